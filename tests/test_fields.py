"""Samples with named fields (docs/fields.md): every kind through every format that stores
fields, exactly; the layout the source returned; batches on every loader backend; stock
webdataset reading the tar members; the geometry of masks and boxes; bad input; the CLI."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
from hypothesis import HealthCheck, given, settings, strategies as st
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

import fastdata
from conftest import FIELD_FORMATS, SUFFIXES
from fastdata.errors import InvalidOptionError
from fastdata.fields import FieldError, Schema
from fastdata.formats import get_format
from fastdata.formats.tar import TarIndexedDataset

FORMATS = {name: SUFFIXES[name] for name in FIELD_FORMATS}  # format -> output name ending
PALETTE = [value for index in range(256) for value in (index, 255 - index, (index * 7) % 256)]


def pixels(index: int, height: int = 6, width: int = 8) -> np.ndarray:
    rng = np.random.default_rng(index)
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)


def mask(index: int, height: int = 6, width: int = 8) -> Image.Image:
    image = Image.frombytes("P", (width, height), ((np.arange(height * width) + index) % 5).astype(np.uint8).tobytes())
    image.putpalette(PALETTE)
    return image


def boxes(index: int) -> tv_tensors.BoundingBoxes:
    values = np.arange(4 * (index % 3), dtype=np.float32).reshape(-1, 4) / 3 + np.float32(0.1)
    return tv_tensors.BoundingBoxes(torch.from_numpy(values), format="XYXY", canvas_size=(6, 8))


class Everything:
    """A dict of every field kind; sample 0 has empty boxes, zero-length bytes, an empty caption list."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, index: int) -> dict:
        return {
            "image": Image.fromarray(pixels(index)),
            "mask": mask(index),
            "boxes": boxes(index),
            "label": index * 10 - 7,
            "score": index / 3,
            "flag": bool(index % 2),
            "attrs": np.arange(4, dtype=np.int16) * (index - 2),
            "points": np.full((index, 2), index, dtype=np.float64),
            "caption": f"ünïcødé ✓ {index}" if index else "",
            "captions": [f"a {index}", "日本語"] if index else [],
            "meta": {"id": index, "tags": ["x"] * index, "nested": {"f": 1.5}},
            "blob": bytes(range(index * 3)),
        }


def kinds() -> dict[str, str]:
    return {"mask": "mask", "points": "array:variable"}


class Hinted(Everything):
    fastdata_kinds = kinds()


def reader(path: Path, **options):
    if get_format(fastdata.formats.find_manifest(path)["format"]).iterable:
        return TarIndexedDataset(path, **options)
    return fastdata.open_dataset(path, **options)


