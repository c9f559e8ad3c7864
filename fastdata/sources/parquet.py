"""Parquet files, ``save_to_disk`` folders and ``datasets.Dataset`` objects as conversion sources
(docs/converting.md, "Parquet and Hugging Face datasets").

Rows are samples, columns fields (:mod:`fastdata.sources.columns`). The tables are read one group
at a time (a Parquet row group, an Arrow record batch): each conversion process keeps the group
its rows lie in, so memory is bounded by a group, never by a file; reading starts from the files'
metadata only. Samples are named ``<file> row <R>`` (the row within its file), so every error
names the file, the row and (:class:`CellError`) the column. Units of work are files x row
groups (:meth:`TableSource.unit_bounds`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fastdata.errors import FastdataError, InvalidOptionError, SourceReadError, fix_option
from fastdata.extras import require
from fastdata.fields import CLASS_IDS
from fastdata.images import ReadOptions
from fastdata.remote.failures import one_line
from fastdata.sources.base import Protected, Source
from fastdata.sources.columns import (CellContext, ClassNameKind, Column, check_class_label, check_field_names, choose,
                                      class_names_column, column_of, detect_image_bytes, hf_features, is_text)
from fastdata.sources.saved_tables import ArrowFiles, ObjectTable, is_saved_dataset
from fastdata.sources.tables import ParquetFiles, has_parquet, is_parquet_spec
from fastdata.urls import is_url


class CellError(ValueError):
    """A cell that cannot become its field's value: the message names the column."""

    def __init__(self, column: str, reason: str):
        super().__init__(f"column {column!r}: {reason}")
        self.column = column


class _RowNames:
    """``keys``: every sample's name, computed when asked (no list of millions of strings)."""

    def __init__(self, source: "TableSource"):
        self.source = source

    def __len__(self) -> int:
        return int(self.source.starts[-1])

    def __getitem__(self, index: int) -> str:
        return self.source.sample_name(index)


class _RowLabels:
    """``labels``: each sample's label, read with its row's group."""

    def __init__(self, source: "TableSource"):
        self.source = source

    def __len__(self) -> int:
        return int(self.source.starts[-1])

    def __getitem__(self, index: int) -> int:
        return self.source.label_of(index)


