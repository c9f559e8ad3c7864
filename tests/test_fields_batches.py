"""``ds[indices]`` (one fancy-indexed read of each fixed field's rows; a variable field's bytes
sliced from its offsets) gives, row by row, exactly what reading each sample gives: for every
field kind, in every format and store, in any order and with repeats (issue 21, item 5)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from test_fields import FORMATS, Hinted, reader


def plain(value):
    """A value as something ``==`` compares exactly (arrays by dtype, shape and bytes; boxes also
    by format and canvas size; a tensor and an ndarray of the same values alike)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    extra = ()
    if type(value).__name__ == "BoundingBoxes":
        extra = (str(value.format), tuple(value.canvas_size))
    if isinstance(value, torch.Tensor):
        value = value.as_subclass(torch.Tensor).numpy()
    if isinstance(value, Image.Image):
        value = np.asarray(value)
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.shape, value.tobytes(), *extra)
    if isinstance(value, (bool, int, float)):
        return (type(value).__name__, value)
    return value


def rows(column):
    """A batch's column as one value per sample (a stacked tensor split along its first axis)."""
    if isinstance(column, (torch.Tensor, np.ndarray)):
        return [plain(row.item() if row.ndim == 0 else row) for row in column]
    return [plain(value) for value in column]


@pytest.mark.parametrize("store", ["raw", "encoded"])
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_batch_of_indices_equals_each_sample_read_and_collated(tmp_path, name: str, store: str) -> None:
    out = tmp_path / f"all{FORMATS[name]}"
    fastdata.convert(Hinted(), out, workers=0, store=store)
    for image_format in ("tensor", "numpy"):
        ds = reader(out, image_format=image_format)
        for indices in ([4, 0, 2], [1, 2, 3], [3], [0, 0, 4], np.array([2, 1], dtype=np.int64)):
            batch = ds[indices]
            samples = [ds[int(i)] for i in indices]
            assert list(batch) == list(Hinted()[0])
            for key, column in batch.items():
                want = [plain(sample[key]) for sample in samples]
                got = rows(column)
                assert got == want, (name, store, image_format, list(indices), key)


class Metadata:
    """LAION-style samples: an image, a caption and JSON metadata whose keys differ by sample
    (``nsfw`` only where the crawler recorded it)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> dict:
        meta = {"url": f"http://x/{index}.jpg", "similarity": index / 4, **({"nsfw": "UNLIKELY"} if index % 2 else {})}
        return {"image": Image.fromarray(np.full((6, 8, 3), index * 30, np.uint8)), "txt": f"photo {index}",
                "json": meta, "score": np.float32(index / 8)}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_transform_does_not_change_the_batch_structure_or_fail_on_missing_keys(tmp_path, name: str) -> None:
    """A batch with a transform is laid out as one without: JSON dicts stay a list of dicts (not
    a dict of lists, which also failed on a key only some samples have), floats keep their dtype."""
    out = tmp_path / f"meta{FORMATS[name]}"
    fastdata.convert(Metadata(), out, workers=0, store="encoded")
    plain_batch = reader(out)[[0, 1, 2, 3]]
    for transform in (lambda sample: sample, lambda sample: dict(sample)):
        batch = reader(out, transform=transform)[[0, 1, 2, 3]]
        assert list(batch) == list(plain_batch) == ["image", "txt", "json", "score"]
        assert batch["json"] == plain_batch["json"] == [Metadata()[i]["json"] for i in range(4)]
        assert batch["txt"] == plain_batch["txt"] and batch["image"].shape == plain_batch["image"].shape == (4, 3, 6, 8)
        assert batch["score"].dtype == plain_batch["score"].dtype == torch.float32
        assert torch.equal(batch["score"], plain_batch["score"])
        loaded = next(iter(fastdata.loader(reader(out, transform=transform), batch_size=4)))
        assert loaded["json"] == batch["json"]


class Depth:
    """A dataset resized to one size in its ``__getitem__``: (image, depth map of the image's (H, W))."""

    fastdata_kinds: dict = {}

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int):
        depth = np.arange(6 * 8, dtype=np.float32).reshape(6, 8) + np.float32(index)
        return Image.fromarray(np.full((6, 8, 3), index * 30, np.uint8)), depth


class HintedDepth(Depth):
    fastdata_kinds = {"array": "array"}


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("dataset, store, stacked", [(Depth, "raw", True), (HintedDepth, "encoded", True),
                                                     (Depth, "encoded", False)])
def test_an_array_of_the_image_size_is_stacked_where_images_have_one_size(tmp_path, name: str, dataset, store: str,
                                                                         stacked: bool) -> None:
    """Raw images without --resize have one size, so an array of that size stacks in batches as
    before; a conversion taking images of several sizes (encoded) stores it ragged (a list a batch)
    unless the dataset's hint says it is a fixed array."""
    out = tmp_path / f"depth{FORMATS[name]}"
    fastdata.convert(dataset(), out, workers=0, store=store)
    ds = reader(out)
    assert (ds.schema["array"].shape, ds.schema["array"].encoding) == (((6, 8), None) if stacked else (None, "npy"))
    want = torch.stack([torch.from_numpy(Depth()[i][1]) for i in range(4)])
    _, depth = next(iter(fastdata.loader(ds, batch_size=4, shuffle=False)))
    if stacked:
        assert isinstance(depth, torch.Tensor) and torch.equal(depth, want)
    else:
        assert isinstance(depth, list) and all(torch.equal(torch.as_tensor(d), w) for d, w in zip(depth, want))
    _, depth = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    assert torch.equal(depth, want)


class Flow:
    """(image, flow (2, H, W)) whose images change size after the probed samples (the 10th on)."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        height = 6 if index < 10 else 5
        flow = np.arange(2 * height * 8, dtype=np.float32).reshape(2, height, 8) + np.float32(index)
        return Image.fromarray(np.full((height, 8, 3), index, np.uint8)), flow


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("options", [{"store": "encoded"}, {"store": "raw", "resize": "4x4"}])
def test_an_array_of_the_image_size_converts_where_images_change_size_after_the_probe(tmp_path, name: str,
                                                                                      options: dict) -> None:
    """A conversion taking images of several sizes stores an array of its image's size ragged
    from the start, so a later image of another size (and its array) converts."""
    out = tmp_path / f"flow{FORMATS[name]}"
    fastdata.convert(Flow(), out, workers=0, **options)
    ds = reader(out)
    assert (ds.schema["array"].shape, ds.schema["array"].encoding) == (None, "npy")
    for index in (0, 9, 10, 11):
        assert plain(ds[index][1]) == plain(Flow()[index][1])
