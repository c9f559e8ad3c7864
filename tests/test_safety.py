"""Data safety: fastdata never destroys what it did not write, resumes only an unchanged source,
lets one conversion at a time write an output, and explains every bad path or option in one line.

Each test reproduces one finding of the data-safety review (numbered as there).
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from conftest import WRITABLE_FORMATS, class_folder, finish, pattern, run_fastdata, save, start_fastdata, wait_until
from fastdata.conversion import journal
from fastdata.errors import (
    InvalidOptionError, OutputExistsError, OutputLockedError, OutputWriteError, SourceChangedError,
)
from fastdata.machine import cgroup_cpu_quota
from fastdata.conversion.locks import ConversionLock
from fastdata.conversion.outputs import write_error



def cli_here(capsys, *args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The command line's main() in this process (faster; same messages and exit codes)."""
    from fastdata.cli import main

    previous = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        code = main([str(a) for a in args])
    finally:
        os.chdir(previous)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out, err)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The CLI failed with exactly one 'fastdata: error:' line and no traceback."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastdata: error: "), result.stderr
    return lines[0][len("fastdata: error: "):]


def tree(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _convert_then_die(source: str, output: str, after: int) -> None:
    """Run a conversion and die like SIGKILL (no clean-up) once ``after`` samples are written."""
    journal.CHECKPOINT_INTERVAL_S = 0.0  # a checkpoint after every unit (of 8 samples below)
    done = [0]

    def progress(count: int, total: int) -> None:
        done[0] += count
        if done[0] >= after:
            os._exit(9)

    fastdata.convert(source, output, workers=0, unit_samples=8, progress=progress)


def interrupted(source: Path, output: Path, after: int) -> dict:
    """A real partial conversion left by a killed process; returns its journal."""
    process = multiprocessing.get_context("fork").Process(target=_convert_then_die, args=(str(source), str(output), after))
    process.start()
    process.join(60)
    assert process.exitcode == 9
    record = json.loads(journal.journal_path(output).read_text())
    assert record["next_index"] >= after // 2 and (output.parent / (output.name + ".partial")).exists()
    return record


# --- 1. --resume only for the same, unchanged source ----------------------------------------------


def test_resume_refuses_a_source_with_a_new_class_folder(tmp_path: Path) -> None:
    source = class_folder(tmp_path / "src", {"b": 40, "c": 40, "d": 40})
    out = tmp_path / "out.npy"
    interrupted(source, out, after=45)
    partial_before = tree(tmp_path / "out.npy.partial")
    class_folder(tmp_path / "new", {"a_new": 3})
    (tmp_path / "new" / "a_new").rename(source / "a_new")  # sorts first: every label would shift
    with pytest.raises(SourceChangedError) as info:
        fastdata.convert(source, out, workers=0, resume=True)
    assert str(info.value) == (
        f"Cannot resume {str(out)!r}: the source changed since the conversion began: class folder 'a_new' was "
        "added (3 files). Resuming would mix samples and labels of both. Convert without --resume (resume=True) to "
        "start over, with --overwrite (overwrite=True) if the output exists."
    )
    assert tree(tmp_path / "out.npy.partial") == partial_before and not out.exists()  # nothing touched
    fastdata.convert(source, out, workers=0)  # starting over gives the right labels
    reference = tmp_path / "reference.npy"
    fastdata.convert(source, reference, workers=0)
    assert np.load(out / "labels.npy").tolist() == np.load(reference / "labels.npy").tolist()
    assert np.load(out / "labels.npy")[:3].tolist() == [0, 0, 0]  # a_new is class 0 now
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "out.npy", "reference.npy", "src"]


@pytest.mark.parametrize("change,expected", [
    ("add", "'c': 1 file added (41 now, 40 before)"),
    ("remove", "'c': 1 file removed (39 now, 40 before)"),
    ("modify", "'c': files modified (same names, other sizes or modification times)"),
    ("rename", "'c': files renamed or replaced (same number, 40)"),
])
def test_resume_names_a_changed_file(tmp_path: Path, change: str, expected: str) -> None:
    source = class_folder(tmp_path / "src", {"b": 40, "c": 40})
    out = tmp_path / "out.npy"
    interrupted(source, out, after=30)
    target = source / "c" / "0007.png"
    if change == "add":
        save(Image.fromarray(pattern(8, 8, 99)), source / "c" / "extra.png")
    elif change == "remove":
        target.unlink()
    elif change == "modify":
        save(Image.fromarray(pattern(8, 8, 98)), target, compress_level=0)
    else:
        target.rename(source / "c" / "renamed.png")
    result = run_fastdata("convert", source, out, "--workers", "0", "--resume", "--quiet")
    assert one_error_line(result) == (
        f"Cannot resume {str(out)!r}: the source changed since the conversion began: {expected}. Resuming would "
        "mix samples and labels of both. Convert without --resume (resume=True) to start over, with --overwrite "
        "(overwrite=True) if the output exists."
    )


