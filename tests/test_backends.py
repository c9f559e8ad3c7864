"""The thread and process backends of fastdata.loader behave like the DataLoader users know:
the same batches as num_workers=0, the DataLoader's keywords, seeds and worker info, failures
reported (never hung on), Ctrl-C, and no shared-memory segment left behind."""

from __future__ import annotations

import ctypes
import faulthandler
import itertools
import mmap
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, TensorDataset, get_worker_info

import fastdata
from conftest import finish, wait_until
from fastdata.errors import InvalidOptionError
from fastdata.loading import WorkerError, shm, spares, teardown
from fastdata.loading.shm import PREFIX, _alive as alive, stale_segments
from fastdata.machine import populate

SHM = Path("/dev/shm")


def segments() -> set[str]:
    return {p.name for p in SHM.iterdir() if p.name.startswith(PREFIX)} if SHM.is_dir() else set()


def running_elsewhere(name: str) -> bool:
    """Whether segment ``name`` belongs to another live process (another test run on this machine, or
    in another PID namespace sharing /dev/shm, whose pid says nothing here) or is not fastdata's."""
    created = shm.owner(name)
    if created is None or created[0] != shm.pid_namespace():
        return True
    return created[1] != os.getpid() and alive(created[1])


@pytest.fixture(autouse=True)
def no_segment_left_behind():
    before = segments()
    yield
    spares.clear_spares()  # closed loaders' segments kept for the next loader: removed here
    left = {name for name in segments() - before if not running_elsewhere(name)}
    assert left == set(), "a shared-memory segment outlived its loader"


class Squares(Dataset):
    """A per-sample dataset (no index arrays): sample i is a 2x2 float tensor of i and i*i."""

    def __len__(self) -> int:
        return 23

    def __getitem__(self, index: int):
        return torch.full((2, 2), float(index)), index * index


