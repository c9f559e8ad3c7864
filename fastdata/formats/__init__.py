"""Storage formats: one package each, found by discovery (:mod:`fastdata.formats.registry`).

The contract a format keeps is :mod:`fastdata.formats.base` (its readers subclass
:class:`StoredDataset`, :mod:`fastdata.formats.dataset`); the CLI choices,
:func:`fastdata.open_dataset`, the benchmark sweep and the contract tests iterate the registry,
so a new format touches its own package (and its test file) only. Steps: docs/formats.md.
"""

from __future__ import annotations

from typing import Any

from fastdata.formats.base import FormatSpec, MissingFormat, Reader, Writer
from fastdata.formats.registry import (
    ENTRY_POINT_GROUP, NO_EXTENSION_FORMAT, FormatUnavailableError, all_formats, available_formats, discover,
    format_for_output, get_format, missing_formats, register, registered, require, restored,
)
from fastdata.formats.stored import find_manifest, manifest_problems, open_manifest, require_manifest

__all__ = [
    "ENTRY_POINT_GROUP", "NO_EXTENSION_FORMAT", "FormatSpec", "FormatUnavailableError", "MissingFormat", "Reader",
    "StoredDataset", "Writer", "all_formats", "available_formats", "discover", "find_manifest", "format_for_output",
    "get_format", "manifest_problems", "missing_formats", "open_manifest", "register", "registered", "require",
    "require_manifest", "restored",
]


def __getattr__(name: str) -> Any:
    """:class:`~fastdata.formats.dataset.StoredDataset` on first use (PEP 562): it imports torch,
    which the registry, ``fastdata info`` and ``fastdata verify`` do without."""
    if name == "StoredDataset":
        from fastdata.formats.dataset import StoredDataset

        return StoredDataset
    raise AttributeError(f"module 'fastdata.formats' has no attribute {name!r}")
