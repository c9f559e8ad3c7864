"""A converted dataset written to a URL: its files uploaded one by one, the manifest last.

The conversion runs into a local staging copy (in the cache directory, so ``--resume`` continues
it there) and is uploaded: a marker object first (``.fastdata-upload``: "a fastdata upload in
progress", :func:`begin_upload`), each tar shard as soon as it is closed, then removed from the
local disk (:class:`ShardSink`), the rest once the conversion is done, the manifest last, then
the marker is removed (:func:`finish_upload`); s3fs sends large files as multipart uploads. A dataset at a URL is complete exactly when
its manifest is there, so an interrupted upload is never taken for a dataset; running the
conversion again (``--resume`` or ``--overwrite``) continues or replaces it.

``--overwrite`` follows the local rules: only a fastdata dataset (a manifest, or our marker) is
replaced, and its manifest is removed first so it is never seen half-replaced; a prefix holding
anything else is refused.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from pathlib import Path
from typing import Any

from fastdata.errors import OutputExistsError, OutputWriteError, RemoteNotFoundError
from fastdata.formats.base import FileSink
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
    if single and names != [MARKER]:  # [MARKER]: an interrupted upload of an .h5, checked below
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


def begin_upload(url: str, *, replace: list[str], options: RemoteOptions) -> None:
    """Mark ``url`` as an upload in progress: the marker object written, and the manifest of a
    dataset being replaced removed first (from here on it is no dataset until the new manifest)."""
    fs, path = filesystem(url, options.storage_options)
    path = path.rstrip("/")
    if replace == [""]:
        return  # one object (.h5): replaced whole by its upload
    if MANIFEST_NAME in replace:
        with_retry(lambda: fs.rm_file(f"{path}/{MANIFEST_NAME}"), url, options.retry, options.storage_options)
    marker = b"a fastdata conversion is uploading here; no manifest yet\n"
    with_retry(lambda: fs.pipe_file(f"{path}/{MARKER}", marker), url, options.retry, options.storage_options)


class ShardSink(FileSink):
    """The sink of a streaming writer (tar) converting to ``url``: each finished shard uploaded
    under its name as soon as the writer closes it, then removed from the local disk (in the
    writer's thread, which waits for it before it closes the next one); brought back when a
    resumed conversion reopens it. What it sent is in :attr:`sent`."""

    def __init__(self, url: str, options: RemoteOptions):
        self.url, self.options = url.rstrip("/"), options
        self.sent: list[str] = []

    def _call(self, function, name: str):
        return with_retry(function, f"{self.url}/{name}", self.options.retry, self.options.storage_options)

    def closed(self, path: Path) -> None:
        fs, base = filesystem(self.url, self.options.storage_options)
        logger.debug("uploading %s (%d bytes)", scrub(f"{self.url}/{path.name}"), path.stat().st_size)
        self._call(lambda: fs.put_file(str(path), f"{base.rstrip('/')}/{path.name}"), path.name)
        path.unlink()
        self.sent.append(path.name)
        logger.info("uploaded %s as it was closed (its local copy removed)", scrub(f"{self.url}/{path.name}"))

    def restore(self, path: Path) -> None:
        fs, base = filesystem(self.url, self.options.storage_options)
        temporary = path.with_name(f"{path.name}.{secrets.token_hex(4)}.download")
        try:
            self._call(lambda: fs.get_file(f"{base.rstrip('/')}/{path.name}", str(temporary)), path.name)
            os.replace(temporary, path)  # whole, or not there
        finally:
            temporary.unlink(missing_ok=True)
        logger.info("brought back %s to resume it", scrub(f"{self.url}/{path.name}"))


def finish_upload(local: Path, url: str, *, replace: list[str], options: RemoteOptions) -> int:
    """Upload the files of the finished local dataset ``local`` that its manifest lists (what a
    :class:`ShardSink` sent as it was closed is no longer there, and is checked in the bucket
    instead), remove the replaced dataset's other files, then upload the manifest, then remove
    the marker. Returns the bytes sent here."""
    fs, path = filesystem(url, options.storage_options)
    path = path.rstrip("/")

    def call(function, *args):
        return with_retry(lambda: function(*args), url, options.retry, options.storage_options)

    if local.is_file():  # one object: it appears whole, or not at all
        call(fs.put_file, str(local), path)
        try:
            call(fs.rm_file, f"{path}/{MARKER}")
        except RemoteNotFoundError:
            pass
        return local.stat().st_size
    listed = json.loads((local / MANIFEST_NAME).read_text(encoding="utf-8")).get("files", {})  # every file
    here = [name for name in sorted(listed) if (local / name).is_file()]
    total = 0
    for name in here:
        size = (local / name).stat().st_size
        call(fs.put_file, str(local / name), f"{path}/{name}")
        total += size
        logger.info("uploaded %s (%d bytes)", scrub(f"{url}/{name}"), size)
    _check_streamed(fs, path, url, {name: entry for name, entry in listed.items() if name not in here}, options)
    for stale in sorted(set(replace) - set(listed) - {MANIFEST_NAME, MARKER}):
        call(fs.rm_file, f"{path}/{stale}")  # a file of the old dataset the new one does not have
    call(fs.put_file, str(local / MANIFEST_NAME), f"{path}/{MANIFEST_NAME}")
    total += (local / MANIFEST_NAME).stat().st_size
    try:
        call(fs.rm_file, f"{path}/{MARKER}")
    except RemoteNotFoundError:
        pass
    return total


def _check_streamed(fs: Any, path: str, url: str, expected: dict[str, dict[str, Any]], options: RemoteOptions) -> None:
    """Before the manifest goes up: every file it lists that was uploaded as it was closed (and is
    no longer local) is in the bucket with the manifest's size."""
    if not expected:
        return
    found = with_retry(lambda: fs.find(path, withdirs=False, detail=True), url, options.retry, options.storage_options)
    sizes = {name[len(path) + 1:]: info.get("size") for name, info in found.items() if name.startswith(path + "/")}
    for name, entry in sorted(expected.items()):
        if sizes.get(name) != entry.get("bytes"):
            there = "is missing" if name not in sizes else f"has {sizes[name]} bytes, not {entry.get('bytes')}"
            raise OutputWriteError(
                f"{scrub(f'{url}/{name}')!r}, uploaded while the conversion ran, {there} in the bucket now (removed "
                "or replaced since); the manifest was not written. Put it back and run again with --resume, or "
                "convert again with --overwrite.")


def staging_path(url: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where a conversion to ``url`` is written before it is uploaded (kept for ``--resume``)."""
    import hashlib

    from fastdata.remote.cache import default_cache_dir

    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    name = url.rstrip("/").rsplit("/", 1)[-1]
    digest = hashlib.blake2b(scrub(url).encode(), digest_size=8).hexdigest()
    return base / ".uploads" / digest / name


def check_writable(url: str, options: RemoteOptions) -> None:
    """Reach ``url`` before a long run writes there (``bench --out URL``): no credentials, a
    403 or an unreachable server is one clear error now, not after the run."""
    fs, path = filesystem(url, options.storage_options)
    with_retry(lambda: fs.exists(path.rstrip("/")), url, options.retry, options.storage_options)


def upload_results(files: list[Path], url: str, options: RemoteOptions) -> list[str]:
    """Put each of ``files`` under ``url`` (``bench --out URL``'s results); their URLs."""
    fs, path = filesystem(url, options.storage_options)
    path = path.rstrip("/")
    sent = []
    for file in files:
        with_retry(lambda: fs.put_file(str(file), f"{path}/{file.name}"), f"{url.rstrip('/')}/{file.name}",
                   options.retry, options.storage_options)
        sent.append(f"{scrub(url).rstrip('/')}/{file.name}")
    return sent

