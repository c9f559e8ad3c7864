"""The conversion driver behind ``fastdata.convert``: source -> parallel decode/resize/encode -> format writer -> dataset.

This module decides *whether* and *where* a conversion writes (the output rules of
:mod:`fastdata.conversion.outputs`, the lock, ``--resume`` and "already complete"); :mod:`fastdata.conversion.engine`
does the writing. Output goes to ``<output>.partial`` and is renamed to ``<output>`` only when
complete, so a failed or interrupted conversion never leaves something that looks like a dataset.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, Callable

from fastdata.conversion import journal
from fastdata.conversion.engine import Target, write_job
from fastdata.errors import InvalidOptionError, OutputExistsError, SourceChangedError
from fastdata.conversion.fingerprint import describe_changes
from fastdata.formats import find_manifest, format_for_output, get_format
from fastdata.machine import usable_cores
from fastdata.conversion.options import ConvertOptions, parse_reencode, parse_size
from fastdata.conversion.locks import ConversionLock
from fastdata.conversion.outputs import (
    PARTIAL_SUFFIX, check_existing, check_output_path, partial_removed_on_failure,
    prepare_output, publish, remove_path,
)
from fastdata.conversion.pipeline import ModeConflict, plan_job
from fastdata.conversion.scale.staging import check_no_parts
from fastdata.sources import FastdataSource, Source, WebDatasetSource, is_shard_source, resolve_source

__all__ = ["PARTIAL_SUFFIX", "convert", "open_source", "parse_reencode", "parse_size", "remove_path", "run_conversion"]
logger = logging.getLogger("fastdata")


def convert(
    source: Any,
    output: str | os.PathLike,
    options: ConvertOptions | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Convert ``source`` into ``output``; return the written manifest.

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
    output = Path(output)
    overrides["format"] = format_for_output(output, overrides.get("format", options.format if options else None))
    options = ConvertOptions.build(options, **overrides)
    check_output_path(output)
    if options.engine == "ray":
        from fastdata.conversion.scale.ray_engine import convert_on_ray, import_ray

        import_ray()  # says how to install it before the source is read
        return convert_on_ray(open_source(source, options), output, options, progress)
    if options.part is not None:
        from fastdata.conversion.scale.parts import convert_part, source_argument

        return convert_part(open_source(source, options), output, options, progress,
                            source=source_argument(source, options))
    return run_conversion(open_source(source, options), output, options, progress)


def open_source(source: Any, options: ConvertOptions | None = None) -> Source:
    """What the user gave as a :class:`~fastdata.sources.Source`: a path holding a converted
    dataset is read through its format's map-style reader (as PIL images, with its classes);
    WebDataset shards that fastdata did not write (a folder of ``.tar`` files, a ``.tar``, a brace
    pattern) through :class:`~fastdata.sources.WebDatasetSource`; the rest as
    :func:`~fastdata.sources.resolve_source` says."""
    options = options or ConvertOptions()
    if isinstance(source, (str, os.PathLike)) and not str(source).startswith("torchvision:"):
        path = Path(source)
        manifest = find_manifest(path) if path.exists() else None
        if manifest is not None:
            reader = get_format(manifest["format"]).map_dataset
            return FastdataSource(path, manifest, reader(path, image_format="pil"))
        if is_shard_source(source):
            return WebDatasetSource(source)
    return resolve_source(source, **options.source_arguments)


def run_conversion(
    src: Source,
    output: Path,
    options: ConvertOptions,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Convert ``src`` into ``output`` under the output rules of :mod:`fastdata.conversion.outputs`."""
    options = options.for_output(output)
    # an existing output is refused at once, before fingerprinting the source
    prepare_output(output, src.protected(), overwrite=options.overwrite, resume=options.resume)
    spec = get_format(options.format, writable=True)
    fields = _key_fields(spec, src, options)
    target = Target(output, spec, journal.conversion_key(fields), src.fingerprint(), progress)
    workers = usable_cores() if options.workers is None else options.workers
    options = dataclasses.replace(options, workers=_cap_workers(workers, len(src), explicit=options.workers))
    with ConversionLock(output):
        check_no_parts(output, overwrite=options.overwrite)
        existing = check_existing(output, overwrite=options.overwrite, resume=options.resume)
        if options.resume and existing is not None:
            kept = _keep_complete(output, existing, target, overwrite=options.overwrite)
            if kept is not None:
                return kept
        state = _claim_partial(target, fields, options)
        with partial_removed_on_failure(output, target.partial):
            manifest = _convert_once(src, options, target, fields, state)
            publish(target.partial, output, replace=existing is not None)
    return manifest


