"""The ``hdf5`` writer: one ``.h5`` file (see the package docstring for its layout)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from fastdata.errors import InvalidOptionError, fix_option
from fastdata.formats.base import Batch, Plan, RunningDigest, Writer
from fastdata.formats.fieldfiles import FieldFileWriter
from fastdata.formats.hdf5.layout import (
    COPY_BYTES, FORMAT, LAYOUT_VERSION, MANIFEST_ATTR, MAX_ATTRIBUTE_BYTES, USERBLOCK_BYTES, field_datasets,
    hash_after_userblock, userblock,
)
from fastdata.formats.hdf5.options import HDF5Options, default_chunk_images, filter_kwargs
from fastdata.manifest import CHECKSUM_ALGORITHM, seal_manifest
from fastdata.files import unique_sibling


class ContentHash(RunningDigest):
    """Checksum of an HDF5 dataset's contents (its arrays' bytes), fed in write order."""

    def update(self, array: np.ndarray) -> None:
        if array.size == 0:  # e.g. a field of (0,) arrays: nothing to hash (and no view to cast)
            return
        super().update(memoryview(np.ascontiguousarray(array)).cast("B"))

    def describe(self, name: str) -> dict[str, Any]:
        return {"dataset": name, **self.entry()}


def write_fixed_attributes(file: h5py.File, classes: list[str]) -> None:
    """The root attributes, all of fixed size: they live in the object header and are read
    without HDF5's global heap, whose damaged object sizes can make a read spin forever. The
    ``classes`` attribute is left out when it would not fit in the header (the manifest always
    has ``class_to_idx``), and when a class has several names (the manifest has them all)."""
    file.attrs["fastdata_format"] = np.bytes_(FORMAT)
    file.attrs["layout_version"] = np.int64(LAYOUT_VERSION)
    if not all(isinstance(name, str) for name in classes):
        return
    encoded = [name.encode("utf-8") for name in classes]
    length = max((len(name) for name in encoded), default=0) or 1
    if length * len(encoded) <= MAX_ATTRIBUTE_BYTES:
        file.attrs.create("classes", np.array(encoded, dtype=f"S{length}"), dtype=h5py.string_dtype("utf-8", length))


def write_manifest(file: h5py.File, text: str) -> None:
    """The manifest as the contiguous, unfiltered uint8 dataset ``fastdata_manifest`` (its
    UTF-8 JSON), replacing one already there. Plain h5py reads it back with
    ``json.loads(file["fastdata_manifest"][()].tobytes())``."""
    if MANIFEST_ATTR in file:
        del file[MANIFEST_ATTR]
    file.create_dataset(MANIFEST_ATTR, data=np.frombuffer(text.encode("utf-8"), dtype=np.uint8))


def stored_names(plan: Plan) -> list[tuple[str, str]]:
    """Each field's datasets in an ``hdf5`` file: the image's and the label's as always, every
    other field's under ``fields/`` (:func:`~fastdata.formats.hdf5.layout.field_datasets`)."""
    schema = plan.schema
    names = [(schema.image.name, name) for name in (("images",) if plan.store == "raw" else ("blob", "offsets"))]
    if schema.label is not None:
        names.append((schema.label.name, "labels"))
    return names + [(f.name, name) for f in schema.extras for name in field_datasets(f)]


