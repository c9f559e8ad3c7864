"""Untrusted datasets stay inside their directory, and crafted numbers are reported, not crashed on.

A dataset may come from anyone. Its readers and ``fastdata verify`` must never read another
file (HDF5 external storage, virtual datasets, external links; tar shard names with '..' or an
absolute path), never allocate what a crafted number asks for, and never raise anything but a
fastdata data error (readers) or report anything but a finding (verify).
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastdata
from conftest import WRITABLE, WRITABLE_FORMATS, pattern, save
from fastdata.errors import CorruptDataError, CorruptManifestError, ManifestError
from fastdata.formats import get_format
from fastdata.formats.hdf5 import MANIFEST_ATTR, USERBLOCK_BYTES, userblock, write_manifest
from fastdata.manifest import MANIFEST_NAME, seal_manifest

READER_ERRORS = (CorruptDataError, ManifestError)  # what a reader may raise for a damaged dataset


def seal_userblock(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[:USERBLOCK_BYTES] = userblock(hashlib.blake2b(data[USERBLOCK_BYTES:], digest_size=32).hexdigest())
    path.write_bytes(bytes(data))


def hdf5_dataset(folder: Path, out: Path) -> Path:
    fastdata.convert(folder, out, format="hdf5", workers=0)
    return out


def rebuild_with_images(original: Path, target: Path, make_images) -> None:
    """A copy of an HDF5 dataset whose ``images`` is made by ``make_images(file, pixels)``; every
    checksum (dataset attributes, manifest, user block) is recomputed so only the storage differs."""
    with h5py.File(original, "r") as source, h5py.File(target, "w", userblock_size=USERBLOCK_BYTES) as file:
        pixels = source["images"][()]
        make_images(file, pixels)
        file.create_dataset("labels", data=source["labels"][()])
        file.create_dataset(MANIFEST_ATTR, data=source[MANIFEST_ATTR][()])
        for name in ("images", "labels"):
            if name in file and not isinstance(file.get(name, getlink=True), h5py.ExternalLink):
                file[name].attrs["blake2b"] = source[name].attrs["blake2b"]
        for key, value in source.attrs.items():
            file.attrs[key] = value
    seal_userblock(target)


def reads_pixels(path: Path) -> np.ndarray:
    return np.stack([image.numpy() for image, _ in fastdata.HDF5Dataset(path)])


@pytest.fixture
def original(uniform_folder: Path, tmp_path: Path) -> Path:
    return hdf5_dataset(uniform_folder, tmp_path / "original.h5")


def outside_copy(original: Path, tmp_path: Path) -> Path:
    """A file outside the dataset holding exactly the dataset's pixels (so checksums match)."""
    with h5py.File(original, "r") as file:
        pixels = file["images"][()]
    outside = tmp_path / "elsewhere" / "secret.bin"
    outside.parent.mkdir()
    outside.write_bytes(pixels.tobytes())
    return outside


def external_storage(original: Path, tmp_path: Path) -> tuple[Path, str]:
    outside = outside_copy(original, tmp_path)
    crafted = tmp_path / "external.h5"

    def make(file, pixels):
        file.create_dataset("images", shape=pixels.shape, dtype=np.uint8, external=[(str(outside), 0, pixels.nbytes)])

    rebuild_with_images(original, crafted, make)
    return crafted, f"dataset 'images' uses external storage ({str(outside)!r})"


def virtual_dataset(original: Path, tmp_path: Path) -> tuple[Path, str]:
    other = tmp_path / "elsewhere.h5"
    with h5py.File(original, "r") as source, h5py.File(other, "w") as file:
        file["images"] = source["images"][()]
    crafted = tmp_path / "virtual.h5"

    def make(file, pixels):
        layout = h5py.VirtualLayout(shape=pixels.shape, dtype=np.uint8)
        layout[:] = h5py.VirtualSource(str(other), "images", shape=pixels.shape)
        file.create_virtual_dataset("images", layout)

    rebuild_with_images(original, crafted, make)
    return crafted, "dataset 'images' is a virtual dataset (its data lives in other files)"