def _convert_once(src: Source, options: ConvertOptions, target: Target, fields: dict[str, Any],
                  state: dict[str, Any] | None) -> dict[str, Any]:
    """Plan and write; when auto mode planned grayscale and met a colour image, again as RGB."""
    if state is None:
        journal.start(target.output, key=target.key, fields=fields, fingerprint=target.fingerprint)
    try:
        return write_job(plan_job(src, options, mode=state["mode"] if state else None), target, state)
    except ModeConflict:
        journal.start(target.output, key=target.key, fields=fields, fingerprint=target.fingerprint)
        return write_job(plan_job(src, options, mode="RGB"), target, None)


def _cap_workers(requested: int, count: int, *, explicit: int | None) -> int:
    """Conversion processes: at most the cores this process may use and the sample count."""
    cores = usable_cores()
    capped = max(0, min(requested, cores, count))
    if explicit is not None and capped < explicit and explicit > 1:
        limit = "the usable cores" if capped == cores else "the sample count"
        logger.warning("--workers %d capped at %d (%s)", explicit, capped, limit)
    return capped


def _key_fields(spec, src: Source, options: ConvertOptions) -> dict[str, Any]:
    """What determines the output's bytes: the journal's and the manifest's conversion key."""
    source = {key: value for key, value in src.describe().items() if key != "length"}  # the fingerprint's part
    return {"layout_version": spec.layout_version, "source": source, **options.key_fields()}


def _keep_complete(output: Path, manifest: dict[str, Any], target: Target, *, overwrite: bool) -> dict[str, Any] | None:
    """``--resume`` on a finished output: its manifest when written from the same, unchanged
    source with the same options; None to convert again (``--overwrite`` given); else a refusal."""
    if manifest.get("conversion_key") != target.key:
        if overwrite:
            return None
        if manifest.get("format") != target.spec.name:
            raise OutputExistsError(
                f"Output {str(output)!r} is a {manifest.get('format')} dataset, but this conversion writes "
                f"{target.spec.name} (from --format or the output's name); --resume does not replace it. Pass "
                f"--format {manifest.get('format')} to resume it, or --overwrite to convert again."
            )
        raise OutputExistsError(
            f"Output {str(output)!r} was converted from another source or with other options; "
            "--resume does not replace it. Pass --overwrite to convert again."
        )
    changes = describe_changes(manifest.get("source_fingerprint"), target.fingerprint)
    if changes is None:
        return manifest
    if overwrite:
        return None
    raise SourceChangedError(
        f"Output {str(output)!r} is complete, but its source changed since it was converted: {changes}. "
        "--resume keeps an output only when its source is unchanged; pass --overwrite to convert again."
    )


def _claim_partial(target: Target, fields: dict[str, Any], options: ConvertOptions) -> dict[str, Any] | None:
    """The checkpoint to resume from, or None after removing a stale partial output of ours.

    A partial output that fastdata has no journal for is refused, never removed; with
    ``--resume``, one made from other options or a changed source is refused too.
    """
    output, partial = target.output, target.partial
    if not (partial.exists() or partial.is_symlink()):
        journal.remove(output)
        return None
    record = journal.read(output)
    if record is None or partial.is_symlink():
        raise OutputExistsError(
            f"{str(partial)!r} exists, but fastdata has no record of writing it (no journal "
            f"{journal.journal_path(output).name!r}); it is not removed. Move it away, or choose another output path."
        )
    if options.resume and not options.overwrite:
        _check_resumable(output, record, target, fields)
        if target.spec.writer.supports_resume and record.get("writer") is not None:
            return record
    remove_path(partial)
    journal.remove(output)
    return None


def _check_resumable(output: Path, record: dict[str, Any], target: Target, fields: dict[str, Any]) -> None:
    shown = str(output)
    if record.get("version") != journal.JOURNAL_VERSION or "fields" not in record:
        raise OutputExistsError(
            f"Cannot resume {shown!r}: its partial output was written by another fastdata version. "
            "Convert again without --resume to start over (the partial output is replaced)."
        )
    if record["key"] != target.key:
        raise InvalidOptionError(
            f"Cannot resume {shown!r}: its partial conversion was started with {_field_changes(record['fields'], fields)}. "
            "Resume with the same source and options, or convert without --resume to start over."
        )
    changes = describe_changes(record.get("source_fingerprint"), target.fingerprint)
    if changes is not None:
        raise SourceChangedError(
            f"Cannot resume {shown!r}: the source changed since the conversion began: {changes}. Resuming "
            "would mix samples and labels of both. Convert without --resume (--overwrite if the output "
            "exists) to start over."
        )


def _field_changes(before: dict[str, Any], now: dict[str, Any]) -> str:
    names = sorted(name for name in set(before) | set(now) if before.get(name) != now.get(name))
    if "source" in names:
        return f"another source ({before.get('source')!r}, now {now.get('source')!r})"
    return "other options (" + ", ".join(f"{name} {before.get(name)!r}, now {now.get(name)!r}" for name in names) + ")"
