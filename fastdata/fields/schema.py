"""Named fields: what a sample is made of beyond ``(image, label)`` (docs/fields.md).

A sample is a record of named values. Each value has a *kind* that decides how it is stored,
batched and checked:

=============  =====================================================  ===========================
kind           values                                                 stored as
=============  =====================================================  ===========================
``image``      PIL image, ``tv_tensors.Image``                        the format's image storage
``mask``       ``tv_tensors.Mask``, a PIL image hinted ``"mask"``     lossless (raw uint8 or PNG)
``int``        int, numpy integer, 0-d integer tensor, bool           int64 (bool: bool) scalar
``float``      float, numpy floating, 0-d float tensor                float64/float32 scalar
``array``      ndarray / tensor (dtype kept), ``BoundingBoxes``       fixed shape, or a variable
                                                                      first dimension
``text``       str                                                    UTF-8
``text_list``  list of str (captions)                                 JSON (UTF-8)
``json``       other plain data (dict / list of JSON values)          JSON (UTF-8)
``bytes``      bytes                                                  as they are
=============  =====================================================  ===========================

Nothing is pickled: any other Python object is an error naming its type.
:func:`fastdata.fields.values.infer` makes a :class:`Schema` from the first samples' values;
:func:`fastdata.fields.values.check_record` refuses a later sample that does not fit (naming the sample, the field and what differs), never casting silently.
``None`` is the empty value of a variable field (a COCO image with no boxes: zero boxes).

How a value becomes bytes is :mod:`fastdata.fields.codecs` (``Field.store`` / ``load`` /
``member`` / ``from_member`` call it); how Python values become fields (inference, checking a
later sample, flattening a nested item) is :mod:`fastdata.fields.values`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field as dataclass_field
from typing import Any

import numpy as np
from fastdata.fields import codecs as fieldcodecs
from fastdata.errors import BadSampleError, InvalidOptionError

KINDS = ("image", "mask", "int", "float", "array", "text", "text_list", "json", "bytes")
SPATIAL = ("image", "mask")
LAYOUTS = ("tuple", "dict")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
ARRAY_DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                 "float16", "float32", "float64")
VARIABLE = "variable"  # the kinds hint suffix "array:variable": a variable first dimension
RAGGED = "ragged"  # "array:ragged": every dimension may vary (the number of dimensions may not)


# ``meta`` entries a source gives a field (``Source.field_meta``), kept in the manifest:
CLASS_IDS = "class_ids"  # True: the field's integers are indices into the manifest's ``classes`` (verify checks them)
MEMBER_KEY = "member_key"  # True: a text field of keys, unique and safe as tar member names (the tar writer names members by them)
SOURCE_META = (CLASS_IDS, MEMBER_KEY)


class FieldError(BadSampleError):
    """A sample's value does not fit its field (the message names the sample and the field)."""


