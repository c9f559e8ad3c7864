"""A converted dataset written to a URL: its files uploaded one by one, the manifest last.

The conversion runs into a local staging copy (in the cache directory, so ``--resume`` continues
it there) and is uploaded: a marker object first (``.fastdata-upload``: "a fastdata upload in
progress", :func:`begin_upload`), each tar shard as soon as it is closed, then removed from the
local disk (:class:`ShardSink`), the rest once the conversion is done, the manifest last, then
the marker is removed (:func:`finish_upload`); s3fs sends large files as multipart uploads. A
dataset at a URL is complete exactly when its manifest is there, so an interrupted upload is
never taken for a dataset; running the conversion again (``--resume`` or ``--overwrite``)
continues or replaces it. A conversion that fails takes back what it added (its uploads and its
marker, :func:`undo_upload`), so the URL is as it found it.

``--overwrite`` follows the local rules (:func:`check_destination`): only a fastdata dataset (a
manifest, or our marker) is replaced, and only when it holds nothing its manifest does not list;
the objects deleted are those the old manifest lists (and the marker). The old dataset stays whole
and readable while the new one is converted (the driver then stages it whole, streaming no
shard), and its manifest is removed when the new files start to go up, so it is never read as
a mix of old and new.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastdata.errors import (FastdataError, InvalidOptionError, OutputExistsError, OutputWriteError, RemoteNotFoundError,
                             fix_option)
from fastdata.formats.base import FileSink
from fastdata.manifest import MANIFEST_NAME, parse_manifest
from fastdata.remote.cache import default_cache_dir
from fastdata.remote.cachedir import UPLOADS, claim_directory
from fastdata.remote.dataset import SINGLE_FILE_MAGIC, RemoteOptions
from fastdata.remote.filesystem import filesystem, naming_the_bucket, scrub, with_retry

logger = logging.getLogger(__name__)
MARKER = ".fastdata-upload"


def _listing(fs: Any, path: str) -> list[str]:
    """Every object name under ``path/`` (relative), empty when there is none."""
    try:
        found = fs.find(path, withdirs=False)
    except FileNotFoundError:
        return []
    prefix = path.rstrip("/") + "/"
    return sorted(name[len(prefix):] for name in found if name.startswith(prefix))


@dataclass(frozen=True)
class Destination:
    """What a conversion found at its output URL: the objects under it (names relative to it;
    ``[""]`` for one object, a ``.h5``) and, for a dataset there, its manifest."""

    url: str
    names: tuple[str, ...] = ()
    manifest: dict[str, Any] | None = None

    @property
    def dataset(self) -> bool:
        """A complete dataset is there (a manifest, or a fastdata ``.h5`` object)."""
        return self.manifest is not None or self.names == ("",)

    def replaceable(self) -> set[str]:
        """The objects an upload may delete: those the old manifest lists, the manifest and the
        marker; every object of an interrupted upload of ours (marker, no manifest: our partial
        output, as a local ``OUTPUT.partial`` is)."""
        if self.manifest is not None:
            return set(self.manifest.get("files") or {}) | {MANIFEST_NAME, MARKER}
        return set(self.names) - {""}


def check_output_url(url: str) -> None:
    """Refuse an output URL whose path has an empty, '.' or '..' part: object stores keep them in
    the objects' names, and listings name them differently, so the upload could not be found again."""
    scheme, _, rest = url.rstrip("/").partition("://")
    parts = rest.split("/")
    if any(part in ("", ".", "..") for part in parts[1:]):
        fixed = f"{scheme}://" + "/".join(part for part in parts if part not in ("", "."))
        raise InvalidOptionError(f"Output URL {scrub(url)!r} has an empty, '.' or '..' part in its path; object stores "
                                 f"keep those in the objects' names. Write it without them, e.g. {scrub(fixed)!r}.")


