"""``fastdata preview``'s text strip: class names only for class fields, and a font that has
the glyphs of the text it writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageFont

import fastdata
from fastdata import preview as preview_module
from fastdata.preview import font_file, preview, render, text_font


CELL = 192  # wide enough for "label: person (1)" on one line


def _image(value: int) -> torch.Tensor:
    return torch.full((3, 8, 8), value, dtype=torch.uint8)


class ImagesWithIds(torch.utils.data.Dataset):
    """COCO-like records: an ``image_id`` that happens to equal a class id, beside the label."""

    classes = ["cat", "person"]

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> dict:
        pixels = np.full((8, 8, 3), 40 * index, np.uint8)
        return {"image": Image.fromarray(pixels), "image_id": 1, "label": 1}


def test_only_class_fields_are_written_with_class_names(tmp_path: Path) -> None:
    out = tmp_path / "ids.npy"
    fastdata.convert(ImagesWithIds(), out, workers=0)
    picture = np.asarray(preview(out, index="0", cell_size=CELL))
    # the same picture as the text written out: "image_id: 1" (no class), "label: person (1)"
    expected = render([{"image": _image(0), "image_id": "1", "label": "person (1)"}], cell_size=CELL)
    assert np.array_equal(picture, np.asarray(expected))
    names = {1: "person"}
    assert np.array_equal(np.asarray(render([{"image": _image(0), "count": 1}], class_names=names, cell_size=CELL)),
                          np.asarray(render([{"image": _image(0), "count": "1"}], cell_size=CELL)))
    marked = render([{"image": _image(0), "category": 1}], class_names=names, class_fields=("category",), cell_size=CELL)
    assert np.array_equal(np.asarray(marked), np.asarray(render([{"image": _image(0), "category": "person (1)"}],
                                                                cell_size=CELL)))


def _strip(text: str) -> np.ndarray:
    """The text strip of a one-cell preview whose caption is ``text``."""
    picture = np.asarray(render([{"image": _image(0), "caption": text}], cell_size=CELL))
    return picture[2 + CELL:]


def test_accented_letters_are_drawn_not_replaced_by_a_box() -> None:
    missing = "\ufffe"  # no font has a glyph for it: drawn as the font's "missing glyph" box
    assert not np.array_equal(_strip("café"), _strip("caf" + missing))
    assert not np.array_equal(_strip("Ωmega"), _strip(missing + "mega"))
    assert not np.array_equal(_strip("é"), _strip("è"))


def test_without_dejavu_sans_the_preview_falls_back_to_pillows_font(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preview_module, "_font_files", lambda: iter([str(Path("/nonexistent/NoSuchFont.ttf"))]))
    font_file.cache_clear()
    try:
        font = text_font()
        assert font.getbbox("caf") == ImageFont.load_default().getbbox("caf")
        assert _strip("café").shape[0] > 0  # still drawn
    finally:
        monkeypatch.undo()
        font_file.cache_clear()
    assert text_font().font.family == "DejaVu Sans"  # matplotlib's copy, installed with the test extra


def test_box_labels_are_drawn_in_the_same_font() -> None:
    from torchvision import tv_tensors

    record = {"image": tv_tensors.Image(torch.full((3, 64, 64), 200, dtype=torch.uint8)),
              "boxes": tv_tensors.BoundingBoxes([[4, 20, 60, 60]], format="XYXY", canvas_size=(64, 64)),
              "labels": torch.tensor([1])}
    drawn = {name: np.asarray(render([record], class_names={1: name}, cell_size=64)) for name in ("café", "caf\ufffe")}
    assert not np.array_equal(drawn["café"], drawn["caf\ufffe"])