def external_link(original: Path, tmp_path: Path) -> tuple[Path, str]:
    other = tmp_path / "linked.h5"
    with h5py.File(original, "r") as source, h5py.File(other, "w") as file:
        file["images"] = source["images"][()]
        file["images"].attrs["blake2b"] = source["images"].attrs["blake2b"]
    crafted = tmp_path / "link.h5"

    def make(file, pixels):
        file["images"] = h5py.ExternalLink(str(other), "/images")

    rebuild_with_images(original, crafted, make)
    return crafted, f"'images' is a ExternalLink (to {str(other)!r}), not a dataset in the file"


def unknown_filter(original: Path, tmp_path: Path) -> tuple[Path, str]:
    hdf5plugin = pytest.importorskip("hdf5plugin")
    crafted = tmp_path / "filter.h5"

    def make(file, pixels):
        file.create_dataset("images", data=pixels, chunks=(4, *pixels.shape[1:]), **hdf5plugin.Bitshuffle())

    rebuild_with_images(original, crafted, make)
    return crafted, "dataset 'images' uses HDF5 filter 32008, which fastdata does not know"


@pytest.mark.parametrize("craft", [external_storage, virtual_dataset, external_link, unknown_filter])
def test_hdf5_refuses_data_stored_outside_the_file(original: Path, tmp_path: Path, craft) -> None:
    crafted, reason = craft(original, tmp_path)
    for use_memmap in (True, False):
        with pytest.raises(CorruptDataError) as info:
            fastdata.HDF5Dataset(crafted, use_memmap=use_memmap)
        assert str(info.value) == (f"{str(crafted)!r}: {reason}; fastdata reads only data stored inside the file "
                                   "itself. Run 'fastdata verify' on it, or convert the source again.")
    report = fastdata.verify(crafted, deep=True)
    assert not report.ok and any(reason in problem for problem in report.problems), report.problems


def test_the_crafting_is_real(original: Path, tmp_path: Path) -> None:
    """Plain h5py does read the outside file: the refusals above are what protects the user."""
    crafted, _ = external_storage(original, tmp_path)
    outside = tmp_path / "elsewhere" / "secret.bin"
    outside.write_bytes(bytes(len(outside.read_bytes())))  # change what lies outside
    with h5py.File(crafted, "r") as file:
        assert not file["images"][()].any()  # h5py followed the external storage


def test_verify_reports_links_anywhere_in_the_file(original: Path, tmp_path: Path) -> None:
    crafted = tmp_path / "extra-link.h5"
    shutil.copy(original, crafted)
    with h5py.File(crafted, "a") as file:
        group = file.create_group("more")
        group["passwords"] = h5py.ExternalLink("/etc/passwd", "/x")
    problems = fastdata.verify(crafted).problems
    assert f"{str(crafted)!r}: 'more/passwords' is a ExternalLink (to '/etc/passwd'); fastdata reads only data " \
           "stored inside the file itself." in problems


# --- tar ------------------------------------------------------------------------------------------


@pytest.fixture
def shards(uniform_folder: Path, tmp_path: Path) -> Path:
    out = tmp_path / "shards"
    fastdata.convert(uniform_folder, out, format="tar", store="encoded", workers=0, shard_samples=5)
    return out


def edit_index(out: Path, edit) -> None:
    index = json.loads((out / "index.json").read_text())
    edit(index)
    (out / "index.json").write_text(json.dumps(index))


def open_every_way(out: Path) -> list[BaseException]:
    """Open and read the dataset with both readers and verify (also --deep); the errors raised."""
    errors = []
    for read in (lambda: list(fastdata.TarDataset(out, shuffle=False)),
                 lambda: [fastdata.TarIndexedDataset(out)[i] for i in range(12)]):
        try:
            read()
        except BaseException as exc:  # noqa: BLE001 - the test checks the type
            errors.append(exc)
    for deep in (False, True):
        report = fastdata.verify(out, deep=deep)  # never raises
        assert not report.ok
    return errors


