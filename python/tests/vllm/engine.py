"""One vLLM engine's offloading manager, as vLLM builds it, with kvtier.vllm as its secondary tier:
the tests' and the bench's stand-in for a vLLM engine process on a machine without a GPU.

vLLM's TieringOffloadingSpec, its CPU primary tier (a SharedOffloadRegion in host memory) and its
TieringOffloadingManager are the real ones; what a GPU would do (copy KV blocks between HBM and
the primary tier) is done by writing and reading the primary tier's rows here.

Reads JSON commands on stdin, one per line, and answers one JSON line each on stdout:
  {"op": "store", "seed": S, "n": N}  blocks of keys K(S, 0..N) through prepare_store/complete_store
  {"op": "load", "seed": S, "n": N}   lookups, promotions and prepare_load; whether each block read
                                      is byte-identical to what K(S, i) must hold
  {"op": "stats"}                     kvtier's counters and vLLM's back-pressure state
  {"op": "stall_stores"}              the next store stops inside its copy (after the daemon granted
                                      slots, before it publishes them) and says "stalled"
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time

import numpy as np
from vllm.v1.kv_offload.base import (
    LookupResult,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec


def region_path(engine_id: str) -> str:
    """Where vLLM's CPU tier keeps its region (SharedOffloadRegion), which it leaves behind."""
    return f"/dev/shm/vllm_offload_{engine_id}.mmap"


def key(seed: int, i: int) -> bytes:
    return make_offload_key(hashlib.sha256(f"{seed}:{i}".encode()).digest(), 0)


def content(k: bytes, n: int) -> np.ndarray:
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(k).digest()[:8], "little"))
    return rng.integers(-128, 128, size=n, dtype=np.int8)


def make_manager(address: str, engine_id: str, block_bytes: int, cpu_blocks: int, tier: dict):
    tier_config = {"type": "KvtierTier", "module_path": "kvtier.vllm", "daemon": address, **tier}
    cfg = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0",), group_id=0),),
        worker_kv_bytes_per_block=block_bytes,
        enable_kv_cache_events=False,
        extra_config={
            "cpu_bytes_to_use": block_bytes * cpu_blocks,
            "secondary_tiers": [tier_config],
            "tier_poll_interval_s": 0,
        },
        engine_id=engine_id,
        model=OffloadingModelConfig(name="kvtier-test-model", dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=0,
            is_parallelism_agnostic=False,
        ),
    )
    spec = TieringOffloadingSpec(cfg)
    return spec, spec.get_manager()


class Engine:
    def __init__(self, address: str, engine_id: str, block_bytes: int, cpu_blocks: int, tier):
        self.spec, self.m = make_manager(address, engine_id, block_bytes, cpu_blocks, tier)
        self.tier = self.m.secondary_tiers[0]
        self.view = self.m.primary_tier.get_kv_memoryview()
        self.block_bytes = block_bytes
        self.rows = np.frombuffer(self.view, dtype=np.int8).reshape(self.view.shape)
        self.requests = 0

    def step(self) -> None:
        self.m.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))

    def settle(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.m.has_pending_work() and time.monotonic() < deadline:
            self.step()
            time.sleep(0.001)
        self.step()

    def request(self) -> ReqContext:
        self.requests += 1
        req = ReqContext(req_id=f"{os.getpid()}-{self.requests}")
        self.m.on_new_request(req)
        return req

    def store(self, seed: int, n: int) -> dict:
        keys = [key(seed, i) for i in range(n)]
        req = self.request()
        out = self.m.prepare_store(keys, req)
        stored = list(out.keys_to_store) if out is not None else []
        if out is not None:
            for k, row in zip(out.keys_to_store, out.store_spec.chunk_ids):
                self.rows[int(row)] = content(k, self.block_bytes)  # the GPU's copy to the CPU
        self.m.complete_store(stored, req)
        self.m.on_request_finished(req)
        self.settle()
        return {"stored": len(stored)}

    def load(self, seed: int, n: int, timeout_s: float = 20.0) -> dict:
        keys = [key(seed, i) for i in range(n)]
        req = self.request()
        results = {}
        deadline = time.monotonic() + timeout_s
        pending = list(keys)
        while pending and time.monotonic() < deadline:
            still = []
            for k in pending:
                r = self.m.lookup(k, req)
                if r in (LookupResult.HIT, LookupResult.MISS):
                    results[k] = r
                else:
                    still.append(k)
            pending = still
            if pending:
                self.step()
                time.sleep(0.001)
        hits = [k for k in keys if results.get(k) is LookupResult.HIT]
        identical = 0
        if hits:
            spec = self.m.prepare_load(hits, req)
            for k, row in zip(hits, spec.chunk_ids):  # the GPU's copy from the CPU
                identical += bool(np.array_equal(self.rows[int(row)], content(k, self.block_bytes)))
            self.m.complete_load(hits, req)
        self.m.on_request_finished(req)
        self.settle()
        return {"hits": len(hits), "identical": identical, "unsettled": len(pending)}

    def stats(self) -> dict:
        s = self.tier.kvtier_stats()
        bp = self.tier.bp_detector
        if bp is not None:
            s["under_pressure"] = bp.is_under_pressure()
            s["stores_dropped"], s["blocks_dropped"] = bp.policy.pop_stores_dropped()
        return s

    def stall_stores(self) -> dict:
        """Makes the next store stop inside its copy, after the daemon granted its slots."""
        real = self.tier._store

        class Stalling:
            def __getattr__(self, name):
                return getattr(real, name)

            def write(self, *args):
                print(json.dumps({"stalled": True}), flush=True)
                threading.Event().wait()  # until SIGKILL

        self.tier._store = Stalling()
        return {"armed": True}


def main() -> None:
    address, engine_id = sys.argv[1], sys.argv[2]
    block_bytes = int(sys.argv[3]) if len(sys.argv) > 3 else 16384
    tier = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    engine = Engine(address, engine_id, block_bytes, cpu_blocks=256, tier=tier)
    print(json.dumps({"ready": True, "space": engine.tier.kvtier_stats()["space"]}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            if op == "store":
                out = engine.store(**cmd)
            elif op == "load":
                out = engine.load(**cmd)
            elif op == "stats":
                out = engine.stats()
            elif op == "stall_stores":
                out = engine.stall_stores()
            else:
                out = {"error": f"unknown op {op}"}
        except Exception as e:  # the test reads it: an error on the request path fails it
            out = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out, default=str), flush=True)


if __name__ == "__main__":
    main()
