"""Decoding stored images at read time: the mode, an optional resize and center crop (the
same ``--resize``/``--center-crop`` semantics as conversion, i.e. torchvision's ``Resize`` and
``CenterCrop``), and the decoder.

* ``decoder="pil"`` (default): Pillow decodes, converts the mode and resizes (bilinear, with
  its antialiasing), exactly what torchvision does with PIL images: pixel-equal to a plain
  ``Image.open(...).convert(...)`` and ``resize(...)``.
* ``decoder="fast"`` (opt-in, ``pip install "torch-fastdata[jpeg]"``): JPEGs are decoded by
  libjpeg-turbo through ``simplejpeg`` with its fast integer IDCT and upsampling, scaled in the
  DCT domain (1/2, 1/4, 1/8) when the requested size allows, then resized with torch's
  vectorised uint8 bilinear antialiasing (``torch.nn.functional.interpolate``, the kernel
  torchvision's ``resize`` calls for uint8 tensors: the same pixels, without needing
  torchvision). Pixels differ slightly from Pillow's (measured in
  docs/reading.md); other image types take the Pillow path.

With a fixed output size and an ``allocate`` (the process backend's shared-memory slot, or
any preallocated batch buffer), each image is written straight into its row of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from fastdata.errors import CorruptDataError, DependencyMissingError, InvalidOptionError
from fastdata.extras import require
from fastdata.images import Geometry, as_hwc, center_crop_array, open_image, parse_size, to_mode

DECODERS = ("pil", "fast")
_JPEG_MAGIC = b"\xff\xd8\xff"


def _simplejpeg() -> Any:
    return require("simplejpeg", extra="jpeg", feature="decoder='fast'")


def check_decoder(decoder: str) -> str:
    """``decoder`` if it is one of :data:`DECODERS` (and ``"fast"``'s package is installed)."""
    if decoder not in DECODERS:
        raise InvalidOptionError(f"Unknown decoder {decoder!r}. Allowed: {', '.join(map(repr, DECODERS))}.")
    if decoder == "fast":
        _simplejpeg()
    return decoder


def geometry_of(resize: Any, center_crop: Any) -> Geometry:
    """The read-time resize and center crop, parsed like ``--resize``/``--center-crop`` (an int
    center crop is a square, as torchvision's ``CenterCrop(int)``); parsing a parsed value gives it back."""
    if isinstance(center_crop, int) and not isinstance(center_crop, bool):
        center_crop = (center_crop, center_crop)
    return Geometry(resize=parse_size(resize, flag="resize", allow_single=True),
                    center_crop=parse_size(center_crop, flag="center_crop", allow_single=False))


@dataclass(frozen=True)
class Decoder:
    """How a reader turns stored image bytes into pixels (see the module docstring)."""

    mode: str
    geometry: Geometry = Geometry()
    fast: bool = False

    @classmethod
    def make(cls, mode: str, *, resize: Any = None, center_crop: Any = None, decoder: str = "pil") -> "Decoder":
        return cls(mode, geometry_of(resize, center_crop), check_decoder(decoder) == "fast")

    @property
    def channels(self) -> int:
        return 1 if self.mode == "L" else 3

    def decode(self, blob: bytes | memoryview, *, pil: bool = False) -> Any:
        """One image: a uint8 HWC array (or, with ``pil``, a PIL image)."""
        data = bytes(blob)
        if self.fast and not pil and data[:3] == _JPEG_MAGIC:
            return self._decode_fast(data)
        image = self.geometry.apply(to_mode(open_image(data), self.mode))
        return image if pil else as_hwc(image)

    def _decode_fast(self, data: bytes) -> np.ndarray:
        import torch

        simplejpeg = _simplejpeg()
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        out_width, out_height = width, height
        if self.geometry.resize:  # the size before any crop: the DCT may scale down to at least that
            out_width, out_height = Geometry(resize=self.geometry.resize).output_size(width, height)
        colorspace = "GRAY" if self.mode == "L" else "RGB"
        pixels = simplejpeg.decode_jpeg(data, colorspace=colorspace, fastdct=True, fastupsample=True,
                                        min_height=out_height, min_width=out_width)
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]
        if pixels.shape[:2] != (out_height, out_width):
            tensor = torch.from_numpy(pixels).permute(2, 0, 1)[None]
            resized = torch.nn.functional.interpolate(tensor, size=(out_height, out_width), mode="bilinear",
                                                      antialias=True, align_corners=False)
            pixels = resized[0].permute(1, 2, 0).numpy()
        if self.geometry.center_crop is not None:
            pixels = center_crop_array(pixels, *self.geometry.center_crop)
        return pixels

    def decode_all(self, blobs: Iterable[bytes | memoryview], where: Callable[[int], str], dataset: Path, *,
                   pil: bool = False, allocate: Callable | None = None) -> Any:
        """Decode every image: a list of arrays (or PIL images with ``pil``), or, when the output
        size is fixed and ``allocate`` gives room, one (B, H, W, C) array written row by row.
        A sample that does not decode is a CorruptDataError naming it (``where(row)``)."""
        blobs = list(blobs)
        fixed = self.geometry.fixed_size
        out = None
        if fixed is not None and allocate is not None and not pil:
            out = allocate((len(blobs), *fixed, self.channels), np.uint8)
        pixels = []
        for row, blob in enumerate(blobs):
            try:
                decoded = self.decode(blob, pil=pil)
            except DependencyMissingError:
                raise  # the data is fine: the install command, not "convert again"
            except Exception as exc:
                raise CorruptDataError(
                    f"{where(row)}: cannot decode image ({exc}). Run 'fastdata verify {dataset}', or convert the "
                    "source again."
                ) from exc
            if out is not None:
                out[row] = decoded
            else:
                pixels.append(decoded)
        return out if out is not None else pixels
