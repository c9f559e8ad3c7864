"""The ``array`` kind: numpy arrays and tensors (dtype kept) of a fixed shape, of a variable first
dimension (boxes ``(K, 4)``, keypoints), or ragged (each value an ``.npy``: COCO's ``(K, H, W)``
instance masks); ``tv_tensors.BoundingBoxes`` with their format and canvas, ``tv_tensors.Mask``
arrays moved with the image by torchvision's kernels; ``.npy`` tar members."""

from __future__ import annotations

import io
import math
from typing import Any, Callable

import numpy as np
from PIL import Image

from fastdata.fields.kinds import (
    ARRAY_DTYPES, KINDS, FieldError, FieldKind, Hint, Stored, as_numpy, describe_type, is_array, little_endian,
    tv_type,
)
from fastdata.fields.schema import Field

BOXES = "BoundingBoxes"
WIDE_MODES = ("I;16", "I;16B", "I;16L", "I", "F")  # PIL modes of 16/32-bit values, which images (uint8) cannot keep


def variable_array(name: str, dtype: str, rest: tuple, meta: dict) -> Field:
    """An array field with a variable first dimension; rows of zero size (a trailing 0) cannot
    be counted from the bytes, so such values are stored as one ``.npy`` each."""
    if math.prod(rest):
        return Field(name, "array", dtype=dtype, shape=(None, *rest), meta=meta)
    return Field(name, "array", dtype=dtype, shape=(None, *rest), encoding="npy", meta=dict(meta, ndim=1 + len(rest)))


def npy_bytes(value: Any, dtype: str) -> bytes:
    """``value`` as an ``.npy`` file of little-endian ``dtype``."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(value, dtype=little_endian(dtype)), allow_pickle=False)
    return buffer.getvalue()


def check_member_array(f: Field, array: np.ndarray) -> None:
    """A ``.npy`` member's array has the field's dtype and shape (a variable field: its trailing
    shape); else ValueError saying what differs."""
    shape = tuple(f.shape) if f.shape is not None else None
    if array.dtype.newbyteorder("=") != np.dtype(f.dtype).newbyteorder("="):
        raise ValueError(f"holds {array.dtype}, the manifest says {f.dtype}")
    if shape is None:
        return
    fits = (array.ndim == len(shape) and tuple(array.shape[1:]) == shape[1:]) if None in shape \
        else tuple(array.shape) == shape
    if not fits:
        shown = tuple("K" if s is None else s for s in shape)
        raise ValueError(f"has shape {tuple(array.shape)}, the manifest says {shown}")


def _dtype_checked(name: str, array: np.ndarray, sample: str) -> np.ndarray:
    if str(array.dtype) not in ARRAY_DTYPES:
        raise FieldError(f"{sample}: field {name!r} is an array of dtype {array.dtype}, which fastdata does not "
                         f"store (never pickled). Use one of: {', '.join(ARRAY_DTYPES)}.")
    return array


class ShapedKind(FieldKind):
    """A kind whose values have an array shape: fixed where the field's shape is all known."""

    def variable(self, f: Field) -> bool:
        return f.shape is None or any(s is None for s in f.shape)


