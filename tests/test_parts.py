"""``--part I/N`` and ``fastdata merge``: parts of a job array give the bytes of a local conversion;
missing, duplicate and mismatched parts are refused; parts write concurrently, while a whole
conversion and parts of the same output exclude each other."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastdata
from conftest import finish, make_folder, output_contents, pattern, run_fastdata, save, start_fastdata
from fastdata.errors import OutputExistsError, OutputLockedError, PartsError

CASES = [("npy", "raw", {}), ("npy", "encoded", {}), ("tar", "raw", {"shard_samples": 4}),
         ("tar", "encoded", {"shard_bytes": "3000"}), ("npy", "encoded", {"reencode": "jpeg:80"}),
         ("hdf5", "raw", {"compression": "lzf", "chunk_images": 3}), ("hdf5", "encoded", {})]


def same_output(local: Path, merged: Path) -> None:
    assert output_contents(merged) == output_contents(local)  # hdf5: the same datasets (one writer either way)


def parts(source: Path, out: Path, count: int, **options) -> list[dict]:
    return [fastdata.convert(source, out, part=f"{i}/{count}", unit_samples=4, workers=0, **options)
            for i in range(1, count + 1)]


@pytest.mark.parametrize("fmt,store,extra", CASES, ids=[f"{f}-{s}-{'-'.join(e) or 'default'}" for f, s, e in CASES])
def test_merged_parts_equal_a_local_conversion(tmp_path: Path, fmt: str, store: str, extra: dict) -> None:
    source = make_folder(tmp_path / "src")
    options = dict(format=fmt, store=store, skip_bad=True, **extra)
    local = tmp_path / "local"
    fastdata.convert(source, local, workers=0, **options)
    merged = tmp_path / "merged"
    records = parts(source, merged, 3, **options)
    assert [r["count"] for r in records] == [7, 12, 11] and [r["skipped"] for r in records] == [1, 0, 0]
    manifest = fastdata.merge(merged)
    assert manifest["count"] == 30 and [s["key"] for s in manifest["skipped"]] == ["a/007-bad.png"]
    same_output(local, merged)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local", "merged", "src"]  # no staging, lock or journal left


def test_auto_mode_parts_agree_on_rgb_when_one_part_meets_colour(tmp_path: Path) -> None:
    """The first 64 images are grayscale; image b/070.png (sample 75, in part 3 of 3) is not: every part's units end as RGB."""
    source = make_folder(tmp_path / "src", 80, bad=False, colour_at=70)
    local = tmp_path / "local"
    fastdata.convert(source, local, format="npy", store="encoded", reencode="png", workers=0)
    merged = tmp_path / "merged"
    records = parts(source, merged, 3, format="npy", store="encoded", reencode="png")
    assert [r["plan"]["mode"] for r in records] == ["L", "L", "L"]  # the plan all parts made
    units = sorted(json.loads(p.read_text())["mode"] for p in (tmp_path / "merged.partial.units").glob("*/unit.json"))
    assert units == ["L"] * 13 + ["RGB"] * 7  # part 3 converted its own units again; the merge does the rest
    assert fastdata.merge(merged)["image"]["mode"] == "RGB"
    same_output(local, merged)


def test_auto_mode_parts_of_grayscale_images_stay_grayscale(tmp_path: Path) -> None:
    source = make_folder(tmp_path / "src", 20, bad=False, colour_at=-1)
    local, merged = tmp_path / "local", tmp_path / "merged"
    fastdata.convert(source, local, format="tar", store="raw", workers=0)
    parts(source, merged, 2, format="tar", store="raw")
    assert fastdata.merge(merged)["image"]["shape"] == [10, 12, 1]
    same_output(local, merged)


