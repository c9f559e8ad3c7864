"""The hdf5 format: layouts on disk, plain-h5py readability, read paths, fork safety, errors,
and ChunkShuffleSampler. (The registry-wide contract lives in test_contract.py.)"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, get_worker_info

import fastdata
from conftest import folder_samples
from fastdata.cli import build_parser, main
from fastdata.errors import (
    CorruptDataError,
    DependencyMissingError,
    InvalidOptionError,
    ManifestError,
    SourceNotFoundError,
)
from fastdata.formats.hdf5 import HDF5Dataset, HDF5Options, USERBLOCK_BYTES, default_chunk_images, userblock, write_manifest
from fastdata.manifest import seal_manifest
from fastdata.loading.samplers import ChunkShuffleSampler
from fastdata.sources import scan_folder
from fastdata.testing import FormatContract


class TestHDF5Format(FormatContract):
    format = "hdf5"
    layouts = {"gzip-chunks": ("raw", {"compression": "gzip", "chunk_images": 7})}

    @staticmethod
    def stored_bytes(out: Path) -> list[bytes]:
        with h5py.File(out, "r") as file:
            blob, offsets = file["blob"][()], file["offsets"][()]
        return [blob[offsets[i] : offsets[i + 1]].tobytes() for i in range(len(offsets) - 1)]

    @staticmethod
    def reseal(out: Path) -> None:
        manifest = fastdata.formats.find_manifest(out)
        with h5py.File(out, "a") as file:
            for name, entry in manifest["files"].items():
                content = np.ascontiguousarray(file[name][()]).tobytes()
                entry["blake2b"] = hashlib.blake2b(content, digest_size=32).hexdigest()
                file[name].attrs["blake2b"] = np.bytes_(entry["blake2b"])
            write_manifest(file, json.dumps(seal_manifest(manifest)))
        data = bytearray(out.read_bytes())
        data[:USERBLOCK_BYTES] = userblock(hashlib.blake2b(data[USERBLOCK_BYTES:], digest_size=32).hexdigest())
        out.write_bytes(bytes(data))

    @classmethod
    def set_label(cls, out: Path, sample: int, label: int) -> None:
        with h5py.File(out, "a") as file:
            file["labels"][sample] = label
        cls.reseal(out)

    @classmethod
    def garble_sample(cls, out: Path, sample: int) -> None:
        with h5py.File(out, "a") as file:
            start, stop = file["offsets"][sample : sample + 2]
            file["blob"][start:stop] = np.frombuffer(b"x" * int(stop - start), np.uint8)
        cls.reseal(out)

    @staticmethod
    def sample_file(out: Path, sample: int) -> Path:
        return out

    def rewrite_manifest(self, out: Path, change: dict) -> None:
        with h5py.File(out, "a") as file:
            manifest = json.loads(file["fastdata_manifest"][()].tobytes())
            write_manifest(file, json.dumps({**manifest, **change}))

    def damage(self, out: Path) -> str:
        with h5py.File(out, "r") as file:
            name = "images" if "images" in file else "blob"
            offset, size = file[name].id.get_offset(), file[name].id.get_storage_size()
        with open(out, "r+b") as handle:
            if offset is None:  # chunked: cut the file inside its data
                handle.truncate(out.stat().st_size // 2)
            else:  # contiguous: the data's bytes are there, but its end is cut off
                handle.truncate(offset + size // 2)
        return repr(str(out)).replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")

LAYOUTS = {  # id -> convert options, expected (chunks first dim or None, h5py compression)
    "contiguous": ({}, (None, None)),
    "gzip": ({"compression": "gzip"}, (12, "gzip")),
    "gzip1-chunk5": ({"compression": "gzip:1", "chunk_images": 5}, (5, "gzip")),
    "lzf": ({"compression": "lzf"}, (12, "lzf")),
    "chunked-uncompressed": ({"chunk_images": 3}, (3, None)),
}


def blake2b(array: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(array).tobytes(), digest_size=32).hexdigest()


@pytest.fixture(params=list(LAYOUTS), ids=list(LAYOUTS))
def raw_h5(request, uniform_folder: Path, tmp_path: Path):
    options, expected_layout = LAYOUTS[request.param]
    out = tmp_path / "raw.h5"
    fastdata.convert(uniform_folder, out, format="hdf5", workers=0, **options)
    return out, expected_layout


# --- round trips -------------------------------------------------------------------------


def test_raw_round_trip_is_pixel_exact_on_every_read_path(raw_h5, uniform_folder: Path) -> None:
    out, _ = raw_h5
    images, labels = folder_samples(uniform_folder)
    ds = fastdata.open_dataset(out)
    assert isinstance(ds, HDF5Dataset) and len(ds) == 12 and ds.classes == ["ant", "bee", "cow"]
    order = np.array([11, 0, 5, 5, 3, 10, 1])  # unsorted, repeated, spanning chunks
    batch, batch_labels = ds[order]  # the collated fast path (fastdata.loader)
    np.testing.assert_array_equal(batch.permute(0, 2, 3, 1).numpy(), images[order])
    np.testing.assert_array_equal(batch_labels.numpy(), labels[order])
    for (image, label), index in zip(ds.__getitems__(order.tolist()), order):  # standard DataLoader
        np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), images[index])
        assert label == labels[index]
    image, label = ds[-1]
    np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), images[11])
    assert label == labels[11]


def test_h5py_fallback_and_tiny_cache_read_the_same(raw_h5, uniform_folder: Path) -> None:
    out, _ = raw_h5
    images, _ = folder_samples(uniform_folder)
    ds = HDF5Dataset(out, image_format="numpy", use_memmap=False, cache_bytes=0)  # 2 chunks cached
    for order in (np.arange(12), np.arange(12)[::-1], np.array([7, 0, 11, 3, 8, 1, 7]), np.arange(4, 9), []):
        pixels, _ = ds[order]
        np.testing.assert_array_equal(pixels.reshape(-1, 12, 10, 3), images[np.asarray(order, dtype=int)])


def test_encoded_round_trip_is_byte_exact_and_plain_h5py_reads_it(uniform_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "enc.h5"
    fastdata.convert(uniform_folder, out, format="hdf5", store="encoded", workers=0)
    keys, labels, _ = scan_folder(uniform_folder)
    with h5py.File(out, "r") as file:
        blob, offsets = file["blob"][()], file["offsets"][()]
        assert file["blob"].chunks is None and file["blob"].compression is None
        np.testing.assert_array_equal(file["labels"][()], labels)
        for i, key in enumerate(keys):
            assert blob[offsets[i] : offsets[i + 1]].tobytes() == (uniform_folder / key).read_bytes()
    images, _ = folder_samples(uniform_folder)
    pixels, _ = HDF5Dataset(out, image_format="numpy")[np.arange(12)]
    np.testing.assert_array_equal(pixels, images)


def test_encoded_mixed_sizes_decode_like_the_folder(mixed_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "mixed.h5"
    fastdata.convert(mixed_folder, out, format="hdf5", store="encoded", workers=0, mode="RGB")
    ds = HDF5Dataset(out, image_format="numpy")
    reference = fastdata.FolderDataset(mixed_folder, image_format="numpy")
    assert len(ds) == len(reference) == 7
    for i in range(len(ds)):
        np.testing.assert_array_equal(ds[i][0], reference[i][0])
        assert ds[i][1] == reference[i][1]


def test_raw_with_skipped_samples_is_compacted(uniform_folder: Path, tmp_path: Path) -> None:
    images, labels = folder_samples(uniform_folder)
    (uniform_folder / "bee" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    for name, options in (("contiguous", {}), ("chunked", {"compression": "lzf", "chunk_images": 5})):
        out = tmp_path / f"{name}.h5"
        manifest = fastdata.convert(uniform_folder, out, format="hdf5", workers=0, skip_bad=True, **options)
        assert manifest["count"] == 12
        assert manifest["skipped"][0]["key"] == os.path.join("bee", "broken.png")
        with h5py.File(out, "r") as file:  # no trailing rows for the missing sample
            assert file["images"].shape == (12, 12, 10, 3) and file["labels"].shape == (12,)
            assert file["images"].attrs["blake2b"] == blake2b(images).encode()
        pixels, got_labels = HDF5Dataset(out, image_format="numpy")[np.arange(12)]
        np.testing.assert_array_equal(pixels, images)
        np.testing.assert_array_equal(got_labels, labels)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunked.h5", "contiguous.h5", "uniform"]


# --- the file on disk --------------------------------------------------------------------


def test_plain_h5py_sees_images_labels_classes_manifest_and_checksums(raw_h5, uniform_folder: Path) -> None:
    out, (chunk_rows, compression) = raw_h5
    images, labels = folder_samples(uniform_folder)
    with h5py.File(out, "r") as file:
        assert sorted(file) == ["fastdata_manifest", "images", "labels"]
        np.testing.assert_array_equal(file["images"][()], images)
        np.testing.assert_array_equal(file["labels"][()], labels)
        assert file["labels"].dtype == np.int64 and file["images"].dtype == np.uint8
        assert (file["images"].chunks or (None,))[0] == chunk_rows
        assert file["images"].compression == compression
        assert list(file.attrs["classes"]) == [b"ant", b"bee", b"cow"]  # fixed-length: bytes in h5py
        assert file.attrs["fastdata_format"] == b"hdf5" and file.attrs["layout_version"] == 2
        manifest = json.loads(file["fastdata_manifest"][()].tobytes())
        assert file["images"].attrs["blake2b"] == blake2b(images).encode()
        assert file["labels"].attrs["blake2b"] == blake2b(labels).encode()
    assert manifest["format"] == "hdf5" and manifest["layout_version"] == 2 and manifest["count"] == 12
    assert manifest["files"]["images"] == {"dataset": "images", "bytes": images.nbytes, "blake2b": blake2b(images)}
    assert manifest["hdf5"]["images"] == ("chunked" if chunk_rows else "contiguous")
    assert manifest == fastdata.formats.find_manifest(out)


def test_contiguous_data_is_memory_mapped_and_chunked_data_is_not(raw_h5) -> None:
    out, (chunk_rows, _) = raw_h5
    ds = HDF5Dataset(out)
    ds[0]
    if chunk_rows is None:
        # a plain ndarray view of the mapping (no memmap subclass per batch), the mapping its base
        assert isinstance(ds.handles.data.base, np.memmap) and ds.handles.file is None
    else:
        assert ds.chunk_images == chunk_rows and isinstance(ds.handles.file, h5py.File)


def test_default_chunk_rule_is_about_one_mebibyte() -> None:
    assert default_chunk_images((32, 32, 3), 20000) == 341  # 1 MiB // 3072 bytes
    assert default_chunk_images((32, 32, 3), 100) == 100  # never more than the dataset
    assert default_chunk_images((1024, 1024, 3), 50) == 1  # at least one image


@pytest.mark.parametrize("compression", ["blosc", "blosc:9", "lz4", "zstd:3"])
def test_plugin_codecs_round_trip_with_hdf5plugin(uniform_folder: Path, tmp_path: Path, compression: str) -> None:
    hdf5plugin = pytest.importorskip("hdf5plugin")  # in the test extra; the real filters run
    out = tmp_path / "plugin.h5"
    fastdata.convert(uniform_folder, out, format="hdf5", compression=compression, chunk_images=5, workers=0)
    images, labels = folder_samples(uniform_folder)
    got, got_labels = fastdata.open_dataset(out, image_format="numpy")[np.arange(12)]
    np.testing.assert_array_equal(got, images)
    assert got_labels.tolist() == labels.tolist()
    with h5py.File(out) as handle:  # plain h5py reads it once hdf5plugin is imported
        assert hdf5plugin is not None and handle["images"].chunks == (5, 12, 10, 3)
        np.testing.assert_array_equal(handle["images"][:], images)
    assert fastdata.verify(out).ok


def test_plugin_compression_without_hdf5plugin_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "hdf5plugin", None)  # import fails as if not installed
    with pytest.raises(DependencyMissingError) as caught:
        HDF5Options(compression="zstd")
    assert str(caught.value) == ("compression 'zstd' needs the hdf5plugin package, which is not installed. Install it "
                                 "with: pip install 'torch-fastdata[hdf5plugin]' or, in a checkout of fastdata, pip install "
                                 "'.[hdf5plugin]' (or use 'gzip' or 'lzf').")


@pytest.mark.parametrize(
    "options,error,message",
    [
        ({"compression": "zip"}, InvalidOptionError, "Invalid --compression 'zip'. Allowed: 'none', 'gzip"),
        ({"compression": "gzip:12"}, InvalidOptionError, r"Invalid --compression 'gzip:12': the gzip level must be in 0..9. Use e.g. 'gzip:4'."),
        ({"compression": "lzf:3"}, InvalidOptionError, r"Invalid --compression 'lzf:3': lzf takes no level. Use 'lzf'."),
        ({"chunk_images": 0}, InvalidOptionError, "Invalid --chunk-images 0. Use a positive integer."),
        ({"level": 3}, InvalidOptionError, "Option 'level' does not apply to format 'hdf5'"),
    ],
)
def test_bad_options_are_refused_up_front(uniform_folder: Path, tmp_path: Path, options, error, message) -> None:
    with pytest.raises(error, match=message):
        fastdata.convert(uniform_folder, tmp_path / "x.h5", format="hdf5", workers=0, **options)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["uniform"]


def test_compression_with_encoded_store_is_refused(uniform_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match=r"Option compression='gzip:4' applies to --store raw only"):
        fastdata.convert(
            uniform_folder, tmp_path / "x.h5", format="hdf5", store="encoded", compression="gzip", workers=0
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["uniform"]


def test_failure_while_creating_the_file_leaves_nothing(uniform_folder: Path, tmp_path: Path, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise OSError("no space left on device")

    monkeypatch.setattr(h5py.File, "create_dataset", refuse)
    with pytest.raises(OSError, match="no space left on device"):
        fastdata.convert(uniform_folder, tmp_path / "x.h5", format="hdf5", compression="lzf", workers=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["uniform"]


def test_cli_flags_come_from_the_options() -> None:
    args = build_parser().parse_args(
        ["convert", "src", "out.h5", "--format", "hdf5", "--compression", "GZIP", "--chunk-images", "64"]
    )
    from fastdata.cli.convert import options_from
    from fastdata.conversion.plan import decide_options

    options = decide_options(args.output, **options_from(args, skip=("source", "output", "quiet", "command", "run")))
    assert options.format_options == HDF5Options(compression="gzip:4", chunk_images=64)
    assert HDF5Options(compression="GZIP", chunk_images=64) == HDF5Options(compression="gzip:4", chunk_images=64)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--compression", "zstd"], "compression 'zstd' needs the hdf5plugin package"),
        (["--compression", "zip"], "Invalid --compression 'zip'"),
        (["--chunk-images", "0"], "Invalid --chunk-images '0'. Use a positive integer."),
        (["--store", "encoded", "--compression", "lzf"], "Option compression='lzf' applies to --store raw only"),
    ],
)
def test_cli_reports_option_errors_without_traceback(
    uniform_folder: Path, tmp_path: Path, monkeypatch, capsys, flags, message
) -> None:
    monkeypatch.setitem(sys.modules, "hdf5plugin", None)
    out = str(tmp_path / "x.h5")
    code = main(["convert", str(uniform_folder), out, "--format", "hdf5", "--workers", "0", "--quiet", *flags])
    err = capsys.readouterr().err
    assert code != 0 and err.startswith("fastdata: error: ") and message in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["uniform"]


# --- errors when reading -------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncate", "garbage-header"])
def test_damaged_file_raises_an_error_naming_it(raw_h5, damage: str) -> None:
    out, _ = raw_h5
    data = out.read_bytes()
    garbage_header = b"\x89HDF\r\n\x1a\n" + bytes(range(64)) + data[72:]  # signature kept, superblock not
    out.write_bytes(data[: len(data) // 2] if damage == "truncate" else garbage_header)
    with pytest.raises(CorruptDataError, match=f"{str(out)!r}: cannot open as HDF5.*truncated or damaged"):
        HDF5Dataset(out)
    with pytest.raises(CorruptDataError, match=repr(str(out))):
        fastdata.open_dataset(out)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match=f"{str(tmp_path / 'nope.h5')!r} does not exist."):
        HDF5Dataset(tmp_path / "nope.h5")


def test_plain_hdf5_file_is_not_taken_for_a_dataset(tmp_path: Path) -> None:
    out = tmp_path / "plain.h5"
    with h5py.File(out, "w") as file:
        file["images"] = np.zeros((2, 4, 4, 3), np.uint8)
    with pytest.raises(ManifestError, match="is not an HDF5 dataset written by 'fastdata convert'"):
        HDF5Dataset(out)
    with pytest.raises(ManifestError, match="is not a dataset written by 'fastdata convert'"):
        fastdata.open_dataset(out)


# --- processes ---------------------------------------------------------------------------


def _check_fresh_handle(worker_id: int) -> None:
    """In each worker: the parent's h5py handle (inherited under fork) must not be used."""
    ds = get_worker_info().dataset
    inherited = ds._handles
    ds[0]
    if inherited is not None and inherited.file is not None:
        if inherited.file.id.valid or ds.handles.file is inherited.file:
            raise RuntimeError("worker reads through the h5py handle its parent opened")
    if ds._pid != os.getpid() or ds.handles.file is None or not ds.handles.file.id.valid:
        raise RuntimeError("worker did not open its own h5py handle")


