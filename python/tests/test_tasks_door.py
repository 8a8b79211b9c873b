"""The retrieval tasks through the Python door (docs/evaluation.md): the items `kvtier-run tasks`
emits (the same token segments the C++ evaluation uses), run through kvtier.hf.TieredCache on
SmolLM2 in transformers. The hierarchy at r = 0 gives the full cache's answers exactly, and its T0
share after placement matches what `kvtier-run eval --tasks-file` reports within 0.03 (the two
doors run different numerics: transformers' float32 weights against the engine's Q4_1, so the
scores that rank pages differ slightly; the cap itself is the same)."""

from __future__ import annotations

import csv
import json
import subprocess

import pytest
import torch
from conftest import model_path, program

from kvtier.hf import TieredCache, cache_kwargs

SETTINGS = dict(hbm_ratio=0.25, evict_ratio=0.0, page_tokens=16, window_tokens=32, sink_tokens=4,
                protect_prompt=False, retier_interval=256)


def greedy(model, ids, cache, max_new):
    out = []
    with torch.no_grad():
        logits = model(input_ids=ids, **cache_kwargs(cache), use_cache=True).logits[0, -1]
        for _ in range(max_new):
            token = int(logits.argmax())
            if token in (0, 2):
                break
            out.append(token)
            logits = model(input_ids=torch.tensor([[token]]), **cache_kwargs(cache),
                           use_cache=True).logits[0, -1]
    return out


def test_tasks_give_the_full_cache_answers_at_r0_and_the_cpp_tier_figures(hf_model, tmp_path):
    model, tokenizer = hf_model
    model.set_attn_implementation("kvtier")
    emitted = subprocess.run(
        [program("kvtier-run"), "--model", str(model_path()), "tasks", "--tasks",
         "passkey,multikey", "--lengths", "1k", "--items", "1", "--with-tokens"],
        check=True, capture_output=True, text=True).stdout
    items = [json.loads(line) for line in emitted.splitlines()]
    assert len(items) == 2
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text(emitted)
    out = tmp_path / "out"
    subprocess.run(
        [program("kvtier-run"), "--model", str(model_path()), "eval", "--tasks-file",
         str(tasks_file), "--out", str(out), "--grid", "none", "--config", "hierarchy:hbm=0.25",
         "--quiet"], check=True)
    cpp = {(r["item"], r["policy"]): r for r in csv.DictReader(open(out / "results.csv"))}
    for item in items:
        ids = torch.tensor([item["context_tokens"] + item["question_tokens"][0]])
        full = TieredCache(policy="full")
        tiered = TieredCache(policy="hierarchy", **SETTINGS)
        a = greedy(model, ids, full, item["max_new_tokens"])
        b = greedy(model, ids, tiered, item["max_new_tokens"])
        assert a == b, (item["id"], tokenizer.decode(a), tokenizer.decode(b))
        report = tiered.report()
        t0, t1, t2, t3 = report["tokens_by_tier"]
        assert t1 > 0 and t2 == 0 and t3 == 0, report
        ours = report["t0_bytes"] / report["full_bytes"]
        theirs = float(cpp[(item["id"], "hierarchy")]["t0_fraction"])
        assert abs(ours - theirs) <= 0.03, (item["id"], ours, theirs)
        full.close()
        tiered.close()


def test_protect_prompt_modes_are_checked():
    with pytest.raises(ValueError, match="protect_prompt='sometimes'"):
        TieredCache(protect_prompt="sometimes")
    with pytest.raises(ValueError, match="needs protected_prompt_begin"):
        TieredCache(protect_prompt="last-turn")
    cache = TieredCache(protect_prompt="last-turn", protected_prompt_begin=30)
    assert cache.protect_prompt and cache.protected_prompt_begin == 30
    assert TieredCache(protect_prompt="none").protect_prompt is False
    assert TieredCache(protect_prompt=True, protected_prompt_begin=30).protected_prompt_begin == 0