def test_missing_mismatched_and_duplicate_parts_are_refused(tmp_path: Path) -> None:
    source = make_folder(tmp_path / "src", bad=False)
    out = tmp_path / "out"
    first = fastdata.convert(source, out, format="npy", part="1/3", unit_samples=4, workers=0)
    with pytest.raises(PartsError) as missing:
        fastdata.merge(out)
    assert str(missing.value) == (
        f"Cannot merge {str(out)!r}: 2 of 3 parts missing (2/3, 3/3). Run them with 'fastdata convert SOURCE "
        f"{out} --part I/3' (same source and options), then merge again."
    )
    with pytest.raises(PartsError) as other_options:
        fastdata.convert(source, out, format="npy", part="2/3", unit_samples=4, workers=0, resize="8x8")
    assert str(other_options.value) == (
        f"Parts of {str(out)!r} do not match (different source or options): resize None in part 1/3, [8, 8] in "
        "part 2/3. Every part must convert the same source with the same options and the same N; run part 2/3 "
        f"again with the others' (--overwrite (overwrite=True)), or remove {str(out) + '.partial.units'!r} to start over."
    )
    with pytest.raises(PartsError, match=r"^Parts of .* do not match \(different source or options\): parts 3 in "
                       r"part 1/3, 4 in part 2/4\. "):
        fastdata.convert(source, out, format="npy", part="2/4", unit_samples=4, workers=0)
    with pytest.raises(PartsError) as duplicate:
        fastdata.convert(source, out, format="npy", part="1/3", unit_samples=4, workers=0)
    owner = first["owner"]
    assert str(duplicate.value) == (
        f"Part 1/3 of {str(out)!r} was already written (process {owner['pid']} on {owner['host']}, finished "
        f"{owner['finished']}); each --part I/N runs once. Check the job array's indices, or pass --overwrite "
        "(overwrite=True) to convert part 1/3 again."
    )
    with pytest.raises(OutputExistsError, match=r"is being converted in parts: .* \(finished parts: 1/3\)\. Finish "
                       r"it with the remaining --part runs and 'fastdata merge .*', or pass --overwrite \(overwrite=True\) to discard"):
        fastdata.convert(source, out, format="npy", workers=0)
    assert not out.exists()
    resized = fastdata.convert(source, out, format="npy", part="1/3", unit_samples=4, workers=0, overwrite=True,
                               resize="8x8")  # converted again, with other options: its units are replaced
    assert resized["plan"]["shape"] == [8, 8, 3]
    again = fastdata.convert(source, out, format="npy", part="1/3", unit_samples=4, workers=0, overwrite=True)
    assert again["plan"]["shape"] == [10, 12, 3] and again["count"] == 8
    for i in (2, 3):
        fastdata.convert(source, out, format="npy", part=f"{i}/3", unit_samples=4, workers=0)
    assert fastdata.merge(out)["count"] == 30


def test_a_mismatched_record_is_refused_by_the_merge(tmp_path: Path) -> None:
    """Parts whose records disagree (here: another unit size) never merge, whichever ran first."""
    source = make_folder(tmp_path / "src", bad=False)
    out = tmp_path / "out"
    parts(source, out, 2, format="npy")
    record = out.with_name("out.partial.units") / "part-0002-of-0002.json"
    record.write_text(record.read_text().replace('"unit_samples": 4', '"unit_samples": 5'))
    with pytest.raises(PartsError, match=r"do not match \(different source or options\): unit_samples 4 in part "
                       r"1/2, 5 in part 2/2\."):
        fastdata.merge(out)
    record.write_text(record.read_text().replace('"unit_samples": 5', '"unit_samples": 4'))
    copy = record.with_name("part-0002-of-0002 (copy).json")
    copy.write_bytes(record.read_bytes())
    with pytest.raises(PartsError) as twice:
        fastdata.merge(out)
    assert str(twice.value) == (
        f"Cannot merge {str(out)!r}: part 2/2 is recorded twice in {str(out) + '.partial.units'!r} (two records of "
        "one part); each --part I/N runs once. Remove the copy that the job array did not write, then merge again."
    )
    copy.unlink()
    assert fastdata.merge(out)["count"] == 30


def test_part_options_are_checked(tmp_path: Path) -> None:
    from fastdata.errors import InvalidOptionError

    with pytest.raises(InvalidOptionError) as zero:
        fastdata.convert(tmp_path, tmp_path / "out", part="0/4")
    assert str(zero.value) == ("Invalid --part '0/4'. Use I/N with 1 <= I <= N, e.g. --part 1/4 (part='1/4') ... --part 4/4 "
                               "(a 0-based array index is I-1: --part $((SLURM_ARRAY_TASK_ID + 1))/N).")
    with pytest.raises(InvalidOptionError, match=r"^--resume does not apply to --part: "):
        fastdata.convert(tmp_path, tmp_path / "out", part="1/2", resume=True)
    with pytest.raises(PartsError, match=r"^Nothing to merge for '.*/out': '.*/out.partial.units' does not exist\."):
        fastdata.merge(tmp_path / "out")


