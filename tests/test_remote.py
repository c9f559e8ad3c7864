"""Datasets read from real servers on 127.0.0.1, started here: moto's S3 server (through
``AWS_ENDPOINT_URL`` or ``storage_options``) and an HTTP server answering range requests. No
mock of fsspec or s3fs: the bytes travel over sockets. Downloads are counted from the S3 server's
own request log."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
import torch
from torch.utils.data import DataLoader

import fastdata
from conftest import (
    WRITABLE_FORMATS, all_samples, convert_to, finish, output_contents, run_fastdata, same_samples, start_fastdata, wait_until,
)
from fastdata.errors import CorruptDataError, RemoteAccessError, RemoteNotFoundError, RemoteUnavailableError
from fastdata.formats.tar import TarDataset, TarIndexedDataset
from fastdata.remote import Cache, Retry

pytest.importorskip("moto.server")
pytest.importorskip("s3fs")
from servers import BUCKET, KEYS, ROOT, S3, CacheSizes, downloaded, upload  # noqa: E402 - after the skips


# --- reading ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name,store", [("npy", "raw"), ("npy", "encoded"), ("hdf5", "raw"), ("hdf5", "encoded"),
                                        ("tar", "raw"), ("tar", "encoded")])
def test_every_format_read_from_s3_gives_the_samples_read_locally(s3: S3, name: str, store: str,
                                                                  uniform_folder: Path, tmp_path: Path) -> None:
    local = convert_to(uniform_folder, tmp_path, name, store)
    url = upload(s3, local, f"read/{local.name}")  # AWS_ENDPOINT_URL leads s3fs to the server
    cache = tmp_path / "cache"
    remote = fastdata.open_dataset(url, cache_dir=cache, shuffle=False) if name == "tar" else \
        fastdata.open_dataset(url, cache_dir=cache)
    expected = fastdata.open_dataset(local, shuffle=False) if name == "tar" else fastdata.open_dataset(local)
    assert type(remote) is type(expected) and remote.url == url
    same_samples(remote, expected, 12)
    if name != "tar":
        images, labels = remote[[11, 0, 5]]
        local_images, local_labels = expected[[11, 0, 5]]
        assert torch.equal(images, local_images) and torch.equal(labels, local_labels)
    else:
        indexed = TarIndexedDataset(url, cache_dir=cache)
        assert torch.equal(indexed[[11, 0, 5]][0], fastdata.formats.tar.TarIndexedDataset(local)[[11, 0, 5]][0])
    assert fastdata.verify(url, cache_dir=cache).ok


@pytest.mark.parametrize("name", ["npy", "hdf5", "tar"])
def test_open_dataset_asks_the_server_for_the_manifest_once(s3: S3, name: str, uniform_folder: Path,
                                                             tmp_path: Path) -> None:
    """The manifest picks the reader, which opens the dataset with the same answer: one GET of
    the manifest (a one-file .h5: no more GETs of it than its reader opened directly makes)."""
    local = convert_to(uniform_folder, tmp_path, name, "encoded")
    url = upload(s3, local, f"once/{local.name}")
    key = f"once/{local.name}" + ("" if name == "hdf5" else "/manifest.json")
    before = s3.log.gets(key)
    dataset = fastdata.open_dataset(url, cache_dir=tmp_path / "cache")
    by_open_dataset = s3.log.gets(key) - before
    reader = type(dataset)(url, cache_dir=tmp_path / "cache-direct")
    by_the_reader = s3.log.gets(key) - before - by_open_dataset
    assert by_open_dataset == by_the_reader and (name == "hdf5" or by_open_dataset == 1)
    assert len(dataset) == len(reader) == 12


def test_a_tar_stream_over_workers_and_ranks_reads_what_the_local_one_reads(s3: S3, uniform_folder: Path,
                                                                              tmp_path: Path) -> None:
    local = convert_to(uniform_folder, tmp_path, "tar", "raw", shard_samples=2)  # 6 shards
    url = upload(s3, local, "split/ds.tar")
    seen = []
    for rank in (0, 1):
        options = dict(seed=3, rank=rank, world_size=2, shuffle_buffer=0)
        remote = TarDataset(url, cache_dir=tmp_path / "cache", **options)
        expected = TarDataset(local, **options)
        got = [int(label) for _, label in DataLoader(remote, batch_size=None, num_workers=2)]
        want = [int(label) for _, label in DataLoader(expected, batch_size=None, num_workers=2)]
        assert got == want
        seen += got
    assert sorted(seen) == sorted(int(label) for _, label in TarDataset(local))  # every sample once


def test_https_reads_with_range_requests(http_root, uniform_folder: Path, tmp_path: Path) -> None:
    root, base = http_root
    for name in WRITABLE_FORMATS:
        local = convert_to(uniform_folder, tmp_path, name, "encoded")
        if local.is_file():
            (root / local.name).write_bytes(local.read_bytes())
        else:
            (root / local.name).mkdir()
            for file in local.iterdir():
                (root / local.name / file.name).write_bytes(file.read_bytes())
        options = {"shuffle": False} if name == "tar" else {}
        remote = fastdata.open_dataset(f"{base}/{local.name}", cache_dir=tmp_path / "cache", **options)
        same_samples(remote, fastdata.open_dataset(local, **options), 12)


def test_storage_options_reach_the_server_and_no_credential_is_ever_shown(s3: S3, uniform_folder: Path,
                                                                          tmp_path: Path, monkeypatch) -> None:
    local = convert_to(uniform_folder, tmp_path, "npy", "raw")
    url = upload(s3, local, "opts/ds.npy")
    for name in [*KEYS, "AWS_ENDPOINT_URL"]:
        monkeypatch.delenv(name)
    secret = "a-secret-that-must-not-show"
    options = {"endpoint_url": s3.endpoint, "key": "some-key-id", "secret": secret, "skip_instance_cache": True}
    remote = fastdata.open_dataset(url, cache_dir=tmp_path / "cache", storage_options=options)
    assert np.array_equal(remote[[0, 1]][0].numpy(), fastdata.open_dataset(local)[[0, 1]][0].numpy())
    assert secret not in repr(remote.options) and secret not in repr(remote)
    assert secret not in json.dumps(remote.manifest)
    with pytest.raises(RemoteNotFoundError) as caught:
        fastdata.open_dataset(f"s3://{BUCKET}/opts/missing.npy", cache_dir=tmp_path / "cache",
                              storage_options=options, retry=Retry(attempts=1))
    message = str(caught.value)
    assert message.startswith(f"'s3://{BUCKET}/opts/missing.npy' does not exist (404: ")
    assert message.endswith("Check the URL: it names the dataset directory (or .h5 file) that 'fastdata convert' "
                            "wrote.")
    assert secret not in message and isinstance(caught.value, FileNotFoundError)


def test_no_credentials_is_explained_with_the_fix(s3: S3, tmp_path: Path, monkeypatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(RemoteAccessError) as caught:
        fastdata.open_dataset(f"s3://{BUCKET}/x.npy", cache_dir=tmp_path / "cache",
                              storage_options={"skip_instance_cache": True},
                              retry=Retry(attempts=1))
    assert str(caught.value).startswith(f"'s3://{BUCKET}/x.npy/manifest.json': no credentials found (")
    assert str(caught.value).endswith("To fix: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or "
                                      "pass storage_options={'anon': True} for a public bucket (from the CLI: "
                                      "FSSPEC_S3_ANON=true).")


def test_the_cli_reads_a_public_bucket_without_credentials_through_fsspecs_environment_config(
        s3: S3, uniform_folder: Path, tmp_path: Path) -> None:
    url = upload(s3, convert_to(uniform_folder, tmp_path, "tar", "encoded"), "public/ds.tar")
    fs = s3.fs()
    for key in fs.find(f"{BUCKET}/public/ds.tar"):  # a public bucket's objects: readable without credentials
        fs.chmod(key, "public-read")
    env = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "FASTDATA_CACHE_DIR": str(tmp_path / "cache"),
           "FSSPEC_S3_ANON": "true", "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
           "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_EC2_METADATA_DISABLED": "true"}
    info = run_fastdata("info", url, env=env)
    assert info.returncode == 0, info.stderr
    assert "samples:  12\n" in info.stdout


def test_the_cli_reads_a_url(s3: S3, uniform_folder: Path, tmp_path: Path) -> None:
    local = convert_to(uniform_folder, tmp_path, "tar", "encoded")
    url = upload(s3, local, "cli/ds.tar")
    env = {"FASTDATA_CACHE_DIR": str(tmp_path / "cache")}
    info = run_fastdata("info", url, env=env)
    assert info.returncode == 0, info.stderr
    assert f"path:     {url}\n" in info.stdout and "samples:  12\n" in info.stdout
    assert "in object storage" in info.stdout
    verify = run_fastdata("verify", url, env=env)
    assert verify.returncode == 0, verify.stderr
    assert verify.stdout.startswith(f"{url}: OK (tar, 12 samples; 4 checksums match)")


def test_bench_on_a_url_reads_it_cold_beside_the_local_copy_says_how_the_best_num_workers_shifts_and_uploads(
        s3: S3, uniform_folder: Path, tmp_path: Path) -> None:
    local = convert_to(uniform_folder, tmp_path, "tar", "encoded", shard_samples=2)  # 6 shards
    url = upload(s3, local, "bench/ds.tar")
    shards = sorted(p.name for p in local.glob("shard-*.tar"))
    before = {name: s3.log.gets(f"bench/ds.tar/{name}") for name in shards}
    out = f"s3://{BUCKET}/bench/results"  # bench --out URL: the results are uploaded there
    run = run_fastdata("bench", url, "--formats", "tar", "--stores", "encoded", "--num-workers", "0,2", "--backends",
                       "torch", "--batch-size", "4", "--epochs", "1", "--warmup", "0", "--cache", "cold", "--quiet",
                       "--out", out, env={"FASTDATA_CACHE_DIR": str(tmp_path / "cache")}, timeout=300)
    assert run.returncode == 0, run.stderr
    assert f"fastdata: {url}: 8 file(s) downloaded" in run.stderr  # the local copy: manifest, index, 6 shards
    assert run.stdout.startswith(f"fastdata bench: {url}, batch 4")
    assert f"\nwrote {out}/results.json, {out}/results.csv" in run.stdout
    document = json.loads(s3.fs().cat_file(f"{BUCKET}/bench/results/results.json"))
    assert s3.fs().cat_file(f"{BUCKET}/bench/results/results.csv").startswith(b"format,store,read_path,")
    rows = document["rows"]
    cells = sorted((row["store"], row["read_path"], row["num_workers"]) for row in rows if row["format"] == "tar")
    assert cells == sorted((store, path, workers) for store in ("encoded", "encoded url:cold")
                           for path in ("fast", "standard") for workers in (0, 2))
    assert all(row["status"] == "ok" for row in rows)
    assert {row["url"] for row in rows if row.get("location") == "url"} == {url}
    # every shard downloaded once for the local copy, then once per cold epoch of each of the 4 URL rows
    assert {name: s3.log.gets(f"bench/ds.tar/{name}") - before[name] for name in shards} == {name: 5 for name in shards}
    table = run.stdout.split("\n")
    assert any(line.startswith("tar encoded url:cold fast ") for line in table)
    assert any(line.startswith("tar encoded fast ") for line in table)
    assert any(line.startswith("url:cold: read from the dataset's URL through a cache of the bench's own, emptied "
                               "before each epoch") for line in table)
    remote = next(line for line in table if line.startswith("remote: "))
    assert re.fullmatch(r"remote: from the URL \(a cold cache: every shard downloaded while it is read\), tar encoded "
                        r"(fast|standard) is best at num_workers=[02] \([\d,]+/s, [\d.]+x the local copy's best\) "
                        r"against num_workers=[02] on the local copy \([\d,]+/s\): .+\.", remote), remote
    summary = document["summary"]["remote"]
    assert summary["cache"] == "cold" and summary["store"] == "encoded" and summary["text"] == remote[len("remote: "):]


# --- the cache -------------------------------------------------------------------------------


def test_the_cache_stays_within_its_limit_plus_one_shard_on_a_dataset_three_times_bigger(
        s3: S3, uniform_folder: Path, tmp_path: Path) -> None:
    local = convert_to(uniform_folder, tmp_path, "tar", "raw", shard_samples=1)  # 12 shards
    url = upload(s3, local, "bounded/ds.tar")
    manifest = json.loads((local / "manifest.json").read_text())
    total = sum(entry["bytes"] for entry in manifest["files"].values())
    shard = max(entry["bytes"] for name, entry in manifest["files"].items() if name.endswith(".tar"))
    limit = total // 3
    cache_dir = tmp_path / "cache"
    cache = Cache(cache_dir, limit)
    with CacheSizes(cache) as sizes:
        for epoch in range(2):
            dataset = TarDataset(url, cache_dir=cache_dir, cache_limit=limit, shuffle=False)
            labels = [int(label) for _, label in dataset]
            assert labels == [int(label) for _, label in TarDataset(local, shuffle=False)]
    sizes = sizes.samples
    assert len(sizes) > 10 and max(sizes) <= limit + shard, (max(sizes), limit, shard)
    assert cache.usage() <= limit


def test_a_shard_changed_on_the_server_is_fetched_again_then_named(s3: S3, uniform_folder: Path,
                                                                    tmp_path: Path) -> None:
    local = convert_to(uniform_folder, tmp_path, "tar", "raw", shard_samples=4)
    url = upload(s3, local, "changed/ds.tar")
    shard = bytearray((local / "shard-000001.tar").read_bytes())
    shard[1024] ^= 0xFF  # inside the first image member: same size, other bytes
    s3.fs().pipe(f"{BUCKET}/changed/ds.tar/shard-000001.tar", bytes(shard))
    before = s3.log.gets("changed/ds.tar/shard-000001.tar")
    dataset = TarDataset(url, cache_dir=tmp_path / "cache", shuffle=False, prefetch=0)
    with pytest.raises(CorruptDataError) as caught:
        list(dataset)
    assert str(caught.value).startswith(f"'{url}/shard-000001.tar': its blake2b ")
    assert "does not match the manifest's" in str(caught.value) and "(the same after fetching it again)" in str(caught.value)
    assert s3.log.gets("changed/ds.tar/shard-000001.tar") - before == 2
    assert not (tmp_path / "cache" / dataset.files.key / "shard-000001.tar").exists()
    assert os.listdir(tmp_path / "cache" / ".tmp") == []
    report = fastdata.verify(url, cache_dir=tmp_path / "cache")  # a finding of verify, not an exception
    assert not report.ok and report.path == url and len(report.problems) == 1
    assert report.problems[0].startswith(f"'{url}/shard-000001.tar': its blake2b ")


def test_a_stopped_server_is_a_clear_error_and_the_next_epoch_reads_once_it_is_back(
        s3: S3, uniform_folder: Path, tmp_path: Path) -> None:
    local = convert_to(uniform_folder, tmp_path, "tar", "raw", shard_samples=2)  # 6 shards
    url = upload(s3, local, "outage/ds.tar")
    dataset = TarDataset(url, cache_dir=tmp_path / "cache", shuffle=False, prefetch=0, batch_size=1,
                         retry=Retry(attempts=2, delay=0.01))  # batches of 1: samples are read as they are taken
    stream = iter(dataset)
    first = [int(next(stream)[1]) for _ in range(2)]  # shard 0 read
    s3.stop()
    try:
        with pytest.raises(RemoteUnavailableError) as caught:
            list(stream)
        assert str(caught.value).startswith(f"'{url}/shard-000001.tar': the server did not answer (endpoint "
                                            f"'{s3.endpoint}' from AWS_ENDPOINT_URL) after 2 attempts (")
    finally:
        s3.start()
    labels = [int(label) for _, batch in dataset for label in batch]
    assert labels == [int(label) for _, label in TarDataset(local, shuffle=False)] and labels[:2] == first


def test_a_short_outage_is_retried_and_the_read_is_exact(s3: S3, uniform_folder: Path, tmp_path: Path) -> None:
    local = convert_to(uniform_folder, tmp_path, "npy", "encoded")
    url = upload(s3, local, "blip/ds.npy")
    s3.stop()
    back = threading.Timer(0.5, s3.start)
    back.start()
    try:
        remote = fastdata.open_dataset(url, cache_dir=tmp_path / "cache", retry=Retry(attempts=8, delay=0.2))
    finally:
        back.join()
    assert torch.equal(remote[list(range(12))][0], fastdata.open_dataset(local)[list(range(12))][0])


def test_two_processes_with_two_workers_each_download_every_shard_once(s3: S3, uniform_folder: Path,
                                                                        tmp_path: Path) -> None:
    local = convert_to(uniform_folder, tmp_path, "tar", "raw", shard_samples=1)  # 12 shards
    url = upload(s3, local, "shared/ds.tar")
    script = (
        "import json, sys\n"
        "from torch.utils.data import DataLoader\n"
        "from fastdata.formats.tar import TarDataset\n"
        f"ds = TarDataset({url!r}, cache_dir={str(tmp_path / 'cache')!r}, shuffle=False)\n"
        "labels = [int(label) for _, label in DataLoader(ds, batch_size=None, num_workers=2)]\n"
        "print(json.dumps(sorted(labels)))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    runs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env) for _ in range(2)]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err for _, err in outputs]
    expected = sorted(int(label) for _, label in TarDataset(local, shuffle=False))
    assert [json.loads(out) for out, _ in outputs] == [expected, expected]
    shards = sorted(name for name in os.listdir(local) if name.endswith(".tar"))
    assert {name: s3.log.gets(f"shared/ds.tar/{name}") for name in shards} == {name: 1 for name in shards}


def test_what_a_killed_process_left_in_the_cache_does_not_trip_the_next_run(s3: S3, uniform_folder: Path,
                                                                             tmp_path: Path) -> None:
    local = convert_to(uniform_folder, tmp_path, "npy", "raw")
    url = upload(s3, local, "killed/ds.npy")
    cache_dir = tmp_path / "cache"
    Cache(cache_dir, 10**6)
    (cache_dir / ".tmp" / "0123456789abcdef01234567.99999.deadbeef.4096.part").write_bytes(b"half")  # no lock held
    (cache_dir / ".locks" / "0123456789abcdef01234567.lock").write_bytes(b"")
    killed = subprocess.run([sys.executable, "-c", (
        "import os, fastdata\n"
        f"ds = fastdata.open_dataset({url!r}, cache_dir={str(cache_dir)!r})\n"
        "ds[0]\n"
        "os.kill(os.getpid(), 9)\n")], env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, timeout=120)
    assert killed.returncode == -9
    remote = fastdata.open_dataset(url, cache_dir=cache_dir, cache_limit=10**6)
    assert np.array_equal(remote[[3]][0].numpy(), fastdata.open_dataset(local)[[3]][0].numpy())
    assert os.listdir(cache_dir / ".tmp") == []


# --- writing ---------------------------------------------------------------------------------


def test_convert_to_s3_uploads_every_file_then_the_manifest_and_reads_back(s3: S3, uniform_folder: Path,
                                                                           tmp_path: Path, capsys, monkeypatch) -> None:
    from fastdata.cli import main

    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/written/ds.tar"
    start = len(s3.log.lines)
    assert main(["convert", str(uniform_folder), url, "--shard-samples", "5", "--quiet"]) == 0
    puts = [line for line in s3.log.lines[start:] if re.search(r"(?<![A-Z])(PUT|DELETE) /", line)]
    names = [re.search(rf"/{BUCKET}/written/ds.tar/([^ ?]+)", line)[1] for line in puts if "/written/ds.tar/" in line]
    assert names[0] == ".fastdata-upload" and names[-2:] == ["manifest.json", ".fastdata-upload"]  # marker, ..., manifest, marker gone
    assert sorted(names[1:-2]) == ["index.json", "shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert sorted(s3.fs().ls(f"{BUCKET}/written/ds.tar")) == sorted(
        f"{BUCKET}/written/ds.tar/{name}" for name in ["index.json", "manifest.json", "shard-000000.tar",
                                                        "shard-000001.tar", "shard-000002.tar"])
    local = convert_to(uniform_folder, tmp_path, "tar", "raw")
    same_samples(fastdata.open_dataset(url, shuffle=False, cache_dir=tmp_path / "read"),
                 fastdata.open_dataset(local, shuffle=False), 12)
    capsys.readouterr()
    assert main(["convert", str(uniform_folder), url, "--quiet"]) == 1
    assert capsys.readouterr().err == f"fastdata: error: Output {url!r} already exists. Pass --overwrite (overwrite=True) to replace it.\n"
    assert main(["convert", str(uniform_folder), url, "--shard-samples", "12", "--overwrite", "--quiet"]) == 0
    assert sorted(name.rsplit("/", 1)[-1] for name in s3.fs().ls(f"{BUCKET}/written/ds.tar")) == [
        "index.json", "manifest.json", "shard-000000.tar"]  # the old dataset's other shards are gone


def test_an_interrupted_upload_is_no_dataset_and_resume_finishes_it(s3: S3, uniform_folder: Path, tmp_path: Path,
                                                                    capsys, monkeypatch) -> None:
    from fastdata.cli import main

    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/interrupted/ds.npy"
    s3.fs().pipe(f"{BUCKET}/interrupted/ds.npy/.fastdata-upload", b"x")  # what an upload killed midway leaves
    s3.fs().pipe(f"{BUCKET}/interrupted/ds.npy/labels.npy", b"partial")
    with pytest.raises(RemoteNotFoundError, match="holds no manifest.json: it is not a dataset written by "
                                                  r"'fastdata convert' \(or its conversion did not finish\)"):
        fastdata.open_dataset(url, cache_dir=tmp_path / "read", retry=Retry(attempts=1))
    assert main(["convert", str(uniform_folder), url, "--quiet"]) == 1
    assert capsys.readouterr().err == (f"fastdata: error: Output {url!r} holds an interrupted fastdata upload (no "
                                       "manifest). Pass --resume (resume=True) to continue it or --overwrite (overwrite=True) to replace it.\n")
    assert main(["convert", str(uniform_folder), url, "--resume", "--quiet"]) == 0
    local = convert_to(uniform_folder, tmp_path, "npy", "raw")
    remote = fastdata.open_dataset(url, cache_dir=tmp_path / "read")
    assert torch.equal(remote[list(range(12))][0], fastdata.open_dataset(local)[list(range(12))][0])


def test_overwrite_never_replaces_what_fastdata_did_not_write(s3: S3, uniform_folder: Path, tmp_path: Path,
                                                              capsys, monkeypatch) -> None:
    from fastdata.cli import main

    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    s3.fs().pipe(f"{BUCKET}/foreign/photos/cat.jpg", b"not ours")
    s3.fs().pipe(f"{BUCKET}/foreign/notes.h5", b"not ours either")
    for url, found in ((f"s3://{BUCKET}/foreign/photos", "already holds objects not written by fastdata (e.g. "
                                                          "'cat.jpg'); fastdata never replaces them."),
                       (f"s3://{BUCKET}/foreign/notes.h5", "already exists and is not a fastdata dataset; fastdata "
                                                           "never replaces it.")):
        assert main(["convert", str(uniform_folder), url, "--format", "hdf5" if url.endswith("h5") else "tar",
                     "--overwrite", "--quiet"]) == 1
        assert capsys.readouterr().err == f"fastdata: error: Output {url!r} {found} Choose another output URL.\n"
    assert s3.fs().cat_file(f"{BUCKET}/foreign/photos/cat.jpg") == b"not ours"
    assert s3.fs().cat_file(f"{BUCKET}/foreign/notes.h5") == b"not ours either"


@pytest.mark.parametrize("name", ["npy", "hdf5"])
def test_a_memory_mapped_dataset_bigger_than_the_cache_is_refused_before_anything_is_downloaded(
        s3: S3, name: str, uniform_folder: Path, tmp_path: Path) -> None:
    local = convert_to(uniform_folder, tmp_path, name, "raw")
    url = upload(s3, local, f"toobig/{local.name}")
    if local.is_file():
        size, shards = local.stat().st_size, [local.name]
    else:
        files = json.loads((local / "manifest.json").read_text())["files"]
        size, shards = sum(entry["bytes"] for entry in files.values()), list(files)
    start = len(s3.log.lines)
    with pytest.raises(fastdata.errors.InvalidOptionError) as caught:
        fastdata.open_dataset(url, cache_dir=tmp_path / "cache", cache_limit=size // 2)
    why = ("its one file is fetched whole and read from the cache while it is open" if name == "hdf5" else
           "its files are fetched whole and memory-mapped from the cache while it is open")
    assert str(caught.value) == (
        f"{url!r} is {size} bytes, more than cache_limit {size // 2} bytes: {why}. Raise cache_limit (cache_limit= or "
        f"$FASTDATA_CACHE_LIMIT) to at least {size} bytes, or convert it to tar ('fastdata convert {url} OUT.tar'), "
        "whose readers stream shards through a cache of any size.")
    assert not [line for line in s3.log.lines[start:] for file in shards if f"{local.name}/{file} " in line
                or line.endswith(f"GET /{BUCKET}/toobig/{local.name} HTTP/1.1")]  # no data file was downloaded
    remote = fastdata.open_dataset(url, cache_dir=tmp_path / "cache", cache_limit=size)  # the fix: it fits
    assert torch.equal(remote[list(range(12))][0], fastdata.open_dataset(local)[list(range(12))][0])


def test_random_access_to_a_tar_dataset_three_times_the_cache_stays_within_the_limit_plus_one_shard(
        s3: S3, tmp_path: Path) -> None:
    from conftest import pattern, save

    folder = tmp_path / "large"  # 64x64 images: a shard (12 kB) well above the index and manifest held at open
    for i in range(12):
        save(Image.fromarray(pattern(64, 64, seed=i)), folder / ["ant", "bee", "cow"][i % 3] / f"{i}.png")
    local = convert_to(folder, tmp_path, "tar", "raw", shard_samples=1)  # 12 shards
    url = upload(s3, local, "indexed/ds.tar")
    manifest = json.loads((local / "manifest.json").read_text())
    shard_files = [name for name in manifest["files"] if name.endswith(".tar")]
    total = sum(manifest["files"][name]["bytes"] for name in shard_files)
    shard = max(manifest["files"][name]["bytes"] for name in shard_files)
    limit = total // 3
    cache_dir = tmp_path / "cache"
    cache = Cache(cache_dir, limit)
    remote = TarIndexedDataset(url, cache_dir=cache_dir, cache_limit=limit)
    expected = TarIndexedDataset(local)
    order = np.random.default_rng(0).permutation(np.tile(np.arange(12), 3))  # every sample 3 times, shuffled
    before = sum(s3.log.gets(f"indexed/ds.tar/{name}") for name in shard_files)
    with CacheSizes(cache) as sizes:
        for batch in np.array_split(order, 9):  # batches of 4 samples from up to 4 shards
            got, want = remote[batch.tolist()], expected[batch.tolist()]
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        remote.close()  # its open shards released: the workers' readers below have the cache to themselves
        for workers in (0, 2):
            fresh = TarIndexedDataset(url, cache_dir=cache_dir, cache_limit=limit)
            loader = DataLoader(fresh, batch_size=3, shuffle=True, num_workers=workers)
            assert sorted(int(label) for _, labels in loader for label in labels) == sorted(expected.labels.tolist())
            fresh.close()
    sizes = sizes.samples
    assert len(sizes) > 10 and max(sizes) <= limit + shard, (max(sizes), limit, shard)
    fetched = sum(s3.log.gets(f"indexed/ds.tar/{name}") for name in shard_files) - before
    assert fetched > 12  # shards evicted to stay within the limit were fetched again when read again


def test_parts_on_machines_sharing_only_the_bucket_merge_into_the_local_engines_bytes(
        s3: S3, tmp_path: Path, capsys, monkeypatch) -> None:
    from fastdata.cli import main
    from conftest import make_folder

    source = make_folder(tmp_path / "src", 30)
    options = dict(format="tar", store="encoded", shard_samples=8, skip_bad=True)
    local = tmp_path / "local"
    fastdata.convert(source, local, workers=0, **options)
    url = f"s3://{BUCKET}/parts/ds.tar"
    for part in (1, 2, 3):  # each part in a cache of its own: a machine of its own
        monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / f"machine-{part}"))
        if part == 3:
            capsys.readouterr()
            assert main(["merge", url, "--quiet"]) == 1
            assert capsys.readouterr().err.startswith(f"fastdata: error: Cannot merge {url!r}: 1 of 3 parts missing (3/3).")
            assert not (tmp_path / "machine-3" / ".uploads").exists() or not [  # records checked before units fetched
                p for p in (tmp_path / "machine-3").rglob("unit-*")]
        record = fastdata.convert(source, url, part=f"{part}/3", unit_samples=4, workers=0, **options)
        assert record["count"] == [7, 12, 11][part - 1]
    with pytest.raises(fastdata.errors.PartsError, match=re.escape(
            f"Part 2/3 of {url!r} was already uploaded (process {os.getpid()} on ")):
        fastdata.convert(source, url, part="2/3", unit_samples=4, workers=0, **options)
    assert not s3.fs().exists(f"{BUCKET}/parts/ds.tar")  # the units lie beside the output: no dataset yet
    shared = sorted(name.rsplit("/", 1)[-1] for name in s3.fs().ls(f"{BUCKET}/parts/ds.tar.partial.units"))
    assert [name for name in shared if name.startswith("part-")] == [
        "part-0001-of-0003.json", "part-0002-of-0003.json", "part-0003-of-0003.json"]
    assert [name for name in shared if name.startswith("unit-")] == [f"unit-{n:06d}" for n in range(8)]
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "merger"))
    assert main(["merge", url, "--quiet"]) == 0
    assert capsys.readouterr().out == f"merged into {url}: 30 samples (67.3 kB); skipped 1 (listed in the manifest)\n"
    assert output_contents(downloaded(s3, url, tmp_path / "got")) == output_contents(local)  # the objects are the local engine's files
    assert not s3.fs().exists(f"{BUCKET}/parts/ds.tar.partial.units")
    assert not s3.fs().exists(f"{BUCKET}/parts/ds.tar/.fastdata-upload")
    for cache in ["merger", "machine-1", "machine-2", "machine-3"]:  # no staged unit or record kept in a cache
        assert not [p for p in (tmp_path / cache).rglob("*") if p.is_file() and "unit-" in p.as_posix()], cache
    with pytest.raises(fastdata.errors.OutputExistsError, match=re.escape(
            f"Output {url!r} already exists. Pass --overwrite (overwrite=True) to replace it.")):  # a part of a new job array
        fastdata.convert(source, url, part="1/3", unit_samples=4, workers=0, **options)
    read = all_samples(fastdata.open_dataset(url, shuffle=False, cache_dir=tmp_path / "read"))
    expected = all_samples(fastdata.open_dataset(local, shuffle=False))
    assert read[1] == expected[1] and len(read[0]) == 30
    assert all(np.array_equal(x, y) for x, y in zip(read[0], expected[0]))


def test_a_part_killed_after_its_first_unit_resumes_from_the_bucket_without_converting_it_again(
        s3: S3, tmp_path: Path) -> None:
    import signal

    url = f"s3://{BUCKET}/killed/ds.tar"
    units = f"{BUCKET}/killed/ds.tar.partial.units"
    source = ["torchvision:FakeData", "--source-option", "size=6000", "--source-option", "image_size=(3, 64, 64)"]
    options = ["--format", "tar", "--store", "encoded", "--unit-samples", "500", "--workers", "1", "--quiet"]

    def convert(output: str, machine: str, *extra: str) -> subprocess.Popen:
        return start_fastdata("convert", *source, output, *options, *extra,
                              env={"FASTDATA_CACHE_DIR": str(tmp_path / machine)}, start_new_session=True)

    process = convert(url, "machine-1", "--part", "1/1")
    wait_until(lambda: s3.fs().exists(f"{units}/unit-000000/unit.json"), "the first unit's upload", process=process)
    os.killpg(process.pid, signal.SIGKILL)
    finish(process, timeout=30)
    assert not s3.fs().exists(f"{units}/part-0001-of-0001.json")  # killed midway: the part is not done
    uploaded = sorted(name.rsplit("/", 1)[-1] for name in s3.fs().find(f"{units}/unit-000000"))
    assert uploaded == ["data.bin", "labels.npy", "sizes.npy", "unit.json"]
    start = len(s3.log.lines)
    again = convert(url, "machine-2", "--part", "1/1")  # another machine: only the bucket holds the unit
    _, stderr = finish(again, timeout=300)
    assert again.returncode == 0, stderr
    lines = s3.log.lines[start:]
    assert [line for line in lines if re.search(r"(?<![A-Z])GET /[^ ]*/unit-000000/data.bin", line)]
    assert not [line for line in lines if re.search(r"(?<![A-Z])PUT /[^ ]*/unit-000000/", line)]  # kept, not redone
    assert [line for line in lines if re.search(r"(?<![A-Z])PUT /[^ ]*/unit-000011/unit.json", line)]
    merge = run_fastdata("merge", url, "--quiet", env={"FASTDATA_CACHE_DIR": str(tmp_path / "merger")}, timeout=300)
    assert merge.returncode == 0, merge.stderr
    local = tmp_path / "local.tar"
    whole = convert(str(local), "machine-3")
    finish(whole, timeout=300)
    assert whole.returncode == 0
    assert output_contents(downloaded(s3, url, tmp_path / "got")) == output_contents(local)


def test_ray_writes_to_a_url_the_local_engines_bytes(s3: S3, tmp_path: Path, monkeypatch) -> None:
    ray = pytest.importorskip("ray")
    from conftest import make_folder

    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    source = make_folder(tmp_path / "src", 20)
    options = dict(format="npy", store="encoded", skip_bad=True)
    local = tmp_path / "local"
    fastdata.convert(source, local, workers=0, **options)
    url = f"s3://{BUCKET}/ray/ds.npy"
    s3.fs().pipe(f"{BUCKET}/ray/ds.npy/.fastdata-upload", b"x")  # what a killed run leaves: its marker, a file
    s3.fs().pipe(f"{BUCKET}/ray/ds.npy/labels.npy", b"partial")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:  # run again without --resume, as a Ray conversion is locally (it keeps the units it finished)
        manifest = fastdata.convert(source, url, engine="ray", unit_samples=6, **options)
    finally:
        ray.shutdown()
    assert manifest["count"] == 20 and [s["key"] for s in manifest["skipped"]] == ["a/007-bad.png"]
    assert output_contents(downloaded(s3, url, tmp_path / "got")) == output_contents(local)  # no marker either
    cached = [p.name for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert cached == [".fastdata-cache"]  # no staging copy or unit kept


def test_hdf5_parts_merge_into_one_object_equal_to_the_local_file_and_no_marker_is_left(
        s3: S3, tmp_path: Path, monkeypatch) -> None:
    from conftest import make_folder

    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    source = make_folder(tmp_path / "src", 20)
    fastdata.convert(source, tmp_path / "local.h5", workers=0, skip_bad=True)
    url = f"s3://{BUCKET}/h5parts/ds.h5"
    for part in (1, 2):
        fastdata.convert(source, url, part=f"{part}/2", unit_samples=4, workers=0, skip_bad=True)
    assert fastdata.merge(url)["count"] == 20
    fastdata.convert(source, f"s3://{BUCKET}/h5parts/plain.h5", workers=0, skip_bad=True)
    assert s3.fs().find(f"{BUCKET}/h5parts") == [f"{BUCKET}/h5parts/ds.h5", f"{BUCKET}/h5parts/plain.h5"]
    for name in ("ds.h5", "plain.h5"):  # the upload marker of a one-object dataset is removed too
        s3.fs().get_file(f"{BUCKET}/h5parts/{name}", str(tmp_path / f"got-{name}"))
        assert output_contents(tmp_path / f"got-{name}") == output_contents(tmp_path / "local.h5")


def _usage_in_child(directory: str) -> None:
    Cache(Path(directory), 10**6).usage()  # takes the cache's lock


def test_a_process_forked_while_another_thread_holds_the_cache_lock_can_take_it(tmp_path: Path) -> None:
    """A DataLoader worker forked while another thread of its parent holds the cache's lock (a
    flock, which belongs to the open file the child shares) must not keep that lock held for
    its whole life and then wait for it forever: the child closes its copy at the fork."""
    import multiprocessing

    cache = Cache(tmp_path / "cache", 10**6)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with cache._locked(cache.directory / ".lock"):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(30)
    child = multiprocessing.get_context("fork").Process(target=_usage_in_child, args=(str(cache.directory),))
    child.start()  # forked while the lock is held
    release.set()
    holder.join()
    child.join(30)
    hung = child.is_alive()
    if hung:
        child.kill()
        child.join()
    assert not hung and child.exitcode == 0
    assert cache.usage() == 0  # and this process takes it too
