"""The tables of plug-ins that are not formats: loader backends (fastdata.loading.backends) and
storage schemes (fastdata.remote.schemes). Every row is complete and consistent with the code it
names; the loader, bench and tune take their choices from the table; a scheme's aliases all
lead to its row."""

from __future__ import annotations

import pytest
import torch

import fastdata
from fastdata.errors import InvalidOptionError
from fastdata.extras import EXTRAS
from fastdata.loading.backends import BACKENDS, DEFAULT_BACKEND, backend_names, get_backend
from fastdata.remote.schemes import SCHEMES, find_scheme, scheme_of_url


def test_every_backend_row_names_its_loader_class_and_the_loader_builds_it() -> None:
    dataset = torch.utils.data.TensorDataset(torch.arange(8))
    assert backend_names() == ("torch", "thread", "process") and DEFAULT_BACKEND in BACKENDS
    assert [row.preference for row in BACKENDS.values()] == sorted(row.preference for row in BACKENDS.values())
    for name, row in BACKENDS.items():
        assert row.name == name and row.loader_class().backend == name
        assert row.worker_noun(1) != row.worker_noun(2) and row.title and row.workers_name and row.reason
        assert row.needs_picklable == row.crosses_process and row.shares_gil != row.crosses_process
        loader = fastdata.loader(dataset, batch_size=4, shuffle=False, num_workers=1, backend=name)
        assert type(loader) is row.loader_class()
        assert [batch[0].tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(InvalidOptionError, match=r"^Unknown backend 'fibers'. Allowed: 'torch', 'thread', 'process'.$"):
        get_backend("fibers")
    with pytest.raises(InvalidOptionError, match=r"^zero_copy applies to backend='process' only \(got backend='thread'\).$"):
        fastdata.loader(dataset, batch_size=4, backend="thread", zero_copy=1)
    with pytest.raises(InvalidOptionError, match=r"^Option 'multiprocessing_context' does not apply to backend='thread'"):
        fastdata.loader(dataset, batch_size=4, num_workers=1, backend="thread", multiprocessing_context="spawn")


def test_bench_and_tune_take_their_backends_and_words_from_the_table() -> None:
    from fastdata.bench.config import BenchConfig
    from fastdata.bench.explain import startup_sentence
    from fastdata.bench.summary import label

    assert BenchConfig().backends == backend_names()
    with pytest.raises(InvalidOptionError, match=r"^Unknown --backends 'fibers'"):
        BenchConfig(backends=("fibers",))
    assert label(("npy", "raw", "fast", DEFAULT_BACKEND)) == "npy raw fast" and \
        label(("npy", "raw", "fast", "thread")) == "npy raw fast [thread]"
    assert startup_sentence("process", 2, 0.5, 10.0).startswith("Starting 2 worker processes takes about")


def test_every_scheme_alias_leads_to_its_row_and_its_extra_exists() -> None:
    seen = set()
    for name, row in SCHEMES.items():
        assert row.name == name and row.extra in EXTRAS and not seen & set(row.names)
        seen |= set(row.names)
        for alias in row.names:
            assert find_scheme(alias) is row and find_scheme(alias.upper()) is row
            assert scheme_of_url(f"{alias}://bucket/key") is row
    assert scheme_of_url("memory://x") is None and find_scheme("file") is None
    assert [row.name for row in SCHEMES.values() if row.conditional_writes] == ["s3"]  # what the locks rely on
    assert scheme_of_url("abfss://c/x").container == "container" and scheme_of_url("https://h/x").container == ""
