"""Existing WebDataset shards (that fastdata did not write) as a conversion source.

``fastdata convert shards/ out.npy`` reads a folder of ``.tar`` shards, one ``.tar`` file, or a
brace pattern (``'data/shard-{000000..000099}.tar'``, expanded by webdataset). Members are
grouped into samples exactly as ``webdataset`` groups them: its own ``group_by_keys`` and
``base_plus_ext`` run over the shards' member list (key = the name up to the first dot of the
file name; suffixes lower-cased; ``__meta__`` files skipped; a repeated suffix in one sample is
an error). Only the member list is read up front (tar headers, with seeks over the data);
conversion workers then read each sample's bytes at its offset, in parallel.

A sample's image is its first member with an image suffix (``jpg``, ``jpeg``, ``png``, ``webp``,
...); its label is the integer text of ``cls`` (webdataset's convention), ``label`` or ``class``,
or the ``label``/``cls`` field of its ``json``. Shards without labels convert with label -1.

Every other member is kept as a field of its own, named by its suffix (docs/fields.md): ``txt``
text and ``json`` JSON stored as the bytes they were, ``npy`` arrays, ``seg.png`` (or another
suffix ending in ``seg.<image suffix>``) masks, other image suffixes images, anything else bytes;
with ``--store encoded`` (and no ``--resize``/``--center-crop``/``--reencode``) every image and
mask member is kept as the bytes it was, like the image, and so are text, JSON and bytes members;
read back, ``ds[i]`` is a dict keyed by suffix (the image under its suffix, or ``image`` when
samples mix image suffixes). A sample that lacks a member other samples have is an error
naming the sample and the member (``--skip-bad`` leaves it out).

Each sample's own ``__key__`` is kept as the text field ``__key__`` (first in the dict, as in
webdataset's samples). Where every key is unique and usable as a tar member name
(:func:`fastdata.fields.codecs.member_key_problem`) the schema says so (meta
``member_key``), and a tar output names its members by the keys, so stock webdataset reads the
same ``__key__`` back; otherwise a tar output numbers its members and keeps each key in a
``__key__.txt`` member. Keys that repeat (webdataset allows it across shards) are a
:class:`RepeatedKeysWarning`: every sample keeps its key, which then does not tell them apart.
"""

from __future__ import annotations

import json
import logging
import os
import tarfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fastdata.sources import fingerprint
from fastdata.errors import EmptySourceError, InvalidOptionError, SourceNotFoundError, fix_option
from fastdata.fields import MEMBER_KEY, FieldError, kind_named, name_problem
from fastdata.fields.codecs import member_key_problem
from fastdata.images import ReadOptions, check_pixels, exif_transpose, open_checked, oriented_size
from fastdata.sources.base import Protected
from fastdata.sources.base import Source

IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "ppm", "pgm", "bmp", "tif", "tiff")
LABEL_SUFFIXES = ("cls", "label", "class")
NO_LABEL = -1
KEY_FIELD = "__key__"
logger = logging.getLogger(__name__)


class RepeatedKeysWarning(UserWarning):
    """Samples of WebDataset shards share a ``__key__``: each keeps its key, but the key does not
    tell them apart (and a tar output numbers its members instead)."""


def is_shard_source(source: Any) -> bool:
    """Whether ``source`` names WebDataset shards: a ``.tar`` file, a brace pattern, or a folder
    holding ``.tar`` files and no sub-folders (an ImageFolder has one sub-folder per class)."""
    text = str(source)
    if "{" in text and ".." in text and text.endswith(".tar"):
        return True
    path = Path(text)
    if path.is_file():
        return path.suffix == ".tar"
    if path.is_dir():
        entries = [entry for entry in path.iterdir() if not entry.name.startswith(".")]
        return any(e.suffix == ".tar" and e.is_file() for e in entries) and not any(e.is_dir() for e in entries)
    return False


