"""Reading across ranks and resuming mid-epoch: each epoch is split across distributed ranks, then
across each rank's workers, exactly once (``even=False``) or evenly like ``DistributedSampler``
(``even=True``); a loader's ``state_dict`` continues an epoch in a new process with exactly the
batches not yet consumed, for every backend and ``num_workers``."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import pickle
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from PIL import Image
from torch.utils.data import DataLoader, DistributedSampler

import fastdata
from fastdata.errors import InvalidOptionError
from fastdata.formats.tar import TarIndexedDataset
from fastdata.loading.samplers import BatchIndexSampler, ChunkShuffleSampler

from conftest import WRITABLE, convert_to, pattern, save

BACKENDS = ("torch", "thread", "process")
SAMPLES = 23  # odd, and not a multiple of the batch size: padding, short batches and uneven shares all occur
BATCH = 4


def digest(image: torch.Tensor) -> str:
    return hashlib.blake2b(image.numpy().tobytes(), digest_size=8).hexdigest()


def batch_digests(batch) -> list[str]:
    return [digest(image) for image in batch[0]]


def map_style(path: Path):
    """The map-style reader of a converted dataset (tar: the indexed one)."""
    ds = fastdata.open_dataset(path)
    return TarIndexedDataset(path) if isinstance(ds, torch.utils.data.IterableDataset) else ds


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "folder"
    for i in range(SAMPLES):
        save(Image.fromarray(pattern(8, 6, seed=100 + i)), root / f"c{i % 3}" / f"{i:02d}.png")
    return root


# --- the sampler's split -------------------------------------------------------------------


def shares(world_size: int, **options) -> list[list[int]]:
    return [[i for batch in BatchIndexSampler(SAMPLES, BATCH, seed=7, rank=rank, world_size=world_size, **options)
             for i in batch.tolist()] for rank in range(world_size)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_uneven_split_reads_every_sample_exactly_once(world_size):
    per_rank = shares(world_size, even=False)
    assert sorted(i for share in per_rank for i in share) == list(range(SAMPLES))
    sizes = [len(share) for share in per_rank]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("world_size", [2, 3, 4, 5])
@pytest.mark.parametrize("drop_last", [False, True])
def test_even_split_sizes_match_distributed_sampler(world_size, drop_last):
    per_rank = shares(world_size, even=True, drop_last=drop_last)
    for rank, share in enumerate(per_rank):
        torch_share = DistributedSampler(range(SAMPLES), num_replicas=world_size, rank=rank, drop_last=drop_last)
        expected = len(torch_share)
        # the loader's drop_last also drops each rank's short last batch, as DataLoader(drop_last=True) does
        assert len(share) == (expected // BATCH * BATCH if drop_last else expected)
    counts = Counter(i for share in per_rank for i in share)
    if drop_last:  # at most once; the N % world_size left out
        assert max(counts.values()) == 1
    else:  # every sample, and the padding repeats the epoch's first samples
        assert set(counts) == set(range(SAMPLES))
        padding = -SAMPLES % world_size
        order = np.random.default_rng([7, 0]).permutation(SAMPLES)
        assert sorted(i for i, n in counts.items() if n == 2) == sorted(order[:padding].tolist())
        assert sum(counts.values()) == SAMPLES + padding


def test_ranks_cut_one_permutation_then_batch():
    """Rank r reads a contiguous block of the epoch's order, in batches of its own."""
    order = np.random.default_rng([7, 0]).permutation(SAMPLES)
    batches = list(BatchIndexSampler(SAMPLES, BATCH, seed=7, rank=1, world_size=2, even=False))
    assert [b.tolist() for b in batches] == [sorted(order[11 + k : min(11 + k + BATCH, 23)].tolist())
                                            for k in range(0, 12, BATCH)]


