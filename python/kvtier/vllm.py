"""kvtier.vllm: one kvtierd block store per host, shared by every vLLM engine on it.

A vLLM (0.33+) secondary offloading tier (``SecondaryTierManager``) whose store is kvtierd's
block store: blocks go there by vLLM's offload key, and every engine of the same trust domain
that serves the same model and KV layout finds them, across engine restarts. Two lines of vLLM
config (docs/vllm.md)::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 8589934592,
        "secondary_tiers": [{"type": "KvtierTier", "module_path": "kvtier.vllm",
                             "daemon": "unix:/run/kvtier/kvtierd.sock"}]}}'

What vLLM asks of a tier, and how this one keeps it:
- every method runs in the scheduler and must not block: lookups read the table kvtierd shares
  (no call to the daemon); copies and the daemon's calls run on this tier's own thread;
- a store the daemon has no room for fails its job, which vLLM's back-pressure detector counts
  (with ``DropStorePolicy``, later stores are dropped until it recovers): never an error on the
  request path;
- kvtierd gone or restarted: lookups miss, jobs fail (vLLM recomputes), and the tier reconnects
  in the background.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

try:
    from vllm.v1.kv_offload.base import (
        LookupResult,
        Medium,
        OffloadingCounterMetadata,
        OffloadKey,
        ReqContext,
        RequestOffloadingContext,
    )
    from vllm.v1.kv_offload.tiering.base import (
        JobResult,
        SecondaryTierManager,
        TransferJob,
    )
except ImportError as e:  # pragma: no cover - depends on the vLLM installed
    raise ImportError(
        "kvtier.vllm needs vLLM 0.33 or later, whose vllm.v1.kv_offload.tiering has the "
        f"SecondaryTierManager plug point ({e})"
    ) from e

import kvtier

logger = logging.getLogger(__name__)

# vLLM's offload key: the block hash (sha256: 32 bytes by default) and a 4-byte group index.
DEFAULT_KEY_BYTES = 36
# A daemon call waits at most this long; the copy thread, never the scheduler, waits.
DEFAULT_TIMEOUT_S = 2.0
# The most keys in one daemon call (its bound per request).
MAX_KEYS_PER_CALL = 1024


class KvtierMetrics:
    """kvtier's own counters, beside vLLM's ``vllm:kv_offload_tiering_*``."""

    LOOKUPS = "kvtier:vllm_lookups"
    LOOKUP_HITS = "kvtier:vllm_lookup_hits"
    BLOCKS_STORED = "kvtier:vllm_blocks_stored"
    BLOCKS_SKIPPED = "kvtier:vllm_blocks_already_stored"
    BLOCKS_NO_ROOM = "kvtier:vllm_blocks_no_room"
    BLOCKS_LOADED = "kvtier:vllm_blocks_loaded"
    LOAD_MISSES = "kvtier:vllm_load_misses"
    DAEMON_ERRORS = "kvtier:vllm_daemon_errors"
    RECONNECTS = "kvtier:vllm_reconnects"
    BAD_KEYS = "kvtier:vllm_bad_keys"

    ALL = (
        LOOKUPS,
        LOOKUP_HITS,
        BLOCKS_STORED,
        BLOCKS_SKIPPED,
        BLOCKS_NO_ROOM,
        BLOCKS_LOADED,
        LOAD_MISSES,
        DAEMON_ERRORS,
        RECONNECTS,
        BAD_KEYS,
    )


def default_space(offloading_spec: Any, block_bytes: int) -> str:
    """A namespace for blocks that only engines with the same model and KV layout share.

    Two engines whose blocks differ in any of these must never read each other's: the key is
    a hash of tokens only.
    """
    cfg = getattr(offloading_spec, "config", None)
    parts = [f"block_bytes={block_bytes}"]
    if cfg is not None:
        model, par = cfg.model, cfg.parallel
        parts += [
            f"model={model.name}",
            f"dtype={model.dtype}",
            f"tokens_per_hash={cfg.cache.tokens_per_hash}",
            f"blocks_per_chunk={cfg.cache.blocks_per_chunk}",
            f"kv_bytes_per_block={cfg.worker_kv_bytes_per_block}",
            f"layout={cfg.kv_cache_layout}",
            f"canonical={cfg.canonical_layout}",
            f"tp={par.tp_size}",
            f"pp={par.pp_size}",
            f"pcp={par.pcp_size}",
            f"dcp={par.dcp_size}",
        ]
    digest = hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]
    name = cfg.model.name if cfg is not None else "unknown"
    return f"vllm:{name[-160:]}:{digest}"


@dataclass
class _Job:
    job: TransferJob
    store: bool


_RECONNECT = object()  # asks the copy thread to reconnect


class KvtierTier(SecondaryTierManager):
    """A vLLM secondary tier backed by kvtierd's node-wide block store. See the module doc."""

    medium: ClassVar[Medium] = Medium.CPU

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        daemon: str = "unix:/run/kvtier/kvtierd.sock",
        space: str | None = None,
        key_bytes: int = DEFAULT_KEY_BYTES,
        want_mib: int = 0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        reconnect_s: float = 1.0,
        backpressure_detector: Any = None,
        **unknown: Any,
    ) -> None:
        super().__init__(
            offloading_spec=offloading_spec,
            primary_kv_view=primary_kv_view,
            tier_type=tier_type,
            backpressure_detector=backpressure_detector,
        )
        if unknown:
            raise ValueError(
                f"KvtierTier: unknown option(s) {sorted(unknown)}; known: daemon, space, "
                "key_bytes, want_mib, timeout_s, reconnect_s, backpressure"
            )
        if not 1 <= key_bytes <= 64:
            raise ValueError(f"KvtierTier: key_bytes = {key_bytes}; must be 1..64")
        self._view = primary_kv_view
        self._daemon = daemon
        self._space = space or default_space(offloading_spec, self.block_size_bytes)
        self._key_bytes = key_bytes
        self._want_bytes = int(want_mib) << 20
        self._timeout_s = timeout_s
        self._reconnect_s = reconnect_s
        self._counts = dict.fromkeys(KvtierMetrics.ALL, 0)
        self._counts_lock = threading.Lock()
        self._reported: dict[str, int] = {}
        self._store: kvtier.BlockStore | None = None
        self._next_connect = 0.0
        self._reconnect_asked = False
        # Refusals (wrong domain, bad sizes) are the operator's to fix: fail at engine start.
        # A daemon not (yet) there is not: start with misses and reconnect.
        try:
            self._store = self._open()
        except kvtier.UnavailableError as e:
            logger.warning("kvtier: kvtierd unavailable at start (%s); lookups miss until it is", e)
        self._jobs: queue.Queue[Any] = queue.Queue()
        self._finished: list[JobResult] = []
        self._finished_lock = threading.Lock()
        self._in_flight = 0
        self._idle = threading.Condition(self._finished_lock)
        self._thread = threading.Thread(target=self._run, name="kvtier-vllm-copy", daemon=True)
        self._thread.start()

    # ---- the scheduler's calls: none blocks ----

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self._count(KvtierMetrics.LOOKUPS)
        store = self._store
        if store is None:
            self._ask_reconnect()
            return LookupResult.MISS
        if len(key) != self._key_bytes:
            self._count(KvtierMetrics.BAD_KEYS)
            return LookupResult.MISS
        if store.lookup(bytes(key)):
            self._count(KvtierMetrics.LOOKUP_HITS)
            return LookupResult.HIT
        return LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(_Job(job_metadata, store=True))

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(_Job(job_metadata, store=False))

    def get_finished_jobs(self) -> Iterable[JobResult]:
        with self._finished_lock:
            out, self._finished = self._finished, []
        return out

    def has_pending_work(self) -> bool:
        with self._finished_lock:
            return self._in_flight > 0 or bool(self._finished)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def drain_jobs(self) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._in_flight == 0)

    def shutdown(self) -> None:
        self.drain_jobs()
        self._jobs.put(None)
        self._thread.join(timeout=self._timeout_s * 2)
        self._store = None

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        return {
            name: OffloadingCounterMetadata(documentation=f"kvtier block store: {name}")
            for name in KvtierMetrics.ALL
        }

    def get_stats(self) -> Any:
        """kvtier's counters since the last call, as vLLM's offloading stats (Prometheus)."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
            OffloadingConnectorStats,
        )

        with self._counts_lock:
            deltas = {k: v - self._reported.get(k, 0) for k, v in self._counts.items()}
            self._reported = dict(self._counts)
        stats = OffloadingConnectorStats()
        for name, delta in deltas.items():
            if delta:
                stats.increase_counter(name, delta)
        return None if stats.is_empty() else stats

    def kvtier_stats(self) -> dict[str, Any]:
        """kvtier's counters and the daemon's counts of the space (last reply)."""
        with self._counts_lock:
            out: dict[str, Any] = dict(self._counts)
        store = self._store
        out["connected"] = store is not None
        out["space"] = self._space
        if store is not None:
            out["daemon"] = store.stats()
        return out

    # ---- the copy thread ----

    def _submit(self, job: _Job) -> None:
        with self._finished_lock:
            self._in_flight += 1
        self._jobs.put(job)

    def _ask_reconnect(self) -> None:
        # The copy thread reconnects; the scheduler only asks, at most once per reconnect_s.
        now = time.monotonic()
        if not self._reconnect_asked and now >= self._next_connect:
            self._reconnect_asked = True
            self._jobs.put(_RECONNECT)

    def _count(self, name: str, n: int = 1) -> None:
        with self._counts_lock:
            self._counts[name] += n

    def _open(self) -> kvtier.BlockStore:
        return kvtier.BlockStore(
            self._daemon,
            self._space,
            self.block_size_bytes,
            self._key_bytes,
            want_bytes=self._want_bytes,
            timeout_s=self._timeout_s,
        )

    def _connected(self) -> kvtier.BlockStore | None:
        if self._store is not None:
            return self._store
        now = time.monotonic()
        if now < self._next_connect:
            return None
        self._next_connect = now + self._reconnect_s
        try:
            self._store = self._open()
            self._count(KvtierMetrics.RECONNECTS)
            logger.info("kvtier: connected to kvtierd's block store (space %s)", self._space)
        except kvtier.Error as e:
            logger.debug("kvtier: reconnect failed: %s", e)
        return self._store

    def _lost(self, store: kvtier.BlockStore, e: Exception) -> None:
        # The daemon no longer answers for this space (gone, restarted, refused): forget the
        # mapping so that lookups miss, and reconnect later.
        self._count(KvtierMetrics.DAEMON_ERRORS)
        if self._store is store:
            logger.warning("kvtier: block store call failed (%s); reconnecting", e)
            self._store = None
            self._next_connect = time.monotonic() + self._reconnect_s

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job is _RECONNECT:
                self._connected()
                self._reconnect_asked = False
                continue
            t0 = time.monotonic()
            try:
                ok, moved, loaded_keys = self._do(job)
            except Exception:  # never let the thread die: the job fails, vLLM recomputes
                logger.exception("kvtier: transfer job %d failed", job.job.job_id)
                ok, moved, loaded_keys = False, 0, None
            result = JobResult(
                job_id=job.job.job_id,
                success=ok,
                successful_keys=loaded_keys,
                transfer_time=time.monotonic() - t0,
                transfer_bytes=moved,
            )
            with self._finished_lock:
                self._finished.append(result)
                self._in_flight -= 1
                self._idle.notify_all()

    def _do(self, job: _Job) -> tuple[bool, int, list[OffloadKey] | None]:
        store = self._connected()
        if store is None:
            return False, 0, None
        keys = [bytes(k) for k in job.job.keys]
        rows = [int(c) for c in job.job.chunk_ids]
        if any(len(k) != self._key_bytes for k in keys):
            self._count(KvtierMetrics.BAD_KEYS)
            return False, 0, None
        ok, moved, loaded = True, 0, []
        for i in range(0, len(keys), MAX_KEYS_PER_CALL):
            part, part_rows = keys[i : i + MAX_KEYS_PER_CALL], rows[i : i + MAX_KEYS_PER_CALL]
            try:
                if job.store:
                    part_ok, part_moved = self._store_part(store, part, part_rows)
                else:
                    part_ok, part_moved, part_loaded = self._load_part(store, part, part_rows)
                    loaded += part_loaded
            except kvtier.Error as e:
                self._lost(store, e)
                return False, moved, (loaded if not job.store else None)
            ok = ok and part_ok
            moved += part_moved
        return ok, moved, (None if job.store or ok else loaded)

    def _store_part(self, store: kvtier.BlockStore, keys: list[bytes], rows: list[int]):
        ticket, slots = store.begin_store(keys)
        granted = [(s, r) for s, r in zip(slots, rows) if s >= 0]
        self._count(KvtierMetrics.BLOCKS_SKIPPED, sum(1 for s in slots if s == -1))
        no_room = sum(1 for s in slots if s == -2)
        self._count(KvtierMetrics.BLOCKS_NO_ROOM, no_room)
        if ticket:
            try:
                store.write([s for s, _ in granted], self._view, [r for _, r in granted])
            except BaseException:
                store.finish_store(ticket, False)
                raise
            store.finish_store(ticket, True)
            self._count(KvtierMetrics.BLOCKS_STORED, len(granted))
        # A store without room failed: vLLM's detector counts it (back-pressure).
        return no_room == 0, len(granted) * self.block_size_bytes

    def _load_part(self, store: kvtier.BlockStore, keys: list[bytes], rows: list[int]):
        ticket, slots = store.acquire(keys)
        hits = [(k, s, r) for k, s, r in zip(keys, slots, rows) if s >= 0]
        misses = len(keys) - len(hits)
        self._count(KvtierMetrics.LOAD_MISSES, misses)
        if ticket:
            try:
                store.read([s for _, s, _ in hits], self._view, [r for _, _, r in hits])
            finally:
                store.release(ticket)
            self._count(KvtierMetrics.BLOCKS_LOADED, len(hits))
        return misses == 0, len(hits) * self.block_size_bytes, [k for k, _, _ in hits]


__all__ = ["KvtierTier", "KvtierMetrics", "default_space"]
