"""User-facing text (README, docs, docstrings and messages of the package, the benchmark and
example scripts) says what a feature does and what was measured, never which internal ticket
asked for it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICKET = re.compile(r"\b(?:issues?|tickets?)\s*#?\s*\d+|\bthe issue's\b", re.IGNORECASE)


def user_facing_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for folder in ("fastdata", "benchmarks", "examples"):
        files += sorted(path for path in (ROOT / folder).rglob("*") if path.suffix in (".py", ".md"))
    return files


def test_user_facing_text_cites_no_ticket_numbers() -> None:
    files = user_facing_files()
    assert ROOT / "fastdata" / "reader" / "fused.py" in files and ROOT / "docs" / "reading.md" in files
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in files
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if TICKET.search(line)]
    assert found == []
