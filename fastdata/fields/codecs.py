"""How each field kind's values are kept as bytes (docs/fields.md, "How each format stores it").

Every non-image value has *stored bytes* (:func:`store` / :func:`load`): the raw little-endian
row of a fixed-shape field (so a format keeps fixed fields as one ``(N, *shape)`` array), or the
variable bytes of the others (kept as data + offsets). Tar members use WebDataset's conventions
instead (:func:`member` / :func:`from_member`): ``.cls`` ints, ``.json`` floats and lists,
``.txt`` text, ``.npy`` arrays, so stock ``webdataset`` decodes them with its default decoders;
:func:`member_key_problem` says which sample keys can name such members.

The functions take a :class:`fastdata.fields.Field` (its ``kind``, ``dtype``, ``shape``,
``encoding`` and ``name``); ``Field`` calls them from its methods of the same names, so this
module imports nothing of :mod:`fastdata.fields.schema`.
"""

from __future__ import annotations

import io
import json
import math
import re
from typing import Any

import numpy as np

from fastdata.errors import CorruptDataError

_SPATIAL = ("image", "mask")  # fastdata.fields.SPATIAL (not imported: the schema imports this module)
_ORIGINAL_SUFFIXES = ("jpg", "jpeg", "png", "webp", "ppm", "pgm", "bmp", "tif", "tiff")


# --- stored bytes -------------------------------------------------------------------------
def store(field: Any, value: Any) -> bytes:
    """A checked value (non-image kinds) as its stored bytes."""
    kind = field.kind
    if value is None:
        return b""
    if kind == "array" and field.encoding == "npy":
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(value, dtype=np.dtype(field.dtype).newbyteorder("<")), allow_pickle=False)
        return buffer.getvalue()
    if kind in ("int", "float", "array"):
        array = np.ascontiguousarray(value, dtype=np.dtype(field.dtype).newbyteorder("<"))
        return array.tobytes()
    if isinstance(value, bytes) and kind in ("text", "json"):
        return value  # checked, kept as it was
    if kind == "text":
        return value.encode("utf-8")
    if kind in ("text_list", "json"):
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    if kind == "bytes":
        return bytes(value)
    if kind in _SPATIAL:
        return value if isinstance(value, bytes) else np.ascontiguousarray(value, dtype=np.uint8).tobytes()
    raise AssertionError(kind)


def load(field: Any, data: bytes | memoryview | np.ndarray, where: str = "") -> Any:
    """Stored bytes (or, for fixed fields, the stored row) back as the value a reader gives."""
    kind = field.kind
    try:
        if kind in ("int", "float"):
            array = np.frombuffer(bytes(data), dtype=np.dtype(field.dtype).newbyteorder("<"))
            return array[0].item()
        if kind == "array" and field.encoding == "npy":
            stored = io.BytesIO(bytes(data))
            array = np.load(stored, allow_pickle=False)
            if str(array.dtype.newbyteorder("=")) != field.dtype and array.dtype != np.dtype(field.dtype):
                raise ValueError(f"holds {array.dtype}, not {field.dtype}")
            return array.astype(field.dtype, copy=False)
        if kind == "array":
            raw = np.frombuffer(bytes(data), dtype=np.dtype(field.dtype).newbyteorder("<"))
            if field.variable:
                rest = field.shape[1:]
                per = math.prod(rest) if rest else 1
                if per == 0:
                    rows = 0  # a (K, 0) array: its rows are not in the bytes
                elif raw.size % per:
                    raise ValueError(f"{raw.size} values are not whole rows of {rest}")
                else:
                    rows = raw.size // per
                return raw.reshape((rows, *rest)).astype(field.dtype, copy=False)
            return raw.reshape(field.shape).astype(field.dtype, copy=False)
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
        raise CorruptDataError(f"{where}field {field.name!r}: damaged {kind} data ({exc}). "
                               "Run 'fastdata verify' or convert the source again.") from exc
    raise AssertionError(kind)

# --- WebDataset members (tar) ------------------------------------------------------------


def extension(field: Any) -> str:
    """The extension WebDataset's default decoders read this field's member with."""
    if field.kind == "int":
        return "cls"
    if field.kind == "text":
        return "txt"
    if field.kind in ("float", "text_list", "json"):
        return "json"
    if field.kind == "array":
        return "npy"
    if field.kind == "bytes":
        return "bin"
    if field.encoding == "raw":
        return "npy"
    if field.encoding == "original":  # a source's own file (a WebDataset member): its name says its type
        last = field.name.rsplit(".", 1)[-1].lower()
        return last if last in _ORIGINAL_SUFFIXES else "img"
    if field.kind == "mask":
        return "png"
    return field.encoding if field.encoding in ("png",) else ("jpg" if field.encoding == "jpeg" else "img")


