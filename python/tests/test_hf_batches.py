"""kvtier.hf.TieredCache in the shapes people use, against stock eager + DynamicCache on tiny
random models (configs only): left-padded batches through generate, crop / rollback (whatever
tier the pages are in, through kvtierd too), speculative decoding, and beam search refused
before anything is stored."""

from __future__ import annotations

import pytest
import torch
from test_hf_families import LOGIT_TOLERANCE, OFFLOAD, build
from transformers import DynamicCache

import kvtier
from kvtier.hf import TieredCache, cache_kwargs

PAD = 0  # the tiny configs' pad_token_id
LENGTHS = (5, 12, 9)  # prompts of different lengths: generate left-pads them
NEW_TOKENS = 16


def padded_batch(vocab: int):
    g = torch.Generator().manual_seed(7)
    longest = max(LENGTHS)
    ids = torch.full((len(LENGTHS), longest), PAD)
    mask = torch.zeros((len(LENGTHS), longest), dtype=torch.long)
    for row, n in enumerate(LENGTHS):
        ids[row, longest - n:] = torch.randint(3, vocab, (n,), generator=g)
        mask[row, longest - n:] = 1
    return ids, mask


def generate(model, ids, mask, cache, **kw):
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, **cache_kwargs(cache), max_new_tokens=NEW_TOKENS,
                             do_sample=False, output_logits=True, return_dict_in_generate=True,
                             pad_token_id=PAD, eos_token_id=None, **kw)
    return out.sequences, torch.stack(out.logits, dim=1).float()


@pytest.mark.parametrize("name", ["llama-gqa7", "mistral-window", "gemma2-window-softcap1"])
def test_left_padded_batch_matches_stock_and_rows_stay_separate(name):
    model, stock = build(name)
    ids, mask = padded_batch(model.config.vocab_size)
    want_tokens, want_logits = generate(stock, ids, mask, DynamicCache(config=stock.config))
    full = TieredCache(policy="full")
    got_tokens, got_logits = generate(model, ids, mask, full)
    delta = (got_logits - want_logits).abs().max().item()
    assert torch.equal(got_tokens, want_tokens), f"{name}: tokens differ (|Δ logit| {delta})"
    assert delta < LOGIT_TOLERANCE[torch.float32], f"{name}: max |Δ logit| {delta}"
    # Each row is its own kvtier sequence from its first real token: padding is never stored.
    longest = max(LENGTHS)
    assert full.starts == [longest - n for n in LENGTHS]
    for row, n in enumerate(LENGTHS):
        report = full.report(row)
        assert report["prompt_tokens"] == n and report["length"] == n + NEW_TOKENS - 1, report
    assert full.get_seq_length() == longest + NEW_TOKENS - 1  # transformers' count, padding in

    # hierarchy at r 0: bit-identical to full, with pages of every row leaving T0.
    tiered = TieredCache(policy="hierarchy", **OFFLOAD)
    tiered_tokens, tiered_logits = generate(model, ids, mask, tiered)
    assert torch.equal(tiered_tokens, got_tokens) and torch.equal(tiered_logits, got_logits)
    for row in range(len(LENGTHS)):
        assert tiered.report(row)["offload_bytes"] > 0, tiered.report(row)

    # A row alone (no padding) decodes the same tokens as in the batch.
    row = 0
    alone_ids = ids[row:row + 1, longest - LENGTHS[row]:]
    alone, alone_logits = generate(model, alone_ids, torch.ones_like(alone_ids),
                                   TieredCache(policy="full"))
    assert torch.equal(alone[0, alone_ids.shape[1]:], got_tokens[row, longest:])
    assert (alone_logits[0] - got_logits[row]).abs().max().item() < 1e-4


def test_padding_that_is_not_on_the_left_is_refused_before_storing():
    model, _ = build("llama-gqa7")
    ids, mask = padded_batch(model.config.vocab_size)
    right = mask.flip(1)
    cache = TieredCache(policy="full")
    with pytest.raises(NotImplementedError, match="padding other than on the left"):
        with torch.no_grad():
            model(input_ids=ids.flip(1), attention_mask=right, **cache_kwargs(cache), use_cache=True)
    assert cache.sequences == []
    hole = mask.clone()
    hole[1, 6] = 0
    with pytest.raises(NotImplementedError, match="padding other than on the left"):
        with torch.no_grad():
            model(input_ids=ids, attention_mask=hole, **cache_kwargs(cache), use_cache=True)
    assert cache.sequences == []


def feed(model, cache, ids):
    with torch.no_grad():
        return model(input_ids=ids, **cache_kwargs(cache), use_cache=True).logits[0, -1].float()


