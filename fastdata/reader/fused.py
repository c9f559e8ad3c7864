"""Training-time decode: a pipeline's leading random-resized-crop (+ horizontal flip), or its
leading resize + centre crop, fused into the JPEG decode: only the DCT scale the crop box
needs is decoded.

Three steps, each usable on its own:

* :func:`split_transform` reads torchvision's own transform objects (v1 or v2, a ``Compose`` or
  a single transform) and splits off a leading ``RandomResizedCrop`` (+ ``RandomHorizontalFlip``)
  or ``Resize`` + ``CenterCrop`` as a :class:`FusedPlan`, with the rest of the pipeline to run
  after. Anything else is not fused: it returns None, and :func:`fusion_refusal` says why (the
  same reason is logged at DEBUG level on the ``fastdata.reader.fused`` logger).
* :meth:`FusedPlan.draw` draws the crop box and the flip from the image's (height, width) alone,
  with the same operations, in the same order, on the same torch generator stream as
  torchvision's ``RandomResizedCrop.get_params`` then ``RandomHorizontalFlip``: for a generator
  in a given state the boxes are torchvision's boxes. :func:`generator_for` seeds that generator
  from (seed, epoch, index), so the draw is the same in every process, backend and num_workers.
  Given the seed itself (``seed=``, what the readers pass: :func:`seed_for`), the draw of a
  generator freshly seeded with it is replayed without torch ops (:mod:`fastdata.reader.replay`:
  the same boxes, no GIL released per op).
* :func:`fused_decode` decodes a JPEG at the smallest DCT scale (1/8, 1/4, 1/2, 1) whose image
  of the box still covers the output size, cuts the box out of the scaled image, resizes it once
  and flips it while writing it into its row of the batch, with :mod:`fastdata.reader.kernels`
  (the calling thread only, never torch's intra-op pool; for bilinear + antialias, torch's
  vectorised uint8 kernel, what torchvision's tensor ``resize`` calls, where it has it). Other
  images (PNG, ...) are decoded in full, then cropped on the same box: pixel-equal to
  torchvision on a uint8 tensor.

The decoder (a row of :data:`DECODERS`) is chosen by measurement (``benchmarks/bench_fused.py``,
numbers in docs/reading.md, :func:`default_decoder`): ``"region"`` decodes only the box's part at
the DCT scale (:mod:`fastdata.reader.region`, the ``region`` extra), ``"simplejpeg"`` the whole
image at it (the ``jpeg`` extra), ``"pil"`` Pillow's ``draft`` (no extra); a missing extra asked
for by name is a DependencyMissingError naming the install command. Output: a uint8 CHW tensor.
"""

from __future__ import annotations

import functools
import io
import logging
import math
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any, Callable

import numpy as np
import torch

from fastdata.errors import InvalidOptionError
from fastdata.extras import require
from fastdata.images import center_crop_array
from fastdata.reader import kernels, region, replay
from fastdata.reader.region import DCT_SCALES, dct_scale, decoded_scale, scaled_region  # noqa: F401 (re-exported)
from fastdata.reader.replay import seed_for  # noqa: F401 (re-exported)

logger = logging.getLogger(__name__)

_JPEG_MAGIC = b"\xff\xd8\xff"


@dataclass(frozen=True)
class Draw:
    """One sample's box in source pixels (torchvision's ``top, left, height, width``) and flip."""

    top: int
    left: int
    height: int
    width: int
    flip: bool


