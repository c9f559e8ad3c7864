"""Rendering benchmark rows: summary per configuration, table, verdicts, JSON/CSV, plot.

Everything here is derived from the rows (never the reverse).
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import Any

from fastdata.bench.runner import ROW_FIELDS
from fastdata.explain import why_best_workers


def summarize(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[int, dict[str, Any]]]:
    """(format, store, path, backend) -> num_workers -> median of the measured epochs (or the
    failure). The thread and process backends share the torch row's num_workers=0 cell (at
    num_workers=0 every backend computes in the main thread)."""
    grouped: dict[tuple[str, str, str, str], dict[int, list[dict[str, Any]]]] = {}
    for row in rows:
        if row["format"] == "probe":
            continue
        key = (row["format"], row["store"], row["path"], row.get("backend") or "torch")
        grouped.setdefault(key, {}).setdefault(row["num_workers"], []).append(row)
    summary: dict[tuple[str, str, str], dict[int, dict[str, Any]]] = {}
    for key, by_workers in grouped.items():
        for workers, group in by_workers.items():
            measured = [r for r in group if r["status"] == "ok" and not r["warmup"]]
            if not measured:
                summary.setdefault(key, {})[workers] = {"status": group[0]["status"]}
                continue
            summary.setdefault(key, {})[workers] = {
                "status": "ok",
                **{name: statistics.median(r[name] for r in measured)
                   for name in ("samples_per_s", "first_batch_s", "wait_fraction", "cpu_s", "uss_mb")},
                "samples": statistics.median(r.get("samples") or 0 for r in measured),
                "batches": statistics.median(r.get("batches") or 0 for r in measured),
            }
    for key, by_workers in summary.items():
        serial = summary.get((*key[:3], "torch"), {}).get(0)
        if key[3] != "torch" and 0 not in by_workers and serial is not None:
            by_workers[0] = serial
    return summary


def label(key: tuple[str, ...]) -> str:
    """``npy raw fast``, or ``npy raw fast [thread]`` for another backend than torch's DataLoader."""
    parts = [part for part in key[:3] if part and part != "-"]
    backend = key[3] if len(key) > 3 else "torch"
    return " ".join(parts) + (f" [{backend}]" if backend != "torch" else "")


BACKEND_REASONS = {
    "thread": "threads hand each batch over by reference (nothing crosses a process boundary) and the read "
              "releases the GIL",
    "process": "workers write each batch once into reusable shared memory, read back with one copy (no pickling, "
               "no new segment per batch)",
    "torch": "the DataLoader",
}


def best_workers(by_workers: dict[int, dict[str, Any]]) -> int | None:
    ok = {w: s["samples_per_s"] for w, s in by_workers.items() if s["status"] == "ok"}
    return max(ok, key=ok.__getitem__) if ok else None


def transfer_ms(rows: list[dict[str, Any]]) -> float | None:
    """Per-batch cost of moving a batch from a worker: probe(num_workers>0) - probe(0)."""
    summary = summarize([dict(r, format="p") for r in rows if r["format"] == "probe"])
    probe = summary.get(("p", "-", "transfer", "torch"))
    if not probe or 0 not in probe or len(probe) < 2:
        return None
    batch = next(r["batch_size"] for r in rows if r["format"] == "probe")
    with_workers = min(w for w in probe if w > 0)
    if probe[0]["status"] != "ok" or probe[with_workers]["status"] != "ok":
        return None
    per_batch = lambda w: batch / probe[w]["samples_per_s"] * 1000  # noqa: E731
    return max(0.0, per_batch(with_workers) - per_batch(0))


def verdicts(rows: list[dict[str, Any]], baseline: str | None) -> list[str]:
    summary = summarize(rows)
    transfer = transfer_ms(rows)
    batch = rows[0]["batch_size"] if rows else 0
    reference = None
    for key, by_workers in summary.items():
        if key[0] == baseline and best_workers(by_workers) is not None:
            reference = by_workers[best_workers(by_workers)]["samples_per_s"]
    lines = []
    for key, by_workers in sorted(summary.items(), key=lambda item: _order(item[0], baseline)):
        fmt = key[0]
        best = best_workers(by_workers)
        if best is None:
            lines.append(f"{label(key)}: every configuration failed ({next(iter(by_workers.values()))['status']})")
            continue
        rate = by_workers[best]["samples_per_s"]
        ratio = f", {rate / reference:,.1f}x {baseline}" if reference and fmt != baseline else ""
        why = _why(by_workers, best, batch, transfer)
        lines.append(f"{label(key)}: best num_workers={best} ({rate:,.0f} samples/s{ratio}); {why}")
    return lines + _backend_verdicts(summary)


