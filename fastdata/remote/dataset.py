"""A converted dataset at a URL, seen by the readers as a local directory in the cache.

:func:`locate` is what a reader calls with its path: a local path comes back as it is; a URL
comes back as the dataset's directory in the cache, with a :class:`RemoteFiles` that brings the
files there. The manifest is fetched from the server each time a dataset is opened (it is
small), and names the cache directory together with the URL (``<name>-<hash of URL and manifest
checksum>``), so a dataset converted again never meets the old copy's files. Every data file is
checked on arrival against the manifest's blake2b; a single-file dataset (``.h5``, which
carries its manifest inside) against its own whole-file checksum, by the format's verify, which
the caller passes (``check_single``: :func:`fastdata.formats.stored.single_file_problem`), so
nothing here knows a format.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from fastdata.errors import CorruptManifestError, InvalidOptionError, ManifestError, RemoteNotFoundError
from fastdata.manifest import CHECKSUM_ALGORITHM, MANIFEST_CHECKSUM_KEY, MANIFEST_NAME, is_plain_name, parse_manifest
from fastdata.remote.cache import Cache, Lease
from fastdata.remote.fetch import DOWNLOADS, Prefetcher
from fastdata.remote.filesystem import Retry, filesystem, naming_the_bucket, remember_session, scrub, with_retry
from fastdata.urls import is_url

logger = logging.getLogger(__name__)
SINGLE_FILE_MAGIC = b"fastdata hdf5 "  # how a one-file dataset (.h5) starts: its user block (formats/hdf5/layout.py)


@dataclass(frozen=True)
class RemoteOptions:
    """How a URL is read: ``storage_options`` for the fsspec filesystem (credentials, endpoint;
    never shown in a repr), ``cache_dir``/``cache_limit`` of the cache, ``retry`` for transient
    errors, ``prefetch`` shards fetched ahead per worker, at the same time (tar).

    The one declaration of these options: readers take them as keywords by these names
    (:meth:`keywords`, :meth:`from_keywords`), ``open_dataset`` too."""

    storage_options: dict[str, Any] | None = field(default=None, repr=False)
    cache_dir: str | os.PathLike | None = None
    cache_limit: int | None = None
    retry: Retry = field(default_factory=Retry.from_env)
    prefetch: int = field(default=2, metadata={"streaming": True})  # only readers that stream files take it

    @classmethod
    def keywords(cls, *, streaming: bool = True) -> tuple[str, ...]:
        """The option names, in declaration order (without those of streaming readers unless ``streaming``)."""
        return tuple(f.name for f in dataclasses.fields(cls) if streaming or not f.metadata.get("streaming"))

    @classmethod
    def from_keywords(cls, values: dict[str, Any]) -> "RemoteOptions":
        """The options named in ``values`` (other keys ignored; None: the default)."""
        return cls(**{name: values[name] for name in cls.keywords() if values.get(name) is not None})

    def __post_init__(self) -> None:
        if self.storage_options is not None and not isinstance(self.storage_options, dict):
            raise InvalidOptionError(f"storage_options must be a dict of fsspec filesystem options, not "
                                     f"{type(self.storage_options).__name__}.")
        limit = self.cache_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
            raise InvalidOptionError(f"Invalid cache_limit {limit!r}. Use a positive number of bytes.")
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise InvalidOptionError(f"cache_dir must be a path, not {type(self.cache_dir).__name__}.")
        if not isinstance(self.retry, Retry):
            raise InvalidOptionError(f"retry must be a fastdata.remote.Retry, not {type(self.retry).__name__}.")
        if isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int) or self.prefetch < 0:
            raise InvalidOptionError(f"Invalid prefetch {self.prefetch!r}. Use a number of shards >= 0.")


class LocalFiles:
    """The files of a local dataset: already there."""

    url = None

    def ensure(self, names: Iterable[str]) -> None:
        return None

    def lease(self, name: str) -> None:
        return None

    def prefetch(self, names: list[str]) -> None:
        return None

    def close(self) -> None:
        return None


class RemoteFiles:
    """The files of the dataset at ``url``, brought into ``cache`` on demand. Pickles as its
    URL and options; each process opens its own filesystem and holds its own leases."""

    def __init__(self, url: str, options: RemoteOptions, key: str, manifest: dict[str, Any] | None,
                 single: str | None = None, single_size: int = 0,
                 check_single: Callable[[Path, str], str | None] | None = None):
        self.url, self.options, self.key, self.manifest, self.single = url.rstrip("/"), options, key, manifest, single
        self.single_size = single_size  # a single-file dataset's size on the server
        self.check_single = check_single  # (its downloaded file, the URL) -> what is wrong with it, or None
        self._setup()

    def _setup(self) -> None:
        self.cache = Cache(self.options.cache_dir, self.options.cache_limit)
        self._fs: Any = None
        self._pid = os.getpid()
        self._pinned: dict[str, Lease] = {}
        self._forget_threads()

    def _forget_threads(self) -> None:
        """This process's prefetch state, new (after a fork the parent's threads and lock are
        not this process's; the inherited leases stay held by the parent)."""
        self._owner = os.getpid()
        self._prefetcher = Prefetcher(lambda name: self._fetch(name, optional=True), 1 + self.options.prefetch,
                                      cached=self._cached)

    def _cached(self, name: str) -> Lease | None:
        lease = self.cache.lease(self.key, name)
        if lease is not None:
            self.cache.stats.hits += 1
        return lease

    def _check_process(self) -> None:
        if self._owner != os.getpid():
            self._forget_threads()

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "options": self.options, "key": self.key, "manifest": self.manifest,
                "single": self.single, "single_size": self.single_size, "check_single": self.check_single,
                "pinned": list(self._pinned)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        pinned = state.pop("pinned")
        self.__dict__.update(state)
        self._setup()
        self.ensure(pinned)  # this process's own leases (the files are there: the parent holds them)

    @property
    def directory(self) -> Path:
        return self.cache.directory / self.key

    @property
    def fs(self) -> Any:
        if self._fs is None or self._pid != os.getpid():
            self._fs, self._base = filesystem(self.url, self.options.storage_options)
            self._pid = os.getpid()
        return self._fs

    @property
    def base(self) -> str:
        """The dataset's path on its filesystem (fsspec's name for it)."""
        self.fs
        return self._base.rstrip("/")

    def url_of(self, name: str) -> str:
        return self.url if self.single else f"{self.url}/{name}"

    # --- fetching ------------------------------------------------------------------------

    def _fetch(self, name: str, optional: bool = False) -> Lease | None:
        url = self.url_of(name)
        if self.single:
            size, expected = self.single_size, None
        else:
            entry = self.manifest["files"].get(name)
            if entry is None:
                raise CorruptManifestError(f"{scrub(self.url)!r}: the manifest does not list {name!r}.")
            size, expected = int(entry["bytes"]), entry[CHECKSUM_ALGORITHM]
        path = self.base if self.single else f"{self.base}/{name}"

        def download(write, restart) -> None:
            fs = self.fs

            def get(start: int, end: int) -> bytes:  # a ranged GET of a known size: no HEAD first, no read-ahead
                return with_retry(lambda: fs.cat_file(path, start=start, end=end), url, self.options.retry,
                                  self.options.storage_options)

            DOWNLOADS.read(get, size, write)  # concurrent ranges, written in order
            remember_session(url, fs, self.options.storage_options)

        def check(digest: str, file: Path) -> str | None:
            if expected is not None:
                if file.stat().st_size != size:
                    return f"{scrub(url)!r}: {file.stat().st_size} bytes arrived, but the manifest says {size}"
                if digest != expected:
                    return (f"{scrub(url)!r}: its {CHECKSUM_ALGORITHM} {digest[:16]}... does not match the "
                            f"manifest's {expected[:16]}...")
                return None
            return self.check_single(file, url)

        return self.cache.fetch(self.key, name, size=size, download=download, check=check, optional=optional)

    def ensure(self, names: Iterable[str]) -> None:
        """Bring ``names`` into the cache and hold them there while this reader lives (in this
        process): the files a reader maps or reads at open (npy, HDF5, the tar index)."""
        for name in names:
            if name not in self._pinned:
                self._pinned[name] = self._fetch(name)

    def held_bytes(self) -> int:
        """Bytes of the files this reader holds in the cache while it lives (:meth:`ensure`)."""
        return sum(os.fstat(lease.descriptor).st_size for lease in self._pinned.values()
                   if lease is not None and lease.descriptor >= 0)

    def lease(self, name: str) -> Lease:
        """The cached file ``name`` (prefetched, or fetched now), leased until released."""
        self._check_process()
        lease = self._prefetcher.take(name)  # waits for a prefetch of it in progress: one download
        if lease is None:  # no room for it when it was prefetched (or no prefetch)
            self._prefetcher.make_room()
            lease = self._fetch(name)
        return lease

    def prefetch(self, names: list[str]) -> None:
        """Fetch ``names[0]`` (the file read next) and the ``prefetch`` files after it in
        background threads, all at the same time; each is leased until :meth:`lease` takes it.
        A prefetch that finds no room is left to the reader's own fetch."""
        self._check_process()
        self._prefetcher.want(names)

    def fetch_all(self) -> Path:
        """Every file of the dataset in the cache (held there while this object lives); the local path."""
        self.ensure([self.single] if self.single else list(self.manifest["files"]))
        return self.directory / self.single if self.single else self.directory

    def drop(self) -> None:
        """Remove this dataset's files from the cache (a cold start), except those in use."""
        names = [self.single] if self.single else list(self.manifest["files"])
        self.cache.discard(self.key, [name for name in names if name not in self._pinned])

    def close(self) -> None:
        """Release every lease this process holds."""
        self._check_process()
        self._prefetcher.stop()
        for lease in self._pinned.values():
            if lease is not None:
                lease.release()
        self._pinned = {}