class WhoAmI(Dataset):
    """Each sample says which worker made it and that worker's torch seed."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int):
        info = get_worker_info()
        return torch.tensor([index, info.id if info else -1, info.num_workers if info else 0,
                             torch.initial_seed() % 2**31, os.getpid()])


RELEASE_HANG, HANGING = threading.Event(), threading.Event()  # a thread worker's hang, in this process


class FailsOn(Dataset):
    def __init__(self, bad: int, how: str = "raise"):
        self.bad, self.how = bad, how

    def __len__(self) -> int:
        return 30

    def __getitem__(self, index: int):
        if index == self.bad:
            if self.how == "raise":
                raise ValueError(f"sample {index} is broken")
            if self.how == "sigbus":  # what writing into a full /dev/shm does
                faulthandler.disable()  # pytest's, inherited: it would print a dump of the crash
                os.kill(os.getpid(), signal.SIGBUS)
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            HANGING.set()
            RELEASE_HANG.wait(30)  # a test sets it once the hang was reported (a thread cannot be killed)
            HANGING.clear()
        return torch.zeros(3), index


def batches(loader) -> list[tuple]:
    return [tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in batch) for batch in loader]


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("num_workers", [0, 1, 3])
def test_any_dataset_gives_the_batches_of_the_torch_backend(backend: str, num_workers: int) -> None:
    tensors = TensorDataset(torch.arange(50).float().reshape(25, 2), torch.arange(25))
    for dataset in (tensors, Squares()):
        want = batches(fastdata.loader(dataset, batch_size=4, seed=2))
        loader = fastdata.loader(dataset, batch_size=4, seed=2, backend=backend, num_workers=num_workers)
        got = batches(loader)
        assert len(got) == len(want)
        for mine, theirs in zip(got, want):
            assert all(torch.equal(a, b) for a, b in zip(mine, theirs))
        getattr(loader, "close", lambda: None)()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without an accelerator")
@pytest.mark.parametrize("backend", ["thread", "process"])
def test_pin_memory_without_cuda_warns_like_the_dataloader_and_loads(backend: str) -> None:
    dataset = TensorDataset(torch.arange(20).float(), torch.arange(20))
    want = batches(fastdata.loader(dataset, batch_size=4, seed=1))
    with pytest.warns(UserWarning, match="'pin_memory' argument is set as true but no accelerator is found"):
        loader = fastdata.loader(dataset, batch_size=4, seed=1, backend=backend, num_workers=2, pin_memory=True)
    got = batches(loader)
    assert all(torch.equal(a, b) for mine, theirs in zip(got, want) for a, b in zip(mine, theirs)) and len(got) == 5
    getattr(loader, "close", lambda: None)()


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_process_workers_have_distinct_seeds_and_worker_info(context: str) -> None:
    loader = fastdata.loader(WhoAmI(), batch_size=5, shuffle=False, backend="process", num_workers=2,
                             multiprocessing_context=context, persistent_workers=True)
    first = torch.cat([images for images in loader])
    second = torch.cat([images for images in loader])
    loader.close()
    assert first[:, 0].tolist() == list(range(40))
    assert first[:, 1].tolist() == [(i // 5) % 2 for i in range(40)]  # batch b is made by worker b % 2
    assert set(first[:, 2].tolist()) == {2}
    seeds = {worker: set(first[first[:, 1] == worker, 3].tolist()) for worker in (0, 1)}
    assert all(len(s) == 1 for s in seeds.values()) and seeds[0] != seeds[1]  # one seed per worker, distinct
    assert set(first[:, 4].tolist()) == set(second[:, 4].tolist()) and os.getpid() not in first[:, 4].tolist()


def test_non_persistent_workers_restart_each_epoch_and_worker_init_fn_runs_in_them(tmp_path: Path) -> None:
    def init(worker_id: int) -> None:
        (tmp_path / f"init-{worker_id}-{os.getpid()}").touch()

    loader = fastdata.loader(WhoAmI(), batch_size=5, backend="process", num_workers=2, worker_init_fn=init)
    pids = [set(torch.cat(list(loader))[:, 4].tolist()) for _ in range(2)]
    assert pids[0].isdisjoint(pids[1])  # new workers each epoch
    assert sorted(p.name.split("-")[1] for p in tmp_path.iterdir()) == ["0", "0", "1", "1"]
    loader.close()


def test_an_epoch_that_ends_does_not_wait_for_its_workers_to_exit_and_the_next_start_reaps_them() -> None:
    loader = fastdata.loader(WhoAmI(), batch_size=5, backend="process", num_workers=2)
    first = {int(pid) for pid in torch.cat(list(loader))[:, 4].tolist()}
    stopping = list(loader._stopping)  # asked to stop when the last batch was taken, not waited for
    assert {worker.process.pid for worker in stopping} == first and loader._workers == []
    wait_until(lambda: all(not worker.process.is_alive() for worker in stopping), "the stopped workers' exit")
    second = {int(pid) for pid in torch.cat(list(loader))[:, 4].tolist()}
    assert second.isdisjoint(first) and all(worker.process.exitcode == 0 for worker in stopping)
    assert all(worker not in loader._stopping for worker in stopping)  # reaped by the second epoch's start
    loader.close()
    assert loader._stopping == [] and loader._workers == []


def test_epochs_with_fewer_batches_than_workers_print_nothing(capfd) -> None:
    # the epoch ends (and its workers' control blocks go) before the idle workers have started
    loader = fastdata.loader(TensorDataset(torch.arange(6)), batch_size=4, shuffle=False, backend="process",
                             num_workers=4)
    for _ in range(8):
        assert [batch[0].tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5]]
    loader.close()  # waits for the last workers: all they printed is in
    assert capfd.readouterr().err == ""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("backend", ["thread", "process"])
def test_two_live_iterators_each_read_an_epoch_of_their_own(backend: str, persistent: bool) -> None:
    # timeout=20: a batch that never comes fails the test instead of hanging it
    dataset = TensorDataset(torch.arange(40))
    serial = fastdata.loader(dataset, batch_size=4, seed=2, num_workers=0)
    expected = [[batch[0].tolist() for batch in serial] for _ in range(5)]
    loader = fastdata.loader(dataset, batch_size=4, seed=2, backend=backend, num_workers=2,
                             persistent_workers=persistent, timeout=20)
    peek = iter(loader)
    first = next(peek)  # "peek, then train"
    assert [batch[0].tolist() for batch in loader] == expected[1]
    assert [first[0].tolist()] + [batch[0].tolist() for batch in peek] == expected[0]
    pairs = [(a[0].tolist(), b[0].tolist()) for a, b in zip(loader, loader)]
    assert [a for a, _ in pairs] == expected[2] and [b for _, b in pairs] == expected[3]
    assert [batch[0].tolist() for batch in loader] == expected[4]
    getattr(loader, "close", loader.shutdown)()


@pytest.mark.parametrize("persistent", [False, True])
def test_close_stops_the_workers_of_a_second_iterator_still_mid_epoch(persistent: bool) -> None:
    import multiprocessing

    before = set(multiprocessing.active_children())
    loader = fastdata.loader(TensorDataset(torch.arange(40)), batch_size=4, seed=2, backend="process",
                             num_workers=2, persistent_workers=persistent, timeout=20)
    first, second = iter(loader), iter(loader)
    next(first), next(second)  # the second reads on workers of its own
    assert len(set(multiprocessing.active_children()) - before) == 4
    loader.close()
    assert set(multiprocessing.active_children()) - before == set()  # before: the second's two were left running
    del first, second


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("backend", "workers"), [("thread", 2), ("process", 2), ("torch", 0), ("torch", 2),
                                                  ("process", "auto")])
def test_state_dict_with_two_live_iterators_is_the_position_of_the_one_that_began_last(backend, workers) -> None:
    # zip(loader, loader): both iterators exist before either draws its epoch; the second draws epoch 1
    dataset = TensorDataset(torch.arange(40))
    serial = fastdata.loader(dataset, batch_size=4, seed=2, num_workers=0)
    expected = [[batch[0].tolist() for batch in serial] for _ in range(2)]
    loader = fastdata.loader(dataset, batch_size=4, seed=2, backend=backend, num_workers=workers, timeout=20)
    first, second = iter(loader), iter(loader)
    assert next(first)[0].tolist() == expected[0][0]
    assert [next(second)[0].tolist() for _ in range(3)] == expected[1][:3]
    state = loader.state_dict()
    assert (state["epoch"], state["consumed"]) == (1, 3)  # the second's (before: epoch 0, the first's, at 3)
    resumed = fastdata.loader(dataset, batch_size=4, seed=2, num_workers=0)
    resumed.load_state_dict(state)
    assert [batch[0].tolist() for batch in resumed] == expected[1][3:]
    del first, second
    getattr(loader, "close", lambda: None)()


def _hang_at_exit(worker_id: int) -> None:
    """A worker whose exit hangs (a finalizer run at its exit sleeps for a minute)."""
    import multiprocessing.util

    multiprocessing.util.Finalize(None, time.sleep, args=(60,), exitpriority=0)


def test_a_worker_that_does_not_exit_after_an_epoch_is_terminated_at_the_next_start() -> None:
    loader = fastdata.loader(WhoAmI(), batch_size=5, backend="process", num_workers=1, worker_init_fn=_hang_at_exit)
    assert len(list(loader)) == 8
    (hung,) = loader._stopping
    time.sleep(teardown._STOP_GRACE_S + 0.2)
    assert hung.process.is_alive()  # its exit hangs: never waited for at the end of the epoch
    assert len(list(loader)) == 8  # the next start stops it for sure, and the epoch runs
    assert hung.process.exitcode == -signal.SIGTERM and hung not in loader._stopping
    loader.close()
    assert loader._stopping == []


def test_prefetch_factor_sets_the_slots_and_zero_copy_views_stay_valid() -> None:
    data = TensorDataset(torch.arange(64 * 48).reshape(64, 48).to(torch.uint8), torch.arange(64))
    want = batches(fastdata.loader(data, batch_size=4, seed=1))
    loader = fastdata.loader(data, batch_size=4, seed=1, backend="process", num_workers=2, prefetch_factor=3,
                             zero_copy=3, persistent_workers=True)
    assert loader.slots == 3 + 2  # prefetch_factor + the views held per worker
    recent: list = []
    for index, batch in enumerate(loader):
        recent.append((index, batch))
        recent = recent[-3:]  # the documented guarantee: the last zero_copy batches are valid
        for held, (images, labels) in recent:
            assert torch.equal(images, want[held][0]) and torch.equal(labels, want[held][1])
    copied = list(fastdata.loader(data, batch_size=4, seed=1, backend="process", num_workers=2))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(copied, want))  # copies: valid forever
    loader.close()


class Growing(Dataset):
    """Index-array dataset with one large batch: samples 40-43 are 64x64, the others 8x8, so the
    slots sized from the first batch are too small for batch 10 (batch size 4, in order)."""

    supports_index_arrays = True

    def __len__(self) -> int:
        return 80

    def __getitem__(self, indices):
        side = 64 if 40 <= indices[0] < 44 else 8
        images = torch.stack([torch.full((side, side), int(i) % 251, dtype=torch.uint8) for i in indices])
        return images, torch.as_tensor(indices)


def modes(monkeypatch) -> list[str]:
    """How the process backend handed out each batch from a slot: "lend" (its slot lent), "copy" or
    "view" (zero_copy)."""
    from fastdata.loading import shm

    seen: list[str] = []
    unpack = shm.unpack

    def recording(*args, mode, **kwargs):
        unpacked = unpack(*args, mode=mode, **kwargs)
        seen.append("copy" if mode == "lend" and unpacked.lease is None else mode)
        return unpacked

    monkeypatch.setattr(shm, "unpack", recording)
    return seen


# 8 images a batch are 96 KiB: lent (arrays under shm.LEND_MIN_BYTES, such as the labels, are copied)
RAW = TensorDataset(torch.randint(0, 256, (96, 3, 64, 64), generator=torch.Generator().manual_seed(0),
                                  dtype=torch.uint8), torch.arange(96))


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_a_plain_loop_is_lent_every_batch_and_gives_the_slots_back(monkeypatch, num_workers: int) -> None:
    serial = fastdata.loader(RAW, batch_size=8, seed=3)
    want = [batches(serial), batches(serial)]
    seen = modes(monkeypatch)
    loader = fastdata.loader(RAW, batch_size=8, seed=3, backend="process", num_workers=num_workers,
                             persistent_workers=True)
    for epoch in range(2):
        for number, (images, labels) in enumerate(loader):
            assert torch.equal(images, want[epoch][number][0]) and torch.equal(labels, want[epoch][number][1])
    assert loader.slots == 2 + 1  # prefetch_factor in flight, and the batch the loop holds
    assert seen == ["lend"] * 24  # the first batch too: the worker asks for slots of its size and copies it in
    del images, labels
    loader._take_back()
    assert loader._lent == [set()] * num_workers  # every slot came back when the loop dropped its batch
    loader.close()


def test_large_batches_leave_the_spare_slot_unused_with_several_workers(monkeypatch) -> None:
    from fastdata.loading import processes

    monkeypatch.setattr(processes, "_SPARE_SLOT_BYTES", 64 * 1024)  # RAW's 96 KiB batches count as large
    serial = fastdata.loader(RAW, batch_size=8, seed=3)
    want = batches(serial)
    seen = modes(monkeypatch)
    loader = fastdata.loader(RAW, batch_size=8, seed=3, backend="process", num_workers=2, persistent_workers=True)
    got = batches(loader)
    assert [loader._active_slots(w) for w in (0, 1)] == [2, 2]  # prefetch_factor: no slot for a held batch
    assert all(torch.equal(a[0], b[0]) for a, b in zip(got, want)) and seen == ["lend"] * 12
    loader.close()
    lone = fastdata.loader(RAW, batch_size=8, seed=3, backend="process", num_workers=1)
    batches(lone)
    assert lone._active_slots(0) == 3  # a lone worker's next batch is drawn while its last one is held
    lone.close()


class Sizes(Dataset):
    """Index-array dataset: 128x128 images (64 KiB a batch of 4: lent), 256x256 for samples 40-43
    (256 KiB: past a spare-slot size of 200 KiB)."""

    supports_index_arrays = True

    def __len__(self) -> int:
        return 48

    def __getitem__(self, indices):
        side = 256 if 40 <= indices[0] < 44 else 128
        images = torch.stack([torch.full((side, side), int(i), dtype=torch.uint8) for i in indices])
        return images, torch.as_tensor(indices)


def test_new_workers_get_a_slot_when_the_loop_holds_batches_lent_before_the_slots_grew(monkeypatch) -> None:
    from fastdata.loading import processes

    monkeypatch.setattr(processes, "_SPARE_SLOT_BYTES", 200 * 1024)
    want = batches(fastdata.loader(Sizes(), batch_size=4, shuffle=False))
    loader = fastdata.loader(Sizes(), batch_size=4, shuffle=False, backend="process", num_workers=2, timeout=20)
    kept = list(loader)  # worker 0 lends 2 of its 3 slots; batch 10 then grows them past the spare size: 2 slots
    assert loader._lent[0] and len(loader._lent[0]) == loader._active_slots(0)
    again = batches(loader)  # new workers: worker 0 still needs a slot to work in
    assert all(torch.equal(a[0], b[0]) for a, b in zip(kept, want)) and len(kept) == 12
    assert all(torch.equal(a[0], b[0]) for a, b in zip(again, want)) and len(again) == 12
    del kept
    loader.close()


def test_a_loop_that_keeps_every_batch_gets_copies_beyond_the_spare_slots(monkeypatch) -> None:
    want = batches(fastdata.loader(RAW, batch_size=8, seed=3))
    seen = modes(monkeypatch)
    loader = fastdata.loader(RAW, batch_size=8, seed=3, backend="process", num_workers=2, prefetch_factor=3)
    kept = list(loader)  # lent batches stay valid while held: no worker ever reuses their slots
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(kept, want)) and len(kept) == 12
    assert seen == ["lend"] * 6 + ["copy"] * 6  # 3 lent per worker (4 slots each, one always cycles)
    epoch_two = list(loader)  # new workers start without the 6 slots the loop still holds
    assert all(torch.equal(a[0], b[0]) for a, b in zip(kept, want))
    assert len(epoch_two) == 12 and seen[12:] == ["copy"] * 12
    kept.clear()
    epoch_two.clear()
    third = batches(loader)  # the slots came back; a loop that drops each batch is lent every one
    assert seen[24:] == ["lend"] * 12 and len(third) == 12
    loader.close()


def test_a_batch_dropped_in_another_thread_gives_its_slot_back() -> None:
    import threading

    loader = fastdata.loader(RAW, batch_size=8, seed=3, backend="process", num_workers=1, persistent_workers=True)
    iterator = iter(loader)
    box = [next(iterator)]
    while not loader._lent[0]:  # the first batches travel pickled, until the slots are sized
        box = [next(iterator)]
    assert len(loader._lent[0]) == 1
    thread = threading.Thread(target=box.clear)
    thread.start()
    thread.join()
    kept = next(iterator)
    assert len(loader._lent[0]) == 1  # the batch dropped in the thread gave its slot back; the new one is lent
    del kept, iterator
    loader.close()


def test_a_lent_batch_outlives_close_and_its_segment_is_removed_with_the_spares() -> None:
    loader = fastdata.loader(RAW, batch_size=8, seed=3, backend="process", num_workers=1)
    kept = list(loader)
    names = slot_segments(loader)
    loader.close()
    assert names and sorted(spares.spares()) == sorted(names) and names <= segments()  # kept for the next loader
    spares.clear_spares()
    assert spares.spares() == [] and not (names & segments())  # unlinked at once ...
    want = batches(fastdata.loader(RAW, batch_size=8, seed=3))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(kept, want))  # ... mapped while a batch needs it


def test_zero_copy_views_at_close_keep_their_segment_from_every_other_loader() -> None:
    """Views handed out with zero_copy carry no lease: a segment with one alive is never reused."""
    spares.clear_spares()
    loader = fastdata.loader(RAW, batch_size=8, seed=3, backend="process", num_workers=1, zero_copy=2)
    views = list(itertools.islice(loader, 2))  # (a third draw would give the first one's slot back)
    names = slot_segments(loader)
    loader.close()
    assert names and spares.spares() == [] and not (names & segments())
    want = batches(fastdata.loader(RAW, batch_size=8, seed=3))
    other = fastdata.loader(RAW, batch_size=8, seed=4, backend="process", num_workers=1)
    assert len(batches(other)) == 12 and not (slot_segments(other) & names)
    other.close()
    assert all(torch.equal(a[0], b[0]) for a, b in zip(views, want[:2]))


def slot_segments(loader) -> set[str]:
    """The names of a running process loader's slot segments, every generation."""
    return {segment.name for generations in loader._generations for segment, _ in generations}


