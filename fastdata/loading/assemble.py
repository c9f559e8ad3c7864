"""One batch from parts read separately (a mix's sources): each part's rows placed back where they
belong, one copy per part, into memory the caller may provide (a shared-memory slot)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from fastdata.errors import InvalidOptionError


class SharedRows:
    """Room for a batch's arrays, shared by the runs read into it: ``rows(start, stop)`` is an
    ``allocate(shape, dtype)`` for one run, giving rows ``start:stop`` of a batch-sized buffer (the
    ``n``-th array a run asks for comes from the ``n``-th buffer; None where shapes disagree)."""

    def __init__(self, total: int, allocate: Callable | None):
        self.total, self.allocate = total, allocate
        self.buffers: list[np.ndarray] = []

    def rows(self, start: int, stop: int) -> Callable:
        asked = [0]

        def allocate(shape: tuple[int, ...], dtype: Any) -> np.ndarray | None:
            number, asked[0] = asked[0], asked[0] + 1
            if not shape or shape[0] != stop - start:
                return None
            if number == len(self.buffers):
                self.buffers.append(_empty((self.total, *shape[1:]), dtype, self.allocate))
            buffer = self.buffers[number] if number < len(self.buffers) else None
            if buffer is None or buffer.shape[1:] != tuple(shape[1:]) or buffer.dtype != np.dtype(dtype):
                return None
            return buffer[start:stop]

        return allocate


def _in_place(parts: Sequence[np.ndarray], places: Sequence[np.ndarray], buffers: Sequence[np.ndarray]) -> Any:
    """The buffer that already holds every part at its place (parts in memory order), else None."""
    for buffer in buffers:
        if buffer.shape[1:] != parts[0].shape[1:] or buffer.dtype != parts[0].dtype:
            continue
        row = buffer[0].nbytes if len(buffer) else 0
        origin = buffer.__array_interface__["data"][0]
        if all(p.flags.c_contiguous and len(w) and p.__array_interface__["data"][0] == origin + int(w[0]) * row
               and int(w[-1]) - int(w[0]) + 1 == len(p) == len(w) for p, w in zip(parts, places)):
            return buffer
    return None


def _per_field(parts: Sequence[Any], names: Sequence[str], leaf: Callable[[Sequence[Any]], Any]) -> Any:
    """``leaf(parts)`` at every field of the parts' common structure (tuples, named tuples and
    dicts, the parts checked alike at each level), put back in that structure."""
    first = parts[0]
    if isinstance(first, tuple):
        _same(parts, len(first), names, "tuple of")
        fields = [_per_field([p[i] for p in parts], names, leaf) for i in range(len(first))]
        return type(first)(*fields) if hasattr(first, "_fields") else tuple(fields)
    if isinstance(first, dict):
        _same(parts, set(first), names, "keys")
        return {key: _per_field([p[key] for p in parts], names, leaf) for key in first}
    return leaf(parts)


def assemble(parts: Sequence[Any], places: Sequence[np.ndarray], total: int, *,
             allocate: Callable | None = None, names: Sequence[str] = (), buffers: Sequence[np.ndarray] = ()) -> Any:
    """The batch of ``total`` rows whose rows ``places[k]`` are ``parts[k]`` (collated batches of
    one structure: tuples and dicts of tensors, arrays and per-sample lists). ``allocate(shape,
    dtype)`` may give the memory of an array or tensor (None: a new one)."""
    return _per_field(parts, names, lambda leaves: _placed(leaves, places, total, allocate, names, buffers))


def _placed(parts: Sequence[Any], places: Sequence[np.ndarray], total: int, allocate: Callable | None,
            names: Sequence[str], buffers: Sequence[np.ndarray]) -> Any:
    """One field of :func:`assemble`."""
    first = parts[0]
    if isinstance(first, list):
        out: list[Any] = [None] * total
        for part, where in zip(parts, places):
            for place, item in zip(where.tolist(), part):
                out[place] = item
        return out
    if isinstance(first, torch.Tensor):
        return _tensor(parts, places, total, allocate, names, buffers)
    if isinstance(first, np.ndarray):
        _checked_shapes(parts, names)
        held = _in_place(parts, places, buffers)
        if held is not None:
            return held
        out_array = _empty((total, *first.shape[1:]), first.dtype, allocate)
        for part, where in zip(_checked_shapes(parts, names), places):
            out_array[where] = part
        return out_array
    raise InvalidOptionError(f"Cannot put together batches holding {type(first).__name__}: a mix's sources must "
                             "return tuples, dicts, lists, tensors or arrays.")


def concatenate_runs(parts: Sequence[Any], runs: Sequence[tuple[int, int]], total: int, *,
                     allocate: Callable | None = None, names: Sequence[str] = (),
                     buffers: Sequence[np.ndarray] = ()) -> Any:
    """The batch of ``total`` rows whose rows ``runs[k] = (start, stop)`` are ``parts[k]``, the runs
    in order and covering the batch (a mix's batch grouped per source). A tensor every part read
    straight into its rows of one of ``buffers`` costs one view; other tensors of one dimension
    (labels) are concatenated; anything else is placed as :func:`assemble` places it."""
    return _per_field(parts, names, lambda leaves: _concatenated(leaves, runs, total, allocate, names, buffers))


def _concatenated(parts: Sequence[Any], runs: Sequence[tuple[int, int]], total: int, allocate: Callable | None,
                  names: Sequence[str], buffers: Sequence[np.ndarray]) -> Any:
    """One field of :func:`concatenate_runs`."""
    first = parts[0]
    if isinstance(first, list):
        return [item for part in parts for item in part]
    if isinstance(first, torch.Tensor):
        held = _held(parts, runs, total, buffers)
        if held is not None:
            return held
        if first.ndim == 1 and allocate is None:
            _checked_shapes(parts, names)
            out = torch.cat([_plain(p) for p in parts])
            return out if type(first) is torch.Tensor else out.as_subclass(type(first))
    return _placed(parts, [np.arange(start, stop) for start, stop in runs], total, allocate, names, buffers)


def _held(parts: Sequence[torch.Tensor], runs: Sequence[tuple[int, int]], total: int,
          buffers: Sequence[np.ndarray]) -> torch.Tensor | None:
    """The batch as one view of the buffer every part was read into at its rows (all parts alike in
    shape, strides and type), else None."""
    first = parts[0]
    origin = first.data_ptr()
    for buffer in buffers:
        if buffer.__array_interface__["data"][0] != origin or len(buffer) != total or not buffer.flags.c_contiguous:
            continue
        row = buffer.strides[0]
        if buffer.itemsize != first.element_size() or first.ndim == 0 or first.stride(0) * first.element_size() != row:
            return None
        shape, strides = first.shape[1:], first.stride()
        for part, (start, stop) in zip(parts, runs):
            if (part.data_ptr() != origin + start * row or part.shape[0] != stop - start or part.shape[1:] != shape
                    or part.stride() != strides or part.dtype != first.dtype or type(part) is not type(first)):
                return None
        out = torch.from_numpy(buffer)
        if out.dtype != first.dtype:
            return None
        out = out.as_strided((total, *shape), strides)
        return out if type(first) is torch.Tensor else out.as_subclass(type(first))
    return None


def _tensor(parts: Sequence[torch.Tensor], places: Sequence[np.ndarray], total: int, allocate: Callable | None,
            names: Sequence[str], buffers: Sequence[np.ndarray] = ()) -> torch.Tensor:
    """The parts' rows placed in one tensor laid out in memory as the first part is (a reader's
    CHW images are views of HWC memory: rows are copied whole, never element by element)."""
    first = parts[0]
    _checked_shapes(parts, names)
    order = sorted(range(first.ndim), key=lambda d: (-first.stride(d), d))
    if first.ndim == 0 or order[0] != 0:
        order = list(range(first.ndim))
    shape = (total, *(first.shape[d] for d in order[1:]))
    inverse = [order.index(d) for d in range(first.ndim)]
    if first.dtype != torch.bfloat16 and buffers:  # read straight into a shared buffer: nothing to copy
        held = _in_place([_plain(p).permute(order).numpy() for p in parts], places, buffers)
        if held is not None:
            out = torch.from_numpy(held).permute(inverse)
            return out if type(first) is torch.Tensor else out.as_subclass(type(first))
    if first.dtype == torch.bfloat16:  # no numpy twin: torch places the rows
        base = torch.empty(shape, dtype=first.dtype)
        for part, where in zip(parts, places):
            base[torch.from_numpy(where)] = part.as_subclass(torch.Tensor).permute(order)
    else:  # numpy copies whole rows (torch's index_put goes element by element)
        memory = _empty(shape, torch.empty(0, dtype=first.dtype).numpy().dtype, allocate)
        for part, where in zip(parts, places):
            memory[where] = _plain(part).permute(order).numpy()
        base = torch.from_numpy(memory)
    out = base.permute(inverse)
    return out if type(first) is torch.Tensor else out.as_subclass(type(first))


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as a plain Tensor (a tv_tensor's subclass dispatch left out)."""
    return tensor if type(tensor) is torch.Tensor else tensor.as_subclass(torch.Tensor)