class ArrayKind(ShapedKind):
    name, default_name, member_extension, infer_rank = "array", "array", "npy", 5
    stored = Stored(ARRAY_DTYPES, (None, "npy"), (None,), "array")
    tv_tensors = ("Image", "Mask", BOXES)

    # --- values -> fields ---------------------------------------------------------------------

    def infer(self, name: str, value: Any, hint: Hint, sample: str, image_field: str | None) -> Field | None:
        """A hinted array (``"array"``, ``"array:variable"``, ``"array:ragged"``), and boxes
        (unless hinted an image or a mask)."""
        tv = tv_type(value)
        if isinstance(value, Image.Image) and value.mode in WIDE_MODES and image_field is not None and \
                (hint.kind is None or hint.kind == self.name):
            # 16/32-bit values beside the image (Cityscapes' instance ids, a depth map): their exact
            # values, each of its own size, given back as the PIL image they were
            return Field(name, "array", dtype=str(np.asarray(value).dtype), encoding="npy", meta={"as": "pil", "ndim": 2})
        if hint.kind == self.name and is_array(value) and tv != BOXES:
            array = _dtype_checked(name, as_numpy(value), sample)
            meta = {"tv_tensor": tv} if tv in ("Mask", "Image") else ({"as": "numpy"} if isinstance(value, np.ndarray) else {})
            if hint.ragged:  # every dimension may vary (COCO's (K, H, W) instance masks): each value an .npy
                return Field(name, "array", dtype=str(array.dtype), encoding="npy", meta=dict(meta, ndim=array.ndim))
            if hint.variable and array.ndim:
                return variable_array(name, str(array.dtype), tuple(array.shape[1:]), meta)
            return Field(name, "array", dtype=str(array.dtype), shape=tuple(array.shape), meta=meta)
        if tv == BOXES and not (hint.kind is not None and KINDS[hint.kind].spatial):
            array = as_numpy(value)
            box_format = getattr(value.format, "name", str(value.format))
            return Field(name, "array", dtype=str(array.dtype), shape=(None, *array.shape[1:]),
                         meta={"tv_tensor": BOXES, "format": box_format, "canvas_size_of": image_field})
        return None

    def infer_value(self, name: str, value: Any, hint: Hint, sample: str, image_field: str | None) -> Field | None:
        if not is_array(value):
            return None
        array = _dtype_checked(name, as_numpy(value), sample)
        shape = tuple(array.shape)
        if not shape:
            return None  # a 0-d tensor is a number: the int and float kinds claim it
        meta = {"as": "numpy"} if isinstance(value, np.ndarray) else {}
        if hint.variable:
            return variable_array(name, str(array.dtype), shape[1:], meta)
        return Field(name, "array", dtype=str(array.dtype), shape=shape, meta=meta)

    def merge(self, old: Field, new: Field) -> Field | None:
        """A fixed array whose first dimension differs becomes variable; an ``.npy`` one stays."""
        if old.kind != new.kind:
            return None
        if old.encoding == "npy" or new.encoding == "npy":
            return old if old.encoding == "npy" else new
        if old.shape != new.shape and old.dtype == new.dtype and len(old.shape) == len(new.shape) \
                and old.shape[1:] == new.shape[1:] and old.shape:
            return variable_array(old.name, old.dtype, old.shape[1:], old.meta)
        if old.shape != new.shape and old.dtype == new.dtype and old.shape is not None and new.shape is not None \
                and len(old.shape) == len(new.shape) and old.meta.get("tv_tensor") != BOXES:
            # other dimensions vary too (a (2, H, W) flow of each image's size): each value an .npy
            return Field(old.name, "array", dtype=old.dtype, encoding="npy", meta=dict(old.meta, ndim=len(old.shape)))
        return old

    def check(self, f: Field, value: Any, where: str) -> Any:
        if f.meta.get("as") == "pil" and isinstance(value, Image.Image) and value.mode in WIDE_MODES:
            value = np.asarray(value)
        if not is_array(value):
            raise FieldError(f"{where} is a {describe_type(value)}; the first samples have an array there.")
        tv = tv_type(value)
        if f.meta.get("tv_tensor") == BOXES and tv != BOXES:
            raise FieldError(f"{where} is a {describe_type(value)}; the first samples have tv_tensors.BoundingBoxes.")
        if tv == BOXES:
            box_format = getattr(value.format, "name", str(value.format))
            if box_format != f.meta.get("format"):
                raise FieldError(f"{where} has box format {box_format}; the first samples have "
                                 f"{f.meta.get('format')}. Convert it (transforms.v2.ConvertBoundingBoxFormat).")
        array = as_numpy(value)
        if str(array.dtype) != f.dtype:
            raise FieldError(f"{where} has dtype {array.dtype}; the first samples have {f.dtype} (never cast). "
                             "Convert it in the dataset.")
        return self._shape_checked(f, array, where)

    @staticmethod
    def _shape_checked(f: Field, array: np.ndarray, where: str) -> np.ndarray:
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
            first_only = array.ndim == len(f.shape) and array.ndim and tuple(array.shape[1:]) == f.shape[1:]
            hint, what = ("array:variable", "its first dimension") if first_only else ("array:ragged", "its shape")
            raise FieldError(
                f"{where} has shape {tuple(array.shape)}; the first samples have {f.shape}. If {what} varies, say "
                f"so: kinds={{{f.name!r}: {hint!r}}} (from the CLI, as the dataset's fastdata_kinds)."
            )
        return array

    # --- stored bytes and tar members ----------------------------------------------------------

    def store(self, f: Field, value: Any) -> bytes:
        if f.encoding == "npy":
            return npy_bytes(value, f.dtype)
        return np.ascontiguousarray(value, dtype=little_endian(f.dtype)).tobytes()

    def load(self, f: Field, data: Any) -> Any:
        if f.encoding == "npy":
            stored = io.BytesIO(bytes(data))
            array = np.load(stored, allow_pickle=False)
            if str(array.dtype.newbyteorder("=")) != f.dtype and array.dtype != np.dtype(f.dtype):
                raise ValueError(f"holds {array.dtype}, not {f.dtype}")
            return array.astype(f.dtype, copy=False)
        raw = np.frombuffer(bytes(data), dtype=little_endian(f.dtype))
        if not f.variable:
            return raw.reshape(f.shape).astype(f.dtype, copy=False)
        rest = f.shape[1:]
        per = math.prod(rest) if rest else 1
        if per == 0:
            rows = 0  # a (K, 0) array: its rows are not in the bytes
        elif raw.size % per:
            raise ValueError(f"{raw.size} values are not whole rows of {rest}")
        else:
            rows = raw.size // per
        return raw.reshape((rows, *rest)).astype(f.dtype, copy=False)

    def member(self, f: Field, stored: bytes) -> bytes:
        return bytes(stored) if f.encoding == "npy" else npy_bytes(f.load(stored), f.dtype)  # .npy already

    def from_member(self, f: Field, data: bytes | memoryview) -> bytes | memoryview:
        if f.encoding == "npy":
            f.load(data)  # a damaged member fails here, naming it
            return data
        member = io.BytesIO(bytes(data))
        array = np.load(member, allow_pickle=False)
        check_member_array(f, array)  # never cast: a member that no longer fits is damage
        return np.ascontiguousarray(array, dtype=little_endian(f.dtype)).tobytes()

    def value_from_member(self, data: bytes) -> Any:
        member = io.BytesIO(data)
        return np.load(member, allow_pickle=False)

    # --- conversion ------------------------------------------------------------------------------

    def moves_with_image(self, f: Field) -> bool:
        return f.meta.get("tv_tensor") in (BOXES, "Mask")

    def moved(self, f: Field, value: Any, move: Callable[[Any], Any], size: tuple[int, int]) -> Any:
        """Instance masks ``(K, H, W)`` by nearest neighbour, as a mask; boxes moved and scaled."""
        if value is None or not self.moves_with_image(f):
            return value
        import torch
        from torchvision import tv_tensors

        array = np.asarray(value)
        if f.meta.get("tv_tensor") == "Mask":
            wrapped = tv_tensors.Mask(torch.from_numpy(np.ascontiguousarray(array)))
        else:
            width, height = size
            wrapped = tv_tensors.BoundingBoxes(torch.from_numpy(np.ascontiguousarray(array)), format=f.meta["format"],
                                               canvas_size=(height, width))
        return move(wrapped).numpy().astype(array.dtype, copy=False)

    # --- reading ---------------------------------------------------------------------------------

    def read_value(self, f: Field, stored: Any, image_format: str, canvas: Callable[[], tuple[int, int]]) -> Any:
        import torch

        array = f.load(stored) if f.variable else np.asarray(stored)
        if f.meta.get("tv_tensor") == BOXES:
            from torchvision import tv_tensors

            height, width = canvas()
            return tv_tensors.BoundingBoxes(torch.from_numpy(np.array(array)), format=f.meta["format"],
                                            canvas_size=(int(height), int(width)))
        if f.meta.get("tv_tensor") in ("Mask", "Image") and image_format == "tensor":
            from torchvision import tv_tensors

            return getattr(tv_tensors, f.meta["tv_tensor"])(torch.from_numpy(np.array(array)))
        if f.meta.get("as") == "pil":
            return Image.fromarray(np.ascontiguousarray(array))  # uint16: I;16, int32: I, float32: F
        if f.meta.get("as") == "numpy" or image_format == "numpy":
            return np.array(array)
        return torch.from_numpy(np.array(array))

    def paddable(self, f: Field) -> bool:
        # a ragged array ("array:ragged", COCO's (K, H, W) masks) varies in every dimension, so it
        # has no one trailing shape to pad to
        return f.variable and f.shape is not None

    def pad_refusal(self, f: Field) -> str:
        return "is an array of a fixed shape" if f.shape is not None else "is a ragged array (every dimension varies)"

