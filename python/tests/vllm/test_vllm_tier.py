"""kvtier.vllm against the real vLLM package: the offloading managers vLLM builds (its
TieringOffloadingSpec, CPU primary tier and TieringOffloadingManager) in separate engine
processes, sharing one real kvtierd's block store."""

from __future__ import annotations

import time

import pytest

import kvtier

# Back-pressure as docs/vllm.md configures it: failed stores put the tier under pressure and
# DropStorePolicy drops stores until it recovers.
BACKPRESSURE = {
    "backpressure": {
        "backpressure_cls": "EMABackpressureDetector",
        "policy_cls": "DropStorePolicy",
        "failure_threshold": 3,
        "decay_half_life_s": 60,
    }
}


def test_a_block_stored_by_one_engine_is_a_byte_identical_hit_for_another(
    blocks_daemon, engines
):
    a = engines(blocks_daemon.address, "engine-a")
    b = engines(blocks_daemon.address, "engine-b")
    assert a.hello["space"] == b.hello["space"]
    assert a.call(op="store", seed=1, n=40) == {"stored": 40}
    stats = a.call(op="stats")
    assert stats["kvtier:vllm_blocks_stored"] == 40
    assert stats["daemon"]["published"] == 40
    got = b.call(op="load", seed=1, n=40)
    assert got == {"hits": 40, "identical": 40, "unsettled": 0}
    # Keys nobody stored miss, in both.
    assert b.call(op="load", seed=2, n=5)["hits"] == 0
    stats = b.call(op="stats")
    assert stats["kvtier:vllm_blocks_loaded"] == 40
    assert stats["daemon"]["leased"] == 0  # every lease given back


def test_an_engine_killed_mid_store_leaves_no_visible_block_and_no_leak(blocks_daemon, engines):
    block = 16384
    slots = (4 << 20) // block  # space_mib = 4
    a = engines(blocks_daemon.address, "engine-a", block)
    assert a.call(op="stall_stores") == {"armed": True}
    a.proc.stdin.write('{"op": "store", "seed": 7, "n": 8}\n')
    a.proc.stdin.flush()
    assert a.read() == {"stalled": True}  # slots granted, copy under way
    a.kill()
    b = engines(blocks_daemon.address, "engine-b", block)
    assert b.call(op="load", seed=7, n=8)["hits"] == 0  # nothing half-visible
    # Every slot can be granted again: the dead engine's 8 pending slots went back.
    assert b.call(op="store", seed=8, n=slots) == {"stored": slots}
    stats = b.call(op="stats")
    assert stats["kvtier:vllm_blocks_no_room"] == 0
    assert stats["daemon"]["pending"] == 0
    assert stats["daemon"]["owners_dropped"] >= 1
    assert stats["daemon"]["published"] == slots


def test_a_restarted_engine_finds_its_blocks_again(blocks_daemon, engines):
    a = engines(blocks_daemon.address, "engine-a")
    assert a.call(op="store", seed=3, n=10) == {"stored": 10}
    a.close()
    again = engines(blocks_daemon.address, "engine-a2")
    assert again.call(op="load", seed=3, n=10)["identical"] == 10


def test_kvtierd_restarted_engines_miss_without_hanging_and_reconnect(blocks_daemon, engines):
    a = engines(blocks_daemon.address, "engine-a", tier={"reconnect_s": 0.2})
    b = engines(blocks_daemon.address, "engine-b", tier={"reconnect_s": 0.2})
    assert a.call(op="store", seed=4, n=10) == {"stored": 10}
    blocks_daemon.stop(keep=True)
    t0 = time.monotonic()
    got = b.call(op="load", seed=4, n=10)  # the table still says yes; the daemon is gone
    assert got["hits"] == 0 and got["unsettled"] == 0
    assert time.monotonic() - t0 < 15
    assert a.call(op="store", seed=5, n=4)["stored"] == 4  # no error on the request path
    blocks_daemon.start()
    time.sleep(0.3)
    # The first store after the restart reconnects (a fresh, empty space), the next is kept.
    deadline = time.monotonic() + 20
    while a.call(op="stats")["kvtier:vllm_reconnects"] == 0 and time.monotonic() < deadline:
        a.call(op="store", seed=int(time.monotonic() * 1000), n=1)
        time.sleep(0.2)
    assert a.call(op="store", seed=6, n=10) == {"stored": 10}
    # b's lookups miss and ask its tier to reconnect; then they hit.
    deadline = time.monotonic() + 20
    got = b.call(op="load", seed=6, n=10)
    while got["identical"] < 10 and time.monotonic() < deadline:
        time.sleep(0.3)
        got = b.call(op="load", seed=6, n=10)
    assert got["identical"] == 10
    assert b.call(op="load", seed=4, n=10)["hits"] == 0  # the old daemon's blocks are gone


def test_a_full_pool_drops_stores_through_vllm_backpressure(blocks_daemon, engines):
    block = 16384
    slots = (4 << 20) // block
    a = engines(blocks_daemon.address, "engine-a", block, tier=BACKPRESSURE)
    # Another engine of the domain reads every block (leases held): nothing can be evicted.
    assert a.call(op="store", seed=10, n=slots) == {"stored": slots}
    space = a.hello["space"]
    reader = kvtier.BlockStore(blocks_daemon.address, space, block, 36)
    from engine import key  # noqa: PLC0415

    ticket, leased = reader.acquire([key(10, i) for i in range(slots)])
    assert ticket and min(leased) >= 0
    for seed in range(11, 17):  # every store finds no room; none raises
        assert "error" not in a.call(op="store", seed=seed, n=4)
    stats = a.call(op="stats")
    assert stats["kvtier:vllm_blocks_no_room"] >= 3 * 4
    assert stats["under_pressure"] is True
    assert stats["stores_dropped"] >= 1  # vLLM's DropStorePolicy skipped stores to this tier
    reader.release(ticket)


def test_bad_configuration_is_a_clear_error_at_engine_start(blocks_daemon):
    from engine import make_manager  # noqa: PLC0415

    with pytest.raises(ValueError, match="key_bytes = 65"):
        make_manager(blocks_daemon.address, "bad-1", 16384, 64, {"key_bytes": 65})
    with pytest.raises(kvtier.InvalidArgumentError, match="block_bytes"):
        # A block larger than a sixteenth of the space's arena.
        make_manager(blocks_daemon.address, "bad-2", 1 << 20, 8, {})
    with pytest.raises(ValueError, match="unknown option"):
        make_manager(blocks_daemon.address, "bad-3", 16384, 64, {"colour": "blue"})


def test_a_key_of_the_wrong_size_is_a_miss(blocks_daemon):
    store = kvtier.BlockStore(blocks_daemon.address, "wrong-size", 4096, 36)
    assert not store.lookup(b"x" * 35)
    with pytest.raises(kvtier.InvalidArgumentError, match="keys\\[0\\] has 35 bytes"):
        store.begin_store([b"x" * 35])


def test_blocks_do_not_cross_uids_by_default(blocks_daemon):
    # The daemon names the caller's domain from the kernel's uid.
    import os

    store = kvtier.BlockStore(blocks_daemon.address, "domain", 4096, 36)
    assert store.stats()["domain"] == f"uid:{os.getuid()}"
