"""The checks behind ``fastdata.verify``: a converted dataset against its manifest.

Every format: the manifest itself (fields, layout version, classes), the recorded checksum and
size of every data file (directory formats), files the manifest does not list, the sample
count and the label range (``0 <= label < len(classes)`` when classes are known), and so the
ids of every field the schema marks as class ids (``meta.class_ids``: VOCDetection's ``labels``). Each format
adds its own checks through its :class:`~fastdata.formats.FormatSpec` ``verify`` hook (HDF5:
per-dataset checksums and attributes; tar: the shard index and every member header).
``deep=True`` also decodes every sample through the format's reader.

Problems are collected, not raised: :func:`verify` returns a :class:`VerifyReport` listing one
message per problem, each naming the file (and sample). It raises only when ``path`` does not
exist or holds no dataset at all.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fastdata.errors import CorruptDataError, FastdataError, ManifestError, RemoteError, SourceNotFoundError
from fastdata.fields import CLASS_IDS, Field, Schema
from fastdata.fields.schema import NO_LABEL
from fastdata.formats import get_format, manifest_problems, require_manifest
from fastdata.formats.stored import single_file_problem
from fastdata.manifest import (
    CHECKSUM_ALGORITHM, MANIFEST_CHECKSUM_KEY, MANIFEST_NAME, class_count, file_checksum, manifest_checksum,
)
from fastdata.remote.dataset import RemoteOptions, locate
from fastdata.urls import is_url

_DEEP_BATCH = 64
_IDS_BATCH = 4096
_LABELS_SHOWN = 5


@dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify` found. ``ok`` is True when ``problems`` is empty."""

    path: Path | str  # a str for a URL
    format: str | None
    count: int | None
    deep: bool
    checked: tuple[str, ...]  # files (or HDF5 datasets) whose checksums were recomputed
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """One line: what was checked and the verdict."""
        count = "?" if self.count is None else f"{self.count:,}"
        what = f"{self.format or 'unknown format'}, {count} samples"
        if self.ok:
            decoded = ", every sample decodes" if self.deep else ""
            return f"{self.path}: OK ({what}; {len(self.checked)} checksums match{decoded})"
        found = len(self.problems)
        decoded = ", every sample decoded" if self.deep else ""
        return f"{self.path}: {found} problem{'s' if found > 1 else ''} ({what}; {len(self.checked)} checksums checked{decoded})"

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON values (``fastdata verify --json``)."""
        return {"path": str(self.path), "format": self.format, "ok": self.ok, "deep": self.deep,
                "count": self.count, "checksums": len(self.checked), "checked": list(self.checked),
                "problems": list(self.problems)}


def verify(path: str | os.PathLike, *, deep: bool = False,
           progress: Callable[[int, int], None] | None = None, **remote: Any) -> VerifyReport:
    """Check the dataset at ``path`` against its manifest; ``deep`` decodes every sample too, and
    calls ``progress(n, total)`` as each n more samples are decoded (as :func:`fastdata.convert`
    does while it converts). A URL's files are fetched into the cache, each checked against the
    manifest as it arrives (``remote``: ``storage_options``, ``cache_dir``, ``cache_limit``,
    ``retry`` of :class:`fastdata.remote.RemoteOptions`), then checked there."""
    if is_url(path):
        return _verify_remote(os.fspath(path), deep=deep, progress=progress, options=RemoteOptions(**remote))
    path = Path(path)
    try:
        manifest = require_manifest(path, checked=False)  # every problem is reported below
    except FastdataError as exc:
        if type(exc) in (SourceNotFoundError, ManifestError):  # no path, or no dataset at all: raised
            raise
        return VerifyReport(path, None, None, deep, (), (str(exc),))  # an unreadable manifest is a finding
    problems = manifest_problems(path, manifest)
    count = manifest.get("count") if isinstance(manifest.get("count"), int) else None
    if problems:  # the rest would be judged against a manifest that is itself wrong
        return VerifyReport(path, manifest.get("format"), count, deep, (), tuple(problems))
    recorded = manifest.get(MANIFEST_CHECKSUM_KEY)
    if recorded != manifest_checksum(manifest):  # well-formed but edited: the files are still worth checking
        origin = repr(str(path / MANIFEST_NAME) if path.is_dir() else str(path))
        problems.append(f"{origin}: the manifest's content does not match its {MANIFEST_CHECKSUM_KEY!r} "
                        f"{recorded!r} (it was edited or damaged).")
    spec = get_format(manifest["format"])
    checked: list[str] = []
    if path.is_dir():
        problems += check_files(path, manifest)
        checked += list(manifest["files"])
    else:
        checked += [f"{path.name}:{name}" for name in manifest["files"]]
    if spec.verify is not None:
        problems += spec.verify(path, manifest, deep=deep)
    problems += check_reader(path, manifest, spec, deep=deep, progress=progress)
    unique = tuple(dict.fromkeys(problems))  # a damaged file may fail two checks alike
    return VerifyReport(path, manifest["format"], count, deep, tuple(checked), unique)


# --- files --------------------------------------------------------------------------------


def check_files(directory: Path, manifest: dict[str, Any]) -> list[str]:
    """Size and checksum of every file the manifest lists; files it does not list."""
    problems = []
    files = manifest["files"]
    for name, entry in files.items():
        file = directory / name
        if file.is_symlink():
            problems.append(f"{str(file)!r} is a symbolic link (to {os.readlink(file)!r}); a dataset's files must be "
                            "stored inside its directory.")
            continue
        if not file.is_file():
            problems.append(f"{str(file)!r}: listed in the manifest but missing.")
            continue
        size, expected = file.stat().st_size, entry["bytes"]
        if size != expected:
            state = "truncated" if size < expected else "damaged: data was appended"
            problems.append(f"{str(file)!r}: {size} bytes but the manifest says {expected} ({state}).")
            continue
        digest = file_checksum(file)
        if digest != entry[CHECKSUM_ALGORITHM]:
            problems.append(
                f"{str(file)!r}: {CHECKSUM_ALGORITHM} {digest[:16]}... does not match the manifest's "
                f"{entry[CHECKSUM_ALGORITHM][:16]}... (the file is damaged)."
            )
    listed = set(files) | {MANIFEST_NAME}
    for file in sorted(directory.rglob("*")):
        if not file.is_dir() and file.relative_to(directory).as_posix() not in listed:
            problems.append(
                f"{str(file)!r}: not listed in the manifest (left by an interrupted conversion, or added "
                "later). Remove it if it is not yours."
            )
    return problems


# --- through the reader -------------------------------------------------------------------


def check_reader(path: Path, manifest: dict[str, Any], spec: Any, *, deep: bool,
                 progress: Callable[[int, int], None] | None = None) -> list[str]:
    """Open the format's reader: sample count, label range, and with ``deep`` every sample."""
    try:
        reader = spec.dataset(path, image_format="numpy")
        labels = np.asarray(reader.labels)
        by_index = spec.map_dataset(path, image_format="numpy") if spec.iterable and class_id_fields(manifest) \
            else reader  # the class-id check reads fields by index
    except FastdataError as exc:
        return [str(exc)]
    problems = []
    if len(labels) != manifest["count"]:
        problems.append(f"{str(path)!r}: {len(labels)} labels but the manifest says {manifest['count']} samples.")
    if has_label_column(manifest):
        problems += check_label_range(path, labels, class_count(manifest))
    problems += check_class_ids(path, manifest, by_index)
    if deep:
        problems += _decode_all(reader, progress or (lambda count, total: None))
    return problems


