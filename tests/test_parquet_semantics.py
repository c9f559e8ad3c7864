"""Parquet and Hugging Face sources read what the user sees and nothing else: Hub configurations,
links and save_to_disk files out of the dataset's folder, ClassLabel values and names, transforms
and casts, streaming options, nulls and column types (tables written here by ``pyarrow`` and
``datasets``, nothing downloaded)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import fastdata
from fastdata.errors import BadSampleError, InvalidOptionError

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from test_parquet import NAMES, hf_dataset, pixels, png  # noqa: E402 - after the importorskips

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())]) if pa else None


def _pixels_of(path: Path, index: int) -> np.ndarray:
    image = fastdata.open_dataset(path)[index]
    image = image[0] if isinstance(image, tuple) else image["image"]
    return image.permute(1, 2, 0).numpy()


# --- links and paths out of the dataset's folder ----------------------------------------------


def test_image_paths_through_links_out_of_the_folder_are_refused(tmp_path: Path) -> None:
    folder, outside = tmp_path / "set", tmp_path / "outside"
    (folder / "img").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.png").write_bytes(png(9))
    (folder / "img" / "0.png").write_bytes(png(0))
    (folder / "img" / "inner.png").symlink_to("0.png")  # a link inside the folder is fine
    (folder / "img" / "link.png").symlink_to("../../outside/secret.png")
    (folder / "linked").symlink_to(outside, target_is_directory=True)
    path = folder / "a.parquet"
    for cell in ("img/link.png", "linked/secret.png"):
        pq.write_table(pa.table({"image": pa.array([{"bytes": None, "path": "img/inner.png"},
                                                    {"bytes": None, "path": cell}], IMAGE), "label": [0, 1]}), path)
        with pytest.raises(BadSampleError) as raised:
            fastdata.convert(path, tmp_path / "bad.npy", workers=0)
        assert str(raised.value) == (
            f"{path} row 1: cannot read image (column 'image': image path {cell!r} leads through a symbolic link out of "
            "the folder of the Parquet file; only files inside it are read). Re-run with --skip-bad (skip_bad=True) to leave it out.")
        assert not (tmp_path / "bad.npy").exists()
    manifest = fastdata.convert(path, tmp_path / "ok.npy", workers=0, skip_bad=True)
    assert manifest["count"] == 1 and np.array_equal(_pixels_of(tmp_path / "ok.npy", 0), pixels(0))


def test_image_paths_in_a_hub_cache_snapshot_follow_its_links_to_the_repos_blobs(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "datasets--org--name"  # huggingface_hub's cache: snapshot files link to ../../blobs
    snapshot, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    (snapshot / "img").mkdir(parents=True)
    blobs.mkdir()
    (tmp_path / "secret.png").write_bytes(png(9))
    for index in range(2):
        (blobs / f"b{index}").write_bytes(png(index))
        (snapshot / "img" / f"{index}.png").symlink_to(f"../../../blobs/b{index}")
    (snapshot / "img" / "out.png").symlink_to("../../../../../secret.png")  # out of the repo's folder: refused
    cells = [{"bytes": None, "path": f"img/{name}.png"} for name in ("0", "1", "out")]
    pq.write_table(pa.table({"image": pa.array(cells, IMAGE), "label": [0, 1, 2]}), blobs / "parquet")
    (snapshot / "train.parquet").symlink_to("../../blobs/parquet")
    manifest = fastdata.convert(snapshot, tmp_path / "o.npy", workers=0, skip_bad=True)
    assert [s["key"] for s in manifest["skipped"]] == [f"{snapshot / 'train.parquet'} row 2"]
    assert [np.array_equal(_pixels_of(tmp_path / "o.npy", i), pixels(i)) for i in range(2)] == [True, True]


def _saved(tmp_path: Path) -> Path:
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": hf_dataset(range(4)), "test": hf_dataset(range(2))}).save_to_disk(str(saved))
    return saved


@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_a_saved_state_json_naming_arrow_files_outside_its_folder_is_refused(tmp_path: Path, where: str) -> None:
    saved = _saved(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(saved / "test", elsewhere)
    state_path = saved / "train" / "state.json"
    state = json.loads(state_path.read_text())
    name = "../../elsewhere/data-00000-of-00001.arrow" if where == "relative" else str(
        elsewhere / "data-00000-of-00001.arrow")
    state["_data_files"] = [{"filename": name}]
    state_path.write_text(json.dumps(state))
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(saved, tmp_path / "o.npy", split="train", workers=0)
    assert str(raised.value) == (f"{str(saved / 'train')!r}: its state.json names the Arrow file {name!r}, which lies "
                                 "outside the folder; fastdata reads only a saved dataset's own files. Save the dataset "
                                 "again with save_to_disk.")
    assert not (tmp_path / "o.npy").exists()


def test_a_saved_dataset_dict_json_naming_a_split_outside_its_folder_is_refused(tmp_path: Path) -> None:
    saved = _saved(tmp_path)
    shutil.copytree(saved / "test", tmp_path / "other")
    (saved / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "../other"]}))
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(saved, tmp_path / "o.npy", split="../other", workers=0)
    assert str(raised.value) == (f"{str(saved)!r}: its dataset_dict.json names the split '../other', which lies outside "
                                 "the folder; fastdata reads only a saved dataset's own files. Save the dataset again "
                                 "with save_to_disk.")
    assert fastdata.convert(saved, tmp_path / "o.npy", split="train", workers=0)["count"] == 4


# --- Hub configurations -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> Path:
    """Two configurations of one Hub dataset in both of the Hub's layouts: ``en/train-00000-of-
    00001.parquet`` (``push_to_hub(config_name=...)``) and ``en/train/0000.parquet`` (the Hub's
    Parquet conversion), ``en`` of rows 0-3 and ``fr`` of rows 10-12."""
    root = tmp_path_factory.mktemp("configs")
    for layout in ("pushed", "converted"):
        for config, indices in (("en", range(4)), ("fr", range(10, 13))):
            name = "train-00000-of-00001.parquet" if layout == "pushed" else "train/0000.parquet"
            (root / layout / config / name).parent.mkdir(parents=True, exist_ok=True)
            hf_dataset(indices).to_parquet(str(root / layout / config / name))
        hf_dataset(range(20, 22)).to_parquet(str(root / layout / "en" / (name.replace("train", "test"))))
    return root


def _check_configurations(source: Path | str, tmp_path: Path) -> None:
    """``source`` (the ``configs`` fixture's layout, local or a URL) is refused naming its
    configurations, and ``config="fr"`` converts fr's three rows."""
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(source, tmp_path / "o.npy", split="train", workers=0)
    assert str(raised.value) == (f"{str(source)!r} holds the configurations en, fr (Hugging Face subsets); convert one "
                                 "at a time: add --config en (config='en') (or another), or give its folder.")
    assert not (tmp_path / "o.npy").exists()
    manifest = fastdata.convert(source, tmp_path / "fr.npy", config="fr", workers=0)
    assert manifest["count"] == 3 and manifest["source"]["config"] == "fr"
    assert [np.array_equal(_pixels_of(tmp_path / "fr.npy", i), pixels(10 + i)) for i in range(3)] == [True] * 3


@pytest.mark.parametrize("layout", ["pushed", "converted"])
def test_several_configurations_are_refused_by_name_and_one_is_picked_by_config_or_path(
        configs: Path, tmp_path: Path, capsys, layout: str) -> None:
    from test_parquet import cli

    root = configs / layout
    _check_configurations(root, tmp_path)
    with pytest.raises(InvalidOptionError, match=r"holds the splits test, train; convert one at a time"):
        fastdata.convert(root, tmp_path / "o.npy", config="en", workers=0)
    assert fastdata.convert(root / "en", tmp_path / "en.npy", split="train", workers=0)["count"] == 4
    code, _, err = cli(capsys, "convert", root, tmp_path / "cli.npy", "--config", "en", "--split", "test", "--quiet")
    assert code == 0, err
    assert [int(fastdata.open_dataset(tmp_path / "cli.npy")[i]["label"]) for i in range(2)] == [20 % 3, 21 % 3]
    code, _, err = cli(capsys, "convert", root, tmp_path / "no.npy", "--config", "de", "--split", "train")
    assert code == 1 and err == (f"fastdata: error: {str(root)!r} has no configuration 'de' (configurations: en, fr). "
                                 "Check --config NAME (config='NAME').\n")
    assert not (tmp_path / "o.npy").exists() and not (tmp_path / "no.npy").exists()


def test_config_is_refused_where_there_are_no_configurations(tmp_path: Path, uniform_folder: Path) -> None:
    saved = _saved(tmp_path)
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(saved, tmp_path / "o.npy", split="train", config="en", workers=0)
    assert str(raised.value) == ("--config 'en' picks a configuration among Parquet files (a Hub dataset's folders); a "
                                 "saved dataset or a datasets object is one already. Drop --config en (config='en').")
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(uniform_folder, tmp_path / "o.npy", config="en", workers=0)
    assert str(raised.value) == ("--config en (config='en') applies to Parquet files (a Hugging Face dataset's configurations); "
                                 "this source has none. Drop it.")


# --- ClassLabel values and names ----------------------------------------------------------------


def _labelled(labels: list[int]):
    """``hf_dataset`` rows with these ClassLabel values (-1: Hugging Face's "no label")."""
    dataset = hf_dataset(range(len(labels))).cast_column("label", datasets.Value("int64"))
    dataset = dataset.map(lambda row, index: {"label": labels[index]}, with_indices=True)
    return dataset.cast_column("label", datasets.ClassLabel(names=NAMES))


@pytest.mark.parametrize("suffix", ["npy", "h5", "tar"])
@pytest.mark.parametrize("columns", ["image,label", None])
def test_an_unlabelled_test_split_converts_with_label_minus_one_and_verifies(tmp_path: Path, columns,
                                                                             suffix: str) -> None:
    from test_parquet import records

    path = tmp_path / "test-00000-of-00001.parquet"
    _labelled([-1, 0, -1, 2]).to_parquet(str(path))
    out = tmp_path / f"test.{suffix}"
    manifest = fastdata.convert(path, out, columns=columns, workers=0)
    assert manifest["count"] == 4 and manifest["classes"] == NAMES
    got = [sample[1] if columns else sample["label"] for sample in records(out)]
    assert [int(label) for label in got] == [-1, 0, -1, 2]
    assert fastdata.verify(out).problems == () and fastdata.verify(out, deep=True).problems == ()


def test_a_label_beyond_the_class_names_fails_by_file_and_row_and_skip_bad_leaves_it_out(tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    _labelled([0, -1, 7, 2]).to_parquet(str(path))
    reason = ("column 'label': label 7 is not a class: the ClassLabel has 3 names, so labels are 0..2 (or -1: no "
              "label)")
    for columns in ("image,label", "image,text,label"):
        out = tmp_path / f"{columns}.npy"
        with pytest.raises(BadSampleError) as raised:
            fastdata.convert(path, out, columns=columns, workers=0)
        assert str(raised.value) == f"{path} row 2: cannot convert sample ({reason}). Re-run with --skip-bad (skip_bad=True) to leave it out."
        assert not out.exists()
        manifest = fastdata.convert(path, out, columns=columns, workers=0, skip_bad=True)
        assert manifest["skipped"] == [{"key": f"{path} row 2", "reason": reason}]
        ds = fastdata.open_dataset(out)
        assert [int(ds[i][1] if columns == "image,label" else ds[i]["label"]) for i in range(3)] == [0, -1, 2]
        assert fastdata.verify(out).problems == ()


def test_class_label_names_that_differ_between_shards_are_refused_naming_the_files(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    first, second = folder / "train-00000-of-00002.parquet", folder / "train-00001-of-00002.parquet"
    hf_dataset(range(3)).to_parquet(str(first))
    other = hf_dataset(range(3, 5)).cast_column("label", datasets.ClassLabel(names=["dog", "cat", "emu"]))
    other.to_parquet(str(second))
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(folder, tmp_path / "o.npy", workers=0)
    assert str(raised.value) == (
        f"{second}: column 'label' is ClassLabel(names=['dog', 'cat', 'emu']), but it is ClassLabel(names=['cat', "
        f"'dog', 'emu']) in {first}. Every file needs the same features (a ClassLabel's names in the same order): "
        "convert the files apart, or leave the column out with --columns NAMES (columns='NAMES').")
    assert not (tmp_path / "o.npy").exists()
    assert fastdata.convert(folder, tmp_path / "o.npy", columns="image,text", workers=0)["count"] == 5


def test_shards_whose_features_are_written_differently_but_mean_the_same_convert(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    first, second = folder / "train-00000-of-00002.parquet", folder / "train-00001-of-00002.parquet"
    hf_dataset(range(3)).to_parquet(str(first))
    table = pq.read_table(first)
    document = json.loads(table.schema.metadata[b"huggingface"])
    features = document["info"]["features"]
    features["scores"] = {"_type": "Sequence", "feature": {"dtype": "float32", "_type": "Value"}}  # older datasets
    del features["text"]  # a column written without its feature: the same text column
    second_table = pq.read_table(first).replace_schema_metadata({b"huggingface": json.dumps(document).encode()})
    pq.write_table(second_table, second)
    manifest = fastdata.convert(folder, tmp_path / "o.npy", workers=0)
    assert manifest["count"] == 6 and manifest["classes"] == NAMES
    gray = hf_dataset(range(3)).cast_column("image", datasets.Image(mode="L"))
    gray.to_parquet(str(second))
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(folder, tmp_path / "gray.npy", workers=0)
    assert str(raised.value).startswith(f"{second}: column 'image' is the feature {{")


# --- what ds[i] gives: transforms and casts ------------------------------------------------------


def test_a_dataset_with_a_transform_is_refused(tmp_path: Path) -> None:
    transformed = hf_dataset(range(3)).with_transform(lambda batch: {"label": [7 for _ in batch["label"]]})
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(transformed, tmp_path / "o.npy", workers=0)
    assert str(raised.value) == (
        "This datasets.Dataset has a transform (with_transform or set_transform): its items are what the transform "
        "returns, which fastdata does not run. Convert the rows it transforms (ds.with_format(None)) and transform "
        "them when reading, or store the transform's results with ds.map(...).")
    assert not (tmp_path / "o.npy").exists()
    assert fastdata.convert(transformed.with_format(None), tmp_path / "o.npy", workers=0)["count"] == 3


def test_a_datasets_format_columns_are_the_columns_converted(tmp_path: Path) -> None:
    shown = hf_dataset(range(3))
    shown.set_format(None, columns=["image", "label"])
    assert list(shown[0]) == ["image", "label"]
    manifest = fastdata.convert(shown, tmp_path / "pair.npy", workers=0)
    assert manifest["source"]["columns"] == ["image", "label"]
    assert [int(fastdata.open_dataset(tmp_path / "pair.npy")[i][1]) for i in range(3)] == [0, 1, 2]
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(shown, tmp_path / "o.npy", columns="image,text", workers=0)
    assert str(raised.value) == ("The datasets.Dataset gives only the columns image, label (its format's columns, "
                                 "set_format), not text. Check columns= and label_column=, or give the object those columns.")
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(shown.with_format(None, columns=["image", "text"]), tmp_path / "o.npy", label_column="label",
                         workers=0)
    assert str(raised.value) == ("The datasets.Dataset gives only the columns image, text (its format's columns, "
                                 "set_format), not label. Check columns= and label_column=, or give the object those "
                                 "columns.")


@pytest.mark.parametrize("store", ["raw", "encoded"])
@pytest.mark.parametrize("given", ["dataset", "parquet"])
def test_an_image_cast_to_a_mode_converts_in_that_mode(tmp_path: Path, given: str, store: str) -> None:
    gray = hf_dataset(range(4)).cast_column("image", datasets.Image(mode="L"))
    source = gray
    if given == "parquet":
        source = tmp_path / "gray.parquet"
        gray.to_parquet(str(source))  # the feature, mode included, in the file's metadata
    out = tmp_path / "gray.npy"
    fastdata.convert(source, out, columns="image,label", store=store, workers=0)
    ds = fastdata.open_dataset(out)
    for index in range(4):
        expected = np.asarray(gray[index]["image"])
        assert gray[index]["image"].mode == "L" and expected.shape == (6, 5)
        assert np.array_equal(ds[index][0].numpy(), expected[None])


# --- streaming datasets ---------------------------------------------------------------------------


def test_a_stream_built_with_filters_is_refused_and_one_with_columns_converts_those(hub_like: Path,
                                                                                     tmp_path: Path) -> None:
    files = [str(hub_like)]
    filtered = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True,
                                     filters=[("weight", ">", 1.0)])
    assert len(list(filtered)) == 3  # rows 5, 6, 7 of 8
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(filtered, tmp_path / "o.npy", workers=0)
    assert str(raised.value) == (
        "This datasets.IterableDataset streams only the rows its filters= keep ([('weight', '>', 1.0)]), which "
        "fastdata cannot count before reading them. Load it without streaming (load_dataset(..., filters=...) gives a "
        "Dataset, which fastdata converts), or give fastdata the Parquet files without the filters.")
    assert not (tmp_path / "o.npy").exists()
    kept = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True,
                                 columns=["image", "label"])
    manifest = fastdata.convert(kept, tmp_path / "pair.npy", workers=0)
    assert manifest["source"]["columns"] == ["image", "label"] and manifest["count"] == 8
    ds = fastdata.open_dataset(tmp_path / "pair.npy")
    assert [int(ds[i][1]) for i in range(8)] == [i % 3 for i in range(8)]
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(kept, tmp_path / "o.npy", columns="image,text", workers=0)
    assert str(raised.value) == ("The datasets.IterableDataset streams only the columns image, label (its columns=), "
                                 "not text. Check columns= and label_column=, or give the object those columns.")
    text_only = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True,
                                      columns=["image", "text"])
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(text_only, tmp_path / "o.npy", label_column="label", workers=0)
    assert str(raised.value) == ("The datasets.IterableDataset streams only the columns image, text (its columns=), "
                                 "not label. Check columns= and label_column=, or give the object those columns.")
    assert not (tmp_path / "o.npy").exists()


@pytest.fixture()
def hub_like(tmp_path: Path) -> Path:
    path = tmp_path / "train-00000-of-00001.parquet"
    hf_dataset(range(8)).to_parquet(str(path), batch_size=3)
    return path


# --- column types ---------------------------------------------------------------------------------


def test_bool_category_audio_and_pdf_columns_convert_as_their_arrow_types_say(tmp_path: Path) -> None:
    import pandas as pd

    path = tmp_path / "typed.parquet"
    pd.DataFrame({"image": [png(i) for i in range(3)], "label": [True, False, True],
                  "kind": pd.Categorical(["a", "b", "a"])}).to_parquet(path)  # kind: dictionary-encoded strings
    fastdata.convert(path, tmp_path / "typed.npy", workers=0)
    ds = fastdata.open_dataset(tmp_path / "typed.npy")
    assert [(bool(ds[i]["label"]), ds[i]["kind"]) for i in range(3)] == [(True, "a"), (False, "b"), (True, "a")]
    with pytest.raises(InvalidOptionError, match=r"--label-column 'label' is not an integer or string column"):
        fastdata.convert(path, tmp_path / "o.npy", label_column="label", workers=0)
    manifest = fastdata.convert(path, tmp_path / "kinds.npy", label_column="kind", workers=0)  # category: its values
    assert manifest["classes"] == ["a", "b"]
    assert [int(fastdata.open_dataset(tmp_path / "kinds.npy")[i]["kind"]) for i in range(3)] == [0, 1, 0]
    sounds = [b"RIFF\x10\x00\x00\x00WAVEfmt %d" % i for i in range(3)]
    documents = [b"%%PDF-1.4 %d" % i for i in range(3)]
    files = hf_dataset(range(3)).add_column("audio", [{"bytes": b, "path": None} for b in sounds])
    files = files.add_column("doc", [{"bytes": b, "path": None} for b in documents])
    files = files.cast_column("audio", datasets.Audio(decode=False)).cast_column("doc", datasets.Pdf(decode=False))
    files.to_parquet(str(tmp_path / "files.parquet"))
    fastdata.convert(tmp_path / "files.parquet", tmp_path / "files.npy", columns="image,audio,doc", workers=0)
    ds = fastdata.open_dataset(tmp_path / "files.npy")
    assert [(ds[i]["audio"], ds[i]["doc"]) for i in range(3)] == list(zip(sounds, documents))  # never images
    assert np.array_equal(ds[2]["image"].permute(1, 2, 0).numpy(), pixels(2))


def test_a_stream_of_dictionary_encoded_columns_converts_their_values(tmp_path: Path) -> None:
    import pandas as pd

    path = tmp_path / "typed.parquet"
    pd.DataFrame({"image": [png(i) for i in range(3)], "kind": pd.Categorical(["a", "b", "a"])}).to_parquet(path)
    stream = datasets.load_dataset("parquet", data_files=[str(path)], split="train", streaming=True)
    assert [row["kind"] for row in stream] == ["a", "b", "a"]  # datasets streams the values, as a string column
    fastdata.convert(stream, tmp_path / "typed.npy", workers=0)
    ds = fastdata.open_dataset(tmp_path / "typed.npy")
    assert [ds[i]["kind"] for i in range(3)] == ["a", "b", "a"]


def test_a_binary_image_column_whose_first_cell_is_null_is_still_the_image_column(tmp_path: Path) -> None:
    path = tmp_path / "n.parquet"
    pq.write_table(pa.table({"image": [None, png(1), png(2)], "label": [0, 1, 2]}), path)
    with pytest.raises(BadSampleError) as raised:
        fastdata.convert(path, tmp_path / "o.npy", workers=0)
    assert str(raised.value) == (f"{path} row 0: cannot read image (column 'image': no image (null)). Re-run with "
                                 "--skip-bad (skip_bad=True) to leave it out.")
    manifest = fastdata.convert(path, tmp_path / "o.npy", workers=0, skip_bad=True)
    assert manifest["count"] == 2 and np.array_equal(_pixels_of(tmp_path / "o.npy", 1), pixels(2))


def test_a_column_name_that_cannot_name_a_field_is_refused_naming_columns(tmp_path: Path) -> None:
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"image": [png(i) for i in range(3)], "my label": [0, 1, 2], "note": ["a", "b", "c"]}),
                   path)
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(path, tmp_path / "o.npy", workers=0)
    assert str(raised.value) == (f"{path}: column 'my label' cannot name a field (use letters, digits, '_', '-' and '.' "
                                 "(up to 64, not starting with '.' or '-')). Leave it out with --columns NAMES (columns='NAMES'), or rename "
                                 "the column.")
    assert fastdata.convert(path, tmp_path / "o.npy", columns="image,note", workers=0)["count"] == 3
    pair = fastdata.convert(path, tmp_path / "pair.npy", columns="image,my label", label_column="my label", workers=0)
    assert pair["count"] == 3  # (image, label) pairs: the column's name is no field's


