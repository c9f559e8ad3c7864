"""Region decode: only the crop box's part of a JPEG, at the DCT scale, through TurboJPEG 3
(``tj3SetScalingFactor`` + ``tj3SetCroppingRegion``, libjpeg-turbo's ``jpeg_crop_scanline`` and
``jpeg_skip_scanlines``): the entropy decode runs up to the box's last row, IDCT, upsampling
and colour conversion only inside the box (its left edge down to the scaled iMCU), nothing after
its last row. With the fast IDCT and upsampling the box's pixels are exactly simplejpeg's
(libjpeg-turbo too), measured in docs/reading.md.

No kept binding offers a region decode, so this is a small ctypes binding to a libturbojpeg >= 3,
found once per process (the first that loads and exports ``tj3Init`` wins):

1. ``FASTDATA_LIBTURBOJPEG``: a path to one (an empty value or ``none`` switches the region decode
   off; a path that does not load is a :class:`~fastdata.errors.DependencyMissingError` naming it);
2. the one the ``turbojpeg`` wheel ships in ``turbojpeg.libs/`` (``pip install
   "torch-fastdata[region]"``), found through its distribution's file list: its module is never
   imported (it has the same name as PyTurboJPEG's);
3. the system's (``ctypes.util.find_library("turbojpeg")``), if it is 3.0 or newer.

None: the fused decode uses simplejpeg (one DEBUG line on this module's logger). A fresh TurboJPEG
handle per image (see :class:`_Handle`). Only the decode itself (``tj3Decompress8``) lets go of the
GIL; the calls around it (handle, header, parameters: microseconds each) keep it, since every
release lets another loader thread take the GIL, and taking it back costs this thread a context
switch (docs/reading.md, "Threads and the GIL"). A JPEG tj3 decodes only with
a warning or an error gives None here: the caller's decoder (simplejpeg's strict mode, then Pillow)
decides, as for every JPEG without the region decode.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from importlib import metadata

from typing import Any

import numpy as np

from fastdata.errors import DependencyMissingError
from fastdata.extras import install_command

logger = logging.getLogger(__name__)

ENV = "FASTDATA_LIBTURBOJPEG"
_OFF = ("", "none")
_DECOMPRESS = 1  # TJINIT_DECOMPRESS
_STOP_ON_WARNING, _SUBSAMP, _JPEG_WIDTH, _JPEG_HEIGHT, _FAST_UPSAMPLE, _FAST_DCT = 0, 4, 5, 6, 9, 10  # TJPARAM_*
_MCU_WIDTH = (8, 16, 16, 8, 8, 32, 8)  # tjMCUWidth per TJSAMP_* (444, 422, 420, GRAY, 440, 411, 441)
_PIXEL_FORMAT = {"RGB": (0, 3), "BGR": (1, 3), "L": (6, 1)}  # mode -> (TJPF_RGB / BGR / GRAY, channels)
_EOI = b"\xff\xd9"
DCT_SCALES = (8, 4, 2, 1)  # denominators libjpeg-turbo scales by in the DCT, smallest image first


def dct_scale(box_height: int, box_width: int, out_height: int, out_width: int) -> int:
    """The largest denominator s in 8, 4, 2, 1 with the box at 1/s still covering the output."""
    for scale in DCT_SCALES:
        if box_height / scale >= out_height and box_width / scale >= out_width:
            return scale
    return 1


def decoded_scale(height: int, width: int, decoded_height: int, decoded_width: int) -> int:
    """The denominator s a JPEG was decoded at: libjpeg's image at 1/s is ceil(size / s)."""
    for scale in DCT_SCALES:
        if (-(-height // scale), -(-width // scale)) == (decoded_height, decoded_width):
            return scale
    raise ValueError(f"a {width}x{height} JPEG decoded to {decoded_width}x{decoded_height}, not a DCT scale of it")


def scaled_region(draw: Any, scale: int, height: int, width: int) -> tuple[int, int, int, int]:
    """The box at 1/scale, rounded to whole pixels (at most half a scaled pixel off per edge)."""
    top, left = round(draw.top / scale), round(draw.left / scale)
    bottom = min(max(round((draw.top + draw.height) / scale), top + 1), height)
    right = min(max(round((draw.left + draw.width) / scale), left + 1), width)
    return top, left, bottom, right


class _Factor(ctypes.Structure):
    _fields_ = [("num", ctypes.c_int), ("denom", ctypes.c_int)]


class _Region(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int) for name in ("x", "y", "w", "h")]


_SIGNATURES = {  # name -> (restype, argtypes)
    "tj3Init": (ctypes.c_void_p, [ctypes.c_int]),
    "tj3Destroy": (None, [ctypes.c_void_p]),
    "tj3Set": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]),
    "tj3Get": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
    "tj3DecompressHeader": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
    "tj3SetScalingFactor": (ctypes.c_int, [ctypes.c_void_p, _Factor]),
    "tj3SetCroppingRegion": (ctypes.c_int, [ctypes.c_void_p, _Region]),
    "tj3Decompress8": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p,
                                      ctypes.c_int, ctypes.c_int]),
    "tj3GetErrorStr": (ctypes.c_char_p, [ctypes.c_void_p]),
    "tj3GetErrorCode": (ctypes.c_int, [ctypes.c_void_p]),
}


