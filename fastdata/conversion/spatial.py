"""Fields that move with the image: masks, extra images and boxes through ``--resize`` and
``--center-crop``, and each extra field's stored bytes (:mod:`fastdata.fields`).

The geometry is torchvision's: ``transforms.v2.functional.resize``/``center_crop`` on
``tv_tensors.Mask`` (nearest neighbour, never colour-converted) and ``tv_tensors.BoundingBoxes``
(moved and scaled with the image; what torchvision does with boxes that leave the canvas is
what happens to them, fastdata does not clip them itself). Nothing here reimplements geometry.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from fastdata.errors import ShapeMismatchError
from fastdata.fields import Field, FieldError, Schema
from fastdata.formats.base import Plan
from fastdata.images import Geometry, encode, pixels, to_mode

MASK_MODES = ("L", "P", "1")


def transform_fields(schema: Schema, values: dict[str, Any], size: tuple[int, int], geometry: Geometry,
                     sample: str) -> dict[str, Any]:
    """``values`` with every mask and box field given the image's geometry (``size``: the
    image's (width, height) before it); a mask of another size than its image is an error."""
    out = dict(values)
    width, height = size
    for f in schema.extras:
        value = out[f.name]
        if f.kind == "mask":
            if value.size != size:
                raise FieldError(f"{sample}: field {f.name!r} is a {value.width}x{value.height} mask but its image "
                                 f"{schema.image.name!r} is {width}x{height} (WxH); a mask has its image's size.")
            if value.mode not in MASK_MODES:
                raise FieldError(f"{sample}: field {f.name!r} is a mask in mode {value.mode!r}; masks are 8-bit class "
                                 "ids (mode 'L' or 'P'). Convert it in the dataset.")
    if geometry.is_identity:
        return out
    import torch  # torch and torchvision only for conversions that resize fields: keeps the CLI start light
    from torchvision import tv_tensors
    from torchvision.transforms.v2 import functional as F

    def moved(value: Any) -> Any:
        if geometry.resize is not None:
            value = F.resize(value, list(geometry.resize))
        if geometry.center_crop is not None:
            value = F.center_crop(value, list(geometry.center_crop))
        return value

    for f in schema.extras:
        value = out[f.name]
        if f.kind == "mask":
            mode, palette = value.mode, value.getpalette() if value.mode == "P" else None
            array = np.array(value.convert("L") if mode == "1" else value, dtype=np.uint8)
            result = moved(tv_tensors.Mask(torch.from_numpy(array)))
            image = Image.fromarray(result.numpy().astype(np.uint8, copy=False), "L")
            if mode == "P":
                image = _as_palette(image, palette)
            out[f.name] = image
        elif f.kind == "array" and f.meta.get("tv_tensor") == "Mask" and value is not None:
            array = np.asarray(value)  # (K, H, W) instance masks: nearest neighbour, as the mask
            out[f.name] = moved(tv_tensors.Mask(torch.from_numpy(np.ascontiguousarray(array)))).numpy().astype(
                array.dtype, copy=False)
        elif f.meta.get("tv_tensor") == "BoundingBoxes" and value is not None:
            array = np.asarray(value)
            boxes = tv_tensors.BoundingBoxes(torch.from_numpy(np.ascontiguousarray(array)), format=f.meta["format"],
                                             canvas_size=(height, width))
            out[f.name] = moved(boxes).numpy().astype(array.dtype, copy=False)
    return out


def _as_palette(image: Image.Image, palette: list[int] | None) -> Image.Image:
    """An ``L`` image of palette indices as a ``P`` image with ``palette`` (indices unchanged)."""
    result = Image.frombytes("P", image.size, image.tobytes())
    if palette:
        result.putpalette(palette)
    return result


def raw_bytes(f: Field, array: np.ndarray, sample: str) -> bytes:
    """A raw-stored field's bytes, or a clear error where its size is not the planned one."""
    if array.shape != f.shape:
        raise ShapeMismatchError(
            f"{sample}: field {f.name!r} is {array.shape[0]}x{array.shape[1]} (HxW) but raw storage planned "
            f"{f.shape[0]}x{f.shape[1]}. Use --resize HxW (or --resize S --center-crop HxW), or --store encoded."
        )
    return array.tobytes()


def store_field(f: Field, value: Any, plan: Plan, sample: str) -> bytes:
    """One extra field's stored bytes: masks lossless (raw uint8 rows or PNG), extra images
    with the image's geometry and storage, the rest as :meth:`Field.store` says."""
    if f.kind == "mask":
        if f.encoding == "raw":
            array = np.array(value.convert("L") if value.mode == "1" else value, dtype=np.uint8)
            return raw_bytes(f, array, sample)
        # PNG of the class ids in mode L (a P mask's palette is in the schema): stock webdataset's
        # decode("l8") then reads the ids themselves, where it would colour-convert a palette image
        ids = value.convert("L") if value.mode == "1" else value
        if ids.mode == "P":
            ids = Image.frombytes("L", ids.size, ids.tobytes())
        return encode(ids, "png")
    if f.kind == "image":
        image = plan.geometry.apply(to_mode(value, f.mode))
        if f.encoding == "raw":
            return raw_bytes(f, pixels(image), sample)
        return encode(image, f.encoding, plan.jpeg_quality)
    return f.store(value)