def test_a_closed_loaders_segments_serve_the_next_loader() -> None:
    """Pages written once are written again (no first-write cost): a new loader's workers take
    the segments a closed loader left, and read the same batches."""
    spares.clear_spares()
    first = fastdata.loader(RAW, batch_size=8, seed=3, backend="process", num_workers=2)
    want = [batch[0].clone() for batch in first]  # copies: no batch of the segments is held
    names = slot_segments(first)
    first.close()
    assert len(names) == 2 and sorted(spares.spares()) == sorted(names) and names <= segments()
    second = fastdata.loader(RAW, batch_size=8, seed=3, backend="process", num_workers=2)
    got = [batch[0].clone() for batch in second]
    assert slot_segments(second) == names and spares.spares() == []
    assert len(got) == 12 and all(torch.equal(a, b) for a, b in zip(want, got))
    second.close()


def test_batches_held_at_close_keep_their_slots_while_the_next_loader_reuses_the_segment() -> None:
    """A loop that keeps batches of a closed loader: the next loader of the same dataset and batch
    size starts in that loader's segment (its first batch straight into a slot, no growing), with
    the held batches' slots kept from its worker until they are dropped; they are never written over."""
    spares.clear_spares()
    first = fastdata.loader(RAW, batch_size=8, seed=3, backend="process", num_workers=1)
    kept = list(first)  # the worker lends 2 of its 3 slots (the loop keeps them), copies the rest
    names = slot_segments(first)
    first.close()
    assert len(names) == 1 and spares.spares() == sorted(names)
    want = batches(fastdata.loader(RAW, batch_size=8, seed=3))
    want_other = batches(fastdata.loader(RAW, batch_size=8, seed=4))
    grown = []
    second = fastdata.loader(RAW, batch_size=8, seed=4, backend="process", num_workers=1)
    original_grow = second._grow
    second._grow = lambda *args: grown.append(args) or original_grow(*args)
    got = batches(second)
    assert slot_segments(second) == names and grown == [] and spares.spares() == []
    assert sorted(second._lent[0]) == [0, 1]  # the two batches the loop still holds
    assert all(torch.equal(a[0], b[0]) for a, b in zip(got, want_other)) and len(got) == 12
    assert all(torch.equal(a[0], b[0]) for a, b in zip(kept, want))  # never written over
    del kept
    second._take_back()
    assert second._lent[0] == set()  # given back once dropped
    assert len(batches(second)) == 12
    second.close()


