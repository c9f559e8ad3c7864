"""Shared memory for the ``process`` backend: named segments, the sweep of segments a killed
process left behind, and packing a batch into a slot (and back).

A segment is ``/dev/shm/fastdata_<ns>_<pid>_<token>``: ``<pid>`` is the main process that created
it, ``<ns>`` its PID namespace (the inode of ``/proc/self/ns/pid``, in hex; left out where there
is none). The main process creates and unlinks every segment; workers only attach. A main
process killed before it could unlink leaves its segments behind; the next loader that starts
removes every segment of its own PID namespace whose process no longer exists
(:func:`sweep_stale_segments`). Where /dev/shm is shared across PID namespaces (containers run
with ``--ipc=host``, pods sharing /dev/shm) a pid means another process in each, so the
segments of other namespaces are never touched.

A batch is packed by walking its structure (tuples, lists, dicts): every tensor or numpy array
is placed in the slot (where it already lives when the dataset wrote it there through the
slot's allocator; copied otherwise, in its own memory order), and replaced by a small
:class:`_Leaf` that records where. What remains (the structure, labels that are not arrays,
strings) is pickled: a few hundred bytes, not the pixels. Read back (:func:`unpack`), its arrays
are copied out, views of the slot, or lent: views through one ``ctypes`` object over the slot,
which numpy names as every view's base, so a weakref on it says when the last of them is gone.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import math
import mmap
import os
import pickle
import secrets
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from fastdata.machine import SHM_DIR, shared_memory_free, shared_memory_full

try:  # POSIX shared memory, the module multiprocessing.shared_memory itself uses
    import _posixshmem
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

PREFIX = "fastdata_"
ALIGN = 64
_SHM_DIR = Path(SHM_DIR)


class Segment:
    """A named POSIX shared-memory segment mapped into this process.

    Unlike ``multiprocessing.shared_memory.SharedMemory`` it never reports to Python's resource
    tracker (which before 3.13 tracks every attach too, and warns about or unlinks segments it
    did not create; fastdata removes its segments itself and sweeps those of killed processes),
    and dropping it never raises while views of it are alive: the mapping goes with the last view.
    """

    def __init__(self, name: str, *, create: bool = False, size: int = 0):
        if _posixshmem is None:  # pragma: no cover - Windows
            from fastdata.errors import DependencyMissingError

            raise DependencyMissingError(
                "backend='process' needs POSIX shared memory (Linux, macOS). Use backend='thread' or 'torch'."
            )
        self.name = name
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        descriptor = _posixshmem.shm_open("/" + name, flags, mode=0o600)
        try:
            if create:
                os.ftruncate(descriptor, max(size, 1))
            self.size = os.fstat(descriptor).st_size
            self.map = mmap.mmap(descriptor, self.size)
        finally:
            os.close(descriptor)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.map))  # (the export goes at once)

    @property
    def buf(self) -> mmap.mmap:
        return self.map

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:
            pass  # views remain (tensors handed out with zero_copy): the mapping goes with them


def new_segment(size: int) -> Segment:
    """A new segment of ``size`` bytes named after this process."""
    return Segment(f"{segment_prefix()}{secrets.token_hex(6)}", create=True, size=size)


def pid_namespace() -> str | None:
    """This process's PID namespace: the inode of ``/proc/self/ns/pid`` in hex (None without /proc)."""
    try:
        return f"{os.stat('/proc/self/ns/pid').st_ino:x}"
    except OSError:
        return None


def segment_prefix(pid: int | None = None) -> str:
    """How the names of the segments of process ``pid`` (this one by default) of this PID namespace begin."""
    namespace = pid_namespace()
    return f"{PREFIX}{'' if namespace is None else namespace + '_'}{os.getpid() if pid is None else pid}_"


def owner(name: str) -> tuple[str | None, int] | None:
    """The PID namespace (None: not recorded) and pid of the process that created segment ``name``;
    None for a name fastdata does not make."""
    if not name.startswith(PREFIX):
        return None
    parts = name[len(PREFIX):].split("_")
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0], int(parts[1])
    if len(parts) == 2 and parts[0].isdigit():
        return None, int(parts[0])
    return None


def check_room(needed: int, what: str) -> None:
    """Refuse, with :class:`~fastdata.errors.SharedMemoryFullError`, ``needed`` bytes of segments
    that /dev/shm has no room for (``what`` needs them): written, they would kill with SIGBUS."""
    free = shared_memory_free()
    if free is not None and needed > free:
        raise shared_memory_full(needed, what, free=free)


def written_bytes(name: str) -> int:
    """The bytes of /dev/shm that segment ``name`` takes now: its pages written so far (0 where it
    cannot be told)."""
    try:
        return os.stat(_SHM_DIR / name).st_blocks * 512
    except (OSError, AttributeError):
        return 0


def attach(name: str) -> Segment:
    return Segment(name)


