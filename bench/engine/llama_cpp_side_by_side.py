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

import numpy as np
from llama_cpp import Llama

PROMPT = [100 + (i * 7919) % 40000 for i in range(64)]  # as engine_bench.cc Tokens(64)
DECODE = 64


def llama_cpp(model, threads, reps):
    llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=512,
                n_batch=512, verbose=False)
    pre, dec, pre_cpu, dec_cpu = [], [], [], []
    for _ in range(reps):
        llm.reset()
        t0, c0 = time.perf_counter(), time.thread_time()
        llm.eval(PROMPT)
        t1, c1 = time.perf_counter(), time.thread_time()
        for _ in range(DECODE):
            # Without logits_all llama-cpp-python stores no scores: read the context's logits.
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
            llm.eval([int(logits.argmax())])
        t2, c2 = time.perf_counter(), time.thread_time()
        pre.append(len(PROMPT) / (t1 - t0))
        dec.append(DECODE / (t2 - t1))
        pre_cpu.append(len(PROMPT) / (c1 - c0))
        dec_cpu.append(DECODE / (c2 - c1))
    med = statistics.median
    return med(pre), med(dec), med(pre_cpu), med(dec_cpu)


def engine(bench, threads):
    out = subprocess.run(
        [bench, f"--benchmark_filter=BM_(Prefill|Decode)/threads:{threads}/(tokens:64|batch:1)/",
         "--benchmark_format=json", "--benchmark_repetitions=3",
         "--benchmark_report_aggregates_only=true"],
        check=True, capture_output=True, text=True).stdout
    res = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            kind = "prefill" if "Prefill" in b["name"] else "decode"
            res[kind] = b["tok/s"]
            res[kind + "_cpu"] = b["tok/cpu_s"]
    return res["prefill"], res["decode"], res["prefill_cpu"], res["decode_cpu"]


def main():
    home = os.environ.get("KVTIER_HOME", os.path.expanduser("~/.cache/kvtier"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.environ.get(
        "KVTIER_MODEL", os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf")))
    ap.add_argument("--bench", default="build/bin/engine_bench")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    # tok/cpu-s: tokens per CPU-second of the calling thread. With 1 thread both engines compute
    # on that thread, so it is the idle-core throughput even on a busy host; with 2 threads it
    # only counts the caller's share and is not comparable.
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'threads':>7} {'engine':>9} {'prefill tok/s':>14} {'decode tok/s':>13} "
          f"{'prefill tok/cpu-s':>18} {'decode tok/cpu-s':>17}")
    for threads in (1, 2):
        e = engine(args.bench, threads)
        l = llama_cpp(args.model, threads, args.reps)
        for name, r in (("kvtier", e), ("llama.cpp", l), ("ratio", [a / b for a, b in zip(e, l)])):
            fmt = "{:14.2f} {:13.2f} {:18.2f} {:17.2f}" if name == "ratio" else \
                "{:14.1f} {:13.1f} {:18.1f} {:17.1f}"
            print(f"{threads:>7} {name:>9} " + fmt.format(*r))


if __name__ == "__main__":
    main()
