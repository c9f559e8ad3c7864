"""From measured rows to answers: the median and spread of each cell, ties inside the noise,
each row's best num_workers, and the one recommendation of a run.

Pure functions of the rows (hand-built rows work as well as measured ones); nothing here
measures, prints or writes.
"""

from __future__ import annotations

import statistics
from typing import Any

from fastdata.bench.explain import (
    TIE, backends_sentence, bench_recommendation, outrun_by_none_simpler, remote_sentence,
)
from fastdata.loading.backends import DEFAULT_BACKEND, preference  # in a tie: the DataLoader users know, then threads

# An epoch of fewer batches than this is mostly worker start-up and the first batch (tens of
# ms each), and the loader's prefetch pipeline (num_workers x prefetch_factor batches in flight)
# never reaches its steady state: its samples/s says little about a real epoch.
MIN_TIMED_BATCHES = 20
# Two cells whose medians differ by less than this share of the larger are a tie even when their
# per-epoch ranges do not overlap: with 2 or 3 epochs the range under-states the noise of a shared
# machine. The same 5% ``fastdata tune`` calls a tie.
NOISE_FLOOR = TIE
# ... and cells whose ranges overlap are a tie only while their medians differ by less than this:
# one wild epoch widens a range over a real difference (a median 30% lower is no tie).
OVERLAP_TIE = 0.15

Key = tuple[str, str, str, str]  # (format, store, read path, backend)


def label(key: tuple[str, ...]) -> str:
    """``npy raw fast``, or ``npy raw fast [thread]`` for another backend than torch's DataLoader;
    ``npy raw`` for a (format, store) pair."""
    parts = [part for part in key[:3] if part and part != "-"]
    backend = key[3] if len(key) > 3 else DEFAULT_BACKEND
    return " ".join(parts) + (f" [{backend}]" if backend != DEFAULT_BACKEND else "")


def read_path(row: dict[str, Any]) -> str:
    """A row's read path (``read_path``; rows written before it was named carry ``path``)."""
    return row.get("read_path") or row.get("path") or ""


def summarize(rows: list[dict[str, Any]]) -> dict[Key, dict[int, dict[str, Any]]]:
    """(format, store, read path, backend) -> num_workers -> the cell: median of the measured
    epochs, their min and max samples/s (the noise), the data wait per batch; or the failure.
    The thread and process backends share the torch row's num_workers=0 cell (at num_workers=0
    every backend computes in the main thread)."""
    grouped: dict[Key, dict[int, list[dict[str, Any]]]] = {}
    for row in rows:
        if row["format"] == "probe":
            continue
        key = (row["format"], row["store"], read_path(row), row.get("backend") or DEFAULT_BACKEND)
        grouped.setdefault(key, {}).setdefault(row["num_workers"], []).append(row)
    summary: dict[Key, dict[int, dict[str, Any]]] = {}
    for key, by_workers in grouped.items():
        for workers, group in by_workers.items():
            summary.setdefault(key, {})[workers] = _cell(group)
    for key, by_workers in summary.items():
        serial = summary.get((*key[:3], DEFAULT_BACKEND), {}).get(0)
        if key[3] != DEFAULT_BACKEND and 0 not in by_workers and serial is not None:
            by_workers[0] = serial
    return summary


def _cell(group: list[dict[str, Any]]) -> dict[str, Any]:
    measured = [r for r in group if r["status"] == "ok" and not r["warmup"]]
    if not measured:
        return {"status": group[0]["status"]}
    rates = [r["samples_per_s"] for r in measured]
    cell = {
        "status": "ok",
        **{name: statistics.median(r[name] for r in measured)
           for name in ("samples_per_s", "first_batch_s", "wait_fraction", "cpu_s", "uss_mb")},
        "min_samples_per_s": min(rates),
        "max_samples_per_s": max(rates),
        "epochs": len(measured),
        "samples": statistics.median(r.get("samples") or 0 for r in measured),
        "batches": statistics.median(r.get("batches") or 0 for r in measured),
    }
    cell["read_ms"] = statistics.median(_read_ms(r) for r in measured)
    return cell


def _read_ms(row: dict[str, Any]) -> float:
    """Time the loop waited for one batch: the loop's time per batch times the share of it spent
    in ``next()``. A simulated (or real) training step is outside ``next()``, so it is not in here."""
    per_batch = row["samples"] / row["batches"] if row.get("samples") and row.get("batches") else row["batch_size"]
    return per_batch / row["samples_per_s"] * 1000 * row["wait_fraction"] if row["samples_per_s"] else 0.0