@pytest.mark.parametrize("then", [{"prefetch_factor": 2}, {"prefetch_factor": 2, "zero_copy": 2}])
def test_a_segment_with_more_batches_held_than_a_loader_can_spare_is_left_to_another(then: dict) -> None:
    """A loader with fewer slots (or zero_copy views to keep) than the batches held in a kept
    segment leave free does not take it: it reads its own, and the held batches stay intact for
    a loader that can take the segment around them."""
    spares.clear_spares()
    want = batches(fastdata.loader(RAW, batch_size=8, seed=3))
    first = fastdata.loader(RAW, batch_size=8, seed=3, backend="process", num_workers=1, prefetch_factor=4)
    kept = list(first)  # 4 of its 5 slots lent and kept
    names, slot_bytes = slot_segments(first), first._slot_bytes(0)
    first.close()
    other = fastdata.loader(RAW, batch_size=8, seed=3, backend="process", num_workers=1, timeout=60, **then)
    spares.remember_slot_size(other._size_key(), slot_bytes)  # its slots would be that size: it looks for the segment
    got = batches(other)
    assert len(got) == 12 and all(torch.equal(a[0], b[0]) for a, b in zip(got, want))
    assert not (slot_segments(other) & names) and spares.spares() == sorted(names)
    other.close()
    again = fastdata.loader(RAW, batch_size=8, seed=3, backend="process", num_workers=1, prefetch_factor=4)
    got = batches(again)
    assert slot_segments(again) == names and sorted(again._lent[0]) == [0, 1, 2, 3]
    assert len(got) == 12 and all(torch.equal(a[0], b[0]) for a, b in zip(got, want))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(kept, want))  # never written over
    again.close()
    del kept


