"""kvtier.hf.TieredCache and a real kvtierd: new caches across a kill -9 and a restart (local
pools while it is down, the daemon again once it is back, errors that name the socket), and
reproducible placement (wait_for_plans) over a chain that really evicts."""

from __future__ import annotations

import pytest
import torch
from conftest import Daemon
from test_hf_families import OFFLOAD, build, chain

import kvtier
from kvtier.hf import TieredCache

# kvtierd takes no 0-token sink set (its wire reads 0 as the default): one sink.
OFFLOAD = dict(OFFLOAD, sink_tokens=1)
# r > 0 with a small protected set: pages go to T1 and to T3 within the chain.
EVICTING = dict(OFFLOAD, evict_ratio=0.3)


def test_new_caches_across_a_daemon_killed_and_restarted():
    model, _ = build("llama-gqa7")
    want_logits, want_tokens = chain(model, TieredCache(policy="hierarchy", **OFFLOAD))
    d = Daemon()
    try:
        before = TieredCache(policy="hierarchy", daemon=d.address, **OFFLOAD)
        logits, tokens = chain(model, before)
        assert tokens == want_tokens and torch.equal(logits, want_logits)
        assert before.report()["daemon_backed"]

        d.kill()
        with pytest.raises(kvtier.UnavailableError, match=str(d.socket)):
            chain(model, TieredCache(daemon=d.address, local_fallback=False, **OFFLOAD))
        down = TieredCache(policy="hierarchy", daemon=d.address, **OFFLOAD)
        with pytest.warns(RuntimeWarning, match=rf"{d.socket}.*local pools"):
            logits, tokens = chain(model, down)
        assert tokens == want_tokens and torch.equal(logits, want_logits)
        report = down.report()
        assert report["fell_back_to_local"] and not report["daemon_backed"], report
        assert report["offload_bytes"] > 0, report  # local pools really took pages

        d.start()  # a new daemon: the old session is unknown to it
        for _ in range(2):  # the first re-registers (or finds the client already back)
            after = TieredCache(policy="hierarchy", daemon=d.address, **OFFLOAD)
            logits, tokens = chain(model, after)
            assert tokens == want_tokens and torch.equal(logits, want_logits)
            report = after.report()
            assert report["daemon_backed"] and not report["fell_back_to_local"], report
            assert report["local_plans"] == 0 and report["offload_bytes"] > 0, report
        # The cache that fell back goes to the daemon once it starts over.
        down.close()
        chain(model, down)
        assert down.report()["daemon_backed"]
    finally:
        d.stop()


def test_wait_for_plans_gives_local_pools_tokens_over_a_chain_that_evicts(daemon):
    model, _ = build("mistral-window")
    local = TieredCache(policy="hierarchy", **EVICTING)
    want_logits, want_tokens = chain(model, local)
    through = TieredCache(policy="hierarchy", daemon=daemon.address, wait_for_plans=True,
                          **EVICTING)
    got_logits, got_tokens = chain(model, through)
    for cache in (local, through):
        t = cache.report()["tokens_by_tier"]
        assert t[3] > 0 and t[1] > 0, cache.report()  # pages were evicted and offloaded
    assert through.report()["daemon_backed"] and through.report()["local_plans"] == 0
    assert got_tokens == want_tokens
    assert torch.equal(got_logits, want_logits)
    assert torch.equal(through.tiers(), local.tiers())


def test_a_protected_set_kvtierd_cannot_carry_is_refused_by_name():
    with pytest.raises(ValueError, match="sink_tokens=0 cannot reach kvtierd.*daemon=\"\""):
        TieredCache(daemon="unix:/run/kvtier/kvtierd.sock", sink_tokens=0)
    with pytest.raises(ValueError, match="window_tokens=0"):
        TieredCache(daemon="unix:/run/kvtier/kvtierd.sock", window_tokens=0)
    TieredCache(sink_tokens=0, window_tokens=0)  # local pools take them
