"""Running the benchmark grid: cached conversions, one fresh process per configuration.

Each configuration runs in a process forked from this (clean) parent — or spawned where
fork is unavailable — so no configuration warms or poisons another. A configuration that
fails (a crashed worker, an exception, a timeout) becomes rows with ``status`` = the reason.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from fastdata._version import __version__
from fastdata.bench.config import BenchConfig, Case
from fastdata.errors import FastdataError, InvalidOptionError, ShapeMismatchError
from fastdata.formats import all_formats, find_manifest, get_format
from fastdata.manifest import disk_usage
from fastdata.images import parse_size
from fastdata.files import remove_path
from fastdata.remote.filesystem import scrub
from fastdata.sources import TORCHVISION_PREFIX, FolderSource, Source

ROW_FIELDS = (
    "format", "store", "read_path", "num_workers", "epoch", "warmup", "samples_per_s", "first_batch_s",
    "wait_fraction", "cpu_s", "uss_mb", "status", "backend",
)


@dataclass
class Prepared:
    """A dataset ready to be read: the source baseline or a (cached) conversion."""

    format: str
    store: str
    path: str
    disk_bytes: int
    conversion_s: float | None = None
    cached: bool = False
    image_size: tuple[int, int] | None = None
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    baseline: bool = False  # the source read as it is (image folder, torchvision dataset)
    remote: str = ""  # read from its URL (``path``) through a cache of the bench's own: "cold" or "warm"

    def files(self) -> tuple[str, ...]:
        if self.remote:
            return ()  # no local file: a cold URL read starts from an emptied cache instead (measure.run_case)
        root = Path(self.path)
        if root.is_file():
            return (str(root),)
        return tuple(sorted(str(p) for p in root.rglob("*") if p.is_file()))


def fingerprint(source: Source) -> str:
    """Changes when the source's description or contents change (its :meth:`~Source.fingerprint`:
    file names, sizes and times of a folder; sampled items of a dataset)."""
    text = json.dumps({"source": source.describe(), "fingerprint": source.fingerprint()}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def prepare_conversion(
    source: Source, source_key: str, spec_name: str, store: str, config: BenchConfig, cache_dir: Path,
    progress: Callable[[str], None],
) -> Prepared:
    """Convert (or reuse the cached conversion of) ``source`` to one format/store."""
    from fastdata.conversion import convert

    spec = get_format(spec_name, writable=True)
    options = {"format": spec_name, "store": store, "resize": config.resize if store == "raw" else None}
    key_text = json.dumps({"source": source_key, "options": options, "fastdata": __version__,
                           "layout": spec.layout_version}, sort_keys=True)
    key = hashlib.sha256(key_text.encode()).hexdigest()[:12]
    output = cache_dir / f"{spec_name}-{store}-{key}{spec.suffix}"
    record_path = cache_dir / f"{spec_name}-{store}-{key}.bench.json"
    if output.exists() and record_path.exists() and find_manifest(output) is not None:
        record = json.loads(record_path.read_text())
        return Prepared(spec_name, store, str(output), disk_usage(output), record["conversion_s"], True,
                        _image_size(output))
    for stale in cache_dir.glob(f"{spec_name}-{store}-*"):  # an older conversion of changed options
        remove_path(stale)  # the bench's own cache: only it writes there
    progress(f"converting to {spec_name} {store}")
    start = time.perf_counter()
    try:
        convert(source, output, overwrite=True, **options)
    except FastdataError as exc:
        return Prepared(spec_name, store, str(output), 0, error=f"conversion failed: {exc}")
    elapsed = time.perf_counter() - start
    record_path.write_text(json.dumps({"key": key_text, "conversion_s": elapsed}))
    return Prepared(spec_name, store, str(output), disk_usage(output), elapsed, False, _image_size(output))


def _image_size(path: Path) -> tuple[int, int] | None:
    manifest = find_manifest(path)
    shape = manifest and manifest["image"].get("shape")
    return (shape[0], shape[1]) if shape else None


def parse_resize(text: str | None) -> tuple[int, int] | None:
    """``--resize`` of the bench: HxW only (encoded and folder reads resize each image to one size,
    so batches can be collated), parsed as ``fastdata convert`` parses it."""
    if text is None:
        return None
    size = parse_size(text, flag="--resize", allow_single=False)
    return size[0], size[1]


def baseline(source_arg: Any, source: Source, options: dict[str, Any]) -> Prepared | None:
    """The source read as it is: an image folder like ImageFolder, or the torchvision dataset."""
    if isinstance(source, FolderSource):
        folder = next(spec.name for spec in all_formats() if spec.baseline)
        return Prepared(folder, "-", str(source.root), disk_usage(source.root), baseline=True)
    if isinstance(source_arg, str) and source_arg.startswith(TORCHVISION_PREFIX):
        kwargs = {"name": source_arg[len(TORCHVISION_PREFIX):], "root": options.get("root"),
                  "split": options.get("split"), "download": options.get("download", False),
                  "options": options.get("source_options")}
        root = options.get("root")
        return Prepared("torchvision", "-", str(root or ""), disk_usage(Path(root)) if root else 0,
                        dataset_kwargs=kwargs, baseline=True)
    return None


def read_paths(prepared: Prepared) -> list[str]:
    """How a format is read: the fast batched path and the standard DataLoader, or a stream."""
    if prepared.baseline:
        return ["standard"]
    spec = get_format(prepared.format)
    # an iterable reader that can collate whole batches itself has a fast path too
    return ["fast", "standard"] if not spec.iterable or spec.self_batching else ["stream"]


def select_formats(names: tuple[str, ...]) -> list[str]:
    known = {spec.name for spec in all_formats()}
    for name in names:
        if name not in known:
            get_format(name)  # raises the standard unknown-format error
    return [name for name in names if not get_format(name).baseline]


# --- one configuration per process ------------------------------------------------------


def _child(case: Case, config: BenchConfig, image_size, connection, single_thread: bool = False) -> None:
    try:
        from fastdata.bench.measure import run_case

        if single_thread:  # forked from a process that may have run torch's OpenMP threads: a parallel
            import torch  # op here would wait forever on threads that did not survive the fork

            torch.set_num_threads(1)

        connection.send({"rows": run_case(case, config, image_size)})
    except BaseException as exc:  # reported as the configuration's status, never raised
        detail = f"{type(exc).__name__}: {exc}".strip()
        connection.send({"error": detail.splitlines()[0][:300], "traceback": traceback.format_exc()})
    finally:
        connection.close()


def _context():
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def run_isolated(case: Case, config: BenchConfig, image_size, *, single_thread: bool = False) -> list[dict[str, Any]]:
    """Run one configuration in a fresh process; failures come back as a failed row.
    ``single_thread``: the parent may have used torch's intra-op threads (``fastdata.sweep`` in
    a user's process), so the child runs torch on one thread, as DataLoader workers do."""
    context = _context()
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(case, config, image_size, sender, single_thread))
    process.start()
    sender.close()
    message = None
    if receiver.poll(config.timeout_s):
        try:
            message = receiver.recv()
        except EOFError:
            message = None
    process.join(5)
    if process.is_alive():
        process.kill()
        process.join()
        if message is None:
            message = {"error": f"timed out after {config.timeout_s:.0f} s"}
    if message is None:
        message = {"error": f"process died with exit code {process.exitcode}"}
    if "rows" in message:
        return [dict(row, status="ok") for row in message["rows"]]
    return [{"epoch": None, "warmup": False, "status": f"failed: {message['error']}"}]


