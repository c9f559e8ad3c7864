"""WebDataset shards that fastdata did not write, as a conversion source: written here with
stock ``webdataset.TarWriter``, read back and compared with stock ``webdataset.WebDataset``."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

import fastdata
from conftest import WRITABLE_FORMATS, pattern
from fastdata.errors import BadSampleError, InvalidOptionError, SourceChangedError
from fastdata.sources import WebDatasetSource, is_shard_source
from fastdata.sources.webdataset import RepeatedKeysWarning


def encoded(array: np.ndarray, fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def write_shards(folder: Path, shards: int = 3, per_shard: int = 5, *, label: str | None = "cls",
                 drop_image: int | None = None) -> Path:
    """``shards`` tar files of ``per_shard`` samples each, LAION-like: an image (jpg or png), a
    caption, a json, and a label member when ``label`` is given."""
    folder.mkdir(parents=True)
    for number in range(shards):
        with wds.TarWriter(str(folder / f"data-{number:06d}.tar")) as sink:
            for row in range(per_shard):
                index = number * per_shard + row
                sample = {"__key__": f"sample{index:04d}", "txt": f"caption {index}".encode(),
                          "json": json.dumps({"index": index, "label": index % 4}).encode()}
                if index != drop_image:
                    fmt = "png" if index % 2 else "jpg"
                    sample[fmt] = encoded(pattern(8, 6, seed=index), "PNG" if fmt == "png" else "JPEG")
                if label == "cls":
                    sample["cls"] = str(index % 3).encode()
                sink.write(sample)
    return folder


def stock(urls: str | list[str]) -> list[tuple[np.ndarray, dict]]:
    dataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("rgb8")
    return [(sample.get("jpg", sample.get("png")), sample) for sample in dataset]


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # stock webdataset leaves its shard files open
def test_a_folder_of_shards_converts_like_stock_webdataset_reads_it(tmp_path: Path) -> None:
    shards = write_shards(tmp_path / "shards")
    assert is_shard_source(shards) and not is_shard_source(tmp_path)
    out = tmp_path / "out.npy"
    manifest = fastdata.convert(shards, out, workers=0)
    assert manifest["count"] == 15 and manifest["source"]["type"] == "webdataset" and manifest["classes"] == []
    ds = fastdata.open_dataset(out, image_format="numpy")
    reference = stock([str(p) for p in sorted(shards.iterdir())])
    assert len(reference) == 15
    for index, (image, sample) in enumerate(reference):
        got = ds[index]  # every member kept: a dict keyed by suffix, the image under "image", and the key
        assert list(got) == ["__key__", "image", "cls", "json", "txt"] and got["__key__"] == sample["__key__"]
        np.testing.assert_array_equal(got["image"], image)
        assert got["cls"] == int(sample["cls"]) == index % 3
        assert got["txt"] == sample["txt"] == f"caption {index}" and got["json"] == sample["json"]
    assert (out / "fields" / "json.bin").read_bytes() == b"".join(
        json.dumps({"index": index, "label": index % 4}).encode() for index in range(15))  # the bytes as they were


def test_encoded_store_keeps_the_original_bytes_and_a_brace_pattern_selects_shards(tmp_path: Path) -> None:
    shards = write_shards(tmp_path / "shards")
    out = tmp_path / "two.npy"
    manifest = fastdata.convert(str(shards / "data-{000000..000001}.tar"), out, store="encoded", workers=0)
    assert manifest["count"] == 10 and manifest["image"]["encoding"] == "original"
    data, offsets = (out / "data.bin").read_bytes(), np.load(out / "offsets.npy")
    first = data[offsets[0]:offsets[1]]
    assert first == encoded(pattern(8, 6, seed=0), "JPEG")
    single = fastdata.convert(shards / "data-000002.tar", tmp_path / "one.npy", workers=0)
    assert single["count"] == 5


def test_labels_from_json_and_shards_without_labels(tmp_path: Path) -> None:
    shards = write_shards(tmp_path / "shards", label=None)
    source = WebDatasetSource(shards)
    assert source.labels.tolist() == [i % 4 for i in range(15)]  # from each sample's json "label"
    bare = tmp_path / "bare"
    bare.mkdir()
    with wds.TarWriter(str(bare / "x.tar")) as sink:
        for index in range(3):
            sink.write({"__key__": f"k{index}", "jpg": encoded(pattern(4, 4, seed=index), "JPEG"), "txt": b"hi"})
    manifest = fastdata.convert(bare, tmp_path / "bare.npy", workers=0)
    assert manifest["count"] == 3 and np.load(tmp_path / "bare.npy" / "labels.npy").tolist() == [-1, -1, -1]
    assert [f["name"] for f in manifest["fields"]["fields"]] == ["__key__", "jpg", "txt"]  # no label; the caption kept
    assert fastdata.open_dataset(tmp_path / "bare.npy")[2]["txt"] == "hi"


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # stock webdataset leaves its shard files open
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_captions_without_labels_are_kept_and_a_missing_member_is_named(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs"
    pairs.mkdir()
    with wds.TarWriter(str(pairs / "x.tar")) as sink:
        for index in range(4):
            sample = {"__key__": f"k{index}", "jpg": encoded(pattern(4, 4, seed=index), "JPEG"),
                      "json": json.dumps({"url": f"http://x/{index}"}).encode()}
            if index != 2:
                sample["txt"] = f"a photo {index}".encode()
            sink.write(sample)
    with pytest.raises(BadSampleError) as info:
        fastdata.convert(pairs, tmp_path / "pairs.tar", workers=0)
    assert str(info.value) == ("x.tar:k2: has no 'txt' member, which other samples have (it has jpg,json). Give every "
                               "sample the same members, or re-run with --skip-bad (skip_bad=True) to leave it out.")
    manifest = fastdata.convert(pairs, tmp_path / "pairs.tar", workers=0, skip_bad=True)
    assert manifest["count"] == 3 and manifest["skipped"][0]["key"] == "x.tar:k2"
    stock_samples = list(wds.WebDataset(str(tmp_path / "pairs.tar" / "shard-000000.tar"), shardshuffle=False).decode())
    assert [s["txt"] for s in stock_samples] == ["a photo 0", "a photo 1", "a photo 3"]
    assert [s["json"] for s in stock_samples] == [{"url": f"http://x/{i}"} for i in (0, 1, 3)]


def test_bad_samples_are_named(tmp_path: Path) -> None:
    shards = write_shards(tmp_path / "shards", drop_image=7)
    with pytest.raises(BadSampleError) as info:
        fastdata.convert(shards, tmp_path / "x.npy", workers=0, mode="RGB", resize="8x6")
    assert str(info.value) == ("data-000001.tar:sample0007: cannot read image (no image member (it has cls,json,txt)). "
                               "Re-run with --skip-bad (skip_bad=True) to leave it out.")
    manifest = fastdata.convert(shards, tmp_path / "x.npy", workers=0, skip_bad=True)
    assert manifest["count"] == 14 and manifest["skipped"] == [
        {"key": "data-000001.tar:sample0007", "reason": "no image member (it has cls,json,txt)"}]
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    with wds.TarWriter(str(mixed / "x.tar")) as sink:
        sink.write({"__key__": "a", "jpg": encoded(pattern(4, 4, seed=1), "JPEG"), "cls": b"1"})
        sink.write({"__key__": "b", "jpg": encoded(pattern(4, 4, seed=2), "JPEG")})
    with pytest.raises(InvalidOptionError, match=r"^x.tar:b: no label member \(it has jpg\), while other samples have one"):
        WebDatasetSource(mixed)


def test_resume_notices_a_changed_shard_and_the_output_stays_out_of_the_shards(tmp_path: Path) -> None:
    shards = write_shards(tmp_path / "shards")
    out = tmp_path / "out.npy"
    fastdata.convert(shards, out, workers=0)
    assert fastdata.convert(shards, out, workers=0, resume=True)["count"] == 15
    (shards / "data-000001.tar").write_bytes((shards / "data-000000.tar").read_bytes())  # (its keys are shard 0's)
    with pytest.raises(SourceChangedError, match="'data-000001.tar': files modified"), \
            pytest.warns(RepeatedKeysWarning, match="have the same key 'sample0000'"):
        fastdata.convert(shards, out, workers=0, resume=True)
    with pytest.raises(InvalidOptionError, match="is inside the source shards folder"), pytest.warns(RepeatedKeysWarning):
        fastdata.convert(shards, shards / "inside.npy", workers=0)


def field_bytes(out: Path, fmt: str, name: str, count: int) -> list[bytes]:
    """Each sample's stored bytes of a variable field (or, name None, the image), read from the
    format's own files without fastdata (docs/fields.md, docs/formats.md)."""
    if fmt == "npy":
        data = (out / ("data.bin" if name is None else f"fields/{name}.bin")).read_bytes()
        offsets = np.load(out / ("offsets.npy" if name is None else f"fields/{name}.offsets.npy"))
        return [data[offsets[i]:offsets[i + 1]] for i in range(count)]
    if fmt == "hdf5":
        import h5py

        with h5py.File(out, "r") as file:
            data = file["blob" if name is None else f"fields/{name}.data"][:].tobytes()
            offsets = file["offsets" if name is None else f"fields/{name}.offsets"][:]
        return [data[offsets[i]:offsets[i + 1]] for i in range(count)]
    members: dict[str, dict[str, bytes]] = {}
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as archive:
            for member in archive:
                key, _, suffix = member.name.partition(".")
                members.setdefault(key, {})[suffix] = archive.extractfile(member).read()
    samples = [members[key] for key in sorted(members)]
    assert len(samples) == count
    return [sample[name] if name is not None else sample["jpg"] for sample in samples]


