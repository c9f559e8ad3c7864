"""Image helpers shared by sources, writers and readers: modes, resizing, codecs.

Mode rules (``--mode auto`` picks ``L`` only when every image is grayscale):

========================  ==========  ==============================================
input mode                grayscale?  converted with
========================  ==========  ==============================================
1, L                      yes         ``Image.convert``
LA, La                    yes         ``Image.convert`` (alpha dropped)
I;16, I;16B/L/N           yes         value >> 8 to 8 bits, then L
I (32-bit signed)         yes         clipped to 0..65535, then >> 8, then L
F                         yes         clipped to 0..255, then L
RGB, RGBA, RGBX, RGBa     no          ``Image.convert`` (alpha dropped, no blending)
P, PA                     no          ``Image.convert`` through the palette (transparency dropped)
CMYK, YCbCr, LAB, HSV     no          ``Image.convert`` (Pillow's own formulas)
========================  ==========  ==============================================
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
from PIL import Image, ImageOps

from fastdata.errors import InvalidOptionError, fix_option

GRAYSCALE_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})
_WIDE_MODES = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N"})
MODES = ("auto", "RGB", "L")
CHANNELS = {"L": 1, "RGB": 3}
FIELD_CHANNELS = {**CHANNELS, "RGBA": 4}  # an extra image field also keeps its alpha (Cityscapes' color target)


def is_grayscale(mode: str) -> bool:
    return mode in GRAYSCALE_MODES


DEFAULT_MAX_PIXELS = Image.MAX_IMAGE_PIXELS  # Pillow's limit: 89,478,485 pixels
_EXIF_ORIENTATION = 0x0112


@dataclass(frozen=True)
class ReadOptions:
    """How sources decode: the pixel limit (None: none) and whether EXIF orientation is applied."""

    max_pixels: int | None = DEFAULT_MAX_PIXELS
    exif_transpose: bool = False


class TooManyPixelsError(ValueError):
    """An image over the pixel limit (the decompression-bomb guard), or with no pixels at all."""


_pillow_limit_off = False  # True in conversion worker processes, which own their Pillow state


def disable_pillow_limit() -> None:
    """For worker processes: turn Pillow's own limit off once (fastdata checks every image)."""
    global _pillow_limit_off
    Image.MAX_IMAGE_PIXELS = None
    _pillow_limit_off = True


