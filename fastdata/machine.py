"""What this process may use of the machine: cores (affinity and cgroup quota), memory.

``os.cpu_count()`` counts the machine's cores; a container, a SLURM job or ``taskset`` may give
this process fewer. :func:`usable_cores` is what conversion pools and ``fastdata tune`` size
themselves by; results report both.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import math
import mmap
import os
import platform
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def affinity_cores() -> int:
    """Cores this process may run on (``sched_getaffinity``; ``os.cpu_count()`` where unknown)."""
    if hasattr(os, "sched_getaffinity"):
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except OSError:
            pass
    return os.cpu_count() or 1


def cgroup_cpu_quota(root: Path = _CGROUP_ROOT) -> float | None:
    """The CPU quota of this process's cgroup in cores (cgroup v2 ``cpu.max`` or v1
    ``cpu.cfs_quota_us``/``cpu.cfs_period_us``), or None when there is none."""
    for quota_file, period_file in (
        (root / "cpu.max", None),
        (root / "cpu" / "cpu.cfs_quota_us", root / "cpu" / "cpu.cfs_period_us"),
        (root / "cpu,cpuacct" / "cpu.cfs_quota_us", root / "cpu,cpuacct" / "cpu.cfs_period_us"),
    ):
        try:
            text = quota_file.read_text().split()
            if period_file is None:
                quota, period = text[0], text[1] if len(text) > 1 else "100000"
            else:
                quota, period = text[0], period_file.read_text().split()[0]
        except (OSError, IndexError):
            continue
        if quota in ("max", "-1"):
            return None
        try:
            cores = int(quota) / int(period)
        except (ValueError, ZeroDivisionError):
            continue
        return cores if cores > 0 else None
    return None


def usable_cores() -> int:
    """Cores this process can keep busy: the affinity mask, lowered to the cgroup quota
    (rounded up: a quota of 1.5 cores still runs two processes part of the time)."""
    cores = affinity_cores()
    quota = cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return cores


def spare_core(num_workers: int) -> bool:
    """Whether this process's workers, and those of the other ranks on this node (torchrun's
    ``LOCAL_WORLD_SIZE``), leave a core for each consumer to poll on."""
    try:
        local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local_ranks = 1
    return (num_workers + 1) * local_ranks <= usable_cores()


def machine_info() -> dict[str, Any]:
    """What every benchmark result reports about the machine it ran on."""
    import numpy
    import psutil
    import torch

    info = {
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cores(),
        "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": numpy.__version__,
    }
    try:
        import h5py

        info["h5py"] = h5py.__version__
    except ImportError:  # pragma: no cover - h5py is a dependency
        pass
    return info


# --- worker processes ---------------------------------------------------------------------

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while worker processes fork: a handler that raises during the fork
    (inside an at-fork hook) would have its exception dropped, and the signal lost. They are
    delivered, in the normal way, as soon as the block ends."""
    blockable = hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread()
    if blockable:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        if blockable:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def restart_calls_on_child_exit() -> None:
    """Have a child's exit (SIGCHLD) restart the system calls it interrupts, where a handler
    catches it (a DataLoader with workers installs one for the process): for workers that exit
    behind the training loop. A handler Python installs lets such calls fail with EINTR, which
    Python retries but C code need not: torch's shared-memory manager start (the first
    ``file_system`` share of a process) spins forever on one. Only SIGCHLD changes; waits that
    are never restarted (``poll``, ``select``) still return early, and the handler still runs."""
    handler = signal.getsignal(signal.SIGCHLD) if hasattr(signal, "SIGCHLD") else None
    if callable(handler):
        signal.siginterrupt(signal.SIGCHLD, False)


def die_with_parent() -> None:
    """Linux: have the kernel kill this process when its parent dies (even by SIGKILL)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def become_worker() -> None:
    """What every fastdata worker process does first: leave Ctrl-C to its parent (which stops
    it), take SIGTERM's default (how it is stopped), unblock the signals its parent held while
    forking it, and die with its parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    die_with_parent()


