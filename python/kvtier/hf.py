"""Hugging Face transformers: a cache that places KV by attention instead of deleting it.

    import kvtier.hf                     # registers attn_implementation="kvtier"
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="kvtier")
    cache = kvtier.hf.TieredCache(policy="hierarchy", hbm_ratio=0.5, evict_ratio=0.03)
    model.generate(ids, cache=cache, max_new_tokens=256)
    cache.report()                       # the figures of `kvtier-run generate --json`

Each layer's post-RoPE K/V goes into one kvtier ``TieredSequence`` (T0 in the runtime's arena,
T1/T2 in the daemon's pools or local ones); the ``"kvtier"`` attention implementation attends
over T0 ∪ T1 (and dequantized T2) with kvtier's kernel, in position order, and accumulates the
cumulative attention score that places the pages. Each layer's sliding window and attention
logit softcap are computed by the kernel; anything else it does not compute raises
NotImplementedError by name (docs/python.md lists the model families that work). Positions are
never renumbered: an evicted token keeps its place, so RoPE positions and ``cache_position``
stay those of the full sequence.

Tested with transformers 5.2 to 5.24 (docs/python.md, "Versions"): pass the cache as
``**kvtier.hf.cache_kwargs(cache)`` to reach it under the name the installed one reads.
One kvtier sequence per batch row: a left-padded batch (what
``generate`` builds for prompts of different lengths) stores each row from its first real token.
``crop`` rolls back (speculative decoding); beam search is refused before anything is stored.
CPU tensors; the GPU path is the CUDA backend's.
"""

from __future__ import annotations

import atexit
import inspect
import math
import sys
import threading
import warnings
import weakref
from dataclasses import dataclass

import torch
import transformers
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache
from transformers.generation.utils import GenerationMixin
from transformers.modeling_utils import PreTrainedModel

from kvtier import _native
from kvtier._socket import daemon_from_env

__all__ = ["TieredCache", "kvtier_attention", "ATTN_IMPLEMENTATION", "CACHE_KEYWORD",
           "cache_kwargs"]

ATTN_IMPLEMENTATION = "kvtier"
POLICIES = ("full", "hierarchy", "streaming")

# The keyword models' forward and generate() take a cache under: transformers 5.24 renamed
# ``past_key_values`` to ``cache`` (the old name still works there, with a FutureWarning);
# before 5.24 a ``cache=`` would reach the attention functions unread.
_TRANSFORMERS = tuple(int(part) for part in transformers.__version__.split(".")[:2])
CACHE_KEYWORD = "cache" if _TRANSFORMERS >= (5, 24) else "past_key_values"


# DynamicCache.crop(n) before transformers 5.16 or so: n > 0 is the length to keep (n < 0
# removes -n positions); later: only n <= 0, positive raises.
_CROP_TAKES_LENGTH = "max_length" in inspect.signature(DynamicCache.crop).parameters


def cache_kwargs(cache) -> dict:
    """``model(**kvtier.hf.cache_kwargs(cache))``: the cache under the keyword this transformers
    reads (``cache`` from 5.24, ``past_key_values`` before)."""
    return {CACHE_KEYWORD: cache}


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


