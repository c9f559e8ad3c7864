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
