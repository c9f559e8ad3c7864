"""What every reader keeps of its output (:class:`ReaderOutput`): its options, the attributes
read from them and changeable after construction, the classes, and the constructor signature
``help()`` shows."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

from fastdata.reader.decoding import Decoder
from fastdata.reader.options import ReaderOptions
from fastdata.remote.dataset import RemoteOptions

def _signature(cls: type) -> inspect.Signature:
    """``cls``'s constructor as users call it: its own leading parameters, then every field of
    its ``Options`` as a keyword (in place of ``**options``)."""
    own = [parameter for parameter in inspect.signature(cls.__init__).parameters.values()
           if parameter.kind is not inspect.Parameter.VAR_KEYWORD][1:]  # without self
    taken = {parameter.name for parameter in own}
    declared = {field.name: field for field in dataclasses.fields(cls.Options)}
    declared.update({field.name: field for field in dataclasses.fields(RemoteOptions)})  # gathered into remote=
    keywords = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=declared[name].type,
                                  default=None if declared[name].default is dataclasses.MISSING else declared[name].default)
                for name in cls.Options.keywords() if name not in taken]
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
            self.decoder = decoder.with_options(self.options)  # a new transform: a new fusion, held there

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
        """The output contract with this reader's current options, as they apply to what its
        decoder gives: after a fused decode (``decoder.fusion``), the rest of the transform."""
        decoder = getattr(self, "decoder", None)
        fusion = decoder.fusion if isinstance(decoder, Decoder) else None
        if fusion is None:
            return self.options
        cached = self.__dict__.get("_output")  # built once per (options, fusion): read for every batch
        if cached is None or cached[0] is not self.options or cached[1] is not fusion:
            cached = (self.options, fusion, self.options.after_fusion(fusion))
            self._output = cached
        return cached[2]

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
        """Class names (index = label) and their mapping as the source had them, like
        torchvision's: a class with several names is a tuple of them (``ImageNet``)."""
        self.classes = [tuple(entry) if isinstance(entry, list) else entry for entry in manifest.get("classes") or []]
        mapping = manifest.get("class_to_idx")
        self.class_to_idx = dict(mapping) if isinstance(mapping, dict) and mapping else \
            {name: index for index, name in enumerate(self.classes)}
