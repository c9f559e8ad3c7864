"""The bench's ``auto`` row: ``fastdata.loader(..., num_workers="auto")`` measured beside the grid.

After the grid, the fast read path of the fastest (format, store) runs once more with
``num_workers="auto"`` (its own fresh process, the same epochs). :func:`auto_summary` compares its
median samples/s with the best fixed setting of that dataset and says what it chose and how long
it took to settle. Pure functions of rows, apart from :func:`auto_case`'s choice of dataset.
"""

from __future__ import annotations

import statistics
from typing import Any

from fastdata.bench.summary import label, read_path

AUTO = "auto"  # the Case.backend (and row backend) of the auto row


def _measured(rows: list[dict[str, Any]]) -> dict[tuple, list[float]]:
    """(format, store, backend, num_workers) -> samples/s of the measured fast-path epochs."""
    cells: dict[tuple, list[float]] = {}
    for row in rows:
        if row.get("status") != "ok" or row.get("warmup") or read_path(row) != "fast" or row["format"] == "probe":
            continue
        key = (row["format"], row["store"], row.get("backend") or "torch", row["num_workers"])
        cells.setdefault(key, []).append(row["samples_per_s"])
    return cells


def best_fixed(rows: list[dict[str, Any]], dataset: tuple[str, str] | None = None) -> tuple[tuple, float] | None:
    """The fast-path cell with the highest median samples/s (of ``dataset``'s when given)."""
    cells = {key: statistics.median(rates) for key, rates in _measured(rows).items()
             if dataset is None or key[:2] == dataset}
    if not cells:
        return None
    key = max(cells, key=cells.get)
    return key, cells[key]


def auto_summary(auto_rows: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How the auto row compares with the best fixed setting of its dataset, what it chose and
    when it settled (``text``: one line for the report); None without a measured auto row."""
    measured = [r for r in auto_rows if r.get("status") == "ok" and not r.get("warmup")]
    if not measured:
        failed = next((r for r in auto_rows if r.get("status", "ok") != "ok"), None)
        return {"text": f"num_workers='auto' {failed['status']}"} if failed else None
    dataset = (measured[0]["format"], measured[0]["store"])
    rate = statistics.median(r["samples_per_s"] for r in measured)
    best = best_fixed(rows, dataset)
    last = measured[-1]
    chose = last.get("auto_chose") or {}
    chosen = f"{chose.get('backend')} x{chose.get('num_workers')}" if chose.get("num_workers") else "num_workers=0"
    settled = last.get("settled_after_s")
    summary = {"format": dataset[0], "store": dataset[1], "samples_per_s": round(rate, 1), "chose": chose,
               "settled_after_s": settled, "settled_after_batches": last.get("settled_after_batches"),
               "decisions": last.get("decisions")}
    when = f"settled after {settled:.1f} s" if settled is not None else "not settled within the run"
    if best is None:
        summary["text"] = f"{label(dataset)} num_workers='auto': {rate:.0f} samples/s, chose {chosen}, {when}"
        return summary
    (fmt, store, backend, workers), best_rate = best
    summary.update(best_fixed={"backend": backend, "num_workers": workers, "samples_per_s": round(best_rate, 1)},
                   vs_best=round(rate / best_rate, 3) if best_rate else None)
    summary["text"] = (f"{label(dataset)} num_workers='auto': {rate:.0f} samples/s, {rate / best_rate:.2f}x the best "
                       f"fixed setting ({backend} x{workers}, {best_rate:.0f} samples/s); chose {chosen}, {when} "
                       f"({summary['decisions']} decisions)")
    return summary


def auto_dataset(rows: list[dict[str, Any]]) -> tuple[str, str] | None:
    """The (format, store) the auto row reads: the fastest fast-path dataset of the grid."""
    best = best_fixed(rows)
    return None if best is None else best[0][:2]


def tuning_fields(loader: Any) -> dict[str, Any]:
    """What a measured auto loader adds to its rows: its choice, when it first settled, its decisions."""
    log = getattr(loader, "tuning_log", None)
    if log is None:
        return {}
    settled = next((entry for entry in log if "settled" in entry["reason"]), None)
    return {"auto_chose": loader.tuned, "decisions": len(log),
            "settled_after_s": settled["elapsed_s"] if settled else None,
            "settled_after_batches": settled["batch"] if settled else None}
