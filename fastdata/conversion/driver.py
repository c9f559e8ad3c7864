"""``fastdata.convert``: every conversion is plan, run, write (docs/converting.md).

Plan (:mod:`fastdata.conversion.plan`): the format is decided, the source opened, the plan and
the conversion key made. Run: an engine computes the units, here or in a local pool
(:mod:`~fastdata.conversion.engine`), as one part of a job array
(:mod:`~fastdata.conversion.scale.parts`) or as Ray tasks (:mod:`~fastdata.conversion.scale.ray_engine`).
Write (:mod:`fastdata.conversion.write`): one loop streams the finished units through the
format's writer into ``<output>.partial``, which is renamed to ``<output>`` only when complete,
so a failed or interrupted conversion never leaves something that looks like a dataset. This
module decides *whether* a conversion writes (the output rules of
:mod:`~fastdata.conversion.outputs`, the lock, ``--resume`` and "already complete"), and owns the
one restart a conversion may make, for every engine and the merge (:func:`restarting`): auto mode
planned grayscale and a colour image came up, so it runs again as RGB. Every engine resumes the
same way (:mod:`fastdata.conversion.resume`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, Callable, TypeVar

from fastdata.conversion import journal
from fastdata.conversion.engine import run_here
from fastdata.conversion.locks import ConversionLock
from fastdata.conversion.options import ConvertOptions
from fastdata.conversion.outputs import Target, check_existing, check_output_path, partial_path, prepare_output
from fastdata.conversion.pipeline import ModeConflict
from fastdata.conversion.plan import conversion_key, decide_options, open_source, plan_job
from fastdata.conversion.resume import in_order, keep_complete, kept_units, resumed_units, units_to_run
from fastdata.conversion.scale.merge import merge_parts, options_from_fields
from fastdata.conversion.scale.parts import convert_part, source_argument
from fastdata.conversion.scale.ray_engine import convert_on_ray, import_ray, ray_session
from fastdata.conversion.scale.staging import (
    PART_PATTERN, check_complete, check_no_parts, claim_staging, describe_part, is_staging, read_records,
    remove_staging,
)
from fastdata.conversion.units import part_units, plan_units, remove_unit, staged_key
from fastdata.conversion.units import staging_path as units_staging
from fastdata.conversion.write import write_units, written_once
from fastdata.formats import get_format, require_manifest
from fastdata.formats.stored import single_file_problem
from fastdata.machine import usable_cores
from fastdata.manifest import Manifest
from fastdata.files import remove_path
from fastdata.errors import (ConversionInterrupted, OutputExistsError, OutputLockedError, OutputWriteError, PartsError,
                             RemoteError, fix_option)
from fastdata.remote.cachedir import write_error, writing_to
from fastdata.remote.dataset import RemoteOptions, fetch_dataset, open_remote
from fastdata.remote.filesystem import scrub
from fastdata.conversion.remote.locks import part_writing, writing
from fastdata.conversion.remote.units import (
    UnitUploader, download_units, fetch_uploaded_units, part_record, remove_units, units_url, upload_part,
)
from fastdata.conversion.remote.upload import (
    Destination, ShardSink, begin_upload, check_destination, check_output_url, finish_upload, staging_path, undo_upload,
)
from fastdata.sources import Source
from fastdata.sources.parquet import is_remote_table
from fastdata.urls import is_url

__all__ = ["convert", "merge", "open_source", "run_conversion"]
logger = logging.getLogger("fastdata")
T = TypeVar("T")


def convert(
    source: Any,
    output: str | os.PathLike,
    options: ConvertOptions | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Convert ``source`` into ``output``; return the written manifest (a dict, shown short:
    :class:`~fastdata.manifest.Manifest`).

    ``source`` is an image folder, ``"torchvision:NAME"``, a map-style dataset of
    ``(image, label)``, or a dataset written by ``fastdata convert``. ``options`` is a
    :class:`~fastdata.conversion.options.ConvertOptions`; keyword ``overrides`` set its fields (``format``,
    ``store``, ``resize="64x64"``, ``workers``, ``resume``, ``root``/``split``/``download``/
    ``source_options`` for torchvision sources, ...) or the format's own options
    (``compression`` for hdf5, ``shard_bytes`` for tar). Without ``format``, the output's name
    decides it: ``.h5``/``.hdf5`` hdf5, ``.npy`` npy, ``.tar`` or no extension tar (another
    extension is refused); a ``format`` that contradicts the extension is refused. ``progress(n,
    total)`` is called as each n more samples complete.

    ``engine="ray"`` runs the work as Ray tasks (``ray_address`` names the cluster); ``part=(I, N)``
    (or ``"I/N"``) converts only part I of N and returns that part's record instead of a manifest:
    :func:`fastdata.merge` writes the output once all N are done (docs/scale-out.md).
    """
    return Manifest(_convert(source, output, options, progress, overrides))


