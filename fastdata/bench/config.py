"""The benchmark's declared grid: :class:`BenchConfig` and one :class:`Case` per measured run."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from fastdata.errors import InvalidOptionError
from fastdata.loading.backends import BACKENDS, DEFAULT_BACKEND, backend_names

TRANSFORMS = ("none", "normalize", "augment")
START_METHODS = ("fork", "spawn", "forkserver")
CACHE_MODES = ("warm", "cold")
# Peak memory is sampled (every 0.1 s, fastdata.bench.measure) over untimed epochs lasting at least
# this long by default: ~10 samples. A single short epoch would be seen once or twice.
MEMORY_MIN_S = 1.0


def _registered() -> list[str]:
    from fastdata.formats import available_formats

    return available_formats()


def auto_workers(cpu_count: int | None = None) -> list[int]:
    """0, 1, 2, 4, ... up to the core count, plus the core count itself."""
    cores = cpu_count or os.cpu_count() or 1
    counts, value = [0], 1
    while value <= cores:
        counts.append(value)
        value *= 2
    if counts[-1] != cores:
        counts.append(cores)
    return counts


def parse_workers(text: str) -> list[int]:
    if text.strip() == "auto":
        return auto_workers()
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        counts = []
    if not counts or counts[0] < 0:
        raise InvalidOptionError(f"Invalid --num-workers {text!r}. Use a list like '0,1,2,4' or 'auto'.")
    return counts


@dataclass(frozen=True)
class BenchConfig:
    """Everything one ``fastdata bench`` run measures (the grid) and how."""

    formats: tuple[str, ...] = field(default_factory=lambda: tuple(_registered()))
    stores: tuple[str, ...] = ("raw", "encoded")
    workers: tuple[int, ...] = field(default_factory=lambda: tuple(auto_workers()))
    resize: str | None = None
    batch_size: int = 256
    epochs: int = 3
    warmup: int = 1
    step_ms: float = 0.0
    transform: str = "none"
    start_method: str | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int = 2
    cache: str = "warm"
    timeout_s: float = 600.0
    backends: tuple[str, ...] = backend_names()  # thread and process apply to the fast path of map-style formats
    step: Any = None  # the training step run on each batch: a callable or 'module:function' (else --step-ms)
    auto: bool = True  # also measure num_workers="auto" on the fastest dataset's fast path (fastdata.bench.autorow)
    memory_s: float = MEMORY_MIN_S  # peak memory: sampled over untimed epochs lasting at least this long

    def __post_init__(self) -> None:
        from fastdata.importing import is_import_string
        from fastdata.conversion.options import STORES

        checks = [
            (self.transform in TRANSFORMS or is_import_string(self.transform),
             f"Unknown --transform {self.transform!r}. Allowed: {', '.join(map(repr, TRANSFORMS))}, "
             "or an import string 'module:function'."),
            (self.step is None or callable(self.step) or is_import_string(self.step),
             f"Invalid --step {self.step!r}. Use an import string 'module:function'."),
            (self.step is None or not self.step_ms, "Give --step or --step-ms, not both."),
            (self.start_method in (None, *START_METHODS), f"Unknown --start-method {self.start_method!r}. Allowed: {', '.join(map(repr, START_METHODS))}."),
            (self.cache in CACHE_MODES, f"Unknown --cache {self.cache!r}. Allowed: 'warm', 'cold'."),
            (self.batch_size > 0, f"Invalid --batch-size {self.batch_size!r}. Use a positive integer."),
            (self.epochs > 0, f"Invalid --epochs {self.epochs!r}. Use 1 or more."),
            (self.warmup >= 0, f"Invalid --warmup {self.warmup!r}. Use 0 or more."),
            (self.step_ms >= 0, f"Invalid --step-ms {self.step_ms!r}. Use 0 or more."),
            (self.prefetch_factor > 0, f"Invalid --prefetch-factor {self.prefetch_factor!r}. Use 1 or more."),
            (math.isfinite(self.memory_s) and self.memory_s >= 0,
             f"Invalid --memory-s {self.memory_s!r}. Use 0 (one epoch) or a number of seconds."),
            (all(store in STORES for store in self.stores),
             f"Unknown --stores {','.join(self.stores)!r}. Allowed: {', '.join(map(repr, STORES))}."),
            (bool(self.backends) and all(b in BACKENDS for b in self.backends),
             f"Unknown --backends {','.join(self.backends)!r}. Allowed: {', '.join(map(repr, BACKENDS))}."),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidOptionError(message)

    def to_dict(self) -> dict[str, Any]:
        step = self.step
        values = asdict(dataclasses.replace(self, step=None))
        values["step"] = step if step is None or isinstance(step, str) else callable_name(step)
        return values

    def step_function(self) -> Any:
        """The step to run on each batch (None: sleep ``step_ms``)."""
        if isinstance(self.step, str):
            from fastdata.importing import load_callable

            return load_callable(self.step, what="--step")
        return self.step


def callable_name(value: Any) -> str:
    """``module:qualname`` of a function or class instance, for reports."""
    target = value if hasattr(value, "__qualname__") else type(value)
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(value))}"


@dataclass(frozen=True)
class Case:
    """One measured configuration: a dataset read one way with one num_workers."""

    format: str
    store: str
    path: str  # fast | standard | stream
    num_workers: int
    dataset_path: str
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)
    files: tuple[str, ...] = ()  # evicted from the page cache before each epoch with --cache cold
    backend: str = DEFAULT_BACKEND  # who computes a batch on the fast path (fastdata.loader's backend)
    remote: str = ""  # a dataset read from its URL: "cold" (the cache emptied before each epoch) or "warm"

    @property
    def label(self) -> str:
        store = f"{self.store} url:{self.remote}" if self.remote else self.store
        parts = [part for part in (self.format, store, self.path) if part and part != "-"]
        return " ".join(parts) + (f" [{self.backend}]" if self.backend != DEFAULT_BACKEND else "")
