"""Fields that move with the image: masks, extra images and boxes through ``--resize`` and
``--center-crop``, and each extra field's stored bytes (:mod:`fastdata.fields`).

The geometry is torchvision's: ``transforms.v2.functional.resize``/``center_crop`` on
``tv_tensors.Mask`` (nearest neighbour, never colour-converted) and ``tv_tensors.BoundingBoxes``
(moved and scaled with the image; what torchvision does with boxes that leave the canvas is
what happens to them, fastdata does not clip them itself). Nothing here reimplements geometry;
what each field kind does with it is the kind's (:class:`fastdata.fields.FieldKind`:
``check_beside_image``, ``moved``, ``converted``).
"""

from __future__ import annotations

from typing import Any

from fastdata.fields import Field, Schema
from fastdata.formats.base import Plan
from fastdata.images import Geometry


def moves_with_image(fields: list[Field]) -> bool:
    """Some of ``fields`` change with the image's geometry (or are checked against its size)."""
    return any(f.kind_spec.moves_with_image(f) for f in fields)


def transform_fields(schema: Schema, values: dict[str, Any], size: tuple[int, int], geometry: Geometry,
                     sample: str) -> dict[str, Any]:
    """``values`` with every mask and box field given the image's geometry (``size``: the
    image's (width, height) before it); a mask of another size than its image is an error."""
    out = dict(values)
    for f in schema.extras:
        f.kind_spec.check_beside_image(f, out[f.name], size, schema.image.name, sample)
    if geometry.is_identity:
        return out
    from torchvision.transforms.v2 import functional as F  # only for conversions that resize fields: a light CLI start

    def moved(value: Any) -> Any:
        if geometry.resize is not None:
            value = F.resize(value, list(geometry.resize))
        if geometry.center_crop is not None:
            value = F.center_crop(value, list(geometry.center_crop))
        return value

    for f in schema.extras:
        out[f.name] = f.kind_spec.moved(f, out[f.name], moved, size)
    return out


def store_field(f: Field, value: Any, plan: Plan, sample: str) -> bytes:
    """One extra field's stored bytes: masks lossless (raw uint8 rows or PNG), extra images
    with the image's geometry and storage, the rest as :meth:`Field.store` says."""
    return f.kind_spec.converted(f, value, plan, sample)
