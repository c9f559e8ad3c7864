"""Shared fixtures: small image folders generated on the fly (nothing is downloaded), the grid of
writable formats x stores, and a converted dataset of each."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastdata
from fastdata.formats import all_formats, get_format

ROOT = Path(__file__).resolve().parent.parent  # the checkout: what a fastdata subprocess imports

# the format grid, from the registry: every writable format x each of its stores
WRITABLE = [(spec.name, store) for spec in all_formats() if spec.writable for store in spec.stores]
WRITABLE_IDS = [f"{name}-{store}" for name, store in WRITABLE]
WRITABLE_FORMATS = sorted({name for name, _ in WRITABLE})
# the name ending that picks each writable format for an output (out.npy, out.h5, out.tar)
SUFFIXES = {spec.name: spec.suffixes[0] for spec in all_formats() if spec.writable}
FIELD_FORMATS = sorted(spec.name for spec in all_formats() if spec.writable and spec.fields)  # named fields kept


def pattern(height: int, width: int, seed: int, channels: int = 3) -> np.ndarray:
    """A deterministic, compressible-but-not-flat uint8 image."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:height, 0:width]
    base = (xs * (seed % 7 + 1) + ys * (seed % 5 + 2)) % 256
    pixels = np.stack([(base + 40 * c) % 256 for c in range(channels)], axis=-1)
    pixels = pixels + rng.integers(0, 20, pixels.shape)
    return np.clip(pixels, 0, 255).astype(np.uint8)


