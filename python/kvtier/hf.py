"""Hugging Face transformers: a cache that places KV by attention instead of deleting it.

    import kvtier.hf                     # registers attn_implementation="kvtier"
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="kvtier")
    cache = kvtier.hf.TieredCache(policy="hierarchy", hbm_ratio=0.5, evict_ratio=0.03)
    model.generate(ids, past_key_values=cache, max_new_tokens=256)
    cache.report()                       # the figures of `kvtier-run generate --json`

Each layer's post-RoPE K/V goes into one kvtier ``TieredSequence`` (T0 in the runtime's arena,
T1/T2 in the daemon's pools or local ones); the ``"kvtier"`` attention implementation attends
over T0 ∪ T1 (and dequantized T2) with kvtier's kernel, in position order, and accumulates the
cumulative attention score that places the pages. Each layer's sliding window and attention
logit softcap are computed by the kernel; anything else it does not compute raises
NotImplementedError by name (docs/python.md lists the model families that work). Positions are
never renumbered: an evicted token keeps its place, so RoPE positions and ``cache_position``
stay those of the full sequence.

Tested with the transformers version pinned in python/requirements.txt (docs/python.md says
what a newer one needs). One kvtier sequence per batch row (rows of equal length: no padding),
CPU tensors; the GPU path is the CUDA backend's.
"""

from __future__ import annotations

import atexit
import math
import sys
import threading
import weakref
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.modeling_utils import PreTrainedModel

from kvtier import _native
from kvtier._socket import daemon_from_env

__all__ = ["TieredCache", "kvtier_attention", "ATTN_IMPLEMENTATION"]

ATTN_IMPLEMENTATION = "kvtier"
POLICIES = ("full", "hierarchy", "streaming")


@dataclass
class _Pending:
    """What a layer's `update` handed to the model: its attention call finds the cache by it."""

    cache: "TieredCache"
    layer: int
    key: torch.Tensor


_pending = threading.local()

# One runtime per (model shape, pages, codec, daemon) in this process: a runtime in daemon mode
# is one registered worker, and every sequence of the process shares its session and pools.
_runtimes: dict[tuple, _native.Runtime] = {}
_runtimes_lock = threading.Lock()


def _runtime_for(key: tuple, make) -> _native.Runtime:
    with _runtimes_lock:
        runtime = _runtimes.get(key)
        if runtime is None:
            runtime = make()
            _runtimes[key] = runtime
        return runtime


_live_caches: "weakref.WeakSet[TieredCache]" = weakref.WeakSet()


def release_runtimes() -> None:
    """Drops the shared runtimes (their daemon sessions close once no sequence holds them)."""
    with _runtimes_lock:
        _runtimes.clear()


@atexit.register
def _close_at_exit() -> None:
    # Sequences and sessions end cleanly (CloseWorker) instead of waiting out the lease.
    for cache in list(_live_caches):
        cache.close()
    release_runtimes()


def _check_ratio(name: str, value: float) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"TieredCache: {name}={value} is outside [0, 1]")
    return value


class _TieredLayer(CacheLayerMixin):
    """One model layer's view of the cache's TieredSequence (what transformers' Cache expects)."""

    is_sliding = False
    is_compileable = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, cache: "TieredCache", layer: int):
        super().__init__()
        self._cache = cache
        self._layer = layer
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        return self._cache._hand_over(self._layer, key_states, value_states)

    def get_seq_length(self) -> int:
        return self._cache._length(self._layer)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self._cache.close()

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("TieredCache holds one sequence: beam search is not supported")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("TieredCache cannot crop: positions are never taken back")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("TieredCache cannot copy its rows: beam search is not supported")

    def batch_select_indices(self, indices) -> None:
        raise NotImplementedError("TieredCache cannot drop rows: beam search is not supported")


