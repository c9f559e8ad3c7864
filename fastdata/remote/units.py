"""The staged units of a job array (``--part I/N``) converting to a URL, shared through the bucket.

Parts of one job array may run on machines that share no file system, so a part converting to
``s3://bucket/out.tar`` stages its units locally (beside the upload staging copy in the cache
directory, :func:`fastdata.remote.upload.staging_path`) and then uploads them under the prefix
``s3://bucket/out.tar.partial.units/``: its units first, its part record last, so a record there
means its units are there. ``fastdata merge s3://bucket/out.tar`` downloads that prefix into its
own local staging, writes the output through the one write loop and uploads it as ``convert``
does (the manifest last), then removes the prefix. The prefix is a sibling of the output, never
inside it: an unfinished job array is no dataset.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from fastdata.conversion.scale.staging import PART_PATTERN
from fastdata.conversion.scale.units import STAGING_SUFFIX, Unit
from fastdata.errors import RemoteNotFoundError
from fastdata.remote.dataset import RemoteOptions
from fastdata.remote.filesystem import filesystem, scrub, with_retry

logger = logging.getLogger(__name__)
_STAGING_MARK_NAME = "staging.json"  # fastdata.conversion.scale.staging's mark of a staging folder


def units_url(url: str) -> str:
    """Where the parts of a job array converting to ``url`` share their units."""
    return url.rstrip("/") + STAGING_SUFFIX


def upload_part(local_units: Path, url: str, units: list[Unit], record: dict[str, Any],
                options: RemoteOptions) -> None:
    """Upload one finished part: the staging mark, its ``units`` (each unit's files), then its record."""
    fs, path = filesystem(units_url(url), options.storage_options)
    path = path.rstrip("/")

    def put(relative: str) -> None:
        with_retry(lambda: fs.put_file(str(local_units / relative), f"{path}/{relative}"), units_url(url),
                   options.retry, options.storage_options)

    put(_STAGING_MARK_NAME)
    for unit in units:
        for file in sorted((local_units / unit.name).iterdir()):
            put(f"{unit.name}/{file.name}")
    put(PART_PATTERN.format(record["part"], record["parts"]))
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
