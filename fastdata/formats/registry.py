"""The format registry: every format found, by name.

Formats are discovered, never listed: every package under ``fastdata/formats/`` (found with
:mod:`pkgutil`) and every module named by an entry point of the ``fastdata.formats`` group (a
third-party package's ``[project.entry-points."fastdata.formats"]``) is imported once, and ends
by calling :func:`register` with its :class:`~fastdata.formats.base.FormatSpec`. A format whose
optional dependency is missing calls :func:`require` first: it is then listed with its install
command (:func:`missing_formats`) instead of failing at import, and asking for it raises
:class:`~fastdata.errors.DependencyMissingError` with that command.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import logging
import pkgutil
import warnings
from pathlib import Path
from typing import Iterator

from fastdata.errors import DependencyMissingError, InvalidOptionError, UnknownFormatError, fix_option
from fastdata.formats.base import FormatSpec, MissingFormat

ENTRY_POINT_GROUP = "fastdata.formats"
NO_EXTENSION_FORMAT = "tar"  # an output named without an extension (a directory of shards)
_PACKAGE = "fastdata.formats"
_REGISTRY: dict[str, FormatSpec] = {}
_MISSING: dict[str, MissingFormat] = {}
_imported: set[str] = set()  # format modules and entry points already loaded
logger = logging.getLogger(__name__)


class FormatUnavailableError(DependencyMissingError):
    """Raised by :func:`require` inside a format's package: its dependency is missing (discovery
    records the format as missing and goes on)."""


def register(spec: FormatSpec) -> FormatSpec:
    """Add a format to the registry (called at the end of each format's package). A name that
    is taken is refused: two formats cannot share one."""
    existing = _REGISTRY.get(spec.name)
    if existing is not None and existing != spec:
        raise InvalidOptionError(
            f"Format {spec.name!r} is already registered (reader {existing.dataset.__qualname__}). Give the new "
            "format another name; tests can swap one in with fastdata.formats.registered(spec)."
        )
    _MISSING.pop(spec.name, None)
    _REGISTRY[spec.name] = spec
    return spec


def require(name: str, *modules: str, install: str, suffixes: tuple[str, ...] = (), description: str = "") -> None:
    """Declare that format ``name`` needs ``modules``; call it at the top of the format's
    package, before importing them. When one is not installed, the format is recorded as
    missing (with ``install``, the command that installs it) and :class:`FormatUnavailableError`
    stops the package's import; discovery goes on with the other formats.

    >>> require("zarr", "zarr", install="pip install 'torch-fastdata[zarr]'", suffixes=(".zarr",))  # doctest: +SKIP
    """
    absent = tuple(module for module in modules if not _installed(module))
    if absent:
        missing = MissingFormat(name, absent, install, tuple(suffixes), description)
        if name not in _REGISTRY:
            _MISSING[name] = missing
        raise FormatUnavailableError(missing.message)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing, or half set up
        return False


def discover() -> None:
    """Import every format not imported yet: the packages under ``fastdata/formats/``, then the
    ``fastdata.formats`` entry points (a module, which registers itself, or a FormatSpec).
    Runs on the first registry lookup; call it again after installing a format's package in a
    running process."""
    package = importlib.import_module(_PACKAGE)
    for module in pkgutil.iter_modules(package.__path__):
        if module.ispkg:
            _load(f"{_PACKAGE}.{module.name}", lambda name=module.name: importlib.import_module(f"{_PACKAGE}.{name}"))
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        _load(f"entry point {entry.name} = {entry.value}", entry.load, plugin=True)


def _load(key: str, load, *, plugin: bool = False) -> None:
    if key in _imported:
        return
    _imported.add(key)
    try:
        loaded = load()
    except FormatUnavailableError as exc:
        logger.debug("%s: %s", key, exc)
        return
    except Exception as exc:  # noqa: BLE001 - a broken third-party plugin must not break fastdata
        if not plugin:
            raise
        warnings.warn(f"The format plugin {key} failed to load ({type(exc).__name__}: {exc}); it is left out. "
                      "Reinstall or remove the package that provides it.", RuntimeWarning, stacklevel=2)
        return
    if isinstance(loaded, FormatSpec):
        register(loaded)


def _discovered() -> None:
    if not _imported:
        discover()


@contextlib.contextmanager
def registered(spec: FormatSpec) -> Iterator[FormatSpec]:
    """Register ``spec`` for the duration of a ``with`` block (replacing a format of the same
    name), then restore the registry: for tests and experiments.

    >>> with registered(FormatSpec(name="mine", dataset=MyDataset, writer=MyWriter)):   # doctest: +SKIP
    ...     fastdata.convert(folder, "out", format="mine")
    """
    with restored():
        _REGISTRY[spec.name] = spec
        yield spec


@contextlib.contextmanager
def restored() -> Iterator[None]:
    """Whatever is registered (or discovered) inside the ``with`` block is forgotten after it:
    for tests that install a format for a while."""
    _discovered()
    saved = dict(_REGISTRY), dict(_MISSING), set(_imported)
    try:
        yield
    finally:
        for table, before in zip((_REGISTRY, _MISSING, _imported), saved):
            table.clear()
            table.update(before)


def available_formats(*, writable: bool = False) -> list[str]:
    """Registered format names, sorted; ``writable=True`` leaves out read-only formats."""
    _discovered()
    return sorted(name for name, spec in _REGISTRY.items() if spec.writable or not writable)


def all_formats() -> list[FormatSpec]:
    """Every registered format, sorted by name."""
    _discovered()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def missing_formats() -> list[MissingFormat]:
    """Formats found whose dependency is not installed, sorted by name (each with its
    ``install`` command)."""
    _discovered()
    return [_MISSING[name] for name in sorted(_MISSING)]


def get_format(name: str, *, writable: bool = False) -> FormatSpec:
    """Look a format up by name, with an error that lists the available ones (or, for a format
    whose dependency is missing, says how to install it)."""
    _discovered()
    spec = _REGISTRY.get(name) if isinstance(name, str) else None
    if spec is None and isinstance(name, str) and name in _MISSING:
        raise DependencyMissingError(_MISSING[name].message)
    if spec is None or (writable and not spec.writable):
        names = ", ".join(repr(n) for n in available_formats(writable=writable))
        kind = "output format" if writable and spec is not None else "format"
        raise UnknownFormatError(f"Unknown {kind} {name!r}. Available formats: {names}.")
    return spec


def format_for_output(output: str | Path, given: str | None = None) -> str:
    """The format to write ``output`` in, the way ``fastdata convert`` decides it.

    Without ``given``, the output's extension names it (``.h5``/``.hdf5`` hdf5, ``.npy`` npy,
    ``.tar`` tar; see each format's ``suffixes``), and a name without an extension is tar; an
    extension no format claims is refused rather than guessed (one that a format whose
    dependency is missing claims names the install command). ``given`` is checked against a
    recognised extension (``--format npy out/x.h5`` is refused); with no extension, or one no
    format claims, ``given`` is used as it is.
    """
    path = Path(output)
    extension = path.suffix.lower()
    named = next((spec for spec in all_formats() if spec.writable and extension in spec.suffixes), None)
    if given is not None:
        spec = get_format(given, writable=True)
        if named is not None and named.name != spec.name:
            renamed = path.with_suffix(spec.suffixes[0] if spec.suffixes else "")
            raise InvalidOptionError(
                f"--format {spec.name} does not match the output name {str(path)!r} ({path.suffix} is {named.name}). "
                f"Leave out {fix_option('format', spec.name)} (or pass {fix_option('format', named.name)}) to write "
                f"{named.name}, "
                f"or name the output {str(renamed)!r} to write {spec.name}."
            )
        return spec.name
    if named is not None:
        return named.name
    if not extension:
        return NO_EXTENSION_FORMAT
    missing = next((entry for entry in missing_formats() if extension in entry.suffixes), None)
    if missing is not None:
        raise DependencyMissingError(f"{missing.message} ({str(path)!r} is named for it).")
    known = ", ".join(sorted(s for spec in all_formats() if spec.writable for s in spec.suffixes))
    raise InvalidOptionError(
        f"Cannot tell the output format from the name {str(path)!r}: no format uses {path.suffix!r} "
        f"(known: {known}; no extension is {NO_EXTENSION_FORMAT}). Pass "
        f"{fix_option('format', 'NAME')} ({', '.join(available_formats(writable=True))}), or rename the output."
    )
