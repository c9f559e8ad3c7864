"""Storage formats: one package each, found by discovery (:mod:`fastdata.formats.registry`).

The contract a format keeps is :mod:`fastdata.formats.base`; the CLI choices,
:func:`fastdata.open_dataset`, the benchmark sweep and the contract tests iterate the registry,
so a new format touches its own package (and its test file) only. Steps: docs/formats.md.
"""

from __future__ import annotations

from fastdata.formats.base import FormatSpec, MissingFormat, Reader, Writer
from fastdata.formats.registry import (
    ENTRY_POINT_GROUP, NO_EXTENSION_FORMAT, FormatUnavailableError, all_formats, available_formats, discover,
    format_for_output, get_format, missing_formats, register, registered, require, restored,
)
from fastdata.formats.stored import find_manifest, manifest_problems, open_manifest, require_manifest

__all__ = [
    "ENTRY_POINT_GROUP", "NO_EXTENSION_FORMAT", "FormatSpec", "FormatUnavailableError", "MissingFormat", "Reader",
    "Writer", "all_formats", "available_formats", "discover", "find_manifest", "format_for_output", "get_format",
    "manifest_problems", "missing_formats", "open_manifest", "register", "registered", "require",
    "require_manifest", "restored",
]