def test_the_last_batch_of_a_plain_loop_does_not_keep_the_next_loader_from_its_segment() -> None:
    """``for images, labels in loader`` keeps the last batch bound when the next epoch's loader
    starts: the next loader's worker writes around it, in the same segment."""
    spares.clear_spares()
    want = [batches(fastdata.loader(RAW, batch_size=8, seed=epoch)) for epoch in range(3)]
    used = []
    for epoch in range(3):
        loader = fastdata.loader(RAW, batch_size=8, seed=epoch, backend="process", num_workers=1)
        for number, (images, labels) in enumerate(loader):
            assert torch.equal(images, want[epoch][number][0]) and torch.equal(labels, want[epoch][number][1])
        used.append(slot_segments(loader))
        if epoch:
            assert torch.equal(last, want[epoch - 1][-1][0])  # the batch bound across epochs, intact
        last = images
        loader.close()
    assert used[0] == used[1] == used[2]
    del images, last


def test_no_segment_is_kept_beyond_the_spare_limit(monkeypatch) -> None:
    spares.clear_spares()
    monkeypatch.setenv(spares.SPARE_ENV, "0")
    loader = fastdata.loader(RAW, batch_size=8, seed=3, backend="process", num_workers=1)
    assert len(batches(loader)) == 12
    names = slot_segments(loader)
    loader.close()
    assert names and spares.spares() == [] and not (names & segments())
    monkeypatch.setenv(spares.SPARE_ENV, str(2**40))
    older, old = shm.new_segment(8192), shm.new_segment(8192)
    assert spares.keep_spare(older) and spares.keep_spare(old) and spares.spares() == [older.name, old.name]
    monkeypatch.setenv(spares.SPARE_ENV, str(12288))  # room for one: the oldest kept make room
    new = shm.new_segment(8192)
    assert spares.keep_spare(new) and spares.spares() == [new.name]
    assert not ({older.name, old.name} & segments()) and new.name in segments()
    assert spares.take_spare(16384) is None  # none large enough
    taken, held = spares.take_spare(8192)
    assert taken.name == new.name and held == {} and spares.spares() == []
    shm.release(taken, unlink=True)


