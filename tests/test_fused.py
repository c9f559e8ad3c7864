"""The fused training-time decode (fastdata.reader.fused): torchvision's boxes exactly, reproducible
randomness, pixels close to decode-then-crop on the same box, PNG through the fallback exactly."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("torchvision")
from torchvision import transforms as v1  # noqa: E402
from torchvision import tv_tensors  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

from conftest import photo, psnr  # noqa: E402
from fastdata.reader import fused  # noqa: E402
from fastdata.errors import InvalidOptionError  # noqa: E402

# fused JPEG decode vs decode-then-crop-then-resize on the same box: measured 29-48 dB on these
# images (blurred noise with a 4-pixel white line, harder than a photo); the DCT's own 1/2..1/8
# downscale and the box rounded to whole scaled pixels account for the difference
MIN_PSNR_DB = 28.0


def _encode(pixels: np.ndarray, codec: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=codec, **({"quality": 90} if codec == "JPEG" else {}))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def images() -> dict[str, tuple[np.ndarray, bytes]]:
    out = {}
    for name, (height, width) in {"imagenet": (375, 500), "portrait": (480, 320), "large": (1500, 2000),
                                    "odd": (1501, 2003)}.items():
        pixels = photo(height, width, seed=height)
        out[name] = (pixels, _encode(pixels, "JPEG"))
    pixels = photo(300, 420, seed=7)
    out["png"] = (pixels, _encode(pixels, "PNG"))
    return out


def _train_plan(flip_p: float | None = 0.5, **crop) -> fused.FusedPlan:
    steps = [v2.RandomResizedCrop(224, **crop)] + ([v2.RandomHorizontalFlip(flip_p)] if flip_p is not None else [])
    plan, _ = fused.split_transform(v2.Compose(steps))
    return plan


# --- the boxes -------------------------------------------------------------------------------

SIZES = [(375, 500), (500, 333), (1500, 2000), (224, 224), (20, 2000), (2000, 20), (7, 9)]


@pytest.mark.parametrize("height,width", SIZES)
@pytest.mark.parametrize("crop", [{}, {"scale": (0.35, 1.0)}, {"scale": (0.9, 1.0), "ratio": (0.2, 0.25)}])
def test_boxes_equal_torchvision_for_the_same_generator_state(height: int, width: int, crop: dict) -> None:
    plan = _train_plan(**crop)
    tv_crop, image = v2.RandomResizedCrop(224, **crop), tv_tensors.Image(torch.zeros(3, height, width, dtype=torch.uint8))
    for seed in range(40):
        draw = plan.draw(height, width, torch.Generator().manual_seed(seed))
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            expected_v2 = tv_crop.make_params([image])
            expected_flip = bool(torch.rand(1) < 0.5)
            torch.manual_seed(seed)
            expected_v1 = v1.RandomResizedCrop.get_params(image, list(tv_crop.scale), list(tv_crop.ratio))
        assert (draw.top, draw.left, draw.height, draw.width) == tuple(expected_v2.values()) == expected_v1
        assert draw.flip is expected_flip


def test_the_central_crop_fallback_is_torchvisions() -> None:
    """A 20 x 2000 strip never fits a ratio in 3/4..4/3 at scale >= 0.08: all 10 tries fail."""
    draw = _train_plan().draw(20, 2000, torch.Generator().manual_seed(0))
    assert (draw.top, draw.left, draw.height, draw.width) == (0, (2000 - 27) // 2, 20, 27)


def test_scales_and_ratios_follow_torchvisions_distribution() -> None:
    """Per-sample generators (seed, epoch, index) against torchvision's one global stream."""
    plan, height, width = _train_plan(flip_p=None), 375, 500
    ours = [plan.draw(height, width, fused.generator_for(5, 0, index)) for index in range(4000)]
    tv_crop, image = v2.RandomResizedCrop(224), tv_tensors.Image(torch.zeros(3, height, width, dtype=torch.uint8))
    with torch.random.fork_rng():
        torch.manual_seed(1234)
        theirs = [tv_crop.make_params([image]) for _ in range(4000)]
    our_scale = np.array([d.height * d.width for d in ours]) / (height * width)
    their_scale = np.array([p["height"] * p["width"] for p in theirs]) / (height * width)
    our_ratio = np.log([d.width / d.height for d in ours])
    their_ratio = np.log([p["width"] / p["height"] for p in theirs])
    for quantile in (0.1, 0.25, 0.5, 0.75, 0.9):
        assert abs(np.quantile(our_scale, quantile) - np.quantile(their_scale, quantile)) < 0.03
        assert abs(np.quantile(our_ratio, quantile) - np.quantile(their_ratio, quantile)) < 0.03
    assert 0.08 <= our_scale.min() and our_scale.max() <= 1.0
    assert np.log(3 / 4) - 0.02 <= our_ratio.min() and our_ratio.max() <= np.log(4 / 3) + 0.02


