"""What a saved loader or sampler state may hold: every field's type and range, its keys, checked
before any of it is used, so that a damaged or hand-edited state is refused in one line naming the
field instead of resuming in another order (or failing deep inside).

A state is what :meth:`fastdata.loading.samplers.EpochSampler.state_at` writes (version 2; version
1, from before state versions, lacks ``version``, ``order`` and ``earlier``), plus what a loader
adds: ``backend``, a mix's ``dataset`` and auto's ``tuned``. Integers are integers (Python's or
numpy's; not bools, floats or strings), flags are bools; nothing is coerced.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from fastdata.errors import InvalidOptionError
from fastdata.loading.order import MAX_STAGES, STATE_VERSION

_INT64_MAX = 2**63 - 1
_VERSION_1 = ("seed", "epoch", "consumed", "length", "batch_size", "drop_last", "rank", "world_size", "even")
_VERSION_2 = ("version", *_VERSION_1, "order", "earlier")
_ADDED = ("backend", "dataset", "tuned")  # what a loader adds to its sampler's state (dataset, tuned: some)
_LAYOUT = ("world_size", "batch_size", "even", "drop_last", "consumed")  # an entry of "earlier"


def _count(low: int, high: int | None = _INT64_MAX) -> Callable[[Any], str | None]:
    """A check of an int (not a bool) from ``low`` to ``high`` (None: no bound): None if fine, else
    what is allowed."""
    def check(value: Any) -> str | None:
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and low <= value \
                and (high is None or value <= high):
            return None  # numpy's too: a state built or edited with numpy integers
        if high is None:
            return f"an integer >= {low}"
        return f"an integer from {low} to {'2**63 - 1' if high == _INT64_MAX else high}"
    return check


def _flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else "True or False"


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) else "a string"


def _batch_size(value: Any) -> str | None:
    return None if value is None or _count(1)(value) is None else "None or an integer from 1 to 2**63 - 1"


_FIELDS: dict[str, Callable[[Any], str | None]] = {
    "version": _count(1, STATE_VERSION), "seed": _count(0, None), "epoch": _count(0), "consumed": _count(0),
    "length": _count(0), "batch_size": _batch_size, "drop_last": _flag, "even": _flag, "world_size": _count(1),
    "rank": _count(0), "order": _text, "backend": _text,
}


def _refuse(field: str, value: Any, allowed: str) -> InvalidOptionError:
    return InvalidOptionError(f"Invalid state: {field}={value!r:.100} (allowed: {allowed}). Resume from a state as "
                              "state_dict() saved it, or start the next epoch without it (loader.set_epoch(epoch)).")


def checked_state(state: Any, *, kind: str) -> dict[str, Any]:
    """``state`` if every key and field is one a state of this fastdata holds, else an
    :class:`InvalidOptionError` naming the first wrong field."""
    if not isinstance(state, dict) or not {"seed", "epoch", "consumed"} <= set(state):
        raise InvalidOptionError(f"Not a {kind} state: expected a dict from state_dict(), got {state!r:.200}.")
    version = state.get("version", 1)
    if _count(1)(version) is None and version > STATE_VERSION:
        raise InvalidOptionError(
            f"Cannot resume: the state has version {version!r}, but this fastdata reads state versions 1 to "
            f"{STATE_VERSION}. Upgrade fastdata to resume from it.")
    keys = _VERSION_2 if "version" in state else _VERSION_1
    missing = [key for key in keys if key not in state]
    unknown = [key for key in state if key not in keys and key not in _ADDED]
    if missing or unknown:
        what = f"has no {missing[0]!r}" if missing else f"has the unknown key {unknown[0]!r:.60}"
        raise InvalidOptionError(f"Invalid state: it {what} (a version {version!r} state holds "
                                 f"{', '.join(keys)}). Resume from a state as state_dict() saved it.")
    for key, check in _FIELDS.items():
        if key in state and check(state[key]) is not None:
            raise _refuse(key, state[key], check(state[key]) or "")
    if "backend" in state and state["batch_size"] is None:  # a loader's batches always have a size
        raise _refuse("batch_size", None, "an integer from 1 to 2**63 - 1 in a loader's state")
    if state["rank"] >= state["world_size"]:
        raise _refuse("rank", state["rank"], f"an integer from 0 to world_size - 1 = {state['world_size'] - 1}")
    _check_earlier(state.get("earlier", []))
    _check_dataset(state.get("dataset"))
    _check_tuned(state.get("tuned"))
    return state


def _check_earlier(earlier: Any) -> None:
    """``earlier``: a list of at most MAX_STAGES layouts ``[world_size, batch_size, even, drop_last, consumed]``."""
    if not isinstance(earlier, list) or len(earlier) > MAX_STAGES:
        raise _refuse("earlier", earlier, f"a list of at most {MAX_STAGES} [world_size, batch_size, even, "
                                          "drop_last, consumed] lists")
    for number, entry in enumerate(earlier):
        if not isinstance(entry, list) or len(entry) != len(_LAYOUT):
            raise _refuse(f"earlier[{number}]", entry, "a list [world_size, batch_size, even, drop_last, consumed]")
        for name, value in zip(_LAYOUT, entry):
            problem = _FIELDS[name](value)
            if problem is not None:
                raise _refuse(f"earlier[{number}] {name}", value, problem)


def _check_dataset(dataset: Any) -> None:
    """``dataset`` (a mix's identity): None, or ``{"seed": int >= 0, "digest": str}``."""
    if dataset is None:
        return
    if not isinstance(dataset, dict) or set(dataset) != {"seed", "digest"}:
        raise _refuse("dataset", dataset, "None or a mix's {'seed': ..., 'digest': ...}")
    for key, check in (("seed", _count(0, None)), ("digest", _text)):
        if check(dataset[key]) is not None:
            raise _refuse(f"dataset {key}", dataset[key], check(dataset[key]) or "")


def _check_tuned(tuned: Any) -> None:
    """``tuned`` (auto's best setting): None, or ``{"backend": str, "num_workers": int >= 0, "prefetch": int >= 1}``."""
    if tuned is None:
        return
    checks = {"backend": _text, "num_workers": _count(0), "prefetch": _count(1)}
    if not isinstance(tuned, dict) or set(tuned) != set(checks):
        raise _refuse("tuned", tuned, "None or {'backend': ..., 'num_workers': ..., 'prefetch': ...}")
    for key, check in checks.items():
        if check(tuned[key]) is not None:
            raise _refuse(f"tuned {key}", tuned[key], check(tuned[key]) or "")
