"""Options of ``--format hdf5``: compression (gzip, lzf; blosc, lz4, zstd with hdf5plugin) and
the chunk-size rule."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdata.errors import InvalidOptionError
from fastdata.extras import require
from fastdata.quantities import parse_count

CHUNK_TARGET_BYTES = 1 << 20  # the chunk-size rule: ~1 MiB of pixels per chunk
PLUGIN_CODECS = ("blosc", "lz4", "zstd")  # need the hdf5plugin package
_LEVELS = {"gzip": (0, 9, 4), "blosc": (0, 9, 5), "zstd": (1, 22, 3)}  # min, max, default


def parse_compression(value: str | None) -> str | None:
    """``"gzip"`` -> ``"gzip:4"``, ``"lzf"``, ``"zstd:9"``, ``"none"`` -> None (validated)."""
    if value is None:
        return None
    text = str(value).strip().lower()
    if text in ("", "none"):
        return None
    match = re.fullmatch(r"(gzip|lzf|blosc|lz4|zstd)(?::(\d+))?", text)
    allowed = "'none', 'gzip[:0-9]', 'lzf', and with hdf5plugin 'blosc[:0-9]', 'lz4', 'zstd[:1-22]'"
    if not match:
        raise InvalidOptionError(f"Invalid --compression {value!r}. Allowed: {allowed}.")
    codec, level = match.group(1), match.group(2)
    if codec in PLUGIN_CODECS:
        import_hdf5plugin(f"compression {value!r}")
    if codec not in _LEVELS:
        if level is not None:
            raise InvalidOptionError(f"Invalid --compression {value!r}: {codec} takes no level. Use {codec!r}.")
        return codec
    low, high, default = _LEVELS[codec]
    level_value = default if level is None else int(level)
    if not low <= level_value <= high:
        raise InvalidOptionError(f"Invalid --compression {value!r}: the {codec} level must be in {low}..{high}. "
                                 f"Use e.g. '{codec}:{default}'.")
    return f"{codec}:{level_value}"


def import_hdf5plugin(what: str) -> Any:
    return require("hdf5plugin", extra="hdf5plugin", feature=what, otherwise="use 'gzip' or 'lzf'")


@dataclass(frozen=True)
class HDF5Options:
    """Options of ``--format hdf5``; ``compression`` applies to ``--store raw`` only."""

    compression: str | None = field(
        default=None,
        metadata={
            "help": "hdf5, raw store: none (default, contiguous), gzip[:LEVEL], lzf; with hdf5plugin "
            "blosc[:LEVEL], lz4, zstd[:LEVEL]",
            "metavar": "CODEC[:LEVEL]",
        },
    )
    chunk_images: int | None = field(
        default=None,
        metadata={
            "help": "hdf5, raw store: images per chunk (default: about 1 MiB of pixels per chunk)",
            "metavar": "N",
        },
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "compression", parse_compression(self.compression))
        object.__setattr__(self, "chunk_images", parse_count(self.chunk_images, flag="--chunk-images", allow_none=True))


def default_chunk_images(image_shape: tuple[int, ...], count: int) -> int:
    """The chunk-size rule: as many images as fit in 1 MiB, at least 1, at most ``count``."""
    image_bytes = int(np.prod(image_shape))
    return max(1, min(max(count, 1), CHUNK_TARGET_BYTES // max(image_bytes, 1)))


def filter_kwargs(compression: str | None) -> dict[str, Any]:
    """h5py ``create_dataset`` keyword arguments for a normalised compression name."""
    if compression is None:
        return {}
    codec, _, level = compression.partition(":")
    if codec == "gzip":
        return {"compression": "gzip", "compression_opts": int(level)}
    if codec == "lzf":
        return {"compression": "lzf"}
    plugin = import_hdf5plugin(f"compression {compression!r}")
    if codec == "blosc":
        return dict(plugin.Blosc(cname="lz4", clevel=int(level), shuffle=plugin.Blosc.SHUFFLE))
    if codec == "lz4":
        return dict(plugin.LZ4())
    return dict(plugin.Zstd(clevel=int(level)))
