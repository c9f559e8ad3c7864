"""The one ``.npy`` header writer, for every format that stores raw pixels as ``.npy``: the npy
format's ``images.npy`` (written in place, so its header may need rewriting to a fixed length)
and the tar format's ``.npy`` members. It writes exactly what ``numpy.lib.format`` writes
(format 1.0, uint8, C order; checked by a test)."""

from __future__ import annotations

import struct

MAGIC = b"\x93NUMPY\x01\x00"


def npy_header(shape: tuple[int, ...], length: int = 0, descr: str = "|u1") -> bytes:
    """A format-1.0 .npy header for a C-order array of ``shape`` (uint8 unless ``descr`` says
    another dtype, e.g. ``'<f4'``), padded to a multiple of 64 bytes, or to ``length`` bytes when
    given (to rewrite a header in place)."""
    text = "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (descr, tuple(int(v) for v in shape))
    total = max(length, -(-(len(text) + 11) // 64) * 64)
    text = text.ljust(total - 10 - 1) + "\n"
    return MAGIC + struct.pack("<H", len(text)) + text.encode("latin1")