def _draws(seed: int, epoch: int, count: int) -> list[tuple]:
    plan = _train_plan()
    return [tuple(vars(plan.draw(375, 500, fused.generator_for(seed, epoch, index))).values()) for index in range(count)]


def test_randomness_is_reproducible_from_seed_epoch_index_in_any_process() -> None:
    here = _draws(3, 1, 20)
    assert here == _draws(3, 1, 20)
    assert here != _draws(3, 2, 20) and here != _draws(4, 1, 20)
    assert len(set(here)) == 20  # per index, not one box for every sample
    code = ("import sys; sys.path[:0] = ['tests', '.']; from test_fused import _draws; print(repr(_draws(3, 1, 20)))")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert eval(child.stdout) == here  # a fresh interpreter (another worker) draws the same


# --- the draw replayed without torch ops (fastdata.reader.replay) -----------------------------


def _replay_case(plan: fused.FusedPlan, count: int, seed: int) -> tuple[list, list, int]:
    """(replayed draws, torch's draws on the same seeds, how many the replay left to torch)
    over ``count`` random (height, width, seed)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 2400, (count, 2)).tolist()
    seeds = [fused.seed_for(seed, 0, index) for index in range(count)]
    from fastdata.reader import replay

    ratio_bounds = fused._log_ratio(tuple(plan.ratio))
    replayed = [replay.random_resized_crop(h, w, plan.scale, plan.ratio, ratio_bounds, plan.flip_p, s)
                for (h, w), s in zip(sizes, seeds)]
    theirs = [plan.draw(h, w, torch.Generator().manual_seed(s)) for (h, w), s in zip(sizes, seeds)]
    ours = [plan.draw(h, w, seed=s) for (h, w), s in zip(sizes, seeds)]
    assert ours == theirs  # plan.draw(seed=) is exactly the torch draw, replayed or not
    left = sum(r is None for r in replayed)
    return [r for r in replayed if r is not None], [vars(t) for r, t in zip(replayed, theirs) if r is not None], left


def test_the_replayed_draw_is_torchs_draw_on_100000_sizes_and_seeds() -> None:
    replayed, theirs, left = _replay_case(_train_plan(), 100_000, seed=11)
    assert [dict(zip(("top", "left", "height", "width", "flip"), r)) for r in replayed] == theirs
    assert left < 200  # measured 52 in 100,000: a box on the edge of torch's exp ulp
    assert sum(r[4] for r in replayed) / len(replayed) == pytest.approx(0.5, abs=0.01)


@pytest.mark.parametrize("flip_p,crop", [(0.3, {}), (1.0, {"scale": (0.35, 1.0)}), (None, {"ratio": (0.2, 0.25)}),
                                         (0.0, {"scale": (0.9, 1.0), "ratio": (0.5, 2.0)}),
                                         (0.7, {"scale": (0.01, 0.02), "ratio": (1.0, 1.0)})])
def test_the_replayed_draw_is_torchs_for_other_plans(flip_p: float | None, crop: dict) -> None:
    replayed, theirs, left = _replay_case(_train_plan(flip_p=flip_p, **crop), 6_000, seed=12)
    assert [dict(zip(("top", "left", "height", "width", "flip"), r)) for r in replayed] == theirs
    assert left < 60


def test_a_draw_the_replay_is_unsure_of_goes_to_torch() -> None:
    """(height, width, seed) where the box's width rounds differently an ulp of torch's exp
    away: the replay gives None, plan.draw(seed=) torch's draw."""
    from fastdata.reader import replay

    plan, rng = _train_plan(), np.random.default_rng(11)
    ratio_bounds = fused._log_ratio(tuple(plan.ratio))
    for index, (height, width) in enumerate(rng.integers(1, 2400, (100_000, 2)).tolist()):
        seed = fused.seed_for(11, 0, index)
        if replay.random_resized_crop(height, width, plan.scale, plan.ratio, ratio_bounds, 0.5, seed) is None:
            break
    else:
        pytest.fail("no draw in 100,000 was left to torch")
    assert plan.draw(height, width, seed=seed) == plan.draw(height, width, torch.Generator().manual_seed(seed))


