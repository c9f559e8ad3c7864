"""``fastdata convert SOURCE OUTPUT --engine ray [--ray-address ADDRESS]``: units as Ray tasks.

The driver (this process) holds the output's lock, plans the units, and sends each Ray task only
its unit: the range and, for an image folder, the unit's own file names and labels (never the full
list; other sources that cannot be cut are put in Ray's object store once). A task decodes,
resizes, encodes and writes its unit into ``OUTPUT.partial.units`` (shared storage on a real
cluster), under a temporary name renamed when complete, so a worker killed mid-task leaves no
unit that looks finished; Ray runs the task again (``max_retries``). Bad input fails the task
with the same error as the local engine (not retried: it would fail again); the driver reports
the first bad unit in source order. The driver then writes the output from the units with the
format's writer (:func:`fastdata.conversion.scale.merge.write_output`), each unit as soon as it and
the ones before it are finished: it is the single writer of an HDF5 file, and npy and tar come
out byte-identical to ``--engine local``. Units finished by an earlier run of the same
conversion are kept and not sent again (:mod:`fastdata.conversion.resume`). A task that meets a
colour image while auto mode guessed grayscale raises :class:`ModeConflict`; the driver runs the
conversion again as RGB in the same Ray session.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Callable, Iterator

from fastdata.errors import EngineError
from fastdata.formats import get_format
from fastdata.images import disable_pillow_limit
from fastdata.conversion.options import ConvertOptions
from fastdata.conversion.locks import ConversionLock
from fastdata.conversion.outputs import check_existing, prepare_output
from fastdata.conversion.pipeline import Job, ModeConflict, WorkerPool, batches
from fastdata.conversion.plan import conversion_key, plan_job
from fastdata.conversion.resume import kept_units, units_to_run
from fastdata.conversion.scale.merge import write_output
from fastdata.conversion.scale.parts import Counter
from fastdata.conversion.scale.staging import check_no_parts, claim_staging, read_records, remove_staging
from fastdata.conversion.units import (
    Finished, Unit, plan_units, remove_temporaries, staged, staged_key, staging_path, write_unit,
)
from fastdata.sources import Source
from fastdata.extras import require

CANCEL_WAIT_S = 60  # the longest a failed conversion waits for its cancelled tasks to stop
MAX_RETRIES = 3  # a task whose worker or node dies runs again, up to this many times


def import_ray():
    """The ``ray`` module, or the one clear error that says how to install it."""
    return require("ray", extra="ray", feature="--engine ray",
                   otherwise="use --engine local, or --part I/N on a job array")


def convert_on_ray(ray, src: Source, output: Path, options: ConvertOptions,
                   progress: Callable[[int, int], None] | None = None, *, mode: str | None = None,
                   sink: Any = None) -> dict[str, Any]:
    """Convert ``src`` into ``output`` with Ray tasks (in ``mode``, else as planned), in a
    :func:`ray_session`; return the manifest. ``sink``: see :class:`~fastdata.conversion.outputs.Target`."""
    prepare_output(output, src.protected(), overwrite=options.overwrite, resume=False)
    spec = get_format(options.format, writable=True)
    fields, key = conversion_key(spec, src, options)
    fingerprint = src.fingerprint()
    with ConversionLock(output):
        existing = check_existing(output, overwrite=options.overwrite, resume=False)
        if staging_path(output).exists() and read_records(staging_path(output)):
            check_no_parts(output, overwrite=options.overwrite)  # a job array's parts: refused or discarded
        staging = claim_staging(output)  # units of an earlier run of this conversion are kept
        remove_temporaries(staging)
        job = plan_job(src, options, mode=mode)
        units = plan_units(len(src), options.unit_samples, src.unit_bounds())
        counter = Counter(progress, len(src))
        try:
            unit_key = staged_key(key, fingerprint)  # units staged before the source changed are not kept
            kept = kept_units(staging, units, unit_key, mode=job.plan.mode, gray_guess=job.gray_guess)
            for record in kept.values():
                counter(record["count"] + len(record["skipped"]))
            computed = run_units(ray, job, src, units_to_run(units, None, kept), staging, unit_key, counter)
            manifest = write_output(output, spec, job.plan, options, units, kept, computed, key=key, fields=fields,
                                    fingerprint=fingerprint, source=src.describe(), existing=existing, sink=sink)
        except ModeConflict:
            counter.restart()  # the driver converts again as RGB
            raise
        remove_staging(staging)
    return manifest


@contextlib.contextmanager
def ray_session(ray, address: str | None) -> Iterator[None]:
    """Joined to the cluster at ``address`` (or a local Ray started) for the block; Ray is shut
    down after it when this started it."""
    started = _connect(ray, address)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def _connect(ray, address: str | None) -> bool:
    """Join the cluster at ``address`` (or start a local one); True when this call started Ray."""
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise EngineError(f"Cannot connect to the Ray cluster at {address!r}: {exc}. Check --ray-address "
                          "(e.g. 'auto' on a cluster node, or 'ray://HEAD:10001').") from exc
    return True


def run_units(ray, job: Job, src: Source, units: list[Unit], staging: Path, key: str,
              counter: Callable[[int], None] | None) -> Iterator[Finished]:
    """Run ``units`` as Ray tasks; yield them finished, in unit order, each as soon as it and
    every unit before it are finished (read back from ``staging``)."""
    records: dict[int, dict[str, Any]] = {}
    cut = src.take(0, 0) is not None
    job_ref = ray.put(job.on(None) if cut else job)  # once into the object store, not once per task
    task = ray.remote(_unit_task).options(max_retries=MAX_RETRIES, num_cpus=1)
    tasks = {task.remote(job_ref, src.take(u.start, u.stop) if cut else None, u, str(staging), key): u for u in units}
    failures: dict[int, BaseException] = {}
    pending, position, cancelled = list(tasks), 0, []
    try:
        while pending:
            while position < len(units) and units[position].number in records:
                yield from staged(staging, [records[units[position].number]], job.plan)
                position += 1
            (ref,), pending = ray.wait(pending, num_returns=1)
            unit = tasks[ref]
            try:
                record = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:  # the task raised: bad input, a colour image, or a bug
                failures[unit.number] = getattr(exc, "cause", None) or exc
            except ray.exceptions.RayError as exc:  # worker, node or object lost, more often than retried
                failures[unit.number] = _lost(unit, exc)
            else:
                records[unit.number] = record
                if counter:
                    counter(record["count"] + len(record["skipped"]))
                continue
            first = min(failures)  # later units cannot change which error a local conversion reports
            for later in [r for r in pending if tasks[r].number > first]:
                ray.cancel(later)
                cancelled.append(later)
            pending = [r for r in pending if tasks[r].number < first]
    finally:  # the caller stopped early (an error, Ctrl-C): no task keeps running for nothing
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref)
        # a cancelled task may be mid-way through writing its unit: let it settle (bounded) so that
        # nothing writes into the staging folder after this returns (a rerun may be removing it)
        stopping = cancelled + pending
        if stopping:
            with contextlib.suppress(Exception):
                ray.wait(stopping, num_returns=len(stopping), timeout=CANCEL_WAIT_S)
    for unit in units[position:]:
        if unit.number not in records:
            break
        yield from staged(staging, [records[unit.number]], job.plan)
    if failures:
        raise failures[min(failures)]


def _lost(unit: Unit, exc: Exception) -> EngineError:
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    return EngineError(
        f"{unit.name} (samples {unit.start}..{unit.stop - 1}) failed on Ray after {MAX_RETRIES} retries: "
        f"{type(exc).__name__}: {first_line}. Check the cluster, then convert again (finished units are kept)."
    )


def _unit_task(job: Job, src: Source | None, unit: Unit, staging: str, key: str) -> dict[str, Any]:
    """One Ray task: convert ``unit`` (of ``src``, a cut of the source, or of the job's own source)."""
    disable_pillow_limit()
    work = job.on(src if src is not None else job.src)
    start, stop, offset = (0, len(unit), unit.start) if src is not None else (unit.start, unit.stop, 0)
    with WorkerPool(work, 0, 0) as pool:  # a colour image while auto mode guessed grayscale: ModeConflict
        converted = (batch for batch, _ in batches(work, pool, start, stop))
        return write_unit(Path(staging), unit, work.plan, key, converted, offset)
