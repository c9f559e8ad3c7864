"""Procedural demo images with realistic compressibility (not noise, not flat colour).

Each image is a smooth two-colour gradient with a few filled shapes and mild sensor-like
noise, so PNG compresses it roughly 1.5-3x and JPEG behaves as on photographs. Seeded:
the same arguments always give the same files.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CLASS_NAMES = ("airplane", "bird", "car", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def demo_image(rng: np.random.Generator, height: int, width: int, label: int) -> Image.Image:
    """One procedural RGB image; ``label`` shifts its hue so classes differ visibly."""
    hue = np.array([label * 25 % 256, (label * 70 + 80) % 256, (255 - label * 20) % 256], dtype=np.float32)
    start = np.clip(hue + rng.normal(0, 30, 3), 0, 255)
    end = np.clip(255 - start + rng.normal(0, 30, 3), 0, 255)
    angle = rng.uniform(0, np.pi)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    t = (np.cos(angle) * xs / width + np.sin(angle) * ys / height + 1) / 2
    pixels = start * (1 - t[..., None]) + end * t[..., None]
    image = Image.fromarray(pixels.astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(1, 4))):
        x0, y0 = rng.integers(0, width), rng.integers(0, height)
        x1 = min(width, x0 + int(rng.integers(width // 6 + 1, width // 2 + 2)))
        y1 = min(height, y0 + int(rng.integers(height // 6 + 1, height // 2 + 2)))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=colour)
    noisy = np.asarray(image, dtype=np.int16) + rng.integers(-6, 7, (height, width, 3), dtype=np.int16)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def make_demo_folder(
    root: str | os.PathLike,
    *,
    small: int = 2000,
    small_size: int = 32,
    large: int = 0,
    large_sides: tuple[int, int] = (256, 512),
    classes: int = 10,
    seed: int = 0,
) -> Path:
    """Write an ImageFolder-layout folder: ``small`` PNGs of ``small_size`` px square and
    ``large`` JPEGs with sides drawn from ``large_sides`` (ImageNet-like, mixed sizes)."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    names = [CLASS_NAMES[i] if i < len(CLASS_NAMES) else f"class{i:03d}" for i in range(classes)]
    for name in names:
        (root / name).mkdir(parents=True, exist_ok=True)
    for i in range(small):
        label = i % classes
        demo_image(rng, small_size, small_size, label).save(root / names[label] / f"{i:06d}.png")
    for i in range(large):
        label = i % classes
        height, width = (int(v) for v in rng.integers(large_sides[0], large_sides[1] + 1, 2))
        image = demo_image(rng, height, width, label)
        image.save(root / names[label] / f"large-{i:05d}.jpg", quality=90)
    return root


COMPLETE_MARK = ".complete"
OWNER_MARK = ".fastdata-demo"


def demo_folder(root: str | os.PathLike, **kwargs) -> Path:
    """:func:`make_demo_folder` once: an existing complete folder at ``root`` (marked by a
    ``.complete`` file, which ImageFolder listings skip as hidden) is reused; otherwise it is
    written under a temporary name and renamed, so an interrupted run never leaves half a folder
    that looks complete. Only folders that carry fastdata's own mark are ever removed.
    ``kwargs`` go to :func:`make_demo_folder`."""
    import shutil

    from fastdata.errors import OutputExistsError

    root = Path(root)
    if (root / COMPLETE_MARK).exists():
        return root
    partial = root.with_name(root.name + ".partial")
    for stale in (partial, root):
        if stale.exists():
            if not (stale / OWNER_MARK).exists():
                raise OutputExistsError(
                    f"{str(stale)!r} exists and is not a demo folder fastdata made; it is not replaced. "
                    "Move it away, or choose another folder."
                )
            shutil.rmtree(stale)  # a demo folder of ours that an earlier run did not finish
    partial.mkdir(parents=True)
    (partial / OWNER_MARK).touch()
    make_demo_folder(partial, **kwargs)
    (partial / COMPLETE_MARK).touch()
    os.replace(partial, root)
    return root