@pytest.mark.parametrize("name", ["../outside.tar", "/tmp/outside.tar", "sub/shard.tar", "..", ""])
def test_tar_shard_names_must_be_plain_file_names(shards: Path, tmp_path: Path, name: str) -> None:
    shutil.copy(shards / "shard-000000.tar", tmp_path / "outside.tar")

    def rename(index):
        index["shards"][0]["file"] = name

    edit_index(shards, rename)
    errors = open_every_way(shards)
    assert len(errors) == 2 and all(isinstance(e, CorruptManifestError) for e in errors)
    assert all(f"shard 0 names file {name!r}; a shard must be a plain file name inside the dataset directory"
               in str(e) for e in errors)


@pytest.mark.parametrize("field,value,message", [
    ("image_offset", 2**63, "shard 0 has 'image_offset' value 9223372036854775808; expected integers"),
    ("image_offset", 10**15, "shard 0 sample 0: 'image_offset' 1000000000000000 does not fit a"),
    ("image_size", 10**15, "shard 0 sample 0: 'image_size' 1000000000000000 does not fit a"),
    ("image_size", -5, "shard 0 sample 0: 'image_size' -5 does not fit a"),
    ("file", None, "shard 0 names file None; a shard must be a plain file name"),
    ("count", 10**12, "shard 0 'count' is 1000000000000; expected an integer from 0 to"),
    ("count", "5", "shard 0 'count' is '5'; expected an integer"),
    ("bytes", 10**30, "shard 0 'bytes' is 1000000000000000000000000000000; expected an integer"),
    ("label", [0.5] * 5, "shard 0 has 'label' value 0.5; expected integers"),
    ("cls_offset", None, "shard 0 'cls_offset' is 'None'; expected a list of 5 integers"),
    ("cls_size", [1, 2], "shard 0 has 2 'cls_size' values for 5 samples"),
])
def test_crafted_index_numbers_are_reported(shards: Path, field: str, value, message: str) -> None:
    def craft(index):
        shard = index["shards"][0]
        if isinstance(shard.get(field), list) and not isinstance(value, list) and value is not None:
            shard[field][0] = value
        else:
            shard[field] = value

    edit_index(shards, craft)
    errors = open_every_way(shards)
    assert [type(e) for e in errors] == [CorruptManifestError, CorruptManifestError], errors
    assert all(message in str(e) for e in errors), [str(e) for e in errors]


# --- hypothesis: any mutation of any manifest or index field ------------------------------------

MUTATIONS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, -1, 1, 2**31, 2**63, 10**12]),
    st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=8), st.sampled_from(["..", "/etc/passwd"]),
    st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def json_paths(document, prefix=()) -> list[tuple]:
    """Every place in a JSON document a value can be replaced (lists: their first 3 items)."""
    paths = [prefix] if prefix else []
    if isinstance(document, dict):
        for key, value in document.items():
            paths += json_paths(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document[:3]):
            paths += json_paths(value, (*prefix, index))
    return paths


def replaced(document, path: tuple, value):
    document = copy.deepcopy(document)
    target = document
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return document


@pytest.fixture(scope="module")
def converted_all(tmp_path_factory) -> dict[tuple[str, str], Path]:
    folder = tmp_path_factory.mktemp("folder")
    for label, name in enumerate(["ant", "bee"]):
        for i in range(3):
            save(Image.fromarray(pattern(6, 5, seed=label * 10 + i)), folder / name / f"{i}.png")
    outputs = {}
    for name, store in WRITABLE:
        out = tmp_path_factory.mktemp("converted") / f"{name}-{store}{get_format(name).suffix}"
        fastdata.convert(folder, out, format=name, store=store, workers=0, **({"shard_samples": 4} if name == "tar" else {}))
        outputs[(name, store)] = out
    return outputs


def documents(out: Path) -> dict[str, dict]:
    if out.is_file():
        with h5py.File(out, "r") as file:
            return {MANIFEST_ATTR: json.loads(file[MANIFEST_ATTR][()].tobytes())}
    found = {MANIFEST_NAME: json.loads((out / MANIFEST_NAME).read_text())}
    if (out / "index.json").exists():
        found["index.json"] = json.loads((out / "index.json").read_text())
    return found