def check_fits(files: RemoteFiles, size: int, why: str) -> None:
    """Refuse, before anything is downloaded, a dataset that a reader holds in the cache whole
    (npy, HDF5) when it is bigger than ``cache_limit``: it could only go over the limit."""
    limit = files.cache.limit
    if size > limit:
        raise InvalidOptionError(
            f"{scrub(files.url)!r} is {_size(size)}, more than cache_limit {_size(limit)}: {why}. Raise cache_limit "
            f"(cache_limit= or $FASTDATA_CACHE_LIMIT) to at least {_size(size)}, or convert it to tar ('fastdata "
            f"convert {scrub(files.url)} OUT.tar'), whose readers stream shards through a cache of any size.")


def check_room_for_readers(files: RemoteFiles, largest: int, readers: int) -> None:
    """Refuse a ``cache_limit`` that cannot hold what the processes reading a tar dataset at random
    keep in the cache at once: the files held at open (index, manifest) and, for each of the
    ``readers`` processes, the shard it reads (up to ``largest`` bytes). Below that a process
    would wait for another's shard to be let go, which happens only when that one moves on."""
    held, limit = files.held_bytes(), files.cache.limit
    needed = held + readers * largest
    if needed > limit:
        who = f"{readers} DataLoader workers" if readers > 1 else "one process"
        raise InvalidOptionError(
            f"cache_limit {_size(limit)} is too small to read {scrub(files.url)!r} at random with {who}: each keeps "
            f"the shard it reads in the cache (up to {_size(largest)}), beside the index and manifest "
            f"({_size(held)}), so it needs at least {_size(needed)}. Raise cache_limit (cache_limit= or "
            "$FASTDATA_CACHE_LIMIT) to that, use fewer workers, or stream it with TarDataset.")