class TableSource(Source):
    """Rows of Arrow tables (see the module docstring); ``columns`` chooses and orders the
    columns, ``label_column`` names the label (default: the one ``ClassLabel`` column)."""

    layout = "dict"  # records by column name (the classic (image, label) when those are the two columns)
    has_files = True  # the image column's encoded bytes are kept as they are with --store encoded

    def __init__(self, tables: Any, *, columns: tuple[str, ...] | None = None, label_column: str | None = None,
                 kind: str = "parquet"):
        self.tables, self.kind = tables, kind
        first = tables.schema(0)
        features = hf_features(first)
        where = tables.name(0)
        every = [column_of(f.name, f.type, features.get(f.name), where) for f in first]
        chosen, label = choose(every, columns, label_column, where)
        self._check_shards(first, [c.name for c in chosen])
        if label is not None and is_text(label):  # a string label column: the values it holds are the classes
            label = class_names_column(label, self._distinct(label.name))
            chosen = [label if c.name == label.name else c for c in chosen]
        self.columns = detect_image_bytes(chosen, self._first_cells([c.name for c in chosen]))
        self.label = next((c for c in self.columns if label is not None and c.name == label.name), None)
        self.image = next((c for c in self.columns if c.kind.image), None)
        if not self.is_classic:
            check_field_names(self.columns, where)
        if self.image is None:
            raise InvalidOptionError(f"{where}: no column holds images (columns: {', '.join(c.name for c in every)}); "
                                     "fastdata stores samples with at least one image (an Image feature, or binary "
                                     "image files).")
        self.selected, self.label_column = columns, label_column
        self.class_to_idx = {name: i for i, name in enumerate(self.label.names)} if self.label and self.label.names else {}
        self.kinds = {c.name: c.kind.hint for c in self.columns if c.kind.hint is not None}
        # a label column named otherwise is a field of its own, marked as holding class ids (verify checks them)
        self.field_meta = {self.label.name: {CLASS_IDS: True}} if self.class_to_idx and self.label.name not in (
            "label", "cls") else {}
        self._plan_rows()
        self.keys = _RowNames(self)
        self.labels = _RowLabels(self)
        self._group: tuple[int, Any] | None = None

    # --- planning (metadata only) -------------------------------------------------------

    def _check_shards(self, first: Any, names: list[str]) -> None:
        """Every file has the chosen columns, with the first file's types."""
        for number in range(1, len(self.tables)):
            schema = self.tables.schema(number)
            for name in names:
                index = schema.get_field_index(name)
                if index < 0:
                    raise InvalidOptionError(f"{self.tables.name(number)}: has no column {name!r}, which "
                                             f"{self.tables.name(0)} has. Every file needs the same columns (or leave "
                                             f"it out with {fix_option('columns', 'NAMES')}).")
                if schema.field(index).type != first.field(name).type:
                    raise InvalidOptionError(
                        f"{self.tables.name(number)}: column {name!r} is {schema.field(index).type}, but it is "
                        f"{first.field(name).type} in {self.tables.name(0)}. Every file needs the same column types.")
            self._check_features(number, first, schema, names)

    def _check_features(self, number: int, first_schema: Any, schema: Any, names: list[str]) -> None:
        """File ``number``'s Hugging Face features mean what the first file's do for every chosen
        column (ClassLabel names above all: a label means the class its own file names); how
        they are written (``Sequence`` or ``List``, a ``Value`` left out) does not matter."""
        first, features = hf_features(first_schema), hf_features(schema)
        for name in names:
            if _meaning(schema, features, name) != _meaning(first_schema, first, name):
                raise InvalidOptionError(
                    f"{self.tables.name(number)}: column {name!r} is {_feature_words(features.get(name))}, but it is "
                    f"{_feature_words(first.get(name))} in {self.tables.name(0)}. Every file needs the same features "
                    "(a ClassLabel's names in the same order): convert the files apart, or leave the column out with "
                    f"{fix_option('columns', 'NAMES')}.")

    def _first_cells(self, names: list[str]) -> dict[str, Any]:
        """Each column's first cell that is not null, in the first group (binary columns are told
        images by them)."""
        for number in range(len(self.tables)):
            if any(self.tables.groups(number)):
                group = next(g for g, rows in enumerate(self.tables.groups(number)) if rows)
                try:
                    found: dict[str, Any] = {}
                    for batch in self.tables.slices(number, group, names, SLICE_ROWS):  # slices, not the group
                        for name in names:
                            if found.get(name) is None:
                                found[name] = _first_valid(batch.column(name))
                        if all(found.get(name) is not None for name in names):
                            break
                    return {name: found.get(name) for name in names}
                except FastdataError:
                    raise
                except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a damaged row group
                    raise InvalidOptionError(
                        f"{self.tables.name(number)}: row group {group} cannot be read ({type(exc).__name__}: "
                        f"{one_line(str(exc))[:160]}); the file is damaged. Write it again, or leave it out.") from exc
        return {}

    def _distinct(self, name: str) -> set[str]:
        """Column ``name``'s distinct values (nulls left out) in every group of every file: one
        pass over that column only. A group that cannot be read is left to its rows (bad rows)."""
        import pyarrow.compute as pc

        values: set[str] = set()
        for number in range(len(self.tables)):
            for group, rows in enumerate(self.tables.groups(number)):
                try:
                    for batch in self.tables.slices(number, group, [name], SCAN_ROWS) if rows else ():
                        values.update(pc.unique(batch.column(0)).to_pylist())
                except FastdataError:
                    raise
                except Exception:  # noqa: BLE001 - pyarrow's errors for a damaged row group: each row fails later
                    continue
        values.discard(None)
        return values

    def _plan_rows(self) -> None:
        """Group boundaries: which file and group each row lies in."""
        files, groups, firsts, counts = [], [], [], []
        for number in range(len(self.tables)):
            first = 0
            for group, rows in enumerate(self.tables.groups(number)):
                files.append(number)
                groups.append(group)
                firsts.append(first)
                counts.append(rows)
                first += rows
        self.group_files = np.asarray(files, dtype=np.int32)
        self.group_numbers = np.asarray(groups, dtype=np.int32)
        self.group_firsts = np.asarray(firsts, dtype=np.int64)  # the group's first row within its file
        self.starts = np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))
        if self.starts[-1] == 0:
            from fastdata.errors import EmptySourceError

            raise EmptySourceError(f"{self.tables.spec!r}: the tables hold no rows.")

    def unit_bounds(self) -> list[int]:
        """Every row group's first row: units are files x row groups (a longer group cut every
        ``--unit-samples`` rows), so a unit is read from one group, by one process."""
        return [int(start) for start in self.starts]

    @property
    def is_classic(self) -> bool:
        """Two columns, the image and the label: samples are ``(image, label)``."""
        return self.label is not None and len(self.columns) == 2

    # --- rows -------------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__, _group=None)

    def _locate(self, index: int) -> tuple[int, int]:
        if not 0 <= index < self.starts[-1]:
            raise IndexError(index)
        group = int(np.searchsorted(self.starts, index, side="right")) - 1
        return group, index - int(self.starts[group])

    def sample_name(self, index: int) -> str:
        group, row = self._locate(index)
        return f"{self.tables.name(int(self.group_files[group]))} row {int(self.group_firsts[group]) + row}"

    def _cells(self, index: int) -> tuple[dict[str, list[Any]], int, int]:
        """The columns (as Python lists) of the slice of :data:`SLICE_ROWS` rows that row
        ``index`` lies in, the row in the slice and the file. A group is read forwards, one slice
        at a time (a process reads its rows in order): one slice is kept per process, the last
        read, and a row before it opens its group again."""
        group, row = self._locate(index)
        cursor = self._group
        if cursor is None or cursor.group != group or row < cursor.first:
            cursor = self._group = _Cursor(group)
        while isinstance(cursor.cells, dict) and row >= cursor.first + cursor.rows:
            cursor.next_slice(self)
        if isinstance(cursor.cells, Exception):
            raise cursor.cells
        return cursor.cells, row - cursor.first, int(self.group_files[group])

    def forget(self) -> None:
        """Drop the slice this process holds (the parent's probe), before the pool forks."""
        self._group = None

    def _context(self, number: int, read: ReadOptions) -> CellContext:
        return CellContext(read, lambda path: self.tables.read_relative(number, path))

    def _value(self, column: Column, cells: dict[str, list[Any]], row: int, context: CellContext) -> Any:
        cell = cells[column.name][row]
        try:
            return column.kind.value(cell, context) if cell is not None or column.kind.image else column.kind.empty()
        except SourceReadError:
            raise
        except Exception as exc:  # noqa: BLE001 - Pillow and numpy raise many types for a bad cell
            raise CellError(column.name, _why(exc)) from exc

    def load_record(self, index: int, read: ReadOptions | None = None) -> dict[str, Any]:
        read = read or ReadOptions()
        cells, row, number = self._cells(index)
        context = self._context(number, read)
        return {c.name: self._value(c, cells, row, context) for c in self.columns}

    def load(self, index: int, read: ReadOptions | None = None) -> tuple[Image.Image, int]:
        read = read or ReadOptions()
        cells, row, number = self._cells(index)
        return self._value(self.image, cells, row, self._context(number, read)), self.label_of(index)

    def label_of(self, index: int) -> int:
        cells, row, number = self._cells(index)
        if isinstance(self.label.kind, ClassNameKind):  # a string: its class's index
            return self._value(self.label, cells, row, self._context(number, ReadOptions()))
        label = cells[self.label.name][row]
        if isinstance(label, bool) or not isinstance(label, int):
            raise CellError(self.label.name, f"the label is {label!r}, not an integer")
        if not -2**63 <= label < 2**63:  # a uint64 cell: labels are stored as int64
            raise CellError(self.label.name, f"the label {label} does not fit a 64-bit signed integer")
        if self.label.names is not None:
            try:
                check_class_label(label, self.label.names)
            except ValueError as exc:
                raise CellError(self.label.name, str(exc)) from None
        return label

    def _encoded(self, column: Column, index: int) -> bytes:
        cells, row, number = self._cells(index)
        try:
            return column.kind.encoded(cells[column.name][row], self._context(number, ReadOptions()))
        except SourceReadError:
            raise
        except Exception as exc:  # noqa: BLE001 - a missing path, a null cell
            raise CellError(column.name, _why(exc)) from exc

    def file_bytes(self, index: int) -> bytes:
        return self._encoded(self.image, index)

    @property
    def field_files(self) -> frozenset[str]:
        return frozenset(c.name for c in self.columns if c.kind.image and c is not self.image)

    def field_bytes(self, index: int, name: str) -> bytes:
        return self._encoded(next(c for c in self.columns if c.name == name), index)

    # --- what the conversion records ----------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, **self.tables.describe(), "columns": [c.name for c in self.columns],
                "label_column": self.label.name if self.label else None, "length": int(self.starts[-1])}

    def fingerprint(self) -> dict[str, Any]:
        return {"kind": self.kind, "count": int(self.starts[-1]), "digest": self.tables.fingerprint()}

    def protected(self) -> list[Protected]:
        root = self.tables.local_root()
        if root is not None:
            return [Protected(root.resolve(), f"source {self.kind} {'folder' if root.is_dir() else 'file'}")]
        return [Protected(path.resolve(), f"source {self.kind} file") for path in self.tables.local_files()]