class TieredCache(Cache):
    """A transformers ``Cache`` whose KV lives in kvtier's tiers: one kvtier sequence per batch
    row (rows of equal length; a padding mask is refused).

    Keywords: ``policy`` ("hierarchy", "full", "streaming"), ``hbm_ratio`` β (T0's share of live
    tokens), ``evict_ratio`` r (cumulative evicted share of eligible tokens; 0 = exact),
    ``compress_ratio`` γ (share of live candidates in 8-bit T2), ``codec`` ("int8_kivi",
    "fp8_e4m3"), ``page_tokens``, ``daemon`` ("unix:/run/kvtier/kvtierd.sock"; None = the daemon
    ``$KVTIER_SOCKET`` names when set, else local pools in this process; "" = local pools). The
    protected set and Δ: ``sink_tokens``, ``window_tokens``, ``protect_prompt`` (True / "all":
    the whole prompt stays in T0; False / "none": it competes for T0 like any token;
    "last-turn": only the prompt from ``protected_prompt_begin``, the token where the last user
    turn starts, is protected), ``retier_interval``. ``max_lost_mass`` ε: evict only while the
    evicted pages' estimated attention mass per decode step stays at most ε (None = no limit,
    0 = no eviction); ``report()["lost_mass"]`` is the guardrail's figure.

    Needs the model loaded with ``attn_implementation="kvtier"`` (after ``import kvtier.hf``).
    """

    def __init__(
        self,
        policy: str = "hierarchy",
        hbm_ratio: float = 0.5,
        evict_ratio: float = 0.0,
        compress_ratio: float = 0.0,
        codec: str = "int8_kivi",
        page_tokens: int = 16,
        daemon: str | None = None,
        *,
        sink_tokens: int = 4,
        window_tokens: int = 128,
        protect_prompt: bool | str = True,
        protected_prompt_begin: int = 0,
        retier_interval: int = 64,
        max_lost_mass: float | None = None,
        tag: str = "transformers",
        local_ddr_bytes: int = 2 << 30,
        local_compressed_bytes: int = 1 << 30,
    ):
        super().__init__(layers=[])
        if policy not in POLICIES:
            raise ValueError(f"TieredCache: policy={policy!r} is not one of {', '.join(POLICIES)}")
        self.policy = policy
        self.hbm_ratio = _check_ratio("hbm_ratio", hbm_ratio)
        self.evict_ratio = _check_ratio("evict_ratio", evict_ratio)
        self.compress_ratio = _check_ratio("compress_ratio", compress_ratio)
        if self.evict_ratio + self.compress_ratio > 1:
            raise ValueError(
                f"TieredCache: evict_ratio + compress_ratio = "
                f"{self.evict_ratio + self.compress_ratio} exceeds 1"
            )
        if max_lost_mass is not None and not float(max_lost_mass) >= 0:
            raise ValueError(f"TieredCache: max_lost_mass={max_lost_mass} must be >= 0 or None")
        self.max_lost_mass = None if max_lost_mass is None else float(max_lost_mass)
        if int(page_tokens) <= 0:
            raise ValueError(f"TieredCache: page_tokens={page_tokens} must be positive")
        if int(retier_interval) <= 0:
            raise ValueError(f"TieredCache: retier_interval={retier_interval} must be positive")
        if daemon is None:
            daemon = daemon_from_env()
        if daemon == "":
            daemon = None
        if daemon is not None and not daemon.startswith("unix:"):
            raise ValueError(
                f"TieredCache: daemon={daemon!r} must be kvtierd's unix socket, 'unix:PATH' "
                "(workers need the memory channel beside it), or \"\" for local pools"
            )
        self.codec = codec
        self.page_tokens = int(page_tokens)
        self.daemon = daemon
        self.sink_tokens = int(sink_tokens)
        self.window_tokens = int(window_tokens)
        modes = {True: "all", False: "none", "all": "all", "none": "none", "last-turn": "last-turn"}
        if not isinstance(protect_prompt, (bool, str)) or protect_prompt not in modes:
            raise ValueError(
                f"TieredCache: protect_prompt={protect_prompt!r} is not True, False, 'all', "
                "'none' or 'last-turn'"
            )
        self.protect_mode = modes[protect_prompt]
        self.protect_prompt = self.protect_mode != "none"
        if int(protected_prompt_begin) < 0:
            raise ValueError(
                f"TieredCache: protected_prompt_begin={protected_prompt_begin} must be >= 0"
            )
        if self.protect_mode == "last-turn" and int(protected_prompt_begin) == 0:
            raise ValueError(
                "TieredCache: protect_prompt='last-turn' needs protected_prompt_begin, the token "
                "where the last user turn starts"
            )
        self.protected_prompt_begin = (
            int(protected_prompt_begin) if self.protect_mode == "last-turn" else 0
        )
        self.retier_interval = int(retier_interval)
        self.tag = tag
        self.local_ddr_bytes = int(local_ddr_bytes)
        self.local_compressed_bytes = int(local_compressed_bytes)
        self.sequences: list[_native.TieredSequence] = []
        _live_caches.add(self)

    # ---- transformers' Cache ----

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        while len(self.layers) <= layer_idx:
            self.layers.append(_TieredLayer(self, len(self.layers)))
        return self.layers[layer_idx].update(key_states, value_states)

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("TieredCache holds one sequence: beam search is not supported")

    # ---- kvtier ----

    @property
    def sequence(self) -> _native.TieredSequence | None:
        """Row 0's kvtier sequence (None before the first forward pass)."""
        return self.sequences[0] if self.sequences else None

    def report(self, row: int = 0) -> dict:
        """The figures of ``kvtier-run generate --json``'s report for one batch row (bytes of
        f32 KV)."""
        report = {
            "policy": self.policy,
            "hbm_ratio": self.hbm_ratio,
            "evict_ratio": self.evict_ratio,
            "compress_ratio": self.compress_ratio,
            "max_lost_mass": self.max_lost_mass,
            "page_tokens": self.page_tokens,
            "codec": self.codec,
            "daemon": self.daemon or "",
            "daemon_backed": False,
            "prompt_tokens": 0,
            "generated_tokens": 0,
        }
        seq = self._row(row)
        if seq is not None and not seq.closed:
            report.update(seq.report())
            report["daemon_backed"] = seq.daemon_backed
            report["generated_tokens"] = report["length"] - report["prompt_tokens"]
        return report

    def tiers(self, group: int = 0, row: int = 0):
        """Each position's tier (0..3), by its page; empty before the first forward pass."""
        seq = self._row(row)
        if seq is None:
            return torch.empty(0, dtype=torch.uint8)
        return torch.from_numpy(seq.tiers(group))

    def scores(self, group: int = 0, row: int = 0):
        """Each position's cumulative attention score (frozen once evicted)."""
        seq = self._row(row)
        if seq is None:
            return torch.empty(0, dtype=torch.float32)
        return torch.from_numpy(seq.scores(group))

    def close(self) -> None:
        """Frees the sequences' memory now (the daemon's slots too); the cache can start over."""
        for seq in self.sequences:
            seq.close()
        self.sequences = []
        self.layers = []

    def _row(self, row: int):
        if not self.sequences:
            return None
        if not 0 <= row < len(self.sequences):
            raise IndexError(f"TieredCache: row {row} of a batch of {len(self.sequences)}")
        return self.sequences[row]

    # ---- between update() and the attention call ----

    def _length(self, layer: int) -> int:
        seq = self.sequence
        if seq is None or seq.closed:
            return 0
        return seq.length(layer)

    def _hand_over(self, layer: int, key_states, value_states):
        if getattr(_pending, "value", None) is not None:
            _pending.value = None
            raise RuntimeError(
                "TieredCache needs the model loaded with attn_implementation='kvtier' "
                "(import kvtier.hf first): layer "
                f"{layer - 1}'s attention did not run through kvtier. A model whose attention "
                "is not on transformers' AttentionInterface (Falcon, ...) cannot use it: load "
                "it with attn_implementation='eager' and a DynamicCache (docs/python.md lists "
                "the families that work)"
            )
        _pending.value = _Pending(self, layer, key_states)
        return key_states, value_states

    def _open(self, module, query, key, scaling: float) -> None:
        # Head counts and head_dim from the tensors: configs name them differently (GPT-NeoX has
        # no num_key_value_heads) and some layers derive them (head_dim != hidden / heads).
        batch, heads, query_tokens, head_dim = query.shape
        config = module.config
        layers = getattr(config, "num_hidden_layers", None)
        if layers is None:
            raise NotImplementedError(
                f"TieredCache: {type(module).__name__}'s config "
                f"({type(config).__name__}) has no num_hidden_layers"
            )
        shape = (int(layers), int(heads), int(key.shape[1]), int(head_dim), float(scaling))
        key = shape + (self.page_tokens, self.codec, self.daemon or "")
        if self.daemon is None:
            key += (self.local_ddr_bytes, self.local_compressed_bytes)
        runtime = _runtime_for(
            key,
            lambda: _native.Runtime(
                *shape,
                page_tokens=self.page_tokens,
                codec=self.codec,
                daemon=self.daemon or "",
                worker_name="kvtier-python",
                ddr_bytes=self.local_ddr_bytes,
                compressed_bytes=self.local_compressed_bytes,
            ),
        )
        open_row = lambda row: runtime.open(  # noqa: E731
            policy=self.policy,
            prompt_tokens=query_tokens,
            hbm_ratio=self.hbm_ratio,
            evict_ratio=self.evict_ratio,
            compress_ratio=self.compress_ratio,
            sink_tokens=self.sink_tokens,
            window_tokens=self.window_tokens,
            protect_prompt=self.protect_prompt,
            protected_prompt_begin=self.protected_prompt_begin,
            retier_interval=self.retier_interval,
            max_lost_mass=math.inf if self.max_lost_mass is None else self.max_lost_mass,
            tag=self.tag if batch == 1 else f"{self.tag}[{row}]",
        )
        self.sequences = [open_row(row) for row in range(batch)]

    def _attend(self, module, layer: int, query, key, value, scaling, window, softcap):
        if query.device.type != "cpu":
            raise TypeError(
                f"TieredCache: the query is on {query.device}; kvtier's CPU kernel reads host "
                "memory (the CUDA backend is the GPU path: docs/python.md)"
            )
        batch, heads, n, head_dim = query.shape
        if not self.sequences:
            if layer != 0:
                raise RuntimeError(f"TieredCache: the first forward pass began at layer {layer}")
            self._open(module, query, key, scaling)
        elif batch != len(self.sequences):
            raise ValueError(f"TieredCache holds {len(self.sequences)} rows; this call has {batch}")
        dtype = query.dtype
        out = torch.empty((batch, n, heads, head_dim), dtype=torch.float32)
        for row, seq in enumerate(self.sequences):
            # The kernel computes in float32; other dtypes are converted at this edge.
            k = key[row].detach().transpose(0, 1).to(torch.float32).contiguous()
            v = value[row].detach().transpose(0, 1).to(torch.float32).contiguous()
            seq.append(layer, k, v)
            q = query[row].detach().transpose(0, 1).to(torch.float32).contiguous()
            seq.attend(layer, q, out[row], window=window, softcap=softcap)
        return (out if dtype == torch.float32 else out.to(dtype)), None