def expect_sample(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    assert type(got["image"]) is tv_tensors.Image and got["image"].dtype == torch.uint8
    np.testing.assert_array_equal(got["image"].permute(1, 2, 0).numpy(), np.asarray(want["image"]))
    assert type(got["mask"]) is tv_tensors.Mask
    np.testing.assert_array_equal(got["mask"].numpy(), np.asarray(want["mask"]))  # palette indices, pixel-equal
    assert type(got["boxes"]) is tv_tensors.BoundingBoxes and got["boxes"].dtype == torch.float32
    assert got["boxes"].format == tv_tensors.BoundingBoxFormat.XYXY and got["boxes"].canvas_size == (6, 8)
    assert got["boxes"].numpy().tobytes() == want["boxes"].numpy().tobytes() and got["boxes"].shape == want["boxes"].shape
    assert got["label"] == want["label"] and type(got["label"]) is int
    assert got["score"] == want["score"] and type(got["score"]) is float
    assert got["flag"] is want["flag"]
    assert got["attrs"].dtype == np.int16 and got["attrs"].tolist() == want["attrs"].tolist()
    assert got["points"].dtype == np.float64 and got["points"].shape == want["points"].shape
    assert got["points"].tobytes() == want["points"].tobytes()
    assert got["caption"] == want["caption"] and got["captions"] == want["captions"]
    assert got["meta"] == want["meta"] and got["blob"] == want["blob"] and type(got["blob"]) is bytes


@pytest.mark.parametrize("store", ["raw", "encoded"])
@pytest.mark.parametrize("name", FORMATS)
def test_every_kind_round_trips_exactly_in_every_format(tmp_path: Path, name: str, store: str) -> None:
    out = tmp_path / f"all{FORMATS[name]}"
    manifest = fastdata.convert(Hinted(), out, store=store, workers=0)
    schema = Schema.from_json(manifest["fields"])
    assert schema.layout == "dict" and schema.names == list(Everything()[0])
    assert schema["mask"].meta["palette"] == PALETTE and schema["boxes"].shape == (None, 4)
    ds = reader(out)
    assert len(ds) == 5
    for index in range(5):
        expect_sample(ds[index], Everything()[index])
    assert fastdata.verify(out, deep=True).ok
    batch = ds[[0, 2, 1]]
    assert batch["image"].shape == (3, 3, 6, 8) and batch["mask"].shape == (3, 6, 8)
    assert batch["label"].tolist() == [-7, 13, 3] and batch["label"].dtype == torch.int64
    assert batch["attrs"].shape == (3, 4) and batch["attrs"].dtype == torch.int16
    assert batch["flag"].tolist() == [False, False, True]
    assert [b.shape[0] for b in batch["boxes"]] == [0, 2, 1] and batch["caption"][1] == "ünïcødé ✓ 2"
    assert batch["blob"] == [b"", bytes(range(6)), bytes(range(3))]


@pytest.mark.parametrize("name", FORMATS)
def test_tuples_come_back_as_tuples_and_transforms_v2_moves_image_mask_and_boxes_together(tmp_path: Path, name: str) -> None:
    class Pairs:
        def __len__(self) -> int:
            return 3

        def __getitem__(self, index: int):
            return tv_tensors.Image(torch.from_numpy(pixels(index)).permute(2, 0, 1)), \
                tv_tensors.Mask(torch.from_numpy(np.array(mask(index)))), {"boxes": boxes(index + 1), "labels": torch.arange(index + 1)}

    out = tmp_path / f"pairs{FORMATS[name]}"
    fastdata.convert(Pairs(), out, workers=0, store="encoded")
    image, got_mask, target = reader(out)[1]
    assert type(image) is tv_tensors.Image and type(got_mask) is tv_tensors.Mask and set(target) == {"boxes", "labels"}
    assert torch.equal(target["labels"], torch.arange(2))
    flip = v2.RandomHorizontalFlip(p=1.0)
    flipped = reader(out, transform=flip)[1]
    assert torch.equal(flipped[0], F.horizontal_flip(image)) and torch.equal(flipped[1], F.horizontal_flip(got_mask))
    assert torch.equal(flipped[2]["boxes"], F.horizontal_flip(target["boxes"]))


def test_classic_pairs_keep_their_layout_and_have_no_schema(tmp_path: Path) -> None:
    class Classic:
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int):
            return Image.fromarray(pixels(index)), index

    manifest = fastdata.convert(Classic(), tmp_path / "c.npy", workers=0)
    assert "fields" not in manifest and sorted(p.name for p in (tmp_path / "c.npy").iterdir()) == [
        "images.npy", "labels.npy", "manifest.json"]
    image, label = fastdata.open_dataset(tmp_path / "c.npy")[2]
    assert type(image) is torch.Tensor and label == 2


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # stock webdataset leaves its shard files open
@pytest.mark.parametrize("store", ["raw", "encoded"])
def test_stock_webdataset_decodes_every_member_with_its_default_decoders(tmp_path: Path, store: str) -> None:
    out = tmp_path / "shards.tar"
    fastdata.convert(Hinted(), out, store=store, workers=0)
    samples = list(wds.WebDataset(str(out / "shard-000000.tar"), shardshuffle=False).decode("l8"))
    images = [s["npy" if store == "raw" else "png"] for s in
              wds.WebDataset(str(out / "shard-000000.tar"), shardshuffle=False).decode("rgb8")]
    assert len(samples) == 5
    for index, sample in enumerate(samples):
        want = Everything()[index]
        suffixes = {k for k in sample if not k.startswith("__")}
        assert suffixes == {"npy" if store == "raw" else "png", "cls", "mask.npy" if store == "raw" else "mask.png",
                            "boxes.npy", "score.json", "flag.cls", "attrs.npy", "points.npy", "caption.txt",
                            "captions.json", "meta.json", "blob.bin"}
        assert sample["cls"] == want["label"] and sample["flag.cls"] == int(want["flag"])
        assert sample["caption.txt"] == want["caption"] and sample["captions.json"] == want["captions"]
        assert sample["meta.json"] == want["meta"] and sample["blob.bin"] == want["blob"]
        assert sample["score.json"] == want["score"]
        assert sample["boxes.npy"].tobytes() == want["boxes"].numpy().tobytes()
        np.testing.assert_array_equal(sample["mask.npy" if store == "raw" else "mask.png"], np.asarray(want["mask"]))
        np.testing.assert_array_equal(images[index], np.asarray(want["image"]))


