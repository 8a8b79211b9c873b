"""kvtier._native: arrays cross without copies and give the C++ engine's results bit for bit;
bad input raises a clear exception and loses nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

try:  # the wheel's check in a clean root (scripts/wheel-test) runs without torch
    import torch
except ImportError:
    torch = None
from conftest import Daemon, program

import kvtier

H, KVH, D = 6, 2, 32
SCALE = D**-0.5


def runtime(**kw) -> kvtier.Runtime:
    return kvtier.Runtime(1, H, KVH, D, SCALE, page_tokens=4, arena_bytes=64 << 20,
                          ddr_bytes=16 << 20, compressed_bytes=8 << 20, **kw)


def chunks(seed: int, sizes: list[int]):
    rng = np.random.default_rng(seed)
    for n in sizes:
        yield (rng.standard_normal((n, KVH, D), dtype=np.float32),
               rng.standard_normal((n, KVH, D), dtype=np.float32),
               rng.standard_normal((n, H, D), dtype=np.float32))


def reference(tmp_path, data, mode="tiered") -> list[tuple[np.ndarray, np.ndarray]]:
    """The C++ engine's attention on the same chunks (kvtier-attend-reference): "tiered" is the
    cache kvtier-run drives, "dense" the engine's reference cache."""
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    with open(src, "wb") as f:
        for k, v, q in data:
            np.uint32(k.shape[0]).tofile(f)
            k.tofile(f), v.tofile(f), q.tofile(f)
    subprocess.run([program("kvtier-attend-reference"), mode, str(H), str(KVH), str(D), repr(SCALE),
                    str(src), str(dst)], check=True)
    flat = np.fromfile(dst, dtype=np.float32)
    results, at, length = [], 0, 0
    for k, _, q in data:
        length += k.shape[0]
        out = flat[at:at + q.size].reshape(q.shape)
        at += q.size
        results.append((out, flat[at:at + length]))
        at += length
    return results


SIZES = [37, 1, 1, 5, 1, 1, 1, 1]  # a prefill, then decode steps
# Through kvtierd plans come back in the background and apply at the first step after they
# arrive: steps paced like a model's (DAEMON_STEP_S) give them time to.
DAEMON_SIZES = [37] + [1] * 40
DAEMON_STEP_S = 0.005


needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


@needs_torch
@pytest.mark.parametrize("hbm_ratio", [1.0, 0.3])
def test_attention_is_bit_identical_to_the_engine(tmp_path, hbm_ratio):
    """The binding's tiered sequence against the C++ engine's, bit for bit (and against the
    engine's dense reference within f32 rounding); at β = 0.3 pages really live in T1 (read in
    place) and the result is still identical."""
    data = list(chunks(7, SIZES))
    want = reference(tmp_path, data)
    dense = reference(tmp_path, data, "dense")
    seq = runtime().open(policy="hierarchy" if hbm_ratio < 1 else "full", prompt_tokens=37,
                         hbm_ratio=hbm_ratio, window_tokens=4, sink_tokens=0,
                         protect_prompt=False, retier_interval=1)
    for step, ((k, v, q), (want_out, want_mass), (dense_out, _)) in enumerate(
            zip(data, want, dense)):
        seq.append(0, torch.from_numpy(k), torch.from_numpy(v))  # torch in, by DLPack
        out = np.empty_like(q)  # numpy out, written in place
        mass = np.empty(seq.length(0), dtype=np.float32)
        seq.attend(0, q, out, mass)
        assert np.array_equal(out, want_out), f"step {step}: output differs"
        assert np.array_equal(mass, want_mass), f"step {step}: position mass differs"
        assert np.abs(out - dense_out).max() < 1e-5, f"step {step}: far from the dense reference"
    tiers = seq.tiers()
    if hbm_ratio < 1:
        assert (tiers == kvtier.T1).sum() > 0.5 * len(tiers), tiers  # pages left T0
        assert seq.report()["ddr_bytes"] > 0
    else:
        assert (tiers == kvtier.T0).all()


def _decode(seq, seed: int, steps: int) -> None:
    """A 64-token prefill then `steps` decode steps of random K/V/Q, attended each step."""
    for k, v, q in chunks(seed, [64] + [1] * steps):
        seq.append(0, k, v)
        seq.attend(0, q, np.empty_like(q), None)