# Keywords transformers passes to attention functions that do not change what is computed here.
_NEUTRAL_KWARGS = frozenset({
    "position_ids", "cache_position", "use_cache", "output_attentions", "output_hidden_states",
    "output_router_logits", "past_key_values", "past_key_value", "return_dict", "layer_idx",
    "num_items_in_batch", "position_embeddings", "logits_to_keep", "is_causal", "cache",
})


def _model_name(module) -> str:
    model_type = getattr(getattr(module, "config", None), "model_type", None) or "?"
    return f"{type(module).__name__}, model_type {model_type!r}"


def _refuse(module, feature: str) -> None:
    raise NotImplementedError(
        f"kvtier attention does not compute {feature} ({_model_name(module)}); nothing was "
        "stored. Load the model with attn_implementation='eager' and a DynamicCache instead"
    )


def _check_call(module, query, key, value, dropout, kwargs) -> tuple[int, float]:
    """Refuses, by name and before anything is stored, what kvtier's kernel does not compute;
    returns the layer's (sliding window, softcap), 0 for none."""
    if dropout and float(dropout) != 0.0:
        _refuse(module, f"attention dropout ({dropout}, the model is in training mode)")
    if kwargs.get("is_causal") is False or getattr(module, "is_causal", True) is False:
        _refuse(module, "non-causal (bidirectional) attention")
    if value.shape[-1] != query.shape[-1] or key.shape[-1] != query.shape[-1]:
        _refuse(module, f"a value head_dim ({value.shape[-1]}) other than the query's "
                        f"({query.shape[-1]})")
    if query.shape[1] % key.shape[1] != 0:
        _refuse(module, f"{query.shape[1]} query heads over {key.shape[1]} kv heads")
    window = kwargs.pop("sliding_window", None)
    softcap = kwargs.pop("softcap", None)
    for name, value_ in kwargs.items():
        if name in _NEUTRAL_KWARGS or value_ is None or value_ is False:
            continue
        _refuse(module, f"the attention keyword {name!r} (e.g. sinks / s_aux, packed sequences)")
    window = int(window) if window is not None else 0
    softcap = float(softcap) if softcap is not None else 0.0
    if window < 0 or not 0.0 <= softcap < float("inf"):
        raise ValueError(f"kvtier attention: sliding_window={window}, softcap={softcap} "
                         f"({_model_name(module)})")
    return window, softcap


