"""Fields whose names meet on disk (a file, an HDF5 dataset, a tar member of one name) are
refused before anything is written, naming both; names that only look alike still convert."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

import fastdata
from fastdata.errors import InvalidOptionError
from fastdata.formats.tar import TarIndexedDataset


def picture(index: int) -> Image.Image:
    return Image.fromarray(np.full((6, 8, 3), index * 40, np.uint8))


class Fields:
    """Samples of an image and ``extra(index)``'s fields."""

    fastdata_kinds = {"png": "mask"}

    def __init__(self, extra):
        self.extra = extra

    def __len__(self) -> int:
        return 3

    def __getitem__(self, index: int) -> dict:
        return {"image": picture(index), **self.extra(index)}


COLLISIONS = {  # (format, fields of a sample) -> the name both would take
    "npy: x and x.offsets": (".npy", lambda i: {"x": "t" * i, "x.offsets": np.zeros(4, np.int64)},
                             ("x", "x.offsets", "fields/x.offsets.npy", "npy")),
    "hdf5: x and x.data": (".h5", lambda i: {"x": "t" * i, "x.data": np.zeros(4, np.int64)},
                           ("x", "x.data", "fields/x.data", "hdf5")),
    "tar: a and a.cls": (".tar", lambda i: {"a": 1, "a.cls": 2}, ("a", "a.cls", "<key>.a.cls", "tar")),
    "tar: label and cls": (".tar", lambda i: {"label": 1, "cls": 2}, ("label", "cls", "<key>.cls", "tar")),
    "tar: a mask named png": (".tar", lambda i: {"png": Image.fromarray(np.zeros((6, 8), np.uint8), "L")},
                              ("image", "png", "<key>.png", "tar")),
    "tar: boxes and boxes.npy": (".tar", lambda i: {"boxes": np.zeros((i, 4), np.float32),
                                                    "boxes.npy": np.zeros(3, np.float32)},
                                 ("boxes", "boxes.npy", "<key>.boxes.npy", "tar")),
}


@pytest.mark.parametrize("case", COLLISIONS)
def test_fields_stored_under_one_name_are_refused_before_writing(tmp_path: Path, case: str) -> None:
    suffix, extra, (first, second, name, format_name) = COLLISIONS[case]
    out = tmp_path / "out" / f"x{suffix}"
    with pytest.raises(InvalidOptionError) as caught:
        fastdata.convert(Fields(extra), out, store="encoded", workers=0)
    assert str(caught.value) == (
        f"Fields {first!r} and {second!r} would both be stored as {name!r} in the {format_name} format, where only one "
        "of them could be read back. Rename one in the source (a dict key, names=[...] for a tuple, a WebDataset "
        "member's suffix), or convert to another format.")
    assert not out.parent.exists() or list(out.parent.iterdir()) == []  # nothing written, not even a partial output


@pytest.mark.parametrize("suffix", [".npy", ".h5", ".tar"])
def test_names_that_differ_on_disk_convert_and_read_back(tmp_path: Path, suffix: str) -> None:
    """The same names where the format keeps them apart: npy and hdf5 name files by field, tar by
    member suffix, where ``a`` (an int, ``a.cls``) and ``a.txt`` (text) differ."""
    extra = (lambda i: {"a": i, "a.txt": f"t{i}"}) if suffix == ".tar" else \
        (lambda i: {"a": i, "a.cls": i + 1, "x": "t" * i, "x.npy": np.full(2, i, np.int64)})
    out = tmp_path / f"x{suffix}"
    fastdata.convert(Fields(extra), out, store="encoded", workers=0)
    dataset = TarIndexedDataset(out) if suffix == ".tar" else fastdata.open_dataset(out)
    sample = dataset[2]
    assert {k: v for k, v in sample.items() if k != "image" and k != "x.npy"} == \
        {k: v for k, v in extra(2).items() if k != "x.npy"}
    assert fastdata.verify(out, deep=True).ok


def shard_of(folder: Path, members: dict[str, bytes]) -> Path:
    folder.mkdir()
    with tarfile.open(folder / "data-000000.tar", "w") as archive:
        for index in range(2):
            for suffix, data in members.items():
                info = tarfile.TarInfo(f"s{index}.{suffix}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return folder


def encoded(image: Image.Image, codec: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, codec)
    return buffer.getvalue()


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # stock webdataset leaves its shard files open
def test_a_webdataset_jpg_with_a_png_member_keeps_both_members(tmp_path: Path) -> None:
    """An image ``.jpg`` kept as its bytes cannot be a ``.png`` member: the png field is no collision."""
    shards = shard_of(tmp_path / "shards", {"jpg": encoded(picture(1), "JPEG"), "png": encoded(picture(2), "PNG")})
    out = tmp_path / "out.tar"
    fastdata.convert(shards, out, store="encoded", workers=0)
    samples = list(wds.WebDataset(str(out / "shard-000000.tar"), shardshuffle=False))
    assert [sorted(k for k in s if not k.startswith("__")) for s in samples] == [["jpg", "png"], ["jpg", "png"]]
    assert samples[0]["jpg"] == encoded(picture(1), "JPEG")


def test_a_jpg_member_holding_png_bytes_is_refused_where_it_meets_the_png_field(tmp_path: Path) -> None:
    shards = shard_of(tmp_path / "shards", {"jpg": encoded(picture(1), "PNG"), "png": encoded(picture(2), "PNG")})
    with pytest.raises(InvalidOptionError, match=r"data-000000.tar:s0: its image is a .png file, and field 'png' is "
                                                 r"stored as the member '<key>.png' too"):
        fastdata.convert(shards, tmp_path / "out.tar", store="encoded", workers=0)
    assert not (tmp_path / "out.tar").exists()