def shard_paths(source: Any) -> list[Path]:
    """The shard files of ``source``, in order (a folder's ``.tar`` files sorted by name)."""
    text = str(source)
    if "{" in text:
        from webdataset.shardlists import expand_urls

        paths = [Path(url) for url in expand_urls(text)]
    elif Path(text).is_dir():
        paths = sorted(p for p in Path(text).iterdir() if p.suffix == ".tar" and p.is_file())
    else:
        paths = [Path(text)]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise SourceNotFoundError(f"Shard {str(missing[0])!r} does not exist ({len(missing)} of {len(paths)} missing).")
    if not paths:
        raise EmptySourceError(f"{text!r} holds no .tar shards.")
    return paths


def _members(shard: Path, number: int):
    """(name, (shard number, data offset, size)) of every regular member, as webdataset's
    ``tar_file_iterator`` would yield them (but with the data's place instead of its bytes)."""
    try:
        with tarfile.open(shard, "r:") as archive:
            for member in archive:
                if not member.isreg():
                    continue
                name = member.name
                if "/" not in name and name.startswith("__") and name.endswith("__"):
                    continue
                yield {"fname": name, "data": (number, member.offset_data, member.size), "__url__": str(shard)}
    except tarfile.TarError as exc:
        raise SourceNotFoundError(f"{str(shard)!r} is not a readable tar file ({exc}).") from exc


