"""Resume: what a conversion keeps of an earlier run of itself, the same way for every engine.

Every conversion is planned as the same deterministic units (:func:`~fastdata.conversion.units.plan_units`:
ranges of source indices, from the sample count and ``unit_samples`` alone, and a Parquet source's
row groups). A unit, once
finished, is kept in one of two places, and a resumed run computes only the units in neither:

* **in the partial output**: the write loop (:func:`fastdata.conversion.write.write_units`, which
  every engine goes through) records in the journal, at a unit boundary, how many leading units
  the partial output holds (``next_unit``) with the writer's checkpoint. ``--resume`` reopens the
  partial output there (:func:`claim_partial`: a resumable writer, same key and fingerprint). A
  local conversion keeps its units this way only, so no unit is written to disk twice.
* **staged** in ``OUTPUT.partial.units`` (:mod:`~fastdata.conversion.units`), by engines
  whose units are computed elsewhere than where the output is written (``--part I/N``, Ray
  tasks): a unit finished for the same conversion key in the planned mode is reused by any later
  run (:func:`kept_units`).

:func:`units_to_run` says which units an engine computes, :func:`in_order` gives the write loop
every unit after the checkpoint in order, kept or computed. A finished output is kept whole when
``--resume`` finds it written from the same, unchanged source with the same options
(:func:`keep_complete`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterator

from fastdata.conversion import journal
from fastdata.sources.fingerprint import describe_changes
from fastdata.conversion.options import ConvertOptions
from fastdata.files import remove_path
from fastdata.conversion.outputs import Target
from fastdata.conversion.pipeline import ModeConflict
from fastdata.conversion.units import Finished, Unit, read_unit, remove_unit, staged
from fastdata.formats.base import Plan
from fastdata.errors import InvalidOptionError, OutputExistsError, SourceChangedError, fix_option

logger = logging.getLogger("fastdata")


def keep_complete(output: Path, manifest: dict[str, Any], target: Target, *, overwrite: bool,
                  options: ConvertOptions | None = None, source: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """``--resume`` on a finished output: its manifest when written from the same, unchanged
    source with the same options; None to convert again (``--overwrite`` given); else a refusal
    (naming what differs from the manifest's ``source``, ``store`` and ``options`` when
    ``options`` and ``source``, this conversion's key fields' source, are given)."""
    if manifest.get("conversion_key") != target.key:
        if overwrite:
            return None
        if manifest.get("format") != target.spec.name:
            raise OutputExistsError(
                f"Output {str(output)!r} is a {manifest.get('format')} dataset, but this conversion writes "
                f"{target.spec.name} (from --format or the output's name); --resume does not replace it. Pass "
                f"{fix_option('format', manifest.get('format'))} to resume it, or {fix_option('overwrite')} to convert again."
            )
        differs = "from another source or with other options"
        if options is not None and source is not None:
            before = {"source": {k: v for k, v in (manifest.get("source") or {}).items() if k != "length"},
                      "store": manifest.get("store"), **(manifest.get("options") or {})}
            now = {"source": source, "store": options.store, **options.describe()}
            if any(before.get(name) != now.get(name) for name in set(before) | set(now)):
                differs = field_changes(before, now).replace("another source", "from another source", 1)
                differs = differs if differs.startswith("from") else "with " + differs
        raise OutputExistsError(
            f"Output {str(output)!r} was converted {differs}; "
            f"--resume does not replace it. Pass {fix_option('overwrite')} to convert again."
        )
    changes = describe_changes(manifest.get("source_fingerprint"), target.fingerprint)
    if changes is None:
        return manifest
    if overwrite:
        return None
    raise SourceChangedError(
        f"Output {str(output)!r} is complete, but its source changed since it was converted: {changes}. "
        f"--resume keeps an output only when its source is unchanged; pass {fix_option('overwrite')} to convert again."
    )


def claim_partial(target: Target, fields: dict[str, Any], options: ConvertOptions) -> dict[str, Any] | None:
    """The checkpoint to resume from, or None after removing a stale partial output of ours.

    A partial output that fastdata has no journal for is refused, never removed; with
    ``--resume``, one made from other options or a changed source is refused too.
    """
    output, partial = target.output, target.partial
    if not (partial.exists() or partial.is_symlink()):
        journal.remove(output)
        if options.resume:
            logger.warning("--resume: %r has no partial output to continue; converting from the start", str(output))
        return None
    record = journal.read(output)
    if record is None or partial.is_symlink():
        raise OutputExistsError(
            f"{str(partial)!r} exists, but fastdata has no record of writing it (no journal "
            f"{journal.journal_path(output).name!r}); it is not removed. Move it away, or choose another output path."
        )
    if options.resume and not options.overwrite:
        check_resumable(output, record, target, fields)
        if target.spec.writer.supports_resume and record.get("writer") is not None:
            logger.warning("--resume: continuing %r from its last checkpoint (%s samples already in %r)",
                           str(output), f"{record['next_index']:,}", str(partial))
            return record
        why = "holds no checkpoint yet" if target.spec.writer.supports_resume else \
            f"cannot be continued ({target.spec.name} cannot resume)"
        logger.warning("--resume: the partial output of %r %s; converting from the start", str(output), why)
    remove_path(partial)
    journal.remove(output)
    return None


def check_resumable(output: Path, record: dict[str, Any], target: Target, fields: dict[str, Any]) -> None:
    """Refuse to resume a partial output of another fastdata, other options or a changed source."""
    shown = str(output)
    if record.get("version") != journal.JOURNAL_VERSION or "fields" not in record:
        raise OutputExistsError(
            f"Cannot resume {shown!r}: its partial output was written by another fastdata version. "
            f"Convert again without {fix_option('resume')} to start over (the partial output is replaced)."
        )
    if record["key"] != target.key:
        raise InvalidOptionError(
            f"Cannot resume {shown!r}: its partial conversion was started with {field_changes(record['fields'], fields)}. "
            f"Resume with the same source and options, or convert without {fix_option('resume')} to start over."
        )
    changes = describe_changes(record.get("source_fingerprint"), target.fingerprint)
    if changes is not None:
        raise SourceChangedError(
            f"Cannot resume {shown!r}: the source changed since the conversion began: {changes}. Resuming "
            f"would mix samples and labels of both. Convert without {fix_option('resume')} to start over, with "
            f"{fix_option('overwrite')} if the output exists."
        )


def field_changes(before: dict[str, Any], now: dict[str, Any]) -> str:
    """How two conversions' key fields differ, in words."""
    names = sorted(name for name in set(before) | set(now) if before.get(name) != now.get(name))
    if "source" in names:
        return f"another source ({before.get('source')!r}, now {now.get('source')!r})"
    return "other options (" + ", ".join(f"{name} {before.get(name)!r}, now {now.get(name)!r}" for name in names) + ")"


