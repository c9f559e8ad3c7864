"""The per-image pixel kernels of the read path (the fused crop-resize-flip, ``decoder="fast"``,
read-time resize and centre crop): each does its work in the calling thread and never enters
torch's intra-op thread pool, whatever ``torch.get_num_threads()`` is.

Why: a loader runs one kernel per image, thousands per second. Any torch op that goes through
``at::parallel_for`` (an elementwise copy, a flip, the generic resize) wakes ``get_num_threads()``
threads around a ~0.2 ms job, and every thread that calls into torch (the thread backend's
workers, the training loop) brings its own team: measured 3.5-4.8x the CPU per image under
torch's default threads against one thread (docs/reading.md). So copies and flips here are
numpy's (or the C library's memmove, with the GIL held), and a resize runs one of, by
interpolation (:data:`KERNELS`):

* ``bilinear`` / ``bicubic``: torch's vectorised uint8 kernel (what torchvision's tensor
  ``resize`` calls) fed a channels-last view, on x86 CPUs where torch has it (AVX2/AVX512): that
  kernel loops over the batch in the calling thread and has no parallel region (asserted by
  tests/test_kernels.py, which counts the threads an intra-op region starts). Elsewhere
  Pillow's ``Image.resize`` (the same antialiased filter, within 1 grey level; it runs in the
  calling thread and releases the GIL).
* ``nearest`` / ``nearest-exact``: numpy row and column indices, torch's index rule.

Every function takes and returns uint8 HWC numpy arrays.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any, Callable

import numpy as np

_PILLOW_FILTERS = {"bilinear": 2, "bicubic": 3}  # PIL.Image.Resampling.BILINEAR / BICUBIC


@functools.lru_cache(maxsize=None)
def torch_resizes_serially() -> bool:
    """Whether torch's uint8 bilinear/bicubic kernel here is the vectorised one that runs in the
    calling thread (x86 with AVX2 or AVX512; torch compiles it only for those)."""
    import torch

    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


@functools.lru_cache(maxsize=None)
def _torch_op(interpolation: str, antialias: bool) -> Callable[..., Any]:
    """The aten op ``torch.nn.functional.interpolate`` calls for ``size=`` (no scale factors,
    ``align_corners=False``) on a 4-D input, taken with an ``out=`` tensor (a channels-last one:
    the kernel writes HWC rows into it directly)."""
    import torch

    name = {("bilinear", True): "_upsample_bilinear2d_aa", ("bilinear", False): "upsample_bilinear2d",
            ("bicubic", True): "_upsample_bicubic2d_aa", ("bicubic", False): "upsample_bicubic2d"}
    return getattr(torch._C._nn, name[(interpolation, antialias)])


class _Scratch(threading.local):
    """Per thread: the last resize's channels-last output tensor and its HWC numpy view."""

    key: tuple[int, int, int] | None = None
    tensor: Any = None
    view: np.ndarray | None = None


_scratch = _Scratch()


def _smooth_torch(pixels: np.ndarray, size: tuple[int, int], interpolation: str, antialias: bool,
                  scratch: bool = False) -> np.ndarray:
    import torch

    # HWC memory seen as NCHW: channels-last, the layout the vectorised kernel reads directly (made
    # contiguous first: the kernel would copy a crop view through torch's intra-op pool), and
    # (with a real batch stride, not newaxis's 0) recognised as such, so the result is
    # channels-last too: HWC, copied into a batch row whole (a planar result costs the kernel
    # a strided pack and the copy a channel-by-channel interleave). The views are numpy's: a
    # torch view op lets go of the GIL, and each release lets another loader thread take it
    # (docs/reading.md, "Threads and the GIL"); the resize is the one torch call. With
    # ``scratch``, it writes into this thread's output tensor, kept for the next image: a new
    # tensor per image let go of the GIL three more times as it was freed.
    pixels = _contiguous(pixels)
    tensor = torch.from_numpy(pixels.reshape(1, *pixels.shape).transpose(0, 3, 1, 2))
    key = (pixels.shape[2], *size)
    if not scratch or _scratch.key != key:
        output = torch.empty((1, *key), dtype=torch.uint8, memory_format=torch.channels_last)
        view = output.numpy()[0].transpose(1, 2, 0)
        if scratch:
            _scratch.tensor, _scratch.view, _scratch.key = output, view, key
    else:
        output, view = _scratch.tensor, _scratch.view
    _torch_op(interpolation, antialias)(tensor, size, False, None, None, out=output)
    return view


