"""The ``tar`` writer: size-bounded shards written one after another; a background thread
finishes (fsyncs and renames) each full shard while the next one is written; the index last.
Given a sink (a conversion to a URL), the same thread hands it each finished shard, which uploads
and removes it, and a shard waits for the one before it to be gone before it is finished: the
local disk holds at most two shards, the one being written and the one being uploaded."""

from __future__ import annotations

import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.formats.base import Batch, FileSink, Plan, RunningDigest, Writer
from fastdata.formats.npyfile import npy_header
from fastdata.errors import InvalidOptionError
from fastdata.fields.codecs import member_key_problem
from fastdata.fields import MEMBER_KEY
from fastdata.formats.tar.layout import (
    BLOCK, INDEX_FORMAT, INDEX_NAME, LAYOUT_VERSION, RECORD_SUFFIX, SHARD_PATTERN, TRAILER, ZEROS, member_header,
    padded,
)
from fastdata.formats.tar.index import LABEL_COLUMNS, field_columns
from fastdata.images import SNIFFED_EXTENSIONS, sniff_extension
from fastdata.manifest import CHECKSUM_ALGORITHM, describe_file, write_manifest
from fastdata.quantities import parse_bytes, parse_count


@dataclass(frozen=True)
class TarOptions:
    """Shard bounds: a shard closes before it would exceed either (a lone sample may exceed
    ``shard_bytes``, since samples are never split)."""

    shard_samples: int = field(
        default=1000, metadata={"help": "tar: most samples per shard (default 1000)", "metavar": "N"}
    )
    shard_bytes: int = field(
        default=256 * 10**6,
        metadata={"help": "tar: most bytes per shard file, e.g. 256MB, 1GiB (default 256MB)", "metavar": "SIZE"},
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "shard_samples", parse_count(self.shard_samples, flag="--shard-samples"))
        object.__setattr__(self, "shard_bytes", parse_bytes(self.shard_bytes, flag="--shard-bytes"))


def member_key_field(plan: Plan) -> Any:
    """The text field of keys the source vouches for (unique, safe as member names): a tar output
    names members by it, and it is no member of its own (stock webdataset gives it as
    ``__key__``); None when there is none."""
    return next((f for f in plan.extras if f.kind == "text" and f.meta.get(MEMBER_KEY) is True), None)


def image_extensions(plan: Plan) -> tuple[str, ...]:
    """The extensions the image member may have: ``npy`` (raw), the codec's (re-encoded), or the
    one its bytes show (:func:`~fastdata.images.sniff_extension`) for original bytes: that of the
    image field's name where it is a file suffix (a WebDataset source's ``jpg``), else any."""
    if plan.store == "raw":
        return ("npy",)
    if plan.encoding in ("png", "jpeg"):
        return ("jpg",) if plan.encoding == "jpeg" else ("png",)
    suffix = plan.schema.image.name.rsplit(".", 1)[-1].lower() if plan.schema is not None else ""
    named = {"jpeg": "jpg", "tif": "tiff"}.get(suffix, suffix)
    return (named,) if named in SNIFFED_EXTENSIONS else SNIFFED_EXTENSIONS


def stored_names(plan: Plan) -> list[tuple[str, str]]:
    """Each field's member in a ``tar`` sample (``<key>.<suffix>``): the image under each extension
    it may have, the label as ``.cls``, every other field under its member suffix
    (:meth:`fastdata.fields.Field.member_suffix`), the member-key field under none."""
    schema = plan.schema
    names = [(schema.image.name, f"<key>.{extension}") for extension in image_extensions(plan)]
    if schema.label is not None:
        names.append((schema.label.name, "<key>.cls"))
    key_field = member_key_field(plan)
    return names + [(f.name, f"<key>.{f.member_suffix()}") for f in schema.extras if f is not key_field]


