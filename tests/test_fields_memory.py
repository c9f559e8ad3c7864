"""A converted detection dataset's reader (image + variable boxes + labels) keeps its per-sample
metadata in numpy arrays (offsets, sizes), not Python objects: its workers' memory does not grow
over epochs, and the reader sent to each worker is small (beyond those arrays, its pickled size
does not grow with the sample count, and reading does not add to it). Measured as
tests/test_memory.py measures (USS of 2 persistent workers in a fresh interpreter, after a
warm-up, at the end of epoch 1 and of epoch 3), not timed. The batches are padded (``pad=True``,
in the workers, after the reader has made each sample's boxes and labels): two tensors a batch
reach the parent instead of two per sample, each its own shared-memory segment to hand over,
which would make the parent, not the reader, the measurement's cost."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision import tv_tensors

import fastdata
from conftest import FIELD_FORMATS, finish, stop
from fastdata.formats import get_format
from test_memory import BOUND_BYTES, TESTS, growth_report, worker_uss

COUNT = 20_000
FORMATS = {name: get_format(name).map_dataset for name in FIELD_FORMATS}  # format -> its map-style reader
# Per-sample index columns a reader may hold as int64 arrays (the tar index's shard, offsets and
# sizes of the image and of each field member: 9 columns here, and the image member's extension as
# a fixed-width str, 4 bytes a character); the field data itself never.
ARRAY_BYTES_PER_SAMPLE = 8 * 9 + 4 * 4


class Detection:
    """``count`` samples as ``wrap_dataset_for_transforms_v2(CocoDetection(...))`` gives them:
    a 2x2 image (so mapped pixel pages stay far under the bound) and 0-3 boxes with their labels."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        rows = index % 4
        boxes = np.arange(4 * rows, dtype=np.float32).reshape(rows, 4) + np.float32(index % 1000)
        return np.full((2, 2, 3), index % 251, np.uint8), {
            "boxes": tv_tensors.BoundingBoxes(torch.from_numpy(boxes), format="XYXY", canvas_size=(2, 2)),
            "labels": torch.arange(rows, dtype=torch.int64) + index % 80}


@pytest.fixture(scope="module")
def detection(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("detection-memory")
    paths = {"npy": root / "det.npy"}
    fastdata.convert(Detection(COUNT), paths["npy"], store="raw", workers=0)
    for name in ("hdf5", "tar"):
        paths[name] = root / f"det.{name}"
        fastdata.convert(paths["npy"], paths[name], format=name, store="raw", workers=0)
    return paths


@pytest.fixture(scope="module")
def measuring(detection) -> dict[str, subprocess.Popen]:
    """Each format's measurement (this module run as a script in a fresh interpreter), all started
    at once: USS is per process, so running them side by side changes no figure, and they overlap
    instead of queueing."""
    running: dict[str, subprocess.Popen] = {}
    try:
        for name in sorted(FORMATS):
            running[name] = subprocess.Popen([sys.executable, "-m", "test_fields_memory", str(detection[name]), name],
                                             cwd=TESTS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                             start_new_session=True)
        yield running
    finally:
        for process in running.values():
            stop(process)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_detection_readers_workers_do_not_grow_over_three_epochs(measuring, name: str) -> None:
    stdout, stderr = finish(measuring[name], timeout=900, what=f"the {name} measurement")
    assert measuring[name].returncode == 0, stderr
    history = np.array(json.loads(stdout.splitlines()[-1]))
    assert (history - history[0]).max() < BOUND_BYTES, growth_report(history)


class _Measured(pickle.Pickler):
    """A pickler that adds up the bytes of the numpy arrays it pickles."""

    array_bytes = 0

    def reducer_override(self, obj):
        if isinstance(obj, np.ndarray):
            self.array_bytes += obj.nbytes
        return NotImplemented


def pickled(dataset) -> tuple[int, int]:
    """(pickled size, of which numpy arrays' bytes) of ``dataset``: what a worker is sent."""
    buffer = io.BytesIO()
    pickler = _Measured(buffer)
    pickler.dump(dataset)
    return len(buffer.getvalue()), pickler.array_bytes


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_the_reader_sent_to_workers_grows_with_the_samples_only_by_its_index_arrays(tmp_path: Path, name: str) -> None:
    sizes = {}
    for count in (1000, 4000):
        out = tmp_path / f"det{count}.{name}"
        fastdata.convert(Detection(count), out, format=name, store="raw", workers=0)
        ds = FORMATS[name](out)
        fresh = pickled(ds)
        ds[0], ds[np.arange(0, count, 7)]  # reading maps files and loads offsets: none of it may be pickled
        next(iter(fastdata.loader(ds, batch_size=64, shuffle=False, pad=True)))
        sizes[count] = pickled(ds)
        grown = sizes[count][1] - fresh[1]
        assert grown <= 8 * 2 * (count + 1), (fresh, sizes[count])  # at most the two fields' offsets, loaded on use
    (small, small_arrays), (large, large_arrays) = sizes[1000], sizes[4000]
    # no per-sample Python objects: even one repeated str per sample costs >= 2 bytes each (6,000 here);
    # what grows is per shard (tar shard names and their checksums in the manifest: ~400 bytes)
    assert abs((large - large_arrays) - (small - small_arrays)) < 1024, sizes
    assert large_arrays - small_arrays <= ARRAY_BYTES_PER_SAMPLE * 3000, sizes  # index columns, not field data


if __name__ == "__main__":  # the measurement, in the fresh interpreter the test starts
    path, name = sys.argv[1:]
    options = {"num_workers": 2, "persistent_workers": True, "multiprocessing_context": "fork", "pad": True}
    print(json.dumps(worker_uss(fastdata.loader(FORMATS[name](path), batch_size=64, shuffle=False, **options))))