def _size(count: int) -> str:
    return f"{count / 1e6:.1f} MB ({count} bytes)" if count >= 10**5 else f"{count} bytes"


def _key(url: str, version: str) -> str:
    """The dataset's folder in the cache: its name (readable, never hidden) and a hash of the URL and version."""
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in url.rstrip("/").rsplit("/", 1)[-1])[:60]
    name = name.lstrip(".") or "dataset"
    return f"{name}-{hashlib.blake2b(f'{scrub(url)}|{version}'.encode(), digest_size=8).hexdigest()}"


def is_dataset_name(name: Any) -> bool:
    """A file name a manifest may list: a plain name, or a path inside the dataset's own folders
    (``fields/x.bin``): relative, '/'-separated, no empty part, no '.' or '..'."""
    return isinstance(name, str) and not name.startswith("/") and len(name) <= 1024 and \
        all(is_plain_name(part) for part in name.split("/"))


# What the server said about each URL opened within one :func:`reusing_answers` (``open_dataset``:
# its manifest, then the reader's open): the manifest's bytes, or a single file's ``info``.
_ANSWERS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("fastdata_remote_answers",
                                                                                default=None)


@contextlib.contextmanager
def reusing_answers() -> Iterator[None]:
    """Within it, a dataset opened twice (``open_dataset`` reads the manifest to pick the reader,
    then the reader opens the dataset) asks the server once: the manifest (or a single file's
    size and version) fetched by the first :func:`open_remote` serves the next ones."""
    token = _ANSWERS.set({})
    try:
        yield
    finally:
        _ANSWERS.reset(token)


