"""Decode tokens/s of stock transformers (DynamicCache; eager and sdpa attention) against
kvtier's TieredCache (full, and hierarchy β 0.5 r 0.03) on the same model and prompt, in one
run, at each torch thread count asked (default 1 and 2), with the configurations interleaved so
the machine's drift hits all alike. Reports medians and ratios against stock eager and stock
sdpa at the same thread count.

    $KVTIER_HOME/venv/bin/python bench/python/tokens_per_second.py [--new-tokens 512] \
        [--repeats 3] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EAGER = "stock eager (DynamicCache)"
SDPA = "stock sdpa (DynamicCache)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt-file", type=Path, default=REPO / "scripts" / "demo-question.txt")
    p.add_argument("--threads", default="1,2", help="torch thread counts, comma-separated")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    if args.new_tokens <= 0 or args.repeats <= 0:
        p.error("--new-tokens and --repeats must be positive")
    try:
        thread_counts = [int(x) for x in args.threads.split(",")]
    except ValueError:
        p.error(f"--threads {args.threads!r}: give comma-separated positive integers")
    if not thread_counts or min(thread_counts) <= 0:
        p.error(f"--threads {args.threads!r}: give comma-separated positive integers")

    import torch
    from transformers import DynamicCache

    from kvtier.generate import default_model, load
    from kvtier.hf import TieredCache

    model, tokenizer = load(default_model())
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": args.prompt_file.read_text()}], add_generation_prompt=True,
        return_tensors="pt")["input_ids"]
    configs = {
        EAGER: ("eager", lambda: DynamicCache(config=model.config)),
        SDPA: ("sdpa", lambda: DynamicCache(config=model.config)),
        "TieredCache full": ("kvtier", lambda: TieredCache(policy="full")),
        "TieredCache hierarchy β0.5 r0.03": (
            "kvtier", lambda: TieredCache(policy="hierarchy", hbm_ratio=0.5, evict_ratio=0.03)),
    }
    print(f"prompt {ids.shape[1]} tokens, {args.new_tokens} new, {args.repeats} rounds, "
          f"torch threads {thread_counts}", file=sys.stderr)
    results = []
    print(f"{'threads':>7} {'configuration':36} {'tok/s (median)':>15} {'× eager':>8} "
          f"{'× sdpa':>7}  tiers T0/T1/T2/T3")
    for threads in thread_counts:
        torch.set_num_threads(threads)
        rates: dict[str, list[float]] = {name: [] for name in configs}
        reports: dict[str, dict] = {}
        for round_ in range(args.repeats):
            for name, (attn, make) in configs.items():
                model.set_attn_implementation(attn)
                cache = make()
                rates[name].append(decode_rate(model, ids, cache, args.new_tokens))
                if isinstance(cache, TieredCache):
                    reports[name] = cache.report()
                    cache.close()
                print(f"  {threads} threads, round {round_ + 1}: {name}: "
                      f"{rates[name][-1]:.1f} tok/s", file=sys.stderr)
        eager = statistics.median(rates[EAGER])
        sdpa = statistics.median(rates[SDPA])
        for name, values in rates.items():
            median = statistics.median(values)
            tiers = reports.get(name, {}).get("tokens_by_tier", "")
            print(f"{threads:7} {name:36} {median:15.1f} {median / eager:8.2f} "
                  f"{median / sdpa:7.2f}  {tiers}")
            results.append({"threads": threads, "configuration": name,
                            "tokens_per_second": values, "median": median,
                            "ratio_to_stock_eager": median / eager,
                            "ratio_to_stock_sdpa": median / sdpa, "tokens_by_tier": tiers})
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def decode_rate(model, ids, cache, new_tokens: int) -> float:
    """Greedy decode tokens/s after an untimed prefill."""
    import torch

    from kvtier.hf import cache_kwargs

    with torch.no_grad():
        model(input_ids=ids, **cache_kwargs(cache), use_cache=True)
        token = ids[:, -1:]
        start = time.perf_counter()
        for _ in range(new_tokens):
            logits = model(input_ids=token, **cache_kwargs(cache), use_cache=True).logits
            token = logits[:, -1].argmax(-1, keepdim=True)
        return new_tokens / (time.perf_counter() - start)


if __name__ == "__main__":
    sys.exit(main())