def test_resume_of_an_unchanged_source_gives_the_uninterrupted_output(tmp_path: Path) -> None:
    source = class_folder(tmp_path / "src", {"b": 40, "c": 40, "d": 40})
    out = tmp_path / "out.npy"
    record = interrupted(source, out, after=60)
    assert 0 < record["next_index"] < 120
    fastdata.convert(source, out, workers=0, resume=True)
    reference = tmp_path / "reference.npy"
    fastdata.convert(source, reference, workers=0)
    ours, theirs = tree(out), tree(reference)
    assert ours.pop("manifest.json") != b"" and theirs.pop("manifest.json") != b""
    assert ours == theirs


def test_resume_refuses_other_options(tmp_path: Path) -> None:
    source = class_folder(tmp_path / "src", {"b": 40, "c": 40})
    out = tmp_path / "out.npy"
    interrupted(source, out, after=30)
    with pytest.raises(InvalidOptionError, match=r"^Cannot resume '.*out.npy': its partial conversion was started "
                       r"with other options \(store 'raw', now 'encoded'\)\. Resume with the same source"):
        fastdata.convert(source, out, workers=0, resume=True, store="encoded")


def test_finished_output_is_not_kept_after_source_files_were_deleted(tmp_path: Path) -> None:
    source = class_folder(tmp_path / "src", {"b": 5, "c": 5})
    out = tmp_path / "out.npy"
    fastdata.convert(source, out, workers=0)
    kept = fastdata.convert(source, out, workers=0, resume=True)  # unchanged: kept as it is
    assert kept["count"] == 10
    (source / "b" / "0001.png").unlink()
    result = run_fastdata("convert", source, out, "--workers", "0", "--resume", "--quiet")
    assert one_error_line(result) == (
        f"Output {str(out)!r} is complete, but its source changed since it was converted: 'b': 1 file removed "
        "(4 now, 5 before). --resume keeps an output only when its source is unchanged; pass --overwrite (overwrite=True) to "
        "convert again."
    )
    again = run_fastdata("convert", source, out, "--workers", "0", "--resume", "--overwrite", "--quiet")
    assert again.returncode == 0 and again.stdout.startswith(f"wrote 9 samples to {out}")


def test_resume_refuses_a_changed_torchvision_dataset(tmp_path: Path) -> None:
    out = tmp_path / "fake.npy"
    small = ["torchvision:FakeData", "--source-option", "size=20", "--source-option", "image_size=(3, 8, 8)"]
    assert run_fastdata("convert", *small, out, "--quiet").returncode == 0
    again = run_fastdata("convert", *small, out, "--quiet", "--resume")
    assert again.returncode == 0 and "is already complete (20 samples, same source and options)" in again.stdout
    other = ["torchvision:FakeData", "--source-option", "size=20", "--source-option", "image_size=(3, 8, 8)",
             "--source-option", "random_offset=5"]  # same length, other images
    message = one_error_line(run_fastdata("convert", *other, out, "--quiet", "--resume"))
    assert "was converted from another source (" in message and "'random_offset': '5'" in message  # named


def test_resume_on_a_finished_output_names_the_options_that_differ(tmp_path: Path) -> None:
    source = tmp_path / "src"
    for index in range(4):
        (source / "a").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (6, 4), (index, 0, 0)).save(source / "a" / f"{index}.png")
    out = tmp_path / "out.npy"
    assert run_fastdata("convert", source, out, "--resize", "4x4", "--workers", "0", "--quiet").returncode == 0
    message = one_error_line(run_fastdata("convert", source, out, "--resize", "8x8", "--store", "encoded",
                                          "--workers", "0", "--resume", "--quiet"))
    assert message == (f"Output {str(out)!r} was converted with other options (resize [4, 4], now [8, 8], "
                       "store 'raw', now 'encoded'); --resume does not replace it. Pass --overwrite (overwrite=True) to convert again.")


class Items(torch.utils.data.Dataset):
    """A map-style dataset whose items can change while its description stays the same."""

    def __init__(self, length: int, shift: int = 0):
        self.length, self.shift = length, shift

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return np.full((4, 4, 3), (index + self.shift) % 256, dtype=np.uint8), index % 2


