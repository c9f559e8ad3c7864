"""``fastdata bench``: every format x store x read path x num_workers, measured on this machine.

The grid is declared by :class:`BenchConfig`; :func:`run_bench` converts the source to each
format (cached), runs each configuration in a fresh process, and writes ``results.json``,
``results.csv`` and ``throughput.png``. The recommendation, table, reasons and plot are
rendered from those rows (:mod:`~fastdata.bench.summary`, :mod:`~fastdata.bench.report`,
:mod:`~fastdata.bench.plot`); the plain-words reasons, which ``fastdata tune`` gives too, come
from :mod:`~fastdata.bench.explain`, and ``--demo``'s seeded image folder from
:mod:`~fastdata.bench.demo`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fastdata.bench.advice import how_to_use
from fastdata.bench.autorow import AUTO, auto_dataset, auto_summary
from fastdata.bench.config import BenchConfig, Case, auto_workers, parse_workers
from fastdata.bench.plot import plot
from fastdata.bench.report import table, verdicts, write_results
from fastdata.bench.runner import (
    Prepared, baseline, check_image_sizes, fingerprint, make_row, parse_resize, prepare_conversion, read_paths,
    resolve, run_isolated, select_formats,
)
from fastdata.bench.summary import URL_MARK, summary_document
from fastdata.errors import InvalidOptionError
from fastdata.formats import find_manifest, get_format
from fastdata.loading.backends import DEFAULT_BACKEND
from fastdata.machine import machine_info
from fastdata.manifest import disk_usage
from fastdata.remote.filesystem import scrub

__all__ = ["BenchConfig", "BenchResult", "auto_workers", "bench_dataset", "machine_info", "parse_workers", "run_bench"]

TRANSFER_PROBE_BATCHES = 50


@dataclass
class BenchResult:
    """What :func:`run_bench` measured and wrote.

    ``rows``: one per configuration and epoch (``results.json``'s ``rows``); ``summary``: per
    row the median and spread of its epochs, its best num_workers, the recommendation and
    warnings (``results.json``'s ``summary``); ``recommendation``: its one sentence (None when
    nothing was measured); ``table`` and ``verdicts`` (the short reasons): the text
    ``fastdata bench`` prints; ``plot``: ``throughput.png``, None when not written (no
    matplotlib, or nothing measured); ``conversions``: format, store, dataset path, size on disk
    and conversion time of each converted dataset."""

    rows: list[dict[str, Any]]
    table: str
    verdicts: list[str]
    out: Path
    plot: Path | None
    conversions: list[dict[str, Any]]
    summary: dict[str, Any]
    document: dict[str, Any]  # results.json as written

    @property
    def recommendation(self) -> str | None:
        choice = self.summary["recommendation"]
        return choice["text"] if choice else None

    @property
    def backends(self) -> str | None:
        """One line: what fastdata's thread and process backends change against the DataLoader's
        workers (``summary["backends"]``; None where they were not measured beside it)."""
        effect = self.summary.get("backends")
        return effect["text"] if effect else None

    @property
    def remote(self) -> str | None:
        """One line: how reading from the URL shifted the best num_workers against the local copy
        (``summary["remote"]``; None where the source was not a URL)."""
        effect = self.summary.get("remote")
        return effect["text"] if effect else None

    @property
    def auto(self) -> str | None:
        """One line: ``num_workers="auto"`` against the best fixed setting, what it chose and when it
        settled (``results.json``'s ``auto``; None where it was not measured)."""
        effect = self.document.get("auto")
        return effect["text"] if effect else None

    @property
    def warnings(self) -> list[str]:
        return self.summary["warnings"]

    @property
    def all_failed(self) -> bool:
        """True when no configuration was measured (``fastdata bench`` exits 1 then)."""
        return self.summary["recommendation"] is None

    @property
    def failed(self) -> list[dict[str, Any]]:
        """Every configuration that failed (``summary["failed"]``: format, store, read_path,
        backend, num_workers, reason); ``fastdata bench`` exits 1 when there is any."""
        return self.summary["failed"]


def _prepare(source_arg: Any, config: BenchConfig, out: Path, source_options: dict[str, Any],
             progress: Callable[[str], None]) -> tuple[list[Prepared], str | None]:
    existing = find_manifest(Path(source_arg)) if isinstance(source_arg, (str, os.PathLike)) and \
        not str(source_arg).startswith("torchvision:") and Path(source_arg).exists() else None
    source = resolve(source_arg, source_options)
    prepared: list[Prepared] = []
    base = baseline(source_arg, source, source_options)
    if base is None and existing and existing.get("source", {}).get("type") == "folder" and \
            Path(existing["source"]["path"]).is_dir():
        base = baseline(existing["source"]["path"], resolve(existing["source"]["path"], {}), {})
    if base is not None:
        prepared.append(base)
    source_key = fingerprint(source)
    cache_dir = out / "datasets"
    check_image_sizes(source, config.resize, cache_dir, source_key)
    cache_dir.mkdir(parents=True, exist_ok=True)
    for name in select_formats(config.formats):
        for store in config.stores:
            if store not in get_format(name).stores:
                continue
            if existing and existing["format"] == name and existing["store"] == store:
                prepared.append(Prepared(name, store, str(source_arg), disk_usage(Path(source_arg)),
                                         image_size=parse_resize(config.resize)))
                continue
            prepared.append(prepare_conversion(source, source_key, name, store, config, cache_dir, progress))
    reference = base.format if base else (f"{existing['format']}" if existing else None)
    return prepared, reference


def _remote_twins(prepared: list[Prepared], source: Any, url: str, config: BenchConfig, out: Path) -> list[Prepared]:
    """The converted dataset ``source`` (the local copy of ``url``) read from ``url`` itself, when its
    format streams (tar); npy and HDF5 readers fetch every file at open, so their epochs would be
    the local copy's."""
    twins = []
    for item in prepared:
        if item.baseline or item.path != str(source) or not get_format(item.format).iterable:
            continue
        kwargs = dict(item.dataset_kwargs, cache_dir=str(out / "remote-cache"))
        twins.append(dataclasses.replace(item, path=url, dataset_kwargs=kwargs, remote=config.cache))
    return twins


def _probe_case(prepared: list[Prepared], config: BenchConfig) -> list[Case]:
    """The transfer probe: a trivial dataset with the benchmark's batch shape, nw=0 and nw>0."""
    size = parse_resize(config.resize) or next((p.image_size for p in prepared if p.image_size), None)
    with_workers = [w for w in config.workers if w > 0]
    if size is None or not with_workers:
        return []
    channels = 3
    for item in prepared:
        manifest = find_manifest(Path(item.path)) if not item.baseline else None
        if manifest:
            channels = manifest["image"]["channels"]
            break
    shape = [config.batch_size, channels, *size]
    kwargs = {"batches": TRANSFER_PROBE_BATCHES, "shape": shape}
    return [Case("probe", "-", "transfer", w, "", kwargs) for w in (0, min(with_workers))]


def _grid(item: Prepared, config: BenchConfig) -> list[tuple[str, str, int]]:
    """(read path, backend, num_workers) of one prepared dataset. The thread and process
    backends apply to the fast path of map-style readers, with workers (at num_workers=0 every
    backend computes in the main thread: the torch row measures it)."""
    grid = []
    for path in read_paths(item):
        for backend in config.backends:
            if backend != DEFAULT_BACKEND and (path != "fast" or item.baseline or get_format(item.format).iterable):
                continue
            grid += [(path, backend, workers) for workers in config.workers if backend == DEFAULT_BACKEND or workers > 0]
    return grid


def run_bench(
    source: Any,
    config: BenchConfig,
    out: str | os.PathLike,
    *,
    source_options: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    on_case: Callable[[Case, int, int], None] | None = None,
    url: str | None = None,
) -> BenchResult:
    """Measure every configuration of ``config`` on ``source``; write results under ``out``.

    ``source``: an image folder, ``"torchvision:NAME"`` (options such as ``root`` in
    ``source_options``), or a converted dataset. It is converted to each format and store of
    ``config`` (cached under ``out/datasets/``), then every read path x backend x num_workers is
    measured in a fresh process. Writes ``results.json`` (rows, summary, recommendation),
    ``results.csv`` (rows) and ``throughput.png`` (with matplotlib, when anything was measured)
    under ``out`` and returns a :class:`BenchResult`.

    ``url``: where ``source`` (a converted dataset, fetched into the cache) came from. A streamed
    format (tar) is then also read from the URL itself, through a cache of the bench's own under
    ``out/remote-cache`` (emptied before each epoch with ``config.cache == "cold"``, so every
    shard is downloaded while it is decoded), in rows ``<store> url:cold`` (or ``url:warm``)
    beside the local copy's; :attr:`BenchResult.remote` says how that shifts the best num_workers.

    Raises :class:`~fastdata.errors.ShapeMismatchError` before converting or measuring anything
    when a folder's images differ in size and ``config.resize`` is None. A configuration that
    fails is recorded as rows whose ``status`` is ``failed: <reason>``; when all fail,
    :attr:`BenchResult.all_failed` is True. ``progress`` receives one line per conversion,
    ``on_case`` each configuration before it runs (with its number and the total)."""
    out = Path(out)
    progress = progress or (lambda message: None)
    prepared, reference = _prepare(source, config, out, source_options or {}, progress)
    if url is not None:
        prepared += _remote_twins(prepared, source, url, config, out)
    cases: list[tuple[Case, Prepared | None]] = []
    failed_rows: list[dict[str, Any]] = []
    for item in prepared:
        for path, backend, workers in _grid(item, config):
                case = Case(item.format, item.store, path, workers, item.path, item.dataset_kwargs,
                            item.files() if config.cache == "cold" else (), backend, item.remote)
                if item.error:
                    failed_rows.append(make_row(case, item, {"status": f"failed: {item.error}",
                                                             "warmup": False}, config))
                else:
                    cases.append((case, item))
    cases += [(case, None) for case in _probe_case(prepared, config)]
    rows = list(failed_rows)
    total = len(cases) + bool(config.auto)
    for number, (case, item) in enumerate(cases):
        if on_case:
            on_case(case, number, total)
        image_size = parse_resize(config.resize) or (item.image_size if item else None)
        for result in run_isolated(case, config, image_size):
            rows.append(make_row(case, item, result, config))
    auto = _auto_row(prepared, rows, config, on_case, total) if config.auto else None
    meta = {
        "machine": machine_info(),
        "config": config.to_dict(),
        "source": str(source),
        **({"url": scrub(url)} if url is not None else {}),
        "baseline": reference,
        "conversions": [
            {"format": p.format, "store": p.store, "path": p.path, "disk_bytes": p.disk_bytes,
             "conversion_s": p.conversion_s, "cached": p.cached, "error": p.error}
            for p in prepared
        ],
        **({"auto": auto} if auto else {}),
    }
    return _report(rows, reference, meta, out, config, root=(source_options or {}).get("root"))


def _auto_row(prepared: list[Prepared], rows: list[dict[str, Any]], config: BenchConfig,
              on_case: Callable[[Case, int, int], None] | None, total: int) -> dict[str, Any] | None:
    """``num_workers="auto"`` on the fast path of the grid's fastest dataset, in a fresh process:
    its rows and how it compares (:func:`~fastdata.bench.autorow.auto_summary`)."""
    dataset = auto_dataset(rows)
    item = next((p for p in prepared if (p.format, p.store) == dataset and not p.remote), None)
    if item is None:
        return None
    case = Case(item.format, item.store, "fast", 0, item.path, item.dataset_kwargs,
                item.files() if config.cache == "cold" else (), AUTO)
    if on_case:
        on_case(case, total - 1, total)
    auto_rows = [make_row(case, item, result, config)
                 for result in run_isolated(case, config, parse_resize(config.resize) or item.image_size)]
    summary = auto_summary(auto_rows, rows)
    return None if summary is None else dict(summary, rows=auto_rows)


def bench_dataset(source: str, config: BenchConfig, out: str | os.PathLike,
                  on_case: Callable[[Case, int, int], None] | None = None, *, dataset: Any = None,
                  opened: list[str] | None = None) -> BenchResult:
    """``fastdata bench module:name``: :func:`fastdata.sweep` over the user's own Dataset (``source``
    is ``"module:name"``, naming a map-style Dataset or a zero-argument function returning one),
    with ``config``'s workers, backends and loader options (its formats and stores do not apply:
    nothing is converted). Writes the same files and returns the same :class:`BenchResult` as
    :func:`run_bench`; there is no baseline, so the recommendation has no speed-up. ``dataset``:
    the Dataset itself (``source`` then only names it: ``fastdata bench --mix``), and ``opened`` the
    Python lines that make it, for the advice."""
    from fastdata.bench.sweep import sweep
    from fastdata.importing import load_dataset

    dataset = load_dataset(source) if dataset is None else dataset
    refuse_pil_samples(dataset, source)
    step = config.step if config.step is not None else (config.step_ms or None)
    rows = sweep(dataset, batch_size=config.batch_size, workers=config.workers, backends=config.backends, step=step,
                 epochs=config.epochs, warmup=config.warmup, persistent_workers=config.persistent_workers,
                 prefetch_factor=config.prefetch_factor, pin_memory=config.pin_memory,
                 start_method=config.start_method, timeout_s=config.timeout_s, on_case=on_case)
    meta = {"machine": machine_info(), "config": config.to_dict(), "source": source, "baseline": None,
            "conversions": []}
    return _report(rows, None, meta, Path(out), config, opened=opened)


def refuse_pil_samples(dataset: Any, source: str) -> None:
    """A dataset whose samples hold PIL images (a torchvision dataset without a transform) is
    refused up front: DataLoader's default_collate cannot batch them, so the user's own training
    loop could not either, and timing a list of PIL images would measure nothing they run."""
    from PIL import Image

    try:
        sample = dataset[0]
    except Exception:  # noqa: BLE001 - the sweep reports a dataset that cannot be read, per row
        return
    stack = [sample]
    while stack:
        value = stack.pop()
        if isinstance(value, Image.Image):
            raise InvalidOptionError(
                f"{source}: sample 0 holds a PIL image, which DataLoader's default_collate cannot batch (a training "
                "loop over it fails the same way). Give the dataset a transform that makes tensors of one size, "
                "e.g. transform=v2.Compose([v2.PILToTensor(), v2.Resize((224, 224))]) (torchvision.transforms.v2), "
                f"or convert it and bench that: fastdata convert {source} out.npy --resize 224x224, then fastdata "
                "bench out.npy.")
        if isinstance(value, (tuple, list)):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())


def _report(rows: list[dict[str, Any]], reference: str | None, meta: dict[str, Any], out: Path,
            config: BenchConfig, root: str | None = None, opened: list[str] | None = None) -> BenchResult:
    """Summary, reasons, results.json/csv and the plot of measured rows; the recommendation
    carries ``how`` to train with it (:func:`~fastdata.bench.advice.how_to_use`)."""
    lines = verdicts(rows, reference)
    summary = summary_document(rows, reference)
    picked = summary["recommendation"]
    if picked is not None:
        store = picked["store"].split(URL_MARK)[0]  # a row read from the dataset's URL: that dataset
        converted = URL_MARK in picked["store"] or any(
            item["path"] == meta["source"] and (item["format"], item["store"]) == (picked["format"], store)
            for item in meta["conversions"])
        picked["how"] = how_to_use(dict(picked, store=store), source=meta.get("url") or meta["source"],
                                   config=config, baseline=reference, converted=converted, root=root,
                                   opened=opened)
    document = {**meta, "verdicts": lines, "summary": summary, "rows": rows}
    write_results(out, document)
    title = f"fastdata bench on {meta['source']} — {meta['machine']['cpu_count']} cores, batch {config.batch_size}"
    stepped = bool(config.step_ms) or config.step is not None
    image = plot(out, rows, title, baseline=reference, step=stepped) if summary["recommendation"] else None
    return BenchResult(rows, table(rows, reference), lines, out, image, meta["conversions"], summary, document)
