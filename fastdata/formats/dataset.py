"""The base of the readers of converted datasets (:class:`StoredDataset`): the manifest opened
and checked through the registry (:func:`fastdata.formats.open_manifest`), a URL fetched into the
cache, and the read-time decoder (:func:`decoder_for`). Formats subclass it (the :class:`Reader`
hooks); the reading it shares with every map-style reader is :class:`fastdata.reader.MapDataset`."""

from __future__ import annotations

import os
from typing import Any, Callable

from fastdata.reader.decoding import Decoder
from fastdata.errors import CorruptManifestError, InvalidOptionError, fix_option
from fastdata.formats.base import Reader
from fastdata.formats.stored import open_manifest, single_file_problem
from fastdata.reader.mapstyle import MapDataset
from fastdata.reader.options import ReaderOptions
from fastdata.remote.dataset import locate
from fastdata.urls import is_url


def decoder_for(manifest: dict[str, Any], options: ReaderOptions) -> Decoder:
    """The read-time :class:`~fastdata.reader.decoding.Decoder` of a converted dataset: resize,
    center_crop and decoder apply to encoded images; raw pixels were sized at conversion."""
    encoded = manifest["store"] != "raw"
    made = Decoder(manifest["image"]["mode"], options.geometry, options.decoder == "fast", encoded=encoded)
    if not encoded and (not made.geometry.is_identity or made.fast):
        raise InvalidOptionError(
            "resize, center_crop and decoder apply to datasets of encoded images; this one stores decoded "
            f"pixels (--store raw). Convert with {fix_option('resize', 'HxW')} (or {fix_option('center_crop', 'HxW')}) "
            "instead, or transform the tensors."
        )
    return made.with_options(options)


class StoredDataset(MapDataset, Reader):
    """Base of the readers of converted datasets: opens and checks the manifest
    (:func:`fastdata.formats.open_manifest`), takes the classes from it, then calls the
    subclass's :meth:`_load` to check and load its own files."""

    format_name = ""
    required_files: dict[str, tuple[str, ...]] = {}  # store -> names the manifest's "files" must list
    remote_fetch: tuple[str, ...] | None = None  # a URL's files fetched at open (None: all; the rest on use)

    def __init__(self, path: str | os.PathLike, transform: Callable | None = None,
                 target_transform: Callable | None = None, **options: Any):
        super().__init__(transform, target_transform, **options)
        self.url = os.fspath(path) if is_url(path) else None
        self.path, self.files = locate(path, self.options.remote, fetch=self.remote_fetch,  # a URL: into the cache
                                       check_single=single_file_problem)
        self.manifest = open_manifest(self.path, self.format_name)
        self.store = self.manifest["store"]
        self.mode = self.manifest["image"]["mode"]
        self.decoder = decoder_for(self.manifest, self.options)
        missing = [name for name in self.required_files.get(self.store, ()) if name not in self.manifest["files"]]
        if missing:
            raise CorruptManifestError(
                f"{str(self.path)!r}: the manifest does not list {missing[0]!r}, which a {self.format_name} "
                f"{self.store} dataset needs. Run 'fastdata verify {self.path}' or convert the source again."
            )
        self._set_classes(self.manifest)
        self._load()
        if "fields" in self.manifest:
            from fastdata.reader.records import open_schema  # only datasets with fields need it

            self.schema = open_schema(self)