def test_python_dataset_fingerprint_names_the_change(tmp_path: Path) -> None:
    out = tmp_path / "items.npy"
    fastdata.convert(Items(50), out, workers=0)
    with pytest.raises(SourceChangedError, match=r"its source changed since it was converted: the dataset has 60 "
                                                 r"items now, 50 before\. --resume keeps"):
        fastdata.convert(Items(60), out, workers=0, resume=True)
    with pytest.raises(SourceChangedError, match=r"items 0, 3, 6, 9, 13 differ \(a dataset with random items "
                                                 r"cannot be resumed\)"):
        fastdata.convert(Items(50, shift=1), out, workers=0, resume=True)
    assert fastdata.convert(Items(50), out, workers=0, resume=True)["count"] == 50


# --- 2. --overwrite never deletes a source or what fastdata did not write --------------------------


def test_output_equal_to_inside_or_containing_the_source_is_refused(tmp_path: Path, capsys) -> None:
    work = tmp_path / "work"
    source = class_folder(work / "photos", {"a": 3, "b": 3})
    before = tree(work)
    cases = [
        (source, f"Output {str(source)!r} is the source folder itself; fastdata never writes over what it reads."),
        (work, f"Output {str(work)!r} contains the source folder {str(source)!r}; replacing it would delete the source."),
        (source / "a" / "out", f"Output {str(source / 'a' / 'out')!r} is inside the source folder "
                               f"{str(source)!r}; it would be read as part of the source next time."),
    ]
    for output, message in cases:
        for flags in ([], ["--overwrite"], ["--resume"]):
            for fmt in ("npy", "hdf5"):
                result = cli_here(capsys, "convert", source, output, "--format", fmt, "--quiet", *flags)
                assert one_error_line(result).startswith(message)
    assert tree(work) == before


def test_overwrite_replaces_only_a_fastdata_dataset(tmp_path: Path, capsys) -> None:
    source = class_folder(tmp_path / "src", {"a": 3, "b": 3})
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "sub" / "notes.txt").write_text("keep me")
    refusal = one_error_line(cli_here(capsys, "convert", source, mine, "--quiet"))
    assert refusal == (f"Output {str(mine)!r} already exists and is not a fastdata dataset; fastdata never replaces "
                       "it. Choose another output path (or move it away yourself).")
    assert "--overwrite" not in refusal
    assert one_error_line(cli_here(capsys, "convert", source, mine, "--quiet", "--overwrite")) == refusal
    assert (mine / "sub" / "notes.txt").read_text() == "keep me"
    out = tmp_path / "out"  # no extension: --format decides, so npy can be replaced by hdf5 below
    assert cli_here(capsys, "convert", source, out, "--quiet", "--format", "npy").returncode == 0
    (out / "my-notes.txt").write_text("also mine")
    message = one_error_line(cli_here(capsys, "convert", source, out, "--quiet", "--overwrite"))
    assert message == (f"Output {str(out)!r} is a fastdata dataset but also holds 'my-notes.txt', which its "
                       "manifest does not list; fastdata replaces only what it wrote. Move those out, or choose "
                       "another output path.")
    (out / "my-notes.txt").unlink()
    replaced = cli_here(capsys, "convert", source, out, "--quiet", "--overwrite", "--format", "hdf5")
    assert replaced.returncode == 0 and out.is_file()  # a directory dataset replaced by a file dataset
    assert fastdata.verify(out).ok


def test_damaged_dataset_is_not_replaced(tmp_path: Path) -> None:
    source = class_folder(tmp_path / "src", {"a": 3})
    out = tmp_path / "out.npy"
    fastdata.convert(source, out, workers=0)
    (out / "manifest.json").write_text("{not json")
    with pytest.raises(OutputExistsError, match=r"already exists and fastdata cannot read its manifest .* "
                                                 r"replaces only datasets it can identify"):
        fastdata.convert(source, out, workers=0, overwrite=True)
    assert (out / "manifest.json").read_text() == "{not json"


# --- 3. files next to the output ------------------------------------------------------------------


def test_files_next_to_the_output_are_kept(tmp_path: Path) -> None:
    source = class_folder(tmp_path / "src", {"a": 3, "b": 3})
    out = tmp_path / "d.npy"
    fastdata.convert(source, out, workers=0)
    (tmp_path / "d.npy.old").write_text("my backup")
    fastdata.convert(source, out, workers=0, overwrite=True)
    assert (tmp_path / "d.npy.old").read_text() == "my backup"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.npy", "d.npy.old", "src"]


