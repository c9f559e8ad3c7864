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

Nothing is pickled: any other Python object is an error naming its type. :func:`infer` makes a
:class:`Schema` from the first samples' values; :meth:`Schema.check` refuses a later sample
that does not fit (naming the sample, the field and what differs), never casting silently.
``None`` is the empty value of a variable field (a COCO image with no boxes: zero boxes).

Every non-image value has *stored bytes* (:meth:`Field.store` / :meth:`Field.load`): the raw
little-endian row of a fixed-shape field (so a format keeps fixed fields as one ``(N, *shape)``
array), or the variable bytes of the others (kept as data + offsets). Tar members use
WebDataset's conventions instead (:meth:`Field.member` / :meth:`Field.from_member`).
"""

from __future__ import annotations

import io
import json
import math
import re
from dataclasses import dataclass, field as dataclass_field
from typing import Any

import numpy as np
from PIL import Image

from fastdata.errors import BadSampleError, CorruptDataError, InvalidOptionError

KINDS = ("image", "mask", "int", "float", "array", "text", "text_list", "json", "bytes")
SPATIAL = ("image", "mask")
LAYOUTS = ("tuple", "dict")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_ARRAY_DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                 "float16", "float32", "float64")
VARIABLE = "variable"  # the kinds hint suffix "array:variable": a variable first dimension
RAGGED = "ragged"  # "array:ragged": every dimension may vary (the number of dimensions may not)


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

    # --- stored bytes ---------------------------------------------------------------------

    def store(self, value: Any) -> bytes:
        """A checked value (non-image kinds) as its stored bytes."""
        kind = self.kind
        if value is None:
            return b""
        if kind == "array" and self.encoding == "npy":
            buffer = io.BytesIO()
            np.save(buffer, np.ascontiguousarray(value, dtype=np.dtype(self.dtype).newbyteorder("<")), allow_pickle=False)
            return buffer.getvalue()
        if kind in ("int", "float", "array"):
            array = np.ascontiguousarray(value, dtype=np.dtype(self.dtype).newbyteorder("<"))
            return array.tobytes()
        if isinstance(value, bytes) and kind in ("text", "json"):
            return value  # checked, kept as it was
        if kind == "text":
            return value.encode("utf-8")
        if kind in ("text_list", "json"):
            return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
        if kind == "bytes":
            return bytes(value)
        if kind in SPATIAL:
            return value if isinstance(value, bytes) else np.ascontiguousarray(value, dtype=np.uint8).tobytes()
        raise AssertionError(kind)

    def load(self, data: bytes | memoryview | np.ndarray, where: str = "") -> Any:
        """Stored bytes (or, for fixed fields, the stored row) back as the value a reader gives."""
        kind = self.kind
        try:
            if kind in ("int", "float"):
                array = np.frombuffer(bytes(data), dtype=np.dtype(self.dtype).newbyteorder("<"))
                return array[0].item()
            if kind == "array" and self.encoding == "npy":
                stored = io.BytesIO(bytes(data))
                array = np.load(stored, allow_pickle=False)
                if str(array.dtype.newbyteorder("=")) != self.dtype and array.dtype != np.dtype(self.dtype):
                    raise ValueError(f"holds {array.dtype}, not {self.dtype}")
                return array.astype(self.dtype, copy=False)
            if kind == "array":
                raw = np.frombuffer(bytes(data), dtype=np.dtype(self.dtype).newbyteorder("<"))
                if self.variable:
                    rest = self.shape[1:]
                    per = math.prod(rest) if rest else 1
                    if per == 0:
                        rows = 0  # a (K, 0) array: its rows are not in the bytes
                    elif raw.size % per:
                        raise ValueError(f"{raw.size} values are not whole rows of {rest}")
                    else:
                        rows = raw.size // per
                    return raw.reshape((rows, *rest)).astype(self.dtype, copy=False)
                return raw.reshape(self.shape).astype(self.dtype, copy=False)
            if kind == "text":
                return bytes(data).decode("utf-8")
            if kind in ("text_list", "json"):
                raw = bytes(data)
                if not raw:
                    return [] if kind == "text_list" else None
                return json.loads(raw.decode("utf-8"))
            if kind == "bytes":
                return bytes(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptDataError(f"{where}field {self.name!r}: damaged {kind} data ({exc}). "
                                   "Run 'fastdata verify' or convert the source again.") from exc
        raise AssertionError(kind)

    # --- WebDataset members (tar) ------------------------------------------------------------

    @property
    def extension(self) -> str:
        """The extension WebDataset's default decoders read this field's member with."""
        if self.kind == "int":
            return "cls"
        if self.kind == "text":
            return "txt"
        if self.kind in ("float", "text_list", "json"):
            return "json"
        if self.kind == "array":
            return "npy"
        if self.kind == "bytes":
            return "bin"
        if self.encoding == "raw":
            return "npy"
        if self.kind == "mask":
            return "png"
        return self.encoding if self.encoding in ("png",) else ("jpg" if self.encoding == "jpeg" else "img")

    def member_suffix(self, extension: str | None = None) -> str:
        """The member name after ``<key>.``: the field's name when it already ends in the
        extension WebDataset decodes it by (``txt``, ``seg.png``), else ``<name>.<extension>``."""
        extension = extension or self.extension
        if self.name == extension or self.name.endswith("." + extension):
            return self.name
        return f"{self.name}.{extension}"

    def member(self, stored: bytes) -> bytes:
        """Stored bytes as the member WebDataset's default decoders read."""
        kind = self.kind
        if kind == "int":
            return str(self.load(stored)).encode("ascii") if self.dtype != "bool" else str(int(self.load(stored))).encode()
        if kind == "float":
            return json.dumps(self.load(stored)).encode("ascii")
        if kind == "text_list" and not stored:
            return b"[]"
        if kind == "json" and not stored:
            return b"null"
        if kind == "array" and self.encoding == "npy":
            return bytes(stored)  # already an .npy file
        if kind == "array" or (kind in SPATIAL and self.encoding == "raw"):
            value = self.load(stored) if kind == "array" else np.frombuffer(stored, np.uint8).reshape(self.shape)
            buffer = io.BytesIO()
            np.save(buffer, np.ascontiguousarray(value, dtype=np.dtype(self.dtype).newbyteorder("<")), allow_pickle=False)
            return buffer.getvalue()
        return bytes(stored)

    def from_member(self, data: bytes, where: str = "") -> bytes:
        """A member's bytes back as stored bytes."""
        kind = self.kind
        try:
            if kind == "int":
                text = data.decode("ascii").strip()
                return self.store(bool(int(text)) if self.dtype == "bool" else int(text))
            if kind == "float":
                return self.store(float(json.loads(data.decode("ascii"))))
            if kind == "text_list" and data == b"[]":
                return b""
            if kind == "json" and data == b"null":
                return b""
            if kind == "array" and self.encoding == "npy":
                self.load(data)  # a damaged member fails here, naming it
                return data
            if kind == "array" or (kind in SPATIAL and self.encoding == "raw"):
                stored = io.BytesIO(bytes(data))
                array = np.load(stored, allow_pickle=False)
                return np.ascontiguousarray(array, dtype=np.dtype(self.dtype).newbyteorder("<")).tobytes()
        except (ValueError, UnicodeDecodeError, EOFError, OSError) as exc:
            raise CorruptDataError(f"{where}field {self.name!r}: damaged {kind} member ({exc}). "
                                   "Run 'fastdata verify' or convert the source again.") from exc
        return data


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

    def check(self, values: dict[str, Any], sample: str) -> dict[str, Any]:
        """``values`` (a flattened record) checked against the schema, normalised (tensors as
        numpy, tv_tensors unwrapped); a :class:`FieldError` naming ``sample`` and the field."""
        missing = [n for n in self.names if n not in values]
        if missing:
            raise FieldError(f"{sample}: has no field {missing[0]!r}, which the first samples have. "
                             "Give every sample every field (None for an empty one).")
        extra = [n for n in values if n not in self.names]
        if extra:
            raise FieldError(f"{sample}: field {extra[0]!r} is not in the schema (the first samples do not have it). "
                             "Give every sample the same fields.")
        return {f.name: check_value(f, values[f.name], sample) for f in self.fields}


