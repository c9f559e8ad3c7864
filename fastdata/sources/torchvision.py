"""torchvision datasets by name (``torchvision:CIFAR10``) as conversion sources.

:func:`torchvision_dataset` creates the dataset: ``split`` goes to the dataset's own argument
(``train=``, ``split=`` or ``image_set=``) with the dataset's own values, and ``--source-option``
text is turned into the type the constructor's signature asks for (:func:`coerce_option`).
:func:`torchvision_source` makes it a :class:`~fastdata.sources.base.Source`: a record source
(:mod:`fastdata.sources.torchvision_targets`) for the datasets whose target is not one class
index, the classic ``(image, label)`` source otherwise.
"""

from __future__ import annotations

import ast
import collections.abc
import contextlib
import difflib
import io
import inspect
import os
import typing
from dataclasses import dataclass
from typing import Any, Callable

from fastdata.errors import FastdataError, InvalidOptionError, SourceNotFoundError, fix_option
from fastdata.sources.datasets import dataset_length
from fastdata.extras import require

TORCHVISION_PREFIX = "torchvision:"
ALIASES = {"SBD": "SBDataset"}  # the names users know these datasets by


@dataclass(frozen=True)
class SplitArgument:
    """How one dataset takes its split: the constructor argument, its allowed values (a function
    of the other options where they depend on them; None: the dataset checks them itself), and
    the value used when ``--split`` is not given."""

    argument: str
    values: Callable[[dict[str, Any]], tuple[str, ...]] | None
    default: str


def _voc_sets(options: dict[str, Any]) -> tuple[str, ...]:
    return ("train", "trainval", "val") + (("test",) if str(options.get("year", "2012")) == "2007" else ())


def _cityscapes_splits(options: dict[str, Any]) -> tuple[str, ...]:
    return ("train", "val", "test") if options.get("mode", "fine") == "fine" else ("train", "train_extra", "val")


SPLIT_ARGUMENTS: dict[str, SplitArgument | None] = {
    "VOCSegmentation": SplitArgument("image_set", _voc_sets, "train"),
    "VOCDetection": SplitArgument("image_set", _voc_sets, "train"),
    "OxfordIIITPet": SplitArgument("split", lambda options: ("trainval", "test"), "trainval"),
    "CelebA": SplitArgument("split", lambda options: ("train", "valid", "test", "all"), "train"),
    "SBDataset": SplitArgument("image_set", lambda options: ("train", "val", "train_noval"), "train"),
    "Cityscapes": SplitArgument("split", _cityscapes_splits, "train"),
    # no split: the annotation file decides the samples
    "CocoDetection": None, "CocoCaptions": None, "Flickr8k": None, "Flickr30k": None,
}
_NO_SPLIT_HINT = {"CocoDetection": "annFile", "CocoCaptions": "annFile", "Flickr8k": "ann_file", "Flickr30k": "ann_file"}


