"""fastdata: convert image datasets once into fast formats, read them back with worker-safe
torch Datasets, and measure which format and ``num_workers`` feed a training loop fastest.

The public names below are imported on first use (PEP 562), so ``import fastdata`` is cheap and
the command line can start, and answer Ctrl-C, before torch is loaded.
"""

from __future__ import annotations

import importlib
from typing import Any

from fastdata._version import __version__  # noqa: F401 - public

_EXPORTS = {
    "BatchIndexSampler": "fastdata.loading.samplers",
    "ChunkShuffleSampler": "fastdata.loading.samplers",
    "FastdataError": "fastdata.errors",
    "FolderDataset": "fastdata.formats.folder",
    "HDF5Dataset": "fastdata.formats.hdf5",
    "MemmapDataset": "fastdata.formats.npy",
    "TarDataset": "fastdata.formats.tar",
    "TarIndexedDataset": "fastdata.formats.tar",
    "VerifyReport": "fastdata.verification",
    "WorkerError": "fastdata.loading",
    "convert": "fastdata.conversion",
    "loader": "fastdata.loading",
    "merge": "fastdata.conversion.driver",
    "mix": "fastdata.loading.mix",
    "open_dataset": "fastdata.api",
    "Recommendation": "fastdata.tuning",
    "sweep": "fastdata.bench.sweep",
    "tune": "fastdata.tuning",
    "verify": "fastdata.verification",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        try:  # a submodule, e.g. fastdata.formats after a plain "import fastdata"
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'fastdata' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
