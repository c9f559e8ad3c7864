"""``TarDataset`` (the streaming tar reader) on a dataset with fields: the samples and batches
the map-style reader gives, exactly, read with the streaming reader's block reads (one read per
block of samples, not one per member)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision import tv_tensors

import fastdata
from fastdata.formats.tar import TarDataset, TarIndexedDataset
from test_fields_loader import COUNT, Detection, boxes_of, labels_of


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("stream") / "det.tar"
    fastdata.convert(Detection(), out, workers=0)
    return out


def preads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the shard reads (``os.pread`` calls) from here on; the reads still happen."""
    sizes: list[int] = []
    real = os.pread

    def counted(descriptor: int, size: int, offset: int) -> bytes:
        sizes.append(size)
        return real(descriptor, size, offset)

    monkeypatch.setattr(os, "pread", counted)
    return sizes


def test_streamed_samples_with_fields_are_the_map_style_readers_from_block_reads(shards, monkeypatch) -> None:
    indexed = TarIndexedDataset(shards)
    want = [indexed[i] for i in range(COUNT)]
    reads = preads(monkeypatch)
    got = list(TarDataset(shards, shuffle=False))
    assert len(reads) == 1  # the 7 samples' images, boxes, labels and points: one block (was 1 + 4 per sample)
    assert len(got) == COUNT
    for index, ((image, target), (want_image, want_target)) in enumerate(zip(got, want)):
        assert type(image) is tv_tensors.Image and torch.equal(image, want_image) and image[0, 0, 0] == index
        assert type(target["boxes"]) is tv_tensors.BoundingBoxes and target["boxes"].canvas_size == (4, 6)
        assert target["boxes"].numpy().tobytes() == boxes_of(index).tobytes()
        assert target["labels"].tolist() == labels_of(index).tolist()
        assert target["points"].dtype == np.uint8 and target["points"].shape == (index % 2, 2)


def test_streamed_batches_with_fields_are_the_map_style_readers_batches(shards, monkeypatch) -> None:
    indexed = TarIndexedDataset(shards)
    reads = preads(monkeypatch)
    batches = list(TarDataset(shards, shuffle=False, batch_size=3))
    assert len(reads) == 1
    assert [len(images) for images, _ in batches] == [3, 3, 1]
    for number, (images, target) in enumerate(batches):
        rows = np.arange(3 * number, min(3 * number + 3, COUNT))
        want_images, want_target = indexed[rows]
        assert torch.equal(images, want_images)
        assert [b.numpy().tobytes() for b in target["boxes"]] == [boxes_of(int(i)).tobytes() for i in rows]
        assert [t.tolist() for t in target["labels"]] == [labels_of(int(i)).tolist() for i in rows]
        assert [p.shape for p in target["points"]] == [p.shape for p in want_target["points"]]


def test_streamed_fields_keep_open_dataset_fields(shards) -> None:
    (image, target), *_ = TarDataset(shards, shuffle=False, fields=["image", "labels"])
    assert list(target) == ["labels"] and target["labels"].tolist() == []
