"""A WebDataset source's own ``__key__`` survives conversion into every format and comes back as
``ds[i]["__key__"]``; a tar output names its members by the keys where they are unique and safe
(so stock ``webdataset`` reads the same ``__key__`` back), and numbers them otherwise, keeping
each key in a ``__key__.txt`` member; keys that repeat are a warning, never a silent collision."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import webdataset as wds
from PIL import Image

import fastdata
from conftest import pattern
from fastdata.errors import InvalidOptionError
from fastdata.fields.codecs import member_key_problem
from fastdata.sources import DatasetSource, RepeatedKeysWarning
from test_parts import same_output
from test_webdataset_source import encoded

SUFFIXES = {"npy": ".npy", "hdf5": ".h5", "tar": ".tar"}
# stock webdataset leaves its shard files open
OPEN_FILES = pytest.mark.filterwarnings("ignore::ResourceWarning")
UNRAISABLE = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def write(folder: Path, keys: list[list[str]]) -> Path:
    """One shard per list of keys (written by stock ``webdataset.TarWriter``): a JPEG, a label and
    a caption per sample, numbered across shards."""
    folder.mkdir(parents=True)
    index = 0
    for number, names in enumerate(keys):
        with wds.TarWriter(str(folder / f"part-{number:02d}.tar")) as sink:
            for key in names:
                sink.write({"__key__": key, "jpg": encoded(pattern(6, 8, seed=index), "JPEG"),
                            "cls": str(index % 3).encode(), "txt": f"caption {index}".encode()})
                index += 1
    return folder


def stock(shards: list[Path]) -> list[dict]:
    """What stock ``webdataset.WebDataset`` yields for ``shards``, decoded."""
    return list(wds.WebDataset([str(s) for s in shards], shardshuffle=False, empty_check=False).decode())


def read(out: Path, **options):
    return fastdata.TarIndexedDataset(out, **options) if out.suffix == ".tar" else fastdata.open_dataset(out, **options)


def member_names(out: Path) -> list[str]:
    names = []
    for shard in sorted(out.glob("shard-*.tar")):
        with tarfile.open(shard) as archive:
            names += [member.name for member in archive]
    return names


def schema_meta(manifest: dict) -> dict:
    return {f["name"]: f.get("meta", {}) for f in manifest["fields"]["fields"]}


KEYS = [["img-000", "dir/a/img-001", "UPPER_x-9"], ["d.v2/img-003", "z"]]  # a dot in a folder is part of the key


@OPEN_FILES
@UNRAISABLE
@pytest.mark.parametrize("store", ["raw", "encoded"])
@pytest.mark.parametrize("fmt", sorted(SUFFIXES))
def test_keys_come_back_from_every_format_as_stock_webdataset_gives_them(tmp_path: Path, fmt: str, store: str) -> None:
    shards = write(tmp_path / "shards", KEYS)
    keys = [s["__key__"] for s in stock(sorted(shards.iterdir()))]
    assert keys == [key for names in KEYS for key in names]
    out = tmp_path / f"out{SUFFIXES[fmt]}"
    manifest = fastdata.convert(shards, out, workers=0, store=store, **({"shard_samples": 3} if fmt == "tar" else {}))
    assert schema_meta(manifest)["__key__"] == {"member_key": True} and manifest["source"]["key_field"] == "__key__"
    ds = read(out)
    assert [ds[i]["__key__"] for i in range(5)] == keys and list(ds[0])[:2] == ["__key__", "jpg"]
    assert ds[[4, 0, 4]]["__key__"] == [keys[4], keys[0], keys[4]] and ds[2]["txt"] == "caption 2"
    assert read(out, fields=["__key__"])[1] == {"__key__": "dir/a/img-001"}
    assert fastdata.verify(out, deep=True).ok
    if fmt != "tar":
        return
    extension = "npy" if store == "raw" else "jpg"
    assert member_names(out) == [f"{key}.{suffix}" for key in keys for suffix in (extension, "cls", "txt")]
    back = stock(sorted(out.glob("shard-*.tar")))  # stock webdataset reading fastdata's output: the same keys
    assert [s["__key__"] for s in back] == keys and [s["txt"] for s in back] == [f"caption {i}" for i in range(5)]
    assert all("__key__.txt" not in s for s in back)
    index = json.loads((out / "index.json").read_text())
    assert [shard["key"] for shard in index["shards"]] == [keys[:3], keys[3:]]
    streamed = fastdata.TarDataset(out, shuffle=False)
    assert [sample["__key__"] for sample in streamed] == keys


def test_repeated_keys_are_a_warning_and_every_sample_keeps_its_own(tmp_path: Path) -> None:
    shards = write(tmp_path / "shards", [["a", "b"], ["a", "c"]])  # webdataset allows it across shards
    for fmt, suffix in SUFFIXES.items():
        out = tmp_path / f"out{suffix}"
        with pytest.warns(RepeatedKeysWarning) as caught:
            manifest = fastdata.convert(shards, out, workers=0, store="encoded")
        assert [str(w.message) for w in caught] == [
            f"{str(shards)!r}: samples part-00.tar:a and part-01.tar:a have the same key 'a'. Each sample keeps its "
            "own in its '__key__' field, where it does not tell them apart; a tar output names its members by number."]
        assert "member_key" not in schema_meta(manifest)["__key__"]
        assert [read(out)[i]["__key__"] for i in range(4)] == ["a", "b", "a", "c"], fmt
        assert fastdata.verify(out, deep=True).ok
    out = tmp_path / "out.tar"
    assert member_names(out)[:4] == ["000000000.jpg", "000000000.cls", "000000000.__key__.txt", "000000000.txt"]
    with tarfile.open(out / "shard-000000.tar") as archive:
        samples = {}
        for member in archive:
            key, _, suffix = member.name.partition(".")
            samples.setdefault(key, {})[suffix] = archive.extractfile(member).read()
    assert [sample["__key__.txt"] for sample in samples.values()] == [b"a", b"b", b"a", b"c"]
    assert len(samples) == 4  # no two samples' members collide


def test_keys_that_cannot_name_members_are_kept_in_a_member(tmp_path: Path) -> None:
    keys = ["clé-0", "with space", "x" * 95, "back\\slash"]
    shards = write(tmp_path / "shards", [keys])
    manifest = fastdata.convert(shards, tmp_path / "out.tar", workers=0, store="encoded")  # no warning: all differ
    assert "member_key" not in schema_meta(manifest)["__key__"]
    ds = fastdata.TarIndexedDataset(tmp_path / "out.tar")
    assert [ds[i]["__key__"] for i in range(4)] == keys
    assert member_names(tmp_path / "out.tar")[2::4] == [f"{i:09d}.__key__.txt" for i in range(4)]


@pytest.mark.parametrize("key, longest, problem", [
    ("img-001", 4, None), ("dir/sub/img_1", 10, None), ("a.b/c", 4, None), ("x" * 95, 4, None),
    ("", 0, "it is empty"),
    ("clé", 0, "it holds characters other than printable ASCII without spaces and backslashes"),
    ("a b", 0, "it holds characters other than printable ASCII without spaces and backslashes"),
    ("a\\b", 0, "it holds characters other than printable ASCII without spaces and backslashes"),
    ("../x", 0, "it is not a relative path of plain names"), ("/x", 0, "it is not a relative path of plain names"),
    ("a//b", 0, "it is not a relative path of plain names"), ("a/", 0, "it is not a relative path of plain names"),
    ("a/./b", 0, "it is not a relative path of plain names"),
    ("a.b", 0, "its file name holds a dot, where webdataset would end the key"),
    ("x" * 96, 4, "with a 4-character suffix it is longer than a tar header's 100 characters"),
])
def test_what_can_name_tar_members(key: str, longest: int, problem: str | None) -> None:
    assert member_key_problem(key, longest) == problem


def test_parts_and_a_second_conversion_keep_the_member_keys(tmp_path: Path) -> None:
    shards = write(tmp_path / "shards", KEYS)
    local, merged = tmp_path / "local", tmp_path / "merged"
    options = dict(format="tar", store="encoded", shard_samples=2)
    fastdata.convert(shards, local, workers=0, **options)
    for part in ("1/2", "2/2"):
        fastdata.convert(shards, merged, part=part, unit_samples=2, workers=0, **options)
    fastdata.merge(merged)
    same_output(local, merged)  # the same bytes, members named by the keys
    again = tmp_path / "again.tar"
    manifest = fastdata.convert(local, again, workers=0, store="encoded")  # a converted dataset as the source
    assert schema_meta(manifest)["__key__"] == {"member_key": True}
    assert member_names(again)[::3] == [f"{key}.jpg" for names in KEYS for key in names]  # (the JPEGs kept as stored)
    assert fastdata.verify(again, deep=True).ok


def test_verify_reports_a_member_key_that_is_no_plain_name(tmp_path: Path) -> None:
    out = tmp_path / "out.tar"
    fastdata.convert(write(tmp_path / "shards", KEYS), out, workers=0, store="encoded")
    index = json.loads((out / "index.json").read_text())
    index["shards"][0]["key"][1] = "../evil"
    (out / "index.json").write_text(json.dumps(index))
    problems = fastdata.verify(out).problems
    assert f"{str(out / 'index.json')!r}: shard 0 sample 1 has member key '../evil': it is not a relative path of " \
           "plain names." in problems
    assert f"{str(out / 'shard-000000.tar')!r}: member 'dir/a/img-001.jpg' (" in " ".join(problems)  # not in the index
    assert fastdata.TarIndexedDataset(out)[1]["__key__"] == "../evil"  # read as text, never as a path


class Keyed(DatasetSource):
    """A source that vouches for keys it should not (``member_key`` on a key with a space)."""

    field_meta = {"__key__": {"member_key": True}}


def test_the_tar_writer_refuses_a_key_it_cannot_name_members_by(tmp_path: Path) -> None:
    samples = [{"__key__": key, "image": Image.fromarray(pattern(4, 4, seed=i))} for i, key in enumerate(["ok", "a b"])]
    with pytest.raises(InvalidOptionError) as info:
        fastdata.convert(Keyed(samples), tmp_path / "out.tar", workers=0)
    assert str(info.value) == ("1: field '__key__' is 'a b', which cannot name tar members (it holds characters other "
                               "than printable ASCII without spaces and backslashes), though the schema's meta says "
                               "'member_key'. Convert from the original source.")
    assert not (tmp_path / "out.tar").exists()
    fastdata.convert(Keyed(samples), tmp_path / "out.npy", workers=0)  # other formats store the text as it is
    assert fastdata.open_dataset(tmp_path / "out.npy")[1]["__key__"] == "a b"
