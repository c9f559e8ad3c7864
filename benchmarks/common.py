"""Shared pieces of the benchmark scripts: the seeded workload and an epoch timer."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

DATA = Path(__file__).resolve().parent / "data"


def workload_folder(count: int = 20_000, size: int = 32, large: int = 0) -> Path:
    """The seeded image folder (generated once, reused): ``count`` PNGs of ``size`` px."""
    from fastdata.demo import make_demo_folder

    root = DATA / f"folder-{count}-{size}px-{large}jpg"
    done = root / ".complete"
    if not done.exists():
        make_demo_folder(root, small=count, small_size=size, large=large, seed=0)
        done.touch()
    return root


def converted(folder: Path, name: str, **options) -> Path:
    """Convert ``folder`` once per option set (cached next to it)."""
    import fastdata

    out = DATA / f"{folder.name}-{name}"
    if not out.exists():
        fastdata.convert(folder, out, **options)
    return out


def epoch_rate(make_iterable: Callable[[], Iterable], *, epochs: int = 3, warmup: int = 1) -> float:
    """Median samples/s over ``epochs`` full passes after ``warmup`` passes."""
    rates = []
    for epoch in range(warmup + epochs):
        start = time.perf_counter()
        count = 0
        for batch in make_iterable():
            labels = batch[1]
            count += len(labels)
        elapsed = time.perf_counter() - start
        if epoch >= warmup:
            rates.append(count / elapsed)
    return statistics.median(rates)


def machine() -> str:
    import torch

    return (
        f"{platform.machine()}, os.cpu_count()={os.cpu_count()}, Python {sys.version.split()[0]}, "
        f"torch {torch.__version__}, numpy {np.__version__}"
    )


def table(rows: list[tuple[str, dict[int, float]]], workers: list[int]) -> str:
    head = f"| {'reader':<44} | " + " | ".join(f"nw={w:<2}" for w in workers) + " | best |"
    lines = [head, "|" + "-" * 46 + "|" + "|".join("-" * 9 for _ in workers) + "|------|"]
    for name, rates in rows:
        cells = [f"{rates[w] / 1000:>6.1f}k" if w in rates else "      -" for w in workers]
        best = max(rates.values())
        lines.append(f"| {name:<44} | " + " | ".join(cells) + f" | {best / 1000:.1f}k |")
    return "\n".join(lines)
