"""The conversion's process pool with what its workers inherit from the parent: Parquet on S3 (moto's
server) and over HTTP (a server on 127.0.0.1), whose fsspec filesystems are not fork-safe, and a
Python Dataset that runs torch ops (an OpenMP region in the parent before the fork). Every
conversion runs with the default workers, in a process of its own, bounded so that a hang fails;
a read failure is reported as one, never as a bad image."""

from __future__ import annotations

import http.server
import io
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastdata
from conftest import finish, run_fastdata
from test_parquet import pixels, png  # 6x5 images that encode their row

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

FILES, ROWS, GROUP_ROWS = 3, 40, 16  # 120 rows: more than the pool's threshold (64)
# one file larger than fsspec's read-ahead block (5 MB, which the parent's probe would have fetched whole)
NOISE_ROWS, NOISE_GROUP_ROWS = 480, 20


def write_shards(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for shard in range(FILES):
        indices = range(shard * ROWS, (shard + 1) * ROWS)
        pq.write_table(pa.table({"image": [png(i) for i in indices], "label": [i % 3 for i in indices]}),
                       folder / f"part-{shard}.parquet", row_group_size=GROUP_ROWS)
    return folder


def noise() -> np.ndarray:
    """The images of the one large file: 64x64 noise (PNG keeps it at about 12 KB an image)."""
    return np.random.default_rng(55).integers(0, 256, (NOISE_ROWS, 64, 64, 3), dtype=np.uint8)


def write_noise(path: Path) -> Path:
    images = []
    for array in noise():
        out = io.BytesIO()
        Image.fromarray(array).save(out, "PNG", compress_level=1)
        images.append(out.getvalue())
    pq.write_table(pa.table({"image": images, "label": [i % 3 for i in range(NOISE_ROWS)]}), path,
                   row_group_size=NOISE_GROUP_ROWS)
    return path


def check_output(path: Path, indices: range | None) -> None:
    """The converted rows ``indices`` of the shards (None: the one large file), pixel for pixel."""
    ds = fastdata.open_dataset(path)
    expected = noise() if indices is None else [pixels(index) for index in indices]
    assert len(ds) == len(expected)
    for position, array in enumerate(expected):
        image, label = ds[position]
        assert np.array_equal(image.permute(1, 2, 0).numpy(), array), position
        assert int(label) == (position if indices is None else indices[position]) % 3


def convert_in_a_process(source: str, out: Path, env: dict[str, str] | None = None) -> None:
    """``fastdata convert SOURCE OUT`` with the default workers (the pool: two or more cores)."""
    done = run_fastdata("convert", source, out, "--quiet", env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """``shards/part-{0,1,2}.parquet`` and ``single/noise.parquet`` (over 5 MB) in one folder."""
    root = tmp_path_factory.mktemp("pool")
    (root / "single").mkdir()
    write_noise(root / "single/noise.parquet")
    return write_shards(root / "shards")


WHERE = [("shards/", range(FILES * ROWS)), ("shards/part-*.parquet", range(FILES * ROWS)),
         ("single/noise.parquet", None)]


@pytest.mark.parametrize("where,indices", WHERE, ids=["folder", "glob", "one-file"])
def test_parquet_on_s3_converts_with_the_default_workers(s3, shards: Path, tmp_path: Path, where: str,
                                                         indices: range | None) -> None:
    from servers import upload

    base = upload(s3, shards.parent, "pool")
    out = tmp_path / "out.npy"
    # s3fs reads ahead 50 MB by default: with 1 MB, the parent's probe leaves most of the file unread
    convert_in_a_process(f"{base}/{where}", out, env={"FSSPEC_S3": '{"default_block_size": 1048576}'})
    check_output(out, indices)


class Listing(http.server.SimpleHTTPRequestHandler):
    """Static files with range requests answered 206, folders listed (fsspec's HTTP filesystem
    finds a folder's files and a glob's matches through the links of that listing)."""

    def log_message(self, *args) -> None:  # quiet
        pass

    def send_head(self):
        from servers import RangeHandler

        if Path(self.translate_path(self.path)).is_dir():
            return super().send_head()
        return RangeHandler.send_head(self)


@pytest.fixture(scope="module")
def http_shards(shards: Path):
    from servers import serving

    with serving(Listing, shards.parent) as base:
        yield base


@pytest.mark.parametrize("where,indices", WHERE, ids=["folder", "glob", "one-file"])
def test_parquet_over_http_converts_with_the_default_workers(http_shards: str, tmp_path: Path, where: str,
                                                             indices: range | None) -> None:
    out = tmp_path / "out.npy"
    convert_in_a_process(f"{http_shards}/{where}", out)
    check_output(out, indices)


class FailingReads(http.server.BaseHTTPRequestHandler):
    """One file, whose bytes are served to the first request for them (the parent's probe of the
    first row) and to requests for its footer (the metadata every process reads); every later
    request for its rows is answered 503, as an overloaded server would."""

    data = b""
    footer = 0  # where the footer's bytes begin
    served = 0  # requests for rows answered so far

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.data)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self) -> None:
        import re

        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        start, end = (int(match[1]), min(int(match[2] or len(self.data) - 1), len(self.data) - 1)) if match else \
            (0, len(self.data) - 1)
        cls = type(self)
        if start < cls.footer:
            cls.served += 1
            if cls.served > 1:
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        body = self.data[start : end + 1]
        self.send_response(206 if match else 200)
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(self.data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize("skip_bad", [False, True], ids=["plain", "skip-bad"])
def test_a_read_failure_is_no_bad_image_and_is_not_skipped(tmp_path: Path, skip_bad: bool) -> None:
    from servers import serving

    path = tmp_path / "rows.parquet"  # more rows than the pool's threshold
    pq.write_table(pa.table({"image": [png(i) for i in range(100)], "label": [i % 3 for i in range(100)]}), path,
                   row_group_size=GROUP_ROWS)
    metadata = pq.ParquetFile(path).metadata
    last = metadata.row_group(metadata.num_row_groups - 1).column(1)
    FailingReads.data, FailingReads.served = path.read_bytes(), 0
    FailingReads.footer = last.data_page_offset + last.total_compressed_size
    with serving(FailingReads) as base:
        out = tmp_path / "out.npy"
        done = run_fastdata("convert", f"{base}/rows.parquet", out, "--workers", "2",
                            *(["--skip-bad"] if skip_bad else []), timeout=240)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"fastdata: error: {base}/rows.parquet: cannot be read (ClientResponseError: 503"), \
        lines[0]
    assert lines[0].endswith("This is a read failure, not a damaged sample (--skip-bad (skip_bad=True) does not skip it): check the "
                             "network or the disk, then run again.")
    assert not out.exists()


