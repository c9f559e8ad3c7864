"""The format registry: one module per storage format, each registering a :class:`FormatSpec`.

The CLI choices, :func:`fastdata.open_dataset`, the benchmark sweep and the contract tests
iterate this registry, so a new format touches one module (and one test file).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from fastdata.errors import InvalidOptionError, UnknownFormatError

_BUILTIN_MODULES = ("fastdata.formats.folder", "fastdata.formats.hdf5", "fastdata.formats.npy", "fastdata.formats.tar")
_REGISTRY: dict[str, "FormatSpec"] = {}
NO_EXTENSION_FORMAT = "tar"  # an output named without an extension (a directory of shards)
_loaded = False


@dataclass(frozen=True)
class FormatSpec:
    """What the rest of fastdata needs to know about one storage format.

    ``dataset`` is the reader :func:`fastdata.open_dataset` returns; when it is iterable,
    ``map_reader`` is its random-access counterpart (what ``fastdata.loader``, a shuffling
    DataLoader and a conversion from this format use), and ``self_batching`` says that it can
    collate whole batches itself (``dataset(path, batch_size=...)``). ``writer`` is None for
    read-only formats; ``baseline`` marks what the bench compares against (the source as it
    is). ``suffixes`` are the output-name extensions (lower case) that select this format when
    ``--format`` is not given (:func:`format_for_output`). ``options`` is a frozen dataclass of format-specific conversion options; each field's
    ``metadata`` may hold ``help`` and ``metavar`` for the CLI. ``read_manifest(path)`` (single-file
    formats only; directories carry ``manifest.json``) returns the manifest dict when the file
    holds a dataset of this format, else None. ``verify(path, manifest, *, deep)`` returns the
    problems (one message each, naming the file and sample) that this format's own checks
    find, beyond what :func:`fastdata.verify` checks for every format.
    """

    name: str
    dataset: type
    writer: type | None = None
    stores: tuple[str, ...] = ("raw", "encoded")
    suffix: str = ""
    suffixes: tuple[str, ...] = ()
    layout_version: int = 1
    options: type | None = None
    read_manifest: Callable[[Path], dict[str, Any] | None] | None = None
    description: str = ""
    verify: Callable[..., list[str]] | None = None
    map_reader: type | None = None
    self_batching: bool = False
    baseline: bool = False

    @property
    def writable(self) -> bool:
        return self.writer is not None

    @property
    def iterable(self) -> bool:
        """Whether ``dataset`` is an iterable (streaming) reader."""
        from torch.utils.data import IterableDataset

        return issubclass(self.dataset, IterableDataset)

    @property
    def map_dataset(self) -> type | None:
        """The map-style (random access) reader: ``dataset`` itself unless it is iterable."""
        return self.map_reader if self.iterable else self.dataset

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
    """Add a format to the registry (called at the end of each format's package). A name that
    is taken is refused: two formats cannot share one."""
    existing = _REGISTRY.get(spec.name)
    if existing is not None and existing != spec:
        raise InvalidOptionError(
            f"Format {spec.name!r} is already registered (reader {existing.dataset.__qualname__}). Give the new "
            "format another name; tests can swap one in with fastdata.formats.registered(spec)."
        )
    _REGISTRY[spec.name] = spec
    return spec


@contextlib.contextmanager
def registered(spec: FormatSpec) -> Iterator[FormatSpec]:
    """Register ``spec`` for the duration of a ``with`` block (replacing a format of the same
    name), then restore the registry: for tests and experiments.

    >>> with registered(FormatSpec(name="mine", dataset=MyDataset, writer=MyWriter)):   # doctest: +SKIP
    ...     fastdata.convert(folder, "out", format="mine")
    """
    _load_builtin()
    previous = _REGISTRY.get(spec.name)
    _REGISTRY[spec.name] = spec
    try:
        yield spec
    finally:
        if previous is None:
            _REGISTRY.pop(spec.name, None)
        else:
            _REGISTRY[spec.name] = previous


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


def format_for_output(output: str | Path, given: str | None = None) -> str:
    """The format to write ``output`` in, the way ``fastdata convert`` decides it.

    Without ``given``, the output's extension names it (``.h5``/``.hdf5`` hdf5, ``.npy`` npy,
    ``.tar`` tar; see each format's ``suffixes``), and a name without an extension is tar; an
    extension no format claims is refused rather than guessed. ``given`` is checked against a
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
                f"Leave out --format (or pass --format {named.name}) to write {named.name}, "
                f"or name the output {str(renamed)!r} to write {spec.name}."
            )
        return spec.name
    if named is not None:
        return named.name
    if not extension:
        return NO_EXTENSION_FORMAT
    known = ", ".join(sorted(s for spec in all_formats() if spec.writable for s in spec.suffixes))
    raise InvalidOptionError(
        f"Cannot tell the output format from the name {str(path)!r}: no format uses {path.suffix!r} "
        f"(known: {known}; no extension is {NO_EXTENSION_FORMAT}). Pass --format "
        f"({', '.join(available_formats(writable=True))}), or rename the output."
    )


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
