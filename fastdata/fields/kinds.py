"""Field kinds: one class per kind, one table (docs/fields.md, "Adding a field kind").

A kind is everything that differs between an ``image``, a ``mask``, an ``int``, ... field: which
values it claims (:meth:`FieldKind.infer`), how a later value is checked, how a value becomes
stored bytes and a tar member and back, whether it is stored as fixed rows or variable bytes,
how it moves with the image under ``--resize``/``--center-crop``, and what a reader gives back,
one sample at a time or as a batch. The rest of the package asks the field's kind
(``field.kind_spec``, a row of :data:`KINDS`), never compares kind names.

:func:`register_kind` adds a kind (a :class:`FieldKind` instance) to the table. fastdata's own
kinds are in :mod:`fastdata.fields.scalar_kinds`, :mod:`fastdata.fields.text_kinds`,
:mod:`fastdata.fields.array_kind` and :mod:`fastdata.fields.image_kinds`.

This module imports nothing of :mod:`fastdata.fields.schema` (the schema asks this table), so a
kind's methods take a :class:`fastdata.fields.Field` without naming its class.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fastdata.errors import BadSampleError, InvalidOptionError

VARIABLE = "variable"  # the kinds hint suffix "array:variable": a variable first dimension
RAGGED = "ragged"  # "array:ragged": every dimension may vary (the number of dimensions may not)
ARRAY_DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                "float16", "float32", "float64")
_KIND_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


class FieldError(BadSampleError):
    """A sample's value does not fit its field (the message names the sample and the field)."""


@dataclass(frozen=True)
class Stored:
    """The values a stored field of one kind may have in a manifest: ``dtypes``, ``encodings``,
    ``modes`` (None: absent), and which ``shape`` rule applies (``"scalar"``: none or ``[]``;
    ``"none"``: none; ``"array"``: a shape, a variable first dimension allowed; ``"spatial"``: a
    raw image's or mask's fixed one, of ``ndim`` dimensions). A manifest's JSON is untrusted:
    every value is checked."""

    dtypes: tuple = (None,)
    encodings: tuple = (None,)
    modes: tuple = (None,)
    shape: str = "none"
    ndim: int | None = None


@dataclass(frozen=True)
class Hint:
    """A ``kinds`` hint parsed: ``{"points": "array:variable"}`` -> ``Hint("array", variable=True)``;
    ``kind`` None where the dataset gave no hint for the field."""

    kind: str | None = None
    variable: bool = False
    ragged: bool = False

    @classmethod
    def parse(cls, text: str | None, name: str) -> "Hint":
        if not text:
            return cls()
        kind, _, flag = text.partition(":")
        if KINDS.get(kind) is None or flag not in ("", VARIABLE, RAGGED):
            raise InvalidOptionError(f"kinds hint {kind!r} for field {name!r} is no field kind. Kinds: {', '.join(KINDS)} "
                                     "(arrays: 'array:variable' for a variable first dimension, 'array:ragged' for any).")
        return cls(kind, flag == VARIABLE, flag == RAGGED)


def tv_type(value: Any) -> str | None:
    """The tv_tensors class name of ``value`` (Image, Mask, BoundingBoxes, ...), or None."""
    module = type(value).__module__
    if module.startswith("torchvision.tv_tensors"):
        for cls in type(value).__mro__:
            if cls.__module__.startswith("torchvision.tv_tensors") and cls.__name__ != "TVTensor":
                return cls.__name__
    return None


def is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def is_array(value: Any) -> bool:
    """A tensor or a numpy array."""
    return is_tensor(value) or isinstance(value, np.ndarray)


def as_numpy(value: Any) -> np.ndarray:
    if is_tensor(value):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def describe_type(value: Any) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}" if type(value).__module__ != "builtins" \
        else type(value).__name__


def little_endian(dtype: str) -> np.dtype:
    return np.dtype(dtype).newbyteorder("<")