def test_the_replayed_draw_runs_no_torch_op() -> None:
    plan = _train_plan()
    plan.draw(375, 500, seed=1)  # the once-per-process check of torch's rounding runs torch ops
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        draws = [plan.draw(375, 500, seed=fused.seed_for(0, 0, index)) for index in range(50)]
    assert [event.name for event in profile.events()] == []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        assert [plan.draw(375, 500, fused.generator_for(0, 0, index)) for index in range(50)] == draws
    assert "aten::uniform_" in {event.name for event in profile.events()}  # the probe sees torch's draw


def test_the_uniform_rounding_rule_is_measured_against_torch() -> None:
    """One rounding (a fused multiply-add, torch's AVX2/AVX512 kernels) or two (its default
    kernel): the rule found reproduces torch, the other does not."""
    from fastdata.reader import replay

    rule = replay.uniform_rule()
    assert rule in (True, False)
    generator = torch.Generator().manual_seed(77)
    drawn = [torch.empty(1).uniform_(0.08, 1.0, generator=generator).item() for _ in range(300)]
    outputs = replay.outputs(77, 300)
    assert [replay._Uniform(0.08, 1.0, rule)(o) for o in outputs] == drawn
    assert [replay._Uniform(0.08, 1.0, not rule)(o) for o in outputs] != drawn


def test_the_generators_outputs_are_torchs() -> None:
    from fastdata.reader import replay

    for seed in (0, 1, 2**32 + 5, fused.seed_for(1, 2, 3)):
        for high in (2, 1000, 2**24 + 1):
            generator = torch.Generator().manual_seed(seed)
            expected = [int(torch.randint(0, high, (1,), generator=generator)) for _ in range(30)]
            assert [output % high for output in replay.outputs(seed, 30)] == expected


def _same_draws(plan: fused.FusedPlan, sizes: list, count: int = 300) -> list:
    """plan.draw(seed=) against torch's draw on the same seeds; the replay's results."""
    from fastdata.reader import replay

    replayed = []
    for index in range(count):
        (height, width), seed = sizes[index % len(sizes)], fused.seed_for(9, 0, index)
        assert plan.draw(height, width, seed=seed) == plan.draw(height, width, torch.Generator().manual_seed(seed))
        replayed.append(replay.random_resized_crop(height, width, tuple(plan.scale), tuple(plan.ratio),
                                                   fused._log_ratio(tuple(plan.ratio)), plan.flip_p, seed))
    return replayed


def test_under_a_float64_default_dtype_the_draw_is_torchs() -> None:
    """torchvision's torch.empty(1) then draws in float64 (two outputs a value): torch draws."""
    torch.set_default_dtype(torch.float64)
    try:
        assert set(_same_draws(_train_plan(), [(375, 500), (20, 2000)])) == {None}
        tv_crop, image = v2.RandomResizedCrop(224), tv_tensors.Image(torch.zeros(3, 375, 500, dtype=torch.uint8))
        with torch.random.fork_rng():
            torch.manual_seed(3)
            expected = tuple(tv_crop.make_params([image]).values())  # float64 log-ratio bounds too
        draw = _train_plan().draw(375, 500, torch.Generator().manual_seed(3))
        assert (draw.top, draw.left, draw.height, draw.width) == expected
    finally:
        torch.set_default_dtype(torch.float32)
    code = ("import torch; from fastdata.reader import fused; torch.set_default_dtype(torch.float64); "
            "fused.replay_agrees(); torch.set_default_dtype(torch.float32); print(list(fused._REPLAY_CHECK), "
            "fused.replay_agrees(), list(fused._REPLAY_CHECK))")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert child.stdout.split("\n")[0] == "[] True [True]"  # checked for real once float32 draws can be compared


