"""Damaged Parquet files and save_to_disk folders: each refusal is one line naming the file and
what is wrong (a fastdata error, which the CLI prints as ``fastdata: error: ...``), never a
traceback; and a byte fuzz of both (hypothesis) where every outcome is a good dataset or one line."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from PIL import Image

import fastdata
from fastdata.errors import BadSampleError, FastdataError, InvalidOptionError

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

NAMES = ["cat", "dog", "emu"]


def png(index: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((6, 5, 3), index, np.uint8)).save(out, "PNG")
    return out.getvalue()


def hf_dataset(count: int = 8):
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES),
                                  "text": datasets.Value("string")})
    return datasets.Dataset.from_dict({"image": [{"bytes": png(i), "path": None} for i in range(count)],
                                       "label": [i % 3 for i in range(count)],
                                       "text": [f"t{i}" for i in range(count)]}, features=features)


def refused(source: Path, tmp_path: Path, **options) -> FastdataError:
    with pytest.raises(FastdataError) as caught:
        fastdata.convert(source, tmp_path / "out.npy", workers=0, **options)
    assert "\n" not in str(caught.value)
    return caught.value


def test_a_classlabel_without_names_is_one_line(tmp_path: Path) -> None:
    metadata = {"info": {"features": {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel"}}}}
    table = pa.table({"image": [{"bytes": png(i), "path": None} for i in range(4)], "label": [0, 1, 2, 0]})
    pq.write_table(table.replace_schema_metadata({b"huggingface": json.dumps(metadata).encode()}),
                   tmp_path / "x.parquet")
    error = refused(tmp_path / "x.parquet", tmp_path)
    assert isinstance(error, InvalidOptionError)
    assert str(error) == (f"{tmp_path / 'x.parquet'}: column 'label' is a ClassLabel whose metadata lists no class "
                          "names (names: None); the file's Hugging Face metadata is damaged. Write the file again with "
                          "datasets, or pass --label-column label (label_column='label') to read the labels as plain integers.")


def test_a_uint64_label_beyond_int64_names_the_row_and_the_label_column(tmp_path: Path) -> None:
    table = pa.table({"image": [png(i) for i in range(4)], "label": pa.array([0, 2**63, 1, 2], pa.uint64())})
    pq.write_table(table, tmp_path / "x.parquet")
    error = refused(tmp_path / "x.parquet", tmp_path)
    assert isinstance(error, BadSampleError)
    assert str(error) == (f"{tmp_path / 'x.parquet'} row 1: cannot convert sample (column 'label': the label "
                          "9223372036854775808 does not fit a 64-bit signed integer). Re-run with --skip-bad (skip_bad=True) to leave "
                          "it out.")
    manifest = fastdata.convert(tmp_path / "x.parquet", tmp_path / "kept.npy", workers=0, skip_bad=True)
    assert manifest["count"] == 3


def test_a_state_json_without_data_files_is_one_line(tmp_path: Path) -> None:
    hf_dataset().save_to_disk(str(tmp_path / "saved"))
    state = json.loads((tmp_path / "saved/state.json").read_text())
    (tmp_path / "saved/state.json").write_text(json.dumps({**state, "_data_files": []}))
    error = refused(tmp_path / "saved", tmp_path)
    assert str(error) == (f"{str(tmp_path / 'saved')!r}: its state.json does not list the dataset's Arrow files "
                          "(ValueError: its list of data files is empty); was it written by datasets' save_to_disk?")


@pytest.mark.parametrize("document,cause", [
    ('{"splits": 3}', "ValueError: 'splits' is 3, not a list of split names"),
    ('["train"]', "TypeError: list indices must be integers or slices, not str"),
    ('{"splits": [1]}', "ValueError: 'splits' is [1], not a list of split names"),
])
def test_a_malformed_dataset_dict_json_is_one_line(tmp_path: Path, document: str, cause: str) -> None:
    datasets.DatasetDict({"train": hf_dataset()}).save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "saved/dataset_dict.json").write_text(document)
    error = refused(tmp_path / "saved", tmp_path)
    assert str(error) == (f"{str(tmp_path / 'saved')!r}: dataset_dict.json names no splits ({cause}); was it written "
                          "by datasets' save_to_disk?")


@pytest.mark.parametrize("skip_bad", [False, True], ids=["plain", "skip-bad"])
def test_a_damaged_first_row_group_is_one_line(tmp_path: Path, skip_bad: bool) -> None:
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"image": [png(i) for i in range(8)], "label": [i % 3 for i in range(8)]}), path,
                   row_group_size=4, compression="none")
    data = bytearray(path.read_bytes())
    offset = pq.ParquetFile(path).metadata.row_group(0).column(0).data_page_offset
    data[offset : offset + 40] = bytes(b ^ 0xFF for b in data[offset : offset + 40])  # its first page header
    path.write_bytes(bytes(data))
    error = refused(path, tmp_path, skip_bad=skip_bad)
    assert str(error).startswith(f"{path}: row group 0 cannot be read (OSError: Couldn't deserialize thrift")
    assert str(error).endswith("); the file is damaged. Write it again, or leave it out.")


def test_the_cli_prints_a_damaged_table_in_one_line(tmp_path: Path) -> None:
    from conftest import run_fastdata

    hf_dataset().save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "saved/state.json").write_text("{}")
    done = run_fastdata("convert", tmp_path / "saved", tmp_path / "out.npy", "--workers", "0")
    assert done.returncode == 1
    assert done.stderr == (f"fastdata: error: {str(tmp_path / 'saved')!r}: its state.json does not list the "
                           "dataset's Arrow files (KeyError: '_data_files'); was it written by datasets' "
                           "save_to_disk?\n")


# --- byte fuzz -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> Path:
    """A Parquet file (row groups of 4) and a save_to_disk folder, written by datasets."""
    root = tmp_path_factory.mktemp("originals")
    hf_dataset().to_parquet(str(root / "x.parquet"), batch_size=4)
    hf_dataset().save_to_disk(str(root / "saved"))
    return root


def damaged(data: bytes, edits: list[tuple[float, int]], cut: float | None) -> bytes:
    """``data`` with bytes replaced (each edit: where, as a fraction of the length, and the new
    byte), then cut to a fraction of its length (None: not cut)."""
    out = bytearray(data)
    for where, value in edits:
        out[min(int(where * len(out)), len(out) - 1)] = value
    return bytes(out[: int(cut * len(out))] if cut is not None else out)


EDITS = st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=6)
CUTS = st.none() | st.floats(0, 1, exclude_max=True)


def good_or_one_line(source: Path, out: Path) -> None:
    """Converting ``source`` gives a dataset that reads back whole, or one fastdata error line."""
    if out.exists():
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    try:
        manifest = fastdata.convert(source, out, workers=0)
    except FastdataError as exc:
        assert "\n" not in str(exc) and str(exc), repr(exc)
        assert not out.exists()
        return
    ds = fastdata.open_dataset(out)
    assert len(ds) == manifest["count"] > 0
    for index in range(len(ds)):  # every sample reads back
        assert ds[index]["image"].shape[0] == 3


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=EDITS, cut=CUTS)
def test_a_damaged_parquet_file_converts_or_is_refused_in_one_line(originals, tmp_path: Path, edits, cut) -> None:
    source = tmp_path / "x.parquet"
    source.write_bytes(damaged((originals / "x.parquet").read_bytes(), edits, cut))
    good_or_one_line(source, tmp_path / "out.npy")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=EDITS, cut=CUTS)
def test_a_damaged_arrow_file_converts_or_is_refused_in_one_line(originals, tmp_path: Path, edits, cut) -> None:
    folder = tmp_path / "saved"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(originals / "saved", folder)
    arrow = next(folder.glob("*.arrow"))
    arrow.write_bytes(damaged(arrow.read_bytes(), edits, cut))
    good_or_one_line(folder, tmp_path / "out.npy")


# --- wording ---------------------------------------------------------------------------------------


def image_table(count: int = 3, **columns) -> "pa.Table":
    return pa.table({"image": [png(i) for i in range(count)], "label": [i % 3 for i in range(count)], **columns})


def test_parquet_files_deeper_than_searched_are_named_not_taken_for_an_image_folder(tmp_path: Path) -> None:
    deep = tmp_path / "src/a/b/c"
    deep.mkdir(parents=True)
    pq.write_table(image_table(), deep / "x.parquet")
    error = refused(tmp_path / "src", tmp_path)
    assert str(error) == (f"{str(tmp_path / 'src')!r}: its .parquet files lie more than 3 folders deep (such as "
                          f"{str(deep / 'x.parquet')!r}), deeper than a folder is searched. Give the folder that holds "
                          f"them, or a glob: '{tmp_path / 'src' / '**' / '*.parquet'}'.")
    assert fastdata.convert(f"{tmp_path}/src/**/*.parquet", tmp_path / "glob.npy", workers=0)["count"] == 3


def test_a_file_of_no_split_left_out_by_split_is_named(tmp_path: Path, caplog) -> None:
    (tmp_path / "src").mkdir()
    pq.write_table(image_table(), tmp_path / "src/train-00000-of-00001.parquet")
    pq.write_table(image_table(2), tmp_path / "src/extra.parquet")
    with caplog.at_level("WARNING", logger="fastdata"):
        manifest = fastdata.convert(tmp_path / "src", tmp_path / "out.npy", split="train", workers=0)
    assert manifest["count"] == 3
    assert [r.getMessage() for r in caplog.records if "split" in r.getMessage()] == [
        f"{str(tmp_path / 'src')!r}: --split train leaves out extra.parquet, which belongs to no split"]


def test_split_on_a_folder_of_one_saved_dataset_is_refused(tmp_path: Path) -> None:
    hf_dataset().save_to_disk(str(tmp_path / "saved"))
    error = refused(tmp_path / "saved", tmp_path, split="test")
    assert str(error) == (f"{str(tmp_path / 'saved')!r} holds one dataset (save_to_disk of a Dataset), not splits; "
                          "--split test has nothing to pick. Leave out --split test (split='test').")


def test_a_list_of_images_column_names_the_columns_to_keep(tmp_path: Path) -> None:
    features = datasets.Features({"image": datasets.Image(), "more": datasets.List(datasets.Image()),
                                  "label": datasets.Value("int64")})
    cell = {"bytes": png(1), "path": None}
    datasets.Dataset.from_dict({"image": [cell] * 2, "more": [[cell, cell]] * 2, "label": [0, 1]},
                               features=features).to_parquet(str(tmp_path / "x.parquet"))
    error = refused(tmp_path / "x.parquet", tmp_path)
    assert str(error) == (f"{tmp_path / 'x.parquet'}: column 'more' holds a list of images, which fastdata does not "
                          "convert (one image per field). Leave it out: --columns image,label (columns='image,label').")
    assert fastdata.convert(tmp_path / "x.parquet", tmp_path / "kept.npy", columns="image,label", workers=0)["count"] == 2


def test_a_map_column_is_stored_as_a_json_object(tmp_path: Path) -> None:
    maps = pa.array([[("a", 1), ("b", 2)], [], [("c", 3)]], pa.map_(pa.string(), pa.int64()))
    pq.write_table(image_table(m=maps), tmp_path / "x.parquet")
    fastdata.convert(tmp_path / "x.parquet", tmp_path / "out.npy", workers=0)
    ds = fastdata.open_dataset(tmp_path / "out.npy")
    assert [ds[i]["m"] for i in range(3)] == [{"a": 1, "b": 2}, {}, {"c": 3}]


def test_an_image_path_naming_a_folder_says_so(tmp_path: Path) -> None:
    (tmp_path / "img/folder").mkdir(parents=True)
    table = pa.table({"image": [{"bytes": None, "path": "img/folder"}], "label": [0]})
    pq.write_table(table, tmp_path / "x.parquet")
    error = refused(tmp_path / "x.parquet", tmp_path)
    assert str(error) == (f"{tmp_path / 'x.parquet'} row 0: cannot read image (column 'image': image path "
                          f"{str(tmp_path / 'img/folder')!r} names a folder, not an image file). Re-run with --skip-bad (skip_bad=True) "
                          "to leave it out.")


def test_an_iterable_dataset_with_a_format_converts_as_the_dataset_does(tmp_path: Path) -> None:
    streamed = hf_dataset().to_iterable_dataset().with_format("torch")
    manifest = fastdata.convert(streamed, tmp_path / "out.npy", workers=0)
    assert manifest["count"] == 8
    ds = fastdata.open_dataset(tmp_path / "out.npy")
    assert [int(ds[i]["label"]) for i in range(8)] == [i % 3 for i in range(8)]
    assert [ds[i]["text"] for i in range(8)] == [f"t{i}" for i in range(8)]