def test_a_segment_with_views_is_kept_only_with_leases_at_its_slots() -> None:
    spares.clear_spares()
    segment = shm.new_segment(4 * 8192)
    lease = (ctypes.c_char * 8192).from_buffer(segment.map, 2 * 8192)  # a batch lent from slot 2
    assert not spares.keep_spare(segment, 8192, None)  # views, and nothing says what they are
    assert not spares.keep_spare(segment, 8192 * 3, [lease])  # a lease that is no slot of that size
    assert spares.keep_spare(segment, 8192, [lease]) and spares.spares() == [segment.name]
    assert spares.take_spare(8192) is None  # only for slots of the size it was kept with ...
    assert spares.take_spare(4 * 8192, 8192) is None  # ... where a held batch may take a slot ...
    assert spares.take_spare(2 * 8192, 8192, max_held=1) is None  # ... one of the caller's slots
    taken, held = spares.take_spare(4 * 8192, 8192, max_held=1)
    assert taken is segment and list(held) == [2 * 8192] and held[2 * 8192] is lease
    assert spares.keep_spare(taken, 8192, [lease])
    del lease, held
    taken, held = spares.take_spare(8192)  # every batch dropped: any slot size
    assert taken is segment and held == {}
    shm.release(taken, unlink=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
def test_populate_maps_a_slots_pages_so_that_writing_them_faults_no_more() -> None:
    """A new mapping's pages fault one by one when first written; after populate they do not.
    (Counted in page faults, not timed.)"""
    size = 4 * 2**20
    owner = shm.new_segment(size)
    np.frombuffer(owner.map, dtype=np.uint8)[:] = 1  # the memory exists, as in a kept segment
    pages = size // mmap.PAGESIZE

    def faults_writing(populated: bool) -> int:
        mapping = shm.attach(owner.name)
        array = np.frombuffer(mapping.map, dtype=np.uint8)
        if populated and not populate(array.ctypes.data, size):
            pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        array[:: mmap.PAGESIZE] = 2
        after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        del array
        mapping.close()
        return after - before

    assert faults_writing(False) >= pages * 0.9  # the probe sees the faults
    assert faults_writing(True) < pages * 0.05
    shm.release(owner, unlink=True)


def test_batches_in_flight_when_slots_grow_are_read_from_the_segment_they_were_written_to() -> None:
    want = batches(fastdata.loader(Growing(), batch_size=4, shuffle=False))
    for zero_copy in (0, 1):  # a worker well ahead: batches 11- go into the small slots while batch 10 grows them
        loader = fastdata.loader(Growing(), batch_size=4, shuffle=False, backend="process", num_workers=1,
                                 prefetch_factor=8, zero_copy=zero_copy)
        got = batches(loader)
        assert len(got) == 20 and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, want))
        loader.close()


