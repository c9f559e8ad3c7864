"""Field kinds are one class each in one table (docs/fields.md, "Adding a field kind"): a kind
defined here alone, registered with :func:`fastdata.fields.register_kind`, is inferred, checked,
moved with the image, converted, verified and read back in every format that stores fields,
without a line of fastdata knowing it; registering is checked; a dataset of a kind no longer
registered is refused with a message that names the kind and the fix."""

from __future__ import annotations

import ast
import json
import math
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata.errors import FastdataError, InvalidOptionError
from fastdata.fields import KINDS, Field, FieldError, FieldKind, Hint, Stored, register_kind, unregister_kind
from fastdata.formats import get_format
from fastdata.formats.registry import available_formats

FIELD_FORMATS = [name for name in available_formats(writable=True) if get_format(name).fields]


@dataclass(frozen=True)
class Point:
    """A keypoint in pixels of its sample's image: what the new kind holds."""

    x: float
    y: float


class Point2DKind(FieldKind):
    """``point2d``: a :class:`Point`, stored as one float32 (x, y) row (fixed: an ``(N, 2)``
    array in every format), a ``.json`` tar member ``[x, y]``, moved with the image as a
    degenerate box by torchvision's kernels, a ``(B, 2)`` float32 tensor per batch."""

    name, default_name, member_extension = "point2d", "point", "json"
    stored = Stored(("float32",), (None,), (None,), "array")

    def infer(self, name: str, value: Any, hint: Hint, sample: str, image_field: str | None) -> Field | None:
        if isinstance(value, Point) or hint.kind == self.name:
            return Field(name, self.name, dtype="float32", shape=(2,))
        return None

    def check(self, f: Field, value: Any, where: str) -> Point:
        if not isinstance(value, Point):
            raise FieldError(f"{where} is a {type(value).__name__}; the first samples have a Point there.")
        if not (math.isfinite(value.x) and math.isfinite(value.y)):
            raise FieldError(f"{where} is {value}; a point's coordinates are finite.")
        return value

    def variable(self, f: Field) -> bool:
        return False

    def store(self, f: Field, value: Point) -> bytes:
        return np.array([value.x, value.y], "<f4").tobytes()

    def load(self, f: Field, data: Any) -> Point:
        x, y = np.frombuffer(bytes(data), "<f4")
        return Point(float(x), float(y))

    def member(self, f: Field, stored: bytes) -> bytes:
        point = f.load(stored)
        return json.dumps([point.x, point.y]).encode()

    def from_member(self, f: Field, data: Any) -> bytes:
        x, y = json.loads(bytes(data))
        return np.array([x, y], "<f4").tobytes()

    def moves_with_image(self, f: Field) -> bool:
        return True

    def moved(self, f: Field, value: Point, move: Callable[[Any], Any], size: tuple[int, int]) -> Point:
        from torchvision import tv_tensors

        width, height = size
        box = tv_tensors.BoundingBoxes([[value.x, value.y, value.x, value.y]], format="XYXY",
                                       canvas_size=(height, width))
        x, y = move(box)[0, :2].tolist()
        return Point(x, y)

    def read_value(self, f: Field, stored: Any, image_format: str, canvas: Any) -> Point:
        x, y = np.asarray(stored, dtype=np.float32)
        return Point(float(x), float(y))


@pytest.fixture
def point_kind():
    kind = register_kind(Point2DKind())
    yield kind
    unregister_kind(kind.name)


def pixels(index: int) -> np.ndarray:
    return np.random.default_rng(index).integers(0, 256, (12, 16, 3), dtype=np.uint8)


class Pointed:
    """Images 12x16 (HxW) with a labelled point each: (2i, i + 4) in pixels."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> dict:
        return {"image": Image.fromarray(pixels(index)), "center": Point(2.0 * index, index + 4.0), "label": index}


def _samples(out: Path, **options) -> tuple[Any, list]:
    """The dataset by index (a tar's indexed reader) and every sample, also streamed for a tar."""
    ds = fastdata.open_dataset(out, **options)
    if get_format(fastdata.formats.find_manifest(out)["format"]).iterable:
        streamed = list(ds)
        ds = fastdata.TarIndexedDataset(out, **options)
        assert sorted((s["label"], s["center"]) for s in streamed) == [  # streamed in a seeded order
            (ds[i]["label"], ds[i]["center"]) for i in range(len(ds))]
    return ds, [ds[i] for i in range(len(ds))]


@pytest.mark.parametrize("name", FIELD_FORMATS)
def test_a_kind_defined_in_a_test_converts_verifies_and_reads_back_in_every_format(point_kind, tmp_path: Path,
                                                                                    name: str) -> None:
    out = tmp_path / f"points-{name}"
    manifest = fastdata.convert(Pointed(), out, format=name, workers=0, resize="6x8")  # half size: points halve
    assert {f["name"]: f["kind"] for f in manifest["fields"]["fields"]} == {
        "image": "image", "center": "point2d", "label": "int"}
    report = fastdata.verify(out, deep=True)
    assert report.ok, report.problems
    ds, samples = _samples(out, image_format="numpy")
    assert [s["center"] for s in samples] == [Point(float(i), (i + 4) / 2) for i in range(4)]
    assert [s["label"] for s in samples] == [0, 1, 2, 3]
    assert all(s["image"].shape == (6, 8, 3) for s in samples)
    batch = ds[np.arange(4)]  # fixed kind: one stacked (B, 2) float32 array per batch
    assert batch["center"].dtype == np.float32
    np.testing.assert_array_equal(batch["center"], [[i, (i + 4) / 2] for i in range(4)])
    tensors = fastdata.open_dataset(out) if name != "tar" else fastdata.TarIndexedDataset(out)
    assert torch.equal(tensors[[1, 3]]["center"], torch.tensor([[1.0, 2.5], [3.0, 3.5]]))


def test_the_tar_members_of_a_new_kind_are_its_own(point_kind, tmp_path: Path) -> None:
    fastdata.convert(Pointed(), tmp_path / "p.tar", format="tar", workers=0, store="encoded")
    with tarfile.open(next((tmp_path / "p.tar").glob("*.tar"))) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".center.json")}
    assert sorted(json.loads(data) for data in members.values()) == [[2.0 * i, i + 4.0] for i in range(4)]


