"""The torch backend's hand-over: DataLoader workers write a fastdata reader's batches into
shared memory, reusing a few segments per worker once the loop has let go of a batch, and never
writing over a batch the loop still holds."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from PIL import Image

import fastdata
from conftest import finish, pattern, save, wait_until
from fastdata.loading import SharedBatches, spares
from fastdata.reader.handover import MAGIC, SlotConvert, slot_header

COUNT = 40  # images of 8x6: 40 batches of one, 20 of two


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("handover")
    for i in range(COUNT):
        save(Image.fromarray(pattern(8, 6, seed=i)), root / "src" / ("a" if i % 2 else "b") / f"{i:02d}.png")
    fastdata.convert(root / "src", root / "raw.npy", workers=0)
    return root / "raw.npy"


@pytest.fixture(autouse=True)
def no_kept_segments():
    spares.clear_spares()  # segments an earlier test's loaders left for the next workers
    yield
    spares.clear_spares()


def serial(ds, **options) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images.clone(), labels.clone())
            for images, labels in fastdata.loader(ds, num_workers=0, shuffle=True, seed=5, **options)]


def test_batches_come_in_shared_slots_that_are_reused(raw: Path) -> None:
    ds = fastdata.open_dataset(raw)
    expected = serial(ds, batch_size=1)
    loader = fastdata.loader(ds, batch_size=1, num_workers=1, shuffle=True, seed=5)
    headers = []
    for (images, labels), (want_images, want_labels) in zip(loader, expected, strict=True):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
        assert images.untyped_storage().is_shared()
        headers.append(slot_header(images))
    assert all(h is not None and h[0] == MAGIC and h[1] == 0 for h in headers), headers
    slots = [h[2] for h in headers]
    assert set(slots) <= set(range(4))  # prefetch_factor 2 + 2 slots per worker
    assert len({h[3] for h in headers}) == COUNT  # a new token each time a slot is written
    assert isinstance(loader.worker_init_fn, SharedBatches) and loader.worker_init_fn.count == 4


def test_labels_leave_in_their_images_slot_and_a_held_label_keeps_the_slot(raw: Path) -> None:
    ds = fastdata.open_dataset(raw)
    expected = serial(ds, batch_size=2)
    loader = fastdata.loader(ds, batch_size=2, num_workers=2, shuffle=True, seed=5)
    assert isinstance(loader.collate_fn, SlotConvert)
    held, in_slots = {}, 0
    for index, (images, labels) in enumerate(loader):
        assert torch.equal(images, expected[index][0]) and torch.equal(labels, expected[index][1])
        if slot_header(images) is not None:  # (not when the loop held every slot of the worker: a new segment)
            assert labels.untyped_storage().data_ptr() == images.untyped_storage().data_ptr()
            assert labels.dtype == torch.int64 and labels.storage_offset() * 8 == 64 + 2 * 8 * 6 * 3  # after the pixels
            in_slots += 1
        if index in (0, 3, 5, 6):  # two of each worker's slots
            held[index] = labels  # the images dropped: the labels alone keep the slot
    for index, labels in held.items():
        assert torch.equal(labels, expected[index][1]), f"batch {index}'s slot was written over"
    assert in_slots >= 10


def test_labels_that_do_not_fit_after_the_pixels_leave_as_before() -> None:
    from fastdata.reader.handover import BatchSlots, _WorkerSlots, as_tensor, into_slot_tail, tail_bytes

    assert tail_bytes((2, 8, 6, 3)) == 64 and tail_bytes((9, 8, 6, 3)) == 128
    worker = _WorkerSlots(BatchSlots(1, 2), 0)
    images = as_tensor(worker.allocate((2, 8, 6, 3), "uint8"))
    labels, boxes = torch.tensor([3, 4]), torch.arange(40, dtype=torch.int64)  # 16 bytes fit, 320 do not
    moved = into_slot_tail([images, labels, boxes])
    assert moved[0] is images and moved[2] is boxes
    assert moved[1].untyped_storage().data_ptr() == images.untyped_storage().data_ptr()
    assert moved[1].tolist() == [3, 4] and slot_header(moved[1]) is None
    assert into_slot_tail([labels, boxes]) == [labels, boxes]  # no slot among them: nothing moves


@pytest.mark.parametrize("keep", [1, 3])
def test_a_batch_the_loop_keeps_is_never_written_over(raw: Path, keep: int) -> None:
    """Every ``keep``-th batch is kept (not copied) to the end; the rest are dropped, so their
    slots are written again while the kept ones are still held."""
    ds = fastdata.open_dataset(raw)
    expected = serial(ds, batch_size=1)
    kept, reused = {}, []
    for index, (images, _) in enumerate(fastdata.loader(ds, batch_size=1, num_workers=2, shuffle=True, seed=5)):
        header = slot_header(images)
        if index % keep == 0:
            kept[index] = images
        elif header is not None:
            reused.append(header[1:3])
    for index, images in kept.items():
        assert torch.equal(images, expected[index][0]), f"batch {index} was written over"
    if keep > 1:
        assert len(reused) > len(set(reused)), "no slot was written twice"
    else:  # every slot held: the rest came in new segments, as a DataLoader's do
        assert sum(slot_header(images) is not None for images in kept.values()) == 2 * 4


def test_an_epoch_left_midway_then_new_and_persistent_workers_give_the_same_batches(raw: Path) -> None:
    ds = fastdata.open_dataset(raw)
    expected = serial(ds, batch_size=2)
    loader = fastdata.loader(ds, batch_size=2, num_workers=2, shuffle=True, seed=5)
    for index, _ in enumerate(loader):  # batches in flight are never received: their slots stay taken
        if index == 3:
            break
    loader.set_epoch(0)
    got = list(loader)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, expected, strict=True))
    persistent = fastdata.loader(ds, batch_size=2, num_workers=2, shuffle=True, seed=5, persistent_workers=True)
    for epoch in range(2):
        persistent.set_epoch(0)
        slots = []
        for (images, _), (want, _) in zip(persistent, expected, strict=True):
            assert torch.equal(images, want), epoch
            slots.append(slot_header(images)[1:3])
        assert len(set(slots)) < len(slots)


def segment_ids(loader, expected) -> list[int]:
    """The segment id of each batch of an epoch of ``loader`` (each batch dropped before the next
    but the last), checked against ``expected``."""
    ids = []
    for (images, labels), (want_images, want_labels) in zip(loader, expected, strict=True):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
        ids.append(slot_header(images)[4])
    return ids


def test_a_new_loaders_workers_write_into_the_segments_of_the_last_epochs(raw: Path) -> None:
    ds = fastdata.open_dataset(raw)
    expected = serial(ds, batch_size=2)
    first = segment_ids(fastdata.loader(ds, batch_size=2, num_workers=2, shuffle=True, seed=5), expected)
    # every segment kept but the last batch's, still held when its epoch ended
    assert spares.kept_storages() == len(set(first)) - 1 >= 2
    second = segment_ids(fastdata.loader(ds, batch_size=2, num_workers=2, shuffle=True, seed=5), expected)
    assert len(set(second) & set(first)) >= 2 and first[-1] not in second
    assert len(set(second) - set(first)) < len(set(second))


def test_a_batch_held_after_its_epoch_is_never_given_to_new_workers(raw: Path) -> None:
    ds = fastdata.open_dataset(raw)
    expected = serial(ds, batch_size=2)
    held = []
    for index, (images, _) in enumerate(fastdata.loader(ds, batch_size=2, num_workers=2, shuffle=True, seed=5)):
        if index in (0, 7):
            held.append((index, slot_header(images)[4], images))
    for _ in range(2):  # two more loaders, each writing into what the one before left
        ids = segment_ids(fastdata.loader(ds, batch_size=2, num_workers=2, shuffle=True, seed=5), expected)
        assert not {segment for _, segment, _ in held} & set(ids)
    for index, _, images in held:
        assert torch.equal(images, expected[index][0]), f"batch {index} was written over"


def test_no_segment_is_kept_from_persistent_workers_an_epoch_left_midway_or_past_the_limit(raw: Path, monkeypatch) -> None:
    ds = fastdata.open_dataset(raw)
    persistent = fastdata.loader(ds, batch_size=2, num_workers=2, shuffle=True, seed=5, persistent_workers=True)
    assert len(list(persistent)) == 20 and spares.kept_storages() == 0  # its workers still hold them
    for index, _ in enumerate(fastdata.loader(ds, batch_size=2, num_workers=2, shuffle=True, seed=5)):
        if index == 3:
            break  # its workers may still be writing: nothing is kept
    assert spares.kept_storages() == 0
    monkeypatch.setenv(spares.SPARE_ENV, "0")
    assert sum(1 for _ in fastdata.loader(ds, batch_size=2, num_workers=2, shuffle=True, seed=5)) == 20
    assert spares.kept_storages() == 0
    monkeypatch.setenv(spares.SPARE_ENV, str(2 * (64 + 2 * 8 * 6 * 3 + 64)))  # two segments of a batch of 2 and its labels
    assert sum(1 for _ in fastdata.loader(ds, batch_size=2, num_workers=2, shuffle=True, seed=5)) == 20
    assert spares.kept_storages() == 2


def test_spawned_workers_share_the_slots_and_run_the_users_worker_init_fn(raw: Path) -> None:
    ds = fastdata.open_dataset(raw)
    expected = serial(ds, batch_size=4)
    forked = set(segment_ids(fastdata.loader(ds, batch_size=4, num_workers=1, shuffle=True, seed=5), expected))
    kept = spares.kept_storages()
    assert kept == len(forked) - 1
    loader = fastdata.loader(ds, batch_size=4, num_workers=1, shuffle=True, seed=5,
                             multiprocessing_context="spawn", worker_init_fn=abs)
    got = [(slot_header(images), images.clone()) for images, _ in loader]
    assert all(torch.equal(images, want[0]) for (_, images), want in zip(got, expected, strict=True))
    assert all(header is not None for header, _ in got)
    assert not {header[4] for header, _ in got} & forked  # a spawned worker makes its own segments
    assert spares.kept_storages() > kept  # and leaves them for the next workers
    assert loader.worker_init_fn.fn is abs  # a builtin: picklable whatever other tests imported


@pytest.mark.parametrize("options", [{"batch_transform": lambda images: images.flip(-1)},
                                     {"image_format": "numpy"}])
def test_batches_that_leave_the_worker_as_new_tensors_take_no_slot(raw: Path, options: dict) -> None:
    ds = fastdata.open_dataset(raw, **options)
    plain = fastdata.open_dataset(raw)
    for (images, _), (want, _) in zip(fastdata.loader(ds, batch_size=4, num_workers=1, shuffle=True, seed=5),
                                      serial(plain, batch_size=4), strict=True):
        images = torch.as_tensor(images)
        assert slot_header(images) is None
        assert torch.equal(images, want.flip(-1) if "batch_transform" in options else want.permute(0, 2, 3, 1))


def test_the_other_backends_and_the_serial_loop_take_no_slot(raw: Path) -> None:
    ds = fastdata.open_dataset(raw)
    for backend, workers in (("torch", 0), ("thread", 2), ("process", 2)):
        batches = list(fastdata.loader(ds, batch_size=4, num_workers=workers, backend=backend))
        assert all(slot_header(images) is None for images, _ in batches), backend


def test_with_file_system_sharing_no_segment_is_kept(raw: Path) -> None:
    """torch's other sharing strategy names segments by file: a second mapping of one is not made
    (``_share_fd_cpu_`` would copy the batch into a new segment), so nothing is kept."""
    import torch.multiprocessing

    ds = fastdata.open_dataset(raw)
    expected = serial(ds, batch_size=2)
    before = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        for _ in range(2):
            ids = segment_ids(fastdata.loader(ds, batch_size=2, num_workers=2, shuffle=True, seed=5), expected)
            assert len(set(ids)) >= 2 and spares.kept_storages() == 0
    finally:
        torch.multiprocessing.set_sharing_strategy(before)


def _retire_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name == "fastdata-retire"}


def _epoch_watching_the_stop(loader) -> tuple[list[int], list[bool]]:
    """The labels of one epoch of ``loader``, and for each batch whether a thread stopping this
    epoch's workers had started by the time it arrived."""
    earlier = _retire_threads()  # an earlier epoch's may still be joining its workers
    labels, started = [], []
    for _, batch_labels in loader:
        labels += batch_labels.tolist()
        started.append(bool(_retire_threads() - earlier))
    return labels, started