def test_bounds_the_replay_does_not_model_are_drawn_by_torch() -> None:
    not_exact = fused.FusedPlan("random_resized_crop", (224, 224), scale=(1e-9, 1.0), flip_p=0.5)
    assert set(_same_draws(not_exact, [(375, 500), (20, 2000)])) == {None}  # x * span + low inexact in a double
    subnormal = fused.FusedPlan("random_resized_crop", (224, 224), ratio=(1e-45, 1.0), flip_p=0.5)
    _same_draws(subnormal, [(375, 500), (20, 2000)])  # exp near float32's end: torch's draw, no error
    infinite = fused.FusedPlan("random_resized_crop", (224, 224), ratio=(0.5, float("inf")), flip_p=0.5)
    for drawn in ({"generator": torch.Generator().manual_seed(1)}, {"seed": 1}):
        with pytest.raises(RuntimeError, match="to is out of bounds for float"):  # torch refuses log(inf), seeded too
            infinite.draw(375, 500, **drawn)


def test_odd_sizes_flips_and_plans_draw_as_torch() -> None:
    sizes = [(2**24 + 1, 10), (1, 1), (1, 3000), (7, 9)]
    assert _same_draws(_train_plan(), sizes, count=40)[0] is None  # a side over 2**24: torch draws
    for flip_p in (1e39, -1e39, float("nan")):
        _same_draws(fused.FusedPlan("random_resized_crop", (224, 224), flip_p=flip_p), [(375, 500)], count=40)
    listed = fused.FusedPlan("random_resized_crop", (224, 224), scale=[0.08, 1.0], ratio=[0.75, 4 / 3], flip_p=0.5)
    _same_draws(listed, [(375, 500)], count=40)


def test_the_replay_is_checked_against_torch_once_per_process() -> None:
    assert fused.replay_agrees() is True


def test_the_two_rounding_rule_is_torchs_default_kernel() -> None:
    """A child process on torch's default (not AVX2/AVX-512) kernels: uniform_ rounds twice, the
    replay finds it, and the seeded draws are still torch's."""
    code = ("import sys; sys.path[:0] = ['tests', '.']; import torch; from fastdata.reader import replay; "
            "from test_fused import _same_draws, _train_plan; "
            "print(torch.backends.cpu.get_cpu_capability(), replay.uniform_rule(), "
            "sum(r is not None for r in _same_draws(_train_plan(), [(375, 500), (20, 2000), (500, 333)], 2000)))")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    capability, rule, replayed = child.stdout.split()
    assert (capability, rule) == ("DEFAULT", "False")
    assert int(replayed) > 1900


def test_bounds_torch_refuses_are_refused_with_a_seed_too() -> None:
    """torchvision only warns about scale (max, min); torch's uniform_ then refuses the draw."""
    with pytest.warns(UserWarning, match="Scale and ratio should be of kind"):
        plan = _train_plan(scale=(1.0, 0.5))
    for drawn in ({"generator": torch.Generator().manual_seed(1)}, {"seed": 1}):
        with pytest.raises(RuntimeError, match="uniform_ expects to return a"):
            plan.draw(375, 500, **drawn)


def test_a_draw_takes_a_generator_or_a_seed_not_both() -> None:
    centre = fused.FusedPlan("resize_center_crop", (224, 224), resize=(256,))
    for plan in (_train_plan(), centre):
        with pytest.raises(InvalidOptionError, match="Give the draw a generator or a seed, not both."):
            plan.draw(375, 500, torch.Generator(), seed=1)


# --- the pixels ------------------------------------------------------------------------------


@pytest.mark.parametrize("decoder", ["simplejpeg", "pil"])
@pytest.mark.parametrize("name", ["imagenet", "portrait", "large", "odd"])
def test_fused_jpeg_is_close_to_decode_then_crop_on_the_same_box(images, name: str, decoder: str) -> None:
    if decoder == "simplejpeg":
        pytest.importorskip("simplejpeg")
    _, jpeg = images[name]
    plan = _train_plan()
    scales = set()
    for seed in range(12):
        out = fused.fused_decode(jpeg, plan, generator=torch.Generator().manual_seed(seed), decoder=decoder)
        reference = fused.fallback_decode(jpeg, plan, generator=torch.Generator().manual_seed(seed))
        assert out.shape == (3, 224, 224) and out.dtype == torch.uint8
        assert psnr(out, reference) >= MIN_PSNR_DB, (name, seed)
        draw = plan.draw(*images[name][0].shape[:2], torch.Generator().manual_seed(seed))
        scales.add(fused.dct_scale(draw.height, draw.width, 224, 224))
    if name in ("large", "odd"):
        assert scales & {2, 4}  # the DCT scaling really ran


