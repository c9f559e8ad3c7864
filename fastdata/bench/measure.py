"""Measuring one configuration (runs in its own process, forked from a clean parent).

Per epoch: samples/s, time to first batch, the share of loop time spent waiting for data,
CPU seconds of the main process and its DataLoader workers, and the peak USS/PSS (unique /
proportional set size: RSS double-counts shared pages and memory maps) of all of them.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from typing import Any, Callable

import psutil
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from fastdata.bench.config import BenchConfig, Case
from fastdata.bench.timing import time_epoch
from fastdata.errors import InvalidOptionError
from fastdata.extras import require

# Reading a torch process's smaps costs ~10 ms of kernel time: sampled in an untimed epoch,
# from when the first batch arrives (workers are up), then every 0.1 s.
MEMORY_INTERVAL_S = 0.1
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def make_transform(config: BenchConfig, size: tuple[int, int] | None, *, resize: bool) -> Callable | None:
    """The per-sample torchvision.transforms.v2 pipeline for ``--transform`` (and ``--resize``)."""
    if config.transform not in ("none", "normalize", "augment"):  # an import string: the user's own
        from fastdata.importing import load_callable

        return load_callable(config.transform, what="--transform")
    if config.transform == "none" and not resize:
        return None
    require("torchvision", extra="torchvision", feature="bench --transform/--resize")
    from torchvision.transforms import v2  # here: torchvision is optional (the line above says how to install it)
    steps: list[Any] = []
    if config.transform == "augment":
        if size is None:
            raise InvalidOptionError("--transform augment needs an image size: pass --resize HxW.")
        steps += [v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()]
    elif resize and size is not None:
        steps.append(v2.Resize(size, antialias=True))
    if config.transform in ("normalize", "augment"):
        steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    return v2.Compose(steps) if steps else None


def evict_from_page_cache(files: tuple[str, ...]) -> None:
    """``--cache cold``: drop these files' pages (fsync, then POSIX_FADV_DONTNEED); nothing else."""
    if not hasattr(os, "posix_fadvise"):
        raise InvalidOptionError(
            "--cache cold needs os.posix_fadvise, which this OS does not have. Use --cache warm."
        )
    for name in files:
        descriptor = os.open(name, os.O_RDONLY)
        try:
            os.fsync(descriptor)
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def shared_memory_bytes() -> int:
    """The machine's shared memory in use (``Shmem`` of ``/proc/meminfo``: ``/dev/shm``, memfd;
    0 where the OS does not say)."""
    return int(getattr(psutil.virtual_memory(), "shared", 0) or 0)


