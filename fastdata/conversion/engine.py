"""Run, the middle of a conversion's three steps (plan, run, write; see docs/converting.md): the
local engine. It converts planned units of a job in this process or a local process pool and
yields them, finished and in order, for :func:`fastdata.conversion.write.write_units`; one pool
serves every unit, so units cost a local conversion nothing but a chunk boundary at each unit's
end. The other engines (:mod:`~fastdata.conversion.scale.parts`,
:mod:`~fastdata.conversion.scale.ray_engine`) yield the same units from ``OUTPUT.partial.units``;
only where they are computed differs. Which units to compute, :mod:`fastdata.conversion.resume` says.
"""

from __future__ import annotations

from typing import Any, Iterator

from fastdata.conversion.pipeline import Job, WorkerPool, batches, chunk_size, is_array_copy, split
from fastdata.conversion.units import Finished, Unit
from fastdata.formats.base import Batch


def run_here(job: Job, workers: int, units: list[Unit]) -> Iterator[Finished]:
    """``units`` of the job converted with ``workers`` processes (in this process when ``workers``
    <= 1), each yielded as a finished unit as its batches are consumed. Closing the generator
    stops the pool."""
    with WorkerPool(job, workers, sum(len(unit) for unit in units)) as pool:
        if is_array_copy(job):
            for unit in units:
                skipped: dict[int, dict[str, str]] = {}
                yield Finished(unit, _noted((batch for batch, _ in batches(job, pool, unit.start, unit.stop)),
                                            1 << 62, skipped), skipped)
            return
        size = chunk_size(job.plan, sum(len(unit) for unit in units), pool.workers)
        chunks = [split(list(range(unit.start, unit.stop)), size) for unit in units]
        converted = pool.convert_chunks([chunk for unit_chunks in chunks for chunk in unit_chunks])
        for unit, unit_chunks in zip(units, chunks):
            skipped = {}
            yield Finished(unit, _noted(converted, len(unit_chunks), skipped), skipped)


def _noted(converted: Iterator[Batch], count: int, skipped: dict[int, Any]) -> Iterator[Batch]:
    """The next ``count`` batches of ``converted`` (all when fewer), their skipped samples noted in ``skipped``."""
    for _, batch in zip(range(count), converted):
        skipped.update((int(index), entry) for index, entry in batch.skipped)
        yield batch