# --- the schema -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """One named field of a sample.

    ``dtype``: the numpy dtype name of ``int``/``float``/``array`` values (``"uint8"`` for raw
    images and masks). ``shape``: the shape of one value, ``None`` as the first entry for a
    variable first dimension (``(None, 4)``: boxes); ``()`` for scalars; ``None`` where a value
    has no array shape (text, JSON, bytes, encoded images). ``encoding``: how images and masks
    are stored (``raw``, ``png``, ``jpeg``, ``original``). ``mode``: an image's or mask's PIL
    mode. ``meta``: what a reader needs to give the value back as it was, e.g.
    ``{"tv_tensor": "BoundingBoxes", "format": "XYXY", "canvas_size_of": "image"}`` or a mask's
    ``{"palette": [...]}``.
    """

    name: str
    kind: str
    dtype: str | None = None
    shape: tuple | None = None
    encoding: str | None = None
    mode: str | None = None
    meta: dict = dataclass_field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise InvalidOptionError(
                f"Invalid field name {self.name!r}: use letters, digits, '_', '-' and '.' (up to 64, not starting "
                "with '.' or '-')."
            )
        if self.kind not in KINDS:
            raise InvalidOptionError(f"Field {self.name!r}: unknown kind {self.kind!r}. Kinds: {', '.join(KINDS)}.")
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(None if s is None else int(s) for s in self.shape))

    @property
    def variable(self) -> bool:
        """Stored as data + offsets (not one fixed-size row per sample)."""
        if self.kind in ("int", "float"):
            return False
        if self.kind in ("array", "image", "mask") and self.shape is not None:
            return any(s is None for s in self.shape)
        return True

    @property
    def row_bytes(self) -> int:
        """Bytes of one fixed-shape value (or of one row of a variable array's first dimension)."""
        shape = self.shape[1:] if self.variable else self.shape
        return int(np.dtype(self.dtype).itemsize * math.prod(shape or ()))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        for key in ("dtype", "encoding", "mode"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.shape is not None:
            out["shape"] = list(self.shape)
        out["variable"] = self.variable
        if self.meta:
            out["meta"] = self.meta
        return out

    @classmethod
    def from_json(cls, value: Any) -> "Field":
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            raise InvalidOptionError(f"a field must be an object with a name, got {str(value)[:60]!r}")
        shape = value.get("shape")
        return cls(name=value["name"], kind=value.get("kind"), dtype=value.get("dtype"),
                   shape=tuple(shape) if isinstance(shape, list) else None, encoding=value.get("encoding"),
                   mode=value.get("mode"), meta=dict(value.get("meta") or {}))

    # --- stored bytes and tar members: fastdata.fields.codecs ----------------------------------

    def store(self, value: Any) -> bytes:
        """A checked value (non-image kinds) as its stored bytes."""
        return fieldcodecs.store(self, value)

    def load(self, data: bytes | memoryview | np.ndarray, where: str = "") -> Any:
        """Stored bytes (or, for fixed fields, the stored row) back as the value a reader gives;
        damaged bytes are a CorruptDataError naming ``where`` and the field."""
        return fieldcodecs.load(self, data, where)

    @property
    def extension(self) -> str:
        """The extension WebDataset's default decoders read this field's member with."""
        return fieldcodecs.extension(self)

    def member_suffix(self, extension: str | None = None) -> str:
        """The member name after ``<key>.`` (``boxes.npy``, ``txt``, ``seg.png``)."""
        return fieldcodecs.member_suffix(self, extension)

    def member(self, stored: bytes) -> bytes:
        """Stored bytes as the member WebDataset's default decoders read."""
        return fieldcodecs.member(self, stored)

    def from_member(self, data: bytes | memoryview, where: str = "") -> bytes | memoryview:
        """A member's bytes (or a view of them) back as stored bytes."""
        return fieldcodecs.from_member(self, data, where)


@dataclass(frozen=True)
class Schema:
    """The fields of every sample, in order, and how readers give a sample back: ``layout``
    ``"tuple"`` (values in field order) or ``"dict"`` (keyed by name); ``structure`` the nesting
    when the source returned one, e.g. ``["image", {"boxes": "boxes", "labels": "labels"}]`` for
    ``(image, {"boxes": ..., "labels": ...})``."""

    fields: tuple[Field, ...]
    layout: str = "tuple"
    structure: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))
        if self.layout not in LAYOUTS:
            raise InvalidOptionError(f"Unknown layout {self.layout!r}. Allowed: 'tuple', 'dict'.")
        names = [f.name for f in self.fields]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate:
            raise InvalidOptionError(f"Field {duplicate!r} is named twice; field names must differ.")
        if self.structure is None:
            object.__setattr__(self, "structure", list(names) if self.layout == "tuple" else {n: n for n in names})

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def image(self) -> Field | None:
        """The first image field: stored in the format's image storage (``images.npy``, ...)."""
        return next((f for f in self.fields if f.kind == "image"), None)

    @property
    def label(self) -> Field | None:
        """The int field kept in the format's label storage (``labels.npy``, ``.cls``): the one
        named ``label`` (or ``cls``, WebDataset's name)."""
        return next((f for f in self.fields if f.name in ("label", "cls") and f.kind == "int" and f.dtype == "int64"),
                    None)

    @property
    def extras(self) -> list[Field]:
        """The fields stored beside the image and the label (``fields/<name>``)."""
        image, label = self.image, self.label
        return [f for f in self.fields if f is not image and f is not label]

    @property
    def is_classic(self) -> bool:
        """Two fields, ``(image, label)``: stored exactly as fastdata always stored them."""
        return (self.layout == "tuple" and self.names == ["image", "label"] and self.fields[0].kind == "image"
                and self.label is not None and self.structure == ["image", "label"])

    def with_meta(self, meta: dict[str, dict[str, Any]]) -> "Schema":
        """This schema with ``meta`` (field name -> entries) added to the named fields' ``meta``
        (what a source knows of a field beyond its values, see :data:`SOURCE_META`); names that
        are no field here are left out."""
        fields = tuple(Field(f.name, f.kind, f.dtype, f.shape, f.encoding, f.mode, {**f.meta, **meta[f.name]})
                       if meta.get(f.name) else f for f in self.fields)
        return Schema(fields, self.layout, self.structure)

    def replace_field(self, new: Field) -> "Schema":
        return Schema(tuple(new if f.name == new.name else f for f in self.fields), self.layout, self.structure)

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.layout, "structure": self.structure, "fields": [f.to_json() for f in self.fields]}

    @classmethod
    def from_json(cls, value: Any) -> "Schema":
        if not isinstance(value, dict) or not isinstance(value.get("fields"), list):
            raise InvalidOptionError("a schema must be an object with a 'fields' list")
        return cls(tuple(Field.from_json(f) for f in value["fields"]), value.get("layout", "tuple"),
                   value.get("structure"))


def classic_schema() -> Schema:
    return Schema((Field("image", "image"), Field("label", "int", dtype="int64", shape=())), "tuple")


# --- records: nesting -----------------------------------------------------------------------


def unflatten(values: dict[str, Any], structure: Any) -> Any:
    """Flat named values back in the structure the source returned."""
    if isinstance(structure, list):
        return tuple(unflatten(values, s) for s in structure)
    if isinstance(structure, dict):
        return {key: unflatten(values, s) for key, s in structure.items()}
    return values[structure]


def select(structure: Any, wanted: set[str]) -> Any:
    """``structure`` keeping only the fields in ``wanted`` (``open_dataset(fields=[...])``)."""
    if isinstance(structure, list):
        kept = [select(s, wanted) for s in structure]
        return [s for s in kept if s is not None and s != {} and s != []] or None
    if isinstance(structure, dict):
        kept = {k: select(s, wanted) for k, s in structure.items()}
        return {k: s for k, s in kept.items() if s is not None and s != {} and s != []} or None
    return structure if structure in wanted else None
