"""``fastdata.loader(..., pad=...)`` (docs/fields.md): variable-first-dimension arrays padded to
each batch's longest, as ``torch.nn.utils.rnn.pad_sequence(batch_first=True)`` pads them, with each
sample's length beside them; the same batches on every backend and ``num_workers``; bad options
refused with one clear line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision import tv_tensors

import fastdata
from fastdata.errors import InvalidOptionError
from fastdata.formats.tar import TarIndexedDataset

COUNT = 7


def boxes_of(index: int) -> np.ndarray:
    """Sample ``index``'s boxes: ``index % 4`` rows (samples 0 and 4 have none), exact in float32."""
    rows = index % 4
    return (np.arange(4 * rows, dtype=np.float32).reshape(rows, 4) + np.float32(index) + np.float32(0.25))


def labels_of(index: int) -> np.ndarray:
    return np.arange(index % 4, dtype=np.int64) + 100 * index


class Detection:
    """What ``wrap_dataset_for_transforms_v2(CocoDetection(...))`` gives: (image, {boxes, labels})."""

    def __len__(self) -> int:
        return COUNT

    def __getitem__(self, index: int):
        image = np.full((4, 6, 3), index, np.uint8)
        boxes = tv_tensors.BoundingBoxes(torch.from_numpy(boxes_of(index)), format="XYXY", canvas_size=(4, 6))
        return tv_tensors.Image(torch.from_numpy(image).permute(2, 0, 1)), {
            "boxes": boxes, "labels": torch.from_numpy(labels_of(index)), "points": np.zeros((index % 2, 2), np.uint8)}


class Pairs:
    """A tuple with the variable field at a tuple position: (image, boxes)."""

    def __len__(self) -> int:
        return 3

    def __getitem__(self, index: int):
        image = tv_tensors.Image(torch.zeros((3, 4, 6), dtype=torch.uint8))
        return image, tv_tensors.BoundingBoxes(torch.from_numpy(boxes_of(index)), format="XYXY", canvas_size=(4, 6))


