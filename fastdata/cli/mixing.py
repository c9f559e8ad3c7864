"""``--mix PATH:WEIGHT,PATH:WEIGHT,...`` for ``fastdata bench`` and ``fastdata tune``: a
:func:`fastdata.mix` of converted datasets, each read map-style (a tar dataset through its
indexed reader, ``TarIndexedDataset``: a mix needs random access)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fastdata.errors import InvalidOptionError

HELP = ("a weighted mix of converted datasets instead of SOURCE: PATH:WEIGHT,PATH:WEIGHT,... (e.g. "
        "a.npy:3,b-shards:1; tar datasets are read map-style, as TarIndexedDataset); each epoch draws the sum of "
        "their lengths in those proportions (fastdata.mix, docs/reading.md)")


def parse_mix(text: str) -> list[tuple[str, float]]:
    """``[(path, weight), ...]`` from ``--mix``'s text; one line naming the bad part otherwise."""
    entries = []
    for part in (p.strip() for p in text.split(",")):
        path, colon, weight = part.rpartition(":")
        try:
            value = float(weight) if colon and path else None
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value < 0:
            raise InvalidOptionError(f"Invalid --mix entry {part!r} in {text!r}. Use PATH:WEIGHT pairs, comma-separated, "
                                     "with weights >= 0, e.g. --mix a.npy:3,b-shards:1.")
        entries.append((path, value))
    if len(entries) < 2:
        raise InvalidOptionError(f"Invalid --mix {text!r}: it names one dataset. Give two or more PATH:WEIGHT pairs "
                                 "(or benchmark the one dataset as SOURCE).")
    return entries


def open_mix(text: str, *, transform: Any = None) -> Any:
    """The :func:`fastdata.mix` that ``--mix`` names (seed 0, one epoch = the sum of the lengths)."""
    from fastdata.formats import find_manifest, get_format
    from fastdata.loading.mix import mix

    datasets, weights = [], []
    for path, weight in parse_mix(text):
        manifest = find_manifest(Path(path)) if Path(path).exists() else None
        if not manifest:
            raise InvalidOptionError(f"--mix: {path!r} is not a converted dataset. Convert it first (fastdata convert "
                                     f"{path} OUT --format npy), then mix the output.")
        spec = get_format(manifest["format"])
        datasets.append((spec.map_dataset or spec.dataset)(path, transform=transform))
        weights.append(weight)
    return mix(datasets, weights)
