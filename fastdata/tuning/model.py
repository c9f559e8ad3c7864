"""The model ``fastdata.tune`` predicts with, and how it chooses among predictions and probes."""

from __future__ import annotations

import math
from typing import Any

from fastdata.bench.explain import TIE, outrun_by_none_simpler
from fastdata.loading.backends import BACKENDS, DEFAULT_BACKEND, preference
from fastdata.tuning.measure import Measurements

WAIT_TARGET = 0.05  # "the loop waits for data less than 5% of the time"


def predict(m: Measurements, backend: str, workers: int) -> tuple[float, float]:
    """Predicted (samples/s, data-wait fraction) of ``backend`` with ``workers`` workers.

    Per batch: the loop runs ``overhead + transfer + step``; workers produce ``min(workers, cores) /
    (fetch + transfer)`` batches per ms (threads: only the share of the fetch that releases
    the GIL runs in parallel); all of it shares the usable cores."""
    f, s, cores = max(m.fetch_ms, 1e-6), m.step_ms, m.usable_cores
    if workers == 0:
        per_batch = max(m.loop_ms, f) + s
        return m.batch_size / per_batch * 1000, max(m.loop_ms, f) / per_batch
    c = m.transfer_ms[backend] + m.overhead_ms  # the loop's side of every batch
    if BACKENDS[backend].shares_gil:
        speedup = m.thread_speedup if m.thread_speedup is not None else 1.0
        serial = min(1.0, max(0.0, 2 / max(speedup, 1e-6) - 1))  # Amdahl: the GIL-held share of a fetch
        parallel = 1 / (serial + (1 - serial) / min(workers, cores))
        producer = parallel / (f + c)
        cpu = cores / (f + c + m.step_cpu_ms)
    else:
        producer = min(workers, max(1, cores)) / (f + c)
        cpu = cores / (f + 2 * c + m.step_cpu_ms)
    consumer = 1 / (c + s) if c + s > 0 else math.inf
    rate = min(producer, consumer, cpu)  # batches per ms
    loop = 1 / rate
    return m.batch_size * rate * 1000, max(0.0, loop - s) / loop


def candidate_rows(m: Measurements, backends: tuple[str, ...], max_workers: int) -> list[dict[str, Any]]:
    """One candidate per (backend, num_workers >= 1), and one for num_workers=0: every backend
    runs the same serial loop there, so it is one candidate, probed once (``same_for_backends``
    names them; ``backend`` is the default's, which ``loader_kwargs`` leave out)."""
    serial = [b for b in BACKENDS if b == DEFAULT_BACKEND or b in backends]
    rows = [{"backend": DEFAULT_BACKEND, "num_workers": 0, "same_for_backends": serial}]
    for backend in backends:
        if backend not in m.transfer_ms:
            continue
        rows += [{"backend": backend, "num_workers": n} for n in range(1, max_workers + 1)]
    for row in rows:
        rate, wait = predict(m, row["backend"], row["num_workers"])
        row.update(predicted_samples_per_s=round(rate, 1), predicted_wait_fraction=round(wait, 4))
    return rows


def _simplest_first(row: dict[str, Any]) -> tuple:
    return (row["num_workers"], preference(row["backend"]))


def rows_to_confirm(rows: list[dict[str, Any]], m: Measurements, limit: int) -> list[dict[str, Any]]:
    """The best predictions (and num_workers=0, the reference), or with a dominating step the
    fewest workers predicted to keep the data wait under 5% and the next one up."""
    chosen: list[dict[str, Any]] = [rows[0]]
    if m.step_ms > 0:
        enough = sorted((r for r in rows if r["predicted_wait_fraction"] < WAIT_TARGET), key=_simplest_first)
        for row in enough[:1]:
            chosen.append(row)
            chosen += [r for r in rows if r["backend"] == row["backend"] and r["num_workers"] == row["num_workers"] + 1]
    best = sorted(rows, key=lambda r: (-r["predicted_samples_per_s"], _simplest_first(r)))
    seen_backends = set()
    for row in best:
        if len(chosen) >= limit:
            break
        if row in chosen:
            continue
        if row["backend"] in seen_backends and row["predicted_samples_per_s"] < 0.9 * best[0]["predicted_samples_per_s"]:
            continue
        if any(other["backend"] == row["backend"] and other["num_workers"] < row["num_workers"] and
               other["predicted_samples_per_s"] >= 0.99 * row["predicted_samples_per_s"] for other in chosen):
            continue  # more workers than cores: the same prediction, more memory
        seen_backends.add(row["backend"])
        chosen.append(row)
    unique = []
    for row in chosen:
        if row not in unique:
            unique.append(row)
    return unique[:limit]


def pick_best(rows: list[dict[str, Any]], m: Measurements) -> dict[str, Any]:
    """The recommendation among measured rows (predictions where a row was not measured): with a
    training step, the simplest that keeps the data wait under 5%; else the simplest within
    :data:`TIE` of the fastest; in both, never one that a simpler row outran."""
    def rate(row: dict[str, Any]) -> float:
        measured = row.get("measured_samples_per_s")
        return measured if measured is not None else row["predicted_samples_per_s"]

    def wait(row: dict[str, Any]) -> float:
        measured = row.get("wait_fraction")
        return measured if measured is not None else row["predicted_wait_fraction"]

    ranked = outrun_by_none_simpler(rows, rate, _simplest_first)  # never one slower than a simpler one
    if m.step_ms > 0:
        calm = [r for r in ranked if wait(r) < WAIT_TARGET]
        if calm:
            return calm[0]
    top = max(rate(r) for r in rows)
    return next(r for r in ranked if rate(r) >= (1 - TIE) * top)