def test_a_partial_output_fastdata_did_not_write_is_refused_not_deleted(tmp_path: Path) -> None:
    source = class_folder(tmp_path / "src", {"a": 3})
    (tmp_path / "e.npy.partial").write_text("my own file")
    message = one_error_line(run_fastdata("convert", source, tmp_path / "e.npy", "--quiet"))
    assert message == (f"{str(tmp_path / 'e.npy.partial')!r} exists, but fastdata has no record of writing it (no "
                       "journal 'e.npy.partial.json'); it is not removed. Move it away, or choose another output path.")
    assert (tmp_path / "e.npy.partial").read_text() == "my own file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.npy.partial", "src"]


def test_hdf5_temporary_files_never_replace_a_users_file(tmp_path: Path) -> None:
    source = class_folder(tmp_path / "src", {"a": 3})
    users = tmp_path / "x.h5.partial.blob"
    users.write_text("not fastdata's")
    fastdata.convert(source, tmp_path / "x.h5", format="hdf5", store="encoded", workers=0)
    assert users.read_text() == "not fastdata's"
    assert fastdata.verify(tmp_path / "x.h5").ok


# --- 4. one conversion per output -----------------------------------------------------------------

FAKE = ["torchvision:FakeData", "--source-option", "size=3000", "--source-option", "image_size=(3, 16, 16)"]


def test_a_second_conversion_of_the_same_output_is_refused_at_once(tmp_path: Path) -> None:
    out = tmp_path / "race.npy"
    with ConversionLock(out):  # this process is converting to race.npy
        # refused, not converted after waiting for the lock (a wait that never ends fails as hung)
        message = one_error_line(run_fastdata("convert", *FAKE, out, "--workers", "1", "--quiet"))
    assert message.startswith(f"Another conversion is writing {str(out)!r} (process {os.getpid()} on ")
    assert message.endswith("Wait for it to finish, or stop it; two conversions of one output would corrupt it.")
    assert list(tmp_path.iterdir()) == []
    assert run_fastdata("convert", *FAKE, out, "--workers", "1", "--quiet").returncode == 0  # the lock was released
    assert fastdata.verify(out).ok


