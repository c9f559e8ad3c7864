"""``fastdata.sweep``: ``fastdata bench``'s measurement for any map-style Dataset.

Every (read path, backend, num_workers) runs in a fresh process forked from this one (the
dataset travels by fork; under spawn it is pickled), warm-up epochs first, and yields the same
rows as ``fastdata bench``: ``format`` is the dataset's class name, ``store`` is ``-``, ``read_path``
is ``fast`` (``fastdata.loader``, one ``dataset[indices]`` call per batch where the dataset
accepts index arrays) or ``standard`` (``DataLoader(dataset, batch_size, shuffle=True)``, what
most training scripts do).

Each configuration's process runs torch on one intra-op thread (``torch.set_num_threads(1)``,
as DataLoader workers do): it is forked from the caller's process, and a fork of a process that
has run torch's OpenMP threads hangs on its first parallel op otherwise.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from fastdata.bench.config import BACKENDS, MEMORY_MIN_S, BenchConfig, Case, auto_workers
from fastdata.bench.probes import ReadyBatchesOf
from fastdata.bench.runner import make_row, run_isolated
from fastdata.errors import InvalidOptionError
from fastdata.machine import usable_cores

PATHS = ("fast", "standard")


def step_options(step: Any) -> dict[str, Any]:
    """``step`` as BenchConfig fields: None, milliseconds to sleep, a callable run on each
    batch, or an import string naming one."""
    if step is None:
        return {}
    if isinstance(step, bool):
        raise InvalidOptionError(f"Invalid step {step!r}: use milliseconds, a function, or 'module:function'.")
    if isinstance(step, (int, float)):
        return {"step_ms": float(step)}
    return {"step": step}


def sweep(
    dataset: Any,
    batch_size: int = 256,
    workers: Iterable[int] | None = None,
    backends: Iterable[str] = BACKENDS,
    step: float | Callable[[Any], Any] | str | None = None,
    *,
    paths: Iterable[str] = PATHS,
    epochs: int = 3,
    warmup: int = 1,
    persistent_workers: bool = False,
    prefetch_factor: int = 2,
    pin_memory: bool = False,
    start_method: str | None = None,
    timeout_s: float = 600.0,
    memory_s: float = MEMORY_MIN_S,
    on_case: Callable[[Case, int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Measure ``dataset`` at every ``num_workers`` in ``workers`` (default 0, 1, 2, 4, ... up to
    the usable cores) for each backend, on each read path; the rows ``fastdata bench`` writes.

    ``step`` is the training step each batch is followed by: milliseconds of sleep, a function
    called with the batch, or ``"module:function"``. Peak memory is sampled in untimed epochs
    after the timed ones, lasting at least ``memory_s`` seconds (0: one epoch)."""
    paths = tuple(paths)
    unknown = [path for path in paths if path not in PATHS]
    if unknown or not paths:
        raise InvalidOptionError(f"Unknown path {unknown[0] if unknown else ''!r}. Allowed: 'fast', 'standard'.")
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise InvalidOptionError(f"sweep() needs a map-style Dataset (__getitem__ and __len__), got {type(dataset).__name__}.")
    config = BenchConfig(
        formats=(), stores=(), workers=tuple(sorted(set(workers if workers is not None else auto_workers(usable_cores())))),
        batch_size=batch_size, epochs=epochs, warmup=warmup, persistent_workers=persistent_workers,
        prefetch_factor=prefetch_factor, pin_memory=pin_memory, start_method=start_method, timeout_s=timeout_s,
        memory_s=memory_s,
        backends=tuple(backends), **step_options(step),
    )
    if any(w < 0 for w in config.workers):
        raise InvalidOptionError(f"Invalid workers {list(config.workers)!r}: use counts >= 0.")
    name = type(dataset).__name__
    cases = []
    for path in paths:
        for backend in config.backends if path == "fast" else ("torch",):
            for count in config.workers:
                if backend != "torch" and count == 0:
                    continue  # at num_workers=0 every backend computes in this thread: the torch row measures it
                cases.append(Case(name, "-", path, count, "", {"dataset": dataset}, (), backend))
    cases += _transfer_probe(dataset, config)
    rows = []
    for number, case in enumerate(cases):
        if on_case:
            on_case(case, number, len(cases))
        for result in run_isolated(case, config, None, single_thread=True):
            rows.append(make_row(case, None, result, config))
    return rows


def _transfer_probe(dataset: Any, config: BenchConfig) -> list[Case]:
    """What a DataLoader worker pays to hand over one batch of this dataset's structure and size:
    a probe that returns ready copies of a real batch, at num_workers=0 and the fewest workers
    (the ``probe transfer`` rows ``fastdata bench`` writes too; verdicts use the difference).
    The batch is read in the configuration's own process, never here."""
    with_workers = [w for w in config.workers if w > 0]
    if not with_workers or len(dataset) == 0:
        return []
    ready = ReadyBatchesOf(dataset, config.batch_size, TRANSFER_PROBE_BATCHES)
    return [Case("probe", "-", "transfer", w, "", {"dataset": ready}) for w in (0, min(with_workers))]


TRANSFER_PROBE_BATCHES = 50

__all__ = ["BACKENDS", "PATHS", "step_options", "sweep"]
