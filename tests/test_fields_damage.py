"""Damaged field data gives only fastdata's clear errors (issue 21, Targets): a property test
draws damage to a converted dataset with every field kind (a truncated variable-field data file,
offsets out of order or out of range, a manifest dtype/shape that no longer matches its files, a
garbled text/JSON value, a mask PNG replaced by garbage) in every format, and checks that
reading every sample either gives the undamaged sample or raises a ``FastdataError`` whose
message names the field (or the damaged file), and that ``verify`` reports the damage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from PIL import Image

import fastdata
from conftest import run_fastdata
from fastdata.errors import FastdataError
from fastdata.manifest import seal_manifest
from test_fields import FORMATS, Hinted, reader

DAMAGES = ("truncate", "offsets_order", "offsets_range", "manifest_dtype", "manifest_shape", "garble_text",
           "garble_json", "garbage_mask")
VARIABLE = ("boxes", "caption", "captions", "meta", "blob", "points", "mask")


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[str, tuple[Path, list]]:
    folder = tmp_path_factory.mktemp("undamaged")
    out = {}
    for name, suffix in FORMATS.items():
        path = folder / f"all{suffix}"
        fastdata.convert(Hinted(), path, workers=0, store="encoded")
        ds = reader(path, image_format="numpy")
        out[name] = (path, [plain(ds[i]) for i in range(len(ds))])
    return out


def plain(value):
    """A sample's value as something ``==`` compares exactly."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        value = value.as_subclass(torch.Tensor).numpy()
    if isinstance(value, Image.Image):
        value = np.asarray(value)
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.shape, value.tobytes())
    return value


# --- where each format keeps a field's stored bytes -----------------------------------------


def _read_manifest(out: Path) -> dict:
    if out.is_dir():
        return json.loads((out / "manifest.json").read_text())
    with h5py.File(out, "r") as file:
        return json.loads(file["fastdata_manifest"][()].tobytes())


def _write_manifest(out: Path, manifest: dict) -> None:
    seal_manifest(manifest)  # a consistent manifest that no longer matches its files
    if out.is_dir():
        (out / "manifest.json").write_text(json.dumps(manifest))
    else:
        with h5py.File(out, "r+") as file:
            del file["fastdata_manifest"]
            file.create_dataset("fastdata_manifest", data=np.frombuffer(json.dumps(manifest).encode(), np.uint8))


def _sample_span(out: Path, fmt: str, field: str, sample: int) -> tuple[Path, int, int]:
    """(file, offset, size) of one sample's stored bytes of a variable field."""
    if fmt == "npy":
        offsets = np.load(out / "fields" / f"{field}.offsets.npy")
        return out / "fields" / f"{field}.bin", int(offsets[sample]), int(offsets[sample + 1] - offsets[sample])
    if fmt == "hdf5":
        with h5py.File(out, "r") as file:
            data = file[f"fields/{field}.data"]
            offsets = file[f"fields/{field}.offsets"][:]
            return out, int(data.id.get_offset()) + int(offsets[sample]), int(offsets[sample + 1] - offsets[sample])
    index = json.loads((out / "index.json").read_text())
    shard = index["shards"][0]
    return (out / shard["file"], int(shard[f"field:{field}:offset"][sample]),
            int(shard[f"field:{field}:size"][sample]))


