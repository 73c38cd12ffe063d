"""Plots bench/spec_bench results: median CPU-time speedup over no speculation per batch size
and configuration, one panel per workload, with the median mean accepted length above each bar.

A panel may combine several result files of one workload (say a batch-1 run with repeats and a
batch-8/64 run): join them with '+'. A configuration a file did not run at some batch leaves a
gap there.

Usage: spec_bench_plot.py OUT.png PANEL [PANEL ...]   (PANEL = RESULT.json[+RESULT.json...])
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load_panel(spec):
    """Returns (title, {(batch, config): summary row}) for one '+'-joined list of files."""
    rows, title = {}, None
    for path in spec.split("+"):
        data = json.load(open(path))
        name = data["model"].rsplit("/", 1)[-1]
        drafts = {row["config"].split(":")[0] for row in data["summary"]} - {"none"}
        kind = "n-gram" if drafts == {"ngram"} else "draft model"
        title = title or f'{data["workload"]}: {name} + {kind}'
        for row in data["summary"]:
            rows[(row["batch"], row["config"])] = row
    return title, rows


def main():
    out, panels = sys.argv[1], sys.argv[2:]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, spec in zip(axes[0], panels):
        title, rows = load_panel(spec)
        batches = sorted({b for b, _ in rows})
        configs = list(dict.fromkeys(c for _, c in rows))
        configs.sort(key=lambda c: c != "none")
        width = 0.8 / len(configs)
        for i, config in enumerate(configs):
            xs, ys, labels = [], [], []
            for j, b in enumerate(batches):
                row = rows.get((b, config))
                if row is None:
                    continue
                xs.append(j + (i - (len(configs) - 1) / 2) * width)
                ys.append(row["median_cpu_speedup"])
                labels.append(f'{row["median_mean_accepted_length"]:.2f}')
            bars = ax.bar(xs, ys, width, label=config)
            if config != "none":
                for bar, label in zip(bars, labels):
                    ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(batches)))
        ax.set_xticklabels([f"batch {b}" for b in batches])
        ax.set_ylabel("decode tokens/s ÷ none (CPU time, median)")
        ax.set_title(title)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.25)  # room for the legend above the bars
        ax.legend(fontsize=7, loc="upper center", ncol=3)
    fig.text(0.5, 0.005, "bar labels: mean accepted length (tokens per verification, the "
             "target's own included)", ha="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
