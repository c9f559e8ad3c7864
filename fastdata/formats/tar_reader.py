"""Deprecated: the tar readers moved to :mod:`fastdata.formats.tar` (``TarDataset``,
``TarIndexedDataset``; the pieces to ``fastdata.formats.tar.reader``/``stream``/``index``)."""

import warnings

from fastdata.formats.tar.index import ShardIndex, load_index, open_shard, read_exact
from fastdata.formats.tar.layout import BLOCK, FORMAT, INDEX_NAME, LAYOUT_VERSION, padded
from fastdata.formats.tar.reader import TarIndexedDataset, load_dataset
from fastdata.formats.tar.stream import ShardSplitWarning, TarDataset
from fastdata.formats.tar.verify import verify_shards

warnings.warn("fastdata.formats.tar_reader is deprecated: import from fastdata.formats.tar instead.",
              DeprecationWarning, stacklevel=2)

__all__ = ["BLOCK", "FORMAT", "INDEX_NAME", "LAYOUT_VERSION", "ShardIndex", "ShardSplitWarning", "TarDataset",
           "TarIndexedDataset", "load_dataset", "load_index", "open_shard", "padded", "read_exact", "verify_shards"]
