"""What a URL's cache and upload may touch, and what their failures leave (the moto S3 server on
127.0.0.1, tests/servers.py): the cache works only in a folder of its own and evicts only what it
fetched; ``--overwrite`` deletes only what the old manifest lists; a failed conversion leaves the
URL as it found it; a full disk under the cache is one line naming the folder; a URL that is no
dataset is refused before anything is downloaded; datasets with fields (files in sub-folders)
round-trip through a bucket in every format."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from conftest import convert_to, output_contents, pattern, save
from fastdata.errors import BadSampleError, InvalidOptionError, OutputExistsError
from fastdata.remote import Cache

pytest.importorskip("moto.server")
pytest.importorskip("s3fs")
from servers import BUCKET, ROOT, S3, downloaded, upload  # noqa: E402 - after the skips

KEY = "photos-0123456789abcdef"  # a dataset's folder in the cache: a name and 16 hex digits


def run(capsys, *args: str) -> tuple[int, str, str]:
    """``fastdata ARGS`` in this process: (exit status, stdout, stderr)."""
    from fastdata.cli import main

    capsys.readouterr()
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def contents(path: Path) -> dict[str, bytes]:
    """:func:`conftest.output_contents`, with an HDF5 file's datasets in groups (``fields/x``) too."""
    if path.is_dir():
        return output_contents(path)
    import h5py

    found: dict[str, bytes] = {}
    with h5py.File(path, "r") as file:
        file.visititems(lambda name, item: found.setdefault(name, item[()].tobytes())
                        if isinstance(item, h5py.Dataset) and name != "fastdata_manifest" else None)
        manifest = json.loads(file["fastdata_manifest"][()].tobytes())
    manifest.pop("created")
    manifest.pop("manifest_blake2b")
    found["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return found


def objects(s3: S3, prefix: str) -> list[str]:
    return sorted(name[len(f"{BUCKET}/{prefix}/"):] for name in s3.fs().find(f"{BUCKET}/{prefix}"))


def put(cache: Cache, name: str, data: bytes):
    """``data`` fetched into ``cache`` as ``KEY/name`` (a lease on it)."""
    return cache.fetch(KEY, name, size=len(data), download=lambda write, restart: write(data),
                       check=lambda digest, file: None)


# --- the cache's folder ------------------------------------------------------------------------


def test_the_cache_refuses_a_folder_holding_files_it_did_not_make_and_deletes_none_of_them(
        s3: S3, uniform_folder: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    url = upload(s3, convert_to(uniform_folder, tmp_path, "tar", "raw"), "d.tar")
    mydata = tmp_path / "mydata"
    save(Image.fromarray(pattern(300, 400, 1)), mydata / "photos" / "holiday.png")
    (mydata / "notes").mkdir()
    (mydata / "notes" / "thesis.txt").write_bytes(b"years of work " * 80_000)  # 1.1 MB, past the 1 MB limit
    before = {p: p.read_bytes() for p in mydata.rglob("*") if p.is_file()}
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(mydata))
    monkeypatch.setenv("FASTDATA_CACHE_LIMIT", "1MB")
    assert run(capsys, "info", url) == (1, "", (
        f"fastdata: error: cache_dir '{mydata}' holds 'notes', 'photos', which the fastdata cache did not make. The "
        "cache deletes files in its folder to stay within cache_limit, so it uses only a folder of its own (new or "
        "empty; it marks it with a '.fastdata-cache' file). Set FASTDATA_CACHE_DIR (or cache_dir=) to a new folder, "
        "e.g. '~/.cache/fastdata', or move those out.\n"))
    assert {p: p.read_bytes() for p in mydata.rglob("*") if p.is_file()} == before  # nothing made, nothing deleted
    cache = tmp_path / "cache"  # a new folder: made and marked
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(cache))
    assert run(capsys, "info", url)[0] == 0
    assert (cache / ".fastdata-cache").read_text().startswith("This folder is fastdata's cache of remote files")
    (cache / "results.csv").write_text("mine")  # something of the user's, later: refused, and kept
    with pytest.raises(InvalidOptionError, match=rf"^cache_dir '{re.escape(str(cache))}' holds 'results.csv', which"):
        fastdata.open_dataset(url, cache_dir=cache)
    assert (cache / "results.csv").read_text() == "mine"


