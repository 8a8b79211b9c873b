"""Plots kvtier-schedule-sim's CSV: predicted decode step time, stage-all vs the daemon's
schedule, against context, per model, topology and batch (β = 0.5).

    build/bin/kvtier-schedule-sim --csv /tmp/sim.csv && python3 bench/sim/plot_schedule.py /tmp/sim.csv docs/scheduling.png
"""

import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: str, dst: str) -> int:
    rows = [r for r in csv.DictReader(open(src)) if float(r["beta"]) == 0.5]
    panels = defaultdict(list)
    for r in rows:
        panels[(r["model"], r["topology"])].append(r)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), sharey=False)
    for ax, ((model, topology), rs) in zip(axes, sorted(panels.items())):
        for batch, color in (("1", "tab:gray"), ("8", "tab:blue"), ("32", "tab:red")):
            b = sorted((r for r in rs if r["batch"] == batch), key=lambda r: int(r["context"]))
            ctx = [int(r["context"]) // 1024 for r in b]
            ax.plot(ctx, [float(r["all_step_ms"]) for r in b], "--", color=color,
                    label=f"batch {batch}, stage all")
            ax.plot(ctx, [float(r["sched_step_ms"]) for r in b], "-", color=color,
                    label=f"batch {batch}, schedule")
        ax.set_title(f"{model}, {topology}, β = 0.5", fontsize=10)
        ax.set_xlabel("context (K tokens)")
        ax.set_ylabel("predicted step (ms)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot_schedule.py SIM.csv OUT.png")
    sys.exit(main(sys.argv[1], sys.argv[2]))
