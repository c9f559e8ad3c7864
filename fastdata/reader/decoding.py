"""Decoding stored images at read time: the mode, an optional resize and center crop (the
same ``--resize``/``--center-crop`` semantics as conversion, i.e. torchvision's ``Resize`` and
``CenterCrop``), and the decoder.

* ``decoder="pil"`` (default): Pillow decodes, converts the mode and resizes (bilinear, with
  its antialiasing), exactly what torchvision does with PIL images: pixel-equal to a plain
  ``Image.open(...).convert(...)`` and ``resize(...)``.
* ``decoder="fast"`` (opt-in, ``pip install "torch-fastdata[jpeg]"``): JPEGs are decoded by
  libjpeg-turbo through ``simplejpeg`` with its fast integer IDCT and upsampling, scaled in the
  DCT domain (1/2, 1/4, 1/8) when the requested size allows, then resized with antialiased
  bilinear in the calling thread (:func:`fastdata.reader.kernels.resize`: torch's vectorised
  uint8 kernel, what torchvision's ``resize`` calls for uint8 tensors, where it runs without
  torch's thread pool, else Pillow's). Pixels differ slightly from Pillow's (measured in
  docs/reading.md); other image types take the Pillow path, as do JPEGs that libjpeg-turbo
  decodes only with a warning (:func:`fastdata.reader.fused.strict_simplejpeg`).

With a :class:`~fastdata.reader.fused.FusedPlan` (``plan``: the leading random-resized-crop + flip,
or resize + centre crop, of the reader's ``transform``, split off by
:class:`fastdata.reader.ReaderOptions`), each image is decoded through it instead
(:func:`fastdata.reader.fused.fused_decode`: only the DCT scale the crop box needs), its randomness
drawn from ``(seed, epoch, sample index)``: the same crops on every backend and ``num_workers``,
new ones each epoch. JPEGs go through the region decode (only the box's part,
:mod:`fastdata.reader.region`) where its library loads, else simplejpeg when it is installed, else
Pillow's ``draft``; other image types are decoded in full and cropped on the same box.

With a fixed output size and an ``allocate`` (the process backend's shared-memory slot, or
any preallocated batch buffer), each image is written straight into its row of the batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from fastdata.errors import CorruptDataError, DependencyMissingError, InvalidOptionError
from fastdata.extras import require
from fastdata.reader import kernels
from fastdata.reader.fused import (Fusion, FusedPlan, default_decoder, fused_pixels, replay_agrees, seed_for,
                                   strict_simplejpeg)
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
    fusion: Fusion | None = None  # the transform's fused leading crop (None: decode, then transform)
    encoded: bool = True  # False: the dataset stores decoded pixels (never fused)

    def with_options(self, options: Any) -> "Decoder":
        """This decoder with the fusion reader options ``options`` ask for
        (:meth:`fastdata.reader.ReaderOptions.fusion`); none for stored pixels."""
        fusion = options.fusion() if self.encoded else None
        if fusion is not None:
            default_decoder()  # a FASTDATA_LIBTURBOJPEG that does not load: one error up front
            replay_agrees()  # the replayed draw's once-per-process check, here: forked workers inherit it
        return dataclasses.replace(self, fusion=fusion)

    @property
    def plan(self) -> FusedPlan | None:
        """The fused plan (None: not fused)."""
        return None if self.fusion is None else self.fusion.plan

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
            pixels = self._decode_fast(data)
            if pixels is not None:
                return pixels
        image = self.geometry.apply(to_mode(open_image(data), self.mode))
        return image if pil else as_hwc(image)

    @property
    def fused_library(self) -> str:
        """What decodes JPEGs through ``plan`` (measured, docs/reading.md): the region decode where
        its library loads, else simplejpeg when installed, else Pillow's ``draft``
        (:func:`fastdata.reader.fused.default_decoder`)."""
        return default_decoder()

    def decode_fused(self, blob: bytes | memoryview, index: int | None, epoch: int | None,
                     on_draw: Callable | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """One image through ``plan``, sample ``index`` of ``epoch`` (None: drawn from torch's
        global generator): a uint8 HWC array (``out`` itself, a row of the batch, when given), the
        pixels of the CHW tensor :func:`~fastdata.reader.fused.fused_decode` gives."""
        seed = None if epoch is None else seed_for(self.fusion.seed, epoch, index)
        return fused_pixels(blob, self.plan, seed=seed, mode=self.mode, decoder=self.fused_library,
                            on_draw=on_draw, out=out)

    def _decode_fast(self, data: bytes) -> np.ndarray | None:
        """A JPEG through simplejpeg, or None where its strict mode refuses the file (Pillow,
        the conversion's decoder, then decides: :func:`fastdata.reader.fused.strict_simplejpeg`)."""
        _simplejpeg()  # the install command when it is missing
        header = strict_simplejpeg("decode_jpeg_header", data)
        if header is None:
            return None
        height, width, _, _ = header
        out_width, out_height = width, height
        if self.geometry.resize:  # the size before any crop: the DCT may scale down to at least that
            out_width, out_height = Geometry(resize=self.geometry.resize).output_size(width, height)
        colorspace = "GRAY" if self.mode == "L" else "RGB"
        pixels = strict_simplejpeg("decode_jpeg", data, colorspace=colorspace, fastdct=True, fastupsample=True,
                                   min_height=out_height, min_width=out_width)
        if pixels is None:
            return None
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]
        pixels = kernels.resize(pixels, (out_height, out_width))  # the calling thread only: no torch pool
        if self.geometry.center_crop is not None:
            pixels = center_crop_array(pixels, *self.geometry.center_crop)
        return pixels

    def decode_all(self, blobs: Iterable[bytes | memoryview], where: Callable[[int], str], dataset: Path, *,
                   pil: bool = False, allocate: Callable | None = None, indices: Sequence[int] | None = None,
                   epoch: int | None = None, draws: list | None = None) -> Any:
        """Decode every image: a list of arrays (or PIL images with ``pil``), or, when the output
        size is fixed and ``allocate`` gives room (or with a ``plan``, always), one (B, H, W, C)
        array written row by row.
        With a ``plan``, row ``r``'s crop is drawn from ``(seed, epoch, indices[r])``, or from
        torch's global generator when ``epoch`` is None (as torchvision's transforms draw); a
        ``draws`` list gets each row's ``(height, width, Draw)`` (the sample's other fields are
        moved alike, :mod:`fastdata.reader.records`).
        A sample that does not decode is a CorruptDataError naming it (``where(row)``)."""
        blobs = list(blobs)
        fused = self.plan is not None and not pil
        if fused and epoch is not None and (indices is None or len(indices) != len(blobs)):
            raise ValueError("a fused decode in a known epoch needs the sample index of every image (indices=...)")
        fixed = self.plan.size if fused else self.geometry.fixed_size
        out = None
        if fixed is not None and allocate is not None and not pil:
            out = allocate((len(blobs), *fixed, self.channels), np.uint8)
        if out is None and fused and blobs:  # one batch array, each image decoded into its row:
            out = np.empty((len(blobs), *fixed, self.channels), np.uint8)  # no list to stack after
        pixels = []
        for row, blob in enumerate(blobs):
            try:
                if fused:  # written straight into the batch's row when there is one
                    decoded = self.decode_fused(blob, None if epoch is None else int(indices[row]), epoch,
                                                None if draws is None else lambda *drawn: draws.append(drawn),
                                                out=None if out is None else out[row])
                    if out is not None:
                        continue
                else:
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