class FieldKind:
    """One field kind: a row of :data:`KINDS`. Subclass it, set :attr:`name` (and what differs
    from these defaults), and :func:`register_kind` an instance.

    The defaults describe a kind of variable values kept as the bytes :meth:`store` makes, given
    back by :meth:`load`, one tar member ``<key>.<name>.<extension>`` of those bytes, a list per
    batch, and nothing to do under the image's geometry. A fixed-size kind overrides
    :meth:`variable` (and :attr:`stored` with its dtypes and the ``"array"`` shape rule): formats
    then keep it as one ``(N, *shape)`` array of the field's dtype, and batches stack it.
    """

    name: str = ""
    #: the name a tuple position holding such a value gets (``(image, label)``)
    default_name: str = "value"
    #: what a manifest may say of such a field
    stored: Stored = Stored()
    #: tv_tensors classes (``meta["tv_tensor"]``) a field of this kind may be given back as
    tv_tensors: tuple[str, ...] = ()
    #: an image-like value (H, W[, C]) of uint8: stored in pixel storage or PNG, decoded when
    #: read, moved with the image, the canvas that boxes are drawn on
    spatial: bool = False
    #: the value is JSON data (a list of captions and a JSON field merge into JSON)
    json_valued: bool = False
    #: the order in which kinds are asked to claim a value, in each of the two passes
    #: (:meth:`infer`, then :meth:`infer_value`), lowest first; fastdata's own kinds are 5 to 80,
    #: so a registered kind with the default 0 is asked first
    infer_rank: int = 0
    #: the WebDataset member extension its values are written with (:meth:`extension`)
    member_extension: str = "bin"

    def __repr__(self) -> str:
        return f"<field kind {self.name!r}>"

    # --- values -> fields ---------------------------------------------------------------------

    def infer(self, name: str, value: Any, hint: Hint, sample: str, image_field: str | None) -> Any:
        """The :class:`~fastdata.fields.Field` (its shape as this value has it) this kind makes
        of ``value`` where its type or ``hint`` says this kind (a tv_tensor, a PIL image, a
        hinted value), or None. ``hint`` is what the dataset's ``kinds`` said of the field;
        ``image_field`` the sample's image field so far. Every kind is asked this first, in
        :attr:`infer_rank` order, then :meth:`infer_value`."""
        return None

    def infer_value(self, name: str, value: Any, hint: Hint, sample: str, image_field: str | None) -> Any:
        """The field this kind makes of a value that no kind claimed by its type or hint (a
        number, a str, an array, plain JSON data), or None."""
        return None

    def merge(self, old: Any, new: Any) -> Any:
        """The field two samples' fields of this kind agree on (``old``'s kind is this one); None
        where they cannot join."""
        if old.kind == new.kind:
            return old
        if self.json_valued and new.kind_spec.json_valued:
            return type(old)(old.name, "json")
        return None

    def check(self, f: Any, value: Any, where: str) -> Any:
        """A later sample's value (not None) checked against its field and normalised; a
        :class:`FieldError` starting with ``where`` when it does not fit. Never cast."""
        raise NotImplementedError(f"field kind {self.name!r} has no check()")

    def may_be_empty(self, f: Any) -> bool:
        """A None value is the field's empty value (a COCO image without boxes)."""
        return f.variable and not self.spatial

    def variable(self, f: Any) -> bool:
        """Stored as data + offsets (each value's own bytes), not as one fixed-size row each."""
        return True

    def digest(self, f: Any, value: Any) -> bytes:
        """Bytes that stand for a checked value in a source fingerprint."""
        return f.store(value)

    # --- stored bytes and tar members ----------------------------------------------------------

    def store(self, f: Any, value: Any) -> bytes:
        """A checked value as its stored bytes (a fixed field: one little-endian row)."""
        raise NotImplementedError(f"field kind {self.name!r} has no store()")

    def load(self, f: Any, data: bytes | memoryview | np.ndarray) -> Any:
        """Stored bytes (for fixed fields, the stored row) back as the value; ValueError or
        UnicodeDecodeError for damaged bytes (:meth:`Field.load` names the field)."""
        raise NotImplementedError(f"field kind {self.name!r} has no load()")

    def extension(self, f: Any) -> str:
        """The extension WebDataset's default decoders read this field's member with."""
        return self.member_extension

    def member(self, f: Any, stored: bytes) -> bytes:
        """Stored bytes as the tar member WebDataset's default decoders read."""
        return bytes(stored)

    def from_member(self, f: Any, data: bytes | memoryview) -> bytes | memoryview:
        """A member's bytes back as stored bytes (the same view where they are the same bytes);
        ValueError (or what numpy raises) for a damaged member."""
        return data

    def value_from_member(self, data: bytes) -> Any:
        """A WebDataset source's member (``<key>.<suffix>``) as a value this kind checks."""
        return data

    # --- conversion: the image's geometry, the stored form ---------------------------------------

    def planned(self, f: Any, plan: Any, probe: Any, keeps_file: bool) -> Any:
        """The field as the conversion stores it, once the plan (store, encoding, mode, image
        shape, geometry) is known; ``probe`` is the first sample's value, ``keeps_file`` True
        where the source's own file is kept (``encoding="original"``)."""
        return f

    def moves_with_image(self, f: Any) -> bool:
        """Its values change with ``--resize``/``--center-crop`` (:meth:`moved`)."""
        return False

    def check_beside_image(self, f: Any, value: Any, size: tuple[int, int], image: str, sample: str) -> None:
        """Refuse a value that cannot go with its sample's image (``size``: the image's
        (width, height)); a mask of another size, say."""

    def moved(self, f: Any, value: Any, move: Callable[[Any], Any], size: tuple[int, int]) -> Any:
        """The value after the image's geometry: ``move`` applies torchvision's ``resize`` and
        ``center_crop`` to a tv_tensor; ``size`` is the image's (width, height) before."""
        return value

    def converted(self, f: Any, value: Any, plan: Any, sample: str) -> bytes:
        """A checked (and moved) value's stored bytes at conversion."""
        return f.store(value)

    # --- reading --------------------------------------------------------------------------------

    def decoded(self, f: Any, stored: Any, image_format: str) -> Any:
        """A spatial field's stored value as pixels (an encoded one decoded); others as they are."""
        return stored

    def read_value(self, f: Any, stored: Any, image_format: str, canvas: Callable[[], tuple[int, int]]) -> Any:
        """One sample's value as a reader gives it (``image_format``: ``tensor``, ``numpy`` or
        ``pil``; ``canvas()`` the (height, width) of the image that boxes are drawn on)."""
        return f.load(stored)

    def stacks(self, f: Any) -> bool:
        """A batch holds this field as one stacked array (fixed shape), not a list of values."""
        return not f.variable

    def stacked(self, f: Any, rows: np.ndarray) -> np.ndarray:
        """A batch's stacked rows as the batch holds them."""
        return rows

    def batch_tensor(self, f: Any, tensor: Any) -> Any:
        """A spatial field's stacked (B, H, W[, C]) pixels as the batch's tensor."""
        return tensor

    def batch_dtype(self, f: Any) -> str | None:
        """The dtype a transform's Python numbers of this field are collated to (None: float64)."""
        return None

    def paddable(self, f: Any) -> bool:
        """``fastdata.loader(pad=...)`` can pad it (a variable first dimension)."""
        return False

    def pad_refusal(self, f: Any) -> str:
        """Why ``pad`` cannot pad the field (after 'field NAME of DATASET')."""
        return f"is {f.kind}"


