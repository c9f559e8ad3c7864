"""The staging folder ``OUTPUT.partial.units`` that parts and Ray tasks write into together, the
records of finished parts, and the lock that lets parts share an output.

* Parts of one job array (``--part I/N``) hold ``OUTPUT.partial.lock`` *shared*: they run at the
  same time without waiting for each other. A whole conversion, a Ray driver and ``fastdata merge``
  hold it *exclusively*, so none of them starts while a part runs, and no part starts while one of
  them runs. (Both are ``flock``\\ s, released by the kernel when a process dies.)
* Each unit is written under a temporary name and renamed into place (:mod:`fastdata.conversion.units`),
  so concurrent writers never see each other's half-written units; a unit finished twice (a
  retried task) keeps the first copy, which is identical.
* A finished part leaves ``part-IIII-of-NNNN.json``: the conversion key and its fields, the
  source fingerprint and the plan. The merge compares them: parts of another source, other
  options or another N are refused, and so is a part run twice.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from fastdata.sources.fingerprint import describe_changes
from fastdata.errors import InvalidOptionError, OutputExistsError, PartsError, SourceChangedError, fix_option
from fastdata.conversion.locks import ConversionLock, holder_record
from fastdata.conversion.units import staging_path

STAGING_MARK = "fastdata conversion units"
_MARK_NAME = "staging.json"
PART_PATTERN = "part-{:04d}-of-{:04d}.json"


class PartLock(ConversionLock):
    """``OUTPUT.partial.lock`` held shared by one part of a job array (see the module docstring)."""

    shared = True

    def _busy(self, holder: str) -> str:
        return (f"A whole conversion (local or Ray) or a merge is writing {str(self.output)!r} ({holder}); a --part "
                "run cannot join it. Wait for it to finish, or stop it.")

    def _describe_self(self, descriptor: int, text: bytes) -> None:
        if not text:  # parts share the file: only the first one describes itself
            os.pwrite(descriptor, json.dumps(holder_record()).encode(), 0)

    def _try_exclusive_create(self) -> bool:  # pragma: no cover - Windows
        raise InvalidOptionError("--part needs POSIX file locks (flock); it is not available on this platform.")

    def release(self) -> None:
        """Unlock, leaving the file: other parts may hold it (the next exclusive holder removes it)."""
        if self.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = None


def claim_staging(output: Path) -> Path:
    """``OUTPUT.partial.units``, created with fastdata's mark (atomically: a complete folder is
    renamed into place) when missing; refused when it exists without the mark."""
    staging = staging_path(output)
    if not staging.exists():
        temporary = staging.with_name(f"{staging.name}.tmp-{secrets.token_hex(4)}")
        temporary.mkdir()
        (temporary / _MARK_NAME).write_text(json.dumps({"mark": STAGING_MARK, "version": 1}))
        try:
            os.rename(temporary, staging)
        except OSError:  # another part created it first
            shutil.rmtree(temporary, ignore_errors=True)
    if not is_staging(staging):
        raise OutputExistsError(
            f"{str(staging)!r} exists, but fastdata has no record of writing it (no {_MARK_NAME!r} inside); it is "
            "not removed. Move it away, or choose another output path."
        )
    return staging


def is_staging(staging: Path) -> bool:
    try:
        return json.loads((staging / _MARK_NAME).read_text(encoding="utf-8")).get("mark") == STAGING_MARK
    except (OSError, ValueError, AttributeError):
        return False


def remove_staging(staging: Path) -> None:
    """Remove a staging folder of ours (callers hold the exclusive lock)."""
    if staging.is_dir() and not staging.is_symlink() and is_staging(staging):
        shutil.rmtree(staging, onerror=_vanished_ok)


def _vanished_ok(function: Any, path: str, exc_info: Any) -> None:
    """``rmtree``'s error handler: a file that went away meanwhile (a unit's temporary file renamed
    by a task that was stopping) is gone, as wanted; any other error is raised."""
    if not issubclass(exc_info[0], FileNotFoundError):
        raise exc_info[1]


def read_records(staging: Path) -> list[dict[str, Any]]:
    """The records of the finished parts, by part number."""
    records = []
    for path in sorted(staging.glob("part-*-of-*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PartsError(f"{str(path)!r} cannot be read ({exc}). Remove it and run that part again.") from exc
        records.append(record)
    return sorted(records, key=lambda r: (r.get("parts", 0), r.get("part", 0)))


def describe_part(record: dict[str, Any]) -> str:
    owner = record.get("owner") or {}
    return f"process {owner.get('pid')} on {owner.get('host')}, finished {owner.get('finished')}"


def write_record(output: Path, record: dict[str, Any]) -> Path:
    """Write a part's record; refused when the part was written already (it runs once)."""
    staging = staging_path(output)
    record["owner"] = {"pid": os.getpid(), "host": socket.gethostname(), "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    path = staging / PART_PATTERN.format(record["part"], record["parts"])
    temporary = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
    with open(temporary, "x", encoding="utf-8") as handle:
        json.dump(record, handle)
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(temporary, path)  # fails if the part's record exists: never replaces one
    except FileExistsError:
        earlier = json.loads(path.read_text(encoding="utf-8"))
        raise duplicate_error(output, earlier) from None
    finally:
        temporary.unlink()
    return path


def duplicate_error(output: Path, earlier: dict[str, Any]) -> PartsError:
    part = f"{earlier['part']}/{earlier['parts']}"
    return PartsError(
        f"Part {part} of {str(output)!r} was already written ({describe_part(earlier)}); each --part I/N runs once. "
        f"Check the job array's indices, or pass {fix_option('overwrite')} to convert part {part} again."
    )


def check_no_parts(output: Path, *, overwrite: bool, keep_units: bool = False) -> Path | None:
    """A whole conversion (its caller holds the exclusive lock) refuses an output of which some
    parts are finished; with ``overwrite`` it discards them. Units without a finished part (a Ray
    run or parts that failed, none running now) are removed, or with ``keep_units`` (a local
    ``--resume``) kept: their staging folder is returned."""
    staging = staging_path(output)
    if not (staging.exists() or staging.is_symlink()):
        return None
    if not is_staging(staging) or staging.is_symlink():
        raise OutputExistsError(
            f"{str(staging)!r} exists, but fastdata has no record of writing it (no {_MARK_NAME!r} inside); it is "
            "not removed. Move it away, or choose another output path."
        )
    records = read_records(staging)
    if overwrite or not records:  # no part finished: units of a Ray run, or of parts that failed
        if keep_units and not overwrite:
            return staging
        remove_staging(staging)
        return None
    done = ", ".join(f"{r['part']}/{r['parts']}" for r in records)
    raise OutputExistsError(
        f"Output {str(output)!r} is being converted in parts: {str(staging)!r} holds their units (finished parts: "
        f"{done}). Finish it with the remaining --part runs and 'fastdata merge {output}', or pass "
        f"{fix_option('overwrite')} to discard the parts and convert it whole."
    )


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
            f"others' ({fix_option('overwrite')}), or remove {str(staging_path(output))!r} to start over."
        )
    changes = describe_changes(other["fingerprint"], record["fingerprint"])
    if changes is not None:
        raise SourceChangedError(
            f"Parts of {str(output)!r} do not match: the source changed between part {theirs} and part {mine}: "
            f"{changes}. Convert the parts again from the unchanged source ({fix_option('overwrite')}), or remove "
            f"{str(staging_path(output))!r} to start over."
        )
