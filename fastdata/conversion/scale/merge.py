"""``fastdata merge OUTPUT``: the output of a job-array conversion, written once every part is done.

The merge checks the parts' records (all N present, each once, one source and one set of options),
then streams the finished units, in order, through the format's writer into ``OUTPUT.partial``,
writes index and manifest last and renames it into place (:func:`write_output`, which the Ray
driver uses too). Because one writer sees every sample in order, the output is byte-identical to
a local conversion: skipped samples shift later rows and keys as they would there, encoded npy
offsets are computed from the units' sample sizes, and tar shards are cut by count and by bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from fastdata.conversion import journal
from fastdata.conversion.engine import Target, abort_writer, close_writer
from fastdata.errors import PartsError, SourceChangedError
from fastdata.conversion.fingerprint import describe_changes
from fastdata.formats import FormatSpec, get_format
from fastdata.formats.base import Plan
from fastdata.machine import usable_cores
from fastdata.conversion.options import ConvertOptions
from fastdata.conversion.locks import ConversionLock
from fastdata.conversion.outputs import check_existing, check_output_path, partial_removed_on_failure, publish
from fastdata.conversion.pipeline import with_mode
from fastdata.conversion.scale.staging import is_staging, read_records, remove_staging
from fastdata.conversion.scale.units import Unit, plan_units, read_unit, remove_temporaries, remove_unit, staging_path, unit_batches

Progress = Callable[[int, int], None]


def merge(output: str | Path, *, progress: Progress | None = None, source: Any = None) -> dict[str, Any]:
    """Write ``output`` from its parts (``fastdata convert ... --part I/N``); return its manifest.

    ``source`` is needed only when the parts were converted from a Python dataset object and, in
    auto mode, some parts met colour images while others did not (their units are converted again).
    """
    output = Path(output)
    check_output_path(output)
    staging = staging_path(output)
    if not (staging.is_dir() and is_staging(staging)):
        raise PartsError(
            f"Nothing to merge for {str(output)!r}: {str(staging)!r} does not exist. Convert the parts first: "
            f"'fastdata convert SOURCE {output} --part I/N' for I = 1..N."
        )
    with ConversionLock(output):
        records = read_records(staging)
        check_complete(output, records)
        remove_temporaries(staging)  # what killed parts left half-written (none runs now: the lock is ours)
        first = records[0]
        options = options_from_fields(first["fields"])
        spec = get_format(options.format, writable=True)
        plan = _plan(first["plan"], options)
        units = plan_units(plan.count, first["unit_samples"])
        unit_records = [_finished(staging, unit, first) for unit in units]
        plan, unit_records = settle_mode(plan, first["plan"]["gray_guess"], units, unit_records,
                                         lambda stale: _reconvert(output, first, options, stale, source))
        existing = check_existing(output, overwrite=all(r.get("overwrite") for r in records), resume=False)
        manifest = write_output(output, spec, plan, options, unit_records, key=first["key"], fields=first["fields"],
                                fingerprint=first["fingerprint"], source=first["source"], existing=existing,
                                progress=progress)
        remove_staging(staging)
    return manifest


def options_from_fields(fields: dict[str, Any]) -> ConvertOptions:
    """The conversion options recorded in a conversion key's fields."""
    return ConvertOptions.build(**{k: v for k, v in fields.items() if k not in ("layout_version", "source")})


def _plan(record: dict[str, Any], options: ConvertOptions) -> Plan:
    from fastdata.conversion.scale.parts import plan_from_record

    return plan_from_record(record, options)


