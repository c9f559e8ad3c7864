"""Elastic resume: a state saved by any rank of one job resumes every rank of a job of another
world size, batch size, evenness or drop_last. The old job's consumed batches (every rank in
lockstep) and the new job's pass read the epoch exactly once (``even=False``), or at least once
with padding only from samples not read before (``even=True``); the epochs after it are the new
layout's own. Property-tested over layouts and stop points, on the sampler (cheap), then through
the loader on every backend."""

from __future__ import annotations

import json
import pickle
from collections import Counter

import pytest
import torch
from hypothesis import given, settings, strategies as st

import fastdata
from fastdata.loading.order import MAX_STAGES, STATE_VERSION, Layout, remaining
from fastdata.loading.samplers import BatchIndexSampler, ChunkShuffleSampler

layouts = st.tuples(st.integers(1, 6), st.integers(1, 9), st.booleans(), st.booleans())


def sampler(length, layout, rank, seed=3, cls=BatchIndexSampler):
    world_size, batch_size, even, drop_last = layout
    if cls is ChunkShuffleSampler:
        return ChunkShuffleSampler(length, chunk_images=5, window_chunks=2, batch_size=batch_size, seed=seed,
                                   rank=rank, world_size=world_size, even=even, drop_last=drop_last)
    return BatchIndexSampler(length, batch_size, seed=seed, rank=rank, world_size=world_size, even=even,
                             drop_last=drop_last)


def run_old(length, layout, stop, cls=BatchIndexSampler):
    """Every old rank's first ``stop`` batches (lockstep), and the state each rank saves then."""
    consumed, states = [], []
    for rank in range(layout[0]):
        s = sampler(length, layout, rank, cls=cls)
        batches = iter(s)
        for _ in range(min(stop, len(s))):  # never past its last batch: that would end the pass
            consumed += next(batches).tolist()
        states.append(s.state_dict())
    return consumed, states


def whole_pass(length, layout, cls=BatchIndexSampler):
    """Every rank's whole epoch 0 in ``layout``."""
    return [i for rank in range(layout[0]) for batch in sampler(length, layout, rank, cls=cls) for i in batch.tolist()]


def run_new(length, layout, state, cls=BatchIndexSampler):
    """Each new rank's rest of the interrupted epoch and its next epoch, after loading ``state``."""
    rest, counts, following = [], [], []
    for rank in range(layout[0]):
        s = sampler(length, layout, rank, seed=3 if layout[0] > 1 else None, cls=cls)  # alone: the state's seed
        s.load_state_dict(state)
        mine = [i for batch in s for i in batch.tolist()]
        rest += mine
        counts.append(len(mine))
        following.append([b.tolist() for b in s])
    return rest, counts, following


@settings(max_examples=80, deadline=None)
@given(length=st.integers(0, 60), old=layouts, new=layouts, stop=st.integers(0, 12), saver=st.integers(0, 5),
       chunks=st.booleans())
def test_a_resume_in_another_layout_reads_what_was_not_read_once(length, old, new, stop, saver, chunks):
    cls = ChunkShuffleSampler if chunks else BatchIndexSampler
    consumed, states = run_old(length, old, stop, cls)
    world_size, batch_size, even, drop_last = new
    state = states[saver % old[0]]
    if any({k: v for k, v in s.items() if k != "rank"} != {k: v for k, v in state.items() if k != "rank"}
           for s in states):  # ranks out of step (even=False: a rank ran out of batches first)
        rest, _, _ = run_new(length, new, states, cls)  # every rank's state: the earliest is used
        if not drop_last:
            assert set(whole_pass(length, old, cls)) <= set(consumed) | set(rest)  # none lost
        return
    rest, counts, following = run_new(length, new, state, cls)
    if state["consumed"] == 0:  # nothing read yet: the epoch is the new layout's own
        assert Counter(rest) == Counter(whole_pass(length, new, cls))
        return
    planned = set(whole_pass(length, old, cls))  # what the old layout reads in this epoch
    if new == old:  # the same layout continues at the saved batch: exactly the uninterrupted epoch
        assert Counter(consumed + rest) == Counter(whole_pass(length, old, cls))
        return
    assert not set(rest) & set(consumed)  # nothing read twice across the resume ...
    if not drop_last:
        assert set(rest) == planned - set(consumed)  # ... and nothing planned left out
    else:
        assert set(rest) <= planned - set(consumed)  # drop_last leaves out a few, as it does every epoch
    duplicates = len(rest) - len(set(rest))
    if not even:
        assert duplicates == 0 and max(counts) - min(counts) <= (batch_size if drop_last else 1)
    else:
        assert duplicates < world_size and len(set(counts)) == 1  # padding, as DistributedSampler pads
    if not old[2] and not old[3] and not even and not drop_last:
        assert Counter(consumed + rest) == Counter(range(length))  # exactly once over the epoch
    # the next epoch is the new layout's own
    assert following == [[b.tolist() for b in _fresh(length, new, rank, cls)] for rank in range(world_size)]


