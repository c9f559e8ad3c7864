"""Workers do not grow while they read: no copy-on-access memory growth (pytorch#13246).

A forked DataLoader worker shares its parent's memory pages until it writes to them. A reader
that keeps per-sample Python objects (a list of keys, of ints) writes to them on every access
(reference counts), so each worker's unique memory (USS) grows with every sample it reads until
it holds a private copy of them all. fastdata's readers keep per-sample metadata in numpy
arrays, so a worker's USS stays flat once it has warmed up.

How growth is measured: 2 persistent workers (the same processes all along), reading in index
order, so that the samples a worker has touched grow with its progress (a shuffled read touches
every page of a per-sample list within the first few batches, which would hide the growth
before the first measurement). USS is taken after a warm-up of the first 10% of epoch 1, at
the end of epoch 1 and at the end of epoch 3; the growth from the warm-up to either end must
stay under ``BOUND_BYTES``. That covers copy-on-access (growth within epoch 1) and anything that
keeps growing across epochs (caches, leaked buffers or mappings: growth from epoch 1 to 3).

The parent of the workers is a fresh interpreter (``python -m test_memory``), not the pytest
process: a worker's allocator reuses free space in the pages it inherited, and so copies them,
as it allocates; how much depends on how fragmented its parent's heap was at fork, which in a
long pytest session depends on the tests that ran before (up to ~1.5 MiB was seen there). A
fresh parent makes the measurement independent of test order.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
from torch.utils.data import DataLoader

import fastdata
from conftest import finish, stop

COUNT = 60_000
BATCH = 64
# The bound, for each worker over 3 epochs of 60,000 samples. Measured on a busy 2-core machine
# (3 runs x 3 readers x 2 loaders): fastdata's readers grow by ~0.6 MiB with the standard
# DataLoader (its per-sample tensors and collate churn the allocator; one CI run saw 1.03 MiB)
# and ~0.2 MiB with fastdata.loader, almost all of it in epoch 1. A reader touching one Python
# object per sample grows far more, on top of that: a list of key strings (the ImageFolder
# pattern) by ~4.2 MiB per worker, a list of ints (> 256, so not the interpreter's shared small
# ints) by ~1.7 MiB.
BOUND_BYTES = 1 << 20
LOADER_BOUND_BYTES = {"fastdata.loader": BOUND_BYTES, "DataLoader": BOUND_BYTES * 3 // 2}
WARM_UP = 0.1
TESTS = Path(__file__).parent


class Tiny:
    """``COUNT`` 2x2 grayscale images (4 bytes each, so mapped data pages stay far under the
    bound), with the ``.data``/``.targets`` arrays that make conversion fast."""

    def __init__(self) -> None:
        self.data = (np.arange(COUNT * 4) % 251).astype(np.uint8).reshape(COUNT, 2, 2)
        self.targets = np.arange(COUNT) % 10

    def __len__(self) -> int:
        return COUNT

    def __getitem__(self, index: int):
        return self.data[index], int(self.targets[index])


def with_per_sample_keys(reader: type) -> type:
    """The regression this file guards against: per-sample Python strings, touched per read."""

    class KeyedReader(reader):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.keys = [f"train/n01440764/n01440764_{i:06d}.JPEG" for i in range(len(self))]

        def _read(self, indices: np.ndarray, allocate=None, *, pil=False):
            for index in indices.tolist():
                self.keys[index]  # what a path lookup or logging per sample does
            return super()._read(indices, allocate, pil=pil)

    return KeyedReader


MAP_STYLE = {"npy": fastdata.MemmapDataset, "hdf5": fastdata.HDF5Dataset, "tar": fastdata.TarIndexedDataset}
READERS = {**MAP_STYLE, "npy-with-keys": with_per_sample_keys(fastdata.MemmapDataset)}
LOADERS = ("fastdata.loader", "DataLoader")


def make_loader(dataset, kind: str) -> DataLoader:
    options = {"num_workers": 2, "persistent_workers": True, "multiprocessing_context": "fork"}
    if kind == "fastdata.loader":
        return fastdata.loader(dataset, batch_size=BATCH, shuffle=False, **options)
    return DataLoader(dataset, batch_size=BATCH, shuffle=False, **options)


def worker_uss(loader: DataLoader) -> list[list[int]]:
    """USS in bytes of each of the loader's 2 workers: rows after the warm-up, at the end of
    epoch 1 and at the end of epoch 3; one column per worker."""
    me = psutil.Process()
    before = {child.pid for child in me.children()}
    # The workers start with everything this process holds in the frozen generation, so their
    # garbage collector never walks (and so never copies) what they inherited: that one-off
    # copy, at a GC pass at a random time, is CPython's, not the reader's. It does not hide a
    # reader's per-sample objects: reading them still writes their reference counts.
    gc.collect()
    gc.freeze()
    try:
        batches = iter(loader)
        next(batches)
    finally:
        gc.unfreeze()
    for _ in range(int(len(loader) * WARM_UP)):
        next(batches)
    workers = [child for child in me.children() if child.pid not in before]
    if len(workers) != 2:
        raise RuntimeError(f"expected the loader's 2 workers as new children, found {workers}")

    def uss() -> list[int]:
        return [worker.memory_full_info().uss for worker in workers]

    history = [uss()]
    for _ in batches:
        pass
    history.append(uss())
    for _ in range(2):
        for _ in loader:
            pass
    history.append(uss())
    if not all(worker.is_running() for worker in workers):
        raise RuntimeError("a persistent worker exited between epochs")
    return history


def measured(process: subprocess.Popen) -> np.ndarray:
    """The :func:`worker_uss` history a measurement started by :func:`measuring` printed."""
    stdout, stderr = finish(process, timeout=900, what=f"the {' '.join(process.args[-2:])} measurement")
    assert process.returncode == 0, stderr
    return np.array(json.loads(stdout.splitlines()[-1]))


def growth_report(history: np.ndarray) -> str:
    kib = (history - history[0]) // 1024
    return f"USS growth per worker since the warm-up (KiB): end of epoch 1 {kib[1].tolist()}, epoch 3 {kib[2].tolist()}"


@pytest.fixture(scope="module")
def raw_datasets(tmp_path_factory) -> dict[str, Path]:
    """One raw dataset per format (raw: an encoded store's data file is memory-mapped, and its
    clean file pages count in USS at ~75 bytes per sample, which would measure the file, not
    the reader)."""
    root = tmp_path_factory.mktemp("memory")
    paths = {}
    for name in MAP_STYLE:
        paths[name] = root / name
        fastdata.convert(Tiny(), paths[name], format=name, store="raw", workers=0)
    return paths


CASES = [(name, kind) for name in sorted(MAP_STYLE) for kind in LOADERS] + [("npy-with-keys", "fastdata.loader")]


@pytest.fixture(scope="module")
def measuring(raw_datasets) -> dict[tuple[str, str], subprocess.Popen]:
    """Every (reader, loader) measurement of this module (this module run as a script in a fresh
    interpreter), all started at once: USS is per process, so running them side by side changes
    no figure, and they overlap instead of queueing."""
    running: dict[tuple[str, str], subprocess.Popen] = {}
    try:
        for reader, kind in CASES:
            running[reader, kind] = subprocess.Popen(
                [sys.executable, "-m", "test_memory", str(raw_datasets[reader.removesuffix("-with-keys")]), reader,
                 kind], cwd=TESTS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        yield running
    finally:
        for process in running.values():
            stop(process)


@pytest.mark.parametrize("kind", LOADERS)
@pytest.mark.parametrize("name", sorted(MAP_STYLE))
def test_workers_do_not_grow_over_three_epochs(measuring, name: str, kind: str) -> None:
    history = measured(measuring[name, kind])
    assert (history - history[0]).max() < LOADER_BOUND_BYTES[kind], growth_report(history)


def test_the_measurement_catches_a_reader_with_per_sample_python_objects(measuring) -> None:
    history = measured(measuring["npy-with-keys", "fastdata.loader"])
    assert (history[2] - history[0]).min() > 2 * BOUND_BYTES, growth_report(history)


if __name__ == "__main__":  # the measurement, in the fresh interpreter measuring() starts
    path, reader, kind = sys.argv[1:]
    print(json.dumps(worker_uss(make_loader(READERS[reader](path), kind))))
