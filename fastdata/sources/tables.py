"""Where Arrow tables come from: Parquet files (local or through fsspec, ``hf://`` included), a
``save_to_disk`` folder's Arrow files, or a ``datasets.Dataset`` object. Each is a list of
tables cut into groups (a Parquet file's row groups, an Arrow file's record batches), read one
group at a time, so memory is bounded by a group, not by a file.

:func:`find_parquet` lists what a path, folder, glob or URL names, one split of it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import re
from pathlib import Path
from typing import Any, Iterator

from fastdata.errors import (EmptySourceError, FastdataError, InvalidOptionError, SourceNotFoundError, SourceReadError,
                             fix_option)
from fastdata.extras import require
from fastdata.urls import is_url

PARQUET = ".parquet"
logger = logging.getLogger("fastdata")
READ_BUFFER_BYTES = 1 << 20  # a Parquet column chunk is read this much at a time
_SHARD_NAME = re.compile(r"^(?P<split>.+?)-\d+-of-\d+\.parquet$")  # datasets' train-00000-of-00042.parquet
_GLOB = re.compile(r"[*?\[]")
_HUB_CACHE_REPO = re.compile(r"(datasets|models|spaces)--.+")  # huggingface_hub's cache folder of one repository
_DEPTH = 3  # how deep a folder is searched for Parquet files (data/train/x.parquet)


def require_pyarrow(what: str) -> Any:
    return require("pyarrow", extra="parquet", feature=what)


DEFAULT_CONFIG = "default"  # the Hub's name for a dataset's files outside any configuration's folder


def split_of(relative: str) -> str | None:
    """The split a shard belongs to: ``train`` for ``data/train-00000-of-00042.parquet`` (the
    name datasets writes) or ``default/train/0000.parquet`` (its folder); None at the top level."""
    return layout_of(relative)[1]


def layout_of(relative: str) -> tuple[str, str | None]:
    """The (configuration, split) a shard belongs to, as the Hub lays them out:
    ``en/train-00000-of-00001.parquet`` (``push_to_hub(config_name="en")``) and
    ``en/train/0000.parquet`` (the Hub's Parquet conversion) are configuration ``en``, split
    ``train``; a ``data/`` folder or none is the configuration ``default``."""
    name, parent = posixpath.basename(relative), posixpath.dirname(relative)
    found = _SHARD_NAME.match(name)
    if found:
        config, split = parent, found["split"]
    else:
        config, split = posixpath.dirname(parent), (posixpath.basename(parent) or None)
    if posixpath.basename(config) == "data":
        config = posixpath.dirname(config)
    return config or DEFAULT_CONFIG, split


def pick_split(paths: list[str], root: str, split: str | None, spec: str, config: str | None = None) -> list[str]:
    """The files of ``split`` of ``config`` (all of a configuration when its files hold one split
    and none is asked for): a (configuration, split) is what one conversion reads."""
    by_config: dict[str, dict[str | None, list[str]]] = {}
    for path in paths:
        found_config, found_split = layout_of(posixpath.relpath(path, root) if root else posixpath.basename(path))
        by_config.setdefault(found_config, {}).setdefault(found_split, []).append(path)
    configs = sorted(by_config)
    if config is not None and config not in by_config:
        raise InvalidOptionError(f"{spec!r} has no configuration {config!r} (configurations: {', '.join(configs)}). "
                                 f"Check {fix_option('config', 'NAME')}.")
    if config is None and len(configs) > 1:
        raise InvalidOptionError(f"{spec!r} holds the configurations {', '.join(configs)} (Hugging Face subsets); "
                                 f"convert one at a time: add {fix_option('config', configs[0])} (or another), or give its folder.")
    by_split = by_config[config if config is not None else configs[0]]
    names = sorted(str(s) for s in by_split if s is not None)
    if split is not None:
        if split not in by_split:
            raise InvalidOptionError(f"{spec!r} has no split {split!r} (splits: {', '.join(names) or 'none named'}). "
                                     f"Check {fix_option('split', 'NAME')}.")
        if by_split.get(None):  # files of no split: not silently left out
            logger.warning("%r: --split %s leaves out %s, which belong%s to no split", spec, split,
                           ", ".join(posixpath.basename(p) for p in by_split[None]), "" if len(by_split[None]) > 1 else "s")
        return by_split[split]
    if len(by_split) > 1:
        raise InvalidOptionError(f"{spec!r} holds the splits {', '.join(names)}; convert one at a time: add "
                                 f"{fix_option('split', names[0])} (or another).")
    return next(iter(by_split.values()))


def _walk_local(root: Path, depth: int = _DEPTH) -> list[str]:
    found = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name.startswith("."):
            continue
        if entry.is_file() and entry.name.endswith(PARQUET):
            found.append(entry.path)
        elif entry.is_dir() and depth > 1:
            found.extend(_walk_local(Path(entry.path), depth - 1))
    return found


_DEEPER = 8  # how deep a folder is looked into for Parquet files too deep to read, which are then named


def has_parquet(path: Path) -> bool:
    """Whether a local folder holds Parquet files (those deeper than three folders too: the
    conversion then says where they are, rather than taking the folder for an image folder)."""
    try:
        return bool(_walk_local(path, _DEEPER))
    except OSError:
        return False


def is_parquet_spec(text: str) -> bool:
    """Whether ``text`` names Parquet files without listing anything: a ``.parquet`` file or glob,
    or an ``hf://`` URL (a Hub dataset's files)."""
    return text.endswith(PARQUET) or text.startswith("hf://")


class ParquetFiles:
    """Parquet files, local or behind an fsspec filesystem; opened lazily, per process."""

    def __init__(self, spec: str, *, split: str | None = None, storage_options: dict[str, Any] | None = None,
                 paths: list[str] | None = None, config: str | None = None):
        """``spec``: a file, folder, glob or URL; or, with ``paths`` (files of one file system, as
        a streaming ``datasets.IterableDataset`` lists them), the first of them. ``config`` and
        ``split`` pick the files of one (configuration, split) (:func:`pick_split`)."""
        require_pyarrow(f"Reading Parquet ({spec!r})")
        self.spec, self.storage_options = spec, storage_options
        self.fs, self._pid = None, os.getpid()
        if is_url(spec):
            from fastdata.remote.filesystem import filesystem

            self.fs, path = filesystem(spec, storage_options)
            root, found = self._list_remote(path) if paths is None else ("", [filesystem(p)[1] for p in paths])
        else:
            root, found = self._list_local(spec) if paths is None else ("", list(paths))
        if not found:
            raise EmptySourceError(f"{spec!r} holds no .parquet files.")
        self.root, self.listed, self.config = root, paths is not None, config
        self.features: dict[str, Any] | None = None  # a stream's features, read instead of the files' (cast)
        self.paths = found if self.listed else pick_split(found, root, split, spec, config)
        self._open: tuple[int, Any] | None = None

    def _list_local(self, spec: str) -> tuple[str, list[str]]:
        if _GLOB.search(spec):
            import glob

            paths = sorted(p for p in glob.glob(spec, recursive=True) if p.endswith(PARQUET))
            return (os.path.commonpath([os.path.dirname(p) for p in paths]) if paths else ""), paths
        path = Path(spec)
        if path.is_file():
            return str(path.parent), [str(path)]
        if path.is_dir():
            found = _walk_local(path)
            deeper = [] if found else _walk_local(path, _DEEPER)
            if deeper:
                raise InvalidOptionError(f"{spec!r}: its .parquet files lie more than {_DEPTH} folders deep (such as "
                                         f"{deeper[0]!r}), deeper than a folder is searched. Give the folder that holds "
                                         f"them, or a glob: '{os.path.join(spec, '**', '*.parquet')}'.")
            return str(path), found
        raise SourceNotFoundError(f"Source {spec!r} does not exist.")

    def _list_remote(self, path: str) -> tuple[str, list[str]]:
        from fastdata.remote.filesystem import explain

        try:
            if _GLOB.search(path):
                paths = sorted(p for p in self.fs.glob(path) if p.endswith(PARQUET))
                return (posixpath.commonpath([posixpath.dirname(p) for p in paths]) if paths else ""), paths
            if path.endswith(PARQUET):
                return posixpath.dirname(path), [path]
            found = self.fs.find(path, maxdepth=_DEPTH)
        except FileNotFoundError:
            raise SourceNotFoundError(f"Source {self.spec!r} does not exist.") from None
        except Exception as exc:  # noqa: BLE001 - the backend's errors, explained with the URL
            raise explain(exc, self.spec) from exc
        return path.rstrip("/"), sorted(p for p in found if p.endswith(PARQUET))

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__, _open=None)

    def _here(self) -> None:
        """In a process other than the one that opened them (a forked conversion worker), drop
        the inherited open file and filesystem: each process opens its own (an fsspec async
        filesystem, s3fs, HTTP, gcsfs, adlfs, is not fork-safe: it fails or hangs in a child)."""
        if self._pid != os.getpid():
            self._pid, self._open = os.getpid(), None
            if self.fs is not None:
                from fastdata.remote.filesystem import filesystem

                self.fs = filesystem(self.spec, self.storage_options)[0]  # fsspec's instance cache is per process

    def __len__(self) -> int:
        return len(self.paths)

    def name(self, number: int) -> str:
        """How messages name file ``number``: its URL, or its path."""
        path = self.paths[number]
        if self.fs is None or "://" in path:  # fsspec's HTTP filesystem keeps whole URLs as paths
            return path
        scheme = self.spec.split("://", 1)[0]
        return f"{scheme}://{path}"

    def file(self, number: int) -> Any:
        """The open ``pyarrow.parquet.ParquetFile`` (one kept open per process)."""
        self._here()
        if self._open is None or self._open[0] != number:
            import pyarrow.parquet as pq

            if self._open is not None:
                self._open[1].close()
            try:
                source = self.paths[number] if self.fs is None else _Reads(self._remote_open(number), self.name(number),
                                                                            self.storage_options)
                # read page by page (no column chunk read whole, no row group buffered ahead): memory stays
                # within a slice of rows (:meth:`slices`) however large the row group
                self._open = (number, pq.ParquetFile(source, pre_buffer=False, buffer_size=READ_BUFFER_BYTES))
            except FastdataError:
                raise
            except OSError as exc:
                if exc.errno is None:  # pyarrow's OSError for a damaged file has no errno
                    raise InvalidOptionError(f"{self.name(number)}: not a readable Parquet file "
                                             f"({_one_line(exc)}).") from exc
                raise read_failure(exc, self.name(number)) from exc
            except Exception as exc:  # noqa: BLE001 - pyarrow's ArrowInvalid for a damaged file
                raise InvalidOptionError(f"{self.name(number)}: not a readable Parquet file ({_one_line(exc)}).") from exc
        return self._open[1]

    def schema(self, number: int) -> Any:
        schema = self.file(number).schema_arrow
        if self.features is not None:
            schema = schema.with_metadata({b"huggingface": json.dumps({"info": {"features": self.features}}).encode()})
        return schema

    def cast(self, features: Any) -> None:
        """Read the files as the ``datasets.Features`` ``features`` say (a stream's ``cast_column``
        or ``features=``: ClassLabel names, ``Image(mode=...)``); a cast that changes a column's
        Arrow type, which fastdata does not apply, is refused."""
        pa = require_pyarrow("Reading Parquet")
        schema = self.file(0).schema_arrow
        for field in features.arrow_schema:
            index = schema.get_field_index(field.name)
            if index < 0:
                continue
            stored = schema.field(index).type
            if pa.types.is_dictionary(stored):  # streamed as its values (pandas' category): read so here too
                stored = stored.value_type
            if stored != field.type:
                raise InvalidOptionError(
                    f"This datasets.IterableDataset casts column {field.name!r} from {schema.field(index).type} (in "
                    f"{self.name(0)}) to {field.type}, which fastdata does not apply. Convert the files as they are "
                    "and cast when reading, or convert the Dataset the cast gives (load it without streaming).")
        self.features = features.to_dict()

    def groups(self, number: int) -> list[int]:
        metadata = self.file(number).metadata
        return [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]

    def slices(self, number: int, group: int, columns: list[str], rows: int) -> Iterator[Any]:
        """Row group ``group`` of file ``number`` as record batches of ``rows`` rows, read as they
        are asked for (never the whole group at once)."""
        batches = self.file(number).iter_batches(batch_size=rows, row_groups=[group], columns=columns,
                                                 use_threads=False)
        while True:
            try:
                yield next(batches)
            except StopIteration:
                return
            except OSError as exc:
                if exc.errno is None or isinstance(exc, FastdataError):  # damaged bytes, or a read failure named
                    raise
                raise read_failure(exc, self.name(number)) from exc

    def _remote_open(self, number: int) -> Any:
        try:
            return self.fs.open(self.paths[number], "rb")
        except Exception as exc:  # noqa: BLE001 - the backend's errors: a missing object, the network
            raise read_failure(exc, self.name(number), self.storage_options) from exc

    def read(self, number: int, group: int, columns: list[str]) -> Any:
        parquet = self.file(number)
        try:
            return parquet.read_row_group(group, columns=columns)
        except OSError as exc:
            if exc.errno is None or isinstance(exc, FastdataError):  # damaged bytes, or a read failure already named
                raise
            raise read_failure(exc, self.name(number)) from exc

    def read_relative(self, number: int, relative: str) -> bytes:
        """The file at ``relative`` to data file ``number``'s folder; never outside that folder."""
        folder = posixpath.dirname(self.paths[number]) if self.fs is not None else os.path.dirname(self.paths[number])
        joined = posixpath.normpath(posixpath.join(folder, relative)) if self.fs is not None else \
            os.path.normpath(os.path.join(folder, relative))
        inside = joined.startswith(folder.rstrip("/") + "/") if folder else not joined.startswith((".", "/"))
        if os.path.isabs(relative) or not inside:
            raise ValueError(f"image path {relative!r} lies outside the folder of the Parquet file; only paths inside "
                             "it are read")
        if self.fs is not None:
            self._here()
            try:
                with self.fs.open(joined, "rb") as handle:
                    return handle.read()
            except FileNotFoundError:  # the cell names a missing file: the sample's fault
                raise
            except Exception as exc:  # noqa: BLE001 - the network: no sample's fault
                raise read_failure(exc, f"{self.name(number)}: image {relative!r}", self.storage_options) from exc
        real = real_inside(_link_root(folder or "."), joined)
        if real is None:  # a symbolic link out of the folder
            raise ValueError(f"image path {relative!r} leads through a symbolic link out of the folder of the Parquet "
                             "file; only files inside it are read")
        with open(real, "rb") as handle:
            return handle.read()

    def describe(self) -> dict[str, Any]:
        if self.listed:
            return {"files": [self.name(n) if self.fs is not None else os.path.abspath(p) for n, p in
                              enumerate(self.paths)], "count": len(self.paths)}
        config = {"config": self.config} if self.config is not None else {}
        return {"files": self.spec if self.fs is not None else os.path.abspath(self.spec), **config,
                "count": len(self.paths)}

    def fingerprint(self) -> str:
        """A digest of every file's name, size and modification time (or ETag)."""
        digest = hashlib.sha256()
        for path in self.paths:
            if self.fs is None:
                stat = os.stat(path)
                line = f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
            else:
                info = self.fs.info(path)
                line = f"{path}\0{info.get('size')}\0{info.get('ETag') or info.get('mtime') or info.get('last_commit')}\n"
            digest.update(line.encode("utf-8", "surrogateescape"))
        return digest.hexdigest()

    def local_root(self) -> Path | None:
        """What the output may not be or lie in: the folder given, else the file given (an output
        beside it is fine); None for URLs and globs (whose files are each protected)."""
        if self.fs is not None or self.listed or _GLOB.search(self.spec):
            return None
        return Path(self.spec)

    def local_files(self) -> list[Path]:
        return [Path(p) for p in self.paths] if self.fs is None else []