@pytest.mark.parametrize("decoder", ["simplejpeg", "region", "pil"])
@pytest.mark.parametrize(("height", "width"), [(8, 8), (17, 33), (33, 17), (64, 48)])
def test_a_small_jpeg_the_crop_enlarges_keeps_the_floor(decoder: str, height: int, width: int) -> None:
    """Thumbnails (4:2:0, colour detail a couple of pixels apart) whose box the resize enlarges
    to 224x224: decoded exactly (no fast IDCT or chroma upsampling, whose errors the enlargement
    would keep: 23-27 dB before), they stay above the floor against Pillow on the same box."""
    if decoder == "simplejpeg":
        pytest.importorskip("simplejpeg")
    if decoder == "region" and fused.region.library() is None:
        pytest.skip("no libturbojpeg 3")
    jpeg = _encode(photo(height, width, seed=height * width, detail_px=2, edge_rows=1), "JPEG")
    plan = _train_plan()
    worst = min(psnr(fused.fused_decode(jpeg, plan, generator=torch.Generator().manual_seed(seed), decoder=decoder),
                     fused.fallback_decode(jpeg, plan, generator=torch.Generator().manual_seed(seed)))
                for seed in range(12))
    assert worst >= MIN_PSNR_DB


def test_the_scale_is_read_from_the_decoded_size() -> None:
    """Pillow's draft may decode a larger image than asked (2003 // ceil(2003 / 4) == 3: 1/2)."""
    assert fused.decoded_scale(1501, 2003, 751, 1002) == 2
    assert fused.decoded_scale(1501, 2003, 188, 251) == 8
    with pytest.raises(ValueError, match="a 2003x1501 JPEG decoded to 1000x750, not a DCT scale of it"):
        fused.decoded_scale(1501, 2003, 750, 1000)


@pytest.mark.parametrize("decoder", ["pil", "simplejpeg", "region"])
@pytest.mark.parametrize("name", ["imagenet", "large"])
def test_the_flip_mirrors_the_same_box(images, decoder: str, name: str) -> None:
    """A mirrored image is decoded as BGR and put back in RGB order by the mirroring copy: pixel
    for pixel the unmirrored image's mirror, at the DCT scales these draws reach (1, 2 and 4),
    in a batch row or alone."""
    if decoder == "simplejpeg":
        pytest.importorskip("simplejpeg")
    if decoder == "region" and fused.region.library() is None:
        pytest.skip("no libturbojpeg 3")
    _, jpeg = images[name]
    for seed in range(6):
        flipped = fused.fused_decode(jpeg, _train_plan(flip_p=1.0), generator=torch.Generator().manual_seed(seed),
                                     decoder=decoder)
        kept = fused.fused_decode(jpeg, _train_plan(flip_p=0.0), generator=torch.Generator().manual_seed(seed),
                                  decoder=decoder)
        assert torch.equal(flipped, kept.flip(-1)) and not torch.equal(flipped, kept), seed
        row = np.zeros((2, 224, 224, 3), np.uint8)
        fused.fused_pixels(jpeg, _train_plan(flip_p=1.0), generator=torch.Generator().manual_seed(seed),
                           decoder=decoder, out=row[1])
        assert np.array_equal(row[1], flipped.permute(1, 2, 0).numpy()) and not row[0].any()


