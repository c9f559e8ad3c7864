"""The benchmark harness at tiny sizes: rows, files, verdicts, caching, failures. No timing asserts."""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import get_worker_info

from conftest import run_fastdata
from fastdata.bench import BenchConfig, auto_workers, parse_workers, run_bench
from fastdata.bench.report import best_workers, summarize, table, verdicts
from fastdata.bench.runner import ROW_FIELDS
from fastdata.errors import InvalidOptionError
from fastdata.formats import FormatSpec, registered
from fastdata.formats.npy import MemmapDataset, MemmapWriter
from fastdata.reader import MapDataset

# memory sampled over one untimed epoch (not a second of them): these tests read what the rows say, not the peak
TINY = dict(batch_size=4, epochs=2, warmup=1, resize="6x5", memory_s=0)


def test_auto_workers_for_any_core_count() -> None:
    assert auto_workers(2) == [0, 1, 2]
    assert auto_workers(6) == [0, 1, 2, 4, 6]
    assert auto_workers(64) == [0, 1, 2, 4, 8, 16, 32, 64]
    assert parse_workers("2,0,1,1") == [0, 1, 2]
    with pytest.raises(InvalidOptionError, match="Invalid --num-workers 'x'"):
        parse_workers("x")


def test_rows_files_and_plot(uniform_folder: Path, tmp_path: Path) -> None:
    config = BenchConfig(formats=("folder", "npy"), stores=("raw", "encoded"), workers=(0, 1), **TINY)
    assert config.backends == ("torch", "thread", "process")  # by default, beside the DataLoader
    result = run_bench(uniform_folder, config, tmp_path / "out")
    rows = result.rows
    measured = [r for r in rows if r["format"] != "probe"]
    # folder standard + npy raw/encoded x fast/standard = 5 read paths x 2 worker counts x 3 epochs, and the
    # thread and process backends on npy raw/encoded fast at num_workers=1 (at 0 they are the torch row's loop)
    assert len(measured) == 5 * 2 * 3 + 2 * 2 * 3
    assert {(r["store"], r["backend"], r["num_workers"]) for r in measured if r["backend"] != "torch"} == {
        (store, backend, 1) for store in ("raw", "encoded") for backend in ("thread", "process")}
    assert {(r["format"], r["store"], r["read_path"]) for r in measured} == {
        ("folder", "-", "standard"), ("npy", "raw", "fast"), ("npy", "raw", "standard"),
        ("npy", "encoded", "fast"), ("npy", "encoded", "standard"),
    }
    for row in rows:
        assert list(row)[: len(ROW_FIELDS)] == list(ROW_FIELDS)
        assert row["path"] == row["read_path"]  # the deprecated name, kept for a release
        assert row["status"] == "ok", row["status"]
        assert row["samples_per_s"] > 0 and 0 <= row["wait_fraction"] <= 1 and row["uss_mb"] > 0
        assert row["cpu_count"] == os.cpu_count()
    assert all(r["samples"] == 12 for r in measured)
    assert sorted({r["warmup"] for r in measured}) == [False, True]
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["machine"]["cpu_count"] == os.cpu_count() and len(data["rows"]) == len(rows)
    assert data["baseline"] == "folder" and data["verdicts"] == result.verdicts
    auto = data["auto"]  # num_workers="auto" on the fast path of the fastest dataset, after the grid, apart from rows
    assert auto["format"] == "npy" and [r["epoch"] for r in auto["rows"]] == [0, 1, 2]
    assert all(r["status"] == "ok" and r["backend"] == "auto" and r["read_path"] == "fast" for r in auto["rows"])
    assert result.auto == auto["text"] and auto["text"].startswith(f"npy {auto['store']} num_workers='auto': ")
    assert data["summary"] == json.loads(json.dumps(result.summary)) and data == json.loads(json.dumps(result.document))
    summary_rows = {(r["format"], r["store"], r["read_path"], r["backend"]): r for r in data["summary"]["rows"]}
    assert set(summary_rows) == {(r["format"], r["store"], r["read_path"], r["backend"]) for r in measured}
    for row in summary_rows.values():
        assert row["best_num_workers"] in (0, 1) and [c["num_workers"] for c in row["cells"]] == [0, 1]
        for cell in row["cells"]:
            assert cell["epochs"] == 2 and cell["batches"] == 3 and cell["samples"] == 12
            assert cell["min_samples_per_s"] <= cell["samples_per_s"] <= cell["max_samples_per_s"]
    assert data["summary"]["warnings"][0].startswith("warning: an epoch here is 3 batches (12 samples at batch 4)")
    assert data["summary"]["recommendation"]["text"] == result.recommendation and result.recommendation.startswith("use ")
    effect = data["summary"]["backends"]  # what the backends change, computed from the rows
    picked = data["summary"]["recommendation"]
    assert (effect["format"], effect["store"], effect["read_path"], effect["num_workers"]) == (
        "npy", picked["store"] if picked["format"] == "npy" else "encoded", "fast", 1)

    def median(backend: str, workers: int) -> float:  # of the two measured epochs
        rates = [r["samples_per_s"] for r in measured if not r["warmup"] and r["format"] == "npy" and (
            r["store"], r["read_path"], r["backend"], r["num_workers"]) == (effect["store"], "fast", backend, workers)]
        assert len(rates) == 2
        return sum(rates) / 2

    assert effect["serial_samples_per_s"] == pytest.approx(median("torch", 0))
    for backend in ("torch", "thread", "process"):
        rate = median(backend, 1)
        assert effect["samples_per_s"][backend] == pytest.approx(rate)
        assert effect["ratio_to_serial"][backend] == round(rate / effect["serial_samples_per_s"], 2)
    assert result.backends == effect["text"] and effect["text"].startswith(f"on npy {effect['store']} fast at 1 worker, ")
    with open(tmp_path / "out" / "results.csv") as handle:
        reader = csv.reader(handle)
        assert next(reader)[: len(ROW_FIELDS)] == list(ROW_FIELDS)
        assert sum(1 for _ in reader) == len(rows)
    assert (tmp_path / "out" / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.verdicts[0].startswith("folder standard: num_workers=")
    assert {part for line in result.verdicts for part in line.split(":")[0].split(", ")} >= {
        "folder standard", "npy raw fast", "npy encoded fast"}


def make_rows(rates: dict[int, float], fmt: str = "npy") -> list[dict]:
    return [
        {"format": fmt, "store": "raw", "path": "fast", "num_workers": w, "epoch": e, "warmup": e == 0,
         "samples_per_s": rate * (1 + e / 100), "first_batch_s": 0.1, "wait_fraction": 1.0, "cpu_s": 1.0,
         "uss_mb": 10.0, "status": "ok", "batch_size": 256}
        for w, rate in rates.items() for e in range(3)
    ]


def test_verdict_picks_the_maximum() -> None:
    rows = make_rows({0: 900.0, 1: 2000.0, 2: 1500.0}) + make_rows({0: 100.0, 1: 400.0, 2: 300.0}, "folder")
    summary = summarize(rows)
    assert best_workers(summary[("npy", "raw", "fast", "torch")]) == 1
    assert summary[("npy", "raw", "fast", "torch")][1]["samples_per_s"] == pytest.approx(2000 * 1.015)
    lines = verdicts(rows, "folder")
    assert lines[0].startswith("folder raw fast: num_workers=1: a batch takes 2,522 ms to read")
    assert lines[1] == ("npy raw fast: num_workers=1: a batch takes 280 ms to read and decode in one process, so 1 "
                        "worker overlaps it (transfer costs unmeasured)")


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
    config = BenchConfig(formats=("crashing", "npy"), stores=("raw",), workers=(0, 1), backends=("torch",), **TINY)
    with registered(spec):
        result = run_bench(uniform_folder, config, tmp_path / "out")
    crashing = [r for r in result.rows if r["format"] == "crashing"]
    assert {r["num_workers"] for r in crashing if r["status"] == "ok"} == {0}
    failed = [r for r in crashing if r["status"] != "ok"]
    assert {r["num_workers"] for r in failed} == {1} and len(failed) == 2  # fast and standard
    assert all(r["status"].startswith("failed: RuntimeError: DataLoader worker (pid") for r in failed)
    assert all(r["status"] == "ok" for r in result.rows if r["format"] == "npy")
    assert "crashing raw fast, standard: num_workers=0: " in "\n".join(result.verdicts)
    assert "failed" in result.table


def test_cli_bench_and_option_errors(uniform_folder: Path, tmp_path: Path) -> None:
    command = ["bench", uniform_folder, "--formats", "folder,npy", "--stores", "raw", "--num-workers", "0", "--epochs",
               "1", "--warmup", "0", "--batch-size", "4", "--resize", "6x5", "--out", tmp_path / "b", "--quiet", "--memory-s", "0"]
    result = run_fastdata(*command, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"os.cpu_count()={os.cpu_count()}" in result.stdout
    assert re.search(r"\nrecommendation: use (the image folder|npy raw) through (fastdata.loader \(the fast path\)|a "
                     r"plain DataLoader \(the standard path\)) with num_workers=0: [\d,]+ samples/s", result.stdout)
    assert "\nwhy:\n  folder standard: num_workers=0: " in result.stdout
    assert "\nfast: fastdata.loader(ds, batch_size): one ds[indices] read per batch\n" in result.stdout
    assert "warning: an epoch here is 3 batches (12 samples at batch 4)" in result.stdout
    assert (tmp_path / "b" / "results.json").exists()
    as_json = run_fastdata(*command, "--json", timeout=300)
    assert as_json.returncode == 0 and as_json.stderr == ""
    document = json.loads(as_json.stdout)  # nothing but the document on stdout
    assert document == json.loads((tmp_path / "b" / "results.json").read_text())
    assert document["summary"]["recommendation"]["format"] in ("folder", "npy")
    bad = run_fastdata(*command, "--transform", "blur")
    assert bad.returncode == 1 and "fastdata: error: Unknown --transform 'blur'" in bad.stderr
    unknown = run_fastdata(*command[:2], "--formats", "npy,zarr", cwd=tmp_path)  # no --out: ./bench-out here
    assert unknown.returncode == 1 and "Unknown format 'zarr'" in unknown.stderr


def test_loader_options_spawn_cold_cache_transform_and_step(uniform_folder: Path, tmp_path: Path) -> None:
    config = BenchConfig(formats=("folder", "npy"), stores=("raw",), workers=(1,), batch_size=4, epochs=1,
                         warmup=0, resize="6x5", start_method="spawn", cache="cold", transform="normalize",
                         step_ms=2.0, persistent_workers=True, prefetch_factor=3, backends=("torch",), memory_s=0)
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
    config = BenchConfig(formats=("npy",), stores=("raw",), workers=(0,), batch_size=8, epochs=1, warmup=0, memory_s=0)
    result = run_bench("torchvision:FakeData", config, tmp_path / "out",
                       source_options={"source_options": {"size": 16, "image_size": (3, 6, 6)}})
    statuses = {(r["format"], r["read_path"]): r["status"] for r in result.rows}
    assert statuses == {("torchvision", "standard"): "ok", ("npy", "fast"): "ok", ("npy", "standard"): "ok"}
    assert result.summary["recommendation"]["baseline"]["format"] == "torchvision"
    assert "x the torchvision dataset at its best" in result.recommendation or \
        result.recommendation.startswith("use the torchvision dataset through a plain DataLoader")


def test_verdict_names_worker_start_up_when_it_decides() -> None:
    rows = make_rows({0: 1000.0, 1: 800.0})
    for row in rows:
        row["samples"] = 1000
        row["first_batch_s"] = 0.01 if row["num_workers"] == 0 else 0.5
    (line,) = verdicts(rows, None)
    assert line.startswith("npy raw fast: num_workers=0: starting workers costs 490 ms")
    assert "against a 985 ms epoch in one process" in line and "persistent_workers=True" in line


def test_backends_are_measured_apart(uniform_folder: Path, tmp_path: Path) -> None:
    config = BenchConfig(formats=("npy",), stores=("raw",), workers=(0, 1), backends=("torch", "thread", "process"),
                         **TINY)
    result = run_bench(uniform_folder, config, tmp_path / "out")
    measured = {(r["format"], r["read_path"], r["backend"], r["num_workers"]) for r in result.rows
                if r["status"] == "ok" and r["format"] == "npy"}
    assert measured == {("npy", "fast", "torch", 0), ("npy", "fast", "torch", 1), ("npy", "standard", "torch", 0),
                        ("npy", "standard", "torch", 1), ("npy", "fast", "thread", 1), ("npy", "fast", "process", 1)}
    assert list(result.rows[0])[:13] == [*ROW_FIELDS]  # the existing columns keep their order; backend last
    assert "npy raw fast [thread]" in result.table and "npy raw fast [process]" in result.table
    # one line compares the backends: a winner, or (every backend best without workers) their one serial loop
    winner = [line for line in result.verdicts if line.startswith(("npy raw fast: backend ",
                                                                    "npy raw fast: num_workers=0 on every backend"))]
    assert len(winner) == 1 and (" wins (" in winner[0] or "(torch, thread, process: one serial loop" in winner[0])
    header = (tmp_path / "out" / "results.csv").read_text().splitlines()[0].split(",")
    assert header[: len(ROW_FIELDS)] == list(ROW_FIELDS) and header[len(ROW_FIELDS) - 1] == "backend"


def cell_rows(fmt: str, store: str, path: str, rates: dict[int, list[float]], *, backend: str = "torch",
              wait: float = 1.0, step_ms: float = 0.0, batches: int = 40) -> list[dict]:
    """Hand-built measured rows: one per epoch of each num_workers, the given samples/s."""
    return [
        {"format": fmt, "store": store, "read_path": path, "backend": backend, "num_workers": w, "epoch": e,
         "warmup": False, "samples_per_s": rate, "first_batch_s": 0.01, "wait_fraction": wait, "cpu_s": 1.0,
         "uss_mb": 10.0, "status": "ok", "batch_size": 10, "samples": batches * 10, "batches": batches,
         "step_ms": step_ms}
        for w, epochs in rates.items() for e, rate in enumerate(epochs)
    ]


def test_ties_inside_the_noise_go_to_the_simpler_setting() -> None:
    from fastdata.bench.summary import NOISE_FLOOR, OVERLAP_TIE, choose, within_noise

    cell = lambda *rates: {"status": "ok", "samples_per_s": sorted(rates)[len(rates) // 2],  # noqa: E731
                           "min_samples_per_s": min(rates), "max_samples_per_s": max(rates)}
    assert NOISE_FLOOR == 0.05
    assert within_noise(cell(5350, 9000, 10500), cell(9800, 10077, 10300))  # ranges overlap: a tie
    assert not within_noise(cell(5000, 5100, 5200), cell(9800, 10077, 10300))
    assert within_noise(cell(1000, 1000, 1000), cell(1040, 1040, 1040))  # no spread, but under 5%
    assert not within_noise(cell(1000, 1000, 1000), cell(1060, 1060, 1060))
    # overlapping ranges are a tie only while the medians are within 15%: a median 30% lower is no tie
    assert OVERLAP_TIE == 0.15
    assert within_noise(cell(700, 880, 1300), cell(900, 1000, 1100))  # 12% apart, ranges overlap
    assert not within_noise(cell(700, 700, 700), cell(880, 880, 880))  # 12% apart, no overlap: the better wins
    assert not within_noise(cell(500, 700, 1050), cell(950, 1000, 1050))  # 30% apart, ranges overlap
    wide = summarize(cell_rows("npy", "raw", "fast", {1: [500, 700, 1050], 2: [950, 1000, 1050]}))
    assert best_workers(wide[("npy", "raw", "fast", "torch")]) == 2  # the best marker goes to the better median
    rows = cell_rows("npy", "encoded", "fast", {0: [900, 1000, 1100], 1: [1500, 1600, 1700], 2: [1550, 1650, 1750]})
    summary = summarize(rows)
    by_workers = summary[("npy", "encoded", "fast", "torch")]
    assert best_workers(by_workers) == 1  # nw=2 is fastest (1,650) but inside nw=1's noise
    choice = choose([(("npy", "encoded", "fast", "torch"), w, c) for w, c in by_workers.items()])
    assert choice["fastest"][1] == 2 and [w for _, w, _ in choice["ties"]] == [2]
    # backends: thread at nw=1 ties with torch at nw=1: the DataLoader wins
    rows += cell_rows("npy", "encoded", "fast", {1: [1580, 1640, 1700]}, backend="thread")
    text = "\n".join(verdicts(rows, None))
    assert ("npy encoded fast: num_workers=1: a batch takes 10 ms to read and decode in one process, so 1 worker "
            "overlaps it (transfer costs unmeasured); num_workers=2 measured 1,650/s, within the noise: fewer workers "
            "win the tie") in text
    assert "npy encoded fast: backend torch wins (1,600/s at num_workers=1; thread 1,640/s (nw=1)): a tie within " \
           "the noise with thread: the simpler one wins" in text


def test_a_tie_never_goes_to_a_setting_a_simpler_one_outran() -> None:
    from fastdata.bench.summary import summary_document

    # nw=2 is fastest; nw=1 [thread] is within its noise only through a wide range, and the simpler
    # torch nw=1 measured faster than it: the tie may not go to nw=1 [thread]
    rows = (cell_rows("npy", "raw", "fast", {0: [500, 500, 500], 1: [890, 900, 910], 2: [990, 1000, 1010]})
            + cell_rows("npy", "raw", "fast", {1: [600, 880, 1000]}, backend="thread"))
    recommendation = summary_document(rows, None)["recommendation"]
    assert (recommendation["backend"], recommendation["num_workers"]) == ("torch", 2)
    assert [(t["backend"], t["num_workers"]) for t in recommendation["ties"]] == [("thread", 1)]
    # the same inside one row: its best num_workers
    by_workers = summarize(cell_rows("npy", "raw", "fast", {1: [890, 900, 910], 2: [600, 880, 1000],
                                                              3: [990, 1000, 1010]}))[("npy", "raw", "fast", "torch")]
    assert best_workers(by_workers) == 3
    # a simpler one inside the noise still wins the tie
    assert best_workers(summarize(cell_rows("npy", "raw", "fast", {1: [960, 970, 980], 2: [990, 1000, 1010]}))[
        ("npy", "raw", "fast", "torch")]) == 1


def test_num_workers_0_is_one_measurement_for_every_backend_and_reported_as_such() -> None:
    from fastdata.bench.summary import summary_document

    rows = (cell_rows("npy", "raw", "fast", {0: [990, 1000, 1010], 1: [300, 310, 320]})
            + cell_rows("npy", "raw", "fast", {1: [1010, 1020, 1030]}, backend="thread")
            + cell_rows("npy", "raw", "fast", {1: [700, 720, 740]}, backend="process"))
    summary = summarize(rows)
    assert summary[("npy", "raw", "fast", "thread")][0] is summary[("npy", "raw", "fast", "torch")][0]
    recommendation = summary_document(rows, None)["recommendation"]
    assert (recommendation["backend"], recommendation["num_workers"]) == ("torch", 0)
    assert [(t["backend"], t["num_workers"]) for t in recommendation["ties"]] == [("thread", 1)]  # not nw=0 again
    assert recommendation["text"] == ("use npy raw through fastdata.loader (the fast path) with num_workers=0: 1,000 "
                                      "samples/s (npy raw fast [thread] at num_workers=1 measured 1,020, within the "
                                      "noise: a tie, and fewer workers wins).")
    faster = rows + cell_rows("npy", "raw", "fast", {2: [1190, 1200, 1210]}, backend="thread")
    text = "\n".join(verdicts(faster, None))
    assert ("npy raw fast: backend thread wins (1,200/s at num_workers=2; torch 1,000/s (nw=0); process best at nw=0 "
            "too (the same serial loop)): thread: threads hand each batch over by reference") in text
    assert "nw=0 of a [thread] or [process] row: the torch row's one measurement" in table(rows, None)
    serial_only = cell_rows("npy", "raw", "fast", {0: [990, 1000, 1010]}) + \
        cell_rows("npy", "raw", "fast", {1: [90, 95, 100]}, backend="thread")
    assert "npy raw fast: num_workers=0 on every backend (torch, thread: one serial loop in the calling thread, " \
           "measured once, 1,000/s)" in "\n".join(verdicts(serial_only, None))


def test_recommendation_text_and_summary_fields() -> None:
    from fastdata.bench.summary import MIN_TIMED_BATCHES, summary_document

    rows = (cell_rows("folder", "-", "standard", {0: [900, 1000, 1100], 2: [1900, 2000, 2100]})
            + cell_rows("npy", "raw", "fast", {0: [99000, 100000, 101000], 2: [20000, 21000, 22000]})
            + cell_rows("hdf5", "raw", "fast", {0: [97000, 98500, 100500], 2: [19000, 20000, 21000]})
            + cell_rows("npy", "encoded", "fast", {0: [1000, 1100, 1200], 2: [2300, 2400, 2500]}))
    document = summary_document(rows, "folder")
    recommendation = document["recommendation"]
    assert recommendation["text"] == (
        "use npy raw through fastdata.loader (the fast path) with num_workers=0: 100,000 samples/s, 50x the image "
        "folder at its best; also within the noise: hdf5 raw fast nw=0; if you keep the image folder, use "
        "num_workers=2 (2,000 samples/s).")
    assert {key: recommendation[key] for key in ("format", "store", "read_path", "backend", "num_workers",
                                                 "samples_per_s", "spread", "speedup_over_baseline")} == {
        "format": "npy", "store": "raw", "read_path": "fast", "backend": "torch", "num_workers": 0,
        "samples_per_s": 100000, "spread": 0.01, "speedup_over_baseline": 50.0}
    assert [(t["format"], t["num_workers"]) for t in recommendation["ties"]] == [("hdf5", 0)]
    assert recommendation["baseline"]["num_workers"] == 2 and recommendation["baseline"]["samples_per_s"] == 2000
    folder = next(r for r in document["rows"] if r["format"] == "folder")
    assert folder == {
        "format": "folder", "store": "-", "read_path": "standard", "backend": "torch", "best_num_workers": 2,
        "fastest_num_workers": 2, "tied_num_workers": [],
        "cells": [{"num_workers": w, "status": "ok", "samples_per_s": m, "min_samples_per_s": m - 100,
                   "max_samples_per_s": m + 100, "first_batch_s": 0.01, "wait_fraction": 1.0, "cpu_s": 1.0,
                   "uss_mb": 10.0, "epochs": 3, "samples": 400, "batches": 40, "read_ms": 10 / m * 1000,
                   "spread": round(100 / m, 4)} for w, m in ((0, 1000), (2, 2000))]}
    assert document["warnings"] == [] and document["noise_floor"] == 0.05
    assert document["min_timed_batches"] == MIN_TIMED_BATCHES == 20
    # a tie between a converted format with fewer workers and the folder: the fewer workers win, and it says so
    tied = (cell_rows("folder", "-", "standard", {0: [900, 1000, 1100], 2: [1900, 2000, 2100]})
            + cell_rows("npy", "encoded", "fast", {0: [1950, 1990, 2030], 2: [2000, 2050, 2100]}))
    assert summary_document(tied, "folder")["recommendation"]["text"] == (
        "use npy encoded through fastdata.loader (the fast path) with num_workers=0: 1,990 samples/s, 1.0x the image "
        "folder at its best (npy encoded fast at num_workers=2 measured 2,050, within the noise: a tie, and fewer "
        "workers wins); also within the noise: folder standard nw=2; if you keep the image folder, use "
        "num_workers=2 (2,000 samples/s).")


def test_step_is_kept_apart_from_the_read_cost_and_short_epochs_warn() -> None:
    from fastdata.bench.summary import summary_document

    # nw=0: 9.2 ms read + 20 ms step per batch of 10: 29.2 ms a batch, 31.5% of it waiting for data
    rows = cell_rows("npy", "raw", "fast", {0: [10 / 29.2 * 1000] * 3}, wait=9.2 / 29.2, step_ms=20.0, batches=8)
    document = summary_document(rows, None)
    assert document["rows"][0]["cells"][0]["read_ms"] == pytest.approx(9.2)
    lines = verdicts(rows, None)
    assert lines == ["npy raw fast: num_workers=0: workers only add transfer cost (unmeasured) to a 9.2 ms/batch read",
                     "The simulated training step (20 ms/batch) is not in these read costs: they are the time the "
                     "loop waits for each batch."]
    assert document["warnings"] == [
        "warning: an epoch here is 8 batches (80 samples at batch 10); below 20 batches an epoch is mostly worker "
        "start-up and the first batch, so these rates say little about training. Use a larger dataset or a smaller "
        "--batch-size."]
    one_epoch = summary_document(cell_rows("npy", "raw", "fast", {0: [100.0]}), None)
    assert one_epoch["warnings"] == [
        "warning: one measured epoch per configuration shows no noise; differences under 5% are called ties, larger "
        "ones may be noise too. Use --epochs 3."]


CONVERSION_FAILED = "failed: conversion failed: field 'masks' has shape (5, 79, 92); the first samples have (K, 95, 102)"


def plotted_rows() -> list[dict]:
    """Four datasets read several ways; every configuration of one failed, and one cell of another."""
    return (cell_rows("folder", "-", "standard", {0: [900, 1000, 1100], 1: [1400, 1500, 1600], 2: [1900, 2000, 2100]})
            + cell_rows("npy", "raw", "fast", {0: [99000, 100000, 101000], 1: [20000, 21000, 22000]})
            + cell_rows("npy", "raw", "fast", {1: [59000, 60000, 61000]}, backend="thread")
            + cell_rows("npy", "raw", "fast", {1: [39000, 40000, 41000]}, backend="process")
            + cell_rows("npy", "raw", "standard", {0: [49000, 50000, 51000], 1: [19000, 20000, 21000]})
            + [dict(r, status="failed: RuntimeError: DataLoader worker (pid 7) is killed by signal: Killed.")
               for r in cell_rows("npy", "raw", "standard", {2: [1.0]})]
            + cell_rows("hdf5", "raw", "fast", {0: [99000, 100000, 101000], 1: [20000, 21000, 22000]})
            + [dict(r, status=CONVERSION_FAILED) for r in cell_rows("hdf5", "encoded", "fast", {0: [1.0], 1: [1.0]})
               + cell_rows("hdf5", "encoded", "standard", {0: [1.0], 1: [1.0]})])


def test_plot_says_it_at_a_glance() -> None:
    pytest.importorskip("matplotlib")
    from fastdata.bench.plot import figure

    rows = plotted_rows()
    fig = figure(rows, title="t", baseline="folder")
    bars, legend, *panels = fig.axes  # no step simulated: no data-wait panels
    assert [ax.get_title() for ax in panels] == ["folder", "hdf5 raw", "npy raw"]  # one per dataset drawn
    labels = [t.get_text() for t in bars.get_yticklabels()]
    assert labels == ["folder standard", "hdf5 encoded fast", "hdf5 encoded standard", "hdf5 raw fast",
                      "npy raw fast", "npy raw fast [process]", "npy raw fast [thread]", "npy raw standard"]
    failed_colour = bars.get_yticklabels()[1].get_color()
    assert failed_colour == bars.get_yticklabels()[2].get_color() != bars.get_yticklabels()[0].get_color()
    reason = "failed: conversion failed: field 'masks' has shape (5, 79, 92); the first samples have (K, [...]"
    assert [t.get_text() for t in bars.texts] == [
        "2,000/s at nw=2 (baseline)", reason, reason,  # a tie below: the first name wins
        "100,000/s at nw=0, 50x folder  <- recommended", "100,000/s at nw=0, 50x folder",
        # a backend row's bar: its best with workers, never the serial loop it shares at nw=0
        "40,000/s at nw=1, 20x folder; below nw=0's serial loop (100,000/s)",
        "60,000/s at nw=1, 30x folder; below nw=0's serial loop (100,000/s)", "50,000/s at nw=0, 25x folder"]
    npy = {line.get_label(): line for line in panels[2].get_lines() if not line.get_label().startswith("_")}
    assert list(npy) == ["npy raw fast", "npy raw fast [process]", "npy raw fast [thread]", "npy raw standard"]
    assert len({(line.get_color(), line.get_marker()) for line in npy.values()}) == 4  # no two alike in a panel
    assert list(npy["npy raw fast [thread]"].get_xdata()) == [1]  # nw=0 is the DataLoader row's one measurement
    assert list(npy["npy raw standard"].get_xdata()) == [0, 1]  # nw=2 failed: left out, listed under the plot
    hdf5 = next(line for line in panels[1].get_lines() if line.get_label() == "hdf5 raw fast")
    assert (hdf5.get_color(), hdf5.get_marker()) == (npy["npy raw fast"].get_color(), npy["npy raw fast"].get_marker())
    stars = [(list(s.get_xdata()), list(s.get_ydata())) for s in panels[2].get_lines() if s.get_label() == "_best"]
    assert stars == [([0], [100000]), ([1], [40000]), ([1], [60000]), ([0], [50000])]
    assert [t.get_text() for t in legend.get_legend().get_texts()] == [
        "standard: DataLoader(ds, batch_size), per-sample reads", "fast: fastdata.loader, DataLoader workers",
        "fast, thread backend", "fast, process backend", "nw=0 of the fast path: one serial loop, any backend",
        "folder at its best (baseline)"]
    assert fig.get_supxlabel() == (
        "5 configurations failed (not drawn):\n"
        "  hdf5 encoded (all 4): conversion failed: field 'masks' has shape (5, 79, 92); the first samples have (K, 95, "
        "102)\n"
        "  npy raw standard nw=2: RuntimeError: DataLoader worker (pid 7) is killed by signal: Killed.")
    stepped = figure([dict(r, wait_fraction=0.3, step_ms=20.0) for r in rows], title="t", baseline="folder", step=True)
    assert len(stepped.axes) == 2 + 2 * 3 and stepped.axes[5].get_ylabel() == "data-wait share of the loop"
    assert figure([dict(r, status="failed: x") for r in rows], baseline="folder") is None


def test_failed_configurations_lead_the_report_and_the_summary() -> None:
    from fastdata.bench.summary import summary_document

    document = summary_document(plotted_rows(), "folder")
    assert document["configurations"] == 16  # nw=0 of a backend row is the DataLoader row's cell: counted once
    assert [(f["format"], f["store"], f["read_path"], f["num_workers"]) for f in document["failed"]] == [
        ("hdf5", "encoded", "fast", 0), ("hdf5", "encoded", "fast", 1), ("hdf5", "encoded", "standard", 0),
        ("hdf5", "encoded", "standard", 1), ("npy", "raw", "standard", 2)]
    assert document["failed"][0]["reason"] == CONVERSION_FAILED.removeprefix("failed: ")
    assert document["warnings"][0] == (
        "warning: 5 of 16 configurations failed (the table's 'failed' cells; listed under the plot); the "
        "recommendation is made from the other 11:\n"
        "  hdf5 encoded (all 4): conversion failed: field 'masks' has shape (5, 79, 92); the first samples have "
        "(K, 95, 102)\n"
        "  npy raw standard nw=2: RuntimeError: DataLoader worker (pid 7) is killed by signal: Killed.")
    clean = [r for r in plotted_rows() if r["status"] == "ok"]
    assert summary_document(clean, "folder")["failed"] == [] and summary_document(clean, "folder")["warnings"] == []


def test_mixed_sizes_are_refused_before_anything_is_measured(mixed_folder: Path, tmp_path: Path) -> None:
    from fastdata.errors import ShapeMismatchError

    config = BenchConfig(formats=("folder", "npy"), stores=("raw", "encoded"), workers=(0,), batch_size=4, epochs=1)
    with pytest.raises(ShapeMismatchError, match=r"cat/a\.png is 20x30 \(HxW\) but .*cat/B\.JPG is 25x18; every batch "
                                                 r"the benchmark reads needs one image size\. Use --resize HxW"):
        run_bench(mixed_folder, config, tmp_path / "out")
    assert not (tmp_path / "out" / "datasets").exists() and not (tmp_path / "out" / "results.json").exists()
    result = run_fastdata("bench", mixed_folder, "--formats", "folder,npy", "--num-workers", "0", "--out",
                          tmp_path / "cli", "--quiet")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("fastdata: error: ") and "Use --resize HxW" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "cli" / "throughput.png").exists()


BROKEN = '''
import torch

class Broken(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        raise ValueError("sample unreadable")

dataset = Broken()
'''


def test_cli_exits_1_when_every_configuration_failed(tmp_path: Path) -> None:
    (tmp_path / "brokenset.py").write_text(BROKEN)
    command = ["bench", "brokenset:dataset", "--num-workers", "0", "--epochs", "1", "--warmup", "0", "--batch-size",
               "4", "--out", tmp_path / "out", "--quiet"]
    env = {"PYTHONPATH": str(tmp_path)}
    result = run_fastdata(*command, env=env, cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == "", result.stderr
    table = [line.split() for line in result.stderr.splitlines()]
    assert ["Broken", "fast", "failed"] in table and ["Broken", "standard", "failed"] in table
    assert "fastdata: error: every configuration failed (see the table above); nothing to recommend." in result.stderr
    assert "throughput.png" not in result.stderr and not (tmp_path / "out" / "throughput.png").exists()
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["summary"]["recommendation"] is None
    assert {r["status"] for r in data["rows"]} == {"failed: ValueError: sample unreadable"}
    as_json = run_fastdata(*command, "--json", env=env, cwd=tmp_path)
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["summary"]["recommendation"] is None
    assert as_json.stderr.startswith("fastdata: error: every configuration failed; nothing to recommend.")


def test_run_bench_is_public_and_the_documented_example_runs(tmp_path: Path, monkeypatch, capsys) -> None:
    import fastdata.bench

    assert {"run_bench", "bench_dataset", "BenchConfig", "BenchResult"} <= set(fastdata.bench.__all__)
    assert "results.json" in fastdata.bench.run_bench.__doc__
    docs = (Path(__file__).parent.parent / "docs" / "benchmarking.md").read_text()
    example = docs.split("<!-- example: run_bench -->\n```python\n")[1].split("```")[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "docs/benchmarking.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("use ") and printed[1] in {"0", "1"}
    assert (tmp_path / "bench-out" / "results.json").exists()


def test_one_line_says_what_fastdatas_backends_change() -> None:
    from fastdata.bench.summary import summary_document

    rows = (cell_rows("npy", "raw", "fast", {0: [990, 1000, 1010], 1: [70, 80, 90], 2: [50, 60, 70]})
            + cell_rows("npy", "raw", "fast", {1: [860, 880, 900], 2: [840, 850, 860]}, backend="process")
            + cell_rows("npy", "raw", "fast", {1: [890, 900, 910], 2: [900, 910, 920]}, backend="thread")
            + cell_rows("npy", "encoded", "fast", {0: [90, 100, 110], 2: [120, 130, 140]})
            + cell_rows("npy", "encoded", "fast", {2: [180, 190, 200]}, backend="process"))
    effect = summary_document(rows, None)["backends"]  # the recommended row: npy raw (nw=0)
    assert effect == {
        "format": "npy", "store": "raw", "read_path": "fast", "num_workers": 2, "serial_samples_per_s": 1000,
        "samples_per_s": {"torch": 60, "process": 850, "thread": 910},
        "ratio_to_serial": {"torch": 0.06, "process": 0.85, "thread": 0.91},
        "text": "on npy raw fast at 2 workers, fastdata's thread backend keeps 0.91x the rate of num_workers=0 and "
                "its process backend 0.85x, where the DataLoader's workers keep 0.06x."}
    encoded = [r for r in rows if r["store"] == "encoded"]
    assert summary_document(encoded, None)["backends"]["text"] == (
        "on npy encoded fast at 2 workers, fastdata's process backend reaches 1.90x the rate of num_workers=0, where "
        "the DataLoader's workers reach 1.30x.")
    torch_only = [r for r in rows if r["backend"] == "torch"]
    assert summary_document(torch_only, None)["backends"] is None  # nothing to compare: no line


def test_recommendation_prefers_the_dataloader_and_the_source_as_it_is_in_a_tie() -> None:
    from fastdata.bench.summary import summary_document

    backends = (cell_rows("npy", "raw", "fast", {0: [900, 1000, 1100], 1: [1900, 2000, 2100]})
                + cell_rows("npy", "raw", "fast", {1: [2000, 2060, 2120]}, backend="process"))
    assert summary_document(backends, None)["recommendation"]["text"] == (
        "use npy raw through fastdata.loader (the fast path) with num_workers=1: 2,000 samples/s (npy raw fast "
        "[process] at num_workers=1 measured 2,060, within the noise: a tie, and the DataLoader backend wins).")
    folder = (cell_rows("folder", "-", "standard", {0: [1900, 2000, 2100]})
              + cell_rows("npy", "encoded", "fast", {0: [2000, 2050, 2100]}))
    assert summary_document(folder, "folder")["recommendation"]["text"] == (
        "use the image folder through a plain DataLoader (the standard path) with num_workers=0: 2,000 samples/s "
        "(npy encoded fast at num_workers=0 measured 2,050, within the noise: a tie, and no conversion wins).")


def test_memory_peak_counts_shared_memory_that_no_process_has_mapped() -> None:
    """A DataLoader worker unmaps a batch once it is sent: PSS cannot see it, ``peak_shm`` can."""
    from multiprocessing import shared_memory

    from fastdata.bench.measure import MemoryPeak

    size = 32 * 2**20
    with MemoryPeak() as peak:
        peak.sample()
        pss_before = peak.peak_pss
        block = shared_memory.SharedMemory(create=True, size=size)
        try:
            pages = np.frombuffer(block.buf, dtype=np.uint8)
            pages[:] = 1
            del pages
            block.close()  # written, then unmapped: in no process's PSS, still in /dev/shm
            peak.sample()
        finally:
            block.unlink()
    assert peak.peak_shm >= 0.95 * size  # machine-wide: other programs' shared memory comes and goes
    assert peak.peak_pss - pss_before < size / 2


def test_memory_is_sampled_over_a_second_of_short_epochs() -> None:
    """One 5 ms epoch would be sampled once: a loader's short-lived batches would go unseen.
    ``memory_s=0`` (``--memory-s 0``) samples one epoch."""
    import torch
    from torch.utils.data import TensorDataset

    import fastdata
    from fastdata.bench.config import MEMORY_MIN_S, Case
    from fastdata.bench.measure import MEMORY_INTERVAL_S, sample_memory

    class Counted(TensorDataset):
        reads = 0

        def __getitem__(self, index):  # the loader asks for a whole batch at once (an array of indices)
            Counted.reads += np.size(index)
            return super().__getitem__(index)

    loader = fastdata.loader(Counted(torch.zeros(64, 3)), batch_size=16)
    case = Case(format="probe", store="raw", path="fast", num_workers=0, dataset_path="")
    sampler = sample_memory(loader, BenchConfig(), case)
    # more than the one sample a single epoch gets (how many fit into MEMORY_MIN_S depends on the machine)
    assert MEMORY_MIN_S > MEMORY_INTERVAL_S and sampler.samples >= 2 and sampler.peak_pss > 0
    assert Counted.reads % 64 == 0 and Counted.reads >= 128
    Counted.reads = 0
    assert sample_memory(loader, BenchConfig(memory_s=0), case).peak_pss > 0 and Counted.reads == 64
    for wrong in (-1, float("inf")):
        with pytest.raises(InvalidOptionError, match=rf"Invalid --memory-s {wrong}. Use 0 \(one epoch\) or a number of seconds."):
            BenchConfig(memory_s=wrong)


def test_the_recommendation_says_how_to_train_with_it() -> None:
    from fastdata.bench.advice import how_to_use

    config = BenchConfig(formats=("npy",), stores=("raw",), workers=(0, 2), batch_size=128, resize="32x32",
                         persistent_workers=True)
    picked = {"format": "npy", "store": "raw", "read_path": "fast", "backend": "process", "num_workers": 2}
    assert how_to_use(picked, source="./photos", config=config, baseline="folder", converted=False) == {
        "convert": "fastdata convert ./photos out/photos.npy --store raw --resize 32x32",
        "python": ["import fastdata, torch", 'ds = fastdata.open_dataset("out/photos.npy")',
                   "loader = fastdata.loader(ds, batch_size=128, shuffle=True, num_workers=2, backend='process', "
                   "persistent_workers=True)"]}
    encoded_tar = dict(picked, format="tar", store="encoded", backend="torch", num_workers=0)
    assert how_to_use(encoded_tar, source="torchvision:CIFAR10", config=config, baseline="torchvision",
                      converted=False, root="~/data") == {
        "convert": "fastdata convert torchvision:CIFAR10 out/cifar10.tar --root ~/data --store encoded",
        "python": ["import fastdata, torch",
                   'ds = fastdata.open_dataset("out/cifar10.tar", resize=(32, 32), batch_size=128)',
                   "loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)  # ds collates each batch"]}
    folder = {"format": "folder", "store": "-", "read_path": "standard", "backend": "torch", "num_workers": 1}
    assert how_to_use(folder, source="photos", config=config, baseline="folder", converted=False)["python"][1:] == [
        'ds = fastdata.FolderDataset("photos", resize=(32, 32))  # the folder as it is, read like ImageFolder',
        "loader = torch.utils.data.DataLoader(ds, batch_size=128, shuffle=True, num_workers=1, persistent_workers=True)"]
    mine = how_to_use(dict(folder, format="Mine"), source="mydata:train_set", config=config, baseline=None,
                      converted=False)
    assert mine["convert"] is None and mine["python"][1] == "from mydata import train_set as ds"
    already = how_to_use(dict(picked, store="raw"), source="out/coco.npy", config=config, baseline="npy", converted=True)
    assert already["convert"] is None and already["python"][1] == 'ds = fastdata.open_dataset("out/coco.npy")'
    remote = how_to_use(picked, source="s3://bkt/d.tar", config=config, baseline="tar", converted=False)
    assert remote["convert"] == "fastdata convert s3://bkt/d.tar out/d.npy --store raw --resize 32x32"


def test_the_demo_report_gives_the_commands_for_the_users_own_folder(uniform_folder: Path, tmp_path: Path) -> None:
    from fastdata.cli.bench import report_text

    config = BenchConfig(formats=("folder", "npy"), stores=("raw",), workers=(0,), backends=("torch",), **TINY)
    result = run_bench(uniform_folder, config, tmp_path / "out")
    picked = result.summary["recommendation"]
    assert picked["how"]["python"][0] == "import fastdata, torch"
    text = report_text(result, str(uniform_folder), config, usage_source="./my-images")
    how = text.split("how, for your own image folder (./my-images):\n", 1)[1].split("\n")
    if picked["format"] == "npy":
        assert how[0] == "  fastdata convert ./my-images out/my-images.npy --store raw --resize 6x5"
    else:
        assert how[1] == '  ds = fastdata.FolderDataset("./my-images", resize=(6, 5))  # the folder as it is, read like ImageFolder'
    assert str(uniform_folder) not in "\n".join(how[:4])


WORKERS_FAIL = '''
import torch
from torch.utils.data import get_worker_info

class OnlyInProcess(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        if get_worker_info() is not None:
            raise ValueError("no workers here")
        return torch.zeros(3), index

dataset = OnlyInProcess()
'''


def test_cli_exits_1_when_some_configurations_failed(tmp_path: Path) -> None:
    (tmp_path / "halfset.py").write_text(WORKERS_FAIL)
    command = ["bench", "halfset:dataset", "--num-workers", "0,1", "--epochs", "1", "--warmup", "0", "--batch-size",
               "4", "--backends", "torch", "--out", tmp_path / "out", "--quiet", "--memory-s", "0"]
    env = {"PYTHONPATH": str(tmp_path)}
    result = run_fastdata(*command, env=env, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "\nrecommendation: use OnlyInProcess through" in result.stdout  # what was measured is reported
    assert ("warning: 2 of 4 configurations failed (the table's 'failed' cells; listed under the plot); the "
            "recommendation is made from the other 2:\n  OnlyInProcess fast nw=1; OnlyInProcess standard nw=1: "
            "ValueError: Caught ValueError in DataLoader worker process 0.") in result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        f"fastdata: error: 2 of 4 configurations failed (see the table above; each reason is in the warning); the "
        f"others were measured and are in {tmp_path / 'out' / 'results.json'}")
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [(f["read_path"], f["num_workers"]) for f in data["summary"]["failed"]] == [("fast", 1), ("standard", 1)]
    as_json = run_fastdata(*command, "--json", env=env, cwd=tmp_path)
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["summary"]["configurations"] == 4