def test_report_carries_the_lost_mass_and_max_lost_mass_bounds_eviction():
    """The guardrail's figures reach Python: evicting and compressing lose mass, the exact
    hierarchy none; ε = 0 evicts nothing where the same r otherwise does."""
    kw = dict(policy="hierarchy", prompt_tokens=64, hbm_ratio=0.3, window_tokens=4,
              sink_tokens=0, protect_prompt=False, retier_interval=4)
    lossy = runtime().open(evict_ratio=0.3, compress_ratio=0.3, **kw)
    _decode(lossy, 5, 12)
    lost = lossy.report()["lost_mass"]
    assert lost["evicted_estimate"] > 0 and lost["compressed"] > 0, lost
    assert lost["total"] == pytest.approx(lost["compressed"] + lost["evicted_estimate"])
    assert lost["peak"] >= lost["total"]
    assert (lossy.tiers() == kvtier.T3).sum() > 0
    exact = runtime().open(**kw)
    _decode(exact, 5, 12)
    assert exact.report()["lost_mass"]["total"] == 0
    bounded = runtime().open(evict_ratio=0.3, max_lost_mass=0.0, **kw)
    _decode(bounded, 5, 12)
    assert (bounded.tiers() == kvtier.T3).sum() == 0
    assert bounded.report()["lost_mass"]["evicted_estimate"] == 0


def test_scores_accumulate_the_attention_mass():
    """Prefill seeds each position's score with its mass over the heads (÷ heads); a decode
    step adds the same share; nothing is lost between calls."""
    seq = runtime().open(policy="full", prompt_tokens=10)
    (k, v, q), (k1, v1, q1) = chunks(3, [10, 1])
    seq.append(0, k, v)
    mass = np.empty(10, dtype=np.float32)
    seq.attend(0, q, np.empty_like(q), mass)
    assert np.allclose(seq.scores(), mass / H, rtol=1e-6), (seq.scores(), mass / H)
    seq.append(0, k1, v1)
    mass1 = np.empty(11, dtype=np.float32)
    seq.attend(0, q1, np.empty_like(q1), mass1)
    expect = np.append(mass / H, 0) + mass1 / H
    assert np.allclose(seq.scores(), expect, rtol=1e-5)


def test_bad_arrays_raise_and_lose_nothing():
    seq = runtime().open(policy="full", prompt_tokens=3)
    (k, v, q), = chunks(1, [3])
    with pytest.raises(TypeError, match="k: needs float32"):
        seq.append(0, k.astype(np.float64), v)
    with pytest.raises(ValueError, match=r"v: needs shape \[n, 2, 32\], got \[3, 3, 32\]"):
        seq.append(0, k, np.zeros((3, 3, D), dtype=np.float32))
    with pytest.raises(ValueError, match="k has 3 tokens but v has 2"):
        seq.append(0, k, v[:2])
    with pytest.raises(ValueError, match="C-contiguous"):
        seq.append(0, k.transpose(1, 0, 2).copy().transpose(1, 0, 2), v)
    if torch is not None:
        with pytest.raises(ValueError, match="C-contiguous"):
            seq.append(0, torch.from_numpy(k).transpose(0, 1).contiguous().transpose(0, 1), v)
    with pytest.raises(ValueError, match="layer 1 is out of range"):
        seq.append(1, k, v)
    assert seq.length(0) == 0  # nothing was stored by the failed calls
    seq.append(0, k, v)
    with pytest.raises(ValueError, match=r"out: needs shape \[3, 6, 32\]"):
        seq.attend(0, q, np.empty((2, H, D), dtype=np.float32))
    with pytest.raises(ValueError, match=r"mass: needs shape \[3\]"):
        seq.attend(0, q, np.empty_like(q), np.empty(2, dtype=np.float32))
    with pytest.raises(kvtier.InvalidArgumentError):
        seq.attend(0, np.empty((4, H, D), dtype=np.float32), np.empty((4, H, D), np.float32))
    # The sequence is intact: the same attention as a fresh one.
    out = np.empty_like(q)
    seq.attend(0, q, out)
    fresh = runtime().open(policy="full", prompt_tokens=3)
    fresh.append(0, k, v)
    out2 = np.empty_like(q)
    fresh.attend(0, q, out2)
    assert np.array_equal(out, out2)
    seq.close()
    with pytest.raises(kvtier.FailedPreconditionError, match="closed"):
        seq.length(0)


def test_bad_runtime_and_policy_arguments_name_the_field():
    with pytest.raises(kvtier.InvalidArgumentError, match="num_q_heads 5"):
        kvtier.Runtime(1, 5, 2, D, SCALE)
    with pytest.raises(kvtier.InvalidArgumentError, match="policy"):
        runtime().open(policy="lru", prompt_tokens=1)
    with pytest.raises(kvtier.InvalidArgumentError, match="hbm_ratio"):
        runtime().open(policy="hierarchy", prompt_tokens=1, hbm_ratio=1.5)


