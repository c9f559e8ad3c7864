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
or the ``label``/``cls`` field of its ``json``. Shards without labels (LAION-style image-text
pairs) convert with label -1.
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fastdata.conversion import fingerprint
from fastdata.errors import EmptySourceError, InvalidOptionError, SourceNotFoundError
from fastdata.images import ReadOptions, check_pixels, exif_transpose, open_checked, oriented_size
from fastdata.conversion.outputs import Protected
from fastdata.sources.base import Source

IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "ppm", "pgm", "bmp", "tif", "tiff")
LABEL_SUFFIXES = ("cls", "label", "class")
NO_LABEL = -1


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
        keys, images, labels, members = [], [], [], []
        try:
            for sample in group_by_keys(stream):
                keys.append(f"{Path(sample['__url__']).name}:{sample['__key__']}")
                suffixes = {k: v for k, v in sample.items() if not k.startswith("__")}
                image = next((suffixes[s] for s in IMAGE_SUFFIXES if s in suffixes), None)
                images.append(image if image is not None else (-1, -1, -1))
                labels.append(next((("text", suffixes[s]) for s in LABEL_SUFFIXES if s in suffixes),
                                   ("json", suffixes["json"]) if "json" in suffixes else None))
                members.append(",".join(sorted(suffixes)))
        except ValueError as exc:  # webdataset's own error for a suffix repeated in one sample
            raise InvalidOptionError(f"{self.spec!r}: {exc.args[0]}. Each sample may hold one member per suffix.") from exc
        if not keys:
            raise EmptySourceError(f"{self.spec!r}: the shards hold no samples.")
        self.keys = keys
        self.images = np.asarray(images, dtype=np.int64)  # (N, 3): shard, offset, size; -1 when none
        self.members = np.asarray(members)
        self.labels = self._read_labels(labels)
        self.class_to_idx = {}

    def _read_labels(self, places: list[tuple[str, tuple[int, int, int]] | None]) -> np.ndarray:
        if all(place is None for place in places):
            return np.full(len(places), NO_LABEL, dtype=np.int64)
        labels = np.empty(len(places), dtype=np.int64)
        for index, place in enumerate(places):
            if place is None:
                raise InvalidOptionError(
                    f"{self.keys[index]}: no label member (it has {self.members[index]}), while other samples have "
                    f"one; every sample needs one of {', '.join(LABEL_SUFFIXES)} or a json with 'label'."
                )
            kind, (shard, offset, size) = place
            text = self._read(shard, offset, min(size, 4096))
            labels[index] = _parse_label(kind, text, self.keys[index])
        return labels

    def _read(self, shard: int, offset: int, size: int) -> bytes:
        with open(self.shards[shard], "rb") as handle:
            handle.seek(offset)
            return handle.read(size)

    def sample_name(self, index: int) -> str:
        return self.keys[index]

    def describe(self) -> dict[str, Any]:
        return {"type": "webdataset", "shards": self.spec, "count": len(self.shards)}

    def fingerprint(self) -> dict[str, Any]:
        names = [str(p.resolve().relative_to(self.root)) for p in self.shards]
        return fingerprint.of_files(str(self.root), names, {name.split("/", 1)[0]: 0 for name in names})

    def protected(self) -> list[Protected]:
        return [Protected(self.root, "source shards folder")]

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