def _convert(source: Any, output: str | os.PathLike, options: ConvertOptions | None,
             progress: Callable[[int, int], None] | None, overrides: dict[str, Any]) -> dict[str, Any]:
    if is_url(source) and not is_remote_table(source):  # a converted dataset in object storage: fetched into the cache
        source = fetch_dataset(os.fspath(source), check_single=single_file_problem)
    if is_url(output):
        return _convert_to_url(source, os.fspath(output), options, progress, overrides)
    output = Path(output)
    options = decide_options(output, options, **overrides)
    check_output_path(output)
    if options.engine == "ray":
        ray = import_ray()  # says how to install it before the source is read
        src = open_source(source, options)
        with ray_session(ray, options.ray_address):
            return restarting(lambda mode: convert_on_ray(ray, src, output, options, progress, mode=mode))
    if options.part is not None:
        src, reopen = open_source(source, options), source_argument(source, options)
        return restarting(lambda mode: convert_part(src, output, options, progress, source=reopen, mode=mode))
    refuse_early(output)
    return run_conversion(open_source(source, options), output, options, progress)


def refuse_early(output: Path) -> None:
    """An output that another conversion is writing, refused before the source is opened (which
    may list a bucket or read every file's metadata); :func:`run_conversion` takes the lock for
    the conversion. (An existing output is refused once the source is open: whether it is the
    source itself, which the message then says, needs the source's paths.)"""
    if output.parent.is_dir():
        try:
            with ConversionLock(output):
                pass
        except OutputLockedError:
            raise
        except OSError:  # a folder it cannot write in: run_conversion names it, with the fix
            pass


