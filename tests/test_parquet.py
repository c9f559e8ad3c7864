"""Parquet files, save_to_disk folders and datasets objects as sources: made here with Hugging Face
``datasets`` and ``pyarrow`` (nothing downloaded), converted into every format and read back
equal (pixels, labels, class names, text, arrays, JSON), from Python, the CLI and the S3 test
server; bad input named by file, row and column."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastdata
from fastdata.errors import BadSampleError, DependencyMissingError, InvalidOptionError

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

NAMES = ["cat", "dog", "emu"]
TRAIN = 10  # rows in the train split: shard 0 holds 6 (row groups of 4), shard 1 holds 4


def pixels(index: int) -> np.ndarray:
    """A 6x5 RGB image that encodes ``index`` (a lost or swapped row shows)."""
    array = np.zeros((6, 5, 3), np.uint8)
    array[..., 0] = index
    array[..., 1] = 255 - index
    array[index % 6, index % 5, 2] = 200
    return array


def png(index: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels(index)).save(out, "PNG")
    return out.getvalue()


FEATURES = {
    "image": "Image", "label": NAMES, "text": "string", "scores": "float32 list", "box": "int16[3]",
    "meta": "struct", "weight": "float32", "flag": "bool",
}


def hf_features():
    value = datasets.Value
    return datasets.Features({
        "image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES), "text": value("string"),
        "scores": datasets.List(value("float32")), "box": datasets.List(value("int16"), length=3),
        "meta": {"a": value("int32"), "b": value("string")}, "weight": value("float32"), "flag": value("bool"),
    })


def rows(indices: range) -> dict[str, list]:
    return {
        "image": [{"bytes": png(i), "path": None} for i in indices], "label": [i % 3 for i in indices],
        "text": [f"caption {i} é" for i in indices], "scores": [[i / 2] * (i % 3) for i in indices],
        "box": [[i, i + 1, -i] for i in indices], "meta": [{"a": i, "b": f"m{i}"} for i in indices],
        "weight": [i / 4 for i in indices], "flag": [i % 2 == 0 for i in indices],
    }


def hf_dataset(indices: range):
    return datasets.Dataset.from_dict(rows(indices), features=hf_features())


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Path:
    """A dataset folder as the Hub keeps them: ``data/train-0000X-of-00002.parquet`` (row groups
    of 4) and ``data/test-00000-of-00001.parquet``, written by ``datasets``."""
    root = tmp_path_factory.mktemp("hub")
    (root / "data").mkdir()
    hf_dataset(range(6)).to_parquet(str(root / "data/train-00000-of-00002.parquet"), batch_size=4)
    hf_dataset(range(6, TRAIN)).to_parquet(str(root / "data/train-00001-of-00002.parquet"), batch_size=4)
    hf_dataset(range(100, 103)).to_parquet(str(root / "data/test-00000-of-00001.parquet"))
    (root / "README.md").write_text("---\nlicense: mit\n---\n")
    return root


def records(path: Path) -> list:
    """Every sample of a converted dataset, in order."""
    if json.loads((path / "manifest.json").read_text())["format"] == "tar" if path.is_dir() else False:
        return list(fastdata.open_dataset(path, shuffle=False))
    ds = fastdata.open_dataset(path)
    return [ds[i] for i in range(len(ds))]


def check_record(sample: dict, index: int) -> None:
    assert list(sample) == list(FEATURES)
    assert np.array_equal(sample["image"].permute(1, 2, 0).numpy(), pixels(index))
    assert sample["label"] == index % 3 and sample["text"] == f"caption {index} é"
    assert np.array_equal(np.asarray(sample["scores"]), np.full(index % 3, index / 2, np.float32))
    assert np.asarray(sample["scores"]).dtype == np.float32
    assert np.array_equal(np.asarray(sample["box"]), np.array([index, index + 1, -index], np.int16))
    assert sample["meta"] == {"a": index, "b": f"m{index}"}
    assert float(sample["weight"]) == index / 4 and bool(sample["flag"]) == (index % 2 == 0)


@pytest.mark.parametrize("name,store", [("npy", "raw"), ("npy", "encoded"), ("hdf5", "raw"), ("hdf5", "encoded"),
                                        ("tar", "raw"), ("tar", "encoded")])
def test_a_hub_folder_converts_into_every_format_and_reads_back_equal(hub: Path, tmp_path: Path, name: str,
                                                                     store: str) -> None:
    out = tmp_path / f"out.{ {'npy': 'npy', 'hdf5': 'h5', 'tar': 'tar'}[name]}"
    manifest = fastdata.convert(hub, out, split="train", store=store, workers=0)
    assert manifest["count"] == TRAIN and manifest["classes"] == NAMES
    image = next(f for f in manifest["fields"]["fields"] if f["name"] == "image")
    assert image["encoding"] == ("original" if store == "encoded" else "raw")  # the Parquet's PNG bytes, as they were
    got = records(out)
    assert len(got) == TRAIN
    for index, sample in enumerate(got):
        check_record(sample, index)
    assert fastdata.verify(out).ok


def cli(capsys, *args) -> tuple[int, str, str]:
    """``fastdata ARGS`` in this process (the CLI's own main: its output and exit code)."""
    from fastdata.cli import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_converts_image_and_label_columns_into_the_classic_pair(hub: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "pair.h5"
    code, printed, err = cli(capsys, "convert", hub / "data/train-*.parquet", out, "--columns", "label,image",
                             "--workers", "2", "--quiet")
    assert code == 0, err
    assert printed.startswith(f"wrote {TRAIN} samples to {out}")
    ds = fastdata.open_dataset(out)
    assert ds.classes == NAMES and "fields" not in json.loads(json.dumps(ds.manifest)) or ds.manifest.get("fields") is None
    for index in range(TRAIN):
        image, label = ds[index]
        assert np.array_equal(image.permute(1, 2, 0).numpy(), pixels(index)) and label == index % 3
    code, _, err = cli(capsys, "convert", hub, tmp_path / "x.npy")
    assert code == 1 and err == (f"fastdata: error: {str(hub)!r} holds the splits test, train; convert one at a "
                                 "time: add --split test (split='test') (or another).\n")


def test_a_plain_parquet_file_binary_images_by_magic_and_a_label_column(tmp_path: Path) -> None:
    """No Hugging Face metadata: image bytes found by their magic, not by the column's name."""
    table = pa.table({"picture": [png(i) for i in range(5)], "blob": [b"\x00raw%d" % i for i in range(5)],
                      "fine": pa.array([4, 3, 2, 1, 0], pa.int32()), "name": [f"n{i}" for i in range(5)]})
    pq.write_table(table, tmp_path / "plain.parquet", row_group_size=2)
    out = tmp_path / "plain.npy"
    fastdata.convert(tmp_path / "plain.parquet", out, columns="picture,fine,blob", label_column="fine", workers=0)
    ds = fastdata.open_dataset(out)
    for index in range(5):
        sample = ds[index]
        assert list(sample) == ["picture", "fine", "blob"]
        assert np.array_equal(sample["picture"].permute(1, 2, 0).numpy(), pixels(index))
        assert sample["fine"] == 4 - index and sample["blob"] == b"\x00raw%d" % index
    pair = tmp_path / "pair.npy"
    fastdata.convert(tmp_path / "plain.parquet", pair, columns=["picture", "fine"], label_column="fine", workers=0)
    assert [int(fastdata.open_dataset(pair)[i][1]) for i in range(5)] == [4, 3, 2, 1, 0]


def test_a_save_to_disk_folder_takes_its_split_and_a_dataset_object_converts_alike(tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": hf_dataset(range(TRAIN)), "test": hf_dataset(range(3))}).save_to_disk(str(saved))
    with pytest.raises(InvalidOptionError, match="holds the splits train, test; convert one at a time: add --split"):
        fastdata.convert(saved, tmp_path / "no.npy", workers=0)
    fastdata.convert(saved, tmp_path / "saved.npy", split="train", workers=0)
    got = records(tmp_path / "saved.npy")
    for index, sample in enumerate(got):
        check_record(sample, index)
    shuffled = hf_dataset(range(TRAIN)).select([3, 1, 4])  # a view: its rows in the view's order
    fastdata.convert(shuffled, tmp_path / "object.tar", store="encoded", workers=0)
    got = records(tmp_path / "object.tar")
    assert [s["label"] for s in got] == [0, 1, 1]
    for index, sample in zip([3, 1, 4], got):
        check_record(sample, index)
    streamed = hf_dataset(range(TRAIN)).to_iterable_dataset(num_shards=2)
    fastdata.convert(streamed, tmp_path / "streamed.npy", workers=0)
    for index, sample in enumerate(records(tmp_path / "streamed.npy")):
        check_record(sample, index)
    with pytest.raises(InvalidOptionError, match="IterableDataset streams rows that its files do not hold as they are"):
        fastdata.convert(streamed.map(lambda row: row), tmp_path / "mapped.npy", workers=0)


@pytest.fixture
def pets(tmp_path: Path) -> Path:
    """Two Parquet files written by pandas, labels as strings (the usual pandas layout): 'emu'
    only in the second file, rows in groups of 2."""
    import pandas as pd

    folder = tmp_path / "pets"
    folder.mkdir()
    for name, first, species in (("a", 0, ["dog", "cat", "dog"]), ("b", 3, ["emu", "cat"])):
        indices = range(first, first + len(species))
        pd.DataFrame({"image": [png(i) for i in indices], "species": species, "note": [f"n{i}" for i in indices]}
                     ).to_parquet(folder / f"{name}.parquet", row_group_size=2)
    return folder


PET_LABELS = [1, 0, 1, 2, 0]  # dog, cat, dog, emu, cat among the sorted classes cat, dog, emu


@pytest.mark.parametrize("name,store", [("npy", "raw"), ("hdf5", "encoded"), ("tar", "raw"), ("tar", "encoded")])
def test_a_string_label_column_becomes_class_labels_its_sorted_values_the_classes(pets: Path, tmp_path: Path,
                                                                                  name: str, store: str) -> None:
    out = tmp_path / f"pets.{ {'npy': 'npy', 'hdf5': 'h5', 'tar': 'tar'}[name]}"
    manifest = fastdata.convert(pets, out, label_column="species", store=store, workers=0)
    assert manifest["classes"] == ["cat", "dog", "emu"]
    assert manifest["class_to_idx"] == {"cat": 0, "dog": 1, "emu": 2}
    got = records(out)
    assert [int(sample["species"]) for sample in got] == PET_LABELS
    assert [sample["note"] for sample in got] == [f"n{i}" for i in range(5)]
    for index, sample in enumerate(got):
        assert np.array_equal(sample["image"].permute(1, 2, 0).numpy(), pixels(index))
    pair = tmp_path / f"pair.{out.suffix}"
    fastdata.convert(pets, pair, columns="image,species", label_column="species", store=store, workers=0)
    assert [int(label) for _, label in records(pair)] == PET_LABELS
    assert fastdata.verify(out).ok and fastdata.verify(pair).ok


def test_a_string_label_columns_classes_show_in_info_and_a_null_is_a_bad_row(pets: Path, tmp_path: Path,
                                                                           capsys) -> None:
    import pandas as pd

    code, _, err = cli(capsys, "convert", pets, tmp_path / "pets.npy", "--label-column", "species", "--quiet")
    assert code == 0, err
    code, printed, err = cli(capsys, "info", tmp_path / "pets.npy")
    assert code == 0 and "\nclasses:  3: cat, dog, emu\n" in printed, err
    pd.DataFrame({"image": [png(5), png(6)], "species": [None, "cat"], "note": ["n5", "n6"]}).to_parquet(
        pets / "c.parquet")
    with pytest.raises(BadSampleError) as raised:
        fastdata.convert(pets, tmp_path / "null.npy", label_column="species", workers=0)
    assert str(raised.value).startswith(f"{pets / 'c.parquet'} row 0: cannot convert sample (column 'species': null, "
                                        "and a string label column has no empty value (a row needs a value in it))")
    assert not (tmp_path / "null.npy").exists()
    manifest = fastdata.convert(pets, tmp_path / "skipped.npy", label_column="species", skip_bad=True, workers=0)
    assert manifest["count"] == 6 and manifest["classes"] == ["cat", "dog", "emu"]
    assert [entry["key"] for entry in manifest["skipped"]] == [f"{pets / 'c.parquet'} row 0"]
    ds = fastdata.open_dataset(tmp_path / "skipped.npy")
    assert [int(ds[i]["species"]) for i in range(6)] == PET_LABELS + [0]


def test_info_records_a_saved_datasets_real_split_or_none(tmp_path: Path, capsys) -> None:
    """The source line names the DatasetDict's split, and no split for a saved Dataset (never the
    folder's name)."""
    hf_dataset(range(3)).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"valid": hf_dataset(range(3))}).save_to_disk(str(tmp_path / "dict"))
    fastdata.convert(tmp_path / "saved", tmp_path / "one.npy", workers=0)
    fastdata.convert(tmp_path / "dict", tmp_path / "split.npy", workers=0)
    source = json.loads((tmp_path / "one.npy" / "manifest.json").read_text())["source"]
    assert source["type"] == "saved" and "split" not in source
    assert json.loads((tmp_path / "split.npy" / "manifest.json").read_text())["source"]["split"] == "valid"
    lines = {}
    for name in ("one", "split"):
        code, printed, err = cli(capsys, "info", tmp_path / f"{name}.npy")
        assert code == 0, err
        lines[name] = next(line for line in printed.splitlines() if line.startswith("source:"))
    assert lines["one"] == f"source:   type=saved saved={tmp_path / 'saved'} count=1 columns={list(FEATURES)} " \
                           "label_column=label length=3"
    assert " saved=" + str(tmp_path / "dict") + " split=valid count=1 " in lines["split"]


def test_image_paths_are_read_beside_the_file_and_never_outside_it(tmp_path: Path) -> None:
    folder = tmp_path / "set"
    (folder / "img").mkdir(parents=True)
    for i in range(3):
        (folder / "img" / f"{i}.png").write_bytes(png(i))
    (tmp_path / "secret.png").write_bytes(png(9))
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    paths = ["img/0.png", "img/1.png", "img/2.png"]
    pq.write_table(pa.table({"image": pa.array([{"bytes": None, "path": p} for p in paths], image),
                             "label": [0, 1, 2]}), folder / "a.parquet")
    fastdata.convert(folder / "a.parquet", tmp_path / "ok.npy", workers=0)
    ds = fastdata.open_dataset(tmp_path / "ok.npy")
    assert [int(ds[i][1]) for i in range(3)] == [0, 1, 2]
    assert np.array_equal(ds[2][0].permute(1, 2, 0).numpy(), pixels(2))
    pq.write_table(pa.table({"image": pa.array([{"bytes": None, "path": "../secret.png"}], image), "label": [0]}),
                   folder / "a.parquet")
    with pytest.raises(BadSampleError) as raised:
        fastdata.convert(folder / "a.parquet", tmp_path / "bad.npy", workers=0)
    assert str(raised.value) == (f"{folder / 'a.parquet'} row 0: cannot read image (column 'image': image path "
                                 "'../secret.png' lies outside the folder of the Parquet file; only paths inside it are "
                                 "read). Re-run with --skip-bad (skip_bad=True) to leave it out.")
    assert not (tmp_path / "bad.npy").exists()


def _two_shards(folder: Path, second: dict) -> None:
    folder.mkdir()
    pq.write_table(pa.table({"image": [png(0), png(1)], "label": [0, 1]}), folder / "part-0.parquet")
    pq.write_table(pa.table(second), folder / "part-1.parquet")


def test_bad_input_is_one_line_naming_file_row_and_column(tmp_path: Path) -> None:
    typed = tmp_path / "typed"
    _two_shards(typed, {"image": [png(2)], "label": ["two"]})
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(typed, tmp_path / "o.npy", workers=0)
    assert str(raised.value) == (f"{typed / 'part-1.parquet'}: column 'label' is string, but it is int64 in "
                                 f"{typed / 'part-0.parquet'}. Every file needs the same column types.")
    missing = tmp_path / "missing"
    _two_shards(missing, {"image": [png(2)]})
    with pytest.raises(InvalidOptionError, match=r"part-1.parquet: has no column 'label', which .*part-0.parquet has"):
        fastdata.convert(missing, tmp_path / "o.npy", workers=0)
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(typed / "part-0.parquet", tmp_path / "o.npy", columns="image,caption", workers=0)
    assert str(raised.value) == (f"{typed / 'part-0.parquet'}: has no column 'caption' (columns: image, label). "
                                 "Check --columns NAMES (columns='NAMES').")
    broken = tmp_path / "broken"
    _two_shards(broken, {"image": [png(2), b"\x89PNG\r\n\x1a\nnot really", png(4)], "label": [2, 0, 1]})
    with pytest.raises(BadSampleError) as raised:
        fastdata.convert(broken, tmp_path / "o.npy", workers=0)
    assert str(raised.value).startswith(f"{broken / 'part-1.parquet'} row 1: cannot read image (column 'image': ")
    assert not (tmp_path / "o.npy").exists()
    manifest = fastdata.convert(broken, tmp_path / "o.npy", workers=0, skip_bad=True)
    assert manifest["count"] == 4 and [s["key"] for s in manifest["skipped"]] == [f"{broken / 'part-1.parquet'} row 1"]


def test_a_corrupt_row_group_fails_by_name_and_skip_bad_lists_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"image": [png(i) for i in range(6)], "label": [0, 1, 2, 0, 1, 2]}), path,
                   row_group_size=2, compression="none")
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    start = chunk.data_page_offset
    data[start:start + 24] = b"\xff" * 24  # the page header of row group 1's image column
    path.write_bytes(bytes(data))
    with pytest.raises(BadSampleError) as raised:
        fastdata.convert(path, tmp_path / "o.h5", workers=0)
    assert str(raised.value).startswith(f"{path} row 2: cannot read image (row group 1 cannot be read (")
    manifest = fastdata.convert(path, tmp_path / "o.h5", workers=0, skip_bad=True)
    assert manifest["count"] == 4
    assert [s["key"] for s in manifest["skipped"]] == [f"{path} row 2", f"{path} row 3"]
    assert [int(label) for _, label in fastdata.open_dataset(tmp_path / "o.h5")] == [0, 1, 1, 2]


