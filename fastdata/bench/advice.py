"""How to train with what ``fastdata bench`` recommends: the ``fastdata convert`` command and the
Python lines of the loader, for the user's own source.

Pure functions of the recommendation and the bench's options; nothing here measures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastdata.bench.config import BenchConfig
from fastdata.bench.runner import parse_resize
from fastdata.formats import get_format
from fastdata.loading.backends import BACKENDS, DEFAULT_BACKEND

OUTPUT_FOLDER = "out"
# The loader a read path measured (fastdata.bench.measure.make_loader), as the user writes it: the
# reader's own keywords, then the loader's call; {open} is how the dataset is opened.
LOADERS = {
    "fast": "loader = fastdata.loader(ds, batch_size={batch}, shuffle=True, {workers})",
    "fast iterable": "loader = torch.utils.data.DataLoader(ds, batch_size=None, {workers})  # ds collates each batch",
    "standard": "loader = torch.utils.data.DataLoader(ds, batch_size={batch}, shuffle=True, {workers})",
    "standard iterable": "loader = torch.utils.data.DataLoader(ds, batch_size={batch}, {workers})",
    "stream": "loader = torch.utils.data.DataLoader(ds, batch_size={batch}, {workers})",
}
BASELINE_OPENERS = {
    "folder": 'ds = fastdata.FolderDataset("{source}"{read})  # the folder as it is, read like ImageFolder',
    "torchvision": "ds = ...  # your torchvision dataset as it is, with a transform that gives tensors of one size",
}


def output_name(source: str, format_name: str) -> str:
    """Where the advice converts ``source`` to: ``out/<source's name><format's extension>``."""
    spec = get_format(format_name)
    suffix = spec.suffix or (spec.suffixes[0] if spec.suffixes else "")
    stem = source.split(":", 1)[1].lower() if source.startswith("torchvision:") else \
        Path(source.rstrip("/")).name.split(".")[0] or "dataset"
    return f"{OUTPUT_FOLDER}/{stem}{suffix}"


def _worker_keywords(picked: dict[str, Any], config: BenchConfig) -> str:
    workers = picked["num_workers"]
    words = [f"num_workers={workers}"]
    if picked["read_path"] == "fast" and picked["backend"] != DEFAULT_BACKEND:
        words.append(f"backend={picked['backend']!r}")
    if workers > 0 and config.persistent_workers:
        words.append("persistent_workers=True")
    if workers > 0 and config.start_method and BACKENDS[picked["backend"]].crosses_process:
        words.append(f"multiprocessing_context={config.start_method!r}")
    return ", ".join(words)


def how_to_use(picked: dict[str, Any], *, source: str, config: BenchConfig, baseline: str | None,
               converted: bool, root: str | None = None, opened: list[str] | None = None) -> dict[str, Any]:
    """``{"convert": the command or None, "python": [lines]}`` that train with ``picked`` (a
    ``summary["recommendation"]``) from ``source``. ``converted``: ``source`` is already a
    dataset of the picked format and store (nothing to convert); ``root``: a torchvision source's
    ``--root``; ``opened``: the lines that make the user's own Dataset ``ds`` (``--mix``'s
    ``fastdata.mix(...)``), where ``source`` is no import string."""
    size = parse_resize(config.resize)
    read = f", resize={size!r}" if size and picked["store"] != "raw" else ""
    transform = ([f"# and the transform you benchmarked (--transform {config.transform}): transform=..."]
                 if config.transform != "none" else [])
    command = None
    if picked["format"] == baseline and baseline in BASELINE_OPENERS:
        opening = [BASELINE_OPENERS[baseline].format(source=source, read=read)]
        iterable = False
    elif picked["store"] == "-":  # fastdata bench module:name or --mix: the user's own Dataset, as it is
        module, _, name = source.partition(":")
        opening = opened or [f"from {module} import {name} as ds"]
        iterable = False
    else:
        spec = get_format(picked["format"])
        target = source if converted else output_name(source, picked["format"])
        if not converted:
            flags = [f"--root {root}"] if root and source.startswith("torchvision:") else []
            flags += [f"--store {picked['store']}"] + ([f"--resize {config.resize}"] if size and
                                                        picked["store"] == "raw" else [])
            command = f"fastdata convert {source} {target} {' '.join(flags)}"
        iterable = spec.iterable
        batch = f", batch_size={config.batch_size}" if iterable and picked["read_path"] == "fast" else ""
        opening = [f'ds = fastdata.open_dataset("{target}"{read}{batch})']
    way = picked["read_path"] + (" iterable" if iterable and picked["read_path"] != "stream" else "")
    loader = LOADERS[way].format(batch=config.batch_size, workers=_worker_keywords(picked, config))
    return {"convert": command, "python": ["import fastdata, torch", *opening, *transform, loader]}


def how_lines(how: dict[str, Any], source_words: str) -> list[str]:
    """The report's lines: ``how, for <source_words>:`` and the command and code, indented."""
    lines = [f"how, for {source_words}:"]
    if how["convert"]:
        lines.append(f"  {how['convert']}")
    return lines + [f"  {line}" for line in how["python"]]