@pytest.fixture(scope="module")
def detection(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pad") / "det.npy"
    fastdata.convert(Detection(), out, workers=0)
    return out


def expect_padded(values, lengths, rows: list[np.ndarray], fill, dtype: torch.dtype) -> None:
    longest = max((len(r) for r in rows), default=0)
    assert type(values) is torch.Tensor and values.dtype == dtype
    assert tuple(values.shape) == (len(rows), longest, *rows[0].shape[1:])
    assert type(lengths) is torch.Tensor and lengths.dtype == torch.int64 and lengths.tolist() == [len(r) for r in rows]
    for row, want in zip(values.numpy(), rows):
        assert row[:len(want)].tobytes() == want.tobytes()  # bit-equal
        assert (row[len(want):] == fill).all() and row[len(want):].size == (longest - len(want)) * int(np.prod(want.shape[1:]))


@pytest.mark.parametrize("backend,workers", [("torch", 0), ("torch", 2), ("thread", 2), ("process", 2), ("process", 0)])
def test_pad_gives_padded_tensors_and_lengths_on_every_backend(detection: Path, backend: str, workers: int) -> None:
    ds = fastdata.open_dataset(detection)
    loader = fastdata.loader(ds, batch_size=3, shuffle=False, num_workers=workers, backend=backend,
                             pad={"boxes": -1.5, "labels": -1})
    batches = list(loader)
    assert len(batches) == 3
    for number, (images, target) in enumerate(batches):
        indices = list(range(3 * number, min(3 * number + 3, COUNT)))
        assert images.shape == (len(indices), 3, 4, 6) and images[:, 0, 0, 0].tolist() == indices
        assert list(target) == ["boxes", "boxes_length", "labels", "labels_length", "points"]
        expect_padded(target["boxes"], target["boxes_length"], [boxes_of(i) for i in indices], -1.5, torch.float32)
        expect_padded(target["labels"], target["labels_length"], [labels_of(i) for i in indices], -1, torch.int64)
        assert isinstance(target["points"], list) and [tuple(p.shape) for p in target["points"]] == \
            [(i % 2, 2) for i in indices]  # not asked for: still a list
    assert batches[0][1]["boxes"].shape == (3, 2, 4) and batches[0][1]["boxes_length"].tolist() == [0, 1, 2]


def test_a_batch_of_empty_rows_pads_to_zero_length(detection: Path) -> None:
    ds = fastdata.open_dataset(detection)
    loader = fastdata.loader(ds, batch_size=1, shuffle=False, backend="thread", num_workers=2, pad=True)
    images, target = list(loader)[4]  # sample 4 has no boxes, labels nor points
    assert target["boxes"].shape == (1, 0, 4) and target["boxes"].dtype == torch.float32
    assert target["labels"].shape == (1, 0) and target["labels"].dtype == torch.int64
    # points were numpy arrays in the source, so (as without pad) numpy on the thread backend
    assert type(target["points"]) is np.ndarray and target["points"].shape == (1, 0, 2) and target["points"].dtype == np.uint8
    assert type(target["points_length"]) is np.ndarray and target["points_length"].dtype == np.int64
    assert target["boxes_length"].tolist() == target["labels_length"].tolist() == target["points_length"].tolist() == [0]


def test_pad_true_pads_every_variable_array_with_zero_and_keeps_dtypes(detection: Path) -> None:
    ds = fastdata.open_dataset(detection)
    images, target = next(iter(fastdata.loader(ds, batch_size=4, shuffle=False, pad=True)))
    expect_padded(target["boxes"], target["boxes_length"], [boxes_of(i) for i in range(4)], 0, torch.float32)
    expect_padded(target["labels"], target["labels_length"], [labels_of(i) for i in range(4)], 0, torch.int64)
    expect_padded(target["points"], target["points_length"], [np.zeros((i % 2, 2), np.uint8) for i in range(4)], 0,
                  torch.uint8)


def test_pad_with_a_transform_pads_the_transformed_boxes(detection: Path) -> None:
    from torchvision.transforms import v2

    ds = fastdata.open_dataset(detection, transform=v2.RandomHorizontalFlip(p=1.0))
    _, target = next(iter(fastdata.loader(ds, batch_size=4, shuffle=False, pad=["boxes"])))
    flipped = [v2.functional.horizontal_flip(tv_tensors.BoundingBoxes(torch.from_numpy(boxes_of(i)), format="XYXY",
                                                                      canvas_size=(4, 6))).numpy() for i in range(4)]
    expect_padded(target["boxes"], target["boxes_length"], flipped, 0, torch.float32)


def test_a_field_at_a_tuple_position_becomes_padded_and_lengths(tmp_path: Path) -> None:
    out = tmp_path / "pairs.tar"
    fastdata.convert(Pairs(), out, workers=0)
    ds = TarIndexedDataset(out)
    images, (boxes, lengths) = next(iter(fastdata.loader(ds, batch_size=3, shuffle=False, backend="process",
                                                         num_workers=1, pad={"boxes": 9.0})))
    expect_padded(boxes, lengths, [boxes_of(i) for i in range(3)], 9.0, torch.float32)


@pytest.mark.parametrize("pad,message", [
    ({"boxes": -1, "caption": 0}, "pad: field 'caption' of '{path}' is text; pad pads arrays of a variable first "
                                  "dimension (boxes, keypoints). Its variable array fields: boxes, labels, points."),
    ({"nope": 0}, "pad: field 'nope' of '{path}' is not one of its fields;"),
    ({"points": -1}, "pad: the fill value -1 for field 'points' is outside uint8's range 0..255 (never cast). "
                     "Give a value its dtype uint8 holds."),
    ({"labels": 0.5}, "pad: the fill value 0.5 for field 'labels' is not an integer (the field is int64) (never cast)."),
    ({"boxes": "0"}, "pad: the fill value '0' for field 'boxes' is not a number"),
    ("boxes", "Invalid pad 'boxes'. Use True (every variable array field, padded with 0), a list of field names, or "
              "a dict of field name -> fill value, e.g. pad={'boxes': 0.0, 'labels': -1}."),
])
def test_bad_pad_options_are_one_clear_error(tmp_path: Path, pad, message: str) -> None:
    class WithCaption(Detection):
        def __getitem__(self, index: int):
            image, target = super().__getitem__(index)
            return image, {**target, "caption": f"c{index}"}

    out = tmp_path / "cap.npy"
    fastdata.convert(WithCaption(), out, workers=0)
    with pytest.raises(InvalidOptionError) as caught:
        fastdata.loader(fastdata.open_dataset(out), batch_size=2, pad=pad)
    assert str(caught.value).startswith(message.replace("{path}", str(out)))


def test_pad_is_refused_where_it_does_not_apply(detection: Path, tmp_path: Path) -> None:
    classic = tmp_path / "classic.npy"
    fastdata.convert(torch.utils.data.TensorDataset(torch.zeros(2, 4, 4, 3, dtype=torch.uint8), torch.arange(2)),
                     classic, workers=0)
    with pytest.raises(InvalidOptionError, match=r"^pad applies to fastdata readers of datasets with fields \(boxes, "
                                                 r"keypoints\); MemmapDataset has none\. Pad in a collate_fn"):
        fastdata.loader(fastdata.open_dataset(classic), pad=True)
    with pytest.raises(InvalidOptionError, match=r"^pad pads fastdata's own batches; with a collate_fn, pad in it"):
        fastdata.loader(fastdata.open_dataset(detection), pad=True, collate_fn=list)
    with pytest.raises(InvalidOptionError, match=r"^pad: field 'boxes' of '.*' was left out by fields=\[\.\.\.\]"):
        fastdata.loader(fastdata.open_dataset(detection, fields=["image", "labels"]), pad={"boxes": 0.0})


def test_a_ragged_array_is_not_padded(tmp_path: Path) -> None:
    class Ragged(Detection):
        fastdata_kinds = {"masks": "array:ragged"}

        def __getitem__(self, index: int):
            image, target = super().__getitem__(index)
            return image, {**target, "masks": torch.zeros((index % 3, 1 + index % 2, 2), dtype=torch.uint8)}

    out = tmp_path / "ragged.npy"
    fastdata.convert(Ragged(), out, workers=0)
    ds = fastdata.open_dataset(out)
    with pytest.raises(InvalidOptionError, match=r"^pad: field 'masks' of '.*' is a ragged array \(every dimension "
                                                 r"varies\); pad pads arrays of a variable first dimension"):
        fastdata.loader(ds, pad={"masks": 0})
    _, target = next(iter(fastdata.loader(ds, batch_size=3, shuffle=False, pad=True)))  # True: the others only
    assert "masks_length" not in target and [tuple(m.shape) for m in target["masks"]] == [(0, 1, 2), (1, 2, 2), (2, 1, 2)]
    assert target["boxes"].shape == (3, 2, 4)