def _epoch(ds: HDF5Dataset, loader) -> list[tuple[bytes, int]]:
    return sorted(
        (image.tobytes(), int(label))
        for images, labels in loader
        for image, label in zip(images.permute(0, 2, 3, 1).contiguous().numpy(), labels)
    )


def _expected_records(folder: Path) -> list[tuple[bytes, int]]:
    images, labels = folder_samples(folder)
    return sorted((image.tobytes(), int(label)) for image, label in zip(images, labels))


@pytest.mark.parametrize("reader", ["gzip", "contiguous-via-h5py"])
def test_parent_handle_is_never_shared_with_forked_workers(uniform_folder: Path, tmp_path: Path, reader: str) -> None:
    out = tmp_path / "f.h5"
    options = {"compression": "gzip"} if reader == "gzip" else {}
    fastdata.convert(uniform_folder, out, format="hdf5", workers=0, **options)
    ds = HDF5Dataset(out, use_memmap=False)
    ds[3]  # the parent opens the file before the workers start: the classic failure setup
    parent_file = ds.handles.file
    assert parent_file.id.valid
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, multiprocessing_context="fork",
                        worker_init_fn=_check_fresh_handle)
    assert _epoch(ds, loader) == _expected_records(uniform_folder)
    assert parent_file.id.valid and ds.handles.file is parent_file  # the parent's own handle still works
    np.testing.assert_array_equal(ds[3][0].numpy(), pickle.loads(pickle.dumps(ds))[3][0].numpy())


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_chunk_shuffle_loader_yields_every_sample_once(uniform_folder: Path, tmp_path: Path, num_workers: int) -> None:
    out = tmp_path / "c.h5"
    fastdata.convert(uniform_folder, out, format="hdf5", workers=0, compression="gzip", chunk_images=5)
    ds = HDF5Dataset(out)
    ds[0]
    batches = ChunkShuffleSampler(ds, window_chunks=2, batch_size=4, seed=1)
    context = "fork" if num_workers else None
    loader = DataLoader(ds, batch_size=None, sampler=batches, num_workers=num_workers, multiprocessing_context=context)
    assert _epoch(ds, loader) == _expected_records(uniform_folder)
    samples = ChunkShuffleSampler(ds, window_chunks=1, seed=2)  # per-sample indices, standard collate
    loader = DataLoader(ds, batch_size=3, sampler=samples, num_workers=num_workers, multiprocessing_context=context)
    assert _epoch(ds, loader) == _expected_records(uniform_folder)


