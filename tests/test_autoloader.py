"""``fastdata.loader(..., num_workers="auto")`` end to end, on every backend: the batches are those of a
fixed setting (over epochs, across a state_dict resume mid-epoch, with set_epoch and ranks), every
decision is logged and kept in ``tuning_log``, and ``tuned`` pins a working setting.

Windows are shortened (two batches) so that small datasets see the search change settings
mid-epoch; which settings it picks on this machine is not asserted (that is timing: the decisions
themselves are tested on simulated windows in test_autotune.py)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import fastdata
import fastdata.loading.autoloader as autoloader
from fastdata.errors import InvalidOptionError
from conftest import convert_to

BACKENDS = ["auto", "thread", "process", "torch"]


@pytest.fixture(autouse=True)
def short_windows(monkeypatch):
    monkeypatch.setattr(autoloader, "WINDOW_BATCHES", 2)
    monkeypatch.setattr(autoloader, "WINDOW_S", 0.0)


class Numbers(Dataset):
    """A per-sample dataset (no index arrays): sample i is (i as a 2x2 float tensor, i * i)."""

    def __len__(self) -> int:
        return 50

    def __getitem__(self, index: int):
        return torch.full((2, 2), float(index)), index * index


@pytest.fixture
def npy(uniform_folder: Path, tmp_path: Path):
    return fastdata.open_dataset(convert_to(uniform_folder, tmp_path, "npy", "raw"))


def contents(batches) -> list:
    """Batches as plain lists (images and labels), to compare across loaders."""
    out = []
    for batch in batches:
        out.append([item.tolist() if hasattr(item, "tolist") else item for item in batch])
    return out


def epochs(loader, count: int) -> list:
    return [contents(loader) for _ in range(count)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_auto_yields_the_batches_of_a_fixed_setting_and_logs(backend, npy, caplog):
    fixed = fastdata.loader(npy, batch_size=2, seed=3, num_workers=0)
    with caplog.at_level(logging.INFO, logger="fastdata"):
        auto = fastdata.loader(npy, batch_size=2, seed=3, num_workers="auto", backend=backend)
        got = epochs(auto, 3)
    assert got == epochs(fixed, 3)
    assert len(got[0]) == 6 and sorted(label for epoch in got[:1] for batch in epoch for label in batch[1]) == \
        [0] * 4 + [1] * 4 + [2] * 4
    assert auto.tuning_log, "no decision in 18 batches of two-batch windows"
    for entry in auto.tuning_log:
        assert {"batch", "backend", "num_workers", "prefetch", "samples_per_s", "reason"} <= set(entry)
        assert entry["backend"] in (("thread", "process") if backend == "auto" else (backend,))
        assert 0 <= entry["batch"] <= 18 and entry["reason"].startswith("num_workers ")
    logged = [r.getMessage() for r in caplog.records if r.name == "fastdata" and r.levelno == logging.INFO]
    assert [e["reason"] for e in auto.tuning_log] == [m for m in logged if m.startswith("num_workers ")]
    pinned = fastdata.loader(npy, batch_size=2, seed=3, **auto.tuned)
    assert epochs(pinned, 1) == got[:1]
    auto.close()


@pytest.mark.parametrize("backend", ["thread", "process", "torch"])
def test_per_sample_datasets(backend):
    auto = fastdata.loader(Numbers(), batch_size=4, seed=1, num_workers="auto", backend=backend)
    fixed = fastdata.loader(Numbers(), batch_size=4, seed=1, num_workers=2, backend=backend)
    assert epochs(auto, 2) == epochs(fixed, 2)
    auto.close()


@pytest.mark.parametrize("backend", ["auto", "process"])
def test_resume_mid_epoch_gives_the_rest_of_the_epoch(backend):
    auto = fastdata.loader(Numbers(), batch_size=3, seed=5, num_workers="auto", backend=backend)
    list(auto)  # epoch 0 (the search moves on)
    iterator = iter(auto)
    head = [next(iterator) for _ in range(7)]
    state = auto.state_dict()
    assert state["epoch"] == 1 and state["consumed"] == 7
    assert state["tuned"]["backend"] in ("thread", "process")
    del iterator
    fixed = fastdata.loader(Numbers(), batch_size=3, num_workers=2, backend="thread")
    fixed.load_state_dict(state)
    resumed = fastdata.loader(Numbers(), batch_size=3, num_workers="auto", backend=backend)
    resumed.load_state_dict(state)
    assert resumed.setting.backend == state["tuned"]["backend"]  # starts from the tuned setting
    assert resumed.setting.num_workers == state["tuned"]["num_workers"]
    rest = contents(resumed)
    assert rest == contents(fixed) and len(rest) == 17 - 7
    whole = fastdata.loader(Numbers(), batch_size=3, seed=5, num_workers=0)
    whole.set_epoch(1)
    assert contents(head) + rest == contents(whole)
    auto.close()
    resumed.close()


def test_set_epoch_and_ranks():
    for rank in (0, 1):
        auto = fastdata.loader(Numbers(), batch_size=4, seed=9, num_workers="auto", rank=rank, world_size=2)
        fixed = fastdata.loader(Numbers(), batch_size=4, seed=9, num_workers=0, rank=rank, world_size=2)
        auto.set_epoch(4)
        fixed.set_epoch(4)
        assert contents(auto) == contents(fixed)
        assert len(auto) == 7  # 25 of 50 samples on each rank
        auto.close()


@pytest.mark.parametrize(("options", "message"), [
    (dict(num_workers=2, backend="auto"), "backend='auto', max_workers and memory_budget go with num_workers='auto' "
                                          "(got num_workers=2)."),
    (dict(num_workers=1, max_workers=4), "backend='auto', max_workers and memory_budget go with num_workers='auto' "
                                         "(got num_workers=1)."),
    (dict(num_workers="auto", backend="fiber"), "Unknown backend 'fiber'. Allowed: 'auto', 'torch', 'thread', "
                                                "'process'."),
    (dict(num_workers="auto", max_workers=-1), "Invalid max_workers -1. Use 0 or a positive integer."),
    (dict(num_workers="auto", memory_budget="lots"), "Invalid memory_budget 'lots'. Use bytes or a number with kB, "
                                                     "MB, GB, KiB, MiB or GiB (e.g. '256MB')."),
    (dict(num_workers="auto", zero_copy=2), "zero_copy does not go with num_workers='auto' (batches are copied "
                                            "or lent)."),
    (dict(num_workers="auto", generator=None), "Option 'generator' does not apply to backend='auto'."),
    (dict(num_workers="many"), "Invalid num_workers 'many'. Use 0, a positive integer or 'auto'."),
])
def test_bad_options(options, message):
    with pytest.raises(InvalidOptionError) as caught:
        fastdata.loader(Numbers(), batch_size=4, **options)
    assert str(caught.value).startswith(message)


def test_max_workers_bounds_every_setting():
    auto = fastdata.loader(Numbers(), batch_size=2, seed=2, num_workers="auto", max_workers=1)
    fixed = fastdata.loader(Numbers(), batch_size=2, seed=2, num_workers=0)
    assert epochs(auto, 2) == epochs(fixed, 2)
    assert all(entry["num_workers"] <= 1 for entry in auto.tuning_log)
    assert np.all([auto.setting.num_workers <= 1])
    auto.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("source", ["per-sample", "npy"])
@pytest.mark.parametrize("backend", ["auto", "process", "torch"])
def test_two_live_iterators_each_read_every_sample_of_their_epoch_once(backend, source, request):
    dataset = Numbers() if source == "per-sample" else request.getfixturevalue("npy")
    fixed = fastdata.loader(dataset, batch_size=2, seed=4, num_workers=0)
    expected = epochs(fixed, 5)
    # timeout=20: a batch that never comes fails the test instead of hanging it
    auto = fastdata.loader(dataset, batch_size=2, seed=4, num_workers="auto", backend=backend, timeout=20)
    state = auto.state_dict()  # start with worker processes, as after tuning
    state["tuned"] = {"backend": "process" if backend == "auto" else backend, "num_workers": 2, "prefetch": 2}
    auto.load_state_dict(state)
    assert auto.setting.num_workers >= 1 and auto.setting.backend in ("process", "torch")
    peek = iter(auto)
    first = next(peek)  # "peek, then train"
    assert contents(auto) == expected[1]
    assert contents([first]) + contents(peek) == expected[0]
    pairs = list(zip(auto, auto))
    assert contents(a for a, _ in pairs) == expected[2] and contents(b for _, b in pairs) == expected[3]
    assert contents(auto) == expected[4]
    auto.close()


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize(("options", "message"), [
    (dict(prefetch_factor=0), "Invalid prefetch_factor 0. Use a number of batches per worker >= 1 (or None for 2)."),
    (dict(prefetch_factor="4"), "Invalid prefetch_factor '4'. Use a number of batches per worker >= 1 (or None for "
                                "2)."),
    (dict(timeout=-1), "Invalid timeout -1. Use seconds >= 0 (0: wait as long as it takes)."),
    (dict(timeout="5"), "Invalid timeout '5'. Use seconds >= 0 (0: wait as long as it takes)."),
    (dict(worker_init_fn=3), "Invalid worker_init_fn 3. Use a function (or None)."),
    (dict(collate_fn="stack"), "Invalid collate_fn 'stack'. Use a function (or None)."),
    (dict(pin_memory="yes"), "Invalid pin_memory 'yes'. Use True or False."),
    (dict(persistent_workers=1), "Invalid persistent_workers 1. Use True or False."),
    (dict(multiprocessing_context="fork2"), "Invalid multiprocessing_context 'fork2'. Use one of 'fork', 'spawn', "
                                            "'forkserver', a multiprocessing context, or None."),
])
def test_worker_options_are_checked_when_the_auto_loader_is_built(backend, options, message):
    """Auto starts at num_workers=0: an option only workers use is checked when the loader is made,
    not when the search first starts workers (after some batches, or never)."""
    with pytest.raises(InvalidOptionError) as caught:
        fastdata.loader(Numbers(), batch_size=4, num_workers="auto", backend=backend, **options)
    assert str(caught.value) == message


def test_the_torch_backend_refuses_a_dataloader_option_when_built():
    with pytest.raises(InvalidOptionError) as caught:
        fastdata.loader(Numbers(), batch_size=4, num_workers="auto", backend="torch", workers_seed=3)
    assert str(caught.value) == "backend='torch' refuses these options: DataLoader.__init__() got an unexpected " \
        "keyword argument 'workers_seed'"


def test_a_multiprocessing_context_under_auto_on_the_torch_backend():
    import multiprocessing

    for context in ("fork", multiprocessing.get_context("fork")):
        auto = fastdata.loader(Numbers(), batch_size=4, seed=1, num_workers="auto", backend="torch",
                               multiprocessing_context=context)
        assert epochs(auto, 2) == epochs(fastdata.loader(Numbers(), batch_size=4, seed=1, num_workers=0), 2)
        auto.close()


def test_tuned_and_the_log_keep_the_prefetch_factor_given():
    auto = fastdata.loader(Numbers(), batch_size=2, seed=2, num_workers="auto", backend="thread", prefetch_factor=6)
    assert auto.setting.prefetch == 6
    auto.load_state_dict({**auto.state_dict(), "tuned": {"backend": "thread", "num_workers": 2, "prefetch": 2}})
    assert auto.tuned == {"backend": "thread", "num_workers": 2, "prefetch_factor": 6, "persistent_workers": True}
    epochs(auto, 4)  # a window at 2 workers holds three chunks of 13 batches (more than in flight)
    assert auto.tuning_log and {entry["prefetch"] for entry in auto.tuning_log} == {6}
    auto.close()


def test_persistent_workers_false_is_reported_once():
    with pytest.warns(UserWarning) as caught:
        auto = fastdata.loader(Numbers(), batch_size=4, seed=1, num_workers="auto", persistent_workers=False)
        epochs(auto, 2)
    assert [str(w.message) for w in caught] == [
        "num_workers='auto' keeps the workers of a setting for as long as it runs, across epochs: "
        "persistent_workers=False is not used."]
    assert caught[0].filename == __file__
    auto.close()


class FailsInWorkers(Dataset):
    """Numbers whose sample ``bad`` fails when a worker (thread or process) reads it: the serial
    loop reads it, so the epochs go on until the search has workers read it."""

    def __init__(self, bad: int):
        self.bad = bad

    def __len__(self) -> int:
        return 120

    def __getitem__(self, index: int):
        import multiprocessing
        import threading

        in_worker = threading.current_thread().name.startswith("fastdata-loader") or \
            multiprocessing.parent_process() is not None
        if index == self.bad and in_worker:
            raise KeyError(f"sample {index}")
        return torch.full((2, 2), float(index)), index


def test_a_worker_error_names_the_batch_of_the_epoch():
    """The search's settings each read the rest of the epoch from where the last one stopped: an
    error names the epoch's batch (as a fixed setting does), not the batch within that rest."""
    from fastdata.loading.base import WorkerError

    auto = fastdata.loader(FailsInWorkers(bad=81), batch_size=4, shuffle=False, num_workers="auto")
    with pytest.raises(WorkerError) as caught:
        epochs(auto, 6)
    assert "batch 20 (indices [80, 81, 82, 83] (4 samples))" in str(caught.value), str(caught.value)
    assert "KeyError: 'sample 81'" in str(caught.value)
    auto.close()


