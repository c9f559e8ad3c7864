"""Listing an image folder exactly like torchvision's ``ImageFolder`` (hidden files left out,
symlinked folders followed once). Shared by the folder source and the ``folder`` baseline reader,
so neither depends on the other.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from fastdata.errors import EmptySourceError, SourceLayoutError, SourceNotFoundError

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def is_image_file(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def top_level_images(root: Path) -> list[str]:
    """Sorted names of the non-hidden image files directly inside ``root`` (not in a class folder)."""
    with os.scandir(root) as entries:
        return sorted(e.name for e in entries if not e.name.startswith(".") and is_image_file(e.name)
                      and not e.is_dir())


def _refuse_top_level_images(root: Path, classes: list[str]) -> None:
    """Images beside class folders are a layout mistake: ImageFolder would leave them out
    without a word, and fastdata does not convert a folder with part of its images dropped."""
    loose = top_level_images(root)
    if not loose:
        return
    shown = ", ".join(map(repr, loose[:3])) + (", ..." if len(loose) > 3 else "")
    folders = ", ".join(map(repr, classes[:3])) + (", ..." if len(classes) > 3 else "")
    raise SourceLayoutError(
        f"{str(root)!r} holds {len(loose)} image(s) at its top level ({shown}) beside its {len(classes)} class "
        f"folder(s) ({folders}); only images inside class folders are samples (ImageFolder layout: "
        f"{root.name}/cat/001.jpg), so these {len(loose)} would be left out. Move them into a class folder "
        f"(e.g. {str(root / 'unlabelled')!r}), or out of {str(root)!r} to use only the class folders."
    )


def find_classes(root: Path) -> list[str]:
    """Class names: sorted non-hidden sub-folders of ``root`` (symlinked folders count)."""
    with os.scandir(root) as entries:
        return sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))


def _walk_once(top: Path) -> list[tuple[str, list[str]]]:
    """(folder, file names) for every folder under ``top``, each real folder visited once.

    Follows symlinked folders like ``os.walk(followlinks=True)`` but never twice into the same
    folder, so symlink loops end. Hidden folders and files are left out.
    """
    seen: set[tuple[int, int]] = set()
    found: list[tuple[str, list[str]]] = []
    pending = [str(top)]
    while pending:
        folder = pending.pop()
        try:
            stat = os.stat(folder)
        except OSError:
            continue
        if (stat.st_dev, stat.st_ino) in seen:
            continue
        seen.add((stat.st_dev, stat.st_ino))
        files, subfolders = [], []
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                is_folder = entry.is_dir()
            except OSError:
                is_folder = False
            (subfolders if is_folder else files).append(entry.name)
        found.append((folder, files))
        pending.extend(os.path.join(folder, name) for name in sorted(subfolders, reverse=True))
    return found


def scan_folder(root: str | os.PathLike) -> tuple[list[str], list[int], dict[str, int]]:
    """List an image folder like torchvision's ``ImageFolder``.

    Returns (relative paths, labels, class_to_idx) in ImageFolder's sample order. Images at the
    top level beside the class folders, which ImageFolder would leave out silently, are refused
    (:class:`~fastdata.errors.SourceLayoutError` naming how many and the fix).
    """
    root = Path(root)
    if not root.exists():
        raise SourceNotFoundError(f"Source folder {str(root)!r} does not exist.")
    if not root.is_dir():
        raise SourceNotFoundError(
            f"Source {str(root)!r} is not a folder, nor a file fastdata reads. Give an image folder (one "
            "sub-folder per class), WebDataset shards (.tar files, or a folder of them), Parquet files (a .parquet "
            "file, a folder or glob of them, hf://datasets/ORG/NAME), a datasets save_to_disk folder, a dataset "
            "written by 'fastdata convert', a torchvision dataset such as 'torchvision:CIFAR10', or module:name "
            "(a map-style Dataset in your own module)."
        )
    classes = find_classes(root)
    if not classes:
        raise EmptySourceError(
            f"{str(root)!r} has no class folders. Put images in one sub-folder per class "
            f"(ImageFolder layout: {root.name}/cat/001.jpg, {root.name}/dog/002.png)."
        )
    _refuse_top_level_images(root, classes)
    paths: list[str] = []
    labels: list[int] = []
    empty: list[str] = []
    for label, name in enumerate(classes):
        before = len(paths)
        for folder, files in sorted(_walk_once(root / name)):
            relative = os.path.relpath(folder, root)
            paths.extend(
                os.path.join(relative, f).replace(os.sep, "/") for f in sorted(files) if is_image_file(f)
            )
        labels.extend([label] * (len(paths) - before))
        if len(paths) == before:
            empty.append(name)
    if not paths:
        raise EmptySourceError(
            f"{str(root)!r} has class folders but no images with extensions "
            f"{', '.join(IMG_EXTENSIONS)}."
        )
    if empty:
        warnings.warn(
            f"{str(root)!r}: class folder(s) {', '.join(map(repr, empty))} hold no images; "
            "their class indices are kept.",
            stacklevel=2,
        )
    return paths, labels, {name: i for i, name in enumerate(classes)}


def printable(path: str) -> str:
    """A file name as text that can always be printed and stored in JSON: bytes that are not
    UTF-8 (kept by Python as surrogates) appear as ``\\xNN``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")