def test_zero_copy_views_stay_valid_across_a_worker_restart() -> None:
    want = batches(fastdata.loader(RAW, batch_size=8, shuffle=False))
    loader = fastdata.loader(RAW, batch_size=8, shuffle=False, backend="process", num_workers=1, zero_copy=2)
    *_, last = loader  # non-persistent: the workers stop at the end of the epoch
    iterator = iter(loader)
    first = next(iterator)  # new workers; `last` is within zero_copy=2 batches of it
    worker = loader._workers[0]  # 96 samples: 12 batches, more than its slots
    # until it has filled every slot it may use (each slot it was given holds a batch, taken or ready)
    wait_until(lambda: worker.consumed + worker.ready.get_value() >= worker.given, "the worker filling its slots")
    assert torch.equal(last[0], want[-1][0]) and torch.equal(first[0], want[0][0])
    del iterator
    loader.close()


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_worker_that_raises_is_named_with_the_batch_and_cause(backend: str) -> None:
    loader = fastdata.loader(FailsOn(13), batch_size=4, shuffle=False, backend=backend, num_workers=2)
    with pytest.raises(WorkerError) as info:
        list(loader)
    message = str(info.value)
    expected = "batch 3 (indices [12, 13, 14, 15] (4 samples))"
    if backend == "process":
        assert message.startswith(f"process backend: worker 1 failed on {expected}: ValueError: sample 13 is broken")
        assert "Traceback" in message and isinstance(info.value.__cause__, ValueError)
    else:
        assert message == f"thread backend: {expected} failed: ValueError: sample 13 is broken"
    getattr(loader, "close", lambda: None)()


def test_a_killed_worker_is_named_and_nothing_hangs() -> None:
    # timeout: were the death missed, the wait would end as a timeout, not with this message (hung, not slow)
    loader = fastdata.loader(FailsOn(21, "kill"), batch_size=4, shuffle=False, backend="process", num_workers=2,
                             timeout=120)
    with pytest.raises(WorkerError, match=r"^process backend: worker 1 \(pid \d+\) was killed by signal SIGKILL while "
                                          r"computing batch 5 \(indices \[20, 21, 22, 23\] \(4 samples\)\)"):
        list(loader)
    loader.close()


def test_a_worker_killed_by_sigbus_is_told_about_dev_shm() -> None:
    loader = fastdata.loader(FailsOn(21, "sigbus"), batch_size=4, shuffle=False, backend="process", num_workers=2,
                             timeout=120)
    with pytest.raises(WorkerError) as info:
        list(loader)
    assert re.fullmatch(r"process backend: worker 1 \(pid \d+\) was killed by signal SIGBUS while computing batch 5 "
                        r"\(indices \[20, 21, 22, 23\] \(4 samples\)\)\. A worker gets SIGBUS when /dev/shm is full "
                        r"\(\d+ MB free now\): give the container more shared memory \(docker run --shm-size=2g\), use "
                        r"fewer workers or smaller batches, or use backend='thread'\.", str(info.value)), str(info.value)
    loader.close()


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_timeout_is_reported(backend: str) -> None:
    loader = fastdata.loader(FailsOn(2, "hang"), batch_size=2, shuffle=False, backend=backend, num_workers=1,
                             timeout=1)
    with pytest.raises(WorkerError) as info:
        list(loader)
    assert "batch 1 (indices [2, 3] (2 samples))" in str(info.value) and "within timeout=1 s" in str(info.value)
    assert HANGING.is_set() == (backend == "thread")  # reported while the thread still hangs, not after it
    RELEASE_HANG.set()  # the hung thread returns (a hung process is killed by close)
    try:
        getattr(loader, "close", lambda: None)()
    finally:
        RELEASE_HANG.clear()


