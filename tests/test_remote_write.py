"""Writing a dataset to a bucket (the moto S3 server on 127.0.0.1, tests/servers.py): a tar
conversion streams its shards (each uploaded as it is closed, then removed from the local
disk), so it needs about one shard of local disk, and ``--resume`` continues from the bucket."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

import fastdata
from conftest import convert_to, output_contents

pytest.importorskip("moto.server")
pytest.importorskip("s3fs")
from servers import BUCKET, S3, downloaded, kill, stuck_after_upload  # noqa: E402 - after the skips


class StagingSnapshots(logging.Handler):
    """At each shard upload (the sink logs before and after it, in the writer's thread), what the
    local staging folder holds: a hook on the upload itself, not a sample in time."""

    def __init__(self, folder: Path) -> None:
        super().__init__(logging.DEBUG)
        self.folder, self.snapshots = folder, []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(("uploading ", "uploaded ")) and ".tar/shard-" in message:
            files = {p.name: p.stat().st_size for p in self.folder.rglob("*") if p.is_file()}
            self.snapshots.append((message.split()[0], message.split()[1].rsplit("/", 1)[-1], files))


def test_a_tar_conversion_to_a_url_holds_at_most_the_shard_being_written_and_the_one_being_uploaded(
        s3: S3, uniform_folder: Path, tmp_path: Path, monkeypatch) -> None:
    from fastdata.conversion.remote.upload import staging_path

    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/streamed/ds.tar"
    local = convert_to(uniform_folder, tmp_path, "tar", "raw", shard_samples=1)  # 12 shards
    shard = max(p.stat().st_size for p in local.glob("shard-*.tar"))
    staging = staging_path(url)
    watcher = StagingSnapshots(staging.parent)
    upload_log = logging.getLogger("fastdata.conversion.remote.upload")
    upload_log.addHandler(watcher)
    monkeypatch.setattr(upload_log, "level", logging.DEBUG)
    try:
        fastdata.convert(uniform_folder, url, format="tar", store="raw", shard_samples=1, workers=0)
    finally:
        upload_log.removeHandler(watcher)
    names = [f"shard-{n:06d}.tar" for n in range(12)]
    assert [(event, name) for event, name, _ in watcher.snapshots] == [
        (event, name) for name in names for event in ("uploading", "uploaded")]
    for event, name, files in watcher.snapshots:
        finished = sorted(file for file in files if re.fullmatch(r"shard-\d+\.tar", file))
        assert finished == ([name] if event == "uploading" else []), (event, name, files)
        assert len([file for file in files if file.endswith(".tar.partial")]) <= 1  # the shard being written
        shards = sum(size for file, size in files.items() if ".tar" in file and not file.endswith(".json"))
        assert shards <= 2 * shard, (event, name, files)
    assert output_contents(downloaded(s3, url, tmp_path / "got")) == output_contents(local)
    assert not staging.parent.exists() or not [p for p in staging.parent.rglob("*") if p.is_file()]


def test_resume_continues_a_killed_url_conversion_from_the_bucket_and_brings_back_the_shard_it_reopens(
        s3: S3, uniform_folder: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/resumed/ds.tar"
    # units of 4 samples, shards of 3: the last checkpoint (after unit 1, samples 0-7) has shard 2
    # open with samples 6-7; sample 9 then closes it, and the process is killed once it is uploaded
    call = (f"fastdata.convert({str(uniform_folder)!r}, {url!r}, format='tar', store='raw', shard_samples=3, "
            "unit_samples=4, workers=0)")
    kill(stuck_after_upload(call, "shard-000002.tar", tmp_path / "stuck"))
    prefix = f"{BUCKET}/resumed/ds.tar"
    assert sorted(name.rsplit("/", 1)[-1] for name in s3.fs().find(prefix)) == [
        ".fastdata-upload", "shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]  # no manifest: no dataset
    local = convert_to(uniform_folder, tmp_path, "tar", "raw", shard_samples=3)
    good = (local / "shard-000000.tar").read_bytes()
    s3.fs().pipe(f"{prefix}/shard-000000.tar", good[:512])  # changed in the bucket meanwhile
    start = len(s3.log.lines)
    options = dict(format="tar", store="raw", shard_samples=3, unit_samples=4, workers=0, resume=True)
    with pytest.raises(fastdata.errors.OutputWriteError) as caught:
        fastdata.convert(uniform_folder, url, **options)
    assert str(caught.value) == (
        f"'{url}/shard-000000.tar', uploaded while the conversion ran, has 512 bytes, not {len(good)} in the bucket "
        "now (removed or replaced since); the manifest was not written. Put it back and run again with --resume (resume=True), or "
        "convert again with --overwrite (overwrite=True).")
    assert not s3.fs().exists(f"{prefix}/manifest.json")
    s3.fs().pipe(f"{prefix}/shard-000000.tar", good)
    assert fastdata.convert(uniform_folder, url, **options)["count"] == 12  # the finished staging copy, uploaded
    requests = [re.search(rf"(GET|PUT) /{prefix}/([^ ?]+)", line) for line in s3.log.lines[start:]]
    shards = [(found[1], found[2]) for found in requests if found and found[2].startswith("shard-")]
    # shards 0-1 are in the checkpoint: kept in the bucket; shard 2, reopened at the checkpoint, is
    # brought back, finished and sent again; shard 3 is new (shard 0's PUT is the test's own)
    assert shards == [("GET", "shard-000002.tar"), ("PUT", "shard-000002.tar"), ("PUT", "shard-000003.tar"),
                      ("PUT", "shard-000000.tar")]
    assert output_contents(downloaded(s3, url, tmp_path / "got")) == output_contents(local)


def test_ctrl_c_keeps_a_url_conversion_for_resume(s3: S3, uniform_folder: Path, tmp_path: Path, monkeypatch) -> None:
    from fastdata.conversion import journal
    from fastdata.errors import ConversionInterrupted

    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(journal, "CHECKPOINT_INTERVAL_S", 0.0)  # a checkpoint at every unit's end
    url = f"s3://{BUCKET}/interrupted-by-ctrl-c/ds.tar"
    options = dict(format="tar", store="raw", shard_samples=3, unit_samples=4, workers=0)
    done = [0]

    def ctrl_c_after_unit_1(count: int, total: int) -> None:
        done[0] += count
        if done[0] > 8:  # the checkpoint after unit 1 (samples 0-7) is written
            raise KeyboardInterrupt

    with pytest.raises(ConversionInterrupted) as caught:
        fastdata.convert(uniform_folder, url, progress=ctrl_c_after_unit_1, **options)
    assert str(caught.value).startswith(f"{url!r} keeps 8 of 12 samples in ")
    assert str(caught.value).endswith("; run the same command with --resume (resume=True) to continue from there")
    assert not s3.fs().exists(f"{BUCKET}/interrupted-by-ctrl-c/ds.tar/manifest.json")  # no dataset yet
    assert fastdata.convert(uniform_folder, url, resume=True, **options)["count"] == 12
    local = convert_to(uniform_folder, tmp_path, "tar", "raw", shard_samples=3)
    assert output_contents(downloaded(s3, url, tmp_path / "got")) == output_contents(local)