def test_a_later_sample_that_does_not_fit_a_new_kind_is_refused_naming_it(point_kind, tmp_path: Path) -> None:
    class Broken(Pointed):
        def __getitem__(self, index: int) -> dict:
            sample = super().__getitem__(index)
            return dict(sample, center=(1.0, 2.0)) if index == 3 else sample

    with pytest.raises(FieldError, match=r"field 'center' is a tuple; the first samples have a Point there"):
        fastdata.convert(Broken(), tmp_path / "b.npy", workers=0)
    assert not (tmp_path / "b.npy").exists()


def test_a_dataset_of_a_kind_no_longer_registered_is_refused_naming_the_kind(tmp_path: Path) -> None:
    kind = register_kind(Point2DKind())
    try:
        fastdata.convert(Pointed(), tmp_path / "p.npy", workers=0)
    finally:
        unregister_kind(kind.name)
    with pytest.raises(FastdataError, match=r"kind 'point2d' is not one of image, mask, int, float, array, text, "
                                            r"text_list, json, bytes \(a kind a package adds is registered "
                                            r"with fastdata.fields.register_kind before"):
        fastdata.open_dataset(tmp_path / "p.npy")


@pytest.mark.parametrize("kind, message", [
    (Point2DKind, "register_kind takes a FieldKind instance, got type"),
    (type("Odd", (Point2DKind,), {"name": "Point 2D"})(), "Invalid field kind name 'Point 2D'"),
    (type("Again", (FieldKind,), {"name": "mask"})(), "Field kind 'mask' is registered already (<field kind 'mask'>)"),
])
def test_register_kind_refuses_what_is_no_new_kind(kind: Any, message: str) -> None:
    with pytest.raises(InvalidOptionError) as error:
        register_kind(kind)
    assert str(error.value).startswith(message)
    assert list(KINDS) == ["image", "mask", "int", "float", "array", "text", "text_list", "json", "bytes"]


def test_every_kind_is_a_row_of_the_table() -> None:
    assert all(isinstance(kind, FieldKind) and kind.name == name for name, kind in KINDS.items())
    assert Field("boxes", "array", dtype="float32", shape=(None, 4)).kind_spec is KINDS["array"]


# --- no ladders over kinds: what differs per kind is its row's -----------------------------------

PACKAGE = Path(fastdata.__file__).parent


def _kind_expression(node: ast.AST) -> bool:
    """``x.kind`` (not a dtype's, a fused plan's or a parameter's), ``kind``, ``hint``,
    ``x.get("kind")`` / ``x["kind"]``, ``kinds.get(k)`` / ``kinds[k]``."""
    if isinstance(node, ast.Attribute) and node.attr == "kind":
        owner = node.value
        return not (isinstance(owner, ast.Call) or getattr(owner, "attr", None) == "dtype"
                    or getattr(owner, "id", None) in ("dtype", "plan", "param", "p", "parameter", "self"))
    if isinstance(node, ast.Name):
        return node.id in ("kind", "hint")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        owner = node.func.value
        return getattr(node.args[0], "value", None) == "kind" or \
            str(getattr(owner, "attr", getattr(owner, "id", ""))).endswith("kinds")
    if isinstance(node, ast.Subscript):
        owner = node.value
        return getattr(node.slice, "value", None) == "kind" or \
            str(getattr(owner, "attr", getattr(owner, "id", ""))).endswith("kinds")
    return False


def _kind_names(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in KINDS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_kind_names(item) for item in node.elts)
    return isinstance(node, ast.Name) and node.id in ("KINDS", "SPATIAL", "_SPATIAL")


def kind_comparisons() -> list[str]:
    """Every comparison (==, !=, in, not in) of a field kind with a kind's name or another kind."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                kinds = [o for o in operands if _kind_expression(o)]
                if kinds and (len(kinds) > 1 or any(_kind_names(o) for o in operands)):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_field_kinds_are_asked_not_compared() -> None:
    """What differs per kind is a method or attribute of its row; what is left compares roles
    (the image, the label) and manifest entries. By this count the package held 109 before
    kinds were classes."""
    found = kind_comparisons()
    assert len(found) < 25, "\n".join(found)
    assert not [line for line in found if "/reader/" in line or "/loading/" in line or "/conversion/spatial" in line]
