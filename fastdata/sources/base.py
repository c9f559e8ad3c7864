"""The :class:`Source` interface: where samples come from before conversion.

A source is picklable and loads one sample at a time by index, so conversion workers can run
it in parallel. It also says what it reads (:meth:`Source.protected`, which the output may not
touch) and how to tell whether it changed (:meth:`Source.fingerprint`, for ``--resume``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fastdata.images import ReadOptions


def class_names(dataset: Any) -> tuple[list[Any] | None, dict[str, int]]:
    """A dataset's ``classes`` and ``class_to_idx`` as it has them, as JSON can hold them: a
    class's several names (a tuple) become a list, names and keys become text (a name is text in
    every torchvision dataset but the test fakes). ``classes`` is None where the dataset has
    no list of them; ``class_to_idx`` is made from ``classes`` where the dataset has none."""
    listed = getattr(dataset, "classes", None)
    classes = None
    if isinstance(listed, (list, tuple)) and listed:
        classes = [[str(part) for part in entry] if isinstance(entry, (list, tuple)) else str(entry)
                   for entry in listed]
    mapping = getattr(dataset, "class_to_idx", None)
    if isinstance(mapping, dict) and mapping:
        return classes, {str(name): int(index) for name, index in mapping.items()}
    names = {name: index for index, entry in enumerate(classes or ())
             for name in (entry if isinstance(entry, list) else [entry])}
    return classes, names


@dataclass(frozen=True)
class Protected:
    """A path the conversion reads from: OUTPUT may not be it, be inside it (unless
    ``inside_ok``: a torchvision root may hold the output beside the dataset's files) or contain it."""

    path: Path
    what: str
    inside_ok: bool = False


class Source:
    """Base of all sources. Subclasses set the attributes below and implement ``load``.

    ``has_files`` sources (image folders, shards) hold each sample as an encoded image file:
    :meth:`file_bytes` returns it, so an encoded conversion keeps the original bytes, and errors
    say "cannot read image" rather than "cannot load sample".
    """

    keys: list[str]
    labels: np.ndarray | None  # known up front, or None when only loading tells
    class_to_idx: dict[str, int]
    classes: list[Any] | None = None
    """The class names as the source lists them, index = label, where it lists them: an entry is
    a name, or a list of names where the source gives several to one class (torchvision's
    ``ImageNet`` and ``Imagenette``: a tuple per class). None: ``class_to_idx`` numbers them."""
    has_files = False
    layout: str = "tuple"
    """How readers give a sample back: ``"tuple"`` (values in field order) or ``"dict"`` (by name)."""
    kinds: dict[str, str] = {}
    """Kind hints where a value's type does not say it (:mod:`fastdata.fields`), e.g. ``{"mask": "mask"}``
    for a PIL ``P``/``L`` image that is a mask, ``{"keypoints": "array:variable"}``."""
    structure: Any = None
    """The nesting readers give back (:class:`fastdata.fields.Schema`), when not flat."""
    schema: Any = None
    """The :class:`fastdata.fields.Schema` of the records where the source knows it (a converted
    dataset: the one its manifest holds): the conversion checks every record against it instead
    of inferring one from the first records' values."""
    field_meta: dict[str, dict[str, Any]] = {}
    """What the source knows of its fields beyond their values, added to the schema's ``meta``
    (:data:`fastdata.fields.SOURCE_META`): ``{"labels": {"class_ids": True}}`` (the field holds
    indices of ``class_to_idx``), ``{"__key__": {"member_key": True}}`` (keys usable as tar member names)."""

    def __len__(self) -> int:
        return len(self.keys)

    def sample_name(self, index: int) -> str:
        """How errors name a sample: its file where it has one, else ``sample N``."""
        return f"sample {index}"

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError

    def fingerprint(self) -> dict[str, Any]:
        """What ``--resume`` compares to tell whether the source changed (:mod:`fastdata.sources.fingerprint`)."""
        raise NotImplementedError

    def protected(self) -> list[Protected]:
        """Paths this source reads, which the output may not be, lie in, or contain."""
        return []

    def forget(self) -> None:
        """Drop what this process keeps of the samples it read (a table's current rows): called
        before a conversion pool forks, whose workers read their own."""

    def take(self, start: int, stop: int) -> "Source | None":
        """Samples ``start:stop`` as a small source of their own (index 0 is ``start``), for work
        sent to another machine; None when this source cannot be cut (it is then sent whole)."""
        return None

    def unit_bounds(self) -> list[int] | None:
        """Where the source's own pieces begin, ``[0, ..., len(self)]`` (a Parquet source's row
        groups), so that units of work never cross one (:func:`fastdata.conversion.units.plan_units`);
        None: no such pieces."""
        return None

    def file_bytes(self, index: int) -> bytes | None:
        """The sample's original encoded bytes, or None when the source has no files."""
        return None

    @property
    def field_files(self) -> frozenset[str]:
        """The extra image and mask fields whose encoded bytes the source holds as files of their
        own (a WebDataset sample's ``left.png``, ``seg.png``): with ``--store encoded`` and no
        resize they are kept as those bytes (:meth:`field_bytes`), as the image is."""
        return frozenset()

    def field_bytes(self, index: int, name: str) -> bytes:
        """The original encoded bytes of field ``name`` (one of :attr:`field_files`) of a sample."""
        raise NotImplementedError

    def header(self, index: int, read: ReadOptions | None = None) -> tuple[str, int, int]:
        """(PIL mode, width, height) of a sample, as cheaply as the source allows."""
        image, _ = self.load(index, read)
        return image.mode, image.width, image.height

    def load(self, index: int, read: ReadOptions | None = None) -> tuple[Image.Image, int]:
        """The decoded PIL image (in its own mode) and label of one sample."""
        raise NotImplementedError

    def load_record(self, index: int, read: ReadOptions | None = None) -> dict[str, Any]:
        """One sample as named values, in field order (:mod:`fastdata.fields` says which values a
        record may hold). Default: ``{"image": image, "label": label}`` from :meth:`load`, the
        classic two-field sample, stored exactly as before."""
        image, label = self.load(index, read)
        return {"image": image, "label": label}

    @property
    def is_classic(self) -> bool:
        """Whether samples are ``(image, label)`` (records come from :meth:`load`)."""
        return type(self).load_record is Source.load_record
