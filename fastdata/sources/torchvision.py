"""torchvision datasets by name (``torchvision:CIFAR10``) as conversion sources."""

from __future__ import annotations

import difflib
import inspect
import os
from typing import Any

from fastdata.errors import FastdataError, InvalidOptionError, SourceNotFoundError
from fastdata.sources.datasets import dataset_length
from fastdata.extras import install_command

TORCHVISION_PREFIX = "torchvision:"


def torchvision_dataset(
    name: str,
    *,
    root: str | os.PathLike | None = None,
    split: str = "train",
    download: bool = False,
    options: dict[str, Any] | None = None,
) -> Any:
    """Instantiate ``torchvision.datasets.<name>``, mapping ``split`` to its own argument."""
    try:
        import torchvision.datasets as tv_datasets
    except ImportError as exc:
        from fastdata.errors import DependencyMissingError

        raise DependencyMissingError(
            f"torchvision sources need torchvision. Install it with: {install_command('torchvision')}"
        ) from exc
    cls = getattr(tv_datasets, name, None)
    if not inspect.isclass(cls):
        known = [n for n in dir(tv_datasets) if inspect.isclass(getattr(tv_datasets, n)) and n[0].isupper()]
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise InvalidOptionError(f"Unknown torchvision dataset {name!r}.{hint}")
    if split not in ("train", "test"):
        raise InvalidOptionError(f"Unknown split {split!r}. Allowed: 'train', 'test'.")
    params = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = sorted(set(options or {}) - set(params))
    if unknown and not takes_any:
        allowed = ", ".join(n for n in params if n not in ("self", "root", "train", "split", "download")) or "none"
        raise InvalidOptionError(
            f"torchvision:{name} does not take option {unknown[0]!r} (--source-option). Its options: {allowed}."
        )
    kwargs: dict[str, Any] = {}
    if "root" in params:
        if root is None:
            raise InvalidOptionError(f"torchvision:{name} needs --root (the folder holding its files).")
        kwargs["root"] = str(root)
    if "train" in params:
        kwargs["train"] = split == "train"
    elif "split" in params:
        kwargs["split"] = split
    if "download" in params:
        kwargs["download"] = download
    kwargs.update(options or {})
    try:
        dataset = cls(**kwargs)
    except RuntimeError as exc:
        if "not found" in str(exc).lower():
            raise SourceNotFoundError(
                f"torchvision:{name} not found under root {str(root)!r} ({exc}). "
                "Pass --download to fetch it, or point --root at the folder that holds it."
            ) from exc
        raise _rejected(name, options, exc) from exc
    except FastdataError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the dataset's constructor raises for bad options
        raise _rejected(name, options, exc) from exc
    dataset_length(dataset, f"torchvision:{name}")
    return dataset


def _rejected(name: str, options: dict[str, Any] | None, exc: Exception) -> InvalidOptionError:
    given = ", ".join(f"{k}={v!r}" for k, v in sorted((options or {}).items())) or "no options"
    return InvalidOptionError(
        f"torchvision:{name} cannot be created with {given} ({type(exc).__name__}: {exc}). "
        "Check the --source-option values against the dataset's documentation."
    )
