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
