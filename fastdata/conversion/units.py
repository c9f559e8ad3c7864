"""Units: the deterministic pieces of work of every conversion.

A unit is a range of source indices, ``[start, stop)``, planned from the sample count and the
unit size alone (:func:`plan_units`), so the local engine, every part of a job array and every
Ray task compute the same plan without talking to each other. An engine yields each unit
finished (:class:`Finished`) to the one write loop. Parts and Ray tasks, which compute units away
from the writer, stage a unit's converted samples beside the output,
``OUTPUT.partial.units/unit-NNNNNN/``: written under a temporary name and renamed into place
when complete, so a process killed mid-unit leaves no unit that looks finished. A staged unit
holds ``data.bin`` (raw rows, or encoded files back to back), ``sizes.npy`` (encoded: each
sample's byte count), ``labels.npy`` and ``unit.json`` (its range, count, mode, skipped samples).

The output itself is written by one process (the local driver, the merge, the Ray driver): it
streams the units, in order, through the format's own writer
(:func:`fastdata.conversion.write.write_units`). That is why the output's bytes never depend on
how the work was split: skipped samples, encoded offsets and tar shard bounds (by count and by
bytes) come out exactly as in a local conversion. Which units are finished and kept, in the
partial output or staged, :mod:`fastdata.conversion.resume` says, for every engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from fastdata.formats.base import Batch, Plan

UNIT_SAMPLES = 1000
STAGING_SUFFIX = ".partial.units"
UNIT_RECORD = "unit.json"
_TEMPORARY_INFIX = ".tmp-"
TEMPORARY_INFIX = _TEMPORARY_INFIX  # a unit being written (or downloaded) is named unit-NNNNNN.tmp-XXXX
_READ_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Unit:
    """Source indices ``start:stop``, the ``number``-th unit of the plan."""

    number: int
    start: int
    stop: int

    @property
    def name(self) -> str:
        return f"unit-{self.number:06d}"

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass
class Finished:
    """A finished unit, as an engine yields it to the write loop: its converted samples as
    batches, in source order (consumed once), and the samples it left out (source index -> key
    and reason; complete once the batches are consumed)."""

    unit: Unit
    batches: Iterable[Batch]
    skipped: dict[int, dict[str, str]]


def staged_key(key: str, fingerprint: dict[str, Any]) -> str:
    """What a staged unit is written and found under: the conversion ``key`` together with the
    source's ``fingerprint``, so that a unit staged before the source changed (an image replaced
    after a failed part or Ray run) is converted again, never reused."""
    source = json.dumps([fingerprint.get("kind"), fingerprint.get("count"), fingerprint.get("digest")])
    return hashlib.blake2b(f"{key}|{source}".encode(), digest_size=16).hexdigest()


def plan_units(count: int, unit_samples: int = UNIT_SAMPLES, bounds: Sequence[int] | None = None) -> list[Unit]:
    """Consecutive units of ``unit_samples`` samples (the last may be shorter) covering ``count``.
    ``bounds`` (``0, ..., count``, rising): the source's own pieces (a Parquet source's row
    groups, :meth:`fastdata.sources.Source.unit_bounds`); no unit crosses one, and a piece longer
    than ``unit_samples`` is cut every ``unit_samples`` from its start. Without them, or with
    ``0, count``, the units are the plain ones."""
    edges = [0, count] if not bounds else [int(edge) for edge in bounds]
    if edges[0] != 0 or edges[-1] != count or any(b < a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"unit bounds must rise from 0 to {count}, got {edges[:3]}...{edges[-3:]}")
    starts = [(start, min(start + unit_samples, stop)) for first, stop in zip(edges, edges[1:])
              for start in range(first, stop, unit_samples)]
    return [Unit(number, start, stop) for number, (start, stop) in enumerate(starts)]


def part_units(units: list[Unit], part: int, parts: int) -> list[Unit]:
    """The units of part ``part`` of ``parts`` (1-based): a contiguous block, sizes differing by at most one."""
    return units[len(units) * (part - 1) // parts : len(units) * part // parts]


def staging_path(output: Path) -> Path:
    return output.with_name(output.name + STAGING_SUFFIX)


class UnitWriter:
    """Writes one unit's batches under a temporary name; :meth:`commit` renames it into place."""

    def __init__(self, staging: Path, unit: Unit, plan: Plan, key: str):
        self.unit, self.plan, self.key = unit, plan, key
        self.final = staging / unit.name
        self.temporary = staging / f"{unit.name}{_TEMPORARY_INFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self.temporary.mkdir()
        self.data = open(self.temporary / "data.bin", "wb")
        self.sizes: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []
        self.skipped: list[list[Any]] = []
        self.count = 0
        # extra fields (fastdata.fields): each field's stored bytes, data + sizes, field by field
        self.fields = {f.name: (open(self.temporary / f"field-{number}.bin", "wb"), [])
                       for number, f in enumerate(plan.extras)}

    def write(self, batch: Batch, offset: int = 0) -> None:
        """Append a batch; ``offset`` turns the batch's (slice-relative) skipped indices into source indices."""
        if batch.images is not None and len(batch):
            self.data.write(memoryview(np.ascontiguousarray(batch.images)).cast("B"))
        elif batch.blobs:
            self.data.write(b"".join(batch.blobs))
            self.sizes.append(np.fromiter((len(b) for b in batch.blobs), dtype=np.int64, count=len(batch)))
        self.labels.append(batch.labels.astype(np.int64, copy=False))
        for name, (handle, sizes) in self.fields.items():
            values = batch.fields[name]
            handle.write(b"".join(values))
            sizes.append(np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values)))
        self.skipped.extend([int(index) + offset, entry] for index, entry in batch.skipped)
        self.count += len(batch)

    def commit(self) -> dict[str, Any]:
        """Make the unit durable and visible; the unit's record. When another process finished the
        same unit first (a retried task, a part run twice), its unit is kept and this one dropped."""
        self.data.flush()
        os.fsync(self.data.fileno())
        self.data.close()
        _save(self.temporary / "labels.npy", np.concatenate(self.labels) if self.labels else np.empty(0, np.int64))
        if self.plan.store == "encoded":
            _save(self.temporary / "sizes.npy", np.concatenate(self.sizes) if self.sizes else np.empty(0, np.int64))
        for number, (handle, sizes) in enumerate(self.fields.values()):
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
            _save(self.temporary / f"field-{number}.sizes.npy", np.concatenate(sizes) if sizes else np.empty(0, np.int64))
        record = {"unit": self.unit.number, "start": self.unit.start, "stop": self.unit.stop, "count": self.count,
                  "mode": self.plan.mode, "key": self.key, "skipped": self.skipped}
        _save_json(self.temporary / UNIT_RECORD, record)
        try:
            os.rename(self.temporary, self.final)
        except OSError:  # ENOTEMPTY/EEXIST: the unit is already there
            shutil.rmtree(self.temporary, ignore_errors=True)
            existing = read_unit(self.final.parent, self.unit, self.key)
            if existing is None:
                raise
            return existing
        _sync_folder(self.final.parent)
        return record

    def abort(self) -> None:
        self.data.close()
        for handle, _ in self.fields.values():
            handle.close()
        shutil.rmtree(self.temporary, ignore_errors=True)


