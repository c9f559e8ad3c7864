"""Resume: what a conversion keeps of an earlier run of itself.

A finished output is kept when ``--resume`` finds it written from the same, unchanged source with
the same options (:func:`keep_complete`). A partial output is ours only when its journal says so
(:func:`claim_partial`): it is then reopened at its last checkpoint (``--resume``, a resumable
writer, same key and fingerprint) or removed. Parts and Ray keep their finished units the same
way, by conversion key (:func:`fastdata.conversion.scale.units.reusable_units`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastdata.conversion import journal
from fastdata.conversion.fingerprint import describe_changes
from fastdata.conversion.options import ConvertOptions
from fastdata.conversion.files import remove_path
from fastdata.conversion.outputs import Target
from fastdata.errors import InvalidOptionError, OutputExistsError, SourceChangedError


def keep_complete(output: Path, manifest: dict[str, Any], target: Target, *, overwrite: bool) -> dict[str, Any] | None:
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


def claim_partial(target: Target, fields: dict[str, Any], options: ConvertOptions) -> dict[str, Any] | None:
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
        check_resumable(output, record, target, fields)
        if target.spec.writer.supports_resume and record.get("writer") is not None:
            return record
    remove_path(partial)
    journal.remove(output)
    return None


def check_resumable(output: Path, record: dict[str, Any], target: Target, fields: dict[str, Any]) -> None:
    """Refuse to resume a partial output of another fastdata, other options or a changed source."""
    shown = str(output)
    if record.get("version") != journal.JOURNAL_VERSION or "fields" not in record:
        raise OutputExistsError(
            f"Cannot resume {shown!r}: its partial output was written by another fastdata version. "
            "Convert again without --resume to start over (the partial output is replaced)."
        )
    if record["key"] != target.key:
        raise InvalidOptionError(
            f"Cannot resume {shown!r}: its partial conversion was started with {field_changes(record['fields'], fields)}. "
            "Resume with the same source and options, or convert without --resume to start over."
        )
    changes = describe_changes(record.get("source_fingerprint"), target.fingerprint)
    if changes is not None:
        raise SourceChangedError(
            f"Cannot resume {shown!r}: the source changed since the conversion began: {changes}. Resuming "
            "would mix samples and labels of both. Convert without --resume (--overwrite if the output "
            "exists) to start over."
        )


def field_changes(before: dict[str, Any], now: dict[str, Any]) -> str:
    """How two conversions' key fields differ, in words."""
    names = sorted(name for name in set(before) | set(now) if before.get(name) != now.get(name))
    if "source" in names:
        return f"another source ({before.get('source')!r}, now {now.get('source')!r})"
    return "other options (" + ", ".join(f"{name} {before.get(name)!r}, now {now.get(name)!r}" for name in names) + ")"
