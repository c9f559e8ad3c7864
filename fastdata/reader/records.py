"""Reading samples with fields (docs/fields.md): what a reader's ``ds[i]``, ``ds[indices]`` and
``fastdata.loader`` give for a dataset whose manifest has a schema (:mod:`fastdata.fields`).

``ds[i]`` gives the sample as the source returned it: a tuple where it was a tuple, a dict where
it was a dict; images as ``tv_tensors.Image`` (uint8 CHW), masks as ``tv_tensors.Mask`` (H, W),
boxes as ``tv_tensors.BoundingBoxes`` with their format and the canvas size of their image, so a
``transforms.v2`` pipeline given as ``transform`` transforms the whole sample together. A batch
(``ds[indices]``, ``fastdata.loader``) has one entry per field: fixed-shape fields stacked as
tensors (images, raw masks, scalars, fixed arrays), variable ones as lists (or padded:
:class:`fastdata.loading.padding.Padding`, ``fastdata.loader(..., pad=...)``). Each field is read
once per batch (one fancy-indexed read of a fixed field's rows).

Where the image's decode fuses the transform's leading crop (+ flip) (:mod:`fastdata.reader.fused`),
every other tv_tensor of the sample gets the same drawn box and flip through torchvision's
kernels (:func:`fastdata.reader.fused.transform_like`), then the rest of the transform runs on the
whole sample: what the unfused v2 pipeline gives for the same draw.
"""

from __future__ import annotations

import io
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image

from fastdata.errors import CorruptDataError, CorruptManifestError, InvalidOptionError
from fastdata.fields import Field, Schema, select, unflatten
from fastdata.reader.handover import as_tensor


def open_schema(dataset: Any) -> Schema:
    """The schema in ``dataset``'s manifest, checked, with ``fields=[...]`` applied."""
    manifest = dataset.manifest
    try:
        schema = Schema.from_json(manifest["fields"])
    except (InvalidOptionError, TypeError, ValueError) as exc:
        raise CorruptManifestError(f"{str(dataset.path)!r}: the manifest's 'fields' are damaged ({exc}). "
                                   "Convert the source again.") from exc
    if schema.image is None:
        raise CorruptManifestError(f"{str(dataset.path)!r}: the manifest's 'fields' have no image field.")
    options = dataset.options
    if options.target_transform is not None or options.batch_transform is not None:
        which = "target_transform" if options.target_transform is not None else "batch_transform"
        raise InvalidOptionError(
            f"{which} applies to (image, label) datasets; {str(dataset.path)!r} has fields "
            f"({', '.join(schema.names)}). Pass transform: it gets the whole sample (a transforms.v2 pipeline "
            "transforms image, masks and boxes together)."
        )
    if options.fields is not None:
        unknown = [name for name in options.fields if name not in schema.names]
        if unknown:
            raise InvalidOptionError(f"{str(dataset.path)!r} has no field {unknown[0]!r}. Its fields: "
                                     f"{', '.join(schema.names)}.")
    return schema


