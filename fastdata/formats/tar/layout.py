"""The tar layout fastdata writes: deterministic ustar members and shard names (see the
package docstring). Shared by the writer, the index checks and ``verify``."""

from __future__ import annotations

import numpy as np

from fastdata.errors import InvalidOptionError

FORMAT = "tar"
LAYOUT_VERSION = 1
INDEX_NAME = "index.json"
INDEX_FORMAT = "fastdata-tar-index"
BLOCK = 512  # tar block; every member is one 512-byte ustar header + data padded to 512
SHARD_PATTERN = "shard-{:06d}.tar"
TRAILER = bytes(2 * BLOCK)
RECORD_SUFFIX = ".record.json"  # a finished shard's index record, until the index is written
ZEROS = bytes(BLOCK)


def padded(size: np.ndarray | int) -> np.ndarray | int:
    return -(-size // BLOCK) * BLOCK


def _header_template() -> bytearray:
    block = bytearray(BLOCK)
    block[100:108] = b"0000644\x00"  # mode
    block[108:116] = b"0000000\x00"  # uid
    block[116:124] = b"0000000\x00"  # gid
    block[136:148] = b"00000000000\x00"  # mtime
    block[148:156] = b" " * 8  # checksum placeholder
    block[156:157] = b"0"  # regular file
    block[257:265] = b"ustar\x0000"
    return block


_TEMPLATE = bytes(_header_template())
_TEMPLATE_SUM = sum(_TEMPLATE)


def member_header(name: str, size: int) -> bytes:
    """The ustar header ``tarfile`` writes for a regular file with fixed metadata."""
    encoded = name.encode("ascii")
    if len(encoded) > 100 or size >= 8**11:
        raise InvalidOptionError(f"tar member {name!r} of {size} bytes does not fit a ustar header.")
    size_field = b"%011o\x00" % size
    checksum = _TEMPLATE_SUM + sum(encoded) + sum(size_field)
    return b"".join((
        encoded.ljust(100, b"\x00"), _TEMPLATE[100:124], size_field, _TEMPLATE[136:148],
        b"%06o\x00" % checksum, _TEMPLATE[155:],
    ))
