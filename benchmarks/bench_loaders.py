"""fastdata.loader's backends (torch DataLoader, thread, process) side by side, on raw and
encoded data, against the machine's own ceilings and against torchdata.nodes and SPDL.

    python benchmarks/bench_loaders.py                 # everything (~10 min on 2 cores)
    python benchmarks/bench_loaders.py --only raw32,libraries

Workloads (seeded, generated once under benchmarks/data/):
  raw32    20,000 32x32 RGB images, raw npy, batch 256
  raw224   2,000 224x224 RGB images, raw npy, batch 64 (9.6 MB a batch)
  png32    the same 20,000 images as PNGs, encoded npy, batch 256
  jpeg     1,000 JPEGs of 350-450 px, encoded npy, read with resize=224, center_crop=224, batch 64
Every cell of a workload is timed in one run, epochs interleaved round-robin across cells
(fastdata.bench.timing.compare), persistent workers, steady state (warm-up epoch excluded);
worker start-up is measured apart. The decode ceilings are the same decode in N plain
processes (N = the usable cores), no loader. Rows go to benchmarks/out/bench_loaders.json.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import multiprocessing
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image

import fastdata
from fastdata.bench.measure import MemoryPeak
from fastdata.bench.report import best_rate, rates_table
from fastdata.bench.timing import Cell, compare, time_epoch
from fastdata.bench.demo import demo_folder
from fastdata.machine import machine_info, release_free_memory, usable_cores

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "loaders"


# --- workloads -------------------------------------------------------------------------------


def datasets() -> dict[str, Path]:
    small = demo_folder(DATA / "small-20000", small=20000, small_size=32, seed=0)
    large = demo_folder(DATA / "large-2000", small=0, large=2000, large_sides=(256, 512), seed=1)
    jpegs = demo_folder(DATA / "jpeg-1000", small=0, large=1000, large_sides=(350, 450), seed=2)
    made = {
        "raw32": (small, {"store": "raw"}), "png32": (small, {"store": "encoded"}),
        "raw224": (large, {"store": "raw", "resize": "224x224"}), "jpeg": (jpegs, {"store": "encoded"}),
    }
    paths = {}
    for name, (folder, options) in made.items():
        paths[name] = DATA / f"{name}.npy"
        fastdata.convert(folder, paths[name], resume=True, **options)  # kept when converted already
    return paths


def copying_loader(*args: Any, **kwargs: Any) -> Any:
    """A process loader that copies every batch out of its slot: what a loop that keeps every
    batch gets once the spare slots are lent (the default lends them)."""
    loader = fastdata.loader(*args, **kwargs)
    loader.lend_limit = 0
    return loader


def loader_cells(dataset: Any, batch: int, *, name: str = "", zero_copy: bool = True, **reader) -> list[Cell]:
    """nw=0, then every backend at 1..cores workers (persistent)."""
    cells = [Cell(f"{name}nw=0", 0, lambda: fastdata.loader(dataset, batch_size=batch, seed=0))]
    variants = [("torch", "", {}), ("thread", "", {}), ("process", "", {})]
    if zero_copy:  # the ways the process backend hands a raw batch over
        variants += [("process", " copies", {}), ("process", " zero_copy=2", {"zero_copy": 2})]
    for workers in range(1, usable_cores() + 1):
        for backend, suffix, extra in variants:
            make = copying_loader if suffix == " copies" else fastdata.loader
            cells.append(Cell(f"{name}{backend}{suffix}", workers, functools.partial(
                make, dataset, batch_size=batch, seed=0, num_workers=workers, backend=backend,
                persistent_workers=True, **extra)))
    return cells


def startup(cells: list[Cell]) -> dict[str, float]:
    """Seconds from a fresh loader to its first batch (worker start included), per cell."""
    found = {}
    for cell in cells:
        if cell.num_workers:
            loader = cell.make()
            start = time.perf_counter()
            iterator = iter(loader)
            next(iterator)
            found[f"{cell.reader} nw={cell.num_workers}"] = round(time.perf_counter() - start, 4)
            del iterator
            getattr(loader, "close", lambda: None)()
    return found


# --- decode ceilings: the same decode in N plain processes ----------------------------------------

_BLOBS: list[bytes] = []


def _decode_chunk(bounds: tuple[int, int], mode: str, size: int | None, fast: bool) -> int:
    from fastdata.reader.decoding import Decoder

    decoder = Decoder.make(mode, resize=size, center_crop=size, decoder="fast" if fast else "pil")
    for blob in _BLOBS[bounds[0] : bounds[1]]:
        decoder.decode(blob)
    return bounds[1] - bounds[0]


def _plain_decode_chunk(bounds: tuple[int, int], size: int | None) -> int:
    """What 'decoding with PIL' means with nothing of fastdata in between."""
    for blob in _BLOBS[bounds[0] : bounds[1]]:
        image = Image.open(io.BytesIO(blob)).convert("RGB")
        if size:
            width, height = image.size
            scale = size / min(width, height)
            image = image.resize((max(size, round(width * scale) if width > height else size),
                                  max(size, round(height * scale) if height > width else size)), Image.BILINEAR)
            left, top = round((image.width - size) / 2), round((image.height - size) / 2)
            image = image.crop((left, top, left + size, top + size))
        np.asarray(image)
    return bounds[1] - bounds[0]


def ceiling(path: Path, size: int | None, *, fast: bool = False, plain: bool = False, epochs: int = 3) -> float:
    """Images/s of decoding every sample of an encoded npy dataset in N plain processes."""
    global _BLOBS
    data, offsets = (path / "data.bin").read_bytes(), np.load(path / "offsets.npy")
    _BLOBS = [data[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
    cores = usable_cores()
    chunks = [(start, min(start + 64, len(_BLOBS))) for start in range(0, len(_BLOBS), 64)]
    job = functools.partial(_plain_decode_chunk, size=size) if plain else \
        functools.partial(_decode_chunk, mode="RGB", size=size, fast=fast)
    rates = []
    with multiprocessing.get_context("fork").Pool(cores) as pool:
        pool.map(job, chunks[:cores])  # start-up outside the timing
        for _ in range(epochs):
            start = time.perf_counter()
            done = sum(pool.imap_unordered(job, chunks))
            rates.append(done / (time.perf_counter() - start))
    return float(np.median(rates))


# --- workloads measured ------------------------------------------------------------------------


def raw(path: Path, batch: int, report: dict[str, Any], epochs: int = 3) -> list[dict[str, Any]]:
    ds = fastdata.MemmapDataset(path)
    cells = loader_cells(ds, batch)
    rows = compare(cells, epochs=epochs)
    report["startup_s"] = startup(cells)
    nw0 = best_rate(rows, "nw=0")
    report["ratios_to_nw0"] = {f"{r['reader']} nw={r['num_workers']}": round(r["samples_per_s"] / nw0, 3)
                               for r in rows if r["num_workers"]}
    torch_best = best_rate([r for r in rows if r["num_workers"]], "torch")
    report["process_best_over_dataloader_best"] = round(best_rate(rows, "process") / torch_best, 2)
    report["process_copies_best_over_dataloader_best"] = round(best_rate(rows, "process copies") / torch_best, 2)
    report["process_zero_copy_best_over_nw0"] = round(best_rate(rows, "process zero_copy=2") / nw0, 3)
    return rows


def encoded(path: Path, batch: int, report: dict[str, Any], *, size: int | None) -> list[dict[str, Any]]:
    reader = dict(resize=size, center_crop=size) if size else {}
    ds = fastdata.MemmapDataset(path, **reader)
    cells = loader_cells(ds, batch, zero_copy=False)
    if size:
        fast = fastdata.MemmapDataset(path, decoder="fast", **reader)
        cells += [c for c in loader_cells(fast, batch, name="fast-decoder ", zero_copy=False) if c.num_workers]
    rows = compare(cells, epochs=3)
    report["ceiling_pil_per_s"] = round(ceiling(path, size))
    report["plain_pil_per_s"] = round(ceiling(path, size, plain=True))
    pil_rows = [r for r in rows if not r["reader"].startswith("fast-decoder")]
    best = max(pil_rows, key=lambda r: r["samples_per_s"])
    report["best"] = f"{best['reader']} nw={best['num_workers']}: {best['samples_per_s']:,.0f}/s"
    report["best_over_ceiling"] = round(best["samples_per_s"] / report["ceiling_pil_per_s"], 3)
    if size:
        report["ceiling_fast_decoder_per_s"] = round(ceiling(path, size, fast=True))
        fast_best = max((r for r in rows if r["reader"].startswith("fast-decoder")), key=lambda r: r["samples_per_s"])
        report["fast_best"] = f"{fast_best['reader']} nw={fast_best['num_workers']}: {fast_best['samples_per_s']:,.0f}/s"
        report["fast_best_over_pil_ceiling"] = round(fast_best["samples_per_s"] / report["ceiling_pil_per_s"], 3)
        report["fast_vs_pil_pixels"] = pixel_difference(ds, fast)
        report["pil_path_equals_plain_pil"] = pil_equals_plain(path, ds, size)
    return rows


def pixel_difference(exact: Any, fast: Any, count: int = 200) -> dict[str, float]:
    differences = [np.abs(fast[i][0].numpy().astype(int) - exact[i][0].numpy().astype(int)) for i in range(count)]
    stacked = np.stack(differences).astype(float)
    mse = float((stacked**2).mean())
    return {"mean_abs": round(float(stacked.mean()), 3), "max_abs": int(stacked.max()),
            "psnr_db": round(10 * np.log10(255**2 / mse), 2) if mse else float("inf"), "images": count}


def pil_equals_plain(path: Path, ds: Any, size: int, count: int = 50) -> bool:
    global _BLOBS
    data, offsets = (path / "data.bin").read_bytes(), np.load(path / "offsets.npy")
    for i in range(count):
        image = Image.open(io.BytesIO(data[offsets[i] : offsets[i + 1]])).convert("RGB")
        from fastdata.images import Geometry

        expected = np.asarray(Geometry(resize=(size,), center_crop=(size, size)).apply(image))
        if not np.array_equal(ds[i][0].permute(1, 2, 0).numpy(), expected):
            return False
    return True


def memory_cell(path: Path, batch: int, backend: str, workers: int, seconds: float = 3.0) -> dict[str, float]:
    """Peak PSS of this process and its workers over ``seconds`` of epochs after a warm-up
    epoch, and the peak of the machine's shared memory above its level before the loader existed
    (batches in flight that PSS cannot see). Memory is sampled every 0.1 s and one sample takes
    ~30 ms, so a single epoch (15-200 ms here) would give one or two samples: a DataLoader's
    batches come and go between them, a fixed ring of slots does not. Run in a fresh process per
    cell (see :func:`memory`)."""
    ds = fastdata.MemmapDataset(path)
    release_free_memory()
    peak = MemoryPeak()  # its shared-memory baseline: before the loader made any
    loader = fastdata.loader(ds, batch_size=batch, seed=0, num_workers=workers, backend=backend,
                             persistent_workers=True)
    time_epoch(loader)
    epochs = 0
    with peak:
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            time_epoch(loader, on_first=peak.start_sampling)
            epochs += 1
    getattr(loader, "close", lambda: None)()
    return {"pss_mb": round(peak.peak_pss / 2**20, 1), "shm_mb": round(peak.peak_shm / 2**20, 1), "epochs": epochs,
            "samples": peak.samples}


def memory(path: Path, batch: int, report: dict[str, Any], repeats: int = 3) -> None:
    """Per backend and num_workers, the median over ``repeats`` of :func:`memory_cell`, each in a
    fresh Python process (a process that measured one loader carries its heap into the next:
    the order alone moved results by 2-3%), the order of the cells reversed every other round."""
    cells = [(backend, workers) for backend in ("torch", "process") for workers in range(1, usable_cores() + 1)]
    found: dict[str, list[dict[str, float]]] = {}
    for round_ in range(repeats):
        for backend, workers in cells if round_ % 2 == 0 else cells[::-1]:
            done = subprocess.run([sys.executable, __file__, "--memory-cell", f"{path},{batch},{backend},{workers}"],
                                  capture_output=True, text=True, check=True)
            found.setdefault(f"{backend} nw={workers}", []).append(json.loads(done.stdout.strip().splitlines()[-1]))
    for key in ("pss_mb", "shm_mb"):
        report[key] = {cell: statistics.median(run[key] for run in runs) for cell, runs in found.items()}
    report["pss_mb_runs"] = {cell: [run["pss_mb"] for run in runs] for cell, runs in found.items()}
    report["samples_per_cell"] = {cell: [run["samples"] for run in runs] for cell, runs in found.items()}


# --- the libraries looked at first ---------------------------------------------------------------


def library_cells(ds: Any, batch: int) -> list[Cell]:
    from fastdata.loading.samplers import BatchIndexSampler

    cells = [Cell("nw=0", 0, lambda: fastdata.loader(ds, batch_size=batch, seed=0))]

    def epochs():
        sampler = BatchIndexSampler(len(ds), batch, seed=0)
        return sampler

    try:
        import torchdata.nodes as nodes

        for method in ("thread", "process"):
            for workers in range(1, usable_cores() + 1):
                def make(method=method, workers=workers):
                    class Source:
                        def __iter__(self, sampler=epochs()):
                            return iter(list(sampler))
                    node = nodes.ParallelMapper(nodes.IterableWrapper(Source()), map_fn=ds.__getitem__,
                                                num_workers=workers, in_order=True, method=method)
                    return nodes.Loader(node)
                cells.append(Cell(f"torchdata ParallelMapper {method}", workers, make))
    except ImportError:
        print("torchdata not installed: pip install torchdata", file=sys.stderr)
    try:
        from spdl.pipeline import PipelineBuilder, SharedMemorySegmentPool, iterate_in_subprocess

        for workers in range(1, usable_cores() + 1):
            def thread_pipeline(workers=workers):
                sampler = epochs()

                class Epochs:
                    def __iter__(self):
                        pipeline = (PipelineBuilder().add_source(list(sampler))
                                    .pipe(ds.__getitem__, concurrency=workers, output_order="input")
                                    .add_sink(2 * workers).build(num_threads=workers))
                        with pipeline.auto_stop():
                            yield from pipeline
                return Epochs()

            def process_pool(workers=workers):
                nbytes = sum(t.numel() * t.element_size() for t in ds[np.arange(batch)]) + 65536
                sampler = epochs()
                orders = [list(sampler) for _ in range(50)]  # the epochs to come, known up front
                parts = [iterate_in_subprocess(functools.partial(_spdl_share, ds, orders, w, workers),
                                               arena=SharedMemorySegmentPool(nbytes, 4), mp_context="fork")
                         for w in range(workers)]

                class Epochs:
                    def __iter__(self):
                        iterators = [iter(part) for part in parts]
                        for number in range(len(orders[0])):
                            images, labels = next(iterators[number % workers])
                            yield torch.from_numpy(np.array(images)), torch.from_numpy(np.array(labels))
                        for iterator in iterators:
                            for _ in iterator:
                                pass
                return Epochs()
            cells.append(Cell("SPDL pipeline (threads)", workers, thread_pipeline))
            cells.append(Cell("SPDL iterate_in_subprocess + SharedMemorySegmentPool", workers, process_pool))
    except ImportError:
        print("spdl not installed: pip install spdl", file=sys.stderr)
    return cells


class _spdl_share:  # noqa: N801 - SPDL calls it to make the iterable, in its subprocess
    def __init__(self, ds, orders, worker, workers):
        self.ds, self.orders, self.worker, self.workers, self.epoch = ds, orders, worker, workers, 0

    def __iter__(self):
        order = self.orders[self.epoch]
        self.epoch += 1
        for indices in order[self.worker :: self.workers]:
            images, labels = self.ds[indices]
            yield images.numpy(), labels.numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="raw32,raw224,png32,jpeg,memory,libraries")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "bench_loaders.json")
    parser.add_argument("--raw32-epochs", type=int, default=20,
                        help="measured epochs of raw32 (an epoch takes ~10 ms there: few epochs are noise)")
    parser.add_argument("--memory-cell", help=argparse.SUPPRESS)  # PATH,BATCH,BACKEND,WORKERS: one memory cell
    args = parser.parse_args()
    if args.memory_cell:
        path, batch, backend, workers = args.memory_cell.split(",")
        print(json.dumps(memory_cell(Path(path), int(batch), backend, int(workers))))
        return
    parts = args.only.split(",")
    paths = datasets()
    results: dict[str, Any] = {"machine": machine_info(), "command": " ".join(sys.argv), "workloads": {}}
    print(f"machine: {results['machine']}", flush=True)
    jobs: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]] | None]] = {
        "raw32": lambda report: raw(paths["raw32"], 256, report, epochs=args.raw32_epochs),
        "raw224": lambda report: raw(paths["raw224"], 64, report),
        "png32": lambda report: encoded(paths["png32"], 256, report, size=None),
        "jpeg": lambda report: encoded(paths["jpeg"], 64, report, size=224),
        "memory": lambda report: memory(paths["raw224"], 64, report),
        "libraries": lambda report: compare(library_cells(fastdata.MemmapDataset(paths["raw32"]), 256), epochs=3),
    }
    for name in parts:
        report: dict[str, Any] = {}
        started = time.perf_counter()
        rows = jobs[name](report)
        report["seconds"] = round(time.perf_counter() - started, 1)
        results["workloads"][name] = {"report": report, "rows": rows}
        print(f"\n## {name} ({report['seconds']} s)\n", flush=True)
        if rows:
            print(rates_table(rows))
        print(json.dumps(report, indent=2), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
