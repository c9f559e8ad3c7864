"""A mix of two converted datasets read through ``fastdata.loader`` against each source read alone
at the same setting; the size of a loader's state; the proportions of a mix per epoch and per rank.

    python benchmarks/bench_mix.py                       # ~3 min on 2 cores
    python benchmarks/bench_mix.py --rounds 3 --count 4000

speed: seeded 64x64 RGB images, converted once under benchmarks/data/mix/, per ``--stores``: raw
  (noise; memcpy-bound, the worst case for per-batch overhead) and encoded (smooth images as JPEG
  quality 90; decode-bound, the realistic case): ``a`` as npy (``--count`` images), ``b`` as npy and
  as hdf5 (half as many). Cells, per setting (backend, num_workers): each source alone, and
  ``fastdata.mix([a, b], [1, 1])`` (one epoch: the sum of the lengths). Whole epochs (with workers,
  persistent ones: the epochs differ in length, so a start-up per epoch would favour the longest),
  after one warm-up epoch, timed round-robin with the cells' order rotated every round; the median
  per cell; samples/s and CPU seconds per 1,000 samples (this process and its workers: getrusage,
  and psutil for the live persistent ones). The result is the mix's rate over its slower source's:
  of the medians, and the median of the per-round ratios (robust to a loaded machine's drift).
large: a mix over a large cheap source (``--large SIZE:LENGTH``, default 5e7 samples with 1e5 per
  epoch, and 5e6 with the default length, the sum), each in a fresh interpreter: seconds to build,
  to the first batch of epochs 0 and 1, to the whole first epoch, and the peak RSS over the RSS
  after the imports (``--only-large`` measures only these: about 20 s on 2 cores).
state: ``len(json.dumps(state))`` and ``len(pickle.dumps(state))`` of a mix loader's state after a
  resume into another layout (one earlier layout recorded), for a mix of 10**9 samples.
proportions: a mix of three cheap sources (weights 0.7/0.2/0.1, ``--length`` samples per epoch):
  the largest gap between a source's share and its weight, per epoch and per rank of 4.
Rows go to benchmarks/out/bench_mix.json, with os.cpu_count().
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

import fastdata
from fastdata.machine import machine_info

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "mix"


class RandomImages(torch.utils.data.Dataset):
    """``count`` seeded 64x64 RGB images (uint8 HWC) with labels 0..9: uniform noise, or
    (``smooth``) a random colour gradient with mild noise, which encodes as a photo-sized JPEG."""

    def __init__(self, count: int, seed: int, smooth: bool = False):
        rng = np.random.default_rng(seed)
        if smooth:
            ramp = np.linspace(0, 1, 64, dtype=np.float32)
            corners = rng.uniform(0, 255, (count, 1, 1, 3, 2)).astype(np.float32)
            base = corners[..., 0] + (corners[..., 1] - corners[..., 0]) * (ramp[:, None, None] + ramp[None, :, None]) / 2
            noise = rng.normal(0, 12, (count, 64, 64, 3)).astype(np.float32)
            self.images = np.clip(base + noise, 0, 255).astype(np.uint8)
        else:
            self.images = rng.integers(0, 256, (count, 64, 64, 3), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        return self.images[index], index % 10


def converted(name: str, fmt: str, count: int, seed: int, store: str = "raw") -> Path:
    """The converted dataset (raw pixels of noise, or JPEG quality 90 of smooth images: ``encoded``)."""
    suffix = "" if store == "raw" else "-jpeg"
    path = DATA / f"{name}-{count}{suffix}{'.h5' if fmt == 'hdf5' else '.npy'}"
    if not path.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        encoded = {"reencode": "jpeg:90"} if store == "encoded" else {}
        fastdata.convert(RandomImages(count, seed, smooth=store == "encoded"), path, format=fmt, store=store,
                         workers=0, **encoded)
    return path


class Codes(torch.utils.data.Dataset):
    """A cheap source: sample ``i`` is ``base + i``, read by index array."""

    supports_index_arrays = True

    def __init__(self, size: int, base: int):
        self.size, self.base = size, base

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: Any) -> Any:
        return torch.as_tensor(np.asarray(index) + self.base)


def timed_epoch(loader: Any) -> tuple[float, float, int]:
    """(seconds, CPU seconds of this process and its reaped workers, samples) of one whole epoch."""
    before, cpu = time.perf_counter(), _cpu_s()
    samples = sum(len(batch[1]) for batch in loader)
    return time.perf_counter() - before, _cpu_s() - cpu, samples


def _cpu_s() -> float:
    """CPU seconds of this process (all its threads), of its reaped child processes and of its live
    ones (persistent workers, which are reaped only at the end)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    live = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:  # gone meanwhile: counted as reaped next time
            continue
        live += times.user + times.system
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + live