TORCH_DATASET = """
import sys
import torch
import fastdata

class Full(torch.utils.data.Dataset):
    def __len__(self):
        return 80

    def __getitem__(self, index):  # torch.full runs an OpenMP region (more than one intra-op thread)
        return torch.full((3, 224, 224), index, dtype=torch.uint8), index % 3

print(fastdata.convert(Full(), sys.argv[1])["count"])
"""


def test_a_dataset_of_torch_ops_converts_with_the_default_workers(tmp_path: Path) -> None:
    """The pool forks after the parent read the first sample, which ran an OpenMP region; the
    workers must not hang in their own (torch on one thread there, as in the loader's workers)."""
    import subprocess

    out = tmp_path / "out.npy"
    process = subprocess.Popen([sys.executable, "-c", TORCH_DATASET, str(out)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True,
                               env=_environment())
    stdout, stderr = finish(process, timeout=240, what="fastdata.convert of a Dataset of torch ops")
    assert process.returncode == 0, stderr
    assert stdout.split() == ["80"]
    ds = fastdata.open_dataset(out)
    assert len(ds) == 80
    for index in range(80):
        image, label = ds[index]
        assert image.shape == (3, 224, 224) and bool((image == index).all()), index
        assert int(label) == index % 3


def _environment() -> dict[str, str]:
    import os

    from conftest import ROOT

    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}


# --- memory and the order of checks --------------------------------------------------------


GROUP_ROWS_LARGE = 3000  # 38 KB images: a single row group of 110 MB

MEMORY = """
import sys
import fastdata, fastdata.conversion, fastdata.sources.parquet, pyarrow.parquet

def high_water():  # this process's peak RSS (VmHWM: ru_maxrss would include the parent's, kept across exec)
    line = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024

before = high_water()
fastdata.convert(sys.argv[1], sys.argv[2], workers=0, store="encoded")
print(high_water() - before)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak RSS from /proc")
def test_converting_one_large_row_group_holds_it_once_not_several_times(tmp_path: Path) -> None:
    """The peak memory a conversion adds, converting a file that is one 110 MB row group: under
    twice the group (it was 4.4 times: the group in Arrow, as Python lists, a probe's second read)."""
    import subprocess

    tile = np.random.default_rng(9).integers(0, 256, (100, 128, 3), dtype=np.uint8)
    images = []
    for index in range(GROUP_ROWS_LARGE):
        tile[0, 0, 0] = index % 256
        out = io.BytesIO()
        Image.fromarray(tile).save(out, "PNG", compress_level=0)
        images.append(out.getvalue())
    group_bytes = sum(map(len, images))
    path = tmp_path / "group.parquet"
    pq.write_table(pa.table({"image": images, "label": [i % 3 for i in range(GROUP_ROWS_LARGE)]}), path,
                   row_group_size=GROUP_ROWS_LARGE)
    del images
    process = subprocess.Popen([sys.executable, "-c", MEMORY, str(path), str(tmp_path / "out.npy")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_environment())
    stdout, stderr = finish(process, timeout=240, what="the conversion of one large row group")
    assert process.returncode == 0, stderr
    added = int(stdout.split()[-1])
    assert added < 2 * group_bytes, (added, group_bytes)
    assert len(fastdata.open_dataset(tmp_path / "out.npy")) == GROUP_ROWS_LARGE


def test_a_locked_output_is_refused_before_the_source_is_opened(tmp_path: Path) -> None:
    import os

    from fastdata.conversion.locks import ConversionLock
    from fastdata.errors import OutputLockedError

    out = tmp_path / "out.npy"
    with ConversionLock(out):
        with pytest.raises(OutputLockedError, match=rf"^Another conversion is writing '{out}' \(process {os.getpid()} "):
            fastdata.convert(tmp_path / "not-there.parquet", out)
