"""The ``hdf5`` format: one ``.h5`` file, readable with plain ``h5py``.

raw:      ``images`` (N, H, W, C) uint8 -- contiguous when uncompressed, chunked along N
          when compressed (or ``chunk_images`` is given)
encoded:  ``blob`` (total bytes,) uint8 -- every sample's encoded bytes, concatenated, contiguous
          ``offsets`` (N + 1,) int64 -- sample ``i`` is ``blob[offsets[i]:offsets[i + 1]]``
both:     ``labels`` (N,) int64; ``fastdata_manifest`` (M,) uint8 -- the manifest's UTF-8 JSON,
          contiguous (layout 2; layout 1 kept it in a variable-length attribute, which a damaged
          byte could make h5py read forever); fixed-length root attributes ``fastdata_format``,
          ``layout_version`` and ``classes`` (class names, index = label; left out when over
          60,000 bytes). Every dataset carries a fixed-length ``blake2b`` attribute: the checksum
          of its contents. No variable-length value anywhere, so nothing is read from HDF5's
          global heap. The file starts with a 512-byte HDF5 user block
          (skipped by h5py and every HDF5 tool) holding the checksum of every byte after it, so
          ``fastdata verify`` finds a flipped byte anywhere, metadata included.

Reading: contiguous, unfiltered datasets are memory-mapped at their file offset (as fast as
``npy``); chunked ones are read a whole chunk at a time, decompressed once and kept in a small
per-process cache. :class:`fastdata.loading.samplers.ChunkShuffleSampler` orders an epoch so each chunk
is needed once.
"""

from __future__ import annotations

from fastdata.formats.base import FormatSpec, lazy_exports
from fastdata.formats.registry import register
from fastdata.formats.hdf5.layout import FORMAT, LAYOUT_VERSION, MANIFEST_ATTR, USERBLOCK_BYTES, userblock
from fastdata.formats.hdf5.options import HDF5Options, default_chunk_images, parse_compression
from fastdata.formats.hdf5.storage import checked_dataset, read_manifest
from fastdata.formats.hdf5.verify import verify_file
from fastdata.formats.hdf5.writer import HDF5Writer, stored_names, write_manifest

__all__ = [
    "DEFAULT_CACHE_BYTES", "FORMAT", "LAYOUT_VERSION", "MANIFEST_ATTR", "USERBLOCK_BYTES", "HDF5Dataset",
    "HDF5Options", "HDF5Writer", "checked_dataset", "default_chunk_images", "parse_compression", "read_manifest",
    "userblock", "write_manifest",
]
__getattr__ = lazy_exports({"DEFAULT_CACHE_BYTES": "fastdata.formats.hdf5.reader",  # the reader imports torch
                            "HDF5Dataset": "fastdata.formats.hdf5.reader"})

register(
    FormatSpec(
        name=FORMAT,
        dataset="fastdata.formats.hdf5.reader:HDF5Dataset",
        writer=HDF5Writer,
        suffix=".h5",
        suffixes=(".h5", ".hdf5"),
        layout_version=LAYOUT_VERSION,
        fields=True,
        options=HDF5Options,
        read_manifest=read_manifest,
        stored_names=stored_names,
        description="one HDF5 file (contiguous or chunked/compressed images, or encoded bytes)",
        verify=verify_file,
    )
)