def open_remote(url: str, options: RemoteOptions, *, reader: bool = False,
                check_single: Callable[[Path, str], str | None]) -> RemoteFiles:
    """The dataset at ``url``: its manifest fetched (a directory dataset), or its one file
    downloaded and checked by ``check_single`` (a single-file dataset such as ``.h5``; for a
    ``reader``, refused first when it is bigger than ``cache_limit``: see :func:`check_fits`)."""
    url = str(url).rstrip("/")
    with naming_the_bucket(url, options.storage_options):
        return _open_remote(url, options, reader=reader, check_single=check_single)


def _answer(url: str, options: RemoteOptions) -> tuple[bytes | None, dict[str, Any] | None]:
    """(the manifest's bytes, None) of the dataset at ``url``, or (None, its ``info``) when it has
    no manifest (a single file, or no dataset at all); one request each within :func:`reusing_answers`."""
    answers = _ANSWERS.get()
    if answers is not None and url in answers:
        return answers[url]
    fs, path = filesystem(url, options.storage_options)
    path = path.rstrip("/")
    try:
        text = with_retry(lambda: fs.cat_file(f"{path}/{MANIFEST_NAME}"), f"{url}/{MANIFEST_NAME}", options.retry,
                          options.storage_options)
        remember_session(url, fs, options.storage_options)
        answer = (text, None)
    except RemoteNotFoundError:
        answer = (None, with_retry(lambda: fs.info(path), url, options.retry, options.storage_options))
    if answers is not None:
        answers[url] = answer
    return answer


def _head(url: str, fs: Any, path: str, options: RemoteOptions) -> bytes:
    """The first bytes of the single file at ``url`` (once within :func:`reusing_answers`)."""
    answers, key = _ANSWERS.get(), f"{url}\0head"
    if answers is not None and key in answers:
        return answers[key]
    head = with_retry(lambda: fs.cat_file(path, start=0, end=len(SINGLE_FILE_MAGIC)), url, options.retry,
                      options.storage_options)
    if answers is not None:
        answers[key] = head
    return head


