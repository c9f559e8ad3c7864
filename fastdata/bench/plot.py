"""``throughput.png``: what a benchmark run says, at a glance, drawn from its rows.

:func:`figure` builds the matplotlib Figure (tests inspect it: axes, line labels, annotation
texts); :func:`plot` saves it. Panels, top to bottom:

1. each format/store/path at its best num_workers: a bar (log scale, with the spread of its
   epochs), annotated with that num_workers and its speed-up over the baseline (the source read
   as it is: the image folder or torchvision dataset); the recommended row is marked. A thread
   or process row's bar is its best *with* workers: at num_workers=0 every backend runs the one
   serial loop of the DataLoader row, measured once, so it is drawn once. A row whose every
   configuration failed is listed, with "failed" where its bar would be;
2. samples/s against num_workers, one small panel per dataset (format and store; each on its own
   log scale: the bars compare the datasets), one line per way of reading it. A way of reading keeps its colour and marker in
   every panel (one legend), so no two lines of a panel look alike however many datasets
   there are; the best point of each line is starred, the baseline's best is a dashed line;
3. only when a training step is simulated: the share of loop time spent waiting for data, in
   the same small panels (with no step the loop does nothing else, so it is 1.0 everywhere).

Configurations that failed are left out of the panels and listed under them, with the reason.
"""

from __future__ import annotations

import math
import textwrap
import zlib
from pathlib import Path
from typing import Any

from fastdata.bench.report import label, sort_key
from fastdata.bench.summary import choose_workers, failures, recommend, summarize
from fastdata.bench.explain import times
from fastdata.loading.backends import DEFAULT_BACKEND

# How a dataset is read -> its colour and marker, the same in every panel (colour-blind-safe
# Okabe-Ito colours; the marker tells the lines apart in greyscale too).
WAYS = {
    ("standard", "torch"): ("#0072B2", "o", "standard: DataLoader(ds, batch_size), per-sample reads"),
    ("fast", "torch"): ("#E69F00", "s", "fast: fastdata.loader, DataLoader workers"),
    ("fast", "thread"): ("#009E73", "^", "fast, thread backend"),
    ("fast", "process"): ("#D55E00", "D", "fast, process backend"),
    ("stream", "torch"): ("#CC79A7", "v", "stream: DataLoader over the tar shards"),
}
OTHER_WAYS = (("#56B4E9", "P"), ("#F0E442", "X"), ("#000000", "*"))
PANEL_COLUMNS = 3
FAILED_COLOUR = "#B00020"


def way_style(key: tuple[str, ...]) -> tuple[str, str, str]:
    """(colour, marker, legend text) of the way ``key`` reads its dataset (read path, backend)."""
    way = (key[2], key[3])
    if way in WAYS:
        return WAYS[way]
    colour, marker = OTHER_WAYS[zlib.crc32(repr(way).encode()) % len(OTHER_WAYS)]  # the same in every run
    return colour, marker, f"{key[2]} [{key[3]}]"