def classic_schema() -> Schema:
    return Schema((Field("image", "image"), Field("label", "int", dtype="int64", shape=())), "tuple")


# --- values -> kinds --------------------------------------------------------------------------


def _tv_type(value: Any) -> str | None:
    """The tv_tensors class name of ``value`` (Image, Mask, BoundingBoxes, ...), or None."""
    module = type(value).__module__
    if module.startswith("torchvision.tv_tensors"):
        for cls in type(value).__mro__:
            if cls.__module__.startswith("torchvision.tv_tensors") and cls.__name__ != "TVTensor":
                return cls.__name__
    return None


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _as_numpy(value: Any) -> np.ndarray:
    if _is_tensor(value):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _describe_type(value: Any) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}" if type(value).__module__ != "builtins" \
        else type(value).__name__


def _json_plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_json_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_plain(v) for k, v in value.items())
    return False


def _not_a_kind(name: str, value: Any, sample: str) -> FieldError:
    return FieldError(
        f"{sample}: field {name!r} is a {_describe_type(value)}, which is no field kind (fastdata never pickles). "
        "Return it as a numpy array, a tensor, a str, bytes or plain JSON data (dict/list of numbers and "
        "strings) from the dataset."
    )


def kind_of(name: str, value: Any, hint: str | None, sample: str, image_field: str | None) -> Field | None:
    """The field one value makes (its shape as this value has it); None for a None value."""
    if value is None:
        return None
    tv = _tv_type(value)
    variable = ragged = False
    if hint:
        hint, _, flag = hint.partition(":")
        variable, ragged = flag == VARIABLE, flag == RAGGED
        if hint not in KINDS or flag not in ("", VARIABLE, RAGGED):
            raise InvalidOptionError(f"kinds hint {hint!r} for field {name!r} is no field kind. Kinds: {', '.join(KINDS)} "
                                     "(arrays: 'array:variable' for a variable first dimension, 'array:ragged' for any).")
    if hint == "array" and (_is_tensor(value) or isinstance(value, np.ndarray)) and tv != "BoundingBoxes":
        array = _as_numpy(value)
        meta = {"tv_tensor": tv} if tv in ("Mask", "Image") else ({"as": "numpy"} if isinstance(value, np.ndarray) else {})
        if str(array.dtype) not in _ARRAY_DTYPES:
            raise FieldError(f"{sample}: field {name!r} is an array of dtype {array.dtype}, which fastdata does not "
                             f"store (never pickled). Use one of: {', '.join(_ARRAY_DTYPES)}.")
        if ragged:  # every dimension may vary (COCO's (K, H, W) instance masks): each value an .npy
            return Field(name, "array", dtype=str(array.dtype), encoding="npy", meta=dict(meta, ndim=array.ndim))
        if variable and array.ndim:
            return variable_array(name, str(array.dtype), tuple(array.shape[1:]), meta)
        return Field(name, "array", dtype=str(array.dtype), shape=tuple(array.shape), meta=meta)
    if tv == "Mask" or (hint == "mask" and (isinstance(value, Image.Image) or _is_tensor(value) or isinstance(value, np.ndarray))):
        mode = value.mode if isinstance(value, Image.Image) else None
        meta = {"tv_tensor": "Mask"}
        if isinstance(value, Image.Image) and value.mode == "P" and value.getpalette():
            meta["palette"] = list(value.getpalette())
        return Field(name, "mask", dtype="uint8", mode=mode, meta=meta)
    if tv == "Image" or isinstance(value, Image.Image) or hint == "image":
        return Field(name, "image", dtype="uint8", meta={"tv_tensor": "Image"} if tv == "Image" else {})
    if tv == "BoundingBoxes":
        array = _as_numpy(value)
        box_format = getattr(value.format, "name", str(value.format))
        return Field(name, "array", dtype=str(array.dtype), shape=(None, *array.shape[1:]),
                     meta={"tv_tensor": "BoundingBoxes", "format": box_format, "canvas_size_of": image_field})
    if hint in ("text", "text_list", "json", "bytes"):
        return Field(name, hint)
    if isinstance(value, (bool, np.bool_)):
        return Field(name, "int", dtype="bool", shape=())
    if isinstance(value, (int, np.integer)):
        return Field(name, "int", dtype="int64", shape=())
    if isinstance(value, float):
        return Field(name, "float", dtype="float64", shape=())
    if isinstance(value, np.floating):
        return Field(name, "float", dtype=str(value.dtype), shape=())
    if _is_tensor(value) or isinstance(value, np.ndarray):
        array = _as_numpy(value)
        if str(array.dtype) not in _ARRAY_DTYPES:
            raise FieldError(f"{sample}: field {name!r} is an array of dtype {array.dtype}, which fastdata does not "
                             f"store (never pickled). Use one of: {', '.join(_ARRAY_DTYPES)}.")
        if array.ndim == 0 and hint != "array":
            kind = "int" if array.dtype.kind in "iub" else "float"
            dtype = "bool" if array.dtype.kind == "b" else ("int64" if kind == "int" else str(array.dtype))
            return Field(name, kind, dtype=dtype, shape=())
        shape = tuple(array.shape)
        meta = {"as": "numpy"} if isinstance(value, np.ndarray) else {}
        if variable:
            if not shape:
                raise FieldError(f"{sample}: field {name!r} is 0-d; a variable first dimension needs at least 1-D.")
            return variable_array(name, str(array.dtype), shape[1:], meta)
        return Field(name, "array", dtype=str(array.dtype), shape=shape, meta=meta)
    if isinstance(value, str):
        return Field(name, "text")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Field(name, "bytes")
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return Field(name, "text_list")
    if isinstance(value, (list, tuple, dict)):
        if not _json_plain(value):
            raise FieldError(
                f"{sample}: field {name!r} holds something that is not plain JSON data (only dicts with str keys, "
                "lists, str, int, finite float, bool, None). Convert it in the dataset, or return the arrays as "
                "fields of their own."
            )
        return Field(name, "json")
    raise _not_a_kind(name, value, sample)


