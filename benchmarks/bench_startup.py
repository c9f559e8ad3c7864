"""What starting worker processes costs each epoch: the fused decode read through a fresh loader
per epoch, per backend, with the time to the first batch and to the fourth, the time per batch
after that, and the time the loader takes to stop after the last batch, beside samples/s and CPU
per image.

    python benchmarks/bench_startup.py [--out /tmp/fused-bench] [--count 2000] [--workers 1]
        [--backends torch,thread,process] [--epochs 5] [--rounds 2] [--batch-size 64]

The set is bench_fused.py's ImageNet-size JPEGs (``--out``/imagenet, generated and converted
with ``--store encoded`` when absent), read with RandomResizedCrop(224) + RandomHorizontalFlip
(the fused decode). Each backend runs in a process of its own that loads only torch and
fastdata, once per round, rounds interleaved: one untimed epoch, then ``--epochs`` timed ones,
each through a new ``fastdata.loader`` iterated as a training loop does
(``for images, labels in loader``), so the last batch of an epoch is still bound when the next
epoch's loader starts. The thread backend starts no process: its numbers are what the worker
processes' start costs are measured against. CPU ms per image counts the process and its
workers (waited for after the clock stops where the loader did not wait for their exit).
Medians over the epochs of all rounds. Numbers and what they showed: docs/reading.md ("Backends").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def child(args: argparse.Namespace) -> None:
    """One backend's epochs in this process: one JSON line per timed epoch."""
    import multiprocessing

    import fastdata
    from epoch_timing import cpu_s, reap_new_children
    from torchvision.transforms import v2

    train = v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip()])
    dataset = fastdata.open_dataset(args.dataset, transform=train)
    images = None
    for epoch in range(args.epochs + 1):
        time.sleep(0.2)  # the machine settles between epochs alike for every backend
        loader = fastdata.loader(dataset, batch_size=args.batch_size, shuffle=True, seed=epoch,
                                 backend=args.backend, num_workers=args.workers)
        before = {process.pid for process in multiprocessing.active_children()}
        marks, count = [time.perf_counter()], 0
        cpu_start = cpu_s()
        for images, labels in loader:  # the last batch stays bound, as in a training loop
            marks.append(time.perf_counter())
            count += len(images)
        marks.append(time.perf_counter())
        del loader  # stops a worker process's workers if still running (they stop at the epoch's end)
        reap_new_children(before)  # workers stopped behind the loop (both backends): their exit counted
        cpu = cpu_s() - cpu_start
        if epoch == 0:
            continue  # untimed: libraries loaded, segments written once, as in a later epoch of a run
        print(json.dumps({
            "seconds": marks[-1] - marks[0], "samples": count, "cpu_s": cpu,
            "first_ms": (marks[1] - marks[0]) * 1e3, "fourth_ms": (marks[4] - marks[0]) * 1e3,
            "per_batch_ms": (marks[-2] - marks[4]) / (len(marks) - 6) * 1e3,
            "stop_ms": (marks[-1] - marks[-2]) * 1e3,
        }), flush=True)
    del images


def dataset_path(args: argparse.Namespace) -> str:
    import fastdata
    from bench_fused import make_set, write_folder

    root = os.path.join(args.out, "imagenet")
    source, path = os.path.join(root, "source"), os.path.join(root, "fused.npy")
    if not os.path.isdir(source):
        print(f"generating {args.count} JPEGs in {source}", flush=True)
        write_folder(make_set("imagenet", args.count, 1), source)
    if not os.path.exists(path):
        fastdata.convert(source, path, store="encoded", workers=0)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/tmp/fused-bench")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--backends", default="torch,thread,process")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.workers < 1 or args.epochs < 1 or args.rounds < 1:
        parser.error("--workers, --epochs and --rounds must be at least 1")
    path = dataset_path(args)
    backends = args.backends.split(",")
    epochs: dict[str, list[dict]] = {backend: [] for backend in backends}
    for round_ in range(args.rounds):
        for backend in backends[round_ % len(backends):] + backends[:round_ % len(backends)]:
            command = [sys.executable, os.path.abspath(__file__), "--child", "--backend", backend,
                       "--dataset", path, "--workers", str(args.workers), "--epochs", str(args.epochs),
                       "--batch-size", str(args.batch_size)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{backend}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
            rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
            epochs[backend] += rows
            print(f"  round {round_} {backend}: " + ", ".join(f"{row['samples'] / row['seconds']:.0f}" for row in rows)
                  + " samples/s", flush=True)
    print(f"os.cpu_count() = {os.cpu_count()}, num_workers={args.workers}, batch {args.batch_size}, "
          f"median of {args.epochs * args.rounds} epochs each")
    print(f"{'backend':<8} {'samples/s':>10} {'CPU ms/img':>11} {'1st batch ms':>13} {'4th batch ms':>13} "
          f"{'ms/batch after':>15} {'stop ms':>8}")
    for backend, rows in epochs.items():
        def median(key: str) -> float:
            return statistics.median(row[key] for row in rows)

        rate = statistics.median(row["samples"] / row["seconds"] for row in rows)
        cpu = statistics.median(row["cpu_s"] / row["samples"] * 1e3 for row in rows)
        print(f"{backend:<8} {rate:>10.1f} {cpu:>11.3f} {median('first_ms'):>13.1f} {median('fourth_ms'):>13.1f} "
              f"{median('per_batch_ms'):>15.2f} {median('stop_ms'):>8.1f}")


if __name__ == "__main__":
    main()
