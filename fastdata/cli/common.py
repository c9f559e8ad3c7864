"""Helpers every ``fastdata`` command uses: the help layout, sizes in words, manifests, the progress bar."""

from __future__ import annotations

import argparse
import sys
import time
import textwrap
from pathlib import Path
from typing import Any


class HelpFormatter(argparse.HelpFormatter):
    """Every command's help: descriptions are wrapped, indented lines (the examples) are kept as
    they are, and an option's default is shown when it has a real one (not None, False, an empty
    list, or unset), unless its help already says it."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines: list[str] = []
        for line in text.splitlines():
            if line.startswith(" ") or not line.strip():
                lines.append(indent + line)
            else:
                lines += textwrap.wrap(line, width, initial_indent=indent, subsequent_indent=indent)
        return "\n".join(lines)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or default is None or default is False or default is argparse.SUPPRESS
                or default == [] or action.nargs == 0):
            return text
        return text + " (default: %(default)s)"


class DeprecatedAlias(argparse.Action):
    """An old spelling of an option, kept for a release: it sets the new option's value and prints
    one line to stderr naming the new spelling; it is left out of ``--help``."""

    def __init__(self, option_strings: list[str], dest: str, *, command: str, replacement: str, **kwargs: Any):
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)
        self.command, self.replacement = command, replacement

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"fastdata: {option_string} is deprecated for {self.command}; use {self.replacement}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_command(commands, name: str, *, help: str, description: str, examples: str) -> argparse.ArgumentParser:
    """A subcommand with the shared formatter and an ``Examples:`` epilog (one command a line,
    each runnable as written; ``#`` starts a comment)."""
    return commands.add_parser(name, help=help, description=description, formatter_class=HelpFormatter,
                               epilog="Examples:\n" + examples.strip("\n"))


def backend_list(text: str | None) -> tuple[str, ...]:
    """``--backends``: the comma-separated names given, or every loader backend (in preference
    order) when none was."""
    if text is None:
        from fastdata.loading.backends import backend_names  # imports torch: only commands that run loaders

        return backend_names()
    return tuple(part.strip() for part in text.split(",") if part.strip())


def human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count} B"


def disk_usage(path: Path) -> int:
    from fastdata.manifest import disk_usage as usage

    return usage(path)


def find_manifest(path: Path) -> dict[str, Any] | None:
    from fastdata.formats import find_manifest as find

    return find(path)


class LazyBar:
    """A tqdm bar created at the first progress report, so failed validation prints no bar;
    ``with LazyBar(...) as bar: work(progress=bar.update)`` closes it however the work ends."""

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

    def __enter__(self) -> "LazyBar":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


_KEPT: list[Any] = []  # the remote datasets this command fetched: their files stay leased until it exits


def fetch_converted(url: str, *, cold: bool = False) -> Path:
    """The converted dataset at ``url`` fetched into the cache (``$FASTDATA_CACHE_DIR``,
    ``$FASTDATA_CACHE_LIMIT``; first emptied of it with ``cold``), its local path there; says on
    stderr how much was downloaded and how fast."""
    from fastdata.formats.stored import single_file_problem
    from fastdata.remote import RemoteOptions, open_remote

    files = open_remote(url, RemoteOptions(), check_single=single_file_problem)
    _KEPT.append(files)
    if cold:
        files.drop()
    started = time.perf_counter()
    local = files.fetch_all()
    elapsed = time.perf_counter() - started
    stats = files.cache.stats  # this process's downloads, all of them this dataset's
    rate = stats.bytes_downloaded / stats.download_seconds if stats.download_seconds else 0.0
    print(f"fastdata: {url}: {stats.downloads} file(s) downloaded, {human_bytes(stats.bytes_downloaded)} in "
          f"{elapsed:.2f} s ({human_bytes(int(rate))}/s), {stats.hits} already in the cache {files.cache.directory}",
          file=sys.stderr)
    return local
