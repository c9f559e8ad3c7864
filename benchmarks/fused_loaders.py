"""Whole epochs through the loaders: the ``--loader`` mode of benchmarks/bench_fused.py (run it
from there; this module holds the configurations, the isolated epochs and the report).

``--loader``: end to end, against torchvision's loader (and FFCV and DALI where importable).
Each set is written as an image folder (10 classes), converted with ``fastdata convert --store
encoded`` (the files' bytes kept), and read for whole epochs (batches of ``--batch-size``,
shuffled, uint8 224x224 out):
  torchvision   DataLoader(ImageFolder(src, transform=v2.Compose([v2.RandomResizedCrop(224),
                v2.RandomHorizontalFlip(), v2.PILToTensor()])), shuffle=True, num_workers=w)
  fused         fastdata.loader(fastdata.open_dataset(npy, transform=v2.Compose([
                v2.RandomResizedCrop(224), v2.RandomHorizontalFlip()])), backend=b, num_workers=w)
  fused-max-side  the same, converted with --max-side N --reencode jpeg:90 (FFCV's storage
                advice; only with --max-side)
  ffcv          (when ``import ffcv`` works) the set written by FFCV's DatasetWriter with
                RGBImageField(write_mode="jpg", jpeg_quality=90) at full size (FFCV re-encodes every
                image: the nearest it has to original bytes), read by ffcv.loader.Loader(order=RANDOM, os_cache=True) with
                [RandomResizedCropRGBImageDecoder((224, 224)), RandomHorizontalFlip(), ToTensor(),
                ToTorchImage()]; its num_workers are threads. One untimed epoch first (numba JIT).
  ffcv-max-side (with --max-side) the same with max_resolution=N: FFCV's storage advice, read
                against fused-max-side (stored alike)
  dali          (when ``import nvidia.dali`` works) a CPU-only pipeline (device_id=None):
                fn.readers.file + fn.decoders.image_random_crop(device="cpu") + fn.resize +
                fn.flip, num_threads=w; one untimed epoch first.
every backend (torch/thread/process) and ``--workers`` each, in ``--rounds`` rounds of one epoch
per configuration in a shuffled order per round (interleaved, so load from other programs hits
all alike, and no configuration always runs right after the same one); before each epoch the
script waits until no thread of its process uses CPU (DALI's iterator prefetches the next
epoch's batches in its own threads once an epoch ends: timed otherwise in whatever runs next)
and sets torch's thread count back to the run's (FFCV's Loader sets it, for the whole process,
to its own num_workers, and leaves it so).
The median epoch of each, each path at its best configuration, and the ratios; also samples per
CPU-second of this process for the configurations that work in it (num_workers=0, the thread
backend, FFCV, DALI): steadier than samples/s on a loaded machine. Worker start-up
is part of each epoch for both (no persistent workers), as in a default training loop.
Backends side by side: for each of fastdata's settings (path and num_workers >= 1), each round's
samples/s of every backend over the best backend's in the same round, median over the rounds
(steadier than a ratio of medians where the machine's speed drifts between rounds), and each
backend's fastest epoch over the fastest epoch of any backend at its setting (a shared host
runs at two speeds, and an epoch lands in one or the other: this compares them at the fast one).
``--paired``: a round runs those backends back to back (settings shuffled, backends rotated from
round to round), so a round's ratio compares epochs seconds apart. ``--only PATHS``: only these
paths (the first word of a configuration's name), e.g. ``--only fused,fused-max-side``.
``--isolate``: every epoch in a new process that builds only its configuration and loads only its
own library, so no library's threads, memory or fork cost weigh on another's. The timed epoch is a
later epoch of a training run: one untimed epoch of FFCV, DALI and fastdata's loaders first (a
fresh loader for the timed one, as the other modes make one per epoch; what the first left, FFCV's
compiled pipeline or fastdata's shared-memory segments, the second finds), two untimed batches of
torchvision's DataLoader (its workers end with their epoch and leave nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import numpy as np
import torch
from torchvision.transforms import v2

from bench_fused import SIZE, make_set, write_folder
from epoch_timing import quiesce, timed_epoch
from peer_loaders import dali_available, dali_loader, ffcv_available, ffcv_loader, write_ffcv


SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_fused.py")  # --isolate runs it
def _order(names: list[str], round_: int, paired: bool = False) -> list[str]:
    """This round's order: a seeded shuffle, so no configuration always follows the same one
    (a rotation keeps every neighbour). ``paired`` (``--paired``): fastdata's backends at one
    setting run back to back (the settings shuffled, the backends rotated from round to round),
    so that each round compares them within seconds of each other."""
    rng = np.random.default_rng(round_)
    if not paired:
        order = list(names)
        rng.shuffle(order)
        return order
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(_setting(name) or name, []).append(name)
    keys = list(groups)
    rng.shuffle(keys)
    order = []
    for key in keys:
        shift = round_ % len(groups[key])
        order += groups[key][shift:] + groups[key][:shift]
    return order


def _setting(name: str) -> str | None:
    """``"fused nw=2"`` for ``"fused thread nw=2"``: the setting whose backends are compared;
    None for another library's configuration or the serial loop (one backend)."""
    parts = name.split(" ")
    if len(parts) != 3 or parts[2] == "nw=0":
        return None
    return f"{parts[0]} {parts[2]}"