def _meaning(schema: Any, features: dict[str, Any], name: str) -> tuple[Any, ...]:
    """What column ``name`` of ``schema`` (with its HF ``features``) converts as: its kind,
    ClassLabel names and image mode."""
    column = column_of(name, schema.field(name).type, features.get(name), "")
    return type(column.kind), column.kind.hint, column.names, getattr(column.kind, "mode", None)


def _first_valid(column: Any) -> Any:
    """A column's first cell that is not null (None when all are)."""
    valid = column.drop_null()
    return valid[0].as_py(maps_as_pydicts="strict") if len(valid) else None


def _feature_words(feature: Any) -> str:
    """A Hugging Face feature as messages name it: ``ClassLabel(names=['cat', 'dog'])``."""
    if not isinstance(feature, dict):
        return "without a Hugging Face feature"
    if feature.get("_type") == "ClassLabel":
        return f"ClassLabel(names={feature.get('names')!r})"
    text = json.dumps(feature, sort_keys=True)
    return f"the feature {text if len(text) <= 80 else text[:77] + '...'}"


SLICE_ROWS = 64  # rows of a group turned into Python values at a time
SCAN_ROWS = 1 << 16  # rows of a string label column read at a time to find its classes


class _Cursor:
    """Where a process is in one row group: the slice it holds (``cells``, from row ``first``,
    ``rows`` long; or the error that reading the group met, which every later row of it gives)."""

    def __init__(self, group: int):
        self.group, self.first, self.rows = group, 0, 0
        self.batches: Any = None
        self.cells: dict[str, list[Any]] | Exception = {}

    def next_slice(self, source: "TableSource") -> None:
        number, group = int(source.group_files[self.group]), int(source.group_numbers[self.group])
        self.first += self.rows
        try:
            if self.batches is None:
                self.batches = source.tables.slices(number, group, [c.name for c in source.columns], SLICE_ROWS)
            batch = next(self.batches, None)
            if batch is None:  # fewer rows than the metadata said
                raise ValueError(f"it ends before row {self.first}")
            self.rows, self.cells = batch.num_rows, {c.name: batch.column(c.name).to_pylist(maps_as_pydicts="strict")
                                                   for c in source.columns}
        except SourceReadError:  # the network or the disk, not the group: nothing kept as bad
            source.forget()
            raise
        except InvalidOptionError as exc:  # the file itself cannot be opened: every row of it fails
            self.cells = exc
        except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a damaged row group
            self.cells = ValueError(f"row group {group} cannot be read ({type(exc).__name__}: {one_line(str(exc))[:120]})")


