"""Benchmark of the tar format against encoded npy and stock ``webdataset.WebDataset``.

Grid: reader x num_workers (0..os.cpu_count()), batch 256, full epochs, median of repeats
after a warm-up epoch, all in one run on the same workload (20k 32x32 PNGs from
``fastdata.bench.demo.make_demo_folder``, seeded). Emits JSON rows, then a table rendered from them.

    python benchmarks/bench_tar.py --data benchmarks/data/bench_tar --out benchmarks/out/bench_tar.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

import fastdata
from fastdata.bench.report import best_rate, rates_table
from fastdata.bench.timing import Cell, compare
from fastdata.bench.demo import demo_folder


def prepare(data: Path, count: int, size: int, shard_samples: int) -> dict[str, Path]:
    folder = demo_folder(data / f"demo-{count}-{size}", small=count, small_size=size)
    paths = {"folder": folder}
    for name, fmt, store, extra in [
        ("npy-encoded", "npy", "encoded", {}),
        ("tar-encoded", "tar", "encoded", {"shard_samples": shard_samples}),
        ("tar-raw", "tar", "raw", {"shard_samples": shard_samples}),
    ]:
        out = data / f"{folder.name}.{name}"
        fastdata.convert(folder, out, format=fmt, store=store, resume=True, **extra)  # kept when converted
        paths[name] = out
    return paths


def shards(path: Path) -> list[str]:
    return [str(path / s["file"]) for s in json.loads((path / "index.json").read_text())["shards"]]


def stock_webdataset(path: Path, extension: str) -> Any:
    import webdataset as wds

    decoder = "torchrgb8" if extension == "png" else None
    dataset = wds.WebDataset(shards(path), shardshuffle=len(shards(path)), empty_check=False, seed=0).shuffle(1000)
    dataset = dataset.decode(decoder) if decoder else dataset.decode()
    return dataset.to_tuple(extension, "cls")


def readers(paths: dict[str, Path], batch_size: int) -> dict[str, Callable[[int], DataLoader]]:
    def iterable(dataset: Any) -> Callable[[int], DataLoader]:
        return lambda workers: DataLoader(
            dataset, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0
        )

    def batched(dataset: Any) -> Callable[[int], DataLoader]:
        return lambda workers: DataLoader(dataset, batch_size=None, num_workers=workers, persistent_workers=workers > 0)

    def mapped(dataset: Any) -> Callable[[int], DataLoader]:
        return lambda workers: fastdata.loader(
            dataset, batch_size=batch_size, num_workers=workers, seed=0, persistent_workers=workers > 0
        )

    return {
        "npy-encoded (fastdata.loader)": mapped(fastdata.MemmapDataset(paths["npy-encoded"])),
        "tar-encoded (TarDataset, batch_size=B)": batched(fastdata.TarDataset(paths["tar-encoded"], batch_size=batch_size)),
        "tar-raw (TarDataset, batch_size=B)": batched(fastdata.TarDataset(paths["tar-raw"], batch_size=batch_size)),
        "tar-encoded (TarDataset, per-sample collate)": iterable(fastdata.TarDataset(paths["tar-encoded"], seed=0)),
        "tar-raw (TarDataset, per-sample collate)": iterable(fastdata.TarDataset(paths["tar-raw"], seed=0)),
        "tar-encoded (TarIndexedDataset, fastdata.loader)": mapped(fastdata.TarIndexedDataset(paths["tar-encoded"])),
        "stock wds, encoded shards (torchrgb8)": iterable(stock_webdataset(paths["tar-encoded"], "png")),
        "stock wds, raw shards (npy)": iterable(stock_webdataset(paths["tar-raw"], "npy")),
    }


def summary(rows: list[dict[str, Any]]) -> str:
    npy, enc, raw = (best_rate(rows, n) for n in ("npy-encoded (fastdata.loader)", "tar-encoded (TarDataset, batch_size=B)",
                                                  "tar-raw (TarDataset, batch_size=B)"))
    wds_enc = best_rate(rows, "stock wds, encoded shards (torchrgb8)")
    wds_raw = best_rate(rows, "stock wds, raw shards (npy)")
    return "\n".join([
        f"tar-encoded best / npy-encoded best = {enc / npy:.2f}",
        f"tar-raw best / stock wds (encoded shards, its decoder) best = {raw / wds_enc:.1f}x",
        f"tar-raw best / stock wds (raw shards, npy) best = {raw / wds_raw:.1f}x",
        f"os.cpu_count() = {os.cpu_count()}, torch {torch.__version__}",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("benchmarks/data/bench_tar"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/bench_tar.json"))
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--shard-samples", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=ResourceWarning)
    paths = prepare(args.data, args.count, args.size, args.shard_samples)
    workers = list(range(args.max_workers + 1))
    cells = [Cell(name, count, lambda make=make, count=count: make(count), extra={"batch_size": args.batch_size})
             for name, make in readers(paths, args.batch_size).items() for count in workers]
    rows = compare(cells, epochs=args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"cpu_count": os.cpu_count(), "argv": sys.argv, "rows": rows}, indent=2))
    print(rates_table(rows))
    print()
    print(summary(rows))


if __name__ == "__main__":
    main()
