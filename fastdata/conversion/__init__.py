"""The conversion driver: every conversion (local, ``--part I/N``, ``fastdata merge``, ``--engine
ray``) is planned, run and written here.

Public names are imported on first use (PEP 562): the format packages import the option parsers
of :mod:`fastdata.conversion.options` and the sources import :mod:`~fastdata.sources.fingerprint`,
and neither should load the driver (which imports them) to do so.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ConvertOptions": "fastdata.conversion.options",
    "convert": "fastdata.conversion.driver",
    "merge": "fastdata.conversion.driver",
    "open_source": "fastdata.conversion.driver",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fastdata.conversion' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
