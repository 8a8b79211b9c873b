"""kvpress's pipeline with a TieredCache: compare deleting KV (a kvpress press) with placing it
(kvtier) through the same pipeline, prompts and greedy decoding.

    import kvtier.kvpress                 # after kvpress; registers attn_implementation="kvtier"
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="kvtier")
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    press = SnapKVPress(compression_ratio=0.75)           # deletes 75% of the context's KV
    cache = kvtier.kvpress.equal_t0_cache(press)          # keeps 25% in T0, the rest in T1
    pipe(context, question=question, cache=cache)         # press=None: kvtier places instead
    pipe(context, question=question, press=press)         # the press, on a DynamicCache

kvpress 0.5.5 requires transformers < 5.3: it runs in its own environment
(``$KVTIER_HOME/kvpress-venv``, made by scripts/install-deps). The pipeline removes each answer
from the cache before the next question; with a TieredCache that is ``crop`` (every row and
layer, whatever tier the pages are in). A press together with a TieredCache is refused: a press
deletes from a DynamicCache's tensors, which a TieredCache does not hold.
"""

from __future__ import annotations

from kvpress import KVPressTextGenerationPipeline

from kvtier.hf import TieredCache

__all__ = ["equal_t0_cache", "press_kept_share", "EVAL_PROTECTED_SET"]

# The protected set and Δ of `kvtier-run eval --tasks` (docs/evaluation.md): 4 sinks, a 32-token
# window, the prompt unprotected, placement at prefill end and between questions only.
EVAL_PROTECTED_SET = dict(sink_tokens=4, window_tokens=32, protect_prompt=False,
                          retier_interval=256)


def equal_t0_cache(press, evict: bool = False, **kwargs) -> TieredCache:
    """A hierarchy TieredCache whose T0 holds the share of the context that ``press`` keeps
    (1 − compression_ratio), with the evaluation's protected set: r = 0 and β = 1 − c, the
    rest offloaded to T1 and attended exactly; or, ``evict=True``, r = c and β = 1 (β is T0's
    share of the live tokens: what is not evicted stays in T0, like the press, nothing in T1).
    ``kwargs`` override."""
    ratio = getattr(press, "compression_ratio", None)
    if ratio is None or not 0.0 <= float(ratio) < 1.0:
        raise ValueError(
            f"equal_t0_cache: {type(press).__name__} has no compression_ratio in [0, 1) "
            f"(got {ratio!r}); give hbm_ratio= yourself")
    ratio = float(ratio)
    settings = dict(EVAL_PROTECTED_SET, policy="hierarchy", hbm_ratio=1.0 if evict else 1 - ratio,
                    evict_ratio=ratio if evict else 0.0)
    settings.update(kwargs)
    return TieredCache(**settings)


def press_kept_share(model, cache, context_length: int) -> float:
    """The share of the context's (position, layer, kv head) entries a press left in a
    DynamicCache after prefill: the layers' lengths, less the keys masked head by head (kvpress's
    AdaKV-style presses such as KVzip mask keys instead of deleting them: each attention
    module's ``masked_key_indices``, (batch, head, position) index tensors)."""
    if context_length <= 0:
        raise ValueError(f"press_kept_share: context_length={context_length} must be positive")
    kept = total = 0
    for layer in cache.layers:
        batch, heads, length, _ = layer.keys.shape
        total += batch * heads * context_length
        kept += batch * heads * min(length, context_length)
    for module in model.modules():
        indices = getattr(module, "masked_key_indices", None)
        if indices is not None:
            kept -= int(indices[0].numel())
    return kept / total


_forward = KVPressTextGenerationPipeline._forward
_remove_answer = KVPressTextGenerationPipeline._remove_answer_from_cache


def _tiered_forward(self, input_tensors, max_new_tokens=50, press=None, cache=None):
    if press is not None and isinstance(cache, TieredCache):
        raise NotImplementedError(
            f"kvpress pipeline: press={type(press).__name__} with a TieredCache: a press deletes "
            "from a DynamicCache's tensors, which a TieredCache does not hold. Run the press with "
            "cache=None (a DynamicCache), and the TieredCache with press=None "
            "(kvtier.kvpress.equal_t0_cache(press) gives the same T0 budget)")
    if isinstance(cache, TieredCache) and self.model.config._attn_implementation != "kvtier":
        raise ValueError(
            "kvpress pipeline: a TieredCache needs the model's attn_implementation='kvtier' (it "
            f"is {self.model.config._attn_implementation!r}): model.set_attn_implementation"
            "('kvtier') after import kvtier.kvpress")
    if isinstance(cache, TieredCache):
        # Head-wise masks an earlier press (KVzip, AdaKV) left on the attention modules would
        # make kvpress's attention patch rewrite the keys handed to kvtier's attention.
        for module in self.model.modules():
            if getattr(module, "masked_key_indices", None) is not None:
                module.masked_key_indices = None
    return _forward(self, input_tensors, max_new_tokens=max_new_tokens, press=press, cache=cache)


def _tiered_remove_answer(self, cache, cache_seq_lengths):
    """The question and answer leave the cache before the next question: crop for a
    TieredCache (every layer has the same length), the pipeline's slicing otherwise."""
    if not isinstance(cache, TieredCache):
        return _remove_answer(self, cache, cache_seq_lengths)
    remove = cache.get_seq_length() - cache_seq_lengths[0]
    if remove > 0:
        cache.crop(-remove)


KVPressTextGenerationPipeline._forward = _tiered_forward
KVPressTextGenerationPipeline._remove_answer_from_cache = _tiered_remove_answer
