"""Conversion errors name the real cause and a fix that works: a member suffix that cannot name
a field, a source of which nothing is readable under --skip-bad, too many open files; and a
WebDataset sample's cls, label and class members are all kept."""

from __future__ import annotations

import io
import os
import resource
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastdata
from fastdata.errors import (BadSampleError, ConversionInterrupted, InvalidOptionError, OutputExistsError,
                             OutputWriteError)
from fastdata.formats.tar import TarIndexedDataset


def jpeg(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((6, 8, 3), value, np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def shards(folder: Path, members: dict[str, bytes], count: int = 3) -> Path:
    folder.mkdir()
    with tarfile.open(folder / "data-000000.tar", "w") as archive:
        for index in range(count):
            for suffix, data in {"jpg": jpeg(index * 40), **members}.items():
                info = tarfile.TarInfo(f"s{index}.{suffix}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return folder


@pytest.mark.parametrize("skip_bad", [False, True])
def test_a_member_suffix_that_cannot_name_a_field_says_so_whatever_skip_bad(tmp_path: Path, skip_bad: bool) -> None:
    source = shards(tmp_path / "shards", {"my file.txt": b"hello"})
    with pytest.raises(InvalidOptionError) as caught:
        fastdata.convert(source, tmp_path / "out.npy", workers=0, skip_bad=skip_bad)
    assert str(caught.value) == (
        "data-000000.tar:s0: member suffix 'my file.txt' cannot name a field (use letters, digits, '_', '-' and '.' "
        "(up to 64, not starting with '.' or '-')); fastdata keeps every member as a field named by its suffix. Rename "
        "those members in the shards.")
    assert not (tmp_path / "out.npy").exists()


def test_a_folder_of_which_nothing_reads_under_skip_bad_says_so(tmp_path: Path) -> None:
    for index in range(3):
        (tmp_path / "photos" / "cat").mkdir(parents=True, exist_ok=True)
        (tmp_path / "photos" / "cat" / f"{index}.jpg").write_bytes(b"not an image")
    with pytest.raises(BadSampleError) as caught:
        fastdata.convert(tmp_path / "photos", tmp_path / "out.npy", workers=0, skip_bad=True)
    assert str(caught.value) == (
        f"No sample of the 3 could be read, so nothing was converted (the first: {tmp_path / 'photos/cat/0.jpg'}: "
        "cannot read image (not a recognised image file)). Check the source: are these files images, is it the right "
        "folder?")
    assert not (tmp_path / "out.npy").exists()


def test_a_fix_that_is_an_option_names_the_flag_and_the_keyword_of_convert(tmp_path: Path) -> None:
    """Called from Python, the fix is a keyword: messages name both forms."""
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    for index in range(3):
        (tmp_path / "photos" / "cat" / f"{index}.jpg").write_bytes(jpeg(index * 40) if index != 1 else b"not an image")
    with pytest.raises(BadSampleError) as caught:
        fastdata.convert(tmp_path / "photos", tmp_path / "out.npy", workers=0)
    assert str(caught.value) == (f"{tmp_path / 'photos/cat/1.jpg'}: cannot read image (not a recognised image file). "
                                 "Re-run with --skip-bad (skip_bad=True) to leave it out.")
    fastdata.convert(tmp_path / "photos", tmp_path / "out.npy", workers=0, skip_bad=True)
    with pytest.raises(OutputExistsError) as caught:
        fastdata.convert(tmp_path / "photos", tmp_path / "out.npy", workers=0, skip_bad=True)
    assert str(caught.value) == (f"Output {str(tmp_path / 'out.npy')!r} already exists. Pass --overwrite "
                                 "(overwrite=True) to replace it.")
    with pytest.raises(OutputExistsError) as caught:
        fastdata.convert(tmp_path / "photos", tmp_path / "out.npy", workers=0, skip_bad=True, store="encoded",
                         resume=True)
    assert str(caught.value).endswith("--resume does not replace it. Pass --overwrite (overwrite=True) to convert again.")
    assert str(ConversionInterrupted("out.npy", 8, 10, "out.npy.partial")) == (
        "'out.npy' keeps 8 of 10 samples in 'out.npy.partial'; run the same command with --resume (resume=True) to "
        "continue from there")


def test_a_fix_that_is_an_option_with_a_value_names_the_flag_and_the_keyword_as_typed(tmp_path: Path) -> None:
    """Called from Python, the fix's keyword is written as a caller types it: split='train',
    columns='image,label', config='en', format='tar'."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    hub = tmp_path / "hub"
    for config in ("en", "fr"):
        (hub / config).mkdir(parents=True)
        for split in ("train", "test"):
            table = pa.table({"image": [jpeg(index * 40) for index in range(2)], "label": [0, 1]})
            pq.write_table(table, hub / config / f"{split}-00000-of-00001.parquet")
    with pytest.raises(InvalidOptionError) as caught:
        fastdata.convert(hub, tmp_path / "o.npy", workers=0)
    assert str(caught.value) == (f"{str(hub)!r} holds the configurations en, fr (Hugging Face subsets); convert one "
                                 "at a time: add --config en (config='en') (or another), or give its folder.")
    with pytest.raises(InvalidOptionError) as caught:
        fastdata.convert(hub, tmp_path / "o.npy", config="en", workers=0)
    assert str(caught.value) == (f"{str(hub)!r} holds the splits test, train; convert one at a time: add --split test "
                                 "(split='test') (or another).")
    with pytest.raises(InvalidOptionError) as caught:
        fastdata.convert(hub, tmp_path / "o.npy", config="en", split="valid", workers=0)
    assert str(caught.value) == (f"{str(hub)!r} has no split 'valid' (splits: test, train). Check --split NAME "
                                 "(split='NAME').")
    with pytest.raises(InvalidOptionError) as caught:
        fastdata.convert(hub / "en", tmp_path / "o.npy", split="test", label_column="class", workers=0)
    assert str(caught.value) == (f"{hub / 'en' / 'test-00000-of-00001.parquet'}: has no column 'class' (columns: "
                                 "image, label). Check --label-column NAME (label_column='NAME').")
    with pytest.raises(InvalidOptionError) as caught:
        fastdata.convert(hub / "en", tmp_path / "o.npy", split="test", columns="image,label,", workers=0)
    assert str(caught.value) == ("Invalid --columns 'image,label,'. Give column names, comma-separated, each once: "
                                 "--columns image,label (columns='image,label').")
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    (tmp_path / "photos" / "cat" / "0.jpg").write_bytes(jpeg(0))
    with pytest.raises(InvalidOptionError) as caught:
        fastdata.convert(tmp_path / "photos", tmp_path / "o.npy", config="en", workers=0)
    assert str(caught.value) == ("--config en (config='en') applies to Parquet files (a Hugging Face dataset's "
                                 "configurations); this source has none. Drop it.")
    with pytest.raises(InvalidOptionError) as caught:
        fastdata.convert(tmp_path / "photos", tmp_path / "o.npy", part="1/2", resume=True, workers=0)
    assert str(caught.value).endswith("converts only the rest. Drop --resume (resume=True).")
    with pytest.raises(InvalidOptionError) as caught:
        fastdata.convert(tmp_path / "photos", tmp_path / "o.npy", ray_address="auto", workers=0)
    assert str(caught.value) == "--ray-address 'auto' applies to --engine ray only. Add --engine ray (engine='ray')."
    assert not (tmp_path / "o.npy").exists()
    fastdata.convert(tmp_path / "photos", tmp_path / "o.npy", workers=0)
    with pytest.raises(InvalidOptionError) as caught:
        fastdata.open_dataset(tmp_path / "o.npy", resize=4)
    assert str(caught.value) == ("resize, center_crop and decoder apply to datasets of encoded images; this one stores "
                                 "decoded pixels (--store raw). Convert with --resize HxW (resize='HxW') (or "
                                 "--center-crop HxW (center_crop='HxW')) instead, or transform the tensors.")


class ManyFields:
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> dict:
        return {"image": Image.fromarray(np.zeros((4, 4, 3), np.uint8)), **{f"f{k}": "t" * index for k in range(40)}}


def test_running_out_of_file_handles_names_the_limit_and_the_fix(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = len(os.listdir("/proc/self/fd")) + 30  # 40 variable fields need 80 files open at once
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        with pytest.raises(OutputWriteError) as caught:
            fastdata.convert(ManyFields(), tmp_path / "many.npy", workers=0)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert str(caught.value) == (
        f"Cannot write {str(tmp_path / 'many.npy')!r}: too many open files: this process may open {limit} (its "
        "'ulimit -n'), and the npy and hdf5 writers keep one or two files open per field. Raise the limit ('ulimit -n "
        "65536') and convert again, or convert to --format tar (format='tar'), which keeps one shard open; no partial output was "
        "left behind.")
    assert os.listdir(tmp_path) == []
    fastdata.convert(ManyFields(), tmp_path / "many.tar", workers=0)  # the fix it names
    assert TarIndexedDataset(tmp_path / "many.tar")[1]["f39"] == "t"


@pytest.mark.parametrize("suffix", [".npy", ".tar"])
def test_cls_label_and_class_members_are_all_kept(tmp_path: Path, suffix: str) -> None:
    source = shards(tmp_path / "shards", {"cls": b"1", "label": b"2", "class": b"3"})
    out = tmp_path / f"out{suffix}"
    fastdata.convert(source, out, workers=0)
    dataset = TarIndexedDataset(out) if suffix == ".tar" else fastdata.open_dataset(out)
    sample = dataset[0]
    assert [(key, sample[key]) for key in ("cls", "label", "class")] == [("cls", 1), ("label", 2), ("class", 3)]
    assert list(sample) == ["__key__", "jpg", "cls", "label", "class"] and dataset.labels.tolist() == [1, 1, 1]
    if suffix == ".tar":
        with tarfile.open(out / "shard-000000.tar") as archive:
            assert archive.getnames()[1:4] == ["s0.cls", "s0.label.cls", "s0.class.cls"]
