"""``fastdata verify`` and the integrity of every format in the registry: flipped bytes,
truncation, unlisted files, labels out of range, undecodable samples, and no unpickling."""

from __future__ import annotations

import importlib
import json
import pickle
import re
import shutil
import struct
from pathlib import Path

import h5py
import numpy as np
import pytest

import fastdata
from conftest import WRITABLE, WRITABLE_IDS, convert_to, run_fastdata
from fastdata.testing import CONTRACTS
from fastdata.errors import CorruptDataError, FastdataError, ManifestError, SourceNotFoundError
from fastdata.formats import get_format
from fastdata.formats.hdf5 import USERBLOCK_BYTES
from fastdata.formats.tar import TRAILER, member_header
from fastdata.formats.tar import padded
from fastdata.manifest import MANIFEST_NAME, file_checksum

IDS = WRITABLE_IDS
ENCODED = [(name, store) for name, store in WRITABLE if store == "encoded"]


convert = convert_to


def flip(file: Path, offset: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x01
    file.write_bytes(bytes(data))


def manifest_of(out: Path) -> dict:
    return fastdata.formats.find_manifest(out)


def assert_caught(out: Path, name: str) -> None:
    """verify reports a problem naming ``name`` (or refuses the path with an error naming it)."""
    try:
        report = fastdata.verify(out)
    except FastdataError as exc:
        assert str(out) in str(exc)
        return
    assert not report.ok, f"{name}: flip not caught"
    assert any(name in problem for problem in report.problems), report.problems


# --- damage that the recorded checksums agree with: each format's hooks (fastdata.testing.FormatContract)

for _name in sorted({name for name, _ in WRITABLE}):  # each registry format's test file defines its hooks
    importlib.import_module(f"test_{_name}")


def hooks(out: Path) -> type:
    """The contract class (its damage hooks) of the format ``out`` is written in."""
    return CONTRACTS[manifest_of(out)["format"]]


def reseal(out: Path) -> None:
    hooks(out).reseal(out)


# --- sound datasets ---------------------------------------------------------------------------


def test_sound_dataset_verifies_shallow_and_deep(converted: Path) -> None:
    manifest = manifest_of(converted)
    for deep in (False, True):
        report = fastdata.verify(converted, deep=deep)
        assert report.problems == () and report.ok
        assert (report.format, report.count, report.deep) == (manifest["format"], 12, deep)
        assert len(report.checked) == len(manifest["files"])
    assert report.summary() == f"{converted}: OK ({manifest['format']}, 12 samples; {len(manifest['files'])} checksums match, every sample decodes)"
    assert "manifest_blake2b" in manifest


# --- one flipped byte, anywhere ------------------------------------------------------------


DIRECTORIES = [(name, store) for name, store in WRITABLE if get_format(name).read_manifest is None]  # not one file


@pytest.mark.parametrize("name,store", DIRECTORIES, ids=[f"{name}-{store}" for name, store in DIRECTORIES])
def test_a_flipped_byte_in_any_file_is_caught_and_named(uniform_folder: Path, tmp_path: Path, name: str, store: str) -> None:
    pristine = convert(uniform_folder, tmp_path, name, store)
    files = sorted(p.name for p in pristine.iterdir())
    assert MANIFEST_NAME in files and len(files) >= 3
    for file in files:
        size = (pristine / file).stat().st_size
        for offset in sorted({0, 1, size // 3, size // 2, size - 2, size - 1}):
            out = tmp_path / "damaged"
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(pristine, out)
            flip(out / file, offset)
            assert_caught(out, str(out / file))


def _heap_object_headers(data: bytes) -> set[int]:
    """Byte offsets of the global heap's object headers (a flip there can make libhdf5 spin)."""
    skip: set[int] = set()
    start = data.find(b"GCOL")
    while start >= 0:
        end, position = start + struct.unpack("<Q", data[start + 8 : start + 16])[0], start + 16
        while position + 16 <= end:
            index, _, _, size = struct.unpack("<HHIQ", data[position : position + 16])
            skip |= set(range(position, position + 16))
            if index == 0:
                break
            position += 16 + padded8(size)
        start = data.find(b"GCOL", end)
    return skip


def padded8(size: int) -> int:
    return -(-size // 8) * 8


@pytest.mark.parametrize("store", ["raw", "encoded"])
def test_hdf5_a_flipped_byte_in_data_or_metadata_is_caught(uniform_folder: Path, tmp_path: Path, store: str) -> None:
    out = convert(uniform_folder, tmp_path, "hdf5", store)
    pristine = out.read_bytes()
    regions = {}
    with h5py.File(out) as file:
        for name in manifest_of(out)["files"]:
            regions[name] = (file[name].id.get_offset(), file[name].id.get_storage_size())
    data_bytes = {o for start, size in regions.values() for o in range(start, start + size)}
    for name, (start, size) in regions.items():  # inside each dataset's data: named by the dataset
        for offset in (start, start + size // 2, start + size - 1):
            flip(out, offset)
            report = fastdata.verify(out)
            assert f"{str(out)!r}: dataset {name!r}: blake2b " in "\n".join(report.problems), (name, report.problems)
            out.write_bytes(pristine)
    skip = data_bytes | _heap_object_headers(pristine)
    metadata = [o for o in range(len(pristine)) if o not in skip]
    assert len(metadata) > 4000
    for offset in metadata[::23] + [0, 40, USERBLOCK_BYTES - 1, USERBLOCK_BYTES, USERBLOCK_BYTES + 8]:
        flip(out, offset)
        assert_caught(out, str(out))
        out.write_bytes(pristine)
    assert fastdata.verify(out).ok


def test_manifest_edit_that_stays_valid_json_is_caught(converted: Path) -> None:
    manifest = manifest_of(converted)
    hooks(converted)().rewrite_manifest(converted, {"created": "1" + manifest["created"][1:]})  # the seal kept
    origin = repr(str(converted / MANIFEST_NAME if converted.is_dir() else converted))
    report = fastdata.verify(converted)
    assert report.problems[0] == (
        f"{origin}: the manifest's content does not match its 'manifest_blake2b' {manifest['manifest_blake2b']!r} "
        "(it was edited or damaged)."
    )
    if converted.is_dir():  # the data files are still checked, and are sound
        assert len(report.problems) == 1 and len(report.checked) == len(manifest["files"])
    else:  # the file changed too: its user-block checksum says so
        assert len(report.problems) == 2 and "does not match the one in its user block" in report.problems[1]


# --- truncation, extra files ------------------------------------------------------------------


def test_truncated_file_is_named(converted: Path) -> None:
    manifest = manifest_of(converted)
    if converted.is_file():
        converted.write_bytes(converted.read_bytes()[:-700])
        report = fastdata.verify(converted)
        assert any(p.startswith(f"{str(converted)!r}: ") for p in report.problems), report.problems
        assert not report.ok
        return
    for name, entry in manifest["files"].items():
        out = converted.with_name("cut")
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(converted, out)
        (out / name).write_bytes((out / name).read_bytes()[:-7])
        report = fastdata.verify(out)
        expected = f"{str(out / name)!r}: {entry['bytes'] - 7} bytes but the manifest says {entry['bytes']} (truncated)."
        assert report.problems[0] == expected, report.problems


def test_files_the_manifest_does_not_list_are_reported(converted: Path) -> None:
    if converted.is_file():
        with h5py.File(converted, "a") as file:
            file["extra"] = np.zeros(3)
        problems = fastdata.verify(converted).problems
        assert f"{str(converted)!r}: object 'extra' is not listed in the manifest." in problems
        return
    (converted / "stray.partial").write_bytes(b"leftover")
    (converted / "sub").mkdir()
    (converted / "sub" / "x.txt").write_text("x")
    problems = fastdata.verify(converted).problems
    assert problems == tuple(
        f"{str(converted / name)!r}: not listed in the manifest (left by an interrupted conversion, or added later). "
        "Remove it if it is not yours."
        for name in ("stray.partial", "sub/x.txt")
    )


# --- what only the range check, or only decoding, can catch --------------------------------------


def test_label_out_of_range_with_matching_checksums(converted: Path) -> None:
    hooks(converted).set_label(converted, 3, 7)
    report = fastdata.verify(converted)
    assert report.problems == (
        f"{str(converted)!r}: sample 3 has label 7; the manifest lists 3 classes, so labels are 0..2 (or -1: no label).",
    )
    hooks(converted).set_label(converted, 3, -1)  # no label (Hugging Face's unlabelled test splits)
    assert fastdata.verify(converted).problems == ()
    hooks(converted).set_label(converted, 3, -2)
    assert fastdata.verify(converted).problems[0].startswith(f"{str(converted)!r}: sample 3 has label -2;")


@pytest.mark.parametrize("name,store", ENCODED, ids=[f"{f}-{s}" for f, s in ENCODED])
def test_deep_decodes_a_sample_whose_checksum_was_made_to_match(uniform_folder: Path, tmp_path: Path, name: str, store: str) -> None:
    out = convert(uniform_folder, tmp_path, name, store)
    hooks(out).garble_sample(out, 4)
    assert fastdata.verify(out).ok  # the checksums agree with the damage
    problems = fastdata.verify(out, deep=True).problems
    assert len(problems) == 1, problems
    assert re.search(r"sample 4:? cannot (be )?decode", problems[0]), problems
    where = hooks(out).sample_file(out, 4)
    assert problems[0].startswith(repr(str(where))), problems


# --- the command line ------------------------------------------------------------------------


def test_cli_exit_codes_and_messages(uniform_folder: Path, tmp_path: Path) -> None:
    out = convert(uniform_folder, tmp_path, "npy", "raw")
    sound = run_fastdata("verify", out, "--deep", "--quiet")
    assert (sound.returncode, sound.stdout, sound.stderr) == (
        0, f"{out}: OK (npy, 12 samples; 2 checksums match, every sample decodes)\n", ""
    )
    flip(out / "images.npy", 500)
    (out / "junk").write_bytes(b"")
    bad = run_fastdata("verify", out)
    assert bad.returncode == 1 and bad.stderr == ""
    assert bad.stdout.splitlines() == [
        f"{out}: 2 problems (npy, 12 samples; 2 checksums checked)",
        f"  - {str(out / 'images.npy')!r}: blake2b " + bad.stdout.split("blake2b ")[1].split("\n")[0],
        f"  - {str(out / 'junk')!r}: not listed in the manifest (left by an interrupted conversion, or added later). "
        "Remove it if it is not yours.",
        "The dataset is damaged: convert the source again (--overwrite), or restore it from a copy.",
    ]
    assert "does not match the manifest's" in bad.stdout and "(the file is damaged)." in bad.stdout
    for args, message in [
        ((tmp_path / "nope",), f"fastdata: error: {str(tmp_path / 'nope')!r} does not exist.\n"),
        ((uniform_folder,), f"fastdata: error: {str(uniform_folder)!r} is not a dataset written by 'fastdata convert' "
                            "(no manifest found). Convert it first ('fastdata convert'); an image folder is read with "
                            "fastdata.FolderDataset.\n"),
    ]:
        result = run_fastdata("verify", *args)
        assert (result.returncode, result.stdout, result.stderr) == (1, "", message)


def cli_here(capsys, *args: object) -> tuple[int, str, str]:
    from fastdata.cli import main

    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_json_for_a_sound_and_a_damaged_dataset(uniform_folder: Path, tmp_path: Path, capsys) -> None:
    out = convert(uniform_folder, tmp_path, "npy", "raw")
    code, stdout, err = cli_here(capsys, "verify", out, "--json", "--deep", "--quiet")
    assert (code, err) == (0, "")
    assert json.loads(stdout) == {"path": str(out), "format": "npy", "ok": True, "deep": True, "count": 12,
                                  "checksums": 2, "checked": ["images.npy", "labels.npy"], "problems": []}
    recorded = json.loads((out / MANIFEST_NAME).read_text())["files"]["images.npy"]["blake2b"]
    flip(out / "images.npy", 500)
    (out / "junk").write_bytes(b"")
    code, stdout, err = cli_here(capsys, "verify", out, "--json")
    assert (code, err) == (1, "")
    assert json.loads(stdout) == {"path": str(out), "format": "npy", "ok": False, "deep": False, "count": 12,
                                  "checksums": 2, "checked": ["images.npy", "labels.npy"], "problems": [
        f"{str(out / 'images.npy')!r}: blake2b {file_checksum(out / 'images.npy')[:16]}... does not match the "
        f"manifest's {recorded[:16]}... (the file is damaged).",
        f"{str(out / 'junk')!r}: not listed in the manifest (left by an interrupted conversion, or added later). "
        "Remove it if it is not yours.",
    ]}
    assert json.loads(stdout) == fastdata.verify(out).to_dict()


@pytest.mark.parametrize("name,store", WRITABLE, ids=IDS)
def test_deep_verify_shows_a_progress_bar_unless_quiet(uniform_folder: Path, tmp_path: Path, capsys, name: str,
                                                       store: str) -> None:
    out = convert(uniform_folder, tmp_path, name, store)
    summary = f"{out}: OK ({name}, 12 samples; "
    code, stdout, err = cli_here(capsys, "verify", out, "--deep")
    assert code == 0 and stdout.startswith(summary) and stdout.endswith(", every sample decodes)\n")
    assert "verify --deep: 100%" in err and "12/12" in err and err.count("\n") == 1
    assert cli_here(capsys, "verify", out, "--deep", "--quiet")[1:] == (stdout, "")
    assert cli_here(capsys, "verify", out)[2] == ""  # nothing to decode: no bar
    seen: list[tuple[int, int]] = []
    assert fastdata.verify(out, deep=True, progress=lambda count, total: seen.append((count, total))).ok
    assert sum(count for count, _ in seen) == 12 and {total for _, total in seen} == {12}


def test_library_errors_for_paths_that_hold_no_dataset(uniform_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match="does not exist"):
        fastdata.verify(tmp_path / "nope")
    with pytest.raises(ManifestError, match="no manifest found"):
        fastdata.verify(uniform_folder)
    out = convert(uniform_folder, tmp_path, "npy", "raw")
    (out / MANIFEST_NAME).write_bytes(b"\xff\xfe{}")
    report = fastdata.verify(out)
    assert report.problems == (f"{str(out / MANIFEST_NAME)!r}: manifest is not valid UTF-8 (byte 0). "
                               "The dataset is damaged or was not written by fastdata; convert it again.",)


# --- readers given damaged files ---------------------------------------------------------------


@pytest.mark.parametrize("name,store", WRITABLE, ids=IDS)
def test_readers_given_a_truncated_data_file_name_it(uniform_folder: Path, tmp_path: Path, name: str, store: str) -> None:
    out = convert(uniform_folder, tmp_path, name, store)
    data_files = [out] if out.is_file() else [out / n for n in manifest_of(out)["files"] if n != "index.json"]
    pristine = {file: file.read_bytes() for file in data_files}
    for file in data_files:
        file.write_bytes(pristine[file][: len(pristine[file]) * 2 // 3])
        with pytest.raises(CorruptDataError) as caught:
            ds = fastdata.open_dataset(out, image_format="numpy")
            list(ds) if not hasattr(ds, "__getitems__") else ds.__getitems__(list(range(len(ds))))
        assert str(file) in str(caught.value)
        file.write_bytes(pristine[file])


@pytest.mark.parametrize("store", ["raw", "encoded"])
def test_hdf5_reader_given_damaged_metadata_raises_corrupt_data_error_or_reads(uniform_folder: Path, tmp_path: Path, store: str) -> None:
    """h5py raises RuntimeError, KeyError, TypeError... on damaged metadata: the reader names the file."""
    out = convert(uniform_folder, tmp_path, "hdf5", store)
    pristine = out.read_bytes()
    with h5py.File(out) as file:
        start = min(file[n].id.get_offset() for n in file)
    skip = _heap_object_headers(pristine)
    raised = 0
    for offset in range(USERBLOCK_BYTES, start, 5):
        if offset in skip:
            continue
        flip(out, offset)
        try:
            ds = fastdata.open_dataset(out, image_format="numpy")
            ds.__getitems__(list(range(len(ds))))
        except FastdataError as exc:
            assert str(out) in str(exc), exc
            raised += 1
        out.write_bytes(pristine)
    assert raised > 50


# --- security: no pickle, tar member names are never paths --------------------------------------


def test_no_code_path_unpickles() -> None:
    """Nothing read from a dataset or any file is ever unpickled. The one exception is the
    process backend of fastdata.loader, which exchanges messages with its own worker processes
    over pipes (as multiprocessing and the DataLoader do); it opens no file. A round trip of an
    object in memory (``pickle.loads(pickle.dumps(x))``, the contract suite's picklability check)
    reads nothing from outside."""
    root = Path(fastdata.__file__).parent
    ipc = {root / "loading" / name for name in ("processes.py", "worker.py", "shm.py", "failures.py")}
    for source in sorted(root.rglob("*.py")):
        text = source.read_text().replace("pickle.loads(pickle.dumps(", "")
        if source in ipc:
            assert "open(" not in text.replace("shm_open(", ""), source
            continue
        assert not re.search(r"pickle\.loads?\(|torch\.load\(|allow_pickle=True|Unpickler", text), source
        for call in re.findall(r"np\.load\([^)]*\)", text):
            assert "allow_pickle=False" in call, (source, call)


class WritesMarker:
    """Unpickling this creates ``path`` (what a loaded ``.pyd`` member would do)."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def add_member(out: Path, shard_name: str, member: str, data: bytes) -> None:
    """Append a member the index does not list to a shard, and reseal the checksums."""
    shard = out / shard_name
    body = shard.read_bytes()[: -len(TRAILER)]
    shard.write_bytes(body + member_header(member, len(data)) + data + bytes(padded(len(data)) - len(data)) + TRAILER)
    reseal(out)


@pytest.mark.parametrize("store", ["raw", "encoded"])
def test_tar_readers_never_unpickle_or_use_member_names_as_paths(uniform_folder: Path, tmp_path: Path, store: str) -> None:
    out = convert(uniform_folder, tmp_path, "tar", store)
    marker = tmp_path / "unpickled"
    evil_target = (out / "../../evil.png").resolve()
    payload, fake_png = pickle.dumps(WritesMarker(marker)), b"\x89PNG\r\n\x1a\nnot an image"
    shards = [f"shard-{n:06d}.tar" for n in range(3)]
    ends = [(out / shard).stat().st_size - len(TRAILER) for shard in shards]  # where each new member goes
    add_member(out, shards[0], "000000003.pyd", payload)
    add_member(out, shards[1], "../../evil.png", fake_png)
    add_member(out, shards[2], "000000011.pickle", payload)
    before = sorted(tmp_path.parent.rglob("*"))
    labels = sorted(int(label) for _, label in fastdata.TarDataset(out))
    indexed = fastdata.TarIndexedDataset(out)
    assert labels == sorted(int(indexed[i][1]) for i in range(12)) == [0] * 4 + [1] * 4 + [2] * 4
    report = fastdata.verify(out, deep=True)
    assert report.problems == (
        f"{str(out / shards[0])!r}: member '000000003.pyd' ({len(payload)} bytes) at byte {ends[0]} is not in the index.",
        f"{str(out / shards[1])!r}: member '../../evil.png' ({len(fake_png)} bytes) at byte {ends[1]} is not in the index.",
        f"{str(out / shards[2])!r}: member '000000011.pickle' ({len(payload)} bytes) at byte {ends[2]} is not in the index.",
    )
    assert not marker.exists() and not evil_target.exists()
    assert sorted(tmp_path.parent.rglob("*")) == before


@pytest.mark.parametrize("store", ["raw", "encoded"])
def test_tar_damaged_member_header_names_the_member(uniform_folder: Path, tmp_path: Path, store: str) -> None:
    out = convert(uniform_folder, tmp_path, "tar", store)
    flip(out / "shard-000001.tar", 10)  # the name field of sample 5's image member header
    problems = fastdata.verify(out).problems
    extension = "npy" if store == "raw" else "png"
    assert problems[1:] == (
        f"{str(out / 'shard-000001.tar')!r}: damaged tar header at byte 0 (member '000000005.{extension}'); "
        "the rest of the shard was not walked.",
    )
    assert problems[0].startswith(f"{str(out / 'shard-000001.tar')!r}: blake2b ")


# --- class ids in fields ----------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".npy", ".h5", ".tar"])
def test_class_ids_of_a_field_out_of_range_are_named(tmp_path: Path, suffix: str) -> None:
    """VOCDetection's ``labels`` field holds indices of the manifest's 21 classes (recorded in its
    schema, meta ``class_ids``): an id changed to 25 or -3, with every checksum made to match,
    is reported naming the sample and the field. A manifest from before the record (no
    ``class_ids``) is not checked, as before."""
    import tv_layouts
    from test_fields_damage import _read_manifest, _sample_span, _write_manifest

    tv_layouts.make_voc(tmp_path / "voc")
    out = tmp_path / f"det{suffix}"
    fastdata.convert("torchvision:VOCDetection", out, root=tmp_path / "voc", split="trainval", store="encoded",
                     workers=0)
    fields = {f["name"]: f for f in _read_manifest(out)["fields"]["fields"]}
    assert fields["labels"]["meta"] == {"class_ids": True} and "class_ids" not in fields["boxes"].get("meta", {})
    assert fastdata.verify(out).ok
    fmt = {".npy": "npy", ".h5": "hdf5", ".tar": "tar"}[suffix]
    for sample, position, value in ((2, 1, 25), (3, 0, -3)):  # 2008_000008: horse, person, dog; 2009_000012: cat
        file, offset, size = _sample_span(out, fmt, "labels", sample)
        objects = len(tv_layouts.VOC_OBJECTS[tv_layouts.VOC_NAMES[sample]])
        at = offset + size - 8 * (objects - position) if fmt == "tar" else offset + 8 * position  # tar: an .npy member
        with open(file, "r+b") as handle:
            handle.seek(at)
            handle.write(struct.pack("<q", value))
    hooks(out).reseal(out)
    report = fastdata.verify(out)
    assert report.problems == (
        f"{str(out)!r}: sample 2 has 'labels' 25, sample 3 has 'labels' -3; field 'labels' holds class ids and the "
        "manifest lists 21 classes, so they are 0..20 (or -1: no class).",)
    assert fastdata.verify(out, deep=True).problems == report.problems  # the samples still decode
    manifest = _read_manifest(out)
    for f in manifest["fields"]["fields"]:
        f.get("meta", {}).pop("class_ids", None)
    _write_manifest(out, manifest)
    if fmt == "hdf5":
        hooks(out).reseal(out)
    assert fastdata.verify(out).ok  # written before class ids were recorded: nothing says what they index


class _ClassIds(list):
    """Items with a class id scalar and a fixed (3,) array of class ids, two of them out of range."""

    classes = ["cat", "dog", "fox"]


@pytest.mark.parametrize("suffix", [".npy", ".h5", ".tar"])
def test_fixed_class_id_fields_are_checked_too(tmp_path: Path, suffix: str) -> None:
    from PIL import Image

    from fastdata.sources import DatasetSource

    class Source(DatasetSource):
        field_meta = {"kind": {"class_ids": True}, "parts": {"class_ids": True}}

    items = _ClassIds({"image": Image.new("RGB", (4, 4), (i, 0, 0)), "kind": [0, 2, 3, 1][i],
                       "parts": np.array([[0, 1, 2], [2, 2, 2], [1, 0, 0], [-1, 5, 0]][i], np.int64)} for i in range(4))
    out = tmp_path / f"ids{suffix}"
    fastdata.convert(Source(items), out, workers=0)
    assert fastdata.verify(out).problems == (
        f"{str(out)!r}: sample 2 has 'kind' 3; field 'kind' holds class ids and the manifest lists 3 classes, so they "
        "are 0..2 (or -1: no class).",
        f"{str(out)!r}: sample 3 has 'parts' 5; field 'parts' holds class ids and the manifest lists 3 classes, so "
        "they are 0..2 (or -1: no class).")  # -1 is no class
