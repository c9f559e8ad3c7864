"""``num_workers="auto"`` in ``fastdata bench`` (the auto row, from hand-built rows) and in
``fastdata tune`` (its "use auto" when the best setting depends on the phase)."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

import fastdata
from fastdata.bench.autorow import auto_dataset, auto_summary, best_fixed, tuning_fields
from fastdata.tuning.measure import Measurements
from fastdata.tuning.noise import Spread
from fastdata.tuning.phases import phase_advice


def row(fmt, store, backend, workers, rate, *, warmup=False, path="fast", status="ok", **extra):
    return {"format": fmt, "store": store, "read_path": path, "backend": backend, "num_workers": workers,
            "samples_per_s": rate, "warmup": warmup, "status": status, **extra}


GRID = [
    row("npy", "raw", "torch", 0, 900.0), row("npy", "raw", "torch", 0, 1100.0), row("npy", "raw", "torch", 0, 50.0,
                                                                                     warmup=True),
    row("npy", "raw", "thread", 2, 2000.0), row("npy", "raw", "thread", 2, 2200.0), row("npy", "raw", "thread", 2, 1800.0),
    row("hdf5", "raw", "thread", 2, 1500.0), row("npy", "raw", "torch", 2, 9000.0, path="standard"),
    row("npy", "raw", "process", 2, 9000.0, status="failed: died"),
]


def test_best_fixed_is_the_fastest_fast_path_median():
    assert best_fixed(GRID) == (("npy", "raw", "thread", 2), 2000.0)
    assert best_fixed(GRID, ("hdf5", "raw")) == (("hdf5", "raw", "thread", 2), 1500.0)
    assert auto_dataset(GRID) == ("npy", "raw")


def test_auto_summary_compares_with_the_best_fixed_setting():
    chose = {"backend": "thread", "num_workers": 2, "prefetch_factor": 2, "persistent_workers": True}
    auto = [row("npy", "raw", "auto", 0, 100.0, warmup=True)] + [
        row("npy", "raw", "auto", 0, rate, auto_chose=chose, settled_after_s=1.25, settled_after_batches=40,
            decisions=3) for rate in (1700.0, 1900.0, 1800.0)]
    summary = auto_summary(auto, GRID)
    assert summary["samples_per_s"] == 1800.0 and summary["vs_best"] == 0.9
    assert summary["best_fixed"] == {"backend": "thread", "num_workers": 2, "samples_per_s": 2000.0}
    assert summary["text"] == ("npy raw num_workers='auto': 1800 samples/s, 0.90x the best fixed setting (thread x2, "
                               "2000 samples/s); chose thread x2, settled after 1.2 s (3 decisions)")
    failed = auto_summary([row("npy", "raw", "auto", 0, 0.0, status="failed: timed out after 600 s")], GRID)
    assert failed == {"text": "num_workers='auto' failed: timed out after 600 s"}
    assert auto_summary([], GRID) is None


def test_tuning_fields_of_a_real_auto_loader():
    dataset = TensorDataset(torch.arange(40))
    loader = fastdata.loader(dataset, batch_size=4, num_workers="auto")
    for _ in loader:
        pass
    fields = tuning_fields(loader)
    assert fields["auto_chose"] == loader.tuned and fields["decisions"] == len(loader.tuning_log)
    assert tuning_fields(fastdata.loader(dataset, batch_size=4)) == {}


def measurements(**overrides) -> Measurements:
    values = dict(batch_size=32, samples=10000, batches_per_epoch=313, batch_bytes=1408, fetch_ms=2.0,
                  loop_ms=2.1, standard_fetch_ms=3.0, step_ms=0.0, step_cpu_ms=0.0, thread_speedup=1.9,
                  transfer_ms={"torch": 1.4, "thread": 0.01, "process": 0.05}, startup_s={"torch": 0.03,
                  "thread": 0.002, "process": 0.03}, usable_cores=8, cpu_count=8, start_method="fork",
                  pickle_error=None, cuda=False)
    values.update(overrides)
    return Measurements(**values)


def test_tune_says_use_auto_only_when_the_best_setting_moves():
    steady = measurements(spreads={"fetch_ms": Spread((2.0, 2.1, 1.9))})
    assert phase_advice(steady, TensorDataset(torch.arange(4)), ("thread", "process"), 16) is None
    # the fetch ran from 0.02 ms (a hot cache) to 2 ms: workers do not pay at the one, do at the other
    varied = measurements(spreads={"fetch_ms": Spread((0.02, 0.03, 2.0))})
    advice = phase_advice(varied, TensorDataset(torch.arange(4)), ("thread", "process"), 16)
    assert advice.startswith("use num_workers='auto' (the loader follows the phase): the fetch took 0.0 to 2.0 ms "
                             "per batch, and the best setting moves with it (")