def photo(height: int, width: int, seed: int = 0, *, detail_px: int = 24, edge_rows: int = 4) -> np.ndarray:
    """A stand-in for a photo (JPEG-friendly, not flat): random colours ``detail_px`` apart,
    smoothly interpolated, and a white band ``edge_rows`` high a third of the way down (a hard
    edge, so a misplaced crop box shows)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(height // detail_px, 2), max(width // detail_px, 2), 3), dtype=np.uint8)
    pixels = np.array(Image.fromarray(small).resize((width, height), Image.BICUBIC))
    pixels[height // 3 : height // 3 + edge_rows] = 255
    return pixels


def psnr(a, b) -> float:
    """The peak signal-to-noise ratio of two uint8 images (tensors or arrays), in dB; inf if equal."""
    mse = float(((np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def save(image: Image.Image, path: Path, **kwargs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, **kwargs)
    return path


def make_folder(root: Path, count: int = 30, *, bad: bool = True, colour_at: int | None = None) -> Path:
    """``count`` PNGs in two classes (pixels encode the index); a file that is no image when ``bad``;
    with ``colour_at``, every image is grayscale except that one."""
    for i in range(count):
        pixels = pattern(10, 12, seed=i)
        image = Image.fromarray(pixels if colour_at in (None, i) else pixels[:, :, 0])
        save(image, root / ("a" if i % 2 else "b") / f"{i:03d}.png")
    if bad:
        (root / "a" / "007-bad.png").write_bytes(b"not a png")
    return root


def class_folder(root: Path, classes: dict[str, int], size: int = 8) -> Path:
    """An image folder with ``classes`` (name -> how many size x size PNGs, ``0000.png`` on)."""
    for number, (name, count) in enumerate(classes.items()):
        for i in range(count):
            save(Image.fromarray(pattern(size, size, seed=number * 1000 + i)), root / name / f"{i:04d}.png")
    return root


def expected_pixels(path: Path, mode: str = "RGB", size: tuple[int, int] | None = None) -> np.ndarray:
    """The HWC pixels the image file ``path`` should be stored as: converted to ``mode``, resized
    bilinearly to ``size`` (H, W) if given (L: one channel kept)."""
    image = Image.open(path).convert(mode)
    if size is not None:
        image = image.resize((size[1], size[0]), Image.BILINEAR)
    array = np.asarray(image)
    return array[:, :, None] if array.ndim == 2 else array


def folder_samples(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """An image folder's samples in the readers' order: its RGB pixels stacked, and its labels."""
    from fastdata.sources import scan_folder

    keys, labels, _ = scan_folder(folder)
    return np.stack([expected_pixels(folder / key) for key in keys]), np.asarray(labels, dtype=np.int64)


@pytest.fixture
def uniform_folder(tmp_path: Path) -> Path:
    """3 classes x 4 RGB PNGs, all 12x10 (HxW): raw-storable without resizing."""
    root = tmp_path / "uniform"
    for label, name in enumerate(["ant", "bee", "cow"]):
        for i in range(4):
            save(Image.fromarray(pattern(12, 10, seed=label * 10 + i)), root / name / f"{i}.png")
    return root


@pytest.fixture
def mixed_folder(tmp_path: Path) -> Path:
    """Mixed sizes, modes (L, RGB, RGBA, P), PNG and JPEG, upper-case extensions, a non-image
    file, a hidden file, a nested folder and a non-ASCII name."""
    root = tmp_path / "mixed"
    save(Image.fromarray(pattern(20, 30, 1)), root / "cat" / "a.png")
    save(Image.fromarray(pattern(25, 18, 2)), root / "cat" / "B.JPG", quality=90)
    save(Image.fromarray(pattern(16, 16, 3)[:, :, 0]), root / "cat" / "gray.png")
    save(Image.fromarray(pattern(14, 22, 4, channels=4)), root / "dog" / "rgba.PNG")
    save(Image.fromarray(pattern(30, 20, 5)).convert("P"), root / "dog" / "palette.png")
    save(Image.fromarray(pattern(18, 18, 6)), root / "dog" / "nested" / "deep.jpeg", quality=85)
    save(Image.fromarray(pattern(21, 19, 7)), root / "dog" / "écureuil-ü.png")
    (root / "dog" / "notes.txt").write_text("not an image")
    save(Image.fromarray(pattern(8, 8, 8)), root / "dog" / ".hidden.png")
    return root


@pytest.fixture
def png_bytes() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pattern(8, 8, 0)).save(buffer, format="PNG")
    return buffer.getvalue()


def convert_to(folder: Path, tmp_path: Path, name: str, store: str, **options) -> Path:
    """``folder`` converted to one format and store under ``tmp_path`` (tar: several shards)."""
    out = tmp_path / f"out-{name}-{store}{get_format(name).suffix}"
    if name == "tar":
        options.setdefault("shard_samples", 5)
    fastdata.convert(folder, out, format=name, store=store, workers=0, **options)
    return out


@pytest.fixture(params=WRITABLE, ids=WRITABLE_IDS)
def converted(request, uniform_folder: Path, tmp_path: Path) -> Path:
    """``uniform_folder`` (12 images, 3 classes) converted to each format and store, fresh per test."""
    return convert_to(uniform_folder, tmp_path, *request.param)


def all_samples(dataset) -> tuple[list[np.ndarray], list[int]]:
    """Every ``(image, label)`` of ``dataset`` in its order: the images as arrays, the labels as ints."""
    images, labels = [], []
    for image, label in dataset:
        images.append(image.numpy())
        labels.append(int(label))
    return images, labels


def output_contents(path: Path) -> dict[str, bytes]:
    """A converted dataset's bytes, file by file (an HDF5 file: dataset by dataset), the manifest
    without its creation time and the seal that covers it: what two conversions of one source share."""
    if path.is_file():
        import h5py

        with h5py.File(path, "r") as file:
            files = {name: file[name][()].tobytes() for name in file if name != "fastdata_manifest"}
            manifest = json.loads(file["fastdata_manifest"][()].tobytes())
    else:
        files = {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
        manifest = json.loads(files.pop("manifest.json"))
    manifest.pop("created")
    manifest.pop("manifest_blake2b")
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return files


def same_samples(remote, local, count: int) -> None:
    """``remote`` and ``local`` give the same ``count`` samples: pixels and labels equal."""
    got, want = all_samples(remote), all_samples(local)
    assert got[1] == want[1] and len(got[0]) == len(want[0]) == count
    assert all(np.array_equal(a, b) for a, b in zip(got[0], want[0]))


def write_idx(path: Path, array: np.ndarray) -> None:
    """MNIST's idx format: magic (0, 0, dtype code 0x08=ubyte, ndim), big-endian dims, data."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def make_mnist(root: Path, train: int = 40, test: int = 15) -> Path:
    """MNIST's real on-disk files (``root/MNIST/raw/*-idx?-ubyte``), random pixels and labels."""
    rng = np.random.default_rng(0)
    raw = root / "MNIST" / "raw"
    for prefix, count in (("train", train), ("t10k", test)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (count, 28, 28)))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, count))
    return root


@pytest.fixture
def mnist_root(tmp_path: Path) -> Path:
    return make_mnist(tmp_path)


# --- the command line in a process of its own ---------------------------------------------------


def start_fastdata(*args: object, cwd: Path | None = None, env: dict[str, str | None] | None = None,
                   **popen: object) -> subprocess.Popen:
    """``python -m fastdata ARGS`` started in a process of its own (for signals, or to watch it
    run), output piped as text unless ``popen`` says otherwise. It imports this checkout's fastdata
    from any ``cwd``: ``PYTHONPATH`` is the checkout, then ``env``'s ``PYTHONPATH`` (modules of the
    test), then this process's. ``env`` changes this process's environment (a value of None
    removes the variable)."""
    changes = dict(env or {})
    paths = [str(ROOT), changes.pop("PYTHONPATH", None) or "", os.environ.get("PYTHONPATH", "")]
    environment = {**os.environ, **changes, "PYTHONPATH": os.pathsep.join(path for path in paths if path)}
    environment = {name: value for name, value in environment.items() if value is not None}
    options = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **popen}
    return subprocess.Popen([sys.executable, "-m", "fastdata", *map(str, args)], cwd=cwd, env=environment, **options)


