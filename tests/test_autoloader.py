"""``fastdata.loader(..., num_workers="auto")`` end to end, on every backend: the batches are those of a
fixed setting (over epochs, across a state_dict resume mid-epoch, with set_epoch and ranks), every
decision is logged and kept in ``tuning_log``, and ``tuned`` pins a working setting.

Windows are shortened (two batches) so that small datasets see the search change settings
mid-epoch; which settings it picks on this machine is not asserted (that is timing: the decisions
themselves are tested on simulated windows in test_autotune.py)."""

from __future__ import annotations

import logging
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
