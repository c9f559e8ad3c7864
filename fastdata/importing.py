"""Import strings: ``package.module:name`` names a Python object, as uvicorn and gunicorn do.

``fastdata bench`` and ``fastdata tune`` take any Dataset this way (a Dataset object, or a
zero-argument callable that returns one), and ``--step``/``--transform`` take functions. The
current directory is importable, so ``fastdata tune mydata:train_set`` finds ``./mydata.py``.
``torchvision:NAME`` keeps its meaning (a torchvision dataset), and an existing path is a path.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path
from typing import Any

from fastdata.errors import InvalidOptionError

_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_TORCHVISION = "torchvision:"


def is_import_string(text: Any) -> bool:
    """Whether ``text`` is ``module:attribute`` (not ``torchvision:NAME``, not an existing path)."""
    if not isinstance(text, str) or text.startswith(_TORCHVISION) or not _PATTERN.match(text):
        return False
    return not Path(text).exists()


def load_object(text: str, *, what: str = "object") -> Any:
    """The object ``module:attribute`` names (dotted attributes allowed: ``mod:Class.attr``).

    Errors name the import string and say which part failed, never a bare ImportError."""
    if not _PATTERN.match(text):
        raise InvalidOptionError(f"Invalid import string {text!r} for the {what}. Use 'package.module:name'.")
    module_name, attribute = text.split(":", 1)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        value: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise InvalidOptionError(
                f"Cannot import module {module_name!r} for the {what} {text!r}: no such module. "
                "Run from the directory that holds it, or install its package."
            ) from None
        raise InvalidOptionError(f"Importing {module_name!r} for the {what} {text!r} failed: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - the user's module raised while importing
        raise InvalidOptionError(
            f"Importing {module_name!r} for the {what} {text!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise InvalidOptionError(f"Module {module_name!r} has no attribute {attribute!r} (the {what} {text!r}).")
        value = getattr(value, part)
    return value


def load_dataset(text: str) -> Any:
    """The Dataset ``module:name`` names: the object itself, or what a zero-argument callable
    (a function, a class) returns."""
    value = load_object(text, what="dataset")
    if not _is_dataset(value) and callable(value):
        try:
            value = value()
        except TypeError as exc:
            raise InvalidOptionError(
                f"{text!r} is callable but calling it with no arguments failed ({exc}). Point at a Dataset "
                "object, or at a function that takes no arguments and returns one."
            ) from exc
    if not _is_dataset(value):
        raise InvalidOptionError(
            f"{text!r} is a {type(value).__name__}, not a map-style Dataset (it needs __getitem__ and __len__)."
        )
    return value


def load_callable(text: str, *, what: str) -> Any:
    value = load_object(text, what=what)
    if not callable(value):
        raise InvalidOptionError(f"The {what} {text!r} is a {type(value).__name__}, not a function.")
    return value


def _is_dataset(value: Any) -> bool:
    if isinstance(value, type):
        return False
    return hasattr(value, "__getitem__") and hasattr(value, "__len__")
