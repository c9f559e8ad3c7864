"""``--resume``: the checkpoint journal of a partial conversion, ``OUTPUT.partial.json``.

While a resumable writer works, the engine periodically asks it for a checkpoint (everything
so far made durable) and records, next to the partial output, which source index comes next,
how many samples were written and skipped, and the writer's own state. ``--resume`` reopens
the partial output at that checkpoint when the journal's key (source + options) matches.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

JOURNAL_SUFFIX = ".partial.json"
# how often a checkpoint is made durable (fsync) and recorded; tests shorten it
CHECKPOINT_INTERVAL_S = float(os.environ.get("FASTDATA_CHECKPOINT_INTERVAL_S", "2.0"))


def journal_path(output: Path) -> Path:
    return output.with_name(output.name + JOURNAL_SUFFIX)


def conversion_key(fields: dict[str, Any]) -> str:
    """A stable digest of what determines a conversion's output (source and options)."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def load(output: Path, key: str) -> dict[str, Any] | None:
    """The journal of ``output`` if it exists, parses, and was written for ``key``."""
    try:
        state = json.loads(journal_path(output).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and state.get("key") == key else None


def save(output: Path, state: dict[str, Any]) -> None:
    """Replace the journal atomically (write, fsync, rename)."""
    target = journal_path(output)
    temporary = target.with_name(target.name + ".tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, target)


def remove(output: Path) -> None:
    for path in (journal_path(output), journal_path(output).with_name(journal_path(output).name + ".tmp")):
        path.unlink(missing_ok=True)
