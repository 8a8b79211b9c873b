"""kvtier.hf.TieredCache on the real SmolLM2 through transformers: zero-error offloading with
`torch.equal`, positions and masks after eviction, and bad input."""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import chat_ids, e2e_prompts
from transformers import DynamicCache

import kvtier
from kvtier.hf import TieredCache, cache_kwargs

STEPS = 48
# β = 0.5 with a small protected set, re-tiering every 8 steps: pages leave T0 early and often.
OFFLOAD = dict(hbm_ratio=0.5, evict_ratio=0.0, page_tokens=8, window_tokens=16, sink_tokens=4,
               protect_prompt=False, retier_interval=8)


def step(model, ids, cache):
    with torch.no_grad():
        return model(input_ids=ids, **cache_kwargs(cache), use_cache=True).logits[0, -1]


@pytest.mark.parametrize("where", ["local", "kvtierd"])
def test_hierarchy_logits_are_bit_identical_to_full(hf_model, where, request):
    model, tokenizer = hf_model
    model.set_attn_implementation("kvtier")
    daemon = request.getfixturevalue("daemon").address if where == "kvtierd" else None
    full = TieredCache(policy="full", daemon=daemon)
    tiered = TieredCache(policy="hierarchy", daemon=daemon, **OFFLOAD)
    ids = chat_ids(tokenizer, e2e_prompts()[0])
    a, b = step(model, ids, full), step(model, ids, tiered)
    assert torch.equal(a, b), "prefill logits differ"
    t1_seen = 0
    for i in range(STEPS):
        token = a.argmax().view(1, 1)
        a, b = step(model, token, full), step(model, token, tiered)
        assert torch.equal(a, b), f"step {i}: logits differ by {(a - b).abs().max().item()}"
        t1_seen = max(t1_seen, tiered.report()["tokens_by_tier"][1])
    report = tiered.report()
    live = report["length"]
    t0, t1, t2, t3 = report["tokens_by_tier"]
    assert t2 == 0 and t3 == 0, report
    # T0 holds about half the live tokens; the rest really left it (into DDR) and was read there.
    # Slack of one re-tiering interval: through kvtierd the last plan may still be on its way.
    slack = OFFLOAD["page_tokens"] + OFFLOAD["retier_interval"]
    assert t0 <= live // 2 + slack, report
    assert t1 >= live // 2 - slack and t1_seen > 0, report
    assert report["ddr_bytes"] > 0 and report["offload_bytes"] > 0, report
    assert report["t0_peak_bytes"] < full.report()["t0_peak_bytes"], report
    assert report["daemon_backed"] == (where == "kvtierd"), report
    if where == "kvtierd":
        assert report["local_plans"] == 0 and report["plans"] > 0, report
    full.close()
    tiered.close()


def test_evicted_positions_keep_everyone_elses_place(hf_model):
    """r > 0: after eviction the next token attends to the surviving positions at their own
    RoPE positions. The reference is eager attention over the whole sequence with the evicted
    columns masked; the same reference with positions squeezed together (what renumbering would
    do) or without the mask is far off, so the check can fail."""
    model, tokenizer = hf_model
    model.set_attn_implementation("kvtier")
    cache = TieredCache(policy="hierarchy", hbm_ratio=1.0, evict_ratio=0.3, page_tokens=4,
                        window_tokens=8, sink_tokens=0, protect_prompt=False,
                        retier_interval=1000)
    ids = chat_ids(tokenizer, e2e_prompts()[1])
    prompt = ids.shape[1]
    logits = step(model, ids, cache)  # the prefill ends with a re-tiering: pages go to T3
    evicted = (cache.tiers() == kvtier.T3).nonzero().flatten()
    eligible = prompt - 8
    # floor(r × eligible) tokens, rounded to whole pages of 4.
    assert len(evicted) > 0 and abs(len(evicted) - int(0.3 * eligible)) <= 4, cache.tiers()
    assert evicted.max() < prompt - 8, "the window was evicted"
    token = logits.argmax().view(1, 1)
    got = step(model, token, cache)
    assert cache.get_seq_length() == prompt + 1  # positions are never renumbered

    model.set_attn_implementation("eager")
    whole = torch.cat([ids, token], dim=1)
    n = whole.shape[1]
    lowest = torch.finfo(torch.float32).min
    causal = torch.full((n, n), lowest).triu(1)
    masked = causal.clone()
    masked[n - 1, evicted] = lowest

    def reference(mask, positions):
        with torch.no_grad():
            out = model(input_ids=whole, attention_mask=mask[None, None], position_ids=positions,
                        use_cache=False)
        return out.logits[0, -1]

    positions = torch.arange(n)[None]
    squeezed = positions.clone()
    squeezed[0, -1] -= len(evicted)
    model_error = (got - reference(masked, positions)).abs().max().item()
    renumbered = (got - reference(masked, squeezed)).abs().max().item()
    unmasked = (got - reference(causal, positions)).abs().max().item()
    model.set_attn_implementation("kvtier")
    assert model_error < 1e-3, model_error
    assert renumbered > 100 * max(model_error, 1e-5), (renumbered, model_error)
    assert unmasked > 100 * max(model_error, 1e-5), (unmasked, model_error)
    cache.close()