def test_a_dead_daemon_is_unavailable_with_its_address(tmp_path):
    address = f"unix:{tmp_path}/nobody.sock"
    with pytest.raises(kvtier.UnavailableError, match="nobody.sock") as err:
        runtime(daemon=address)
    assert isinstance(err.value, ConnectionError)
    assert err.value.code == "UNAVAILABLE"


def test_runtime_through_kvtierd_offloads_into_its_pools(daemon, tmp_path):
    rt = runtime(daemon=daemon.address)
    assert rt.daemon_mode and rt.worker_id > 0
    data = list(chunks(11, DAEMON_SIZES))
    want = reference(tmp_path, data)
    seq = rt.open(policy="hierarchy", prompt_tokens=37, hbm_ratio=0.3, window_tokens=4,
                  sink_tokens=1, protect_prompt=False, retier_interval=1)
    for (k, v, q), (want_out, _) in zip(data, want):
        time.sleep(DAEMON_STEP_S)
        seq.append(0, k, v)
        out = np.empty_like(q)
        seq.attend(0, q, out)
        assert np.array_equal(out, want_out)
    assert seq.daemon_backed
    report = seq.report()
    assert report["plans"] > 0 and report["local_plans"] == 0, report
    assert report["ddr_bytes"] > 0, report


def test_a_declared_link_brings_schedules_and_split_attention(daemon, tmp_path):
    """A worker that declares a narrow host link follows the daemon's schedules: the pages they
    leave in place are attended as a split, exact up to one merge's rounding."""
    with pytest.raises(kvtier.InvalidArgumentError, match="link_bytes_per_second"):
        runtime(daemon=daemon.address, link={"link_bytes_per_second": -1.0})
    with pytest.raises(kvtier.InvalidArgumentError, match="link"):
        runtime(daemon=daemon.address, link={"link_bandwidth": 1.0})  # not a HostLink field
    rt = runtime(daemon=daemon.address, link={"link_id": "sw0", "link_bytes_per_second": 1e4})
    data = list(chunks(12, DAEMON_SIZES))
    want = reference(tmp_path, data)
    seq = rt.open(policy="hierarchy", prompt_tokens=37, hbm_ratio=0.3, window_tokens=4,
                  sink_tokens=1, protect_prompt=False, retier_interval=1)
    worst = 0.0
    for (k, v, q), (want_out, _) in zip(data, want):
        time.sleep(DAEMON_STEP_S)
        seq.append(0, k, v)
        out = np.empty_like(q)
        seq.attend(0, q, out)
        worst = max(worst, float(np.max(np.abs(out - want_out))))
    report = seq.report()
    assert report["schedules"] > 0 and report["schedules_refused"] == 0, report
    assert report["schedule_bytes"]["in_place"] > 0, report
    assert report["split_attends"] > 0, report
    assert worst < 1e-5


def test_client_speaks_to_kvtierd_in_dicts(daemon):
    registration = {
        "worker_name": "pytest-client",
        "geometry": {"num_layers": 2, "num_kv_heads": KVH, "head_dim": D, "page_tokens": 4,
                     "layer_groups": 1, "element_bytes": 4},
        "t1_page_bytes": 2 * 2 * 4 * KVH * D * 4,  # layers x (K, V) x tokens x heads x dim x f32
        "t2_page_bytes": 2560,
    }
    client = kvtier.Client(daemon.address, registration)
    assert client.connected and client.worker_id > 0
    seq = client.open_sequence(8, {"name": "hierarchy", "hbm_ratio": 0.5}, tag="py")
    status = client.status()
    assert status["view"] == "own", status["view"]
    mine = [s for s in status["sequence_list"] if s["sequence_id"] == seq]
    assert mine and mine[0]["tag"] == "py", status["sequence_list"]
    assert isinstance(mine[0]["sequence_id"], int)  # uint64 stays an int
    plan = client.submit_snapshot({"sequence_id": seq, "length": 8, "decode_step": 0,
                                   "num_pages": 2, "page_scores": [0.5, 0.1],
                                   "current_tiers": bytes([0, 0])})
    assert plan["sequence_id"] == seq and plan["plan_version"] > 0, plan
    assert plan["target_tiers"] == bytes([0, 0])  # all in the protected window
    client.ack_plan(seq, plan["plan_version"])
    with pytest.raises(kvtier.InvalidArgumentError, match="num_pages"):
        client.submit_snapshot({"sequence_id": seq, "length": 8, "num_pages": 3,
                                "page_scores": [0, 0, 0], "current_tiers": bytes(3),
                                "last_plan_version": plan["plan_version"]})
    with pytest.raises(kvtier.InvalidArgumentError, match="snapshot.*not a message value"):
        client.submit_snapshot({"sequence_id": object()})
    client.close_sequence(seq)
    with pytest.raises(kvtier.NotFoundError):
        client.close_sequence(seq)
    with pytest.raises(kvtier.InvalidArgumentError, match="policy.*no_such_field"):
        client.open_sequence(8, {"name": "hierarchy", "no_such_field": 1})
    with pytest.raises(kvtier.InvalidArgumentError, match="registration"):
        kvtier.Client(daemon.address, {"worker_nam": "typo"})
    client.close()