def variable_array(name: str, dtype: str, rest: tuple, meta: dict) -> Field:
    """An array field with a variable first dimension; rows of zero size (a trailing 0) cannot
    be counted from the bytes, so such values are stored as one ``.npy`` each."""
    if math.prod(rest):
        return Field(name, "array", dtype=dtype, shape=(None, *rest), meta=meta)
    return Field(name, "array", dtype=dtype, shape=(None, *rest), encoding="npy", meta=dict(meta, ndim=1 + len(rest)))


def _merge(old: Field, new: Field, sample: str) -> Field | None:
    """The field two samples' values agree on (a fixed array whose first dimension differs
    becomes variable; an empty caption list meets a non-empty one); None when their kinds differ."""
    if old.kind == "json" and new.kind == "text_list" or old.kind == "text_list" and new.kind == "json":
        return Field(old.name, "json")
    if old.kind != new.kind:
        return None
    if old.kind == "array" and (old.encoding == "npy" or new.encoding == "npy"):
        return old if old.encoding == "npy" else new
    if old.kind == "array" and old.shape != new.shape and old.dtype == new.dtype and len(old.shape) == len(new.shape) \
            and old.shape[1:] == new.shape[1:] and old.shape:
        return variable_array(old.name, old.dtype, old.shape[1:], old.meta)
    return old


