"""The staged units of a job array (``--part I/N``) converting to a URL, shared through the bucket.

Parts of one job array may run on machines that share no file system, so a part converting to
``s3://bucket/out.tar`` stages its units locally (beside the upload staging copy in the cache
directory, :func:`fastdata.conversion.remote.upload.staging_path`) and then uploads them under the prefix
``s3://bucket/out.tar.partial.units/``: its units first, its part record last, so a record there
means its units are there. ``fastdata merge s3://bucket/out.tar`` downloads that prefix into its
own local staging, writes the output through the one write loop and uploads it as ``convert``
does (the manifest last), then removes the prefix. The prefix is a sibling of the output, never
inside it: an unfinished job array is no dataset.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
from pathlib import Path
from typing import Any

from fastdata.conversion.scale.staging import PART_PATTERN
from fastdata.conversion.units import STAGING_SUFFIX, TEMPORARY_INFIX, UNIT_RECORD, Unit
from fastdata.errors import RemoteNotFoundError
from fastdata.remote.dataset import RemoteOptions
from fastdata.remote.filesystem import filesystem, scrub, with_retry

logger = logging.getLogger(__name__)
_STAGING_MARK_NAME = "staging.json"  # fastdata.conversion.scale.staging's mark of a staging folder


def units_url(url: str) -> str:
    """Where the parts of a job array converting to ``url`` share their units."""
    return url.rstrip("/") + STAGING_SUFFIX


def _put_unit(fs: Any, path: str, local_units: Path, unit: str, url: str, options: RemoteOptions, *,
              replacing: bool = False) -> None:
    """One staged unit's files uploaded, its ``unit.json`` last: a unit whose record is in the
    bucket is complete there (``replacing`` an older version of it: its record removed first)."""
    if replacing:
        try:
            with_retry(lambda: fs.rm_file(f"{path}/{unit}/{UNIT_RECORD}"), units_url(url), options.retry,
                       options.storage_options)
        except RemoteNotFoundError:
            pass
    files = sorted((local_units / unit).iterdir(), key=lambda file: (file.name == UNIT_RECORD, file.name))
    for file in files:
        with_retry(lambda: fs.put_file(str(file), f"{path}/{unit}/{file.name}"), units_url(url), options.retry,
                   options.storage_options)


def _stamp(local_units: Path, unit: str) -> int | None:
    """Which version of a staged unit this is (its ``unit.json``'s mtime; a unit converted again,
    e.g. as RGB after a mode conflict, is a new one); None when it is not finished."""
    try:
        return (local_units / unit / UNIT_RECORD).stat().st_mtime_ns
    except FileNotFoundError:
        return None


def upload_part(local_units: Path, url: str, units: list[Unit], record: dict[str, Any],
                options: RemoteOptions, *, sent: dict[str, int] | None = None) -> None:
    """Upload one finished part: the staging mark, its ``units`` not ``sent`` yet as they are now
    (uploaded as each was finished, :class:`UnitUploader`), then its record."""
    sent = sent or {}
    fs, path = filesystem(units_url(url), options.storage_options)
    path = path.rstrip("/")
    with_retry(lambda: fs.put_file(str(local_units / _STAGING_MARK_NAME), f"{path}/{_STAGING_MARK_NAME}"),
               units_url(url), options.retry, options.storage_options)
    for unit in units:
        if sent.get(unit.name) != _stamp(local_units, unit.name):
            _put_unit(fs, path, local_units, unit.name, url, options, replacing=unit.name in sent)
    name = PART_PATTERN.format(record["part"], record["parts"])
    with_retry(lambda: fs.put_file(str(local_units / name), f"{path}/{name}"), units_url(url), options.retry,
               options.storage_options)
    logger.info("uploaded part %d/%d's %d units to %s", record["part"], record["parts"], len(units),
                scrub(units_url(url)))


def part_record(url: str, part: int, parts: int, options: RemoteOptions) -> dict[str, Any] | None:
    """The record of part ``part``/``parts`` already uploaded for ``url``, else None."""
    fs, path = filesystem(units_url(url), options.storage_options)
    name = f"{path.rstrip('/')}/{PART_PATTERN.format(part, parts)}"
    try:
        text = with_retry(lambda: fs.cat_file(name), units_url(url), options.retry, options.storage_options)
    except RemoteNotFoundError:
        return None
    return json.loads(text)


def download_units(url: str, local_units: Path, options: RemoteOptions, *, records_only: bool = False) -> bool:
    """Download the shared units of ``url``'s job array into ``local_units`` (files already there
    with the same size are kept), or with ``records_only`` the parts' records and the staging
    mark alone (checked before the units are fetched); False when there is nothing at the prefix."""
    fs, path = filesystem(units_url(url), options.storage_options)
    path = path.rstrip("/")
    try:
        found = with_retry(lambda: fs.find(path, withdirs=False, detail=True), units_url(url), options.retry,
                           options.storage_options)
    except RemoteNotFoundError:
        return False
    prefix = path + "/"
    names = {name[len(prefix):]: info for name, info in found.items() if name.startswith(prefix)
             and not name.endswith(".lock")  # the parts' locks in the bucket (fastdata.conversion.remote.locks)
             and not (records_only and name[len(prefix):].startswith("unit-"))}
    if not names:
        return False
    for name, info in sorted(names.items()):
        target = local_units / name
        if target.is_file() and target.stat().st_size == info.get("size"):
            continue  # converted on this machine (units are written once, identical)
        target.parent.mkdir(parents=True, exist_ok=True)
        with_retry(lambda: fs.get_file(f"{path}/{name}", str(target)), units_url(url), options.retry,
                   options.storage_options)
    return True


def remove_units(url: str, options: RemoteOptions) -> None:
    """Remove the shared units once the merged output is uploaded."""
    fs, path = filesystem(units_url(url), options.storage_options)
    path = path.rstrip("/")
    try:
        with_retry(lambda: fs.rm(path, recursive=True), units_url(url), options.retry, options.storage_options)
    except RemoteNotFoundError:
        pass


def fetch_uploaded_units(url: str, local_units: Path, units: list[Unit], options: RemoteOptions) -> dict[str, int]:
    """This part's units already in the bucket (an earlier run of it, killed midway, uploaded
    each as it was finished) brought into ``local_units``, each downloaded into a temporary
    folder renamed into place, so the conversion keeps them instead of converting them again.
    A unit without its ``unit.json`` there (its upload was cut) is converted again. Their names
    and versions (:func:`_stamp`), as :class:`UnitUploader` records what it sent."""
    fs, path = filesystem(units_url(url), options.storage_options)
    path = path.rstrip("/")
    try:
        found = with_retry(lambda: fs.find(path, withdirs=False), units_url(url), options.retry,
                           options.storage_options)
    except RemoteNotFoundError:
        return {}
    prefix, wanted = path + "/", {unit.name for unit in units}
    by_unit: dict[str, list[str]] = {}
    for name in found:
        relative = name[len(prefix):] if name.startswith(prefix) else ""
        if "/" in relative:
            unit, file = relative.split("/", 1)
            by_unit.setdefault(unit, []).append(file)
    got: dict[str, int] = {}
    for unit, files in sorted(by_unit.items()):
        if unit not in wanted or UNIT_RECORD not in files:
            continue
        target = local_units / unit
        if not (target / UNIT_RECORD).is_file():
            temporary = local_units / f"{unit}{TEMPORARY_INFIX}{secrets.token_hex(4)}"
            temporary.mkdir(parents=True)
            for file in sorted(files):
                with_retry(lambda: fs.get_file(f"{path}/{unit}/{file}", str(temporary / file)), units_url(url),
                           options.retry, options.storage_options)
            os.rename(temporary, target)
        got[unit] = _stamp(local_units, unit)
    if got:
        logger.info("%d unit(s) of this part already in %s: kept, not converted again", len(got), scrub(units_url(url)))
    return got


class UnitUploader:
    """Uploads each of a part's ``units`` to ``URL.partial.units/`` as soon as it is finished in
    ``local_units`` (its folder renamed into place with its ``unit.json``), in a thread, while the
    part goes on; so a part killed midway resumes from what is in the bucket. What it sent is in
    :attr:`sent` (``already``: units that were there before); :func:`upload_part` sends the rest."""

    def __init__(self, local_units: Path, url: str, units: list[Unit], options: RemoteOptions, *,
                 already: dict[str, int] | None = None, poll_s: float = 0.2):
        self.local_units, self.url, self.units, self.options, self.poll_s = local_units, url, units, options, poll_s
        self.sent: dict[str, int] = dict(already or {})  # unit -> the version sent (_stamp)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fastdata-unit-upload")

    def __enter__(self) -> "UnitUploader":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        fs, path = filesystem(units_url(self.url), self.options.storage_options)
        path = path.rstrip("/")
        marked = False
        while not self._stop.wait(self.poll_s):
            try:
                for unit in self.units:
                    if self._stop.is_set():
                        return
                    stamp = _stamp(self.local_units, unit.name)
                    if stamp is None or self.sent.get(unit.name) == stamp:
                        continue
                    if not marked:
                        mark = self.local_units / _STAGING_MARK_NAME
                        with_retry(lambda: fs.put_file(str(mark), f"{path}/{_STAGING_MARK_NAME}"),
                                   units_url(self.url), self.options.retry, self.options.storage_options)
                        marked = True
                    _put_unit(fs, path, self.local_units, unit.name, self.url, self.options,
                              replacing=unit.name in self.sent)
                    self.sent[unit.name] = stamp
                    logger.info("uploaded %s as it was finished", scrub(f"{units_url(self.url)}/{unit.name}"))
            except Exception as exc:  # noqa: BLE001 - upload_part sends it again, or raises
                logger.debug("upload of a finished unit failed: %s", scrub(str(exc), self.options.storage_options))