def _fresh(length, layout, rank, cls):
    s = sampler(length, layout, rank, cls=cls)
    s.set_epoch(1)
    return list(s)


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 50), first=layouts, second=layouts, third=layouts, stops=st.tuples(
    st.integers(0, 6), st.integers(0, 6)))
def test_two_resumes_in_one_epoch_still_read_it_exactly_once(length, first, second, third, stops):
    first, second, third = ((w, b, False, False) for w, b, _, _ in (first, second, third))
    in_step = min(stops[0], min(len(sampler(length, first, rank)) for rank in range(first[0])))
    consumed, states = run_old(length, first, in_step)  # every rank in step: the same state
    middle, saved = [], []
    for rank in range(second[0]):
        counter = sampler(length, second, rank)
        counter.load_state_dict(states)
        s = sampler(length, second, rank)
        s.load_state_dict(states)
        batches = iter(s)
        for _ in range(min(stops[1], len(list(counter)))):  # never past its last batch
            middle += next(batches).tolist()
        saved.append(s.state_dict())
    rest, _, _ = run_new(length, third, saved)  # every rank's state: the earliest is used
    assert set(consumed + middle + rest) == set(range(length))  # none lost
    if all({**s, "rank": 0} == {**saved[0], "rank": 0} for s in saved):  # ranks in step: none read twice
        assert Counter(consumed + middle + rest) == Counter(range(length))


def test_the_same_layout_continues_at_the_saved_batch_on_any_rank():
    """A state saved by rank 0 resumes rank 1 of the same layout at the same batch (the lockstep rule)."""
    reference = list(sampler(23, (2, 4, True, False), 1))
    _, states = run_old(23, (2, 4, True, False), 2)
    resumed = sampler(23, (2, 4, True, False), 1)
    resumed.load_state_dict(states[0])
    assert [b.tolist() for b in resumed] == [b.tolist() for b in reference[2:]]


def test_a_state_from_before_versions_is_read():
    """A state as fastdata saved it before state versions (no "version", "order", "earlier") resumes."""
    old = {"seed": 3, "epoch": 0, "consumed": 2, "length": 23, "batch_size": 4, "drop_last": False, "rank": 0,
           "world_size": 1, "even": True, "backend": "torch"}
    first_two = [i for b in list(sampler(23, (1, 4, True, False), 0))[:2] for i in b.tolist()]
    resumed = sampler(23, (1, 3, False, False), 0, seed=None)
    resumed.load_state_dict(old)
    assert sorted(first_two + [i for b in resumed for i in b.tolist()]) == list(range(23))
    resumed = sampler(23, (1, 4, True, False), 0, seed=None)
    resumed.load_state_dict(old)
    assert [b.tolist() for b in resumed] == [b.tolist() for b in list(sampler(23, (1, 4, True, False), 0))[2:]]


def test_a_state_stays_under_one_kibibyte_whatever_the_dataset_size():
    s = BatchIndexSampler(10**12, 4096, seed=2**62, rank=1023, world_size=1024)
    stages = [(Layout(1024 - i, 4096 + i, bool(i % 2), bool(i % 3)), 10**9) for i in range(MAX_STAGES)]
    state = {**s.state_at(10**6, 10**9, stages), "backend": "process",
             "dataset": {"seed": 2**62, "digest": "0123456789abcdef"}}
    assert state["version"] == STATE_VERSION
    assert len(json.dumps(state)) < 1024 and len(pickle.dumps(state)) < 1024


def test_remaining_marks_padding_read():
    """Padding a rank read counts as reading its sample: it is not read again."""
    layout = Layout(world_size=2, batch_size=2, even=True, drop_last=False)  # 5 samples: rank 1 pads with 0
    assert remaining(5, layout, 1).tolist() == [2]  # rank 0 read 0, 1; rank 1 read 3, 4
    assert remaining(5, layout, 2).tolist() == []


@pytest.mark.parametrize("backend", ["torch", "thread", "process"])
def test_a_loader_resumes_on_more_ranks_with_another_batch_size(backend):
    ds = torch.utils.data.TensorDataset(torch.arange(37))
    seen, state = [], None
    for rank in range(2):
        loader = fastdata.loader(ds, batch_size=4, seed=5, rank=rank, world_size=2, even=False, backend=backend,
                                 num_workers=2)
        for number, (batch,) in enumerate(loader):
            seen += batch.tolist()
            if number == 2:
                state = loader.state_dict()
                break
    rest = []
    for rank in range(3):
        loader = fastdata.loader(ds, batch_size=5, seed=5, rank=rank, world_size=3, even=False, backend=backend,
                                 num_workers=2)
        loader.load_state_dict(state)
        rest += [i for (batch,) in loader for i in batch.tolist()]
        assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["earlier"] == []
    assert sorted(seen + rest) == list(range(37))