@pytest.mark.parametrize("name", ["done.npy", "done.h5"])
def test_merging_a_finished_dataset_says_it_is_complete(tmp_path: Path, capsys, name: str) -> None:
    from fastdata.cli import main

    out = tmp_path / name
    fastdata.convert(make_folder(tmp_path / "src", 4, bad=False), out, workers=0)
    assert main(["merge", str(out)]) == 1
    assert capsys.readouterr().err == (
        f"fastdata: error: Nothing to merge for {str(out)!r}: it is already a complete dataset (4 samples) and no "
        f"parts wait in {str(out) + '.partial.units'!r}. 'fastdata verify {out}' checks it.\n")


# --- real processes ------------------------------------------------------------------------


def test_parts_as_concurrent_processes_then_cli_merge(tmp_path: Path) -> None:
    source = make_folder(tmp_path / "src", 40)
    common = ["--format", "npy", "--store", "encoded", "--skip-bad", "--workers", "1", "--quiet"]
    local, merged = tmp_path / "local", tmp_path / "merged"
    running = [start_fastdata("convert", source, local, *common, start_new_session=True)]
    running += [start_fastdata("convert", source, merged, *common, "--part", f"{i}/3", "--unit-samples", "3",
                               start_new_session=True) for i in (1, 2, 3)]
    results = [finish(process, timeout=300) + (process.returncode,) for process in running]
    assert [code for _, _, code in results] == [0, 0, 0, 0], results
    assert results[1][0] == (f"wrote part 1/3 of {merged}: 11 samples (1 skipped) into {merged}.partial.units; "
                             f"when all 3 parts are done: fastdata merge {merged}\n")
    merge = run_fastdata("merge", merged, "--quiet", timeout=300)
    stdout, stderr = merge.stdout, merge.stderr
    assert merge.returncode == 0 and stdout.startswith(f"merged into {merged}: 40 samples ("), stderr
    same_output(local, merged)


def _part_waiting(source: str, out: str, part: str, started, release) -> None:
    """A part that stops after its first batch until ``release`` is set."""
    def progress(count: int, total: int) -> None:
        started.set()
        release.wait(60)

    fastdata.convert(source, out, format="npy", part=part, unit_samples=4, workers=0, progress=progress)


def _whole_waiting(source: str, out: str, started, release) -> None:
    def progress(count: int, total: int) -> None:
        started.set()
        release.wait(60)

    fastdata.convert(source, out, format="npy", workers=0, progress=progress)


def test_parts_write_together_but_exclude_a_whole_conversion(tmp_path: Path) -> None:
    source = make_folder(tmp_path / "src", bad=False)
    out = tmp_path / "out"
    context = multiprocessing.get_context("fork")
    started, release = context.Event(), context.Event()
    first = context.Process(target=_part_waiting, args=(str(source), str(out), "1/2", started, release))
    first.start()
    try:
        assert started.wait(60)
        # another part of the same output runs to the end while part 1 is in the middle of its work
        second = fastdata.convert(source, out, format="npy", part="2/2", unit_samples=4, workers=0)
        assert second["count"] == 14  # units 4..7 of 0..7
        with pytest.raises(OutputLockedError, match=rf"^Another conversion is writing {str(out)!r} \(process "
                           rf"{first.pid} on "):
            fastdata.convert(source, out, format="npy", workers=0)
        with pytest.raises(OutputLockedError, match=rf"^Another conversion is writing {str(out)!r}"):
            fastdata.merge(out)
    finally:
        release.set()
        first.join(60)
    assert first.exitcode == 0
    fastdata.merge(out)
    local = tmp_path / "local"
    fastdata.convert(source, local, format="npy", workers=0)
    same_output(local, out)