def test_without_pyarrow_the_error_names_the_install_command(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"image": [png(0)], "label": [0]}), path)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(DependencyMissingError, match=r"needs the pyarrow package, which is not installed. Install it "
                       r"with: pip install 'torch-fastdata\[parquet\]'"):
        fastdata.convert(path, tmp_path / "o.npy", workers=0)


def test_parquet_on_s3_converts_as_the_local_files_do(hub: Path, s3, tmp_path: Path, capsys) -> None:
    from conftest import output_contents
    from servers import upload

    url = upload(s3, hub / "data", "hub/data")
    local, remote = tmp_path / "local.npy", tmp_path / "remote.npy"
    fastdata.convert(hub / "data", local, split="train", store="encoded", workers=0)
    manifest = fastdata.convert(url, remote, split="train", store="encoded", workers=2)
    assert manifest["count"] == TRAIN and manifest["source"]["files"] == url
    for index, sample in enumerate(records(remote)):
        check_record(sample, index)
    ours, theirs = output_contents(local), output_contents(remote)
    assert {k: v for k, v in ours.items() if k != "manifest.json"} == {k: v for k, v in theirs.items()
                                                                        if k != "manifest.json"}
    out = tmp_path / "cli.h5"
    code, _, err = cli(capsys, "convert", url, out, "--split", "train", "--columns", "image,label", "--quiet")
    assert code == 0, err
    assert [int(label) for _, label in fastdata.open_dataset(out)] == [i % 3 for i in range(TRAIN)]