def preload_worker_imports() -> None:
    """Import here what every worker imports to seed itself (``numpy.random``, which numpy loads
    on first use; DataLoader workers seed it too), so that workers forked from this process
    inherit it instead of each importing it again every epoch (10-15 ms of each worker's start
    on a VM, before its first batch)."""
    import numpy.random  # noqa: F401


def release_free_memory() -> None:
    """Give the heap's free pages back to the OS (glibc ``malloc_trim``; nothing elsewhere).

    glibc keeps a large freed block in the heap after it has freed one that was mapped (its
    mmap threshold grows to that size), so a worker that built one batch on its heap (the first
    one, sent pickled before its slots exist) would hold that memory for its whole life."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


_TRIM: list[Any] = []


def _malloc_trim() -> Any:
    if not _TRIM:
        function = None
        if sys.platform.startswith("linux"):
            try:
                function = ctypes.CDLL(None).malloc_trim
                function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
            except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
                function = None
        _TRIM.append(function)
    return _TRIM[0]


# MADV_POPULATE_WRITE (Linux 5.14+): map a range's pages, allocating those not yet written, in one
# call. A page of shared memory written for the first time in a process's mapping otherwise costs
# a page fault even when the segment's memory exists (a kept segment, a new worker's mapping):
# 0.7-2.4 us each on a VM, 2,352 for a 9.6 MB slot (64 224x224 RGB images), against 0.4-0.6 ms
# for the slot in one call (docs/reading.md, "Backends"; page faults counted in tests/test_backends.py).
_MADV_POPULATE_WRITE = 23
_populate_works = sys.platform.startswith("linux")  # macOS has no such advice
_MADVISE: list[Any] = []


def _madvise() -> Any:
    if not _MADVISE:
        function = ctypes.CDLL(None, use_errno=True).madvise
        function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        function.restype = ctypes.c_int
        _MADVISE.append(function)
    return _MADVISE[0]


def populate(address: int, length: int, *, what: str = "a batch") -> bool:
    """Map the pages of ``[address, address + length)`` (a range of a shared-memory mapping of
    this process) for writing, in one call, before they are written: no page fault for each
    one. False where the kernel has no such call (Linux before 5.14, other systems) or it fails
    (the pages then fault in as they are written, as without it). Where /dev/shm has no room
    for them (writing would kill this process with SIGBUS), :class:`SharedMemoryFullError`
    (``what``: who needs the room, for its message)."""
    global _populate_works
    if not _populate_works or length <= 0:
        return False
    page = mmap.PAGESIZE
    start = address // page * page
    try:
        failed = _madvise()(start, address + length - start, _MADV_POPULATE_WRITE)
    except (AttributeError, OSError):  # pragma: no cover - a libc without madvise
        _populate_works = False
        return False
    if failed and ctypes.get_errno() == errno.EINVAL:  # a kernel without it: not asked again
        _populate_works = False
    elif failed and ctypes.get_errno() == errno.EFAULT:  # "a SIGBUS would have been generated": no room
        raise shared_memory_full(length, what)
    return not failed


SHM_DIR = "/dev/shm"


def shared_memory_free() -> int | None:
    """The bytes free in /dev/shm (None where there is none: macOS, Windows)."""
    try:
        stats = os.statvfs(SHM_DIR)
    except (OSError, AttributeError):
        return None
    return stats.f_bavail * stats.f_frsize


def shared_memory_full(needed: int, what: str, *, free: int | None = None) -> Any:
    """The :class:`~fastdata.errors.SharedMemoryFullError` for ``what`` (``"a batch"``, ``"a loader of
    2 workers (2 slots of 9.2 MB each)"``) that needs ``needed`` bytes of /dev/shm (Docker gives a
    container 64 MB), which has ``free`` bytes (measured now when not given). The free MB are
    rounded down and the needed up: never "has 10 MB free, ... needs 10 MB"."""
    from fastdata.errors import SharedMemoryFullError

    free = (shared_memory_free() or 0) if free is None else free
    return SharedMemoryFullError(
        f"/dev/shm has {free // 2**20} MB free, {what} needs {max(1, -(-needed // 2**20))} MB: give the "
        "container more shared memory (docker run --shm-size=2g), use fewer workers or smaller batches, or "
        "use backend='thread' (threads need no shared memory).")