def finish(process: subprocess.Popen, *, timeout: float = 120, what: str = "fastdata") -> tuple[str, str]:
    """``process``'s (stdout, stderr) once it has ended; a test failure naming it as hung (its
    process group killed if it leads one, its output so far shown) when it has not ended in
    ``timeout`` seconds: the bound catches a hang, it never measures speed."""
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(process)
        stdout, stderr = process.communicate()
        pytest.fail(f"{what} hung: still running after {timeout:g} s\nstdout: {stdout}\nstderr: {stderr}")


def stop(process: subprocess.Popen) -> None:
    """``process`` killed and waited for if it is still running: what a test that started it
    calls however it ends, so that one failing part-way leaves nothing running or writing."""
    if process.poll() is None:
        _kill(process)
        process.communicate()


def _kill(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(process.pid) == process.pid:  # started with start_new_session: its workers too
            os.killpg(process.pid, signal.SIGKILL)
        process.kill()


def run_fastdata(*args: object, cwd: Path | None = None, env: dict[str, str | None] | None = None,
                 timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m fastdata ARGS`` run to its end in a process of its own (see
    :func:`start_fastdata`): exit status, stdout and stderr as text. ``timeout`` bounds a hang
    (see :func:`finish`), it never measures speed."""
    process = start_fastdata(*args, cwd=cwd, env=env, start_new_session=True)
    stdout, stderr = finish(process, timeout=timeout, what=f"fastdata {' '.join(map(str, args))}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def wait_until(condition, what: str, *, process: subprocess.Popen | None = None, timeout_s: float = 120,
               poll_s: float = 0.02) -> None:
    """Until ``condition()`` is true: a wait for another process or thread, not a timing check.
    Fails when ``process`` (if given) ends first, with its output, or when ``what`` has not
    happened after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process is not None:
            assert process.poll() is None, f"the process ended before {what}: {process.communicate()}"
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout_s:g} s"
        time.sleep(poll_s)


def wait_for_checkpoint(process: subprocess.Popen, journal: Path, *, past: int = 0) -> None:
    """Until the conversion ``process``'s journal ``journal`` records a checkpoint past sample
    ``past``. Fails if the conversion ends first, or writes none in 120 s."""
    def written() -> bool:
        try:
            return json.loads(journal.read_text())["next_index"] > past
        except (OSError, ValueError):  # not written yet
            return False

    wait_until(written, "a checkpoint", process=process)


def kill_after_checkpoint(process: subprocess.Popen, journal: Path, *, past: int = 1000,
                          signum: int = signal.SIGKILL) -> int:
    """Send ``signum`` to the conversion ``process`` (started with ``start_new_session=True``, so
    its workers get it too) once its journal ``journal`` records a checkpoint past sample
    ``past``; the last checkpoint's ``next_index`` once the process has ended."""
    try:
        wait_for_checkpoint(process, journal, past=past)
    except BaseException:
        stop(process)
        raise
    os.killpg(process.pid, signum)
    finish(process, timeout=60)
    return json.loads(journal.read_text())["next_index"]


# --- servers on 127.0.0.1 for datasets in object storage (tests/servers.py) ----------------


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server with the bucket ``servers.BUCKET``, reached through ``AWS_ENDPOINT_URL``
    and test credentials in the environment (restored after the module)."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    import logging

    from servers import KEYS, S3, BUCKET

    import s3fs

    saved = {name: os.environ.get(name) for name in [*KEYS, "AWS_ENDPOINT_URL"]}
    s3fs.S3FileSystem.clear_instance_cache()  # filesystems of an earlier module's server (another endpoint)
    server = S3()
    os.environ.update(KEYS, AWS_ENDPOINT_URL=server.endpoint)
    if not server.fs().exists(BUCKET):  # moto keeps its buckets in this process: made by an earlier module
        server.fs().mkdir(BUCKET)
    yield server
    logging.getLogger("werkzeug").removeHandler(server.log)
    server.stop()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def http_root(tmp_path: Path):
    """An HTTP server answering range requests for the files under ``(root, base URL)``."""
    from servers import RangeHandler, serving

    root = tmp_path / "www"
    root.mkdir()
    with serving(RangeHandler, root) as base:
        yield root, base


@pytest.fixture
def region_off(monkeypatch: pytest.MonkeyPatch):
    """The fused decode's region decode switched off, as ``FASTDATA_LIBTURBOJPEG=none`` does."""
    from fastdata.reader import region

    monkeypatch.setenv(region.ENV, "none")
    region.library.cache_clear()
    yield
    region.library.cache_clear()
