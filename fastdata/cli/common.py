"""Helpers every ``fastdata`` command uses: sizes in words, manifests, the progress bar."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count} B"


def disk_usage(path: Path) -> int:
    from fastdata.manifest import disk_usage as usage

    return usage(path)


def find_manifest(path: Path) -> dict[str, Any] | None:
    from fastdata.formats import find_manifest as find

    return find(path)


class LazyBar:
    """A tqdm bar created at the first progress report, so failed validation prints no bar."""

    def __init__(self, *, disable: bool, desc: str):
        self.disable, self.desc, self.bar = disable, desc, None

    def update(self, count: int, total: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="img", desc=self.desc, disable=self.disable, file=sys.stderr)
        self.bar.update(count)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
