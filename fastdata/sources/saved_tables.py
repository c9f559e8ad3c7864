"""Arrow tables already on this machine: a ``save_to_disk`` folder's Arrow files (groups are its
record batches) and a ``datasets.Dataset`` object (groups of :data:`OBJECT_GROUP_ROWS` rows), read
like :class:`~fastdata.sources.tables.ParquetFiles`, one group at a time."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

from fastdata.errors import InvalidOptionError, fix_option
from fastdata.remote.failures import one_line
from fastdata.sources.tables import real_inside, require_pyarrow

OBJECT_GROUP_ROWS = 1000  # a datasets.Dataset object's table, read this many rows at a time


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a folder ``datasets``' ``save_to_disk`` wrote (one dataset or a DatasetDict)."""
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def _inside(folder: Path, name: Any, what: str) -> Path:
    """``folder / name``, refused unless it lies inside ``folder`` once links are resolved (a
    saved dataset's files are its own, never ``../`` or an absolute path elsewhere)."""
    if not isinstance(name, str) or real_inside(folder, folder / name) is None:
        raise InvalidOptionError(f"{str(folder)!r}: its {what} {name!r}, which lies outside the folder; fastdata reads "
                                 "only a saved dataset's own files. Save the dataset again with save_to_disk.")
    return folder / name


