"""One writer of a URL at a time, across machines that share only the bucket: the lock objects of
fastdata.conversion.remote.locks, created with S3's conditional write (``If-None-Match: *``) on the moto
server, refuse a second merge, a part run during a merge and two runs of one part, each naming
the holder; a killed holder's lock is taken over as documented."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from pathlib import Path

import pytest

import fastdata
from fastdata.errors import OutputLockedError
from conftest import output_contents, wait_until
from fastdata.remote import RemoteOptions

pytest.importorskip("moto.server")
pytest.importorskip("s3fs")
from servers import BUCKET, S3, downloaded, kill, stuck_after_upload  # noqa: E402 - after the skips

HOST = socket.gethostname()
OPTIONS = dict(format="tar", store="raw", shard_samples=3, unit_samples=4, workers=0)


def parts_in_bucket(folder: Path, url: str) -> None:
    """Both parts of a 2-part job array converted into ``url``'s shared units."""
    for part in ("1/2", "2/2"):
        fastdata.convert(folder, url, part=part, **OPTIONS)


def refusal(caught: pytest.ExceptionInfo, operation: str, url: str, why: str, holder: str, lock: str) -> None:
    message = str(caught.value)
    assert message.startswith(f"Cannot {operation} {url!r}: {why} ({holder}, started "), message
    assert f"; lock {lock!r}). Wait for it to finish. If that process is gone, run again: its lock is taken over at " \
           "once on its own machine, and elsewhere once it is 600 s old ($FASTDATA_LOCK_STALE_S); or delete the lock " \
           "object." in message, message
    assert isinstance(caught.value, OutputLockedError)


