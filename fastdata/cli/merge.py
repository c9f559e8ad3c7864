"""``fastdata merge OUTPUT``: write the output of a job-array conversion (``--part I/N``) once
every part is done."""

from __future__ import annotations

import argparse
from pathlib import Path

from fastdata.cli.common import LazyBar, add_command, disk_usage, human_bytes
from fastdata.urls import is_url

EXAMPLES = """
  fastdata merge out/in1k.npy            # after every 'fastdata convert ... out/in1k.npy --part I/N'
  fastdata merge out/shards --quiet      # no progress bar (batch jobs)
  fastdata merge s3://bucket/in1k.tar    # parts converted to a URL: their units are shared in the bucket
"""


def add_parser(commands) -> None:
    parser = add_command(
        commands, "merge",
        help="write the output of a conversion run as job-array parts (--part I/N) once every part is done",
        description="Check that every part of OUTPUT (fastdata convert ... OUTPUT --part I/N) is done, from one "
        "source with one set of options, then write OUTPUT (byte-identical to a conversion on one machine).",
        examples=EXAMPLES,
    )
    parser.add_argument("output", metavar="OUTPUT", help="the OUTPUT the parts were converted into")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run_merge)


def run_merge(args: argparse.Namespace) -> int:
    from fastdata.conversion.driver import merge

    with LazyBar(disable=args.quiet, desc="merge") as bar:
        manifest = merge(args.output, progress=bar.update)
    size = sum(entry["bytes"] for entry in manifest["files"].values()) if is_url(args.output) else \
        disk_usage(Path(args.output))
    line = f"merged into {args.output}: {manifest['count']:,} samples ({human_bytes(size)})"
    if manifest["skipped"]:
        line += f"; skipped {len(manifest['skipped'])} (listed in the manifest)"
    print(line)
    return 0
