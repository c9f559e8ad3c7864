"""The fused training-time decode (fastdata.reader.fused) against torchvision's standard training
pipeline, per decoder, on two generated sets: ImageNet-size and high-resolution JPEGs.

    python benchmarks/bench_fused.py [--count 2000] [--large-count 500] [--repeats 3] [--json rows.json]
    python benchmarks/bench_fused.py --loader --out /tmp/fused-bench [--count 2000] [--large-count 500]
        [--rounds 3] [--workers 0,1,2] [--batch-size 64] [--max-side 512] [--sets imagenet,large]
        [--step-ms 30] [--threads N] [--isolate] [--paired] [--only PATHS] [--json rows.json]
    python benchmarks/bench_fused.py --decode-only [--count 2000] [--large-count 500] [--repeats 5]
        [--libturbojpeg PATH] [--json rows.json]

Torch runs with its default intra-op threads (as a training script does) unless ``--threads``
says otherwise. ``--step-ms``: a busy training step after every batch, in the benchmark's own
process (a fixed count of float32 matmuls on torch's threads, calibrated once to take that long
on its own), so the loader competes for the cores as in training. CPU ms per image: this
process's CPU time plus that of its reaped children (worker processes that end with their
epoch), per sample.

Sets (seeded, generated in memory, JPEG quality 90, photo-like multi-scale noise):
``imagenet``: shorter side 300-500 px, aspect 3:4..4:3; ``large``: longer side 1500-2500 px.
Every path decodes the same bytes to a 224x224 uint8 CHW tensor on the same boxes and flips
(sample i draws from ``fastdata.reader.fused.generator_for(0, 0, i)``, the fused paths from its seed,
``seed_for(0, 0, i)``, as the readers: the same boxes; torchvision's pipeline gets the same state
through ``torch.manual_seed``). One process: median of ``repeats`` passes in rotating order after a warm-up, all in one run (ratios side by
side). PSNR: each path against decode-then-crop-then-resize on the same box (Pillow decode,
torch's antialiased bilinear), mean and minimum over the set.

Paths:
  torchvision   Image.open + convert("RGB"), v2.RandomResizedCrop(224) + v2.RandomHorizontalFlip
                on the PIL image, v2.PILToTensor (the standard ImageNet recipe)
  full+crop     simplejpeg full decode, crop the box, torch resize, flip (no DCT scaling)
  fused-simplejpeg / fused-pil   fastdata.reader.fused.fused_decode with that decoder
  fused-turbojpeg   PyTurboJPEG 1.x (if importable: not where the turbojpeg wheel, whose module has
                    the same name, is installed instead): lossless crop to the box's iMCU-aligned
                region, then a DCT-scaled decode of that region only, crop, resize, flip

``--decode-only``: the region decode micro benchmark: CPU ms per image (this process's CPU
time, median of ``repeats`` passes in rotating order) of the decode alone (to the box's pixels at
the DCT scale) and of the whole fused op (decode, crop, resize to 224, flip), on the same boxes:
  simplejpeg scale      simplejpeg at the DCT scale, whole image, then the box (what the fused
                        decode does)
  pil draft             Pillow's draft to the same scale, whole image, then the box
  tj3 scale             TurboJPEG 3 (tj3Decompress8) at the DCT scale, whole image, then the box
  tj3 scale+region      TurboJPEG 3 with tj3SetCroppingRegion: IDCT, upsampling and colour
                        conversion only inside the box (its left edge down to the iMCU), no
                        decode after its last row
TurboJPEG 3 through fastdata's own binding (:mod:`fastdata.reader.region`; the tj3 scale+region
row is the fused decode's ``"region"`` decoder): ``--libturbojpeg PATH``, else the libturbojpeg
that the ``turbojpeg`` wheel (``pip install "torch-fastdata[region]"``; not PyTurboJPEG) ships
in turbojpeg.libs/; without one the tj3 rows are skipped. The tj3 rows' box pixels are compared
with simplejpeg's (identical or not).

``--loader``: end to end, against torchvision's loader (and FFCV and DALI where importable), with
torch's default threads, the training step and ``--isolate`` as above: described in
benchmarks/fused_loaders.py, which holds it.
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

from fastdata.reader import fused, region

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
        region = pixels[draw.top:draw.top + draw.height, draw.left:draw.left + draw.width]
        return torch.from_numpy(fused._finish(region, plan, plan.size, draw.flip)).permute(2, 0, 1)  # HWC

    return run


def fused_path(plan: fused.FusedPlan, decoder: str):
    def run(data: bytes, index: int) -> torch.Tensor:
        return fused.fused_decode(data, plan, seed=fused.seed_for(0, 0, index), decoder=decoder)  # as the readers

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
        top, left, bottom, right = fused.scaled_region(local, scale, *pixels.shape[:2])
        return torch.from_numpy(fused._finish(pixels[top:bottom, left:right], plan, plan.size,
                                              draw.flip)).permute(2, 0, 1)

    return run


def decode_only_paths(plan: fused.FusedPlan, tj3: bool) -> dict:
    """name -> (data, index) -> (the box's pixels at the DCT scale, draw)."""
    import simplejpeg

    def box(height: int, width: int, index: int) -> tuple[fused.Draw, int]:
        draw = plan.draw(height, width, fused.generator_for(0, 0, index))
        return draw, fused.dct_scale(draw.height, draw.width, SIZE, SIZE)

    def cut(pixels: np.ndarray, draw: fused.Draw, height: int, width: int) -> np.ndarray:
        scale = fused.decoded_scale(height, width, *pixels.shape[:2])
        top, left, bottom, right = fused.scaled_region(draw, scale, *pixels.shape[:2])
        return pixels[top:bottom, left:right]

    def simplejpeg_scale(data: bytes, index: int):
        height, width = simplejpeg.decode_jpeg_header(data)[:2]
        draw, scale = box(height, width, index)
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, fastupsample=True,
                                        min_height=-(-height // scale), min_width=-(-width // scale))
        return cut(pixels, draw, height, width), draw

    def pil_draft(data: bytes, index: int):
        with Image.open(io.BytesIO(data)) as image:
            height, width = image.height, image.width
            draw, scale = box(height, width, index)
            image.draft("RGB", (-(-width // scale), -(-height // scale)))
            return cut(np.asarray(image.convert("RGB")), draw, height, width), draw

    def tj3_scale(data: bytes, index: int):
        height, width = region.header(data)
        draw, scale = box(height, width, index)
        whole = (0, 0, -(-height // scale), -(-width // scale))
        return cut(region.decode(data, scale, whole, "RGB"), draw, height, width), draw

    def tj3_region(data: bytes, index: int):
        height, width = region.header(data)
        draw, scale = box(height, width, index)
        return fused.DECODERS["region"].box(data, draw, scale, height, width, "RGB"), draw

    paths = {"simplejpeg scale": simplejpeg_scale, "pil draft": pil_draft}
    if tj3:
        paths.update({"tj3 scale": tj3_scale, "tj3 scale+region": tj3_region})
    return paths


def fused_op(decoder, plan: fused.FusedPlan):
    """The whole fused op on ``decoder``'s box pixels: resize to 224, flip."""
    def run(data: bytes, index: int) -> torch.Tensor:
        pixels, draw = decoder(data, index)
        return fused._finish(pixels, plan, plan.size, draw.flip)

    return run


def run_decode_only(args: argparse.Namespace) -> list[dict]:
    plan, _ = fused.split_transform(v2.Compose([v2.RandomResizedCrop(SIZE), v2.RandomHorizontalFlip()]))
    if args.libturbojpeg:
        os.environ[region.ENV] = args.libturbojpeg
    library = region.library()
    print(f"TurboJPEG 3: {library._name if library else 'none found (tj3 rows skipped)'}")
    decoders = decode_only_paths(plan, library is not None)
    paths = {f"{name} decode": decoder for name, decoder in decoders.items()}
    for name in ("simplejpeg scale", "tj3 scale+region"):
        if name in decoders:
            paths[f"{name} fused"] = fused_op(decoders[name], plan)
    rows = []
    for kind, count, seed in (("imagenet", args.count, 1), ("large", args.large_count, 2)):
        images = make_set(kind, count, seed)
        reference = [decoders["simplejpeg scale"](data, index)[0] for index, data in enumerate(images)]
        seconds = {name: [] for name in paths}
        names = list(paths)
        for repeat in range(args.repeats):
            for name in names[repeat % len(names):] + names[:repeat % len(names)]:
                start = time.process_time()
                for index, data in enumerate(images):
                    paths[name](data, index)
                seconds[name].append((time.process_time() - start) * 1000 / count)
        for name in names:
            decoder = decoders.get(name.rsplit(" ", 1)[0])
            identical = all(np.array_equal(decoder(data, index)[0], reference[index])
                            for index, data in enumerate(images)) if name.endswith("decode") else None
            rows.append({"set": kind, "count": count, "path": name, "cpu_count": os.cpu_count(),
                         "cpu_ms_per_image": statistics.median(seconds[name]), "box_pixels_identical": identical})
    return rows


def print_decode_only(rows: list[dict], args: argparse.Namespace) -> None:
    print(f"os.cpu_count() = {os.cpu_count()}, one process, CPU ms per image, median of {args.repeats}")
    print(f"{'set':9} {'path':28} {'CPU ms':>7} {'x simplejpeg':>13} {'box pixels = simplejpeg':>24}")
    base = {(row["set"], row["path"].rsplit(" ", 1)[1]): row["cpu_ms_per_image"] for row in rows
            if row["path"].startswith("simplejpeg scale")}
    for row in rows:
        ratio = row["cpu_ms_per_image"] / base[row["set"], row["path"].rsplit(" ", 1)[1]]
        same = "" if row["box_pixels_identical"] is None else str(row["box_pixels_identical"])
        print(f"{row['set']:9} {row['path']:28} {row['cpu_ms_per_image']:7.2f} {ratio:13.2f} {same:>24}")


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


def write_folder(images: list[bytes], root: str, classes: int = 10) -> None:
    for index, data in enumerate(images):
        folder = os.path.join(root, f"class{index % classes:02d}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{index:05d}.jpg"), "wb") as handle:
            handle.write(data)




def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000, help="images in the ImageNet-size set")
    parser.add_argument("--large-count", type=int, default=500, help="images in the high-resolution set")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--loader", action="store_true", help="whole epochs through the loaders (see above)")
    parser.add_argument("--decode-only", action="store_true", help="the region decode micro benchmark (see above)")
    parser.add_argument("--libturbojpeg", help="--decode-only: a libturbojpeg >= 3 to load (default: the one the "
                        "turbojpeg wheel ships)")
    parser.add_argument("--out", default="/tmp/fastdata-bench-fused", help="--loader: where the sets are written")
    parser.add_argument("--rounds", type=int, default=3, help="--loader: epochs per configuration")
    parser.add_argument("--workers", default="0,1,2", help="--loader: num_workers values")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-side", type=int, default=0, help="--loader: also read a --max-side N --reencode "
                        "jpeg:90 conversion")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch intra-op threads (default: torch's default, as a training script has it)")
    parser.add_argument("--sets", default="imagenet,large", help="--loader: which sets to read")
    parser.add_argument("--step-ms", type=float, default=0.0, help="--loader: a busy training step of this "
                        "length (calibrated once) after every batch, in this process")
    parser.add_argument("--isolate", action="store_true", help="--loader: every epoch in a new process that "
                        "loads only its own library (none of the others' threads, memory or libraries in it)")
    parser.add_argument("--paired", action="store_true", help="--loader: fastdata's backends at one setting run "
                        "back to back in each round (compared within seconds of each other)")
    parser.add_argument("--only", help="--loader: only these paths, comma-separated (e.g. fused,fused-max-side)")
    parser.add_argument("--one-epoch", help=argparse.SUPPRESS)  # --isolate's child: one configuration's epoch
    parser.add_argument("--paths", help=argparse.SUPPRESS)
    parser.add_argument("--step-count", type=int, default=0, help=argparse.SUPPRESS)  # the parent's calibration
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import epoch_timing
    import fused_loaders  # the loader comparison (benchmarks/fused_loaders.py): imports this module

    if args.step_ms:
        step, args.step_count = epoch_timing.training_step(args.step_ms, args.step_count)
        epoch_timing.STEP.append(step)
        if not args.one_epoch:
            print(f"training step: {args.step_count} matmuls of 384x384 float32 ({args.step_ms} ms here, alone)",
                  flush=True)
    if args.one_epoch:
        fused_loaders.one_epoch(args)
        return
    if args.decode_only:
        rows = run_decode_only(args)
        print_decode_only(rows, args)
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(rows, handle, indent=1)
        return
    if args.loader:
        print(f"load average at the start: {os.getloadavg()}", flush=True)
        print(f"fused decoder: {fused.default_decoder()}" + ("" if region.library() is not None else
              " (no region decode here: pip install 'torch-fastdata[region]' for the default users get)"), flush=True)
        rows = fused_loaders.run_loader(args)
        print(f"load average at the end: {os.getloadavg()}")
        fused_loaders.print_loader(rows, args)
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(rows, handle, indent=1)
        return
    plan, _ = fused.split_transform(v2.Compose([v2.RandomResizedCrop(SIZE), v2.RandomHorizontalFlip()]))
    paths = {"torchvision": torchvision_path(), "full+crop": full_crop_path(plan),
             "fused-simplejpeg": fused_path(plan, "simplejpeg"), "fused-pil": fused_path(plan, "pil")}
    try:
        paths["fused-turbojpeg"] = turbojpeg_path(plan)
    except (ImportError, RuntimeError, OSError, AttributeError) as exc:  # AttributeError: the other turbojpeg
        print(f"fused-turbojpeg skipped: {exc}")
    rows = []
    for kind, count, seed in (("imagenet", args.count, 1), ("large", args.large_count, 2)):
        images = make_set(kind, count, seed)
        results = measure(paths, images, args.repeats, plan)
        base = results["torchvision"]["samples_per_s"]
        for name, result in results.items():
            rows.append({"set": kind, "count": count, "path": name, "cpu_count": os.cpu_count(), "threads": args.threads,
                         **result, "ratio_vs_torchvision": result["samples_per_s"] / base})
    print(f"os.cpu_count() = {os.cpu_count()}, one process, torch threads {args.threads}, median of {args.repeats}")
    print(f"{'set':9} {'path':17} {'samples/s':>10} {'x tv':>6} {'PSNR mean':>10} {'PSNR min':>9}")
    for row in rows:
        print(f"{row['set']:9} {row['path']:17} {row['samples_per_s']:10.1f} {row['ratio_vs_torchvision']:6.2f} "
              f"{row['psnr_mean_db']:10.1f} {row['psnr_min_db']:9.1f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