class WebDatasetSource(Source):
    """WebDataset shards as a source (see the module docstring for how samples are formed)."""

    has_files = True

    def __init__(self, source: Any):
        from webdataset.tariterators import group_by_keys

        self.spec = str(source)
        self.shards = shard_paths(source)
        self.root = Path(os.path.commonpath([str(p.parent.resolve()) for p in self.shards]))
        stream = (item for number, shard in enumerate(self.shards) for item in _members(shard, number))
        numbers = {str(shard): number for number, shard in enumerate(self.shards)}
        keys, key_shards, images, labels, members, places = [], [], [], [], [], []
        image_suffixes: dict[str, None] = {}
        try:
            for sample in group_by_keys(stream):
                key_shards.append(numbers[sample["__url__"]])
                keys.append(f"{self.shards[key_shards[-1]].name}:{sample['__key__']}")
                suffixes = {k: v for k, v in sample.items() if not k.startswith("__")}
                first = next((s for s in IMAGE_SUFFIXES if s in suffixes), None)
                image = suffixes[first] if first is not None else None
                if first is not None:
                    image_suffixes[first] = None
                places.append({k: v for k, v in suffixes.items() if k != first})
                images.append(image if image is not None else (-1, -1, -1))
                labels.append(next((("text", suffixes[s], s) for s in LABEL_SUFFIXES if s in suffixes),
                                   ("json", suffixes["json"], "json") if "json" in suffixes else None))
                members.append(",".join(sorted(suffixes)))
        except ValueError as exc:  # webdataset's own error for a suffix repeated in one sample
            raise InvalidOptionError(f"{self.spec!r}: {exc.args[0]}. Each sample may hold one member per suffix.") from exc
        if not keys:
            raise EmptySourceError(f"{self.spec!r}: the shards hold no samples.")
        self.keys = keys  # "<shard file>:<key>", how errors name a sample
        self.key_shards = np.asarray(key_shards, dtype=np.int32)
        self.images = np.asarray(images, dtype=np.int64)  # (N, 3): shard, offset, size; -1 when none
        self.members = np.asarray(members)
        self.labels = self._read_labels(labels)
        self.class_to_idx = {}
        self._plan_fields(places, labels, list(image_suffixes))
        self.field_meta = self._key_meta()

    def _plan_fields(self, places: list[dict[str, tuple[int, int, int]]], labels: list[Any],
                     image_suffixes: list[str]) -> None:
        """Which members are fields beside the image (every suffix some sample has, in first-seen
        order), and whether the samples are the classic (image, label) (only a label member)."""
        order: dict[str, int] = {}
        for index, found in enumerate(places):
            for suffix in found:
                order.setdefault(suffix, index)
        for suffix, index in order.items():
            problem = name_problem(suffix)
            if problem is not None:  # every sample has it alike: no sample is to blame, --skip-bad cannot help
                raise InvalidOptionError(
                    f"{self.keys[index]}: member suffix {suffix!r} cannot name a field ({problem}); fastdata keeps "
                    "every member as a field named by its suffix. Rename those members in the shards.")
        label_member = next((place for place in labels if place is not None), None)
        # the label: the first of cls, label, class the first labelled sample has; other such members are fields
        self.label_suffix = label_member[2] if label_member is not None and label_member[0] == "text" else None
        self.field_suffixes = [s for s in order if s != self.label_suffix]
        self.places = places
        self.label_name = "cls" if self.label_suffix is not None else ("label" if self.labels_from_json else None)
        self.image_name = image_suffixes[0] if len(image_suffixes) == 1 else "image"
        self.layout = "dict"
        self.kinds = {s: _member_kind(s) for s in self.field_suffixes}
        self.kinds[self.image_name] = "image"
        self.kinds[KEY_FIELD] = "text"

    def source_key(self, index: int) -> str:
        """Sample ``index``'s own ``__key__``, as webdataset gives it."""
        return self.keys[index][len(self.shards[self.key_shards[index]].name) + 1:]

    def _key_meta(self) -> dict[str, dict[str, Any]]:
        """``{"__key__": {"member_key": True}}`` when every key is unique and can name tar
        members (with this source's member suffixes); else nothing, and a warning for a key that
        names more than one sample."""
        longest = max([len(suffix) + len(".json") for suffix in self.field_suffixes] + [len("tiff")])
        seen: dict[str, int] = {}
        unsafe: tuple[str, str] | None = None  # the first key that cannot name members, and why
        for index in range(len(self.keys)):
            key = self.source_key(index)
            if key in seen:
                warnings.warn(RepeatedKeysWarning(
                    f"{self.spec!r}: samples {self.keys[seen[key]]} and {self.keys[index]} have the same key {key!r}. "
                    f"Each sample keeps its own in its {KEY_FIELD!r} field, where it does not tell them apart; a tar "
                    "output names its members by number."), stacklevel=2)
                return {}
            seen[key] = index
            if unsafe is None and (problem := member_key_problem(key, longest)) is not None:
                unsafe = key, problem
        if unsafe is not None:
            logger.info("%s: key %r cannot name tar members (%s); a tar output names its members by number and keeps "
                        "each key in a %s member", self.spec, *unsafe, KEY_FIELD)
            return {}
        return {KEY_FIELD: {MEMBER_KEY: True}}

    def load_record(self, index: int, read: ReadOptions | None = None) -> dict[str, Any]:
        """The sample's key, image, label (when the shards have labels) and every other member, by suffix."""
        values: dict[str, Any] = {KEY_FIELD: self.source_key(index), self.image_name: self.load(index, read)[0]}
        if self.label_name is not None:
            values[self.label_name] = int(self.labels[index])
        found = self.places[index]
        for suffix in self.field_suffixes:
            if suffix not in found:
                raise FieldError(f"{self.keys[index]}: has no {suffix!r} member, which other samples have (it has "
                                 f"{self.members[index]}). Give every sample the same members, or re-run with "
                                 f"{fix_option('skip_bad')} to leave it out.")
            shard, offset, size = found[suffix]
            values[suffix] = _member_value(self.kinds[suffix], self._read(shard, offset, size), self.keys[index], suffix)
        return values

    def _read_labels(self, places: list[tuple[str, tuple[int, int, int]] | None]) -> np.ndarray:
        self.labels_from_json = False
        if all(place is None for place in places):
            return np.full(len(places), NO_LABEL, dtype=np.int64)
        labels = np.empty(len(places), dtype=np.int64)
        from_json = [place is not None and place[0] == "json" for place in places]
        self.labels_from_json = any(from_json)
        if all(from_json) and not self._json_labels(places):
            self.labels_from_json = False
            return np.full(len(places), NO_LABEL, dtype=np.int64)  # captions' json, no label: fields only
        for index, place in enumerate(places):
            if place is None:
                raise InvalidOptionError(
                    f"{self.keys[index]}: no label member (it has {self.members[index]}), while other samples have "
                    f"one; every sample needs one of {', '.join(LABEL_SUFFIXES)} or a json with 'label'."
                )
            kind, (shard, offset, size), _ = place
            text = self._read(shard, offset, min(size, 4096))
            labels[index] = _parse_label(kind, text, self.keys[index])
        return labels

    def _json_labels(self, places: list[Any]) -> bool:
        """Whether the samples' json members hold labels (the first one decides)."""
        _, (shard, offset, size), _ = places[0]
        try:
            document = json.loads(self._read(shard, offset, min(size, 1 << 20)))
        except ValueError:
            return False
        return isinstance(document, dict) and ("label" in document or "cls" in document)

    def _read(self, shard: int, offset: int, size: int) -> bytes:
        with open(self.shards[shard], "rb") as handle:
            handle.seek(offset)
            return handle.read(size)

    def sample_name(self, index: int) -> str:
        return self.keys[index]

    def describe(self) -> dict[str, Any]:
        return {"type": "webdataset", "shards": self.spec, "count": len(self.shards), "key_field": KEY_FIELD}

    def fingerprint(self) -> dict[str, Any]:
        names = [str(p.resolve().relative_to(self.root)) for p in self.shards]
        return fingerprint.of_files(str(self.root), names, {name.split("/", 1)[0]: 0 for name in names})

    def protected(self) -> list[Protected]:
        return [Protected(self.root, "source shards folder")]

    @property
    def field_files(self) -> frozenset[str]:
        return frozenset(s for s in self.field_suffixes if kind_named(self.kinds[s]).spatial)

    def field_bytes(self, index: int, name: str) -> bytes:
        shard, offset, size = self.places[index][name]
        return self._read(shard, offset, size)

    def file_bytes(self, index: int) -> bytes:
        shard, offset, size = self.images[index].tolist()
        if shard < 0:
            raise ValueError(f"no image member (it has {self.members[index]})")
        return self._read(shard, offset, size)

    def header(self, index: int, read: ReadOptions | None = None) -> tuple[str, int, int]:
        read = read or ReadOptions()
        import io

        with open_checked(io.BytesIO(self.file_bytes(index)), read.max_pixels) as image:
            width, height = oriented_size(image) if read.exif_transpose else image.size
            return image.mode, width, height

    def load(self, index: int, read: ReadOptions | None = None) -> tuple[Image.Image, int]:
        read = read or ReadOptions()
        import io

        image = open_checked(io.BytesIO(self.file_bytes(index)), read.max_pixels)
        with image:
            image.load()
        check_pixels(image, read.max_pixels)
        return (exif_transpose(image) if read.exif_transpose else image), int(self.labels[index])