class _ShardFile:
    """One shard being written under a temporary name; :meth:`finish` renames it into place."""

    def __init__(self, directory: Path, number: int, first: int, fields: tuple[str, ...] = (), keyed: bool = False,
                 labelled: bool = True):
        self.name = SHARD_PATTERN.format(number)
        self.final = directory / self.name
        self.temporary = directory / (self.name + ".partial")
        self.handle = open(self.temporary, "wb", buffering=1024 * 1024)
        self.digest = RunningDigest()  # the shard's checksum and size, kept as it is written
        self.first = first
        self.columns: dict[str, list] = {k: [] for k in (
            "label", "extension", "image_offset", "image_size", *(LABEL_COLUMNS if labelled else ()),
            *field_columns(fields), *(("key",) if keyed else ()))}

    @property
    def count(self) -> int:
        return len(self.columns["label"])

    @property
    def position(self) -> int:
        """Bytes written to the shard so far."""
        return self.digest.bytes

    def _write(self, data: bytes | memoryview) -> None:
        self.handle.write(data)
        self.digest.update(data)

    def _member(self, name: str, parts: list[bytes | memoryview], out: list[bytes | memoryview]) -> tuple[int, int]:
        size = sum(len(part) for part in parts)
        out.append(member_header(name, size))
        offset = self.position + sum(len(chunk) for chunk in out)
        out.extend(parts)
        out.append(ZEROS[: padded(size) - size])
        return offset, size

    def add(self, key: str, extension: str, parts: list[bytes | memoryview], label: int,
            extras: list[tuple[str, bytes]] = ()) -> None:
        """One sample's members: the image, ``.cls`` (samples with a label), then each extra
        field's member (``extras``: (member suffix, bytes) in field order); the index records
        ``key`` where the shard's members are named by the samples' own keys (its ``key`` column)."""
        out: list[bytes | memoryview] = []
        values = [label, extension, *self._member(f"{key}.{extension}", parts, out)]
        if LABEL_COLUMNS[0] in self.columns:
            values.extend(self._member(f"{key}.cls", [str(label).encode("ascii")], out))
        for suffix, data in extras:
            values.extend(self._member(f"{key}.{suffix}", [data], out))
        values.append(key)  # (kept only by a shard with a "key" column)
        self._write(b"".join(out))
        for name, value in zip(self.columns, values):
            self.columns[name].append(value)

    def finish(self) -> dict[str, Any]:
        self._write(TRAILER)
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        record = {"file": self.name, "count": self.count, "first": self.first, "bytes": self.position,
                  CHECKSUM_ALGORITHM: self.digest.hexdigest(), **self.columns}
        # the shard's index record, kept beside it until the index is written (for --resume)
        self.final.with_name(self.name + RECORD_SUFFIX).write_text(json.dumps(record))
        os.replace(self.temporary, self.final)
        return record

    def checkpoint(self) -> dict[str, Any]:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        return {"first": self.first, "position": self.position, "columns": self.columns}

    @classmethod
    def reopen(cls, directory: Path, number: int, state: dict[str, Any], sink: FileSink | None = None) -> "_ShardFile":
        """Continue a shard at a checkpoint: cut what came after it, re-hash what came before
        (a shard finished after the checkpoint and given to the ``sink`` is brought back first)."""
        shard = cls.__new__(cls)
        shard.name = SHARD_PATTERN.format(number)
        shard.final = directory / shard.name
        shard.temporary = directory / (shard.name + ".partial")
        if not shard.temporary.exists() and not shard.final.exists() and sink is not None:
            sink.restore(shard.final)
        if not shard.temporary.exists() and shard.final.exists():
            os.replace(shard.final, shard.temporary)  # it was finished after the checkpoint
        shard.handle = open(shard.temporary, "r+b", buffering=1024 * 1024)
        shard.handle.truncate(state["position"])
        shard.digest = RunningDigest.of_file(shard.handle)  # what came before the checkpoint: state["position"] bytes
        shard.first, shard.columns = state["first"], state["columns"]
        return shard