@dataclass(frozen=True)
class FusedPlan:
    """What the decoder does instead of the pipeline's leading geometric transforms.

    ``kind`` is ``"random_resized_crop"`` (``size``, ``scale``, ``ratio``, ``flip_p``) or
    ``"resize_center_crop"`` (``resize``, ``max_size``, then a centre crop to ``size``).
    ``size`` is the output (height, width); ``interpolation`` a torchvision InterpolationMode
    value (``"bilinear"``, ...)."""

    kind: str
    size: tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    interpolation: str = "bilinear"
    antialias: bool | None = True
    flip_p: float | None = None  # None: no flip in the pipeline (nothing drawn for it)
    resize: tuple[int, ...] | None = None
    max_size: int | None = None

    def draw(self, height: int, width: int, generator: torch.Generator | None = None, *,
             seed: int | None = None) -> Draw:
        """The box and flip for an image of ``height`` x ``width``: torchvision's
        ``RandomResizedCrop.get_params`` (10 tries, log-uniform ratio, central-crop fallback),
        then ``torch.rand(1) < flip_p``, on ``generator`` (None: torch's global one, as
        torchvision). ``seed`` instead of a generator: the draw of ``torch.Generator().manual_seed(
        seed)``, replayed without torch ops where the replay is sure of torch's result (nearly
        always: :mod:`fastdata.reader.replay`), else drawn on that generator. A resize + centre
        crop plan draws nothing and covers the whole image."""
        if seed is not None and generator is not None:
            raise InvalidOptionError("Give the draw a generator or a seed, not both.")
        if self.kind == "resize_center_crop":
            return Draw(0, 0, height, width, False)
        if seed is not None:
            replayed = None
            if replay_agrees():
                replayed = replay.random_resized_crop(height, width, tuple(self.scale), tuple(self.ratio),
                                                      _log_ratio(tuple(self.ratio)), self.flip_p, seed)
            if replayed is not None:
                return Draw(*replayed)
            generator = torch.Generator().manual_seed(seed)
        top, left, box_height, box_width = random_resized_crop_box(height, width, self.scale, self.ratio, generator)
        flip = False
        if self.flip_p is not None:  # torchvision draws even for p = 0 or 1: the stream stays aligned
            flip = bool(torch.rand(1, generator=generator) < self.flip_p)
        return Draw(top, left, box_height, box_width, flip)

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """For a resize + centre crop plan: (height, width) after the Resize, torchvision's rule,
        asked of torchvision's public ``v2.functional.resize`` on an empty (0, height, width)
        tensor (it computes the output size and resizes nothing)."""
        _, _, functional = _torchvision()
        empty = torch.empty((0, height, width), dtype=torch.uint8)
        resized = functional.resize(empty, list(self.resize) if self.resize else None, max_size=self.max_size)
        return int(resized.shape[-2]), int(resized.shape[-1])


@dataclass(frozen=True)
class Fusion:
    """A reader's fused decode: ``plan`` done inside the decode, ``rest`` (the rest of the
    transform, None: nothing) run on what it gives, the crops drawn from ``(seed, epoch,
    index)``. Decided by :meth:`fastdata.reader.ReaderOptions.fusion` and held by the reader's
    :class:`~fastdata.reader.decoding.Decoder` alone (``decoder.fusion``)."""

    plan: FusedPlan
    rest: Callable | None = None
    seed: int = 0


def random_resized_crop_box(height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float],
                            generator: torch.Generator | None = None) -> tuple[int, int, int, int]:
    """(top, left, box_height, box_width), line for line torchvision 0.29's
    ``RandomResizedCrop.get_params`` / ``make_params``, drawing from ``generator``."""
    area = height * width
    log_ratio = _log_ratio(tuple(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=generator)).item()
        box_width = int(round(math.sqrt(target_area * aspect_ratio)))
        box_height = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < box_width <= width and 0 < box_height <= height:
            top = int(torch.randint(0, height - box_height + 1, size=(1,), generator=generator).item())
            left = int(torch.randint(0, width - box_width + 1, size=(1,), generator=generator).item())
            return top, left, box_height, box_width
    return replay.central_crop(height, width, ratio)  # every try missed


