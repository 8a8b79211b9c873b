"""Fixtures of the kvtier package's tests: the real SmolLM2 GGUF through transformers, a real
kvtierd on a unix socket, and the programs of the build tree (KVTIER_BUILD_DIR)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def build_dir() -> Path:
    return Path(os.environ.get("KVTIER_BUILD_DIR", REPO / "build"))


def program(name: str) -> Path:
    path = build_dir() / "bin" / name
    if os.environ.get("KVTIER_TEST_NO_PROGRAMS") == "1":  # scripts/wheel-test: the wheel alone
        pytest.skip(f"no {name}: this run checks the wheel without the programs")
    if not path.exists() and os.environ.get("KVTIER_TEST_PROGRAMS_OPTIONAL") == "1":
        pytest.skip(f"no {path}: scripts/wheel-test has the packaged programs only")
    if not path.exists():
        pytest.fail(f"{path} is missing: build the tree first (scripts/build)")
    return path


def model_path() -> Path:
    if os.environ.get("KVTIER_MODEL"):
        return Path(os.environ["KVTIER_MODEL"])
    home = Path(os.environ.get("KVTIER_HOME", Path.home() / ".cache" / "kvtier"))
    return home / MODEL_FILE


def e2e_prompts() -> list[str]:
    """The questions the project wrote for its e2e and eval tests."""
    lines = (REPO / "tests" / "fixtures" / "eval_questions.jsonl").read_text().splitlines()
    return [json.loads(line)["question"] for line in lines if line.strip()]


@pytest.fixture(scope="session")
def hf_model():
    """SmolLM2-135M-Instruct from the project's GGUF, loaded by transformers (float32), with the
    "kvtier" attention implementation registered; tests switch implementations as they need."""
    path = model_path()
    if not path.exists():
        pytest.fail(f"{path} is missing: scripts/install-deps downloads it")
    import kvtier.hf  # noqa: F401  (registers "kvtier")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, attn_implementation="kvtier"
    )
    model.eval()
    return model, tokenizer


def chat_ids(tokenizer, question: str):
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt"
    )
    return encoded["input_ids"] if not hasattr(encoded, "dim") else encoded


def _accepts(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False


class Daemon:
    """A real kvtierd in its own temporary directory (socket, memory channel, log)."""

    def __init__(self, ddr_mib: int = 64, compressed_mib: int = 32, extra_config: str = ""):
        self.dir = Path(tempfile.mkdtemp(prefix="kvtierd-py-"))
        self.socket = self.dir / "kvtierd.sock"
        self.log = self.dir / "kvtierd.log"
        self.config = self.dir / "kvtierd.toml"
        self.config.write_text(
            f'[server]\nmetrics = ""\n[pools]\nddr_mib = {ddr_mib}\n'
            f"compressed_mib = {compressed_mib}\n" + extra_config
        )
        self.start()

    def start(self) -> None:
        """Starts kvtierd on the socket (again, after kill: a restart)."""
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(program("kvtierd")), "--config", str(self.config), "--socket",
                 str(self.socket)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 20
        while not _accepts(str(self.socket)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"kvtierd did not start: {self.log.read_text()}")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: no goodbye to its workers; the socket file stays behind."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    @property
    def address(self) -> str:
        return f"unix:{self.socket}"

    def stop(self, keep: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon():
    d = Daemon()
    yield d
    d.stop()