def _backend_verdicts(summary: dict[tuple, dict[int, dict[str, Any]]]) -> list[str]:
    """Where several backends read the same data: which wins, and why."""
    groups: dict[tuple, dict[str, tuple[int, float]]] = {}
    for key, by_workers in summary.items():
        best = best_workers(by_workers)
        if best is not None:
            groups.setdefault(key[:3], {})[key[3]] = (best, by_workers[best]["samples_per_s"])
    lines = []
    for group, results in sorted(groups.items()):
        if len(results) < 2:
            continue
        winner = max(results, key=lambda backend: results[backend][1])
        workers, rate = results[winner]
        others = ", ".join(f"{b} {r:,.0f}/s (nw={w})" for b, (w, r) in sorted(results.items()) if b != winner)
        if workers == 0:
            reason = "num_workers=0 wins: no backend's workers repay their hand-over cost here"
        elif winner == "thread" and group[0] == "hdf5" and group[1] == "raw":
            reason = "threads: " + BACKEND_REASONS["thread"] + " (memory-mapped HDF5; h5py reads would serialise on its global lock)"
        else:
            reason = f"{winner}: " + BACKEND_REASONS[winner]
        lines.append(f"{label((*group, 'torch'))}: backend {winner} wins ({rate:,.0f}/s at num_workers={workers}; "
                     f"{others}): {reason}")
    return lines


def _why(by_workers: dict[int, dict[str, Any]], best: int, batch: int, transfer: float | None) -> str:
    """Why ``best`` wins (:func:`fastdata.explain.why_best_workers`, from this row's cells)."""
    serial = by_workers.get(0, {})
    read_ms = startup = epoch_s = None
    if serial.get("status") == "ok":  # per batch actually read (an epoch may be shorter than one batch)
        samples_per_batch = serial["samples"] / serial["batches"] if serial.get("batches") else batch
        read_ms = samples_per_batch / serial["samples_per_s"] * 1000
        epoch_s = serial["samples"] / serial["samples_per_s"]
    parallel = sorted(w for w, s in by_workers.items() if w > 0 and s.get("status") == "ok")
    if parallel and read_ms:
        startup = by_workers[parallel[0]]["first_batch_s"] - serial["first_batch_s"]
    return why_best_workers(best=best, read_ms=read_ms, transfer_ms=transfer, largest=max(by_workers),
                            first_parallel=parallel[0] if parallel else None, startup_s=startup, epoch_s=epoch_s)


def _order(key: tuple[str, ...], baseline: str | None) -> tuple:
    backend = key[3] if len(key) > 3 else "torch"
    return (key[0] != baseline, key[0], key[1], key[2] != "fast", key[2], backend != "torch", backend)


def table(rows: list[dict[str, Any]], baseline: str | None) -> str:
    summary = summarize(rows)
    workers = sorted({w for by_workers in summary.values() for w in by_workers})
    head = ["format/store/path"] + [f"nw={w}" for w in workers]
    body = []
    for key, by_workers in sorted(summary.items(), key=lambda item: _order(item[0], baseline)):
        best = best_workers(by_workers)
        cells = []
        for w in workers:
            cell = by_workers.get(w)
            if cell is None:
                cells.append("")
            elif cell["status"] != "ok":
                cells.append("failed")
            else:
                cells.append(f"{cell['samples_per_s']:,.0f}" + ("*" if w == best else ""))
        body.append([label(key)] + cells)
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    render = lambda r: "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r))  # noqa: E731
    return "\n".join([render(head), render(["-" * w for w in widths]), *map(render, body)]) + \
        "\nsamples/s, median of the measured epochs; * = best num_workers of the row"


def write_results(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({**meta, "rows": rows}, indent=2, default=str))
    extra = sorted({key for row in rows for key in row} - set(ROW_FIELDS))
    with open(out / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*ROW_FIELDS, *extra])
        writer.writeheader()
        writer.writerows(rows)


def plot(out: Path, rows: list[dict[str, Any]], title: str) -> Path | None:
    """``throughput.png``: samples/s and data-wait fraction vs num_workers, one line per row."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    summary = summarize(rows)
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 8), sharex=True)
    colours = plt.get_cmap("tab10")
    formats = sorted({key[0] for key in summary})
    for key, by_workers in sorted(summary.items()):
        points = sorted((w, s) for w, s in by_workers.items() if s["status"] == "ok")
        if not points:
            continue
        style = {"color": colours(formats.index(key[0]) % 10), "label": label(key),
                 "linestyle": {"thread": ":", "process": "-."}.get(key[3], "--" if key[1] == "encoded" else "-"),
                 "marker": {"thread": "^", "process": "D"}.get(key[3], "s" if key[2] == "standard" else "o")}
        xs = [w for w, _ in points]
        top.plot(xs, [s["samples_per_s"] for _, s in points], **style)
        bottom.plot(xs, [s["wait_fraction"] for _, s in points], **style)
    bottom.set_xticks(sorted({w for by_workers in summary.values() for w in by_workers}))
    top.set_yscale("log")
    top.set_ylabel("samples/s (log)")
    top.set_title(title, fontsize=9)
    top.legend(fontsize=7)
    bottom.set_ylabel("data-wait fraction of loop time")
    bottom.set_xlabel("DataLoader num_workers")
    bottom.set_ylim(0, 1.05)
    figure.tight_layout()
    target = out / "throughput.png"
    figure.savefig(target, dpi=100)
    plt.close(figure)
    return target


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