def _log_ratio(ratio: tuple[float, float]) -> tuple[float, float]:
    """torchvision's ``torch.log(torch.tensor(ratio))`` (in the default dtype, float32 unless set
    otherwise), as Python floats: the same bounds for ``uniform_``, computed once per ratio and
    dtype instead of two tensor ops per draw."""
    return _log_ratio_in(tuple(ratio), torch.get_default_dtype())


@functools.lru_cache(maxsize=64)
def _log_ratio_in(ratio: tuple[float, float], dtype: torch.dtype) -> tuple[float, float]:
    low, high = torch.log(torch.tensor(ratio, dtype=dtype)).tolist()
    return low, high


_REPLAY_CHECK: list[bool] = []  # the check's result, once it has compared draws


def replay_agrees() -> bool:
    """Whether the replayed draw (:mod:`fastdata.reader.replay`) is this torch's, checked once per
    process on 48 draws (sizes that need the position drawn and sizes where every try fails):
    False, and every draw stays torch's, where torch's generator or ops ever change. Where the
    replay compares nothing (a float64 default dtype: torch draws), it is asked again next time."""
    if _REPLAY_CHECK:
        return _REPLAY_CHECK[0]
    plan, compared = FusedPlan("random_resized_crop", (224, 224), flip_p=0.5), 0
    for index in range(48):
        height, width = ((375, 500), (500, 333), (20, 2000), (1500, 7))[index % 4]
        seed = replay.seed_for(20261205, 0, index)
        replayed = replay.random_resized_crop(height, width, plan.scale, plan.ratio, _log_ratio(plan.ratio), 0.5,
                                              seed)
        if replayed is None:
            continue
        compared += 1
        if Draw(*replayed) != plan.draw(height, width, torch.Generator().manual_seed(seed)):
            logger.debug("the replayed crop draw differs from torch's here: every draw is torch's")
            _REPLAY_CHECK.append(False)
            return False
    if compared:
        _REPLAY_CHECK.append(True)
    return True


def generator_for(seed: int, epoch: int, index: int) -> torch.Generator:
    """A torch generator seeded from a hash of (seed, epoch, index) (:func:`seed_for`): the same
    stream in every process, different per epoch and per sample."""
    return torch.Generator().manual_seed(seed_for(seed, epoch, index))


# --- reading torchvision's transform objects -------------------------------------------------

_PIL_ONLY_MODES = ("box", "hamming")  # torchvision resizes tensors with every other mode


def _torchvision() -> tuple[Any, Any, Any]:
    require("torchvision", extra="torchvision", feature="the fused decode (reading torchvision transforms)")
    from torchvision import transforms as v1
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional

    return v1, v2, functional


def _is(step: Any, name: str) -> bool:
    """``step`` is exactly torchvision's (v1 or v2) class ``name``; a subclass may override its
    parameters or its kernel, so it is not fused."""
    v1, v2, _ = _torchvision()
    return type(step) in (getattr(v1, name), getattr(v2, name))


def _subclass_of(step: Any, name: str) -> bool:
    v1, v2, _ = _torchvision()
    return isinstance(step, (getattr(v1, name), getattr(v2, name))) and not _is(step, name)


def _interpolation(step: Any) -> tuple[str | None, str | None]:
    """(the step's interpolation as an InterpolationMode value, None) or (None, why not fused).
    torchvision takes an ``InterpolationMode``, its value as a string (``"bilinear"``) or, as
    documented, the Pillow integer constant of one (``PIL.Image.Resampling``: 0 nearest,
    1 lanczos, 2 bilinear, 3 bicubic, 4 box, 5 hamming); anything else it refuses when the
    transform runs, so that is left to it (not fused). Public names only: the mapping is
    checked against torchvision's own resize in tests/test_fused.py."""
    from PIL import Image

    _, _, functional = _torchvision()
    value = step.interpolation
    if isinstance(value, functional.InterpolationMode):
        mode = value.value
    elif isinstance(value, str) and value in {member.value for member in functional.InterpolationMode}:
        mode = value
    elif isinstance(value, int) and not isinstance(value, bool) and value in set(Image.Resampling):
        mode = functional.InterpolationMode[Image.Resampling(value).name].value
    else:
        return None, f"{type(step).__name__} has an interpolation torchvision refuses ({value!r})"
    if mode in _PIL_ONLY_MODES:
        return None, f"{type(step).__name__} interpolation {mode!r} exists only for PIL images"
    return mode, None


