"""The stored size distribution ``fastdata info`` shows: bytes per image from the whole index
(offsets, or the tar shard index), width and height from the image headers of an evenly spaced
sample (at most :data:`HEADER_SAMPLES`; Pillow reads a header without decoding the image)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Callable

import numpy as np

HEADER_SAMPLES = 1000


def _blob_reader(path: Path, manifest: dict[str, Any]) -> tuple[np.ndarray, Callable[[int], bytes]] | None:
    """(bytes of every stored image, sample index -> its bytes), or None for formats without an
    index of encoded images."""
    from fastdata.api import open_dataset

    name = manifest.get("format")
    if name in ("npy", "hdf5"):
        dataset = open_dataset(path)
        offsets = dataset.offsets
        data = dataset.handles if name == "npy" else dataset.handles.data
        return np.diff(offsets), lambda i: bytes(data[offsets[i] : offsets[i + 1]])
    if name == "tar":
        from fastdata.formats.tar import TarIndexedDataset
        from fastdata.formats.tar.index import open_shard, read_exact

        dataset = TarIndexedDataset(path)
        index, descriptors = dataset.index, {}

        def read(i: int) -> bytes:
            shard = int(index.shard_of[i])
            if shard not in descriptors:
                descriptors[shard] = open_shard(path, index, shard)
            return read_exact(descriptors[shard], int(index.image_size[i]), int(index.image_offset[i]),
                              path / index.files[shard])

        return np.asarray(index.image_size), read
    return None


def stored_sizes(path: Path, manifest: dict[str, Any], samples: int = HEADER_SAMPLES) -> dict[str, Any] | None:
    """``{"width": [min, median, max], "height": [...], "bytes": [...], "headers_read": n}`` of an
    encoded dataset (stored pixels: every image has the manifest's shape, so None)."""
    from PIL import Image

    if manifest.get("store") != "encoded" or not manifest.get("count"):
        return None
    found = _blob_reader(path, manifest)
    if found is None:
        return None
    sizes, read = found
    picked = np.unique(np.linspace(0, len(sizes) - 1, min(samples, len(sizes))).round().astype(np.int64))
    widths, heights = [], []
    for index in picked.tolist():
        with Image.open(io.BytesIO(read(index))) as image:
            widths.append(image.width)
            heights.append(image.height)

    def spread(values: Any) -> list[int]:
        return [int(np.min(values)), int(np.median(values)), int(np.max(values))]

    return {"width": spread(widths), "height": spread(heights), "bytes": spread(sizes), "headers_read": len(picked)}


def sizes_line(sizes: dict[str, Any], count: int, human_bytes: Callable[[float], str]) -> str:
    """``width 85/256/256, height 100/218/256, bytes 2.1 kB/5.3 kB/9.0 kB (min/median/max; ...)``."""
    low, middle, high = (human_bytes(value) for value in sizes["bytes"])
    width, height = ("/".join(map(str, sizes[key])) for key in ("width", "height"))
    sampled = f"sizes from {sizes['headers_read']:,} of {count:,} headers" if sizes["headers_read"] < count \
        else "sizes from every header"
    return f"width {width}, height {height}, bytes {low}/{middle}/{high} (min/median/max; {sampled})"
