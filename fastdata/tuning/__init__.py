"""``fastdata.tune``: recommend loader settings for any map-style Dataset, with the evidence.

Model first, then confirm, within a time budget:

1. Measure (a few seconds): the per-batch fetch at num_workers=0 (``fastdata.loader``'s one
   ``dataset[indices]`` call, and DataLoader's per-sample fetch + collate for comparison); the
   cost of handing one batch of this structure and size from a worker to the loop, per backend
   (a probe dataset that returns ready copies of a real batch, so only the hand-over remains);
   worker start-up per backend; whether 2 threads fetch faster than one (the GIL); the
   consumer's step (``step_ms`` sleeps, ``step`` runs the user's function on real batches); the
   cores this process may use (CPU affinity and the cgroup quota, not ``os.cpu_count()``).
   The machine's own noise is measured too, noisy figures are repeated, and each keeps its
   spread: :meth:`Recommendation.doubts` says which cannot be trusted (:mod:`fastdata.tuning.noise`).
2. Predict samples/s and data wait for every backend x num_workers (0 .. 2 x cores).
3. Confirm the best few predictions with short probes of the real dataset (persistent
   workers, start-up excluded), measuring samples/s, data wait and memory (PSS) per worker,
   and recommend the best measured one. With a training step that dominates, recommend the
   fewest workers that keep the loop's data wait under 5%.
4. Decide ``persistent_workers`` (worker start-up against the epoch), ``prefetch_factor`` and
   ``pin_memory`` (only where CUDA is present); for a folder or torchvision source, predict from
   a probe conversion of a sample whether converting would win and by how much.

Where worker processes start with spawn (Windows, macOS, or ``start_method="spawn"``) and the
dataset cannot be pickled, process backends are left out and the explanation names the fix.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from fastdata.bench.probes import ReadyBatches, ReadyBatchesOf
from fastdata.bench.sweep import step_options
from fastdata.errors import FastdataError, InvalidOptionError
from fastdata.bench.explain import tune_paragraph
from fastdata.loading.backends import BACKENDS, DEFAULT_BACKEND, get_backend
from fastdata.loading.fetch import BatchFetcher
from fastdata.tuning.measure import (
    PROBE_BATCHES, Measurements, ProbeResult, probe_batches, probe_loader, resolve_start_method, measure, probe,
)
from fastdata.tuning.noise import Spread, choice_doubt, doubts
from fastdata.tuning.model import TIE, WAIT_TARGET, candidate_rows, pick_best, rows_to_confirm, predict

MIN_BUDGET_S = 2.0  # tune never spends less (worker start-up alone takes tens of ms per probe)
EPOCHS_WORTH = 4  # ... nor more than about this many num_workers=0 epochs (see _effective_budget)
CONVERSION_PROBE_S = 2.0  # added for a probe conversion of a folder or torchvision source
CONVERSION_PROBE_SAMPLES = 512  # converted by the probe (fewer when the dataset is smaller) ...
CONVERSION_PROBE_FETCHES = 16  # ... then this many batches fetched from it, timed: work, not a time share
NO_CONVERT_SOURCE = ("no convert_source was given: a conversion is predicted for an image folder or a torchvision "
                     "source")

__all__ = ["Measurements", "PROBE_BATCHES", "ProbeResult", "ReadyBatches", "ReadyBatchesOf", "Recommendation",
           "Spread", "TIE", "WAIT_TARGET", "measure", "predict", "predict_conversion", "probe", "tune"]


@dataclass
class Recommendation:
    """The recommended loader settings, what they are predicted and measured to reach, and why.

    ``loader_kwargs`` go to ``fastdata.loader(dataset, **kwargs)``; when ``backend`` is
    ``"torch"`` they are DataLoader keywords too. ``dataloader_kwargs`` are the best settings for
    a plain ``DataLoader`` (``batch_size=None`` plus a sampler is what ``fastdata.loader`` adds)."""

    backend: str
    num_workers: int
    batch_size: int
    persistent_workers: bool
    prefetch_factor: int | None
    pin_memory: bool
    predicted_samples_per_s: float
    measured_samples_per_s: float | None
    predicted_wait_fraction: float
    wait_fraction: float | None
    pss_mb_per_worker: float | None
    measurements: Measurements
    candidates: list[dict[str, Any]] = field(default_factory=list)
    conversion: dict[str, Any] | None = None  # tune() always sets it: a prediction, an error, or why none
    multiprocessing_context: str | None = None
    elapsed_s: float = 0.0
    budget_s: float = 0.0
    effective_budget_s: float = 0.0  # less than budget_s for a small dataset (see _effective_budget)
    dataloader_settings: dict[str, Any] = field(default_factory=dict)
    use_auto: str | None = None  # why num_workers="auto" fits better than any one setting (fastdata.tuning.phases)

    @property
    def step_ms_effective(self) -> float:
        return self.measurements.step_ms

    @property
    def loader_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"batch_size": self.batch_size, "shuffle": True, "num_workers": self.num_workers,
                                  "pin_memory": self.pin_memory}
        if self.backend != DEFAULT_BACKEND:
            kwargs["backend"] = self.backend
        if self.num_workers > 0:
            kwargs["persistent_workers"] = self.persistent_workers
            kwargs["prefetch_factor"] = self.prefetch_factor
            if self.multiprocessing_context and BACKENDS[self.backend].crosses_process:
                kwargs["multiprocessing_context"] = self.multiprocessing_context
        return kwargs

    @property
    def dataloader_kwargs(self) -> dict[str, Any]:
        return dict(self.dataloader_settings)

    def make_loader(self, dataset: Any, **overrides: Any) -> Any:
        """``fastdata.loader(dataset, **self.loader_kwargs, **overrides)``."""
        from fastdata.loading import loader

        return loader(dataset, **{**self.loader_kwargs, **overrides})

    def explain(self) -> str:
        return tune_paragraph(self.measurements, self)

    def doubts(self) -> list[str]:
        """The measured figures that cannot be trusted on this machine now, and why
        (:func:`fastdata.tuning.noise.doubts`); empty when every figure was steady."""
        choice = choice_doubt(self.candidates, self.backend, self.num_workers, self.measurements.spreads.get("noise"))
        return doubts(self.measurements) + ([choice] if choice else [])

    def to_dict(self) -> dict[str, Any]:
        m = asdict(self.measurements)
        m["epoch_s"] = self.measurements.epoch_s
        m["spreads"] = {name: spread.to_dict() for name, spread in self.measurements.spreads.items()}
        return {
            "backend": self.backend, "num_workers": self.num_workers, "batch_size": self.batch_size,
            "persistent_workers": self.persistent_workers, "prefetch_factor": self.prefetch_factor,
            "pin_memory": self.pin_memory, "multiprocessing_context": self.multiprocessing_context,
            "predicted_samples_per_s": round(self.predicted_samples_per_s, 1),
            "measured_samples_per_s": None if self.measured_samples_per_s is None else round(self.measured_samples_per_s, 1),
            "predicted_wait_fraction": round(self.predicted_wait_fraction, 4),
            "wait_fraction": None if self.wait_fraction is None else round(self.wait_fraction, 4),
            "pss_mb_per_worker": self.pss_mb_per_worker,
            "loader_kwargs": self.loader_kwargs, "dataloader_kwargs": self.dataloader_kwargs,
            "measurements": m, "candidates": self.candidates, "conversion": self.conversion,
            "explanation": self.explain(), "doubts": self.doubts(),
            "elapsed_s": round(self.elapsed_s, 2), "budget_s": self.budget_s,
            "effective_budget_s": round(self.effective_budget_s, 2), "use_auto": self.use_auto,
        }


def tune(
    dataset: Any,
    batch_size: int = 256,
    step: float | Callable[[Any], Any] | str | None = None,
    budget_s: float = 60.0,
    *,
    backends: Iterable[str] = BACKENDS,
    start_method: str | None = None,
    max_workers: int | None = None,
    convert_source: Any = None,
    convert_options: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Recommendation:
    """Recommend ``fastdata.loader`` settings for ``dataset`` (see the module docstring).

    ``step`` is the training step after each batch: milliseconds to sleep, a function called
    with the batch, or ``"module:function"``. ``budget_s`` bounds the whole run. ``start_method``
    (default: this platform's) decides whether worker processes need a picklable dataset.
    ``convert_source`` (a folder path or ``torchvision:NAME``, with ``convert_options``) adds a
    prediction of what converting it to a fastdata format would give: a probe conversion of a
    sample that always runs, even once the budget is spent (it is bounded by its work, not by
    the time left). ``Recommendation.conversion`` always says what became of it: the prediction,
    ``{"format", "store", "error"}`` when the probe conversion failed, or ``{"skipped": reason}``
    without a ``convert_source``."""
    started = time.perf_counter()
    say = progress or (lambda message: None)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidOptionError(f"Invalid batch_size {batch_size!r}. Use a positive integer.")
    if not (budget_s > 0):
        raise InvalidOptionError(f"Invalid budget_s {budget_s!r}. Use a number of seconds > 0.")
    backends = tuple(backends)
    for name in backends or ("",):
        get_backend(name)
    options = step_options(step)
    step_fn = options.get("step")
    if isinstance(step_fn, str):
        from fastdata.importing import load_callable

        step_fn = load_callable(step_fn, what="step")
    step_ms = options.get("step_ms", 0.0)
    if step_ms < 0:
        raise InvalidOptionError(f"Invalid step {step!r}: milliseconds must be >= 0.")
    method = resolve_start_method(start_method)
    requested_budget = budget_s
    budget_s = min(budget_s, _effective_budget(dataset, batch_size, step_fn, step_ms, budget_s)
                   + (CONVERSION_PROBE_S if convert_source is not None else 0.0))
    say("measuring the fetch, the hand-over per backend, worker start-up, the GIL")
    m, sample_batches = measure(dataset, batch_size=batch_size, step=step_fn, step_ms=step_ms, backends=backends,
                                start_method=method, seconds=min(budget_s * 0.25, 8.0))
    limit_workers = max_workers if max_workers is not None else max(2, 2 * m.usable_cores)
    rows = candidate_rows(m, backends, limit_workers)
    confirm = rows_to_confirm(rows, m, limit=5)
    conversion_share = 0.2 if convert_source is not None else 0.0
    remaining = budget_s - (time.perf_counter() - started)
    per_probe = max(0.25, min(3.0, remaining * (1 - conversion_share) / (len(confirm) + 0.5) - 0.05))
    for position, row in enumerate(confirm):
        # the reference and the best prediction are always probed; the rest while the budget lasts
        if position >= 2 and budget_s - (time.perf_counter() - started) < per_probe + 0.2 + conversion_share * budget_s:
            row["skipped"] = "budget"
            continue
        say(f"probing backend={row['backend']} num_workers={row['num_workers']}")
        loader = probe_loader(dataset, row["backend"], row["num_workers"], batch_size, context=method)
        result = probe(loader, per_probe, step=step_fn, step_s=step_ms / 1000, memory=row["num_workers"] > 0
                       and BACKENDS[row["backend"]].crosses_process)
        row.update(measured_samples_per_s=round(result.samples_per_s, 1), wait_fraction=round(result.wait_fraction, 4),
                   first_batch_s=round(result.first_batch_s, 4), pss_mb_per_worker=result.pss_mb_per_worker)
    measured = [r for r in confirm if "measured_samples_per_s" in r]
    best = pick_best(measured or rows, m)
    recommendation = Recommendation(
        backend=best["backend"], num_workers=best["num_workers"], batch_size=batch_size,
        persistent_workers=best["num_workers"] > 0,  # start-up paid once; explain() compares it with the epoch
        prefetch_factor=2 if best["num_workers"] > 0 else None,
        pin_memory=m.cuda, predicted_samples_per_s=best["predicted_samples_per_s"],
        measured_samples_per_s=best.get("measured_samples_per_s"),
        predicted_wait_fraction=best["predicted_wait_fraction"], wait_fraction=best.get("wait_fraction"),
        pss_mb_per_worker=best.get("pss_mb_per_worker"), measurements=m, candidates=rows,
        multiprocessing_context=start_method if BACKENDS[best["backend"]].crosses_process and best["num_workers"] > 0
        else None,
        budget_s=requested_budget, effective_budget_s=budget_s,
    )
    recommendation.dataloader_settings = _dataloader_settings(rows, m, batch_size)
    from fastdata.tuning.phases import phase_advice

    recommendation.use_auto = phase_advice(m, dataset, backends, limit_workers)
    if convert_source is not None:  # always, whatever is left of the budget: it is bounded by its work
        say("probe conversion of a sample")
        recommendation.conversion = predict_conversion(dataset, m, recommendation, backends, limit_workers)
    else:
        recommendation.conversion = {"skipped": NO_CONVERT_SOURCE}
    recommendation.elapsed_s = time.perf_counter() - started
    return recommendation


def _effective_budget(dataset: Any, batch_size: int, step: Callable[[Any], Any] | None, step_ms: float,
                      budget_s: float) -> float:
    """``budget_s``, or less for a small dataset: about ``EPOCHS_WORTH`` epochs at num_workers=0
    (at least ``MIN_BUDGET_S``). Telling settings apart takes a fixed number of batches, not
    epochs; an exhaustive sweep of a small dataset is itself quick, and tune should stay far
    below it."""
    if len(dataset) == 0:
        return budget_s
    fetch = BatchFetcher(dataset)
    indices = probe_batches(len(dataset), batch_size, 3)
    try:
        times = []
        for batch_indices in (indices * 2)[:2]:  # the first call pays one-off costs (opening files, imports)
            start = time.perf_counter()
            batch = fetch(batch_indices)
            if step is not None:
                step(batch)
            times.append(time.perf_counter() - start)
        per_batch = min(times) + step_ms / 1000
    except Exception:  # noqa: BLE001 - measure() reports a dataset that cannot be read
        return budget_s
    epoch_s = per_batch * math.ceil(len(dataset) / batch_size)
    return min(budget_s, max(MIN_BUDGET_S, EPOCHS_WORTH * epoch_s))


def _dataloader_settings(rows: list[dict[str, Any]], m: Measurements, batch_size: int) -> dict[str, Any]:
    """The best plain-DataLoader (backend torch) row as DataLoader keywords."""
    torch_rows = [r for r in rows if BACKENDS[r["backend"]].dataloader_options]
    measured = [r for r in torch_rows if "measured_samples_per_s" in r]
    best = pick_best(measured if len(measured) > 1 else torch_rows, m)  # never a guess against a measurement
    kwargs: dict[str, Any] = {"batch_size": batch_size, "shuffle": True, "num_workers": best["num_workers"],
                              "pin_memory": m.cuda}
    if best["num_workers"] > 0:
        kwargs.update(persistent_workers=True, prefetch_factor=2)
    return kwargs


def predict_conversion(dataset: Any, m: Measurements, current: Recommendation, backends: tuple[str, ...],
                       max_workers: int, *, probe_samples: int = CONVERSION_PROBE_SAMPLES,
                       fetches: int = CONVERSION_PROBE_FETCHES) -> dict[str, Any]:
    """Convert a sample of ``dataset`` (what the source reads as) to npy, time ``fetches``
    batch fetches from it (the median), and predict the best rate after a full conversion
    (same hand-over costs: same batch). Bounded by that work alone, never by a time budget.
    A conversion that fails gives ``{"format", "store", "error"}``."""
    from torch.utils.data import Subset

    from fastdata.api import open_dataset
    from fastdata.conversion import convert

    count = min(len(dataset), max(probe_samples, m.batch_size))
    with tempfile.TemporaryDirectory(prefix="fastdata-tune-") as scratch:
        out = Path(scratch) / "probe.npy"
        start = time.perf_counter()
        try:
            convert(Subset(dataset, range(count)), out, format="npy", store="raw", workers=0)
        except FastdataError as exc:
            return {"format": "npy", "store": "raw", "error": str(exc)}
        conversion_s = time.perf_counter() - start
        converted = open_dataset(out)
        fetch = BatchFetcher(converted)
        indices = probe_batches(count, min(m.batch_size, count), fetches)
        fetch(indices[0])  # the first read opens the files
        times = []
        for position in range(fetches):
            before = time.perf_counter()
            fetch(indices[position % len(indices)])
            times.append(time.perf_counter() - before)
        fetch_ms = statistics.median(times) * 1000
    after = dataclasses.replace(m, fetch_ms=fetch_ms, loop_ms=fetch_ms + m.overhead_ms)
    best = max(candidate_rows(after, backends, max_workers), key=lambda r: r["predicted_samples_per_s"])
    here = current.measured_samples_per_s or current.predicted_samples_per_s
    return {
        "format": "npy", "store": "raw", "probe_samples": count, "fetch_ms": round(fetch_ms, 4),
        "predicted_samples_per_s": best["predicted_samples_per_s"], "backend": best["backend"],
        "num_workers": best["num_workers"], "speedup": round(best["predicted_samples_per_s"] / here, 2) if here else None,
        "predicted_conversion_s": round(conversion_s / count * m.samples, 3),
    }
