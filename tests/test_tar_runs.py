"""The map-style tar reader reads each contiguous byte run once (fastdata/formats/tar/runs.py):
one ``pread`` for a sample's image and every field member, one for adjacent samples, and
separate ones only where members lie apart; every member still comes back exactly."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fastdata
from fastdata.formats.tar import TarIndexedDataset
from fastdata.formats.tar.runs import RUN_GAP_BYTES, plan_runs
from test_fields import Everything, expect_sample

BLOB_BYTES = RUN_GAP_BYTES + 1000  # a member wider than the gap a run spans


@pytest.fixture
def preads(monkeypatch) -> list[tuple[int, int]]:
    """Every ``os.pread`` from now on, as (size, offset)."""
    calls: list[tuple[int, int]] = []
    real = os.pread

    def counted(descriptor: int, size: int, offset: int) -> bytes:
        calls.append((size, offset))
        return real(descriptor, size, offset)

    monkeypatch.setattr(os, "pread", counted)
    return calls


class Wide(Everything):
    """Every field kind, and a ``blob`` member wider than :data:`RUN_GAP_BYTES`."""

    fastdata_kinds = {"mask": "mask", "points": "array:variable"}

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict:
        sample = super().__getitem__(index % 5)
        return dict(sample, blob=bytes([index]) * BLOB_BYTES, label=index)


def sample_span(out: Path, sample: int) -> tuple[int, int]:
    """(first member's data offset, last member's data end) of ``sample`` (one shard), from the index."""
    shard = json.loads((out / "index.json").read_text())["shards"][0]
    starts = [shard[name][sample] for name in shard if name.endswith("offset")]
    ends = [shard[name][sample] + shard[name[: -len("offset")] + "size"][sample] for name in shard if name.endswith("offset")]
    return min(starts), max(ends)


@pytest.mark.parametrize("store", ["raw", "encoded"])
def test_one_pread_per_sample_and_per_run_of_adjacent_samples(tmp_path: Path, store: str, preads) -> None:
    out = tmp_path / "wide.tar"
    fastdata.convert(Wide(), out, store=store, workers=0, shard_samples=8)
    ds = TarIndexedDataset(out)
    source = Wide()
    for index in (0, 5, 7):
        preads.clear()
        got = ds[index]
        expect_sample({**got, "blob": b"", "label": 0}, {**source[index], "blob": b"", "label": 0})
        assert got["blob"] == source[index]["blob"] and got["label"] == index
        first, end = sample_span(out, index)
        assert preads == [(end - first, first)]  # image, mask, boxes, ..., blob: one read
    preads.clear()
    batch = ds[np.arange(2, 6)]
    assert len(preads) == 1 and batch["label"].tolist() == [2, 3, 4, 5]
    assert preads[0] == (sample_span(out, 5)[1] - sample_span(out, 2)[0], sample_span(out, 2)[0])
    preads.clear()
    batch = ds[[6, 1, 6]]  # apart (sample 2..5 between), out of order, one repeated
    assert sorted(preads, key=lambda call: call[1]) == [
        (sample_span(out, 1)[1] - sample_span(out, 1)[0], sample_span(out, 1)[0]),
        (sample_span(out, 6)[1] - sample_span(out, 6)[0], sample_span(out, 6)[0])]
    assert batch["blob"] == [bytes([6]) * BLOB_BYTES, bytes([1]) * BLOB_BYTES, bytes([6]) * BLOB_BYTES]


def test_a_member_left_out_wider_than_the_gap_splits_the_run(tmp_path: Path, preads) -> None:
    """``fields=`` without the wide blob: each sample's other members are one run, but the blob
    between two samples is not read, so adjacent samples take one read each."""
    out = tmp_path / "wide.tar"
    fastdata.convert(Wide(), out, store="encoded", workers=0)
    ds = TarIndexedDataset(out, fields=["image", "caption", "label"])
    preads.clear()
    batch = ds[np.arange(0, 4)]
    assert len(preads) == 4 and batch["caption"] == [Everything()[i]["caption"] for i in range(4)]
    blob_only = TarIndexedDataset(out, fields=["blob"])
    preads.clear()
    assert blob_only[np.arange(0, 4)]["blob"] == [bytes([i]) * BLOB_BYTES for i in range(4)]
    assert len(preads) == 4 and all(size == BLOB_BYTES for size, _ in preads)
    labels_only = TarIndexedDataset(out, fields=["label"])  # the index holds the labels: nothing to read
    preads.clear()
    assert labels_only[np.arange(0, 4)]["label"].tolist() == [0, 1, 2, 3] and labels_only[5] == {"label": 5}
    assert preads == []


def test_classic_samples_and_shards(tmp_path: Path, preads) -> None:
    """(image, label): adjacent samples' images are one read per shard they lie in."""
    out = tmp_path / "classic.tar"
    from test_tar import Numbered, identity

    fastdata.convert(Numbered(30), out, format="tar", store="raw", shard_samples=10, workers=0)
    ds = TarIndexedDataset(out)
    preads.clear()
    images, labels = ds[np.arange(5, 25)]
    assert [identity(image) for image in images] == list(range(5, 25)) and labels.tolist() == [i % 3 for i in range(5, 25)]
    assert len(preads) == 3  # shards 0, 1 and 2
    preads.clear()
    image, label = ds[17]
    assert identity(image) == 17 and label == 2 and len(preads) == 1