def test_eviction_only_ever_removes_files_the_cache_fetched(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache", limit=3000)
    put(cache, "fields/a.bin", b"a" * 1000).release()  # a name in a sub-folder is counted and evicted too
    put(cache, "b.bin", b"b" * 1000).release()
    mine = tmp_path / "cache" / "photos" / "holiday.jpg"  # put there after the cache claimed the folder
    mine.parent.mkdir()
    mine.write_bytes(b"x" * 5000)
    assert cache.usage() == 2000  # what it fetched, nothing else
    put(cache, "c.bin", b"c" * 2000).release()  # room for it: the least recently used file goes
    assert not (tmp_path / "cache" / KEY / "fields" / "a.bin").exists()
    assert (tmp_path / "cache" / KEY / "b.bin").exists() and mine.read_bytes() == b"x" * 5000
    assert cache.usage() == 3000


def test_a_cache_folder_an_earlier_fastdata_made_is_taken_as_it_is(tmp_path: Path) -> None:
    earlier = tmp_path / "earlier"  # what the cache made before it marked its folder
    for name in (".tmp", ".locks", KEY):
        (earlier / name).mkdir(parents=True)
    (earlier / ".locks" / "0123456789abcdef01234567.lock").write_bytes(b"")
    (earlier / KEY / "shard-000000.tar").write_bytes(b"s" * 100)
    (earlier / ".lock").write_bytes(b"")
    assert Cache(earlier, limit=1000).usage() == 100
    assert (earlier / ".fastdata-cache").is_file()
    users = tmp_path / "users"  # a '.tmp' of someone else's is no cache's
    (users / ".tmp").mkdir(parents=True)
    (users / ".tmp" / "draft.txt").write_text("mine")
    with pytest.raises(InvalidOptionError, match=r"holds '\.tmp', which the fastdata cache did not make"):
        Cache(users)
    assert (users / ".tmp" / "draft.txt").read_text() == "mine" and not (users / ".fastdata-cache").exists()


# --- overwrite, failures, resume ---------------------------------------------------------------


def test_overwrite_to_a_url_refuses_a_dataset_holding_objects_its_manifest_does_not_list(
        s3: S3, uniform_folder: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/noted/d.tar"
    fastdata.convert(uniform_folder, url, shard_samples=5, workers=0)
    s3.fs().pipe(f"{BUCKET}/noted/d.tar/NOTES.txt", b"notes")
    s3.fs().pipe(f"{BUCKET}/noted/d.tar/runs/1/results.csv", b"results")
    before = objects(s3, "noted/d.tar")
    with pytest.raises(OutputExistsError) as caught:
        fastdata.convert(uniform_folder, url, shard_samples=12, workers=0, overwrite=True)
    assert str(caught.value) == (
        f"Output {url!r} is a fastdata dataset but also holds 'NOTES.txt', 'runs/1/results.csv', which its manifest "
        "does not list; fastdata replaces only what it wrote. Move those out, or choose another output URL.")
    assert objects(s3, "noted/d.tar") == before
    s3.fs().rm([f"{BUCKET}/noted/d.tar/NOTES.txt", f"{BUCKET}/noted/d.tar/runs/1/results.csv"])
    fastdata.convert(uniform_folder, url, shard_samples=12, workers=0, overwrite=True)  # the fix
    assert objects(s3, "noted/d.tar") == ["index.json", "manifest.json", "shard-000000.tar"]


def broken_copy(folder: Path, tmp_path: Path) -> Path:
    """``folder`` with its last image (in source order) cut in half: it fails when it is decoded."""
    copy = tmp_path / "broken"
    for file in sorted(folder.rglob("*.png")):
        target = copy / file.relative_to(folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(file.read_bytes())
    data = (copy / "cow" / "3.png").read_bytes()
    (copy / "cow" / "3.png").write_bytes(data[: len(data) // 2])
    return copy


def test_a_failed_conversion_to_a_url_takes_back_its_uploads_and_marker_so_the_same_command_runs_again(
        s3: S3, uniform_folder: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    source = broken_copy(uniform_folder, tmp_path)
    url = f"s3://{BUCKET}/failed/d.tar"
    start = len(s3.log.lines)
    with pytest.raises(BadSampleError):  # the last sample: shards 0-10 were uploaded as they were closed
        fastdata.convert(source, url, shard_samples=1, workers=0)
    assert [line for line in s3.log.lines[start:] if re.search(r"PUT /\S+/failed/d\.tar/shard-", line)]
    assert objects(s3, "failed/d.tar") == []
    (source / "cow" / "3.png").write_bytes((uniform_folder / "cow" / "3.png").read_bytes())  # fixed
    assert fastdata.convert(source, url, shard_samples=1, workers=0)["count"] == 12  # no --resume, no --overwrite


def test_a_failed_overwrite_leaves_the_old_dataset_at_the_url_whole_and_readable(
        s3: S3, uniform_folder: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/kept/d.tar"
    fastdata.convert(uniform_folder, url, shard_samples=1, workers=0)
    old = output_contents(downloaded(s3, url, tmp_path / "old"))
    with pytest.raises(BadSampleError):
        fastdata.convert(broken_copy(uniform_folder, tmp_path), url, shard_samples=1, workers=0, overwrite=True)
    assert output_contents(downloaded(s3, url, tmp_path / "after")) == old
    assert ".fastdata-upload" not in objects(s3, "kept/d.tar")
    assert fastdata.verify(url, cache_dir=tmp_path / "read").ok


def test_resume_on_a_finished_url_output_keeps_it_as_locally(s3: S3, uniform_folder: Path, tmp_path: Path, capsys,
                                                              monkeypatch) -> None:
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/finished/d.tar"
    assert run(capsys, "convert", str(uniform_folder), url, "--quiet")[0] == 0
    start = len(s3.log.lines)
    assert run(capsys, "convert", str(uniform_folder), url, "--resume", "--quiet") == (
        0, f"{url} is already complete (12 samples, same source and options); nothing to do\n", "")
    assert not [line for line in s3.log.lines[start:] if re.search(r"(?<![A-Z])(PUT|DELETE|POST) /", line)
                and "/finished/d.tar/" in line]  # nothing written to the dataset
    status, _, err = run(capsys, "convert", str(uniform_folder), url, "--resume", "--store", "encoded", "--quiet")
    assert status == 1
    assert err.startswith(f"fastdata: error: Output {url!r} was converted with other options (")
    assert err.endswith("--resume does not replace it. Pass --overwrite (overwrite=True) to convert again.\n")


def test_an_output_url_with_an_empty_part_is_refused_before_anything_is_written(
        s3: S3, uniform_folder: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}//slashes/d.tar"
    with pytest.raises(InvalidOptionError) as caught:
        fastdata.convert(uniform_folder, url, workers=0)
    assert str(caught.value) == (
        f"Output URL {url!r} has an empty, '.' or '..' part in its path; object stores keep those in the objects' "
        f"names. Write it without them, e.g. 's3://{BUCKET}/slashes/d.tar'.")
    assert not [name for name in s3.fs().find(BUCKET) if "slashes" in name]


def test_a_missing_bucket_is_named_as_a_bucket_when_reading_and_writing(
        s3: S3, uniform_folder: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    url = "s3://no-such-bucket/d.tar"
    for run in (lambda: fastdata.open_dataset(url), lambda: fastdata.convert(uniform_folder, url, workers=0)):
        with pytest.raises(fastdata.errors.RemoteNotFoundError) as caught:
            run()
        assert str(caught.value) == (f"{url!r}: the bucket 'no-such-bucket' does not exist (404). Check the bucket's "
                                     "name in the URL, or create the bucket first.")


# --- a URL that is no dataset ------------------------------------------------------------------


def test_info_and_verify_refuse_an_object_that_is_no_dataset_without_downloading_it(s3: S3, tmp_path: Path, capsys,
                                                                                    monkeypatch) -> None:
    s3.fs().pipe(f"{BUCKET}/other/big.bin", np.random.default_rng(0).bytes(3_000_000))
    url = f"s3://{BUCKET}/other/big.bin"
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FASTDATA_CACHE_LIMIT", "1MB")
    for command in ("info", "verify"):
        start = len(s3.log.lines)
        assert run(capsys, command, url) == (1, "", (
            f"fastdata: error: {url!r} is not a dataset written by 'fastdata convert': there is no manifest.json under "
            "it, and it is no fastdata .h5 file. Check the URL: it names the dataset's folder, or its .h5 file.\n"))
        gets = [line for line in s3.log.lines[start:] if re.search(rf"GET /{BUCKET}/other/big\.bin ", line)]
        assert len(gets) == 1  # its first bytes, to see it is no fastdata .h5
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.stat().st_size > 1000]


# --- datasets with fields in a bucket ----------------------------------------------------------


class Annotated:
    """Segmentation, detection and caption samples: image, class-id mask, boxes, caption."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, index: int) -> dict:
        from torchvision import tv_tensors

        mask = Image.frombytes("L", (10, 8), ((np.arange(80) + index) % 4).astype(np.uint8).tobytes())
        boxes = np.arange(4 * (index % 3), dtype=np.float32).reshape(-1, 4) + np.float32(0.5)
        return {"image": Image.fromarray(pattern(8, 10, seed=index)), "mask": mask,
                "boxes": tv_tensors.BoundingBoxes(torch.from_numpy(boxes), format="XYXY", canvas_size=(8, 10)),
                "caption": f"sample {index} ✓" if index else ""}


def samples(dataset) -> list[dict]:
    found = list(dataset) if isinstance(dataset, torch.utils.data.IterableDataset) else \
        [dataset[i] for i in range(len(dataset))]
    return [{name: value.tolist() if isinstance(value, torch.Tensor) else value for name, value in sample.items()}
            for sample in found]


@pytest.mark.parametrize("name,suffix", [("npy", ".npy"), ("hdf5", ".h5"), ("tar", ".tar")])
def test_a_dataset_with_fields_round_trips_through_a_bucket_in_every_format(
        s3: S3, name: str, suffix: str, tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("torchvision")
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/fields/x{suffix}"
    local = tmp_path / f"x{suffix}"
    written = fastdata.convert(Annotated(), url, format=name, workers=0, overwrite=True)
    fastdata.convert(Annotated(), local, format=name, workers=0)
    if name == "npy":
        assert "fields/boxes.bin" in written["files"]  # names inside the dataset's own folders
    copy = tmp_path / "copy"
    if name == "hdf5":
        s3.fs().get(f"{BUCKET}/fields/x{suffix}", str(copy))
    assert contents(copy if name == "hdf5" else downloaded(s3, url, copy)) == contents(local)
    options = {"shuffle": False} if name == "tar" else {}
    remote = fastdata.open_dataset(url, cache_dir=tmp_path / "read", **options)
    got, want = samples(remote), samples(fastdata.open_dataset(local, **options))
    assert got == want and len(got) == 5 and got[1]["caption"] == "sample 1 ✓"
    assert fastdata.verify(url, cache_dir=tmp_path / "read").ok


def test_a_manifest_naming_a_file_outside_the_dataset_is_refused(s3: S3, uniform_folder: Path, tmp_path: Path) -> None:
    local = convert_to(uniform_folder, tmp_path, "npy", "raw")
    manifest = json.loads((local / "manifest.json").read_text())
    for bad in ("../escape.bin", "/etc/passwd", "fields//x.bin", "fields/./x.bin"):
        manifest["files"] = {bad: {"bytes": 1, "blake2b": hashlib.blake2b(b"x", digest_size=32).hexdigest()}}
        s3.fs().pipe(f"{BUCKET}/escape/d.npy/manifest.json", json.dumps(manifest).encode())
        with pytest.raises(fastdata.errors.CorruptManifestError, match="'files' must list the dataset's files"):
            fastdata.open_dataset(f"s3://{BUCKET}/escape/d.npy", cache_dir=tmp_path / "cache")


# --- the cache's disk full ---------------------------------------------------------------------


def _can_mount_tmpfs() -> bool:
    """Whether this user may mount a tmpfs in a user namespace of its own (``unshare -rm``)."""
    try:
        return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                               "mount -t tmpfs -o size=8k tmpfs /tmp"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs 'unshare -rm' (unprivileged user namespaces) to mount a "
                                                   "small tmpfs as a full disk")
def test_a_full_disk_under_the_cache_is_one_line_naming_the_folder_and_the_fix(
        s3: S3, tmp_path: Path) -> None:
    folder = tmp_path / "large"  # 64x64 images: shards of 24 kB, more than the 16 kB disk holds
    for i in range(6):
        save(Image.fromarray(pattern(64, 64, seed=i)), folder / ["ant", "bee"][i % 2] / f"{i}.png")
    url = upload(s3, convert_to(folder, tmp_path, "tar", "raw", shard_samples=2), "full/d.tar")
    cache = tmp_path / "cache"
    cache.mkdir()
    commands = [["verify", url], ["convert", url, str(tmp_path / "out.npy")],
                ["bench", url, "--formats", "tar", "--out", str(tmp_path / "bench")],
                ["convert", str(folder), f"s3://{BUCKET}/full/out.tar", "--shard-samples", "6", "--quiet"]]
    script = ("import json, sys\nfrom fastdata.cli import main\n"
              "for argv in json.loads(sys.argv[1]):\n    print(main(argv), file=sys.stderr, flush=True)\n")
    # in a mount namespace of its own, where the cache's folder is a 16 kB tmpfs
    run = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                          f"mount -t tmpfs -o size=16k tmpfs '{cache}' && exec \"$@\"", "sh", sys.executable, "-c",
                          script, json.dumps(commands)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(ROOT), FASTDATA_CACHE_DIR=str(cache)))
    fix = ("no space left on the device. To fix: free space on that disk, or set FASTDATA_CACHE_DIR (cache_dir=) to a "
           "folder on a disk with room; then run the same command again.")
    lines = run.stderr.splitlines()
    assert len(lines) == 8 and lines[1::2] == ["1"] * 4, run.stderr  # one line each, exit 1
    for line in lines[0:6:2]:  # fetching into the cache: verify, convert from the URL, bench
        assert re.fullmatch(rf"fastdata: error: Cannot write to the cache folder '{re.escape(str(cache))}' while "
                            rf"fetching 'shard-00000\d\.tar' \([\d,]+ bytes\): {re.escape(fix)}", line), line
    assert lines[6] == (f"fastdata: error: Cannot write to the cache folder '{cache}' while writing the local copy of "
                        f"'s3://{BUCKET}/full/out.tar': {fix}")  # converting to a URL: its staging copy
    assert objects(s3, "full/out.tar") == []  # no marker left: the same command runs again once there is room


# --- random access with too small a cache ------------------------------------------------------


def test_random_access_with_a_cache_limit_below_one_shard_per_worker_fails_at_once_naming_the_limit(
        s3: S3, tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from fastdata.formats.tar import TarIndexedDataset

    folder = tmp_path / "large"  # 64x64 images, 2 per shard: shards (24 kB) far above the index and manifest
    for i in range(8):
        save(Image.fromarray(pattern(64, 64, seed=i)), folder / ["ant", "bee"][i % 2] / f"{i}.png")
    local = convert_to(folder, tmp_path, "tar", "raw", shard_samples=2)
    url = upload(s3, local, "tight/d.tar")
    held = (local / "manifest.json").stat().st_size + (local / "index.json").stat().st_size
    largest = max(p.stat().st_size for p in local.glob("shard-*.tar"))
    limit = held + largest + largest // 2  # room for one reader's shard, not for two
    dataset = TarIndexedDataset(url, cache_dir=tmp_path / "cache", cache_limit=limit)
    assert torch.equal(dataset[[0, 7]][0], TarIndexedDataset(local)[[0, 7]][0])  # one process: it fits
    needed = held + 2 * largest
    with pytest.raises(InvalidOptionError, match=re.escape(
            f"cache_limit {limit} bytes is too small to read {url!r} at random with 2 DataLoader workers: each keeps "
            f"the shard it reads in the cache (up to {largest} bytes), beside the index and manifest ({held} bytes), "
            f"so it needs at least {needed} bytes. Raise cache_limit (cache_limit= or $FASTDATA_CACHE_LIMIT) to that, "
            "use fewer workers, or stream it with TarDataset.")):
        list(DataLoader(dataset, batch_size=2, num_workers=2))