def _contiguous(pixels: np.ndarray) -> np.ndarray:
    """``pixels`` (uint8 HWC) C-contiguous. A crop of a larger decode (rows of whole pixels, at
    the decode's row stride) is copied row by row with the GIL held (``bytearray`` of a buffer):
    numpy's copy lets go of it, and another loader thread takes it."""
    if pixels.flags.c_contiguous:
        return pixels
    height, width, channels = pixels.shape
    rows = pixels.reshape(height, width * channels)  # a view: a crop of a decode has contiguous rows
    if rows.flags.c_contiguous:  # reshape had to copy
        return rows.reshape(pixels.shape)
    return np.frombuffer(bytearray(memoryview(rows)), np.uint8).reshape(pixels.shape)


def _smooth_pillow(pixels: np.ndarray, size: tuple[int, int], interpolation: str, antialias: bool,
                   scratch: bool = False) -> np.ndarray:
    from PIL import Image

    image = Image.fromarray(np.ascontiguousarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels))
    resized = np.asarray(image.resize((size[1], size[0]), _PILLOW_FILTERS[interpolation]))
    return resized[:, :, None] if resized.ndim == 2 else resized


def _smooth(pixels: np.ndarray, size: tuple[int, int], interpolation: str, antialias: bool,
            scratch: bool = False) -> np.ndarray:
    if torch_resizes_serially() and pixels.shape[2] in (1, 3):
        return _smooth_torch(pixels, size, interpolation, antialias, scratch)
    return _smooth_pillow(pixels, size, interpolation, antialias)


def _source_indices(in_size: int, out_size: int, offset: float) -> np.ndarray:
    """torch's nearest index rule: ``min(floor((dst + offset) * scale), in - 1)``, float32 scale."""
    scale = np.float32(in_size) / np.float32(out_size)
    positions = (np.arange(out_size, dtype=np.float32) + np.float32(offset)) * scale
    return np.minimum(np.floor(positions).astype(np.int64), in_size - 1)


def _nearest(offset: float) -> Callable[..., np.ndarray]:
    def kernel(pixels: np.ndarray, size: tuple[int, int], interpolation: str, antialias: bool,
               scratch: bool = False) -> np.ndarray:
        rows = _source_indices(pixels.shape[0], size[0], offset)
        columns = _source_indices(pixels.shape[1], size[1], offset)
        return pixels[rows[:, None], columns[None, :]]

    return kernel


# interpolation (torchvision's InterpolationMode value) -> kernel(pixels, (height, width), interpolation, antialias,
# scratch)
KERNELS: dict[str, Callable[..., np.ndarray]] = {
    "bilinear": _smooth,
    "bicubic": _smooth,
    "nearest": _nearest(0.0),
    "nearest-exact": _nearest(0.5),
}


def resize(pixels: np.ndarray, size: tuple[int, int], *, interpolation: str = "bilinear",
           antialias: bool | None = True, scratch: bool = False) -> np.ndarray:
    """``pixels`` (uint8 HWC, any strides) resized to ``size`` (height, width) as torchvision's
    tensor ``resize`` does (``antialias`` None means True, as in torchvision's v2); the array
    itself when it already has that size. ``scratch``: the result may be this thread's scratch
    output, valid until its next resize with ``scratch`` (for a caller that copies it at once)."""
    if tuple(pixels.shape[:2]) == tuple(size):
        return pixels
    return KERNELS[interpolation](pixels, tuple(size), interpolation, antialias is not False, scratch)


