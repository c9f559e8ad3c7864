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

Each kind is one class in one table, :data:`fastdata.fields.kinds.KINDS` (``Field.kind_spec`` is
the field's row): how a value is inferred, checked, stored, kept as a tar member, moved with the
image and read back. :func:`fastdata.fields.register_kind` adds a kind (docs/fields.md, "Adding a
field kind"). How Python values become fields (inference, checking a later sample, flattening a
nested item) is :mod:`fastdata.fields.values`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field as dataclass_field
from typing import Any

import numpy as np
from fastdata.errors import CorruptDataError, InvalidOptionError
from fastdata.fields.codecs import member_suffix
from fastdata.fields.kinds import (  # noqa: F401 - ARRAY_DTYPES, RAGGED, VARIABLE, FieldError: importable from here too
    ARRAY_DTYPES, KINDS, RAGGED, VARIABLE, FieldError, FieldKind, Stored,
)
from fastdata.images import FIELD_CHANNELS

LAYOUTS = ("tuple", "dict")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


# ``meta`` entries a source gives a field (``Source.field_meta``), kept in the manifest:
CLASS_IDS = "class_ids"  # True: the field's integers are indices into the manifest's ``classes`` (verify checks them)
MEMBER_KEY = "member_key"  # True: a text field of keys, unique and safe as tar member names (the tar writer names members by them)
SOURCE_META = (CLASS_IDS, MEMBER_KEY)
NO_LABEL = -1  # a label or class id naming no class (Hugging Face's unlabelled test splits): kept, and verify accepts it


def name_problem(name: Any) -> str | None:
    """Why ``name`` cannot name a field (None when it can): it names files, HDF5 datasets and tar
    members, so only letters, digits, '_', '-' and '.' (up to 64, not starting with '.' or '-')."""
    if isinstance(name, str) and _NAME.fullmatch(name):
        return None
    return "use letters, digits, '_', '-' and '.' (up to 64, not starting with '.' or '-')"


# --- what a manifest may say of a field (its JSON is untrusted: every value is checked) -------


BOX_FORMATS = ("XYXY", "XYWH", "CXCYWH", "XYWHR", "CXCYWHR", "XYXYXYXY")  # tv_tensors.BoundingBoxFormat
_MAX_DIMENSIONS = 32
_MAX_SIDE = 2**31
_MAX_DEPTH = 32  # of a structure: a source's nesting is two or three levels deep
_MAX_NODES = 1 << 20


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _shape_problem(value: dict[str, Any], rule: Stored) -> str | None:
    """What is wrong with a stored field's ``shape`` under its kind's ``rule`` (None: nothing)."""
    shape, encoding = value.get("shape"), value.get("encoding")
    if shape is None:
        needed = (rule.shape == "array" and encoding is None) or (rule.shape == "spatial" and encoding == "raw")
        return "has no shape, which its kind and encoding need" if needed else None
    if rule.shape == "none" or (rule.shape == "spatial" and encoding != "raw"):
        return f"has shape {_shown(shape)}, but a {value['kind']} field stored so has none"
    if not isinstance(shape, list) or len(shape) > _MAX_DIMENSIONS or not all(
            _is_int(s, 0, _MAX_SIDE) or (s is None and at == 0 and rule.shape == "array") for at, s in enumerate(shape)):
        return (f"has shape {_shown(shape)}; expected a list of up to {_MAX_DIMENSIONS} sizes from 0 to {_MAX_SIDE} "
                "(null only first, for a variable array)")
    if rule.shape == "scalar" and shape:
        return f"has shape {_shown(shape)}; a {value['kind']} is a scalar (shape [])"
    if rule.shape == "spatial":
        expected = rule.ndim
        channels = FIELD_CHANNELS.get(value.get("mode"))
        if len(shape) != expected or 0 in shape or (expected == 3 and shape[2] != channels):
            return f"has shape {_shown(shape)}; a raw {value['kind']} in mode {value.get('mode')!r} is " + (
                f"[height, width, {channels}]" if expected == 3 else "[height, width]")
    if encoding == "npy" and (shape[0] is not None or value.get("meta", {}).get("ndim") != len(shape)):
        return f"has shape {_shown(shape)}, which does not fit an array stored as .npy values of its 'ndim'"
    return None


def _meta_problem(value: dict[str, Any]) -> str | None:
    """What is wrong with a stored field's ``meta`` (None: nothing); keys fastdata does not use
    are left alone."""
    meta, kind = value.get("meta", {}), value["kind"]
    if not isinstance(meta, dict):
        return f"'meta' is {_shown(meta)}; expected an object"
    tv, tv_tensors = meta.get("tv_tensor"), KINDS[kind].tv_tensors
    checks = (
        ("tv_tensor", tv is None or (isinstance(tv, str) and tv in tv_tensors),
         f"one of {', '.join(tv_tensors) or 'none'} for a {kind}"),
        ("format", tv != "BoundingBoxes" or meta.get("format") in BOX_FORMATS, f"one of {', '.join(BOX_FORMATS)}"),
        ("canvas_size_of", meta.get("canvas_size_of") is None or isinstance(meta.get("canvas_size_of"), str),
         "a field name"),
        ("palette", "palette" not in meta or isinstance(meta["palette"], list) and len(meta["palette"]) <= 1024
         and all(_is_int(v, 0, 255) for v in meta["palette"]), "a list of up to 1024 values from 0 to 255"),
        ("ndim", (value.get("encoding") != "npy" and "ndim" not in meta) or _is_int(meta.get("ndim"), 0, _MAX_DIMENSIONS),
         f"the number of dimensions (0 to {_MAX_DIMENSIONS}) of an array stored as .npy values"),
        ("as", meta.get("as") in (None, "numpy") or (meta.get("as") == "tensor" and kind in ("image", "int"))
         or (meta.get("as") == "pil" and kind == "array") or (meta.get("as") == "tuple" and kind == "json"),
         "'numpy' (or 'tensor' for an image or int, 'pil' for an array, 'tuple' for JSON)"),
        (CLASS_IDS, meta.get(CLASS_IDS) in (None, True, False), "true or false"),
        (MEMBER_KEY, meta.get(MEMBER_KEY) in (None, False) or (meta[MEMBER_KEY] is True and kind == "text"),
         "true (on a text field) or false"),
    )
    return next((f"meta {key!r} is {_shown(meta.get(key))}; expected {allowed}" for key, fine, allowed in checks
                 if not fine), None)


def stored_field_problem(value: dict[str, Any]) -> str | None:
    """What is wrong with a field as a manifest stores it (its name already checked), or None:
    kind, dtype, encoding and mode allowed for the kind, a shape that fits them, and ``meta``
    values of the types readers use."""
    kind = KINDS.get(value.get("kind")) if isinstance(value.get("kind"), str) else None
    rule = kind.stored if kind is not None else None
    if rule is None:
        return (f"kind {_shown(value.get('kind'))} is not one of {', '.join(KINDS)} (a kind a package adds is "
                "registered with fastdata.fields.register_kind before the dataset is read)")
    for key, allowed in (("dtype", rule.dtypes), ("encoding", rule.encodings), ("mode", rule.modes)):
        if value.get(key) not in allowed:
            shown = ", ".join("none" if v is None else repr(v) for v in allowed)
            return f"{key} {_shown(value.get(key))} is not allowed for {value['kind']} fields ({shown})"
    return _meta_problem(value) or _shape_problem(value, rule)


def structure_problem(structure: Any, layout: str, names: set[str]) -> str | None:
    """What is wrong with a stored schema's ``structure`` (None: nothing, or no structure): a
    list for the tuple layout (or one field's name: a bare value), an object for the dict layout, nested lists and objects at most
    32 deep whose leaves name fields of the schema."""
    if structure is None:
        return None
    if isinstance(structure, str) and layout == "tuple":  # a bare value: the sample is that one field
        return None if structure in names else f"structure names {_shown(structure)}, which is no field of the schema"
    if not isinstance(structure, list if layout == "tuple" else dict):
        return f"structure {_shown(structure)} is not a {'list' if layout == 'tuple' else 'object'} ({layout} layout)"
    pending, nodes = [(structure, 1)], 0
    while pending:
        node, depth = pending.pop()
        nodes += 1
        if depth > _MAX_DEPTH or nodes > _MAX_NODES:
            return f"structure is nested deeper than {_MAX_DEPTH} levels (or larger than {_MAX_NODES} entries)"
        if isinstance(node, (list, dict)):
            pending += [(child, depth + 1) for child in (node.values() if isinstance(node, dict) else node)]
        elif not isinstance(node, str) or node not in names:
            return f"structure names {_shown(node)}, which is no field of the schema"
    return None


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
        if name_problem(self.name):
            raise InvalidOptionError(f"Invalid field name {_shown(self.name)}: {name_problem(self.name)}.")
        if KINDS.get(self.kind) is None:
            raise InvalidOptionError(f"Field {self.name!r}: unknown kind {self.kind!r}. Kinds: {', '.join(KINDS)}.")
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(None if s is None else int(s) for s in self.shape))

    @property
    def kind_spec(self) -> FieldKind:
        """The field's kind: its row of :data:`fastdata.fields.kinds.KINDS`."""
        return KINDS[self.kind]

    @property
    def variable(self) -> bool:
        """Stored as data + offsets (not one fixed-size row per sample)."""
        return self.kind_spec.variable(self)

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
        """A field as a manifest stores it, every value checked (:func:`stored_field_problem`):
        an :class:`InvalidOptionError` saying what is wrong, never a field readers fail on."""
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            raise InvalidOptionError(f"a field must be an object with a name, got {_shown(value)}")
        problem = name_problem(value["name"]) or stored_field_problem(value)
        if problem:
            raise InvalidOptionError(f"field {_shown(value['name'])}: {problem}")
        shape = value.get("shape")
        return cls(name=value["name"], kind=value["kind"], dtype=value.get("dtype"),
                   shape=tuple(shape) if isinstance(shape, list) else None, encoding=value.get("encoding"),
                   mode=value.get("mode"), meta=dict(value.get("meta") or {}))

    # --- stored bytes and tar members: the kind's ------------------------------------------------

    def store(self, value: Any) -> bytes:
        """A checked value (non-image kinds) as its stored bytes (None, an empty value: none)."""
        return b"" if value is None else self.kind_spec.store(self, value)

    def load(self, data: bytes | memoryview | np.ndarray, where: str = "") -> Any:
        """Stored bytes (or, for fixed fields, the stored row) back as the value a reader gives;
        damaged bytes are a CorruptDataError naming ``where`` and the field."""
        try:
            return self.kind_spec.load(self, data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptDataError(f"{where}field {self.name!r}: damaged {self.kind} data ({exc}). "
                                   "Run 'fastdata verify' or convert the source again.") from exc

    @property
    def extension(self) -> str:
        """The extension WebDataset's default decoders read this field's member with."""
        return self.kind_spec.extension(self)

    def member_suffix(self, extension: str | None = None) -> str:
        """The member name after ``<key>.`` (``boxes.npy``, ``txt``, ``seg.png``)."""
        return member_suffix(self.name, extension or self.extension)

    def member(self, stored: bytes) -> bytes:
        """Stored bytes as the member WebDataset's default decoders read."""
        return self.kind_spec.member(self, stored)

    def from_member(self, data: bytes | memoryview, where: str = "") -> bytes | memoryview:
        """A member's bytes (or a view of them) back as stored bytes."""
        try:
            return self.kind_spec.from_member(self, data)
        except (ValueError, UnicodeDecodeError, EOFError, OSError) as exc:
            raise CorruptDataError(f"{where}field {self.name!r}: damaged {self.kind} member ({exc}). "
                                   "Run 'fastdata verify' or convert the source again.") from exc


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
        """A schema as a manifest stores it, checked whole: every field
        (:meth:`Field.from_json`), the layout, the structure (:func:`structure_problem`) and what
        fields name of each other (a box field's canvas image)."""
        if not isinstance(value, dict) or not isinstance(value.get("fields"), list):
            raise InvalidOptionError(f"a schema must be an object with a 'fields' list, got {_shown(value)}")
        fields = tuple(Field.from_json(f) for f in value["fields"])
        layout = value.get("layout", "tuple")
        if layout not in LAYOUTS:
            raise InvalidOptionError(f"layout {_shown(layout)} is not one of {', '.join(LAYOUTS)}")
        names = {f.name: f for f in fields}
        problem = structure_problem(value.get("structure"), layout, set(names)) or next(
            (f"field {f.name!r}: its boxes' canvas {_shown(f.meta.get('canvas_size_of'))} is no image or mask field"
             for f in fields if f.meta.get("tv_tensor") == "BoundingBoxes"
             and not _is_canvas(names.get(f.meta.get("canvas_size_of")))), None)
        if problem:
            raise InvalidOptionError(problem)
        return cls(fields, layout, value.get("structure"))


def _is_canvas(f: Field | None) -> bool:
    return f is not None and f.kind_spec.spatial


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