KINDS: dict[str, FieldKind] = {}


def register_kind(kind: FieldKind, *, replace: bool = False) -> FieldKind:
    """Add ``kind`` (a :class:`FieldKind` instance) to :data:`KINDS` under ``kind.name``; from then
    on conversions infer, check, store and read fields of that kind in every format. A kind of
    that name already there is refused unless ``replace``. Returns ``kind``."""
    if not isinstance(kind, FieldKind):
        raise InvalidOptionError(f"register_kind takes a FieldKind instance, got {describe_type(kind)}.")
    if not isinstance(kind.name, str) or not _KIND_NAME.fullmatch(kind.name):
        raise InvalidOptionError(f"Invalid field kind name {kind.name!r}: use lowercase letters, digits and '_' "
                                 "(up to 32, starting with a letter).")
    if kind.name in KINDS and not replace:
        raise InvalidOptionError(f"Field kind {kind.name!r} is registered already ({KINDS[kind.name]!r}). "
                                 "Pass replace=True to replace it.")
    KINDS[kind.name] = kind
    _INFERENCE.clear()
    return kind


def unregister_kind(name: str) -> None:
    """Remove a registered kind (tests; datasets that have fields of it cannot be read after)."""
    KINDS.pop(name, None)
    _INFERENCE.clear()


def kind_named(name: str) -> FieldKind:
    """The registered kind ``name``; an :class:`InvalidOptionError` listing the kinds when there is none."""
    kind = KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise InvalidOptionError(f"Unknown field kind {name!r}. Kinds: {', '.join(KINDS)}.")
    return kind


_INFERENCE: list[FieldKind] = []


def inference_order() -> list[FieldKind]:
    """The kinds in the order they are asked to claim a value (:attr:`FieldKind.infer_rank`)."""
    if not _INFERENCE:
        _INFERENCE.extend(sorted(KINDS.values(), key=lambda kind: kind.infer_rank))
    return _INFERENCE
