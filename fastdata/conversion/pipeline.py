"""The per-sample work of a conversion: decode, convert, resize and encode, in this process or a
process pool, yielding batches in source order (planned by :mod:`fastdata.conversion.plan`)."""

from __future__ import annotations

import dataclasses
import multiprocessing
import sys
import threading
from typing import Any, Iterator

import numpy as np
from PIL import Image, UnidentifiedImageError

from fastdata.errors import BadSampleError, RemoteError, ShapeMismatchError, SourceReadError, fix_option
from fastdata.fields import FieldError
from fastdata.fields.values import check_record
from fastdata.conversion.spatial import moves_with_image, store_field, transform_fields
from fastdata.images import (
    CHANNELS, TooManyPixelsError, disable_pillow_limit, encode, is_grayscale, open_image, pixels, to_mode,
)
from fastdata.formats.base import Batch, Plan
from fastdata.conversion.options import ConvertOptions
from fastdata.sources.imagefolder import printable
from fastdata.machine import become_worker, stop_signals_held
from fastdata.sources import ArraySource, Source
from fastdata.sources.parquet import CellError

_CHUNK_BYTES = 16 * 1024 * 1024


# --- per-sample work (runs in worker processes) -------------------------------------------


def _reason(exc: BaseException) -> str:
    if isinstance(exc, CellError):  # a table's cell: its column named before the reason
        return str(exc)
    if isinstance(exc, UnidentifiedImageError):
        return "not a recognised image file"
    if isinstance(exc, FileNotFoundError):
        return "file not found (broken symlink?)"
    if isinstance(exc, (Image.DecompressionBombError, TooManyPixelsError)):
        return str(exc)
    text = " ".join(str(exc).split()) or type(exc).__name__  # one line (pyarrow's and others' texts span several)
    if "truncated" in text.lower():  # Pillow says this several ways ("Truncated File Read", ...)
        return "image file is truncated"
    return text[:200]


def with_mode(plan: Plan, mode: str) -> Plan:
    """``plan`` in another mode (its raw shape gets that mode's channels)."""
    shape = (*plan.shape[:2], CHANNELS[mode]) if plan.shape else None
    return dataclasses.replace(plan, mode=mode, channels=CHANNELS[mode], shape=shape)


class ModeConflict(Exception):
    """Auto mode planned grayscale, but a colour image came up: the conversion restarts as RGB."""