class MemoryPeak:
    """Samples USS and PSS of this process plus all its children in a background thread, and
    the machine's shared memory above what it was at the start (``peak_shm``).

    PSS counts a shared-memory page only in processes that have it mapped and touched: a
    DataLoader worker unmaps a batch once it is sent, and the main process maps it without
    touching it until the loop reads it, so batches in flight can be in no process's PSS.
    ``peak_shm`` counts them; it is machine-wide, so other programs' shared memory shows too.

    Sampling starts at :meth:`start_sampling` (called when the first batch arrives)."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.peak_uss = self.peak_pss = self.peak_shm = 0
        self.samples = 0
        self._shm_base = shared_memory_bytes()
        self._stop = threading.Event()
        self._go = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start_sampling(self) -> None:
        self._go.set()

    def sample(self) -> None:
        uss = pss = 0
        for process in [self.process, *self.process.children(recursive=True)]:
            try:
                info = process.memory_full_info()
            except (psutil.Error, OSError):
                continue
            uss += info.uss
            pss += getattr(info, "pss", info.uss)
        self.peak_uss, self.peak_pss = max(self.peak_uss, uss), max(self.peak_pss, pss)
        self.peak_shm = max(self.peak_shm, shared_memory_bytes() - self._shm_base)
        self.samples += 1

    def _run(self) -> None:
        self._go.wait()
        while True:  # at least one sample once started, however short the epoch
            self.sample()
            if self._stop.wait(MEMORY_INTERVAL_S):
                break

    def __enter__(self) -> "MemoryPeak":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if not self._go.is_set():  # no batch came: sample once now
            self.sample()
        self._go.set()
        self._thread.join()


class CpuClock:
    """CPU seconds of this process and its children (live ones and those already reaped)."""

    def __init__(self) -> None:
        self.process = psutil.Process()

    def read(self) -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
        live = 0.0
        for child in self.process.children(recursive=True):
            try:
                times = child.cpu_times()
                live += times.user + times.system
            except psutil.Error:
                continue
        return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime + live


def make_dataset(case: Case, config: BenchConfig, image_size: tuple[int, int] | None) -> Dataset:
    from fastdata.formats import get_format
    from fastdata.sources import torchvision_dataset

    if "dataset" in case.dataset_kwargs:  # fastdata.sweep: the user's own Dataset, as it is
        return case.dataset_kwargs["dataset"]
    resize = config.resize is not None and (case.store != "raw")
    transform = make_transform(config, image_size, resize=resize)
    if case.format == "torchvision":
        from torchvision.transforms.v2.functional import pil_to_tensor

        steps = [pil_to_tensor] + ([transform] if transform else [])
        options = dict(case.dataset_kwargs)
        name = options.pop("name")
        extra = dict(options.pop("options") or {}, transform=TransformChain(steps))
        return torchvision_dataset(name, options=extra, **options)
    spec = get_format(case.format)
    kwargs = dict(case.dataset_kwargs)
    if case.path == "fast" and issubclass(spec.dataset, IterableDataset):
        kwargs["batch_size"] = config.batch_size  # the reader collates each batch itself
    return spec.dataset(case.dataset_path, transform=transform, **kwargs)


class TransformChain:
    """Picklable composition of callables (for spawn workers)."""

    def __init__(self, steps: list[Callable]):
        self.steps = steps

    def __call__(self, value: Any) -> Any:
        for step in self.steps:
            value = step(value)
        return value


def make_loader(dataset: Dataset, case: Case, config: BenchConfig) -> DataLoader:
    from fastdata.loading import loader

    kwargs: dict[str, Any] = {"num_workers": case.num_workers, "pin_memory": config.pin_memory}
    if case.backend == "auto":  # the auto row (fastdata.bench.autorow): the loader picks its workers
        kwargs.update(num_workers="auto", **({"multiprocessing_context": config.start_method}
                                             if config.start_method else {}))
    elif case.num_workers > 0:
        kwargs["persistent_workers"] = config.persistent_workers
        kwargs["prefetch_factor"] = config.prefetch_factor
        if config.start_method:
            kwargs["multiprocessing_context"] = config.start_method
    if getattr(dataset, "schema", None) is not None and case.path != "fast":
        from fastdata.reader.records import collate  # samples with fields: variable ones (boxes, text) as lists

        kwargs["collate_fn"] = collate
    if case.path == "fast" and isinstance(dataset, IterableDataset):
        return DataLoader(dataset, batch_size=None, **kwargs)
    if case.path == "fast":
        return loader(dataset, batch_size=config.batch_size, shuffle=True, seed=0, backend=case.backend, **kwargs)
    if case.path == "stream" or isinstance(dataset, IterableDataset):
        return DataLoader(dataset, batch_size=config.batch_size, **kwargs)
    if case.path == "transfer":
        return DataLoader(dataset, batch_size=None, **kwargs)
    return DataLoader(dataset, batch_size=config.batch_size, shuffle=True, **kwargs)


def run_epoch(loader: DataLoader, config: BenchConfig, case: Case,
              on_first: Callable[[], None] | None = None) -> dict[str, Any]:
    """One full, timed pass (memory is sampled apart: its cost would distort timings);
    ``on_first`` is called when the first batch arrives."""
    if config.cache == "cold":
        evict_from_page_cache(case.files)
    clock = CpuClock()
    cpu_start = clock.read()
    timing = time_epoch(loader, step_s=config.step_ms / 1000, on_first=on_first, step=config.step_function())
    cpu_s = clock.read() - cpu_start
    elapsed = timing.seconds
    return {
        "samples_per_s": timing.samples_per_s,
        "first_batch_s": timing.first_batch_s,
        "wait_fraction": min(1.0, timing.waited_s / elapsed) if elapsed > 0 else 0.0,  # sums of intervals may round up
        "cpu_s": cpu_s,
        "samples": timing.samples,
        "batches": timing.batches,
        "epoch_s": elapsed,
    }


def sample_memory(loader: DataLoader, config: BenchConfig, case: Case) -> MemoryPeak:
    """Peak memory over untimed epochs lasting at least ``config.memory_s`` in all (default
    :data:`~fastdata.bench.config.MEMORY_MIN_S`; 0: one epoch): with samples every
    ``MEMORY_INTERVAL_S``, a single short epoch would be seen once or twice, which always catches
    memory a loader keeps and rarely the batches that come and go."""
    with MemoryPeak() as sampler:
        started = time.perf_counter()
        while True:
            run_epoch(loader, config, case, on_first=sampler.start_sampling)
            if time.perf_counter() - started >= config.memory_s:
                return sampler


def run_case(case: Case, config: BenchConfig, image_size: tuple[int, int] | None) -> list[dict[str, Any]]:
    """Warm-up epochs, then measured epochs: one row each."""
    torch.manual_seed(0)
    if case.path == "transfer":  # bench's probe (a shape) or sweep's (ready copies of a real batch)
        kwargs = case.dataset_kwargs
        dataset = kwargs["dataset"] if "dataset" in kwargs else TransferProbe(**kwargs)
        getattr(dataset, "prepare", lambda: None)()  # read its batch here, before any worker forks
    else:
        dataset = make_dataset(case, config, image_size)
    loader = make_loader(dataset, case, config)
    plan = getattr(getattr(dataset, "decoder", None), "plan", None)
    rows = []
    for epoch in range(config.warmup + config.epochs):
        if case.remote == "cold":  # a URL read from an empty cache: every shard downloaded while it is decoded
            dataset.files.drop()
        row = run_epoch(loader, config, case)
        rows.append({"epoch": epoch, "warmup": epoch < config.warmup, **row,
                     "fused_decode": plan.kind if plan is not None else None})
    from fastdata.bench.autorow import tuning_fields

    tuned = tuning_fields(loader)  # the auto row: what it chose in the timed epochs
    for row in rows:
        row.update(tuned)
    # peak memory comes from more, untimed epochs: sampling smaps costs ~10 ms per process
    sampled = sample_memory(loader, config, case)
    getattr(loader, "close", lambda: None)()
    for row in rows:
        row.update(uss_mb=sampled.peak_uss / 2**20, pss_mb=sampled.peak_pss / 2**20,
                   shm_mb=sampled.peak_shm / 2**20)
    return rows


class TransferProbe(Dataset):
    """A trivial dataset returning a new, unfilled batch per index: what remains is the cost of
    moving a batch out of a worker (a new tensor each time, as a real batch is: one tensor sent
    twice would already sit in shared memory and cost nothing the second time)."""

    def __init__(self, batches: int, shape: list[int]):
        self.batches = batches
        self.shape = tuple(shape)

    def __len__(self) -> int:
        return self.batches

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.empty(self.shape, dtype=torch.uint8), torch.empty(self.shape[0], dtype=torch.int64)
