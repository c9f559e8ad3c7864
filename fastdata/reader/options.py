"""The output contract shared by every reader, and its options: :class:`ReaderOptions` turns
pixels and labels into samples or a collated batch, for map-style and iterable readers alike
(see :mod:`fastdata.reader` for the contract)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate

from fastdata.reader.decoding import check_decoder, geometry_of
from fastdata.errors import InvalidOptionError, ShapeMismatchError, UnknownOptionError, fix_option
from fastdata.reader.fused import Fusion, split_transform
from fastdata.reader.handover import as_tensor
from fastdata.images import Geometry
from fastdata.remote.dataset import RemoteOptions

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
    apply to encoded images (:mod:`fastdata.reader.decoding`).

    ``fuse`` (default True): a torchvision ``transform`` that starts with ``RandomResizedCrop``
    (+ ``RandomHorizontalFlip``), or ``Resize`` + ``CenterCrop``, has that part done inside the
    decode of encoded images (:mod:`fastdata.reader.fused`) and the rest of it run after
    (:meth:`fusion`); ``fuse=False`` decodes, then runs the whole transform. Only with
    ``image_format="tensor"`` and no read-time ``resize``/``center_crop``. The crops are drawn
    from ``(seed, epoch, sample index)``; a dataset with fields moves its masks, boxes and
    further images with the same crop and flip (:mod:`fastdata.reader.records`).

    ``pixels`` given to :meth:`samples`/:meth:`batch` are uint8 HWC: one (B, H, W, C) array, or
    a list of (H, W, C) arrays when sizes may differ.

    ``remote`` says how a URL (``s3://``, ``gs://``, ``https://``, ...) is read: a
    :class:`fastdata.remote.RemoteOptions`, or built from its options given as keywords
    (``storage_options``, ``cache_dir``, ``cache_limit``, ``retry``; ``prefetch`` for readers that
    stream, :attr:`streams`): see :mod:`fastdata.remote` and docs/remote.md.
    """

    streams: ClassVar[bool] = False  # a reader that streams files: takes RemoteOptions' streaming options

    transform: Callable | None = None
    target_transform: Callable | None = None
    image_format: str = "tensor"
    batch_transform: Callable | None = None
    resize: Any = None
    center_crop: Any = None
    decoder: str = "pil"
    remote: RemoteOptions | None = None  # None: RemoteOptions() (each of its options by default)
    fields: Any = None  # names of the fields to read (datasets with fields, docs/fields.md); None: all
    fuse: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.remote is None:
            object.__setattr__(self, "remote", RemoteOptions())
        elif not isinstance(self.remote, RemoteOptions):
            raise InvalidOptionError(f"remote must be a fastdata.remote.RemoteOptions, not {type(self.remote).__name__}.")
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

    def fusion(self) -> Fusion | None:
        """The fused decode these options ask for (see the class docstring), or None: the one
        place that decides it. A reader of encoded images hands it to its decoder, which holds
        it (``decoder.fusion``); :meth:`after_fusion` gives the options the rest runs with."""
        if not self.fuse or self.transform is None or self.image_format != "tensor" or not self.geometry.is_identity:
            return None
        if not type(self.transform).__module__.startswith("torchvision."):
            return None  # only torchvision's own transforms are read (and torchvision stays optional)
        split = split_transform(self.transform)
        return None if split is None else Fusion(split[0], split[1], self.seed)

    def after_fusion(self, fusion: Fusion | None) -> "ReaderOptions":
        """These options as they apply to images decoded through ``fusion``: its rest as the
        transform (nothing fused again); themselves when ``fusion`` is None."""
        return self if fusion is None else self.replace(transform=fusion.rest, fuse=False)

    @classmethod
    def build(cls, reader: str, values: dict[str, Any]) -> "ReaderOptions":
        """The options of reader ``reader`` (a class name, for the error) from keyword arguments,
        refusing a name it does not take; :class:`RemoteOptions`' own (:meth:`keywords`) are
        gathered into ``remote``."""
        known = cls.keywords()
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise UnknownOptionError(
                f"{reader}() got an unexpected keyword argument {unknown[0]!r}. "
                f"Its options: {', '.join(map(repr, known))}."
            )
        return cls(**cls._gathered(values))

    @classmethod
    def keywords(cls) -> list[str]:
        """Every keyword a reader with these options takes: the fields, with ``remote``'s own
        options after it."""
        remote = RemoteOptions.keywords(streaming=cls.streams)
        return [name for f in dataclasses.fields(cls) for name in ((f.name, *remote) if f.name == "remote" else (f.name,))]

    @classmethod
    def _gathered(cls, values: dict[str, Any], remote: RemoteOptions | None = None) -> dict[str, Any]:
        """``values`` with the remote options among them gathered into ``remote`` (onto ``remote``
        when given: a :meth:`replace`)."""
        names = [name for name in RemoteOptions.keywords(streaming=cls.streams) if name in values]
        if not names:
            return values
        if values.get("remote") is not None:
            raise InvalidOptionError(f"Give remote= or its options ({', '.join(names)}), not both.")
        rest = {key: value for key, value in values.items() if key not in names}
        flat = {name: values[name] for name in names}
        rest["remote"] = RemoteOptions.from_keywords(flat) if remote is None else dataclasses.replace(
            remote, **{key: value for key, value in flat.items() if value is not None})
        return rest

    def replace(self, **changes: Any) -> "ReaderOptions":
        """A copy with ``changes`` (validated again); a remote option changes ``remote``."""
        return dataclasses.replace(self, **self._gathered(changes, self.remote))

    @property
    def geometry(self) -> Geometry:
        return Geometry(resize=self.resize, center_crop=self.center_crop)

    @property
    def per_sample(self) -> bool:
        """Whether a batch must be built sample by sample (a transform, or PIL images)."""
        return (self.transform is not None or self.target_transform is not None
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
        transform = self.transform
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
        images = as_tensor(pixels).permute(0, 3, 1, 2)
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
            f"with {fix_option('resize', 'HxW')}."
        )
    if not pixels:
        return np.empty((0, 0, 0, 0), dtype=np.uint8)
    out = allocate((len(pixels), *pixels[0].shape), np.uint8) if allocate is not None else None
    return np.stack(pixels, out=out) if out is not None else np.stack(pixels)


def allocated(allocate: Callable | None, shape: tuple[int, ...]) -> np.ndarray:
    """A uint8 array of ``shape``: from ``allocate`` when given (and it has room), else new."""
    out = allocate(shape, np.uint8) if allocate is not None else None
    return out if out is not None else np.empty(shape, dtype=np.uint8)
