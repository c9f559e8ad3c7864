"""The format registry: one module per storage format, each registering a :class:`FormatSpec`.

The CLI choices, :func:`fastdata.open_dataset`, the benchmark sweep and the contract tests
iterate this registry, so a new format touches one module (and one test file).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fastdata.errors import InvalidOptionError, UnknownFormatError

_BUILTIN_MODULES = ("fastdata.formats.folder", "fastdata.formats.hdf5", "fastdata.formats.npy", "fastdata.formats.tar")
_REGISTRY: dict[str, "FormatSpec"] = {}
_loaded = False


@dataclass(frozen=True)
class FormatSpec:
    """What the rest of fastdata needs to know about one storage format.

    ``writer`` is None for read-only formats (the folder baseline). ``options`` is a frozen
    dataclass of format-specific conversion options; each field's ``metadata`` may hold
    ``help`` and ``parse`` (str -> value) for the CLI. ``read_manifest(path)`` returns the
    manifest dict when ``path`` holds a dataset of this format, else None.
    ``verify(path, manifest, *, deep)`` returns the problems (one message each, naming the
    file and sample) that this format's own checks find, beyond what :func:`fastdata.verify`
    checks for every format.
    """

    name: str
    dataset: type
    writer: type | None = None
    stores: tuple[str, ...] = ("raw", "encoded")
    suffix: str = ""
    layout_version: int = 1
    options: type | None = None
    read_manifest: Callable[[Path], dict[str, Any] | None] | None = None
    description: str = ""
    verify: Callable[..., list[str]] | None = None
    map_reader: type | None = None  # when ``dataset`` is iterable: its random-access counterpart

    @property
    def writable(self) -> bool:
        return self.writer is not None

    @property
    def map_dataset(self) -> type:
        """The map-style (random access) reader: ``dataset`` itself unless it is iterable."""
        from torch.utils.data import IterableDataset

        if self.map_reader is not None or issubclass(self.dataset, IterableDataset):
            return self.map_reader
        return self.dataset

    def make_options(self, values: dict[str, Any]) -> Any:
        """Build this format's options dataclass, refusing options it does not know."""
        known = {field.name for field in dataclasses.fields(self.options)} if self.options else set()
        unknown = sorted(set(values) - known)
        if unknown:
            allowed = ", ".join(repr(name) for name in sorted(known)) or "none"
            raise InvalidOptionError(
                f"Option {unknown[0]!r} does not apply to format {self.name!r}. "
                f"Its options: {allowed}."
            )
        return self.options(**values) if self.options else None


def register(spec: FormatSpec) -> FormatSpec:
    """Add a format to the registry (called at the end of each format module)."""
    _REGISTRY[spec.name] = spec
    return spec


def _load_builtin() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for module in _BUILTIN_MODULES:
            importlib.import_module(module)


def available_formats(*, writable: bool = False) -> list[str]:
    """Registered format names, sorted; ``writable=True`` leaves out read-only formats."""
    _load_builtin()
    return sorted(name for name, spec in _REGISTRY.items() if spec.writable or not writable)


def get_format(name: str, *, writable: bool = False) -> FormatSpec:
    """Look a format up by name, with an error that lists the available ones."""
    _load_builtin()
    spec = _REGISTRY.get(name) if isinstance(name, str) else None
    if spec is None or (writable and not spec.writable):
        names = ", ".join(repr(n) for n in available_formats(writable=writable))
        kind = "output format" if writable and spec is not None else "format"
        raise UnknownFormatError(f"Unknown {kind} {name!r}. Available formats: {names}.")
    return spec


def all_formats() -> list[FormatSpec]:
    _load_builtin()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def find_manifest(path: str | Path) -> dict[str, Any] | None:
    """The manifest of the converted dataset at ``path`` (read once), or None if it holds none:
    a directory's ``manifest.json``, or what a single-file format finds in a file."""
    from fastdata.manifest import MANIFEST_NAME, read_manifest_file

    path = Path(path)
    if path.is_dir():
        candidate = path / MANIFEST_NAME
        return read_manifest_file(candidate) if candidate.is_file() else None
    for spec in all_formats():
        if spec.read_manifest is not None:
            manifest = spec.read_manifest(path)
            if manifest is not None:
                return manifest
    return None
