"""kvtier.vllm's figures in one run, on the real vLLM package (its own environment):
lookup latency (p50/p99) of the tier vLLM builds, through vLLM's manager and alone, and the
tier's copy rate (GB/s) for stores and loads against numpy's memcpy of the same bytes.

    $KVTIER_HOME/vllm-venv/bin/python bench/python/vllm_tier.py [--blocks 256] [--block-kib 256]

Needs a built tree (build/bin/kvtierd, build/python/kvtier/_native*.so): it starts its own
kvtierd with a block store. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("KVTIER_BUILD_DIR", REPO / "build"))
sys.path[:0] = [str(BUILD / "python"), str(REPO / "python"), str(REPO / "python" / "tests" / "vllm")]
os.environ.setdefault("KVTIER_BUILD_DIR", str(BUILD))

import numpy as np  # noqa: E402
from conftest import Daemon  # noqa: E402  (python/tests/vllm/conftest.py: a real kvtierd)
from engine import Engine, key, region_path  # noqa: E402  (vLLM's manager with kvtier.vllm)


def percentiles(samples_s: list[float]) -> dict:
    a = np.sort(np.asarray(samples_s)) * 1e6
    return {"p50_us": round(float(np.percentile(a, 50)), 3),
            "p99_us": round(float(np.percentile(a, 99)), 3), "n": len(a)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--block-kib", type=int, default=256)
    ap.add_argument("--lookups", type=int, default=20000)
    args = ap.parse_args()
    block = args.block_kib << 10
    space_mib = max(4, (2 * args.blocks * block) >> 20)
    d = Daemon(extra_config=f"[blocks]\nmib = {space_mib + 16}\nspace_mib = {space_mib}\n")
    try:
        a = Engine(d.address, f"bench-a-{os.getpid()}", block, args.blocks, {})
        b = Engine(d.address, f"bench-b-{os.getpid()}", block, args.blocks, {})
        # Stores: vLLM's cascade from a's primary tier into kvtierd.
        # (Not timed: the engine stand-in generates each block's bytes, which dominates.)
        assert a.store(seed=1, n=args.blocks)["stored"] == args.blocks
        # Loads: b's lookups find them in kvtierd, vLLM promotes them into b's primary tier.
        got = b.load(seed=1, n=args.blocks)
        assert got["identical"] == args.blocks, got
        # The copies alone, as the tier's thread does them (kvtier._native, GIL released).
        store = a.tier._store
        keys = [key(2, i) for i in range(args.blocks)]
        rows = list(range(args.blocks))
        t0 = time.perf_counter()
        ticket, slots = store.begin_store(keys)
        t1 = time.perf_counter()
        store.write(slots, a.view, rows)  # first touch of these arena pages: faults them in
        t2 = time.perf_counter()
        store.write(slots, a.view, rows)
        warm_store_s = time.perf_counter() - t2
        t2 = time.perf_counter()
        store.finish_store(ticket, True)
        t3 = time.perf_counter()
        lease, lslots = store.acquire(keys)
        t4 = time.perf_counter()
        store.read(lslots, a.view, rows)
        t5 = time.perf_counter()
        store.release(lease)
        nbytes = args.blocks * block
        src = np.frombuffer(a.view, dtype=np.uint8).reshape(args.blocks, block)
        dst = np.empty_like(src)
        memcpy = []
        for _ in range(5):
            t = time.perf_counter()
            np.copyto(dst, src)
            memcpy.append(time.perf_counter() - t)
        # Lookups: the tier alone (the shared table), and vLLM's manager (primary tier first, then
        # the tier: b's primary holds seed 1 now, so use keys only kvtierd holds).
        hit, miss = key(2, 0), key(99, 0)
        tier_hit, tier_miss = [], []
        from vllm.v1.kv_offload.base import ReqContext  # noqa: PLC0415

        req = ReqContext(req_id="bench")
        for i in range(args.lookups):
            k = hit if i % 2 == 0 else miss
            t = time.perf_counter()
            b.tier.lookup(k, req)
            (tier_hit if i % 2 == 0 else tier_miss).append(time.perf_counter() - t)
        b.m.on_new_request(req)
        mgr_miss = []
        for _ in range(args.lookups // 2):
            t = time.perf_counter()
            b.m.lookup(miss, req)
            mgr_miss.append(time.perf_counter() - t)
        out = {
            "block_bytes": block,
            "blocks": args.blocks,
            "lookup_tier_hit": percentiles(tier_hit),
            "lookup_tier_miss": percentiles(tier_miss),
            "lookup_vllm_manager_miss": percentiles(mgr_miss),
            "copy_store_first_touch_GBps": round(nbytes / (t2 - t1 - warm_store_s) / 1e9, 2),
            "copy_store_GBps": round(nbytes / warm_store_s / 1e9, 2),
            "copy_load_GBps": round(nbytes / (t5 - t4) / 1e9, 2),
            "memcpy_GBps": round(nbytes / min(memcpy) / 1e9, 2),
            "daemon_begin_store_ms": round((t1 - t0) * 1e3, 3),
            "daemon_finish_store_ms": round((t3 - t2) * 1e3, 3),
            "daemon_acquire_ms": round((t4 - t3) * 1e3, 3),
        }
        print(json.dumps(out, indent=1))
        a.m.shutdown()
        b.m.shutdown()
    finally:
        d.stop()
        for who in ("a", "b"):
            Path(region_path(f"bench-{who}-{os.getpid()}")).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
