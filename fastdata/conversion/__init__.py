"""The conversion driver: every conversion (local, ``--part I/N``, ``fastdata merge``, ``--engine
ray``) is planned, run and written here.

Its modules: plan (:mod:`~fastdata.conversion.plan`), the units every engine computes
(:mod:`~fastdata.conversion.units`), run (:mod:`~fastdata.conversion.engine`, the engines of
:mod:`fastdata.conversion.scale`), write (:mod:`~fastdata.conversion.write`), the driver
(:mod:`~fastdata.conversion.driver`), and a conversion to a URL (:mod:`fastdata.conversion.remote`).

Public names are imported on first use (PEP 562), as ``fastdata``'s own are: a module of the
package (the options for the command line, the pipeline a pool worker unpickles) loads without
the driver and the formats, sources and uploads it imports.
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
