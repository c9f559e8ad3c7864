"""The kinds of variable bytes: ``text`` (UTF-8), ``text_list`` (captions, JSON), ``json``
(plain JSON data) and ``bytes`` (as they are), one ``.txt`` / ``.json`` / ``.bin`` tar member each."""

from __future__ import annotations

import json
import math
from typing import Any

from fastdata.fields.kinds import FieldError, FieldKind, Hint, describe_type
from fastdata.fields.schema import Field


def json_plain(value: Any) -> bool:
    """``value`` is plain JSON data: dicts with str keys, lists, str, int, finite float, bool, None."""
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(json_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and json_plain(v) for k, v in value.items())
    return False


def _dumped(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


class BytesValuedKind(FieldKind):
    """A kind whose values are variable bytes; a ``kinds`` hint naming it decides the kind of
    any value but an image, a mask or boxes (whose types say theirs)."""

    def infer(self, name: str, value: Any, hint: Hint, sample: str, image_field: str | None) -> Field | None:
        return Field(name, self.name) if hint.kind == self.name else None


class TextKind(BytesValuedKind):
    name, default_name, member_extension, infer_rank = "text", "text", "txt", 30

    def infer_value(self, name: str, value: Any, hint: Hint, sample: str, image_field: str | None) -> Field | None:
        return Field(name, "text") if isinstance(value, str) else None

    def check(self, f: Field, value: Any, where: str) -> Any:
        if isinstance(value, (bytes, bytearray)):  # text as it was stored (a WebDataset .txt member): kept as is
            try:
                bytes(value).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise FieldError(f"{where} is not UTF-8 text ({exc.reason} at byte {exc.start}).") from None
            return bytes(value)
        if not isinstance(value, str):
            raise FieldError(f"{where} is a {describe_type(value)}; the first samples have text (str) there.")
        return value

    def store(self, f: Field, value: Any) -> bytes:
        return value if isinstance(value, bytes) else value.encode("utf-8")  # bytes: checked, kept as they were

    def load(self, f: Field, data: Any) -> Any:
        return bytes(data).decode("utf-8")


class TextListKind(BytesValuedKind):
    name, default_name, member_extension, infer_rank, json_valued = "text_list", "captions", "json", 31, True

    def infer_value(self, name: str, value: Any, hint: Hint, sample: str, image_field: str | None) -> Field | None:
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
            return Field(name, "text_list")
        return None

    def check(self, f: Field, value: Any, where: str) -> Any:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise FieldError(f"{where} is a {describe_type(value)}; the first samples have a list of str there.")
        return list(value)

    def store(self, f: Field, value: Any) -> bytes:
        return _dumped(value)

    def load(self, f: Field, data: Any) -> Any:
        raw = bytes(data)
        return json.loads(raw.decode("utf-8")) if raw else []

    def member(self, f: Field, stored: bytes) -> bytes:
        return bytes(stored) if stored else b"[]"

    def from_member(self, f: Field, data: bytes | memoryview) -> bytes | memoryview:
        return b"" if data == b"[]" else data


class JsonKind(BytesValuedKind):
    name, default_name, member_extension, infer_rank, json_valued = "json", "target", "json", 32, True

    def infer_value(self, name: str, value: Any, hint: Hint, sample: str, image_field: str | None) -> Field | None:
        if not isinstance(value, (list, tuple, dict)):
            return None
        if not json_plain(value):
            raise FieldError(
                f"{sample}: field {name!r} holds something that is not plain JSON data (only dicts with str keys, "
                "lists, str, int, finite float, bool, None). Convert it in the dataset, or return the arrays as "
                "fields of their own."
            )
        return Field(name, "json", meta={"as": "tuple"} if isinstance(value, tuple) else {})  # INaturalist's tuple

    def read_value(self, f: Field, stored: Any, image_format: str, canvas: Any) -> Any:
        value = f.load(stored)
        return tuple(value) if f.meta.get("as") == "tuple" and isinstance(value, list) else value

    def check(self, f: Field, value: Any, where: str) -> Any:
        if isinstance(value, (bytes, bytearray)):  # JSON as it was stored (a WebDataset .json member): kept as is
            try:
                json.loads(bytes(value).decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                raise FieldError(f"{where} is not valid JSON ({str(exc)[:80]}).") from None
            return bytes(value)
        if not json_plain(value):
            raise FieldError(f"{where} holds something that is not plain JSON data (only dicts with str keys, lists, "
                             "str, int, finite float, bool, None). Convert it in the dataset.")
        return value

    def store(self, f: Field, value: Any) -> bytes:
        return value if isinstance(value, bytes) else _dumped(value)  # bytes: checked, kept as they were

    def load(self, f: Field, data: Any) -> Any:
        raw = bytes(data)
        return json.loads(raw.decode("utf-8")) if raw else None

    def member(self, f: Field, stored: bytes) -> bytes:
        return bytes(stored) if stored else b"null"

    def from_member(self, f: Field, data: bytes | memoryview) -> bytes | memoryview:
        return b"" if data == b"null" else data


class BytesKind(BytesValuedKind):
    name, default_name, member_extension, infer_rank = "bytes", "data", "bin", 33

    def infer_value(self, name: str, value: Any, hint: Hint, sample: str, image_field: str | None) -> Field | None:
        return Field(name, "bytes") if isinstance(value, (bytes, bytearray, memoryview)) else None

    def check(self, f: Field, value: Any, where: str) -> Any:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise FieldError(f"{where} is a {describe_type(value)}; the first samples have bytes there.")
        return bytes(value)

    def store(self, f: Field, value: Any) -> bytes:
        return bytes(value)

    def load(self, f: Field, data: Any) -> Any:
        return bytes(data)

