"""The contract every writable storage format keeps, written once: :class:`FormatContract`.

A format's test file subclasses it, names the format, and supplies small hooks: how to damage
one of its data files (to test that readers name the damage), and, where its layout differs
from a directory with a ``manifest.json``, how to rewrite its manifest (to test the version
check). fastdata's own test suite also takes the hooks ``stored_bytes``, ``reseal``,
``set_label``, ``garble_sample`` and ``sample_file`` (the damage its checksums are made to agree
with) of each format's subclass from :data:`CONTRACTS`. pytest then runs every test below for
that format and each of its stores.

The source of every dataset here is :class:`Numbered`: pixels that spell each sample's index,
so a sample read twice, lost, mixed up with another or given the wrong label is caught.
"""

from __future__ import annotations

import json
import pickle
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from fastdata import loading
from fastdata.api import open_dataset
from fastdata.conversion import convert
from fastdata.errors import BadSampleError, CorruptDataError, OutputExistsError, VersionMismatchError
from fastdata.extras import require
from fastdata.formats import find_manifest, get_format
from fastdata.manifest import describe_file, write_manifest
from fastdata.verification import verify

pytest = require("pytest", extra="testing", feature="fastdata.testing (the format contract suite)")

COUNT = 47  # prime: every batch size, shard size and worker count leaves a remainder
CLASSES = 5
BATCH = 5
SIDE = 4
EXPECTED = Counter((i, i % CLASSES) for i in range(COUNT))
# every subclass that names a format, by format name (fastdata's own tests take each format's hooks here)
CONTRACTS: dict[str, type] = {}


def sample_pixels(index: int) -> np.ndarray:
    """Sample ``index``'s 4x4 RGB pixels: red spells the index, green/blue vary per pixel."""
    pixels = np.empty((SIDE, SIDE, 3), dtype=np.uint8)
    pixels[:, :, 0] = index
    pixels[:, :, 1] = (np.arange(SIDE * SIDE).reshape(SIDE, SIDE) * 13 + index * 7) % 256
    pixels[:, :, 2] = 255 - index
    return pixels


class Numbered(torch.utils.data.Dataset):
    """A plain map-style source (no ``.data`` fast path): ``(HWC uint8 array, index % CLASSES)``,
    with class names, like a torchvision dataset."""

    classes = [f"class{i}" for i in range(CLASSES)]

    def __len__(self) -> int:
        return COUNT

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        if not 0 <= index < COUNT:
            raise IndexError(index)
        return sample_pixels(index), index % CLASSES


class FailsAt(torch.utils.data.Dataset):
    def __init__(self, bad: int):
        self.bad = bad

    def __len__(self):
        return 300

    def __getitem__(self, i):
        if i == self.bad:
            raise OSError("disk went away")
        return np.full((4, 4, 3), i % 256, dtype=np.uint8), i % 3


def records(loader, seen_order: list[int]) -> Counter:
    """The multiset of (index spelled by the pixels, label) one pass over ``loader`` yields;
    every image must equal the source pixels of the index it spells, not only its red channel."""
    found: Counter = Counter()
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, SIDE, SIDE)
        assert labels.dtype == torch.int64 and len(labels) == len(images)
        for image, label in zip(images.permute(0, 2, 3, 1).numpy(), labels.tolist()):
            index = int(image[0, 0, 0])
            np.testing.assert_array_equal(image, sample_pixels(index), err_msg=f"sample {index}")
            found[(index, label)] += 1
            seen_order.append(index)
    return found


def check_epochs(make_loader, shuffle: bool, *, in_order: bool = False, epochs: int = 2) -> None:
    """``epochs`` passes each yield every sample exactly once; a shuffled pass is not in index
    order, and with ``in_order`` an unshuffled pass is."""
    for epoch in range(epochs):
        order: list[int] = []
        found = make_loader(epoch, order)
        missing, extra = EXPECTED - found, found - EXPECTED
        assert not missing and not extra, f"epoch {epoch}: missing {sorted(missing)}, extra {sorted(extra)}"
        if shuffle:
            assert order != sorted(order), f"epoch {epoch}: shuffle=True read in index order"
        elif in_order:
            assert order == list(range(COUNT)), f"epoch {epoch}: shuffle=False read out of index order"


