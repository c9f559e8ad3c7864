"""Deprecated: moved to :mod:`fastdata.formats.tar.split`."""

import warnings

from fastdata.formats.tar.split import buffer_shuffle, resolve_distributed, shard_order, split_pieces

warnings.warn("fastdata.formats.tar_split is deprecated: import from fastdata.formats.tar.split instead.",
              DeprecationWarning, stacklevel=2)

__all__ = ["buffer_shuffle", "resolve_distributed", "shard_order", "split_pieces"]