@st.composite
def members(draw) -> tuple[list[int], list[int], list[int], int, int]:
    """Members of a few shards laid out like tar members (none overlap in a shard), a selection of
    them (any order, repeats), a gap and a limit."""
    shards, offsets, sizes = [], [], []
    for shard in range(draw(st.integers(1, 3))):
        position = 512
        for _ in range(draw(st.integers(1, 12))):
            position += draw(st.integers(0, 3000))
            size = draw(st.integers(0, 5000))
            shards.append(shard), offsets.append(position), sizes.append(size)
            position += size
    chosen = draw(st.lists(st.integers(0, len(offsets) - 1), min_size=0, max_size=20))
    return ([shards[i] for i in chosen], [offsets[i] for i in chosen], [sizes[i] for i in chosen],
            draw(st.integers(0, 4000)), draw(st.integers(1, 12000)))


@settings(max_examples=300, deadline=None)
@given(members())
def test_plan_runs_invariant(drawn) -> None:
    shards, offsets, sizes, gap, limit = drawn
    planned = list(plan_runs(shards, offsets, sizes, gap=gap, limit=limit))
    runs = [(shard, first, size, members if members is not None else [(lead, 0, size)])
            for shard, first, size, lead, members in planned]
    assert all(members is None or len(members) > 1 for *_, members in planned)
    assert sorted(m for _, _, _, found in runs for m, _, _ in found) == list(range(len(offsets)))  # each once
    assert [(shard, first) for shard, first, _, _ in runs] == sorted((shard, first) for shard, first, _, _ in runs)
    for shard, first, size, found in runs:
        assert all(shards[m] == shard and offsets[m] == first + at and sizes[m] == length for m, at, length in found)
        assert [at for _, at, _ in found] == sorted(at for _, at, _ in found) and found[0][1] == 0
        assert size == max(at + length for _, at, length in found)  # the run covers its members, no more
        assert size <= max(limit, max(length for _, _, length in found))
        reach = 0
        for _, at, length in found:  # each joined within the gap of the run so far
            assert at <= reach + gap or at == 0
            reach = max(reach, at + length)
    for (shard, first, size, _), (next_shard, next_first, _, found) in zip(runs, runs[1:]):
        # a run ends: another shard, a gap wider than allowed, or the limit
        ends = next_first + found[0][2]  # the next run's first member (at offset 0 of its run)
        assert (next_shard != shard or next_first > first + size + gap or max(first + size, ends) - first > limit)
