"""Faults during conversion: Ctrl-C, SIGKILL, a full disk. The final path is never half-written."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

import fastdata
from conftest import finish, run_fastdata, start_fastdata, wait_for_checkpoint, wait_until
from fastdata.conversion import journal

SLOW_SOURCE = ["torchvision:FakeData", "--source-option", "size=100000", "--source-option", "image_size=(3, 16, 16)"]


def start(out: Path, *extra: str, **popen) -> subprocess.Popen:
    return start_fastdata("convert", *SLOW_SOURCE, out, "--store", "encoded", "--workers", "2", *extra, **popen)


def wait_for_progress(partial: Path, process: subprocess.Popen, timeout_s: float = 120) -> None:
    """Until the partial output holds data (the progress bar has advanced)."""
    data = partial / "data.bin"
    wait_until(lambda: data.exists() and data.stat().st_size > 0, "progress", process=process, timeout_s=timeout_s)


def test_ctrl_c_after_a_checkpoint_keeps_the_partial_output_for_resume(tmp_path: Path) -> None:
    out = tmp_path / "fake.npy"
    process = start(out, "--unit-samples", "500", "--quiet", start_new_session=True)
    wait_for_checkpoint(process, journal.journal_path(out))
    os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    _, stderr = finish(process, timeout=60)
    record = json.loads(journal.journal_path(out).read_text())  # the last checkpoint before the signal
    assert process.returncode == 130 and "Traceback" not in stderr
    assert stderr.strip().splitlines() == [
        f"fastdata: interrupted; {str(out)!r} keeps {record['next_index']:,} of 100,000 samples in "
        f"{str(out) + '.partial'!r}; run the same command with --resume (resume=True) to continue from there."]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake.npy.partial", "fake.npy.partial.json"]
    assert record["next_index"] % 500 == 0 and record["next_index"] > 0


def test_ctrl_c_removes_an_output_that_cannot_resume(tmp_path: Path) -> None:
    out = tmp_path / "fake.h5"  # HDF5 cannot reopen a half-written file: nothing is kept
    process = start(out, "--unit-samples", "500", "--quiet", start_new_session=True)
    partial = tmp_path / "fake.h5.partial"  # converting: the partial file grows
    wait_until(lambda: partial.exists() and partial.stat().st_size > 0, "a partial file", process=process)
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = finish(process, timeout=60)
    assert process.returncode == 130
    assert stderr.strip().splitlines() == ["fastdata: interrupted"], stderr
    assert list(tmp_path.iterdir()) == []


# a Dataset whose reads run Python inside weakref callbacks (as h5py's object registry and the
# pool's finalizers do), slowly: a Ctrl-C lands there nearly every time, where Python drops the
# exception the handler raises. Reaching sample N, it writes the file reached-N (for the test to wait on).
CALLBACK_SOURCE = """
import time, weakref
import numpy as np

class Held:
    pass

class InCallbacks:
    def __len__(self):
        return 3000

    def __getitem__(self, index):
        held = Held()
        watch = weakref.ref(held, lambda ref: time.sleep(0.004))
        del held  # its callback runs here, and sleeps
        if index in (20, 300, 900, 1500):
            open(f"reached-{index}", "w").close()
        return np.full((8, 8, 3), index % 256, dtype=np.uint8), index % 3

dataset = InCallbacks()
"""


@pytest.mark.parametrize("moment", [20, 300, 900, 1500])
def test_ctrl_c_stops_a_conversion_even_inside_a_weakref_callback(tmp_path: Path, moment: int) -> None:
    (tmp_path / "incallbacks.py").write_text(CALLBACK_SOURCE)
    out = tmp_path / "out" / "c.h5"
    out.parent.mkdir()
    process = start_fastdata("convert", "incallbacks:dataset", out, "--workers", "0", "--quiet", cwd=tmp_path,
                             env={"PYTHONPATH": str(tmp_path)}, start_new_session=True)
    wait_until((tmp_path / f"reached-{moment}").exists, f"sample {moment}", process=process)
    os.killpg(process.pid, signal.SIGINT)
    stdout, stderr = finish(process, timeout=60)
    assert (process.returncode, stdout, stderr) == (130, "", "fastdata: interrupted\n")
    assert list(out.parent.iterdir()) == []


def test_sigkill_leaves_no_output_and_no_worker(tmp_path: Path) -> None:
    out = tmp_path / "fake.npy"
    process = start(out)
    wait_for_progress(tmp_path / "fake.npy.partial", process)
    workers = psutil.Process(process.pid).children(recursive=True)
    assert len(workers) == 2
    process.kill()  # only the parent: its pool workers must not outlive it
    finish(process, timeout=30)
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert alive == [] and len(gone) == 2
    assert not out.exists() and (tmp_path / "fake.npy.partial").exists()
    # a new conversion (without --resume) removes the stale partial output first
    small = run_fastdata("convert", "torchvision:FakeData", "--source-option", "size=20", out, "--quiet")
    assert small.returncode == 0, small.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake.npy"]
    assert fastdata.open_dataset(out).manifest["count"] == 20


def limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit then fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))


def test_file_size_limit_is_a_clear_error(uniform_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "u.npy"
    process = start_fastdata("convert", uniform_folder, out, "--workers", "0", "--quiet", preexec_fn=limit_file_size)
    stdout, stderr = finish(process)
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert result.returncode == 1
    assert result.stderr == (
        f"fastdata: error: Cannot write {str(out)!r}: file too large for the file-size limit ('ulimit -f') or the file "
        "system. Raise the limit, or use --format tar (format='tar'), which splits the output into shards; no partial output was "
        "left behind.\n"
    )
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["uniform"]
    fastdata.convert(uniform_folder, out, workers=0)
    assert fastdata.open_dataset(out).manifest["count"] == 12