def _forget_runtime(key: tuple, runtime) -> None:
    """Drops a runtime whose daemon session is stale (its live sequences keep it alive)."""
    with _runtimes_lock:
        if _runtimes.get(key) is runtime:
            del _runtimes[key]


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
    is_croppable = True  # TieredCache.crop rolls every row back (TieredSequence.truncate)
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

    def get_mask_sizes(self, query_length) -> tuple[int, int]:
        # transformers < 5.3 passes the query's cache_position tensor instead of its length.
        if isinstance(query_length, torch.Tensor):
            query_length = query_length.shape[0]
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    get_max_cache_shape = get_max_length  # its name before transformers 5.3

    def reset(self) -> None:
        self._cache.close()

    def reorder_cache(self, beam_idx) -> None:
        _refuse_beams("reorder_cache")

    def crop(self, tokens_to_remove: int) -> None:
        # One kvtier sequence holds every layer: the cache crops them all at once.
        raise NotImplementedError("TieredCache crops every layer at once: call cache.crop(-n)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        _refuse_beams("batch_repeat_interleave")

    def batch_select_indices(self, indices) -> None:
        _refuse_beams("batch_select_indices")


def _refuse_beams(operation: str) -> None:
    raise NotImplementedError(
        f"TieredCache.{operation}: beam search (num_beams > 1) is not supported: each row is a "
        "kvtier sequence whose pages live in several tiers and cannot be copied between rows. "
        "Use num_beams=1 (greedy, sampling, assisted decoding), or a DynamicCache for beams"
    )


class TieredCache(Cache):
    """A transformers ``Cache`` whose KV lives in kvtier's tiers: one kvtier sequence per batch
    row. A left-padded batch keeps each row from its first real token (padding is never
    stored); other padding (right, holes) and custom 4-D masks are refused.

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
    0 = no eviction); ``report()["lost_mass"]`` is the guardrail's figure. ``wait_for_plans``
    (daemon only; default False): apply each kvtierd plan at its re-tiering step, as local pools
    do, so placement and tokens do not depend on the daemon's timing (one round trip per
    re-tiering on the token path; False keeps the daemon off it and applies a plan at the first
    step after it arrives).
    ``local_fallback`` (default True): a new cache whose kvtierd is down opens its sequences
    on local pools (with a RuntimeWarning naming the socket) instead of raising; the next cache,
    or this one after ``close()``, goes to kvtierd again.

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
        wait_for_plans: bool = False,
        local_fallback: bool = True,
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
        if daemon is not None and (int(sink_tokens) == 0 or int(window_tokens) == 0):
            name = "sink_tokens" if int(sink_tokens) == 0 else "window_tokens"
            raise ValueError(
                f"TieredCache: {name}=0 cannot reach kvtierd, which reads 0 as its default: "
                "use at least 1, or local pools (daemon=\"\")"
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
        self.wait_for_plans = bool(wait_for_plans)
        self.local_fallback = bool(local_fallback)
        self.fell_back = False  # this cache's sequences are on local pools: kvtierd was down
        self.tag = tag
        self.local_ddr_bytes = int(local_ddr_bytes)
        self.local_compressed_bytes = int(local_compressed_bytes)
        self.sequences: list[_native.TieredSequence] = []
        self.starts: list[int] = []  # per row: left padding, never stored
        _live_caches.add(self)

    # ---- transformers' Cache ----

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        while len(self.layers) <= layer_idx:
            self.layers.append(_TieredLayer(self, len(self.layers)))
        return self.layers[layer_idx].update(key_states, value_states)

    def reorder_cache(self, beam_idx) -> None:
        _refuse_beams("reorder_cache")

    def crop(self, tokens_to_remove: int) -> None:
        """Removes the last ``-tokens_to_remove`` positions of every row and layer (speculative
        decoding, rollbacks), whatever tier their pages are in, as ``DynamicCache.crop`` does.
        A rollback that keeps part of an evicted page raises FailedPreconditionError (nothing
        changes); one below the length kvtierd last saw brings the row's offloaded pages back
        to T0 (kvtierd's lengths only grow)."""
        tokens_to_remove = int(tokens_to_remove)
        if tokens_to_remove > 0 and not _CROP_TAKES_LENGTH:
            raise ValueError(
                f"TieredCache.crop({tokens_to_remove}): give a negative number of positions to "
                "remove (as DynamicCache.crop does)"
            )
        if tokens_to_remove == 0 or not self.sequences:
            return
        length = self._length(0)
        if tokens_to_remove > 0:  # the length to keep, as this transformers' crop reads it
            tokens_to_remove = min(0, tokens_to_remove - length)
            if tokens_to_remove == 0:
                return
        if -tokens_to_remove > length - max(self.starts):
            raise ValueError(
                f"TieredCache.crop({tokens_to_remove}): the cache holds {length} positions, "
                f"{max(self.starts)} of them padding in some row; nothing was removed"
            )
        for seq, start in zip(self.sequences, self.starts):
            seq.truncate(length + tokens_to_remove - start)

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
            "wait_for_plans": self.wait_for_plans,
            "sink_tokens": self.sink_tokens,
            "window_tokens": self.window_tokens,
            "protect_prompt": self.protect_prompt,
            "retier_interval": self.retier_interval,
            "fell_back_to_local": self.fell_back,
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
        self.starts = []
        self.layers = []
        self.fell_back = False

    def _row(self, row: int):
        if not self.sequences:
            return None
        if not 0 <= row < len(self.sequences):
            raise IndexError(f"TieredCache: row {row} of a batch of {len(self.sequences)}")
        return self.sequences[row]

    # ---- between update() and the attention call ----

    def _length(self, layer: int) -> int:
        """Positions as transformers counts them: row 0's, its left padding included."""
        seq = self.sequence
        if seq is None or seq.closed:
            return 0
        stored = seq.length(layer)
        return stored + self.starts[0] if stored else 0

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

    def _open(self, module, query, key, scaling: float, starts: list[int]) -> None:
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

        def open_rows(runtime):
            return [
                runtime.open(
                    policy=self.policy,
                    prompt_tokens=query_tokens - starts[row],
                    hbm_ratio=self.hbm_ratio,
                    evict_ratio=self.evict_ratio,
                    compress_ratio=self.compress_ratio,
                    sink_tokens=self.sink_tokens,
                    window_tokens=self.window_tokens,
                    protect_prompt=self.protect_prompt,
                    # Counted in the (left-padded) input, like the tokens the caller sees.
                    protected_prompt_begin=max(0, self.protected_prompt_begin - starts[row]),
                    retier_interval=self.retier_interval,
                    max_lost_mass=math.inf if self.max_lost_mass is None else self.max_lost_mass,
                    wait_for_plans=self.wait_for_plans,
                    tag=self.tag if batch == 1 else f"{self.tag}[{row}]",
                )
                for row in range(batch)
            ]

        if self.daemon is None:
            self.sequences = open_rows(self._runtime(shape, None)[1])
        else:
            self.sequences = self._open_at_daemon(shape, open_rows)
        self.starts = list(starts)

    def _runtime(self, shape: tuple, daemon: str | None):
        key = shape + (self.page_tokens, self.codec, daemon or "")
        if daemon is None:
            key += (self.local_ddr_bytes, self.local_compressed_bytes)
        runtime = _runtime_for(
            key,
            lambda: _native.Runtime(
                *shape,
                page_tokens=self.page_tokens,
                codec=self.codec,
                daemon=daemon or "",
                worker_name="kvtier-python",
                ddr_bytes=self.local_ddr_bytes,
                compressed_bytes=self.local_compressed_bytes,
            ),
        )
        return key, runtime

    def _open_at_daemon(self, shape: tuple, open_rows):
        """Opens the rows at kvtierd. A shared runtime whose session a restart ended (NotFound,
        "register again") or whose connection went stale (Unavailable) is replaced once; a
        daemon that stays unreachable leaves the rows on local pools (local_fallback)."""
        for attempt in (0, 1):
            try:
                key, runtime = self._runtime(shape, self.daemon)
            except _native.UnavailableError as error:
                return self._fall_back(shape, open_rows, error)
            try:
                return open_rows(runtime)
            except (_native.NotFoundError, _native.FailedPreconditionError,
                    _native.UnavailableError) as error:
                stale = not isinstance(error, _native.FailedPreconditionError) or (
                    "register again" in str(error))
                if not stale:
                    raise
                _forget_runtime(key, runtime)
                if attempt == 1:
                    if isinstance(error, _native.UnavailableError):
                        return self._fall_back(shape, open_rows, error)
                    raise
        raise AssertionError("unreachable")

    def _fall_back(self, shape: tuple, open_rows, error):
        if not self.local_fallback:
            raise error
        warnings.warn(
            f"TieredCache: kvtierd at {self.daemon} is unreachable ({error}); this cache's "
            "sequences use local pools in this process (the next cache tries kvtierd again)",
            RuntimeWarning,
            stacklevel=4,
        )
        self.fell_back = True
        return open_rows(self._runtime(shape, None)[1])

    def _attend(self, module, layer: int, query, key, value, scaling, window, softcap, mask):
        if query.device.type != "cpu":
            raise TypeError(
                f"TieredCache: the query is on {query.device}; kvtier's CPU kernel reads host "
                "memory (the CUDA backend is the GPU path: docs/python.md)"
            )
        batch, heads, n, head_dim = query.shape
        past = self._length(layer)
        starts = _left_padding(mask, batch, past + n)
        if not self.sequences:
            if layer != 0:
                raise RuntimeError(f"TieredCache: the first forward pass began at layer {layer}")
            starts = starts or [0] * batch
            for row, start in enumerate(starts):
                if start >= n:
                    raise NotImplementedError(
                        f"TieredCache: row {row} of the first forward pass is all padding "
                        f"({start} of {n} positions); nothing was stored"
                    )
            self._open(module, query, key, scaling, starts)
        elif batch != len(self.sequences):
            raise ValueError(f"TieredCache holds {len(self.sequences)} rows; this call has {batch}")
        elif starts is not None and starts != self.starts:
            raise NotImplementedError(
                f"TieredCache: the padding changed after the first forward pass (rows start at "
                f"{self.starts}, the mask now says {starts}): only left padding of the prompt is "
                "supported"
            )
        dtype = query.dtype
        out = torch.zeros((batch, n, heads, head_dim), dtype=torch.float32)
        for row, seq in enumerate(self.sequences):
            # Positions of this call that are the row's left padding are not stored; their
            # outputs stay 0 (no real position ever attends them).
            skip = max(0, self.starts[row] - past)
            # The kernel reads transformers' [heads, n, head_dim] views where they lie (no
            # copy); it computes in float32, so other dtypes are converted at this edge.
            k = key[row, :, skip:].detach().to(torch.float32)
            v = value[row, :, skip:].detach().to(torch.float32)
            seq.append_heads_first(layer, k, v)
            q = query[row, :, skip:].detach().to(torch.float32)
            seq.attend_heads_first(layer, q, out[row, skip:], window=window, softcap=softcap)
        return (out if dtype == torch.float32 else out.to(dtype)), None


def _left_padding(mask, batch: int, length: int) -> list[int] | None:
    """Each row's left padding from kvtier_mask's 2-D padding mask (None: no mask). Refuses, by
    name, a mask that is not left padding (right padding, holes) or of another shape."""
    if mask is None:
        return None
    if mask.dim() != 2:
        raise NotImplementedError(
            f"TieredCache: a custom {mask.dim()}-D attention mask; kvtier's kernel computes causal "
            "attention (with the layer's window) over each row's own positions. Pass a 2-D "
            "padding mask (left padding), or use attn_implementation='eager' and a DynamicCache"
        )
    if mask.shape[0] != batch or mask.shape[1] < length:
        raise ValueError(
            f"TieredCache: the padding mask is {list(mask.shape)}; the call needs "
            f"[{batch}, >= {length}]"
        )
    mask = mask[:, :length].to(torch.bool)
    starts = (~mask).to(torch.int64).cumprod(dim=1).sum(dim=1)
    positions = torch.arange(length)[None, :]
    if not torch.equal(mask, positions >= starts[:, None]):
        raise NotImplementedError(
            "TieredCache: padding other than on the left (right padding, or masked positions "
            "between real ones) is not supported: pad on the left (tokenizer.padding_side = "
            "'left', what generate expects) — nothing was stored"
        )
    return [int(x) for x in starts]


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
    # Only where cache= is not a parameter (before 5.24) does it reach here unread.
    unread = CACHE_KEYWORD != "cache" and isinstance(kwargs.get("cache"), TieredCache)
    if pending is None and unread:
        raise TypeError(
            f"a TieredCache passed as cache= reached the attention unread: transformers "
            f"{transformers.__version__} takes the cache as past_key_values= (cache= from 5.24); "
            "nothing was stored. Pass **kvtier.hf.cache_kwargs(cache) for either"
        )
    window, softcap = _check_call(module, query, key, value, dropout, dict(kwargs))
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if pending is None:
        return _eager(module, query, key, value, scaling, window, softcap, attention_mask)
    return pending.cache._attend(module, pending.layer, query, key, value, scaling, window,
                                 softcap, attention_mask)


def _eager(module, query, key, value, scaling, window: int, softcap: float, attention_mask):
    """No TieredCache: eager attention with the mask kvtier_mask does not build (causal, the
    queries are the last positions, and the window), the padding it passes on (2-D) or a
    custom 4-D mask, and the softcap, as the kernel computes."""
    q, kv = query.shape[2], key.shape[2]
    lowest = torch.finfo(query.dtype).min
    if attention_mask is not None and attention_mask.dim() == 4:
        mask = attention_mask[:, :, :, -kv:]
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=query.dtype).masked_fill(~mask, lowest)
    else:
        query_pos = torch.arange(kv - q, kv, device=query.device)[:, None]
        key_pos = torch.arange(kv, device=query.device)[None, :]
        allowed = (key_pos <= query_pos)[None, None]
        if window:
            allowed = allowed & (key_pos > query_pos - window)
        if attention_mask is not None:  # kvtier_mask's padding: [batch, >= kv] positions
            allowed = allowed & attention_mask[:, None, None, -kv:].to(torch.bool)
        mask = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
        mask.masked_fill_(~allowed, lowest)
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap:
        weights = torch.tanh(weights / softcap) * softcap
    weights = torch.softmax(weights + mask, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def kvtier_mask(batch_size, q_length=None, kv_length=None, q_offset=0, kv_offset=0,
                mask_function=None, attention_mask=None, **kwargs):
    """The ``"kvtier"`` mask: kvtier's kernel is causal, windowed and skips evicted positions
    itself, so only padding adds anything: the 2-D padding mask is passed on (positions past
    its end are real), None without padding. The attention call reads each row's left padding
    from it and refuses any other. (transformers < 5.3 passes cache_position instead of
    q_length and q_offset, which this does not need.)"""
    if attention_mask is None or attention_mask.dim() != 2 or bool(attention_mask.all()):
        return None
    missing = kv_length + kv_offset - attention_mask.shape[-1]
    if missing > 0:
        attention_mask = torch.nn.functional.pad(attention_mask, (0, missing), value=True)
    return attention_mask.to(torch.bool)


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

_prepare_cache = GenerationMixin._prepare_cache_for_generation


def _kvtier_prepare_cache(self, generation_config, model_kwargs, *args, **kwargs):
    """generate() with a TieredCache and beams: refused before the prefill stores anything."""
    cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    if isinstance(cache, TieredCache) and (generation_config.num_beams or 1) > 1:
        _refuse_beams(f"generate(num_beams={generation_config.num_beams})")
    return _prepare_cache(self, generation_config, model_kwargs, *args, **kwargs)


GenerationMixin._prepare_cache_for_generation = _kvtier_prepare_cache
AttentionInterface.register(ATTN_IMPLEMENTATION, kvtier_attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, kvtier_mask)