class Layouts(torch.utils.data.Dataset):
    """Several readers as one map-style dataset, read a batch at a time: ``dataset[indices]`` is
    ``(images, labels, layouts)``, each sample's layout its reader's position in ``readers``."""

    supports_index_arrays = True

    def __init__(self, readers: list) -> None:
        self.readers = readers
        self.ends = np.cumsum([len(reader) for reader in readers])

    def __len__(self) -> int:
        return int(self.ends[-1])

    def __getitem__(self, indices) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        indices = np.asarray(indices)
        layouts = np.searchsorted(self.ends, indices, side="right")
        starts = np.concatenate([[0], self.ends[:-1]])
        batches = [self.readers[layout][(indices[layouts == layout] - starts[layout]).tolist()]
                   for layout in np.unique(layouts)]
        return (torch.cat([images for images, _ in batches]), torch.cat([labels for _, labels in batches]),
                torch.from_numpy(np.sort(layouts, kind="stable")))


def workers(num_workers: int, context: str = "fork") -> dict:
    return {"num_workers": num_workers, "multiprocessing_context": context if num_workers else None}


# num_workers=3 on a 2-core machine: torch warns that it suggests fewer workers (warnings are errors)
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
class FormatContract:
    """Subclass with ``format = "<name>"`` and the hooks below; see the module docstring."""

    format: str = ""
    # extra conversions with their own read path: id -> (store, format options)
    layouts: dict[str, tuple[str, dict]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.format:
            CONTRACTS[cls.format] = cls
            if not get_format(cls.format).iterable:  # nothing to collect, rather than a skip per case
                cls.test_iterable_reader_yields_every_sample_once_across_ranks = None

    # --- hooks a format supplies --------------------------------------------------------

    def rewrite_manifest(self, out: Path, change: dict) -> None:
        """Store the manifest with ``change`` applied (directory formats: manifest.json)."""
        manifest = json.loads((out / "manifest.json").read_text())
        (out / "manifest.json").write_text(json.dumps({**manifest, **change}))

    def damage(self, out: Path) -> str:
        """Damage a data file so that reading fails; return what the error must contain."""
        raise NotImplementedError

    @staticmethod
    def stored_bytes(out: Path) -> list[bytes]:
        """Each sample's encoded bytes as stored, read without fastdata (test_properties)."""
        raise NotImplementedError

    # damage the recorded checksums agree with (test_verify takes these from the registry's formats)

    @staticmethod
    def reseal(out: Path) -> None:
        """Recompute every checksum the dataset records from its current content, as a writer
        would (directory formats: the manifest's ``files``)."""
        manifest = find_manifest(out)
        manifest["files"] = {name: describe_file(out / name) for name in manifest["files"]}
        write_manifest(out, manifest)

    @classmethod
    def set_label(cls, out: Path, sample: int, label: int) -> None:
        """Store ``label`` as the label of ``sample`` (where the readers take it from), resealed."""
        raise NotImplementedError

    @classmethod
    def garble_sample(cls, out: Path, sample: int) -> None:
        """Overwrite an encoded sample's bytes (same length, offsets kept) with b"x", resealed."""
        raise NotImplementedError

    @staticmethod
    def sample_file(out: Path, sample: int) -> Path:
        """The file that holds ``sample``'s bytes (the path verify names for it)."""
        raise NotImplementedError

    # --- fixtures -------------------------------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def converted_layouts(cls, tmp_path_factory) -> dict[str, Path]:
        """Every store (and extra layout) of this format, converted once from :class:`Numbered`
        (read-only: tests that change a dataset take :meth:`converted`, a fresh copy)."""
        spec = get_format(cls.format)
        layouts = {store: (store, {}) for store in spec.stores} | cls.layouts
        done = {}
        for key, (store, options) in layouts.items():
            out = tmp_path_factory.mktemp(f"{cls.format}-{key}") / f"data{spec.suffix}"
            manifest = convert(Numbered(), out, format=cls.format, store=store, workers=0, **options)
            assert manifest["count"] == COUNT and manifest["classes"] == Numbered.classes
            done[key] = out
        return done

    @pytest.fixture(params=["raw", "encoded"])
    def converted(self, request, converted_layouts, tmp_path: Path) -> Path:
        """A fresh copy of one store's dataset, free to change."""
        if request.param not in converted_layouts:
            pytest.skip(f"{self.format} has no {request.param} store")
        source = converted_layouts[request.param]
        copy = tmp_path / "copy" / source.name
        copy.parent.mkdir()
        (shutil.copytree if source.is_dir() else shutil.copy)(source, copy)
        return copy

    def map_style(self, out: Path):
        return get_format(self.format).map_dataset(out)

    # --- the contract -----------------------------------------------------------------------

    def test_round_trip_len_classes_and_manifest(self, converted) -> None:
        ds = open_dataset(converted)
        manifest = find_manifest(converted)
        assert manifest["count"] == COUNT and manifest["format"] == self.format
        assert manifest["files"] and all("blake2b" in entry for entry in manifest["files"].values())
        assert ds.classes == Numbered.classes and ds.class_to_idx == {n: i for i, n in enumerate(Numbered.classes)}
        if isinstance(ds, IterableDataset):
            found = Counter((int(image[0, 0, 0]), label) for image, label in ds)
            assert found == EXPECTED
        reader = self.map_style(converted)
        assert len(reader) == COUNT
        for index in range(COUNT):
            image, label = reader[index]
            np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), sample_pixels(index))
            assert label == index % CLASSES

    def test_targets_and_repr_like_torchvision(self, converted_layouts) -> None:
        for store, out in converted_layouts.items():
            for ds in {open_dataset(out), self.map_style(out)}:
                assert ds.targets == [index % CLASSES for index in range(COUNT)]
                assert ds.targets == ds.labels.tolist()
                lines = repr(ds).splitlines()
                manifest_store = find_manifest(out)["store"]
                assert lines[:4] == [f"Dataset {type(ds).__name__}", f"    Number of datapoints: {COUNT}",
                                     f"    Root location: {out}",
                                     f"    Stored: {self.format} {manifest_store}, " + ("" if manifest_store != "raw" else
                                                                                         f"{SIDE}x{SIDE} ") + "RGB"]
                assert lines[4:] == [f"    Classes: {CLASSES}", "    Output: tensor"]

    def test_pickled_reader_reads_the_same(self, converted) -> None:
        reader = self.map_style(converted)
        reader[0]  # open its files first: they must not travel with the pickle
        clone = pickle.loads(pickle.dumps(reader))
        assert all(torch.equal(clone[i][0], reader[i][0]) for i in range(COUNT))

    @pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
    @pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
    def test_map_style_reader_yields_every_sample_once(self, converted_layouts, num_workers: int,
                                                       shuffle: bool) -> None:
        """With the standard DataLoader, every layout, two epochs (fastdata.loader: the backend
        test below, whose batches equal those of one checked here the same way)."""
        for out in converted_layouts.values():
            standard = DataLoader(self.map_style(out), batch_size=BATCH, shuffle=shuffle, **workers(num_workers))
            check_epochs(lambda epoch, order: records(standard, order), shuffle, in_order=True)

    @pytest.mark.parametrize("world_size", [1, 2, 3])
    @pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
    @pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
    def test_iterable_reader_yields_every_sample_once_across_ranks(self, converted_layouts, num_workers: int,
                                                                   shuffle: bool, world_size: int) -> None:
        """The union over ranks (one DataLoader each, as DDP runs them) is the dataset."""
        spec = get_format(self.format)
        for out in converted_layouts.values():
            def epoch_over_ranks(epoch: int, order: list[int]) -> Counter:
                found: Counter = Counter()
                for rank in range(world_size):
                    ds = spec.dataset(out, shuffle=shuffle, seed=7, shuffle_buffer=8, rank=rank,
                                      world_size=world_size)
                    ds.set_epoch(epoch)
                    found += records(DataLoader(ds, batch_size=BATCH, **workers(num_workers)), order)
                return found

            # workers interleave, and ranks are read one after the other: in order only on one process
            check_epochs(epoch_over_ranks, shuffle, in_order=num_workers <= 1 and world_size == 1)

    @pytest.mark.parametrize("backend", ["torch", "thread", "process"])
    def test_every_backend_yields_the_batches_of_num_workers_0(self, converted_layouts, backend: str) -> None:
        """Same batches, same order, exactly once, for every num_workers 0-3 and shuffle."""
        for out in converted_layouts.values():
            reader = self.map_style(out)
            for shuffle in (False, True):
                # the reference, num_workers=0, is read as the DataLoader is above: every sample once, two
                # epochs, in index order unless shuffled
                reference_loader = loading.loader(reader, batch_size=BATCH, shuffle=shuffle, seed=11)
                check_epochs(lambda epoch, order: records(reference_loader, order), shuffle, in_order=True)
                reference_loader.sampler.set_epoch(0)
                reference = [(images.clone(), labels.clone()) for images, labels in reference_loader]
                assert Counter((int(i[0, 0, 0]), int(l)) for b in reference for i, l in zip(*b)) == EXPECTED
                for num_workers in (0, 1, 2, 3):
                    loader = loading.loader(reader, batch_size=BATCH, shuffle=shuffle, seed=11, backend=backend,
                                             num_workers=num_workers, persistent_workers=num_workers > 0)
                    for epoch in range(2):  # persistent workers serve a second epoch too
                        loader.sampler.set_epoch(0)
                        got = list(loader)
                        assert len(got) == len(reference), (backend, num_workers, shuffle)
                        for (images, labels), (want_images, want_labels) in zip(got, reference):
                            assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
                    getattr(loader, "close", lambda: None)()

    def test_spawned_workers_after_the_parent_read(self, converted_layouts) -> None:
        """Every layout, read through one pool of spawned workers (one start-up for all)."""
        readers = [self.map_style(out) for out in converted_layouts.values()]
        for reader in readers:
            reader[0]  # the parent opens its files first; workers must open their own
        loader = loading.loader(Layouts(readers), batch_size=BATCH, shuffle=True, seed=5, **workers(2, "spawn"))
        found: Counter = Counter()
        for images, labels, layouts in loader:
            for image, label, layout in zip(images.permute(0, 2, 3, 1).numpy(), labels.tolist(), layouts.tolist()):
                index = int(image[0, 0, 0])
                np.testing.assert_array_equal(image, sample_pixels(index), err_msg=f"layout {layout}, sample {index}")
                found[(layout, index, label)] += 1
        assert found == Counter((layout, i, i % CLASSES) for layout in range(len(readers)) for i in range(COUNT))

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_failure_mid_write_leaves_nothing(self, tmp_path: Path, num_workers: int) -> None:
        for store in get_format(self.format).stores:
            with pytest.raises(BadSampleError, match="sample 250: cannot load sample \\(disk went away\\)"):
                # mode and size are given, so no scan pass runs: the failure comes after batches were written
                convert(FailsAt(250), tmp_path / "out", format=self.format, store=store,
                                 workers=num_workers, mode="RGB", resize="4x4")
            assert list(tmp_path.iterdir()) == []

    def test_existing_output_refused_without_overwrite(self, tmp_path: Path) -> None:
        out = tmp_path / "out"
        convert(Numbered(), out, format=self.format, workers=0)
        before = sorted(p.name for p in tmp_path.rglob("*"))
        with pytest.raises(OutputExistsError, match=r"already exists\. Pass --overwrite \(overwrite=True\) to replace it\."):
            convert(Numbered(), out, format=self.format, workers=0)
        assert sorted(p.name for p in tmp_path.rglob("*")) == before
        convert(Numbered(), out, format=self.format, store="encoded", workers=0, overwrite=True)
        assert find_manifest(out)["store"] == "encoded"

    def test_unknown_layout_version_is_refused(self, converted) -> None:
        self.rewrite_manifest(converted, {"layout_version": 99})
        version = get_format(self.format).layout_version
        message = f"'{self.format}' layout version 99 is not supported; this fastdata reads layout version {version}"
        with pytest.raises(VersionMismatchError, match=message):
            open_dataset(converted)
        with pytest.raises(VersionMismatchError, match=message):
            self.map_style(converted)
        self.rewrite_manifest(converted, {"layout_version": version})
        assert len(self.map_style(converted)) == COUNT

    def test_damaged_data_is_named(self, converted_layouts, tmp_path: Path) -> None:
        for key, out in converted_layouts.items():
            copy = tmp_path / key / out.name
            copy.parent.mkdir()
            (shutil.copytree if out.is_dir() else shutil.copy)(out, copy)
            expected = self.damage(copy)
            with pytest.raises(CorruptDataError, match=expected):
                reader = self.map_style(copy)
                [reader[i] for i in range(COUNT)]
            assert not verify(copy).ok
