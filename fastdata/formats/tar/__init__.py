"""The ``tar`` format: WebDataset-compatible shards plus a JSON shard index.

A directory holding ``shard-000000.tar``, ``shard-000001.tar``, ... (bounded by
``shard_samples`` and ``shard_bytes``), ``index.json`` and ``manifest.json``. Sample ``i`` is the
members ``<key>.<ext>`` (the image: original bytes ``.jpg``/``.png``/... for ``--store encoded``,
a uint8 HWC ``.npy`` for ``--store raw``), ``<key>.cls`` (the label as decimal text; samples
without a label, such as detection or caption samples with no ``label`` field, have none) and one
member per further field, where ``key`` is ``i`` zero-padded to ``key_width`` digits, or the
sample's own key where a field of keys is marked ``member_key`` (a WebDataset source's unique
``__key__``s; the index's ``key`` column). Every member is one 512-byte ustar header
(mode 0644, uid/gid 0, mtime 0) and its data padded to 512 bytes; a shard ends with two zero
blocks. The same input gives byte-identical shards and index. Stock ``webdataset.WebDataset``
and GNU tar read the shards; the index records, per sample, the data offset and size of both
members, which the readers (``reader.py``, ``stream.py``) use to read without parsing tar streams.
"""

from __future__ import annotations

from fastdata.formats.base import FormatSpec, lazy_exports
from fastdata.formats.registry import register
from fastdata.formats.tar.layout import BLOCK, FORMAT, INDEX_NAME, LAYOUT_VERSION, TRAILER, member_header, padded
from fastdata.formats.tar.verify import verify_shards
from fastdata.formats.tar.writer import TarOptions, TarWriter, stored_names
from fastdata.quantities import parse_bytes

__all__ = [
    "BLOCK", "FORMAT", "INDEX_NAME", "LAYOUT_VERSION", "TRAILER", "ShardSplitWarning", "TarDataset",
    "TarIndexedDataset", "TarOptions", "TarWriter", "member_header", "padded", "parse_bytes",
]
__getattr__ = lazy_exports({"TarIndexedDataset": "fastdata.formats.tar.reader",  # the readers import torch
                            "ShardSplitWarning": "fastdata.formats.tar.stream", "TarDataset": "fastdata.formats.tar.stream"})

register(
    FormatSpec(
        name=FORMAT,
        dataset="fastdata.formats.tar.stream:TarDataset",
        writer=TarWriter,
        suffixes=(".tar",),
        layout_version=LAYOUT_VERSION,
        fields=True,
        stored_names=stored_names,
        options=TarOptions,
        verify=verify_shards,
        map_reader="fastdata.formats.tar.reader:TarIndexedDataset",
        self_batching=True,
        description="WebDataset-compatible tar shards with a JSON shard index",
    )
)
