"""HDF5 read throughput next to npy, the folder baseline and a hand-written per-sample h5py Dataset.

Grid: variant x num_workers (0, 1, 2); each cell is full epochs of a shuffled ``batch_size``
DataLoader over the same demo workload (20k 32x32 PNGs by default), with a fresh dataset
object per epoch (no reader cache carried over), one warm-up epoch, then the median of
``--repeats`` epochs (more, up to 20, for cells faster than 1 s). Timed epochs are interleaved
round-robin across all cells, so load from other processes does not land on one variant.
Rows go to JSON; the markdown table is rendered from them.

    python benchmarks/bench_hdf5.py            # full run: ~1.5 min on 2 shared cores, +1 min to make the data once
    python benchmarks/bench_hdf5.py --count 2000 --repeats 1   # quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import fastdata
from fastdata.bench.timing import Cell, compare
from fastdata.bench.demo import demo_folder
from fastdata.formats.hdf5 import HDF5Dataset
from fastdata.images import decode
from fastdata.loading.samplers import ChunkShuffleSampler

HERE = Path(__file__).resolve().parent


class PerSampleH5Dataset(Dataset):
    """What users write by hand: open lazily, then one ``h5py`` read per sample."""

    def __init__(self, path: Path):
        self.path = path
        with h5py.File(path, "r") as file:
            self.labels = file["labels"][()]
        self.file = None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        image = torch.from_numpy(self.file["images"][index]).permute(2, 0, 1)
        return image, int(self.labels[index])


def prepare(data: Path, count: int, size: int) -> dict[str, Path]:
    """The demo folder and every converted variant (reused when already there)."""
    folder = demo_folder(data / f"demo-{count}-{size}", small=count, small_size=size)
    outputs = {
        "npy-raw": ({"format": "npy"}, "npy-raw.npy"),
        "hdf5-raw": ({"format": "hdf5"}, "raw.h5"),
        "hdf5-gzip": ({"format": "hdf5", "compression": "gzip"}, "gzip.h5"),
        "hdf5-lzf": ({"format": "hdf5", "compression": "lzf"}, "lzf.h5"),
        "hdf5-encoded": ({"format": "hdf5", "store": "encoded"}, "encoded.h5"),
    }
    paths = {"folder": folder}
    for name, (options, filename) in outputs.items():
        out = data / f"conv-{count}-{size}" / filename
        fastdata.convert(folder, out, resume=True, **options)  # kept when already converted
        paths[name] = out
    return paths


def variants(paths: dict[str, Path], batch_size: int) -> dict[str, tuple[Callable, Callable, list[int]]]:
    """name -> (make a fresh dataset, make a loader for it and num_workers, the num_workers to run)."""
    def batched(ds, nw):
        return fastdata.loader(ds, batch_size=batch_size, shuffle=True, num_workers=nw, seed=0)

    def chunk_shuffled(ds, nw):
        sampler = ChunkShuffleSampler(ds, window_chunks=4, batch_size=batch_size, seed=0)
        return DataLoader(ds, batch_size=None, sampler=sampler, num_workers=nw)

    def per_sample(ds, nw):
        return DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=nw)

    all_workers = [0, 1, 2]
    return {
        "folder": (lambda: fastdata.FolderDataset(paths["folder"]), batched, all_workers),
        "npy raw": (lambda: fastdata.MemmapDataset(paths["npy-raw"]), batched, all_workers),
        "hdf5 raw (contiguous, memmap)": (lambda: HDF5Dataset(paths["hdf5-raw"]), batched, all_workers),
        "hdf5 raw (contiguous, use_memmap=False: h5py reads)": (
            lambda: HDF5Dataset(paths["hdf5-raw"], use_memmap=False), batched, all_workers
        ),
        "hdf5 raw gzip + ChunkShuffleSampler": (lambda: HDF5Dataset(paths["hdf5-gzip"]), chunk_shuffled, all_workers),
        "hdf5 raw lzf + ChunkShuffleSampler": (lambda: HDF5Dataset(paths["hdf5-lzf"]), chunk_shuffled, all_workers),
        "hdf5 raw gzip, plain shuffle": (lambda: HDF5Dataset(paths["hdf5-gzip"]), batched, [0]),
        "hdf5 raw lzf, plain shuffle": (lambda: HDF5Dataset(paths["hdf5-lzf"]), batched, [0]),
        "hdf5 encoded (PNG)": (lambda: HDF5Dataset(paths["hdf5-encoded"]), batched, all_workers),
        "per-sample h5py Dataset (hand-written)": (
            lambda: PerSampleH5Dataset(paths["hdf5-raw"]), per_sample, all_workers
        ),
    }


def encoded_layouts(paths: dict[str, Path], batch_size: int) -> list[dict[str, Any]]:
    """blob+offsets (kept) vs one variable-length uint8 dataset: bytes only and bytes + decode."""
    vlen_path = paths["hdf5-encoded"].with_name("encoded-vlen.h5")
    with h5py.File(paths["hdf5-encoded"], "r") as file:
        blob, offsets, mode = file["blob"][()], file["offsets"][()], "RGB"
    if not vlen_path.exists():
        with h5py.File(vlen_path, "w") as file:
            column = file.create_dataset("images", (len(offsets) - 1,), dtype=h5py.vlen_dtype(np.uint8))
            for i in range(len(offsets) - 1):
                column[i] = blob[offsets[i] : offsets[i + 1]]
    order = np.random.default_rng(0).permutation(len(offsets) - 1)
    batches = [np.sort(order[i : i + batch_size]) for i in range(0, len(order), batch_size)]
    rows = []
    for layout in ("blob+offsets", "vlen"):
        for with_decode in (False, True):
            ds = HDF5Dataset(paths["hdf5-encoded"])
            start = time.perf_counter()
            if layout == "vlen":
                with h5py.File(vlen_path, "r") as file:
                    column = file["images"]
                    for batch in batches:
                        blobs = column[batch]
                        if with_decode:
                            [decode(b.tobytes(), mode) for b in blobs]
            else:
                data_map, starts = ds.handles.data, ds.offsets
                for batch in batches:
                    blobs = [data_map[starts[i] : starts[i + 1]] for i in batch.tolist()]
                    if with_decode:
                        [decode(b.tobytes(), mode) for b in blobs]
            seconds = time.perf_counter() - start
            rows.append({"layout": layout, "decode": with_decode, "num_workers": 0,
                         "samples_per_s": round(len(order) / seconds, 1)})
    return rows


def render(rows: list[dict[str, Any]], layouts: list[dict[str, Any]], info: dict[str, Any]) -> str:
    names = list(dict.fromkeys(r["reader"] for r in rows))
    cell = {(r["reader"], r["num_workers"]): r["samples_per_s"] for r in rows}
    best = {n: max((v, w) for (m, w), v in cell.items() if m == n) for n in names}
    npy_best = best["npy raw"][0]
    hand_best = best["per-sample h5py Dataset (hand-written)"][0]
    lines = [
        f"{info['samples']:,} images {info['size']}x{info['size']} PNG, batch {info['batch_size']}, shuffled, "
        f"os.cpu_count()={info['cpu_count']}, load average before run {info['loadavg']}",
        "",
        "| variant | nw=0 | nw=1 | nw=2 | best (nw) | x npy best | x hand-written h5py best |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        values = [f"{cell[(name, w)]:,.0f}" if (name, w) in cell else "-" for w in (0, 1, 2)]
        value, workers = best[name]
        lines.append(f"| {name} | {' | '.join(values)} | {value:,.0f} ({workers}) | "
                     f"{value / npy_best:.2f} | {value / hand_best:.1f} |")
    lines += ["", "Encoded layouts (num_workers=0, samples/s):", "",
              "| layout | bytes only | bytes + PNG decode |", "|---|---:|---:|"]
    for layout in dict.fromkeys(r["layout"] for r in layouts):
        got = {r["decode"]: r["samples_per_s"] for r in layouts if r["layout"] == layout}
        lines.append(f"| {layout} | {got[False]:,.0f} | {got[True]:,.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", type=Path, default=HERE / "data")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "bench_hdf5.json")
    parser.add_argument("--only", help="comma-separated substrings of variant names to run")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    paths = prepare(args.data, args.count, args.size)
    info = {"samples": args.count, "size": args.size, "batch_size": args.batch_size, "cpu_count": os.cpu_count(),
            "loadavg": " ".join(f"{v:.2f}" for v in os.getloadavg()), "python": platform.python_version(),
            "torch": torch.__version__, "h5py": h5py.__version__, "command": " ".join(sys.argv)}
    cells = [
        # a fresh dataset per epoch: no reader cache carries over from one epoch to the next
        Cell(name, num_workers, lambda make_dataset=make_dataset, make_loader=make_loader, nw=num_workers:
             make_loader(make_dataset(), nw), fresh=True, extra={"batch_size": args.batch_size})
        for name, (make_dataset, make_loader, workers) in variants(paths, args.batch_size).items()
        if not args.only or any(part in name for part in args.only.split(","))
        for num_workers in workers
    ]
    rows = compare(cells, epochs=args.repeats)
    layouts = encoded_layouts(paths, args.batch_size)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"info": info, "rows": rows, "encoded_layouts": layouts}, indent=2))
    if not args.only:
        print(render(rows, layouts, info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
