"""File-system steps that fastdata's writers share: remove what fastdata wrote, pick a fresh
name beside a path, make a rename durable. A leaf module: the format writers import it too."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path


def remove_path(path: Path) -> None:
    """Remove a file or directory tree that fastdata wrote (callers check that first)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def unique_sibling(path: Path, infix: str) -> Path:
    """A name next to ``path`` that does not exist yet (random, so never a user's file)."""
    while True:
        candidate = path.with_name(f"{path.name}{infix}{secrets.token_hex(4)}")
        if not (candidate.exists() or candidate.is_symlink()):
            return candidate


def sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX: fsync the directory)."""
    with contextlib.suppress(OSError):
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