class _Reads:
    """A remote Parquet file for pyarrow, whose failed reads are read failures
    (:class:`~fastdata.errors.SourceReadError`), never taken for damaged bytes: pyarrow re-raises
    what a Python file raises as it is."""

    def __init__(self, handle: Any, name: str, storage_options: dict[str, Any] | None):
        self.handle, self.name, self.storage_options = handle, name, storage_options

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.handle, attribute)

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self.handle, method)(*args)
        except Exception as exc:  # noqa: BLE001 - the backend's errors
            raise read_failure(exc, self.name, self.storage_options) from exc

    def read(self, *args: Any) -> Any:
        return self._call("read", *args)

    def readinto(self, *args: Any) -> Any:
        return self._call("readinto", *args)

    def seek(self, *args: Any) -> Any:
        return self._call("seek", *args)

    def tell(self) -> Any:
        return self._call("tell")


def _one_line(exc: BaseException, limit: int = 160) -> str:
    """pyarrow's text for ``exc`` on one line (it spans several: a message, then its context)."""
    from fastdata.remote.failures import one_line

    return one_line(str(exc))[:limit]


def read_failure(exc: BaseException, name: str, storage_options: dict[str, Any] | None = None) -> SourceReadError:
    """The error for reading ``name`` failing with ``exc`` (the network, the disk, a file gone)."""
    from fastdata.remote.failures import one_line
    from fastdata.remote.filesystem import scrub

    cause = scrub(f"{type(exc).__name__}: {one_line(str(exc))}"[:200], storage_options)
    if isinstance(exc, FileNotFoundError):
        return SourceReadError(f"{name}: not found ({cause}). Check the path or URL; a file that was removed while "
                               "converting needs the source as it was.")
    return SourceReadError(f"{name}: cannot be read ({cause}). This is a read failure, not a damaged sample "
                           f"({fix_option('skip_bad')} does not skip it): check the network or the disk, then run again.")


def real_inside(folder: str | Path, path: str | Path) -> str | None:
    """``path`` with its links resolved, where it lies inside ``folder`` (links resolved too);
    None where it lies outside."""
    real = os.path.realpath(path)
    return real if real.startswith(os.path.realpath(folder).rstrip(os.sep) + os.sep) else None


def _link_root(folder: str) -> str:
    """The folder whose files links inside ``folder`` may lead to: ``folder`` itself, or in a
    huggingface_hub cache snapshot (``datasets--ORG--NAME/snapshots/REV/``, whose files link to
    the repository's ``blobs/``) the repository's folder."""
    parts = Path(os.path.abspath(folder)).parts
    for index in range(len(parts) - 2, 0, -1):
        if parts[index] == "snapshots" and _HUB_CACHE_REPO.fullmatch(parts[index - 1]):
            return str(Path(*parts[:index]))
    return folder
