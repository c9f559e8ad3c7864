"""Python values -> fields: what kind a dataset's value is, the schema the first samples make,
whether a later sample fits it (never casting), and a nested item as flat named values.

:func:`infer` makes a :class:`~fastdata.fields.Schema` from the first samples; :func:`check_record`
refuses a later sample that does not fit, naming the sample, the field and what differs;
:func:`flatten` turns a tuple / dict / ``(image, {"boxes": ..., "labels": ...})`` item into
flat named values and the structure :func:`fastdata.fields.unflatten` gives back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastdata.fields.kinds import Hint, describe_type, inference_order, tv_type
from fastdata.fields.schema import Field, FieldError, Schema
from fastdata.fields.text_kinds import json_plain
from fastdata.images import to_pil

# --- values -> kinds: each kind claims its own (fastdata.fields.kinds) -----------------------


def _not_a_kind(name: str, value: Any, sample: str) -> FieldError:
    return FieldError(
        f"{sample}: field {name!r} is a {describe_type(value)}, which is no field kind (fastdata never pickles). "
        "Return it as a numpy array, a tensor, a str, bytes or plain JSON data (dict/list of numbers and "
        "strings) from the dataset."
    )


def kind_of(name: str, value: Any, hint: str | None, sample: str, image_field: str | None) -> Field | None:
    """The field one value makes (its shape as this value has it); None for a None value. The
    kinds are asked in :func:`~fastdata.fields.kinds.inference_order`: first whether the value's
    type or the hint says their kind (:meth:`~fastdata.fields.kinds.FieldKind.infer`), then
    whether the value is theirs (:meth:`~fastdata.fields.kinds.FieldKind.infer_value`)."""
    if value is None:
        return None
    parsed = Hint.parse(hint, name)
    kinds = inference_order()
    for made in (kind.infer(name, value, parsed, sample, image_field) for kind in kinds):
        if made is not None:
            return made
    for made in (kind.infer_value(name, value, parsed, sample, image_field) for kind in kinds):
        if made is not None:
            return made
    raise _not_a_kind(name, value, sample)


def infer(records: list[tuple[str, dict[str, Any]]], kinds: dict[str, str] | None = None,
          layout: str = "tuple", structure: Any = None, images_may_vary: bool = False) -> Schema:
    """The schema that the first samples' values make (``records``: (sample name, flattened
    record) pairs, at least one); ``kinds`` hints a kind where a value's type does not say it
    (``{"mask": "mask"}``, ``{"keypoints": "array:variable"}``). ``images_may_vary``: the
    conversion takes images of several sizes (encoded, or resized), so an unhinted array of its
    image's size is stored ragged; else (raw, one image size) it stays a fixed array."""
    kinds = dict(kinds or {})
    first_name, first = records[0]
    found: dict[str, Field | None] = {}
    image_field = None
    for name in first:
        made = kind_of(name, first[name], kinds.get(name), first_name, image_field)
        if image_field is None and made is not None and made.kind == "image":
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
            merged = found[name].kind_spec.merge(found[name], made)
            if merged is None:
                check_value(found[name], value, sample)  # the error that says what differs
            found[name] = merged
    # a field None in every probed sample (a stereo dataset's valid mask, a test split's targets):
    # kept as JSON null, which every format stores in a few bytes and reads back as None
    fields = [made if made is not None else Field(name, "json") for name, made in found.items()]
    fields = [_ragged(f) if images_may_vary and f.name not in kinds and _follows_image(f, records, image_field)
              else f for f in fields]
    # boxes name their canvas image once it is known
    fields = [f if f.meta.get("tv_tensor") != "BoundingBoxes" or f.meta.get("canvas_size_of")
              else Field(f.name, f.kind, f.dtype, f.shape, f.encoding, f.mode, dict(f.meta, canvas_size_of=image_field))
              for f in fields]
    return Schema(tuple(fields), layout, structure)


def _follows_image(f: Field, records: list[tuple[str, dict[str, Any]]], image_field: str | None) -> bool:
    """Whether ``f`` is a fixed-shape array whose last two dimensions are its sample's image's
    (H, W) in a probed sample (optical flow (2, H, W), a disparity (1, H, W), SBD's (20, H, W)
    boundaries): where the conversion takes images of several sizes, such a field is stored
    ragged from the start."""
    if f.kind != "array" or f.encoding == "npy" or f.variable or len(f.shape) < 2 or image_field is None:
        return False
    for _, values in records:
        image, value = values.get(image_field), values.get(f.name)
        if value is None or image is None:
            continue
        try:
            width, height = to_pil(image).size
        except (TypeError, ValueError):
            return False
        if tuple(np.shape(value)[-2:]) == (height, width):
            return True
    return False


def _ragged(f: Field) -> Field:
    """``f`` stored as one ``.npy`` per value: every dimension may vary (``"array:ragged"``)."""
    return Field(f.name, f.kind, f.dtype, None, "npy", f.mode, dict(f.meta, ndim=len(f.shape)))


def check_value(f: Field, value: Any, sample: str) -> Any:
    """One value checked against its field (by its kind); normalised (numpy for arrays, the PIL
    image for images). Never cast: a dtype or shape that differs is a :class:`FieldError`."""
    where = f"{sample}: field {f.name!r}"
    kind = f.kind_spec
    if value is None:
        if kind.may_be_empty(f):
            return None
        raise FieldError(f"{where} is None, but {f.kind} fields cannot be empty. Give it a value in every sample.")
    return kind.check(f, value, where)


# --- records: nesting, names --------------------------------------------------------------


def flatten(item: Any, names: list[str] | None = None) -> tuple[dict[str, Any], str, Any]:
    """A dataset item (a bare value, tuple, dict, or a tuple holding a dict, as torchvision's
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
    values: dict[str, Any] = {}
    if not isinstance(item, (tuple, list)):  # a bare value (PhotoTour's patches): given back bare
        return values, "tuple", _flatten_tuple((item,), names, values, set())[0]
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
        if isinstance(value, (tuple, list)) and value and not json_plain(value) and names is None:
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
                raise FieldError(f"{sample}: {where} is a {describe_type(value)}, not the tuple of {len(node)} values "
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
    tv = tv_type(value)
    if tv == "BoundingBoxes":
        return "boxes"
    if tv == "Mask":
        return "mask"
    try:
        made = kind_of("x", value, None, "", "image" if after_image else None)
    except FieldError:
        return "value"
    return made.kind_spec.default_name if made is not None else "value"


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
    return f.kind_spec.digest(f, value)
