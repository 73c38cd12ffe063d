"""Plots bench/spec_bench results: CPU-time speedup over no speculation per batch size and
configuration, one panel per workload, with mean accepted length annotated and, at batch 1,
the ceiling the measured acceptance and draft / verify costs allow (black tick).

Usage: spec_bench_plot.py OUT.png RESULT.json [RESULT.json ...]
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    out, paths = sys.argv[1], sys.argv[2:]
    fig, axes = plt.subplots(1, len(paths), figsize=(6 * len(paths), 4.2), squeeze=False)
    for ax, path in zip(axes[0], paths):
        data = json.load(open(path))
        runs = data["runs"]
        batches = sorted({r["batch"] for r in runs})
        configs = list(dict.fromkeys(r["config"] for r in runs))
        width = 0.8 / len(configs)
        for i, config in enumerate(configs):
            xs, ys, labels = [], [], []
            for j, b in enumerate(batches):
                r = next(r for r in runs if r["batch"] == b and r["config"] == config)
                xs.append(j + (i - (len(configs) - 1) / 2) * width)
                ys.append(r.get("cpu_speedup", 1.0))
                labels.append(f'{r["mean_accepted_length"]:.2f}')
                if "cpu_ceiling_speedup" in r:
                    ax.plot([xs[-1]], [r["cpu_ceiling_speedup"]], marker="_", color="black",
                            markersize=14, markeredgewidth=2)
            bars = ax.bar(xs, ys, width, label=config)
            if config != "none":
                for bar, label in zip(bars, labels):
                    ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(batches)))
        ax.set_xticklabels([f"batch {b}" for b in batches])
        ax.set_ylabel("decode tokens/s ÷ none (CPU time)")
        ax.set_title(f'{data["workload"]}: {data["model"].rsplit("/", 1)[-1]}'
                     + (" + draft" if "draft" in "".join(configs) else " + n-gram"))
        ax.legend(fontsize=8)
    fig.text(0.5, 0.005, "bar labels: mean accepted length (tokens per verification); "
             "black tick: ceiling from acceptance and draft/verify CPU costs (batch 1)",
             ha="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