def make_row(case: Case, prepared: Prepared | None, result: dict[str, Any], config: BenchConfig) -> dict[str, Any]:
    row = {name: result.get(name) for name in ROW_FIELDS}
    row.update(format=case.format, store=case.store, read_path=case.path, num_workers=case.num_workers,
               backend=case.backend)
    if case.remote:  # its own row of the table, beside the local copy's
        row.update(store=f"{case.store} url:{case.remote}", location="url", url_cache=case.remote,
                   url=scrub(case.dataset_path))
    extra = {key: value for key, value in result.items() if key not in row}
    row.update(extra)
    row.update(
        batch_size=config.batch_size, step_ms=config.step_ms, transform=config.transform,
        start_method=config.start_method or multiprocessing.get_start_method(), cache=config.cache,
        pin_memory=config.pin_memory, persistent_workers=config.persistent_workers,
        prefetch_factor=config.prefetch_factor, cpu_count=os.cpu_count(),
        disk_bytes=prepared.disk_bytes if prepared else None,
        conversion_s=prepared.conversion_s if prepared else None,
        path=case.path,  # deprecated name of read_path, kept through 0.2 (a conversion's path is a location)
    )
    return row


def check_image_sizes(source: Source, resize: str | None, cache_dir: Path, source_key: str) -> None:
    """Before anything is converted or measured: without ``--resize`` every image of a folder must
    have one size (every read path collates whole batches), else the error names two files and
    the fix. Headers only; the answer is cached per source fingerprint under ``cache_dir``."""
    if resize is not None or not isinstance(source, FolderSource):
        return
    record = cache_dir / f"sizes-{source_key[:12]}.bench.json"
    if record.exists():
        return
    first = None
    for index in range(len(source)):
        try:
            _, width, height = source.header(index)
        except Exception:  # an unreadable file: the conversion and the reads name it
            continue
        if first is None:
            first = (index, height, width)
        elif (height, width) != first[1:]:
            raise ShapeMismatchError(
                f"{source.sample_name(index)} is {height}x{width} (HxW) but {source.sample_name(first[0])} is "
                f"{first[1]}x{first[2]}; every batch the benchmark reads needs one image size. Use --resize HxW "
                "(raw conversions store that size; the folder and encoded rows resize each image as they read it)."
            )
    cache_dir.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"size": list(first[1:]) if first else None}))


def check_source(source: Any) -> None:
    if isinstance(source, (str, os.PathLike)) and not str(source).startswith(TORCHVISION_PREFIX):
        if not Path(source).exists():
            raise InvalidOptionError(f"Source {str(source)!r} does not exist.")


def resolve(source: Any, options: dict[str, Any]) -> Source:
    from fastdata.conversion import open_source
    from fastdata.conversion.options import ConvertOptions

    check_source(source)
    return open_source(source, ConvertOptions(**options))