@pytest.mark.parametrize("fmt", WRITABLE_FORMATS)
def test_encoded_store_keeps_every_member_byte_identical(tmp_path: Path, fmt: str) -> None:
    """Several images per sample (``.jpg`` + ``.left.png`` + a P-mode ``.seg.png`` mask), a
    caption, a json: with ``--store encoded`` every member is stored as the bytes it was."""
    shards = tmp_path / "shards"
    shards.mkdir()
    written = []
    with wds.TarWriter(str(shards / "x.tar")) as sink:
        for index in range(5):
            left = Image.fromarray(pattern(6 + index, 5, seed=10 + index))
            left_bytes = io.BytesIO()
            left.save(left_bytes, format="PNG", compress_level=1)  # not what fastdata would encode
            seg = Image.fromarray(np.full((6 + index, 5), index, np.uint8), "L").convert("P")
            seg.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255, 9, 9, 9] + [0] * 753)
            seg_bytes = io.BytesIO()
            seg.save(seg_bytes, format="PNG")
            sample = {"__key__": f"k{index}", "jpg": encoded(pattern(6 + index, 5, seed=index), "JPEG"),
                      "left.png": left_bytes.getvalue(), "seg.png": seg_bytes.getvalue(),
                      "txt": f"caption {index} \u00e9\n".encode(), "json": json.dumps({"id": index}, indent=1).encode()}
            sink.write(sample)
            written.append(sample)
    out = tmp_path / f"out{ {'npy': '.npy', 'hdf5': '.h5', 'tar': '.tar'}[fmt] }"
    manifest = fastdata.convert(shards, out, store="encoded", workers=0)
    fields = {f["name"]: f for f in manifest["fields"]["fields"]}
    assert fields["left.png"]["encoding"] == "original" and fields["seg.png"]["encoding"] == "original"
    assert field_bytes(out, fmt, None, 5) == [s["jpg"] for s in written]
    for name in ("left.png", "seg.png", "txt", "json"):
        assert field_bytes(out, fmt, name, 5) == [s[name] for s in written], name
    assert fastdata.verify(out, deep=True).ok
    ds = (fastdata.TarIndexedDataset(out, image_format="numpy") if fmt == "tar"
          else fastdata.open_dataset(out, image_format="numpy"))
    for index, sample in enumerate(written):
        got = ds[index]
        assert got["left.png"].tobytes() == pattern(6 + index, 5, seed=10 + index).tobytes()
        assert got["seg.png"].tolist() == np.full((6 + index, 5), index, np.uint8).tolist()  # the class ids
        assert got["txt"] == sample["txt"].decode() and got["json"] == {"id": index}