def backend_ratios(by_round: list[dict[str, float]]) -> dict[str, list[float]]:
    """name -> each round's samples/s of that backend over the best backend's at its setting in
    the same round (rounds where a backend failed left out of its setting)."""
    ratios: dict[str, list[float]] = {}
    for rates in by_round:
        settings: dict[str, list[str]] = {}
        for name in rates:
            if setting := _setting(name):
                settings.setdefault(setting, []).append(name)
        for members in settings.values():
            best = max(rates[name] for name in members)
            for name in members:
                ratios.setdefault(name, []).append(rates[name] / best)
    return ratios


def best_epoch_ratios(rates: dict[str, list[float]]) -> dict[str, float]:
    """name -> a backend's fastest epoch over the fastest epoch of any backend at its setting:
    what the backends cost when the host is at its fastest (on a shared host one epoch can run
    at two thirds of the speed of the next, whatever reads it; the median mixes the two). The
    fastest epochs compared as :func:`backend_ratios` compares one round."""
    fastest = {name: max(epochs) for name, epochs in rates.items() if epochs}
    return {name: ratios[0] for name, ratios in backend_ratios([fastest]).items()}


def loader_configs(paths: dict[str, str], workers: list[int], batch_size: int,
                   kinds: set[str] | None = None) -> dict[str, object]:
    """name -> a function giving one epoch's iterable (a fresh loader each epoch, like a default
    training loop: workers start in every epoch). ``kinds``: only these paths (the first word of
    a configuration's name; default all): with ``--isolate`` a process builds its own only, so
    that no other library is loaded into it."""
    import fastdata
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    def wanted(kind: str) -> bool:
        return kinds is None or kind in kinds

    standard = v2.Compose([v2.RandomResizedCrop(SIZE), v2.RandomHorizontalFlip(), v2.PILToTensor()])
    train = v2.Compose([v2.RandomResizedCrop(SIZE), v2.RandomHorizontalFlip()])
    configs: dict[str, object] = {}
    if wanted("torchvision"):
        folder = ImageFolder(paths["source"], transform=standard)
        for count in workers:
            configs[f"torchvision nw={count}"] = (lambda count=count: DataLoader(
                folder, batch_size=batch_size, shuffle=True, num_workers=count))
    for name in ("ffcv", "ffcv-max-side"):
        if name in paths and wanted(name):
            for count in [w for w in workers if w > 0]:
                configs[f"{name} threads={count}"] = ffcv_loader(paths[name], count, batch_size)
    if "source" in paths and wanted("dali") and dali_available():
        for count in [w for w in workers if w > 0]:
            configs[f"dali threads={count}"] = dali_loader(paths["source"], count, batch_size)
    for name in ("fused", "fused-max-side"):
        if name not in paths or not wanted(name):
            continue
        dataset = fastdata.open_dataset(paths[name], transform=train)
        if dataset.decoder.plan is None:
            raise SystemExit(f"{paths[name]}: the transform was not fused")
        for backend in ("torch", "thread", "process"):
            for count in workers:
                if count == 0 and backend != "torch":
                    continue  # num_workers=0 is one serial loop on every backend
                configs[f"{name} {backend} nw={count}"] = (lambda dataset=dataset, backend=backend, count=count:
                                                          fastdata.loader(dataset, batch_size=batch_size,
                                                                          backend=backend, num_workers=count))
    return configs


