"""A crafted or damaged manifest is checked whole when it is read: every outcome is a one-line
``FastdataError`` (readers, ``fastdata info``) or a finding (``verify``), or a dataset that reads.
Never a traceback, an "OK" from ``verify`` followed by reads that raise, or a hang."""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import fastdata
from fastdata.cli import main
from fastdata.errors import CorruptManifestError, FastdataError, ManifestError
from fastdata.fields import KINDS, Schema
from fastdata.formats import get_format
from fastdata.manifest import MANIFEST_NAME, seal_manifest
from test_fields import Hinted, kinds
from test_untrusted import MUTATIONS, documents, json_paths, replaced, write_document


class WithRagged(Hinted):
    """Every field kind, and (K, H, W) instance masks whose every dimension varies."""

    fastdata_kinds = {**kinds(), "instances": "array:ragged"}

    def __getitem__(self, index: int) -> dict:
        return {**super().__getitem__(index), "instances": np.full((index, 2 + index, 3), index, np.uint8)}


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("fields")
    outputs = {}
    for name in ("npy", "tar", "hdf5"):
        out = folder / f"all{get_format(name).suffix or '.tar'}"
        fastdata.convert(WithRagged(), out, workers=0, store="encoded", **({"shard_samples": 2} if name == "tar" else {}))
        outputs[name] = out
    return outputs


def crafted(source: Path, folder: Path, edit=None, text: str | None = None) -> Path:
    """A copy of the directory dataset ``source`` whose manifest is ``edit``ed and resealed (a
    consistent forgery), or replaced by ``text``."""
    out = folder / source.name
    shutil.copytree(source, out)
    if text is None:
        manifest = json.loads((source / MANIFEST_NAME).read_text())
        edit(manifest)
        text = json.dumps(seal_manifest(manifest))
    (out / MANIFEST_NAME).write_text(text)
    return out


def info(path: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["info", str(path)])
    return code, out.getvalue(), err.getvalue()


def nested(depth: int, leaf: str = "boxes"):
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def set_in(path: tuple, value):
    """An edit setting ``value`` at ``path``; after ``"fields"``, a name picks that field of the schema."""
    def edit(manifest: dict) -> None:
        target = manifest
        for depth, part in enumerate(path[:-1]):
            target = next(f for f in target["fields"] if f["name"] == part) if depth == 1 else target[part]
        target[path[-1]] = value
    return edit