class Records:
    """Builds one reader's samples and batches from its fields."""

    def __init__(self, dataset: Any):
        self.ds = dataset
        self.schema: Schema = dataset.schema
        wanted = dataset.options.fields
        self.wanted = [f for f in self.schema.fields if wanted is None or f.name in wanted]
        names = {f.name for f in self.wanted}
        self.structure = self.schema.structure if wanted is None else select(self.schema.structure, names)
        if self.structure is None:
            self.structure = [f.name for f in self.wanted]
        self.format = dataset.options.image_format

    # --- reading ----------------------------------------------------------------------

    def _canvas_fields(self) -> set[str]:
        return {f.meta.get("canvas_size_of") for f in self.wanted if f.meta.get("tv_tensor") == "BoundingBoxes"}

    def _read(self, indices: np.ndarray, allocate: Callable | None) -> tuple[dict[str, Any], dict[str, Any], list | None]:
        """Each wanted field's values of ``indices`` (per sample lists, or stacked rows), the
        (H, W) canvas of each image field that boxes name, and, where the image's decode fused
        the transform's leading crop, each row's ``(height, width, Draw)`` (else None)."""
        schema = self.schema
        image, label = schema.image, schema.label
        names = {f.name for f in self.wanted}
        canvas_of = self._canvas_fields()
        ds = self.ds._reading(indices, names | canvas_of)  # the tar reader: every member of the read at once
        out: dict[str, Any] = {}
        canvas: dict[str, Any] = {}
        draws = None
        if image.name in names or image.name in canvas_of:
            pil = self.format == "pil"
            if not pil and getattr(ds, "decoder", None) is not None and ds.decoder.plan is not None:
                draws = []
                pixels = ds._read(indices, allocate, pil=pil, draws=draws)
                canvas[image.name] = [(height, width) for height, width, _ in draws]  # the boxes' canvas: before the crop
            else:
                pixels = ds._read(indices, allocate, pil=pil)
                canvas[image.name] = [(p.height, p.width) if isinstance(p, Image.Image) else tuple(p.shape[:2])
                                      for p in pixels]
            out[image.name] = pixels
        if label is not None and label.name in names:
            out[label.name] = ds.labels[indices]
        for f in schema.extras:
            if f.name not in names and f.name not in canvas_of:
                continue
            stored = ds._field_values(f, indices)
            if f.kind_spec.spatial:
                stored = [self._spatial(f, value, int(i)) for value, i in zip(stored, indices)] \
                    if f.variable else stored
                if f.name in canvas_of:
                    canvas[f.name] = [tuple(np.shape(v)[:2]) if not isinstance(v, Image.Image) else (v.height, v.width)
                                      for v in stored]
            out[f.name] = stored
        return out, canvas, draws

    def _spatial(self, f: Field, data: bytes, sample: int) -> Any:
        """An encoded extra image or mask decoded as its kind gives it: PIL (image_format 'pil')
        or a uint8 array (masks (H, W) of class ids, images (H, W, C))."""
        try:
            with Image.open(io.BytesIO(data)) as opened:
                opened.load()
                value = opened
        except Exception as exc:  # noqa: BLE001 - Pillow raises many types for damaged data
            raise CorruptDataError(f"{str(self.ds.path)!r} sample {sample}: field {f.name!r} does not decode "
                                   f"({exc}). Run 'fastdata verify --deep' or convert the source again.") from exc
        return f.kind_spec.decoded(f, value, self.format)

    # --- one sample -------------------------------------------------------------------

    def _value(self, f: Field, column: Any, row: int, canvas: dict[str, Any]) -> Any:
        """One sample's value of ``f`` as its kind gives it back (boxes on the canvas of their image)."""
        def canvas_size() -> tuple[int, int]:
            size = canvas.get(f.meta.get("canvas_size_of"))
            return size[row] if size is not None else self._fixed_canvas(f)

        return f.kind_spec.read_value(f, column[row], self.format, canvas_size)

    def _fixed_canvas(self, f: Field) -> tuple[int, int]:
        image = self.schema[f.meta["canvas_size_of"]] if f.meta.get("canvas_size_of") in self.schema.names \
            else self.schema.image
        return tuple(image.shape[:2]) if image.shape else (0, 0)

    def samples(self, indices: np.ndarray) -> list[Any]:
        """Each sample of ``indices`` as the source returned it (``transform`` applied to the whole sample)."""
        columns, canvas, draws = self._read(indices, None)
        # a fused decode did the transform's leading crop (+ flip) on the image: the rest runs after
        transform = self.ds.options.transform if draws is None else self.ds.output.transform
        out = []
        for row in range(len(indices)):
            values = {f.name: self._value(f, columns[f.name], row, canvas) for f in self.wanted}
            if draws is not None:
                values = self._moved_alike(values, *draws[row], int(indices[row]))
            sample = unflatten(values, self.structure)
            out.append(transform(sample) if transform is not None else sample)
        return out

    def _moved_alike(self, values: dict[str, Any], height: int, width: int, draw: Any, sample: int) -> dict[str, Any]:
        """The sample's other spatial values (every tv_tensor but the fused image: masks, boxes,
        further images) cropped, resized and flipped as the fused image was
        (:func:`fastdata.reader.fused.transform_like`); what is no tv_tensor the v2 pipeline passes
        through, and so does this."""
        from torchvision import tv_tensors
        from torchvision.transforms.v2.functional import get_size

        from fastdata.reader.fused import transform_like

        plan, image = self.ds.decoder.plan, self.schema.image.name
        moved = {}
        for name, value in values.items():
            if name != image and isinstance(value, tv_tensors.TVTensor):
                size = tuple(get_size(value))
                if size != (height, width):
                    raise InvalidOptionError(
                        f"{str(self.ds.path)!r} sample {sample}: field {name!r} is {size[0]}x{size[1]} (HxW) but its "
                        f"image {image!r} is {height}x{width}; the transform crops them together only at one size "
                        "(torchvision's v2 transforms refuse it too). Resize the field at conversion, or pass "
                        "a transform that handles it, with fuse=False.")
                value = transform_like(value, plan, draw)
            moved[name] = value
        return moved

    # --- a batch ------------------------------------------------------------------------

    def batch(self, indices: np.ndarray, allocate: Callable | None = None) -> Any:
        """The collated batch: fixed-shape fields stacked as tensors, variable ones as lists."""
        if self.ds.options.transform is not None or self.format == "pil":
            return collate(self.samples(indices), self.structure, {f.name: f for f in self.wanted})
        columns, canvas, _ = self._read(indices, allocate)  # no transform: nothing fused
        values = {}
        for f in self.wanted:
            column, kind = columns[f.name], f.kind_spec
            if kind.spatial:
                values[f.name] = self._stacked_images(f, column, allocate)
            elif kind.stacks(f):
                array = kind.stacked(f, np.ascontiguousarray(column))
                values[f.name] = array if self.format == "numpy" else torch.from_numpy(array)
            else:
                values[f.name] = [self._value(f, column, row, canvas) for row in range(len(indices))]
        return unflatten(values, self.structure)

    def _stacked_images(self, f: Field, column: Any, allocate: Callable | None) -> Any:
        """Images or masks of one shape as one tensor ((B, C, H, W) images, (B, H, W) masks); a list
        when sizes differ (encoded images of different sizes)."""
        if isinstance(column, list):
            shapes = {np.shape(v) for v in column}
            if len(shapes) > 1:
                return [f.kind_spec.read_value(f, v, self.format, None) for v in column]
            if not column:
                column = np.empty((0, *(f.shape or (0, 0, 0))), np.uint8)
            else:
                out = allocate((len(column), *np.shape(column[0])), np.uint8) \
                    if allocate is not None and f is self.schema.image else None
                column = np.stack([np.asarray(v) for v in column], out=out) if out is not None \
                    else np.stack([np.asarray(v) for v in column])
        array = np.asarray(column)
        if self.format == "numpy":
            return array
        tensor = as_tensor(array)  # its shared-memory tensor where allocated there (fastdata.reader.handover)
        return f.kind_spec.batch_tensor(f, tensor)