def test_two_workers_and_row_group_units_write_the_bytes_of_one_process(tmp_path: Path) -> None:
    """Rows from several files and row groups, through the conversion's process pool (more than
    64 samples) and in units smaller than a row group: the same bytes as in one process."""
    from conftest import output_contents

    folder = tmp_path / "many"
    folder.mkdir()
    for shard in range(3):
        indices = range(shard * 50, shard * 50 + 50)
        pq.write_table(pa.table({"image": [png(i % 250) for i in indices], "label": [i % 3 for i in indices],
                                 "text": [f"t{i}" for i in indices]}), folder / f"part-{shard}.parquet",
                       row_group_size=16)
    from fastdata.conversion import open_source
    from fastdata.conversion.units import plan_units

    source = open_source(folder)
    assert source.unit_bounds() == [0, 16, 32, 48, 50, 66, 82, 98, 100, 116, 132, 148, 150]  # files x row groups
    assert [(u.start, u.stop) for u in plan_units(150, 10, source.unit_bounds())][:4] == [(0, 10), (10, 16), (16, 26),
                                                                                          (26, 32)]
    one = fastdata.convert(folder, tmp_path / "one.tar", workers=0, store="encoded")
    two = fastdata.convert(folder, tmp_path / "two.tar", workers=2, store="encoded", unit_samples=20)
    assert one["count"] == two["count"] == 150
    assert output_contents(tmp_path / "one.tar") == output_contents(tmp_path / "two.tar")
    for part in (1, 2):  # a job array's parts plan the same row-group units; the merge writes the same bytes
        fastdata.convert(folder, tmp_path / "parts.tar", workers=0, store="encoded", unit_samples=20, part=(part, 2))
    fastdata.merge(tmp_path / "parts.tar")
    assert output_contents(tmp_path / "parts.tar") == output_contents(tmp_path / "two.tar")
    got = records(tmp_path / "two.tar")
    assert [s["text"] for s in got] == [f"t{i}" for i in range(150)]
    assert all(np.array_equal(s["image"].permute(1, 2, 0).numpy(), pixels(i % 250)) for i, s in enumerate(got))


