#!/usr/bin/env python3
"""Side-by-side prefill/decode throughput: kvtier's engine vs llama.cpp on the same GGUF file,
same thread counts, same synthetic 64-token prompt, measured alternately in the same run.

llama.cpp comes from llama-cpp-python in a venv outside the repository (see
scripts/make-oracle-fixture); it is not a project dependency.

  /tmp/llvenv/bin/python bench/engine/llama_cpp_side_by_side.py --bench build/bin/engine_bench
"""
import argparse
import json
import os
import statistics
import subprocess
import time

from llama_cpp import Llama

PROMPT = [100 + (i * 7919) % 40000 for i in range(64)]  # as engine_bench.cc Tokens(64)
DECODE = 64


def llama_cpp(model, threads, reps):
    llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=512,
                n_batch=512, verbose=False)
    pre, dec = [], []
    for _ in range(reps):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(PROMPT)
        t1 = time.perf_counter()
        for _ in range(DECODE):
            logits = llm.scores[llm.n_tokens - 1]
            llm.eval([int(logits.argmax())])
        t2 = time.perf_counter()
        pre.append(len(PROMPT) / (t1 - t0))
        dec.append(DECODE / (t2 - t1))
    return statistics.median(pre), statistics.median(dec)


def engine(bench, threads):
    out = subprocess.run(
        [bench, f"--benchmark_filter=BM_(Prefill|Decode)/threads:{threads}/(tokens:64|batch:1)/",
         "--benchmark_format=json", "--benchmark_repetitions=3",
         "--benchmark_report_aggregates_only=true"],
        check=True, capture_output=True, text=True).stdout
    res = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            res["prefill" if "Prefill" in b["name"] else "decode"] = b["tok/s"]
    return res["prefill"], res["decode"]


def main():
    home = os.environ.get("KVTIER_HOME", os.path.expanduser("~/.cache/kvtier"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.environ.get(
        "KVTIER_MODEL", os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf")))
    ap.add_argument("--bench", default="build/bin/engine_bench")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    print(f"{'threads':>7} {'engine':>8} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for threads in (1, 2):
        ep, ed = engine(args.bench, threads)
        lp, ld = llama_cpp(args.model, threads, args.reps)
        print(f"{threads:>7} {'kvtier':>8} {ep:14.1f} {ed:13.1f}")
        print(f"{threads:>7} {'llama.cpp':>8} {lp:14.1f} {ld:13.1f}")
        print(f"{threads:>7} {'ratio':>8} {ep / lp:14.2f} {ed / ld:13.2f}")


if __name__ == "__main__":
    main()
