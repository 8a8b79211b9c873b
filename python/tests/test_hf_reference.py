"""TieredCache against stock transformers (DynamicCache, eager attention) on the project's e2e
prompts: the same greedy tokens over 128 steps, logits and cumulative scores within stated
tolerances (f32 kernels that sum in a different order)."""

from __future__ import annotations

import pytest
import torch
from conftest import chat_ids, e2e_prompts
from transformers import DynamicCache

from kvtier.hf import TieredCache, cache_kwargs

NEW_TOKENS = 128
LOGIT_TOLERANCE = 2e-3  # max |Δ logit|; logits are O(10), f32 sums in another order
SCORE_TOLERANCE = 1e-4  # max |Δ cumulative score|; scores are O(1)


def generate(model, ids, attn, cache):
    model.set_attn_implementation(attn)
    out = model.generate(ids, **cache_kwargs(cache), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                         do_sample=False, output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, ids.shape[1]:], torch.stack(out.logits)[:, 0]


@pytest.mark.parametrize("prompt", range(len(e2e_prompts())))
def test_greedy_tokens_match_stock_eager(hf_model, prompt):
    model, tokenizer = hf_model
    ids = chat_ids(tokenizer, e2e_prompts()[prompt])
    want_tokens, want_logits = generate(model, ids, "eager", DynamicCache(config=model.config))
    cache = TieredCache(policy="hierarchy", hbm_ratio=0.5, evict_ratio=0.0, window_tokens=32,
                        retier_interval=16)
    got_tokens, got_logits = generate(model, ids, "kvtier", cache)
    assert torch.equal(got_tokens, want_tokens), tokenizer.decode(got_tokens)
    assert (got_logits - want_logits).abs().max().item() < LOGIT_TOLERANCE
    assert cache.report()["tokens_by_tier"][1] > 0  # pages left T0 while compared


def test_cumulative_scores_match_eager_attention_weights(hf_model):
    """The paper's rule from eager's attention weights: per step, each position gains
    (1/L) Σ_layers (1/H) Σ_heads α (the prefill: column sums over its queries)."""
    model, tokenizer = hf_model
    ids = chat_ids(tokenizer, e2e_prompts()[3])
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    cache = TieredCache(policy="full")
    reference = DynamicCache(config=model.config)
    expect = torch.zeros(0, dtype=torch.float64)
    token = ids
    for _ in range(6):
        model.set_attn_implementation("eager")
        with torch.no_grad():
            out = model(input_ids=token, **cache_kwargs(reference), use_cache=True, output_attentions=True)
        mass = sum(a[0].double().sum(dim=(0, 1)) for a in out.attentions) / (layers * heads)
        expect = torch.cat([expect, torch.zeros(len(mass) - len(expect), dtype=torch.float64)])
        expect += mass
        model.set_attn_implementation("kvtier")
        with torch.no_grad():
            model(input_ids=token, **cache_kwargs(cache), use_cache=True)
        got = cache.scores().double()
        assert got.shape == expect.shape
        assert (got - expect).abs().max().item() < SCORE_TOLERANCE
        token = out.logits[0, -1].argmax().view(1, 1)