def dataset_class(name: str) -> type:
    """``torchvision.datasets.<name>`` (or an alias such as ``SBD``), or a clear error."""
    require("torchvision", extra="torchvision", feature="A torchvision source")
    import torchvision.datasets as tv_datasets  # here: torchvision is optional (the line above says how to install it)
    cls = getattr(tv_datasets, ALIASES.get(name, name), None)
    if not inspect.isclass(cls):
        known = [n for n in dir(tv_datasets) if inspect.isclass(getattr(tv_datasets, n)) and n[0].isupper()]
        names = known + list(ALIASES)
        # a case slip ('Cifar10', 'mnist') is the commonest typo; difflib's ratio misses it
        close = [n for n in names if n.lower() == name.lower()] or difflib.get_close_matches(name, names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise InvalidOptionError(f"Unknown torchvision dataset {name!r}.{hint}")
    return cls


def split_argument(cls: type) -> SplitArgument | None:
    """How ``cls`` takes its split (None: it has none)."""
    if cls.__name__ in SPLIT_ARGUMENTS:
        return SPLIT_ARGUMENTS[cls.__name__]
    params = inspect.signature(cls).parameters
    if "train" in params:
        default = params["train"].default
        return SplitArgument("train", lambda options: ("train", "test"), "test" if default is False else "train")
    if "split" in params:
        default = params["split"].default
        return SplitArgument("split", None, default if isinstance(default, str) else "train")
    return None


def split_keywords(name: str, cls: type, split: str | None, options: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The constructor keywords that choose ``split`` (the dataset's default when None), and the
    split's name as the manifest records it."""
    spec = split_argument(cls)
    if spec is None:
        if split is not None:
            given = _NO_SPLIT_HINT.get(cls.__name__)
            how = f"; its samples are those of its annotation file (--source-option {given}=PATH)" if given else ""
            raise InvalidOptionError(f"torchvision:{name} has no split, so --split {split!r} does not apply{how}. "
                                     f"Drop {fix_option('split', split)}.")
        return {}, None
    if spec.argument in options:  # the split given as the dataset's own option (train=false: the test split)
        given = options[spec.argument]
        named = ("train" if given else "test") if spec.argument == "train" else str(given)
        if split is not None and split != named:
            raise InvalidOptionError(f"torchvision:{name}: --split {split!r} and --source-option "
                                     f"{spec.argument}={given!r} disagree. Give one of them.")
        split = named
    split = spec.default if split is None else split
    allowed = spec.values(options) if spec.values is not None else None
    if allowed is not None and split not in allowed:
        raise InvalidOptionError(f"Unknown split {split!r} for torchvision:{name}. Allowed: "
                                 f"{', '.join(map(repr, allowed))}.")
    if spec.argument == "train":
        return {"train": split == "train"}, split
    return {spec.argument: split}, split


_TRUE, _FALSE, _NONE = ("true", "yes", "on", "1"), ("false", "no", "off", "0"), ("none", "null")


def coerce_option(cls: type, key: str, value: Any) -> Any:
    """A ``--source-option`` value as the type ``cls``'s constructor expects.

    Only text is converted (Python values pass as given): ``none``/``None`` is None where the
    parameter takes None; a parameter typed or defaulting to ``str`` keeps the text (``year=2012``
    stays ``"2012"``, as VOC wants), a list-typed one takes a comma list
    (``target_types=category,segmentation``; empty: an empty list), ``bool`` takes
    true/false/yes/no/on/off/1/0 in any case, ``int`` and ``float`` take numbers, bracketed text
    is a Python tuple or list (``image_size=(1,28,28)``), and a parameter with no type takes any
    of these (else the text). Text a typed parameter cannot take is refused, naming what it takes."""
    if not isinstance(value, str):
        return value
    param = inspect.signature(cls).parameters.get(key)
    types = _accepted_types(cls, param) if param is not None else set()
    text = value.strip()
    if text.lower() in _NONE and (type(None) in types or (param is not None and param.default is None) or not types):
        return None
    types.discard(type(None))
    if text[:1] in ("(", "["):
        literal = _literal(text)
        if isinstance(literal, (list, tuple)):
            return literal
    if types & {list, tuple, collections.abc.Sequence} and ("," in value or not text or str not in types):
        return [part.strip() for part in value.split(",") if part.strip()]
    if str in types:
        return value
    if bool in types and text.lower() in _TRUE + _FALSE:
        return text.lower() in _TRUE
    if not types and text.lower() in ("true", "false"):
        return text.lower() == "true"
    number = _literal(text)
    if isinstance(number, (int, float)) and not isinstance(number, bool) and (
            not types or (int in types and isinstance(number, int)) or float in types):
        return number
    if not types:
        return number
    raise InvalidOptionError(
        f"--source-option {key}={value!r}: torchvision:{cls.__name__}'s {key!r} takes "
        f"{' or '.join(sorted(_TYPE_WORDS.get(t, t.__name__) for t in types))}, which {value!r} is not. "
        f"Give e.g. {key}={_EXAMPLES.get(sorted(types, key=str)[0], 'VALUE')}."
    )


_TYPE_WORDS = {bool: "true or false", int: "a whole number", float: "a number", dict: "a mapping"}
_EXAMPLES = {bool: "false", int: "1", float: "0.5"}


def _literal(value: str) -> Any:
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def _accepted_types(cls: type, param: inspect.Parameter) -> set[Any]:
    """The plain types a constructor parameter accepts: its annotation's members (``Union``,
    ``Optional`` and generics unpacked to their origins), else the type of its default."""
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # noqa: BLE001 - an annotation that does not evaluate: use the default's type
        hints = {}
    annotation = hints.get(param.name, param.annotation)
    found: set[Any] = set()
    pending = [annotation]
    while pending:
        item = pending.pop()
        if item is inspect.Parameter.empty or item is type(None) or item is typing.Any:
            continue
        origin = typing.get_origin(item)
        if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
            pending += typing.get_args(item)
        elif origin is not None:
            found.add(origin)
        elif isinstance(item, type):
            found.add(item)
    if not found and param.default is not inspect.Parameter.empty and param.default is not None:
        found.add(type(param.default))
    if found and (annotation is type(None) or type(None) in typing.get_args(annotation)):
        found.add(type(None))  # Optional[...]: None is taken too
    return found


def torchvision_dataset(
    name: str,
    *,
    root: str | os.PathLike | None = None,
    split: str | None = None,
    download: bool = False,
    options: dict[str, Any] | None = None,
) -> Any:
    """Instantiate ``torchvision.datasets.<name>``, mapping ``split`` to its own argument."""
    dataset, _, _ = _create(name, root=root, split=split, download=download, options=options)
    return dataset


def torchvision_source(
    name: str,
    *,
    root: str | os.PathLike | None = None,
    split: str | None = None,
    download: bool = False,
    options: dict[str, Any] | None = None,
) -> Any:
    """``torchvision:NAME`` as a Source: records of named fields for the datasets whose target
    is not a class index (:mod:`fastdata.sources.torchvision_targets`), ``(image, label)``
    otherwise."""
    from fastdata.sources.datasets import make_dataset_source
    from fastdata.sources.torchvision_targets import RECORDS, TorchvisionRecordSource

    dataset, split_name, typed = _create(name, root=root, split=split, download=download, options=options)
    description: dict[str, Any] = {"type": "torchvision", "name": name, "split": split_name,
                                   "root": str(root) if root else None}
    if typed:  # as the dataset got them (year='2012', target_types=['category', 'segmentation'])
        description["options"] = {k: repr(v) for k, v in sorted(typed.items())}
    if type(dataset).__name__ in RECORDS:
        return TorchvisionRecordSource(dataset, name=name, description=description, options=typed)
    return make_dataset_source(dataset, description)


def _create(name: str, *, root: Any, split: str | None, download: bool,
            options: dict[str, Any] | None) -> tuple[Any, str | None, dict[str, Any]]:
    """The dataset, its split's name, and the options as given to it (typed)."""
    cls = dataset_class(name)
    params = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = sorted(set(options or {}) - set(params))
    if unknown and not takes_any:
        allowed = ", ".join(n for n in params if n not in ("self", "root", "train", "download")) or "none"
        raise InvalidOptionError(
            f"torchvision:{name} does not take option {unknown[0]!r} (--source-option). Its options: {allowed}."
        )
    options = {key: coerce_option(cls, key, value) for key, value in (options or {}).items()}
    kwargs: dict[str, Any] = {}
    if "root" in params:
        if root is None:
            raise InvalidOptionError(f"torchvision:{name} needs --root (the folder holding its files).")
        kwargs["root"] = str(root)
    chosen, split_name = split_keywords(name, cls, split, options)
    kwargs.update(chosen)
    if "download" in params:
        kwargs["download"] = download
    kwargs.update({key: value for key, value in options.items() if key not in chosen})
    _check_needed(name, cls, kwargs)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress; library code never prints
            dataset = cls(**kwargs)
    except RuntimeError as exc:
        if "not found" in str(exc).lower():
            raise SourceNotFoundError(
                f"torchvision:{name} not found under root {str(root)!r} ({exc}). "
                "Pass --download to fetch it, or point --root at the folder that holds it."
            ) from exc
        raise _rejected(name, options, exc) from exc
    except FastdataError:
        raise
    except FileNotFoundError as exc:
        raise SourceNotFoundError(
            f"torchvision:{name}: {exc.strerror}: {exc.filename!r}. Point --root (and any file option) at the "
            "dataset's files."
        ) from exc
    except Exception as exc:  # noqa: BLE001 - whatever the dataset's constructor raises for bad options
        raise _rejected(name, options, exc) from exc
    dataset_length(dataset, f"torchvision:{name}")
    return dataset, split_name, options


def _check_needed(name: str, cls: type, kwargs: dict[str, Any]) -> None:
    """A required constructor argument that was not given (``annFile``, ``ann_file``), and the
    packages some datasets import only when created, named before the dataset is."""
    for param in inspect.signature(cls).parameters.values():
        if param.default is inspect.Parameter.empty and param.kind is param.POSITIONAL_OR_KEYWORD \
                and param.name != "self" and param.name not in kwargs:
            if collections.abc.Callable in _accepted_types(cls, param):  # DatasetFolder's loader
                raise InvalidOptionError(
                    f"torchvision:{name} needs a function as its {param.name!r} argument, which the command line "
                    f"cannot give: convert it from Python, fastdata.convert({cls.__name__}(root, {param.name}, ...), "
                    "OUTPUT) (an image folder converts from the command line as it is: fastdata convert FOLDER OUTPUT).")
            raise InvalidOptionError(f"torchvision:{name} needs its {param.name!r} argument. "
                                     f"Give it with --source-option {param.name}=VALUE.")
    if cls.__name__ in ("CocoDetection", "CocoCaptions"):
        require("pycocotools", extra="coco", feature=f"torchvision:{name}")
    if cls.__name__ == "SBDataset":
        require("scipy", extra="sbd", feature=f"torchvision:{name} (its .mat files)")


def _rejected(name: str, options: dict[str, Any] | None, exc: Exception) -> InvalidOptionError:
    given = ", ".join(f"{k}={v!r}" for k, v in sorted((options or {}).items())) or "no options"
    return InvalidOptionError(
        f"torchvision:{name} cannot be created with {given} ({type(exc).__name__}: {exc}). "
        "Check the --source-option values against the dataset's documentation."
    )