@pytest.mark.parametrize("backend", ["torch", "thread", "process"])
def test_the_loader_batches_fixed_fields_as_tensors_and_variable_ones_as_lists(tmp_path: Path, backend: str) -> None:
    out = tmp_path / "all.npy"
    fastdata.convert(Hinted(), out, workers=0)
    ds = fastdata.open_dataset(out)
    loader = fastdata.loader(ds, batch_size=2, shuffle=False, num_workers=2, backend=backend)
    batches = list(loader)
    assert [len(b["caption"]) for b in batches] == [2, 2, 1]
    first = batches[0]
    assert torch.equal(first["image"], ds[[0, 1]]["image"]) and first["mask"].shape == (2, 6, 8)
    assert first["label"].tolist() == [-7, 3] and first["attrs"].tolist() == [[0, -2, -4, -6], [0, -1, -2, -3]]
    assert [b.shape for b in first["boxes"]] == [(0, 4), (1, 4)] and first["meta"][1] == Everything()[1]["meta"]
    assert first["blob"] == [b"", bytes(range(3))]


def test_open_dataset_reads_only_the_fields_asked_for(tmp_path: Path) -> None:
    out = tmp_path / "all.h5"
    fastdata.convert(Hinted(), out, workers=0)
    ds = fastdata.open_dataset(out, fields=["caption", "boxes"])
    assert list(ds[3]) == ["boxes", "caption"] and ds[3]["caption"] == "ünïcødé ✓ 3"
    assert ds[3]["boxes"].canvas_size == (6, 8)
    with pytest.raises(InvalidOptionError, match=r"has no field 'nope'\. Its fields: image, mask, boxes"):
        fastdata.open_dataset(out, fields=["nope"])


@pytest.mark.parametrize("store", ["raw", "encoded"])
def test_resize_and_center_crop_move_masks_and_boxes_as_torchvision_does(tmp_path: Path, store: str) -> None:
    out = tmp_path / "small.npy"
    fastdata.convert(Hinted(), out, workers=0, store=store, resize="12", center_crop="10x14")
    ds = fastdata.open_dataset(out)
    for index in range(5):
        want = Everything()[index]
        got = ds[index]
        expected_mask = F.center_crop(F.resize(tv_tensors.Mask(torch.from_numpy(np.array(want["mask"]))), [12]), [10, 14])
        assert torch.equal(got["mask"], expected_mask)  # nearest neighbour: class ids only
        assert set(np.unique(got["mask"].numpy())) <= set(range(5))
        expected_boxes = F.center_crop(F.resize(want["boxes"], [12]), [10, 14])
        assert got["boxes"].numpy().tobytes() == expected_boxes.numpy().tobytes() and got["boxes"].canvas_size == (10, 14)
        assert got["image"].shape == (3, 10, 14)


def test_parts_and_a_single_run_write_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "fieldsdata.py").write_text(
        "import sys\nsys.path.insert(0, %r)\nfrom test_fields import Hinted\ntrain = Hinted()\n" % str(Path(__file__).parent))
    monkeypatch.syspath_prepend(str(tmp_path))
    single = tmp_path / "one.npy"
    fastdata.convert("fieldsdata:train", single, workers=0, unit_samples=2)
    parted = tmp_path / "parts.npy"
    for part in ("1/2", "2/2"):
        fastdata.convert("fieldsdata:train", parted, workers=0, part=part, unit_samples=2)
    fastdata.merge(parted)
    names = sorted(str(p.relative_to(single)) for p in single.rglob("*") if p.is_file() and p.name != "manifest.json")
    assert "fields/boxes.bin" in names and "fields/attrs.npy" in names
    for name in names:
        assert (single / name).read_bytes() == (parted / name).read_bytes(), name


