"""What a batch's hand-over from a torch DataLoader worker costs the worker, three ways.

    python benchmarks/bench_handover.py                  # batches of 64 x 224 x 224 x 3 uint8 (9.6 MB)
    python benchmarks/bench_handover.py --batch 256 --side 128 --repeats 100

  copy      what a DataLoader worker does with a batch built in its own memory: the batch is
            written into the heap, then ``share_memory_()`` copies it into a new shared segment
            (torch's pickling of a tensor that is not shared yet)
  new       the batch written straight into a new shared segment (what ``default_collate`` and
            the ``torch`` backend's fallback do): no copy, but every page is new
  reused    the batch written into a shared segment written before (the ``torch`` backend's
            slots, fastdata.reader.handover): no copy, no new page

Each row: the median over ``--repeats`` batches of wall and CPU milliseconds per batch, in this
process, with torch's default threads (``share_memory_()``'s copy may use them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--side", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    nbytes = args.batch * args.side * args.side * 3
    source = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    reused = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(nbytes)).numpy()
    reused[:] = 0

    def copy() -> None:
        batch = torch.from_numpy(source.copy())
        batch.share_memory_()

    def new() -> None:
        out = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(nbytes)).numpy()
        np.copyto(out, source)

    def reuse() -> None:
        np.copyto(reused, source)

    print(f"os.cpu_count() = {os.cpu_count()}, torch threads {torch.get_num_threads()}, "
          f"batch {args.batch} x {args.side} x {args.side} x 3 uint8 ({nbytes / 1e6:.1f} MB), "
          f"median of {args.repeats}")
    for name, run in (("copy", copy), ("new", new), ("reused", reuse)):
        walls, cpus = [], []
        for _ in range(args.repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        print(f"  {name:7s} {1000 * statistics.median(walls):7.2f} ms wall  {1000 * statistics.median(cpus):7.2f} ms CPU")


if __name__ == "__main__":
    main()
