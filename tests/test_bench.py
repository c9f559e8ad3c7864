"""The benchmark harness at tiny sizes: rows, files, verdicts, caching, failures. No timing asserts."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import get_worker_info

from fastdata.bench import BenchConfig, auto_workers, parse_workers, run_bench
from fastdata.bench.report import best_workers, summarize, verdicts
from fastdata.bench.runner import ROW_FIELDS
from fastdata.errors import InvalidOptionError
from fastdata.formats import FormatSpec, registered
from fastdata.formats.npy import MemmapDataset, MemmapWriter
from fastdata.reader import MapDataset

TINY = dict(batch_size=4, epochs=2, warmup=1, resize="6x5")


def test_auto_workers_for_any_core_count() -> None:
    assert auto_workers(2) == [0, 1, 2]
    assert auto_workers(6) == [0, 1, 2, 4, 6]
    assert auto_workers(64) == [0, 1, 2, 4, 8, 16, 32, 64]
    assert parse_workers("2,0,1,1") == [0, 1, 2]
    with pytest.raises(InvalidOptionError, match="Invalid --num-workers 'x'"):
        parse_workers("x")


def test_rows_files_and_plot(uniform_folder: Path, tmp_path: Path) -> None:
    config = BenchConfig(formats=("folder", "npy"), stores=("raw", "encoded"), workers=(0, 1), **TINY)
    result = run_bench(uniform_folder, config, tmp_path / "out")
    rows = result.rows
    measured = [r for r in rows if r["format"] != "probe"]
    # folder standard + npy raw/encoded x fast/standard = 5 read paths x 2 worker counts x 3 epochs
    assert len(measured) == 5 * 2 * 3
    assert {(r["format"], r["store"], r["path"]) for r in measured} == {
        ("folder", "-", "standard"), ("npy", "raw", "fast"), ("npy", "raw", "standard"),
        ("npy", "encoded", "fast"), ("npy", "encoded", "standard"),
    }
    for row in rows:
        assert list(row)[: len(ROW_FIELDS)] == list(ROW_FIELDS)
        assert row["status"] == "ok", row["status"]
        assert row["samples_per_s"] > 0 and 0 <= row["wait_fraction"] <= 1 and row["uss_mb"] > 0
        assert row["cpu_count"] == os.cpu_count()
    assert all(r["samples"] == 12 for r in measured)
    assert sorted({r["warmup"] for r in measured}) == [False, True]
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["machine"]["cpu_count"] == os.cpu_count() and len(data["rows"]) == len(rows)
    assert data["baseline"] == "folder" and data["verdicts"] == result.verdicts
    with open(tmp_path / "out" / "results.csv") as handle:
        reader = csv.reader(handle)
        assert next(reader)[: len(ROW_FIELDS)] == list(ROW_FIELDS)
        assert sum(1 for _ in reader) == len(rows)
    assert (tmp_path / "out" / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(result.verdicts) == 5 and result.verdicts[0].startswith("folder standard: best num_workers=")


def make_rows(rates: dict[int, float], fmt: str = "npy") -> list[dict]:
    return [
        {"format": fmt, "store": "raw", "path": "fast", "num_workers": w, "epoch": e, "warmup": e == 0,
         "samples_per_s": rate * (1 + e / 100), "first_batch_s": 0.1, "wait_fraction": 0.5, "cpu_s": 1.0,
         "uss_mb": 10.0, "status": "ok", "batch_size": 256}
        for w, rate in rates.items() for e in range(3)
    ]


def test_verdict_picks_the_maximum() -> None:
    rows = make_rows({0: 900.0, 1: 2000.0, 2: 1500.0}) + make_rows({0: 100.0, 1: 400.0, 2: 300.0}, "folder")
    summary = summarize(rows)
    assert best_workers(summary[("npy", "raw", "fast", "torch")]) == 1
    assert summary[("npy", "raw", "fast", "torch")][1]["samples_per_s"] == pytest.approx(2000 * 1.015)
    lines = verdicts(rows, "folder")
    assert lines[0].startswith("folder raw fast: best num_workers=1 (406 samples/s)")
    assert lines[1].startswith("npy raw fast: best num_workers=1 (2,030 samples/s, 5.0x folder)")
    assert "a batch takes 280 ms to read and decode in one process, so 1 worker overlap" in lines[1]


def test_conversions_are_cached_and_invalidated(uniform_folder: Path, tmp_path: Path) -> None:
    config = BenchConfig(formats=("npy",), stores=("raw",), workers=(0,), **TINY)
    first = run_bench(uniform_folder, config, tmp_path / "out")
    assert [c["cached"] for c in first.conversions if c["format"] == "npy"] == [False]
    converted = Path(next(c["path"] for c in first.conversions if c["format"] == "npy"))
    stamp = (converted / "images.npy").stat().st_mtime_ns
    second = run_bench(uniform_folder, config, tmp_path / "out")
    again = next(c for c in second.conversions if c["format"] == "npy")
    assert again["cached"] is True and again["path"] == str(converted)
    assert (converted / "images.npy").stat().st_mtime_ns == stamp
    resized = run_bench(uniform_folder, BenchConfig(**{**config.to_dict(), "resize": "4x4"}), tmp_path / "out")
    changed = next(c for c in resized.conversions if c["format"] == "npy")
    assert changed["cached"] is False and changed["path"] != str(converted) and not converted.exists()
    assert np.load(Path(changed["path"]) / "images.npy").shape == (12, 4, 4, 3)
    (uniform_folder / "ant" / "0.png").write_bytes((uniform_folder / "bee" / "0.png").read_bytes())
    touched = run_bench(uniform_folder, BenchConfig(**{**config.to_dict(), "resize": "4x4"}), tmp_path / "out")
    assert next(c for c in touched.conversions if c["format"] == "npy")["cached"] is False


class CrashingWriter(MemmapWriter):
    def close(self, manifest):
        return super().close(dict(manifest, format="npy"))  # readable by MemmapDataset


class CrashingDataset(MapDataset):
    """npy data whose DataLoader workers die: the sweep must record it and go on."""

    def __init__(self, path, transform=None, **kwargs):
        super().__init__(transform=transform)
        self.inner = MemmapDataset(path)
        self.labels = self.inner.labels

    def _read(self, indices, allocate=None, *, pil=False):
        if get_worker_info() is not None:
            os._exit(3)
        return self.inner._read(indices, allocate, pil=pil)


def test_failing_configuration_is_reported_without_aborting(uniform_folder: Path, tmp_path: Path) -> None:
    spec = FormatSpec(name="crashing", dataset=CrashingDataset, writer=CrashingWriter, stores=("raw",))
    config = BenchConfig(formats=("crashing", "npy"), stores=("raw",), workers=(0, 1), **TINY)
    with registered(spec):
        result = run_bench(uniform_folder, config, tmp_path / "out")
    crashing = [r for r in result.rows if r["format"] == "crashing"]
    assert {r["num_workers"] for r in crashing if r["status"] == "ok"} == {0}
    failed = [r for r in crashing if r["status"] != "ok"]
    assert {r["num_workers"] for r in failed} == {1} and len(failed) == 2  # fast and standard
    assert all(r["status"].startswith("failed: RuntimeError: DataLoader worker (pid") for r in failed)
    assert all(r["status"] == "ok" for r in result.rows if r["format"] == "npy")
    assert "crashing raw fast: best num_workers=0" in "\n".join(result.verdicts)
    assert "failed" in result.table


def test_cli_bench_and_option_errors(uniform_folder: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "fastdata", "bench", str(uniform_folder), "--formats", "folder,npy",
               "--stores", "raw", "--num-workers", "0", "--epochs", "1", "--warmup", "0", "--batch-size", "4",
               "--resize", "6x5", "--out", str(tmp_path / "b"), "--quiet"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"os.cpu_count()={os.cpu_count()}" in result.stdout
    assert "npy raw fast: best num_workers=0" in result.stdout
    assert (tmp_path / "b" / "results.json").exists()
    bad = subprocess.run(command + ["--transform", "blur"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "fastdata: error: Unknown --transform 'blur'" in bad.stderr
    unknown = subprocess.run(command[:5] + ["--formats", "npy,zarr"], capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 1 and "Unknown format 'zarr'" in unknown.stderr


def test_loader_options_spawn_cold_cache_transform_and_step(uniform_folder: Path, tmp_path: Path) -> None:
    config = BenchConfig(formats=("folder", "npy"), stores=("raw",), workers=(1,), batch_size=4, epochs=1,
                         warmup=0, resize="6x5", start_method="spawn", cache="cold", transform="normalize",
                         step_ms=2.0, persistent_workers=True, prefetch_factor=3)
    result = run_bench(uniform_folder, config, tmp_path / "out")
    measured = [r for r in result.rows if r["format"] != "probe"]
    assert len(measured) == 3 and all(r["status"] == "ok" for r in measured), [r["status"] for r in measured]
    for row in measured:
        assert (row["start_method"], row["cache"], row["transform"], row["step_ms"]) == ("spawn", "cold", "normalize", 2.0)
        assert row["persistent_workers"] is True and row["prefetch_factor"] == 3
        assert row["samples"] == 12 and row["batches"] == 3
        assert row["epoch_s"] >= 3 * 0.002  # three simulated 2 ms steps are inside the loop time


def test_cold_cache_needs_posix_fadvise(tmp_path: Path, monkeypatch) -> None:
    from fastdata.bench.measure import evict_from_page_cache

    target = tmp_path / "f.bin"
    target.write_bytes(b"x" * 4096)
    evict_from_page_cache((str(target),))  # works where the OS has posix_fadvise
    monkeypatch.delattr(os, "posix_fadvise")
    with pytest.raises(InvalidOptionError, match="--cache cold needs os.posix_fadvise.*Use --cache warm"):
        evict_from_page_cache((str(target),))


def test_torchvision_source_is_the_baseline(tmp_path: Path) -> None:
    config = BenchConfig(formats=("npy",), stores=("raw",), workers=(0,), batch_size=8, epochs=1, warmup=0)
    result = run_bench("torchvision:FakeData", config, tmp_path / "out",
                       source_options={"source_options": {"size": 16, "image_size": (3, 6, 6)}})
    statuses = {(r["format"], r["path"]): r["status"] for r in result.rows}
    assert statuses == {("torchvision", "standard"): "ok", ("npy", "fast"): "ok", ("npy", "standard"): "ok"}
    assert "x torchvision)" in result.verdicts[1]


def test_verdict_names_worker_start_up_when_it_decides() -> None:
    rows = make_rows({0: 1000.0, 1: 800.0})
    for row in rows:
        row["samples"] = 1000
        row["first_batch_s"] = 0.01 if row["num_workers"] == 0 else 0.5
    (line,) = verdicts(rows, None)
    assert line.startswith("npy raw fast: best num_workers=0 (1,015 samples/s); starting workers costs 490 ms")
    assert "against a 985 ms epoch in one process" in line and "persistent_workers=True" in line


def test_backends_are_measured_apart(uniform_folder: Path, tmp_path: Path) -> None:
    config = BenchConfig(formats=("npy",), stores=("raw",), workers=(0, 1), backends=("torch", "thread", "process"),
                         **TINY)
    result = run_bench(uniform_folder, config, tmp_path / "out")
    measured = {(r["format"], r["path"], r["backend"], r["num_workers"]) for r in result.rows
                if r["status"] == "ok" and r["format"] == "npy"}
    assert measured == {("npy", "fast", "torch", 0), ("npy", "fast", "torch", 1), ("npy", "standard", "torch", 0),
                        ("npy", "standard", "torch", 1), ("npy", "fast", "thread", 1), ("npy", "fast", "process", 1)}
    assert list(result.rows[0])[:13] == [*ROW_FIELDS]  # the existing columns keep their order; backend last
    assert "npy raw fast [thread]" in result.table and "npy raw fast [process]" in result.table
    winner = [line for line in result.verdicts if line.startswith("npy raw fast: backend ")]
    assert len(winner) == 1 and " wins (" in winner[0]
    header = (tmp_path / "out" / "results.csv").read_text().splitlines()[0].split(",")
    assert header[: len(ROW_FIELDS)] == list(ROW_FIELDS) and header[len(ROW_FIELDS) - 1] == "backend"