def speed(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for store, b_format in [(store, b_format) for store in args.stores for b_format in ("npy", "hdf5")]:
        pair = f"npy+{b_format} {store}"
        a = fastdata.open_dataset(converted("a", "npy", args.count, 1, store))
        b = fastdata.open_dataset(converted(f"b-{b_format}", b_format, args.count // 2, 2, store))
        cells = {"a (npy) alone": a, f"b ({b_format}) alone": b, f"mix(a, b {b_format}, [1, 1])": fastdata.mix([a, b], [1, 1])}
        for backend, workers in args.settings:
            persistent = {"persistent_workers": True} if workers else {}  # start-up paid once, in the warm-up epoch
            loaders = {name: fastdata.loader(ds, batch_size=args.batch_size, seed=0, backend=backend,
                                             num_workers=workers, **persistent) for name, ds in cells.items()}
            for loader in loaders.values():  # warm-up: page cache, imports
                timed_epoch(loader)
            times: dict[str, list[tuple[float, float, int]]] = {name: [] for name in loaders}
            names = list(loaders)
            for round_number in range(args.rounds):
                for name in names[round_number % len(names):] + names[:round_number % len(names)]:
                    times[name].append(timed_epoch(loaders[name]))
            for name, runs in times.items():
                seconds = statistics.median(t for t, _, _ in runs)
                samples = runs[0][2]
                rows.append({"pair": pair, "store": store, "cell": name, "backend": backend, "num_workers": workers,
                             "batch_size": args.batch_size, "samples": samples, "epochs": len(runs),
                             "samples_per_s": samples / seconds,
                             "cpu_s_per_1000": 1000 * statistics.median(c for _, c, _ in runs) / samples})
            mine = [r for r in rows if r["pair"] == pair and r["backend"] == backend
                    and r["num_workers"] == workers]
            slower = min(r["samples_per_s"] for r in mine if "alone" in r["cell"])
            mixed = next(r["samples_per_s"] for r in mine if r["cell"].startswith("mix"))
            rates = {name: [samples / t for t, _, samples in runs] for name, runs in times.items()}
            mix_name = next(name for name in rates if name.startswith("mix"))
            per_round = [rates[mix_name][i] / min(rates[name][i] for name in rates if "alone" in name)
                         for i in range(args.rounds)]
            for r in mine:
                r["mix_over_slower_source"] = mixed / slower
                r["mix_over_slower_per_round"] = per_round
            print(f"{pair} {backend} nw={workers}: " + ", ".join(
                f"{r['cell']} {r['samples_per_s']:.0f}/s ({r['cpu_s_per_1000']:.4g} CPU s/1000)" for r in mine)
                  + f"; mix / slower source = {mixed / slower:.3f} (of medians), {statistics.median(per_round):.3f} "
                  f"(median of per-round ratios)", flush=True)
    return rows


def state_size() -> dict[str, Any]:
    sources = [Codes(10**9 // 2, 0), Codes(10**9 // 2, 10**9)]
    mix = fastdata.mix(sources, [3, 1], length=10**6)  # a large mix's epoch: 10**6 draws of 10**9 samples
    loader = fastdata.loader(mix, batch_size=256, seed=0, rank=1, world_size=4)
    old = fastdata.loader(mix, batch_size=256, seed=0, rank=0, world_size=8)
    state = {**old.state_dict(), "consumed": 100}
    loader.load_state_dict(state)  # a resume into another layout: the state now records one earlier layout
    batches = iter(loader)
    next(batches)
    resumed = loader.state_dict()
    return {"json_bytes": len(json.dumps(resumed)), "pickle_bytes": len(pickle.dumps(resumed)),
            "earlier_layouts": len(resumed["earlier"]), "state": resumed}


def proportions(length: int) -> dict[str, Any]:
    weights = [0.7, 0.2, 0.1]
    mix = fastdata.mix([Codes(50_000, 0), Codes(3_000, 10**6), Codes(200, 2 * 10**6)], weights, length=length)
    per_epoch = []
    for epoch in range(3):
        sources, _ = mix.plan(epoch)
        shares = np.bincount(sources, minlength=3) / length
        per_epoch.append(float(np.abs(shares - weights).max()))
    per_rank = []
    for rank in range(4):
        loader = fastdata.loader(mix, batch_size=256, seed=0, rank=rank, world_size=4)
        codes = torch.cat(list(loader)).numpy()
        shares = np.bincount(codes // 10**6, minlength=3) / len(codes)
        per_rank.append(float(np.abs(shares - weights).max()))
    return {"length": length, "weights": weights, "max_gap_per_epoch": per_epoch, "max_gap_per_rank": per_rank}


def large_case(size: int, length: int | None, batch_size: int) -> dict[str, Any]:
    """One mix over a source of ``size`` samples (and a small one), in this process: seconds to
    build it, to the first batch of epochs 0 and 1, to a whole epoch 0, and the peak RSS over the
    RSS after the imports (both from getrusage/psutil, MB)."""
    base = psutil.Process().memory_info().rss
    started = time.perf_counter()
    mix = fastdata.mix([Codes(size, 0), Codes(1000, 10**12)], [1, 1], length=length)
    built = time.perf_counter()
    loader = fastdata.loader(mix, batch_size=batch_size, seed=0, backend="thread", num_workers=0)
    row: dict[str, Any] = {"size": size, "length": len(mix), "batch_size": batch_size,
                           "build_s": built - started}
    for epoch in range(2):
        before = time.perf_counter()
        batches = iter(loader)
        next(batches)
        row[f"first_batch_s_epoch{epoch}"] = time.perf_counter() - before
        if epoch == 0 and len(mix) <= 10**6:
            sum(1 for _ in batches)
            row["epoch_s"] = time.perf_counter() - before
        del batches
    row["peak_rss_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base) / 2**20
    return row


def large(args: argparse.Namespace) -> list[dict[str, Any]]:
    """:func:`large_case` per ``--large`` case, each in a fresh interpreter (its own peak RSS)."""
    import subprocess
    import sys

    rows = []
    for case in args.large:
        size, length = case.split(":")
        command = [sys.executable, __file__, "--large-case", f"{size}:{length}", "--batch-size", str(args.batch_size)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"large: source of {row['size']:,} + 1,000, length {row['length']:,}: build {row['build_s']:.2f} s, "
              f"first batch {row['first_batch_s_epoch0']:.3f} s (epoch 1: {row['first_batch_s_epoch1']:.3f} s)"
              + (f", epoch {row['epoch_s']:.2f} s" if "epoch_s" in row else "")
              + f", peak RSS +{row['peak_rss_mb']:.0f} MB", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=8000, help="images in source a (b has half)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--length", type=int, default=100_000, help="samples per epoch of the proportions mix")
    parser.add_argument("--stores", default="raw,encoded", help="raw (memcpy-bound), encoded (JPEG, decode-bound)")
    parser.add_argument("--settings", default="torch:0,thread:2,process:2", help="backend:num_workers,...")
    parser.add_argument("--large", default="50000000:100000,5000000:none",
                        help="SIZE:LENGTH,... mixes over a large source (LENGTH none: the sum of the lengths)")
    parser.add_argument("--only-large", action="store_true", help="measure the large mixes only")
    parser.add_argument("--large-case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.large_case:
        size, length = args.large_case.split(":")
        print(json.dumps(large_case(int(size), None if length == "none" else int(length), args.batch_size)))
        return
    args.large = [case for case in args.large.split(",") if case]
    if args.only_large:
        print(json.dumps({"cpu_count": os.cpu_count(), "large": large(args)}, indent=2))
        return
    args.stores = args.stores.split(",")
    args.settings = [(s.split(":")[0], int(s.split(":")[1])) for s in args.settings.split(",")]
    document = {"machine": machine_info(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                "args": {k: v for k, v in vars(args).items()}, "speed": speed(args), "state": state_size(),
                "proportions": proportions(args.length), "large": large(args)}
    print(f"state: {document['state']['json_bytes']} bytes as JSON, {document['state']['pickle_bytes']} pickled")
    print(f"proportions: largest gap per epoch {max(document['proportions']['max_gap_per_epoch']):.6f}, "
          f"per rank of 4 {max(document['proportions']['max_gap_per_rank']):.4f}; os.cpu_count()={os.cpu_count()}")
    out = HERE / "out" / "bench_mix.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(document, indent=2, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