def unlink_name(name: str) -> None:
    """Remove a segment's name (its memory stays while some process maps it)."""
    if _posixshmem is None:  # pragma: no cover
        return
    try:
        _posixshmem.shm_unlink("/" + name.lstrip("/"))
    except FileNotFoundError:
        pass


def release(segment: Segment, *, unlink: bool) -> None:
    """Unlink (the name disappears at once; the memory stays while mapped) and unmap when no
    view of it is left."""
    if unlink:
        unlink_name(segment.name)
    segment.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_segments(directory: Path = _SHM_DIR) -> list[str]:
    """Names of the fastdata segments of this PID namespace whose creating process is gone (a pid
    of another namespace says nothing here: its segments are left alone, as are those of a name
    that records none, where this process has one)."""
    if not directory.is_dir():
        return []
    namespace = pid_namespace()
    stale = []
    for entry in directory.iterdir():
        created = owner(entry.name)
        if created is not None and created[0] == namespace and not _alive(created[1]):
            stale.append(entry.name)
    return stale


def sweep_stale_segments(directory: Path = _SHM_DIR) -> list[str]:
    """Remove the segments of processes that died without cleaning up; their names."""
    removed = []
    for name in stale_segments(directory):
        unlink_name(name)
        removed.append(name)
    return removed


# --- a batch in a slot -------------------------------------------------------------------------


class _Leaf(tuple):
    """Where one array of a packed batch lies in its slot: ``(kind, dtype, offset, count,
    shape, inverse)`` -- ``shape`` of its memory in storage order, ``inverse`` the permutation
    back to the array's own order (None: none). A tuple subclass: cheap to pickle."""

    __slots__ = ()


@functools.lru_cache(maxsize=256)  # a loader sees a handful of layouts: the batch's, the last batch's
def _storage_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...] | None:
    """The permutation that makes an array with these strides C-contiguous, or None when it is
    not dense (overlapping or with gaps)."""
    order = tuple(sorted(range(len(shape)), key=lambda d: (-strides[d], d)))
    expected = 1
    for dim in reversed(order):
        if shape[dim] != 1 and strides[dim] != expected:
            return None
        expected *= shape[dim]
    return order


@functools.lru_cache(maxsize=64)
def _inverse(order: tuple[int, ...]) -> tuple[int, ...] | None:
    """The permutation that undoes ``order`` (None for the identity)."""
    inverse = tuple(sorted(range(len(order)), key=order.__getitem__))
    return None if inverse == tuple(range(len(order))) else inverse