def member_suffix(field: Any, extension_name: str | None = None) -> str:
    """The member name after ``<key>.``: the field's name when it already ends in the
    extension WebDataset decodes it by (``txt``, ``seg.png``), else ``<name>.<extension>``."""
    suffix = extension_name or extension(field)
    if field.name == suffix or field.name.endswith("." + suffix):
        return field.name
    return f"{field.name}.{suffix}"


MEMBER_NAME_BYTES = 100  # a ustar header's name field (fastdata's tar writer writes no prefix field)
_KEY_CHARACTERS = re.compile(r"[!-~]+")  # printable ASCII, no space


def member_key_problem(key: str, longest_suffix: int = 0) -> str | None:
    """Why ``key`` cannot be the ``<key>`` of member names ``<key>.<suffix>`` (suffixes up to
    ``longest_suffix`` characters), or None when it can: stock ``webdataset`` reads such members
    back as one sample of exactly that ``__key__`` (it ends a key at the first dot of the file
    name), and extracting the shard with ``tar`` writes inside the current directory only."""
    if not isinstance(key, str) or not key:
        return "it is empty"
    if not _KEY_CHARACTERS.fullmatch(key) or "\\" in key:
        return "it holds characters other than printable ASCII without spaces and backslashes"
    parts = key.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "it is not a relative path of plain names"
    if "." in parts[-1]:
        return "its file name holds a dot, where webdataset would end the key"
    if len(key) + 1 + longest_suffix > MEMBER_NAME_BYTES:
        return f"with a {longest_suffix}-character suffix it is longer than a tar header's {MEMBER_NAME_BYTES} characters"
    return None


def member(field: Any, stored: bytes) -> bytes:
    """Stored bytes as the member WebDataset's default decoders read."""
    kind = field.kind
    if kind == "int":
        return str(load(field, stored)).encode("ascii") if field.dtype != "bool" else str(int(load(field, stored))).encode()
    if kind == "float":
        return json.dumps(load(field, stored)).encode("ascii")
    if kind == "text_list" and not stored:
        return b"[]"
    if kind == "json" and not stored:
        return b"null"
    if kind == "array" and field.encoding == "npy":
        return bytes(stored)  # already an .npy file
    if kind == "array" or (kind in _SPATIAL and field.encoding == "raw"):
        value = load(field, stored) if kind == "array" else np.frombuffer(stored, np.uint8).reshape(field.shape)
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(value, dtype=np.dtype(field.dtype).newbyteorder("<")), allow_pickle=False)
        return buffer.getvalue()
    return bytes(stored)


def from_member(field: Any, data: bytes | memoryview, where: str = "") -> bytes | memoryview:
    """A member's bytes (or a view of them) back as stored bytes (the same view where they are
    the same bytes)."""
    kind = field.kind
    try:
        if kind == "int":
            text = bytes(data).decode("ascii").strip()
            return store(field, bool(int(text)) if field.dtype == "bool" else int(text))
        if kind == "float":
            return store(field, float(json.loads(bytes(data).decode("ascii"))))
        if kind == "text_list" and data == b"[]":
            return b""
        if kind == "json" and data == b"null":
            return b""
        if kind == "array" and field.encoding == "npy":
            load(field, data)  # a damaged member fails here, naming it
            return data
        if kind == "array" or (kind in _SPATIAL and field.encoding == "raw"):
            stored = io.BytesIO(bytes(data))
            array = np.load(stored, allow_pickle=False)
            _check_member_array(field, array)  # never cast: a member that no longer fits is damage
            return np.ascontiguousarray(array, dtype=np.dtype(field.dtype).newbyteorder("<")).tobytes()
    except (ValueError, UnicodeDecodeError, EOFError, OSError) as exc:
        raise CorruptDataError(f"{where}field {field.name!r}: damaged {kind} member ({exc}). "
                               "Run 'fastdata verify' or convert the source again.") from exc
    return data


def _check_member_array(field: Any, array: np.ndarray) -> None:
    """A ``.npy`` member's array has the field's dtype and shape (a variable field: its trailing
    shape); else ValueError saying what differs."""
    shape = tuple(field.shape) if field.shape is not None else None
    if array.dtype.newbyteorder("=") != np.dtype(field.dtype).newbyteorder("="):
        raise ValueError(f"holds {array.dtype}, the manifest says {field.dtype}")
    if shape is None:
        return
    fits = (array.ndim == len(shape) and tuple(array.shape[1:]) == shape[1:]) if None in shape \
        else tuple(array.shape) == shape
    if not fits:
        shown = tuple("K" if s is None else s for s in shape)
        raise ValueError(f"has shape {tuple(array.shape)}, the manifest says {shown}")