def has_label_column(manifest: dict[str, Any]) -> bool:
    """Whether the readers' label column holds class indices: always for a classic dataset; for
    one with fields only when a ``label`` (or ``cls``) field is stored there. Otherwise it is -1
    for every sample, and ``classes`` names the ids of another field (VOCDetection's ``labels``)."""
    schema = manifest.get("fields")
    if not isinstance(schema, dict):
        return True
    return any(isinstance(f, dict) and f.get("name") in ("label", "cls") and f.get("kind") == "int"
               for f in schema.get("fields", ()))


def check_label_range(path: Path, labels: np.ndarray, classes: int) -> list[str]:
    """Labels must index the manifest's classes (when it has any), or be :data:`NO_LABEL`."""
    if not classes or not len(labels):
        return []
    bad = np.flatnonzero((labels < NO_LABEL) | (labels >= classes))
    shown = ", ".join(f"sample {i} has label {int(labels[i])}" for i in bad[:_LABELS_SHOWN])
    more = f" (and {len(bad) - _LABELS_SHOWN} more)" if len(bad) > _LABELS_SHOWN else ""
    if not len(bad):
        return []
    return [f"{str(path)!r}: {shown}{more}; the manifest lists {classes} classes, so labels are 0..{classes - 1} (or -1: no label)."]