def write_unit(staging: Path, unit: Unit, plan: Plan, key: str, batches: Iterable[Batch], offset: int = 0) -> dict[str, Any]:
    """Write ``batches`` (the unit's converted samples, in order) as finished unit ``unit``."""
    writer = UnitWriter(staging, unit, plan, key)
    try:
        for batch in batches:
            writer.write(batch, offset)
        return writer.commit()
    except BaseException:
        writer.abort()
        raise


def read_unit(staging: Path, unit: Unit, key: str) -> dict[str, Any] | None:
    """The record of finished unit ``unit`` when it was written for conversion ``key``, else None."""
    try:
        record = json.loads((staging / unit.name / UNIT_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != key or (record.get("start"), record.get("stop")) != (
        unit.start, unit.stop
    ):
        return None
    return record


def remove_unit(staging: Path, unit: Unit) -> None:
    shutil.rmtree(staging / unit.name, ignore_errors=True)


def remove_temporaries(staging: Path) -> None:
    """Units that a killed process left half-written (never visible as finished units)."""
    for entry in staging.glob(f"unit-*{_TEMPORARY_INFIX}*"):
        shutil.rmtree(entry, ignore_errors=True)


def unit_batches(staging: Path, record: dict[str, Any], plan: Plan) -> Iterator[Batch]:
    """A finished unit's samples as batches of at most 16 MB, for the format writer (with each
    batch's extra fields, when samples have them)."""
    folder = staging / f"unit-{record['unit']:06d}"
    if plan.extras:
        yield from _with_fields(folder, _unit_batches(folder, plan), plan)
        return
    yield from _unit_batches(folder, plan)


def _with_fields(folder: Path, batches: Iterator[Batch], plan: Plan) -> Iterator[Batch]:
    """``batches`` with their extra fields read back from the unit, batch by batch."""
    readers = []
    for number, f in enumerate(plan.extras):
        sizes = np.load(folder / f"field-{number}.sizes.npy", allow_pickle=False)
        readers.append((f.name, open(folder / f"field-{number}.bin", "rb"), sizes))
    try:
        first = 0
        for batch in batches:
            fields = {}
            for name, handle, sizes in readers:
                part = sizes[first:first + len(batch)]
                block = handle.read(int(part.sum()))
                ends = np.cumsum(part)
                fields[name] = [block[int(a):int(b)] for a, b in zip(np.concatenate(([0], ends[:-1])), ends)]
            batch.fields = fields
            first += len(batch)
            yield batch
    finally:
        for _, handle, _ in readers:
            handle.close()


def _unit_batches(folder: Path, plan: Plan) -> Iterator[Batch]:
    labels = np.load(folder / "labels.npy", allow_pickle=False)
    count = len(labels)
    with open(folder / "data.bin", "rb") as data:
        if plan.store == "raw":
            row = int(np.prod(plan.shape))
            step = max(1, _READ_BYTES // max(row, 1))
            for first in range(0, count, step):
                number = min(step, count - first)
                images = np.frombuffer(data.read(number * row), dtype=np.uint8).reshape(number, *plan.shape)
                yield Batch(keys=[""] * number, labels=labels[first:first + number], images=images)
            return
        sizes = np.load(folder / "sizes.npy", allow_pickle=False)
        first = 0
        while first < count:
            last = first + 1
            total = int(sizes[first])
            while last < count and total + int(sizes[last]) <= _READ_BYTES:
                total += int(sizes[last])
                last += 1
            block = data.read(total)
            ends = np.cumsum(sizes[first:last])
            blobs = [block[int(a):int(b)] for a, b in zip(np.concatenate(([0], ends[:-1])), ends)]
            # keys are not written by any format (tar keys are the output index); only their count matters
            yield Batch(keys=[""] * len(blobs), labels=labels[first:last], blobs=blobs)
            first = last


def staged(staging: Path, records: Iterable[dict[str, Any]], plan: Plan) -> Iterator[Finished]:
    """Finished units read back from the staging folder, in the order of ``records``, for the write loop."""
    for record in records:
        yield Finished(unit_of(record), unit_batches(staging, record, plan),
                       {int(i): entry for i, entry in record["skipped"]})


def unit_of(record: dict[str, Any]) -> Unit:
    """The unit a finished unit's record describes."""
    return Unit(record["unit"], record["start"], record["stop"])


def _save(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as handle:
        np.save(handle, array, allow_pickle=False)
        handle.flush()
        os.fsync(handle.fileno())


def _save_json(path: Path, value: Any) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(value, handle)
        handle.flush()
        os.fsync(handle.fileno())


def _sync_folder(folder: Path) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