def check_destination(url: str, *, single: bool, overwrite: bool, resume: bool, options: RemoteOptions,
                      rerun: bool = False) -> Destination:
    """What is at ``url``, after checking that an upload may go there: nothing; an interrupted
    upload of ours (with ``overwrite``, ``resume`` or ``rerun``: a Ray conversion or a job
    array's part or merge, which keep what they finished and run again without ``--resume``); or
    a fastdata dataset (``single``: a one-file dataset such as ``.h5``, recognised by its fastdata
    user block), which ``overwrite`` replaces (refused when it holds objects its manifest does not
    list) and ``resume`` may keep."""
    fs, path = filesystem(url, options.storage_options)
    path = path.rstrip("/")
    with naming_the_bucket(url, options.storage_options):
        names = with_retry(lambda: _listing(fs, path), url, options.retry, options.storage_options)
    if not names:
        return _single_destination(fs, path, url, single=single, overwrite=overwrite, resume=resume, options=options)
    if single and names != [MARKER]:  # [MARKER]: an interrupted upload of an .h5, checked below
        raise OutputExistsError(f"Output {scrub(url)!r} is a folder of objects; fastdata never replaces it with a "
                                "file. Choose another output URL.")
    if MANIFEST_NAME in names:
        text = with_retry(lambda: fs.cat_file(f"{path}/{MANIFEST_NAME}"), url, options.retry, options.storage_options)
        manifest = parse_manifest(text.decode("utf-8", "replace"), repr(scrub(f"{url}/{MANIFEST_NAME}")))  # ours, or refused
        found = Destination(url, tuple(names), manifest)
        if not (overwrite or resume):
            raise OutputExistsError(f"Output {scrub(url)!r} already exists. Pass {fix_option('overwrite')} to replace it.")
        unlisted = [name for name in names if name not in found.replaceable()]
        if overwrite and unlisted:
            shown = ", ".join(repr(name) for name in unlisted[:3]) + (
                f" and {len(unlisted) - 3} more" if len(unlisted) > 3 else "")
            raise OutputExistsError(
                f"Output {scrub(url)!r} is a fastdata dataset but also holds {shown}, which its manifest does not "
                "list; fastdata replaces only what it wrote. Move those out, or choose another output URL.")
        return found
    if MARKER in names:
        if not (overwrite or resume or rerun):
            raise OutputExistsError(f"Output {scrub(url)!r} holds an interrupted fastdata upload (no manifest). "
                                    f"Pass {fix_option('resume')} to continue it or {fix_option('overwrite')} to replace "
                                    "it.")
        return Destination(url, tuple(names))
    raise OutputExistsError(f"Output {scrub(url)!r} already holds objects not written by fastdata (e.g. "
                            f"{names[0]!r}); fastdata never replaces them. Choose another output URL.")


def _single_destination(fs: Any, path: str, url: str, *, single: bool, overwrite: bool, resume: bool,
                        options: RemoteOptions) -> Destination:
    """Nothing under ``url/``: nothing there at all, or one object (a fastdata ``.h5`` or not)."""
    is_file = with_retry(lambda: fs.isfile(path), url, options.retry, options.storage_options)
    if not is_file:
        return Destination(url)
    head = with_retry(lambda: fs.cat_file(path, start=0, end=64), url, options.retry, options.storage_options)
    if not (single and head.startswith(SINGLE_FILE_MAGIC)):
        raise OutputExistsError(f"Output {scrub(url)!r} already exists and is not a fastdata dataset; fastdata "
                                "never replaces it. Choose another output URL.")
    if not (overwrite or resume):
        raise OutputExistsError(f"Output {scrub(url)!r} already exists. Pass {fix_option('overwrite')} to replace it.")
    return Destination(url, ("",))


def begin_upload(url: str, found: Destination, options: RemoteOptions) -> bool:
    """Mark ``url`` as an upload in progress (the marker object; a dataset being replaced keeps
    its manifest, and stays readable, until :func:`finish_upload`); whether the marker was
    written now (it was not there before)."""
    if MARKER in found.names:
        return False
    fs, path = filesystem(url, options.storage_options)
    marker = b"a fastdata conversion is uploading here; no manifest yet\n"
    with_retry(lambda: fs.pipe_file(f"{path.rstrip('/')}/{MARKER}", marker), url, options.retry,
               options.storage_options)
    return True


