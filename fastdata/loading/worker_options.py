"""The options a loader's workers use, checked once, up front (``num_workers="auto"`` starts at
``num_workers=0`` and would otherwise meet a bad one only when the search first starts workers)."""

from __future__ import annotations

import multiprocessing
import warnings
from typing import Any

from torch.utils.data import DataLoader

from fastdata.errors import InvalidOptionError


def check_prefetch_factor(prefetch_factor: Any) -> int:
    """``prefetch_factor`` checked: batches in flight per worker (None: 2)."""
    if prefetch_factor is not None and (isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, int)
                                        or prefetch_factor < 1):
        raise InvalidOptionError(f"Invalid prefetch_factor {prefetch_factor!r}. Use a number of batches per worker "
                                 f">= 1 (or None for 2).")
    return 2 if prefetch_factor is None else prefetch_factor


def check_worker_options(dataset: Any, kwargs: dict[str, Any], backends: tuple[str, ...]) -> None:
    """The options that only workers use, checked when the auto loader is built (it starts at
    ``num_workers=0``, and would meet a bad one only when it first starts workers); with
    ``persistent_workers=False``, a warning that workers stay while a setting runs."""
    check_prefetch_factor(kwargs.get("prefetch_factor"))
    timeout = kwargs.get("timeout", 0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise InvalidOptionError(f"Invalid timeout {timeout!r}. Use seconds >= 0 (0: wait as long as it takes).")
    for name in ("worker_init_fn", "collate_fn"):
        value = kwargs.get(name)
        if value is not None and not callable(value):
            raise InvalidOptionError(f"Invalid {name} {value!r}. Use a function (or None).")
    for name in ("pin_memory", "persistent_workers"):
        if not isinstance(kwargs.get(name, False), bool):
            raise InvalidOptionError(f"Invalid {name} {kwargs[name]!r}. Use True or False.")
    context = kwargs.get("multiprocessing_context")
    methods = multiprocessing.get_all_start_methods()
    if context is not None and not isinstance(context, multiprocessing.context.BaseContext) and context not in methods:
        raise InvalidOptionError(f"Invalid multiprocessing_context {context!r}. Use one of "
                                 f"{', '.join(map(repr, methods))}, a multiprocessing context, or None.")
    if "torch" in backends:  # a DataLoader checks its own options (and any other one given) when made
        try:
            DataLoader(dataset, batch_size=None, num_workers=1, **{**kwargs, "persistent_workers": True})
        except (TypeError, ValueError) as exc:
            raise InvalidOptionError(f"backend='torch' refuses these options: {exc}") from exc
    if kwargs.get("persistent_workers") is False:
        warnings.warn("num_workers='auto' keeps the workers of a setting for as long as it runs, across epochs: "
                      "persistent_workers=False is not used.", UserWarning, stacklevel=4)