def test_generate_works_unchanged_and_reports(hf_model, daemon):
    model, tokenizer = hf_model
    model.set_attn_implementation("kvtier")
    ids = chat_ids(tokenizer, e2e_prompts()[2])
    cache = TieredCache(policy="hierarchy", hbm_ratio=0.5, evict_ratio=0.03,
                        daemon=daemon.address)
    renamed = kvtier.hf.CACHE_KEYWORD == "cache"  # transformers 5.24 renamed past_key_values
    with pytest.warns(FutureWarning) if renamed else contextlib.nullcontext():
        out = model.generate(ids, past_key_values=cache, max_new_tokens=24, do_sample=False)
    report = cache.report()
    assert report["generated_tokens"] == out.shape[1] - ids.shape[1] - 1  # the last is not fed
    assert report["prompt_tokens"] == ids.shape[1]
    for key in ("t0_bytes", "t0_peak_bytes", "ddr_bytes", "tokens_by_tier",
                "evicted_generated_fraction", "offload_bytes", "plans", "daemon_backed"):
        assert key in report, key
    assert report["daemon_backed"] is True
    again = TieredCache(policy="hierarchy", hbm_ratio=0.5, evict_ratio=0.03)
    out2 = model.generate(ids, **cache_kwargs(again), max_new_tokens=24, do_sample=False)
    assert torch.equal(out, out2)  # local pools and kvtierd: the same tokens


def test_batch_rows_are_separate_sequences(hf_model):
    """Two rows of equal length decode as two kvtier sequences: each row's tokens are those of
    the row alone, logits within 1e-4 (torch's batched matmuls round differently), and each
    row's KV is placed on its own."""
    model, tokenizer = hf_model
    model.set_attn_implementation("kvtier")
    prompts = [chat_ids(tokenizer, "Name a fruit."), chat_ids(tokenizer, "Name a color.")]
    assert prompts[0].shape == prompts[1].shape
    both = TieredCache(**OFFLOAD)
    alone = [TieredCache(**OFFLOAD), TieredCache(**OFFLOAD)]
    ids = torch.cat(prompts)
    singles = list(prompts)
    for i in range(24):
        with torch.no_grad():
            batched = model(input_ids=ids, **cache_kwargs(both), use_cache=True).logits[:, -1]
        for row in range(2):
            single = step(model, singles[row], alone[row])
            assert (batched[row] - single).abs().max().item() < 1e-4, (i, row)
        ids = batched.argmax(-1, keepdim=True)
        singles = [ids[row:row + 1] for row in range(2)]
    for row in range(2):
        assert both.report(row)["tokens_by_tier"] == alone[row].report()["tokens_by_tier"]
        assert both.report(row)["tokens_by_tier"][1] > 0
    with pytest.raises(IndexError, match="row 2 of a batch of 2"):
        both.report(2)


def test_bad_input_raises_clearly_and_loses_nothing(hf_model, tmp_path):
    model, tokenizer = hf_model
    ids = chat_ids(tokenizer, "Say hello.")
    with pytest.raises(ValueError, match="hbm_ratio=1.5"):
        TieredCache(hbm_ratio=1.5)
    with pytest.raises(ValueError, match="policy='lru'"):
        TieredCache(policy="lru")
    with pytest.raises(ValueError, match="evict_ratio \\+ compress_ratio"):
        TieredCache(evict_ratio=0.6, compress_ratio=0.6)
    with pytest.raises(ValueError, match="unix:PATH"):
        TieredCache(daemon="127.0.0.1:50551")
    model.set_attn_implementation("eager")
    with pytest.raises(RuntimeError, match="attn_implementation='kvtier'"):
        step(model, ids, TieredCache())
    model.set_attn_implementation("kvtier")
    with pytest.raises(NotImplementedError, match="padding"):
        with torch.no_grad():
            model(input_ids=ids.repeat(2, 1), attention_mask=torch.ones(2, ids.shape[1]).tril(),
                  **cache_kwargs(TieredCache()), use_cache=True)
    nobody = f"unix:{tmp_path}/nobody.sock"
    with pytest.raises(kvtier.UnavailableError, match="nobody.sock"):
        step(model, ids, TieredCache(daemon=nobody, local_fallback=False))
    with pytest.warns(RuntimeWarning, match="nobody.sock.*local pools"):
        step(model, ids, TieredCache(daemon=nobody))  # the default: local pools, said aloud
    # "kvtier" without a TieredCache is transformers' eager attention, causal mask included.
    with torch.no_grad():
        fallback = model(input_ids=ids, **cache_kwargs(DynamicCache(config=model.config)),
                         use_cache=True).logits[0, -1]
    # Nothing was left half-done: the same model and a fresh cache give the reference logits.
    ok = TieredCache(policy="full")
    got = step(model, ids, ok)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits[0, -1]
    model.set_attn_implementation("kvtier")
    assert (got - want).abs().max().item() < 1e-3
    assert (fallback - want).abs().max().item() < 1e-5