CRAFTED = {  # what the manifest says -> what the one-line error must say
    "fields is text": (set_in(("fields",), "x"), "'fields' is 'x'; expected an object"),
    "dtype nope": (set_in(("fields", "boxes", "dtype"), "nope"), "field 'boxes': dtype 'nope' is not allowed"),
    "structure names a missing field": (set_in(("fields", "structure"), {"image": "image", "gone": "nothere"}),
                                        "structure names 'nothere', which is no field of the schema"),
    "structure 40 deep": (set_in(("fields", "structure"), {"image": "image", "deep": nested(40)}),
                          "structure is nested deeper than 32 levels"),
    "structure 900 deep": (set_in(("fields", "structure"), {"image": "image", "deep": nested(900)}),
                           "nests arrays or objects more than 64 deep"),
    "bogus box format": (set_in(("fields", "boxes", "meta", "format"), "BOGUS"),
                         "field 'boxes': meta 'format' is 'BOGUS'; expected one of XYXY"),
    "ndim text": (set_in(("fields", "instances", "meta", "ndim"), "x"), "field 'instances': meta 'ndim' is 'x'"),
    "canvas of no image": (set_in(("fields", "boxes", "meta", "canvas_size_of"), "label"),
                           "field 'boxes': its boxes' canvas 'label' is no image or mask field"),
    "palette of text": (set_in(("fields", "mask", "meta", "palette"), "red"), "field 'mask': meta 'palette' is 'red'"),
    "shape of text": (set_in(("fields", "boxes", "shape"), ["K", 4]), "field 'boxes': has shape ['K', 4]"),
    "mask kind of json": (set_in(("fields", "mask", "kind"), "json"), "field 'mask': dtype 'uint8' is not allowed for json"),
    "unknown kind": (set_in(("fields", "mask", "kind"), "video"), "field 'mask': kind 'video' is not one of"),
    "tuple layout of a dict": (set_in(("fields", "layout"), "tuple"), "is not a list (tuple layout)"),
    "source is a list": (set_in(("source",), [1, 2]), "'source' is '[1, 2]'; expected an object"),
    "skipped is a number": (set_in(("skipped",), 3), "'skipped' is '3'; expected list"),
}
TEXTS = {  # manifest text -> the one-line error
    "a 5,000-digit integer": (lambda text: text.replace('"count": 5', '"count": ' + "9" * 5000),
                              "holds a number Python refuses to read"),
    "100,000 nested brackets": (lambda text: text[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                "nests arrays or objects too deep"),
}


def check_refused(path: Path, message: str) -> None:
    """Every way in gives the same one-line error (``verify`` as a finding, never "OK")."""
    with pytest.raises(CorruptManifestError) as caught:
        fastdata.open_dataset(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    report = fastdata.verify(path)
    assert not report.ok and any(message in problem for problem in report.problems), report.problems
    code, out, err = info(path)
    assert (code, out) == (1, "") and err.startswith("fastdata: error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("case", CRAFTED)
def test_a_crafted_schema_is_refused_by_every_reader_and_found_by_verify(converted, tmp_path: Path, case: str) -> None:
    edit, message = CRAFTED[case]
    check_refused(crafted(converted["npy"], tmp_path, edit), message)


@pytest.mark.parametrize("case", TEXTS)
def test_manifest_text_python_cannot_parse_is_one_error(converted, tmp_path: Path, case: str) -> None:
    make, message = TEXTS[case]
    text = (converted["npy"] / MANIFEST_NAME).read_text()
    out = crafted(converted["npy"], tmp_path, text=make(json.dumps(json.loads(text))))
    check_refused(out, message)


def test_the_converted_schema_itself_passes_every_check(converted) -> None:
    for out in converted.values():
        schema = Schema.from_json(fastdata.formats.find_manifest(out)["fields"])
        assert schema.names[-1] == "instances" and schema["instances"].meta == {"as": "numpy", "ndim": 3}
        assert fastdata.verify(out).ok


# --- hypothesis: any value anywhere in a fields dataset's manifest ------------------------------

SCHEMA_VALUES = st.one_of(
    MUTATIONS, st.sampled_from(list(KINDS)), st.sampled_from(["XYXY", "XYWH", "CXCYWH"]),
    st.sampled_from(["uint8", "float32", "int64", "bool", "nope", "raw", "png", "npy", "original", "P", "RGB",
                     "image", "mask", "boxes", "label", "instances", "BoundingBoxes", "Mask", "numpy"]),
    st.lists(st.one_of(st.none(), st.integers(-2, 9)), max_size=4), st.just(nested(40)),
    st.dictionaries(st.sampled_from(["image", "boxes", "x"]), st.sampled_from(["image", "boxes", "gone"]), max_size=2),
)
READ_FAILURES = (FastdataError,)  # a reader's, the loader's or info's: one line naming what is wrong


def read_all(out: Path) -> None:
    first = fastdata.open_dataset(out)
    for dataset in (first, get_format(first.manifest["format"]).map_dataset(out)):
        if hasattr(dataset, "__getitems__"):
            indices = list(range(len(dataset)))
            dataset.__getitems__(indices)
            for index in indices:
                dataset[index]
            fastdata.loader(dataset, batch_size=2, num_workers=0).__iter__().__next__()
        else:
            list(dataset)


@pytest.mark.parametrize("name", ["npy", "tar", "hdf5"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_value_anywhere_in_a_fields_manifest_is_one_error_or_reads(converted, name: str, data) -> None:
    source = converted[name]
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / source.name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, out)
        document_name = next(n for n in documents(out) if n != "index.json")
        document = documents(out)[document_name]
        schema_paths = [p for p in json_paths(document) if p[0] == "fields"]
        path = data.draw(st.sampled_from(schema_paths if data.draw(st.integers(0, 3)) else json_paths(document)))
        mutated = seal_manifest(replaced(document, path, data.draw(SCHEMA_VALUES)))
        if data.draw(st.booleans()) and isinstance(mutated.get("fields"), dict):
            mutated["fields"]["structure"] = data.draw(st.one_of(st.none(), SCHEMA_VALUES))
            seal_manifest(mutated)
        write_document(out, document_name, mutated)
        try:
            read_all(out)
        except READ_FAILURES as exc:
            assert "\n" not in str(exc).strip(), str(exc)
        for deep in (False, True):
            try:
                fastdata.verify(out, deep=deep)
            except ManifestError:
                pass  # no manifest at all ('format' replaced): refused with the reason
        code, _, err = info(out)
        assert code == 0 or (code == 1 and err.startswith("fastdata: error: ") and err.count("\n") == 1), err


def test_a_batch_of_the_loader_reads_every_field_after_the_checks(converted) -> None:
    batch = next(iter(fastdata.loader(fastdata.open_dataset(converted["npy"]), batch_size=5)))
    assert [value.shape for value in batch["instances"]] == [(i, 2 + i, 3) for i in range(5)]
    assert batch["label"].dtype == torch.int64


@pytest.mark.parametrize("case", ["source is a list", "dtype nope", "a 5,000-digit integer"])
def test_a_crafted_manifest_at_a_url_is_one_error_from_info_and_verify(converted, http_root, tmp_path: Path,
                                                                       monkeypatch, case: str) -> None:
    root, base, source = *http_root, converted["tar"]  # (a tar dataset's files are plain names)
    if case in CRAFTED:
        crafted(source, root, CRAFTED[case][0])
        message = CRAFTED[case][1]
    else:
        make, message = TEXTS[case]
        crafted(source, root, text=make(json.dumps(json.loads((source / MANIFEST_NAME).read_text()))))
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    url = f"{base}/{source.name}"
    code, out, err = info(url)
    assert (code, out) == (1, "") and err.startswith("fastdata: error: ") and message in err and err.count("\n") == 1
    try:
        report = fastdata.verify(url)
    except FastdataError as exc:  # a manifest that cannot be parsed at all is refused before anything is fetched
        assert message in str(exc) and "\n" not in str(exc)
    else:
        assert not report.ok and any(message in problem for problem in report.problems), report.problems


def test_convert_returns_the_manifest_as_a_dict_shown_short(uniform_folder: Path, tmp_path: Path) -> None:
    """In a REPL, ``fastdata.convert(...)`` shows one line, not kilobytes of checksums; it is the
    same dict as before (keys, JSON, equality)."""
    out = tmp_path / "u.npy"
    manifest = fastdata.convert(uniform_folder, out, resize="6x5", workers=0)
    assert repr(manifest) == ("<fastdata manifest: npy raw, 12 samples, 6x5x3 uint8, 3 classes; dict(manifest) for "
                              "every key>")
    assert isinstance(manifest, dict) and manifest == json.loads((out / "manifest.json").read_text())
    assert json.loads(json.dumps(manifest)) == manifest and manifest["count"] == 12
    encoded = fastdata.convert(uniform_folder, tmp_path / "e.h5", store="encoded", workers=0)
    assert repr(encoded) == ("<fastdata manifest: hdf5 encoded, 12 samples, encoded (original), 3 classes; "
                             "dict(manifest) for every key>")