def _why(exc: BaseException) -> str:
    from PIL import UnidentifiedImageError

    if isinstance(exc, UnidentifiedImageError):
        return "not a recognised image file"
    if isinstance(exc, FileNotFoundError):
        return f"image file not found ({exc.filename or exc})"
    if isinstance(exc, IsADirectoryError):
        return f"image path {exc.filename!r} names a folder, not an image file"
    return (one_line(str(exc)) or type(exc).__name__)[:200]


def is_hf_dataset(value: Any) -> bool:
    """Whether ``value`` is a ``datasets.Dataset`` / ``IterableDataset`` / ``DatasetDict``."""
    return type(value).__module__.startswith("datasets.") and type(value).__name__ in (
        "Dataset", "IterableDataset", "DatasetDict", "IterableDatasetDict")


def is_table_source(source: Any) -> bool:
    """Whether ``source`` is a Parquet file / folder / glob / URL, a ``save_to_disk`` folder or a
    ``datasets`` object (checked after a converted dataset, before an image folder)."""
    if is_hf_dataset(source):
        return True
    if not isinstance(source, (str, os.PathLike)):
        return False
    text = os.fspath(source)
    if is_parquet_spec(text):
        return True
    if is_url(text):
        return is_remote_table(text)
    if text.startswith("torchvision:"):
        return False
    path = Path(text)
    return is_saved_dataset(path) or (path.is_dir() and has_parquet(path))