_RELEASING = ("tj3Decompress8",)  # the one long call: it runs without the GIL


def _load(path: str) -> tuple[ctypes.CDLL | None, str]:
    """(the library at ``path`` with its tj3 signatures declared, "") or (None, why not). Its
    functions keep the GIL (``ctypes.PyDLL``) but those in :data:`_RELEASING` (``ctypes.CDLL``)."""
    try:
        lib = ctypes.PyDLL(path)
        releasing = ctypes.CDLL(path, handle=lib._handle)  # the same loaded library, its calls without the GIL
    except OSError as exc:
        return None, str(exc).splitlines()[0] if str(exc) else "it does not load"
    missing = [name for name in _SIGNATURES if not hasattr(lib, name)]
    if missing:
        return None, f"it exports no {missing[0]} (a libturbojpeg older than 3.0)"
    for name, (restype, argtypes) in _SIGNATURES.items():
        function = getattr(releasing if name in _RELEASING else lib, name)
        function.restype, function.argtypes = restype, argtypes
        setattr(lib, name, function)
    return lib, ""


def _wheel_libraries() -> list[str]:
    """The libturbojpeg the ``turbojpeg`` wheel installs, from its file list (never imported):
    ``turbojpeg.libs/libturbojpeg-<hash>.so`` on Linux (auditwheel), ``turbojpeg-<hash>.dll``
    (delvewheel), ``.dylibs/libturbojpeg*.dylib`` (delocate)."""
    try:
        files = metadata.distribution("turbojpeg").files or []
    except metadata.PackageNotFoundError:
        return []
    return sorted(str(file.locate()) for file in files if file.name.startswith(("libturbojpeg", "turbojpeg-")))


@functools.cache
def library() -> ctypes.CDLL | None:
    """The libturbojpeg >= 3 this process decodes regions with (None: no region decode)."""
    configured = os.environ.get(ENV)
    if configured is not None and configured.strip().lower() in _OFF:
        logger.debug("%s=%r: the region decode is off", ENV, configured)
        return None
    if configured is not None:
        lib, why = _load(configured)
        if lib is None:
            raise DependencyMissingError(
                f"{ENV}={configured}: cannot use it for the region decode ({why}). Point it to a libturbojpeg "
                f"from libjpeg-turbo 3.0 or newer, unset it to use the one {install_command('region')} installs, "
                f"or set it to 'none' to decode without the region decode.")
        return lib
    for path in (*_wheel_libraries(), ctypes.util.find_library("turbojpeg")):
        lib = _load(path)[0] if path else None
        if lib is not None:
            logger.debug("region decode with %s", path)
            return lib
    logger.debug("no libturbojpeg >= 3 (%s): the fused decode reads whole images at the DCT scale",
                 install_command("region"))
    return None


def require() -> ctypes.CDLL:
    """:func:`library`, or DependencyMissingError naming the install command."""
    lib = library()
    if lib is None:
        raise DependencyMissingError(
            f"The region decode needs a libturbojpeg 3.0 or newer, and none was found. Install it with: "
            f"{install_command('region')} (or point {ENV} to one).")
    return lib