def _empty(shape: tuple[int, ...], dtype: Any, allocate: Callable | None) -> np.ndarray:
    memory = allocate(shape, dtype) if allocate is not None else None
    return memory if memory is not None else np.empty(shape, dtype)


def _checked_shapes(parts: Sequence[Any], names: Sequence[str]) -> Sequence[Any]:
    shapes = [tuple(p.shape[1:]) for p in parts]
    dtypes = [p.dtype for p in parts]
    if len(set(shapes)) > 1 or len(set(dtypes)) > 1:
        shown = ", ".join(f"{'x'.join(map(str, s)) or 'scalar'} {d} from {n}" for s, d, n in
                          zip(shapes, dtypes, names or map(str, range(len(parts)))))
        raise InvalidOptionError(f"A mix's sources give samples of different shapes or types ({shown}), which "
                                 "cannot share a batch. Convert them to one size (fastdata convert --resize) or "
                                 "give each a transform that makes them alike.")
    return parts


def _same(parts: Sequence[Any], expected: Any, names: Sequence[str], what: str) -> None:
    for part, name in zip(parts, names or map(str, range(len(parts)))):
        got = len(part) if isinstance(expected, int) else set(part)
        if not isinstance(part, type(parts[0])) or got != expected:
            raise InvalidOptionError(f"A mix's sources give batches of different structures ({name} gives "
                                     f"{type(part).__name__} {got!r}, not {what} {expected!r}), which cannot share "
                                     "a batch. Make their samples alike (the same fields, in the same order).")