def kept_units(staging: Path, units: list[Unit], key: str, *, mode: str, gray_guess: bool) -> dict[int, dict[str, Any]]:
    """The staged records of ``units`` finished for this conversion (``key``) in ``mode``, by unit
    number; a staged copy in another mode or for other options is removed. While auto mode guesses
    grayscale, a unit staged as RGB met a colour image: :class:`ModeConflict` (the driver restarts
    as RGB, and that unit is kept then)."""
    kept: dict[int, dict[str, Any]] = {}
    for unit in units:
        record = read_unit(staging, unit, key)
        if record is not None and record["mode"] == mode:
            kept[unit.number] = record
        elif record is not None and gray_guess and record["mode"] == "RGB":
            raise ModeConflict()
        else:
            remove_unit(staging, unit)
    return kept


def units_to_run(units: list[Unit], state: dict[str, Any] | None, kept: dict[int, dict[str, Any]]) -> list[Unit]:
    """The units an engine computes: those after the journal's checkpoint ``state`` (the partial
    output holds the ones before it) that are not ``kept`` (staged)."""
    done = state["next_unit"] if state else 0
    return [unit for unit in units[done:] if unit.number not in kept]


def in_order(units: list[Unit], state: dict[str, Any] | None, kept: dict[int, dict[str, Any]], staging: Path | None,
             plan: Plan, computed: Iterator[Finished]) -> Iterator[Finished]:
    """Every unit after the checkpoint ``state``, in order, for the write loop: kept ones read back
    from ``staging``, the others from ``computed`` (an engine's finished :func:`units_to_run`, in order)."""
    done = state["next_unit"] if state else 0
    try:
        for unit in units[done:]:
            if unit.number in kept:
                yield from staged(staging, [kept[unit.number]], plan)
            else:
                yield next(computed)
    finally:
        close = getattr(computed, "close", None)
        if close is not None:  # stop the engine's pool or tasks now, not when collected
            close()


def resumed_units(state: dict[str, Any] | None, options: ConvertOptions) -> int:
    """The unit size a run plans with: the journal's when it resumes one (its ``next_unit`` counts
    units of that size), else ``options.unit_samples``."""
    return state.get("unit_samples", options.unit_samples) if state else options.unit_samples
