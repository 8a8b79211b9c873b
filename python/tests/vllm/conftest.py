"""Fixtures of the tests against the real vLLM package (label vllm, run from vLLM's own
environment, $KVTIER_HOME/vllm-venv): a kvtierd with a block store, and engine processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import importlib.util  # noqa: E402

# python/tests/conftest.py (a real kvtierd), under a name of its own: this file is "conftest" too.
_spec = importlib.util.spec_from_file_location(
    "kvtier_tests_conftest", Path(__file__).resolve().parents[1] / "conftest.py"
)
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
Daemon = _base.Daemon

ENGINE = Path(__file__).resolve().parent / "engine.py"


class EngineProcess:
    """engine.py in its own process: one vLLM engine's offloading manager."""

    def __init__(self, address: str, engine_id: str, block_bytes: int = 16384, tier=None):
        self.engine_id = f"{engine_id}-{os.getpid()}"
        self.proc = subprocess.Popen(
            [sys.executable, str(ENGINE), address, self.engine_id, str(block_bytes),
             json.dumps(tier or {})],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if not os.environ.get("KVTIER_TEST_VERBOSE") else None,
            text=True,
            env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"},
        )
        self.hello = self.read(timeout_s=120)
        assert self.hello.get("ready"), self.hello

    def read(self, timeout_s: float = 60) -> dict:
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise TimeoutError(f"engine said nothing within {timeout_s} s")
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"engine exited ({self.proc.poll()})")
            if line.startswith("{"):
                return json.loads(line)

    def call(self, timeout_s: float = 60, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read(timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def blocks_daemon():
    d = Daemon(extra_config="[blocks]\nmib = 64\nspace_mib = 4\n")
    yield d
    d.stop()


@pytest.fixture
def engines():
    made: list[EngineProcess] = []

    def make(*args, **kwargs) -> EngineProcess:
        e = EngineProcess(*args, **kwargs)
        made.append(e)
        return e

    yield make
    from engine import region_path  # noqa: PLC0415

    for e in made:
        e.close()
        Path(region_path(e.engine_id)).unlink(missing_ok=True)