# --- bad input ---------------------------------------------------------------------------


def bad_dataset(change):
    class Bad(Everything):
        fastdata_kinds = kinds()

        def __len__(self) -> int:
            return 12  # sample 10 comes after the probed ones: checked while converting

        def __getitem__(self, index: int) -> dict:
            sample = super().__getitem__(index)
            if index == 10:
                change(sample)
            return sample

    return Bad()


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: s.update(label="7"), "sample 10: field 'label' is str '7'; the first samples have an int there (never "
                                    "cast). Return an int in every sample."),
    (lambda s: s.update(attrs=np.arange(4, dtype=np.int32)), "sample 10: field 'attrs' has dtype int32; the first "
                                                             "samples have int16 (never cast). Convert it in the dataset."),
    (lambda s: s.update(points=np.zeros((2, 3))), "sample 10: field 'points' has shape (2, 3); the first samples have "
                                                  "(K, 2) (the trailing shape must not change)."),
    (lambda s: s.update(attrs=np.arange(5, dtype=np.int16)), "sample 10: field 'attrs' has shape (5,); the first samples "
     "have (4,). If its first dimension varies, say so: kinds={'attrs': 'array:variable'} (from the CLI, as the "
     "dataset's fastdata_kinds)."),
    (lambda s: s.update(attrs=np.arange(4, dtype=np.int16)[None]), "sample 10: field 'attrs' has shape (1, 4); the "
     "first samples have (4,). If its shape varies, say so: kinds={'attrs': 'array:ragged'} (from the CLI, as the "
     "dataset's fastdata_kinds)."),
    (lambda s: s.update(blob="text"), "sample 10: field 'blob' is a str; the first samples have bytes there."),
    (lambda s: s.update(meta={1, 2}), "sample 10: field 'meta' holds something that is not plain JSON data (only dicts "
     "with str keys, lists, str, int, finite float, bool, None). Convert it in the dataset."),
    (lambda s: s.update(mask=mask(10, 5, 8)), "sample 10: field 'mask' is a 8x5 mask but its image 'image' is 8x6 (WxH); "
                                             "a mask has its image's size."),
    (lambda s: s.pop("caption"), "sample 10: has no field 'caption', which the first samples have. Give every sample "
                                 "every field (None for an empty one)."),
])
def test_a_sample_that_does_not_fit_is_one_clear_error_naming_it(tmp_path: Path, change, message: str) -> None:
    with pytest.raises(FieldError) as info:
        fastdata.convert(bad_dataset(change), tmp_path / "bad.npy", workers=0)
    assert str(info.value) == message
    assert not (tmp_path / "bad.npy").exists()
    manifest = fastdata.convert(bad_dataset(change), tmp_path / "skip.npy", workers=0, skip_bad=True)
    assert manifest["count"] == 11 and manifest["skipped"][0]["reason"] == message[:200]


class Odd:
    pass


def test_a_python_object_that_is_no_field_kind_is_named_by_type(tmp_path: Path) -> None:
    class Objects(Everything):
        def __getitem__(self, index: int) -> dict:
            return {"image": Image.fromarray(pixels(index)), "thing": Odd()}

    with pytest.raises(FieldError) as info:
        fastdata.convert(Objects(), tmp_path / "x.npy", workers=0)
    assert str(info.value) == (
        "sample 0: field 'thing' is a test_fields.Odd, which is no field kind (fastdata never pickles). Return it as a "
        "numpy array, a tensor, a str, bytes or plain JSON data (dict/list of numbers and strings) from the dataset.")


def test_a_format_without_fields_refuses_them(tmp_path: Path) -> None:
    from dataclasses import replace

    from fastdata.formats.registry import registered

    plain = replace(get_format("npy"), name="plainnpy", suffix=".plain", suffixes=(".plain",), fields=False)
    with registered(plain):
        with pytest.raises(InvalidOptionError, match=r"^Format 'plainnpy' stores \(image, label\) samples only; this "
                                                     r"source's samples have fields image, mask, boxes"):
            fastdata.convert(Hinted(), tmp_path / "x.plain", workers=0)
    assert not (tmp_path / "x.plain").exists()


