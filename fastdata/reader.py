"""The output contract shared by every reader, its options, and the map-style reader base.

A dataset with fields beyond ``(image, label)`` (its manifest has a schema) gives each sample as
its source returned it, a tuple or a dict of tv_tensors and values (:mod:`fastdata.records`,
docs/fields.md). Otherwise a reader returns ``(image, label)``: the image a uint8 CHW tensor by default (a view of HWC
storage, so its memory format is channels-last), an HWC ndarray with ``image_format="numpy"``
or a PIL image with ``"pil"``; the label an ``int``. Indexing with a list/array of indices
returns a collated batch from one vectorised read; ``__getitems__`` serves torch's standard
batched fetch. Files are opened lazily in each process, never inherited across fork.

:class:`ReaderOptions` is every option a reader takes besides its path, as one frozen,
validated dataclass: it turns pixels and labels into samples or a collated batch, for map-style
and iterable readers alike. A reader with options of its own subclasses it (its ``Options``).
What a format's reader implements is :class:`fastdata.formats.base.Reader`;
:class:`fastdata.decoding.Decoder` is the one decode path (encoded bytes -> pixels, or a
:class:`~fastdata.errors.CorruptDataError` naming the sample).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, default_collate

from fastdata.decoding import Decoder, check_decoder, geometry_of
from fastdata.errors import CorruptManifestError, InvalidOptionError, ShapeMismatchError, UnknownOptionError
from fastdata.formats.base import Reader
from fastdata.formats.stored import open_manifest
from fastdata.fused import FusedPlan, split_transform
from fastdata.images import Geometry
from fastdata.remote.dataset import RemoteOptions, locate
from fastdata.remote.filesystem import Retry
from fastdata.urls import is_url

IMAGE_FORMATS = ("tensor", "numpy", "pil")


@dataclass(frozen=True)
class ReaderOptions:
    """What every reader takes besides its path (``MemmapDataset(path, transform=...,
    resize=...)``, ``fastdata.open_dataset(path, ...)``), validated once, here. A new option
    shared by every reader is one field.

    ``batch_transform`` takes image tensors ``[B, C, H, W]`` (after ``transform``) and applies on
    every path, so a plain ``DataLoader`` gives what ``fastdata.loader`` gives: to each collated
    batch where the reader collates (``ds[indices]``, ``fastdata.loader``, ``TarDataset(...,
    batch_size=N)``), and to each image as a batch of one (``[1, C, H, W]``) where samples are
    served one by one (``ds[i]``, ``__getitems__``, i.e. ``DataLoader(ds, batch_size=N)``). A
    random transform therefore draws once per batch on the first and once per image on the
    second. It needs ``image_format="tensor"``. ``resize``, ``center_crop`` and ``decoder``
    apply to encoded images (:mod:`fastdata.decoding`).

    ``fuse`` (default True): a torchvision ``transform`` that starts with ``RandomResizedCrop``
    (+ ``RandomHorizontalFlip``), or ``Resize`` + ``CenterCrop``, has that part done inside the
    decode of encoded images (:mod:`fastdata.fused`) and the rest of it run after (``fused``:
    ``(plan, rest)``, or None); ``fuse=False`` decodes, then runs the whole transform. Only with
    ``image_format="tensor"`` and no read-time ``resize``/``center_crop``. The crops are drawn
    from ``(seed, epoch, sample index)``; a dataset with fields moves its masks, boxes and
    further images with the same crop and flip (:mod:`fastdata.records`).

    ``pixels`` given to :meth:`samples`/:meth:`batch` are uint8 HWC: one (B, H, W, C) array, or
    a list of (H, W, C) arrays when sizes may differ.

    ``storage_options``, ``cache_dir``, ``cache_limit`` and ``retry`` apply when the path is a
    URL (``s3://``, ``gs://``, ``https://``, ...): see :mod:`fastdata.remote` and docs/remote.md.
    """

    transform: Callable | None = None
    target_transform: Callable | None = None
    image_format: str = "tensor"
    batch_transform: Callable | None = None
    resize: Any = None
    center_crop: Any = None
    decoder: str = "pil"
    storage_options: dict[str, Any] | None = field(default=None, repr=False)  # may hold credentials
    cache_dir: str | os.PathLike | None = None
    cache_limit: int | None = None
    retry: Retry | None = None
    fields: Any = None  # names of the fields to read (datasets with fields, docs/fields.md); None: all
    fuse: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        self.remote  # validated up front
        if self.fields is not None:
            if isinstance(self.fields, str) or not all(isinstance(name, str) for name in self.fields):
                raise InvalidOptionError(f"fields must be a list of field names, got {self.fields!r}.")
            object.__setattr__(self, "fields", tuple(self.fields))
        if self.image_format not in IMAGE_FORMATS:
            allowed = ", ".join(map(repr, IMAGE_FORMATS))
            raise InvalidOptionError(f"Unknown image_format {self.image_format!r}. Allowed: {allowed}.")
        if self.batch_transform is not None and self.image_format != "tensor":
            raise InvalidOptionError(
                f"batch_transform takes image tensors [B, C, H, W], but image_format={self.image_format!r} gives "
                f"{'ndarrays' if self.image_format == 'numpy' else 'PIL images'}. Use image_format='tensor' (the "
                "default), or apply the transform yourself."
            )
        geometry = geometry_of(self.resize, self.center_crop)
        object.__setattr__(self, "resize", geometry.resize)
        object.__setattr__(self, "center_crop", geometry.center_crop)
        check_decoder(self.decoder)
        if not isinstance(self.fuse, bool):
            raise InvalidOptionError(f"Invalid fuse {self.fuse!r}. Use True (fuse the transform's leading crop "
                                     "into the decode) or False (decode, then transform).")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise InvalidOptionError(f"Invalid seed {self.seed!r}. Use an integer.")
        object.__setattr__(self, "fused", self._split())

    def _split(self) -> tuple[FusedPlan, Callable | None] | None:
        """``(plan, rest)`` of a fusable ``transform`` (see the class docstring), else None."""
        if not self.fuse or self.transform is None or self.image_format != "tensor" or not self.geometry.is_identity:
            return None
        if not type(self.transform).__module__.startswith("torchvision."):
            return None  # only torchvision's own transforms are read (and torchvision stays optional)
        return split_transform(self.transform)

    @property
    def unfused(self) -> "ReaderOptions":
        """These options with ``fuse=False`` (what a reader whose images are not fused uses)."""
        if self.fused is None:
            return self
        cached = self.__dict__.get("_unfused")
        if cached is None:
            cached = self.replace(fuse=False)
            object.__setattr__(self, "_unfused", cached)
        return cached

    @property
    def decoded_transform(self) -> Callable | None:
        """What runs on each decoded image: ``transform``, or the rest of it after a fused crop."""
        return self.fused[1] if self.fused is not None else self.transform

    @classmethod
    def build(cls, reader: str, values: dict[str, Any]) -> "ReaderOptions":
        """The options of reader ``reader`` (a class name, for the error) from keyword arguments,
        refusing a name it does not take."""
        known = [field.name for field in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise UnknownOptionError(
                f"{reader}() got an unexpected keyword argument {unknown[0]!r}. "
                f"Its options: {', '.join(map(repr, known))}."
            )
        return cls(**values)

    def replace(self, **changes: Any) -> "ReaderOptions":
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def remote(self) -> RemoteOptions:
        """How a URL is read (:class:`fastdata.remote.RemoteOptions`)."""
        return RemoteOptions(storage_options=self.storage_options, cache_dir=self.cache_dir,
                             cache_limit=self.cache_limit, retry=self.retry if self.retry is not None else Retry.from_env(),
                             prefetch=getattr(self, "prefetch", 2))

    @property
    def geometry(self) -> Geometry:
        return Geometry(resize=self.resize, center_crop=self.center_crop)

    @property
    def per_sample(self) -> bool:
        """Whether a batch must be built sample by sample (a transform, or PIL images)."""
        return (self.decoded_transform is not None or self.target_transform is not None
                or self.image_format == "pil")

    def samples(self, pixels: np.ndarray | list[np.ndarray], labels: np.ndarray, *,
                collated_next: bool = False) -> list[tuple[Any, Any]]:
        """One ``(image, label)`` per row, transformed (``batch_transform`` as a batch of one,
        unless ``collated_next``: :meth:`batch` applies it to the whole batch)."""
        if self.image_format == "tensor":
            if isinstance(pixels, list):
                images = [torch.from_numpy(p).permute(2, 0, 1) for p in pixels]
            else:
                images = torch.from_numpy(pixels).permute(0, 3, 1, 2).unbind(0)
        elif self.image_format == "numpy":
            images = list(pixels)
        else:  # decoded images come as PIL images already (no array round trip); raw pixels do not
            images = [p if isinstance(p, Image.Image) else Image.fromarray(p[:, :, 0] if p.shape[2] == 1 else p)
                      for p in pixels]
        targets = labels.tolist()
        transform = self.decoded_transform
        if transform is not None:
            images = [transform(image) for image in images]
        if self.target_transform is not None:
            targets = [self.target_transform(label) for label in targets]
        if self.batch_transform is not None and not collated_next:
            images = [self._batch_transformed(image, 3)[0] for image in images]
        return list(zip(images, targets))

    def _batch_transformed(self, images: Any, ndim: int) -> Any:
        """``batch_transform`` of an image tensor (``ndim`` 3: one image, as a batch of one)."""
        if not isinstance(images, torch.Tensor) or images.ndim != ndim:
            got = f"a tensor of shape {tuple(images.shape)}" if isinstance(images, torch.Tensor) else type(images).__name__
            raise TypeError(f"batch_transform takes image tensors [B, C, H, W]; the images here are {got} "
                            "(from transform). Make transform return a (C, H, W) tensor.")
        return self.batch_transform(images.unsqueeze(0) if ndim == 3 else images)

    def batch(self, pixels: np.ndarray | list[np.ndarray], labels: np.ndarray,
              allocate: Callable | None = None) -> tuple[Any, Any]:
        """A collated batch: ``(uint8 [B, C, H, W], int64 [B])`` from one stacked array, or, with
        transforms, the transformed samples collated like torch's ``default_collate`` (PIL images
        that stay PIL images come back as a list)."""
        if self.per_sample:
            samples = self.samples(pixels, labels, collated_next=True)
            if samples and all(isinstance(image, Image.Image) for image, _ in samples):
                return [image for image, _ in samples], default_collate([label for _, label in samples])
            collated = default_collate(samples)
            if self.batch_transform is None:
                return collated
            images, targets = collated
            return self._batch_transformed(images, 4), targets
        if isinstance(pixels, list):
            pixels = stack(pixels, allocate)
        targets = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
        if self.image_format == "numpy":
            return pixels, targets.numpy()
        images = torch.from_numpy(pixels).permute(0, 3, 1, 2)
        if self.batch_transform is not None:
            images = self.batch_transform(images)
        return images, targets


def stack(pixels: list[np.ndarray], allocate: Callable | None = None) -> np.ndarray:
    """HWC arrays of one shape as one (B, H, W, C) array (in ``allocate``'d memory when given:
    the process backend's shared-memory slot), or a clear error."""
    shapes = {p.shape for p in pixels}
    if len(shapes) > 1:
        raise ShapeMismatchError(
            f"Samples of this batch have different shapes {sorted(shapes)[:3]}; a collated batch "
            "needs one. Pass a transform that resizes (e.g. transforms.v2.Resize), or convert "
            "with --resize HxW."
        )
    if not pixels:
        return np.empty((0, 0, 0, 0), dtype=np.uint8)
    out = allocate((len(pixels), *pixels[0].shape), np.uint8) if allocate is not None else None
    return np.stack(pixels, out=out) if out is not None else np.stack(pixels)


def allocated(allocate: Callable | None, shape: tuple[int, ...]) -> np.ndarray:
    """A uint8 array of ``shape``: from ``allocate`` when given (and it has room), else new."""
    out = allocate(shape, np.uint8) if allocate is not None else None
    return out if out is not None else np.empty(shape, dtype=np.uint8)


def _signature(cls: type) -> inspect.Signature:
    """``cls``'s constructor as users call it: its own leading parameters, then every field of
    its ``Options`` as a keyword (in place of ``**options``)."""
    own = [parameter for parameter in inspect.signature(cls.__init__).parameters.values()
           if parameter.kind is not inspect.Parameter.VAR_KEYWORD][1:]  # without self
    taken = {parameter.name for parameter in own}
    keywords = [inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=field.default,
                                  annotation=field.type)
                for field in dataclasses.fields(cls.Options) if field.name not in taken]
    return inspect.Signature([*own, *keywords])