def infer(records: list[tuple[str, dict[str, Any]]], kinds: dict[str, str] | None = None,
          layout: str = "tuple", structure: Any = None) -> Schema:
    """The schema that the first samples' values make (``records``: (sample name, flattened
    record) pairs, at least one); ``kinds`` hints a kind where a value's type does not say it
    (``{"mask": "mask"}``, ``{"keypoints": "array:variable"}``)."""
    kinds = dict(kinds or {})
    first_name, first = records[0]
    found: dict[str, Field | None] = {}
    image_field = None
    for name in first:
        hint = kinds.get(name)
        value = first[name]
        made = kind_of(name, value, hint, first_name, image_field)
        if made is not None and made.kind == "image" and image_field is None:
            image_field = name
        found[name] = made
    for sample, values in records[1:]:
        if set(values) != set(first):  # the same fields in another order are the same fields
            missing = [n for n in first if n not in values] or [n for n in values if n not in first]
            raise FieldError(f"{sample}: fields {list(values)} differ from the first sample's {list(first)} "
                             f"(field {missing[0]!r}). Give every sample the same fields.")
        for name, value in values.items():
            made = kind_of(name, value, kinds.get(name), sample, image_field)
            if made is None:
                continue
            if found[name] is None:
                found[name] = made
                continue
            merged = _merge(found[name], made, sample)
            if merged is None:
                check_value(found[name], value, sample)  # the error that says what differs
            found[name] = merged
    fields = []
    for name, made in found.items():
        if made is None:
            raise FieldError(f"{first_name}: field {name!r} is None in every probed sample, so its kind is unknown. "
                             f"Say it: kinds={{{name!r}: 'json'}} (or another kind).")
        fields.append(made)
    # boxes name their canvas image once it is known
    fields = [f if f.meta.get("tv_tensor") != "BoundingBoxes" or f.meta.get("canvas_size_of")
              else Field(f.name, f.kind, f.dtype, f.shape, f.encoding, f.mode, dict(f.meta, canvas_size_of=image_field))
              for f in fields]
    return Schema(tuple(fields), layout, structure)


