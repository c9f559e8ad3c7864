"""URLs are refused where fastdata takes local paths, never taken for relative paths.

``Path("s3://bucket/out.tar")`` is the local path ``s3:/bucket/out.tar``: a conversion to it once
wrote a local folder and reported success, and ``info``/``verify`` then read that folder back.
Until object storage is supported, every entry point (the CLI's path arguments,
:func:`fastdata.convert`, :func:`fastdata.open_dataset`, :func:`fastdata.verify`) checks its
paths here first.
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
            f"{os.fspath(value)!r}: {role} is a {scheme}:// URL, and fastdata reads and writes local paths only "
            "(object storage is not supported yet). Copy the dataset to a local directory, or mount the bucket "
            "and give its local path."
        )
