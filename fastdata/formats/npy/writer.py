"""The ``npy`` writer: appends samples to the data file; labels (and encoded offsets) go to side
files as they arrive, so a checkpoint is just file sizes and ``--resume`` can truncate back to it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.formats.base import Batch, Plan, RunningDigest, Writer
from fastdata.formats.fieldfiles import FieldFileWriter, field_files, reopen
from fastdata.formats.npyfile import npy_header
from fastdata.manifest import describe_file, write_manifest


def stored_names(plan: Plan) -> list[tuple[str, str]]:
    """Each field's files in an ``npy`` dataset: the image's and the label's as always, every
    other field's under ``fields/`` (:func:`~fastdata.formats.fieldfiles.field_files`)."""
    schema = plan.schema
    names = [(schema.image.name, name) for name in (("images.npy",) if plan.store == "raw" else ("data.bin", "offsets.npy"))]
    if schema.label is not None:
        names.append((schema.label.name, "labels.npy"))
    return names + [(f.name, name) for f in schema.extras for name in field_files(f)]


class MemmapWriter(Writer):
    """Appends samples to the data file; labels (and encoded offsets) go to side files as they
    arrive, so a checkpoint is just file sizes and ``--resume`` can truncate back to it."""

    supports_resume = True

    def __init__(self, path: Path, plan: Plan, options: Any, *, state: dict[str, Any] | None = None):
        super().__init__(path, plan, options)
        self.raw = plan.store == "raw"
        self.header = npy_header((plan.count, *plan.shape)) if self.raw else b""
        self.sample_bytes = int(np.prod(plan.shape)) if self.raw else 0
        data_name = "images.npy" if self.raw else "data.bin"
        if state is None:
            path.mkdir(parents=True)
            self.count, self.position = 0, len(self.header)
            self.data = open(path / data_name, "wb")
            self.data.write(self.header)
            # the data file's checksum, kept while writing (the main process waits on the
            # decoders anyway) instead of re-reading gigabytes at the end
            self.digest: RunningDigest | None = RunningDigest(self.header)
            self.labels = open(path / "labels.partial", "wb")
            self.offsets = None if self.raw else open(path / "offsets.partial", "wb")
            if self.offsets:
                self.offsets.write(np.zeros(1, dtype=np.int64).tobytes())
        else:  # reopen the checkpointed files, dropping whatever was written after the checkpoint
            self.count, self.position = state["count"], state["data_bytes"]
            self.digest = None  # what came before the checkpoint is re-read at the end
            self.data = reopen(path / data_name, self.position)
            self.labels = reopen(path / "labels.partial", 8 * self.count)
            self.offsets = None if self.raw else reopen(path / "offsets.partial", 8 * (self.count + 1))
        fields = (state or {}).get("fields") or {}
        self.field_writers: list[FieldFileWriter] = []
        try:
            for f in plan.extras:
                self.field_writers.append(FieldFileWriter(path, f, plan.count, state=fields.get(f.name) if state else None))
        except BaseException:  # e.g. too many open files: close what is open (the engine removes the output)
            self.abort()
            raise

    @classmethod
    def resume(cls, path: Path, plan: Plan, options: Any, state: dict[str, Any]) -> "MemmapWriter":
        return cls(path, plan, options, state=state)

    def write(self, batch: Batch) -> None:
        if not len(batch):
            return
        if self.raw:
            data = memoryview(np.ascontiguousarray(batch.images)).cast("B")
            self.position += len(batch) * self.sample_bytes
        else:
            sizes = np.fromiter((len(b) for b in batch.blobs), dtype=np.int64, count=len(batch))
            data = b"".join(batch.blobs)
            self.offsets.write((self.position + np.cumsum(sizes)).tobytes())
            self.position += int(sizes.sum())
        self.data.write(data)
        if self.digest is not None:
            self.digest.update(data)
        self.labels.write(batch.labels.astype(np.int64, copy=False).tobytes())
        for writer in self.field_writers:
            writer.write(batch.fields[writer.field.name])
        self.count += len(batch)

    def _handles(self) -> list:
        return [h for h in (self.data, self.labels, self.offsets) if h is not None]

    def checkpoint(self) -> dict[str, Any]:
        for handle in self._handles():
            handle.flush()
            os.fsync(handle.fileno())
        state = {"count": self.count, "data_bytes": self.position}
        if self.field_writers:
            state["fields"] = {writer.field.name: writer.checkpoint() for writer in self.field_writers}
        return state

    def close(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if self.raw and self.count != self.plan.count:
            # samples were skipped: the header promised more rows than were written
            self.data.seek(0)
            self.data.write(npy_header((self.count, *self.plan.shape), len(self.header)))
            self.digest = None
        self.checkpoint()
        for handle in self._handles():
            handle.close()
        names = ["images.npy" if self.raw else "data.bin"]
        side_files = ["labels.partial"] if self.raw else ["offsets.partial", "labels.partial"]
        for side in side_files:
            final = side.replace(".partial", ".npy")
            np.save(self.path / final, np.fromfile(self.path / side, dtype=np.int64))
            (self.path / side).unlink()
            names.append(final)
        for writer in self.field_writers:
            names.extend(writer.close())
        manifest["files"] = {name: describe_file(self.path / name) for name in names[1:]}
        data_file = self.path / names[0]
        manifest["files"][names[0]] = (
            self.digest.entry() if self.digest is not None else describe_file(data_file)
        )
        manifest["files"] = {name: manifest["files"][name] for name in names}  # data file first
        write_manifest(self.path, manifest)
        return manifest

    def abort(self) -> None:
        for handle in self._handles():
            handle.close()
        for writer in self.field_writers:
            writer.abort()

