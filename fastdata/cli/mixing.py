"""``--mix PATH:WEIGHT,PATH:WEIGHT,...`` (or ``--mix mix.json``) for ``fastdata bench`` and
``fastdata tune``: a :func:`fastdata.mix` of converted datasets, each read map-style (a tar dataset
through its indexed reader, ``TarIndexedDataset``: a mix needs random access).

The file form, for a mix with its own length and seed (paths relative to the file's folder)::

    {"datasets": [{"path": "a.npy", "weight": 3}, {"path": "b-shards", "weight": 1}],
     "length": 100000, "seed": 0}
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from fastdata.errors import InvalidOptionError

HELP = ("a weighted mix of converted datasets instead of SOURCE: PATH:WEIGHT,PATH:WEIGHT,... (e.g. "
        "a.npy:3,b-shards:1; tar datasets are read map-style, as TarIndexedDataset); each epoch draws the sum of "
        "their lengths in those proportions (fastdata.mix, docs/reading.md). Or a .json file: "
        '{"datasets": [{"path": ..., "weight": ...}, ...], "length": N, "seed": S} (length and seed optional)')

_KEYS = {"datasets", "length", "seed"}


def mix_spec(text: str) -> tuple[list[tuple[str, float]], int | None, int]:
    """``([(path, weight), ...], length, seed)`` that ``--mix`` names: PATH:WEIGHT pairs (length
    None: the sum of the lengths; seed 0), or a ``.json`` file."""
    if Path(text).suffix.lower() != ".json":
        return parse_mix(text), None, 0
    return read_mix_file(Path(text))


def read_mix_file(path: Path) -> tuple[list[tuple[str, float]], int | None, int]:
    """The mix a JSON file describes; one line naming the file and what is wrong otherwise."""
    usage = ('Write {"datasets": [{"path": "a.npy", "weight": 3}, {"path": "b-shards", "weight": 1}], '
             '"length": 100000, "seed": 0} (length and seed optional).')
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise InvalidOptionError(f"--mix: {str(path)!r} does not exist. {usage}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InvalidOptionError(f"--mix: cannot read {str(path)!r} as JSON ({error}). {usage}") from None
    unknown = sorted(set(document) - _KEYS) if isinstance(document, dict) else []
    entries = document.get("datasets") if isinstance(document, dict) else None
    problem = ("it is not a JSON object with a 'datasets' list" if not isinstance(entries, list) else
               f"unknown key {unknown[0]!r}" if unknown else
               "'datasets' names fewer than two datasets" if len(entries) < 2 else None)
    if problem is None:
        for number, entry in enumerate(entries):
            weight = entry.get("weight", 1) if isinstance(entry, dict) else None
            if not (isinstance(entry, dict) and isinstance(entry.get("path"), str) and set(entry) <= {"path", "weight"}
                    and isinstance(weight, (int, float)) and not isinstance(weight, bool) and math.isfinite(weight)
                    and weight >= 0):
                problem = f"dataset {number} ({json.dumps(entry)[:80]}) is not {{\"path\": STRING, \"weight\": NUMBER >= 0}}"
                break
    length, seed = (document.get("length"), document.get("seed", 0)) if isinstance(document, dict) else (None, 0)
    for key, value, least in (("length", length, 0), ("seed", seed, None)):
        if problem is None and value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                                      or (least is not None and value < least)):
            problem = f"{key!r} is {json.dumps(value)[:40]}, not an integer{' >= 0' if least is not None else ''}"
    if problem is not None:
        raise InvalidOptionError(f"--mix: invalid mix file {str(path)!r}: {problem}. {usage}")
    return [(str(path.parent / entry["path"]), float(entry.get("weight", 1))) for entry in entries], length, seed


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


def _mixed_readers(entries: list[tuple[str, float]]) -> list[Any]:
    """The map-style reader class of each converted dataset ``entries`` names."""
    from fastdata.formats import find_manifest, get_format

    readers = []
    for path, _ in entries:
        manifest = find_manifest(Path(path)) if Path(path).exists() else None
        if not manifest:
            raise InvalidOptionError(f"--mix: {path!r} is not a converted dataset. Convert it first (fastdata convert "
                                     f"{path} OUT --format npy), then mix the output.")
        spec = get_format(manifest["format"])
        readers.append(spec.map_dataset or spec.dataset)
    return readers


def open_mix(text: str, *, transform: Any = None) -> Any:
    """The :func:`fastdata.mix` that ``--mix`` names (PATH:WEIGHT pairs: seed 0, one epoch = the
    sum of the lengths; a JSON file: its length and seed)."""
    from fastdata.loading.mix import mix

    entries, length, seed = mix_spec(text)
    datasets = [reader(path, transform=transform) for reader, (path, _) in zip(_mixed_readers(entries), entries)]
    return mix(datasets, [weight for _, weight in entries], length=length, seed=seed)


def mix_lines(text: str) -> list[str]:
    """The Python that builds the mix ``--mix`` names, as :func:`open_mix` does:
    ``ds = fastdata.mix([fastdata.MemmapDataset("a.npy"), ...], [3, 1])`` (after an import line
    for a reader that another package provides)."""
    entries, length, seed = mix_spec(text)
    imports, opened = [], []
    for reader, (path, _) in zip(_mixed_readers(entries), entries):
        if reader.__module__.startswith("fastdata."):  # fastdata's readers: each at the package's top level
            name = f"fastdata.{reader.__name__}"
        else:
            name = f"{reader.__module__}.{reader.__qualname__}"
            imports.append(f"import {reader.__module__}")
        opened.append(f"{name}({json.dumps(path)})")
    weights = ", ".join(f"{weight:g}" for _, weight in entries)
    options = (f", length={length}" if length is not None else "") + (f", seed={seed}" if seed else "")
    return [*dict.fromkeys(imports), f"ds = fastdata.mix([{', '.join(opened)}], [{weights}]{options})"]
