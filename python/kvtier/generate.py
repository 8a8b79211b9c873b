"""python -m kvtier.generate: one prompt through a transformers model with kvtier's TieredCache,
then the tier report of ``kvtier-run generate`` (``--json``: the same keys).

    python -m kvtier.generate --prompt "How many legs do 3 spiders have?" --chat \\
        --policy hierarchy --hbm-ratio 0.5 --evict-ratio 0.03 --daemon unix:/run/kvtier/kvtierd.sock

The text report says whether T0 ended at most β of the live tokens, and if not, why (the
protected set, degraded plans, or tokens since the last placement).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from kvtier._socket import daemon_from_env

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model() -> str:
    """$KVTIER_MODEL, else $KVTIER_HOME (default ~/.cache/kvtier)/SmolLM2-135M-Instruct.Q4_1.gguf,
    where scripts/install-deps puts it: the same rule as kvtier-run."""
    if os.environ.get("KVTIER_MODEL"):
        return os.environ["KVTIER_MODEL"]
    home = os.environ.get("KVTIER_HOME", str(Path.home() / ".cache" / "kvtier"))
    return str(Path(home) / DEFAULT_MODEL_FILE)


def ratio(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is outside [0, 1]")
    return value


def positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def nonnegative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m kvtier.generate",
        description="Generate with a Hugging Face model whose KV cache kvtier places by attention "
        "(T0 tensors, T1 DDR, T2 8-bit, T3 evicted), then report the tiers.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text")
    source.add_argument("--prompt-file", type=Path, help="read the prompt from a file")
    p.add_argument("--model", default=default_model(),
                   help="a GGUF file (loaded with gguf_file=) or a transformers model directory "
                   "(default: %(default)s)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    p.add_argument("--max-new-tokens", type=positive, default=256)
    p.add_argument("--policy", choices=["full", "hierarchy", "streaming"], default="hierarchy")
    p.add_argument("--hbm-ratio", type=ratio, default=0.5, help="β: share of live tokens in T0")
    p.add_argument("--evict-ratio", type=ratio, default=0.03,
                   help="r: cumulative evicted share of eligible tokens (lossy)")
    p.add_argument("--compress-ratio", type=ratio, default=0.0,
                   help="γ: share of live candidates kept 8-bit in T2 (lossy)")
    p.add_argument("--max-lost-mass", type=float, default=None,
                   help="ε: evict only while the evicted pages' estimated attention mass per step "
                   "stays at most this (default: no limit; 0: no eviction)")
    p.add_argument("--page-tokens", type=positive, default=16)
    p.add_argument("--codec", default="int8_kivi", help="T2 codec: int8_kivi | fp8_e4m3 | minmax")
    kept = p.add_argument_group(
        "the protected set and Δ",
        "positions that never leave T0, and how often pages are placed; with the prompt "
        "protected, a long prompt with a short answer offloads nothing")
    kept.add_argument("--sink-tokens", type=nonnegative, default=4,
                      help="first positions kept in T0 (default: %(default)s)")
    kept.add_argument("--window-tokens", type=nonnegative, default=128,
                      help="most recent positions kept in T0 (default: %(default)s)")
    kept.add_argument("--protect-prompt", action=argparse.BooleanOptionalAction, default=True,
                      help="keep the whole prompt in T0 (default: on)")
    kept.add_argument("--retier-interval", type=positive, default=64,
                      help="Δ: decode steps between placements (default: %(default)s)")
    kept.add_argument("--wait-for-plans", action="store_true",
                      help="with --daemon: apply each plan at its step, as local pools do "
                      "(the same tokens at r > 0; one round trip per placement)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--daemon", help="kvtierd's socket, unix:PATH (default: $KVTIER_SOCKET "
                       "when set, else in-process pools)")
    where.add_argument("--local", action="store_true",
                       help="in-process pools, whatever $KVTIER_SOCKET says")
    p.add_argument("--threads", type=positive, help="torch threads (default: torch's)")
    p.add_argument("--json", action="store_true", help="print one JSON object: text, tokens, report")
    args = p.parse_args(argv)
    if args.evict_ratio + args.compress_ratio > 1:
        p.error(f"--evict-ratio + --compress-ratio = {args.evict_ratio + args.compress_ratio} "
                "exceeds 1")
    if args.daemon is None and not args.local:
        args.daemon = daemon_from_env()
    if args.max_lost_mass is not None and not args.max_lost_mass >= 0:
        p.error(f"--max-lost-mass {args.max_lost_mass} must be >= 0")
    if args.daemon is not None and not args.daemon.startswith("unix:"):
        p.error(f"--daemon {args.daemon!r}: kvtierd's unix socket, unix:PATH")
    if args.prompt_file is not None:
        try:
            args.prompt = args.prompt_file.read_text()
        except OSError as e:
            p.error(f"--prompt-file: {e}")
    if not args.prompt.strip():
        p.error("the prompt is empty")
    if not Path(args.model).exists():
        p.error(f"--model {args.model} does not exist (scripts/install-deps downloads the "
                "project's model)")
    return args


def load(model: str):
    """A model and tokenizer from a GGUF file or a directory, with attn_implementation="kvtier"."""
    import kvtier.hf  # noqa: F401  (registers "kvtier")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model)
    if path.is_file():
        kw = dict(gguf_file=path.name)
        path = path.parent
    else:
        kw = {}
    tokenizer = AutoTokenizer.from_pretrained(path, **kw)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="kvtier", **kw)
    return model.eval(), tokenizer


class Progress:
    """A transformers streamer: a tqdm bar over generated tokens, and their timing."""

    def __init__(self, total: int, quiet: bool):
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="tok", desc="generating", disable=quiet,
                        file=sys.stderr, leave=False)
        self.started = time.perf_counter()
        self.first_token_at = None
        self.steps: list[float] = []
        self._last = None

    def put(self, value):
        now = time.perf_counter()
        if self._last is None:  # the prompt
            self._last = now
            return
        if self.first_token_at is None:
            self.first_token_at = now
        else:
            self.steps.append(now - self._last)
        self._last = now
        self.bar.update(value.numel())

    def end(self):
        self.bar.close()


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[int(len(sorted_values) * q)] if sorted_values else 0.0


def run(args) -> dict:
    import torch

    from kvtier.hf import TieredCache, cache_kwargs

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model)
    if args.chat:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}],
                                            add_generation_prompt=True, return_tensors="pt")
        ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    else:
        ids = tokenizer(args.prompt, return_tensors="pt")["input_ids"]
    cache = TieredCache(policy=args.policy, hbm_ratio=args.hbm_ratio,
                        evict_ratio=args.evict_ratio, compress_ratio=args.compress_ratio,
                        codec=args.codec, page_tokens=args.page_tokens,
                        daemon=args.daemon or "", max_lost_mass=args.max_lost_mass,
                        sink_tokens=args.sink_tokens, window_tokens=args.window_tokens,
                        protect_prompt=args.protect_prompt,
                        retier_interval=args.retier_interval,
                        wait_for_plans=args.wait_for_plans,
                        local_fallback=False)  # --daemon asked for kvtierd: say it is down
    progress = Progress(args.max_new_tokens, quiet=args.json)
    with torch.no_grad():
        out = model.generate(ids, **cache_kwargs(cache), max_new_tokens=args.max_new_tokens,
                             do_sample=False, streamer=progress)
    done = time.perf_counter()
    tokens = out[0, ids.shape[1]:].tolist()
    eos = tokenizer.eos_token_id
    stop = "eos" if tokens and tokens[-1] == eos else "max_new_tokens"
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    report = cache.report()
    prefill = (progress.first_token_at or done) - progress.started
    decode = done - (progress.first_token_at or done)
    steps = sorted(progress.steps)
    report.update({
        "generated_tokens": len(tokens),
        "stop_reason": stop,
        "prefill_seconds": prefill,
        "decode_seconds": decode,
        "decode_tokens_per_second": len(steps) / decode if decode > 0 else 0.0,
        "decode_step_p50_ms": 1e3 * percentile(steps, 0.5),
        "decode_step_p99_ms": 1e3 * percentile(steps, 0.99),
        "decode_step_max_ms": 1e3 * (steps[-1] if steps else 0.0),
    })
    cache.close()
    return {"text": text, "tokens": tokens, "report": report}


def mib(n: float) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def format_report(r: dict) -> str:
    where = f"kvtierd {r['daemon']}" if r["daemon"] else "local pools"
    t = r["tokens_by_tier"]
    share = 100 * r["t0_mean_bytes"] / r["full_mean_bytes"] if r.get("full_mean_bytes") else 100
    return "\n".join([
        f"── tier report: policy {r['policy']}  β={r['hbm_ratio']:.2f}  r={r['evict_ratio']:.2f}  "
        f"γ={r['compress_ratio']:.2f}  page={r['page_tokens']}  {where}",
        f"  tokens          prompt {r['prompt_tokens']} + generated {r['generated_tokens']} "
        f"({r['stop_reason']})",
        f"  T0 (HBM)        peak {mib(r['t0_peak_bytes'])}, mean {mib(r['t0_mean_bytes'])} = "
        f"{share:.1f}% of the full cache ({mib(r['full_mean_bytes'])})",
        f"  T1 (DDR)        {mib(r['ddr_bytes'])} now    T2 (8-bit) {mib(r['compressed_bytes'])} now",
        f"  tokens by tier  T0 {t[0]}  T1 {t[1]}  T2 {t[2]}  T3 {t[3]}",
        f"  evicted         {100 * r['evicted_generated_fraction']:.2f}% of generated tokens "
        "(cumulative)",
        f"  lost mass       {r['lost_mass']['total']:.4f} of a step's attention (T2 x codec error "
        f"{r['lost_mass']['compressed']:.4f}, evicted estimate "
        f"{r['lost_mass']['evicted_estimate']:.4f}; peak {r['lost_mass']['peak']:.4f})",
        f"  moved           offload {mib(r['offload_bytes'])}, compress {mib(r['compress_bytes'])}, "
        f"promote {mib(r['promote_bytes'])}, decompress {mib(r['decompress_bytes'])}",
        f"  plans           {r['plans']} ({r['degraded_plans']} degraded, {r['local_plans']} local, "
        f"{r.get('protected_overflow_plans', 0)} with the protected set over β)",
        *beta_lines(r),
        f"  speed           prefill {r['prompt_tokens'] / max(r['prefill_seconds'], 1e-9):.1f} "
        f"tok/s, decode {r['decode_tokens_per_second']:.1f} tok/s",
    ])


def beta_lines(r: dict) -> list[str]:
    """Whether T0 holds at most β of the live tokens at the end, and if not, why."""
    if r["policy"] != "hierarchy" or "tokens_by_tier" not in r:
        return []
    t0, t1, t2, _ = r["tokens_by_tier"]
    live = t0 + t1 + t2
    if live == 0:
        return []
    share = t0 / live
    if t0 <= r["hbm_ratio"] * live + r["page_tokens"]:  # placement is by whole pages
        return [f"  β               met: T0 holds {100 * share:.1f}% of the live tokens"]
    protected = r.get("sink_tokens", 0) + r.get("window_tokens", 0)
    parts = [f"{r.get('sink_tokens', 0)} sink", f"{r.get('window_tokens', 0)} window"]
    if r.get("protect_prompt"):
        protected += r["prompt_tokens"]
        parts.insert(0, f"the {r['prompt_tokens']}-token prompt")
    lines = [f"  β               NOT met: T0 holds {100 * share:.1f}% of the live tokens, "
             f"β = {100 * r['hbm_ratio']:.0f}%"]
    if r.get("protected_overflow_plans", 0) or protected >= r["hbm_ratio"] * live:
        hint = "--no-protect-prompt" if r.get("protect_prompt") else "a smaller --window-tokens"
        lines.append(f"    why           the protected set ({' + '.join(parts)} = up to {protected} "
                     f"tokens) never leaves T0 and exceeds β × {live} live tokens: try {hint}")
    elif r["degraded_plans"]:
        lines.append("    why           degraded plans: kvtierd was unreachable or its pools full, "
                     "so nothing new was offloaded")
    else:
        lines.append(f"    why           tokens since the last placement stay in T0 until the next "
                     f"(every {r.get('retier_interval', '?')} steps)")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    import kvtier

    try:
        result = run(args)
    except kvtier.Error as e:
        print(f"kvtier.generate: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(result["text"])
        print(format_report(result["report"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