def table_source(source: Any, **options: Any) -> TableSource:
    """The :class:`TableSource` ``source`` names (see :func:`is_table_source`); ``options`` as
    :func:`_table_source` takes them. A file whose schema or metadata pyarrow cannot read (a
    damaged file) is refused in one line naming it."""
    try:
        return _table_source(source, **options)
    except FastdataError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow's many errors for damaged bytes
        shown = source if isinstance(source, (str, os.PathLike)) else type(source).__name__
        raise InvalidOptionError(f"{os.fspath(shown)}: cannot be read as a table ({type(exc).__name__}: "
                                 f"{one_line(str(exc))[:160]}); its data is damaged. Write it again.") from exc


def _table_source(source: Any, *, columns: tuple[str, ...] | None = None, label_column: str | None = None,
                  split: str | None = None, storage_options: dict[str, Any] | None = None,
                  config: str | None = None) -> TableSource:
    """The :class:`TableSource` ``source`` names (see :func:`is_table_source`); ``config``: the
    Hub configuration of a folder or URL holding several."""
    options = {"columns": columns, "label_column": label_column}
    text = None if is_hf_dataset(source) else os.fspath(source)
    if config is not None and (text is None or (not is_url(text) and is_saved_dataset(Path(text)))):
        raise InvalidOptionError(f"--config {config!r} picks a configuration among Parquet files (a Hub dataset's "
                                 "folders); a saved dataset or a datasets object is one already. "
                                 f"Drop {fix_option('config', config)}.")
    if is_hf_dataset(source):
        dataset = _one_dataset(source, split)
        if isinstance(dataset, tuple):  # the Parquet files a streaming dataset reads, and the columns it keeps
            paths, kept, features = dataset
            options["columns"] = _within(columns, label_column, kept, "The datasets.IterableDataset streams only the "
                                         "columns {} (its columns=)")
            files = ParquetFiles(paths[0], paths=paths)
            if features is not None:  # the stream's own (cast_column, features=), where they differ from the files'
                files.cast(features)
            return TableSource(files, kind="parquet", **options)
        options["columns"] = _within(columns, label_column, _format_columns(dataset), "The datasets.Dataset gives only "
                                     "the columns {} (its format's columns, set_format)")
        return TableSource(ObjectTable(dataset), kind="datasets", **options)
    if not is_url(text) and is_saved_dataset(Path(text)):
        return TableSource(ArrowFiles(Path(text), split=split), kind="saved", **options)
    files = ParquetFiles(text, split=split, storage_options=storage_options, config=config)
    return TableSource(files, kind="parquet", **options)


def _one_dataset(dataset: Any, split: str | None) -> Any:
    """A ``datasets.Dataset`` (a ``DatasetDict``'s ``split``); an ``IterableDataset`` streams
    from files whose Parquet fastdata reads itself."""
    name = type(dataset).__name__
    if name in ("DatasetDict", "IterableDatasetDict"):
        splits = list(dataset)
        if split is None and len(splits) != 1:
            raise InvalidOptionError(f"The {name} holds the splits {', '.join(splits)}; convert one at a time: "
                                     f"split={splits[0]!r} (or another).")
        if split is not None and split not in splits:
            raise InvalidOptionError(f"The {name} has no split {split!r} (splits: {', '.join(splits)}).")
        dataset = dataset[split if split is not None else splits[0]]
        name = type(dataset).__name__
    if name == "IterableDataset":
        return _streamed(dataset)
    return dataset


