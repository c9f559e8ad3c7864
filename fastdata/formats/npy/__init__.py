"""The ``npy`` format: memory-mapped numpy arrays in a directory.

raw:      images.npy (N, H, W, C) uint8, labels.npy (N,) int64, manifest.json
encoded:  data.bin (concatenated original bytes), offsets.npy (N + 1,) int64, labels.npy,
          manifest.json

Everything is readable without fastdata: ``np.load(path / "images.npy", mmap_mode="r", allow_pickle=False)``;
sample ``i`` of an encoded dataset is ``data[offsets[i]:offsets[i + 1]]``.
"""

from __future__ import annotations

from fastdata.formats.base import FormatSpec, lazy_exports
from fastdata.formats.registry import register
from fastdata.formats.npy.verify import verify_files
from fastdata.formats.npy.writer import MemmapWriter, stored_names

LAYOUT_VERSION = 1
FORMAT = "npy"

__all__ = ["FORMAT", "LAYOUT_VERSION", "MemmapDataset", "MemmapWriter"]
__getattr__ = lazy_exports({"MemmapDataset": "fastdata.formats.npy.reader"})  # the reader imports torch: on first use

register(
    FormatSpec(
        name=FORMAT,
        dataset="fastdata.formats.npy.reader:MemmapDataset",
        writer=MemmapWriter,
        suffix=".npy",
        suffixes=(".npy",),
        layout_version=LAYOUT_VERSION,
        fields=True,
        stored_names=stored_names,
        description="memory-mapped numpy arrays in a directory",
        verify=verify_files,
    )
)