class ArrowFiles:
    """A ``save_to_disk`` folder: its Arrow stream files, memory-mapped; groups are record batches."""

    def __init__(self, folder: Path, *, split: str | None = None):
        require_pyarrow(f"Reading the saved dataset {str(folder)!r}")
        self.spec = str(folder)
        self.split: str | None = None  # a DatasetDict's split; a saved Dataset records none
        if (folder / "dataset_dict.json").is_file():
            folder = self._split_folder(folder, split)
        elif split is not None:
            raise InvalidOptionError(f"{str(folder)!r} holds one dataset (save_to_disk of a Dataset), not splits; "
                                     f"--split {split} has nothing to pick. Leave out {fix_option('split', split)}.")
        try:
            state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
            names = [entry["filename"] for entry in state["_data_files"]]
            if not names:
                raise ValueError("its list of data files is empty")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidOptionError(f"{str(folder)!r}: its state.json does not list the dataset's Arrow files "
                                     f"({type(exc).__name__}: {exc}); was it written by datasets' save_to_disk?") from exc
        self.paths = [str(_inside(folder, name, "state.json names the Arrow file")) for name in names]
        self.folder = folder
        self._open: tuple[int, Any] | None = None

    def _split_folder(self, folder: Path, split: str | None) -> Path:
        try:
            splits = json.loads((folder / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
            if not isinstance(splits, list) or not splits or not all(isinstance(name, str) for name in splits):
                raise ValueError(f"'splits' is {splits!r}, not a list of split names")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidOptionError(f"{str(folder)!r}: dataset_dict.json names no splits ({type(exc).__name__}: "
                                     f"{exc}); was it written by datasets' save_to_disk?") from exc
        if split is None:
            if len(splits) == 1:
                self.split = splits[0]
                return _inside(folder, splits[0], "dataset_dict.json names the split")
            raise InvalidOptionError(f"{str(folder)!r} holds the splits {', '.join(splits)}; convert one at a time: "
                                     f"add {fix_option('split', splits[0])} (or another).")
        if split not in splits:
            raise InvalidOptionError(f"{str(folder)!r} has no split {split!r} (splits: {', '.join(splits)}). "
                                     f"Check {fix_option('split', 'NAME')}.")
        self.split = split
        return _inside(folder, split, "dataset_dict.json names the split")

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__, _open=None)

    def __len__(self) -> int:
        return len(self.paths)

    def name(self, number: int) -> str:
        return self.paths[number]

    def batches(self, number: int) -> list[Any]:
        if self._open is None or self._open[0] != number:
            import pyarrow as pa

            try:
                reader = pa.ipc.open_stream(pa.memory_map(self.paths[number], "r"))
                self._open = (number, (reader.schema, list(reader)))
            except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a damaged or missing file
                raise InvalidOptionError(f"{self.paths[number]}: not a readable Arrow file ({one_line(str(exc))[:160]}).") from exc
        return self._open[1][1]

    def schema(self, number: int) -> Any:
        self.batches(number)
        schema = self._open[1][0]
        if not schema.metadata:  # the features in dataset_info.json, where the file has none
            info = self.folder / "dataset_info.json"
            try:
                features = json.loads(info.read_text(encoding="utf-8")).get("features")
            except (OSError, ValueError):
                features = None
            if features:
                schema = schema.with_metadata({b"huggingface": json.dumps({"info": {"features": features}}).encode()})
        return schema

    def groups(self, number: int) -> list[int]:
        return [batch.num_rows for batch in self.batches(number)]

    def read(self, number: int, group: int, columns: list[str]) -> Any:
        """Record batch ``group``'s ``columns``, checked in full first: its buffers lie in the
        memory-mapped file, and a damaged offset would read outside them (a crash, not an error)."""
        import pyarrow as pa

        table = pa.Table.from_batches([self.batches(number)[group]]).select(columns)
        table.validate(full=True)
        return table

    def slices(self, number: int, group: int, columns: list[str], rows: int) -> Iterator[Any]:
        """Record batch ``group`` of file ``number`` in batches of ``rows`` rows (memory-mapped: no copy)."""
        return iter(self.read(number, group, columns).to_batches(max_chunksize=rows))

    def read_relative(self, number: int, relative: str) -> bytes:
        raise ValueError(f"image path {relative!r} without bytes: a saved dataset keeps its images' bytes")

    def describe(self) -> dict[str, Any]:
        split = {"split": self.split} if self.split is not None else {}
        return {"saved": os.path.abspath(self.spec), **split, "count": len(self.paths)}

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for path in self.paths:
            stat = os.stat(path)
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
        return digest.hexdigest()

    def local_root(self) -> Path | None:
        return self.folder

    def local_files(self) -> list[Path]:
        return []


class ObjectTable:
    """A ``datasets.Dataset`` object's Arrow table (memory-mapped where the dataset is), in groups of rows."""

    def __init__(self, dataset: Any):
        if (getattr(dataset, "format", None) or {}).get("type") == "custom":
            raise InvalidOptionError(
                "This datasets.Dataset has a transform (with_transform or set_transform): its items are what the "
                "transform returns, which fastdata does not run. Convert the rows it transforms (ds.with_format(None)) "
                "and transform them when reading, or store the transform's results with ds.map(...).")
        self.dataset = dataset
        # a shuffled or selected view: its rows in its order, taken a group at a time (flatten_indices
        # would write a copy of the whole table into the dataset's own folder)
        indices = getattr(dataset, "_indices", None)
        self.indices = indices.column(0) if indices is not None else None
        self.spec = f"datasets.Dataset({getattr(dataset, 'info', None) and dataset.info.dataset_name or ''})"
        self.paths = ["dataset"]

    def __len__(self) -> int:
        return 1

    def name(self, number: int) -> str:
        return "dataset"

    def _table(self) -> Any:
        table = self.dataset.data.table
        features = self.dataset.features.to_dict()
        return table.replace_schema_metadata({b"huggingface": json.dumps({"info": {"features": features}}).encode()})

    def schema(self, number: int) -> Any:
        return self._table().schema

    def groups(self, number: int) -> list[int]:
        rows = self.dataset.num_rows
        return [min(OBJECT_GROUP_ROWS, rows - start) for start in range(0, rows, OBJECT_GROUP_ROWS)]

    def read(self, number: int, group: int, columns: list[str]) -> Any:
        table = self.dataset.data.table
        if self.indices is None:
            return table.slice(group * OBJECT_GROUP_ROWS, OBJECT_GROUP_ROWS).select(columns)
        return table.select(columns).take(self.indices.slice(group * OBJECT_GROUP_ROWS, OBJECT_GROUP_ROWS))

    def slices(self, number: int, group: int, columns: list[str], rows: int) -> Iterator[Any]:
        """Group ``group`` of the table in batches of ``rows`` rows (slices of it: no copy)."""
        return iter(self.read(number, group, columns).to_batches(max_chunksize=rows))

    def read_relative(self, number: int, relative: str) -> bytes:
        with open(relative, "rb") as handle:  # datasets' own Image feature reads such paths as they are
            return handle.read()

    def describe(self) -> dict[str, Any]:
        return {"dataset": self.spec, "fingerprint": getattr(self.dataset, "_fingerprint", None)}

    def fingerprint(self) -> str:
        return str(getattr(self.dataset, "_fingerprint", "")) + f"\0{self.dataset.num_rows}"

    def local_root(self) -> Path | None:
        return None

    def local_files(self) -> list[Path]:
        return []
