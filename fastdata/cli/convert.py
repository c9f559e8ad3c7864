"""``fastdata convert``: its flags come from :class:`~fastdata.conversion.options.ConvertOptions` (and the
format options of every registered format), so a new option is one dataclass field."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from fastdata.cli.common import LazyBar, add_command, disk_usage, find_manifest, human_bytes
from fastdata.errors import FastdataError
from fastdata.urls import is_url

_GROUPS = {"conversion": "conversion options", "run": "running", "source": "sources (torchvision, Parquet, Hugging Face)"}


def _flag(name: str) -> str:
    return "--source-option" if name == "source_options" else "--" + name.replace("_", "-")


def _default_text(field: dataclasses.Field) -> str:
    default = field.default if field.default is not dataclasses.MISSING else None
    if field.metadata.get("kind") in ("flag", "append") or default is None:
        return ""
    return f" (default: {default:,})" if isinstance(default, int) else f" (default: {default})"


def format_option_fields() -> dict[str, dataclasses.Field]:
    """Every registered format's own options, by name (the first format to define a name wins)."""
    from fastdata.formats import all_formats

    fields: dict[str, dataclasses.Field] = {}
    for spec in all_formats():
        if spec.options is not None:
            for field in dataclasses.fields(spec.options):
                fields.setdefault(field.name, field)
    return fields


def add_option_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`ConvertOptions` field and per format option; flags not given are not
    set at all (``argparse.SUPPRESS``), so the dataclass defaults apply and parse the values."""
    from fastdata.conversion.options import cli_fields
    from fastdata.formats import available_formats, missing_formats

    groups = {key: parser.add_argument_group(title) for key, title in _GROUPS.items()}
    for field in cli_fields():
        meta = field.metadata
        writable = available_formats(writable=True)
        help_text = meta["help"].format(formats=", ".join(writable)) + _default_text(field)
        if field.name == "format" and missing_formats():  # listed with how to install them
            help_text += "; not installed: " + ", ".join(f"{m.name} ({m.install})" for m in missing_formats())
        kwargs: dict[str, Any] = {"dest": field.name, "default": argparse.SUPPRESS, "help": help_text}
        if meta["kind"] == "flag":
            kwargs["action"] = "store_true"
        else:
            kwargs["metavar"] = meta["metavar"].format(formats="|".join(writable))
            if meta["kind"] == "append":
                kwargs["action"] = "append"
        groups[meta["group"]].add_argument(_flag(field.name), **kwargs)
    formats = parser.add_argument_group("format options")
    for name, field in format_option_fields().items():
        formats.add_argument("--" + name.replace("_", "-"), dest=name, default=argparse.SUPPRESS,
                             metavar=field.metadata.get("metavar"), help=field.metadata.get("help"))


def options_from(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The option values given on the command line, as ConvertOptions keywords."""
    from fastdata.conversion.options import parse_source_option

    given = {key: value for key, value in vars(args).items() if key not in skip}
    if "source_options" in given:
        given["source_options"] = dict(parse_source_option(text) for text in given["source_options"])
    return given


EXAMPLES = """
  fastdata convert ./photos out/photos.npy --resize 64x64        # .npy: decoded pixels, memory-mapped
  fastdata convert torchvision:CIFAR10 --root ~/data out/cifar   # no extension: WebDataset tar shards
  fastdata convert ./photos out/photos.npy --resize 64x64 --resume   # go on after Ctrl-C, a crash or kill -9, from the last checkpoint (npy, tar)
  fastdata convert ./photos out/photos.npy --part 2/4    # part 2 of a job array; then: fastdata merge out/photos.npy
  fastdata convert ./photos out/photos.npy --engine ray --ray-address auto   # tasks on a Ray cluster
  fastdata convert mydata:train_set out/train.h5 --store encoded   # .h5: a Python Dataset (any fields), in one HDF5 file
"""


def add_parser(commands) -> None:
    parser = add_command(
        commands, "convert",
        help="convert an image folder, torchvision dataset, WebDataset shards, Parquet / Hugging Face dataset or Python "
        "dataset into a fast format",
        description="Convert SOURCE (an image folder, 'torchvision:NAME', WebDataset shards, Parquet files or a "
        "save_to_disk folder, a converted dataset, or module:name for a Python dataset) into OUTPUT, in the format "
        "its extension names (or "
        "--format). Samples may be (image, label) or records of named fields (docs/fields.md).",
        examples=EXAMPLES,
    )
    parser.add_argument("source", metavar="SOURCE",
                        help="image folder (ImageFolder layout), torchvision:NAME, WebDataset shards, Parquet files (a "
                        "file, folder, glob or URL, hf://datasets/ORG/NAME too) or a save_to_disk folder, a converted "
                        "dataset, or module:name (a map-style Dataset, or a function returning one)")
    parser.add_argument("output", metavar="OUTPUT",
                        help="the dataset to create: a directory for npy and tar, a file for hdf5; its extension "
                        "picks the format unless --format is given (.npy npy, .h5/.hdf5 hdf5, .tar or none tar)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_option_flags(parser)
    parser.set_defaults(run=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    from fastdata.conversion import convert
    from fastdata.conversion.plan import decide_options

    options = decide_options(args.output, **options_from(args, skip=("source", "output", "quiet", "command", "run")))
    before = (_url_manifest_digest(args.output) if is_url(args.output) else _manifest_digest(Path(args.output))) \
        if options.resume else None
    with LazyBar(disable=args.quiet, desc=f"convert -> {options.format}") as bar:
        manifest = convert(args.source, args.output, options, progress=bar.update)
    if options.part is not None:
        part, parts = options.part
        print(f"wrote part {part}/{parts} of {args.output}: {manifest['count']:,} samples"
              + (f" ({manifest['skipped']:,} skipped)" if manifest["skipped"] else "")
              + f" into {args.output}.partial.units; when all {parts} parts are done: fastdata merge {args.output}")
        return 0
    if before is not None and before == manifest.get("manifest_blake2b"):
        print(f"{args.output} is already complete ({manifest['count']:,} samples, same source and options); "
              "nothing to do")
        return 0
    skipped = manifest["skipped"]
    size = sum(entry["bytes"] for entry in manifest["files"].values()) if is_url(args.output) else \
        disk_usage(Path(args.output))  # an .h5's files are its datasets: the local size is the file's
    line = f"wrote {manifest['count']:,} samples to {args.output} ({human_bytes(size)})"
    if skipped:
        line += f"; skipped {len(skipped)}: " + "; ".join(f"{s['key']} ({s['reason']})" for s in skipped[:20])
        if len(skipped) > 20:
            line += f"; ... {len(skipped) - 20} more, every one listed in the manifest ('fastdata info --json')"
    print(line)
    return 0


def _url_manifest_digest(url: str) -> str | None:
    """The sealed manifest checksum of a dataset already at ``url`` (None if there is none, or it
    cannot be read now: the conversion then says why)."""
    from fastdata.remote import RemoteOptions
    from fastdata.conversion.remote.upload import manifest_at

    try:
        manifest = manifest_at(url, RemoteOptions())
    except FastdataError:
        return None
    return manifest.get("manifest_blake2b") if manifest else None


def _manifest_digest(output: Path) -> str | None:
    """The sealed manifest checksum of an existing dataset at ``output`` (None if there is none)."""
    try:
        manifest = find_manifest(output) if output.exists() else None
    except FastdataError:
        return None
    return manifest.get("manifest_blake2b") if manifest else None