def test_a_streaming_dataset_converts_from_the_parquet_files_it_streams(hub: Path, tmp_path: Path) -> None:
    files = sorted(str(p) for p in (hub / "data").glob("train-*.parquet"))
    streamed = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)
    manifest = fastdata.convert(streamed, tmp_path / "s.h5", workers=0)
    assert manifest["source"]["files"] == files and manifest["classes"] == NAMES
    for index, sample in enumerate(records(tmp_path / "s.h5")):
        check_record(sample, index)


def test_split_and_column_options_are_checked(hub: Path, uniform_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(hub, tmp_path / "o.npy", split="validation", workers=0)
    assert str(raised.value) == f"{str(hub)!r} has no split 'validation' (splits: test, train). Check --split NAME (split='NAME')."
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(uniform_folder, tmp_path / "o.npy", columns="image,label", workers=0)
    assert str(raised.value) == ("--columns and --label-column apply to Parquet files, saved Hugging Face datasets and "
                                 "datasets objects; this source has no columns. Drop --columns image,label "
                                 "(columns='image,label').")
    with pytest.raises(InvalidOptionError, match=r"Invalid --columns 'image,,label'"):
        fastdata.convert(hub, tmp_path / "o.npy", columns="image,,label", workers=0)
    with pytest.raises(InvalidOptionError, match=r"--label-column 'weight' is not an integer or string column"):
        fastdata.convert(hub, tmp_path / "o.npy", split="test", label_column="weight", workers=0)
    assert not (tmp_path / "o.npy").exists()


def test_the_documented_parquet_examples_convert_photos_of_mixed_sizes(tmp_path: Path, capsys, monkeypatch) -> None:
    """Hub photos differ in size: every example sets --resize or --store encoded, and the first
    runs as written on shards whose images have three sizes."""
    docs = (Path(__file__).resolve().parent.parent / "docs" / "converting.md").read_text()
    block = docs.split("<!-- example: parquet -->\n```\n")[1].split("```")[0]
    lines = [line.split("  #")[0].split() for line in block.splitlines() if line.startswith("fastdata convert")]
    assert len(lines) == 7 and all("--resize" in words or "--store" in words for words in lines)
    python = docs.split("<!-- example: parquet -->\n")[1].split("```python\n")[1].split("```")[0]
    assert python.count("fastdata.convert(") == 2 and python.count("resize=") + python.count('store="encoded"') == 2
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    photos = {"image": [{"bytes": _photo(10 + 7 * i, 12 + 5 * (i % 3)), "path": None} for i in range(6)],
              "label": [i % 3 for i in range(6)]}
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES)})
    datasets.Dataset.from_dict(photos, features=features).to_parquet("data/train-00000-of-00001.parquet")
    capsys.readouterr()  # datasets' own progress bar
    code, printed, err = cli(capsys, *lines[0][1:], "--quiet")
    assert (code, err) == (0, ""), err
    assert printed.startswith("wrote 6 samples to out/train.npy")
    assert [tuple(image.shape) for image, _ in fastdata.open_dataset("out/train.npy")] == [(3, 64, 64)] * 6
    code, _, err = cli(capsys, "convert", "data/", "out/raw.npy", "--split", "train", "--quiet")  # without them
    assert code == 1 and err.startswith("fastdata: error: ") and "Use --resize HxW" in err, err


def _photo(height: int, width: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), height, np.uint8)).save(out, "JPEG")
    return out.getvalue()