class SlotWriter:
    """Packs batches into one slot: ``buffer`` is the slot's bytes (a numpy uint8 view)."""

    def __init__(self, buffer: np.ndarray):
        self.buffer = buffer
        self.base = buffer.__array_interface__["data"][0]
        self.size = len(buffer)
        self.used = 0

    def allocate(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray | None:
        """A new C-contiguous array in the slot (None when it does not fit): for datasets that
        can write a batch straight into shared memory."""
        reserved = self._reserve(shape, dtype)
        return None if reserved is None else reserved[0]

    def _reserve(self, shape: tuple[int, ...], dtype: Any) -> tuple[np.ndarray, int] | None:
        """:meth:`allocate`'s array and its offset in the slot."""
        dtype = np.dtype(dtype)
        size = math.prod(shape) * dtype.itemsize
        start = -(-self.used // ALIGN) * ALIGN
        if start + size > self.size:
            return None
        self.used = start + size
        return self.buffer[start : start + size].view(dtype).reshape(shape), start

    def pack(self, batch: Any) -> bytes | None:
        """The pickled structure of ``batch`` with every array placed in the slot; None when the
        arrays do not fit (the caller sends the batch another way)."""
        try:
            structure = rebuilt(batch, self._place)
        except _NoRoom:
            return None
        return pickle.dumps(structure, protocol=pickle.HIGHEST_PROTOCOL)

    def _place(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and not value.requires_grad:
            return self._place_array(value.detach().numpy() if value.dtype != torch.bfloat16 else None, value)
        if isinstance(value, np.ndarray) and value.dtype != object:
            return self._place_array(value, None)
        return value

    def _place_array(self, array: np.ndarray | None, tensor: torch.Tensor | None) -> Any:
        # runs once per array per batch, in the worker's critical path: no ctypes, cached layouts
        if array is None:  # a dtype numpy cannot hold: leave it to pickling
            return tensor
        kind = "tensor" if tensor is not None else "numpy"
        order = _storage_order(array.shape, array.strides) if array.size else tuple(range(array.ndim))
        if order is None:  # not dense: copied into the slot below
            dense, order = np.ascontiguousarray(array), tuple(range(array.ndim))
        else:
            dense = array.transpose(order)  # C-contiguous by construction
        start = dense.__array_interface__["data"][0] - self.base
        if not (array.size and 0 <= start and start + dense.nbytes <= self.size):
            reserved = self._reserve(dense.shape, dense.dtype)
            if reserved is None:
                raise _NoRoom
            target, start = reserved
            np.copyto(target, dense)
        # else: written there by the dataset, nothing to copy
        return _Leaf((kind, dense.dtype.str, start, dense.size, dense.shape, _inverse(order)))


class _NoRoom(Exception):
    pass


def rebuilt(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` with ``leaf`` applied to all that is not a tuple, list or dict (a packed
    :class:`_Leaf` counts as a leaf), the containers rebuilt around the results: the one walk over
    a batch's structure, packing and unpacking it."""
    if isinstance(value, tuple) and not isinstance(value, _Leaf):
        return tuple(rebuilt(item, leaf) for item in value)
    if isinstance(value, list):
        return [rebuilt(item, leaf) for item in value]
    if isinstance(value, dict):
        return {key: rebuilt(item, leaf) for key, item in value.items()}
    return leaf(value)


LEND_MIN_BYTES = 64 * 1024  # smaller arrays (labels, ids) are copied even when a batch is lent


@functools.lru_cache(maxsize=16)
def _slot_type(size: int) -> type:
    return ctypes.c_char * size


class Unpacked:
    """A batch read back from its slot: ``batch``, and ``lease`` -- when the batch was lent, the
    object its arrays keep alive (it goes when the last of them goes: watch it with a weakref),
    else None."""

    __slots__ = ("batch", "lease")

    def __init__(self, batch: Any, lease: Any):
        self.batch, self.lease = batch, lease


class Leases:
    """Slots lent to the training loop (keys such as ``(worker, slot)``), watched through weakrefs
    to their leases (:attr:`Unpacked.lease`). A callback runs in whichever thread drops a batch's
    last tensor; it only appends to ``returned``, which the consumer drains."""

    def __init__(self) -> None:
        self.watched: dict[tuple[int, int], Any] = {}
        self.returned: collections.deque = collections.deque()

    def watch(self, key: tuple[int, int], lease: Any) -> None:
        self.watched[key] = weakref.ref(lease, functools.partial(self._dropped, key))

    def _dropped(self, key: tuple[int, int], _ref: Any) -> None:
        self.returned.append(key)

    def drain(self) -> Iterator[tuple[int, int]]:
        while self.returned:
            key = self.returned.popleft()
            self.watched.pop(key, None)
            yield key


def unpack(header: bytes, buffer: Any, base: int, size: int, *, mode: str,
           allocate: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Unpacked:
    """The batch packed by :meth:`SlotWriter.pack` into the slot of ``size`` bytes at ``base`` of
    ``buffer``. ``mode`` is ``"copy"`` (arrays copied out; tensors into ``allocate(like)`` when
    given, e.g. pinned memory), ``"view"`` (views of the slot) or ``"lend"`` (arrays of at least
    ``LEND_MIN_BYTES`` are views that keep a lease on the slot, smaller ones are copied)."""
    structure = pickle.loads(header)
    reader = _SlotReader(buffer, base, size, mode, allocate)
    batch = rebuilt(structure, reader.restore)
    return Unpacked(batch, reader.lease)


class _SlotReader:
    def __init__(self, buffer: Any, base: int, size: int, mode: str, allocate: Any):
        self.buffer, self.base, self.size, self.mode, self.allocate = buffer, base, size, mode, allocate
        self.lease = None

    def restore(self, value: Any) -> Any:
        return self._array(*value) if isinstance(value, _Leaf) else value

    def _array(self, kind: str, dtype: str, offset: int, count: int, shape: tuple, inverse: tuple | None) -> Any:
        mode = self.mode
        if mode == "lend" and count * np.dtype(dtype).itemsize >= LEND_MIN_BYTES:
            if self.lease is None:  # one object for the whole slot: numpy views name it as their base
                self.lease = _slot_type(self.size).from_buffer(self.buffer, self.base)
            dense = np.frombuffer(self.lease, dtype=dtype, count=count, offset=offset).reshape(shape)
        else:
            dense = np.frombuffer(self.buffer, dtype=dtype, count=count, offset=self.base + offset).reshape(shape)
            if mode != "view":  # one single-threaded memcpy in storage order (torch's copy_ would start OpenMP threads)
                if kind == "tensor" and self.allocate is not None:
                    target = self.allocate(torch.from_numpy(dense)).numpy()
                    np.copyto(target, dense)
                    dense = target
                else:
                    dense = dense.copy()
        if inverse is not None:
            dense = dense.transpose(inverse)
        return torch.from_numpy(dense) if kind == "tensor" else dense


def needed_bytes(batch: Any) -> int:
    """The slot size a batch needs (its arrays, each aligned)."""
    if isinstance(batch, torch.Tensor):
        return -(-batch.numel() * batch.element_size() // ALIGN) * ALIGN + ALIGN
    if isinstance(batch, np.ndarray) and batch.dtype != object:
        return -(-batch.nbytes // ALIGN) * ALIGN + ALIGN
    if isinstance(batch, (tuple, list)):
        return sum(needed_bytes(item) for item in batch)
    if isinstance(batch, dict):
        return sum(needed_bytes(item) for item in batch.values())
    return 0