@pytest.mark.parametrize("per_sample", [False, True])
def test_the_last_batch_of_an_epoch_starts_the_workers_stop_behind_the_loop(raw: Path, per_sample: bool) -> None:
    ds = fastdata.open_dataset(raw)
    if per_sample:  # a plain Dataset: the DataLoader collates per-sample reads, no slots
        ds = torch.utils.data.Subset(ds, range(COUNT))
    expected = [label for _, labels in serial(fastdata.open_dataset(raw), batch_size=3) for label in labels.tolist()]
    loader = fastdata.loader(ds, batch_size=3, num_workers=2, shuffle=True, seed=5)
    for epoch in range(2):
        loader.set_epoch(0)
        labels, started = _epoch_watching_the_stop(loader)
        assert labels == expected, epoch  # every batch, the last included, reached the loop
        assert started == [False] * 13 + [True]  # 14 batches; the stop started with the last only
    wait_until(lambda: not _retire_threads() and not multiprocessing.active_children(), "the workers' exit")


def test_a_resumed_epoch_ends_with_its_own_last_batch_in_any_layout(raw: Path) -> None:
    ds = fastdata.open_dataset(raw)
    loader = fastdata.loader(ds, batch_size=4, num_workers=2, shuffle=True, seed=5)
    seen = []
    for _, labels in loader:
        seen += labels.tolist()
        if len(seen) == 12:
            break
    state = loader.state_dict()
    same = fastdata.loader(ds, batch_size=4, num_workers=2, shuffle=True, seed=5)
    same.load_state_dict(state)
    labels, started = _epoch_watching_the_stop(same)
    assert len(started) == 7 and started[-1] and not any(started[:-1])
    assert sorted(seen + labels) == sorted(ds.labels.tolist())  # the rest of the epoch, each sample once
    other = fastdata.loader(ds, batch_size=3, num_workers=2, shuffle=True, seed=5)  # another batch size
    other.load_state_dict(state)
    labels, started = _epoch_watching_the_stop(other)
    assert len(started) == 10 and started[-1] and not any(started[:-1])  # 28 samples left: 9 batches of 3, 1 of 1
    assert sorted(seen + labels) == sorted(ds.labels.tolist())


