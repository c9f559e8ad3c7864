"""What a ``process`` loader says when a worker fails: it raised (its traceback, and the exception
itself where it pickles), died (its exit code or signal; a SIGBUS names /dev/shm) or sent no batch
within ``timeout``. Each is a :class:`~fastdata.loading.base.WorkerError` naming the worker, the
batch and its indices (used by :mod:`fastdata.loading.processes`)."""

from __future__ import annotations

import pickle
import signal
from typing import Any

import numpy as np

from fastdata.loading.base import WorkerError, describe_indices
from fastdata.machine import shared_memory_free


def died(worker_id: int, process: Any, number: int, indices: np.ndarray) -> WorkerError:
    """Worker ``worker_id`` (``process``, exited) died while computing batch ``number``."""
    code = process.exitcode
    how = f"was killed by signal {signal.Signals(-code).name}" if code is not None and code < 0 else \
        f"exited with code {code}"
    fix = "If it ran out of memory, use fewer workers or smaller batches."
    free = shared_memory_free() if code == -signal.SIGBUS else None  # None: no /dev/shm to blame (macOS)
    if free is not None:  # what writing into a full /dev/shm does (where a slot could not be populated first)
        fix = (f"A worker gets SIGBUS when /dev/shm is full ({free // 2**20} MB free now): give the container "
               "more shared memory (docker run --shm-size=2g), use fewer workers or smaller batches, or use "
               "backend='thread'.")
    return WorkerError(
        f"process backend: worker {worker_id} (pid {process.pid}) {how} while computing batch {number} "
        f"(indices {describe_indices(indices)}). {fix}"
    )


def failed(worker_id: int, number: int, indices: np.ndarray, text: str, payload: bytes | None) -> WorkerError:
    """Worker ``worker_id`` raised on batch ``number`` (negative: in ``worker_init_fn``): ``text`` is
    its traceback, ``payload`` the pickled exception (None where it did not pickle)."""
    original = None
    if payload is not None:
        try:
            original = pickle.loads(payload)
        except Exception:  # noqa: BLE001 - the text below still says what happened
            original = None
    where = "in worker_init_fn" if number < 0 else f"on batch {number} (indices {describe_indices(indices)})"
    cause = f"{type(original).__name__}: {original}" if original is not None else text.splitlines()[-1]
    error = WorkerError(f"process backend: worker {worker_id} failed {where}: {cause}\n\n{text}")
    error.__cause__ = original
    return error


def timed_out(worker_id: int, process: Any, timeout: float, number: int, indices: np.ndarray) -> WorkerError:
    """Worker ``worker_id`` sent no batch within ``timeout`` seconds."""
    return WorkerError(
        f"process backend: worker {worker_id} (pid {process.pid}) sent no batch within "
        f"timeout={timeout} s; it was computing batch {number} (indices {describe_indices(indices)})."
    )
