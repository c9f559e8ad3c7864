"""What every storage format implements: the :class:`Writer` interface, the :class:`Plan` a
writer receives before the first sample, and the :class:`Batch` of converted samples it
receives after. Nothing here knows where samples come from (no ``sources`` import).

Format writers are created with the path to write (a temporary name; the engine renames it when
complete), the plan and the format's options, receive batches in sample order, and finally write
their manifest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.images import Geometry


@dataclass(frozen=True)
class Plan:
    """Everything a writer needs to know before the first batch arrives.

    ``count`` is the number of samples attempted; with ``skip_bad`` fewer may arrive.
    ``shape`` is (H, W, C) for raw storage, None for encoded. ``encoding`` is ``"raw"``,
    ``"original"`` (source file bytes kept as they are), ``"png"`` or ``"jpeg"``.
    """

    count: int
    store: str
    mode: str
    channels: int
    shape: tuple[int, int, int] | None
    encoding: str
    class_to_idx: dict[str, int]
    geometry: Geometry = Geometry()
    jpeg_quality: int | None = None


@dataclass
class Batch:
    """Consecutive converted samples: raw pixels in ``images`` or encoded bytes in ``blobs``."""

    keys: list[str]
    labels: np.ndarray
    images: np.ndarray | None = None  # (B, H, W, C) uint8
    blobs: list[bytes] | None = None
    skipped: list[tuple[int, dict[str, str]]] = field(default_factory=list)  # (index, {key, reason})

    def __len__(self) -> int:
        return len(self.keys)


class Writer:
    """Interface of a format writer (subclass it in ``fastdata/formats/<name>.py``)."""

    def __init__(self, path: Path, plan: Plan, options: Any):
        self.path = path
        self.plan = plan
        self.options = options

    def write(self, batch: Batch) -> None:
        """Append a batch (samples arrive in order; ``batch`` may be empty)."""
        raise NotImplementedError

    def close(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Finish the files, add ``files`` (checksums) and layout details to ``manifest``,
        store it, and return it. Called once, after the last batch."""
        raise NotImplementedError

    def abort(self) -> None:
        """Release open handles after a failure (the engine removes the temporary output)."""

    # --- optional: resumable writers (``fastdata convert --resume``) ---------------------

    supports_resume = False

    def checkpoint(self) -> dict[str, Any]:
        """Make everything written so far durable; return JSON-able state for :meth:`resume`."""
        raise NotImplementedError

    @classmethod
    def resume(cls, path: Path, plan: Plan, options: Any, state: dict[str, Any]) -> "Writer":
        """Reopen a partial output at a checkpoint's ``state`` and continue after it."""
        raise NotImplementedError
