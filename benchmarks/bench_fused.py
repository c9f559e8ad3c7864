"""The fused training-time decode (fastdata.fused) against torchvision's standard training
pipeline, per decoder, on the two generated sets of issue #22's Targets.

    python benchmarks/bench_fused.py [--count 2000] [--large-count 500] [--repeats 3] [--json rows.json]

Sets (seeded, generated in memory, JPEG quality 90, photo-like multi-scale noise):
``imagenet``: shorter side 300-500 px, aspect 3:4..4:3; ``large``: longer side 1500-2500 px.
Every path decodes the same bytes to a 224x224 uint8 CHW tensor on the same boxes and flips
(sample i draws from ``fastdata.fused.generator_for(0, 0, i)``; torchvision's pipeline gets the
same state through ``torch.manual_seed``). One process, one thread: per-core throughput,
median of ``repeats`` passes in rotating order after a warm-up, all in one run (ratios side by
side). PSNR: each path against decode-then-crop-then-resize on the same box (Pillow decode,
torch's antialiased bilinear), mean and minimum over the set.

Paths:
  torchvision   Image.open + convert("RGB"), v2.RandomResizedCrop(224) + v2.RandomHorizontalFlip
                on the PIL image, v2.PILToTensor (the standard ImageNet recipe)
  full+crop     simplejpeg full decode, crop the box, torch resize, flip (no DCT scaling)
  fused-simplejpeg / fused-pil   fastdata.fused.fused_decode with that decoder
  fused-turbojpeg   PyTurboJPEG 1.x (if importable): lossless crop to the box's iMCU-aligned
                region, then a DCT-scaled decode of that region only, crop, resize, flip
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import time

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import v2

from fastdata import fused

SIZE = 224


def photo(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """Multi-scale (roughly 1/f) colour noise: detail at every scale, like a photo."""
    total = np.zeros((height, width, 3), np.float32)
    for cells, weight in ((4, 1.0), (16, 0.5), (64, 0.25), (256, 0.12)):
        small = rng.random((max(height * cells // max(height, width), 2), max(width * cells // max(height, width), 2), 3))
        layer = Image.fromarray((small * 255).astype(np.uint8)).resize((width, height), Image.BICUBIC)
        total += weight * np.asarray(layer, np.float32)
    total = (total - total.min()) / (total.max() - total.min() + 1e-6) * 255
    return total.astype(np.uint8)


def make_set(kind: str, count: int, seed: int) -> list[bytes]:
    rng, out = np.random.default_rng(seed), []
    for _ in range(count):
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        if kind == "imagenet":
            short = int(rng.integers(300, 501))
            height, width = (short, int(short * aspect)) if aspect >= 1 else (int(short / aspect), short)
        else:
            long = int(rng.integers(1500, 2501))
            height, width = (int(long / aspect), long) if aspect >= 1 else (long, int(long * aspect))
        buffer = io.BytesIO()
        Image.fromarray(photo(height, width, rng)).save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def torchvision_path():
    pipeline = v2.Compose([v2.RandomResizedCrop(SIZE), v2.RandomHorizontalFlip(), v2.PILToTensor()])

    def run(data: bytes, index: int) -> torch.Tensor:
        torch.manual_seed(fused.generator_for(0, 0, index).initial_seed())
        return pipeline(Image.open(io.BytesIO(data)).convert("RGB")).as_subclass(torch.Tensor)

    return run


def full_crop_path(plan: fused.FusedPlan):
    import simplejpeg

    def run(data: bytes, index: int) -> torch.Tensor:
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, fastupsample=True)
        draw = plan.draw(*pixels.shape[:2], fused.generator_for(0, 0, index))
        region = torch.from_numpy(pixels[draw.top:draw.top + draw.height, draw.left:draw.left + draw.width])
        return fused._finish(region.permute(2, 0, 1).contiguous(), plan, plan.size, draw.flip)

    return run


def fused_path(plan: fused.FusedPlan, decoder: str):
    def run(data: bytes, index: int) -> torch.Tensor:
        return fused.fused_decode(data, plan, generator=fused.generator_for(0, 0, index), decoder=decoder)

    return run


def turbojpeg_path(plan: fused.FusedPlan):
    import turbojpeg

    jpeg = turbojpeg.TurboJPEG()

    def run(data: bytes, index: int) -> torch.Tensor:
        width, height, subsample, _ = jpeg.decode_header(data)
        draw = plan.draw(height, width, fused.generator_for(0, 0, index))
        mcu_w, mcu_h = turbojpeg.tjMCUWidth[subsample], turbojpeg.tjMCUHeight[subsample]
        x, y = draw.left - draw.left % mcu_w, draw.top - draw.top % mcu_h
        cropped = jpeg.crop(data, x, y, draw.left + draw.width - x, draw.top + draw.height - y)
        scale = fused.dct_scale(draw.height, draw.width, SIZE, SIZE)
        pixels = jpeg.decode(cropped, pixel_format=turbojpeg.TJPF_RGB, scaling_factor=(1, scale),
                             flags=turbojpeg.TJFLAG_FASTDCT | turbojpeg.TJFLAG_FASTUPSAMPLE)
        local = fused.Draw(draw.top - y, draw.left - x, draw.height, draw.width, draw.flip)
        top, left, bottom, right = fused._scaled_region(local, scale, *pixels.shape[:2])
        region = torch.from_numpy(np.ascontiguousarray(pixels[top:bottom, left:right])).permute(2, 0, 1)
        return fused._finish(region, plan, plan.size, draw.flip)

    return run


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = ((a.double() - b.double()) ** 2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def measure(paths: dict, images: list[bytes], repeats: int, plan: fused.FusedPlan) -> dict[str, dict]:
    for run in paths.values():  # warm-up, and the pixel check on the same boxes
        for index in range(min(8, len(images))):
            run(images[index], index)
    quality = {}
    for name, run in paths.items():
        values = [psnr(run(data, index), fused.fallback_decode(data, plan, generator=fused.generator_for(0, 0, index)))
                  for index, data in enumerate(images[:100])]
        quality[name] = (statistics.fmean(min(v, 99.0) for v in values), min(values))
    seconds = {name: [] for name in paths}
    names = list(paths)
    for repeat in range(repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            start = time.perf_counter()
            for index, data in enumerate(images):
                paths[name](data, index)
            seconds[name].append(time.perf_counter() - start)
    return {name: {"samples_per_s": len(images) / statistics.median(seconds[name]),
                   "psnr_mean_db": quality[name][0], "psnr_min_db": quality[name][1]} for name in paths}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000, help="images in the ImageNet-size set")
    parser.add_argument("--large-count", type=int, default=500, help="images in the high-resolution set")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    plan, _ = fused.split_transform(v2.Compose([v2.RandomResizedCrop(SIZE), v2.RandomHorizontalFlip()]))
    paths = {"torchvision": torchvision_path(), "full+crop": full_crop_path(plan),
             "fused-simplejpeg": fused_path(plan, "simplejpeg"), "fused-pil": fused_path(plan, "pil")}
    try:
        paths["fused-turbojpeg"] = turbojpeg_path(plan)
    except (ImportError, RuntimeError, OSError) as exc:
        print(f"fused-turbojpeg skipped: {exc}")
    rows = []
    for kind, count, seed in (("imagenet", args.count, 1), ("large", args.large_count, 2)):
        images = make_set(kind, count, seed)
        results = measure(paths, images, args.repeats, plan)
        base = results["torchvision"]["samples_per_s"]
        for name, result in results.items():
            rows.append({"set": kind, "count": count, "path": name, "cpu_count": os.cpu_count(), "threads": 1,
                         **result, "ratio_vs_torchvision": result["samples_per_s"] / base})
    print(f"os.cpu_count() = {os.cpu_count()}, one process, torch threads 1, median of {args.repeats}")
    print(f"{'set':9} {'path':17} {'samples/s':>10} {'x tv':>6} {'PSNR mean':>10} {'PSNR min':>9}")
    for row in rows:
        print(f"{row['set']:9} {row['path']:17} {row['samples_per_s']:10.1f} {row['ratio_vs_torchvision']:6.2f} "
              f"{row['psnr_mean_db']:10.1f} {row['psnr_min_db']:9.1f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