def run_loader(args: argparse.Namespace) -> list[dict]:
    import fastdata

    workers = [int(part) for part in args.workers.split(",")]
    rows = []
    sets = (("imagenet", args.count, 1), ("large", args.large_count, 2))
    for kind, count, seed in [entry for entry in sets if entry[0] in args.sets.split(",")]:
        root = os.path.join(args.out, kind)
        paths = {"source": os.path.join(root, "source"), "fused": os.path.join(root, "fused.npy")}
        if not os.path.isdir(paths["source"]):
            print(f"{kind}: generating {count} JPEGs", flush=True)
            write_folder(make_set(kind, count, seed), paths["source"])
        if not os.path.exists(paths["fused"]):
            fastdata.convert(paths["source"], paths["fused"], store="encoded", workers=0)
        if args.max_side:
            paths["fused-max-side"] = os.path.join(root, f"max-side-{args.max_side}.npy")
            if not os.path.exists(paths["fused-max-side"]):
                fastdata.convert(paths["source"], paths["fused-max-side"], store="encoded", max_side=args.max_side,
                                 reencode="jpeg:90", workers=0)
        kinds = set(args.only.split(",")) if args.only else None  # --only: these paths alone
        if (kinds is None or "ffcv" in kinds) and ((args.isolate and _available_elsewhere("ffcv")) or
                               (not args.isolate and ffcv_available())):
            # FFCV re-encodes every image (q90): at full size, the nearest it has to original bytes
            paths["ffcv"] = os.path.join(root, "full.beton")
            if not os.path.exists(paths["ffcv"]):
                write_ffcv(paths["source"], paths["ffcv"], None)
            if args.max_side:
                paths["ffcv-max-side"] = os.path.join(root, f"max-side-{args.max_side}.beton")
                if not os.path.exists(paths["ffcv-max-side"]):
                    write_ffcv(paths["source"], paths["ffcv-max-side"], args.max_side)
        if args.isolate:
            dali = (kinds is None or "dali" in kinds) and _available_elsewhere("nvidia.dali")  # asked only if wanted
            names = _config_names(paths, workers, dali=dali, kinds=kinds)
            configs = {name: (lambda name=name, paths=paths: _isolated_epoch(name, paths, args)) for name in names}
        else:
            configs = loader_configs(paths, workers, args.batch_size, kinds)
        names, rates = list(configs), {name: [] for name in configs}
        cpu_rates = {name: [] for name in configs}  # worker processes' CPU is not counted: in-process only
        by_round: list[dict[str, float]] = []
        for round_ in range(args.rounds):
            by_round.append({})
            for name in _order(names, round_, args.paired):
                quiesce()
                # FFCV's Loader calls torch.set_num_threads(its num_workers) for the whole process
                # (ffcv.pipeline.compiler.Compiler.set_num_threads), and leaves it so: every
                # epoch starts at the thread count chosen for the run (torch's default unless
                # --threads 1), as a training script would have it
                torch.set_num_threads(args.threads)
                try:
                    if args.isolate:
                        elapsed, samples, cpu_s = configs[name]()
                    else:
                        elapsed, samples, cpu_s = timed_epoch(configs[name]())
                except Exception as exc:  # one library failing leaves the others' numbers
                    print(f"  {kind} round {round_} {name}: failed ({type(exc).__name__}: {exc})", flush=True)
                    continue
                if samples != count:
                    print(f"  {kind} {name}: an epoch gave {samples} samples, not {count}", flush=True)
                rates[name].append(samples / elapsed)
                by_round[-1][name] = samples / elapsed
                cpu_rates[name].append(samples / max(cpu_s, 1e-9))
                print(f"  {kind} round {round_} {name}: {samples / elapsed:.1f} samples/s "
                      f"({cpu_rates[name][-1]:.1f} per CPU-second of this process)", flush=True)
        ratios = backend_ratios(by_round)
        best_ratios = best_epoch_ratios(rates)
        for name in names:
            if rates[name]:
                rows.append({"set": kind, "count": count, "config": name, "path": name.split(" ")[0],
                             "samples_per_s": statistics.median(rates[name]), "epoch_rates": rates[name],
                             "samples_per_cpu_s": statistics.median(cpu_rates[name]),
                             "cpu_ms_per_image": 1000 / statistics.median(cpu_rates[name]),
                             "torch_threads": args.threads, "step_ms": args.step_ms,
                             "step_matmuls": args.step_count,
                             "cpu_count": os.cpu_count(), "batch_size": args.batch_size,
                             **({"backend_ratio": statistics.median(ratios[name]), "backend_ratios": ratios[name],
                                 "backend_best_epoch_ratio": best_ratios[name]} if name in ratios else {})})
    return rows