# --- ChunkShuffleSampler ---------------------------------------------------------------


def max_chunks_open(order: np.ndarray, chunk: int, length: int) -> int:
    """Walk an epoch, closing a window each time every chunk seen in it is fully consumed
    after ``window`` chunks; return the most chunks a window had open at once."""
    left = {c: min(chunk, length - c * chunk) for c in range(-(-length // chunk))}
    seen: set[int] = set()
    worst = 0
    for index in order.tolist():
        number = index // chunk
        seen.add(number)
        left[number] -= 1
        worst = max(worst, len(seen))
        if all(left[c] == 0 for c in seen):
            seen = set()
    return worst


def test_window_check_catches_a_plain_shuffle() -> None:
    order = np.random.default_rng(0).permutation(200)
    assert max_chunks_open(order, 10, 200) > 4


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(0, 300),
    chunk=st.integers(1, 40),
    window=st.integers(1, 5),
    seed=st.integers(0, 2**32),
    batch=st.integers(1, 50),
)
def test_chunk_shuffle_is_a_permutation_confined_to_windows(length, chunk, window, seed, batch) -> None:
    sampler = ChunkShuffleSampler(length, chunk_images=chunk, window_chunks=window, seed=seed)
    order = np.array(list(sampler), dtype=np.int64)
    assert len(sampler) == length and sorted(order.tolist()) == list(range(length))
    assert max_chunks_open(order, chunk, length) <= window
    batched = ChunkShuffleSampler(length, chunk_images=chunk, window_chunks=window, seed=seed, batch_size=batch)
    batches = list(batched)
    assert len(batches) == len(batched) == -(-length // batch)
    assert all((np.diff(b) > 0).all() for b in batches)
    assert sorted(np.concatenate(batches or [np.empty(0, np.int64)]).tolist()) == list(range(length))


def test_chunk_shuffle_is_seeded_per_epoch_and_drop_last() -> None:
    sampler = ChunkShuffleSampler(100, chunk_images=10, window_chunks=2, seed=7)
    first, second = list(sampler), list(sampler)
    assert first != second and sorted(first) == sorted(second) == list(range(100))
    sampler.set_epoch(0)
    assert list(sampler) == first
    assert len(list(ChunkShuffleSampler(100, chunk_images=10, seed=7, batch_size=30, drop_last=True))) == 3
    with pytest.raises(InvalidOptionError, match="Invalid window_chunks 0. Use a positive integer."):
        ChunkShuffleSampler(100, chunk_images=10, window_chunks=0)


def test_chunk_shuffle_takes_the_chunk_size_from_the_dataset(raw_h5) -> None:
    out, (chunk_rows, _) = raw_h5
    sampler = ChunkShuffleSampler(HDF5Dataset(out), seed=0)
    assert sampler.chunk_images == (chunk_rows or 12)
    assert torch.tensor(sorted(sampler)).tolist() == list(range(12))