def _option(name: str) -> property:
    """A reader attribute kept in its :class:`ReaderOptions`: settable after construction (like
    torchvision datasets' ``transform``), validated again when set."""

    def get(self: "ReaderOutput") -> Any:
        return getattr(self.options, name)

    def set_(self: "ReaderOutput", value: Any) -> None:
        self.options = self.options.replace(**{name: value})
        decoder = getattr(self, "decoder", None)
        if isinstance(decoder, Decoder):
            self.decoder = decoder.with_options(self.options)  # a new transform: a new fused plan

    return property(get, set_, doc=f"``{name}`` (see :class:`ReaderOptions`).")


class ReaderOutput:
    """What every reader keeps of its output: its :class:`ReaderOptions` (``self.options``;
    ``Options`` is the class, a subclass for a reader with options of its own), the
    ``transform``/``target_transform``/``image_format``/``batch_transform`` read from them
    (changeable after construction), and the classes.

    A reader's constructor takes ``(path, transform=None, target_transform=None, **options)``;
    its signature, as :func:`inspect.signature` and ``help()`` show it, lists every option by
    name and default (set here from ``Options``)."""

    Options: type[ReaderOptions] = ReaderOptions
    classes: list[str] = []
    class_to_idx: dict[str, int] = {}
    transform = _option("transform")
    target_transform = _option("target_transform")
    image_format = _option("image_format")
    batch_transform = _option("batch_transform")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__ or "Options" in cls.__dict__:
            cls.__signature__ = _signature(cls)

    def _init_options(self, transform: Callable | None, target_transform: Callable | None,
                      options: dict[str, Any]) -> None:
        self.options = self.Options.build(type(self).__name__,
                                          dict(options, transform=transform, target_transform=target_transform))

    @property
    def output(self) -> ReaderOptions:
        """The output contract with this reader's current options (without fusion where its
        decoder does not fuse: decoded pixels are stored)."""
        decoder = getattr(self, "decoder", None)
        if self.options.fused is not None and (decoder is None or decoder.plan is None):
            return self.options.unfused
        return self.options

    @property
    def targets(self) -> list[int]:
        """Every sample's label in index order, a list of ints like torchvision's
        ``ImageFolder.targets`` (``labels`` is the same as a numpy array)."""
        return self.labels.tolist()

    def __repr__(self) -> str:
        """Like a torchvision dataset's: name, count, location, what is stored, the transforms."""
        lines = [f"Dataset {type(self).__name__}", f"    Number of datapoints: {len(self.labels)}"]
        root = getattr(self, "path", None) or getattr(self, "root", None)
        if root is not None:
            lines.append(f"    Root location: {root}")
        manifest = getattr(self, "manifest", None)
        if manifest:
            image = manifest.get("image") or {}
            shape = image.get("shape")
            size = f"{shape[0]}x{shape[1]} " if isinstance(shape, list) and len(shape) == 3 else ""
            lines.append(f"    Stored: {manifest.get('format')} {manifest.get('store')}, {size}{image.get('mode', '')}")
        elif getattr(self, "mode", None):
            lines.append(f"    Mode: {self.mode}")
        schema = getattr(self, "schema", None)
        if schema is not None:
            lines.append(f"    Fields: {', '.join(f'{f.name} ({f.kind})' for f in schema.fields)}")
        lines.append(f"    Classes: {len(self.classes)}")
        lines.append(f"    Output: {self.image_format}")
        for name in ("transform", "target_transform", "batch_transform"):
            value = getattr(self, name, None)
            if value is not None:
                text = repr(value).replace("\n", "\n    ")
                lines.append(f"    {name}: {text}")
        return "\n".join(lines)

    def _set_classes(self, manifest: dict[str, Any]) -> None:
        """Class names (index = label) and their mapping, like torchvision's ImageFolder."""
        self.classes = list(manifest.get("classes") or [])
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}


