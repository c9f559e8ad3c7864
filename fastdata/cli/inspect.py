"""``fastdata info`` and ``fastdata verify``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fastdata.cli.common import LazyBar, add_command, disk_usage, human_bytes
from fastdata.urls import is_url


def _files_line(files: dict[str, Any], shown: int = 4) -> str:
    names = list(files)
    line = ", ".join(f"{name} ({human_bytes(files[name]['bytes'])})" for name in names[:shown])
    if len(names) > shown:
        line += f", ... {len(names) - shown} more ({len(names)} files)"
    return line


def field_line(entry: dict[str, Any]) -> str:
    """One field of ``fastdata info``: name, kind, dtype and shape (K for a variable first
    dimension), encoding, what a reader gives back."""
    from fastdata.fields import KINDS  # numpy and PIL only for datasets with fields: a light CLI start

    kind = KINDS.get(entry.get("kind")) if isinstance(entry.get("kind"), str) else None
    parts = [f"{entry.get('name')}: {entry.get('kind')}"]
    if entry.get("dtype") and not (kind is not None and kind.spatial):  # an image's uint8 goes without saying
        parts.append(str(entry["dtype"]))
    shape = entry.get("shape")
    if shape is not None and not (kind is not None and kind.stored.shape == "scalar"):
        parts.append("(" + ", ".join("K" if s is None else str(s) for s in shape) + ")")
    if entry.get("encoding"):
        parts.append(entry["encoding"] + (f", mode {entry['mode']}" if entry.get("mode") else ""))
    meta = entry.get("meta") or {}
    if meta.get("tv_tensor") == "BoundingBoxes":
        parts.append(f"BoundingBoxes {meta.get('format')} on {meta.get('canvas_size_of')!r}")
    if meta.get("palette"):
        parts.append("palette kept")
    return "  " + " ".join(parts)


def describe(path: Path | str, manifest: dict[str, Any], sizes: dict[str, Any] | None = None,
             size: str | None = None) -> str:
    from fastdata.cli.sizes import sizes_line  # numpy and Pillow: imported when info runs, not at CLI start-up

    image = manifest["image"]
    if image.get("shape"):
        shape = "x".join(str(v) for v in image["shape"]) + f" {image['dtype']}"
    else:
        options = manifest.get("options") or {}
        reencode = options.get("reencode") or [None, None]
        quality = f" quality {reencode[1]}" if image["encoding"] == "jpeg" and reencode[1] else ""
        max_side = f", longest side at most {options['max_side']}" if options.get("max_side") else ""
        shape = f"encoded ({image['encoding']}{quality}{max_side})"
    classes = manifest.get("classes", [])
    names = [" / ".join(entry) if isinstance(entry, list) else str(entry) for entry in classes[:8]]  # a class's names
    shown = ", ".join(names) + (", ..." if len(classes) > 8 else "")
    files = manifest.get("files", {})
    rows = [
        ("path", str(path)),
        ("format", f"{manifest['format']} (layout {manifest['layout_version']}), store {manifest['store']}"),
        ("samples", f"{manifest['count']:,}"),
        ("image", shape + (f", mode {image['mode']}" if image.get("mode") else "")),  # None: not recorded
        *([("stored", sizes_line(sizes, manifest["count"], human_bytes))] if sizes else []),
        ("classes", f"{len(classes)}: {shown}" if classes else "none (no class labels)"),
        ("size", size or f"{human_bytes(disk_usage(path))} on disk"),
        ("files", _files_line(files)),
        ("source", " ".join(f"{k}={v}" for k, v in manifest.get("source", {}).items())),
        ("created", f"{manifest.get('created')} by fastdata {manifest.get('fastdata_version')}"),
        ("skipped", str(len(manifest.get("skipped", [])))),
    ]
    if isinstance(manifest.get("fields"), dict):  # samples with fields (docs/fields.md)
        schema = manifest["fields"]
        rows.insert(4, ("fields", f"{len(schema.get('fields') or [])}, given back as a {schema.get('layout')}"))
        for entry in schema.get("fields") or []:
            rows.insert(5 + (schema["fields"].index(entry)), ("", field_line(entry)))
    return "\n".join(f"{name + ':' if name else '':<9} {value}" for name, value in rows)


def run_info(args: argparse.Namespace) -> int:
    from fastdata.cli.sizes import stored_sizes  # numpy and Pillow: imported when info runs, not at CLI start-up
    from fastdata.formats import require_manifest

    if is_url(args.path):  # only the manifest is fetched
        from fastdata.formats.stored import single_file_problem
        from fastdata.remote import RemoteOptions, open_remote

        files = open_remote(args.path, RemoteOptions(), check_single=single_file_problem)
        # checked as a local manifest is (the fetched manifest.json lies in the dataset's cache directory)
        manifest = require_manifest(files.directory if files.single is None else files.directory / files.single)
        total = sum(entry["bytes"] for entry in manifest["files"].values()) if files.single is None else \
            files.cache.path(files.key, files.single).stat().st_size
        if args.json:
            print(json.dumps(dict(manifest, size_bytes=total), indent=2))
        else:
            print(describe(args.path, manifest, size=f"{human_bytes(total)} in object storage"))
        return 0
    path = Path(args.path)
    manifest = require_manifest(path)
    sizes = stored_sizes(path, manifest)
    if args.json:
        extra = {"stored_sizes": sizes} if sizes else {}
        print(json.dumps(dict(manifest, size_bytes=disk_usage(path), **extra), indent=2))
    else:
        print(describe(path, manifest, sizes))
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from fastdata.verification import verify

    with LazyBar(disable=args.quiet, desc="verify --deep") as bar:
        report = verify(args.path, deep=args.deep, progress=bar.update)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0 if report.ok else 1
    print(report.summary())
    if report.ok:
        return 0
    for problem in report.problems:
        print(f"  - {problem}")
    print("The dataset is damaged: convert the source again (--overwrite), or restore it from a copy.")
    return 1


def add_parsers(commands) -> None:
    info = add_command(
        commands, "info", help="show a converted dataset's manifest",
        description="Show what a converted dataset holds: format, samples, image shape, classes, files and where "
        "it came from. For encoded images, the stored size distribution: min/median/max of bytes per image (from "
        "the index) and of width and height (from the headers of up to 1,000 evenly spaced images).",
        examples="""
  fastdata info out/photos.npy
  fastdata info out/cifar.h5 --json      # the whole manifest, for scripts