def test_a_part_cannot_join_a_whole_conversion(tmp_path: Path) -> None:
    source = make_folder(tmp_path / "src", bad=False)
    out = tmp_path / "out"
    context = multiprocessing.get_context("fork")
    started, release = context.Event(), context.Event()
    whole = context.Process(target=_whole_waiting, args=(str(source), str(out), started, release))
    whole.start()
    try:
        assert started.wait(60)
        with pytest.raises(OutputLockedError, match=rf"^A whole conversion \(local or Ray\) or a merge is writing "
                           rf"{str(out)!r} \(process {whole.pid} on .*\); a --part run cannot join it\."):
            fastdata.convert(source, out, format="npy", part="1/2", unit_samples=4, workers=0)
    finally:
        release.set()
        whole.join(60)
    assert whole.exitcode == 0 and out.is_dir() and not out.with_name("out.partial.units").exists()
    assert np.load(out / "labels.npy").shape == (30,)


def test_engine_ray_without_ray_installed_is_one_clear_error(tmp_path: Path) -> None:
    source = make_folder(tmp_path / "src", 3, bad=False)
    code = ("import sys; sys.modules['ray'] = None; from fastdata.cli import main; "  # 'import ray' now fails
            f"sys.exit(main(['convert', {str(source)!r}, {str(tmp_path / 'out')!r}, '--format', 'npy', '--engine', 'ray']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == ("fastdata: error: --engine ray needs the ray package, which is not installed. Install it "
                             "with: pip install 'torch-fastdata[ray]' or, in a checkout of fastdata, pip install '.[ray]' (or use --engine local, or --part I/N on a job "
                             "array).\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_a_bad_image_fails_its_part_as_it_fails_a_local_conversion(tmp_path: Path) -> None:
    source = make_folder(tmp_path / "src", 80, bad=False)
    (source / "b" / "070.png").write_bytes(b"not a png")  # sample 75: after the 64 the plan reads, in part 2/2
    with pytest.raises(fastdata.FastdataError) as local:
        fastdata.convert(source, tmp_path / "local", format="tar", workers=0)
    out = tmp_path / "out"
    fastdata.convert(source, out, format="tar", part="1/2", unit_samples=8, workers=0)
    with pytest.raises(type(local.value)) as part:
        fastdata.convert(source, out, format="tar", part="2/2", unit_samples=8, workers=0)
    assert str(part.value) == str(local.value) == (
        f"{source / 'b' / '070.png'}: cannot decode image (not a recognised image file). Re-run with --skip-bad (skip_bad=True) to "
        "leave it out."
    )
    result = run_fastdata("merge", out)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (f"fastdata: error: Cannot merge {str(out)!r}: 1 of 2 parts missing (2/2). Run them with "
                             f"'fastdata convert SOURCE {out} --part I/2' (same source and options), then merge again.\n")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["out.partial.units", "src"]


def test_a_rerun_part_never_keeps_units_of_a_changed_source(tmp_path: Path) -> None:
    """A part that failed keeps its finished units for a rerun, but only while the source is the
    same: an image of a kept unit replaced meanwhile is converted again, never merged stale."""
    source = make_folder(tmp_path / "src", 160, bad=False)
    (source / "a" / "141.png").write_bytes(b"not a png")  # sample 70: unit 4 of part 1/2 (units of 16)
    out = tmp_path / "out"
    with pytest.raises(fastdata.FastdataError):
        fastdata.convert(source, out, format="npy", part="1/2", unit_samples=16, workers=0)
    kept = out.with_name("out.partial.units")
    assert sorted(p.name for p in kept.iterdir() if p.name.startswith("unit-")) == [f"unit-{i:06d}" for i in range(4)]
    save(Image.fromarray(pattern(10, 12, seed=500)), source / "a" / "011.png")  # sample 5: in kept unit 0
    save(Image.fromarray(pattern(10, 12, seed=141)), source / "a" / "141.png")  # the bad file mended
    for part in ("1/2", "2/2"):
        fastdata.convert(source, out, format="npy", part=part, unit_samples=16, workers=0)
    fastdata.merge(out)
    local = tmp_path / "local"
    fastdata.convert(source, local, format="npy", workers=0)
    same_output(local, out)