def _available_elsewhere(module: str) -> bool:
    """Whether ``module`` imports, asked of a new process (this one stays without it)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def _config_names(paths: dict[str, str], workers: list[int], *, dali: bool,
                  kinds: set[str] | None = None) -> list[str]:
    """The configurations :func:`loader_configs` would build (for ``kinds``, as there), by name,
    without building them."""
    names = [f"torchvision nw={count}" for count in workers]
    names += [f"{kind} threads={count}" for kind in ("ffcv", "ffcv-max-side") if kind in paths
              for count in workers if count > 0]
    if dali:
        names += [f"dali threads={count}" for count in workers if count > 0]
    names += [f"{kind} {backend} nw={count}" for kind in ("fused", "fused-max-side") if kind in paths
              for backend in ("torch", "thread", "process") for count in workers if count > 0 or backend == "torch"]
    return [name for name in names if kinds is None or name.split(" ")[0] in kinds]


def _isolated_epoch(name: str, paths: dict[str, str], args: argparse.Namespace) -> tuple[float, int, float]:
    """One timed epoch of configuration ``name`` in a new process that loads only its own library
    (``--isolate``): (seconds, samples, CPU seconds of that process and its workers)."""
    import subprocess
    import sys

    command = [sys.executable, SCRIPT, "--one-epoch", name, "--paths", json.dumps(paths),
               "--workers", args.workers, "--batch-size", str(args.batch_size), "--threads", str(args.threads),
               "--step-ms", str(args.step_ms), "--step-count", str(args.step_count)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{name}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["seconds"], result["samples"], result["cpu_s"]


def one_epoch(args: argparse.Namespace) -> None:
    """``--one-epoch NAME``: build that configuration alone and print one timed epoch as JSON."""
    paths = json.loads(args.paths)
    kind = args.one_epoch.split(" ")[0]
    configs = loader_configs(paths, [int(part) for part in args.workers.split(",")], args.batch_size, kinds={kind})
    torch.set_num_threads(args.threads)
    if kind == "torchvision":
        for number, _ in enumerate(configs[args.one_epoch]()):  # libraries loaded, kernels run once: untimed
            if number == 1:  # (a DataLoader keeps nothing from one epoch to the next: two batches do)
                break
    elif kind in ("fused", "fused-max-side"):  # a whole untimed epoch, as FFCV's and DALI's: a later
        # epoch starts with what the one before left (kept segments). Run as the timed one is, so that
        # its last batch is let go when its loop ends, as a training loop lets it go at the next
        # epoch's first batch (a batch held through the whole timed epoch would keep one of a
        # process worker's slots from it: the worker could not work ahead)
        timed_epoch(configs[args.one_epoch]())
    batches = configs[args.one_epoch]()  # FFCV and DALI run their untimed first epoch here
    torch.set_num_threads(args.threads)
    quiesce()
    seconds, samples, cpu_s = timed_epoch(batches)
    print(json.dumps({"seconds": seconds, "samples": samples, "cpu_s": cpu_s}))


LABELS = {"torchvision": "tv", "ffcv": "ffcv", "dali": "dali"}  # the ratio columns of the report


def print_loader(rows: list[dict], args: argparse.Namespace) -> None:
    print(f"os.cpu_count() = {os.cpu_count()}, torch threads {args.threads}, training step {args.step_ms} ms per "
          f"batch, batch {args.batch_size}, median of {args.rounds} epochs each, "
          + ("interleaved, fastdata's backends back to back" if args.paired else "interleaved"))
    print(f"{'set':9} {'configuration':28} {'samples/s':>10} {'CPU ms/image':>13}")
    for row in rows:
        print(f"{row['set']:9} {row['config']:28} {row['samples_per_s']:10.1f} {row['cpu_ms_per_image']:13.2f}")
    print("best of each path (by samples/s), ratios to torchvision's, FFCV's and DALI's best:")
    for kind in dict.fromkeys(row["set"] for row in rows):
        best = {}
        for row in rows:
            if row["set"] == kind and row["samples_per_s"] > best.get(row["path"], {}).get("samples_per_s", 0):
                best[row["path"]] = row
        peers = {peer: best[peer]["samples_per_s"] for peer in ("torchvision", "ffcv", "dali") if peer in best}
        for path, row in best.items():
            versus = "".join(f"  {row['samples_per_s'] / rate:5.2f}x {LABELS[peer]}" for peer, rate in peers.items())
            print(f"  {kind:9} {path:15} {row['config']:28} {row['samples_per_s']:8.1f} "
                  f"{row['cpu_ms_per_image']:6.2f} ms{versus}")
        if "fused-max-side" in best and "ffcv-max-side" in best:
            ours, theirs = best["fused-max-side"]["samples_per_s"], best["ffcv-max-side"]["samples_per_s"]
            print(f"  {kind:9} stored alike (--max-side): fused-max-side {ours / theirs:.2f}x ffcv-max-side")
        paired = [row for row in rows if row["set"] == kind and "backend_ratio" in row]
        if paired:
            print(f"  {kind:9} backends, each round against the best backend at its setting in that round "
                  f"(median; {'back to back' if args.paired else 'interleaved with the rest'}): " + ", ".join(
                      f"{row['config']} {row['backend_ratio']:.2f}x" for row in paired))
            print(f"  {kind:9} backends, each one's fastest epoch against the fastest of any backend at its "
                  f"setting: " + ", ".join(f"{row['config']} {row['backend_best_epoch_ratio']:.2f}x" for row in paired))
        one_core = {row["config"]: row for row in rows if row["set"] == kind and row["config"] in (
            "fused torch nw=0", "ffcv threads=1", "dali threads=1")}
        if "fused torch nw=0" in one_core:
            ours = one_core.pop("fused torch nw=0")["samples_per_s"]
            print(f"  {kind:9} one core: fused nw=0 {ours:.1f}/s" + "".join(
                f", {ours / row['samples_per_s']:.2f}x {name}" for name, row in one_core.items()))
