"""The npy reader against the numpy ceiling, torchvision ImageFolder and hand-written Datasets.

    python benchmarks/bench_npy.py [--count 20000] [--workers 0,1,2]

Workload: ``count`` seeded 32x32 PNGs (fastdata.bench.demo), batch 256, shuffle, full epochs
(1 warm-up + median of 3). All rows are measured in one run, so ratios are side by side.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

import fastdata
from fastdata.bench.report import best_rate, rates_table
from fastdata.bench.timing import Cell, compare
from fastdata.bench.demo import demo_folder
from fastdata.machine import machine_info

DATA = Path(__file__).resolve().parent / "data"

BATCH = 256


class NumpyGather(Dataset):
    """The ceiling through DataLoader: a batch of indices -> one fancy-indexed read."""

    def __init__(self, path):
        self.images = np.load(path / "images.npy", mmap_mode="r")
        self.labels = np.load(path / "labels.npy")

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, indices):
        indices = np.sort(np.asarray(indices))
        return torch.from_numpy(self.images[indices]), torch.from_numpy(self.labels[indices])


class PerSampleMemmap(Dataset):
    """What users write by hand: one memmap row per __getitem__, default collate."""

    def __init__(self, path):
        self.path = path
        self.images = None
        self.labels = np.load(path / "labels.npy")

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        if self.images is None:
            self.images = np.load(self.path / "images.npy", mmap_mode="r")
        return torch.from_numpy(np.array(self.images[index])).permute(2, 0, 1), int(self.labels[index])


def plain_ceiling(path):
    """The same batches from a plain numpy loop: no Dataset, no DataLoader (the ceiling)."""
    images = np.load(path / "images.npy", mmap_mode="r")
    labels = np.load(path / "labels.npy")

    def batches():
        order = np.random.permutation(len(labels))
        for start in range(0, len(order), BATCH):
            idx = np.sort(order[start : start + BATCH])
            yield torch.from_numpy(images[idx]), torch.from_numpy(labels[idx])

    return batches


def conversion_ratio(folder, workers: int) -> tuple[float, float]:
    """(fastdata convert samples/s, PIL decode-only samples/s) on ``workers`` processes."""
    from fastdata.sources import scan_folder

    start = time.perf_counter()  # listing the folder is part of both jobs
    keys, _, _ = scan_folder(folder)
    paths = [str(folder / k) for k in keys]
    with multiprocessing.get_context().Pool(workers) as pool:
        for _ in pool.imap_unordered(_decode, paths, chunksize=256):
            pass
    decode_rate = len(paths) / (time.perf_counter() - start)
    out = folder.parent / "conversion-check.npy"
    start = time.perf_counter()
    fastdata.convert(folder, out, format="npy", workers=workers, overwrite=True)
    convert_rate = len(paths) / (time.perf_counter() - start)
    return convert_rate, decode_rate


def _decode(path):
    from PIL import Image

    with Image.open(path) as image:
        return image.convert("RGB").size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--workers", default="0,1,2")
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    folder = demo_folder(DATA / f"folder-{args.count}-32px-0jpg", small=args.count, small_size=32, seed=0)
    npy = DATA / f"{folder.name}-raw.npy"
    fastdata.convert(folder, npy, format="npy", store="raw", resume=True)  # kept when already converted
    print(f"machine: {machine_info()}; workload: {args.count} x 32x32 PNG, batch {BATCH}, shuffle")

    from torchvision.datasets import ImageFolder
    from torchvision.transforms.v2.functional import pil_to_tensor

    ds = fastdata.MemmapDataset(npy)
    readers = {
        "fastdata.loader(MemmapDataset) [fast path]": lambda nw: fastdata.loader(ds, batch_size=BATCH, num_workers=nw),
        "DataLoader(MemmapDataset, 256) [standard]": lambda nw: DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=nw),
        "DataLoader(hand-written per-sample memmap)": lambda nw: DataLoader(PerSampleMemmap(npy), batch_size=BATCH, shuffle=True, num_workers=nw),
        "numpy gather via DataLoader(BatchSampler)": lambda nw: DataLoader(
            NumpyGather(npy), batch_size=None, num_workers=nw,
            sampler=BatchSampler(RandomSampler(range(args.count)), BATCH, drop_last=False)),
        "torchvision ImageFolder": lambda nw: DataLoader(
            ImageFolder(str(folder), transform=pil_to_tensor), batch_size=BATCH, shuffle=True, num_workers=nw),
        "fastdata FolderDataset (baseline)": lambda nw: DataLoader(
            fastdata.FolderDataset(folder), batch_size=BATCH, shuffle=True, num_workers=nw),
    }
    cells = [Cell(name, nw, lambda make=make, nw=nw: make(nw)) for name, make in readers.items() for nw in workers]
    cells.append(Cell("plain numpy loop, no DataLoader (ceiling)", 0, plain_ceiling(npy), fresh=True))
    rows = compare(cells)
    print(rates_table(rows))
    ceiling = best_rate(rows, "plain numpy loop, no DataLoader (ceiling)")
    fast0 = next(r["samples_per_s"] for r in rows if r["reader"].endswith("[fast path]") and r["num_workers"] == 0)
    print(f"fast path nw=0 / ceiling: {fast0 / ceiling:.2f}x")
    print(f"fast path best / ImageFolder best: "
          f"{best_rate(rows, 'fastdata.loader(MemmapDataset) [fast path]') / best_rate(rows, 'torchvision ImageFolder'):.0f}x")
    print(f"standard best / hand-written per-sample best: "
          f"{best_rate(rows, 'DataLoader(MemmapDataset, 256) [standard]') / best_rate(rows, 'DataLoader(hand-written per-sample memmap)'):.2f}x")
    cores = os.cpu_count() or 1
    convert_rate, decode_rate = conversion_ratio(folder, cores)
    print(f"conversion on {cores} processes: {convert_rate:,.0f} img/s vs PIL decode alone {decode_rate:,.0f} img/s "
          f"({convert_rate / decode_rate:.2f}x)")


if __name__ == "__main__":
    main()