class TarWriter(Writer):
    """Streams samples into size-bounded shards; a background thread finishes (fsyncs and
    renames) each full shard while the next one is written, and hands it to the ``sink`` if
    there is one; the index is written last."""

    supports_resume = True
    streams_files = True

    def __init__(self, path: Path, plan: Plan, options: TarOptions | None, *, state: dict[str, Any] | None = None,
                 sink: FileSink | None = None):
        super().__init__(path, plan, options or TarOptions())
        self.sink = sink
        if state is None:
            path.mkdir(parents=True)
        self.key_width = max(9, len(str(max(plan.count - 1, 0))))
        self.npy_header = npy_header(plan.shape) if plan.store == "raw" else b""
        # a text field of keys the source vouches for (unique, safe as member names): members are
        # named by it, and it is no member of its own (stock webdataset gives it as "__key__")
        self.key_field = member_key_field(plan)
        # a .cls member holds the label: samples without one (a schema with no label field) have none
        self.labelled = plan.schema is None or plan.schema.label is not None
        self.extras = [f for f in plan.extras if f is not self.key_field]
        self.field_names = tuple(f.name for f in self.extras)
        self.field_suffixes = {f.member_suffix(): f.name for f in self.extras}
        self.longest_suffix = max([len(f.member_suffix()) for f in self.extras] + [len("tiff")])
        self.written = state["written"] if state else 0
        self.shard: _ShardFile | None = None
        self.finished: list[Future] = []
        self.queued: list[_ShardFile] = []  # shards handed to the finisher and maybe not finished yet (closed on abort)
        self.finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastdata-tar")
        if state:
            for number in range(state["shards"]):
                done: Future = Future()
                done.set_result(json.loads((path / (SHARD_PATTERN.format(number) + RECORD_SUFFIX)).read_text()))
                self.finished.append(done)
            if state["current"] is not None:
                self.shard = _ShardFile.reopen(path, state["shards"], state["current"], sink)

    @classmethod
    def resume(cls, path: Path, plan: Plan, options: TarOptions | None, state: dict[str, Any], *,
               sink: FileSink | None = None) -> "TarWriter":
        return cls(path, plan, options, state=state, sink=sink)

    def checkpoint(self) -> dict[str, Any]:
        """Finished shards are durable (their records lie beside them); the open one is fsynced."""
        for future in self.finished:
            future.result()
        current = self.shard.checkpoint() if self.shard is not None else None
        return {"written": self.written, "shards": len(self.finished), "current": current}

    def _sample_bytes(self, payload_size: int) -> int:
        return BLOCK + padded(payload_size) + (2 * BLOCK if self.labelled else 0)  # image member + .cls member

    def _shard_for(self, payload_size: int) -> _ShardFile:
        shard, options = self.shard, self.options
        if shard is not None and shard.count and (
            shard.count >= options.shard_samples
            or shard.position + self._sample_bytes(payload_size) + len(TRAILER) > options.shard_bytes
        ):
            self._finish(shard)
            shard = None
        if shard is None:
            shard = self.shard = _ShardFile(self.path, len(self.finished), self.written, self.field_names,
                                            self.key_field is not None, self.labelled)
        return shard

    def write(self, batch: Batch) -> None:
        for row in range(len(batch)):
            if self.plan.store == "raw":
                image = np.ascontiguousarray(batch.images[row])
                parts, extension = [self.npy_header, memoryview(image).cast("B")], "npy"
            else:
                blob = batch.blobs[row]
                parts, extension = [blob], sniff_extension(blob)
                if extension in self.field_suffixes:  # original bytes of another type than their name says
                    raise InvalidOptionError(
                        f"{batch.keys[row]}: its image is a .{extension} file, and field "
                        f"{self.field_suffixes[extension]!r} is stored as the member '<key>.{extension}' too. Rename "
                        "that field in the source, or convert with --reencode or to another format.")
            size = sum(len(part) for part in parts)
            extras = [(f.member_suffix(), f.member(batch.fields[f.name][row])) for f in self.extras]
            size += sum(BLOCK + padded(len(data)) for _, data in extras)
            self._shard_for(size).add(self._key(batch, row), extension, parts, int(batch.labels[row]), extras)
            self.written += 1

    def _finish(self, shard: _ShardFile) -> None:
        """Finish ``shard`` in the background (after the one before it is given to the sink, so
        at most one finished shard waits on the local disk for its upload)."""
        if self.sink is not None and self.finished:
            self.finished[-1].result()
        self.queued = [waiting for waiting in self.queued if not waiting.handle.closed] + [shard]
        self.finished.append(self.finisher.submit(self._finished, shard))

    def _finished(self, shard: _ShardFile) -> dict[str, Any]:
        record = shard.finish()
        if self.sink is not None:
            self.sink.closed(shard.final)
        return record

    def _key(self, batch: Batch, row: int) -> str:
        """The member key of ``batch``'s sample ``row``: the sample's number, zero-padded, or
        the key field's value (checked once more: a name no tar tool or webdataset would change)."""
        if self.key_field is None:
            return f"{self.written:0{self.key_width}d}"
        key = bytes(batch.fields[self.key_field.name][row]).decode("utf-8")
        problem = member_key_problem(key, self.longest_suffix)
        if problem is not None:
            raise InvalidOptionError(
                f"{batch.keys[row]}: field {self.key_field.name!r} is {key!r}, which cannot name tar members "
                f"({problem}), though the schema's meta says {MEMBER_KEY!r}. Convert from the original source.")
        return key

    def close(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if self.shard is not None:
            self._finish(self.shard)
            self.shard = None
        shards = [future.result() for future in self.finished]
        self.finisher.shutdown()
        for shard in shards:
            (self.path / (shard["file"] + RECORD_SUFFIX)).unlink()
        index = {"format": INDEX_FORMAT, "layout_version": LAYOUT_VERSION, "count": self.written,
                 "key_width": self.key_width, "shards": shards}
        with open(self.path / INDEX_NAME, "w", encoding="utf-8") as handle:
            json.dump(index, handle, separators=(",", ":"))
            handle.flush()
            os.fsync(handle.fileno())
        files = {s["file"]: {"bytes": s["bytes"], CHECKSUM_ALGORITHM: s[CHECKSUM_ALGORITHM]} for s in shards}
        files[INDEX_NAME] = describe_file(self.path / INDEX_NAME)
        manifest["files"] = files
        manifest["tar"] = {"index": INDEX_NAME, "shards": len(shards), "key_width": self.key_width,
                           "counts": [s["count"] for s in shards]}
        write_manifest(self.path, manifest)
        return manifest

    def abort(self) -> None:
        if self.shard is not None:
            self.shard.handle.close()
        self.finisher.shutdown(wait=True, cancel_futures=True)
        for shard in self.queued:  # those the finisher never started
            shard.handle.close()
