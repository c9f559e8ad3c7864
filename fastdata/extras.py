"""The optional dependencies: which extra of the distribution installs which module, and the one
error every feature raises when its module is missing.

fastdata is installed as ``torch-fastdata`` (the name ``fastdata`` on the package index belongs
to an unrelated library); it is imported as ``fastdata`` and its command is ``fastdata``.
``tests/test_extras.py`` checks this table against ``pyproject.toml`` and against every import in
the package, so an extra always installs what its feature imports.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from fastdata.errors import DependencyMissingError

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
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        instead = f" (or {otherwise})." if otherwise else ""
        raise DependencyMissingError(f"{feature} needs the {module} package, which is not installed. "
                                     f"Install it with: {install_command(extra)}{instead}") from exc
