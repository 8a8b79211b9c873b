"""kvpress 0.5.5's presses against kvtier at equal T0 bytes, through kvpress's own pipeline, on
the retrieval tasks of `kvtier-run tasks` (docs/evaluation.md), question-agnostic: the context is
prefilled and compressed (a press) or placed (kvtier) before the questions arrive; every question
of an item is asked against the same context (the pipeline removes each answer before the next).

At compression ratio c a press keeps 1 − c of the context's KV and deletes the rest; kvtier keeps
β = 1 − c in T0 and either offloads the rest to T1 (r = 0, attended exactly) or evicts it too
(r = c, like the press). Scored by exact match (every answer as a whole word of the reply,
case-insensitive) and by retention against the full cache.

    PYTHONPATH=build/python:python $KVTIER_HOME/kvpress-venv/bin/python \\
        bench/python/kvpress_compare.py --tasks passkey,niah_number,multikey --lengths 1k \\
        --items 2 --ratios 0.75 --out OUT

Writes OUT/results.csv (one row per item × question × configuration, appended as they come: a
restarted run skips what is there) and OUT/summary.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PRESSES = ("snapkv", "streaming_llm", "expected_attention", "kvzip", "knorm")
KVTIER = ("kvtier_offload", "kvtier_evict")


def correct(reply: str, answers: list[str]) -> bool:
    """Every answer occurs in the reply as a whole word (not inside a longer run of letters or
    digits), case-insensitive: the C++ evaluation's exact match."""
    for answer in answers:
        pattern = r"(?<![0-9A-Za-z])" + re.escape(answer) + r"(?![0-9A-Za-z])"
        if not re.search(pattern, reply, flags=re.IGNORECASE):
            return False
    return True


def make_press(name: str, ratio: float):
    import kvpress

    if name == "snapkv":
        return kvpress.SnapKVPress(compression_ratio=ratio)
    if name == "streaming_llm":
        return kvpress.StreamingLLMPress(compression_ratio=ratio)
    if name == "expected_attention":
        return kvpress.ExpectedAttentionPress(compression_ratio=ratio)
    if name == "kvzip":
        return kvpress.KVzipPress(compression_ratio=ratio)
    if name == "knorm":
        return kvpress.KnormPress(compression_ratio=ratio)
    raise ValueError(f"--presses: unknown press {name!r} (one of {', '.join(PRESSES)})")


def items_of(args) -> list[dict]:
    run = subprocess.run(
        [str(args.kvtier_run), "--model", args.model, "tasks", "--tasks", args.tasks, "--lengths",
         args.lengths, "--items", str(args.items), "--seed", str(args.seed)],
        check=True, capture_output=True, text=True)
    return [json.loads(line) for line in run.stdout.splitlines() if line.strip()]


