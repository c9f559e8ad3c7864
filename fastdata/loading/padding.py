"""Opt-in padding of variable arrays in batches of samples with fields
(``fastdata.loader(..., pad=...)``, docs/fields.md): boxes ``(K, 4)`` of a batch as one
``(B, K_max, 4)`` tensor and their lengths, the way ``torch.nn.utils.rnn.pad_sequence`` pads.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fastdata.errors import InvalidOptionError
from fastdata.fields import Field
from fastdata.reader.records import Records


def _is_number(value: Any) -> bool:
    return isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating))


class Padding:
    """``padding(batch)`` -> the batch with each chosen variable-first-dimension array field
    padded to the batch's longest, as ``torch.nn.utils.rnn.pad_sequence(rows, batch_first=True,
    padding_value=fill)`` does: ``(B, K_max, *trailing)`` of the field's dtype, plain tensors
    (boxes lose their ``BoundingBoxes`` wrapper: one canvas per batch does not hold). Each
    sample's length (int64, ``(B,)``) goes beside the field as ``<key>_length`` in the dict
    holding it, or, for a field at a tuple position, the position holds ``(padded, lengths)``.
    Picklable, so every backend's workers pad the batches they make."""

    def __init__(self, dataset: Any, pad: Any):
        records = Records(dataset)
        self.structure = records.structure
        # arrays of a variable first dimension only (the field's kind says: FieldKind.paddable)
        paddable = {f.name: f for f in records.wanted if f.kind_spec.paddable(f)}
        where = str(getattr(dataset, "path", type(dataset).__name__))
        listed = ", ".join(paddable) or "none"
        if pad is True:
            if not paddable:
                raise InvalidOptionError(
                    f"pad=True: {where!r} has no variable array fields to pad (its fields: "
                    f"{', '.join(f.name for f in records.wanted)}). Leave pad out.")
            fills = {name: 0 for name in paddable}
        elif isinstance(pad, dict):
            fills = dict(pad)
        elif isinstance(pad, (list, tuple)) and all(isinstance(n, str) for n in pad):
            fills = {name: 0 for name in pad}
        else:
            raise InvalidOptionError(
                f"Invalid pad {pad!r}. Use True (every variable array field, padded with 0), a list of field "
                "names, or a dict of field name -> fill value, e.g. pad={'boxes': 0.0, 'labels': -1}.")
        self.fields: dict[str, Field] = {}
        for name, fill in fills.items():
            f = paddable.get(name)
            if f is None:
                names = records.schema.names
                if name in names and not any(w.name == name for w in records.wanted):
                    what = "was left out by fields=[...]"
                elif name in names:
                    known = records.schema[name]
                    what = known.kind_spec.pad_refusal(known)
                else:
                    what = "is not one of its fields"
                raise InvalidOptionError(
                    f"pad: field {name!r} of {where!r} {what}; pad pads arrays of a variable first dimension "
                    f"(boxes, keypoints). Its variable array fields: {listed}.")
            self.fields[name] = f
            self._check_fill(f, fill)
        self.fills = fills
        self._check_length_keys(self.structure)

    @staticmethod
    def _check_fill(f: Field, fill: Any) -> None:
        dtype = np.dtype(f.dtype)
        bad = None
        if not _is_number(fill):
            bad = "is not a number"
        elif dtype.kind == "b" and fill not in (0, 1):
            bad = "is not a bool"
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            if isinstance(fill, (float, np.floating)) and not float(fill).is_integer():
                bad = f"is not an integer (the field is {dtype})"
            elif not info.min <= int(fill) <= info.max:
                bad = f"is outside {dtype}'s range {info.min}..{info.max}"
        if bad:
            raise InvalidOptionError(f"pad: the fill value {fill!r} for field {f.name!r} {bad} (never cast). "
                                     f"Give a value its dtype {dtype} holds.")

    def _check_length_keys(self, structure: Any) -> None:
        if isinstance(structure, list):
            for s in structure:
                self._check_length_keys(s)
        elif isinstance(structure, dict):
            for key, s in structure.items():
                if isinstance(s, str) and s in self.fields and f"{key}_length" in structure:
                    raise InvalidOptionError(f"pad: the batch already has a key {key}_length beside {key!r}, "
                                             f"where its lengths would go. Rename that field or leave {key!r} out of pad.")
                self._check_length_keys(s)

    def __call__(self, batch: Any) -> Any:
        return self._walk(batch, self.structure)

    def _walk(self, batch: Any, structure: Any) -> Any:
        if isinstance(structure, list) and isinstance(batch, (tuple, list)):
            out = [self.padded(s, item) if isinstance(s, str) and s in self.fields else self._walk(item, s)
                   for item, s in zip(batch, structure)]
            return type(batch)(out)
        if isinstance(structure, dict) and isinstance(batch, dict):
            out = {}
            for key, item in batch.items():
                s = structure.get(key)
                if isinstance(s, str) and s in self.fields:
                    out[key], out[f"{key}_length"] = self.padded(s, item)
                else:
                    out[key] = self._walk(item, s) if s is not None else item
            return out
        return batch

    def padded(self, name: str, rows: Any) -> tuple[Any, Any]:
        """``(values (B, K_max, *trailing), lengths (B,) int64)`` of one field's rows."""
        f, fill = self.fields[name], self.fills[name]
        if isinstance(rows, (np.ndarray, torch.Tensor)):  # already one stacked array (every K equal)
            lengths = np.full(len(rows), rows.shape[1] if rows.ndim > 1 else 0, np.int64)
            if isinstance(rows, np.ndarray):
                return rows, lengths
            return rows.as_subclass(torch.Tensor), torch.from_numpy(lengths)
        if not isinstance(rows, list):
            raise InvalidOptionError(f"pad: field {name!r} is a {type(rows).__name__} in the batch, not a list of "
                                     "arrays (a transform changed the sample's layout?). Leave it out of pad.")
        trailing = tuple(f.shape[1:])
        if rows and all(isinstance(r, np.ndarray) for r in rows):  # image_format="numpy"
            lengths = np.array([len(r) for r in rows], np.int64)
            out = np.full((len(rows), int(lengths.max()), *rows[0].shape[1:]), fill, dtype=rows[0].dtype)
            for row, r in zip(out, rows):
                row[:len(r)] = r
            return out, lengths
        tensors = [torch.as_tensor(r).as_subclass(torch.Tensor) for r in rows]
        lengths = torch.tensor([len(t) for t in tensors], dtype=torch.int64)
        if not tensors:
            dtype = torch.from_numpy(np.empty(0, f.dtype)).dtype
            return torch.empty((0, 0, *trailing), dtype=dtype), lengths
        from torch.nn.utils.rnn import pad_sequence

        return pad_sequence(tensors, batch_first=True, padding_value=fill), lengths