def class_id_fields(manifest: dict[str, Any]) -> list[Field]:
    """The integer fields the schema marks as holding indices of the manifest's ``classes``
    (meta ``class_ids``, recorded at conversion: VOCDetection's ``labels``), beside the label
    column :func:`has_label_column` tells of. None in a manifest without classes or fields."""
    if not manifest.get("classes") or not isinstance(manifest.get("fields"), dict):
        return []
    try:
        schema = Schema.from_json(manifest["fields"])
    except (FastdataError, TypeError, ValueError):
        return []  # a damaged schema is reported by the manifest checks and the reader
    return [f for f in schema.fields if f.meta.get(CLASS_IDS) is True and f.kind in ("int", "array")
            and f.dtype is not None and np.dtype(f.dtype).kind in "iu"]


def check_class_ids(path: Path, manifest: dict[str, Any], reader: Any) -> list[str]:
    """Every value of a :func:`class_id_fields` field must index the manifest's classes (or be
    :data:`NO_LABEL`); each field's out-of-range ids are one problem naming the samples."""
    classes = class_count(manifest)
    problems = []
    for f in class_id_fields(manifest):
        bad: list[tuple[int, int]] = []  # (sample, its first id out of range), in sample order
        try:
            for start in range(0, len(reader), _IDS_BATCH):
                indices = np.arange(start, min(start + _IDS_BATCH, len(reader)))
                stored = reader._field_values(f, indices)
                if f.variable:  # each sample's ids, one flat array, and whose they are
                    rows = [f.load(value, f"{str(path)!r} sample {sample}: ").reshape(-1)
                            for value, sample in zip(stored, indices.tolist())]
                    ids = np.concatenate(rows) if rows else np.empty(0, np.int64)
                    owner = np.repeat(indices, [len(row) for row in rows])
                else:
                    ids = np.asarray(stored).reshape(-1)
                    owner = np.repeat(indices, ids.size // max(len(indices), 1))
                outside = np.flatnonzero((ids < NO_LABEL) | (ids >= classes))
                _, first = np.unique(owner[outside], return_index=True)  # each sample's first id outside
                bad += [(int(owner[outside[at]]), int(ids[outside[at]])) for at in first]
        except FastdataError as exc:
            problems.append(str(exc))  # damaged field data: named by the reader
            continue
        if bad:
            shown = ", ".join(f"sample {sample} has {f.name!r} {value}" for sample, value in bad[:_LABELS_SHOWN])
            more = f" (and {len(bad) - _LABELS_SHOWN} more samples)" if len(bad) > _LABELS_SHOWN else ""
            problems.append(f"{str(path)!r}: {shown}{more}; field {f.name!r} holds class ids and the manifest lists "
                            f"{classes} classes, so they are 0..{classes - 1} (or -1: no class).")
    return problems


def _decode_all(reader: Any, progress: Callable[[int, int], None]) -> list[str]:
    """Decode every sample; batches first, one sample at a time where a batch fails."""
    total = len(reader)
    if not hasattr(reader, "__getitems__"):  # an iterable reader: stops at its first bad sample
        done = 0
        try:
            for done, _ in enumerate(reader, 1):
                if done % _DEEP_BATCH == 0:
                    progress(_DEEP_BATCH, total)
        except FastdataError as exc:
            return [str(exc)]
        finally:
            progress(done % _DEEP_BATCH, total)
        return []
    problems = []
    for start in range(0, total, _DEEP_BATCH):
        indices = list(range(start, min(start + _DEEP_BATCH, len(reader))))
        try:
            reader.__getitems__(indices)
        except FastdataError:
            for index in indices:
                try:
                    reader.__getitems__([index])
                except FastdataError as exc:
                    problems.append(str(exc))
        progress(len(indices), total)
    return problems


def _verify_remote(url: str, *, deep: bool, progress: Callable[[int, int], None] | None,
                   options: RemoteOptions) -> VerifyReport:
    try:
        local, files = locate(url, options, fetch=None, reader=False, check_single=single_file_problem)
    except CorruptDataError as exc:
        if isinstance(exc, RemoteError):
            raise
        return VerifyReport(url, None, None, deep, (), (str(exc),))  # a file that arrived damaged is a finding
    try:
        report = verify(local, deep=deep, progress=progress)
    finally:
        files.close()
    return dataclasses.replace(report, path=url)
