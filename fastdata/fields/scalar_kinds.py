"""The scalar field kinds: ``int`` (int64 or bool) and ``float`` (float16/32/64), kept as one
little-endian row each, stacked in batches, ``.cls`` and ``.json`` tar members."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from fastdata.fields.kinds import (
    ARRAY_DTYPES, FieldError, FieldKind, Hint, Stored, as_numpy, describe_type, is_array, little_endian,
    is_tensor, tv_type,
)
from fastdata.fields.schema import Field

INT_DTYPES = ("bool",) + tuple(d for d in ARRAY_DTYPES if d.startswith(("int", "uint")))


class ScalarKind(FieldKind):
    """A number per sample: one fixed row, a tensor per batch."""

    def variable(self, f: Field) -> bool:
        return False

    def store(self, f: Field, value: Any) -> bytes:
        return np.ascontiguousarray(value, dtype=little_endian(f.dtype)).tobytes()

    def load(self, f: Field, data: bytes | memoryview | np.ndarray) -> Any:
        return np.frombuffer(bytes(data), dtype=little_endian(f.dtype))[0].item()

    @staticmethod
    def zero_d(value: Any) -> np.ndarray | None:
        """A 0-d tensor or array of a dtype fastdata stores (else None: not a scalar's)."""
        if not is_array(value):
            return None
        array = as_numpy(value)
        return array if array.ndim == 0 and str(array.dtype) in ARRAY_DTYPES else None


class IntKind(ScalarKind):
    """Python and numpy integers and bools, 0-d integer tensors: int64 (bool: bool)."""

    name, default_name, member_extension, infer_rank = "int", "label", "cls", 70
    stored = Stored(INT_DTYPES, (None,), (None,), "scalar")

    def infer_value(self, name: str, value: Any, hint: Hint, sample: str, image_field: str | None) -> Field | None:
        if isinstance(value, (bool, np.bool_)):
            return Field(name, "int", dtype="bool", shape=())
        if isinstance(value, (int, np.integer)):
            return Field(name, "int", dtype="int64", shape=())
        array = self.zero_d(value)
        if array is not None and array.dtype.kind in "iub":
            dtype = "bool" if array.dtype.kind == "b" else "int64"
            # a 0-d torch tensor of that dtype (CelebA's identity, PhotoTour's match flag) is given back as one
            tensor = is_tensor(value) and str(array.dtype) == dtype
            return Field(name, "int", dtype=dtype, shape=(), meta={"as": "tensor"} if tensor else {})
        return None

    def check(self, f: Field, value: Any, where: str) -> Any:
        if tv_type(value) is None and is_array(value):
            array = as_numpy(value)
            if array.ndim:
                raise FieldError(f"{where} is an array of shape {array.shape}; the first samples have an int there.")
            value = array.item()
        if f.dtype == "bool":
            if not isinstance(value, (bool, np.bool_)):
                raise FieldError(f"{where} is {describe_type(value)} {value!r}; the first samples have a bool there.")
            return bool(value)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise FieldError(f"{where} is {describe_type(value)} {str(value)[:40]!r}; the first samples have an int "
                             "there (never cast). Return an int in every sample.")
        value = int(value)
        if not -(1 << 63) <= value < (1 << 63):
            raise FieldError(f"{where} is {value}, which does not fit int64.")
        return value

    def member(self, f: Field, stored: bytes) -> bytes:
        return str(f.load(stored)).encode("ascii") if f.dtype != "bool" else str(int(f.load(stored))).encode()

    def from_member(self, f: Field, data: bytes | memoryview) -> bytes:
        text = bytes(data).decode("ascii").strip()
        return f.store(bool(int(text)) if f.dtype == "bool" else int(text))

    def value_from_member(self, data: bytes) -> Any:
        return int(data.strip())

    def read_value(self, f: Field, stored: Any, image_format: str, canvas: Any) -> Any:
        value = bool(stored) if f.dtype == "bool" else int(stored)
        if f.meta.get("as") == "tensor":
            import torch

            return torch.tensor(value, dtype=torch.bool if f.dtype == "bool" else torch.int64)
        return value

    def stacked(self, f: Field, rows: np.ndarray) -> np.ndarray:
        return rows if f.dtype == "bool" else rows.astype(np.int64, copy=False)


class FloatKind(ScalarKind):
    """Python floats (float64), numpy floating scalars and 0-d float tensors (their dtype)."""

    name, default_name, member_extension, infer_rank = "float", "score", "json", 80
    stored = Stored(("float16", "float32", "float64"), (None,), (None,), "scalar")

    def infer_value(self, name: str, value: Any, hint: Hint, sample: str, image_field: str | None) -> Field | None:
        if isinstance(value, float):
            return Field(name, "float", dtype="float64", shape=())
        if isinstance(value, np.floating):
            return Field(name, "float", dtype=str(value.dtype), shape=())
        array = self.zero_d(value)
        if array is not None and array.dtype.kind not in "iub":
            return Field(name, "float", dtype=str(array.dtype), shape=())
        return None

    def check(self, f: Field, value: Any, where: str) -> Any:
        if is_array(value):
            array = as_numpy(value)
            if array.ndim or array.dtype.kind != "f":
                raise FieldError(f"{where} is an array of dtype {array.dtype} shape {array.shape}; the first samples "
                                 "have a float there.")
            value = array[()]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (float, np.floating)):
            raise FieldError(f"{where} is {describe_type(value)} {str(value)[:40]!r}; the first samples have a "
                             "float there (never cast). Return a float in every sample.")
        if isinstance(value, np.floating) and str(value.dtype) != f.dtype:
            raise FieldError(f"{where} has dtype {value.dtype}; the first samples have {f.dtype} (never cast).")
        return value

    def member(self, f: Field, stored: bytes) -> bytes:
        return json.dumps(f.load(stored)).encode("ascii")

    def from_member(self, f: Field, data: bytes | memoryview) -> bytes:
        return f.store(float(json.loads(bytes(data).decode("ascii"))))

    def read_value(self, f: Field, stored: Any, image_format: str, canvas: Any) -> Any:
        return float(stored)

    def batch_dtype(self, f: Field) -> str | None:
        return f.dtype