def spread(cell: dict[str, Any]) -> float:
    """Half the range of the per-epoch rates, as a share of the median (0 with one epoch)."""
    return (cell["max_samples_per_s"] - cell["min_samples_per_s"]) / 2 / cell["samples_per_s"] \
        if cell.get("samples_per_s") else 0.0


def within_noise(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """True when two measured cells are a tie: their medians differ by less than
    :data:`NOISE_FLOOR` (5%) of the larger, or by less than :data:`OVERLAP_TIE` (15%) with
    overlapping per-epoch ranges (min..max samples/s). Otherwise the better median wins, however
    wide the ranges."""
    gap = abs(a["samples_per_s"] - b["samples_per_s"]) / max(a["samples_per_s"], b["samples_per_s"], 1e-12)
    overlap = a["min_samples_per_s"] <= b["max_samples_per_s"] and b["min_samples_per_s"] <= a["max_samples_per_s"]
    return gap < NOISE_FLOOR or (overlap and gap < OVERLAP_TIE)


def _simplicity(key: Key, workers: int, cell: dict[str, Any], baseline: str | None) -> tuple:
    return (workers, preference(key[3]), key[0] != baseline, -cell["samples_per_s"], key)


def choose(cells: list[tuple[Key, int, dict[str, Any]]], baseline: str | None = None) -> dict[str, Any] | None:
    """Among measured ``(key, num_workers, cell)``: the fastest, the ones within its noise, and
    the one chosen — the simplest of those (fewest workers, then the torch backend, then the
    source as it is, then the faster median, then the name: the same rows give the same answer)
    that no simpler cell outran (:func:`fastdata.bench.explain.outrun_by_none_simpler`): a tie never
    goes to a setting slower than a simpler one measured. A cell that stands for several keys
    (num_workers=0, one serial loop on every backend: :func:`summarize`) counts once, under its
    simplest key."""
    ok, seen = [], set()
    measured = [item for item in cells if item[2]["status"] == "ok"]
    for item in sorted(measured, key=lambda item: _simplicity(*item, baseline)):
        if id(item[2]) not in seen:
            seen.add(id(item[2]))
            ok.append(item)
    if not ok:
        return None
    fastest = max(ok, key=lambda item: item[2]["samples_per_s"])
    tied = [item for item in ok if within_noise(item[2], fastest[2])]
    candidates = outrun_by_none_simpler(ok, lambda item: item[2]["samples_per_s"],
                                        lambda item: _simplicity(*item, baseline))
    chosen = next(item for item in candidates if within_noise(item[2], fastest[2]))
    return {"key": chosen[0], "num_workers": chosen[1], "cell": chosen[2], "fastest": fastest,
            "ties": [item for item in tied if item[:2] != chosen[:2]]}


def choose_workers(key: Key, by_workers: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """:func:`choose` among one row's num_workers."""
    return choose([(key, w, cell) for w, cell in by_workers.items()])


def best_workers(by_workers: dict[int, dict[str, Any]]) -> int | None:
    """A row's best num_workers: the fewest workers within the noise of the fastest cell."""
    choice = choose_workers(("", "", "", DEFAULT_BACKEND), by_workers)
    return choice["num_workers"] if choice else None


def batches_warning(summary: dict[Key, dict[int, dict[str, Any]]], batch_size: int) -> str | None:
    """A warning when a measured epoch has fewer than :data:`MIN_TIMED_BATCHES` batches."""
    cells = [cell for by_workers in summary.values() for cell in by_workers.values()
             if cell["status"] == "ok" and cell["batches"]]  # rows from before batches were counted have none
    if not cells:
        return None
    fewest = min(cells, key=lambda cell: cell["batches"])
    if fewest["batches"] >= MIN_TIMED_BATCHES:
        return None
    return (f"warning: an epoch here is {fewest['batches']:.0f} batch{'es' if fewest['batches'] != 1 else ''} "
            f"({fewest['samples']:.0f} samples at batch {batch_size}); below {MIN_TIMED_BATCHES} batches an epoch is "
            "mostly worker start-up and the first batch, so these rates say little about training. Use a larger "
            "dataset or a smaller --batch-size.")


def epochs_warning(summary: dict[Key, dict[int, dict[str, Any]]]) -> str | None:
    epochs = [cell["epochs"] for by_workers in summary.values() for cell in by_workers.values() if cell["status"] == "ok"]
    if epochs and min(epochs) < 2:
        return (f"warning: one measured epoch per configuration shows no noise; differences under "
                f"{NOISE_FLOOR:.0%} are called ties, larger ones may be noise too. Use --epochs 3.")
    return None


def distinct_cells(summary: dict[Key, dict[int, dict[str, Any]]]) -> list[tuple[Key, int, dict[str, Any]]]:
    """Every (key, num_workers, cell) measured or failed, each cell once: num_workers=0, shared by
    every backend of a row (:func:`summarize`), counts under the torch row."""
    cells, seen = [], set()
    for key, by_workers in sorted(summary.items(), key=lambda item: (item[0][:3], preference(item[0][3]),
                                                                      item[0][3])):
        for workers, cell in sorted(by_workers.items()):
            if id(cell) not in seen:
                seen.add(id(cell))
                cells.append((key, workers, cell))
    return cells


def failures(summary: dict[Key, dict[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The configurations that failed, one entry per reason: ``{"reason", "cells": [{format,
    store, read_path, backend, num_workers}], "where"}``, in name order.
    ``where`` names them: ``hdf5 raw (all 8)`` where every configuration of a dataset failed
    alike, else ``npy raw fast nw=1,2; npy raw standard nw=2``."""
    cells = distinct_cells(summary)
    per_dataset: dict[tuple[str, str], int] = {}
    for key, _, _ in cells:
        per_dataset[key[:2]] = per_dataset.get(key[:2], 0) + 1
    groups: dict[str, dict[Key, list[int]]] = {}
    for key, workers, cell in cells:
        if cell["status"] != "ok":
            groups.setdefault(cell["status"].removeprefix("failed: "), {}).setdefault(key, []).append(workers)
    entries = []
    for reason, by_key in groups.items():
        failed = [{**dict(zip(("format", "store", "read_path", "backend"), key)), "num_workers": w}
                  for key, counts in by_key.items() for w in counts]
        names: dict[tuple[str, str], list[str]] = {}
        for key, counts in by_key.items():
            names.setdefault(key[:2], []).append(f"{label(key)} nw={','.join(map(str, counts))}")
        where = []
        for dataset, parts in names.items():
            count = sum(len(counts) for key, counts in by_key.items() if key[:2] == dataset)
            where += [f"{label(dataset)} (all {count})"] if count == per_dataset[dataset] and count > 1 else parts
        entries.append({"reason": reason, "cells": failed, "where": "; ".join(where)})
    return entries


def failed_warning(summary: dict[Key, dict[int, dict[str, Any]]]) -> str | None:
    """The warning that leads the report when any configuration failed: how many, where, why."""
    groups = failures(summary)
    if not groups:
        return None
    total = len(distinct_cells(summary))
    failed = sum(len(group["cells"]) for group in groups)
    lines = [f"warning: {failed} of {total} configurations failed (the table's 'failed' cells; listed under the "
             f"plot); the recommendation is made from the other {total - failed}:" if failed < total else
             f"warning: all {total} configurations failed:"]
    lines += [f"  {group['where']}: {group['reason']}" for group in groups]
    return "\n".join(lines)


def summary_document(rows: list[dict[str, Any]], baseline: str | None) -> dict[str, Any]:
    """``results.json``'s ``summary``: per row its cells (median, min, max, spread), best and
    fastest num_workers; the recommendation; warnings. See docs/benchmarking.md for the schema."""
    summary = summarize(rows)
    batch = next((r["batch_size"] for r in rows if r.get("batch_size")), 0)
    out_rows = []
    for key, by_workers in summary.items():
        choice = choose_workers(key, by_workers)
        out_rows.append({
            "format": key[0], "store": key[1], "read_path": key[2], "backend": key[3],
            "best_num_workers": choice["num_workers"] if choice else None,
            "fastest_num_workers": choice["fastest"][1] if choice else None,
            "tied_num_workers": sorted(w for _, w, _ in choice["ties"]) if choice else [],
            "cells": [{"num_workers": w, **({**cell, "spread": round(spread(cell), 4)} if cell["status"] == "ok" else cell)}
                      for w, cell in sorted(by_workers.items())],
        })
    warnings = [w for w in (failed_warning(summary), batches_warning(summary, batch), epochs_warning(summary)) if w]
    recommendation = recommend(summary, baseline)
    failed = failures(summary)
    return {"rows": out_rows, "recommendation": recommendation, "backends": backend_effect(summary, recommendation),
            "remote": remote_effect(summary), "warnings": warnings,
            "configurations": len(distinct_cells(summary)),
            "failed": [{**cell, "reason": group["reason"]} for group in failed for cell in group["cells"]],
            "noise_floor": NOISE_FLOOR, "overlap_tie": OVERLAP_TIE, "min_timed_batches": MIN_TIMED_BATCHES}


def backend_effect(summary: dict[Key, dict[int, dict[str, Any]]],
                   recommendation: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """What fastdata's thread and process backends change, on one fast-path row where they were
    measured beside the DataLoader: each backend's samples/s at the most workers that every
    backend was measured with, as a share of num_workers=0 (one serial loop, whatever the
    backend). The row is the recommended format/store's when it has them, else the first in name
    order. None where no row has them."""
    groups: dict[tuple[str, str, str], dict[str, dict[int, dict[str, Any]]]] = {}
    for key, by_workers in summary.items():
        if key[2] == "fast":
            groups.setdefault(key[:3], {})[key[3]] = by_workers
    usable = {group: by_backend for group, by_backend in groups.items() if len(by_backend) > 1
              and by_backend.get(DEFAULT_BACKEND, {}).get(0, {}).get("status") == "ok"}
    if not usable:
        return None
    wanted = (recommendation["format"], recommendation["store"], "fast") if recommendation else None
    group = wanted if wanted in usable else sorted(usable)[0]
    by_backend = usable[group]
    common = set.intersection(*({w for w, cell in cells.items() if w > 0 and cell["status"] == "ok"}
                                for cells in by_backend.values()))
    if not common:
        return None
    workers = max(common)
    serial = by_backend[DEFAULT_BACKEND][0]["samples_per_s"]
    rates = {backend: cells[workers]["samples_per_s"] for backend, cells in by_backend.items()}
    ratios = {backend: round(rate / serial, 2) for backend, rate in rates.items()}
    return {"format": group[0], "store": group[1], "read_path": group[2], "num_workers": workers,
            "serial_samples_per_s": serial, "samples_per_s": rates, "ratio_to_serial": ratios,
            "text": backends_sentence(" ".join(p for p in group if p != "-"), workers, ratios)}


URL_MARK = " url:"  # a row read from the dataset's URL: its store is "<store> url:<cold|warm>" (runner.make_row)


def remote_effect(summary: dict[Key, dict[int, dict[str, Any]]]) -> dict[str, Any] | None:
    """How reading from the URL shifts the best num_workers (``fastdata bench URL``): the row read
    from the URL with the best rate, its best num_workers and rate beside its local copy's. None
    where no row was read from a URL (or either side failed)."""
    pairs = []
    for key, by_workers in summary.items():
        if URL_MARK not in key[1]:
            continue
        store, cache = key[1].split(URL_MARK, 1)
        local = summary.get((key[0], store, key[2], key[3]))
        remote_best, local_best = best_workers(by_workers), best_workers(local) if local else None
        if remote_best is None or local_best is None:
            continue
        pairs.append((by_workers[remote_best]["samples_per_s"], key, store, cache, remote_best, local_best, local))
    if not pairs:
        return None
    rate, key, store, cache, remote_best, local_best, local = max(pairs, key=lambda item: item[0])
    local_rate = local[local_best]["samples_per_s"]
    name = " ".join(part for part in (key[0], store, key[2]) if part and part != "-")
    largest = max(w for w, cell in summary[key].items() if cell["status"] == "ok")
    return {"format": key[0], "store": store, "read_path": key[2], "backend": key[3], "cache": cache,
            "best_num_workers": remote_best, "samples_per_s": rate,
            "local_best_num_workers": local_best, "local_samples_per_s": local_rate,
            "ratio_to_local": round(rate / local_rate, 3),
            "text": remote_sentence(name, cache, (remote_best, rate), (local_best, local_rate), largest)}


def recommend(summary: dict[Key, dict[int, dict[str, Any]]], baseline: str | None) -> dict[str, Any] | None:
    """The one answer of a run: which row and num_workers to train with, and for the source as it
    is (``baseline``) its own best num_workers. None when nothing was measured."""
    cells = [(key, w, cell) for key, by_workers in summary.items() for w, cell in by_workers.items()]
    choice = choose(cells, baseline)
    if choice is None:
        return None
    base = choose([item for item in cells if item[0][0] == baseline], baseline) if baseline else None
    entry = lambda key, workers, cell: {  # noqa: E731
        "format": key[0], "store": key[1], "read_path": key[2], "backend": key[3], "num_workers": workers,
        "samples_per_s": cell["samples_per_s"], "spread": round(spread(cell), 4)}
    picked = entry(choice["key"], choice["num_workers"], choice["cell"])
    speedup = picked["samples_per_s"] / base["cell"]["samples_per_s"] if base else None
    ties = [entry(*item) for item in choice["ties"]]
    fastest = entry(*choice["fastest"])
    keep = entry(base["key"], base["num_workers"], base["cell"]) if base else None
    return {**picked, "speedup_over_baseline": round(speedup, 2) if speedup else None,
            "fastest": fastest, "ties": ties, "baseline": keep,
            "text": bench_recommendation(picked, fastest=fastest, ties=ties, baseline=keep, speedup=speedup)}