@pytest.mark.parametrize("decoder", ["pil", "simplejpeg"])
def test_a_box_decoded_as_bgr_is_the_rgb_box_reversed(images, decoder: str) -> None:
    if decoder == "simplejpeg":
        pytest.importorskip("simplejpeg")
    _, jpeg = images["large"]
    height, width = fused.jpeg_size(jpeg)
    draw = _train_plan().draw(height, width, torch.Generator().manual_seed(4))
    for scale in fused.DCT_SCALES:
        rgb = fused.DECODERS[decoder].box(jpeg, draw, scale, height, width, "RGB")
        bgr = fused.DECODERS[decoder].box(jpeg, draw, scale, height, width, "BGR")
        assert bgr.shape == rgb.shape and np.array_equal(bgr, rgb[:, :, ::-1]), scale


def test_png_goes_through_the_fallback_pixel_exactly(images) -> None:
    pixels, png = images["png"]
    pipeline = v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip()])
    plan, rest = fused.split_transform(pipeline)
    assert rest is None
    for seed in range(8):
        out = fused.fused_decode(png, plan, generator=torch.Generator().manual_seed(seed))
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            expected = pipeline(tv_tensors.Image(torch.from_numpy(pixels.copy()).permute(2, 0, 1)))
        assert torch.equal(out, expected.as_subclass(torch.Tensor))


def test_resize_center_crop_png_is_exact_and_jpeg_close(images) -> None:
    pipeline = v2.Compose([v2.Resize(256), v2.CenterCrop(224)])
    plan, _ = fused.split_transform(pipeline)
    pixels, png = images["png"]
    expected = pipeline(tv_tensors.Image(torch.from_numpy(pixels.copy()).permute(2, 0, 1)))
    assert torch.equal(fused.fused_decode(png, plan), expected.as_subclass(torch.Tensor))
    pixels, jpeg = images["large"]
    out = fused.fused_decode(jpeg, plan, decoder="pil")
    assert out.shape == (3, 224, 224)
    assert psnr(out, fused.fallback_decode(jpeg, plan)) >= MIN_PSNR_DB


def test_grayscale_output_has_one_channel(images) -> None:
    out = fused.fused_decode(images["imagenet"][1], _train_plan(), generator=torch.Generator().manual_seed(0),
                             mode="L", decoder="pil")
    assert out.shape == (1, 224, 224)


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_fused_pixels_are_fused_decodes_as_hwc_written_into_the_row(images, mode: str) -> None:
    """What the readers call: the same pixels as :func:`fused_decode`, HWC, in ``out`` itself."""
    channels = 3 if mode == "RGB" else 1
    for data in (images["imagenet"][1], images["png"][1]):
        for decoder in sorted({"pil", fused.default_decoder()}):
            def seeded() -> dict:
                return {"generator": torch.Generator().manual_seed(5), "mode": mode, "decoder": decoder}

            expected = fused.fused_decode(data, _train_plan(), **seeded())
            row = np.zeros((224, 224, channels), np.uint8)
            pixels = fused.fused_pixels(data, _train_plan(), out=row, **seeded())
            assert pixels is row and np.array_equal(row, expected.permute(1, 2, 0).numpy()) and row.any()
            alone = fused.fused_pixels(data, _train_plan(), **seeded())
            assert alone.shape == (224, 224, channels) and alone.flags.c_contiguous and np.array_equal(alone, row)


def test_unknown_decoder_is_refused(images) -> None:
    with pytest.raises(InvalidOptionError, match=r"Unknown fused decoder 'nvjpeg'\. Allowed: 'simplejpeg', 'pil', 'region'\."):
        fused.fused_decode(images["imagenet"][1], _train_plan(), decoder="nvjpeg")


# --- reading the transforms ------------------------------------------------------------------


def test_split_reads_torchvisions_parameters_and_keeps_the_rest() -> None:
    normalize = v2.Normalize([0.5] * 3, [0.2] * 3)
    pipeline = v2.Compose([v2.RandomResizedCrop((200, 180), scale=(0.2, 0.9), ratio=(0.5, 2.0),
                                                interpolation=v2.InterpolationMode.BICUBIC, antialias=False),
                           v2.RandomHorizontalFlip(0.3), v2.ToDtype(torch.float32, scale=True), normalize])
    plan, rest = fused.split_transform(pipeline)
    assert plan == fused.FusedPlan("random_resized_crop", (200, 180), scale=(0.2, 0.9), ratio=(0.5, 2.0),
                                   interpolation="bicubic", antialias=False, flip_p=0.3)
    assert isinstance(rest, v2.Compose) and rest.transforms[1] is normalize and len(rest.transforms) == 2
    plan, rest = fused.split_transform(v1.Compose([v1.RandomResizedCrop(64), v1.Normalize([0.0], [1.0])]))
    assert (plan.size, plan.flip_p, type(rest)) == ((64, 64), None, v1.Normalize)
    plan, rest = fused.split_transform(v1.Compose([v1.Resize(256), v1.CenterCrop(224)]))
    assert (plan.kind, plan.resize, plan.size, rest) == ("resize_center_crop", (256,), (224, 224), None)
    assert fused.split_transform(v2.RandomResizedCrop(32))[0].size == (32, 32)


