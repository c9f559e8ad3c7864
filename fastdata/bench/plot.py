"""``throughput.png``: what a benchmark run says, at a glance, drawn from its rows.

:func:`figure` builds the matplotlib Figure (tests inspect it: axes, line labels, annotation
texts); :func:`plot` saves it. Panels, top to bottom:

1. each format/store/path at its best num_workers: a bar (log scale, with the spread of its
   epochs), annotated with that num_workers and its speed-up over the baseline (the source read
   as it is: the image folder or torchvision dataset); the recommended row is marked;
2. samples/s against num_workers, one line per row (each row its own colour, line style and
   marker, so lines that overlap stay apart), the best point of each row starred, the
   baseline's best as a dashed horizontal line;
3. only when a training step is simulated: the share of loop time spent waiting for data (with
   no step the loop does nothing else, so it is 1.0 everywhere and says nothing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastdata.bench.report import sort_key, label
from fastdata.bench.summary import choose_workers, recommend, summarize
from fastdata.bench.explain import times

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#000000")
LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def style(position: int) -> dict[str, Any]:
    """Colour, line style and marker of the ``position``-th row. The three cycles have pairwise
    coprime lengths (11, 4, 7), so the first 308 rows all differ in at least one of them."""
    return {"color": COLOURS[position % len(COLOURS)], "linestyle": LINE_STYLES[position % len(LINE_STYLES)],
            "marker": MARKERS[position % len(MARKERS)]}


def figure(rows: list[dict[str, Any]], *, title: str = "", baseline: str | None = None,
           step: bool = False) -> Any:
    """The figure of ``throughput.png`` (a :class:`matplotlib.figure.Figure`), or None when no
    configuration was measured. ``step``: a training step was simulated (adds the wait panel).
    Raises ImportError without matplotlib."""
    from matplotlib.figure import Figure

    summary = summarize(rows)
    keys = [key for key, by_workers in sorted(summary.items(), key=lambda item: sort_key(item[0], baseline))
            if any(cell["status"] == "ok" for cell in by_workers.values())]
    if not keys:
        return None
    heights = [0.8 + 0.32 * len(keys), 4.0] + ([2.6] if step else [])
    fig = Figure(figsize=(9, sum(heights) + 0.6))
    axes = fig.subplots(len(heights), 1, gridspec_kw={"height_ratios": heights})
    _best_bars(axes[0], summary, keys, baseline)
    axes[0].set_title(title, fontsize=9)
    _curves(axes[1], summary, keys, baseline, "samples_per_s")
    if step:
        _curves(axes[2], summary, keys, baseline, "wait_fraction")
    fig.tight_layout()
    return fig


def _best_bars(ax: Any, summary: dict, keys: list, baseline: str | None) -> None:
    recommendation = recommend({key: summary[key] for key in keys}, baseline)
    base = recommendation["baseline"]["samples_per_s"] if recommendation and recommendation["baseline"] else None
    choices = [choose_workers(key, summary[key]) for key in keys]
    for position, (key, choice) in enumerate(zip(keys, choices)):
        cell, workers = choice["cell"], choice["num_workers"]
        rate = cell["samples_per_s"]
        error = [[rate - cell["min_samples_per_s"]], [cell["max_samples_per_s"] - rate]]
        ax.barh(position, rate, xerr=error, color=style(position)["color"], alpha=0.85,
                hatch="//" if key[0] == baseline else None, capsize=2)
        text = f"{rate:,.0f}/s at nw={workers}"
        if key[0] == baseline:
            text += " (baseline)"
        elif base:
            text += f", {times(rate / base)} {baseline}"
        if recommendation and (recommendation["format"], recommendation["store"], recommendation["read_path"],
                               recommendation["backend"], recommendation["num_workers"]) == (*key, workers):
            text += "  <- recommended"
        ax.annotate(text, (cell["max_samples_per_s"], position), xytext=(6, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set_yticks(range(len(keys)), [label(key) for key in keys], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("samples/s at the row's best num_workers (log; bars: min..max of the epochs)", fontsize=8)
    lows = [choice["cell"]["min_samples_per_s"] for choice in choices]
    highs = [choice["cell"]["max_samples_per_s"] for choice in choices]
    ax.set_xlim(max(min(lows), 1e-3) / 3, max(highs) * 12)  # bars start inside the axes; room for the annotations


def _curves(ax: Any, summary: dict, keys: list, baseline: str | None, metric: str) -> None:
    for position, key in enumerate(keys):
        points = sorted((w, cell) for w, cell in summary[key].items() if cell["status"] == "ok")
        ax.plot([w for w, _ in points], [cell[metric] for _, cell in points], label=label(key), markersize=5,
                linewidth=1.2, **style(position))
        choice = choose_workers(key, summary[key])
        ax.plot([choice["num_workers"]], [choice["cell"][metric]], marker="*", markersize=13, linestyle="none",
                color=style(position)["color"], markeredgecolor="black", label="_best")
    workers = sorted({w for by_workers in summary.values() for w in by_workers})
    ax.set_xticks(workers)
    ax.set_xlabel("num_workers (* = the row's best)", fontsize=8)
    if metric == "samples_per_s":
        base = [key for key in keys if key[0] == baseline]
        if base:
            choice = choose_workers(base[0], summary[base[0]])
            ax.axhline(choice["cell"]["samples_per_s"], color="grey", linestyle=(0, (5, 5)), linewidth=1,
                       label=f"{baseline} at its best (baseline)")
        ax.set_yscale("log")
        ax.set_ylabel("samples/s (log)", fontsize=8)
        ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    else:
        ax.set_ylabel("data-wait share of the loop", fontsize=8)
        ax.set_ylim(0, 1.05)


def plot(out: Path, rows: list[dict[str, Any]], title: str, *, baseline: str | None = None,
         step: bool = False) -> Path | None:
    """Write ``out/throughput.png``; None (nothing written) without matplotlib or when no
    configuration was measured."""
    try:
        fig = figure(rows, title=title, baseline=baseline, step=step)
    except ImportError:
        return None
    if fig is None:
        return None
    target = out / "throughput.png"
    fig.savefig(target, dpi=100, bbox_inches="tight")
    return target