def kvtier_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The ``"kvtier"`` attention implementation: a TieredCache's layers attend through kvtier;
    anything else (no cache, another cache class) falls back to transformers' eager attention."""
    pending = getattr(_pending, "value", None)
    if pending is not None and pending.key is key:
        _pending.value = None  # consumed, whether this call attends or is refused
    else:
        pending = None
    window, softcap = _check_call(module, query, key, value, dropout, dict(kwargs))
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if pending is None:
        return _eager(module, query, key, value, scaling, window, softcap)
    return pending.cache._attend(module, pending.layer, query, key, value, scaling, window, softcap)


def _eager(module, query, key, value, scaling, window: int, softcap: float):
    """No TieredCache: eager attention with the mask kvtier_mask does not build (causal, the
    queries are the last positions, and the window) and the softcap, as the kernel computes."""
    q, kv = query.shape[2], key.shape[2]
    query_pos = torch.arange(kv - q, kv, device=query.device)[:, None]
    key_pos = torch.arange(kv, device=query.device)[None, :]
    allowed = key_pos <= query_pos
    if window:
        allowed &= key_pos > query_pos - window
    mask = torch.zeros((q, kv), dtype=query.dtype, device=query.device)
    mask.masked_fill_(~allowed, torch.finfo(query.dtype).min)
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap:
        weights = torch.tanh(weights / softcap) * softcap
    weights = torch.softmax(weights + mask, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def kvtier_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                attention_mask=None, **kwargs):
    """The ``"kvtier"`` mask: none. kvtier's kernel is causal and skips evicted positions itself,
    so only a padding mask would add anything, and padding is refused here, where transformers
    still shows it (the attention call would not see it)."""
    if attention_mask is not None and attention_mask.dim() == 2 and not bool(attention_mask.all()):
        raise NotImplementedError(
            "TieredCache: padding is not supported (batch rows of equal length only)"
        )
    return None


