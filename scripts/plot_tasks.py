"""Plots of a `kvtier-run eval --tasks` run: accuracy against T0 share, one panel per (task,
length), one figure per regime. Reads OUT/summary.csv; writes tasks-<regime>.png."""
import csv
import math
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def series_of(config):
    """A config's series: the policy, with r and γ for the hierarchy."""
    if config == "full":
        return "full"
    parts = config.split()
    policy = parts[0]
    if policy == "hierarchy":
        r, g, codec = parts[2], parts[3], parts[4]
        eps = f" {parts[5]}" if len(parts) > 5 else ""  # max_lost_mass ε
        return f"hierarchy {r}" + (f" {g} {codec}" if g != "g0.00" else "") + eps
    return policy


def main(out_dir, plot_dir):
    rows = list(csv.DictReader(open(os.path.join(out_dir, "summary.csv"))))
    by_regime = defaultdict(list)
    for r in rows:
        by_regime[r["regime"]].append(r)
    for regime, rs in by_regime.items():
        panels = sorted({(r["task"], int(r["length"])) for r in rs})
        cols = min(4, len(panels))
        n_rows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(n_rows, cols, figsize=(4.2 * cols, 3.4 * n_rows), squeeze=False)
        for ax, (task, length) in zip(axes.flat, panels):
            series = defaultdict(list)
            for r in rs:
                if r["task"] == task and int(r["length"]) == length:
                    series[series_of(r["config"])].append(r)
            for name, pts in sorted(series.items()):
                pts.sort(key=lambda r: float(r["t0_fraction"]))
                x = [float(r["t0_fraction"]) for r in pts]
                y = [float(r["accuracy"]) for r in pts]
                lo = [y_ - float(r["lo"]) for y_, r in zip(y, pts)]
                hi = [float(r["hi"]) - y_ for y_, r in zip(y, pts)]
                style = dict(marker="*", markersize=12) if name == "full" else dict(marker="o")
                ax.errorbar(x, y, yerr=[lo, hi], label=name, capsize=2, linewidth=1, **style)
            ax.set_title(f"{task}, {length} tokens")
            ax.set_xlabel("T0 share of the full cache")
            ax.set_ylabel("accuracy (95% Wilson)")
            ax.set_ylim(-0.05, 1.05)
            ax.set_xlim(0, 1.05)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8)
        fig.suptitle(f"question-{regime}")
        fig.tight_layout(rect=(0, 0.08, 1, 0.97))
        path = os.path.join(plot_dir, f"tasks-{regime}.png")
        fig.savefig(path, dpi=90)
        print(path)


def kept_bytes(r):
    """T0 + T1 + T2 bytes over the full cache's."""
    share = float(r["t0_fraction"])
    full = float(r["t0_bytes"]) / share if share > 0 else 0
    kept = float(r["t0_bytes"]) + float(r["ddr_bytes"]) + float(r["compressed_bytes"])
    return kept / full if full else 1


def bytes_plot(out_dir, plot_dir):
    """Runs with ε (max_lost_mass) configurations: retention against T0 + T1 + T2 bytes, the
    hierarchy at fixed r against ε, one panel per (task, length, regime)."""
    rows = list(csv.DictReader(open(os.path.join(out_dir, "summary.csv"))))
    rows = [r for r in rows if r["config"].startswith("hierarchy") and r["retention"] != "nan"]
    if not any(len(r["config"].split()) > 5 for r in rows):
        return
    panels = sorted({(r["task"], int(r["length"]), r["regime"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (task, length, regime) in zip(axes.flat, panels):
        pts = [r for r in rows if (r["task"], int(r["length"]), r["regime"]) == (task, length, regime)]
        for label, pick in (("fixed r", lambda c: len(c.split()) <= 5),
                            ("r 0.9 capped by ε", lambda c: len(c.split()) > 5)):
            sel = sorted((r for r in pts if pick(r["config"])), key=kept_bytes)
            ax.plot([kept_bytes(r) for r in sel], [float(r["retention"]) for r in sel], marker="o",
                    label=label)
        ax.set_title(f"{task}, {length} tokens, {regime}")
        ax.set_xlabel("(T0 + T1 + T2) / full cache bytes")
        ax.set_ylabel("retention vs full cache")
        ax.set_ylim(-0.05, 1.05)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(plot_dir, "tasks-bytes.png")
    fig.savefig(path, dpi=90)
    print(path)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: plot_tasks.py OUT_DIR [PLOT_DIR]")
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else sys.argv[1])
    bytes_plot(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else sys.argv[1])
