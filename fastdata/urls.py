"""URLs: recognised, and refused where fastdata still takes only local paths.

``Path("s3://bucket/out.tar")`` is the local path ``s3:/bucket/out.tar``: a conversion to it once
wrote a local folder and reported success, and ``info``/``verify`` then read that folder back.
Reading a URL goes through :mod:`fastdata.remote` (readers, ``open_dataset``, ``verify``, the
CLI's ``info``/``verify``/``bench``/``tune`` and ``convert``'s SOURCE), and so does the OUTPUT
of ``convert`` (every engine and ``--part``) and ``merge`` (:mod:`fastdata.conversion.remote.upload`) and
``bench --out`` (its results); what is still local only (``preview --out``) is refused here,
never taken for a relative path.
"""

from __future__ import annotations

import os
import re
from typing import Any

from fastdata.errors import UnsupportedURLError

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(value: Any) -> bool:
    """Whether ``value`` (a str or path-like) is written as a URL (``scheme://...``)."""
    if not isinstance(value, (str, os.PathLike)):
        return False
    text = os.fspath(value)
    return isinstance(text, str) and bool(_URL.match(text))


def refuse_url(value: Any, role: str) -> None:
    """Raise :class:`UnsupportedURLError` when ``value`` is a URL; ``role`` names the argument."""
    if is_url(value):
        scheme = os.fspath(value).split("://", 1)[0]
        raise UnsupportedURLError(
            f"{os.fspath(value)!r}: {role} is a {scheme}:// URL, and this writes to local paths only (of the "
            "writing commands only 'fastdata convert', 'fastdata merge' and 'fastdata bench --out' upload to a URL). Write to a local directory, then copy it "
            "to the bucket (e.g. 'aws s3 cp --recursive DIR URL')."
        )