class Job:
    """The per-sample work of one conversion; pickled once into each worker process."""

    def __init__(self, src: Source, plan: Plan | None, options: ConvertOptions, *, reference: int = 0,
                 gray_guess: bool = False, reference_name: str | None = None):
        self.src = src
        self.plan = plan
        self.options = options
        self.reference = reference  # the sample whose size raw storage adopted
        self.reference_name = reference_name  # its name, for a job that runs on a slice of the source
        self.gray_guess = gray_guess

    def on(self, src: Source, *, mode: str | None = None) -> "Job":
        """This job's work on ``src`` (a slice of the source, see :meth:`Source.take`), optionally
        in another mode (``"RGB"`` after auto mode met a colour image: no more guessing)."""
        plan = self.plan if mode is None else with_mode(self.plan, mode)
        name = self.reference_name or (self.src.sample_name(self.reference) if self.src is not None else None)
        return Job(src, plan, self.options, reference=self.reference, reference_name=name,
                   gray_guess=self.gray_guess and mode is None)

    def fail(self, index: int, exc: BaseException, stage: str) -> BadSampleError:
        """The error for a sample that failed while reading its header (``stage="read"``) or
        decoding it (``"decode"``); dataset sources fail while loading the sample either way."""
        image = getattr(getattr(self.src, "image", None), "name", None)  # a table's image column
        if isinstance(exc, CellError) and exc.column != image:  # a table's other column: not the image's fault
            what = "cannot convert sample"
        else:
            what = f"cannot {stage} image" if self.src.has_files else "cannot load sample"
        return BadSampleError(
            f"{self.src.sample_name(index)}: {what} ({_reason(exc)}). Re-run with {fix_option('skip_bad')} to leave it out."
        )

    def _check_mode(self, image: Image.Image) -> None:
        if self.gray_guess and not is_grayscale(image.mode):
            raise ModeConflict()

    def sample(self, index: int) -> tuple[int, Any]:
        if self.plan.encoding == "original":
            return int(self.src.labels[index]), self._payload(index, None)
        image, label = self.src.load(index, self.options.read)
        self._check_mode(image)
        return label, self._payload(index, image)

    def _payload(self, index: int, image: Image.Image | None) -> Any:
        """The image as the plan stores it: the source's own bytes (decoded fully: a corrupt file
        fails now, not in training), re-encoded bytes, or raw pixels of the planned shape."""
        plan = self.plan
        if plan.encoding == "original":
            data = self.src.file_bytes(index)
            self._check_mode(open_image(data, self.options.max_pixels))
            return data
        image = plan.geometry.apply(to_mode(image, plan.mode))
        if plan.store == "encoded":
            return encode(image, plan.encoding, plan.jpeg_quality)
        array = pixels(image)
        if array.shape != plan.shape:
            self._mismatch(index, array.shape)
        return array

    def sample_record(self, index: int) -> tuple[int, Any, dict[str, bytes]]:
        """A sample with fields (``plan.schema``): its label, image payload (as :meth:`sample`)
        and every extra field's stored bytes, checked against the schema; spatial fields get the
        image's geometry (:func:`fastdata.conversion.spatial.transform_fields`). The image comes
        first: where images differ in size, that is what an error names, not a mask of its size."""
        plan, schema, name = self.plan, self.plan.schema, self.src.sample_name(index)
        values = check_record(schema, self.src.load_record(index, self.options.read), name)
        image_field, label_field = schema.image, schema.label
        image = values[image_field.name]
        label = values[label_field.name] if label_field is not None else -1
        self._check_mode(image)
        payload = self._payload(index, image)
        extras = plan.extras
        if moves_with_image(extras):
            values = transform_fields(schema, values, image.size, plan.geometry, name)
        stored = {f.name: self.src.field_bytes(index, f.name) if f.encoding == "original"
                  else store_field(f, values[f.name], plan, name) for f in extras}
        return label, payload, stored

    def _mismatch(self, index: int, shape: tuple[int, ...]) -> None:
        height, width = self.plan.shape[:2]
        raise ShapeMismatchError(
            f"{self.src.sample_name(index)} is {shape[0]}x{shape[1]} (HxW) but "
            f"{self.reference_name or self.src.sample_name(self.reference)} is {height}x{width}; raw storage needs one "
            f"image size. Use {fix_option('resize', 'HxW')}, or {fix_option('resize', 'S')} with "
            f"{fix_option('center_crop', 'HxW')}, or {fix_option('store', 'encoded')}."
        )

    def chunk(self, indices: list[int]) -> Batch:
        keys, labels, payloads, skipped = [], [], [], []
        raw = self.plan.store == "raw"
        images = np.empty((len(indices), *self.plan.shape), dtype=np.uint8) if raw else None
        extras = self.plan.extras
        fields: dict[str, list[bytes]] | None = {f.name: [] for f in extras} if self.plan.schema is not None else None
        for index in indices:
            try:
                if fields is None:
                    label, payload = self.sample(index)
                else:
                    label, payload, stored = self.sample_record(index)
            except (ShapeMismatchError, ModeConflict, SourceReadError, RemoteError):  # not the sample's fault
                raise
            except FieldError as exc:
                if not self.options.skip_bad:
                    raise
                skipped.append((index, {"key": printable(self.src.keys[index]), "reason": str(exc)[:200]}))
                continue
            except Exception as exc:
                if not self.options.skip_bad:
                    raise self.fail(index, exc, "decode") from exc
                skipped.append((index, {"key": printable(self.src.keys[index]), "reason": _reason(exc)}))
                continue
            if raw:
                images[len(keys)] = payload  # straight into the batch: no list, no stack
            else:
                payloads.append(payload)
            keys.append(self.src.keys[index])
            labels.append(label)
            if fields is not None:
                for name, data in stored.items():
                    fields[name].append(data)
        batch = Batch(keys=keys, labels=np.asarray(labels, dtype=np.int64), skipped=skipped, fields=fields)
        if raw:
            batch.images = images[: len(keys)]
        else:
            batch.blobs = payloads
        return batch

    def array_chunk(self, start: int, stop: int) -> Batch:
        """Vectorised raw read of ``.data`` rows for array sources (no PIL, no pool)."""
        images = self.src.data[start:stop]
        if images.ndim == 3:
            images = images[:, :, :, None]
        if images.shape[3] != self.plan.channels:
            images = np.repeat(images, self.plan.channels, axis=3)
        return Batch(
            keys=self.src.keys[start:stop],
            labels=self.src.labels[start:stop].copy(),
            images=np.ascontiguousarray(images),
        )