def test_persistent_workers_and_an_epoch_left_midway_start_no_stop_thread(raw: Path) -> None:
    ds = fastdata.open_dataset(raw)
    persistent = fastdata.loader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    for _ in range(2):
        assert _epoch_watching_the_stop(persistent)[1] == [False] * 10
    loader = fastdata.loader(ds, batch_size=4, num_workers=2)
    before = _retire_threads()
    for index, _ in enumerate(loader):
        if index == 8:
            break
    assert _retire_threads() <= before  # a DataLoader left midway is stopped as it always was


EXIT_SCRIPT = """
import pathlib, sys, time
import multiprocessing.util
import torch
import fastdata

def exits_slowly(worker_id):  # a worker whose exit takes a while, then leaves a mark that it exited normally
    mark = pathlib.Path(f"exited-{worker_id}")
    multiprocessing.util.Finalize(None, lambda: (time.sleep(0.3), mark.touch()), exitpriority=0)

class Numbers(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        return torch.full((3,), index)

for batch in fastdata.loader(Numbers(), batch_size=8, num_workers=2, worker_init_fn=exits_slowly):
    pass
print("done", flush=True)
"""


def test_a_script_that_ends_with_the_epoch_lets_the_workers_exit_normally(tmp_path: Path) -> None:
    """The stop behind the loop is still under way when the script ends: the interpreter waits for
    it, as it would have waited in the loop, instead of killing workers that are exiting."""
    script = tmp_path / "train.py"
    script.write_text(EXIT_SCRIPT)
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=tmp_path)
    stdout, stderr = finish(process, what="the training script")
    assert (process.returncode, stdout, stderr) == (0, "done\n", "")
    assert sorted(path.name for path in tmp_path.glob("exited-*")) == ["exited-0", "exited-1"]