def test_conversions_started_together_leave_one_sound_dataset(tmp_path: Path) -> None:
    for attempt in range(3):
        out = tmp_path / f"together-{attempt}.npy"
        command = ["convert", *FAKE[:1], "--source-option", "size=300", out, "--workers", "1", "--quiet"]
        processes = [start_fastdata(*command, start_new_session=True) for _ in range(2)]
        outputs = [finish(p, timeout=300) for p in processes]
        results = sorted((p.returncode, *output) for p, output in zip(processes, outputs))
        (ok, ok_out, _), (failed, _, failed_err) = results
        assert (ok, failed) == (0, 1) and ok_out.startswith(f"wrote 300 samples to {out}")
        assert ("Another conversion is writing" in failed_err or "already exists" in failed_err), failed_err
        assert "Traceback" not in failed_err
        assert fastdata.verify(out).ok
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"together-{i}.npy" for i in range(3)]


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    source = class_folder(tmp_path / "src", {"a": 3})
    out = tmp_path / "s.npy"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "s.npy.partial.lock").write_text(json.dumps({"lock": "fastdata conversion lock",
                                                             "pid": int(dead.stdout), "host": "here"}))
    assert fastdata.convert(source, out, workers=0)["count"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.npy", "src"]


def test_lock_refuses_a_file_it_did_not_write(tmp_path: Path) -> None:
    (tmp_path / "x.npy.partial.lock").write_text("my notes")
    with pytest.raises(OutputExistsError, match=r"x.npy.partial.lock' exists and was not written by fastdata"):
        with ConversionLock(tmp_path / "x.npy"):
            pass
    assert (tmp_path / "x.npy.partial.lock").read_text() == "my notes"
    with ConversionLock(tmp_path / "y.npy"):
        with pytest.raises(OutputLockedError, match=rf"\(process {os.getpid()} on "):
            ConversionLock(tmp_path / "y.npy").acquire()
    assert not (tmp_path / "y.npy.partial.lock").exists()


@pytest.mark.parametrize("code,cause", [
    (errno.ENOSPC, "no space left on the device. Free disk space and convert again"),
    (errno.EDQUOT, "disk quota exceeded"),
    (errno.EACCES, "permission denied. Check that you can write to that folder (/data/x)"),
    (errno.ENOENT, "a folder disappeared during the conversion (was it moved or deleted?). Convert again (/data/x)"),
    (errno.EEXIST, "a path that fastdata creates already exists"),
    (errno.EROFS, "the file system is read-only"),
    (errno.EIO, "an input/output error on the device"),
])
def test_write_errors_name_their_real_cause(code: int, cause: str) -> None:
    error = write_error(Path("/data/out.npy"), OSError(code, os.strerror(code), "/data/x"))
    assert isinstance(error, OutputWriteError) and error.errno == code
    assert str(error).startswith(f"Cannot write '/data/out.npy': {cause}")
    assert str(error).endswith("; no partial output was left behind.")
    assert "Free disk space" not in str(error) or code == errno.ENOSPC


# --- 5/6. untrusted datasets stay inside their directory: see test_untrusted.py --------------------

# --- 7. converted datasets convert ----------------------------------------------------------------


@pytest.mark.parametrize("fmt", WRITABLE_FORMATS)
@pytest.mark.parametrize("store", ["raw", "encoded"])
def test_every_converted_dataset_converts_and_keeps_its_classes(uniform_folder: Path, tmp_path: Path, fmt: str,
                                                                 store: str) -> None:
    first = tmp_path / f"first-{fmt}"
    fastdata.convert(uniform_folder, first, format=fmt, store=store, workers=0)
    reader = fastdata.formats.get_format(fmt).map_dataset(first)
    assert reader.classes == ["ant", "bee", "cow"] and reader.class_to_idx == {"ant": 0, "bee": 1, "cow": 2}
    second = tmp_path / "second.npy"
    manifest = fastdata.convert(first, second, workers=0)
    assert manifest["classes"] == ["ant", "bee", "cow"] and manifest["source"]["type"] == "fastdata"
    again = fastdata.open_dataset(second)
    original = fastdata.FolderDataset(uniform_folder)
    for index in range(12):
        image, label = again[index]
        expected_image, expected_label = original[index]
        assert label == expected_label and np.array_equal(image.numpy(), expected_image.numpy())
    report = fastdata.verify(second)
    assert report.ok, report.problems


def test_iterable_tar_reader_exposes_classes(uniform_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "t"
    fastdata.convert(uniform_folder, out, format="tar", workers=0)
    reader = fastdata.TarDataset(out)
    assert reader.classes == ["ant", "bee", "cow"] and reader.class_to_idx["cow"] == 2


# --- 8. one-line errors, never tracebacks ---------------------------------------------------------


def test_bad_torchvision_options_and_output_paths_are_one_line_errors(tmp_path: Path, capsys) -> None:
    fake = ["torchvision:FakeData", "--source-option", "size=5"]
    (tmp_path / "afile").write_text("x")
    long_name = "x" * 250
    cases = [
        (["torchvision:FakeData", "--source-option", "size=-1", tmp_path / "o.npy"],
         "torchvision:FakeData has no valid length (ValueError: __len__() should return >= 0). A source must be a "
         "map-style dataset with __len__ and __getitem__; check its options."),
        ([*fake, "--source-option", "image_size=(0, 0, 0)", tmp_path / "o.npy"],
         "sample 0: cannot load sample (the image is empty (0x0 pixels)). Re-run with --skip-bad (skip_bad=True) to leave it out."),
        ([*fake, "--source-option", "bogus=1", tmp_path / "o.npy"],
         "torchvision:FakeData does not take option 'bogus' (--source-option). Its options: size, image_size, "
         "num_classes, transform, target_transform, random_offset."),
        ([*fake, tmp_path / "afile" / "out.npy"],
         f"Cannot create output {str(tmp_path / 'afile' / 'out.npy')!r}: {str(tmp_path / 'afile')!r} is a file, "
         "not a folder. Choose an output path in a folder."),
        ([*fake, tmp_path / long_name],
         f"Output name {long_name[:40]!r}... is 250 bytes long; this file system allows 255, and fastdata adds up "
         "to 32 for its temporary names. Use a name of at most 223 bytes."),
        ([*fake, "."], "Invalid output '.': give the path of the dataset to create, e.g. 'out/data.npy'."),
        ([*fake, ".."], "Invalid output '..': give the path of the dataset to create, e.g. 'out/data.npy'."),
    ]
    for args, message in cases:
        assert one_error_line(cli_here(capsys, "convert", *args, "--quiet", cwd=tmp_path)) == message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def _wait_for_output(process: subprocess.Popen, path: Path) -> None:
    wait_until(lambda: path.exists() and any(path.iterdir()), f"output in {path}", process=process)


# no checkpoint is ever made, so an interrupted conversion keeps nothing (with one, Ctrl-C and
# SIGTERM keep the partial output for --resume: test_faults, test_resume)
NO_CHECKPOINT = {"FASTDATA_CHECKPOINT_INTERVAL_S": "1e9"}


@pytest.mark.parametrize("delay_s", [0.1, 0.3, 0.6, 1.0, 1.5])
def test_ctrl_c_at_any_moment_exits_130_with_one_line(tmp_path: Path, delay_s: float) -> None:
    out = tmp_path / "c.npy"
    process = start_fastdata("convert", *FAKE, out, "--quiet", env=NO_CHECKPOINT, start_new_session=True)
    # counted from the first extension module loaded: a signal while the interpreter itself still starts
    # (importing site) is Python's fatal error, not fastdata's, and a loaded machine can stretch that start
    wait_until(lambda: _maps_site_packages(process.pid), "the interpreter's start", process=process)
    time.sleep(delay_s)  # the moment of the signal: during the imports, the source scan, or the conversion
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = finish(process, timeout=60)
    if process.returncode == 0:  # a fast machine finished first: then the output is whole, and nothing else is left
        assert stderr == ""
        assert [p.name for p in tmp_path.iterdir()] == ["c.npy"] and fastdata.verify(out).ok
        return
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines() == ["fastdata: interrupted"], stderr
    assert list(tmp_path.iterdir()) == []


def _maps_site_packages(pid: int) -> bool:
    """Whether process ``pid`` has mapped a compiled module from site-packages (its start is over)."""
    try:
        return "site-packages" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_sigterm_cleans_up_like_ctrl_c(tmp_path: Path) -> None:
    out = tmp_path / "t.npy"
    process = start_fastdata("convert", *FAKE, out, "--workers", "2", "--store", "encoded", "--quiet",
                             env=NO_CHECKPOINT)
    _wait_for_output(process, tmp_path / "t.npy.partial")
    process.terminate()  # only the main process, as a job scheduler's first signal
    _, stderr = finish(process, timeout=60)
    assert process.returncode == 143 and stderr.strip().splitlines() == ["fastdata: terminated"], stderr
    assert list(tmp_path.iterdir()) == []


# --- 9. --workers is capped -----------------------------------------------------------------------


def test_workers_are_capped_at_the_usable_cores(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    result = run_fastdata("convert", *FAKE[:1], "--source-option", "size=240", tmp_path / "w.npy", "--workers",
                          "100000", "--quiet")
    assert result.returncode == 0, result.stderr
    assert result.stderr == f"fastdata: --workers 100000 capped at {cores} (the usable cores)\n"
    few = run_fastdata("convert", *FAKE[:1], "--source-option", "size=1", tmp_path / "one.npy", "--workers",
                       cores + 1, "--quiet")
    assert few.returncode == 0 and few.stderr == f"fastdata: --workers {cores + 1} capped at 1 (the sample count)\n"


@pytest.mark.parametrize("files,expected", [
    ({"cpu.max": "150000 100000\n"}, 1.5),
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.0),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),
])
def test_cgroup_cpu_quota(tmp_path: Path, files: dict[str, str], expected: float | None) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path) == expected


# --- 10. smaller findings -------------------------------------------------------------------------


def test_a_dangling_symlink_as_output_is_refused_before_converting(tmp_path: Path) -> None:
    source = class_folder(tmp_path / "src", {"a": 3})
    link = tmp_path / "link.npy"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(OutputExistsError, match=r"is a symbolic link \(to '.*nowhere'\); fastdata does not write "
                                                r"through or replace links"):
        fastdata.convert(source, link, workers=0, progress=lambda *a: pytest.fail("it converted first"))
    assert link.is_symlink() and not link.exists()


def test_32_bit_images_clip_negative_values_to_black(tmp_path: Path) -> None:
    values = np.array([[-70000, -1, 0, 255], [256, 65535, 65536, 2**31 - 1]], dtype=np.int32)
    save(Image.fromarray(values, mode="I"), tmp_path / "src" / "a" / "wide.tif")
    fastdata.convert(tmp_path / "src", tmp_path / "w.npy", workers=0)
    stored = np.load(tmp_path / "w.npy" / "images.npy")[0, :, :, 0]
    assert stored.tolist() == [[0, 0, 0, 0], [1, 255, 255, 255]]
