#!/usr/bin/env python3
"""Long-context side by side: kvtier's engine (policy `full`, and `hierarchy` with beta 0.5,
r 0.03) against llama.cpp on the same GGUF file, the same prompt token ids, the same thread
counts, measured alternately in one run.

For each thread count and context C, the prompt is C - DECODE synthetic tokens (token i =
100 + (i * 7919) % 40000, as engine_bench) and DECODE greedy steps follow that never stop at
end-of-sequence, so every run decodes the same number of tokens up to context C. Each round
runs kvtier full, kvtier hierarchy and llama.cpp one after another; the table gives the median
of the rounds (wall-clock tok/s) and the ratios of medians. This machine is shared, so only the
ratios of one run mean anything.

llama.cpp comes from llama-cpp-python built from source in a virtual environment OUTSIDE the
repository (it is not a project dependency; nothing fetched is committed):

  python3 -m venv $LLAMA_VENV
  CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL=1 \\
      $LLAMA_VENV/bin/pip install llama-cpp-python numpy
  $LLAMA_VENV/bin/python bench/engine/llama_cpp_long_context.py \\
      --run build/bin/long_context_run --contexts 512,2048,8192 --threads 1,2 --rounds 3

llama.cpp runs with llama-cpp-python's defaults (f16 KV cache, flash attention off), n_ctx = C
and n_batch 512; its logits are read from the context after each step (without logits_all the
library keeps no scores).

--baseline-run OLD_BINARY adds a fourth engine to every round, OLD_BINARY's policy `full`
("before"), so that a change is measured against its baseline in the same run.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

DECODE = 256


def prompt_ids(n):
    return [100 + (i * 7919) % 40000 for i in range(n)]


def kvtier(run, threads, prompt, policy, model):
    cmd = [run, "--model", model, "--threads", str(threads), "--prompt-tokens", str(prompt),
           "--decode", str(DECODE), "--policy", policy]
    if policy == "hierarchy":
        cmd += ["--hbm-ratio", "0.5", "--evict-ratio", "0.03"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return r["prefill_tok_s"], r["decode_tok_s"]


class LlamaCpp:
    def __init__(self, model, threads, n_ctx):
        from llama_cpp import Llama  # imported here so --help works without the venv
        self.llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads,
                         n_ctx=n_ctx, n_batch=512, verbose=False, logits_all=False)

    def last_logits(self):
        # Without logits_all, llama-cpp-python keeps no scores: read the context's logits of the
        # last evaluated token (the only row a batch asks for).
        import numpy as np
        return np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),))

    def run(self, prompt):
        llm = self.llm
        llm.reset()
        ids = prompt_ids(prompt)
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        for _ in range(DECODE):
            llm.eval([int(self.last_logits().argmax())])  # never stops at end-of-sequence
        t2 = time.perf_counter()
        return prompt / (t1 - t0), DECODE / (t2 - t1)


def main():
    home = os.environ.get("KVTIER_HOME", os.path.expanduser("~/.cache/kvtier"))
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.environ.get(
        "KVTIER_MODEL", os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf")))
    ap.add_argument("--run", default="build/bin/long_context_run")
    ap.add_argument("--contexts", default="512,2048,8192")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline-run", help="also run this long_context_run (policy full) each round")
    ap.add_argument("--json", help="also write every measurement to this file")
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    threads_list = [int(t) for t in args.threads.split(",")]
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    results = []
    engines = ("full", "hierarchy", "llama.cpp") + (("before",) if args.baseline_run else ())
    for threads in threads_list:
        for ctx in contexts:
            prompt = ctx - DECODE
            llama = LlamaCpp(args.model, threads, ctx)
            runs = {e: [] for e in engines}
            for rnd in range(args.rounds):
                runs["full"].append(kvtier(args.run, threads, prompt, "full", args.model))
                runs["hierarchy"].append(kvtier(args.run, threads, prompt, "hierarchy",
                                                args.model))
                runs["llama.cpp"].append(llama.run(prompt))
                if args.baseline_run:
                    runs["before"].append(kvtier(args.baseline_run, threads, prompt, "full",
                                                 args.model))
                print(f"  threads {threads} ctx {ctx} round {rnd + 1}: " + ", ".join(
                    f"{e} {runs[e][-1][0]:.1f}/{runs[e][-1][1]:.1f}" for e in engines),
                    file=sys.stderr, flush=True)
            del llama
            med = {e: (statistics.median(r[0] for r in runs[e]),
                       statistics.median(r[1] for r in runs[e])) for e in engines}
            results.append({"threads": threads, "context": ctx, "prompt": prompt,
                            "runs": runs, "median": med})
            print(f"threads {threads} context {ctx} (prompt {prompt} + {DECODE} decode): "
                  f"prefill tok/s full {med['full'][0]:.1f}, llama.cpp {med['llama.cpp'][0]:.1f}"
                  f" ({med['full'][0] / med['llama.cpp'][0]:.2f}x); decode tok/s full "
                  f"{med['full'][1]:.1f}, hierarchy {med['hierarchy'][1]:.1f}, llama.cpp "
                  f"{med['llama.cpp'][1]:.1f}", flush=True)
    print()
    before = args.baseline_run is not None
    print("| threads | context | prefill kvtier / llama.cpp | decode kvtier full / llama.cpp |"
          " decode hierarchy / full |" + (" before: prefill, decode / llama.cpp |" if before
                                          else ""))
    print("|---|---|---|---|---|" + ("---|" if before else ""))
    for r in results:
        m = r["median"]
        f, h, l = m["full"], m["hierarchy"], m["llama.cpp"]
        row = (f"| {r['threads']} | {r['context']} | {f[0]:.1f} / {l[0]:.1f} = {f[0] / l[0]:.2f}x"
               f" | {f[1]:.1f} / {l[1]:.1f} = {f[1] / l[1]:.2f}x | {h[1]:.1f} / {f[1]:.1f} = "
               f"{h[1] / f[1]:.3f} |")
        if before:
            b = m["before"]
            row += f" {b[0] / l[0]:.2f}x, {b[1] / l[1]:.2f}x |"
        print(row)
    print(f"\nmedians of {args.rounds} alternating rounds; load average at end: "
          f"{os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