def check_complete(output: Path, records: list[dict[str, Any]]) -> None:
    """Refuse parts that are missing or that do not match each other."""
    shown = str(output)
    if not records:
        raise PartsError(
            f"Nothing to merge for {shown!r}: no part has finished yet. Run 'fastdata convert SOURCE {output} "
            "--part I/N' for I = 1..N, then merge."
        )
    for other in records[1:]:
        check_agreement(output, other, records[0])
    parts = records[0]["parts"]
    numbers = [r["part"] for r in records]
    twice = sorted({n for n in numbers if numbers.count(n) > 1})
    if twice:
        raise PartsError(
            f"Cannot merge {shown!r}: part {twice[0]}/{parts} is recorded twice in {str(staging_path(output))!r} "
            "(two records of one part); each --part I/N runs once. Remove the copy that the job array did not "
            "write, then merge again."
        )
    present = set(numbers)
    missing = [i for i in range(1, parts + 1) if i not in present]
    if missing:
        names = ", ".join(f"{i}/{parts}" for i in missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        raise PartsError(
            f"Cannot merge {shown!r}: {len(missing)} of {parts} parts missing ({names}). Run them with "
            f"'fastdata convert SOURCE {output} --part I/{parts}' (same source and options), then merge again."
        )


def check_agreement(output: Path, record: dict[str, Any], other: dict[str, Any]) -> None:
    """Refuse two parts of one output that differ in source, options, N or unit size, or whose
    source changed in between."""
    mine, theirs = f"{record['part']}/{record['parts']}", f"{other['part']}/{other['parts']}"
    mine_fields = {**record["fields"], "parts": record["parts"], "unit_samples": record["unit_samples"]}
    their_fields = {**other["fields"], "parts": other["parts"], "unit_samples": other["unit_samples"]}
    names = sorted(n for n in set(mine_fields) | set(their_fields) if mine_fields.get(n) != their_fields.get(n))
    if names:
        differences = "; ".join(
            f"{name} {their_fields.get(name)!r} in part {theirs}, {mine_fields.get(name)!r} in part {mine}" for name in names
        )
        raise PartsError(
            f"Parts of {str(output)!r} do not match (different source or options): {differences}. Every part "
            f"must convert the same source with the same options and the same N; run part {mine} again with the "
            f"others' (--overwrite), or remove {str(staging_path(output))!r} to start over."
        )
    changes = describe_changes(other["fingerprint"], record["fingerprint"])
    if changes is not None:
        raise SourceChangedError(
            f"Parts of {str(output)!r} do not match: the source changed between part {theirs} and part {mine}: "
            f"{changes}. Convert the parts again from the unchanged source (--overwrite), or remove "
            f"{str(staging_path(output))!r} to start over."
        )


def _finished(staging: Path, unit: Unit, record: dict[str, Any]) -> dict[str, Any]:
    found = read_unit(staging, unit, record["key"])
    if found is None:
        raise PartsError(
            f"Cannot merge {str(staging)!r}: {unit.name} (samples {unit.start}..{unit.stop - 1}) is missing or "
            "damaged although its part finished. Run the part that holds it again with --overwrite."
        )
    return found


def settle_mode(plan: Plan, gray_guess: bool, units: list[Unit], records: list[dict[str, Any]],
                reconvert: Callable[[list[Unit]], list[dict[str, Any]]]) -> tuple[Plan, list[dict[str, Any]]]:
    """Auto mode: RGB when any unit met a colour image; grayscale units are then converted again
    (unless their bytes are the original files, which do not depend on the mode)."""
    if not gray_guess or all(r["mode"] == plan.mode for r in records):
        return plan, records
    stale = [(position, unit) for position, (unit, r) in enumerate(zip(units, records)) if r["mode"] != "RGB"]
    if plan.encoding != "original":
        for (position, _), record in zip(stale, reconvert([unit for _, unit in stale])):
            records[position] = record
    return with_mode(plan, "RGB"), records


def _reconvert(output: Path, record: dict[str, Any], options: ConvertOptions, units: list[Unit],
               source: Any) -> list[dict[str, Any]]:
    from fastdata.conversion import open_source
    from fastdata.conversion.pipeline import plan_job
    from fastdata.conversion.scale.parts import convert_here

    reopen = record.get("reopen")
    if source is None and reopen is None:
        raise PartsError(
            f"Cannot merge {str(output)!r}: some parts met colour images and others did not, so their grayscale "
            "units must be converted again as RGB, which needs the source: pass it (merge(output, source=...)), or "
            "convert the parts with --mode RGB."
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
    return convert_here(job, units, staging_path(output), record["key"], min(usable_cores(), len(units)))


def write_output(output: Path, spec: FormatSpec, plan: Plan, options: ConvertOptions, units: Iterable[dict[str, Any]], *,
                 key: str, fields: dict[str, Any], fingerprint: dict[str, Any], source: dict[str, Any],
                 existing: dict[str, Any] | None, progress: Progress | None = None) -> dict[str, Any]:
    """Stream finished units, in order, through the format's writer into ``OUTPUT.partial``; write
    the manifest and rename it into place. The caller holds the exclusive lock. ``units`` may be
    a generator that yields each unit's record once it is finished (the Ray driver writes while
    later units are still converted); an error it raises removes the partial output."""
    from fastdata.conversion import _claim_partial

    staging = staging_path(output)
    target = Target(output, spec, key, fingerprint, progress)
    _claim_partial(target, fields, options.replace(resume=False))
    journal.start(output, key=key, fields=fields, fingerprint=fingerprint)
    writer, written, skipped = None, 0, {}
    with partial_removed_on_failure(output, target.partial):
        try:
            writer = spec.writer(target.partial, plan, options.format_options)
            for record in units:
                for batch in unit_batches(staging, record, plan):
                    writer.write(batch)
                    written += len(batch)
                    target.report(len(batch), plan.count)
                skipped.update({int(index): entry for index, entry in record["skipped"]})
                target.report(len(record["skipped"]), plan.count)
            manifest = close_writer(writer, spec, plan, options, source, written, skipped, total=plan.count, key=key,
                                    fingerprint=fingerprint)
            publish(target.partial, output, replace=existing is not None)
        except BaseException:
            abort_writer(writer)
            raise
    return manifest
