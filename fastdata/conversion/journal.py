"""The journal of a conversion in progress, ``OUTPUT.partial.json``.

It is written before the partial output is created, so it is fastdata's record that
``OUTPUT.partial`` is its own (a partial output without it is never removed). It holds what
determines the output (the conversion key and its fields), the source's fingerprint, the
process that writes it and, for resumable writers, the last checkpoint, made at a unit boundary:
how many of the conversion's units (of ``unit_samples`` samples) the partial output holds
(``next_unit``; ``next_index`` is the source index after them), how many samples were written
and skipped, and the writer's own state (see :mod:`fastdata.conversion.resume`). ``--resume``
reopens the partial output at that checkpoint only when key and fingerprint both match.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any

JOURNAL_SUFFIX = ".partial.json"
JOURNAL_MARK = "fastdata conversion journal"
JOURNAL_VERSION = 3  # 3: checkpoints at unit boundaries (next_unit, unit_samples)
# how often a checkpoint is made durable (fsync) and recorded; tests shorten it
CHECKPOINT_INTERVAL_S = float(os.environ.get("FASTDATA_CHECKPOINT_INTERVAL_S", "2.0"))


def journal_path(output: Path) -> Path:
    return output.with_name(output.name + JOURNAL_SUFFIX)


def conversion_key(fields: dict[str, Any]) -> str:
    """A stable digest of what determines a conversion's output (source and options)."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def start(output: Path, *, key: str, fields: dict[str, Any], fingerprint: dict[str, Any]) -> dict[str, Any]:
    """Record a new conversion of ``output`` (before its partial output exists)."""
    state = {
        "journal": JOURNAL_MARK, "version": JOURNAL_VERSION, "key": key, "fields": fields,
        "source_fingerprint": fingerprint,
        "owner": {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")},
        "mode": None, "unit_samples": None, "next_unit": 0, "next_index": 0, "written": 0, "skipped": {}, "writer": None,
    }
    save(output, state)
    return state


def read(output: Path) -> dict[str, Any] | None:
    """The journal of ``output`` when it is one fastdata wrote, else None."""
    try:
        state = json.loads(journal_path(output).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or state.get("journal") != JOURNAL_MARK:
        return None
    return state


def exists(output: Path) -> bool:
    return journal_path(output).exists()


def save(output: Path, state: dict[str, Any]) -> None:
    """Replace the journal atomically (write a new file, fsync, rename)."""
    target = journal_path(output)
    temporary = target.with_name(f"{target.name}.{secrets.token_hex(4)}.tmp")
    with open(temporary, "x", encoding="utf-8") as handle:  # "x": never a file that is not ours
        json.dump(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, target)


def remove(output: Path) -> None:
    """Remove the journal once its partial output is gone or published."""
    target = journal_path(output)
    if read(output) is not None or target.is_file() and target.stat().st_size == 0:
        target.unlink(missing_ok=True)
