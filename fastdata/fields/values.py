"""Python values -> fields: what kind a dataset's value is, the schema the first samples make,
whether a later sample fits it (never casting), and a nested item as flat named values.

:func:`infer` makes a :class:`~fastdata.fields.Schema` from the first samples; :func:`check_record`
refuses a later sample that does not fit, naming the sample, the field and what differs;
:func:`flatten` turns a tuple / dict / ``(image, {"boxes": ..., "labels": ...})`` item into
flat named values and the structure :func:`fastdata.fields.unflatten` gives back.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from PIL import Image

from fastdata.errors import InvalidOptionError
from fastdata.fields.schema import ARRAY_DTYPES, KINDS, RAGGED, SPATIAL, VARIABLE, Field, FieldError, Schema


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


def _is_palette_image(value: Any) -> bool:
    """A PIL image of palette indices (mode ``P``): after a sample's image, a segmentation mask of
    class ids (VOC's, SBD's), as torchvision's datasets give them; hint ``"image"`` for a picture."""
    return isinstance(value, Image.Image) and value.mode == "P"


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
        if str(array.dtype) not in ARRAY_DTYPES:
            raise FieldError(f"{sample}: field {name!r} is an array of dtype {array.dtype}, which fastdata does not "
                             f"store (never pickled). Use one of: {', '.join(ARRAY_DTYPES)}.")
        if ragged:  # every dimension may vary (COCO's (K, H, W) instance masks): each value an .npy
            return Field(name, "array", dtype=str(array.dtype), encoding="npy", meta=dict(meta, ndim=array.ndim))
        if variable and array.ndim:
            return variable_array(name, str(array.dtype), tuple(array.shape[1:]), meta)
        return Field(name, "array", dtype=str(array.dtype), shape=tuple(array.shape), meta=meta)
    if tv == "Mask" or (hint == "mask" and (isinstance(value, Image.Image) or _is_tensor(value) or isinstance(value, np.ndarray))) \
            or (hint is None and image_field is not None and _is_palette_image(value)):
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
        if str(array.dtype) not in ARRAY_DTYPES:
            raise FieldError(f"{sample}: field {name!r} is an array of dtype {array.dtype}, which fastdata does not "
                             f"store (never pickled). Use one of: {', '.join(ARRAY_DTYPES)}.")
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
    ``wrap_dataset_for_transforms_v2`` gives, or a tuple holding a tuple of images, masks or
    arrays, as torchvision's datasets with several target types give, ``(image, (label,
    mask))``) as (flat named values, layout, structure)."""
    if isinstance(item, dict):
        values = {}
        for key, value in item.items():
            if not isinstance(key, str):
                raise FieldError(f"dict keys must be str field names, got {key!r}")
            values[key] = value
        return values, "dict", {k: k for k in values}
    if not isinstance(item, (tuple, list)):
        item = (item,)
    values: dict[str, Any] = {}
    return values, "tuple", _flatten_tuple(item, names, values, set())


def _flatten_tuple(item: Any, names: list[str] | None, values: dict[str, Any], taken: set[str]) -> list:
    """A tuple's values into ``values`` (named by ``names``, else by kind); its structure."""
    structure: list = []
    for position, value in enumerate(item):
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value) and names is None:
            inner = {}
            for key, sub in value.items():
                name = _unique(key, taken)
                values[name] = sub
                inner[key] = name
            structure.append(inner)
            continue
        if isinstance(value, (tuple, list)) and value and not _json_plain(value) and names is None:
            structure.append(_flatten_tuple(value, None, values, taken))  # (label, mask): fields, not JSON
            continue
        name = names[position] if names and position < len(names) else _unique(_guess_name(value, bool(values)), taken)
        taken.add(name)
        values[name] = value
        structure.append(name)
    return structure


def flatten_as(item: Any, structure: Any, sample: str) -> dict[str, Any]:
    """A sample laid out as ``structure`` (what :func:`fastdata.fields.unflatten` makes: tuples
    for lists, dicts for dicts) as flat named values, in the order the structure names them; a
    :class:`FieldError` naming ``sample`` where it is laid out otherwise."""
    values: dict[str, Any] = {}
    pending = [(item, structure, "the sample")]
    while pending:
        value, node, where = pending.pop(0)
        if isinstance(node, list):
            if not isinstance(value, (tuple, list)) or len(value) != len(node):
                raise FieldError(f"{sample}: {where} is a {_describe_type(value)}, not the tuple of {len(node)} values "
                                 "the dataset's schema says.")
            pending += [(v, s, f"{where}[{i}]") for i, (v, s) in enumerate(zip(value, node))]
        elif isinstance(node, dict):
            if not isinstance(value, dict) or set(value) != set(node):
                raise FieldError(f"{sample}: {where} is not the dict of {sorted(node)} the dataset's schema says.")
            pending += [(value[key], s, f"{where}[{key!r}]") for key, s in node.items()]
        else:
            values[node] = value
    return values


def _guess_name(value: Any, after_image: bool = False) -> str:
    """A tuple position's name by its value's kind (``after_image``: a value after the first, which
    is the image where the sample has one)."""
    tv = _tv_type(value)
    if tv == "BoundingBoxes":
        return "boxes"
    if tv == "Mask":
        return "mask"
    try:
        made = kind_of("x", value, None, "", "image" if after_image else None)
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


def check_record(schema: Schema, values: dict[str, Any], sample: str) -> dict[str, Any]:
    """``values`` (a flattened record) checked against ``schema``, normalised (tensors as
    numpy, tv_tensors unwrapped); a :class:`FieldError` naming ``sample`` and the field."""
    missing = [n for n in schema.names if n not in values]
    if missing:
        raise FieldError(f"{sample}: has no field {missing[0]!r}, which the first samples have. "
                         "Give every sample every field (None for an empty one).")
    extra = [n for n in values if n not in schema.names]
    if extra:
        raise FieldError(f"{sample}: field {extra[0]!r} is not in the schema (the first samples do not have it). "
                         "Give every sample the same fields.")
    return {f.name: check_value(f, values[f.name], sample) for f in schema.fields}


def digest_value(f: Field, value: Any) -> bytes:
    """Bytes that stand for a checked value in a source fingerprint (images by mode, size, pixels)."""
    if f.kind in SPATIAL:
        return f"{value.mode} {value.size}\n".encode() + value.tobytes()
    return f.store(value)
