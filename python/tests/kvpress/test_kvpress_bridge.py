"""kvpress 0.5.5's pipeline with a TieredCache (label kvpress, run from kvpress's own
environment, $KVTIER_HOME/kvpress-venv): on a multikey item of `kvtier-run tasks` asked two
questions (the pipeline removes each answer before the next: a crop of the TieredCache), the
hierarchy at the T0 budget of a 75% press and r = 0 gives the full TieredCache's answers token
for token while most of the context's pages left T0; the press itself really deleted 75% of the
context; a press with a TieredCache is refused before anything is stored."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
import torch

import kvtier.kvpress as bridge
from kvpress import KVPressTextGenerationPipeline, SnapKVPress
from transformers import DynamicCache

from kvtier.hf import TieredCache

# python/tests/conftest.py (the model's path, the build tree's programs), under a name of its own.
_spec = importlib.util.spec_from_file_location(
    "kvtier_tests_conftest", Path(__file__).resolve().parents[1] / "conftest.py")
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)


@pytest.fixture(scope="module")
def pipe():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    path = base.model_path()
    if not path.exists():
        pytest.fail(f"{path} is missing: scripts/install-deps downloads it")
    logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 attn_implementation="kvtier")
    model.eval()
    return KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def item():
    emitted = subprocess.run(
        [str(base.program("kvtier-run")), "--model", str(base.model_path()), "tasks", "--tasks",
         "multikey", "--lengths", "1k", "--items", "1"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(emitted.splitlines()[0])


def ask(pipe, item, press, cache):
    """Two of the item's questions against one prefilled context (the pipeline's own steps, each
    question with its own answer prefix, as bench/python/kvpress_compare.py asks them), 8
    tokens of answer each."""
    tensors = None
    for q in item["questions"][:2]:
        one = pipe.preprocess(item["context"], questions=[q["question"]],
                              answer_prefix=q["answer_prefix"], max_context_length=10**6)
        tensors = tensors or {"context_ids": one["context_ids"], "questions_ids": []}
        tensors["questions_ids"] += one["questions_ids"]
    with torch.no_grad():
        replies = pipe._forward(tensors, max_new_tokens=8, press=press, cache=cache)
    return replies, int(tensors["context_ids"].shape[1])


def test_hierarchy_at_a_press_budget_gives_the_full_answers_and_the_press_deletes(pipe, item):
    pipe.model.set_attn_implementation("kvtier")
    full = TieredCache(policy="full")
    want, context = ask(pipe, item, None, full)
    assert full.get_seq_length() == context  # the crop removed the questions and answers
    press = SnapKVPress(compression_ratio=0.75)
    tiered = bridge.equal_t0_cache(press)
    got, _ = ask(pipe, item, None, tiered)
    assert got == want
    t0, t1, t2, t3 = tiered.report()["tokens_by_tier"]
    assert t0 + t1 + t2 + t3 == context and t2 == t3 == 0
    assert t0 <= 0.25 * context + 32 and t1 >= 0.7 * context, (t0, t1, context)
    assert all(reply.strip() for reply in want), want
    full.close()
    tiered.close()

    pipe.model.set_attn_implementation("sdpa")
    cache = DynamicCache()
    ask(pipe, item, press, cache)
    kept = bridge.press_kept_share(pipe.model, cache, context)
    assert 0.2 <= kept <= 0.3, kept  # 75% of the context's entries deleted


def test_a_press_with_a_tiered_cache_is_refused_before_anything_is_stored(pipe, item):
    pipe.model.set_attn_implementation("kvtier")
    cache = TieredCache()
    with pytest.raises(NotImplementedError, match="SnapKVPress with a TieredCache"):
        ask(pipe, item, SnapKVPress(compression_ratio=0.5), cache)
    assert cache.sequences == []
    pipe.model.set_attn_implementation("sdpa")
    with pytest.raises(ValueError, match="needs the model's attn_implementation='kvtier'"):
        ask(pipe, item, None, TieredCache())
    with pytest.raises(ValueError, match="no compression_ratio"):
        bridge.equal_t0_cache(object())
    evicting = bridge.equal_t0_cache(SnapKVPress(compression_ratio=0.75), evict=True)
    assert (evicting.hbm_ratio, evicting.evict_ratio) == (1.0, 0.75)