def test_a_second_merge_and_a_part_rerun_are_refused_while_a_merge_runs_and_a_killed_merge_is_taken_over(
        s3: S3, uniform_folder: Path, tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/locked/ds.tar"
    parts_in_bucket(uniform_folder, url)
    merging = stuck_after_upload(f"fastdata.merge({url!r})", "shard-000000.tar", tmp_path / "stuck")  # holds its lock
    holder = f"merge: process {merging.pid} on {HOST}"
    with pytest.raises(OutputLockedError) as caught:
        fastdata.merge(url)
    refusal(caught, "merge", url, "another process is writing it", holder, f"{url}.partial.lock")
    with pytest.raises(OutputLockedError) as caught:
        fastdata.convert(uniform_folder, url, part="1/2", overwrite=True, **OPTIONS)
    refusal(caught, "convert part 1/2 of", url, "a merge or a whole conversion is writing it", holder,
            f"{url}.partial.lock")
    assert not s3.fs().exists(f"{BUCKET}/locked/ds.tar.partial.units/part-0001-of-0002.lock")  # the part let go
    kill(merging)  # its lock stays in the bucket: its process, on this machine, is gone
    lock = json.loads(s3.fs().cat_file(f"{BUCKET}/locked/ds.tar.partial.lock"))
    assert (lock["operation"], lock["pid"], lock["host"]) == ("merge", merging.pid, HOST)
    with caplog.at_level(logging.WARNING, logger="fastdata.conversion.remote.locks"):
        assert fastdata.merge(url)["count"] == 12
    warned = [record.getMessage() for record in caplog.records if record.name == "fastdata.conversion.remote.locks"]
    assert len(warned) == 1 and re.fullmatch(
        re.escape(f"{url}.partial.lock: taking over a stale lock ({holder}, started {lock['started']}, last refreshed ")
        + r"\d+ s ago\)", warned[0]), warned
    assert not s3.fs().exists(f"{BUCKET}/locked/ds.tar.partial.lock")  # released after the merge
    local = tmp_path / "local.tar"
    fastdata.convert(uniform_folder, local, **{k: v for k, v in OPTIONS.items() if k != "unit_samples"})
    assert output_contents(downloaded(s3, url, tmp_path / "got")) == output_contents(local)


def test_one_part_runs_once_at_a_time_and_a_merge_waits_for_the_parts(s3: S3, uniform_folder: Path,
                                                                       tmp_path: Path, monkeypatch) -> None:
    from fastdata.conversion.remote.locks import part_writing

    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/parts-locked/ds.tar"
    lock = f"{url}.partial.units/part-0001-of-0002.lock"
    holder = f"part 1/2: process {os.getpid()} on {HOST}"
    with part_writing(url, 1, 2, RemoteOptions()):  # part 1/2 being converted by another job
        with pytest.raises(OutputLockedError) as caught:
            fastdata.convert(uniform_folder, url, part="1/2", **OPTIONS)
        refusal(caught, "convert part 1/2 of", url, "another process is converting part 1/2", holder, lock)
        fastdata.convert(uniform_folder, url, part="2/2", **OPTIONS)  # another part runs beside it
        with pytest.raises(OutputLockedError) as caught:
            fastdata.merge(url)
        refusal(caught, "merge", url, "a part of a job array is converting into it", holder, lock)
        assert not s3.fs().exists(f"{BUCKET}/parts-locked/ds.tar.partial.lock")  # the merge let go
    assert not s3.fs().exists(f"{BUCKET}/parts-locked/ds.tar.partial.units/part-0001-of-0002.lock")
    fastdata.convert(uniform_folder, url, part="1/2", **OPTIONS)
    assert fastdata.merge(url)["count"] == 12


def test_a_lock_from_another_machine_is_stale_only_once_it_is_old(s3: S3, uniform_folder: Path, tmp_path: Path,
                                                                  monkeypatch) -> None:
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/elsewhere/ds.tar"
    record = {"operation": "convert", "pid": 4242, "host": "node-17", "started": "2026-01-02 03:04:05", "token": "x"}
    s3.fs().pipe(f"{BUCKET}/elsewhere/ds.tar.partial.lock", json.dumps(record).encode())
    with pytest.raises(OutputLockedError) as caught:
        fastdata.convert(uniform_folder, url, **OPTIONS)
    refusal(caught, "convert", url, "another process is writing it", "convert: process 4242 on node-17",
            f"{url}.partial.lock")
    assert not s3.fs().exists(f"{BUCKET}/elsewhere/ds.tar")  # nothing written
    monkeypatch.setenv("FASTDATA_LOCK_STALE_S", "0")  # not refreshed for that long: its holder is gone
    assert fastdata.convert(uniform_folder, url, **OPTIONS)["count"] == 12
    assert not s3.fs().exists(f"{BUCKET}/elsewhere/ds.tar.partial.lock")


def test_a_holder_refreshes_its_lock_and_one_whose_lock_was_taken_over_commits_nothing(s3: S3, monkeypatch) -> None:
    from fastdata.conversion.remote import locks

    monkeypatch.setattr(locks, "REFRESH_S", 0.01)
    url = f"s3://{BUCKET}/taken/ds.tar"
    key = f"{BUCKET}/taken/ds.tar.partial.lock"
    first = locks.BucketLock(f"{url}.partial.lock", "merge", url, RemoteOptions())
    start = len(s3.log.lines)
    assert first.try_acquire() is None
    wait_until(lambda: len([line for line in s3.log.lines[start:] if f"PUT /{key} " in line]) >= 3,
               "two refreshes", timeout_s=60, poll_s=0.01)
    monkeypatch.setenv("FASTDATA_LOCK_STALE_S", "0")  # as if the first had stopped refreshing it
    second = locks.BucketLock(f"{url}.partial.lock", "merge", url, RemoteOptions())
    assert second.try_acquire() is None
    wait_until(lambda: first.lost, "the lost lock noticed", timeout_s=60, poll_s=0.01)  # its If-Match refresh refused
    with pytest.raises(OutputLockedError) as caught:
        first.check()
    assert str(caught.value).startswith(f"{url!r}: this merge's lock '{url}.partial.lock' was taken over by another "
                                        f"process (merge: process {os.getpid()} on {HOST}, started ")
    assert str(caught.value).endswith(") while it ran, so nothing was committed. Make sure one process writes this "
                                      "output at a time, then run again.")
    first.release()
    assert json.loads(s3.fs().cat_file(key))["token"] == second.token  # the new holder's lock is left alone
    second.check()
    second.release()
    assert not s3.fs().exists(key)
