"""A converted dataset written to a URL: its files uploaded one by one, the manifest last.

The conversion runs into a local staging copy (in the cache directory, so ``--resume`` continues
it there), then :func:`upload_dataset` copies it: a marker object first (``.fastdata-upload``:
"a fastdata upload in progress"), every data file (s3fs splits large ones into multipart
uploads), the manifest, then the marker is removed. A dataset at a URL is complete exactly when
its manifest is there, so an interrupted upload is never taken for a dataset; running the
conversion again (``--resume`` or ``--overwrite``) continues or replaces it.

``--overwrite`` follows the local rules: only a fastdata dataset (a manifest, or our marker) is
replaced, and its manifest is removed first so it is never seen half-replaced; a prefix holding
anything else is refused.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from fastdata.errors import OutputExistsError, RemoteNotFoundError
from fastdata.manifest import MANIFEST_NAME, parse_manifest
from fastdata.remote.dataset import RemoteOptions
from fastdata.remote.filesystem import filesystem, scrub, with_retry

logger = logging.getLogger(__name__)
MARKER = ".fastdata-upload"
SINGLE_FILE_MAGIC = b"fastdata hdf5 "  # the start of an .h5 dataset's user block (formats/hdf5/layout.py)


def _listing(fs: Any, path: str) -> list[str]:
    """Every object name under ``path/`` (relative), empty when there is none."""
    try:
        found = fs.find(path, withdirs=False)
    except FileNotFoundError:
        return []
    prefix = path.rstrip("/") + "/"
    return sorted(name[len(prefix):] for name in found if name.startswith(prefix))


def check_destination(url: str, *, single: bool, overwrite: bool, resume: bool, options: RemoteOptions) -> list[str]:
    """The objects already at ``url`` that an upload replaces, after checking it may: nothing
    there; an interrupted upload of ours; or, with ``overwrite``, a fastdata dataset (``single``:
    a one-file dataset such as ``.h5``, recognised by its fastdata user block)."""
    fs, path = filesystem(url, options.storage_options)
    path = path.rstrip("/")
    names = with_retry(lambda: _listing(fs, path), url, options.retry, options.storage_options)
    if not names:
        is_file = with_retry(lambda: fs.isfile(path), url, options.retry, options.storage_options)
        if not is_file:
            return []
        head = with_retry(lambda: fs.cat_file(path, start=0, end=64), url, options.retry, options.storage_options)
        if not (single and head.startswith(SINGLE_FILE_MAGIC)):
            raise OutputExistsError(f"Output {scrub(url)!r} already exists and is not a fastdata dataset; fastdata "
                                    "never replaces it. Choose another output URL.")
        if not overwrite:
            raise OutputExistsError(f"Output {scrub(url)!r} already exists. Pass --overwrite to replace it.")
        return [""]
    if single:
        raise OutputExistsError(f"Output {scrub(url)!r} is a folder of objects; fastdata never replaces it with a "
                                "file. Choose another output URL.")
    if MANIFEST_NAME in names:
        text = with_retry(lambda: fs.cat_file(f"{path}/{MANIFEST_NAME}"), url, options.retry, options.storage_options)
        parse_manifest(text.decode("utf-8", "replace"), repr(scrub(f"{url}/{MANIFEST_NAME}")))  # ours, or refused
        if not overwrite:
            raise OutputExistsError(f"Output {scrub(url)!r} already exists. Pass --overwrite to replace it.")
        return names
    if MARKER in names:
        if not (overwrite or resume):
            raise OutputExistsError(f"Output {scrub(url)!r} holds an interrupted fastdata upload (no manifest). "
                                    "Pass --resume to continue it or --overwrite to replace it.")
        return names
    raise OutputExistsError(f"Output {scrub(url)!r} already holds objects not written by fastdata (e.g. "
                            f"{names[0]!r}); fastdata never replaces them. Choose another output URL.")


def upload_dataset(local: Path, url: str, *, replace: list[str], options: RemoteOptions) -> int:
    """Upload the finished local dataset ``local`` (a directory) to ``url``, the manifest last;
    ``replace``: the objects there now (from :func:`check_destination`). Returns bytes sent."""
    fs, path = filesystem(url, options.storage_options)
    path = path.rstrip("/")

    def call(function, *args):
        return with_retry(lambda: function(*args), url, options.retry, options.storage_options)

    if local.is_file():  # one object: it appears whole, or not at all
        call(fs.put_file, str(local), path)
        return local.stat().st_size

    if MANIFEST_NAME in replace:
        call(fs.rm_file, f"{path}/{MANIFEST_NAME}")  # no longer a dataset from here on, until the new manifest
    call(fs.pipe_file, f"{path}/{MARKER}", b"a fastdata conversion is uploading here; no manifest yet\n")
    files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != MANIFEST_NAME)
    sent = 0
    for file in files:
        name = file.relative_to(local).as_posix()
        call(fs.put_file, str(file), f"{path}/{name}")
        sent += file.stat().st_size
        logger.info("uploaded %s (%d bytes)", scrub(f"{url}/{name}"), file.stat().st_size)
    written = {file.relative_to(local).as_posix() for file in files}
    for stale in sorted(set(replace) - written - {MANIFEST_NAME, MARKER}):
        call(fs.rm_file, f"{path}/{stale}")  # a file of the old dataset the new one does not have
    call(fs.put_file, str(local / MANIFEST_NAME), f"{path}/{MANIFEST_NAME}")
    sent += (local / MANIFEST_NAME).stat().st_size
    try:
        call(fs.rm_file, f"{path}/{MARKER}")
    except RemoteNotFoundError:
        pass
    return sent


def staging_path(url: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where a conversion to ``url`` is written before it is uploaded (kept for ``--resume``)."""
    import hashlib

    from fastdata.remote.cache import default_cache_dir

    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    name = url.rstrip("/").rsplit("/", 1)[-1]
    digest = hashlib.blake2b(scrub(url).encode(), digest_size=8).hexdigest()
    return base / ".uploads" / digest / name
