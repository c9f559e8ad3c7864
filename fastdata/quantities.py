"""Quantities as people write them: byte sizes (``"256MB"``, ``"1GiB"``, ``4096``) and counts
(``"4"`` or ``4``), from a command-line flag, an option keyword or an environment variable. A
leaf: the format options, the remote cache and the conversion options all parse with it, and
a refused value names the flag it came from.
"""

from __future__ import annotations

import re
from typing import Any

from fastdata.errors import InvalidOptionError

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value: Any, *, flag: str) -> int:
    """``"256MB"`` -> 256_000_000, ``"1GiB"`` -> 2**30, ``"4096"`` or 4096 -> 4096."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
        unit = match.group(2).lower() if match else None
        if unit not in _UNITS:
            raise InvalidOptionError(
                f"Invalid {flag} {value!r}. Use bytes or a number with kB, MB, GB, KiB, MiB or GiB (e.g. '256MB')."
            )
        number = int(float(match.group(1)) * _UNITS[unit])
    if number <= 0:
        raise InvalidOptionError(f"Invalid {flag} {value!r}. Use a positive size such as '256MB'.")
    return number


def parse_count(value: Any, *, flag: str, minimum: int = 1, allow_none: bool = False) -> int | None:
    """An integer option given as int or text, at least ``minimum``."""
    if value is None and allow_none:
        return None
    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        number = int(value)
    if number is None or number < minimum:
        allowed = f"an integer >= {minimum}" if minimum > 1 else ("0 or a positive integer" if minimum == 0
                                                                  else "a positive integer")
        raise InvalidOptionError(f"Invalid {flag} {value!r}. Use {allowed}.")  # as given: '-1' from the CLI
    return number