class MapDataset(ReaderOutput, Reader, Dataset):
    """Base of map-style readers. Subclasses set ``labels`` and implement the hooks of
    :class:`fastdata.formats.base.Reader` (``_open``, ``_read``); ``_open()``'s handles are kept
    in ``self._handles``, per process.
    """

    labels: np.ndarray
    epoch: int | None = None  # set_epoch's; None: the crops of a fused transform use torch's global generator

    def __init__(self, transform: Callable | None = None, target_transform: Callable | None = None, **options: Any):
        self._init_options(transform, target_transform, options)
        self._handles: Any = None
        self._pid: int | None = None

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the reads that do not carry one (``fastdata.loader``'s batches do): with
        a fused transform, sample ``i``'s crop is drawn from ``(seed, epoch, i)``. Without it
        (and without ``fastdata.loader``), crops come from torch's global generator, as
        torchvision's transforms' do."""
        self.epoch = int(epoch)

    def epoch_of(self, indices: Any) -> int | None:
        """The epoch a read of ``indices`` is in: the one ``fastdata.loader``'s batches carry,
        else :meth:`set_epoch`'s (None: not known)."""
        return getattr(indices, "epoch", self.epoch)

    # --- per-process resources ---------------------------------------------------------

    def _pixels(self, indices: np.ndarray, allocate: Callable | None = None) -> Any:
        return self._read(indices, allocate, pil=self.image_format == "pil")

    @property
    def handles(self) -> Any:
        """This process's open files, opened on first use (and again after a fork)."""
        if self._pid != os.getpid():
            self._handles = self._open()
            self._pid = os.getpid()
        return self._handles

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = None
        state["_pid"] = None
        return state

    # --- indexing ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.labels)

    def _indices(self, index: Any) -> np.ndarray:
        if isinstance(index, slice):
            return np.arange(*index.indices(len(self)))
        if isinstance(index, torch.Tensor):
            index = index.numpy()
        indices = index if isinstance(index, np.ndarray) else np.asarray(index)
        if indices.ndim != 1 or not (indices.dtype.kind in "iu" or indices.size == 0):
            raise TypeError(
                f"indices must be an int, a slice or a 1-D sequence of ints, got {type(index).__name__}"
            )
        if not indices.size:
            return indices.astype(np.int64)
        length = len(self.labels)
        low, high = indices.min(), indices.max()
        if low >= 0 and high < length:  # the common case: nothing to wrap or refuse
            return indices
        if low < -length or high >= length:
            bad = indices[(indices < -length) | (indices >= length)][0]
            raise IndexError(f"index {bad} is out of range for a dataset of {length} samples")
        return np.where(indices < 0, indices + length, indices)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (int, np.integer)) or (isinstance(index, torch.Tensor) and index.ndim == 0):
            position = int(index)
            if not -len(self) <= position < len(self):
                raise IndexError(f"index {position} is out of range for a dataset of {len(self)} samples")
            indices = np.array([position % len(self)])
            if self.schema is not None:
                return self.records.samples(indices)[0]
            return self.output.samples(self._pixels(indices), self.labels[indices])[0]
        return self.get_batch(self._indices(index))

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, Any]]:
        """torch's batched fetch: the samples of ``indices`` from one read, as views."""
        indices = self._indices(indices)
        if self.schema is not None:
            return self.records.samples(indices)
        return self.output.samples(self._pixels(indices), self.labels[indices])

    schema: Any = None  # the fastdata.fields.Schema of a dataset with fields; None for (image, label)

    @property
    def records(self) -> Any:
        """How this reader's samples with fields are built (:class:`fastdata.records.Records`)."""
        from fastdata.records import Records  # only datasets with fields need it

        return Records(self)

    def _field_values(self, f: Any, indices: np.ndarray) -> Any:
        """One extra field's stored values of ``indices``: the (B, *shape) rows of a fixed field,
        or each sample's stored bytes (:mod:`fastdata.fields`)."""
        raise NotImplementedError

    def get_batch(self, indices: np.ndarray, allocate: Callable | None = None) -> tuple[Any, Any]:
        """A collated batch ``(uint8 [B,C,H,W], int64 [B])`` from one vectorised read (into
        ``allocate``'d memory where given: the process backend's shared-memory slot)."""
        output = self.output
        if self.schema is not None:
            return self.records.batch(indices, None if output.per_sample else allocate)
        if output.per_sample:
            allocate = None  # transformed samples are new objects anyway
        return output.batch(self._pixels(indices, allocate), self.labels[indices], allocate)