def _streamed(dataset: Any) -> Any:
    """What an untransformed ``IterableDataset`` streams: the ``Dataset`` shards of
    ``Dataset.to_iterable_dataset()``, or the Parquet files of ``load_dataset(..., streaming=True)``
    (their paths, read by row groups here, and the columns its ``columns=`` keeps). One with
    ``map``, ``filter``, ``shuffle`` or ``filters=`` gives other rows than its files hold: refused."""
    iterable = getattr(dataset, "_ex_iterable", None)
    arguments = getattr(iterable, "kwargs", None) or {}
    # a format (with_format("torch")) changes only the Python type of what it yields: fastdata reads the rows itself
    plain = type(iterable).__name__ == "ArrowExamplesIterable" and getattr(dataset, "_shuffling", None) is None
    if plain and arguments.get("shards") and all(type(s).__name__ == "Dataset" for s in arguments["shards"]):
        datasets = require("datasets", extra="hf", feature="Converting a datasets.IterableDataset")
        return datasets.concatenate_datasets(list(arguments["shards"]))
    builder = getattr(getattr(iterable, "generate_tables_fn", None), "__self__", None)
    config = getattr(builder, "config", None)
    if plain and type(builder).__name__ != "Parquet":
        plain = False
    if plain and getattr(config, "filters", None) is not None:
        raise InvalidOptionError(
            f"This datasets.IterableDataset streams only the rows its filters= keep ({config.filters!r}), which fastdata "
            "cannot count before reading them. Load it without streaming (load_dataset(..., filters=...) gives a "
            "Dataset, which fastdata converts), or give fastdata the Parquet files without the filters.")
    if plain and arguments.get("files") and not any(arguments.get("row_groups_list") or ()):
        kept = getattr(config, "columns", None)
        return [os.fspath(path) for path in arguments["files"]], (tuple(kept) if kept is not None else None), \
            getattr(dataset, "features", None)
    raise InvalidOptionError(
        "This datasets.IterableDataset streams rows that its files do not hold as they are (map, filter or shuffle "
        "applied, or a builder other than Parquet), and it has no length, which fastdata plans a conversion by. "
        "Give fastdata the Parquet files it streams (a path, a glob or an hf://datasets/ORG/NAME URL), which "
        "fastdata streams by row groups itself, or the Dataset before .to_iterable_dataset().")


def _within(columns: tuple[str, ...] | None, label_column: str | None, kept: tuple[str, ...] | None,
            gives: str) -> tuple[str, ...] | None:
    """The columns to convert from a datasets object whose items hold only the columns ``kept``
    (a stream's ``columns=``, a Dataset's ``set_format(columns=...)``): those, or the ones asked
    for among them (the label column too); ``gives`` says which object, ``{}`` standing for the
    columns."""
    if kept is None:
        return columns
    asked = list(columns or ()) + ([label_column] if label_column is not None else [])
    missing = [name for name in dict.fromkeys(asked) if name not in kept]
    if missing:
        raise InvalidOptionError(f"{gives.format(', '.join(kept))}, not {', '.join(missing)}. Check columns= and "
                                 "label_column=, or give the object those columns.")
    return kept if columns is None else columns


def _format_columns(dataset: Any) -> tuple[str, ...] | None:
    """The columns ``dataset[i]`` holds where its format leaves others out (``set_format(columns=...)``)."""
    form = getattr(dataset, "format", None) or {}
    shown = form.get("columns")
    if shown is None or form.get("output_all_columns") or list(shown) == list(dataset.column_names):
        return None
    return tuple(shown)


def is_remote_table(url: Any) -> bool:
    """Whether URL ``url`` names Parquet files: a ``.parquet`` object or glob, an ``hf://`` URL,
    or a folder holding ``.parquet`` files and no fastdata manifest."""
    text = os.fspath(url)
    if is_parquet_spec(text) or any(c in text for c in "*?["):
        return True
    from fastdata.remote.filesystem import filesystem

    try:
        fs, path = filesystem(text)
        found = fs.find(path, maxdepth=3)
    except Exception:  # noqa: BLE001 - then it is read as a converted dataset, which says what is wrong
        return False
    top = path.rstrip("/") + "/"
    return any(p.endswith(".parquet") for p in found) and f"{top}manifest.json" not in found
