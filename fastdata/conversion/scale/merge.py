"""``fastdata merge OUTPUT``: the output of a job-array conversion, written once every part is done.

The merge checks the parts' records (all N present, each once, one source and one set of options),
then streams the finished units, in order, through the format's writer into ``OUTPUT.partial``,
writes index and manifest last and renames it into place (:func:`write_output`, which the Ray
driver uses too). Because one writer sees every sample in order, the output is byte-identical to
a local conversion: skipped samples shift later rows and keys as they would there, encoded npy
offsets are computed from the units' sample sizes, and tar shards are cut by count and by bytes.
:func:`fastdata.merge` is :func:`fastdata.conversion.driver.merge`, which restarts
:func:`merge_parts` as RGB when auto mode left units of both modes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

from fastdata.sources.fingerprint import describe_changes
from fastdata.conversion.locks import ConversionLock
from fastdata.conversion.options import ConvertOptions
from fastdata.conversion.outputs import Target, check_existing, check_output_path
from fastdata.conversion.pipeline import ModeConflict, with_mode
from fastdata.conversion.plan import open_source, plan_from_record, plan_job, with_format
from fastdata.conversion.resume import in_order
from fastdata.conversion.scale.parts import convert_here
from fastdata.conversion.scale.staging import check_complete, is_staging, read_records, remove_staging
from fastdata.conversion.units import (
    Finished, Unit, plan_units, read_unit, remove_temporaries, remove_unit, staged_key, staging_path,
)
from fastdata.conversion.write import write_units, written_once
from fastdata.errors import FastdataError, PartsError, SourceChangedError, fix_option
from fastdata.formats import FormatSpec, get_format
from fastdata.formats.base import Plan
from fastdata.formats.stored import find_manifest
from fastdata.machine import usable_cores

Progress = Callable[[int, int], None]


def _nothing_to_merge(output: Path, staging: Path) -> str:
    """Why there is nothing to merge: the parts' folder is missing; ``output`` may already be the
    finished dataset (merged before, or converted in one run)."""
    try:
        manifest = find_manifest(output) if output.exists() else None
    except FastdataError:
        manifest = None  # a damaged dataset: the plain answer below
    if manifest is not None and isinstance(manifest.get("count"), int):
        return (f"Nothing to merge for {str(output)!r}: it is already a complete dataset ({manifest['count']:,} "
                f"samples) and no parts wait in {str(staging)!r}. 'fastdata verify {output}' checks it.")
    return (f"Nothing to merge for {str(output)!r}: {str(staging)!r} does not exist. Convert the parts first: "
            f"'fastdata convert SOURCE {output} --part I/N' for I = 1..N.")


def merge_parts(output: Path, *, progress: Progress | None = None, source: Any = None,
                mode: str | None = None, sink: Any = None) -> dict[str, Any]:
    """One attempt of :func:`fastdata.merge` (the driver's, which restarts it): write ``output``
    from its parts' units (a streaming writer's finished files handed to ``sink``, if given).
    When auto mode left units of both modes (some parts met colour images), :class:`ModeConflict`
    without ``mode``; with ``mode="RGB"`` the grayscale units are converted again as RGB first
    (unless their bytes are the original files, the same in either mode)."""
    check_output_path(output)
    staging = staging_path(output)
    if not (staging.is_dir() and is_staging(staging)):
        raise PartsError(_nothing_to_merge(output, staging))
    with ConversionLock(output):
        records = read_records(staging)
        check_complete(output, records)
        remove_temporaries(staging)  # what killed parts left half-written (none runs now: the lock is ours)
        first = records[0]
        options = options_from_fields(first["fields"])
        spec = get_format(options.format, writable=True)
        plan = plan_from_record(first["plan"], options)
        units = plan_units(plan.count, first["unit_samples"], first.get("unit_bounds"))
        kept = {unit.number: _finished(staging, unit, first) for unit in units}
        modes = {record["mode"] for record in kept.values()}
        if len(modes) > 1 and mode is None:
            raise ModeConflict()
        plan = with_mode(plan, mode or modes.pop())
        stale = [unit for unit in units if kept[unit.number]["mode"] != plan.mode]
        if stale and plan.encoding != "original":
            for unit, record in zip(stale, _reconvert(output, first, options, stale, source)):
                kept[unit.number] = record
        existing = check_existing(output, overwrite=all(r.get("overwrite") for r in records), resume=False)
        manifest = write_output(output, spec, plan, options, units, kept, iter(()), key=first["key"],
                                fields=first["fields"], fingerprint=first["fingerprint"], source=first["source"],
                                existing=existing, progress=progress, sink=sink)
        remove_staging(staging)
    return manifest


def options_from_fields(fields: dict[str, Any]) -> ConvertOptions:
    """The conversion options recorded in a conversion key's fields."""
    return with_format(ConvertOptions.build(**{k: v for k, v in fields.items() if k not in ("layout_version", "source")}))


def _finished(staging: Path, unit: Unit, record: dict[str, Any]) -> dict[str, Any]:
    found = read_unit(staging, unit, staged_key(record["key"], record["fingerprint"]))
    if found is None:
        raise PartsError(
            f"Cannot merge {str(staging)!r}: {unit.name} (samples {unit.start}..{unit.stop - 1}) is missing or "
            f"damaged although its part finished. Run the part that holds it again with {fix_option('overwrite')}."
        )
    return found


def _reconvert(output: Path, record: dict[str, Any], options: ConvertOptions, units: list[Unit],
               source: Any) -> list[dict[str, Any]]:
    reopen = record.get("reopen")
    if source is None and reopen is None:
        raise PartsError(
            f"Cannot merge {str(output)!r}: some parts met colour images and others did not, so their grayscale "
            "units must be converted again as RGB, which needs the source: pass it (merge(output, source=...)), or "
            f"convert the parts with {fix_option('mode', 'RGB')}."
        )
    if source is None:
        reopen = dict(reopen)
        source = reopen.pop("source")
        options = options.replace(**reopen)
    src = open_source(source, options)
    changes = describe_changes(record["fingerprint"], src.fingerprint())
    if changes is not None:
        raise SourceChangedError(f"Cannot merge {str(output)!r}: the source changed since the parts were converted: {changes}.")
    for unit in units:
        remove_unit(staging_path(output), unit)
    job = plan_job(src, options, mode="RGB")
    return convert_here(job, units, staging_path(output), staged_key(record["key"], record["fingerprint"]),
                        min(usable_cores(), len(units)))


def write_output(output: Path, spec: FormatSpec, plan: Plan, options: ConvertOptions, units: list[Unit],
                 kept: dict[int, dict[str, Any]], computed: Iterator[Finished], *, key: str, fields: dict[str, Any],
                 fingerprint: dict[str, Any], source: dict[str, Any], existing: dict[str, Any] | None,
                 progress: Progress | None = None, sink: Any = None) -> dict[str, Any]:
    """Write ``output`` from its ``units``, in order, through the one write loop
    (:func:`~fastdata.conversion.write.write_units`); the caller holds the exclusive lock.
    ``kept`` are the records of staged units, ``computed`` yields the others finished, in order
    (the Ray driver writes while later units are still converted); an error it raises removes
    the partial output. ``sink``: see :class:`~fastdata.conversion.outputs.Target`."""
    target = Target(output, spec, key, fingerprint, progress, sink)
    finished = in_order(units, None, kept, staging_path(output), plan, computed)
    return written_once(target, fields, options.replace(resume=False), existing,
                        lambda state: write_units(target, plan, options, finished, source=source))