def _may_run_realtime(priority):
    """Whether a thread of this process may take SCHED_FIFO `priority` (tried on one of its own)."""
    allowed = []

    def probe():
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
            allowed.append(True)
        except PermissionError:
            allowed.append(False)

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return allowed[0]


def _small_registration(name):
    return {
        "worker_name": name,
        "geometry": {"num_layers": 2, "num_kv_heads": KVH, "head_dim": D, "page_tokens": 4,
                     "layer_groups": 1, "element_bytes": 4},
        "t1_page_bytes": 2 * 2 * 4 * KVH * D * 4,
        "t2_page_bytes": 2560,
    }


def test_client_heartbeats_from_a_realtime_thread_when_allowed(daemon):
    registration = _small_registration("pytest-realtime")
    with pytest.raises(kvtier.InvalidArgumentError, match="heartbeat_priority is 100"):
        kvtier.Client(daemon.address, registration, heartbeat_priority=100)
    plain = kvtier.Client(daemon.address, registration)
    assert not plain.heartbeat_realtime
    plain.close()
    client = kvtier.Client(daemon.address, registration, heartbeat_priority=3)
    assert client.heartbeat_realtime == _may_run_realtime(3)
    assert client.connected
    client.close()


def test_client_talks_only_to_a_daemon_of_the_uid_it_expects(daemon):
    registration = _small_registration("pytest-daemon-uid")
    if os.geteuid() != 0:  # root is always taken for the daemon: it can read anyone's memory
        other = os.geteuid() + 4242
        with pytest.raises(kvtier.PermissionDeniedError,
                           match=f"bound by uid {os.geteuid()}, not the daemon's uid {other}"):
            kvtier.Client(daemon.address, registration, daemon_uid=other)
    client = kvtier.Client(daemon.address, registration, daemon_uid=os.geteuid())
    assert client.connected
    client.close()


def test_a_worker_killed_mid_session_does_not_disturb_another(tmp_path):
    """Two Python workers on one daemon; one process is killed with SIGKILL, the other keeps
    its pages and results."""
    d = Daemon()
    try:
        victim = subprocess.Popen(
            [sys.executable, "-c",
             "import sys, time, numpy as np, kvtier\n"
             f"rt = kvtier.Runtime(1, {H}, {KVH}, {D}, {SCALE}, page_tokens=4, daemon=sys.argv[1])\n"
             "s = rt.open(policy='hierarchy', prompt_tokens=64, hbm_ratio=0.2, window_tokens=4,"
             " sink_tokens=1, protect_prompt=False, retier_interval=1)\n"
             f"k = np.ones((64, {KVH}, {D}), np.float32)\n"
             "s.append(0, k, k)\n"
             f"q = np.ones((64, {H}, {D}), np.float32)\n"
             "s.attend(0, q, np.empty_like(q))\n"
             "print('ready', flush=True)\n"
             "time.sleep(60)\n", d.address],
            stdout=subprocess.PIPE, text=True)
        assert victim.stdout.readline().strip() == "ready"
        survivor_data = list(chunks(5, DAEMON_SIZES))
        want = reference(tmp_path, survivor_data)
        rt = runtime(daemon=d.address)
        seq = rt.open(policy="hierarchy", prompt_tokens=37, hbm_ratio=0.3, window_tokens=4,
                      sink_tokens=1, protect_prompt=False, retier_interval=1)
        for i, ((k, v, q), (want_out, _)) in enumerate(zip(survivor_data, want)):
            if i == 8:
                victim.kill()
                victim.wait()
            time.sleep(DAEMON_STEP_S)
            seq.append(0, k, v)
            out = np.empty_like(q)
            seq.attend(0, q, out)
            assert np.array_equal(out, want_out), f"step {i}"
        assert seq.daemon_backed and seq.report()["ddr_bytes"] > 0
    finally:
        d.stop()