def _rest(steps: list, template: Any) -> Callable | None:
    if not steps:
        return None
    if len(steps) == 1:
        return steps[0]
    return type(template)(steps) if hasattr(template, "transforms") else _torchvision()[1].Compose(steps)


def _split(transform: Any) -> tuple[FusedPlan, Callable | None] | str:
    """(plan, rest) or the reason nothing is fused."""
    if transform is None:
        return "there is no transform"
    v1, v2, _ = _torchvision()
    steps = list(transform.transforms) if isinstance(transform, (v1.Compose, v2.Compose)) else [transform]
    if not steps:
        return "the Compose is empty"
    first, name = steps[0], type(steps[0]).__name__
    for base in ("RandomResizedCrop", "Resize", "CenterCrop", "RandomHorizontalFlip"):
        if _subclass_of(first, base):
            return f"{name} is a subclass of torchvision's {base} (it may override how it crops): not fused"
    if _is(first, "RandomResizedCrop"):
        interpolation, reason = _interpolation(first)
        if reason:
            return reason
        rest, flip_p = steps[1:], None
        if rest and _is(rest[0], "RandomHorizontalFlip"):
            flip_p, rest = float(rest[0].p), rest[1:]
        plan = FusedPlan("random_resized_crop", tuple(first.size), scale=tuple(map(float, first.scale)),
                         ratio=tuple(map(float, first.ratio)), interpolation=interpolation,
                         antialias=first.antialias, flip_p=flip_p)
        return plan, _rest(rest, transform)
    if _is(first, "Resize"):
        if len(steps) < 2 or not _is(steps[1], "CenterCrop"):
            following = type(steps[1]).__name__ if len(steps) > 1 else "nothing"
            return f"Resize is followed by {following}, not CenterCrop: only Resize + CenterCrop is fused"
        interpolation, reason = _interpolation(first)
        if reason:
            return reason
        size = first.size
        resize = None if size is None else ((size,) if isinstance(size, int) else tuple(size))
        plan = FusedPlan("resize_center_crop", tuple(steps[1].size), interpolation=interpolation,
                         antialias=first.antialias, resize=resize, max_size=first.max_size)
        return plan, _rest(steps[2:], transform)
    return (f"the pipeline starts with {name}, not RandomResizedCrop (+ RandomHorizontalFlip) "
            "or Resize + CenterCrop")


def split_transform(transform: Any) -> tuple[FusedPlan, Callable | None] | None:
    """``(plan, rest)``: the pipeline's leading crop (+ flip) as a plan for :func:`fused_decode`,
    and what runs after it (None: nothing). None when nothing can be fused; the reason is
    logged at DEBUG and given by :func:`fusion_refusal`."""
    result = _split(transform)
    if isinstance(result, str):
        logger.debug("transform not fused: %s", result)
        return None
    return result


def fusion_refusal(transform: Any) -> str | None:
    """Why ``transform`` is not fused (None: it is)."""
    result = _split(transform)
    return result if isinstance(result, str) else None


# --- the decode ------------------------------------------------------------------------------


def _simplejpeg() -> Any:
    return require("simplejpeg", extra="jpeg", feature="the fused decode with decoder='simplejpeg'")