def _open_remote(url: str, options: RemoteOptions, *, reader: bool,
                 check_single: Callable[[Path, str], str | None]) -> RemoteFiles:
    fs, path = filesystem(url, options.storage_options)
    path = path.rstrip("/")
    manifest_url = f"{url}/{MANIFEST_NAME}"
    text, info = _answer(url, options)
    if text is None:
        if info.get("type") == "directory":
            raise RemoteNotFoundError(f"{scrub(url)!r} holds no {MANIFEST_NAME}: it is not a dataset written by "
                                      "'fastdata convert' (or its conversion did not finish).")
        head = _head(url, fs, path, options)
        if not head.startswith(SINGLE_FILE_MAGIC):  # refused before anything is downloaded
            raise ManifestError(f"{scrub(url)!r} is not a dataset written by 'fastdata convert': there is no "
                                f"{MANIFEST_NAME} under it, and it is no fastdata .h5 file. Check the URL: it names "
                                "the dataset's folder, or its .h5 file.")
        version = "|".join(str(info.get(k)) for k in ("size", "ETag", "etag", "LastModified", "mtime") if k in info)
        name = url.rsplit("/", 1)[-1]
        if not is_plain_name(name):
            raise InvalidOptionError(f"{scrub(url)!r}: cannot name a cache file after {name!r}.")
        files = RemoteFiles(url, options, _key(url, version), None, single=name, single_size=int(info.get("size") or 0),
                            check_single=check_single)
        if reader:
            check_fits(files, files.single_size, "its one file is fetched whole and read from the cache while it is open")
        files.ensure([name])
        return files
    try:
        manifest = parse_manifest(text.decode("utf-8"), repr(scrub(manifest_url)))
    except UnicodeDecodeError as exc:
        raise CorruptManifestError(f"{scrub(manifest_url)!r}: manifest is not valid UTF-8 (byte {exc.start}).") from None
    files_ = manifest.get("files")
    if not isinstance(files_, dict) or not all(
            is_dataset_name(name) and isinstance(entry, dict) and isinstance(entry.get("bytes"), int)
            and isinstance(entry.get(CHECKSUM_ALGORITHM), str) for name, entry in files_.items()):
        raise CorruptManifestError(f"{scrub(manifest_url)!r}: 'files' must list the dataset's files (names inside "
                                   f"its folder) with 'bytes' and {CHECKSUM_ALGORITHM!r}; run 'fastdata verify' on "
                                   "the original.")
    files = RemoteFiles(url, options, _key(url, str(manifest.get(MANIFEST_CHECKSUM_KEY))), manifest)
    _write_manifest(files, text)
    return files


def _write_manifest(files: RemoteFiles, text: bytes) -> None:
    """The manifest, as fetched, into the dataset's cache directory (atomically, leased)."""
    name = MANIFEST_NAME
    lease = files.cache.lease(files.key, name)
    if lease is None:
        lease = files.cache.fetch(files.key, name, size=len(text), download=lambda write, restart: write(text),
                                  check=lambda digest, file: None)
    files._pinned[name] = lease


def locate(path: str | os.PathLike, options: RemoteOptions | None = None, *, fetch: Iterable[str] | None = (),
           reader: bool = True, check_single: Callable[[Path, str], str | None]) -> tuple[Path, LocalFiles | RemoteFiles]:
    """Where a reader finds the dataset ``path``: the local path itself, or for a URL its
    directory (or file) in the cache, with the files ``fetch`` names brought there first
    (``None``: every file of the manifest). For a ``reader`` (not ``verify``, which holds the
    files only while it checks them), a dataset held whole that is bigger than ``cache_limit``
    is refused first (:func:`check_fits`). ``check_single``: what is wrong with a downloaded
    single-file dataset (:func:`open_remote`)."""
    if not is_url(path):
        return Path(path), LocalFiles()
    files = open_remote(os.fspath(path), options or RemoteOptions(), reader=reader, check_single=check_single)
    if files.single:
        return files.directory / files.single, files
    names = list(files.manifest["files"]) if fetch is None else [n for n in fetch if n in files.manifest["files"]]
    if fetch is None and reader:
        check_fits(files, sum(int(files.manifest["files"][n]["bytes"]) for n in names),
                   "its files are fetched whole and memory-mapped from the cache while it is open")
    files.ensure(names)
    return files.directory, files


_FETCHED: list[RemoteFiles] = []  # datasets fetched whole for this process: their files stay leased until it exits


def fetch_dataset(url: str, options: RemoteOptions | None = None, *, cold: bool = False,
                  check_single: Callable[[Path, str], str | None]) -> Path:
    """Every file of the converted dataset at ``url`` in the cache, kept there while this
    process runs; its local path (a conversion's SOURCE, ``fastdata bench``/``tune``). With
    ``cold`` the dataset's cached files are removed first; ``check_single`` as for
    :func:`open_remote`."""
    files = open_remote(url, options or RemoteOptions(), check_single=check_single)
    _FETCHED.append(files)
    if cold:
        files.drop()
    return files.fetch_all()

