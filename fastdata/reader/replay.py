"""The crop draw of a freshly seeded torch generator, replayed without torch ops.

A reader draws each sample's RandomResizedCrop box and flip from ``torch.Generator().manual_seed(
seed_for(seed, epoch, index))``: torchvision's boxes for that generator, the same in every
process and backend. Done with torch, that is about fifteen one-element tensor ops per image
(20-25 us), and each op lets go of the GIL: in the thread backend every release lets another
loader thread in, and taking the GIL back costs a context switch (docs/reading.md, "Threads and
the GIL"). Here the same draw is computed from the generator's own numbers, in Python:

* torch's CPU generator is a Mersenne Twister seeded with the seed's low 32 bits
  (``init_genrand``), numpy's legacy seeding of ``np.random.MT19937`` exactly, whose public
  ``random_raw`` gives the same 32-bit outputs torch draws from;
* ``uniform_(low, high)`` on a float32 tensor is ``x * (high - low) + low`` in float32 with
  ``x`` the output's low 24 bits over 2**24, rounded once (a fused multiply-add, as torch's
  AVX2/AVX512 kernels compute it) or twice (its default kernel): which one this torch does is
  measured once per process against torch itself (:func:`uniform_rule`); ``randint(0, n)`` is
  ``output % n`` (images up to 2**24 pixels a side; larger ones are drawn with torch);
* ``torch.exp`` of a float32 is within an ulp of the correctly rounded value but not always
  that value (SLEEF's ``expf``; 1.1% of the draws' ratios differ by an ulp), so the box is
  computed at the ratio two ulps down and two up: box sizes only grow (width) or shrink
  (height) with the ratio, so where both ends give the same box, torch's ratio gives it too.
  Where they differ (about 1 image in 2,000), :func:`random_resized_crop` gives None and the
  caller draws with torch.

``tests/test_fused.py`` checks the replay against torch's draw on 100,000 (size, seed) pairs and
that it runs no torch op.
"""

from __future__ import annotations

import functools
import hashlib
import math
import struct
import threading
from typing import Callable

import numpy as np
import torch

_F32, _U32 = struct.Struct("<f"), struct.Struct("<I")
_TWO_24 = 2.0 ** -24  # torch's uniform_ for float32: the output's low 24 bits times 2**-24
_LOW_24 = 0xFFFFFF
_TRIES = 10  # torchvision's RandomResizedCrop
_OUTPUTS = 2 * _TRIES + 3  # two per try, two for the position, one for the flip
_ULPS = 2  # the window around the correctly rounded exp that torch's expf lands in
_LARGEST = 2 ** 24  # randint(0, n) is output % n (tested up to 2**24 + 1); larger sides: torch draws
_FLT_MAX = 3.4028234663852886e38
_ASPECTS = (2.0 ** -100, 2.0 ** 100)  # ratios the ulp window is modelled for (normal float32s, far from inf)
_SEEDS = (-2 ** 63, 2 ** 64)  # what manual_seed takes; outside it torch raises
_local = threading.local()