def _member_kind(suffix: str) -> str:
    """The field kind of a member, by WebDataset's suffix conventions."""
    last = suffix.rsplit(".", 1)[-1]
    if suffix in ("txt", "text") or last == "txt":
        return "text"
    if last in ("json", "jsn"):
        return "json"
    if last == "npy":
        return "array"
    if last in LABEL_SUFFIXES or last in ("cls2", "index", "id"):
        return "int"
    if last in IMAGE_SUFFIXES:
        return "mask" if suffix.endswith(f"seg.{last}") or suffix.startswith("seg") else "image"
    return "bytes"


def _member_value(kind: str, data: bytes, key: str, suffix: str) -> Any:
    """A member's bytes as the value of its field, as its kind reads a member (text and JSON kept
    as the bytes they are: :meth:`fastdata.fields.FieldKind.value_from_member`)."""
    try:
        return kind_named(kind).value_from_member(data)
    except Exception as exc:  # noqa: BLE001 - numpy and Pillow raise many types for damaged members
        raise FieldError(f"{key}: member {suffix!r} is not a readable {kind} ({str(exc)[:120]}).") from exc


def _parse_label(kind: str, text: bytes, key: str) -> int:
    try:
        if kind == "text":
            return int(text.strip())
        document = json.loads(text)
        value = document.get("label", document.get("cls")) if isinstance(document, dict) else None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"json has no integer 'label' or 'cls' (got {value!r})")
        return value
    except ValueError as exc:
        raise InvalidOptionError(f"{key}: the label member is not an integer ({exc}).") from exc
