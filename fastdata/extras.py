"""The optional dependencies: which extra of the distribution installs which module, and the one
error every feature raises when its module is missing.

fastdata is installed as ``torch-fastdata`` (the name ``fastdata`` on the package index belongs
to an unrelated library); it is imported as ``fastdata`` and its command is ``fastdata``.
``tests/test_extras.py`` checks this table against ``pyproject.toml`` and against every import in
the package, so an extra always installs what its feature imports.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import re
from types import ModuleType

from fastdata.errors import DependencyMismatchError, DependencyMissingError

DISTRIBUTION = "torch-fastdata"

# extra -> the modules its features import (each installed by that extra, imported only where used)
EXTRAS: dict[str, tuple[str, ...]] = {
    "torchvision": ("torchvision",),
    "plot": ("matplotlib",),
    "hdf5plugin": ("hdf5plugin",),
    "jpeg": ("simplejpeg",),
    # the fused decode's region decode loads the libturbojpeg 3 this wheel ships (fastdata.reader.region),
    # never its module (named like PyTurboJPEG's)
    "region": ("turbojpeg",),
    "ray": ("ray",),
    "remote": ("fsspec",),
    "s3": ("fsspec", "s3fs"),
    "gcs": ("fsspec", "gcsfs"),  # gs:// URLs
    "azure": ("fsspec", "adlfs"),  # az:// and abfs:// URLs
    "http": ("fsspec", "aiohttp"),
    "coco": ("pycocotools",),  # torchvision:CocoDetection / CocoCaptions read their annotation file with it
    "sbd": ("scipy",),  # torchvision:SBD reads its .mat files with it
    "testing": ("pytest",),  # fastdata.testing: the contract suites a format package runs on itself
    "parquet": ("pyarrow",),  # Parquet files and save_to_disk folders as sources
    # hf://datasets/ORG/NAME URLs (huggingface_hub's file system), datasets' own objects
    "hf": ("pyarrow", "fsspec", "huggingface_hub", "datasets"),
}


def install_command(extra: str) -> str:
    """The commands that install ``extra``: from the package index (``pip install
    'torch-fastdata[EXTRA]'``), or, until the distribution is published there, from a checkout
    of fastdata's source (``pip install '.[EXTRA]'``, run in the checkout)."""
    if extra not in EXTRAS:
        raise ValueError(f"Unknown extra {extra!r}. Known: {', '.join(map(repr, EXTRAS))}.")
    return f"pip install '{DISTRIBUTION}[{extra}]' or, in a checkout of fastdata, pip install '.[{extra}]'"


def require(module: str, *, extra: str, feature: str, otherwise: str | None = None) -> ModuleType:
    """Import ``module`` for ``feature``, or raise :class:`DependencyMissingError` naming the
    module and the command that installs ``extra`` (and ``otherwise``, what to do instead, when
    given). Call it where the feature is asked for (an option validated, a dataset opened), so a
    missing package is one clear error up front, never a failure on every sample. Every optional
    import of the package goes through here, so every such error has this one shape."""
    if module not in EXTRAS.get(extra, ()):
        raise ValueError(f"Module {module!r} is not installed by the extra {extra!r} (see fastdata.extras.EXTRAS).")
    if module == "torchvision" and torchvision_problem():
        raise DependencyMismatchError(f"{feature} needs torchvision, but {torchvision_problem()}")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        instead = f" (or {otherwise})." if otherwise else ""
        raise DependencyMissingError(f"{feature} needs the {module} package, which is not installed. "
                                     f"Install it with: {install_command(extra)}{instead}") from exc


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    """``(2, 14, 1)`` of ``"2.14.1+cu130"`` (a pre-release or local part left out)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def paired_torchvision(torch_version: str) -> str | None:
    """The torchvision release built with ``torch_version``: torch 2.M.P goes with torchvision
    0.(M+15).P (2.0.1 with 0.15.2); None for a torch outside that rule."""
    release = _release(torch_version)
    if len(release) < 3 or release[0] != 2:
        return None
    return "0.15.2" if release == (2, 0, 1) else f"0.{release[1] + 15}.{release[2]}"


def torchvision_suspect() -> bool:
    """Whether the installed torch and torchvision look unpaired, from their versions alone (no
    import: cheap enough for every command): another release than :func:`paired_torchvision`,
    or builds for other platforms (``+cpu`` and ``+cu130``)."""
    torch_version, vision_version = _version("torch"), _version("torchvision")
    if torch_version is None or vision_version is None or importlib.util.find_spec("torchvision") is None:
        return False
    paired = paired_torchvision(torch_version)
    local = [version.partition("+")[2] for version in (torch_version, vision_version)]
    return (paired is not None and _release(vision_version) != _release(paired)) or local[0] != local[1]


@functools.cache
def torchvision_problem() -> str | None:
    """None when torchvision is not installed or loads with its compiled operators; otherwise one
    line: which torch and torchvision are installed, the error, and the pair to install together.
    Imports torchvision (seconds): checked once per process."""
    if importlib.util.find_spec("torchvision") is None:
        return None
    try:
        import torch
        import torchvision  # noqa: F401

        torch.ops.torchvision.nms  # noqa: B018 - loaded only with torchvision's compiled operators
    except ImportError:
        return None
    except (RuntimeError, AttributeError, OSError) as exc:
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        torch_version = _version("torch") or torch.__version__
        vision_version = _version("torchvision") or "?"
        paired = paired_torchvision(torch_version)
        pair = (f"pip install torch=={torch_version.split('+')[0]} torchvision=={paired}" if paired else
                "pip install torch torchvision")
        return (f"torchvision {vision_version} does not work with torch {torch_version}: its compiled operators "
                f"do not load ({cause}). Install the two built together, from the same index (CPU or the same "
                f"CUDA): {pair} (torch 2.M goes with torchvision 0.(M+15)).")
    return None