def open_checked(source: Any, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> Image.Image:
    """``Image.open`` with fastdata's pixel limit instead of Pillow's.

    Pillow only warns between its limit and twice that; here any image with more than
    ``max_pixels`` pixels is refused before it is decoded (None: no limit). In the calling
    process Pillow's own limit is switched off only while the header is read.
    """
    if _pillow_limit_off:
        image = Image.open(source)
    else:
        previous = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = None
        try:
            image = Image.open(source)
        finally:
            Image.MAX_IMAGE_PIXELS = previous
    try:
        check_pixels(image, max_pixels)
    except BaseException:
        image.close()
        raise
    return image


@contextlib.contextmanager
def guarded_open(source: Any, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> Iterator[Image.Image]:
    """:func:`open_checked` as a context manager (the file is closed on leaving it)."""
    with open_checked(source, max_pixels) as image:
        yield image


def check_pixels(image: Image.Image, max_pixels: int | None) -> None:
    """Refuse an image without pixels, or with more than ``max_pixels`` (None: no limit)."""
    pixels = image.width * image.height
    if pixels == 0:
        raise TooManyPixelsError(f"the image is empty ({image.width}x{image.height} pixels)")
    if max_pixels is not None and pixels > max_pixels:
        raise TooManyPixelsError(
            f"{image.width}x{image.height} = {pixels:,} pixels, over the limit of {max_pixels:,} "
            f"(a decompression-bomb guard); pass {fix_option('max_pixels', pixels)} to allow it"
        )


def oriented_size(image: Image.Image) -> tuple[int, int]:
    """(width, height) after ``ImageOps.exif_transpose`` (read from the header, no decoding)."""
    if image.getexif().get(_EXIF_ORIENTATION, 1) in (5, 6, 7, 8):
        return image.height, image.width
    return image.width, image.height


def exif_transpose(image: Image.Image) -> Image.Image:
    return ImageOps.exif_transpose(image)


def to_mode(image: Image.Image, mode: str) -> Image.Image:
    """Convert a PIL image to ``L`` or ``RGB`` following the table in this module's docstring."""
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # same colours; avoids Pillow's palette-transparency warning
    if image.mode in _WIDE_MODES:
        # 16-bit values (0..65535) keep their top 8 bits; 32-bit "I" values outside that range are
        # clipped to it first (a negative value is black, never wrapped around to white)
        wide = np.asarray(image).astype(np.int64).clip(0, 65535)
        image = Image.fromarray((wide >> 8).astype(np.uint8))
    elif image.mode == "F":
        image = Image.fromarray(np.asarray(image).clip(0, 255).astype(np.uint8))
    if image.mode == mode:
        return image
    return image.convert(mode)


def parse_size(value: Any, *, flag: str, allow_single: bool) -> tuple[int, ...] | None:
    """``"64x48"`` -> (64, 48); ``"64"`` -> (64,) when ``allow_single``; ints and tuples pass."""
    if value is None:
        return None
    given = value
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?", value)
        value = tuple(int(g) for g in match.groups() if g is not None) if match else ()
    value = tuple(value) if isinstance(value, (tuple, list)) else ()
    allowed = (1, 2) if allow_single else (2,)
    if len(value) not in allowed or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        forms = "'HxW' (e.g. '64x64') or 'S' (shorter side)" if allow_single else "'HxW' (e.g. '56x56')"
        raise InvalidOptionError(f"Invalid {flag} {given!r}. Use {forms}, with positive integers.")
    return value


@dataclass(frozen=True)
class Geometry:
    """``--resize``, ``--center-crop`` and ``--max-side``, applied in that order: torchvision
    ``Resize``/``CenterCrop`` semantics, then the longest side capped at ``max_side``.

    ``resize`` is ``(H, W)`` for an exact size, ``(S,)`` for "shorter side to S", or None.
    ``max_side`` scales an image whose longest side is longer down to exactly ``max_side`` on
    that side, the other rounded to keep the aspect ratio (at least 1 pixel); smaller images are
    left as they are. (FFCV stores its ImageNet this way, ``max_resolution``, for fast decodes.)
    """

    resize: tuple[int, ...] | None = None
    center_crop: tuple[int, int] | None = None
    max_side: int | None = None

    @property
    def is_identity(self) -> bool:
        return self.resize is None and self.center_crop is None and self.max_side is None

    def output_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after this geometry is applied to an image of the given size."""
        if self.resize is not None:
            width, height = _resized_size(width, height, self.resize)
        if self.center_crop is not None:
            height, width = self.center_crop
        if self.max_side is not None:
            width, height = capped_size(width, height, self.max_side)
        return width, height

    @property
    def fixed_size(self) -> tuple[int, int] | None:
        """(H, W) every output has regardless of input size, or None when it depends on input."""
        fixed = None
        if self.center_crop is not None:
            fixed = self.center_crop
        elif self.resize is not None and len(self.resize) == 2:
            fixed = self.resize[0], self.resize[1]
        if fixed is not None and self.max_side is not None:
            width, height = capped_size(fixed[1], fixed[0], self.max_side)
            fixed = height, width
        return fixed

    def apply(self, image: Image.Image) -> Image.Image:
        if self.resize is not None:
            size = _resized_size(image.width, image.height, self.resize)
            if size != image.size:
                image = image.resize(size, Image.BILINEAR)
        if self.center_crop is not None:
            image = center_crop(image, *self.center_crop)
        if self.max_side is not None:
            size = capped_size(image.width, image.height, self.max_side)
            if size != image.size:
                image = image.resize(size, Image.BILINEAR)
        return image

    def describe(self) -> dict[str, Any]:
        return {
            "resize": list(self.resize) if self.resize else None,
            "center_crop": list(self.center_crop) if self.center_crop else None,
            "max_side": self.max_side,
        }


def capped_size(width: int, height: int, max_side: int) -> tuple[int, int]:
    """(width, height) with the longest side at most ``max_side``, the aspect ratio kept."""
    longest = max(width, height)
    if longest <= max_side:
        return width, height
    if width >= height:
        return max_side, max(1, round(height * max_side / width))
    return max(1, round(width * max_side / height)), max_side


def _resized_size(width: int, height: int, resize: tuple[int, ...]) -> tuple[int, int]:
    if len(resize) == 2:
        return resize[1], resize[0]
    (short_side,) = resize
    if width <= height:
        return short_side, int(short_side * height / width)
    return int(short_side * width / height), short_side


def center_crop(image: Image.Image, crop_height: int, crop_width: int) -> Image.Image:
    """torchvision ``CenterCrop``: zero padding where the crop is larger than the image."""
    width, height = image.size
    left = _crop_start(width, crop_width)
    top = _crop_start(height, crop_height)
    if (left, top, crop_width, crop_height) == (0, 0, width, height):
        return image
    return image.crop((left, top, left + crop_width, top + crop_height))


def center_crop_array(pixels: np.ndarray, crop_height: int, crop_width: int) -> np.ndarray:
    """:func:`center_crop` on a uint8 HWC array (zero padding where the crop is larger)."""
    height, width = pixels.shape[:2]
    top, left = _crop_start(height, crop_height), _crop_start(width, crop_width)
    if (top, left, crop_height, crop_width) == (0, 0, height, width):
        return pixels
    out = np.zeros((crop_height, crop_width, pixels.shape[2]), dtype=pixels.dtype)
    source_top, source_left = max(top, 0), max(left, 0)
    target_top, target_left = source_top - top, source_left - left
    rows = min(height - source_top, crop_height - target_top)
    columns = min(width - source_left, crop_width - target_left)
    out[target_top : target_top + rows, target_left : target_left + columns] = \
        pixels[source_top : source_top + rows, source_left : source_left + columns]
    return out


def _crop_start(size: int, crop: int) -> int:
    if crop > size:
        return -((crop - size) // 2)
    return int(round((size - crop) / 2.0))


def open_image(data: bytes, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Decode encoded image bytes fully (raises on truncated or invalid data, or too many pixels)."""
    with guarded_open(io.BytesIO(data), max_pixels) as image:
        image.load()
    return image


def decode_image(data: bytes | memoryview, mode: str) -> Image.Image:
    """Encoded bytes -> the decoded PIL image in ``mode``."""
    return to_mode(open_image(bytes(data)), mode)


def decode(data: bytes | memoryview, mode: str) -> np.ndarray:
    """Encoded bytes -> uint8 HWC array in ``mode``."""
    return as_hwc(decode_image(data, mode))


def pixels(image: Image.Image) -> np.ndarray:
    """PIL image (L, RGB, ...) -> read-only uint8 (H, W, C) view of its bytes (no extra copy)."""
    data = np.frombuffer(image.tobytes(), dtype=np.uint8)
    return data.reshape(image.height, image.width, len(image.getbands()))


def as_hwc(image: Image.Image) -> np.ndarray:
    """PIL image -> writable uint8 (H, W, C) array."""
    array = np.array(image, dtype=np.uint8)
    if array.ndim == 2:
        array = array[:, :, None]
    return array


def encode(image: Image.Image, codec: str, quality: int | None = None) -> bytes:
    """Encode a PIL image as ``png`` or ``jpeg`` bytes."""
    buffer = io.BytesIO()
    if codec == "jpeg":
        image.save(buffer, format="JPEG", quality=quality or 90)
    else:
        image.save(buffer, format="PNG")
    return buffer.getvalue()


SNIFFED_EXTENSIONS = ("jpg", "png", "webp", "gif", "bmp", "tiff", "img")  # what sniff_extension gives


def sniff_extension(data: bytes) -> str:
    """File extension (without dot) for encoded image bytes, from their magic number (one of
    :data:`SNIFFED_EXTENSIONS`)."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:2] == b"BM":
        return "bmp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    return "img"


def to_pil(image: Any) -> Image.Image:
    """A map-style dataset's image (PIL, HWC/CHW uint8 ndarray or tensor) as a PIL image.

    Tensors are read as CHW (torch's convention); ndarrays as HWC when the last axis has
    1, 3 or 4 entries, otherwise as CHW. 2-D inputs are grayscale.
    """
    if isinstance(image, Image.Image):
        return image
    is_tensor = type(image).__module__.startswith("torch")
    if is_tensor:
        image = image.detach().cpu().numpy()
        if image.ndim == 3:
            image = np.moveaxis(image, 0, -1)
    if not isinstance(image, np.ndarray):
        raise TypeError(
            f"expected a PIL image, uint8 ndarray or tensor, got {type(image).__name__}"
        )
    if image.dtype != np.uint8:
        raise TypeError(f"expected uint8 pixels, got dtype {image.dtype}")
    if image.ndim == 3 and not is_tensor and image.shape[-1] not in (1, 3, 4):
        image = np.moveaxis(image, 0, -1)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[:, :, 0]
    if image.ndim == 2:
        return Image.fromarray(image)
    if image.ndim == 3 and image.shape[-1] in (3, 4):
        return Image.fromarray(np.ascontiguousarray(image))
    raise TypeError(f"expected an image of shape HxW, HxWxC or CxHxW, got shape {image.shape}")
