"""The stored size distribution ``fastdata info`` shows: bytes per image from the whole index
(each format's reader gives it: :meth:`fastdata.formats.base.Reader.encoded_sizes`), width and height from the image headers of an evenly spaced
sample (at most :data:`HEADER_SAMPLES`; Pillow reads a header without decoding the image)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Callable

import numpy as np

HEADER_SAMPLES = 1000


def _blob_reader(path: Path, manifest: dict[str, Any]) -> tuple[np.ndarray, Callable[[int], bytes]] | None:
    """(bytes of every stored image, sample index -> its bytes) from the format's map-style reader
    (its :meth:`~fastdata.formats.base.Reader.encoded_sizes` and ``_encoded`` hooks), or None
    for a format whose reader keeps no index of encoded images."""
    from fastdata.errors import UnknownFormatError
    from fastdata.formats import get_format

    try:
        reader_class = get_format(manifest.get("format")).map_dataset
    except UnknownFormatError:  # a format not installed here: its manifest is shown, without sizes
        return None
    if reader_class is None:
        return None
    reader = reader_class(path)
    sizes = reader.encoded_sizes()
    if sizes is None:
        return None
    return np.asarray(sizes), lambda i: reader._encoded(np.array([i], dtype=np.int64))[0]


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