def rollback_chain(model, cache, crop: int, steps: int = 20, again: int = 8):
    """Prefill, `steps` greedy tokens, crop(-crop), then `again` other tokens: the logits."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, model.config.vocab_size, (1, 12), generator=g)
    logits = [feed(model, cache, ids)]
    for _ in range(steps):
        logits.append(feed(model, cache, logits[-1].argmax().view(1, 1)))
    cache.crop(-crop)
    forced = torch.randint(3, model.config.vocab_size, (again,), generator=g)
    for token in forced:
        logits.append(feed(model, cache, token.view(1, 1)))
    return torch.stack(logits)


@pytest.mark.parametrize("where", ["local", "kvtierd"])
def test_crop_rolls_back_pages_in_any_tier(where, request):
    """A rollback of 14 positions (into pages offloaded to T1, past the length kvtierd last saw,
    keeping part of a page): the logits after it are stock's after the same crop, and hierarchy's
    are bit-identical to full's; pages leave T0 again afterwards."""
    model, stock = build("mistral-window")
    daemon = request.getfixturevalue("daemon").address if where == "kvtierd" else None
    # Full layers under the model's window mask: stock's sliding layers cannot roll back past
    # their window before transformers 5.16, and 5.16.1's past recording breaks the mask.
    reference = DynamicCache()
    want = rollback_chain(stock, reference, crop=14)
    full = TieredCache(policy="full", daemon=daemon)
    got = rollback_chain(model, full, crop=14)
    assert (got - want).abs().max().item() < LOGIT_TOLERANCE[torch.float32]
    tiered = TieredCache(policy="hierarchy", daemon=daemon, wait_for_plans=True,
                         **dict(OFFLOAD, sink_tokens=1))  # kvtierd takes no 0-token sink set
    seen_t1 = []
    original = tiered.crop

    def crop_and_look(n):
        seen_t1.append(int((tiered.tiers() == kvtier.T1).sum()))
        original(n)
        seen_t1.append(int((tiered.tiers() == kvtier.T1).sum()))

    tiered.crop = crop_and_look
    assert torch.equal(rollback_chain(model, tiered, crop=14), got)
    assert seen_t1[0] > 0, "nothing was in T1 when the crop ran"
    # Local pools keep the T1 pages below the cut; through kvtierd the cut is below the length
    # it last saw, so the row came back to T0 and re-opened there.
    assert (seen_t1[1] == 0) == (where == "kvtierd"), seen_t1
    report = tiered.report()
    assert report["length"] == 12 + 20 + 8 - 14 and report["tokens_by_tier"][1] > 0, report
    assert report["daemon_backed"] == (where == "kvtierd"), report


def test_crop_into_an_evicted_page_is_refused_and_changes_nothing():
    model, _ = build("llama-gqa7")
    cache = TieredCache(policy="hierarchy", hbm_ratio=1.0, evict_ratio=0.5, page_tokens=4,
                        window_tokens=4, sink_tokens=0, protect_prompt=False, retier_interval=4)
    ids = torch.randint(3, model.config.vocab_size, (1, 24),
                        generator=torch.Generator().manual_seed(5))
    feed(model, cache, ids)
    tiers = cache.tiers()
    evicted = (tiers == kvtier.T3).nonzero().flatten()
    assert len(evicted) > 0, tiers
    last = int(evicted.max())  # the last position of an evicted page
    length = cache.get_seq_length()
    with pytest.raises(kvtier.FailedPreconditionError, match="evicted.*multiple of page_tokens"):
        cache.crop(-(length - last))  # keeps part of that page
    assert cache.get_seq_length() == length and torch.equal(cache.tiers(), tiers)
    cache.crop(-(length - (last + 1)))  # at the page's end: allowed
    assert cache.get_seq_length() == last + 1
    # The evicted page is now inside the recent window and over the shrunken budget: it stays
    # evicted through the next re-tierings, and decoding goes on.
    for token in range(8):
        feed(model, cache, torch.tensor([[5 + token]]))
    assert cache.tiers()[last] == kvtier.T3 and cache.report()["plans"] >= 3, cache.report()
    if kvtier.hf._CROP_TAKES_LENGTH:  # transformers < 5.16: crop(n > 0) keeps n positions
        cache.crop(cache.get_seq_length() - 2)
        assert cache.get_seq_length() == last + 1 + 8 - 2
    else:
        with pytest.raises(ValueError, match="negative"):
            cache.crop(3)


def test_speculative_decoding_gives_stocks_greedy_tokens():
    model, stock = build("llama-gqa7")
    assistant, _ = build("llama-hd128-gqa4")
    assistant.set_attn_implementation("eager")
    ids = torch.randint(3, model.config.vocab_size, (1, 12),
                        generator=torch.Generator().manual_seed(9))
    kw = dict(max_new_tokens=24, do_sample=False, pad_token_id=PAD, eos_token_id=None)
    with torch.no_grad():
        want = stock.generate(ids, **kw)
        cache = TieredCache(policy="hierarchy", **OFFLOAD)
        got = model.generate(ids, **cache_kwargs(cache), assistant_model=assistant, **kw)
    assert torch.equal(got, want)
    assert cache.report()["offload_bytes"] > 0


def test_beam_search_is_refused_before_anything_is_stored():
    model, _ = build("llama-gqa7")
    cache = TieredCache(policy="full")
    with pytest.raises(NotImplementedError, match="beam search.*num_beams=1"):
        model.generate(torch.tensor([[5, 6, 7]]), **cache_kwargs(cache), num_beams=2, max_new_tokens=4,
                       pad_token_id=PAD)
    assert cache.sequences == []
    with pytest.raises(NotImplementedError, match="beam search"):
        cache.reorder_cache(torch.tensor([0]))
