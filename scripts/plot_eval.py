"""Plots for `kvtier-run eval` results (see docs/evaluation.md).

plot_eval.py OUT_DIR [PLOT_DIR]: reads OUT_DIR/results.csv, writes cliff.png, flat.png,
tradeoff.png and codecs.png into PLOT_DIR (default OUT_DIR). Means over questions with 95%
bootstrap intervals (error bars).
"""
import csv
import os
import random
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"hierarchy": "tab:blue", "h2o": "tab:red", "streaming": "tab:orange",
          "rkv": "tab:purple", "arkv": "tab:green"}


def load(path):
    by_config = defaultdict(list)
    with open(path) as f:
        for row in csv.DictReader(f):
            by_config[row["config"]].append(row)
    return by_config


def stat(rows, column, fn=float):
    """Mean and 95% bootstrap interval of a column (or a function of the row)."""
    vals = [column(r) if callable(column) else fn(r[column]) for r in rows]
    n = len(vals)
    mean = sum(vals) / n
    rng = random.Random(1)
    means = sorted(sum(vals[rng.randrange(n)] for _ in range(n)) / n for _ in range(1000))
    return mean, mean - means[25], means[974] - mean


def prefix_share(r):
    n = float(r["ref_tokens"])
    return float(r["identical_prefix"]) / n if n else 1.0


def knob(rows, name):
    return float(rows[0][name])


def series(by_config, policy, key, where=lambda rows: True):
    pts = []
    for rows in by_config.values():
        if rows[0]["policy"] == policy and where(rows):
            pts.append((key(rows), rows))
    return sorted(pts, key=lambda p: p[0])


def errplot(ax, xs, stats, **kw):
    ax.errorbar(xs, [s[0] for s in stats], yerr=[[s[1] for s in stats], [s[2] for s in stats]],
                capsize=3, marker="o", **kw)


def no_t2(rows):
    return knob(rows, "compress_ratio") == 0


def cliff(by_config, out):
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    metrics = [("top1_agreement", "top-1 agreement (teacher-forced)"),
               (prefix_share, "identical prefix / chain (free-running)"),
               ("same_answer", "same final answer as full cache")]
    for ax, (metric, label) in zip(axes, metrics):
        for policy in ["hierarchy", "h2o", "streaming", "rkv", "arkv"]:
            where = (lambda rows: no_t2(rows) and knob(rows, "hbm_ratio") == 0.5) \
                if policy == "hierarchy" else (lambda rows: True)
            pts = series(by_config, policy, lambda rows: stat(rows, "evicted_fraction")[0], where)
            if not pts:
                continue
            errplot(ax, [p[0] for p in pts], [stat(p[1], metric) for p in pts],
                    color=COLORS[policy], label=policy + (" (β=0.5)" if policy == "hierarchy" else ""))
        ax.set_xlabel("evicted share of generated tokens (cumulative, measured)")
        ax.set_ylabel(label)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Fidelity vs eviction: the cliff")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "cliff.png"), dpi=80)


def flat(by_config, out):
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    rs = sorted({knob(rows, "evict_ratio") for rows in by_config.values()
                 if rows[0]["policy"] == "hierarchy" and no_t2(rows)})
    for r in rs:
        pts = series(by_config, "hierarchy", lambda rows: knob(rows, "hbm_ratio"),
                     lambda rows: no_t2(rows) and knob(rows, "evict_ratio") == r)
        if len(pts) < 2:
            continue
        xs = [p[0] for p in pts]
        errplot(axes[0], xs, [stat(p[1], "top1_agreement") for p in pts], label=f"r={r:g}")
        errplot(axes[1], xs, [stat(p[1], "t0_mean_ratio") for p in pts], label=f"r={r:g}")
    axes[0].set_ylabel("top-1 agreement")
    axes[1].set_ylabel("T0 mean bytes / full cache")
    for ax in axes:
        ax.set_xlabel("hbm_ratio β")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylim(-0.02, 1.02)
    fig.suptitle("hierarchy: fidelity is flat in β (a cost knob); T0 bytes are not")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "flat.png"), dpi=80)


def tradeoff(by_config, out):
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, metric, label in [(axes[0], "top1_agreement", "top-1 agreement (teacher-forced)"),
                              (axes[1], prefix_share, "identical prefix / chain (free-running)")]:
        for policy in ["hierarchy", "h2o", "streaming", "rkv", "arkv"]:
            pts = series(by_config, policy, lambda rows: stat(rows, "t0_mean_ratio")[0],
                         no_t2 if policy == "hierarchy" else (lambda rows: True))
            if not pts:
                continue
            ax.scatter([p[0] for p in pts], [stat(p[1], metric)[0] for p in pts],
                       color=COLORS[policy], label=policy, s=30)
        ax.set_xlabel("T0 (HBM) mean bytes / full cache")
        ax.set_ylabel(label)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Fidelity vs HBM footprint (hierarchy: every r and β)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "tradeoff.png"), dpi=80)


def codecs(by_config, out):
    pts = [(rows[0]["codec"], knob(rows, "compress_ratio"), rows) for rows in by_config.values()
           if rows[0]["policy"] == "hierarchy" and not no_t2(rows)]
    if not pts:
        return
    pts.sort(key=lambda p: (p[0], p[1]))
    labels = [f"{c}\nγ={g:g}" for c, g, _ in pts]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, label in [(axes[0], "kl_mean", "mean KL(full ‖ config), nats/step"),
                              (axes[1], "top1_agreement", "top-1 agreement")]:
        stats = [stat(rows, metric) for _, _, rows in pts]
        ax.bar(range(len(pts)), [s[0] for s in stats],
               yerr=[[s[1] for s in stats], [s[2] for s in stats]], capsize=3, color="tab:cyan")
        ax.set_xticks(range(len(pts)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_yscale("log")
    axes[1].set_ylim(0.9, 1.001)
    fig.suptitle("T2 codecs (hierarchy β=0.5, r=0)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "codecs.png"), dpi=80)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: plot-eval OUT_DIR [PLOT_DIR]")
    out = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]
    os.makedirs(out, exist_ok=True)
    by_config = load(os.path.join(sys.argv[1], "results.csv"))
    if not by_config:
        sys.exit("plot-eval: no rows in results.csv")
    cliff(by_config, out)
    flat(by_config, out)
    tradeoff(by_config, out)
    codecs(by_config, out)
    print(f"plot-eval: wrote cliff.png flat.png tradeoff.png codecs.png into {out}")


if __name__ == "__main__":
    main()