def test_a_worker_process_is_measured_by_what_it_adds_not_the_heap_it_shares():
    """A process with a large heap forks a worker: the worker maps the whole heap (its RSS), but
    shares it copy-on-write; the memory budget counts what the worker adds (its USS)."""
    import psutil

    heap = np.ones(300 * 2**20 // 8)  # 300 MB written in this process before the fork
    loader = fastdata.loader(Numbers(), batch_size=4, num_workers=1, backend="process", persistent_workers=True)
    iterator = iter(loader)
    next(iterator)
    meter = autoloader.Meter()
    meter.watch(processes=True)
    meter.reset(skip=0, timed=False)
    for _ in range(10):
        meter.batch(4, 0.001)
    window = meter.window(1)
    worker = loader._workers[0].process.pid
    assert psutil.Process(worker).memory_info().rss > 300 * 2**20  # the heap it maps
    assert window.worker_bytes < 100 * 2**20, window.worker_bytes
    del iterator
    loader.close()
    assert heap[-1] == 1.0


class SlowReads(Dataset):
    """Samples of 1 MiB behind a 2 ms read each (a dataset that waits on I/O: threads pay)."""

    def __len__(self) -> int:
        return 120

    def __getitem__(self, index: int):
        import time

        time.sleep(0.002)
        return np.full(2**18, index, dtype=np.float32)


def test_memory_budget_bounds_threads_by_their_batches_in_flight():
    """Each thread holds prefetch_factor batches of 4 MiB in flight: a 20 MB budget holds two."""
    auto = fastdata.loader(SlowReads(), batch_size=4, seed=0, num_workers="auto", backend="thread",
                           memory_budget="20MB")
    for _ in range(3):
        for batch in auto:
            del batch
    assert auto.tuning_log and max(entry["num_workers"] for entry in auto.tuning_log) <= 2, auto.tuning_log
    assert any(entry["reason"].endswith("at the limit") or "(2 at most" in entry["reason"]
               for entry in auto.tuning_log), auto.tuning_log
    auto.close()


class Phases(Dataset):
    """Index arrays of a quick gather, behind a 1 ms read per sample while the file ``slow`` exists
    (seen by every worker, thread or process)."""

    supports_index_arrays = True

    def __init__(self, slow: Path):
        self.slow = slow
        self.values = torch.arange(4000.0)

    def __len__(self) -> int:
        return 4000

    def __getitem__(self, indices):
        import time

        if self.slow.exists():
            time.sleep(0.001 * len(indices))
        return self.values[torch.as_tensor(indices)]


def run_until(loader, done, *, at_least_s: float, at_most_s: float) -> None:
    """Epochs of ``loader`` (batches dropped) until ``done()`` after ``at_least_s``, or ``at_most_s``."""
    import time

    start = time.monotonic()
    while time.monotonic() - start < at_most_s:
        for batch in loader:
            del batch
            if time.monotonic() - start > at_most_s or (time.monotonic() - start > at_least_s and done()):
                return


def test_auto_goes_back_to_the_serial_loop_after_a_slow_phase(tmp_path, monkeypatch):
    """A quick gather, then the same batches behind a slow read, then quick again: the search
    settles on workers in the slow phase, and once it ends measures the serial loop again and
    settles there (it had stayed at 2 processes, or at 14 threads, 4-8x slower than the serial
    loop it left). Each phase runs until the search settled (at most 20-40 s)."""
    monkeypatch.setattr(autoloader, "WINDOW_BATCHES", 8)  # windows as in use: two-batch ones are noisy here
    monkeypatch.setattr(autoloader, "WINDOW_S", 0.25)
    slow = tmp_path / "slow"
    auto = fastdata.loader(Phases(slow), batch_size=8, seed=0, num_workers="auto")

    def settled_serial() -> bool:
        return bool(auto.tuning_log) and "settled: " in auto.tuning_log[-1]["reason"] and \
            auto.setting.num_workers == 0

    run_until(auto, settled_serial, at_least_s=1.0, at_most_s=20)
    slow.touch()
    began = len(auto.tuning_log)
    run_until(auto, lambda: "settled: " in auto.tuning_log[-1]["reason"] and auto.setting.num_workers >= 4,
              at_least_s=2.0, at_most_s=40)
    during = auto.tuning_log[began:]
    assert during[0]["reason"].startswith("num_workers 0 -> ") and "re-check: " in during[0]["reason"], during
    assert during[-1]["num_workers"] >= 4 and "settled: " in during[-1]["reason"], during
    slow.unlink()
    began = len(auto.tuning_log)
    run_until(auto, settled_serial, at_least_s=1.0, at_most_s=40)
    after = auto.tuning_log[began:]
    assert any("re-check: " in e["reason"] and e["reason"].endswith("starting again from num_workers=0")
               for e in after), after
    assert after[-1]["num_workers"] == 0 and "settled: " in after[-1]["reason"], after
    auto.close()


def test_the_documented_auto_example_runs_as_it_is(tmp_path: Path) -> None:
    """docs/reading.md's ``num_workers="auto"`` example, run as a user pastes it (its own process,
    the real window lengths): what it prints is the setting and each decision, also on a run too
    short for any decision (the log is then empty)."""
    import ast
    import subprocess
    import sys

    from conftest import ROOT

    docs = (ROOT / "docs" / "reading.md").read_text()
    example = docs.split("<!-- example: auto -->\n```python\n")[1].split("```")[0]
    def run(text: str) -> subprocess.CompletedProcess:
        script = tmp_path / "example.py"
        script.write_text(text)
        result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
        assert result.returncode == 0, result.stderr
        return result

    result = run(example)
    tuned, *decisions = [ast.literal_eval(line) for line in result.stdout.splitlines()]
    assert {"backend", "num_workers"} <= set(tuned) and tuned["backend"] in ("thread", "process")
    documented = {"batch", "elapsed_s", "backend", "num_workers", "prefetch", "samples_per_s", "wait_fraction", "reason"}
    assert all(documented <= set(decision) for decision in decisions)
    logged = [line for line in result.stderr.splitlines() if line.startswith("INFO:fastdata:")]
    assert logged == [f"INFO:fastdata:{decision['reason']}" for decision in decisions]
    short = run(example.replace("4_000", "300"))  # 2 batches an epoch: no window ends, nothing decided
    assert [ast.literal_eval(line) for line in short.stdout.splitlines()] == [{"backend": "thread", "num_workers": 0}]


@pytest.mark.timeout(300)
def test_close_stops_the_workers_an_older_iterator_still_reads_from():
    import multiprocessing

    before = set(multiprocessing.active_children())
    auto = fastdata.loader(Numbers(), batch_size=2, seed=4, num_workers="auto", backend="process", timeout=20)
    state = auto.state_dict()  # start with worker processes, as after tuning
    state["tuned"] = {"backend": "process", "num_workers": 2, "prefetch": 2}
    auto.load_state_dict(state)
    peek = iter(auto)
    next(peek)
    train = iter(auto)
    next(train)  # tunes on workers of its own; peek keeps reading from the ones it had
    assert len(set(multiprocessing.active_children()) - before) == 4
    auto.close()
    assert set(multiprocessing.active_children()) - before == set()  # before: peek's two were left running
    del peek, train


class FullOn(Dataset):
    """Sample 5 raises SharedMemoryFullError, as a dataset that itself uses shared memory may."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int):
        if index == 5:
            from fastdata.errors import SharedMemoryFullError

            raise SharedMemoryFullError("/dev/shm has 0 MB free, a batch needs 1 MB: ...")
        return index


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_shared_memory_error_without_worker_processes_reaches_the_loop(workers):
    auto = fastdata.loader(FullOn(), batch_size=2, shuffle=False, num_workers="auto", backend="auto")
    state = auto.state_dict()
    state["tuned"] = {"backend": "thread", "num_workers": workers, "prefetch": 2}
    auto.load_state_dict(state)
    # nothing to fall back from: before, it fell back to the setting it ran, again and again (a hang)
    with pytest.raises(Exception, match=r"/dev/shm has 0 MB free, a batch needs 1 MB: \.\.\.$") as info:
        list(auto)
    assert type(info.value).__name__ == ("SharedMemoryFullError" if workers == 0 else "WorkerError")
    assert auto.tuning_log == []
    auto.close()