def test_a_failing_worker_init_fn_is_reported() -> None:
    def init(worker_id: int) -> None:
        raise RuntimeError(f"no GPU for worker {worker_id}")

    loader = fastdata.loader(WhoAmI(), batch_size=5, backend="process", num_workers=1, worker_init_fn=init)
    with pytest.raises(WorkerError, match=r"worker 0 failed in worker_init_fn: RuntimeError: no GPU for worker 0"):
        list(loader)
    loader.close()


def test_options_are_checked() -> None:
    data = TensorDataset(torch.zeros(4))
    cases = [
        (dict(backend="gpu"), "Unknown backend 'gpu'. Allowed: 'torch', 'thread', 'process'."),
        (dict(backend="thread", num_workers=1, multiprocessing_context="spawn"),
         "Option 'multiprocessing_context' does not apply to backend='thread'."),
        (dict(backend="thread", zero_copy=1), "zero_copy applies to backend='process' only (got backend='thread')."),
        (dict(backend="process", zero_copy=-1), "Invalid zero_copy -1."),
        (dict(num_workers=-2), "Invalid num_workers -2. Use 0, a positive integer or 'auto'."),
        (dict(backend="process", num_workers=2, prefetch_factor=0),
         "Invalid prefetch_factor 0. Use a number of batches per worker >= 1 (or None for 2)."),
        (dict(backend="thread", num_workers=2, prefetch_factor=1.5),
         "Invalid prefetch_factor 1.5. Use a number of batches per worker >= 1 (or None for 2)."),
    ]
    for kwargs, message in cases:
        with pytest.raises(InvalidOptionError, match="^" + message.replace("(", r"\(").replace(")", r"\)")
                           .replace(".", r"\.")):
            fastdata.loader(data, batch_size=2, **kwargs)


SCRIPT = textwrap.dedent("""
    import os, signal, sys, time, torch, fastdata
    from torch.utils.data import Dataset

    # Ctrl-C as in a terminal: a test run started in the background by a shell without job
    # control (`cmd &`) hands its children SIGINT ignored, and Python then keeps it ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)

    class Slow(Dataset):
        def __len__(self): return 10_000
        def __getitem__(self, i):
            time.sleep(0.002)
            return torch.zeros(8), i

    if __name__ == "__main__":
        loader = fastdata.loader(Slow(), batch_size=8, backend="process", num_workers=2, persistent_workers=True)
        mode = sys.argv[1]
        for number, batch in enumerate(loader):
            if number == 5:
                print("running", flush=True)
                if mode == "exception":
                    raise RuntimeError("the training step failed")
                if mode == "normal":
                    break
        loader.close() if mode == "normal" else None
""")


@pytest.mark.parametrize("mode", ["normal", "exception", "ctrl-c", "sigkill"])
def test_no_segment_outlives_the_main_process(tmp_path: Path, mode: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    process = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=tmp_path)
    assert process.stdout.readline().strip() == "running"
    mine = {name for name in segments() if name.startswith(shm.segment_prefix(process.pid))}
    assert mine, "the loader made no segment"
    if mode == "ctrl-c":
        process.send_signal(signal.SIGINT)
    elif mode == "sigkill":
        process.kill()
    stdout, stderr = finish(process, timeout=60, what=f"the training script ({mode})")
    if mode == "ctrl-c":  # the main traceback, none from workers (what came back is in the message)
        assert "KeyboardInterrupt" in stderr and stderr.count("Traceback") == 1, (
            process.returncode, stdout[-500:], stderr[-2000:])
    left = {name for name in segments() if name.startswith(shm.segment_prefix(process.pid))}
    if mode != "sigkill":
        assert left == set(), stderr
        return
    assert left and set(stale_segments()) >= left  # a killed process cannot clean up ...
    loader = fastdata.loader(TensorDataset(torch.zeros(4)), batch_size=2, backend="process", num_workers=1)
    list(loader)  # ... the next loader that starts removes what it left
    loader.close()
    assert {name for name in segments() if name.startswith(shm.segment_prefix(process.pid))} == set()


def test_the_consumer_polls_only_where_a_core_is_left_for_it(monkeypatch):
    from fastdata.machine import spare_core
    from fastdata.machine import usable_cores

    cores = usable_cores()
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert spare_core(cores - 1) and not spare_core(cores)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores))  # torchrun: one rank per core, each with its consumer
    assert not spare_core(1)
    assert spare_core(0)  # no workers: each rank's consumer has its core
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "not a number")
    assert spare_core(cores - 1)