class _MyCrop(v2.RandomResizedCrop):
    pass


@pytest.mark.parametrize("transform,reason", [
    (None, "there is no transform"),
    (v1.Compose([]), "the Compose is empty"),
    (v2.Compose([v2.ToImage(), v2.RandomResizedCrop(224)]),
     "the pipeline starts with ToImage, not RandomResizedCrop (+ RandomHorizontalFlip) or Resize + CenterCrop"),
    (v2.Compose([v2.Resize(256), v2.ToDtype(torch.float32)]),
     "Resize is followed by ToDtype, not CenterCrop: only Resize + CenterCrop is fused"),
    (v2.Resize(256), "Resize is followed by nothing, not CenterCrop: only Resize + CenterCrop is fused"),
    (_MyCrop(224), "_MyCrop is a subclass of torchvision's RandomResizedCrop (it may override how it crops): not fused"),
    (v2.RandomResizedCrop(224, interpolation="box"), "RandomResizedCrop interpolation 'box' exists only for PIL images"),
])
def test_what_is_not_fused_says_why(transform, reason: str, caplog) -> None:
    with caplog.at_level(logging.DEBUG, logger="fastdata.reader.fused"):
        assert fused.split_transform(transform) is None
    assert fused.fusion_refusal(transform) == reason
    assert f"transform not fused: {reason}" in caplog.text


# --- what fastdata reads from torchvision, checked against torchvision itself -----------------
# fused.py uses public torchvision names only; these tests fail loudly if torchvision changes
# what those stand for (the Pillow integer constants of an interpolation, Resize's output size).


@pytest.mark.parametrize("interpolation", [0, 1, 2, 3, "nearest", "nearest-exact", "bicubic",
                                           v2.InterpolationMode.LANCZOS, v2.InterpolationMode.BILINEAR])
@pytest.mark.parametrize("version", [v1, v2])
def test_the_interpolation_read_is_the_one_torchvision_resizes_with(interpolation, version) -> None:
    step = version.RandomResizedCrop(16, interpolation=interpolation)
    plan, _ = fused.split_transform(step)
    image = torch.from_numpy(photo(40, 52)).permute(2, 0, 1).contiguous()
    ours = v2.functional.resize(image, [16, 16], interpolation=v2.InterpolationMode(plan.interpolation))
    theirs = v2.functional.resize(image, [16, 16], interpolation=step.interpolation)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("interpolation,shown", [(4, "'box'"), (5, "'hamming'"), (9, None), ("cubic", None)])
def test_an_interpolation_torchvision_resizes_only_for_pil_or_refuses_is_not_fused(interpolation, shown) -> None:
    step = v2.RandomResizedCrop(16, interpolation=interpolation)
    expected = (f"RandomResizedCrop interpolation {shown} exists only for PIL images" if shown else
                f"RandomResizedCrop has an interpolation torchvision refuses ({interpolation!r})")
    assert fused.fusion_refusal(step) == expected


@pytest.mark.parametrize("size,max_size", [(256, None), ((200, 300), None), (256, 300), (None, 300), (7, None)])
@pytest.mark.parametrize("height,width", [(375, 500), (500, 333), (40, 999), (480, 640)])
def test_the_resized_size_is_torchvisions_resize(size, max_size, height: int, width: int) -> None:
    plan, _ = fused.split_transform(v2.Compose([v2.Resize(size, max_size=max_size), v2.CenterCrop(2)]))
    resized = v2.Resize(size, max_size=max_size)(torch.zeros((1, height, width), dtype=torch.uint8))
    assert plan.resized_size(height, width) == tuple(resized.shape[-2:])
