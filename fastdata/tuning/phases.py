"""When one fixed setting is not the answer: ``fastdata tune`` says "use num_workers='auto'".

The best loader setting depends on the phase of a run where the dataset is read through the URL
cache (the first epoch waits on downloads, later ones read the local copy), or where the fetch
itself varies so much that the model picks another setting at its fastest and at its slowest
measured repeat (a cache warming up, a neighbour on the node). There, ``num_workers="auto"``
(:mod:`fastdata.loading.autoloader`) follows the phase; a fixed setting fits one of them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastdata.tuning.measure import Measurements
from fastdata.tuning.model import candidate_rows

FETCH_VARIES = 2.0  # the slowest measured fetch over the fastest: the fetch is phase-dependent


def _best(m: Measurements, backends: tuple[str, ...], max_workers: int) -> tuple[str, int]:
    rows = candidate_rows(m, backends, max_workers)
    top = max(rows, key=lambda r: (r["predicted_samples_per_s"], -r["num_workers"]))
    return top["backend"], top["num_workers"]


def phase_advice(m: Measurements, dataset: Any, backends: tuple[str, ...], max_workers: int) -> str | None:
    """Why ``num_workers="auto"`` fits better than any one setting, or None where one does."""
    from fastdata.remote.dataset import RemoteFiles

    reasons = []
    if isinstance(getattr(dataset, "files", None), RemoteFiles):
        reasons.append("the dataset is read through the URL cache: the first epoch waits on downloads, later ones "
                       "read the local copy")
    spread = m.spreads.get("fetch_ms")
    if spread is not None and spread.low > 0 and spread.high >= FETCH_VARIES * spread.low:
        settings = []
        for fetch_ms in (spread.low, spread.high):
            varied = dataclasses.replace(m, fetch_ms=fetch_ms, loop_ms=max(m.loop_ms - m.fetch_ms + fetch_ms, fetch_ms))
            settings.append(_best(varied, backends, max_workers))
        if settings[0] != settings[1]:
            (b1, n1), (b2, n2) = settings
            reasons.append(f"the fetch took {spread.low:.1f} to {spread.high:.1f} ms per batch, and the best setting "
                           f"moves with it ({b1} x{n1} -> {b2} x{n2})")
    if not reasons:
        return None
    return "use num_workers='auto' (the loader follows the phase): " + "; ".join(reasons)
