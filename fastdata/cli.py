"""The ``fastdata`` command line: convert, info, verify, bench.

Errors that fastdata raises on purpose print ``fastdata: error: <message>`` and exit 1,
without a traceback (set ``FASTDATA_TRACEBACK=1`` to see one). Ctrl-C exits 130 and SIGTERM
143, each with one line, after the same clean-up (at any moment: this module imports nothing
heavy, so the handlers are in place before torch loads). Notes from the library (the
``fastdata`` logger, e.g. a capped ``--workers``) print as ``fastdata: <message>``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, Sequence

from fastdata._version import __version__
from fastdata.errors import FastdataError, InvalidOptionError

def disk_usage(path: Path) -> int:
    from fastdata.manifest import disk_usage as usage

    return usage(path)


def find_manifest(path: Path) -> dict[str, Any] | None:
    from fastdata.formats import find_manifest as find

    return find(path)


def human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count} B"


def _source_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def _format_option_fields() -> dict[str, dataclasses.Field]:
    from fastdata.formats import all_formats

    fields: dict[str, dataclasses.Field] = {}
    for spec in all_formats():
        if spec.options is not None:
            for field in dataclasses.fields(spec.options):
                fields.setdefault(field.name, field)
    return fields


def _add_convert_parser(commands) -> None:
    from fastdata.formats import available_formats
    from fastdata.images import DEFAULT_MAX_PIXELS

    parser = commands.add_parser(
        "convert",
        help="convert an image folder or torchvision dataset into a fast format",
        description="Convert SOURCE (an image folder, 'torchvision:NAME', or a converted dataset) into OUTPUT.",
    )
    parser.add_argument("source", help="image folder (ImageFolder layout) or torchvision:NAME")
    parser.add_argument("output", help="output path (a directory for npy, a file for hdf5)")
    parser.add_argument("--format", default="npy", help=f"output format: {', '.join(available_formats(writable=True))}")
    parser.add_argument("--store", default="raw", help="raw (decoded pixels) or encoded (image bytes)")
    parser.add_argument("--mode", default="auto", help="auto (L if every image is grayscale, else RGB), RGB or L")
    parser.add_argument("--resize", help="HxW (exact size) or S (shorter side to S, aspect kept)")
    parser.add_argument("--center-crop", help="HxW, applied after --resize")
    parser.add_argument("--reencode", help="encoded store: re-encode as jpeg:Q or png")
    parser.add_argument("--workers", type=int, help="decoding processes (default: all cores; 0 = in-process)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    parser.add_argument("--skip-bad", action="store_true", help="leave unreadable images out (listed in the manifest)")
    parser.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                        help=f"refuse images with more pixels than this before decoding them (default {DEFAULT_MAX_PIXELS:,})")
    parser.add_argument("--exif-transpose", action="store_true",
                        help="apply EXIF orientation (off by default, like torchvision)")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted conversion from its last checkpoint (a finished one is kept)")
    parser.add_argument("--root", help="torchvision sources: the dataset's root folder")
    parser.add_argument("--split", default="train", help="torchvision sources: train or test")
    parser.add_argument("--download", action="store_true", help="torchvision sources: download if missing")
    parser.add_argument("--source-option", action="append", type=_source_option, default=[], metavar="KEY=VALUE",
                        help="extra keyword for the torchvision dataset, e.g. size=1000 (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    group = parser.add_argument_group("format options")
    for name, field in _format_option_fields().items():
        group.add_argument(
            "--" + name.replace("_", "-"), dest=f"format_option_{name}", default=None,
            type=field.metadata.get("parse", str), help=field.metadata.get("help"),
        )


class _LazyBar:
    """A tqdm bar created at the first progress report, so failed validation prints no bar."""

    def __init__(self, *, disable: bool, desc: str):
        self.disable, self.desc, self.bar = disable, desc, None

    def update(self, count: int, total: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="img", desc=self.desc, disable=self.disable, file=sys.stderr)
        self.bar.update(count)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _run_convert(args: argparse.Namespace) -> int:
    from fastdata.convert import convert

    format_options = {
        key[len("format_option_"):]: value
        for key, value in vars(args).items()
        if key.startswith("format_option_") and value is not None
    }
    before = _manifest_digest(Path(args.output)) if args.resume else None
    bar = _LazyBar(disable=args.quiet, desc=f"convert -> {args.format}")
    try:
        manifest = convert(
            args.source, args.output, format=args.format, store=args.store, mode=args.mode,
            resize=args.resize, center_crop=args.center_crop, reencode=args.reencode,
            workers=args.workers, overwrite=args.overwrite, skip_bad=args.skip_bad, resume=args.resume,
            max_pixels=args.max_pixels, exif_transpose=args.exif_transpose,
            root=args.root, split=args.split, download=args.download,
            source_options=dict(args.source_option), progress=bar.update, **format_options,
        )
    finally:
        bar.close()
    if before is not None and before == manifest.get("manifest_blake2b"):
        print(f"{args.output} is already complete ({manifest['count']:,} samples, same source and options); "
              "nothing to do")
        return 0
    skipped = manifest["skipped"]
    line = f"wrote {manifest['count']:,} samples to {args.output} ({human_bytes(disk_usage(Path(args.output)))})"
    if skipped:
        line += f"; skipped {len(skipped)}: " + "; ".join(f"{s['key']} ({s['reason']})" for s in skipped[:20])
        if len(skipped) > 20:
            line += f"; ... {len(skipped) - 20} more, every one listed in the manifest ('fastdata info --json')"
    print(line)
    return 0


def _manifest_digest(output: Path) -> str | None:
    """The sealed manifest checksum of an existing dataset at ``output`` (None if there is none)."""
    try:
        manifest = find_manifest(output) if output.exists() else None
    except FastdataError:
        return None
    return manifest.get("manifest_blake2b") if manifest else None


def _files_line(files: dict[str, Any], shown: int = 4) -> str:
    names = list(files)
    line = ", ".join(f"{name} ({human_bytes(files[name]['bytes'])})" for name in names[:shown])
    if len(names) > shown:
        line += f", ... {len(names) - shown} more ({len(names)} files)"
    return line


def describe(path: Path, manifest: dict[str, Any]) -> str:
    image = manifest["image"]
    if image.get("shape"):
        shape = "x".join(str(v) for v in image["shape"]) + f" {image['dtype']}"
    else:
        shape = f"encoded ({image['encoding']})"
    classes = manifest.get("classes", [])
    shown = ", ".join(classes[:8]) + (", ..." if len(classes) > 8 else "")
    files = manifest.get("files", {})
    rows = [
        ("path", str(path)),
        ("format", f"{manifest['format']} (layout {manifest['layout_version']}), store {manifest['store']}"),
        ("samples", f"{manifest['count']:,}"),
        ("image", f"{shape}, mode {image['mode']}"),
        ("classes", f"{len(classes)}" + (f": {shown}" if classes else "")),
        ("size", f"{human_bytes(disk_usage(path))} on disk"),
        ("files", _files_line(files)),
        ("source", " ".join(f"{k}={v}" for k, v in manifest.get("source", {}).items())),
        ("created", f"{manifest.get('created')} by fastdata {manifest.get('fastdata_version')}"),
        ("skipped", str(len(manifest.get("skipped", [])))),
    ]
    return "\n".join(f"{name + ':':<9} {value}" for name, value in rows)


def _run_info(args: argparse.Namespace) -> int:
    from fastdata.errors import ManifestError, SourceNotFoundError

    path = Path(args.path)
    if not path.exists():
        raise SourceNotFoundError(f"{str(path)!r} does not exist.")
    manifest = find_manifest(path)
    if manifest is None:
        raise ManifestError(f"{str(path)!r} is not a dataset written by 'fastdata convert' (no manifest found).")
    if args.json:
        print(json.dumps(dict(manifest, size_bytes=disk_usage(path)), indent=2))
    else:
        print(describe(path, manifest))
    return 0


def _run_verify(args: argparse.Namespace) -> int:
    from fastdata.verify import verify

    report = verify(args.path, deep=args.deep)
    print(report.summary())
    if report.ok:
        return 0
    for problem in report.problems:
        print(f"  - {problem}")
    print("The dataset is damaged: convert the source again (--overwrite), or restore it from a copy.")
    return 1


def _add_bench_parser(commands) -> None:
    from fastdata.formats import available_formats

    parser = commands.add_parser(
        "bench",
        help="measure every format x num_workers on this machine, and say why the best wins",
        description="Convert SOURCE to every format (cached under --out), read each one with every "
        "num_workers in a fresh process, and print a table plus one verdict per format.",
    )
    parser.add_argument("source", nargs="?", help="image folder, torchvision:NAME or a converted dataset")
    parser.add_argument("--demo", action="store_true", help="generate a demo image folder and benchmark it")
    parser.add_argument("--formats", default=",".join(available_formats()),
                        help=f"comma-separated formats (default: all: {','.join(available_formats())})")
    parser.add_argument("--store", default="raw,encoded", help="stores of the converted formats (default: raw,encoded)")
    parser.add_argument("--resize", help="HxW: raw conversions store this size; encoded/folder reads resize to it")
    parser.add_argument("--workers", default="auto", help="num_workers list, e.g. 0,1,2,4,8, or auto (0,1,2,4.. up to the cores)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=3, help="measured epochs per configuration (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured epochs first")
    parser.add_argument("--step-ms", type=float, default=0.0, help="simulated training step per batch (sleep)")
    parser.add_argument("--transform", default="none", help="none, normalize or augment (torchvision.transforms.v2)")
    parser.add_argument("--start-method", help="DataLoader worker start method: fork, spawn or forkserver")
    parser.add_argument("--pin-memory", action="store_true")
    parser.add_argument("--persistent-workers", action="store_true")
    parser.add_argument("--prefetch-factor", type=int, default=2)
    parser.add_argument("--cache", default="warm", help="warm, or cold: evict the dataset's files from the page cache each epoch")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="limit per configuration")
    parser.add_argument("--out", default="bench-out", help="results and cached conversions (default: ./bench-out)")
    parser.add_argument("--root", help="torchvision sources: the dataset's root folder")
    parser.add_argument("--split", default="train", help="torchvision sources: train or test")
    parser.add_argument("--download", action="store_true", help="torchvision sources: download if missing")
    parser.add_argument("--source-option", action="append", type=_source_option, default=[], metavar="KEY=VALUE")
    parser.add_argument("--quiet", action="store_true", help="no progress output")


DEMO = {"small": 3000, "large": 150, "resize": "32x32"}


def _run_bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from fastdata.bench import BenchConfig, parse_workers, run_bench

    out = Path(args.out)
    source = args.source
    resize = args.resize
    if args.demo:
        from fastdata.demo import make_demo_folder

        folder = out / "demo-images"
        if not (folder / ".complete").exists():
            make_demo_folder(folder, small=DEMO["small"], large=DEMO["large"])
            (folder / ".complete").touch()
        source, resize = str(folder), resize or DEMO["resize"]
    elif source is None:
        raise InvalidOptionError("Give a SOURCE to benchmark (image folder, torchvision:NAME, converted dataset), or --demo.")
    config = BenchConfig(
        formats=tuple(f for f in args.formats.split(",") if f),
        stores=tuple(s for s in args.store.split(",") if s),
        workers=tuple(parse_workers(args.workers)),
        resize=resize, batch_size=args.batch_size, epochs=args.epochs, warmup=args.warmup,
        step_ms=args.step_ms, transform=args.transform, start_method=args.start_method,
        pin_memory=args.pin_memory, persistent_workers=args.persistent_workers,
        prefetch_factor=args.prefetch_factor, cache=args.cache, timeout_s=args.timeout_s,
    )
    source_options = {"root": args.root, "split": args.split, "download": args.download}
    if args.source_option:
        source_options["source_options"] = dict(args.source_option)
    bar = None

    def on_case(case, number, total):
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, unit="config", disable=args.quiet, file=sys.stderr)
        bar.set_description(f"{case.label} nw={case.num_workers}")
        bar.update(1 if number else 0)

    def progress(message):
        if not args.quiet:
            print(message, file=sys.stderr)

    try:
        result = run_bench(source, config, out, source_options=source_options, progress=progress, on_case=on_case)
    finally:
        if bar is not None:
            bar.update(bar.total - bar.n)
            bar.close()
    from fastdata.bench import machine_info

    info = machine_info()
    print(f"fastdata bench: {source}, batch {config.batch_size}, os.cpu_count()={info['cpu_count']}, "
          f"{info['ram_gb']} GiB RAM, torch {info['torch']}")
    for item in result.conversions:
        if item["conversion_s"] is not None:
            state = "cached" if item["cached"] else "converted"
            print(f"  {item['format']} {item['store']}: {human_bytes(item['disk_bytes'])}, "
                  f"{state} in {item['conversion_s']:.1f} s")
    print()
    print(result.table)
    print()
    print("\n".join(result.verdicts))
    written = ["results.json", "results.csv"] + (["throughput.png"] if result.plot else [])
    print(f"\nwrote {', '.join(str(out / name) for name in written)}")
    if result.plot is None:
        print("(no plot: install matplotlib, e.g. pip install 'fastdata[plot]')")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastdata",
        description="Convert image datasets once into fast formats, and measure which format and "
        "DataLoader num_workers feed PyTorch fastest on this machine.",
    )
    parser.add_argument("--version", action="version", version=f"fastdata {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_convert_parser(commands)
    _add_bench_parser(commands)
    info = commands.add_parser("info", help="show a converted dataset's manifest")
    info.add_argument("path")
    info.add_argument("--json", action="store_true", help="print the manifest as JSON")
    check = commands.add_parser(
        "verify", help="check a converted dataset against its manifest (checksums, counts, labels)",
        description="Recompute the checksums recorded in PATH's manifest and check counts, shapes, "
        "label range and the manifest itself. Exit 0 when sound; otherwise list each problem and exit 1.",
    )
    check.add_argument("path")
    check.add_argument("--deep", action="store_true", help="also decode every sample through the reader")
    return parser


_COMMANDS = {"convert": _run_convert, "info": _run_info, "bench": _run_bench, "verify": _run_verify}
_SIGNAL_WORDS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}
_received: list[int] = []
_main_pid: list[int] = []
_caught: list[bool] = []


def _on_signal(signum: int, frame: Any) -> None:
    """SIGINT and SIGTERM unwind the command as KeyboardInterrupt, so its clean-up runs.

    Until :func:`main` has caught one, every signal raises again: Python drops an exception
    raised where it cannot propagate (a ``__del__``, an at-fork hook), and a lost SIGTERM would
    let the command run on. A child process that inherited this handler (a pool or DataLoader
    worker) gets the default behaviour back instead: its parent does the clean-up."""
    if _main_pid and os.getpid() != _main_pid[0]:
        if signum == signal.SIGTERM:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        return
    _received.append(signum)
    if not _caught:
        raise KeyboardInterrupt


def _install_signal_handlers() -> dict[int, Any]:
    _received.clear()
    _caught.clear()
    _main_pid[:] = [os.getpid()]
    try:
        return {signum: signal.signal(signum, _on_signal) for signum in _SIGNAL_WORDS}
    except ValueError:  # not the main thread (main() called from a thread): leave them alone
        return {}


def _configure_logging() -> None:
    logger = logging.getLogger("fastdata")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("fastdata: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)
        logger.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    previous = _install_signal_handlers()
    try:
        return _main(argv)
    except KeyboardInterrupt:
        _caught.append(True)
        signum = _received[0] if _received else signal.SIGINT
        print(f"fastdata: {_SIGNAL_WORDS[signum]}", file=sys.stderr)
        return 128 + signum
    except BrokenPipeError:  # e.g. 'fastdata info ... | head': the reader left; end quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _main(argv: Sequence[str] | None) -> int:
    _configure_logging()
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return _COMMANDS[args.command](args)
    except FastdataError as exc:
        if os.environ.get("FASTDATA_TRACEBACK"):
            raise
        print(f"fastdata: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
