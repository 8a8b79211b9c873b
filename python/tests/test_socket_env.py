"""$KVTIER_SOCKET names kvtierd for every program: python -m kvtier.generate and kvtier-run
generate use it when no --daemon is given, --local overrides it, and the package's helper maps it
to the "unix:PATH" that TieredCache takes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO, build_dir, program

import kvtier

ARGS = ["--prompt", "Name a color.", "--max-new-tokens", "4", "--json"]


def env_with_socket(path: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{build_dir() / 'python'}:{REPO / 'python'}"
    env["KVTIER_SOCKET"] = path
    return env


def test_daemon_from_env(monkeypatch):
    monkeypatch.delenv("KVTIER_SOCKET", raising=False)
    assert kvtier.daemon_from_env() is None
    monkeypatch.setenv("KVTIER_SOCKET", "")
    assert kvtier.daemon_from_env() is None
    monkeypatch.setenv("KVTIER_SOCKET", "/srv/k.sock")
    assert kvtier.daemon_from_env() == "unix:/srv/k.sock"
    monkeypatch.setenv("KVTIER_SOCKET", "unix:/srv/k.sock")
    assert kvtier.daemon_from_env() == "unix:/srv/k.sock"


def test_tiered_cache_takes_the_socket_from_env_unless_told_local(monkeypatch):
    from kvtier.hf import TieredCache

    monkeypatch.setenv("KVTIER_SOCKET", "/srv/k.sock")
    assert TieredCache().daemon == "unix:/srv/k.sock"
    assert TieredCache(daemon="").daemon is None
    assert TieredCache(daemon="unix:/other.sock").daemon == "unix:/other.sock"
    monkeypatch.delenv("KVTIER_SOCKET")
    assert TieredCache().daemon is None


def test_python_generate_and_kvtier_run_use_kvtier_socket(daemon):
    env = env_with_socket(str(daemon.socket))
    ours = json.loads(subprocess.run([sys.executable, "-m", "kvtier.generate", *ARGS], env=env,
                                     capture_output=True, text=True, check=True,
                                     timeout=600).stdout)
    assert ours["report"]["daemon_backed"] and ours["report"]["daemon"] == daemon.address
    run = subprocess.run([program("kvtier-run"), "generate", *ARGS], env=env,
                         capture_output=True, text=True, check=True, timeout=600)
    theirs = json.loads(run.stdout)
    assert theirs["report"]["daemon_backed"] and theirs["report"]["daemon"] == daemon.address
    local = json.loads(subprocess.run([program("kvtier-run"), "generate", *ARGS, "--local"],
                                      env=env, capture_output=True, text=True, check=True,
                                      timeout=600).stdout)
    assert not local["report"]["daemon_backed"] and local["report"]["daemon"] == ""