def test_a_shuffled_view_of_a_saved_dataset_converts_without_writing_into_its_folder(tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    hf_dataset(range(6)).save_to_disk(str(saved))
    view = datasets.load_from_disk(str(saved)).select([4, 0, 5, 2])
    before = sorted(p.name for p in saved.iterdir())
    manifest = fastdata.convert(view, tmp_path / "view.npy", columns="image,label", workers=0)
    assert sorted(p.name for p in saved.iterdir()) == before
    assert manifest["count"] == 4
    assert [np.array_equal(_pixels_of(tmp_path / "view.npy", n), pixels(i)) for n, i in enumerate([4, 0, 5, 2])] == [
        True] * 4


# --- nulls: the column's Arrow type gives the kind; a null is its empty value, or a bad row ---------


EMPTY_VALUES = [("text", pa.string(), "x", ""), ("tags", pa.list_(pa.string()), ["a"], []),
                ("blob", pa.binary(), b"\x00z", b""), ("meta", pa.struct([("a", pa.int32())]), {"a": 1}, None),
                ("scores", pa.list_(pa.float32()), [1.5], np.empty(0, np.float32)),
                ("boxes", pa.list_(pa.list_(pa.float32(), 4)), [[1, 2, 3, 4]], np.empty((0, 4), np.float32))]


@pytest.mark.parametrize("name,arrow_type,value,empty", EMPTY_VALUES, ids=[case[0] for case in EMPTY_VALUES])
@pytest.mark.parametrize("at", [0, 2])
def test_a_null_is_its_columns_empty_value_wherever_it_is(tmp_path: Path, name: str, arrow_type, value, empty,
                                                          at: int) -> None:
    path = tmp_path / "n.parquet"
    cells = [None if i == at else value for i in range(3)]
    pq.write_table(pa.table({"image": [png(i) for i in range(3)], name: pa.array(cells, arrow_type)}), path)
    fastdata.convert(path, tmp_path / "n.npy", workers=0)
    ds = fastdata.open_dataset(tmp_path / "n.npy")
    for index in range(3):
        got, expected = ds[index][name], empty if index == at else value
        if isinstance(empty, np.ndarray):
            got, expected = np.asarray(got), np.asarray(expected, empty.dtype)
            assert (got.dtype, got.shape) == (expected.dtype, expected.shape)
        assert np.array_equal(got, expected) if isinstance(empty, np.ndarray) else got == expected
    assert fastdata.verify(tmp_path / "n.npy").problems == ()


def test_a_later_null_in_a_list_of_lists_takes_the_first_rows_trailing_shape(tmp_path: Path) -> None:
    path = tmp_path / "g.parquet"
    grid = pa.array([[[1, 2]], None, [[3, 4], [5, 6]]], pa.list_(pa.list_(pa.int32())))
    pq.write_table(pa.table({"image": [png(i) for i in range(3)], "grid": grid}), path)
    fastdata.convert(path, tmp_path / "g.npy", workers=0)
    ds = fastdata.open_dataset(tmp_path / "g.npy")
    assert [np.asarray(ds[i]["grid"]).shape for i in range(3)] == [(1, 2), (0, 2), (2, 2)]
    assert np.asarray(ds[1]["grid"]).dtype == np.int32


def test_an_empty_list_of_fixed_size_lists_keeps_their_size(tmp_path: Path) -> None:
    path = tmp_path / "e.parquet"
    boxes = pa.array([[], [[1, 2, 3, 4]], [], [[5, 6, 7, 8], [9, 10, 11, 12]]], pa.list_(pa.list_(pa.float32(), 4)))
    pq.write_table(pa.table({"image": [png(i) for i in range(4)], "boxes": boxes}), path)
    fastdata.convert(path, tmp_path / "e.npy", workers=0)
    ds = fastdata.open_dataset(tmp_path / "e.npy")
    assert [np.asarray(ds[i]["boxes"]).shape for i in range(4)] == [(0, 4), (1, 4), (0, 4), (2, 4)]
    assert np.array_equal(ds[3]["boxes"], np.arange(5, 13, dtype=np.float32).reshape(2, 4))


NO_EMPTY = [("n", pa.int64(), 3, "an integer column"), ("w", pa.float32(), 1.5, "a float column"),
            ("b", pa.bool_(), True, "a bool column"), ("box", pa.list_(pa.int16(), 2), [1, 2], "a fixed-size list column")]


@pytest.mark.parametrize("name,arrow_type,value,what", NO_EMPTY, ids=[case[0] for case in NO_EMPTY])
@pytest.mark.parametrize("at", [0, 2])
def test_a_null_where_the_kind_has_no_empty_value_is_a_bad_row(tmp_path: Path, name: str, arrow_type, value, what: str,
                                                               at: int) -> None:
    path = tmp_path / "n.parquet"
    cells = [None if i == at else value for i in range(3)]
    pq.write_table(pa.table({"image": [png(i) for i in range(3)], name: pa.array(cells, arrow_type)}), path)
    with pytest.raises(BadSampleError) as raised:
        fastdata.convert(path, tmp_path / "n.npy", workers=0)
    assert str(raised.value) == (f"{path} row {at}: cannot convert sample (column {name!r}: null, and {what} has no empty "
                                 "value (a row needs a value in it)). Re-run with --skip-bad (skip_bad=True) to leave it out.")
    assert not (tmp_path / "n.npy").exists()
    manifest = fastdata.convert(path, tmp_path / "n.npy", workers=0, skip_bad=True)
    assert manifest["count"] == 2 and [s["key"] for s in manifest["skipped"]] == [f"{path} row {at}"]


INSIDE = [("tags", pa.list_(pa.string()), ["a", None]), ("scores", pa.list_(pa.float32()), [1.5, None]),
          ("grid", pa.list_(pa.list_(pa.int32())), [[1, 2], [3, None]]), ("box", pa.list_(pa.float32(), 2), [None, 1.0])]


@pytest.mark.parametrize("name,arrow_type,cell", INSIDE, ids=[case[0] for case in INSIDE])
def test_a_null_inside_a_list_is_a_bad_row_never_nan(tmp_path: Path, name: str, arrow_type, cell) -> None:
    path = tmp_path / "n.parquet"
    good = [[x if x is not None else 0 for x in part] if isinstance(part, list) else part or 2.0 for part in cell]
    cells = [good, cell, good] if name != "tags" else [["b"], cell, ["c"]]
    pq.write_table(pa.table({"image": [png(i) for i in range(3)], name: pa.array(cells, arrow_type)}), path)
    with pytest.raises(BadSampleError) as raised:
        fastdata.convert(path, tmp_path / "n.npy", workers=0)
    assert str(raised.value) == (f"{path} row 1: cannot convert sample (column {name!r}: null inside its list, and a list's "
                                 "elements have no empty value (every element needs a value)). Re-run with --skip-bad (skip_bad=True) "
                                 "to leave it out.")
    manifest = fastdata.convert(path, tmp_path / "n.npy", workers=0, skip_bad=True)
    assert manifest["count"] == 2 and [s["key"] for s in manifest["skipped"]] == [f"{path} row 1"]


def test_a_streams_casts_are_honoured_or_refused(hub_like: Path, tmp_path: Path) -> None:
    stream = datasets.load_dataset("parquet", data_files=[str(hub_like)], split="train", streaming=True)
    gray = stream.cast_column("image", datasets.Image(mode="L"))
    fastdata.convert(gray, tmp_path / "gray.npy", columns="image,label", workers=0)
    ds = fastdata.open_dataset(tmp_path / "gray.npy")
    assert [np.array_equal(ds[i][0].numpy(), np.asarray(row["image"])[None]) for i, row in enumerate(gray)] == [True] * 8
    renamed = stream.cast_column("label", datasets.ClassLabel(names=["x", "y", "z"]))
    assert fastdata.convert(renamed, tmp_path / "xyz.npy", columns="image,label", workers=0)["classes"] == ["x", "y", "z"]
    typed = stream.cast_column("weight", datasets.Value("float64"))
    with pytest.raises(InvalidOptionError) as raised:
        fastdata.convert(typed, tmp_path / "o.npy", workers=0)
    assert str(raised.value) == (
        f"This datasets.IterableDataset casts column 'weight' from float (in {hub_like}) to double, which fastdata does "
        "not apply. Convert the files as they are and cast when reading, or convert the Dataset the cast gives (load it "
        "without streaming).")


def test_configurations_on_s3_are_told_apart_as_the_local_ones(configs: Path, s3, tmp_path: Path) -> None:
    from servers import upload

    _check_configurations(upload(s3, configs / "converted", "configs/converted"), tmp_path)