def collate(samples: list[Any], structure: Any = None, fields: dict[str, Field] | None = None) -> Any:
    """Samples with fields collated. With ``structure`` (the samples' layout, as readers give it
    back) and ``fields`` (its leaves' fields), each field's values become one entry laid out as
    the structure says, whatever values hold: a JSON field's dicts stay a list of dicts, as in
    a batch read without a transform (:meth:`Records.batch`); samples a transform laid out
    otherwise are collated as without it. Without: tuples of one length and dicts of the same
    keys are followed. An entry is stacked where its values are tensors of one shape, a tensor
    where they are numbers (of the field's dtype), else a list (variable arrays, boxes, text,
    JSON, bytes, PIL images)."""
    if isinstance(structure, str):
        return _collated_values(samples, (fields or {}).get(structure))
    if isinstance(structure, list) and all(isinstance(s, tuple) and len(s) == len(structure) for s in samples):
        return tuple(collate([s[i] for s in samples], part, fields) for i, part in enumerate(structure))
    if isinstance(structure, dict) and all(isinstance(s, dict) and s.keys() == structure.keys() for s in samples):
        return {key: collate([s[key] for s in samples], part, fields) for key, part in structure.items()}
    first = samples[0] if samples else None
    if isinstance(first, tuple) and all(isinstance(s, tuple) and len(s) == len(first) for s in samples):
        return tuple(collate([s[i] for s in samples]) for i in range(len(first)))
    if isinstance(first, dict) and all(isinstance(s, dict) and s.keys() == first.keys() for s in samples):
        return {key: collate([s[key] for s in samples]) for key in first}
    return _collated_values(samples, None)


def _collated_values(samples: list[Any], field: Field | None) -> Any:
    """One entry's values: stacked tensors of one shape, numbers as a tensor (of ``field``'s
    dtype where known, as a batch read without a transform has them), else a list."""
    first = samples[0] if samples else None
    if isinstance(first, torch.Tensor) and type(first).__name__ != "BoundingBoxes" and \
            len({tuple(s.shape) for s in samples}) == 1 and all(isinstance(s, torch.Tensor) for s in samples):
        return torch.stack([s.as_subclass(torch.Tensor) for s in samples])
    if isinstance(first, bool) and all(isinstance(s, bool) for s in samples):
        return torch.tensor(samples, dtype=torch.bool)
    if isinstance(first, int) and all(isinstance(s, int) and not isinstance(s, bool) for s in samples):
        return torch.tensor(samples, dtype=torch.int64)
    if isinstance(first, float) and all(isinstance(s, float) for s in samples):
        dtype = (field.kind_spec.batch_dtype(field) if field is not None else None) or "float64"
        return torch.from_numpy(np.asarray(samples, dtype=dtype))
    return list(samples)