class _Handle:
    """A fresh TurboJPEG decompressor per image (``with _Handle() as handle``; about 4 us), never
    reused: libjpeg-turbo before 3.1.2 lets ``jpeg_skip_scanlines`` use freed memory when an
    instance that decoded without merged upsampling decodes with it (a 4:2:0 JPEG at another DCT
    scale), and the ``turbojpeg`` wheel's library is 3.0 beta (crashes seen here when reused)."""

    def __enter__(self) -> "_Handle":
        self.lib = require()
        self.pointer = self.lib.tj3Init(_DECOMPRESS)
        if not self.pointer:
            raise MemoryError("tj3Init failed to make a TurboJPEG decompressor")
        for parameter in (_STOP_ON_WARNING, _FAST_UPSAMPLE, _FAST_DCT):
            self.lib.tj3Set(self.pointer, parameter, 1)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.lib.tj3Destroy(self.pointer)

    def failed(self, status: int, what: str) -> bool:
        if status != 0:
            code = "warning" if self.lib.tj3GetErrorCode(self.pointer) == 0 else "error"
            logger.debug("TurboJPEG %s %s (%s)", what, code, self.lib.tj3GetErrorStr(self.pointer).decode())
        return status != 0


def header(data: bytes) -> tuple[int, int] | None:
    """(height, width) of a JPEG, None where TurboJPEG cannot read its header."""
    with _Handle() as handle:
        if handle.failed(handle.lib.tj3DecompressHeader(handle.pointer, data, len(data)), "header"):
            return None
        return handle.lib.tj3Get(handle.pointer, _JPEG_HEIGHT), handle.lib.tj3Get(handle.pointer, _JPEG_WIDTH)


def decode(data: bytes, scale: int, region: tuple[int, int, int, int], mode: str) -> np.ndarray | None:
    """The pixels of ``region`` (top, left, bottom, right in the image at 1/``scale``), uint8 HWC
    in ``mode`` ("RGB", "BGR" or "L"); None where TurboJPEG reports a warning or an error, and for a file
    that does not end with the EOI marker (a truncated one: the region decode stops after the
    box's last row, so it would not see the damage that the whole-image decode refuses)."""
    if mode not in _PIXEL_FORMAT or not data.endswith(_EOI):
        return None
    with _Handle() as handle:
        return _decode(handle, data, scale, region, mode)


def _decode(handle: _Handle, data: bytes, scale: int, region: tuple[int, int, int, int],
            mode: str) -> np.ndarray | None:
    lib, pointer = handle.lib, handle.pointer
    if handle.failed(lib.tj3DecompressHeader(pointer, data, len(data)), "header"):
        return None
    subsampling = lib.tj3Get(pointer, _SUBSAMP)
    if not 0 <= subsampling < len(_MCU_WIDTH):
        return None  # an unusual subsampling: tj3 cannot align a cropping region on it
    top, left, bottom, right = region
    start = left - left % -(-_MCU_WIDTH[subsampling] // scale)  # x on the scaled iMCU (TJSCALED)
    pixel_format, channels = _PIXEL_FORMAT[mode]
    pixels = np.empty((bottom - top, right - start, channels), np.uint8)
    if (handle.failed(lib.tj3SetScalingFactor(pointer, _Factor(1, scale)), "scaling factor")
            or handle.failed(lib.tj3SetCroppingRegion(pointer, _Region(start, top, right - start, bottom - top)),
                             "cropping region")
            or handle.failed(lib.tj3Decompress8(pointer, data, len(data), pixels.ctypes.data, 0, pixel_format),
                             "decode")):
        return None
    return pixels[:, left - start:]


def box(data: bytes, draw: Any, scale: int, height: int, width: int, mode: str) -> np.ndarray | None:
    """The pixels of ``draw``'s box (a :class:`fastdata.reader.fused.Draw`) in a ``height`` x
    ``width`` JPEG at 1/``scale``, as the fused decode cuts it from the whole image at that scale
    (:func:`scaled_region`): uint8 HWC. None for a box that is the whole image (nothing to skip)
    and where :func:`decode` gives None."""
    scaled = (-(-height // scale), -(-width // scale))
    scale = decoded_scale(height, width, *scaled)  # the scale simplejpeg picks for that size
    region = scaled_region(draw, scale, *scaled)
    return None if region == (0, 0, *scaled) else decode(data, scale, region, mode)
