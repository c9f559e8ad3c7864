"""A third-party format, as small as a format can be: ``rawdir`` keeps every sample in its own
file of a directory (``000000.npy``, an HWC uint8 array, for ``--store raw``; ``000000.bin``,
the encoded bytes, for ``--store encoded``), plus ``labels.npy`` and ``manifest.json``.

It lives outside ``fastdata/`` and reaches fastdata only through a ``fastdata.formats`` entry
point (tests/test_rawdir.py installs it the way pip would), so it uses nothing but the public
contract: :class:`fastdata.formats.Writer`, :class:`fastdata.formats.StoredDataset` and
:func:`fastdata.formats.register`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from fastdata.formats import FormatSpec, StoredDataset, Writer, register
from fastdata.manifest import check_file_sizes, describe_file, load_small_array, write_manifest


def _name(index: int, store: str) -> str:
    return f"{index:06d}.{'npy' if store == 'raw' else 'bin'}"


class RawdirWriter(Writer):
    def __init__(self, path: Path, plan: Any, options: Any):
        super().__init__(path, plan, options)
        path.mkdir(parents=True)
        self.labels: list[int] = []

    def write(self, batch: Any) -> None:
        items = batch.images if self.plan.store == "raw" else batch.blobs
        for item, label in zip(items if items is not None else [], batch.labels.tolist()):
            file = self.path / _name(len(self.labels), self.plan.store)
            if self.plan.store == "raw":
                np.save(file, np.ascontiguousarray(item), allow_pickle=False)
            else:
                file.write_bytes(bytes(item))
            self.labels.append(label)

    def close(self, manifest: dict[str, Any]) -> dict[str, Any]:
        np.save(self.path / "labels.npy", np.asarray(self.labels, dtype=np.int64), allow_pickle=False)
        names = ["labels.npy"] + [_name(index, self.plan.store) for index in range(len(self.labels))]
        manifest["files"] = {name: describe_file(self.path / name) for name in names}
        write_manifest(self.path, manifest)
        return manifest


class RawdirDataset(StoredDataset):
    format_name = "rawdir"
    required_files = {"raw": ("labels.npy",), "encoded": ("labels.npy",)}

    def _load(self) -> None:
        check_file_sizes(self.path, self.manifest)
        self.labels = load_small_array(self.path / "labels.npy", dtype=np.int64, length=self.manifest["count"])

    def encoded_sizes(self) -> np.ndarray | None:  # for `fastdata info`: from the manifest, no image read
        if self.store != "encoded":
            return None
        return np.array([self.manifest["files"][_name(i, self.store)]["bytes"] for i in range(len(self.labels))])

    def _encoded(self, indices: np.ndarray) -> list[bytes]:
        return [(self.path / _name(index, self.store)).read_bytes() for index in indices.tolist()]

    def _read(self, indices: np.ndarray, allocate: Callable | None = None, *, pil: bool = False) -> Any:
        files = [self.path / _name(index, self.store) for index in indices.tolist()]
        if self.store == "raw":
            return [np.load(file, allow_pickle=False) for file in files]
        return self.decoder.decode_all((file.read_bytes() for file in files), lambda row: str(files[row]),
                                       self.path, pil=pil)


register(FormatSpec(name="rawdir", dataset=RawdirDataset, writer=RawdirWriter, suffix=".rawdir",
                    suffixes=(".rawdir",), description="one file per sample in a directory (a test plugin)"))
