"""A converted dataset written to a URL: its files uploaded one by one, the manifest last.

The conversion runs into a local staging copy (in the cache directory, so ``--resume`` continues
it there) and is uploaded: a marker object first (``.fastdata-upload``: "a fastdata upload in
progress", :func:`begin_upload`), each tar shard as soon as it is closed (:class:`ShardUploader`),
the rest once the conversion is done, the manifest last, then the marker is removed
(:func:`finish_upload`); s3fs sends large files as multipart uploads. A dataset at a URL is complete exactly when
its manifest is there, so an interrupted upload is never taken for a dataset; running the
conversion again (``--resume`` or ``--overwrite``) continues or replaces it.

``--overwrite`` follows the local rules: only a fastdata dataset (a manifest, or our marker) is
replaced, and its manifest is removed first so it is never seen half-replaced; a prefix holding
anything else is refused.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from fastdata.errors import OutputExistsError, RemoteNotFoundError
from fastdata.formats.tar.layout import RECORD_SUFFIX
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


class ShardUploader:
    """Uploads each tar shard of the conversion writing ``partial`` as soon as it is closed
    (the tar writer writes ``<shard><RECORD_SUFFIX>`` beside a finished shard), in a thread,
    while the conversion goes on. What it sent is in :attr:`sent`; what it did not (or what
    failed) the final pass of :func:`finish_upload` sends."""

    def __init__(self, partial: Path, url: str, options: RemoteOptions, *, poll_s: float = 0.2):
        self.partial, self.url, self.options, self.poll_s = partial, url, options, poll_s
        self.sent: dict[str, tuple[int, int]] = {}  # name -> (size, mtime_ns) as uploaded
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fastdata-upload")

    def __enter__(self) -> "ShardUploader":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        fs, path = filesystem(self.url, self.options.storage_options)
        path = path.rstrip("/")
        while not self._stop.wait(self.poll_s):
            try:
                for record in sorted(self.partial.glob("*" + RECORD_SUFFIX)):
                    shard = record.with_name(record.name[: -len(RECORD_SUFFIX)])
                    if self._stop.is_set() or not shard.is_file():
                        continue
                    stat = shard.stat()
                    if self.sent.get(shard.name) != (stat.st_size, stat.st_mtime_ns):
                        with_retry(lambda: fs.put_file(str(shard), f"{path}/{shard.name}"), self.url,
                                   self.options.retry, self.options.storage_options)
                        self.sent[shard.name] = (stat.st_size, stat.st_mtime_ns)
                        logger.info("uploaded %s as it was closed", scrub(f"{self.url}/{shard.name}"))
            except Exception as exc:  # noqa: BLE001 - the final pass sends it again, or raises
                logger.debug("upload of a closed shard failed: %s", scrub(str(exc), self.options.storage_options))


def finish_upload(local: Path, url: str, *, replace: list[str], options: RemoteOptions,
                  sent: dict[str, tuple[int, int]] | None = None) -> int:
    """Upload what of the finished local dataset ``local`` is not up yet (``sent``: uploaded as
    it was closed, by :class:`ShardUploader`), remove the replaced dataset's other files, then the
    manifest, then the marker. Returns the bytes sent here."""
    fs, path = filesystem(url, options.storage_options)
    path = path.rstrip("/")
    sent = sent or {}

    def call(function, *args):
        return with_retry(lambda: function(*args), url, options.retry, options.storage_options)

    if local.is_file():  # one object: it appears whole, or not at all
        call(fs.put_file, str(local), path)
        try:
            call(fs.rm_file, f"{path}/{MARKER}")
        except RemoteNotFoundError:
            pass
        return local.stat().st_size
    files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != MANIFEST_NAME)
    total = 0
    for file in files:
        name = file.relative_to(local).as_posix()
        stat = file.stat()
        if sent.get(name) == (stat.st_size, stat.st_mtime_ns):
            continue  # the rename into place keeps a file's mtime
        call(fs.put_file, str(file), f"{path}/{name}")
        total += stat.st_size
        logger.info("uploaded %s (%d bytes)", scrub(f"{url}/{name}"), stat.st_size)
    written = {file.relative_to(local).as_posix() for file in files}
    for stale in sorted(set(replace) - written - {MANIFEST_NAME, MARKER}):
        call(fs.rm_file, f"{path}/{stale}")  # a file of the old dataset the new one does not have
    call(fs.put_file, str(local / MANIFEST_NAME), f"{path}/{MANIFEST_NAME}")
    total += (local / MANIFEST_NAME).stat().st_size
    try:
        call(fs.rm_file, f"{path}/{MARKER}")
    except RemoteNotFoundError:
        pass
    return total


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

