"""Arrow columns -> fields: how a Parquet / Arrow table's columns become a sample's named values.

The column's Arrow type (and, where Hugging Face ``datasets`` wrote the table, the feature the
schema's ``huggingface`` metadata names) picks one row of :data:`COLUMN_KINDS`; the row says
which :mod:`fastdata.fields` kind hint the column gives and how a cell becomes a value. The
field kind itself is still decided by :mod:`fastdata.fields` from those values and hints.

=====================================  ===============================================
column                                 field
=====================================  ===============================================
``Image`` struct ``{bytes, path}``     image (bytes kept as they are with --store encoded)
binary holding image bytes (by magic)  image
other binary                           bytes
``ClassLabel``                         int (the label; its names become ``classes``)
strings named by ``--label-column``    int (the label; the sorted values become ``classes``)
ints, bools                            int (bool dtype for bools)
floats                                 float (the column's dtype)
strings                                text
list of strings                        text list
lists, fixed-size lists of numbers     array (variable first dimension unless fixed size)
structs, maps (nested)                 JSON
=====================================  ===============================================
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from PIL import Image

from fastdata.errors import InvalidOptionError, fix_option
from fastdata.fields.schema import NO_LABEL, name_problem
from fastdata.images import ReadOptions, check_pixels, exif_transpose, open_checked

HF_METADATA = b"huggingface"
# the first bytes of the image files Pillow reads (a binary column holding these is an image column)
IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM", b"II*\x00", b"MM\x00*",
               b"P5", b"P6", b"RIFF")


def is_image_bytes(data: Any) -> bool:
    """Whether ``data`` starts as an image file does (WebP: ``RIFF....WEBP``)."""
    if not isinstance(data, (bytes, bytearray)):
        return False
    head = bytes(data[:16])
    if head.startswith(b"RIFF"):
        return head[8:12] == b"WEBP"
    return head.startswith(IMAGE_MAGIC)


def decode_image(data: bytes, read: ReadOptions) -> Image.Image:
    """Encoded image bytes as a loaded PIL image (the pixel limit checked before decoding)."""
    image = open_checked(io.BytesIO(data), read.max_pixels)
    with image:
        image.load()
    check_pixels(image, read.max_pixels)
    return exif_transpose(image) if read.exif_transpose else image


@dataclass(frozen=True)
class CellContext:
    """What a cell needs beyond itself: read options, and how to read an ``Image`` path
    (relative to the data file, never outside its folder)."""

    read: ReadOptions
    read_path: Callable[[str], bytes]


# --- one row per kind of column -------------------------------------------------------------


class ColumnKind:
    """How a column's cells become values; ``hint``: the :mod:`fastdata.fields` kind hint;
    ``what``: what messages call its columns."""

    hint: str | None = None
    image = False
    what = "an integer column"

    def value(self, cell: Any, context: CellContext) -> Any:
        return cell

    def empty(self) -> Any:
        """What a null cell holds: the field's empty value, where its kind has one (the one rule
        for nulls, wherever they are); else the row cannot be converted."""
        raise ValueError(f"null, and {self.what} has no empty value (a row needs a value in it)")

    def encoded(self, cell: Any, context: CellContext) -> bytes:
        raise NotImplementedError


class ImageStructKind(ColumnKind):
    """Hugging Face ``Image``: ``{"bytes": ..., "path": ...}``; bytes win, else the path is read.
    ``mode``: the feature's ``Image(mode=...)``, applied as ``datasets`` applies it (the image
    converted to that mode; its encoded bytes re-encoded as PNG where their mode differs)."""

    hint, image = "image", True

    def __init__(self, mode: str | None = None):
        self.mode = mode

    def stored(self, cell: Any, context: CellContext) -> bytes:
        if cell is None:
            raise ValueError("no image (null)")
        data = cell.get("bytes")
        if data is not None:
            return data
        path = cell.get("path")
        if not path:
            raise ValueError("neither image bytes nor a path")
        return context.read_path(path)

    def encoded(self, cell: Any, context: CellContext) -> bytes:
        data = self.stored(cell, context)
        if self.mode is None:
            return data
        with Image.open(io.BytesIO(data)) as image:  # the header only
            if image.mode == self.mode:
                return data
        out = io.BytesIO()
        self.value(cell, context).save(out, "PNG")
        return out.getvalue()

    def value(self, cell: Any, context: CellContext) -> Any:
        image = decode_image(self.stored(cell, context), context.read)
        return image if self.mode in (None, image.mode) else image.convert(self.mode)


class ImageBytesKind(ImageStructKind):
    """A binary column whose cells are image files."""

    def stored(self, cell: Any, context: CellContext) -> bytes:
        if cell is None:
            raise ValueError("no image (null)")
        return cell


class FileStructKind(ImageStructKind):
    """Another Hugging Face ``{bytes, path}`` feature (``Audio``, ``Pdf``, ``Video``): the file's
    bytes, as a bytes field (never taken for an image)."""

    hint, image = "bytes", False

    def value(self, cell: Any, context: CellContext) -> Any:
        return self.stored(cell, context)

    def empty(self) -> Any:
        return b""


class PlainKind(ColumnKind):
    """Cells that are already values of their kind (ints, bools, text, bytes, JSON)."""

    def __init__(self, hint: str | None = None):
        self.hint = hint

    def value(self, cell: Any, context: CellContext) -> Any:
        if self.hint == "text_list":
            _no_null_inside(cell)
        return cell

    def empty(self) -> Any:
        if self.hint in _EMPTY:
            return _EMPTY[self.hint]()
        return super().empty()


_EMPTY: dict[str, Callable[[], Any]] = {"text": str, "text_list": list, "bytes": bytes, "json": lambda: None}


class BoolKind(PlainKind):
    """Bools: a field of their own, never taken for the label."""

    what = "a bool column"


def check_class_label(label: Any, names: tuple[str, ...]) -> Any:
    """``label`` when it indexes ``names`` or is :data:`NO_LABEL` (Hugging Face's -1, "no
    label"); a ValueError otherwise (a label beyond the names, a damaged file)."""
    if isinstance(label, int) and not isinstance(label, bool) and not NO_LABEL <= label < len(names):
        raise ValueError(f"label {label} is not a class: the ClassLabel has {len(names)} names, so labels are "
                         f"0..{len(names) - 1} (or -1: no label)")
    return label


class ClassLabelKind(PlainKind):
    """A ``ClassLabel`` column: ints checked against its names."""

    what = "a ClassLabel column"

    def __init__(self, names: tuple[str, ...]):
        super().__init__()
        self.names = names

    def value(self, cell: Any, context: CellContext) -> Any:
        return check_class_label(cell, self.names)


class ClassNameKind(ClassLabelKind):
    """A string column named as the label (the usual pandas layout): its distinct values, sorted
    (as ImageFolder sorts class folders), are the classes, and each cell becomes its class's
    index; a null has no class (the row is a bad row)."""

    what = "a string label column"

    def __init__(self, names: tuple[str, ...]):
        super().__init__(names)
        self.index = {name: number for number, name in enumerate(names)}

    def value(self, cell: Any, context: CellContext) -> Any:
        if cell not in self.index:
            raise ValueError(f"the label {cell!r} is not one of the classes the files held when they were scanned")
        return self.index[cell]


class ImageListKind(PlainKind):
    """A list of images (``List(Image())``): fastdata stores one image per field, so such a column
    is refused when chosen (:func:`choose`), naming ``--columns``."""

    def __init__(self) -> None:
        super().__init__("json")


class FloatKind(ColumnKind):
    """Floats kept in the column's dtype (a float32 column stays float32)."""

    what = "a float column"

    def __init__(self, dtype: str):
        self.dtype = np.dtype(dtype)

    def value(self, cell: Any, context: CellContext) -> Any:
        return None if cell is None else self.dtype.type(cell)


class ArrayKind(ColumnKind):
    """Lists of numbers as numpy arrays of the element dtype."""

    what = "a fixed-size list column"

    def __init__(self, dtype: str, fixed: bool, inner: tuple[int, ...] | None = ()):
        """``inner``: the shape under the first level where every inner level has a fixed size
        (a list of boxes: ``(4,)``), else None."""
        self.dtype = np.dtype(dtype)
        self.hint = "array" if fixed else "array:variable"
        self.inner = inner

    def value(self, cell: Any, context: CellContext) -> Any:
        array = np.asarray(_no_null_inside(cell), dtype=self.dtype)
        return array.reshape(0, *self.inner) if array.size == 0 and self.inner else array  # [] of boxes: (0, 4)

    def empty(self) -> Any:
        """An empty array (of the inner shape where the type gives it; else None, which the field
        fills with its own trailing shape)."""
        if self.hint == "array":
            return super().empty()
        return None if self.inner is None else np.empty((0, *self.inner), self.dtype)


def _no_null_inside(cell: list[Any]) -> list[Any]:
    """``cell``, refused when an element of it (at any depth) is null: a list's elements have no
    empty value (a float list's null would otherwise become nan)."""
    for item in cell:
        if item is None:
            raise ValueError("null inside its list, and a list's elements have no empty value (every element needs "
                             "a value)")
        if isinstance(item, list):
            _no_null_inside(item)
    return cell


def _leaf(arrow_type: Any) -> tuple[Any, bool]:
    """The element type under nested lists, and whether every level has a fixed size."""
    import pyarrow as pa

    fixed = True
    while pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        fixed = fixed and pa.types.is_fixed_size_list(arrow_type)
        arrow_type = arrow_type.value_type
    return arrow_type, fixed


def _inner_shape(arrow_type: Any) -> tuple[int, ...] | None:
    """The shape of a list's elements where every level under the first has a fixed size
    (``()`` for a list of numbers), else None."""
    import pyarrow as pa

    shape = []
    arrow_type = arrow_type.value_type
    while _is_list(arrow_type):
        if not pa.types.is_fixed_size_list(arrow_type):
            return None
        shape.append(arrow_type.list_size)
        arrow_type = arrow_type.value_type
    return tuple(shape)


def _numeric(arrow_type: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or pa.types.is_boolean(arrow_type)


def _is_list(arrow_type: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type)


def _list_kind(arrow_type: Any) -> ColumnKind:
    import pyarrow as pa

    leaf, fixed = _leaf(arrow_type)
    if pa.types.is_string(leaf) or pa.types.is_large_string(leaf):
        inner = arrow_type.value_type
        return PlainKind("text_list") if pa.types.is_string(inner) or pa.types.is_large_string(inner) else PlainKind("json")
    if _numeric(leaf):
        return ArrayKind(leaf.to_pandas_dtype().__name__ if not pa.types.is_boolean(leaf) else "bool", fixed,
                         _inner_shape(arrow_type))
    return PlainKind("json")


def _is_file_struct(arrow_type: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_struct(arrow_type) and {arrow_type.field(i).name for i in range(arrow_type.num_fields)} == {
        "bytes", "path"}


def _is_image_struct(arrow_type: Any, feature: dict[str, Any] | None) -> bool:
    """An ``Image`` feature, or a ``{bytes, path}`` struct no feature names otherwise."""
    import pyarrow as pa

    if not pa.types.is_struct(arrow_type):
        return False
    return (feature or {}).get("_type") == "Image" or (_is_file_struct(arrow_type) and not (feature or {}).get("_type"))


# (test on the Arrow type and the HF feature, the kind it makes); the first that matches decides
def _rows() -> list[tuple[Callable[[Any, dict | None], bool], Callable[[Any], ColumnKind]]]:
    import pyarrow as pa

    return [
        (_is_image_struct, lambda t: ImageStructKind()),
        (lambda t, f: _is_file_struct(t), lambda t: FileStructKind()),  # Audio, Pdf, Video: their files' bytes
        (lambda t, f: pa.types.is_boolean(t), lambda t: BoolKind()),
        (lambda t, f: pa.types.is_integer(t), lambda t: PlainKind()),
        (lambda t, f: pa.types.is_floating(t), lambda t: FloatKind(t.to_pandas_dtype().__name__)),
        (lambda t, f: pa.types.is_string(t) or pa.types.is_large_string(t), lambda t: PlainKind("text")),
        (lambda t, f: pa.types.is_binary(t) or pa.types.is_large_binary(t), lambda t: PlainKind("bytes")),
        (lambda t, f: _is_list(t) and _is_image_struct(t.value_type, (f or {}).get("feature")), lambda t: ImageListKind()),
        (lambda t, f: _is_list(t), _list_kind),
        (lambda t, f: pa.types.is_struct(t) or pa.types.is_map(t), lambda t: PlainKind("json")),
    ]


@dataclass(frozen=True)
class Column:
    """A column as a field: ``name`` (the field), its ``kind``, and ClassLabel ``names``."""

    name: str
    kind: ColumnKind
    names: tuple[str, ...] | None = None


def is_text(column: Column) -> bool:
    """Whether ``column`` holds plain strings (a string label column's classes are its values)."""
    return type(column.kind) is PlainKind and column.kind.hint == "text"


def class_names_column(column: Column, values: set[str]) -> Column:
    """String column ``column`` as class labels: ``values`` (its distinct values), sorted, are the classes."""
    names = tuple(sorted(values))
    return Column(column.name, ClassNameKind(names), names)


def hf_features(schema: Any) -> dict[str, dict[str, Any]]:
    """The Hugging Face features the schema's metadata records (``{}`` when none)."""
    metadata = schema.metadata or {}
    if HF_METADATA not in metadata:
        return {}
    try:
        document = json.loads(metadata[HF_METADATA])
    except ValueError:
        return {}
    features = (document.get("info") or {}).get("features") if isinstance(document, dict) else None
    return features if isinstance(features, dict) else {}


def column_of(name: str, arrow_type: Any, feature: dict[str, Any] | None, where: str) -> Column:
    """The :class:`Column` a column of ``arrow_type`` (and HF ``feature``) makes; a dictionary-
    encoded column (pandas' ``category``) by its values' type."""
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    for test, make in _rows():
        if test(arrow_type, feature):
            kind = make(arrow_type)
            names = _class_names(name, feature, where)
            if names is not None and type(kind) is PlainKind and kind.hint is None:
                kind = ClassLabelKind(names)
            if type(kind) is ImageStructKind and (feature or {}).get("mode"):
                kind = ImageStructKind(str(feature["mode"]))
            return Column(name, kind, names)
    raise InvalidOptionError(f"{where}: column {name!r} has Arrow type {arrow_type}, which fastdata does not convert. "
                             f"Leave it out with {fix_option('columns', 'NAMES')}.")


def _class_names(name: str, feature: dict[str, Any] | None, where: str) -> tuple[str, ...] | None:
    """A ``ClassLabel`` feature's class names (None for another feature)."""
    if (feature or {}).get("_type") != "ClassLabel":
        return None
    names = feature.get("names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InvalidOptionError(f"{where}: column {name!r} is a ClassLabel whose metadata lists no class names "
                                 f"(names: {names!r}); the file's Hugging Face metadata is damaged. Write the file "
                                 f"again with datasets, or pass {fix_option('label_column', name)} to read the labels as plain integers.")
    return tuple(names)


def detect_image_bytes(columns: list[Column], first_cells: dict[str, Any]) -> list[Column]:
    """Binary columns whose first non-null cell is an image file become image columns (by magic,
    not by name)."""
    return [Column(c.name, ImageBytesKind(), c.names) if c.kind.hint == "bytes" and is_image_bytes(first_cells.get(c.name))
            else c for c in columns]


def choose(columns: list[Column], selected: tuple[str, ...] | None, label_column: str | None,
           where: str) -> tuple[list[Column], Column | None]:
    """The columns to convert, in order (``selected``: ``--columns``), and the label column
    (``label_column``: an int or string column, else the one ClassLabel column, else an int
    column named ``label``)."""
    by_name = {c.name: c for c in columns}
    available = ", ".join(by_name)
    for name in list(selected or ()) + ([label_column] if label_column else []):
        if name not in by_name:
            option = fix_option("label_column", "NAME") if name == label_column else fix_option("columns", "NAMES")
            raise InvalidOptionError(f"{where}: has no column {name!r} (columns: {available}). Check {option}.")
    chosen = [by_name[n] for n in selected] if selected else list(columns)
    for column in chosen:
        if isinstance(column.kind, ImageListKind):
            others = ",".join(c.name for c in chosen if not isinstance(c.kind, ImageListKind))
            raise InvalidOptionError(f"{where}: column {column.name!r} holds a list of images, which fastdata does not "
                                     f"convert (one image per field). Leave it out: {fix_option('columns', others)}.")
    if label_column is not None:
        label = by_name[label_column]
        integer = isinstance(label.kind, PlainKind) and label.kind.hint is None and not isinstance(label.kind, BoolKind)
        if not integer and not is_text(label):
            raise InvalidOptionError(f"{where}: --label-column {label_column!r} is not an integer or string column.")
        if label not in chosen:
            chosen.append(label)
        return chosen, label
    class_labels = [c for c in chosen if c.names is not None]
    if len(class_labels) == 1:
        return chosen, class_labels[0]
    return chosen, next((c for c in chosen if c.name == "label" and c.kind.hint is None
                         and not isinstance(c.kind, (FloatKind, BoolKind))), None)


def check_field_names(columns: list[Column], where: str) -> None:
    """Every column stored as a field has a name a field can have (it names files and members)."""
    for column in columns:
        problem = name_problem(column.name)
        if problem is not None:
            raise InvalidOptionError(f"{where}: column {column.name!r} cannot name a field ({problem}). Leave it out "
                                     f"with {fix_option('columns', 'NAMES')}, or rename the column.")