def test_chunk_sampler_ranks_keep_whole_windows():
    per_rank = [list(ChunkShuffleSampler(100, chunk_images=10, window_chunks=2, seed=3, rank=r, world_size=2,
                                         even=False)) for r in range(2)]
    assert sorted(per_rank[0] + per_rank[1]) == list(range(100))
    for share in per_rank:  # 50 samples = 2.5 windows of 20: at most 3 windows touched, 6 chunks
        assert len({i // 10 for i in share}) <= 6


def test_several_ranks_need_one_seed():
    with pytest.raises(InvalidOptionError) as error:
        BatchIndexSampler(SAMPLES, BATCH, rank=0, world_size=2)
    assert str(error.value) == (
        "world_size=2 without a seed: every rank must shuffle alike. Pass the same seed= on every rank "
        "(or initialise torch.distributed, and rank 0's seed is shared)."
    )
    with pytest.raises(InvalidOptionError, match=r"Pass both rank= and world_size="):
        fastdata.loader(torch.utils.data.TensorDataset(torch.arange(5)), rank=0)
    with pytest.raises(InvalidOptionError, match=r"Invalid rank=2, world_size=2\."):
        BatchIndexSampler(SAMPLES, BATCH, seed=0, rank=2, world_size=2)


# --- state_dict / load_state_dict ----------------------------------------------------------


def test_state_of_a_sampler_between_and_within_epochs():
    ds = torch.utils.data.TensorDataset(torch.arange(SAMPLES))
    loader = fastdata.loader(ds, batch_size=BATCH, seed=1)
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["consumed"] == 0
    for number, _ in enumerate(loader):
        if number == 2:
            assert (loader.state_dict()["epoch"], loader.state_dict()["consumed"]) == (0, 3)
    assert (loader.state_dict()["epoch"], loader.state_dict()["consumed"]) == (1, 0)


def test_set_epoch_after_load_keeps_the_position_of_that_epoch_only():
    ds = torch.utils.data.TensorDataset(torch.arange(SAMPLES))
    reference = [b[0].tolist() for b in fastdata.loader(ds, batch_size=BATCH, seed=1)]
    state = {**fastdata.loader(ds, batch_size=BATCH, seed=1).state_dict(), "consumed": 4}
    resumed = fastdata.loader(ds, batch_size=BATCH, seed=1)
    resumed.load_state_dict(state)
    resumed.set_epoch(0)  # the usual loop: set_epoch(epoch) at the top of every epoch
    assert [b[0].tolist() for b in resumed] == reference[4:]
    other = fastdata.loader(ds, batch_size=BATCH, seed=1)
    other.load_state_dict(state)
    other.set_epoch(3)
    assert len(list(other)) == len(reference)


@pytest.mark.parametrize(("change", "message"), [
    ({"length": 24}, "Cannot resume: the saved state has dataset length=24 but this loader has 23. An epoch's order "
                     "depends on the length: resume over the dataset the state was saved with, or start the next "
                     "epoch without the state (loader.set_epoch(state['epoch'] + 1))."),
    ({"seed": 2}, "Cannot resume: the saved state has seed=2 but this loader was built with seed=1. Build it with "
                  "seed=2, or without seed= (it then takes the state's)."),
    ({"order": "sequential"}, "Cannot resume: the saved state has order='sequential' but this loader has "
                              "'permutation'. Build the loader with the saved one's shuffle (and chunk options)."),
    ({"version": 3}, "Cannot resume: the state has version 3, but this fastdata reads state versions 1 to 2. "
                     "Upgrade fastdata to resume from it."),
])
def test_a_state_that_cannot_continue_this_order_is_refused(change, message):
    ds = torch.utils.data.TensorDataset(torch.arange(SAMPLES))
    loader = fastdata.loader(ds, batch_size=BATCH, seed=1)
    with pytest.raises(InvalidOptionError) as error:
        loader.load_state_dict({**loader.state_dict(), **change})
    assert str(error.value) == message
    with pytest.raises(InvalidOptionError, match=r"^Not a BatchIndexSampler state: expected a dict"):
        loader.load_state_dict({"epoch": 0})


RESUME_SCRIPT = textwrap.dedent("""
    import pickle, sys
    import torch
    import fastdata
    from test_distributed import BACKENDS, BATCH, batch_digests, map_style

    path, phase, states_file, out_file = sys.argv[1:]
    cases = [(backend, workers, rank, world) for backend in BACKENDS for workers in (0, 2)
             for world in (1, 2) for rank in range(world)]
    states = {} if phase == "first" else pickle.load(open(states_file, "rb"))
    seen = {}
    for case in cases:
        backend, workers, rank, world = case
        seed = None if world == 1 else 5  # one rank alone: the seed is drawn here and travels in the state
        loader = fastdata.loader(map_style(path), batch_size=BATCH, num_workers=workers, backend=backend,
                                 seed=seed, rank=rank if world > 1 else None, world_size=world if world > 1 else None,
                                 even=False)
        batches = []
        if phase == "first":
            for number, batch in enumerate(loader):
                batches.append(batch_digests(batch))
                if number == 1:
                    states[case] = loader.state_dict()
                    break
        else:
            loader.load_state_dict(states[case])
            batches = [batch_digests(batch) for batch in loader]
            seen[("next", case)] = [batch_digests(batch) for batch in loader]
        seen[case] = batches
    pickle.dump(states, open(states_file, "wb"))
    pickle.dump(seen, open(out_file, "wb"))
""")


@pytest.mark.parametrize("name_store", [("npy", "raw"), ("tar", "encoded")], ids=["npy-raw", "tar-encoded"])
def test_resume_in_a_new_process_yields_exactly_the_batches_not_consumed(folder, tmp_path, name_store):
    path = convert_to(folder, tmp_path, *name_store)
    script = tmp_path / "resume.py"
    script.write_text(RESUME_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    states, first, second = tmp_path / "states.pkl", tmp_path / "first.pkl", tmp_path / "second.pkl"
    for phase, out in (("first", first), ("second", second)):
        done = subprocess.run([sys.executable, str(script), str(path), phase, str(states), str(out)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
    saved, before, after = (pickle.loads(p.read_bytes()) for p in (states, first, second))
    for case, state in saved.items():
        backend, workers, rank, world = case
        assert (state["epoch"], state["consumed"], state["backend"]) == \
            (0, 2, backend)  # the backend asked for, at num_workers=0 too (every backend runs the serial loop there)
        uninterrupted = fastdata.loader(map_style(path), batch_size=BATCH, seed=state["seed"], even=False,
                                        rank=rank if world > 1 else None, world_size=world if world > 1 else None)
        epochs = [[batch_digests(b) for b in uninterrupted] for _ in range(2)]
        assert before[case] + after[case] == epochs[0], case
        assert after[("next", case)] == epochs[1], case  # and then the epochs go on as usual
        assert len(after[case]) == len(epochs[0]) - 2


def test_a_state_moves_between_backends(folder, tmp_path):
    ds = map_style(convert_to(folder, tmp_path, "hdf5", "raw"))
    reference = [batch_digests(b) for b in fastdata.loader(ds, batch_size=BATCH, seed=2)]
    loader = fastdata.loader(ds, batch_size=BATCH, seed=2, backend="process", num_workers=2)
    got = []
    for batch in loader:
        got.append(batch_digests(batch))
        if len(got) == 3:
            state = loader.state_dict()
            break
    resumed = fastdata.loader(ds, batch_size=BATCH, seed=2, backend="thread", num_workers=2)
    resumed.load_state_dict(state)
    assert got + [batch_digests(b) for b in resumed] == reference


# --- a real process group ----------------------------------------------------------------


def _reference(path: Path) -> Counter:
    ds = map_style(path)
    return Counter(digest(ds[i][0]) for i in range(len(ds)))


def _join_other_threads() -> None:
    """Wait until this process runs no Python thread but its main one, so that the next fork copies
    none midway: a DataLoader's iterator closes its index queues without joining their feeder
    threads (``cancel_join_thread``), and a worker forked while one of them is still running or
    ending can block forever in CPython's after-fork clean-up of the stale thread states (gdb:
    PyOS_AfterFork_Child -> _PyThreadState_DeleteExcept). gloo's threads are not Python threads."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread():
            thread.join(timeout=30)


def _rank_main(rank: int, world_size: int, init_file: str, paths: list[str], result_file: str, heartbeat: str) -> None:
    # as under torchrun, where each rank is a main process: workers fork (a spawned rank's default is
    # spawn, which would start a fresh interpreter per worker per epoch)
    multiprocessing.set_start_method("fork", force=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        results = {}
        for path in map(Path, paths):
            for backend in BACKENDS:
                # no seed: rank 0 draws it and every rank gets it; no rank/world_size: from the process group
                loader = fastdata.loader(map_style(path), batch_size=BATCH, num_workers=2, backend=backend,
                                         even=False)
                even = fastdata.loader(map_style(path), batch_size=BATCH, num_workers=2, backend=backend)
                for epoch in range(2):
                    loader.set_epoch(epoch)
                    mine = [d for batch in loader for d in batch_digests(batch)]
                    _join_other_threads()
                    evens = [len(batch[0]) for batch in even]
                    _join_other_threads()
                    results[(path.name, backend, epoch)] = (mine, evens)
                    _beat(heartbeat, rank, path.name, backend, epoch)
            if path.suffix != ".h5" and (path / "index.json").exists():  # the streaming reader keeps its own split
                stream = fastdata.TarDataset(path, seed=11)
                for epoch in range(2):
                    stream.set_epoch(epoch)
                    mine = [digest(image) for image, _ in DataLoader(stream, batch_size=None, num_workers=2)]
                    _join_other_threads()
                    results[(path.name, "TarDataset", epoch)] = (mine, [])
                    _beat(heartbeat, rank, path.name, "TarDataset", epoch)
        gathered = [None] * world_size
        dist.all_gather_object(gathered, results)
        if rank == 0:
            Path(result_file).write_bytes(pickle.dumps(gathered))
    finally:
        dist.destroy_process_group()


def _beat(heartbeat: str, *step: object) -> None:
    """One more step done (a line in the file the test watches for progress)."""
    with open(heartbeat, "a") as file:
        file.write(" ".join(map(str, step)) + "\n")


def _ranks_finished(rendezvous: Path, paths: list[Path], result_file: Path, *, stall_s: float) -> bool:
    """Run the two ranks; False (both killed) when they hang: no rank finished a step (an epoch
    of one reader, about a second alone) for ``stall_s``, however slowly a loaded machine runs."""
    heartbeat = rendezvous.with_suffix(".steps")
    context = mp.spawn(_rank_main, args=(2, str(rendezvous), [str(p) for p in paths], str(result_file),
                                         str(heartbeat)), nprocs=2, join=False)
    steps, progress = -1, time.monotonic()
    while time.monotonic() - progress < stall_s:
        if context.join(timeout=1):  # raises when a rank failed
            return True
        done = heartbeat.stat().st_size if heartbeat.exists() else 0
        if done != steps:
            steps, progress = done, time.monotonic()
    for process in context.processes:
        process.kill()
        process.join()
    return False


def test_two_gloo_ranks_read_every_sample_exactly_once(folder, tmp_path):
    paths = [convert_to(folder, tmp_path, name, store) for name, store in WRITABLE]
    result_file = tmp_path / "gathered.pkl"
    for attempt in (1, 2):
        # ~11 s alone; a hang (see _join_other_threads) is caught after 90 s without a step, then one more try
        if _ranks_finished(tmp_path / f"rendezvous-{attempt}", paths, result_file, stall_s=90):
            break
    else:
        pytest.fail("the two ranks hung: no step done in 90 s, twice (a worker blocked after fork?)")
    gathered = pickle.loads(result_file.read_bytes())
    references = {p.name: _reference(p) for p in paths}
    assert set(gathered[0]) == set(gathered[1])
    readers = Counter(reader for _, reader, _ in gathered[0])
    assert readers == Counter({**{b: 2 * len(paths) for b in BACKENDS},
                               "TarDataset": 2 * sum(name == "tar" for name, _ in WRITABLE)})
    for key in gathered[0]:
        name, reader, epoch = key
        first, second = gathered[0][key][0], gathered[1][key][0]
        assert Counter(first + second) == references[name], key
        if reader != "TarDataset":
            assert {len(first), len(second)} == {11, 12}, key
            # even=True: the same batches per rank, as DDP needs (12 samples each, one padded)
            assert gathered[0][key][1] == gathered[1][key][1] == [4, 4, 4], key
    for name in references:  # set_epoch reshuffles
        assert gathered[0][(name, "thread", 0)][0] != gathered[0][(name, "thread", 1)][0]


def test_the_ddp_example_trains_on_two_ranks_and_resumes_mid_epoch(folder, tmp_path):
    """examples/ddp_train.py, as docs/scale-out.md runs it: torchrun, 2 ranks, a stop after 3
    batches, then a restart that finishes the epoch from batch 3 on every rank."""
    data = convert_to(folder, tmp_path, "npy", "raw")
    example = Path(__file__).parent.parent / "examples" / "ddp_train.py"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(example),
               str(data), "--epochs", "2", "--batch-size", "2", "--checkpoint", str(tmp_path / "ck.pt")]
    stopped = subprocess.run(command + ["--stop-after", "3"], capture_output=True, text=True, timeout=300)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    state = torch.load(tmp_path / "ck.pt", weights_only=False)
    assert [(s["rank"], s["epoch"], s["consumed"], s["world_size"]) for s in state["loaders"]] == \
        [(0, 0, 3, 2), (1, 0, 3, 2)]
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = sorted(re.findall(r"(?:rank \d epoch \d: \d+ samples|resumed at epoch \d, batch \d)", resumed.stdout))
    # 23 samples, 2 ranks, drop_last: 11 per rank, 5 batches of 2; 3 were done before the stop
    assert lines == ["rank 0 epoch 0: 4 samples", "rank 0 epoch 1: 10 samples", "rank 1 epoch 0: 4 samples",
                     "rank 1 epoch 1: 10 samples", "resumed at epoch 0, batch 3"]


def test_a_sampler_alone_saves_where_its_pass_is():
    """ChunkShuffleSampler under a plain DataLoader (num_workers=0): its own state continues the pass."""
    sampler = ChunkShuffleSampler(50, chunk_images=10, window_chunks=2, seed=4, batch_size=8)
    reference = [b.tolist() for b in ChunkShuffleSampler(50, chunk_images=10, window_chunks=2, seed=4, batch_size=8)]
    seen = []
    for batch in DataLoader(torch.arange(50), batch_size=None, sampler=sampler):
        seen.append(batch.tolist())
        if len(seen) == 2:
            state = sampler.state_dict()
            break
    assert (state["epoch"], state["consumed"]) == (0, 2)
    resumed = ChunkShuffleSampler(50, chunk_images=10, window_chunks=2, seed=4, batch_size=8)
    resumed.load_state_dict(state)
    assert seen + [b.tolist() for b in resumed] == reference
    assert (resumed.state_dict()["epoch"], resumed.state_dict()["consumed"]) == (1, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_right_after_iter_says_nothing_was_consumed(backend):
    """A DataLoader's workers draw from the sampler as soon as the iterator exists; the state counts
    what reached the loop."""
    ds = torch.utils.data.TensorDataset(torch.arange(SAMPLES))
    loader = fastdata.loader(ds, batch_size=BATCH, seed=1, num_workers=2, backend=backend)
    iterator = iter(loader)
    assert (loader.state_dict()["epoch"], loader.state_dict()["consumed"]) == (0, 0)
    next(iterator)
    assert (loader.state_dict()["epoch"], loader.state_dict()["consumed"]) == (0, 1)
    del iterator
    getattr(loader, "close", lambda: None)()