_check_attn_implementation = PreTrainedModel._check_and_adjust_attn_implementation


def _on_attention_interface(cls) -> bool:
    # The class flag is missing on some models that do call the interface (StableLM): their
    # modeling module importing ALL_ATTENTION_FUNCTIONS says so too.
    module = sys.modules.get(cls.__module__)
    return cls.is_backend_compatible() or hasattr(module, "ALL_ATTENTION_FUNCTIONS")


def _kvtier_checked_attn_implementation(self, attn_implementation, *args, **kwargs):
    """At load: a model whose attention is not on AttentionInterface would fail deep inside its
    __init__ (Falcon, Bloom, MPT: KeyError 'kvtier'); say which model and what to use instead."""
    if attn_implementation == ATTN_IMPLEMENTATION and not _on_attention_interface(type(self)):
        raise NotImplementedError(
            f"{type(self).__name__}: its attention is not on transformers' AttentionInterface, "
            "so attn_implementation='kvtier' cannot reach it and TieredCache cannot hold its KV. "
            "Load it with attn_implementation='eager' (or 'sdpa') and a DynamicCache; "
            "docs/python.md lists the families that work"
        )
    return _check_attn_implementation(self, attn_implementation, *args, **kwargs)


PreTrainedModel._check_and_adjust_attn_implementation = _kvtier_checked_attn_implementation
AttentionInterface.register(ATTN_IMPLEMENTATION, kvtier_attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, kvtier_mask)