def ask(pipe, item: dict, press, cache, max_questions: int) -> tuple[list[str], int]:
    """The pipeline's own steps (preprocess, _forward, postprocess), with each question's own
    answer prefix, so that the context is prefilled once for all of the item's questions."""
    questions = item["questions"][:max_questions]
    tensors = None
    for q in questions:
        one = pipe.preprocess(item["context"], questions=[q["question"]],
                              answer_prefix=q["answer_prefix"],
                              max_context_length=pipe.tokenizer.model_max_length)
        if tensors is None:
            tensors = {"context_ids": one["context_ids"], "questions_ids": []}
        tensors["questions_ids"] += one["questions_ids"]
    answers = pipe._forward(tensors, max_new_tokens=item["max_new_tokens"], press=press,
                            cache=cache)
    return answers, int(tensors["context_ids"].shape[1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="passkey,niah_number,multikey")
    p.add_argument("--lengths", default="1k")
    p.add_argument("--items", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-questions", type=int, default=2,
                   help="questions asked per item (multikey has four)")
    p.add_argument("--ratios", default="0.75", help="compression ratios c (β = 1 − c)")
    p.add_argument("--presses", default=",".join(PRESSES[:4]))
    p.add_argument("--kvtier", default=",".join(KVTIER))
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--model", default=None, help="the GGUF (default: kvtier.generate's)")
    p.add_argument("--kvtier-run", type=Path, default=REPO / "build" / "bin" / "kvtier-run")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    ratios = [float(x) for x in args.ratios.split(",")]
    if args.items <= 0 or args.max_questions <= 0:
        p.error("--items and --max-questions must be positive")
    for ratio in ratios:
        if not 0.0 < ratio < 1.0:
            p.error(f"--ratios: {ratio} is outside (0, 1)")
    presses = [x for x in args.presses.split(",") if x]
    kvtiers = [x for x in args.kvtier.split(",") if x]
    for name in kvtiers:
        if name not in KVTIER:
            p.error(f"--kvtier: {name!r} is not one of {', '.join(KVTIER)}")

    import torch
    from transformers import DynamicCache
    from transformers.utils import logging

    import kvtier.kvpress as bridge
    from kvpress import KVPressTextGenerationPipeline
    from kvtier.generate import default_model, load

    for name in presses:
        make_press(name, 0.5)  # refuses an unknown name before anything runs
    logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.model = args.model or default_model()
    model, tokenizer = load(args.model)
    # KVzip reads the tokenizer from model.config.name_or_path: the GGUF's, saved as files.
    tokenizer_dir = tempfile.mkdtemp(prefix="kvtier-kvpress-tok-")
    tokenizer.save_pretrained(tokenizer_dir)
    model.config.name_or_path = tokenizer_dir
    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer)
    items = items_of(args)

    configs = [("full", None, None)]
    for ratio in ratios:
        configs += [(f"{name} c{ratio:g}", name, ratio) for name in presses]
        configs += [(f"{name} c{ratio:g}", name, ratio) for name in kvtiers]
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.csv"
    # Rows are appended as they come; a restarted run skips the (item, configuration) pairs
    # already there (and their full-cache marks come from the file).
    rows = list(csv.DictReader(open(results))) if results.exists() else []
    for row in rows:
        for key in ("question", "correct", "full_correct"):
            row[key] = int(row[key])
        for key in ("t0_share", "t1_share", "deleted_share"):
            row[key] = float(row[key])
    done = {(r["item"], r["config"]) for r in rows}
    print(f"{len(items)} items × {len(configs)} configurations, torch threads "
          f"{torch.get_num_threads()}", file=sys.stderr)
    for item in items:
        full_correct = [r["correct"] for r in rows if (r["item"], r["config"]) ==
                        (item["id"], "full")]
        for label, name, ratio in configs:
            if (item["id"], label) in done:
                continue
            t0 = time.perf_counter()
            tiered = name in KVTIER
            model.set_attn_implementation("kvtier" if tiered else "sdpa")
            press = make_press(name, ratio) if name in PRESSES else None
            if tiered:
                cache = bridge.equal_t0_cache(make_press("snapkv", ratio),
                                              evict=name == "kvtier_evict")
            else:
                cache = DynamicCache()
            replies, context = ask(pipe, item, press, cache, args.max_questions)
            if tiered:
                t0_, t1, t2, t3 = cache.report()["tokens_by_tier"]
                live = t0_ + t1 + t2 + t3
                shares = (t0_ / live, t1 / live, t3 / live)
                cache.close()
            else:
                kept = bridge.press_kept_share(model, cache, context)
                shares = (kept, 0.0, 1.0 - kept)
            marks = [correct(r, q["answers"]) for r, q in zip(replies, item["questions"])]
            if name is None:
                full_correct = marks
            new_rows = []
            for turn, (reply, mark) in enumerate(zip(replies, marks)):
                new_rows.append({
                    "item": item["id"], "task": item["task"], "length": item["length"],
                    "question": turn, "config": label, "ratio": ratio or 0.0,
                    "correct": int(mark), "full_correct": int(full_correct[turn]),
                    "context_tokens": context, "t0_share": round(shares[0], 4),
                    "t1_share": round(shares[1], 4), "deleted_share": round(shares[2], 4),
                    "seconds": round(time.perf_counter() - t0, 2), "reply": reply})
            fresh = not results.exists()
            with open(results, "a", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(new_rows[0]))
                if fresh:
                    writer.writeheader()
                writer.writerows(new_rows)
            rows += new_rows
            print(f"  {item['id']}: {label}: {sum(marks)}/{len(marks)} T0 {shares[0]:.2f} "
                  f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    summary = summarize(rows, [c[0] for c in configs])
    (args.out / "summary.md").write_text(summary)
    print(summary)
    return 0


def summarize(rows: list[dict], labels: list[str]) -> str:
    """Per configuration and task: the full cache's answers right / asked; every other row the
    retention (of those the full cache gets right, how many it keeps), then its mean T0, T1 and
    deleted shares of the context."""
    tasks = sorted({r["task"] for r in rows})
    lines = ["| config | " + " | ".join(tasks) + " | all | T0 share | T1 share | deleted |",
             "|---" * (len(tasks) + 5) + "|"]
    for label in labels:
        mine = [r for r in rows if r["config"] == label]
        cells = []
        for task in tasks + [None]:
            cell = [r for r in mine if task is None or r["task"] == task]
            if label == "full":
                cells.append(f"{sum(r['correct'] for r in cell)}/{len(cell)}")
            else:
                base = [r for r in cell if r["full_correct"]]
                cells.append(f"{sum(r['correct'] for r in base)}/{len(base)}")
        share = [sum(r[k] for r in mine) / len(mine) for k in ("t0_share", "t1_share",
                                                                 "deleted_share")]
        lines.append(f"| {label} | " + " | ".join(cells) +
                     f" | {share[0]:.2f} | {share[1]:.2f} | {share[2]:.2f} |")
    lines.append("")
    runs = {(r["item"], r["config"]): float(r["seconds"]) for r in rows}
    lines.append(f"{len(rows)} answers; {sum(runs.values()):.0f} s of pipeline runs "
                 f"({len(runs)} item × configuration runs).")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