def plotted_cells(key: tuple[str, ...], by_workers: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The measured cells drawn for a row: a thread or process row without num_workers=0 (the
    DataLoader row's serial loop, which it only shares)."""
    return {w: cell for w, cell in by_workers.items() if cell["status"] == "ok" and (w > 0 or key[3] == DEFAULT_BACKEND)}


def figure(rows: list[dict[str, Any]], *, title: str = "", baseline: str | None = None,
           step: bool = False) -> Any:
    """The figure of ``throughput.png`` (a :class:`matplotlib.figure.Figure`), or None when no
    configuration was measured. ``step``: a training step was simulated (adds the wait panels).
    Raises ImportError without matplotlib."""
    from matplotlib.figure import Figure

    summary = summarize(rows)
    keys = [key for key, _ in sorted(summary.items(), key=lambda item: sort_key(item[0], baseline))]
    drawn = [key for key in keys if plotted_cells(key, summary[key])]
    if not drawn:
        return None
    datasets = list(dict.fromkeys(key[:2] for key in drawn))
    columns = min(PANEL_COLUMNS, len(datasets))
    grid_rows = math.ceil(len(datasets) / columns)
    failed = failures(summary)
    note = _failed_note(failed)
    bar_height = 0.9 + 0.3 * len(keys)
    handles = _legend_handles(drawn, baseline)
    legend_height = 0.22 * math.ceil(len(handles) / 2) + 0.1
    heights = [bar_height, legend_height] + [2.4] * grid_rows * (2 if step else 1)
    fig = Figure(figsize=(10, sum(heights) + 0.6 + 0.13 * note.count("\n")), layout="constrained")
    spec = fig.add_gridspec(len(heights), columns, height_ratios=heights)
    bars = fig.add_subplot(spec[0, :])
    _best_bars(bars, summary, keys, baseline)
    bars.set_title(title, fontsize=9)
    legend = fig.add_subplot(spec[1, :])
    legend.axis("off")
    legend.legend(handles=handles, fontsize=7, loc="center", ncols=2, frameon=False,
                  title="samples/s against num_workers, one panel per dataset:", title_fontsize=8)
    _panels(fig, spec, 2, columns, summary, drawn, datasets, baseline, "samples_per_s")
    if step:
        _panels(fig, spec, 2 + grid_rows, columns, summary, drawn, datasets, baseline, "wait_fraction")
    if note:
        fig.supxlabel(note, fontsize=7, color=FAILED_COLOUR, ha="left", x=0.01, family="monospace")
    return fig


def _failed_note(failed: list[dict[str, Any]]) -> str:
    """The text under the panels: every failed configuration and why (empty when none failed)."""
    if not failed:
        return ""
    count = sum(len(group["cells"]) for group in failed)
    lines = [f"{count} configuration{'s' if count != 1 else ''} failed (not drawn):"]
    for group in failed:
        lines += textwrap.wrap(f"{group['where']}: {group['reason']}", 150, initial_indent="  ",
                               subsequent_indent="      ")
    return "\n".join(lines)


def _best_bars(ax: Any, summary: dict, keys: list, baseline: str | None) -> None:
    drawn = {key: plotted_cells(key, summary[key]) for key in keys}
    recommendation = recommend({key: summary[key] for key in keys}, baseline)
    base = recommendation["baseline"]["samples_per_s"] if recommendation and recommendation["baseline"] else None
    picked = (recommendation["format"], recommendation["store"], recommendation["read_path"],
              recommendation["backend"], recommendation["num_workers"]) if recommendation else None
    lows, highs = [], []
    for position, key in enumerate(keys):
        choice = choose_workers(key, drawn[key])
        if choice is None:
            reason = next(iter(summary[key].values()))["status"].removeprefix("failed: ")
            ax.annotate(f"failed: {textwrap.shorten(reason, 90)}", (0, position), xycoords=("axes fraction", "data"),
                        xytext=(4, 0), textcoords="offset points", va="center", fontsize=7, color=FAILED_COLOUR)
            continue
        cell, workers = choice["cell"], choice["num_workers"]
        rate = cell["samples_per_s"]
        lows.append(cell["min_samples_per_s"])
        highs.append(cell["max_samples_per_s"])
        error = [[rate - cell["min_samples_per_s"]], [cell["max_samples_per_s"] - rate]]
        ax.barh(position, rate, xerr=error, color=way_style(key)[0], alpha=0.85,
                hatch="//" if key[0] == baseline else None, capsize=2)
        text = f"{rate:,.0f}/s at nw={workers}"
        if key[0] == baseline:
            text += " (baseline)"
        elif base:
            text += f", {times(rate / base)} {baseline}"
        serial = summary[key].get(0)
        if key[3] != DEFAULT_BACKEND and serial is not None and serial["status"] == "ok" and serial["samples_per_s"] > rate:
            text += f"; below nw=0's serial loop ({serial['samples_per_s']:,.0f}/s)"
        if picked == (*key, workers):
            text += "  <- recommended"
        ax.annotate(text, (cell["max_samples_per_s"], position), xytext=(6, 0), textcoords="offset points",
                    va="center", fontsize=7)
    ax.set_yticks(range(len(keys)), [label(key) for key in keys], fontsize=7)
    for tick, key in zip(ax.get_yticklabels(), keys):
        if not drawn[key]:
            tick.set_color(FAILED_COLOUR)
    ax.set_ylim(len(keys) - 0.5, -0.5)
    ax.set_xscale("log")
    ax.set_xlabel("samples/s at the row's best num_workers (log; bars: min..max of the epochs; thread and process "
                  "rows: their best with workers)", fontsize=8)
    ax.set_xlim(max(min(lows), 1e-3) / 3, max(highs) * 12)  # bars start inside the axes; room for the annotations


def _panels(fig: Any, spec: Any, first_row: int, columns: int, summary: dict, keys: list, datasets: list,
            baseline: str | None, metric: str) -> Any:
    """One small panel per dataset, from grid row ``first_row``; returns the first panel."""
    workers = sorted({w for key in keys for w in plotted_cells(key, summary[key])})
    axes: list[Any] = []
    for position, dataset in enumerate(datasets):
        row, column = divmod(position, columns)
        ax = fig.add_subplot(spec[first_row + row, column])
        axes.append(ax)
        _curves(ax, summary, [key for key in keys if key[:2] == dataset], baseline, metric)
        name = " ".join(part for part in dataset if part and part != "-")
        ax.set_title(name if metric == "samples_per_s" else f"{name}: data wait", fontsize=8)
        ax.set_xticks(workers)
        ax.tick_params(labelsize=7)
        if column == 0:
            ax.set_ylabel("samples/s (log)" if metric == "samples_per_s" else "data-wait share of the loop",
                          fontsize=8)
        if position >= len(datasets) - columns:
            ax.set_xlabel("num_workers (* = the line's best)", fontsize=8)
    base = [key for key in keys if key[0] == baseline]
    for ax in axes:  # each panel its own scale: the bars above compare the datasets, a panel its ways of reading
        if metric != "samples_per_s":
            ax.set_ylim(0, 1.05)
            continue
        ax.set_yscale("log")
        _at_least_a_decade(ax)
        if base:
            choice = choose_workers(base[0], plotted_cells(base[0], summary[base[0]]))
            ax.axhline(choice["cell"]["samples_per_s"], color="grey", linestyle=(0, (5, 5)), linewidth=1)
    return axes[0]


MIN_SPAN = 10.0  # a panel's y axis covers at least this ratio: a flat line stays flat, noise is not magnified


def _at_least_a_decade(ax: Any) -> None:
    from matplotlib.ticker import NullFormatter

    low, high = ax.get_ylim()
    if high / low < MIN_SPAN:
        centre = math.sqrt(low * high)
        low, high = centre / math.sqrt(MIN_SPAN), centre * math.sqrt(MIN_SPAN)
    ax.set_ylim(low, high)
    ax.yaxis.set_minor_formatter(NullFormatter())


def _curves(ax: Any, summary: dict, keys: list, baseline: str | None, metric: str) -> None:
    for key in keys:
        cells = plotted_cells(key, summary[key])
        points = sorted(cells.items())
        colour, marker, _ = way_style(key)
        ax.plot([w for w, _ in points], [cell[metric] for _, cell in points], label=label(key), color=colour,
                marker=marker, markersize=5, linewidth=1.2)
        choice = choose_workers(key, cells)
        ax.plot([choice["num_workers"]], [choice["cell"][metric]], marker="*", markersize=13, linestyle="none",
                color=colour, markeredgecolor="black", label="_best")


def _legend_handles(keys: list, baseline: str | None) -> list[Any]:
    from matplotlib.lines import Line2D

    order = list(WAYS)
    ways = sorted(dict.fromkeys((key[2], key[3]) for key in keys),
                  key=lambda way: (order.index(way) if way in order else len(order), way))
    handles = []
    for way in ways:
        colour, marker, text = way_style(("", "", *way))
        handles.append(Line2D([], [], color=colour, marker=marker, markersize=5, label=text))
    if any(key[3] != DEFAULT_BACKEND for key in keys):
        handles.append(Line2D([], [], linestyle="none", label="nw=0 of the fast path: one serial loop, any backend"))
    if baseline and any(key[0] == baseline for key in keys):
        handles.append(Line2D([], [], color="grey", linestyle=(0, (5, 5)), label=f"{baseline} at its best (baseline)"))
    return handles


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
