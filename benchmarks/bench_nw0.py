"""The default ``fastdata.loader`` at num_workers=0 against the same work done without it, and
``fastdata tune``'s pick against an independent sweep.

    python benchmarks/bench_nw0.py                  # both parts (~3 min on 2 cores)
    python benchmarks/bench_nw0.py --only serial    # or: --only tune

serial: 20,000 raw 32x32 RGB samples (seeded, generated once under benchmarks/data/nw0/), npy,
  batch 256, shuffle. Cells: a same-process numpy gather of the same memmap (the loader's own
  sampler, one sorted fancy-index per batch, then torch.from_numpy), the default
  ``fastdata.loader(ds, batch_size=256)`` (backend "torch", num_workers=0), and the serial loop
  of the other backends (backend="thread" / "process", num_workers=0). Epochs are timed
  round-robin, the order of the cells rotated every round (the cell run right after another
  measured up to 5% slower here, whichever it was); the medians' ratios are the result.
tune: the TensorDataset of docs/tuning.md's first worked example (10,000 x 10 floats, batch
  32). Each run: ``fastdata.tune`` picks a setting; then ``fastdata.sweep`` measures every
  backend at num_workers 0, 1, 2 on the fast path (``--sweep-epochs`` epochs), each in a fresh process; the ratio is the
  picked setting's rate in that sweep over the sweep's best.
Rows and ratios go to benchmarks/out/bench_nw0.json, with os.cpu_count().
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import fastdata
from fastdata.bench.timing import time_epoch
from fastdata.machine import machine_info
from fastdata.loading.samplers import BatchIndexSampler

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "nw0"


class RandomImages(torch.utils.data.Dataset):
    """``count`` seeded random 32x32 RGB images (uint8 HWC) with labels 0..9: the conversion's source."""

    def __init__(self, count: int, seed: int = 0):
        self.images = np.random.default_rng(seed).integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        return self.images[index], index % 10


def raw32(count: int = 20000) -> Path:
    path = DATA / f"raw32-{count}.npy"
    if not (path / "manifest.json").exists():
        fastdata.convert(RandomImages(count), path, format="npy", store="raw", workers=0)
    return path


class NumpyGather:
    """The same epochs without fastdata's loader: one sorted fancy-index of the memmap per batch."""

    def __init__(self, path: Path, batch_size: int):
        self.images = np.load(path / "images.npy", mmap_mode="r")
        self.labels = np.load(path / "labels.npy")
        self.sampler = BatchIndexSampler(len(self.labels), batch_size, seed=0)

    def __iter__(self):
        for indices in self.sampler:
            yield torch.from_numpy(self.images[indices]).permute(0, 3, 1, 2), torch.from_numpy(self.labels[indices])


def rotated(cells: dict[str, Any], rounds: int) -> dict[str, list[float]]:
    """Samples/s of every epoch of every cell, after one warm-up epoch each; each round runs
    every cell once, starting one cell later than the round before."""
    names = list(cells)
    for name in names:
        time_epoch(cells[name])
    rates: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names[round_ % len(names):] + names[: round_ % len(names)]:
            rates[name].append(time_epoch(cells[name]).samples_per_s)
    return rates


def serial(report: dict[str, Any], rounds: int) -> None:
    path = raw32()
    ds = fastdata.MemmapDataset(path)
    cells = {
        "numpy gather": NumpyGather(path, 256),
        "fastdata.loader default (torch, nw=0)": fastdata.loader(ds, batch_size=256, seed=0),
        "backend=thread nw=0": fastdata.loader(ds, batch_size=256, seed=0, backend="thread"),
        "backend=process nw=0": fastdata.loader(ds, batch_size=256, seed=0, backend="process"),
    }
    rates = rotated(cells, rounds)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    default = medians["fastdata.loader default (torch, nw=0)"]
    report["samples_per_s"] = {name: round(value) for name, value in medians.items()}
    report["range_samples_per_s"] = {name: [round(min(v)), round(max(v))] for name, v in rates.items()}
    report["epochs_per_cell"] = rounds
    report["default_over_numpy_gather"] = round(default / medians["numpy gather"], 3)
    report["default_over_thread_nw0"] = round(default / medians["backend=thread nw=0"], 3)
    report["default_over_process_nw0"] = round(default / medians["backend=process nw=0"], 3)


def tensor_dataset() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(10000, 10, generator=generator),
                                          torch.randint(0, 2, (10000,), generator=generator))


def tune_runs(report: dict[str, Any], runs: int, sweep_epochs: int = 10) -> None:
    from fastdata.bench.summary import summarize

    dataset = tensor_dataset()
    found = []
    for run in range(runs):
        started = time.perf_counter()
        picked = fastdata.tune(dataset, batch_size=32)
        tune_s = time.perf_counter() - started
        rows = fastdata.sweep(dataset, batch_size=32, workers=[0, 1, 2], backends=("torch", "thread", "process"),
                              paths=("fast",), epochs=sweep_epochs)
        cells = {(key[3], workers): cell["samples_per_s"]
                 for key, by_workers in summarize(rows).items() for workers, cell in by_workers.items()
                 if cell["status"] == "ok"}
        best_key = max(cells, key=cells.get)
        mine = cells[("torch" if picked.num_workers == 0 else picked.backend, picked.num_workers)]
        found.append({"run": run + 1, "picked": f"{picked.backend} nw={picked.num_workers}",
                      "picked_in_sweep_per_s": round(mine), "sweep_best": f"{best_key[0]} nw={best_key[1]}",
                      "sweep_best_per_s": round(cells[best_key]), "ratio": round(mine / cells[best_key], 3),
                      "tune_s": round(tune_s, 2),
                      "sweep": {f"{b} nw={w}": round(v) for (b, w), v in sorted(cells.items())}})
        print(json.dumps(found[-1]), file=sys.stderr, flush=True)
    report["runs"] = found
    report["ratios"] = [run["ratio"] for run in found]
    report["runs_within_0.9"] = f"{sum(r >= 0.9 for r in report['ratios'])} of {runs}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="serial,tune")
    parser.add_argument("--rounds", type=int, default=40, help="timed epochs per serial cell")
    parser.add_argument("--runs", type=int, default=5, help="tune runs, each against its own sweep")
    parser.add_argument("--sweep-epochs", type=int, default=10,
                        help="measured epochs per sweep configuration (an epoch here lasts ~20 ms)")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "bench_nw0.json")
    args = parser.parse_args()
    results: dict[str, Any] = {"machine": machine_info(), "cpu_count": os.cpu_count(), "command": " ".join(sys.argv)}
    print(f"machine: {results['machine']}", flush=True)
    jobs: dict[str, Callable[[dict[str, Any]], None]] = {
        "serial": lambda report: serial(report, args.rounds),
        "tune": lambda report: tune_runs(report, args.runs, args.sweep_epochs),
    }
    for name in args.only.split(","):
        report: dict[str, Any] = {}
        started = time.perf_counter()
        jobs[name](report)
        report["seconds"] = round(time.perf_counter() - started, 1)
        results[name] = report
        print(f"\n## {name}\n{json.dumps(report, indent=2)}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