def seed_for(seed: int, epoch: int, index: int) -> int:
    """The 63-bit seed of sample ``index`` in ``epoch``: a hash of (seed, epoch, index), the same
    in every process (:func:`fastdata.reader.fused.generator_for` seeds a torch generator with it)."""
    digest = hashlib.blake2b(struct.pack("<qqq", seed, epoch, index), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


def _f32(value: float) -> float:
    return _F32.unpack(_F32.pack(value))[0]


def _f32_saturating(value: float) -> float:
    """``value`` cast to float32 as torch casts a comparison's scalar: too large is infinite."""
    try:
        return _f32(value)
    except OverflowError:
        return math.copysign(math.inf, value)


def _ulps_from(value: float, ulps: int) -> float:
    """The float32 ``ulps`` steps from the positive float32 ``value``."""
    return _F32.unpack(_U32.pack(_U32.unpack(_F32.pack(value))[0] + ulps))[0]


def seeded(seed: int) -> Callable[[], int]:
    """The 32-bit outputs of ``torch.Generator().manual_seed(seed)``, one per call, from this
    thread's generator (seeding and drawing are not atomic). One output per call because
    ``random_raw()`` without a size keeps the GIL, where with a size it lets go of it around its
    loop, and another loader thread takes it (docs/reading.md, "Threads and the GIL"); a draw
    reads five outputs when its first try fits."""
    state = getattr(_local, "state", None)
    if state is None:
        bits = np.random.MT19937()
        state = _local.state = (np.random.RandomState(bits), bits)
    legacy, bits = state
    legacy.seed(seed & 0xFFFF_FFFF)  # init_genrand on the low 32 bits, as torch's mt19937
    return bits.random_raw


def outputs(seed: int, count: int = _OUTPUTS) -> list[int]:
    """The first ``count`` 32-bit outputs of ``torch.Generator().manual_seed(seed)``."""
    draw = seeded(seed)
    return [draw() for _ in range(count)]


class _Uniform:
    """``torch.empty(1).uniform_(low, high, generator=g).item()`` from one output of ``g``."""

    def __init__(self, low: float, high: float, fused: bool) -> None:
        self.low = _f32(low)  # torch casts the bounds to the tensor's dtype first
        self.span = _f32(_f32(high) - self.low)
        self.fused = fused

    def __call__(self, output: int) -> float:
        x = (output & _LOW_24) * _TWO_24
        if self.fused:  # x * span is exact in a double (24 + 24 bits), so is the sum (checked): one rounding
            return _f32(x * self.span + self.low)
        return _f32(_f32(x * self.span) + self.low)

    def exact(self) -> bool:
        """Whether x * span + low is exact in a double for every x (what the fused rule needs):
        the bits from the sum's top down to the product's last fit in 53."""
        if self.span == 0.0 or self.low == 0.0:
            return True
        top = max(math.frexp(self.low)[1], math.frexp(self.span)[1]) + 1
        last = min(math.frexp(self.span)[1] - 48, math.frexp(self.low)[1] - 24)
        return top - last <= 53


@functools.cache
def uniform_rule() -> bool | None:
    """How this torch rounds ``uniform_`` on float32: True (one rounding, a fused multiply-add),
    False (two), None (neither matches: the draws stay torch's). Measured once per process on
    256 draws from a seeded generator, with bounds where the two rules often differ."""
    low, high = 0.08, 1.0
    generator = torch.Generator().manual_seed(20261205)
    drawn = torch.empty(256, dtype=torch.float32).uniform_(low, high, generator=generator).tolist()
    seeds = outputs(20261205, 256)
    for fused in (True, False):
        uniform = _Uniform(low, high, fused)
        if all(uniform(output) == value for output, value in zip(seeds, drawn)):
            return fused
    return None


@functools.lru_cache(maxsize=64)
def _uniforms(scale: tuple[float, float], log_ratio: tuple[float, float]) -> tuple[_Uniform, _Uniform] | None:
    fused = uniform_rule()
    bounds = (*scale, *log_ratio)
    if (fused is None or not all(abs(bound) <= _FLT_MAX for bound in bounds)
            or max(map(abs, log_ratio)) > 69.0 or scale[0] > scale[1] or log_ratio[0] > log_ratio[1]):
        return None  # bounds torch's uniform_ refuses (it raises its own error) or the replay does not model
    area, ratio = _Uniform(*scale, fused), _Uniform(*log_ratio, fused)
    if fused and not (area.exact() and ratio.exact()):
        return None
    return area, ratio


def central_crop(height: int, width: int, ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop fallback when all ten tries miss: (top, left, box_height,
    box_width) of the central crop with the ratio clamped into ``ratio``."""
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        box_width, box_height = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        box_height, box_width = height, int(round(height * max(ratio)))
    else:
        box_width, box_height = width, height
    return (height - box_height) // 2, (width - box_width) // 2, box_height, box_width


def random_resized_crop(height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float],
                        log_ratio: tuple[float, float], flip_p: float | None,
                        seed: int) -> tuple[int, int, int, int, bool] | None:
    """(top, left, box_height, box_width, flip) as :func:`fastdata.reader.fused.random_resized_crop_box`
    then ``torch.rand(1) < flip_p`` (``flip_p`` None: no flip drawn, False) give them on
    ``torch.Generator().manual_seed(seed)``; None where the replay cannot be sure of torch's
    result (the caller then draws with torch): a default dtype other than float32 (torchvision's
    ``torch.empty(1)`` then draws in it), bounds or seeds torch refuses, sides over 2**24,
    ratios near float32's ends, a box on the edge of an ulp of torch's exp. ``log_ratio``:
    torchvision's float32 ``log(ratio)`` as Python floats."""
    if (torch.get_default_dtype() is not torch.float32 or height > _LARGEST or width > _LARGEST
            or not _SEEDS[0] <= seed < _SEEDS[1]):
        return None
    uniforms = _uniforms(scale, log_ratio)
    if uniforms is None:
        return None
    area_uniform, ratio_uniform = uniforms
    draw, area = seeded(seed), height * width
    for _ in range(_TRIES):
        target_area = area * area_uniform(draw())
        aspect = _f32(math.exp(ratio_uniform(draw())))
        if not _ASPECTS[0] < aspect < _ASPECTS[1]:
            return None
        low, high = _ulps_from(aspect, -_ULPS), _ulps_from(aspect, _ULPS)
        box_width = int(round(math.sqrt(target_area * low)))
        box_height = int(round(math.sqrt(target_area / low)))
        if (box_width != int(round(math.sqrt(target_area * high)))
                or box_height != int(round(math.sqrt(target_area / high)))):
            return None  # torch's exp decides the box: only torch knows
        if 0 < box_width <= width and 0 < box_height <= height:
            top = draw() % (height - box_height + 1)
            left = draw() % (width - box_width + 1)
            break
    else:
        top, left, box_height, box_width = central_crop(height, width, ratio)
    flip = flip_p is not None and (draw() & _LOW_24) * _TWO_24 < _f32_saturating(flip_p)
    return top, left, box_height, box_width, flip
