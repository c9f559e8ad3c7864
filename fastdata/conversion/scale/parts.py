"""``fastdata convert SOURCE OUTPUT --part I/N``: one part of a job array (Slurm array, Kubernetes
indexed job). Every part plans the same units from the source (:mod:`fastdata.conversion.units`),
converts its own block of them into ``OUTPUT.partial.units`` with a local process pool, and
records itself; ``fastdata merge OUTPUT`` (:mod:`fastdata.conversion.scale.merge`) writes the output once
every part is there.

A part keeps its finished units: run again, it converts only the units not staged yet
(:mod:`fastdata.conversion.resume`, as every engine).

``--mode auto`` across parts: each part plans from the same first 64 readable images. When they
are all grayscale, a part that meets a colour image raises :class:`ModeConflict`, and the driver
runs it again as RGB (:func:`fastdata.conversion.driver.restarting`, as a local conversion
restarts); each unit records its mode, and the merge converts the other parts' grayscale units
again as RGB, so the output is the one a local conversion gives.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from fastdata.conversion.engine import run_here
from fastdata.conversion.options import ConvertOptions
from fastdata.conversion.outputs import check_existing, prepare_output
from fastdata.conversion.pipeline import Job, ModeConflict
from fastdata.importing import is_import_string
from fastdata.conversion.plan import conversion_key, plan_job, plan_record
from fastdata.conversion.resume import kept_units, units_to_run
from fastdata.conversion.scale.staging import (
    PART_PATTERN, PartLock, check_agreement, claim_staging, duplicate_error, read_records, write_record,
)
from fastdata.conversion.units import Unit, part_units, plan_units, staged_key, write_unit
from fastdata.formats import get_format
from fastdata.machine import usable_cores
from fastdata.sources import Source

Progress = Callable[[int, int], None]


def source_argument(source: Any, options: ConvertOptions) -> dict[str, Any] | None:
    """How ``fastdata merge`` can open the source again (None for a Python dataset object)."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    text = str(source)
    if not text.startswith("torchvision:") and not is_import_string(text):
        text = os.path.abspath(text)
    arguments = dict(options.source_arguments)
    if arguments.get("root"):
        arguments["root"] = os.path.abspath(arguments["root"])
    return {"source": text, **{k: v for k, v in arguments.items() if v is not None}}


def convert_part(src: Source, output: Path, options: ConvertOptions, progress: Progress | None = None,
                 *, source: dict[str, Any] | None = None, mode: str | None = None) -> dict[str, Any]:
    """Convert part ``options.part`` of ``src`` (in ``mode``, else as planned) into
    ``OUTPUT.partial.units``; return the part's record."""
    part, parts = options.part
    prepare_output(output, src.protected(), overwrite=options.overwrite, resume=False)
    if options.overwrite:  # only a fastdata dataset may be replaced: known before converting a part
        check_existing(output, overwrite=True, resume=False)
    fields, key = conversion_key(get_format(options.format, writable=True), src, options)
    fingerprint = src.fingerprint()
    with PartLock(output):
        staging = claim_staging(output)
        mine = staging / PART_PATTERN.format(part, parts)
        earlier = read_records(staging)
        for record in earlier:
            if (record.get("part"), record.get("parts")) == (part, parts):
                if not options.overwrite:
                    raise duplicate_error(output, record)
                mine.unlink()
                earlier.remove(record)
        planned = plan_job(src, options)  # the plan every part makes, recorded; the units may be RGB
        job = planned if mode is None else planned.on(src, mode=mode)
        record = {"part": part, "parts": parts, "key": key, "fields": fields, "fingerprint": fingerprint,
                  "unit_samples": options.unit_samples, "unit_bounds": src.unit_bounds(), "plan": plan_record(planned), "source": src.describe(),
                  "options": options.describe(), "reopen": source, "overwrite": options.overwrite}
        for other in earlier:
            check_agreement(output, record, other)
        units = part_units(plan_units(len(src), options.unit_samples, src.unit_bounds()), part, parts)
        total = sum(len(unit) for unit in units)
        workers = usable_cores() if options.workers is None else min(options.workers, usable_cores())
        counter = Counter(progress, total)
        try:
            results = convert_here(job, units, staging, staged_key(key, fingerprint), workers, counter)
        except ModeConflict:
            counter.restart()  # the driver runs the part again as RGB
            raise
        record["count"] = sum(r["count"] for r in results)
        record["skipped"] = sum(len(r["skipped"]) for r in results)
        record["units"] = [units[0].number, units[-1].number + 1] if units else [0, 0]
        write_record(output, record)
    return record


class Counter:
    """Progress of one process's units: the total, and a way to take back a restarted unit's share."""

    def __init__(self, progress: Progress | None, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self, count: int) -> None:
        self.done += count
        if self.progress is not None and count:
            self.progress(count, self.total)

    def restart(self) -> None:
        self(-self.done)


def convert_here(job: Job, units: list[Unit], staging: Path, key: str, workers: int,
                 counter: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """Convert ``units`` with a process pool here into ``staging``; finished units of the same
    conversion and source (``key``, a :func:`~fastdata.conversion.units.staged_key`) and mode are kept (:func:`~fastdata.conversion.resume.kept_units`). The
    units' records, in order."""
    counter = counter or Counter(None, 0)
    records = kept_units(staging, units, key, mode=job.plan.mode, gray_guess=job.gray_guess)
    for unit in units:
        if unit.number in records:
            counter(len(unit))
    for finished in run_here(job, workers, units_to_run(units, None, records)):
        records[finished.unit.number] = write_unit(staging, finished.unit, job.plan, key,
                                                   _counted(finished.batches, counter))
    return [records[unit.number] for unit in units]


def _counted(batches, counter: Callable[[int], None]):
    for batch in batches:
        counter(len(batch) + len(batch.skipped))
        yield batch