def _convert_to_url(source: Any, url: str, options: ConvertOptions | None,
                    progress: Callable[[int, int], None] | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """Convert into a local staging copy (in the cache directory; ``--resume`` continues it),
    then upload it to ``url``, the manifest last (:mod:`fastdata.conversion.remote.upload`). The rules for
    an existing output (``--overwrite``, ``--resume``) apply to what is at the URL. Every engine
    writes there: the local one and Ray through the same staging copy and upload; a ``--part``
    shares its units through the bucket (:mod:`fastdata.conversion.remote.units`) for ``fastdata merge URL``."""
    check_output_url(url)
    staging = staging_path(url)
    decided = decide_options(staging, options, **overrides)
    remote = RemoteOptions()
    single = get_format(decided.format).read_manifest is not None  # a one-file format (.h5)
    locked = part_writing(url, *decided.part, remote) if decided.part is not None else writing(url, "convert", remote)
    with locked as lock:  # one writer of the URL at a time, across machines (fastdata.conversion.remote.locks)
        # Ray and parts keep the units they finished and run again without --resume, as locally
        found = check_destination(url, single=single, overwrite=decided.overwrite, resume=decided.resume,
                                  rerun=decided.engine == "ray" or decided.part is not None, options=remote)
        with writing_to(_cache_folder(staging), f"writing the local copy of {scrub(url)!r}"):
            staging.parent.mkdir(parents=True, exist_ok=True)
        if found.dataset and not decided.overwrite:  # --resume on a finished output: kept as locally, or refused
            if decided.part is not None:
                raise OutputExistsError(
                    f"Output {scrub(url)!r} already exists. Pass {fix_option('overwrite')} to replace it.")
            return _keep_finished(source, url, found, staging, decided)
        if decided.part is not None:
            return _part_to_url(source, url, staging, decided, progress, remote)
        if not decided.resume:  # an earlier staging copy (ours), started again without --resume
            _remove_staging_copy(staging)
        local = dataclasses.replace(decided, overwrite=False)
        ray = import_ray() if decided.engine == "ray" else None  # says how to install it before anything is uploaded

        def convert_into(sink: ShardSink | None) -> dict[str, Any]:
            if ray is not None:
                src = open_source(source, local)
                with ray_session(ray, local.ray_address):
                    return restarting(lambda mode: convert_on_ray(ray, src, staging, local, progress, mode=mode,
                                                                  sink=sink))
            try:
                return run_conversion(open_source(source, local), staging, local, progress, sink=sink)
            except ConversionInterrupted as exc:  # named as the user named the output
                raise ConversionInterrupted(scrub(url), exc.kept, exc.total, exc.partial) from None

        manifest = _upload(found, staging, remote, lock, convert_into)
    remove_path(staging)
    return manifest


def _upload(found: Destination, staging: Path, remote: RemoteOptions, lock: Any,
            convert_into: Callable[[ShardSink | None], dict[str, Any]]) -> dict[str, Any]:
    """``convert_into(sink)`` the local ``staging`` copy, then upload it to ``found.url``, the
    manifest last. Tar shards stream through the sink as they are closed, except when a dataset
    is replaced: it stays whole and readable until the new one is converted. A failed conversion
    takes back what it uploaded and its marker (the URL is as it found it); one interrupted after
    a checkpoint keeps them for ``--resume``, as does a failed upload of a finished conversion."""
    url = found.url
    marked = begin_upload(url, found, remote)
    sink = None if found.dataset else ShardSink(url, remote)
    try:
        manifest = convert_into(sink)
    except ConversionInterrupted:  # kept for --resume: the staging copy, what it uploaded, the marker
        raise
    except BaseException as exc:
        undo_upload(found, sink.sent if sink is not None else [], marked, remote)
        full = write_error(_cache_folder(staging), exc.errno, f"writing the local copy of {scrub(url)!r}") \
            if isinstance(exc, OutputWriteError) else None
        if full is not None:
            raise full from exc
        raise
    lock.check()  # still this process's: nothing is committed otherwise
    try:
        finish_upload(staging, found, remote)
    except RemoteError as exc:  # the conversion is done: --resume uploads the staging copy
        raise type(exc)(f"{exc} The converted dataset is kept in {str(staging)!r}: run the same command with "
                        f"{fix_option('resume')} to finish its upload.") from None
    return manifest


def _keep_finished(source: Any, url: str, found: Destination, staging: Path, options: ConvertOptions) -> dict[str, Any]:
    """``--resume`` on a dataset already at ``url``: its manifest when it was converted from the
    same, unchanged source with the same options (nothing is uploaded), else the local refusal."""
    manifest = found.manifest if found.manifest is not None else _single_manifest(url)
    src = open_source(source, options)
    spec = get_format(options.format, writable=True)
    fields, key = conversion_key(spec, src, options)
    target = Target(staging, spec, key, src.fingerprint())
    return keep_complete(scrub(url), manifest, target, overwrite=False, options=options, source=fields["source"])


def _single_manifest(url: str) -> dict[str, Any]:
    """The manifest of the one-file dataset (``.h5``) at ``url``, which carries it inside: fetched whole."""
    files = open_remote(url, RemoteOptions(), check_single=single_file_problem)
    try:
        return require_manifest(files.directory / files.single)
    finally:
        files.close()


def _cache_folder(staging: Path) -> Path:
    """The cache's folder that holds the staging copy ``staging`` (``<cache>/.uploads/<hash>/<name>``)."""
    return staging.parents[2]


def _part_to_url(source: Any, url: str, staging: Path, options: ConvertOptions,
                 progress: Callable[[int, int], None] | None, remote: RemoteOptions) -> dict[str, Any]:
    """One part of a job array converting to ``url``: its units staged here, then uploaded under
    ``URL.partial.units/`` with its record last, where ``fastdata merge URL`` finds every part's."""
    part, parts = options.part
    earlier = part_record(url, part, parts, remote)
    if earlier is not None and not options.overwrite:
        raise PartsError(
            f"Part {part}/{parts} of {scrub(url)!r} was already uploaded ({describe_part(earlier)}); each --part I/N "
            f"runs once. Check the job array's indices, or pass {fix_option('overwrite')} to convert part "
            f"{part}/{parts} again.")
    src, reopen = open_source(source, options), source_argument(source, options)
    units = part_units(plan_units(len(src), options.unit_samples, src.unit_bounds()), part, parts)
    local_units = claim_staging(staging)  # refuses a folder fastdata did not write
    already = fetch_uploaded_units(url, local_units, units, remote) if not options.overwrite else {}
    with UnitUploader(local_units, url, units, remote, already=already) as uploader:  # each unit as it is done
        record = restarting(lambda mode: convert_part(src, staging, options, progress, source=reopen, mode=mode))
    upload_part(local_units, url, units, record, remote, sent=uploader.sent)
    for unit in units:  # the bucket holds them now; other parts here may still be writing beside them
        remove_unit(units_staging(staging), unit)
    (units_staging(staging) / PART_PATTERN.format(part, parts)).unlink()
    return record


def merge(output: str | os.PathLike, *, progress: Callable[[int, int], None] | None = None,
          source: Any = None) -> dict[str, Any]:
    """Write ``output`` from its parts (``fastdata convert ... --part I/N``); return its manifest.

    ``source`` is needed only when the parts were converted from a Python dataset object and, in
    auto mode, some parts met colour images while others did not (their units are converted again).
    A URL ``output``: the parts' units are downloaded from ``URL.partial.units/``, the output is
    written locally and uploaded as ``convert`` uploads it (the manifest last), then the units removed.
    """
    if is_url(output):
        return _merge_url(os.fspath(output), progress, source)
    return restarting(lambda mode: merge_parts(Path(output), progress=progress, source=source, mode=mode))


def _merge_url(url: str, progress: Callable[[int, int], None] | None, source: Any) -> dict[str, Any]:
    check_output_url(url)
    staging = staging_path(url)
    remote = RemoteOptions()
    with writing(url, "merge", remote) as lock:  # one merge, and no part running
        local_units = units_staging(staging)
        local_units.parent.mkdir(parents=True, exist_ok=True)
        if local_units.exists() and not is_staging(local_units):
            claim_staging(staging)  # refuses a folder fastdata did not write
        if not download_units(url, local_units, remote, records_only=True):
            raise PartsError(
                f"Nothing to merge for {scrub(url)!r}: {scrub(units_url(url))!r} holds no parts. Convert the parts "
                f"first: 'fastdata convert SOURCE {scrub(url)} --part I/N' for I = 1..N.")
        records = read_records(local_units)
        try:
            check_complete(staging, records)
        except PartsError as exc:  # named as the user named it: the URL, not the local staging copy
            raise PartsError(str(exc).replace(str(staging), scrub(url))) from None
        options = options_from_fields(records[0]["fields"])
        single = get_format(options.format).read_manifest is not None
        found = check_destination(url, single=single, overwrite=all(r.get("overwrite") for r in records),
                                  resume=False, rerun=True, options=remote)  # rerun: an interrupted merge's upload
        download_units(url, local_units, remote)
        _remove_staging_copy(staging)
        manifest = _upload(found, staging, remote, lock, lambda sink: restarting(
            lambda mode: merge_parts(staging, progress=progress, source=source, mode=mode, sink=sink)))
        remove_units(url, remote)
        remove_path(staging)
        return manifest


def _remove_staging_copy(staging: Path) -> None:
    """Remove an earlier local staging copy of a conversion to a URL (ours), finished or partial."""
    for stale in (staging, partial_path(staging)):
        remove_path(stale)  # nothing there: nothing to do


def restarting(attempt: Callable[[str | None], T]) -> T:
    """``attempt(None)``, the conversion as planned; when auto mode planned grayscale and an engine
    met a colour image (:class:`~fastdata.conversion.pipeline.ModeConflict`, raised by every
    engine and the merge), ``attempt("RGB")``: the conversion again as RGB. The only place a
    conversion restarts; units finished as RGB are kept (:func:`~fastdata.conversion.resume.kept_units`)."""
    try:
        return attempt(None)
    except ModeConflict:
        return attempt("RGB")


def run_conversion(
    src: Source,
    output: Path,
    options: ConvertOptions,
    progress: Callable[[int, int], None] | None = None,
    *,
    sink: Any = None,
) -> dict[str, Any]:
    """Convert ``src`` into ``output`` with the local engine; ``options`` as
    :func:`~fastdata.conversion.plan.decide_options` made them (the format decided); ``sink``:
    see :class:`~fastdata.conversion.outputs.Target`."""
    # an existing output is refused at once, before fingerprinting the source
    prepare_output(output, src.protected(), overwrite=options.overwrite, resume=options.resume)
    spec = get_format(options.format, writable=True)
    fields, key = conversion_key(spec, src, options)
    target = Target(output, spec, key, src.fingerprint(), progress, sink)
    workers = usable_cores() if options.workers is None else options.workers
    options = dataclasses.replace(options, workers=_cap_workers(workers, len(src), explicit=options.workers))
    with ConversionLock(output):
        staging = check_no_parts(output, overwrite=options.overwrite, keep_units=options.resume)
        existing = check_existing(output, overwrite=options.overwrite, resume=options.resume)
        if options.resume and existing is not None:
            kept = keep_complete(output, existing, target, overwrite=options.overwrite, options=options,
                                 source=fields["source"])
            if kept is not None:
                if staging is not None:
                    remove_staging(staging)
                return kept
        manifest = written_once(target, fields, options, existing,
                                lambda state: _write_here(src, options, target, fields, state, staging))
        if staging is not None:
            remove_staging(staging)
        return manifest


def _write_here(src: Source, options: ConvertOptions, target: Target, fields: dict[str, Any],
                state: dict[str, Any] | None, staging: Path | None) -> dict[str, Any]:
    """Plan units, run the ones neither in the partial output nor ``staging`` (the units a failed
    Ray run finished, kept by ``--resume``) here, write (restarting as RGB when auto mode meets a
    colour image: a fresh journal)."""

    def attempt(mode: str | None) -> dict[str, Any]:
        nonlocal state
        if mode is not None:  # the restart: the partial output is gone
            journal.start(target.output, key=target.key, fields=fields, fingerprint=target.fingerprint)
            state = None
        job = plan_job(src, options, mode=mode or (state["mode"] if state else None))
        run = dataclasses.replace(options, unit_samples=resumed_units(state, options))
        units = plan_units(len(src), run.unit_samples, src.unit_bounds())
        kept = {} if staging is None else kept_units(staging, units, staged_key(target.key, target.fingerprint),
                                                     mode=job.plan.mode, gray_guess=job.gray_guess)
        computed = run_here(job, run.workers, units_to_run(units, state, kept))
        return write_units(target, job.plan, run, in_order(units, state, kept, staging, job.plan, computed),
                           source=src.describe(), state=state, keep_on_interrupt=True)

    return restarting(attempt)


def _cap_workers(requested: int, count: int, *, explicit: int | None) -> int:
    """Conversion processes: at most the cores this process may use and the sample count."""
    cores = usable_cores()
    capped = max(0, min(requested, cores, count))
    if explicit is not None and capped < explicit and explicit > 1:
        limit = "the usable cores" if capped == cores else "the sample count"
        logger.warning("--workers %d capped at %d (%s)", explicit, capped, limit)
    return capped