_WORKER_JOB: Job | None = None


def _init_worker(job: Job) -> None:
    global _WORKER_JOB
    become_worker()
    _one_torch_thread()
    disable_pillow_limit()
    _WORKER_JOB = job


def _one_torch_thread() -> None:
    """torch on one intra-op thread in this worker, as in the loader's workers: the pool forks
    after the parent may have run an OpenMP region (reading the first sample of a Dataset that
    uses torch ops), and libgomp's threads do not survive a fork (its next parallel region waits
    for them for ever); one thread runs no region. torch not imported: nothing to do."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def _worker_chunk(indices: list[int]) -> Batch:
    return _WORKER_JOB.chunk(indices)


POOL_STOP_WAIT_S = 30  # the longest a stopping pool's handler threads are waited for


def stop_pool(pool: Any) -> None:
    """Terminate ``pool`` and wait (bounded) for its handler threads. CPython's ``Pool.terminate``
    can hang for ever: a worker killed while it held the result queue's lock (mid-way through
    sending a large batch) never releases it, and the task handler then blocks on that lock
    when it sends its sentinel. The workers are killed before that wait, so giving up on the
    (daemon) handler threads after ``POOL_STOP_WAIT_S`` leaves no process running."""
    stopper = threading.Thread(target=lambda: (pool.terminate(), pool.join()), daemon=True,
                               name="fastdata-pool-stop")
    stopper.start()
    stopper.join(POOL_STOP_WAIT_S)


class WorkerPool:
    """A process pool running one conversion's job, or the job in-process when workers <= 1."""

    def __init__(self, job: Job, workers: int, count: int):
        self.job = job
        self.count = count
        self.workers = workers
        self.pool = None

    def __enter__(self) -> "WorkerPool":
        if self.workers > 1 and self.count > 64:
            self.job.src.forget()  # the probe's rows: neither kept by this process nor inherited
            with stop_signals_held():
                self.pool = multiprocessing.get_context().Pool(self.workers, _init_worker, (self.job,))
        return self

    def __exit__(self, *exc_info) -> None:
        if self.pool is not None:
            stop_pool(self.pool)

    def convert(self, indices: list[int], size: int) -> Iterator[Batch]:
        return self.convert_chunks(split(indices, size))

    def convert_chunks(self, chunks: list[list[int]]) -> Iterator[Batch]:
        """Each chunk of source indices converted as one batch, in order."""
        if self.pool is None:
            return map(self.job.chunk, chunks)
        return self.pool.imap(_worker_chunk, chunks)


def split(indices: list[int], size: int) -> list[list[int]]:
    return [indices[i : i + size] for i in range(0, len(indices), size)]


def chunk_size(plan: Plan, count: int, workers: int) -> int:
    per_image = int(np.prod(plan.shape)) if plan.shape else 64 * 1024
    by_bytes = max(1, _CHUNK_BYTES // per_image)
    by_balance = max(1, count // (max(workers, 1) * 8))
    return max(1, min(256, by_bytes, by_balance))


def is_array_copy(job: Job) -> bool:
    """Whether the job's batches are rows of the source's array, copied without the pool."""
    plan, src = job.plan, job.src
    return isinstance(src, ArraySource) and plan.store == "raw" and plan.geometry.is_identity and (
        plan.mode == src.native_mode or src.native_mode == "L")


def batches(job: Job, pool: WorkerPool, start: int = 0, stop: int | None = None) -> Iterator[tuple[Batch, int]]:
    """Converted batches in source order from index ``start`` (to ``stop``), each with the next index."""
    plan, src = job.plan, job.src
    stop = len(src) if stop is None else stop
    if is_array_copy(job):
        step = max(1, _CHUNK_BYTES // int(np.prod(plan.shape)))
        for first in range(start, stop, step):
            last = min(first + step, stop)
            yield job.array_chunk(first, last), last
        return
    indices = list(range(start, stop))
    size = chunk_size(plan, len(indices), pool.workers)
    for number, batch in enumerate(pool.convert(indices, size)):
        yield batch, min(start + (number + 1) * size, stop)