def write_document(out: Path, name: str, document) -> None:
    text = json.dumps(document)
    if out.is_file():
        with h5py.File(out, "a") as file:
            write_manifest(file, text)
    else:
        (out / name).write_text(text)


def read_everything(out: Path) -> None:
    """Open the dataset with every reader of its format and read every sample."""
    manifest = fastdata.formats.find_manifest(out)
    spec = get_format(manifest["format"]) if manifest and manifest.get("format") in WRITABLE_FORMATS else None
    readers = [fastdata.open_dataset] + ([spec.map_dataset] if spec else [])
    for reader in readers:
        dataset = reader(out)
        if hasattr(dataset, "__getitems__"):
            for index in range(len(dataset)):
                dataset[index]
        else:
            list(dataset)


@pytest.mark.parametrize("key", WRITABLE, ids=[f"{n}-{s}" for n, s in WRITABLE])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_mutated_field_is_a_data_error_or_a_finding(converted_all, key, data) -> None:
    source = converted_all[key]
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / source.name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, out)
        docs = documents(out)
        name = data.draw(st.sampled_from(sorted(docs)))
        path = data.draw(st.sampled_from(json_paths(docs[name])))
        value = data.draw(MUTATIONS)
        mutated = replaced(docs[name], path, value)
        forged = name != "index.json" and data.draw(st.booleans())
        if forged:
            mutated = seal_manifest(mutated)  # a consistent forgery: its own checksum matches
        write_document(out, name, mutated)
        try:
            read_everything(out)
        except READER_ERRORS:
            pass  # the damage was named
        for deep in (False, True):
            try:
                report = fastdata.verify(out, deep=deep)
            except ManifestError:
                continue  # no manifest at all ('format' replaced): refused with the reason
            if mutated != docs[name] and not forged:
                assert not report.ok  # an edit is always found, whatever it did to the readers


@pytest.mark.parametrize("name,store,member", [("npy", "raw", "images.npy"), ("npy", "encoded", "data.bin"),
                                               ("tar", "raw", "shard-000000.tar")])
def test_a_data_file_that_is_a_symlink_is_refused(uniform_folder: Path, tmp_path: Path, name: str, store: str,
                                                 member: str) -> None:
    out = tmp_path / "ds"
    fastdata.convert(uniform_folder, out, format=name, store=store, workers=0)
    outside = tmp_path / "outside.bin"
    (out / member).rename(outside)
    (out / member).symlink_to(outside)  # same bytes, same size, same checksum: only the place differs
    with pytest.raises(CorruptDataError, match=rf"{member}' is a symbolic link"):
        reader = get_format(name).map_dataset(out)
        reader[0]
    report = fastdata.verify(out)
    assert (f"{str(out / member)!r} is a symbolic link (to {str(outside)!r}); a dataset's files must be stored "
            "inside its directory.") in report.problems


# --- HDF5 metadata reads are bounded (issue #20: one flipped byte made h5py spin for minutes) ---

PROBE = """
import json, sys
import fastdata
from fastdata.errors import FastdataError
path = sys.argv[1]
report = fastdata.verify(path)
try:
    fastdata.open_dataset(path)
    opened = "opened"
except FastdataError as exc:
    opened = type(exc).__name__ + ": " + str(exc)
print(json.dumps({"problems": list(report.problems), "opened": opened}))
"""


def probe(path: Path) -> dict:
    """verify and open_dataset on ``path`` in a child process: a read that never returns is
    killed after 120 s (and fails the test) instead of holding the suite."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def flip_before_format(path: Path, distance: int, value: int) -> None:
    """The damage of the report: one byte ``distance`` bytes before the manifest's '"format"'."""
    data = bytearray(path.read_bytes())
    data[data.index(b'"format"') - distance] = value
    path.write_bytes(bytes(data))