def check_value(f: Field, value: Any, sample: str) -> Any:
    """One value checked against its field; normalised (numpy for arrays, the PIL image for
    images). Never cast: a dtype or shape that differs is a :class:`FieldError`."""
    where = f"{sample}: field {f.name!r}"
    if value is None:
        if f.variable and f.kind not in SPATIAL:
            return None
        raise FieldError(f"{where} is None, but {f.kind} fields cannot be empty. Give it a value in every sample.")
    tv = _tv_type(value)
    if f.kind in SPATIAL:
        if isinstance(value, Image.Image):
            return value
        if _is_tensor(value) or isinstance(value, np.ndarray):
            array = _as_numpy(value)
            if array.dtype != np.uint8:
                raise FieldError(f"{where} is {f.kind} of dtype {array.dtype}; {f.kind}s are uint8. Convert it in "
                                 "the dataset (e.g. value.to(torch.uint8)).")
            if f.kind == "mask":
                if array.ndim == 3 and array.shape[0] == 1:
                    array = array[0]
                if array.ndim != 2:
                    raise FieldError(f"{where} is a mask of shape {array.shape}; a mask is (H, W) or (1, H, W).")
                return Image.fromarray(np.ascontiguousarray(array), "L")
            from fastdata.images import to_pil  # images import nothing of fields; kept local for clarity

            return to_pil(value)
        raise FieldError(f"{where} is a {_describe_type(value)}, but the first samples have a {f.kind} there.")
    if f.kind == "int":
        if tv is None and (_is_tensor(value) or isinstance(value, np.ndarray)):
            array = _as_numpy(value)
            if array.ndim:
                raise FieldError(f"{where} is an array of shape {array.shape}; the first samples have an int there.")
            value = array.item()
        if f.dtype == "bool":
            if not isinstance(value, (bool, np.bool_)):
                raise FieldError(f"{where} is {_describe_type(value)} {value!r}; the first samples have a bool there.")
            return bool(value)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise FieldError(f"{where} is {_describe_type(value)} {str(value)[:40]!r}; the first samples have an int "
                             "there (never cast). Return an int in every sample.")
        value = int(value)
        if not -(1 << 63) <= value < (1 << 63):
            raise FieldError(f"{where} is {value}, which does not fit int64.")
        return value
    if f.kind == "float":
        if _is_tensor(value) or isinstance(value, np.ndarray):
            array = _as_numpy(value)
            if array.ndim or array.dtype.kind != "f":
                raise FieldError(f"{where} is an array of dtype {array.dtype} shape {array.shape}; the first samples "
                                 "have a float there.")
            value = array[()]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (float, np.floating)):
            raise FieldError(f"{where} is {_describe_type(value)} {str(value)[:40]!r}; the first samples have a "
                             "float there (never cast). Return a float in every sample.")
        if isinstance(value, np.floating) and str(value.dtype) != f.dtype:
            raise FieldError(f"{where} has dtype {value.dtype}; the first samples have {f.dtype} (never cast).")
        return value
    if f.kind == "array":
        if not (_is_tensor(value) or isinstance(value, np.ndarray)):
            raise FieldError(f"{where} is a {_describe_type(value)}; the first samples have an array there.")
        if f.meta.get("tv_tensor") == "BoundingBoxes" and tv != "BoundingBoxes":
            raise FieldError(f"{where} is a {_describe_type(value)}; the first samples have tv_tensors.BoundingBoxes.")
        if tv == "BoundingBoxes":
            box_format = getattr(value.format, "name", str(value.format))
            if box_format != f.meta.get("format"):
                raise FieldError(f"{where} has box format {box_format}; the first samples have "
                                 f"{f.meta.get('format')}. Convert it (transforms.v2.ConvertBoundingBoxFormat).")
        array = _as_numpy(value)
        if str(array.dtype) != f.dtype:
            raise FieldError(f"{where} has dtype {array.dtype}; the first samples have {f.dtype} (never cast). "
                             "Convert it in the dataset.")
        if f.encoding == "npy":
            if array.ndim != f.meta.get("ndim"):
                raise FieldError(f"{where} has {array.ndim} dimensions; the first samples have {f.meta.get('ndim')}.")
            if f.shape is not None and tuple(array.shape[1:]) != f.shape[1:]:
                rest = ", ".join(str(v) for v in f.shape[1:])
                raise FieldError(f"{where} has shape {tuple(array.shape)}; the first samples have (K, {rest}) "
                                 "(the trailing shape must not change).")
            return array
        if f.variable:
            if array.ndim != len(f.shape) or tuple(array.shape[1:]) != f.shape[1:]:
                rest = ", ".join(str(s) for s in f.shape[1:])
                raise FieldError(f"{where} has shape {tuple(array.shape)}; the first samples have (K, {rest}) "
                                 "(the trailing shape must not change).")
        elif tuple(array.shape) != f.shape:
            raise FieldError(
                f"{where} has shape {tuple(array.shape)}; the first samples have {f.shape}. If its first dimension "
                f"varies, say so: kinds={{{f.name!r}: 'array:variable'}}."
            )
        return array
    if f.kind == "text":
        if isinstance(value, (bytes, bytearray)):  # text as it was stored (a WebDataset .txt member): kept as is
            try:
                bytes(value).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise FieldError(f"{where} is not UTF-8 text ({exc.reason} at byte {exc.start}).") from None
            return bytes(value)
        if not isinstance(value, str):
            raise FieldError(f"{where} is a {_describe_type(value)}; the first samples have text (str) there.")
        return value
    if f.kind == "text_list":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise FieldError(f"{where} is a {_describe_type(value)}; the first samples have a list of str there.")
        return list(value)
    if f.kind == "json":
        if isinstance(value, (bytes, bytearray)):  # JSON as it was stored (a WebDataset .json member): kept as is
            try:
                json.loads(bytes(value).decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                raise FieldError(f"{where} is not valid JSON ({str(exc)[:80]}).") from None
            return bytes(value)
        if not _json_plain(value):
            raise FieldError(f"{where} holds something that is not plain JSON data (only dicts with str keys, lists, "
                             "str, int, finite float, bool, None). Convert it in the dataset.")
        return value
    if f.kind == "bytes":
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise FieldError(f"{where} is a {_describe_type(value)}; the first samples have bytes there.")
        return bytes(value)
    raise AssertionError(f.kind)


# --- records: nesting, names --------------------------------------------------------------


_DEFAULT_NAMES = {"image": "image", "mask": "mask", "int": "label", "float": "score", "array": "array",
                  "text": "text", "text_list": "captions", "json": "target", "bytes": "data"}


def flatten(item: Any, names: list[str] | None = None) -> tuple[dict[str, Any], str, Any]:
    """A dataset item (tuple, dict, or a tuple holding a dict, as torchvision's
    ``wrap_dataset_for_transforms_v2`` gives) as (flat named values, layout, structure)."""
    if isinstance(item, dict):
        values = {}
        for key, value in item.items():
            if not isinstance(key, str):
                raise FieldError(f"dict keys must be str field names, got {key!r}")
            values[key] = value
        return values, "dict", {k: k for k in values}
    if not isinstance(item, (tuple, list)):
        item = (item,)
    values, structure, taken = {}, [], set()
    for position, value in enumerate(item):
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value) and names is None:
            inner = {}
            for key, sub in value.items():
                name = _unique(key, taken)
                values[name] = sub
                inner[key] = name
            structure.append(inner)
            continue
        name = names[position] if names and position < len(names) else _unique(_guess_name(value), taken)
        taken.add(name)
        values[name] = value
        structure.append(name)
    return values, "tuple", structure


def _guess_name(value: Any) -> str:
    tv = _tv_type(value)
    if tv == "BoundingBoxes":
        return "boxes"
    if tv == "Mask":
        return "mask"
    try:
        made = kind_of("x", value, None, "", None)
    except FieldError:
        return "value"
    return _DEFAULT_NAMES[made.kind] if made is not None else "value"


def _unique(name: str, taken: set[str]) -> str:
    out, number = name, 1
    while out in taken:
        out = f"{name}_{number}"
        number += 1
    taken.add(out)
    return out


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


def digest_value(f: Field, value: Any) -> bytes:
    """Bytes that stand for a checked value in a source fingerprint (images by mode, size, pixels)."""
    if f.kind in SPATIAL:
        return f"{value.mode} {value.size}\n".encode() + value.tobytes()
    return f.store(value)