class HDF5Writer(Writer):
    """Writes one ``.h5`` file (see the module docstring for its layout)."""

    def __init__(self, path: Path, plan: Plan, options: HDF5Options | None):
        options = options or HDF5Options()
        super().__init__(path, plan, options)
        given = [f"{name}={value!r}" for name, value in vars(options).items() if value is not None]
        if plan.store == "encoded" and given:
            raise InvalidOptionError(
                f"Option {' and '.join(given)} applies to --store raw only (encoded images are already "
                f"compressed, and stored contiguous). Drop it, or use {fix_option('store', 'raw')}."
            )
        self.chunk_images = None
        if plan.store == "raw" and (options.compression or options.chunk_images):
            self.chunk_images = options.chunk_images or default_chunk_images(plan.shape, plan.count)
            if self.chunk_images * int(np.prod(plan.shape)) >= 1 << 32:
                raise InvalidOptionError(
                    f"chunk_images={self.chunk_images} makes chunks of 4 GiB or more (HDF5's limit). "
                    "Use a smaller --chunk-images."
                )
        self.count = 0
        self.labels: list[np.ndarray] = []
        self.hashes = {"labels": ContentHash(), **{name: ContentHash() for name in self._names()}}
        # temporary files beside the partial output, under names no one else uses; only the
        # ones this writer created are ever removed
        self.blob_path = unique_sibling(path, ".blob-")
        self.temporary: list[Path] = []
        self.file: h5py.File | None = None
        self.blob = None
        self.field_dir: Path | None = None
        self.field_writers: list[FieldFileWriter] = []
        # options are all checked; the engine only cleans up after a writer exists, so a failure
        # while creating the files removes them here
        try:
            self._create_files()
        except BaseException:
            self.abort()
            path.unlink(missing_ok=True)
            raise

    def _names(self) -> tuple[str, ...]:
        return ("images",) if self.plan.store == "raw" else ("blob", "offsets")

    def _create_files(self) -> None:
        self.file = h5py.File(self.path, "w", userblock_size=USERBLOCK_BYTES)
        if self.plan.extras:  # extra fields go to temporary files, copied into datasets at close
            self.field_dir = unique_sibling(self.path, ".fields-")
            self.field_dir.mkdir()
            self.temporary.append(self.field_dir)
            self.field_writers = [FieldFileWriter(self.field_dir, f, self.plan.count) for f in self.plan.extras]
        if self.plan.store == "encoded":
            self.blob = open(self.blob_path, "xb")
            self.temporary.append(self.blob_path)
            self.offsets = [np.zeros(1, dtype=np.int64)]
            self.position = 0
            return
        shape = self.plan.shape
        kwargs: dict[str, Any] = {}
        if self.chunk_images is not None:
            kwargs = dict(chunks=(self.chunk_images, *shape), maxshape=(None, *shape),
                          **filter_kwargs(self.options.compression))
        self.images = self.file.create_dataset("images", shape=(self.plan.count, *shape), dtype=np.uint8, **kwargs)
        self.pending: list[np.ndarray] = []  # chunked: images waiting for a whole chunk
        self.written = 0

    def write(self, batch: Batch) -> None:
        if not len(batch):
            return
        if self.plan.store == "raw":
            self.hashes["images"].update(batch.images)
            if self.chunk_images is None:
                self.images[self.count : self.count + len(batch)] = batch.images
            else:
                self.pending.append(batch.images)
                self._flush_chunks(final=False)
        else:
            sizes = np.fromiter((len(b) for b in batch.blobs), dtype=np.int64, count=len(batch))
            data = b"".join(batch.blobs)
            self.blob.write(data)
            self.hashes["blob"].update(np.frombuffer(data, dtype=np.uint8))
            self.offsets.append(self.position + np.cumsum(sizes))
            self.position += int(sizes.sum())
        self.labels.append(batch.labels.astype(np.int64, copy=False))
        for writer in self.field_writers:
            writer.write(batch.fields[writer.field.name])
        self.count += len(batch)

    def _flush_chunks(self, *, final: bool) -> None:
        """Write whole chunks only (each chunk compressed once); the remainder when ``final``."""
        if not self.pending:
            return
        pending = np.concatenate(self.pending) if len(self.pending) > 1 else self.pending[0]
        start = self.written
        end = start + len(pending)
        whole = (end if final else end // self.chunk_images * self.chunk_images) - start
        if whole > 0:
            self.images[start : start + whole] = pending[:whole]
            self.written = start + whole
        self.pending = [pending[whole:]] if whole < len(pending) else []

    def close(self, manifest: dict[str, Any]) -> dict[str, Any]:
        file = self.file
        if self.plan.store == "raw":
            if self.chunk_images is not None:
                self._flush_chunks(final=True)
                self.images.resize(self.count, axis=0)
            elif self.count != self.plan.count:
                file = self._compact()
        else:
            self._write_blob(file)
        labels = np.concatenate(self.labels) if self.labels else np.empty(0, dtype=np.int64)
        self.hashes["labels"].update(labels)
        file.create_dataset("labels", data=labels)
        manifest["files"] = {name: self.hashes[name].describe(name) for name in (*self._names(), "labels")}
        for writer in self.field_writers:
            for name, array in self._field_arrays(writer):
                digest = ContentHash()
                dataset = file.create_dataset(name, shape=array.shape, dtype=array.dtype)
                step = max(1, COPY_BYTES // max(array[:1].nbytes, 1))
                for start in range(0, len(array), step):
                    piece = np.ascontiguousarray(array[start:start + step])
                    dataset[start:start + len(piece)] = piece
                    digest.update(piece)
                manifest["files"][name] = digest.describe(name)
        manifest["hdf5"] = self._layout(file)
        for name, entry in manifest["files"].items():
            file[name].attrs[CHECKSUM_ALGORITHM] = np.bytes_(entry[CHECKSUM_ALGORITHM])
        write_fixed_attributes(file, self.plan.class_list)
        write_manifest(file, json.dumps(seal_manifest(manifest), ensure_ascii=False))
        file.close()
        if self.field_dir is not None:
            shutil.rmtree(self.field_dir)
        with open(self.path, "r+b") as handle:  # the whole-file checksum, in the user block
            handle.write(userblock(hash_after_userblock(handle)))
            handle.flush()
            os.fsync(handle.fileno())  # on disk before the engine renames it
        return manifest

    def _field_arrays(self, writer: FieldFileWriter) -> list[tuple[str, np.ndarray]]:
        """One extra field's finished temporary files as the arrays of its datasets
        (:func:`~fastdata.formats.hdf5.layout.field_datasets`)."""
        f = writer.field
        names = writer.close()
        if f.variable:
            data_file = self.field_dir / names[0]
            data = np.memmap(data_file, dtype=np.uint8, mode="r") if data_file.stat().st_size else np.empty(0, np.uint8)
            arrays = [data, np.load(self.field_dir / names[1], allow_pickle=False)]
        else:
            arrays = [np.load(self.field_dir / names[0], mmap_mode="r", allow_pickle=False)]
        return list(zip(field_datasets(f), arrays))

    def _write_blob(self, file: h5py.File) -> None:
        """Copy the temporary blob file into a contiguous ``blob`` dataset of its exact size."""
        self.blob.close()
        offsets = np.concatenate(self.offsets)
        self.hashes["offsets"].update(offsets)
        blob = file.create_dataset("blob", shape=(self.position,), dtype=np.uint8)
        with open(self.blob_path, "rb") as handle:
            for start in range(0, self.position, COPY_BYTES):
                piece = np.frombuffer(handle.read(COPY_BYTES), dtype=np.uint8)
                blob[start : start + len(piece)] = piece
        self.blob_path.unlink()
        file.create_dataset("offsets", data=offsets)

    def _compact(self) -> h5py.File:
        """Samples were skipped: copy the written rows into a new file (a contiguous dataset
        cannot shrink, and a smaller copy inside the same file would leave dead space)."""
        compact_path = unique_sibling(self.path, ".compact-")
        compact = h5py.File(compact_path, "w-", userblock_size=USERBLOCK_BYTES)
        self.temporary.append(compact_path)
        images = compact.create_dataset("images", shape=(self.count, *self.plan.shape), dtype=np.uint8)
        step = max(1, COPY_BYTES // int(np.prod(self.plan.shape)))
        for start in range(0, self.count, step):
            images[start : start + step] = self.images[start : min(start + step, self.count)]
        self.file.close()
        os.replace(compact_path, self.path)
        self.file = compact
        return compact

    def _layout(self, file: h5py.File) -> dict[str, Any]:
        if self.plan.store == "encoded":
            return {"encoded_layout": "blob+offsets", "blob": "contiguous"}
        images = file["images"]
        return {
            "images": "chunked" if images.chunks else "contiguous",
            "chunk_images": images.chunks[0] if images.chunks else None,
            "compression": self.options.compression,
        }

    def abort(self) -> None:
        try:
            if self.file is not None:
                self.file.close()
        finally:
            if self.blob is not None:
                self.blob.close()
            for writer in self.field_writers:
                writer.abort()
            for leftover in self.temporary:
                if leftover.is_dir():
                    shutil.rmtree(leftover, ignore_errors=True)
                elif leftover.exists():
                    leftover.unlink()