def decoder_for(manifest: dict[str, Any], options: ReaderOptions) -> Decoder:
    """The read-time :class:`~fastdata.decoding.Decoder` of a converted dataset: resize,
    center_crop and decoder apply to encoded images; raw pixels were sized at conversion."""
    encoded = manifest["store"] != "raw"
    made = Decoder(manifest["image"]["mode"], options.geometry, options.decoder == "fast", encoded=encoded)
    if not encoded and (not made.geometry.is_identity or made.fast):
        raise InvalidOptionError(
            "resize, center_crop and decoder apply to datasets of encoded images; this one stores decoded "
            "pixels (--store raw). Convert with --resize/--center-crop instead, or transform the tensors."
        )
    return made.with_options(options)


class StoredDataset(MapDataset):
    """Base of the readers of converted datasets: opens and checks the manifest
    (:func:`fastdata.formats.open_manifest`), takes the classes from it, then calls the
    subclass's :meth:`_load` to check and load its own files."""

    format_name = ""
    required_files: dict[str, tuple[str, ...]] = {}  # store -> names the manifest's "files" must list
    remote_fetch: tuple[str, ...] | None = None  # a URL's files fetched at open (None: all; the rest on use)

    def __init__(self, path: str | os.PathLike, transform: Callable | None = None,
                 target_transform: Callable | None = None, **options: Any):
        super().__init__(transform, target_transform, **options)
        self.url = os.fspath(path) if is_url(path) else None
        self.path, self.files = locate(path, self.options.remote, fetch=self.remote_fetch)  # a URL: into the cache
        self.manifest = open_manifest(self.path, self.format_name)
        self.store = self.manifest["store"]
        self.mode = self.manifest["image"]["mode"]
        self.decoder = decoder_for(self.manifest, self.options)
        missing = [name for name in self.required_files.get(self.store, ()) if name not in self.manifest["files"]]
        if missing:
            raise CorruptManifestError(
                f"{str(self.path)!r}: the manifest does not list {missing[0]!r}, which a {self.format_name} "
                f"{self.store} dataset needs. Run 'fastdata verify {self.path}' or convert the source again."
            )
        self._set_classes(self.manifest)
        self._load()
        if "fields" in self.manifest:
            from fastdata.records import open_schema  # only datasets with fields need it

            self.schema = open_schema(self)