def _overwrite(file: Path, offset: int, data: bytes) -> None:
    with open(file, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def damage(out: Path, fmt: str, kind: str, field: str, sample: int, amount: int) -> str:
    """Damage ``out`` in place; the text an error must name (the field or the damaged file)."""
    if kind == "truncate":
        if fmt == "npy":
            file = out / "fields" / f"{field}.bin"
        elif fmt == "hdf5":
            file = out
        else:
            file = out / json.loads((out / "index.json").read_text())["shards"][0]["file"]
        size = file.stat().st_size
        with open(file, "r+b") as handle:
            handle.truncate(max(0, size - amount))
        return field if fmt == "npy" else file.name
    if kind.startswith("offsets_"):
        if fmt == "tar":
            path = out / "index.json"
            index = json.loads(path.read_text())
            column = index["shards"][0][f"field:{field}:offset"]
            if kind == "offsets_order":
                column[sample], column[-1 - sample] = column[-1 - sample], column[sample] + 1
            else:
                column[sample] += 10**6 * amount
            path.write_text(json.dumps(index))
            return field
        if fmt == "npy":
            path = out / "fields" / f"{field}.offsets.npy"
            offsets = np.load(path)
        else:
            with h5py.File(out, "r") as file:
                offsets = file[f"fields/{field}.offsets"][:]
        if kind == "offsets_order":
            offsets[sample + 1] = offsets[-1] + amount if sample + 1 < len(offsets) - 1 else offsets[0] - amount
        else:
            offsets[sample] = -amount if sample == 0 else offsets[-1] + 10**6 * amount
        if fmt == "npy":
            np.save(path, offsets)
        else:
            with h5py.File(out, "r+") as file:
                file[f"fields/{field}.offsets"][...] = offsets
        return field
    if kind.startswith("manifest_"):
        # fixed-shape fields: their files say their dtype and shape (a variable field's raw bytes
        # do not, so a consistent edit of its dtype is not damage that can be told from data)
        manifest = _read_manifest(out)
        # (tar keeps ints and floats as .cls/.json text, which fits any int/float dtype: only its
        # .npy members say their dtype)
        target = "attrs" if kind == "manifest_shape" or fmt == "tar" else ("attrs", "score", "flag")[sample % 3]
        for f in manifest["fields"]["fields"]:
            if f["name"] == target:
                if kind == "manifest_shape":
                    f["shape"] = [f["shape"][0] + amount]
                else:
                    f["dtype"] = {"int16": "int32", "float64": "float32", "bool": "int16"}[f["dtype"]]
        _write_manifest(out, manifest)
        return target
    target = {"garble_text": "caption", "garble_json": "meta", "garbage_mask": "mask"}[kind]
    sample = max(sample, 1)  # sample 0's caption is empty
    file, offset, size = _sample_span(out, fmt, target, sample)
    if kind == "garble_text":
        _overwrite(file, offset, b"\xff\xfe")  # never UTF-8
    elif kind == "garble_json":
        _overwrite(file, offset, b"#")
    else:
        _overwrite(file, offset, bytes((offset + i * 7) % 256 for i in range(size)))
    return target


def check_reads(out: Path, fmt: str, named: str, undamaged: list) -> bool:
    """Each sample reads as it was or raises a FastdataError naming ``named``; True if one raised."""
    raised = False
    try:
        ds = reader(out, image_format="numpy")
        samples = range(len(ds))
    except FastdataError as exc:
        assert named in str(exc) or "manifest" in str(exc), str(exc)
        return True
    for index in samples:
        try:
            got = ds[index]
        except FastdataError as exc:
            assert named in str(exc) or str(out.name) in str(exc), str(exc)
            assert "\n" not in str(exc), str(exc)
            raised = True
            continue
        assert plain(got) == undamaged[index], (fmt, index)  # never silent wrong data
    return raised


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(fmt=st.sampled_from(sorted(FORMATS)), kind=st.sampled_from(DAMAGES), field=st.sampled_from(VARIABLE),
       sample=st.integers(0, 4), amount=st.integers(1, 40))
def test_damaged_field_data_gives_only_clear_errors(converted, tmp_path_factory, fmt, kind, field, sample,
                                                    amount) -> None:
    source, undamaged = converted[fmt]
    out = tmp_path_factory.mktemp("damaged") / source.name
    (shutil.copytree if source.is_dir() else shutil.copyfile)(source, out)
    named = damage(out, fmt, kind, field, sample, amount)
    raised = check_reads(out, fmt, named, undamaged)
    if kind != "truncate" or fmt == "npy":  # a truncated hdf5/tar may lose only padding nobody reads
        assert raised, (fmt, kind, field)
    try:  # a consistent manifest edit is found by decoding (the files still match their checksums)
        report = fastdata.verify(out, deep=kind.startswith("manifest_"))
    except FastdataError as exc:
        assert "\n" not in str(exc)
    else:
        assert not report.ok, (fmt, kind, field)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_the_cli_reports_damaged_fields_without_a_traceback(converted, tmp_path: Path, fmt: str) -> None:
    source, _ = converted[fmt]
    out = tmp_path / source.name
    (shutil.copytree if source.is_dir() else shutil.copyfile)(source, out)
    damage(out, fmt, "garble_json", "meta", 2, 1)
    result = run_fastdata("verify", "--deep", out)
    assert result.returncode != 0 and "Traceback" not in result.stderr + result.stdout