""")
    info.add_argument("path", metavar="PATH", help="a dataset written by 'fastdata convert'")
    info.add_argument("--json", action="store_true",
                      help="print the manifest (with size_bytes and, for encoded images, stored_sizes) as JSON")
    info.set_defaults(run=run_info, needs_torch=False)  # manifests and headers only: starts in a fraction of a second
    check = add_command(
        commands, "verify", help="check a converted dataset against its manifest (checksums, counts, labels)",
        description="Recompute the checksums recorded in PATH's manifest and check counts, shapes, "
        "label range and the manifest itself. Exit 0 when sound; otherwise list each problem and exit 1.",
        examples="""
  fastdata verify out/photos.npy           # every checksum, count and label
  fastdata verify out/cifar.h5 --deep      # also decode every sample, with a progress bar
  fastdata verify out/photos-tar --json    # the result for scripts; exit 1 when damaged
""")
    check.add_argument("path", metavar="PATH", help="a dataset written by 'fastdata convert'")
    check.add_argument("--deep", action="store_true", help="also decode every sample through the reader")
    check.add_argument("--json", action="store_true",
                       help="print the result as JSON (path, format, ok, deep, count, checksums, checked, problems); "
                       "the exit status is the same")
    check.add_argument("--quiet", action="store_true", help="no progress bar")
    check.set_defaults(run=run_verify)