def test_target_transform_is_refused_for_datasets_with_fields(tmp_path: Path) -> None:
    fastdata.convert(Hinted(), tmp_path / "a.npy", workers=0)
    with pytest.raises(InvalidOptionError, match=r"^target_transform applies to \(image, label\) datasets"):
        fastdata.open_dataset(tmp_path / "a.npy", target_transform=int)


# --- the CLI ------------------------------------------------------------------------------


def test_the_cli_converts_module_name_and_info_lists_the_fields(tmp_path: Path) -> None:
    (tmp_path / "clidata.py").write_text(
        "import sys\nsys.path.insert(0, %r)\nfrom test_fields import Hinted\nitems = Hinted()\n" % str(Path(__file__).parent))
    from conftest import run_fastdata

    done = run_fastdata("convert", "clidata:items", "out.tar", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    info = run_fastdata("info", "out.tar", cwd=tmp_path).stdout
    assert "fields:   12, given back as a dict" in info
    assert "  boxes: array float32 (K, 4) BoundingBoxes XYXY on 'image'" in info
    assert "  mask: mask (6, 8) raw, mode P palette kept" in info, info
    verify = run_fastdata("verify", "out.tar", "--deep", cwd=tmp_path)
    assert verify.returncode == 0 and "OK" in verify.stdout
    bad = run_fastdata("convert", "clidata:nothing", "x.npy", cwd=tmp_path)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "Module 'clidata' has no attribute 'nothing'" in bad.stderr


# --- property: random schemas through every format ----------------------------------------

_DTYPES = ["uint8", "int16", "int64", "float32", "float64", "bool"]


@st.composite
def schemas(draw):
    fields = {}
    for number in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["int", "float", "fixed", "variable", "text", "texts", "json", "bytes"]))
        dtype = draw(st.sampled_from(_DTYPES))
        trailing = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
        fields[f"f{number}_{kind}"] = (kind, dtype, trailing)
    return fields


def value(draw, kind: str, dtype: str, trailing: tuple, fixed_rows: int):
    if kind == "int":
        return draw(st.integers(-(2**63), 2**63 - 1))
    if kind == "float":
        return draw(st.floats(allow_nan=False, allow_infinity=False))
    if kind in ("fixed", "variable"):
        rows = fixed_rows if kind == "fixed" else draw(st.integers(0, 3))
        data = draw(st.binary(min_size=np.dtype(dtype).itemsize * rows * int(np.prod(trailing)),
                              max_size=np.dtype(dtype).itemsize * rows * int(np.prod(trailing))))
        array = np.frombuffer(data, dtype=np.uint8).view(dtype) if dtype != "bool" else np.frombuffer(data, np.uint8) % 2 == 1
        return array.reshape((rows, *trailing)).copy()
    if kind == "text":
        return draw(st.text(max_size=20))
    if kind == "texts":
        return draw(st.lists(st.text(max_size=5), min_size=1, max_size=3))
    if kind == "json":
        return draw(st.dictionaries(st.text(max_size=3), st.integers() | st.text(max_size=3) | st.booleans(), max_size=3))
    return draw(st.binary(max_size=40))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(data=st.data(), layout=schemas())
def test_random_schemas_and_samples_round_trip_through_every_format(tmp_path_factory, data, layout) -> None:
    count = data.draw(st.integers(1, 4))
    rows = {name: data.draw(st.integers(0, 3)) for name in layout}
    samples = []
    for index in range(count):
        sample = {"image": Image.fromarray(pixels(index, 3, 4))}
        for name, (kind, dtype, trailing) in layout.items():
            sample[name] = value(data.draw, kind, dtype, trailing, rows[name])
        samples.append(sample)
    hints = {name: "array:variable" for name, (kind, _, _) in layout.items() if kind == "variable"}

    class Drawn:
        fastdata_kinds = hints

        def __len__(self) -> int:
            return count

        def __getitem__(self, index: int) -> dict:
            return samples[index]

    folder = tmp_path_factory.mktemp("drawn")
    for name, suffix in FORMATS.items():
        out = folder / f"d{suffix}"
        fastdata.convert(Drawn(), out, workers=0, store="encoded")
        ds = reader(out, image_format="numpy")
        for index in range(count):
            got = ds[index]
            assert list(got) == list(samples[index])
            np.testing.assert_array_equal(got["image"], np.asarray(samples[index]["image"]))
            for key, (kind, dtype, _) in layout.items():
                want = samples[index][key]
                if kind in ("fixed", "variable"):
                    assert got[key].dtype == want.dtype and got[key].shape == want.shape
                    assert got[key].tobytes() == want.tobytes(), (name, key)
                elif kind == "float":
                    assert got[key] == want or (got[key] == 0 and want == 0)
                else:
                    assert got[key] == want, (name, key)
        assert fastdata.verify(out).ok, name


