"""fastdata: convert image datasets once into fast formats, read them back with worker-safe
torch Datasets, and measure which format and ``num_workers`` feed a training loop fastest."""

__version__ = "0.1.0"

from fastdata.api import open_dataset  # noqa: E402
from fastdata.convert import convert  # noqa: E402
from fastdata.errors import FastdataError  # noqa: E402
from fastdata.formats.folder import FolderDataset  # noqa: E402
from fastdata.formats.hdf5 import HDF5Dataset  # noqa: E402
from fastdata.formats.npy import MemmapDataset  # noqa: E402
from fastdata.formats.tar import TarDataset, TarIndexedDataset  # noqa: E402
from fastdata.loader import BatchIndexSampler, loader  # noqa: E402
from fastdata.samplers import ChunkShuffleSampler  # noqa: E402
from fastdata.verify import VerifyReport, verify  # noqa: E402

__all__ = [
    "BatchIndexSampler",
    "ChunkShuffleSampler",
    "FastdataError",
    "FolderDataset",
    "HDF5Dataset",
    "MemmapDataset",
    "TarDataset",
    "TarIndexedDataset",
    "VerifyReport",
    "__version__",
    "convert",
    "loader",
    "open_dataset",
    "verify",
]
