"""How shards are downloaded: the one being read and the next ``prefetch`` all at once, and a
large file as ranged GETs that run concurrently and are written in order (tests/servers.py's
servers on 127.0.0.1). No timing: concurrency is shown by a barrier the downloads must reach
together, and parts by the server's request log."""

from __future__ import annotations

import json
import math
import re
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import convert_to
from fastdata.formats.tar import TarDataset

pytest.importorskip("aiohttp")
from servers import BUCKET, S3, RangeHandler, serving, upload  # noqa: E402 - after the skip


def labels(dataset) -> list[int]:
    return [int(label) for _, label in dataset]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_the_shard_being_read_and_the_next_ones_are_downloaded_at_the_same_time(
        prefetch: int, uniform_folder: Path, tmp_path: Path) -> None:
    local = convert_to(uniform_folder, tmp_path, "tar", "raw", shard_samples=2)  # 6 shards
    together = threading.Barrier(1 + prefetch, timeout=20)  # broken (and the read fails) unless all arrive
    arrived: list[str] = []
    counting = threading.Lock()

    class Gate(RangeHandler):
        def do_GET(self) -> None:
            name = self.path.rsplit("/", 1)[-1]
            with counting:
                first = name.startswith("shard-") and len(arrived) < 1 + prefetch
                if first:
                    arrived.append(name)
            if first:
                together.wait()  # the first 1 + prefetch shard downloads must be in flight together
            super().do_GET()

    with serving(Gate, local.parent) as base:
        remote = TarDataset(f"{base}/{local.name}", cache_dir=tmp_path / "cache", shuffle=False, prefetch=prefetch)
        assert labels(remote) == labels(TarDataset(local, shuffle=False))
    assert sorted(arrived) == [f"shard-{n:06d}.tar" for n in range(1 + prefetch)]
    assert not together.broken


def test_a_warm_epoch_sends_no_request_and_starts_no_download_thread(
        uniform_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = convert_to(uniform_folder, tmp_path, "tar", "raw", shard_samples=2)  # 6 shards
    requests: list[str] = []

    class Logged(RangeHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            super().do_GET()

    with serving(Logged, local.parent) as base:
        remote = TarDataset(f"{base}/{local.name}", cache_dir=tmp_path / "cache", shuffle=False, prefetch=2)
        expected = labels(TarDataset(local, shuffle=False))
        assert labels(remote) == expected  # cold: every shard downloaded
        assert len([r for r in requests if "/shard-" in r]) == 6
        requests.clear()
        started: list[str] = []
        start = threading.Thread.start
        monkeypatch.setattr(threading.Thread, "start", lambda thread: (started.append(thread.name), start(thread))[1])
        hits = remote.files.cache.stats.hits
        assert labels(remote) == expected  # warm: every shard leased from the cache where the reader is
    assert requests == []
    assert started == []
    assert remote.files.cache.stats.hits == hits + 6


def test_a_shard_bigger_than_a_part_is_fetched_as_concurrent_ranges_written_in_order(
        s3: S3, uniform_folder: Path, tmp_path: Path, monkeypatch) -> None:
    from fastdata.remote import fetch

    monkeypatch.setattr(fetch, "PART_BYTES", 1024)  # ranges of 1 KiB: a shard is several of them
    local = convert_to(uniform_folder, tmp_path, "tar", "raw", shard_samples=6)  # 2 shards
    url = upload(s3, local, "ranged/ds.tar")
    sizes = {name: entry["bytes"] for name, entry in json.loads((local / "manifest.json").read_text())["files"].items()
             if name.startswith("shard-")}
    start = len(s3.log.lines)
    remote = TarDataset(url, cache_dir=tmp_path / "cache", shuffle=False)
    images = [image.numpy() for image, _ in remote]
    assert all(np.array_equal(a, b.numpy()) for a, (b, _) in zip(images, TarDataset(local, shuffle=False)))
    assert len(images) == 12
    for name, size in sizes.items():  # the cache checked each file's blake2b: the ranges were put in order
        gets = [line for line in s3.log.lines[start:] if re.search(rf"GET /{BUCKET}/ranged/ds.tar/{name} ", line)]
        assert len(gets) == math.ceil(size / 1024) > 1, (name, size, len(gets))