@pytest.mark.parametrize("name", ["npy", "hdf5"])
def test_damaged_field_data_gives_only_clear_errors(tmp_path: Path, name: str) -> None:
    out = tmp_path / f"all{FORMATS[name]}"
    fastdata.convert(Hinted(), out, workers=0)
    if name == "npy":
        offsets = np.load(out / "fields" / "meta.offsets.npy")
        offsets[2] += 3
        np.save(out / "fields" / "meta.offsets.npy", offsets)
        report = fastdata.verify(out)
        assert not report.ok and any("fields/meta.offsets.npy" in p for p in report.problems)
        with pytest.raises(fastdata.errors.CorruptDataError):
            fastdata.open_dataset(out)[1]["meta"]
    else:
        data = bytearray(out.read_bytes())
        start = data.find(json.dumps({"id": 4}).encode()[:6])
        assert start > 0
        data[start] = ord("#")
        out.write_bytes(bytes(data))
        report = fastdata.verify(out)
        assert not report.ok


def test_a_dataset_with_fields_converts_into_every_other_format(tmp_path: Path) -> None:
    fastdata.convert(Hinted(), tmp_path / "a.npy", workers=0, store="encoded")
    fastdata.convert(tmp_path / "a.npy", tmp_path / "b.tar", workers=0)
    fastdata.convert(tmp_path / "b.tar", tmp_path / "c.h5", workers=0, store="raw")
    for name in ("b.tar", "c.h5"):
        ds = reader(tmp_path / name)
        for index in range(5):
            expect_sample(ds[index], Everything()[index])


MANY = '''
import multiprocessing, os, threading
import numpy as np, torch
from PIL import Image
from torchvision import tv_tensors

HOLD_AT = int(os.environ.get("MANY_HOLD_AT", "-1"))


class Many:
    def __len__(self):
        return 2500

    def __getitem__(self, index):
        if 0 <= HOLD_AT <= index and multiprocessing.parent_process() is not None:
            threading.Event().wait()  # a conversion worker held here until the test kills it
        image = Image.fromarray(np.full((8, 8, 3), index % 256, np.uint8))
        boxes = tv_tensors.BoundingBoxes(torch.full((index % 3, 4), float(index)), format="XYXY", canvas_size=(8, 8))
        mask = tv_tensors.Mask(torch.full((8, 8), index % 7, dtype=torch.uint8))
        return {"image": image, "mask": mask, "boxes": boxes, "caption": f"sample {index}", "label": index % 10}

items = Many()
'''