def place(pixels: np.ndarray, out: np.ndarray | None, *, flip: bool = False,
          reversed_channels: bool = False) -> np.ndarray:
    """``pixels`` (HWC, any strides), mirrored left-right when ``flip``, copied into ``out`` (a
    row of a batch) when given, else into a new contiguous array: numpy's copy, one thread.
    ``reversed_channels``: ``pixels`` hold their channels last to first (BGR for an RGB result),
    put back in order while copying. Rows of whole pixels (the resize kernel's HWC result, a
    centre crop of it) are copied as they are, and mirrored with their channels reversed as one
    copy of each row's values backwards (the fused decode decodes an image it will flip as BGR
    for that: one copy, where the channels one by one are three); anything else goes channel by
    channel: numpy copies an (H, W) plane several times faster than an (H, W, 3) view whose
    innermost loop is 3 bytes long, and a mirrored view or a planar (C, H, W) array seen as HWC
    is such a view."""
    if out is None:
        out = np.empty(pixels.shape, dtype=pixels.dtype)
    elif out.shape != pixels.shape:
        raise ValueError(f"cannot place pixels of shape {pixels.shape} into a row of shape {out.shape}")
    channels = pixels.shape[2]
    whole = _whole_pixels(pixels)
    if whole and not flip and not reversed_channels:
        if not (pixels.flags.c_contiguous and out.flags.c_contiguous and _copy_holding_gil(out, pixels)):
            out[...] = pixels
        return out
    if whole and flip and (reversed_channels or channels == 1) and _whole_pixels(out):
        _rows(out)[...] = _rows(pixels)[:, ::-1]
        return out
    columns = slice(None, None, -1) if flip else slice(None)
    for channel in range(channels):
        out[:, :, channel] = pixels[:, columns, channels - 1 - channel if reversed_channels else channel]
    return out


def _whole_pixels(array: np.ndarray) -> bool:
    """Whether an HWC array's rows are runs of whole pixels (each row one run of values)."""
    channels, item = array.shape[2], array.itemsize
    return array.strides[1] == channels * item and (channels == 1 or array.strides[2] == item)


def _rows(array: np.ndarray) -> np.ndarray:
    """An HWC array of :func:`_whole_pixels` seen as (H, W * C): each row's values in order (a
    view: merging W and C needs no copy exactly when the rows are runs of whole pixels)."""
    return array.reshape(array.shape[0], array.shape[1] * array.shape[2])


@functools.lru_cache(maxsize=None)
def _memmove() -> Callable[..., Any] | None:
    """The C library's ``memmove`` called with the GIL held (``ctypes.PyDLL``), or None where it
    cannot be loaded."""
    try:
        function = ctypes.PyDLL(None).memmove
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes, function.restype = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t), ctypes.c_void_p
    return function


def _copy_holding_gil(out: np.ndarray, pixels: np.ndarray) -> bool:
    """Copy C-contiguous ``pixels`` into C-contiguous, writable ``out`` of the same shape and dtype
    without letting go of the GIL (a batch row, about 150 kB: microseconds, where numpy's copy lets
    go of the GIL and another loader thread takes it); False, nothing written, where that cannot be
    done (numpy's copy then does it, or raises its own error: a read-only ``out``)."""
    memmove = _memmove()
    if (memmove is None or out.dtype != pixels.dtype or out.shape != pixels.shape or not out.flags.writeable
            or not (out.flags.c_contiguous and pixels.flags.c_contiguous)):
        return False  # memmove checks none of these: it would write into read-only memory, or past an array
    memmove(out.__array_interface__["data"][0], pixels.__array_interface__["data"][0], pixels.nbytes)
    return True
