"""``--resume``: an interrupted conversion continues from its checkpoint to the same output."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import finish, kill_after_checkpoint, output_contents, start_fastdata, stop
from fastdata.formats import all_formats

SOURCE = ["torchvision:FakeData", "--source-option", "size=8000", "--source-option", "image_size=(3, 8, 8)"]
RESUMABLE = [(spec.name, store) for spec in all_formats() if spec.writable and spec.writer.supports_resume
             for store in spec.stores]
ENV = {"FASTDATA_CHECKPOINT_INTERVAL_S": "0.2"}


def convert(out: Path, fmt: str, store: str, *extra: str, **popen) -> subprocess.Popen:
    return start_fastdata("convert", *SOURCE, out, "--format", fmt, "--store", store, "--workers", "2", "--quiet",
                          *extra, env=ENV, **popen)


def succeed(process: subprocess.Popen) -> str:
    """``process``'s stderr, once it has ended with 0."""
    stdout, stderr = finish(process, timeout=300)  # also closes the pipes
    assert process.returncode == 0, stderr
    return stderr


# every resumable format and store, stopped by SIGKILL (a crash) or SIGTERM (a scheduler's
# preemption, which keeps the partial output after a checkpoint as a crash leaves it), in turn
STOPPED = [(fmt, store, (signal.SIGKILL, signal.SIGTERM)[number % 2]) for number, (fmt, store) in enumerate(RESUMABLE)]


@pytest.mark.parametrize("fmt,store,signum", STOPPED, ids=[f"{f}-{s}-{n.name}" for f, s, n in STOPPED])
def test_a_stopped_conversion_resumes_to_the_uninterrupted_output(tmp_path: Path, fmt: str, store: str,
                                                                   signum: signal.Signals) -> None:
    reference = tmp_path / "reference"
    # side by side with the one stopped: nothing shared but the cores
    uninterrupted = convert(reference, fmt, store, start_new_session=True)
    out = tmp_path / "out"
    journal = tmp_path / "out.partial.json"
    try:
        process = convert(out, fmt, store, start_new_session=True)
        checkpoint = kill_after_checkpoint(process, journal, signum=signum)
        succeed(uninterrupted)
    finally:
        stop(uninterrupted)
    assert process.returncode == (-9 if signum == signal.SIGKILL else 143) and 1000 < checkpoint < 8000
    lock = ["out.partial.lock"] if signum == signal.SIGKILL else []  # a killed process cannot remove its lock file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.partial", "out.partial.json", *lock, "reference"]
    kept = json.loads(journal.read_text())["next_index"]
    assert succeed(convert(out, fmt, store, "--resume")) == (
        f"fastdata: --resume: continuing {str(out)!r} from its last checkpoint ({kept:,} samples already in "
        f"{str(out) + '.partial'!r})\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "reference"]
    assert output_contents(out) == output_contents(reference)


def test_resume_without_partial_output_starts_fresh_and_keeps_a_finished_one(tmp_path: Path) -> None:
    out = tmp_path / "out.npy"
    assert succeed(convert(out, "npy", "raw", "--resume")) == (
        f"fastdata: --resume: {str(out)!r} has no partial output to continue; converting from the start\n")
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = convert(out, "npy", "raw", "--resume")
    stdout, _ = finish(again, timeout=300)
    assert again.returncode == 0
    assert stdout.startswith(f"{out} is already complete (8,000 samples, same source and options); nothing to do")
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    other = convert(out, "npy", "encoded", "--resume")
    _, stderr = finish(other, timeout=300)
    assert other.returncode == 1 and "with other options (store 'raw', now 'encoded'); --resume does not replace it. Pass --overwrite" in stderr


def test_tar_shards_named_by_webdataset_keys_resume_to_the_same_bytes(tmp_path: Path) -> None:
    """A WebDataset source with unique keys: the tar output's members are named by them, the
    index's ``key`` column goes through the checkpoint, and the resumed output is identical."""
    import io

    import numpy as np
    import webdataset as wds
    from PIL import Image

    shards = tmp_path / "shards"
    shards.mkdir()
    buffer = io.BytesIO()
    Image.fromarray(np.full((4, 4, 3), 7, np.uint8)).save(buffer, format="PNG")
    for number in range(4):
        with wds.TarWriter(str(shards / f"part-{number}.tar")) as sink:
            for row in range(2000):
                sink.write({"__key__": f"s{number}/k{row:05d}", "png": buffer.getvalue(), "txt": f"{number} {row}".encode()})

    def run(out: Path, *extra: str, **popen) -> subprocess.Popen:
        return start_fastdata("convert", shards, out, "--format", "tar", "--store", "encoded", "--workers", "2",
                              "--quiet", "--shard-samples", "1500", *extra, env=ENV, **popen)

    reference = tmp_path / "reference"
    uninterrupted = run(reference, start_new_session=True)
    out = tmp_path / "out"
    try:
        process = run(out, start_new_session=True)
        checkpoint = kill_after_checkpoint(process, tmp_path / "out.partial.json")
        succeed(uninterrupted)
    finally:
        stop(uninterrupted)
    assert 1000 < checkpoint < 8000
    succeed(run(out, "--resume"))
    assert output_contents(out) == output_contents(reference)
    index = json.loads((out / "index.json").read_text())
    assert index["shards"][1]["key"][:2] == ["s0/k01500", "s0/k01501"]
