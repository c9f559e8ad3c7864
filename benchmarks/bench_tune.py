"""``fastdata.tune`` against an exhaustive sweep, on five datasets and one step-dominated case.

    python benchmarks/bench_tune.py                     # everything (~10 min on 2 cores)
    python benchmarks/bench_tune.py --only tensor,mnist

For each dataset: the exhaustive sweep (``fastdata.sweep``: every backend x num_workers 0 .. 2 x
usable cores, fast path, 1 warm-up + 2 measured epochs (raw npy 10, tensor 5: their epochs last
milliseconds), each configuration in a fresh process)
and ``fastdata.tune`` (default budget), both timed. Reported: the sweep's best configuration,
tune's recommendation, the recommendation's rate *as the sweep measured it* over the sweep's best
(target >= 0.9), and tune's time over the sweep's (target <= 1/3). The step case (the image folder's
5,000 PNGs as encoded npy, batch 256) adds a 50 ms sleep per batch: the target is the fewest workers whose data wait stays under 5% in the sweep.
Workloads are generated under benchmarks/data/ (seeded); rows go to benchmarks/out/bench_tune.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fastdata
from fastdata.bench.demo import demo_folder
from fastdata.machine import machine_info, usable_cores

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "tune"
LOADERS = HERE / "data" / "loaders"


def write_idx(path: Path, array: np.ndarray) -> None:
    """MNIST's idx file format (what torchvision.datasets.MNIST reads)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def mnist(count: int = 10000) -> Any:
    from torchvision import transforms
    from torchvision.datasets import MNIST

    root = DATA / "mnist"
    raw = root / "MNIST" / "raw"
    if not (raw / "train-images-idx3-ubyte").exists():
        rng = np.random.default_rng(0)
        write_idx(raw / "train-images-idx3-ubyte", rng.integers(0, 256, (count, 28, 28)))
        write_idx(raw / "train-labels-idx1-ubyte", rng.integers(0, 10, count))
        write_idx(raw / "t10k-images-idx3-ubyte", rng.integers(0, 256, (10, 28, 28)))
        write_idx(raw / "t10k-labels-idx1-ubyte", rng.integers(0, 10, 10))
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    return MNIST(str(root), train=True, transform=transform)


def workloads() -> dict[str, tuple[Any, int, float | None]]:
    """name -> (dataset, batch size, step ms)."""
    small = demo_folder(LOADERS / "small-20000", small=20000, small_size=32, seed=0)
    folder = demo_folder(DATA / "folder-5000", small=5000, small_size=32, seed=3)
    paths = {}
    for name, (source, options) in {"raw32": (small, {"store": "raw"}), "png32": (small, {"store": "encoded"}),
                                    "folder encoded": (folder, {"store": "encoded"})}.items():
        paths[name] = (LOADERS if name != "folder encoded" else DATA) / f"{name.replace(' ', '-')}.npy"
        fastdata.convert(source, paths[name], resume=True, **options)
    generator = torch.Generator().manual_seed(0)
    return {
        "raw npy": (fastdata.open_dataset(paths["raw32"]), 256, None),
        "encoded npy": (fastdata.open_dataset(paths["png32"]), 256, None),
        "image folder": (fastdata.FolderDataset(folder), 256, None),
        "tensor": (torch.utils.data.TensorDataset(torch.randn(10000, 10, generator=generator),
                                                  torch.randint(0, 2, (10000,), generator=generator)), 32, None),
        "mnist": (mnist(), 64, None),
        "step 50 ms": (fastdata.open_dataset(paths["folder encoded"]), 256, 50.0),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, float]]:
    cells: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        if row["status"] == "ok" and not row["warmup"] and row["format"] != "probe":  # not the hand-over probe
            cells.setdefault((row["backend"], row["num_workers"]), []).append(row)
    return {key: {"samples_per_s": statistics.median(r["samples_per_s"] for r in group),
                  "wait_fraction": statistics.median(r["wait_fraction"] for r in group)} for key, group in cells.items()}


# measured epochs per sweep configuration: raw npy's epoch lasts ~8 ms, so 2 of them are mostly noise
SWEEP_EPOCHS = {"raw npy": 10, "tensor": 5}


def compare(name: str, dataset: Any, batch: int, step: float | None) -> dict[str, Any]:
    cores = usable_cores()
    workers = list(range(0, 2 * cores + 1))
    start = time.perf_counter()
    rows = fastdata.sweep(dataset, batch_size=batch, workers=workers, backends=("torch", "thread", "process"),
                          step=step, paths=("fast",), epochs=SWEEP_EPOCHS.get(name, 2), warmup=1,
                          persistent_workers=True)
    sweep_s = time.perf_counter() - start
    cells = summarize(rows)
    for backend in ("thread", "process"):  # num_workers=0 is one cell, measured once
        if ("torch", 0) in cells:
            cells[(backend, 0)] = cells[("torch", 0)]
    start = time.perf_counter()
    rec = fastdata.tune(dataset, batch_size=batch, step=step)
    tune_s = time.perf_counter() - start
    best = max(cells, key=lambda key: cells[key]["samples_per_s"])
    chosen = (rec.backend, rec.num_workers)
    result = {
        "dataset": name, "batch_size": batch, "step_ms": step, "sweep_epochs": SWEEP_EPOCHS.get(name, 2), "sweep_s": round(sweep_s, 1), "tune_s": round(tune_s, 1),
        "sweep_best": {"backend": best[0], "num_workers": best[1], **cells[best]},
        "tune": {"backend": rec.backend, "num_workers": rec.num_workers,
                 "measured_by_tune": rec.measured_samples_per_s, "predicted": rec.predicted_samples_per_s},
        "recommended_in_sweep": cells.get(chosen),
        "time_ratio": round(tune_s / sweep_s, 3),
    }
    if cells.get(chosen):
        result["rate_ratio"] = round(cells[chosen]["samples_per_s"] / cells[best]["samples_per_s"], 3)
    if step:
        calm = sorted((key for key in cells if cells[key]["wait_fraction"] < 0.05), key=lambda key: key[1])
        result["fewest_workers_wait_under_5pct"] = calm[0][1] if calm else None
        result["tune_wait_fraction"] = rec.wait_fraction
    result["cells"] = {f"{b} nw={n}": {k: round(v, 4) for k, v in value.items()} for (b, n), value in sorted(cells.items())}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated dataset names (default: all)")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "bench_tune.json")
    args = parser.parse_args()
    print(f"machine: {machine_info()}", flush=True)
    results = []
    chosen = {part.strip() for part in args.only.split(",") if part.strip()}
    for name, (dataset, batch, step) in workloads().items():
        if chosen and name.split()[0] not in chosen and name not in chosen:
            continue
        result = compare(name, dataset, batch, step)
        results.append(result)
        summary = {key: value for key, value in result.items() if key != "cells"}
        print(f"\n## {name}\n{json.dumps(summary, indent=2)}", flush=True)
    print("\n| dataset | sweep best | tune picks | its rate in the sweep / best | tune time / sweep time |")
    print("|---|---|---|---|---|")
    for r in results:
        best = r["sweep_best"]
        pick = r["tune"]
        ratio = r.get("rate_ratio")
        print(f"| {r['dataset']} (batch {r['batch_size']}) | {best['backend']} nw={best['num_workers']} "
              f"{best['samples_per_s']:,.0f}/s | {pick['backend']} nw={pick['num_workers']} | "
              f"{ratio if ratio is not None else '-'} | {r['tune_s']} s / {r['sweep_s']} s = {r['time_ratio']} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine_info(), "results": results}, indent=2, default=str))
    print(f"\nwrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
