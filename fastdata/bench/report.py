"""Rendering benchmark rows: the table, the short reasons, ``results.json``/``results.csv``.

Everything here is derived from the rows (never the reverse): cells, ties and the
recommendation come from :mod:`fastdata.bench.summary`, the plot from :mod:`fastdata.bench.plot`.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from fastdata.bench.runner import ROW_FIELDS
from fastdata.bench.summary import (
    NOISE_FLOOR, OVERLAP_TIE, best_workers, choose, choose_workers, label, spread, summarize,
)
from fastdata.bench.explain import PATH_WORDS, ms, why_best_workers
from fastdata.loading.backends import BACKENDS, DEFAULT_BACKEND, preference

__all__ = ["best_rate", "best_workers", "label", "rates_table", "summarize", "table", "transfer_ms", "verdicts",
           "write_results"]


def transfer_ms(rows: list[dict[str, Any]]) -> float | None:
    """Per-batch cost of moving a batch from a worker: the probe's data wait per batch at the
    fewest workers minus at num_workers=0 (a training step is outside the wait, so not in here)."""
    summary = summarize([dict(r, format="p") for r in rows if r["format"] == "probe"])
    probe = summary.get(("p", "-", "transfer", DEFAULT_BACKEND))
    if not probe or 0 not in probe or len(probe) < 2:
        return None
    with_workers = min(w for w in probe if w > 0)
    if probe[0]["status"] != "ok" or probe[with_workers]["status"] != "ok":
        return None
    return max(0.0, probe[with_workers]["read_ms"] - probe[0]["read_ms"])


def verdicts(rows: list[dict[str, Any]], baseline: str | None) -> list[str]:
    """Short reasons, one per (format, store, backend): the best num_workers and why (its fast
    and standard read paths share a line when they agree), then which backend wins where several
    read the same data."""
    summary = summarize(rows)
    transfer = transfer_ms(rows)
    batch = rows[0]["batch_size"] if rows else 0
    groups: dict[tuple, list[tuple]] = {}
    for key, by_workers in sorted(summary.items(), key=lambda item: sort_key(item[0], baseline)):
        best = best_workers(by_workers)
        groups.setdefault((key[0], key[1], key[3], best), []).append(key)
    lines = []
    for (_, _, _, best), keys in groups.items():
        by_workers = summary[keys[0]]
        name = label(keys[0]) + "".join(f", {k[2]}" for k in keys[1:])
        if best is None:
            lines.append(f"{name}: every configuration failed ({next(iter(by_workers.values()))['status']})")
            continue
        why = _why(by_workers, best, batch, transfer)
        choice = choose_workers(keys[0], by_workers)
        if choice["fastest"][1] != best:
            why += (f"; num_workers={choice['fastest'][1]} measured {choice['fastest'][2]['samples_per_s']:,.0f}/s, "
                    "within the noise: fewer workers win the tie")
        lines.append(f"{name}: num_workers={best}: {why}")
    step = next((r.get("step_ms") for r in rows if r.get("step_ms")), None)
    if step:
        lines.append(f"The simulated training step ({ms(step)}/batch) is not in these read costs: they are the time "
                     "the loop waits for each batch.")
    return lines + _backend_verdicts(summary)


def _backend_verdicts(summary: dict[tuple, dict[int, dict[str, Any]]]) -> list[str]:
    """Where several backends read the same data: which wins (the simpler one in a tie), and why."""
    groups: dict[tuple, list[tuple]] = {}
    for key, by_workers in summary.items():
        best = best_workers(by_workers)
        if best is not None:
            groups.setdefault(key[:3], []).append((key, best, by_workers[best]))
    lines = []
    for group, results in sorted(groups.items()):
        distinct, folded, seen = [], [], set()
        for key, workers, cell in sorted(results, key=lambda item: preference(item[0][3])):
            if id(cell) in seen:  # num_workers=0: the serial loop every backend runs, measured once
                folded.append(key[3])
                continue
            seen.add(id(cell))
            distinct.append((key, workers, cell))
        if len(distinct) < 2:
            if folded:
                lines.append(f"{label((*group, DEFAULT_BACKEND))}: num_workers=0 on every backend ({', '.join(k[3] for k, _, _ in results)}"
                             f": one serial loop in the calling thread, measured once, {distinct[0][2]['samples_per_s']:,.0f}/s): "
                             "no backend's workers repay their hand-over cost here")
            continue
        choice = choose(distinct)
        winner, workers, rate = choice["key"][3], choice["num_workers"], choice["cell"]["samples_per_s"]
        others = ", ".join(f"{k[3]} {c['samples_per_s']:,.0f}/s (nw={w})" for k, w, c in sorted(distinct)
                           if k[3] != winner)
        others += "".join(f"; {backend} best at nw=0 too (the same serial loop)" for backend in folded)
        if workers == 0:
            reason = "num_workers=0 wins: no backend's workers repay their hand-over cost here"
        elif choice["ties"]:
            reason = f"a tie within the noise with {', '.join(k[3] for k, _, _ in choice['ties'])}: the simpler one wins"
        elif BACKENDS[winner].shares_gil and group[0] == "hdf5" and group[1] == "raw":
            reason = (f"{BACKENDS[winner].workers_name}: {BACKENDS[winner].reason} (memory-mapped HDF5; h5py reads "
                      "would serialise on its global lock)")
        else:
            reason = f"{winner}: " + BACKENDS[winner].reason
        lines.append(f"{label((*group, DEFAULT_BACKEND))}: backend {winner} wins ({rate:,.0f}/s at num_workers={workers}; "
                     f"{others}): {reason}")
    return lines


def _why(by_workers: dict[int, dict[str, Any]], best: int, batch: int, transfer: float | None) -> str:
    """Why ``best`` wins (:func:`fastdata.bench.explain.why_best_workers`, from this row's cells). The
    read cost is the data wait per batch at num_workers=0: a training step is not part of it."""
    serial = by_workers.get(0, {})
    read_ms = startup = epoch_s = None
    if serial.get("status") == "ok":
        read_ms = serial["read_ms"]
        epoch_s = serial["samples"] / serial["samples_per_s"] if serial.get("samples") else None
    parallel = sorted(w for w, s in by_workers.items() if w > 0 and s.get("status") == "ok")
    if parallel and read_ms:
        startup = by_workers[parallel[0]]["first_batch_s"] - serial["first_batch_s"]
    return why_best_workers(best=best, read_ms=read_ms, transfer_ms=transfer, largest=max(by_workers),
                            first_parallel=parallel[0] if parallel else None, startup_s=startup, epoch_s=epoch_s)


def sort_key(key: tuple[str, ...], baseline: str | None) -> tuple:
    backend = key[3] if len(key) > 3 else DEFAULT_BACKEND
    return (key[0] != baseline, key[0], key[1], key[2] != "fast", key[2], backend != DEFAULT_BACKEND, backend)


def table(rows: list[dict[str, Any]], baseline: str | None) -> str:
    """Rows = format/store/read path (and backend), columns = num_workers; each cell the median
    samples/s and the spread of its epochs; ``*`` the row's best, ``=`` a tie with its fastest."""
    summary = summarize(rows)
    workers = sorted({w for by_workers in summary.values() for w in by_workers})
    head = ["format/store/path"] + [f"nw={w}" for w in workers]
    body, shared = [], False
    for key, by_workers in sorted(summary.items(), key=lambda item: sort_key(item[0], baseline)):
        shared = shared or (key[3] != DEFAULT_BACKEND and 0 in by_workers
                            and by_workers[0] is summary.get((*key[:3], DEFAULT_BACKEND), {}).get(0))
        choice = choose_workers(key, by_workers)
        tied = {w for _, w, _ in choice["ties"]} if choice else set()
        cells = []
        for w in workers:
            cell = by_workers.get(w)
            if cell is None:
                cells.append("")
            elif cell["status"] != "ok":
                cells.append("failed")
            else:
                mark = "*" if choice and w == choice["num_workers"] else "=" if w in tied else " "
                noise = f" ±{spread(cell):.0%}" if cell["epochs"] > 1 else ""
                cells.append(f"{cell['samples_per_s']:,.0f}{mark}{noise}")
        body.append([label(key)] + cells)
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    render = lambda r: "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r))  # noqa: E731
    paths = sorted({key[2] for key in summary}, key=list(PATH_WORDS).index) if all(
        key[2] in PATH_WORDS for key in summary) else []
    return "\n".join([
        render(head), render(["-" * w for w in widths]), *map(render, body),
        "samples/s: median of the epochs ± half their range; * = the row's best num_workers (the fewest within the "
        f"noise of its fastest: medians within {NOISE_FLOOR:.0%}, or within {OVERLAP_TIE:.0%} with overlapping ranges); "
        "= within the noise",
        *(f"{path}: {PATH_WORDS[path]}" for path in paths),
        *([f"url:{cache}: read from the dataset's URL through a cache of the bench's own, "
           + ("emptied before each epoch (every shard downloaded while it is read)" if cache == "cold" else
              "filled by the warm-up epoch") + "; the rows without it read the local copy"
           for cache in sorted({key[1].split(" url:", 1)[1] for key in summary if " url:" in key[1]})]),
        *(["nw=0 of a [thread] or [process] row: the torch row's one measurement (at num_workers=0 every backend runs "
           "the same serial loop in the calling thread)"] if shared else []),
    ])


def write_results(out: Path, document: dict[str, Any]) -> None:
    """``results.json`` (the whole ``document``: machine, config, conversions, summary, rows) and
    ``results.csv`` (its rows)."""
    rows = document["rows"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(document, indent=2, default=str))
    extra = sorted({key for row in rows for key in row} - set(ROW_FIELDS))
    with open(out / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*ROW_FIELDS, *extra])
        writer.writeheader()
        writer.writerows(rows)


def rates_table(rows: list[dict[str, Any]], *, key: str = "reader") -> str:
    """A markdown table of samples/s: one line per ``key`` (reader), one column per num_workers,
    and the best; from rows such as :func:`fastdata.bench.timing.compare` returns."""
    workers = sorted({row["num_workers"] for row in rows})
    names = list(dict.fromkeys(row[key] for row in rows))
    lines = [f"| {key} | " + " | ".join(f"nw={w}" for w in workers) + " | best |",
             "|---" * (len(workers) + 2) + "|"]
    for name in names:
        cells = {row["num_workers"]: row["samples_per_s"] for row in rows if row[key] == name}
        shown = [f"{cells[w]:,.0f}" if w in cells else "-" for w in workers]
        lines.append(f"| {name} | " + " | ".join(shown) + f" | {max(cells.values()):,.0f} |")
    return "\n".join(lines)


def best_rate(rows: list[dict[str, Any]], reader: str, *, key: str = "reader") -> float:
    """The best samples/s of one reader over its num_workers."""
    return max(row["samples_per_s"] for row in rows if row[key] == reader)
