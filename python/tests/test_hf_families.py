"""kvtier.hf on randomly initialised tiny transformers models of many families, built from
configs here (no download): `full` against stock eager + DynamicCache (the same greedy tokens,
logits within a tolerance per dtype), hierarchy at r 0 against `full` (`torch.equal`, with pages
really leaving T0), and the families kvtier cannot compute refused by name.

Sliding windows (Mistral, Gemma-2's sliding layers, Qwen2, Phi-3, Starcoder2) are active: the
chain is longer than the window. Gemma-2's softcap is 1.0 (it caps hard) besides its default."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf
from transformers import DynamicCache

import kvtier.hf  # noqa: F401  (registers "kvtier")
from kvtier.hf import TieredCache, cache_kwargs

PROMPT, STEPS = 12, 20  # 32 positions: past every window below
WINDOW = 8
# Max |Δ logit| of `full` against stock eager. f32: the same sums in another order. bf16 / fp16:
# stock attends in the model's dtype, kvtier in f32 and rounds the output once.
LOGIT_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 0.15, torch.float16: 0.02}
# β 0.5, tiny pages, nothing protected but 4 recent tokens, re-tiering every 4 steps.
OFFLOAD = dict(hbm_ratio=0.5, evict_ratio=0.0, page_tokens=4, window_tokens=4, sink_tokens=0,
               protect_prompt=False, retier_interval=4)

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=256, initializer_range=0.2,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _gqa(**kw):
    return dict(TINY, num_key_value_heads=2, **kw)


# name -> (config class, model class, config keywords)
FAMILIES = {
    "llama-hd128-gqa4": ("LlamaConfig", "LlamaForCausalLM",
                         dict(TINY, num_attention_heads=8, num_key_value_heads=2, head_dim=128)),
    "llama-gqa7": ("LlamaConfig", "LlamaForCausalLM",
                   dict(TINY, hidden_size=56, num_attention_heads=7, num_key_value_heads=1)),
    "qwen2-bias-window": ("Qwen2Config", "Qwen2ForCausalLM",
                          _gqa(use_sliding_window=True, sliding_window=WINDOW,
                               max_window_layers=1)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", _gqa(head_dim=32)),
    "mistral-window": ("MistralConfig", "MistralForCausalLM", _gqa(sliding_window=WINDOW)),
    "gemma2-window-softcap1": ("Gemma2Config", "Gemma2ForCausalLM",
                               _gqa(head_dim=16, sliding_window=WINDOW,
                                    attn_logit_softcapping=1.0)),
    "gemma2-default-softcap": ("Gemma2Config", "Gemma2ForCausalLM",
                               _gqa(head_dim=16, sliding_window=WINDOW)),
    "gemma3-window": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                      _gqa(head_dim=16, sliding_window=WINDOW,
                           layer_types=["sliding_attention", "full_attention"])),
    "phi3-window": ("Phi3Config", "Phi3ForCausalLM", _gqa(sliding_window=WINDOW)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", _gqa()),
    "granite": ("GraniteConfig", "GraniteForCausalLM", _gqa(attention_multiplier=0.3)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", _gqa()),
    "cohere": ("CohereConfig", "CohereForCausalLM", _gqa()),
    "gpt-neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(TINY)),
    "starcoder2-window": ("Starcoder2Config", "Starcoder2ForCausalLM",
                          _gqa(sliding_window=WINDOW)),
}


def build(name: str, dtype=torch.float32):
    config_cls, model_cls, kw = FAMILIES[name]
    config = getattr(tf, config_cls)(**kw)
    torch.manual_seed(0)
    model = getattr(tf, model_cls)._from_config(config, attn_implementation="kvtier",
                                                dtype=dtype).eval()
    stock = copy.deepcopy(model)
    stock.set_attn_implementation("eager")
    return model, stock


def forward(model, ids, cache):
    with torch.no_grad():
        return model(input_ids=ids, **cache_kwargs(cache), use_cache=True).logits[0, -1]


def prompt(model):
    return torch.randint(0, model.config.vocab_size, (1, PROMPT),
                         generator=torch.Generator().manual_seed(1))


def chain(model, cache, tokens=None):
    """Greedy decode: the logits of each step and the tokens chosen (or fed: teacher forcing)."""
    logits, chosen = [], []
    ids = prompt(model)
    for i in range(STEPS + 1):
        out = forward(model, ids, cache)
        logits.append(out.float())
        token = out.argmax() if tokens is None else tokens[i]
        chosen.append(int(token))
        ids = torch.tensor([[int(token)]])
    return torch.stack(logits), chosen


@pytest.mark.parametrize("name", FAMILIES)
def test_full_matches_stock_eager_and_hierarchy_matches_full(name):
    model, stock = build(name)
    want_logits, want_tokens = chain(stock, DynamicCache(config=stock.config))
    full = TieredCache(policy="full")
    got_logits, got_tokens = chain(model, full)
    delta = (got_logits - want_logits).abs().max().item()
    assert got_tokens == want_tokens, f"{name}: tokens differ (max |Δ logit| {delta})"
    assert delta < LOGIT_TOLERANCE[torch.float32], f"{name}: max |Δ logit| {delta}"

    full = TieredCache(policy="full")
    tiered = TieredCache(policy="hierarchy", **OFFLOAD)
    ids = prompt(model)
    t1_seen = 0
    for i in range(STEPS + 1):
        a, b = forward(model, ids, full), forward(model, ids, tiered)
        assert torch.equal(a, b), f"{name} step {i}: |Δ logit| {(a - b).abs().max().item()}"
        t1_seen = max(t1_seen, tiered.report()["tokens_by_tier"][1])
        ids = a.argmax().view(1, 1)
    report = tiered.report()
    assert t1_seen > 0 and report["offload_bytes"] > 0, report  # pages really left T0
    assert report["t0_peak_bytes"] < full.report()["t0_peak_bytes"], report
    full.close()
    tiered.close()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["llama-hd128-gqa4", "mistral-window", "gemma2-window-softcap1"])
def test_half_precision_full_matches_stock_eager(name, dtype):
    """Teacher-forced on stock's tokens; a token must match where stock's top two logits are
    further apart than the tolerance (nearer, either choice is within rounding)."""
    model, stock = build(name, dtype)
    want_logits, want_tokens = chain(stock, DynamicCache(config=stock.config))
    got_logits, _ = chain(model, TieredCache(policy="full"), tokens=want_tokens)
    delta = (got_logits - want_logits).abs().max().item()
    assert delta < LOGIT_TOLERANCE[dtype], f"{name} {dtype}: max |Δ logit| {delta}"
    top2 = want_logits.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * LOGIT_TOLERANCE[dtype]
    assert torch.equal(got_logits.argmax(-1)[clear], want_logits.argmax(-1)[clear])


def test_window_and_softcap_change_the_answer():
    """The window and the cap are computed, not ignored: without them the logits differ."""
    model, _ = build("gemma2-window-softcap1")
    logits, _ = chain(model, TieredCache(policy="full"))
    for layer in model.model.layers:
        layer.self_attn.sliding_window = None
        layer.self_attn.attn_logit_softcapping = None
    plain, _ = chain(model, TieredCache(policy="full"))
    assert (plain - logits).abs().max().item() > 1e-2


def test_the_cache_keyword_this_transformers_does_not_read_is_refused():
    """transformers 5.24 reads cache= (and past_key_values=, with a FutureWarning); before, only
    past_key_values=, and a cache= would reach the attention unread: refused, not ignored."""
    model, _ = build("llama-gqa7")
    ids = prompt(model)
    cache = TieredCache(policy="full")
    with torch.no_grad():
        if kvtier.hf.CACHE_KEYWORD == "cache":
            with pytest.warns(FutureWarning):
                model(input_ids=ids, past_key_values=cache, use_cache=True)
            assert cache.get_seq_length() == ids.shape[1]
        else:
            with pytest.raises(TypeError, match=r"past_key_values=.*cache_kwargs"):
                model(input_ids=ids, cache=cache, use_cache=True)
            assert cache.sequences == []


@pytest.mark.parametrize("family", ["Falcon", "Bloom", "Mpt"])
def test_model_outside_attention_interface_is_refused_at_load(family):
    config = getattr(tf, f"{family}Config")(vocab_size=128, hidden_size=64, n_layer=2,
                                            num_hidden_layers=2, n_head=4, num_attention_heads=4,
                                            n_heads=4, d_model=64)
    model_cls = getattr(tf, f"{family}ForCausalLM")
    with pytest.raises(NotImplementedError,
                       match=rf"{family}ForCausalLM.*AttentionInterface.*eager"):
        model_cls._from_config(config, attn_implementation="kvtier")
    if family != "Falcon":
        return
    # Loaded another way, a TieredCache says the attention did not reach it, and what to use.
    model = tf.FalconForCausalLM._from_config(copy.deepcopy(config), attn_implementation="eager")
    with pytest.raises(RuntimeError, match=r"did not run through kvtier.*DynamicCache"):
        forward(model, torch.tensor([[1, 2, 3]]), TieredCache(policy="full"))


class _Attention(torch.nn.Module):
    def __init__(self, training=False):
        super().__init__()
        self.config = tf.LlamaConfig(**TINY)
        self.training = training


@pytest.mark.parametrize("kwargs, feature", [
    (dict(s_aux=torch.zeros(4)), "'s_aux'"),
    (dict(sinks=torch.zeros(4)), "'sinks'"),
    (dict(cu_seq_lens_q=torch.tensor([0, 3])), "'cu_seq_lens_q'"),
    (dict(dropout=0.1), "dropout"),
    (dict(is_causal=False), "non-causal"),
])
def test_what_the_kernel_does_not_compute_is_refused_by_name_before_storing(kwargs, feature):
    cache = TieredCache(policy="full")
    key = torch.zeros(1, 2, 3, 16)
    k, v = cache.update(key, key.clone(), 0)  # what a layer hands its attention
    query = torch.zeros(1, 4, 3, 16)
    with pytest.raises(NotImplementedError, match=rf"{feature}.*_Attention, model_type 'llama'"):
        kvtier.hf.kvtier_attention(_Attention(), query, k, v, None, **kwargs)
    assert cache.sequences == [], "nothing may be stored"
    # The refused call consumed the hand-over: the next model is not blamed for it.
    model, _ = build("llama-gqa7")
    forward(model, prompt(model), TieredCache(policy="full"))


def test_attention_sinks_of_gpt_oss_are_refused_by_name():
    config = tf.GptOssConfig(**dict(_gqa(head_dim=16, sliding_window=WINDOW), intermediate_size=64),
                             num_local_experts=4, num_experts_per_tok=2)
    model = tf.GptOssForCausalLM._from_config(config, attn_implementation="kvtier").eval()
    cache = TieredCache(policy="full")
    with pytest.raises(NotImplementedError, match=r"'s_aux'.*GptOssAttention"):
        forward(model, prompt(model), cache)
    assert cache.sequences == []