@pytest.mark.parametrize("fmt", ["npy", "tar"])
def test_sigkill_then_resume_gives_the_uninterrupted_output_with_fields(tmp_path: Path, fmt: str) -> None:

    from conftest import finish, kill_after_checkpoint, output_contents, start_fastdata

    (tmp_path / "many.py").write_text(MANY)

    def convert(out: Path, *extra: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
        return start_fastdata("convert", "many:items", out, "--format", fmt, "--workers", "2", "--quiet", *extra,
                              cwd=tmp_path, env={"FASTDATA_CHECKPOINT_INTERVAL_S": "0.2", **(env or {})}, **popen)

    def succeed(process: subprocess.Popen) -> None:
        _, stderr = finish(process, timeout=300)
        assert process.returncode == 0, stderr

    succeed(convert(tmp_path / "reference"))
    journal = tmp_path / "out.partial.json"
    # the conversion's workers hold at sample 2000 (the source's main-process reads, its fingerprint's,
    # are not held), so it is still running, with units 0 and 1 checkpointed, when it is killed
    held = {"MANY_HOLD_AT": "2000", "FASTDATA_CHECKPOINT_INTERVAL_S": "0"}
    process = convert(tmp_path / "out", env=held, start_new_session=True)
    assert kill_after_checkpoint(process, journal) == 2000
    assert not (tmp_path / "out").exists() and (tmp_path / "out.partial").exists()
    succeed(convert(tmp_path / "out", "--resume"))
    assert output_contents(tmp_path / "out") == output_contents(tmp_path / "reference")


@pytest.mark.parametrize("store", ["raw", "encoded"])
def test_several_images_per_sample_are_stored_alike(tmp_path: Path, store: str) -> None:
    class Stereo:
        def __len__(self) -> int:
            return 3

        def __getitem__(self, index: int) -> dict:
            return {"left": Image.fromarray(pixels(index)), "right": Image.fromarray(pixels(index + 10)),
                    "depth": Image.fromarray(pixels(index + 20)[:, :, 0])}

    manifest = fastdata.convert(Stereo(), tmp_path / "s.h5", store=store, workers=0)
    assert [(f["name"], f["mode"]) for f in manifest["fields"]["fields"]] == [("left", "RGB"), ("right", "RGB"),
                                                                             ("depth", "L")]
    got = fastdata.open_dataset(tmp_path / "s.h5")[2]
    assert torch.equal(got["right"].permute(1, 2, 0), torch.from_numpy(pixels(12)))
    assert got["depth"].shape == (1, 6, 8) and torch.equal(got["depth"][0], torch.from_numpy(pixels(22)[:, :, 0]))


def test_the_source_fingerprint_covers_every_field() -> None:
    from fastdata.sources import DatasetSource

    class Captions(Everything):
        def __init__(self, caption: str):
            self.caption = caption

        def __getitem__(self, index: int) -> dict:
            return dict(super().__getitem__(index), caption=self.caption if index == 4 else "same")

    assert DatasetSource(Captions("a")).fingerprint() == DatasetSource(Captions("a")).fingerprint()
    assert DatasetSource(Captions("a")).fingerprint() != DatasetSource(Captions("b")).fingerprint()


@pytest.mark.parametrize("name", FORMATS)
def test_ragged_instance_masks_keep_every_shape_and_move_with_the_image(tmp_path: Path, name: str) -> None:
    class Instances:
        fastdata_kinds = {"masks": "array:ragged"}

        def __len__(self) -> int:
            return 3

        def __getitem__(self, index: int) -> dict:
            height, width = 6 + index, 8
            masks = torch.zeros((index, height, width), dtype=torch.uint8)
            masks[:, : index + 1, : index + 2] = 1
            return {"image": Image.fromarray(pixels(index, height, width)), "masks": tv_tensors.Mask(masks)}

    out = tmp_path / f"inst{FORMATS[name]}"
    fastdata.convert(Instances(), out, workers=0, store="encoded")
    for index in range(3):
        got = reader(out)[index]["masks"]
        assert type(got) is tv_tensors.Mask and torch.equal(got, Instances()[index]["masks"])
    fastdata.convert(Instances(), tmp_path / f"small{FORMATS[name]}", workers=0, store="raw", resize="4x4")
    got = reader(tmp_path / f"small{FORMATS[name]}")[2]["masks"]
    assert torch.equal(got, F.resize(Instances()[2]["masks"], [4, 4]))


def test_a_tuple_of_numpy_values_keeps_its_first_array_as_the_image(tmp_path: Path) -> None:
    class Arrays:
        def __len__(self) -> int:
            return 3

        def __getitem__(self, index: int):
            return pixels(index), np.arange(index, dtype=np.float32), "x" * index

    manifest = fastdata.convert(Arrays(), tmp_path / "a.npy", workers=0)
    assert [(f["name"], f["kind"], f.get("shape")) for f in manifest["fields"]["fields"]] == [
        ("array", "image", [6, 8, 3]), ("array_1", "array", [None]), ("text", "text", None)]
    image, values, text = fastdata.open_dataset(tmp_path / "a.npy", image_format="numpy")[2]
    np.testing.assert_array_equal(image, pixels(2))
    assert values.tolist() == [0.0, 1.0] and values.dtype == np.float32 and text == "xx"
