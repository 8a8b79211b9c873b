"""kvtier[hf]'s declared transformers/torch range against the environments that test it: its
lower bound is what the python-low tests run with, its upper end holds kvtier's venv, and it
holds kvpress 0.5.5's and vLLM 0.33's transformers so kvtier can share their environments."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

PYTHON = Path(__file__).resolve().parent.parent
# What vLLM 0.33 requires (its package metadata): transformers >=5.16.1,<5.21 and torch ==2.14.
VLLM_TRANSFORMERS = ((5, 16, 1), (5, 20, 99))
VLLM_TORCH = (2, 14, 0)


def version(text: str) -> tuple[int, ...]:
    parts = [int(part) for part in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))  # 5.2 == 5.2.0


def declared(package: str) -> dict[str, tuple[int, ...]]:
    extras = tomllib.loads((PYTHON / "pyproject.toml").read_text())["project"]
    [spec] = [s for s in extras["optional-dependencies"]["hf"] if re.match(rf"{package}\b", s)]
    return {op: version(v) for op, v in re.findall(r"(>=|<|==)([0-9.]+)", spec)}


def pinned(requirements: str, package: str) -> tuple[int, ...]:
    text = (PYTHON / requirements).read_text()
    return version(re.search(rf"^{package}==([0-9.]+)", text, re.M).group(1))


def test_the_lower_bound_is_what_python_low_runs():
    assert pinned("requirements-hf-low.txt", "transformers") == declared("transformers")[">="]


def test_the_range_holds_kvtiers_venv_kvpress_and_vllm():
    low, high = declared("transformers")[">="], declared("transformers")["<"]
    for name, v in [("kvtier's venv", pinned("requirements.txt", "transformers")),
                    ("kvpress 0.5.5", pinned("requirements-kvpress.txt", "transformers")),
                    ("vLLM 0.33's lowest", VLLM_TRANSFORMERS[0]),
                    ("vLLM 0.33's highest", VLLM_TRANSFORMERS[1])]:
        assert low <= v < high, f"{name}: transformers {v} outside [{low}, {high})"
    torch_low = declared("torch")[">="]
    assert torch_low <= VLLM_TORCH, f"torch >= {torch_low} excludes vLLM 0.33's {VLLM_TORCH}"
    assert torch_low <= pinned("requirements.txt", "torch")