def strict_simplejpeg(function: str, data: bytes, **options: Any) -> Any:
    """simplejpeg's ``function`` on ``data``, or None where its strict mode refuses the file.

    libjpeg-turbo warns about damage it recovers from ("Corrupt JPEG data: 1 extraneous bytes
    before marker 0xd9", as in some ImageNet training files); simplejpeg's strict mode turns the
    warning into a ValueError, and without it a truncated file decodes grey. Pillow, which the
    conversion and ``verify --deep`` decode with, accepts the first and refuses the second, so a
    None sends the file to Pillow: what converted and verified reads, what is broken raises."""
    try:
        return getattr(_simplejpeg(), function)(data, **options)
    except ValueError as exc:
        logger.debug("simplejpeg refused a JPEG (%s); Pillow decodes it", exc)
        return None


def jpeg_size(data: bytes, decoder: str = "simplejpeg") -> tuple[int, int]:
    """(height, width) of a JPEG from its header, without decoding."""
    header = DECODERS[decoder].header(data)
    if header is not None:
        return header[0], header[1]
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.height, image.width


def _whole_box(decoder: str) -> Callable[..., np.ndarray]:
    def box(data: bytes, draw: Draw, scale: int, height: int, width: int, mode: str,
            accurate: bool = False) -> np.ndarray:
        """The whole JPEG at 1/scale, then the box cut out of it (``accurate``: the exact IDCT and
        smooth chroma upsampling, as Pillow decodes, instead of the fast ones)."""
        need_height, need_width = -(-height // scale), -(-width // scale)
        if decoder == "simplejpeg":
            pixels = strict_simplejpeg("decode_jpeg", data, colorspace="GRAY" if mode == "L" else mode,
                                       fastdct=not accurate, fastupsample=not accurate, min_height=need_height,
                                       min_width=need_width)
            if pixels is not None:
                return _cut(pixels, draw, height, width)
        from PIL import Image  # Pillow's draft: asked for, or simplejpeg refused the file

        with Image.open(io.BytesIO(data)) as image:
            pil_mode = "RGB" if mode == "BGR" else mode
            image.draft(pil_mode, (need_width, need_height))
            pixels = _cut(np.array(image.convert(pil_mode)), draw, height, width)
        return np.ascontiguousarray(pixels[:, :, ::-1]) if mode == "BGR" else pixels

    return box


def _cut(pixels: np.ndarray, draw: Draw, height: int, width: int) -> np.ndarray:
    """``draw``'s box out of a ``height`` x ``width`` image decoded at a DCT scale (HWC view)."""
    pixels = pixels[:, :, None] if pixels.ndim == 2 else pixels
    scale = decoded_scale(height, width, *pixels.shape[:2])  # the decoder may pick a larger image
    top, left, bottom, right = scaled_region(draw, scale, *pixels.shape[:2])
    return pixels[top:bottom, left:right]


def _region_box(data: bytes, draw: Draw, scale: int, height: int, width: int, mode: str,
                accurate: bool = False) -> np.ndarray:
    """The region decode's box; an ``accurate`` one (a small image) decoded whole, as Pillow
    decodes it (a region's edge would be upsampled without the pixels beyond it)."""
    args = (data, draw, scale, height, width, mode)
    pixels = None if accurate else region.box(*args)  # None: the decoder used without it decides
    return DECODERS[_whole_decoder()].box(*args, accurate) if pixels is None else pixels


@dataclass(frozen=True)
class JpegDecoder:
    """A row of :data:`DECODERS`: a JPEG's header, (height, width, ...) (None: Pillow reads it),
    the box's pixels at the DCT scale (``box(data, draw, scale, height, width, mode, accurate)``,
    uint8 HWC; ``mode`` "RGB", "BGR" or "L"; ``accurate``: no fast IDCT or chroma upsampling), and ``require()``: raises DependencyMissingError where
    its library is missing."""

    header: Callable[[bytes], tuple | None]
    box: Callable[..., np.ndarray]
    require: Callable[[], Any]


DECODERS = {
    "simplejpeg": JpegDecoder(functools.partial(strict_simplejpeg, "decode_jpeg_header"), _whole_box("simplejpeg"),
                              _simplejpeg),
    "pil": JpegDecoder(lambda data: None, _whole_box("pil"), lambda: None),
    "region": JpegDecoder(lambda data: region.header(data) or DECODERS[_whole_decoder()].header(data),
                          _region_box, region.require),
}


@functools.cache
def _whole_decoder() -> str:
    return "simplejpeg" if find_spec("simplejpeg") is not None else "pil"


def default_decoder() -> str:
    """What the readers decode JPEGs through a plan with: the region decode where its library
    loads (:func:`fastdata.reader.region.library`), else simplejpeg where installed, else Pillow."""
    return "region" if region.library() is not None else _whole_decoder()


def _finish(pixels: np.ndarray, plan: FusedPlan, out_size: tuple[int, int], flip: bool,
            out: np.ndarray | None = None, *, bgr: bool = False) -> np.ndarray:
    """Resize HWC ``pixels`` to ``out_size``, centre-crop (a resize + centre crop plan) and flip,
    with the read path's kernels (:mod:`fastdata.reader.kernels`: the calling thread only, never
    torch's intra-op pool); with ``out`` (uint8 HWC of ``plan.size``: a row of a batch) the result
    is written there, flipped while copying. ``bgr``: ``pixels`` are BGR, put in RGB order by the
    same copy (the resize treats each channel alike). The result, uint8 HWC."""
    pixels = kernels.resize(pixels, out_size, interpolation=plan.interpolation, antialias=plan.antialias,
                            scratch=True)  # copied into a new array or ``out`` below
    if plan.kind == "resize_center_crop":
        pixels = center_crop_array(pixels, *plan.size)
    return kernels.place(pixels, out, flip=flip, reversed_channels=bgr)


def fused_decode(data: bytes | memoryview, plan: FusedPlan, *, generator: torch.Generator | None = None,
                 mode: str = "RGB", decoder: str = "simplejpeg",
                 on_draw: Callable[[int, int, Draw], None] | None = None,
                 out: np.ndarray | None = None, seed: int | None = None) -> torch.Tensor:
    """Decode ``data`` through ``plan``: a uint8 CHW tensor of ``plan.size``. The box and flip
    are drawn from ``generator``, or from a generator freshly seeded with ``seed`` (see
    :meth:`FusedPlan.draw`; the readers pass :func:`seed_for`'s seed). A JPEG is decoded at the DCT
    scale the box allows, other images in full (then cropped on the same box). ``on_draw`` gets
    the image's (height, width) and its draw (to move the sample's other fields alike).
    ``out``: a uint8 (height, width, channels) array (a row of a preallocated batch) the image
    is written into; the tensor returned is then a CHW view of it."""
    return torch.from_numpy(fused_pixels(data, plan, generator=generator, mode=mode, decoder=decoder,
                                         on_draw=on_draw, out=out, seed=seed)).permute(2, 0, 1)


def fused_pixels(data: bytes | memoryview, plan: FusedPlan, *, generator: torch.Generator | None = None,
                 mode: str = "RGB", decoder: str = "simplejpeg",
                 on_draw: Callable[[int, int, Draw], None] | None = None,
                 out: np.ndarray | None = None, seed: int | None = None) -> np.ndarray:
    """:func:`fused_decode` as the readers call it: the same pixels as a uint8 HWC array (``out``
    itself when given), without the tensor views (each torch view op lets go of the GIL:
    docs/reading.md, "Threads and the GIL")."""
    if decoder not in DECODERS:
        raise InvalidOptionError(f"Unknown fused decoder {decoder!r}. Allowed: {', '.join(map(repr, DECODERS))}.")
    DECODERS[decoder].require()
    data = bytes(data)
    if data[:3] != _JPEG_MAGIC:
        return _fallback_pixels(data, plan, generator, mode, on_draw, out, seed)
    height, width = jpeg_size(data, decoder)
    draw = plan.draw(height, width, generator, seed=seed)
    if on_draw is not None:
        on_draw(height, width, draw)
    out_size = plan.size if plan.kind == "random_resized_crop" else plan.resized_size(height, width)
    # an image to be mirrored is decoded as BGR: reversing each row's values then mirrors it and
    # puts it back in RGB order in one copy (from RGB it takes three, one per channel), and the
    # GIL is let go of once for that copy, not three times (docs/reading.md, "Threads and the GIL")
    bgr = draw.flip and mode == "RGB"
    scale = dct_scale(draw.height, draw.width, *out_size)
    # a box the resize enlarges (a small image) is decoded exactly: the fast IDCT's and chroma
    # upsampling's errors would be enlarged with it (23-29 dB against Pillow for 4:2:0 thumbnails),
    # and such an image costs little to decode either way
    enlarged = scale == 1 and (draw.height < out_size[0] or draw.width < out_size[1])
    pixels = DECODERS[decoder].box(data, draw, scale, height, width, "BGR" if bgr else mode, enlarged)
    return _finish(pixels, plan, out_size, draw.flip, out, bgr=bgr)


def fallback_decode(data: bytes | memoryview, plan: FusedPlan, *, generator: torch.Generator | None = None,
                    mode: str = "RGB", on_draw: Callable[[int, int, Draw], None] | None = None,
                    out: np.ndarray | None = None, seed: int | None = None) -> torch.Tensor:
    """Decode in full (Pillow, fastdata's mode rules), then crop on the plan's box, resize and
    flip: pixel-equal to torchvision's transforms on the uint8 tensor for the same generator
    (where torch's vectorised kernel runs, :mod:`fastdata.reader.kernels`; within 1 grey level
    elsewhere). A uint8 CHW tensor, a view of ``out`` when given."""
    return torch.from_numpy(_fallback_pixels(data, plan, generator, mode, on_draw, out, seed)).permute(2, 0, 1)


def _fallback_pixels(data: bytes | memoryview, plan: FusedPlan, generator: torch.Generator | None, mode: str,
                     on_draw: Callable[[int, int, Draw], None] | None, out: np.ndarray | None,
                     seed: int | None = None) -> np.ndarray:
    from fastdata.images import decode

    pixels = decode(data, mode)
    height, width = pixels.shape[:2]
    draw = plan.draw(height, width, generator, seed=seed)
    if on_draw is not None:
        on_draw(int(height), int(width), draw)
    if plan.kind == "resize_center_crop":
        return _finish(pixels, plan, plan.resized_size(height, width), False, out)
    region = pixels[draw.top:draw.top + draw.height, draw.left:draw.left + draw.width]
    return _finish(region, plan, plan.size, draw.flip, out)


def transform_like(value: Any, plan: FusedPlan, draw: Draw) -> Any:
    """What the fused steps do to another spatial value of the same sample (a tv_tensor: a
    ``Mask``, ``BoundingBoxes``, another ``Image``, ...): torchvision's own functional kernels
    (``resized_crop`` then ``horizontal_flip``, or ``resize`` then ``center_crop``) with the box
    and flip drawn for the image, i.e. exactly what the unfused v2 pipeline gives for that draw
    (masks resized nearest-neighbour, boxes moved and clamped to the new canvas by torchvision)."""
    _, _, functional = _torchvision()
    interpolation = functional.InterpolationMode(plan.interpolation)
    if plan.kind == "resize_center_crop":
        value = functional.resize(value, list(plan.resize) if plan.resize else None, interpolation=interpolation,
                                  max_size=plan.max_size, antialias=plan.antialias)
        return functional.center_crop(value, list(plan.size))
    value = functional.resized_crop(value, draw.top, draw.left, draw.height, draw.width, list(plan.size),
                                    interpolation=interpolation, antialias=plan.antialias)
    return functional.horizontal_flip(value) if draw.flip else value
