"""Run, the middle of a conversion's three steps (plan, run, write; see docs/converting.md): the
local engine. It converts a planned job in this process or a local process pool and yields
finished units, in source order, for :func:`fastdata.conversion.write.write_units`. The other
engines (:mod:`~fastdata.conversion.scale.parts`, :mod:`~fastdata.conversion.scale.ray_engine`)
yield the same units from ``OUTPUT.partial.units``; only where they are computed differs.
"""

from __future__ import annotations

from typing import Iterator

from fastdata.conversion.pipeline import Job, WorkerPool, batches
from fastdata.conversion.write import Finished


def run_here(job: Job, workers: int, start: int = 0) -> Iterator[Finished]:
    """The job's samples from source index ``start`` on, each converted batch as a finished unit,
    with ``workers`` processes (in this process when ``workers`` <= 1). Closing the generator
    stops the pool."""
    with WorkerPool(job, workers, len(job.src) - start) as pool:
        for batch, next_index in batches(job, pool, start):
            yield Finished((batch,), {int(index): entry for index, entry in batch.skipped}, next_index)
