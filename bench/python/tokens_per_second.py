"""Decode tokens/s of stock transformers (DynamicCache; eager attention, and sdpa for
reference) against kvtier's TieredCache (full, and hierarchy β 0.5 r 0.03) on the same model and
prompt, in one run, with
the configurations interleaved so the machine's drift hits all alike. Reports medians and
ratios against stock eager.

    $KVTIER_HOME/venv/bin/python bench/python/tokens_per_second.py [--new-tokens 512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt-file", type=Path, default=REPO / "scripts" / "demo-question.txt")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    if args.new_tokens <= 0 or args.repeats <= 0:
        p.error("--new-tokens and --repeats must be positive")

    import torch
    from transformers import DynamicCache

    from kvtier.generate import default_model, load
    from kvtier.hf import TieredCache

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load(default_model())
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": args.prompt_file.read_text()}], add_generation_prompt=True,
        return_tensors="pt")["input_ids"]
    configs = {
        "stock eager (DynamicCache)": ("eager", lambda: DynamicCache(config=model.config)),
        "stock sdpa (DynamicCache)": ("sdpa", lambda: DynamicCache(config=model.config)),
        "TieredCache full": ("kvtier", lambda: TieredCache(policy="full")),
        "TieredCache hierarchy β0.5 r0.03": (
            "kvtier", lambda: TieredCache(policy="hierarchy", hbm_ratio=0.5, evict_ratio=0.03)),
    }
    rates: dict[str, list[float]] = {name: [] for name in configs}
    reports: dict[str, dict] = {}
    print(f"prompt {ids.shape[1]} tokens, {args.new_tokens} new, {args.repeats} rounds, "
          f"torch threads {torch.get_num_threads()}", file=sys.stderr)
    for round_ in range(args.repeats):
        for name, (attn, make) in configs.items():
            model.set_attn_implementation(attn)
            cache = make()
            with torch.no_grad():
                model(input_ids=ids, cache=cache, use_cache=True)  # prefill, not timed
                token = ids[:, -1:]
                start = time.perf_counter()
                for _ in range(args.new_tokens):
                    logits = model(input_ids=token, cache=cache, use_cache=True).logits
                    token = logits[:, -1].argmax(-1, keepdim=True)
                elapsed = time.perf_counter() - start
            rates[name].append(args.new_tokens / elapsed)
            if isinstance(cache, TieredCache):
                reports[name] = cache.report()
                cache.close()
            print(f"  round {round_ + 1}: {name}: {rates[name][-1]:.1f} tok/s", file=sys.stderr)
    base = statistics.median(rates["stock eager (DynamicCache)"])
    results = []
    print(f"{'configuration':36} {'tok/s (median)':>15} {'× stock eager':>14}  tiers T0/T1/T2/T3")
    for name, values in rates.items():
        median = statistics.median(values)
        tiers = reports.get(name, {}).get("tokens_by_tier", "")
        print(f"{name:36} {median:15.1f} {median / base:14.2f}  {tiers}")
        results.append({"configuration": name, "tokens_per_second": values,
                        "median": median, "ratio_to_stock_eager": median / base,
                        "tokens_by_tier": tiers})
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
