"""fastdata.sweep, fastdata.tune and ``fastdata tune``: any Dataset, import strings, the model's
decisions (a dominating step, the GIL, spawn without pickling), the JSON and the CLI."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import TensorDataset

import fastdata
from conftest import run_fastdata
from fastdata.errors import InvalidOptionError
from fastdata.importing import is_import_string, load_dataset
from fastdata.loading import BACKENDS
import fastdata.bench.explain
from fastdata.tuning import Measurements, Spread, predict

ROW_FIELDS = ["format", "store", "read_path", "num_workers", "epoch", "warmup", "samples_per_s", "first_batch_s",
              "wait_fraction", "cpu_s", "uss_mb", "status", "backend"]
JSON_FIELDS = ["backend", "num_workers", "batch_size", "persistent_workers", "prefetch_factor", "pin_memory",
               "predicted_samples_per_s", "measured_samples_per_s", "measurements", "loader_kwargs", "explanation"]
MEASURED = ["fetch_ms", "transfer_ms", "startup_s", "step_ms", "usable_cores", "cpu_count", "thread_speedup"]


def tensor_dataset(count: int = 2000) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(count, 10, generator=generator), torch.arange(count))


class SlowBatches(torch.utils.data.Dataset):
    """Batches that take ``fetch_s`` to read, like I/O (the sleep releases the GIL)."""

    supports_index_arrays = True

    def __init__(self, count: int, fetch_s: float):
        self.count, self.fetch_s = count, fetch_s

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, indices):
        time.sleep(self.fetch_s)
        indices = torch.as_tensor(indices)
        return torch.zeros(len(indices), 8), indices


class WithLambda(TensorDataset):
    def __init__(self):
        super().__init__(torch.zeros(512, 4), torch.arange(512))
        self.transform = lambda x: x  # cannot be pickled: spawn workers could not receive it


# --- import strings ------------------------------------------------------------------------------


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch) -> str:
    (tmp_path / "userdata.py").write_text(
        "import torch\nfrom torch.utils.data import TensorDataset\n"
        "dataset = TensorDataset(torch.arange(100.0).reshape(50, 2), torch.arange(50))\n"
        "def make():\n    return TensorDataset(torch.zeros(7, 1), torch.arange(7))\n"
        "def needs(n):\n    return n\n"
        "class Holder:\n    inner = dataset\n"
        "number = 3\n"
        "def step(batch):\n    pass\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "userdata", raising=False)
    return "userdata"


def test_import_strings_name_datasets_and_factories(user_module: str) -> None:
    assert len(load_dataset(f"{user_module}:dataset")) == 50
    assert len(load_dataset(f"{user_module}:make")) == 7  # a zero-argument callable is called
    assert len(load_dataset(f"{user_module}:Holder.inner")) == 50  # dotted attributes
    assert is_import_string("pkg.mod:name") and not is_import_string("torchvision:MNIST")
    assert not is_import_string("folder/with/no/colon")


def test_import_string_errors_say_what_failed(user_module: str, tmp_path: Path) -> None:
    cases = {
        "no_such_module_xyz:data": "Cannot import module 'no_such_module_xyz' for the dataset 'no_such_module_xyz:data': no such module",
        f"{user_module}:missing": f"Module '{user_module}' has no attribute 'missing' (the dataset '{user_module}:missing').",
        f"{user_module}:number": f"'{user_module}:number' is a int, not a map-style Dataset (it needs __getitem__ and __len__).",
        f"{user_module}:needs": f"'{user_module}:needs' is callable but calling it with no arguments failed",
    }
    for text, message in cases.items():
        with pytest.raises(InvalidOptionError) as info:
            load_dataset(text)
        assert message in str(info.value), text
    # a path that exists is a path, even when it looks like an import string
    (tmp_path / "weird:name").mkdir()
    assert not is_import_string("weird:name")


# --- sweep ---------------------------------------------------------------------------------------


def test_sweep_returns_bench_rows_for_any_dataset() -> None:
    rows = fastdata.sweep(tensor_dataset(1000), batch_size=100, workers=[0, 1], backends=["torch", "thread"],
                          epochs=1, warmup=1, step=lambda batch: None, memory_s=0)
    assert all(list(row)[:len(ROW_FIELDS)] == ROW_FIELDS for row in rows)
    assert {row["status"] for row in rows} == {"ok"}
    probes = [row for row in rows if row["format"] == "probe"]  # the hand-over of a real batch, nw=0 and nw=1
    assert {(row["read_path"], row["num_workers"]) for row in probes} == {("transfer", 0), ("transfer", 1)}
    rows = [row for row in rows if row["format"] != "probe"]
    assert all(row["path"] == row["read_path"] for row in rows)  # the deprecated name, kept for a release
    cells = {(row["read_path"], row["backend"], row["num_workers"]) for row in rows}
    assert cells == {("fast", "torch", 0), ("fast", "torch", 1), ("fast", "thread", 1),
                     ("standard", "torch", 0), ("standard", "torch", 1)}
    assert {row["format"] for row in rows} == {"TensorDataset"}
    measured = [row for row in rows if not row["warmup"]]
    assert len(measured) == 5 and all(row["samples"] == 1000 and row["batches"] == 10 for row in measured)


def test_sweep_refuses_what_it_cannot_measure() -> None:
    with pytest.raises(InvalidOptionError, match="Unknown path 'slow'"):
        fastdata.sweep(tensor_dataset(10), paths=["slow"])
    with pytest.raises(InvalidOptionError, match="needs a map-style Dataset"):
        fastdata.sweep(object())
    with pytest.raises(InvalidOptionError, match="Unknown --backends 'gpu'"):
        fastdata.sweep(tensor_dataset(10), backends=["gpu"])


# --- the model -------------------------------------------------------------------------------------


def measurements(**overrides) -> Measurements:
    values = dict(batch_size=32, samples=10000, batches_per_epoch=313, batch_bytes=1408, fetch_ms=0.02,
                  loop_ms=0.03, standard_fetch_ms=1.0, step_ms=0.0, step_cpu_ms=0.0, thread_speedup=1.9,
                  transfer_ms={"torch": 1.4, "thread": 0.01, "process": 0.05}, startup_s={"torch": 0.03,
                  "thread": 0.002, "process": 0.03}, usable_cores=8, cpu_count=8, start_method="fork",
                  pickle_error=None, cuda=False)
    values.update(overrides)
    return Measurements(**values)


def test_the_model_prices_the_hand_over_and_the_cores() -> None:
    cheap = measurements()
    assert predict(cheap, "torch", 0)[0] == pytest.approx(32 / 0.03 * 1000)
    # a 0.02 ms fetch cannot pay for a 1.4 ms hand-over: every DataLoader worker count is slower
    assert all(predict(cheap, "torch", n)[0] < predict(cheap, "torch", 0)[0] for n in range(1, 9))
    costly = measurements(fetch_ms=10.0, loop_ms=10.0)
    rates = [predict(costly, "process", n)[0] for n in range(1, 11)]
    assert rates[3] == pytest.approx(4 * rates[0], rel=0.01)  # scales with workers ...
    assert rates[9] == pytest.approx(rates[7])  # ... up to the usable cores
    gil = measurements(fetch_ms=10.0, loop_ms=10.0, thread_speedup=1.0)
    assert predict(gil, "thread", 4)[0] == pytest.approx(predict(gil, "thread", 1)[0])  # the GIL serialises
    stepped = measurements(fetch_ms=10.0, loop_ms=10.0, step_ms=50.0)
    assert predict(stepped, "torch", 0)[1] == pytest.approx(10 / 60)
    assert predict(stepped, "process", 1)[1] < 0.05


def test_the_tie_goes_to_the_simplest_candidate_no_simpler_one_outran() -> None:
    from fastdata.tuning.model import candidate_rows, pick_best

    def row(backend, workers, rate, wait=0.5):
        return {"backend": backend, "num_workers": workers, "measured_samples_per_s": rate, "wait_fraction": wait,
                "predicted_samples_per_s": 1.0, "predicted_wait_fraction": 1.0}

    m = measurements()
    tied = [row("torch", 0, 960), row("thread", 1, 1000), row("process", 1, 990)]
    assert (pick_best(tied, m)["backend"], pick_best(tied, m)["num_workers"]) == ("torch", 0)  # within 5%: the simplest
    apart = [row("torch", 0, 900), row("thread", 1, 1000)]
    assert pick_best(apart, m)["num_workers"] == 1
    # with a dominating step: the fewest workers that keep the wait under 5%, unless a simpler one measured faster
    stepped = measurements(step_ms=50.0)
    calm = [row("torch", 0, 800, wait=0.3), row("thread", 1, 1000, wait=0.01), row("thread", 2, 1010, wait=0.01)]
    assert pick_best(calm, stepped)["num_workers"] == 1
    outran = [row("torch", 0, 1000, wait=0.3), row("thread", 1, 900, wait=0.01), row("process", 2, 700, wait=0.01)]
    assert (pick_best(outran, stepped)["backend"], pick_best(outran, stepped)["num_workers"]) == ("torch", 0)
    # num_workers=0 is one candidate, whatever the backends: the same serial loop on each
    rows = candidate_rows(m, ("thread", "process"), 2)
    serial = [r for r in rows if r["num_workers"] == 0]
    assert len(serial) == 1 and serial[0]["same_for_backends"] == ["torch", "thread", "process"]
    assert [(r["backend"], r["num_workers"]) for r in rows[1:]] == [("thread", 1), ("thread", 2), ("process", 1),
                                                                      ("process", 2)]
    assert candidate_rows(m, ("thread",), 1)[0]["same_for_backends"] == ["torch", "thread"]


# --- noise: what cannot be trusted ---------------------------------------------------------------------


def test_repeats_continue_while_noisy_or_implausible_up_to_a_limit() -> None:
    from fastdata.tuning.noise import MAX_REPEATS, NOISY, REPEATS, Spread, repeat

    assert (REPEATS, MAX_REPEATS, NOISY) == (3, 6, 0.25)
    steady = Spread((10.0, 10.5, 9.8))
    assert (steady.median, steady.low, steady.high, steady.noisy) == (10.0, 9.8, 10.5, False)
    assert Spread((1.0, 2.0, 3.0)).relative == 0.5 and Spread((1.0, 2.0, 3.0)).noisy
    wide = Spread((1.0,) + (2.0,) * 8 + (50.0,))  # 10 values: the 10th to 90th percentile, not min..max
    assert (wide.low, wide.high) == (1.9, pytest.approx(6.8))

    def calls(values: list[float], **kwargs) -> tuple[int, Spread]:
        feed = iter(values)
        spread = repeat(lambda: next(feed), **kwargs)
        return len(spread.values), spread

    assert calls([10.0, 10.5, 9.8, 99.0])[0] == 3  # steady: three repeats are enough
    assert calls([10.0, 10.0, 30.0, 10.0, 10.0, 10.0, 99.0])[0] == 6  # noisy: more repeats, at most six
    count, ratio = calls([6.9, 6.8, 1.9, 1.9, 1.9, 1.85, 99.0], plausible=lambda value: value <= 2.3)
    assert count == 6 and ratio.median == 1.9  # implausible (above 2x on 2 cores): measured again


def noisy_measurements() -> Measurements:
    from fastdata.tuning.noise import Spread

    spreads = {"noise": Spread((0.001,) * 15 + (0.009,) * 5), "fetch_ms": Spread((30.0, 31.0, 1710.0)),
               "transfer_ms.torch": Spread((-0.2, 0.1, 0.6)), "transfer_ms.process": Spread((1.0, 1.1, 1.2)),
               "thread_speedup": Spread((6.9, 6.8, 7.0)), "startup_s.torch": Spread((0.011, 0.011, 0.012)),
               "startup_s.process": Spread((0.04, 0.05, 0.2))}
    return measurements(fetch_ms=31.0, loop_ms=32.0, thread_speedup=2.0, usable_cores=2, cpu_count=2,
                        transfer_ms={"torch": 0.1, "process": 1.1}, startup_s={"torch": 0.011, "process": 0.05},
                        spreads=spreads)


def test_figures_noise_makes_untrustworthy_are_flagged_never_printed_as_measured() -> None:
    from fastdata.cli.tune import measured_table
    from fastdata.tuning.noise import doubts

    m = noisy_measurements()
    assert doubts(m) == [
        "this machine is busy: the same 1.0 ms of work took 1.0-9.0 ms across 20 runs (+-400%), so every figure "
        "here may be off by as much",
        "the fetch per batch varied from 30 ms to 1,710 ms across 3 calls (+-2710%)",
        "the torch hand-over per batch is below what this machine resolves (-0.2 to +0.6 ms across 3 repeats): "
        "taken as 0",
        "starting one process worker took from 40 ms to 200 ms across 3 starts (+-160%)",
        "2 threads fetched 6.90x as fast as one, more than the 2x that 2 threads on 2 usable cores can reach: "
        "noise; taken as 2.00x"]
    table = dict(measured_table(m))
    assert table["hand-over per batch, torch"] == "below the noise (-0.2 to +0.6 ms over 3 repeats)"
    assert table["hand-over per batch, process"] == "1.1 ms +-9% (3 repeats)"
    assert table["2 threads fetching vs 1 (GIL)"] == "2.00x (measured 6.90x, above the 2x 2 threads can reach: noise)"
    assert table["machine noise"] == "1.0 ms of fixed work took 1.0-9.0 ms (20 runs; busy)"
    assert "0.000 ms" not in "\n".join(table.values())
    assert m.hand_over_below_noise == {"torch"}
    assert "too little to tell from this machine's noise for DataLoader workers" in fastdata.bench.explain.tune_paragraph(
        m, SimpleNamespace(num_workers=0, backend="torch", persistent_workers=False, conversion=None))
    quiet = measurements(spreads={"noise": Spread((0.001, 0.00101, 0.00099)), "fetch_ms": Spread((1.0, 1.01, 0.99))})
    assert doubts(quiet) == []


def test_a_close_choice_on_a_busy_machine_is_called_unsettled_and_start_up_adds_up() -> None:
    from fastdata.bench.explain import startup_sentence
    from fastdata.tuning.noise import Spread, choice_doubt

    rows = [{"backend": "torch", "num_workers": 0, "measured_samples_per_s": 1000.0},
            {"backend": "thread", "num_workers": 2, "measured_samples_per_s": 1100.0}, {"backend": "process",
                                                                                       "num_workers": 1}]
    busy, quiet = Spread((1.0, 1.0, 1.6)), Spread((1.0, 1.0, 1.01))
    assert choice_doubt(rows, "thread", 2, busy) == (
        "the recommended thread num_workers=2 probed at 1,100 samples/s and num_workers=0 at 1,000: closer than this "
        "machine's noise (+-30%), so which is faster is not settled")
    assert choice_doubt(rows, "thread", 2, quiet) is None
    assert choice_doubt([rows[0], dict(rows[1], measured_samples_per_s=5000.0)], "thread", 2, busy) is None
    # one worker's start-up, measured, and what all of them cost together: the same numbers, said once
    assert startup_sentence("process", 2, 0.011, 0.112) == (
        "Starting 2 worker processes takes about 22 ms (2 x 11 ms, measured for one); persistent_workers=True pays "
        "that once instead of at the start of every epoch (an epoch takes about 112 ms).")
    assert startup_sentence("torch", 1, 0.011, 2.5).startswith("Starting 1 DataLoader worker takes about 11 ms; ")


# --- tune --------------------------------------------------------------------------------------------


def test_tune_recommends_settings_that_load_every_sample_once() -> None:
    dataset = tensor_dataset(2000)
    recommendation = fastdata.tune(dataset, batch_size=32, budget_s=8)
    assert recommendation.backend in BACKENDS and recommendation.num_workers >= 0
    assert recommendation.budget_s == 8 and recommendation.elapsed_s > 0  # no timed assert: the machine is shared
    assert recommendation.measured_samples_per_s > 0
    seen = torch.cat([labels for _, labels in recommendation.make_loader(dataset)])
    assert sorted(seen.tolist()) == list(range(2000))
    kwargs = recommendation.loader_kwargs
    assert kwargs["batch_size"] == 32 and kwargs["num_workers"] == recommendation.num_workers
    document = json.loads(json.dumps(recommendation.to_dict()))
    assert all(name in document for name in JSON_FIELDS)
    assert all(name in document["measurements"] for name in MEASURED)
    assert document["conversion"] == {"skipped": "no convert_source was given: a conversion is predicted for an image "
                                                 "folder or a torchvision source"}
    assert recommendation.explain().startswith("num_workers=0: a batch of 32 takes ")
    spreads = document["measurements"]["spreads"]  # every figure with its repeats, and the machine's own noise
    assert {"noise", "fetch_ms", "thread_speedup"} <= set(spreads)
    assert {f"transfer_ms.{b}" for b in recommendation.measurements.transfer_ms} <= set(spreads)
    assert spreads["noise"]["repeats"] == 20 and 3 <= spreads["thread_speedup"]["repeats"] <= 6
    assert document["doubts"] == recommendation.doubts() and isinstance(document["doubts"], list)


def test_the_conversion_probe_runs_however_small_the_budget(uniform_folder: Path) -> None:
    dataset = fastdata.FolderDataset(uniform_folder)  # 12 images of one size
    recommendation = fastdata.tune(dataset, batch_size=4, budget_s=0.01, convert_source=str(uniform_folder))
    assert any(row.get("skipped") == "budget" for row in recommendation.candidates)  # the budget was spent ...
    conversion = recommendation.conversion  # ... and the probe conversion ran all the same, bounded by its work
    assert {key: conversion[key] for key in ("format", "store", "probe_samples")} == {
        "format": "npy", "store": "raw", "probe_samples": 12}
    assert conversion["fetch_ms"] > 0 and conversion["predicted_samples_per_s"] > 0
    assert conversion["backend"] in BACKENDS and conversion["predicted_conversion_s"] > 0
    assert json.loads(json.dumps(recommendation.to_dict()))["conversion"] == conversion


def test_a_dominating_step_gets_the_fewest_workers_that_keep_the_wait_under_5_percent() -> None:
    # fetching a batch takes 20 ms: alone it would leave the loop waiting 20 / (20 + 50) = 29% of the time
    recommendation = fastdata.tune(SlowBatches(4000, 0.02), batch_size=16, step=50, budget_s=12)
    assert recommendation.num_workers == 1, recommendation.candidates
    assert recommendation.wait_fraction < 0.05
    serial = next(row for row in recommendation.candidates if row["num_workers"] == 0)
    assert serial["wait_fraction"] > 0.2
    assert "With a 50 ms training step the loop waits for data" in recommendation.explain()


def test_a_fast_fetch_with_a_long_step_needs_no_worker() -> None:
    recommendation = fastdata.tune(tensor_dataset(2000), batch_size=32, step=30, budget_s=8)
    assert recommendation.num_workers == 0
    assert recommendation.wait_fraction < 0.05
    assert "any worker makes loading slower" in recommendation.explain()


def test_spawn_without_pickling_is_explained_not_crashed() -> None:
    recommendation = fastdata.tune(WithLambda(), batch_size=64, budget_s=6, start_method="spawn")
    assert "lambda" in recommendation.measurements.pickle_error
    assert recommendation.backend == "thread" or recommendation.num_workers == 0
    assert set(recommendation.measurements.transfer_ms) == {"thread"}
    text = recommendation.explain()
    assert "need a picklable dataset" in text and "module-level functions" in text


def test_tune_refuses_bad_arguments() -> None:
    with pytest.raises(InvalidOptionError, match="Invalid batch_size 0"):
        fastdata.tune(tensor_dataset(10), batch_size=0)
    with pytest.raises(InvalidOptionError, match="Invalid budget_s -1"):
        fastdata.tune(tensor_dataset(10), budget_s=-1)
    with pytest.raises(InvalidOptionError, match="Unknown backend 'gpu'"):
        fastdata.tune(tensor_dataset(10), backends=["gpu"])
    with pytest.raises(InvalidOptionError, match="The dataset is empty"):
        fastdata.tune(TensorDataset(torch.zeros(0, 1)), budget_s=2)


# --- the command line ---------------------------------------------------------------------------------


def test_cli_tune_json_on_an_import_string(user_module: str, tmp_path: Path) -> None:
    done = run_fastdata("tune", f"{user_module}:dataset", "--batch-size", "8", "--budget-s", "6", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert all(name in document for name in JSON_FIELDS)
    assert document["batch_size"] == 8 and document["measurements"]["samples"] == 50
    assert document["conversion"] == {"skipped": "the source is a Python Dataset (module:name): a conversion is "
                                                 "predicted for an image folder or a torchvision source"}


def test_cli_tune_text_and_errors(user_module: str, tmp_path: Path) -> None:
    done = run_fastdata("tune", f"{user_module}:make", "--batch-size", "4", "--budget-s", "5", "--step", f"{user_module}:step",
                   "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "recommended: fastdata.loader(dataset, batch_size=4, shuffle=True" in done.stdout
    assert "\nwhy: num_workers=0: a batch of 4 takes " in done.stdout
    missing = run_fastdata("tune", "nosuchmodule_abc:data", cwd=tmp_path)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert missing.stderr.startswith("fastdata: error: Cannot import module 'nosuchmodule_abc'")
    both = run_fastdata("tune", f"{user_module}:make", "--step-ms", "5", "--step", f"{user_module}:step", cwd=tmp_path)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_cli_tune_mnist_predicts_converting_it(mnist_root: Path, tmp_path: Path) -> None:
    from conftest import make_mnist

    make_mnist(mnist_root, train=600)
    # a budget too small for anything but the first probes: the conversion probe runs all the same
    done = run_fastdata("tune", "torchvision:MNIST", "--root", str(mnist_root), "--batch-size", "64", "--budget-s", "1",
                   "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    conversion = document["conversion"]
    assert conversion["format"] == "npy" and conversion["store"] == "raw"
    assert conversion["probe_samples"] == 512 and conversion["speedup"] > 1
    assert "Converting the source to npy (raw) is predicted to read at" in document["explanation"]
    assert conversion["predicted_conversion_s"] > 0 and conversion["fetch_ms"] < document["measurements"]["fetch_ms"]


def test_cli_bench_takes_an_import_string_and_a_step(user_module: str, tmp_path: Path) -> None:
    done = run_fastdata("bench", f"{user_module}:dataset", "--batch-size", "10", "--num-workers", "0,1", "--backends", "torch,thread",
                   "--epochs", "1", "--warmup", "0", "--step", f"{user_module}:step", "--out", str(tmp_path / "b"),
                   "--quiet", "--memory-s", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "TensorDataset fast [thread]" in done.stdout and "TensorDataset standard" in done.stdout
    document = json.loads((tmp_path / "b" / "results.json").read_text())
    effect = document["summary"]["backends"]  # the report's line on what the backends change, from the rows
    assert f"\nbackends: {effect['text']}\n" in done.stdout
    assert effect["text"].startswith("on TensorDataset fast at 1 worker, fastdata's thread backend ")
    assert set(effect["ratio_to_serial"]) == {"torch", "thread"}
    document = json.loads((tmp_path / "b" / "results.json").read_text())
    assert document["config"]["step"] == f"{user_module}:step"
    rows = [row for row in document["rows"] if row["format"] != "probe"]
    assert len(rows) == 5 and {row["samples"] for row in rows} == {50}


class ParallelOps(torch.utils.data.Dataset):
    """Each sample runs an op large enough for torch's intra-op (OpenMP) threads."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int):
        return torch.ones(2_000_000).mul_(2).sum(), index


def test_sweep_survives_a_caller_that_used_intra_op_threads() -> None:
    x = torch.randn(1500, 1500)
    (x @ x).sum()  # this process now has OpenMP threads; a forked child that used them would hang
    rows = fastdata.sweep(ParallelOps(), batch_size=4, workers=[0], epochs=1, warmup=0, timeout_s=60)
    assert {row["status"] for row in rows} == {"ok"}, rows[0]["status"]


def test_cli_tune_reads_a_converted_tar_dataset_map_style(uniform_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "shards"
    fastdata.convert(uniform_folder, out, format="tar", workers=0)
    done = run_fastdata("tune", str(out), "--batch-size", "4", "--budget-s", "4", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["measurements"]["samples"] == len(fastdata.TarIndexedDataset(out))
    store = json.loads((out / "manifest.json").read_text())["store"]
    assert document["conversion"] == {"skipped": f"the source is already converted (tar {store})"}
