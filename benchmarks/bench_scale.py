"""One conversion, three engines: local (a process pool), Ray (tasks on a local Ray instance) and a
job array (``--part I/4`` as four concurrent processes, then ``fastdata merge``).

    python benchmarks/bench_scale.py [--count 20000] [--jpegs 1000] [--repeats 3] [--json rows.json]

Workloads (seeded, made by fastdata.bench.demo under benchmarks/data/, reused across runs):
  * ``count`` 32x32 PNGs in 10 classes, converted to npy ``raw`` and ``encoded``: local and Ray are
    timed in this process (median of ``repeats`` after one warm-up; Ray's start-up is reported
    apart); the four parts run at once, as real ``fastdata convert`` processes (their interpreter
    and torch start-up included, measured apart as ``cli_start_s``) and as forked processes (without
    it), each part in one process; the merge in this process.
  * ``jpegs`` ImageNet-like JPEGs (500x375, quality 90, textured to ~110 KB each, ImageNet's mean
    file size) in 10 classes: the per-sample cost on one core
    (``--workers 0``) of ``--store raw --resize 64 --center-crop 64x64``, of ``--store encoded``
    (original bytes, each decoded once to check it) and of ``--store encoded --resize 256
    --reencode jpeg:90``, and the merge's throughput on their encoded bytes, for the estimate in
    docs/scale-out.md.
Every row is printed as JSON; ``--json`` writes them all.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import fastdata
from fastdata.bench.demo import demo_folder
from fastdata.machine import machine_info, usable_cores
from fastdata.manifest import disk_usage

DATA = Path(__file__).resolve().parent / "data"
OUT = Path(__file__).resolve().parent / "out" / "scale"
PARTS = 4


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def fresh(path: Path) -> Path:
    for leftover in (path, path.with_name(path.name + ".partial.units")):
        shutil.rmtree(leftover, ignore_errors=True)
    return path


def median_time(function, repeats: int) -> tuple[float, list[float]]:
    function()  # warm-up: page cache, Ray workers, imports
    times = [timed(function) for _ in range(repeats)]
    return statistics.median(times), times


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "fastdata", *map(str, args)]


def run_parts(source: Path, out: Path, store: str) -> float:
    """The four parts as concurrent processes (one process each: no pool); the wall time of all four."""
    fresh(out)
    start = time.perf_counter()
    processes = [subprocess.Popen(cli("convert", source, out, "--format", "npy", "--store", store, "--workers", "1",
                                      "--quiet", "--part", f"{i}/{PARTS}"), stdout=subprocess.DEVNULL)
                 for i in range(1, PARTS + 1)]
    codes = [process.wait() for process in processes]
    if any(codes):
        raise SystemExit(f"a part failed: exit codes {codes}")
    return time.perf_counter() - start


def bench_local_and_ray(source: Path, count: int, repeats: int) -> list[dict]:
    rows = []
    for store in ("raw", "encoded"):
        out = OUT / f"npy-{store}"
        local_s, local_runs = median_time(lambda: fastdata.convert(source, fresh(out / "local"), format="npy",
                                                                   store=store), repeats)
        ray_s, ray_runs = median_time(lambda: fastdata.convert(source, fresh(out / "ray"), format="npy", store=store,
                                                               engine="ray"), repeats)
        base = {"workload": f"{count} png 32x32", "format": "npy", "store": store, "samples": count}
        rows += [{**base, "engine": "local", "wall_s": local_s, "runs_s": local_runs, "ratio_to_local": 1.0},
                 {**base, "engine": "ray", "wall_s": ray_s, "runs_s": ray_runs, "ratio_to_local": ray_s / local_s}]
    return rows


def _one_part(source: str, out: str, store: str, part: str) -> None:
    fastdata.convert(source, out, format="npy", store=store, workers=1, part=part)


def run_forked_parts(source: Path, out: Path, store: str) -> float:
    """The four parts as forked processes: the engine's cost without interpreter and torch start-up."""
    import multiprocessing

    fresh(out)
    context = multiprocessing.get_context("fork")
    start = time.perf_counter()
    processes = [context.Process(target=_one_part, args=(str(source), str(out), store, f"{i}/{PARTS}"))
                 for i in range(1, PARTS + 1)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    if any(process.exitcode for process in processes):
        raise SystemExit(f"a part failed: exit codes {[p.exitcode for p in processes]}")
    return time.perf_counter() - start


def bench_parts(source: Path, count: int, repeats: int, local: dict[str, float]) -> list[dict]:
    rows = []
    for store in ("raw", "encoded"):
        out = OUT / f"npy-{store}" / "parts"
        base = {"workload": f"{count} png 32x32", "format": "npy", "store": store, "samples": count}
        for how, run in (("fastdata convert processes", run_parts), ("forked processes", run_forked_parts)):
            part_runs, merge_runs = [], []
            for _ in range(repeats):
                part_runs.append(run(source, out, store))
                merge_runs.append(timed(lambda: fastdata.merge(out)))
            parts_s, merge_s = statistics.median(part_runs), statistics.median(merge_runs)
            rows.append({**base, "engine": f"parts 1..{PARTS}/{PARTS} ({how}) + merge", "wall_s": parts_s + merge_s,
                         "parts_s": parts_s, "merge_s": merge_s, "runs_s": part_runs,
                         "ratio_to_local": (parts_s + merge_s) / local[store]})
    return rows


def imagenet_like(root: Path, count: int) -> Path:
    """``count`` seeded 500x375 JPEGs of ~110 KB (a gradient plus noise), made once and reused."""
    import numpy as np
    from PIL import Image

    if (root / ".complete").exists():
        return root
    partial = fresh(root.with_name(root.name + ".tmp"))
    rng = np.random.default_rng(0)
    ys, xs = np.mgrid[0:375, 0:500]
    for i in range(count):
        slope = rng.uniform(0.1, 1.0, 2)
        base = np.stack([(xs * slope[0] + ys * slope[1] + 40 * c + i) % 256 for c in range(3)], axis=-1)
        pixels = np.clip(base + rng.normal(0, 26, base.shape), 0, 255).astype(np.uint8)
        folder = partial / f"class{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / f"{i:06d}.jpg", quality=90)
    (partial / ".complete").touch()
    fresh(root)
    partial.rename(root)
    return root


def bench_jpegs(source: Path, count: int) -> list[dict]:
    """Per-sample cost of ImageNet-sized JPEGs on one core, and the merge's throughput."""
    rows = []
    files = [p for p in source.rglob("*.jpg")]
    mean_bytes = sum(p.stat().st_size for p in files) / len(files)
    for store, extra in (("raw", {"resize": 64, "center_crop": "64x64"}), ("encoded", {}),
                         ("encoded", {"resize": 256, "reencode": "jpeg:90"})):
        out = fresh(OUT / f"jpeg-{store}-{len(extra)}")
        wall = timed(lambda: fastdata.convert(source, out, format="npy", store=store, workers=0, **extra))
        rows.append({"workload": f"{count} jpeg 500x375", "store": store, "options": extra, "engine": "local, 1 core",
                     "wall_s": wall, "per_sample_ms": 1000 * wall / count, "mean_jpeg_bytes": mean_bytes})
    parts = fresh(OUT / "jpeg-parts")
    for i in range(1, PARTS + 1):
        fastdata.convert(source, parts, format="npy", store="encoded", part=f"{i}/{PARTS}", workers=0)
    merge = timed(lambda: fastdata.merge(parts))
    size = disk_usage(parts)
    rows.append({"workload": f"{count} jpeg 500x375", "store": "encoded", "engine": "merge only", "wall_s": merge,
                 "bytes": size, "merge_mb_per_s": size / merge / 1e6})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--jpegs", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import ray

    info = {**machine_info(), "os_cpu_count": os.cpu_count(), "ray": ray.__version__}
    print(json.dumps(info))
    pngs = demo_folder(DATA / f"scale-png-{args.count}", small=args.count, large=0)
    jpegs = imagenet_like(DATA / f"scale-jpeg-{args.jpegs}", args.jpegs)
    rows = [{"engine": "fastdata CLI start-up (--version)", "cli_start_s": timed(lambda: subprocess.run(
        cli("--version"), check=True, stdout=subprocess.DEVNULL))}]
    from fastdata.sources import FolderSource

    scan = timed(lambda: FolderSource(pngs).fingerprint())  # what every part and the driver do first
    rows.append({"engine": "folder scan + fingerprint", "samples": args.count, "wall_s": scan,
                 "per_file_us": 1e6 * scan / args.count})
    started = time.perf_counter()
    ray.init(num_cpus=usable_cores(), include_dashboard=False, log_to_driver=False)
    rows.append({"engine": "ray.init (local instance)", "wall_s": time.perf_counter() - started})
    try:
        engines = bench_local_and_ray(pngs, args.count, args.repeats)
    finally:
        ray.shutdown()
    rows += engines
    rows += bench_parts(pngs, args.count, args.repeats, {r["store"]: r["wall_s"] for r in engines if r["engine"] == "local"})
    rows += bench_jpegs(jpegs, args.jpegs)
    for row in rows:
        print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