def undo_upload(found: Destination, sent: list[str], marked: bool, options: RemoteOptions) -> None:
    """After a failed conversion: what it added to the URL removed (the objects it uploaded that
    were not there before, and the marker it wrote), so the URL is as the conversion found it
    and the same command may run again. Best effort: when the store cannot be reached, the
    marker stays and the URL reads as an interrupted upload (``--resume`` or ``--overwrite``)."""
    url = found.url
    fs, path = filesystem(url, options.storage_options)
    path = path.rstrip("/")
    added = [name for name in sent if name not in found.names] + ([MARKER] if marked else [])
    try:
        for name in added:
            with contextlib.suppress(RemoteNotFoundError):
                with_retry(lambda: fs.rm_file(f"{path}/{name}"), url, options.retry, options.storage_options)
    except FastdataError as exc:
        logger.warning("could not remove what the failed conversion uploaded to %s (%s); it holds an interrupted "
                       "upload: run again with --resume or --overwrite", scrub(url), exc)


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


def finish_upload(local: Path, found: Destination, options: RemoteOptions) -> int:
    """Upload the files of the finished local dataset ``local`` that its manifest lists (what a
    :class:`ShardSink` sent as it was closed is no longer there, and is checked in the bucket
    instead), then the manifest, then remove the marker. A dataset being replaced loses its
    manifest first (it is never read as a mix of old and new files), and after the new files are
    up, its files the new one does not have. Returns the bytes sent here."""
    url = found.url
    fs, path = filesystem(url, options.storage_options)
    path = path.rstrip("/")

    def call(function, *args):
        return with_retry(lambda: function(*args), url, options.retry, options.storage_options)

    if local.is_file():  # one object: it appears whole, or not at all
        call(fs.put_file, str(local), path)
        with contextlib.suppress(RemoteNotFoundError):
            call(fs.rm_file, f"{path}/{MARKER}")
        return local.stat().st_size
    listed = json.loads((local / MANIFEST_NAME).read_text(encoding="utf-8")).get("files", {})  # every file
    here = [name for name in sorted(listed) if (local / name).is_file()]
    if MANIFEST_NAME in found.names:
        call(fs.rm_file, f"{path}/{MANIFEST_NAME}")  # from here on the old dataset is gone, the new one not there yet
    total = 0
    for name in here:
        size = (local / name).stat().st_size
        call(fs.put_file, str(local / name), f"{path}/{name}")
        total += size
        logger.info("uploaded %s (%d bytes)", scrub(f"{url}/{name}"), size)
    _check_streamed(fs, path, url, {name: entry for name, entry in listed.items() if name not in here}, options)
    for stale in sorted(found.replaceable() & set(found.names) - set(listed) - {MANIFEST_NAME, MARKER}):
        call(fs.rm_file, f"{path}/{stale}")  # a file of the old dataset (or upload) the new one does not have
    call(fs.put_file, str(local / MANIFEST_NAME), f"{path}/{MANIFEST_NAME}")
    total += (local / MANIFEST_NAME).stat().st_size
    with contextlib.suppress(RemoteNotFoundError):
        call(fs.rm_file, f"{path}/{MARKER}")
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
                f"or replaced since); the manifest was not written. Put it back and run again with {fix_option('resume')}, "
                f"or convert again with {fix_option('overwrite')}.")


def staging_path(url: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where a conversion to ``url`` is written before it is uploaded (kept for ``--resume``):
    under ``.uploads/`` of the cache's folder, which is claimed first (a folder that holds
    anything else is refused, :func:`fastdata.remote.cache.claim_directory`)."""
    import hashlib

    base = claim_directory(cache_dir if cache_dir is not None else default_cache_dir())
    name = url.rstrip("/").rsplit("/", 1)[-1]
    digest = hashlib.blake2b(scrub(url).encode(), digest_size=8).hexdigest()
    return base / UPLOADS / digest / name


def manifest_at(url: str, options: RemoteOptions) -> dict[str, Any] | None:
    """The manifest of the directory dataset at ``url`` (``manifest.json`` alone is fetched), or
    None when there is none (nothing there, an interrupted upload, a one-file dataset)."""
    fs, path = filesystem(url, options.storage_options)
    try:
        text = with_retry(lambda: fs.cat_file(f"{path.rstrip('/')}/{MANIFEST_NAME}"), url, options.retry,
                          options.storage_options)
    except RemoteNotFoundError:
        return None
    return parse_manifest(text.decode("utf-8", "replace"), repr(scrub(f"{url}/{MANIFEST_NAME}")))


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