def test_the_manifest_is_a_contiguous_dataset_and_no_value_is_variable_length(original: Path) -> None:
    with h5py.File(original, "r") as file:
        manifest = json.loads(file[MANIFEST_ATTR][()].tobytes())
        assert manifest == fastdata.formats.find_manifest(original)
        assert file[MANIFEST_ATTR].id.get_offset() is not None and file[MANIFEST_ATTR].compression is None
        variable = []
        for node in (file, *(file[name] for name in file)):
            for key in node.attrs:
                kind = h5py.h5a.open(node.id, key.encode()).get_type()
                if isinstance(kind, h5py.h5t.TypeStringID) and kind.is_variable_str():
                    variable.append((node.name, key))
        assert variable == []


@pytest.mark.parametrize("distance, value", [(9, 0xD1), (9, 0xFF), (1, 0x00), (-3, 0xFF), (200, 0xFF)])
def test_a_flipped_byte_near_the_manifest_is_a_finding_not_a_hang(original: Path, distance: int, value: int) -> None:
    """Where the report's byte now falls (data before the manifest, or the manifest's own JSON),
    verify answers with a finding; opening either refuses the file or opens it (damaged pixels
    or labels are found when read, or by verify)."""
    flip_before_format(original, distance, value)
    found = probe(original)
    assert found["problems"]
    if distance <= 1:  # inside the manifest's text: not a dataset any more
        assert found["opened"].startswith(("CorruptManifestError: ", "ManifestError: ")), found["opened"]


def legacy_layout(original: Path, target: Path) -> None:
    """A file as layout 1 wrote it: the manifest in a variable-length string attribute."""
    with h5py.File(original, "r") as source, h5py.File(target, "w", userblock_size=USERBLOCK_BYTES) as file:
        for name in ("images", "labels"):
            file.create_dataset(name, data=source[name][()])
        manifest = json.loads(source[MANIFEST_ATTR][()].tobytes())
        file.attrs["fastdata_format"] = "hdf5"
        file.attrs["layout_version"] = 1
        file.attrs[MANIFEST_ATTR] = json.dumps(seal_manifest({**manifest, "layout_version": 1}))
    seal_userblock(target)


def test_a_layout_1_file_is_refused_by_version_without_reading_its_manifest_attribute(original: Path,
                                                                                        tmp_path: Path) -> None:
    legacy = tmp_path / "legacy.h5"
    legacy_layout(original, legacy)
    with h5py.File(legacy, "r") as file:  # the attribute really is variable-length, in the global heap
        assert h5py.h5a.open(file.id, MANIFEST_ATTR.encode()).get_type().is_variable_str()
    flip_before_format(legacy, 9, 0xD1)  # the global heap object's size: h5py would read it forever
    message = (f"{str(legacy)!r}: 'hdf5' layout version 1 is not supported; this fastdata reads layout version 2. "
               "Convert the source again with this fastdata, or install the fastdata that wrote it.")
    assert probe(legacy) == {"problems": [message], "opened": f"VersionMismatchError: {message}"}


def test_a_variable_length_attribute_is_reported_not_read(original: Path) -> None:
    with h5py.File(original, "a") as file:
        classes = [name.decode() for name in file.attrs["classes"]]
        del file.attrs["classes"]
        file.attrs.create("classes", np.array(classes, dtype=object), dtype=h5py.string_dtype())
    seal_userblock(original)
    report = fastdata.verify(original)
    assert report.problems == (f"{str(original)!r}: attribute 'classes' has a variable-length type, which fastdata "
                               "does not write or read; the file is damaged or was not written by fastdata.",)


def test_images_of_another_integer_type_are_refused_when_opened(original: Path, tmp_path: Path) -> None:
    crafted = tmp_path / "int8.h5"
    rebuild_with_images(original, crafted, lambda file, pixels: file.create_dataset("images", data=pixels.view(np.int8)))
    with h5py.File(crafted, "r") as file:
        shape = file["images"].shape
    with pytest.raises(CorruptDataError) as info:
        fastdata.open_dataset(crafted)
    assert str(info.value) == (f"{str(crafted)!r}: dataset 'images' holds int8 {shape}, expected uint8 shape {shape}; "
                               "the file is damaged. Convert the source again.")
