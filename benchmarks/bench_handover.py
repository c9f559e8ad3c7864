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

Then the sending itself, through a real DataLoader (``batch_size=None``, one forked worker
handing out the same reused segment every batch, ``--batches`` of them, three epochs): CPU of the
training process and of the worker per batch, the batch sent as

  labels apart   images in the segment, labels a new tensor (pickling moves it into a new segment
                 of its own: a second descriptor per batch)
  labels in tail images and labels in one segment (the ``torch`` backend's slots with
                 fastdata.reader.handover.SlotConvert): one descriptor per batch
  images alone   the images only (the floor)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--side", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--batches", type=int, default=400, help="batches per epoch through the DataLoader")
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
    print(f"through a DataLoader worker, {args.batches} batches an epoch, median of 3 epochs, CPU ms per batch:")
    for name in ("labels apart", "labels in tail", "images alone"):
        loop, worker = sending(name, args.batch, nbytes, args.batches)
        print(f"  {name:14s} training process {loop:6.3f}  worker {worker:6.3f}  both {loop + worker:6.3f}")


class _SameSegment(torch.utils.data.Dataset):
    """Every index: the batch in one shared segment made once in the worker, sent as ``mode`` says."""

    def __init__(self, mode: str, batch: int, nbytes: int, length: int):
        self.mode, self.batch, self.nbytes, self.length = mode, batch, nbytes, length
        self.storage = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if self.storage is None:
            self.storage = torch.UntypedStorage._new_shared(64 + self.nbytes + 8 * self.batch)
        images = torch.empty(0, dtype=torch.uint8).set_(self.storage, 64, (self.nbytes,))
        labels = torch.arange(self.batch)
        if self.mode == "labels apart":
            return images, labels
        if self.mode == "labels in tail":
            tail = torch.empty(0, dtype=torch.int64).set_(self.storage, (64 + self.nbytes + 7) // 8, (self.batch,))
            return images, tail.copy_(labels)
        return images


def sending(mode: str, batch: int, nbytes: int, batches: int) -> tuple[float, float]:
    """Median CPU ms per batch (training process, worker) of epochs through one forked worker."""
    loops, workers = [], []
    for _ in range(3):
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        before, cpu = children.ru_utime + children.ru_stime, time.process_time()
        for _ in torch.utils.data.DataLoader(_SameSegment(mode, batch, nbytes, batches), batch_size=None,
                                             num_workers=1, multiprocessing_context="fork"):
            pass
        loops.append(time.process_time() - cpu)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the worker was joined: reaped
        workers.append(children.ru_utime + children.ru_stime - before)
    return 1000 * statistics.median(loops) / batches, 1000 * statistics.median(workers) / batches


if __name__ == "__main__":
    main()
