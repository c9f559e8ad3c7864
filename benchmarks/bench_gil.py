"""What the GIL costs the thread backend on this machine: the readers' fused decode of the same
JPEGs in 1 thread, in N threads of one process, and in N forked processes, with CPU time per
image and context switches per image beside the wall time.

    python benchmarks/bench_gil.py [--images DIR] [--count 1000] [--workers 2] [--rounds 2]

``--images``: a folder of JPEGs (searched recursively); without it, ``--count`` ImageNet-size
JPEGs are generated (the set of benchmarks/bench_fused.py). Each image goes through
``fastdata.reader.fused.fused_pixels`` (RandomResizedCrop(224) + flip on the region decode where
it is installed) into its own row, drawn from ``seed_for(0, 0, i)``, as a reader does (an older
checkout on PYTHONPATH: its ``fused_decode`` where it has no ``fused_pixels``, and the
generator ``generator_for(0, 0, i)`` where it takes no seed: the same work, the same boxes). The
threads share one process, so they take turns at the GIL between the calls that let go of it
(the decode, the resize, the copies; in an older checkout each small torch op of the crop's
draw); the processes do not. Where the per-image CPU of N threads rises above one thread's
while N processes' does not, the rise is the cost of handing the GIL from thread to thread
(waking the waiting thread, moving the interpreter's shared state between cores):
docs/reading.md, "Threads and the GIL".
"""

from __future__ import annotations

import argparse
import inspect
import os
import resource
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))

from fastdata.reader import fused  # noqa: E402

PLAN = fused.FusedPlan("random_resized_crop", (224, 224), flip_p=0.5)


def load_images(args: argparse.Namespace) -> list[bytes]:
    if args.images:
        paths = sorted(path for path in Path(args.images).rglob("*") if path.suffix.lower() in (".jpg", ".jpeg"))
        if not paths:
            sys.exit(f"No JPEG (.jpg, .jpeg) under {args.images}.")
        return [path.read_bytes() for path in paths[: args.count]]
    from bench_fused import make_set  # the ImageNet-size set of bench_fused.py

    return make_set("imagenet", args.count, seed=1)


# an older checkout (PYTHONPATH=it) has only fused_decode: the same work, same arguments, a tensor view returned
PIXELS = getattr(fused, "fused_pixels", None) or fused.fused_decode
# as the readers draw: from the sample's seed (replayed without torch ops), or, in an older checkout, its generator
SEEDED = "seed" in inspect.signature(PIXELS).parameters


def decode_range(images: list[bytes], start: int, stop: int, out: np.ndarray, decoder: str) -> None:
    for index in range(start, stop):
        drawn = {"seed": fused.seed_for(0, 0, index)} if SEEDED else {"generator": fused.generator_for(0, 0, index)}
        PIXELS(images[index % len(images)], PLAN, decoder=decoder, out=out, **drawn)


def switches() -> int:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


def in_threads(images: list[bytes], workers: int, decoder: str) -> tuple[float, float, float]:
    """(wall s, CPU s, context switches) of every image decoded once, shared among ``workers`` threads."""
    share = -(-len(images) // workers)
    rows = np.empty((workers, 224, 224, 3), np.uint8)
    threads = [threading.Thread(target=decode_range, args=(images, w * share, min(len(images), (w + 1) * share),
                                                           rows[w], decoder)) for w in range(workers)]
    start, cpu, switched = time.perf_counter(), time.process_time(), switches()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start, time.process_time() - cpu, switches() - switched


def in_processes(images: list[bytes], workers: int, decoder: str) -> tuple[float, float, float]:
    """The same with ``workers`` forked processes (their CPU and switches from their rusage)."""
    share = -(-len(images) // workers)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start, pids = time.perf_counter(), []
    for w in range(workers):
        pid = os.fork()
        if pid == 0:  # the child never returns into the parent's code, whatever happens
            try:
                decode_range(images, w * share, min(len(images), (w + 1) * share),
                             np.empty((224, 224, 3), np.uint8), decoder)
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        pids.append(pid)
    failed = [pid for pid in pids if os.waitpid(pid, 0)[1] != 0]
    if failed:
        sys.exit(f"{len(failed)} of {workers} decoding processes failed (their errors above).")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    switched = after.ru_nvcsw + after.ru_nivcsw - before.ru_nvcsw - before.ru_nivcsw
    return time.perf_counter() - start, cpu, switched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", help="a folder of JPEGs (default: generate the ImageNet-size set)")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.workers < 1 or args.count < 1 or args.rounds < 1:
        parser.error("--workers, --count and --rounds take 1 or more")
    images = load_images(args)
    decoder = fused.default_decoder()
    decode_range(images, 0, min(50, len(images)), np.empty((224, 224, 3), np.uint8), decoder)  # warm
    print(f"os.cpu_count() = {os.cpu_count()}, torch threads {torch.get_num_threads()}, {len(images)} JPEGs, "
          f"fused decoder {decoder}, median of {args.rounds} rounds in rotating order")
    ways = {"1 thread": lambda: in_threads(images, 1, decoder),
            f"{args.workers} threads": lambda: in_threads(images, args.workers, decoder),
            f"{args.workers} processes": lambda: in_processes(images, args.workers, decoder)}
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ways}
    for round_ in range(args.rounds):
        for name in list(ways)[round_ % len(ways):] + list(ways)[:round_ % len(ways)]:
            results[name].append(ways[name]())
    count = len(images)
    print(f"{'':14} {'images/s':>9} {'CPU us/image':>13} {'switches/image':>15}")
    for name, rows in results.items():
        wall, cpu, switched = (statistics.median(column) for column in zip(*rows))
        print(f"{name:14} {count / wall:9.0f} {cpu / count * 1e6:13.0f} {switched / count:15.2f}")


if __name__ == "__main__":
    main()
