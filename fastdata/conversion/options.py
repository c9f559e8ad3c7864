"""Conversion options: :class:`ConvertOptions`, one frozen dataclass that parses and checks itself.

Every place that needs the options of a conversion derives them from this class: the keywords
of :func:`fastdata.convert` (``convert(src, out, resize="64x64")`` builds one), the
``fastdata convert`` flags (from each field's ``metadata``), the journal's conversion key and
the manifest's ``options`` entry (from the fields marked ``key``), and every other caller
(``fastdata bench`` converts through :func:`fastdata.convert` with one). Values may be given as
text, as the command line does (``resize="64x48"``, ``workers="4"``), or as Python values
(``resize=(64, 48)``, ``workers=4``); either way they are parsed and validated here, once.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from fastdata.errors import InvalidOptionError, fix_option
from fastdata.images import DEFAULT_MAX_PIXELS, MODES, Geometry, ReadOptions, parse_size
from fastdata.quantities import parse_count

STORES = ("raw", "encoded")
ENGINES = ("local", "ray")


# --- parsers shared by every option that takes text ----------------------------------------


def parse_reencode(value: Any) -> tuple[str, int | None] | None:
    """``"jpeg:90"`` -> ("jpeg", 90); ``"png"`` -> ("png", None)."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        value = ":".join(str(part) for part in value if part is not None)
    match = re.fullmatch(r"(jpeg|jpg|png)(?::(\d+))?", str(value).strip().lower())
    if not match or (match.group(1) == "png" and match.group(2)):
        raise InvalidOptionError(f"Invalid --reencode {value!r}. Use 'jpeg:Q' (Q in 1..100) or 'png'.")
    codec = "png" if match.group(1) == "png" else "jpeg"
    quality = int(match.group(2)) if match.group(2) else (90 if codec == "jpeg" else None)
    if quality is not None and not 1 <= quality <= 100:
        raise InvalidOptionError(f"Invalid --reencode {value!r}: JPEG quality {quality} is not in 1..100. "
                                 "Use e.g. 'jpeg:90'.")
    return codec, quality


def parse_part(value: Any) -> tuple[int, int] | None:
    """``"2/4"`` -> (2, 4): part I of N, 1-based (the first part of four is ``1/4``)."""
    if value is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", value) if isinstance(value, str) else None
    numbers = tuple(int(g) for g in match.groups()) if match else value
    if not (isinstance(numbers, (tuple, list)) and len(numbers) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) for n in numbers) and 1 <= numbers[0] <= numbers[1]):
        raise InvalidOptionError(
            f"Invalid --part {value!r}. Use I/N with 1 <= I <= N, e.g. {fix_option('part', '1/4')} ... --part 4/4 "
            "(a 0-based array index is I-1: --part $((SLURM_ARRAY_TASK_ID + 1))/N)."
        )
    return int(numbers[0]), int(numbers[1])


def parse_columns(value: Any) -> tuple[str, ...] | None:
    """``"image,label"`` (or a list of names) as a tuple of column names."""
    if value is None:
        return None
    names = [n.strip() for n in value.split(",")] if isinstance(value, str) else list(value)
    if not names or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise InvalidOptionError(f"Invalid --columns {value!r}. Give column names, comma-separated, each once: "
                                 f"{fix_option('columns', 'image,label')}.")
    return tuple(names)


def parse_source_option(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``--source-option``. VALUE stays text: the source turns it into the type
    the dataset's constructor expects (:func:`fastdata.sources.torchvision.coerce_option`), so
    ``year=2012`` stays the string VOC wants and ``size=1000`` becomes the int FakeData wants."""
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise InvalidOptionError(f"Invalid --source-option {text!r}. Use KEY=VALUE, e.g. size=1000.")
    return key, value


def _choice(value: Any, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise InvalidOptionError(f"Unknown {what} {value!r}. Allowed: {', '.join(map(repr, allowed))}.")
    return value


# --- the options of one conversion ----------------------------------------------------------


def _option(default: Any, help: str, *, key: bool = False, metavar: str | None = None, group: str = "conversion",
            kind: str = "value", factory: Any = None) -> Any:
    """A :class:`ConvertOptions` field; ``metadata`` drives the CLI flag, the key and the manifest."""
    metadata = {"help": help, "key": key, "metavar": metavar, "group": group, "kind": kind}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class ConvertOptions:
    """Every option of one conversion, parsed and validated when the object is made.

    >>> ConvertOptions(format="hdf5", resize="64x64", compression="lzf")   # doctest: +SKIP
    Unknown fields are the format's own options (``compression``, ``shard_bytes``, ...), checked
    by that format. :meth:`replace` returns a copy with some values changed (validated again).
    ``format=None`` (the default) means "from the output's name". The format is decided, and the
    store and the format's own options checked against it, in one place:
    :func:`fastdata.conversion.plan.decide_options` (``fastdata.convert`` and the CLI go through it).
    """

    format: str | None = _option(None, "output format: {formats} (default: from OUTPUT's name: .npy npy, "
                                 ".h5/.hdf5 hdf5, .tar or no extension tar)", key=True, metavar="{formats}")
    store: str = _option("raw", "raw: decoded pixels (fastest to read, one image size); encoded: the image "
                         "files' bytes (small, decoded when read)", key=True, metavar="raw|encoded")
    mode: str = _option("auto", "auto (L when every image is grayscale, else RGB), RGB or L", key=True,
                        metavar="auto|RGB|L")
    resize: tuple[int, ...] | None = _option(None, "HxW (exact size) or S (shorter side to S, aspect kept), like "
                                             "torchvision Resize", key=True, metavar="HxW|S")
    center_crop: tuple[int, int] | None = _option(None, "HxW, applied after --resize, like torchvision CenterCrop",
                                                  key=True, metavar="HxW")
    max_side: int | None = _option(None, "scale images whose longest side is longer than N down to N (aspect kept; "
                                   "smaller ones are not resized), after --resize/--center-crop; with --store encoded "
                                   "add --reencode jpeg:Q", key=True, metavar="N")
    reencode: tuple[str, int | None] | None = _option(None, "encoded store: re-encode as jpeg:Q or png instead of "
                                                      "keeping the original bytes", key=True, metavar="jpeg:Q|png")
    skip_bad: bool = _option(False, "leave unreadable images out (each is listed in the manifest)", key=True,
                             kind="flag")
    max_pixels: int | None = _option(DEFAULT_MAX_PIXELS, "refuse images with more pixels than this before decoding "
                                     "them (a decompression-bomb guard)", key=True, metavar="N")
    exif_transpose: bool = _option(False, "apply EXIF orientation (off by default, like torchvision)", key=True,
                                   kind="flag")
    workers: int | None = _option(None, "decoding processes (default: the usable cores; 0 = in this process)",
                                  metavar="N", group="run")
    overwrite: bool = _option(False, "replace OUTPUT if it is a fastdata dataset (nothing else is ever replaced)",
                              kind="flag", group="run")
    resume: bool = _option(False, "continue an interrupted conversion of the same, unchanged source from its "
                           "last checkpoint (a finished one is kept)", kind="flag", group="run")
    engine: str = _option("local", "where the work runs: local (a process pool here) or ray (tasks on a Ray "
                          "cluster; pip install 'torch-fastdata[ray]')", metavar="local|ray", group="run")
    ray_address: str | None = _option(None, "--engine ray: the cluster to join (ray.init's address, e.g. 'auto' or "
                                      "'ray://head:10001'; default: start a local one)", metavar="ADDRESS", group="run")
    part: tuple[int, int] | None = _option(None, "write part I of N (1-based) of a job array into OUTPUT.partial.units; "
                                           "'fastdata merge OUTPUT' finishes the output once all N are done",
                                           metavar="I/N", group="run")
    unit_samples: int = _option(1000, "samples per unit of work: what a resumed conversion keeps (every part of "
                                "--part must use the same)", metavar="N", group="run")
    root: str | None = _option(None, "torchvision sources: the folder holding the dataset's files",
                               metavar="DIR", group="source")
    split: str | None = _option(None, "the split to convert: a torchvision dataset's own split name (train/test, "
                                "VOC's train/val/trainval, OxfordIIITPet's trainval/test, CelebA's train/valid/test/all, "
                                "...; when not given, the one the dataset uses by itself), or a Parquet / Hugging Face "
                                "dataset's (train-*.parquet, a DatasetDict's split)", metavar="NAME", group="source")
    download: bool = _option(False, "torchvision sources: download the dataset if it is missing", kind="flag",
                             group="source")
    source_options: dict[str, Any] = _option(None, "extra keyword for the torchvision dataset, e.g. size=1000 "
                                             "(repeatable)", metavar="KEY=VALUE", group="source", kind="append",
                                             factory=dict)
    config: str | None = _option(None, "Parquet / Hugging Face sources: the configuration (subset) to convert, where "
                                 "a dataset holds several (en/train-*.parquet, fr/train-*.parquet)", metavar="NAME",
                                 group="source")
    columns: tuple[str, ...] | None = _option(None, "Parquet / Hugging Face sources: the columns to convert, in "
                                              "order (default: all)", metavar="A,B,...", group="source")
    label_column: str | None = _option(None, "Parquet / Hugging Face sources: the column holding the label (default: "
                                       "the ClassLabel column, else an int column named label)", metavar="NAME",
                                       group="source")
    format_options: Any = _option(None, "the format's own options (a dataclass of the format; see its flags)",
                                  key=True, kind="format")

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.format is None and self.store not in STORES:  # a format's own stores: plan.with_format
            raise InvalidOptionError(f"Unknown store {self.store!r}. Allowed: {', '.join(repr(s) for s in STORES)}.")
        _choice(self.mode, MODES, "mode")
        set_(self, "resize", parse_size(self.resize, flag="--resize", allow_single=True))
        set_(self, "center_crop", parse_size(self.center_crop, flag="--center-crop", allow_single=False))
        set_(self, "max_side", parse_count(self.max_side, flag="--max-side", allow_none=True))
        set_(self, "reencode", parse_reencode(self.reencode))
        set_(self, "max_pixels", parse_count(self.max_pixels, flag="--max-pixels", allow_none=True))
        set_(self, "workers", parse_count(self.workers, flag="--workers", minimum=0, allow_none=True))
        if self.split is not None and not isinstance(self.split, str):
            raise InvalidOptionError(f"Invalid split {self.split!r}. Use the dataset's split name, e.g. 'train'.")
        if self.config is not None and (not isinstance(self.config, str) or not self.config):
            raise InvalidOptionError(f"Invalid --config {self.config!r}. Give a configuration name, e.g. 'en'.")
        self._check_engine()
        set_(self, "columns", parse_columns(self.columns))
        if self.label_column is not None and (not isinstance(self.label_column, str) or not self.label_column):
            raise InvalidOptionError(f"Invalid --label-column {self.label_column!r}. Give a column name.")
        set_(self, "source_options", dict(self.source_options or {}))
        if isinstance(self.format_options, dict):  # the format's own options, checked by the format once decided
            set_(self, "format_options", dict(self.format_options))

    def _check_engine(self) -> None:
        _choice(self.engine, ENGINES, "engine")
        object.__setattr__(self, "part", parse_part(self.part))
        object.__setattr__(self, "unit_samples", parse_count(self.unit_samples, flag="--unit-samples"))
        if self.ray_address is not None and self.engine != "ray":
            raise InvalidOptionError(f"--ray-address {self.ray_address!r} applies to --engine ray only. "
                                     f"Add {fix_option('engine', 'ray')}.")
        if self.part is not None and self.engine != "local":
            raise InvalidOptionError(
                "--part and --engine ray are two ways to spread one conversion over machines; use one of them."
            )
        if self.engine == "ray" and self.resume:
            raise InvalidOptionError(
                "--resume does not apply to --engine ray: a Ray conversion run again keeps the units it already "
                f"finished (same source and options) and converts only the rest. Drop {fix_option('resume')}."
            )
        if self.part is not None and self.resume:
            raise InvalidOptionError(
                "--resume does not apply to --part: a part run again keeps the units it already finished (same "
                f"source and options) and converts only the rest. Drop {fix_option('resume')}."
            )

    # --- building ---------------------------------------------------------------------------

    @classmethod
    def build(cls, options: "ConvertOptions | None" = None, **overrides: Any) -> "ConvertOptions":
        """``options`` (or the defaults) with ``overrides``: field names, or the format's own
        option names, which go into ``format_options``."""
        return (options or cls()).replace(**overrides) if overrides or options is None else options

    def replace(self, **overrides: Any) -> "ConvertOptions":
        names = {f.name for f in dataclasses.fields(self)}
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        current = values.pop("format_options")
        if isinstance(current, dict):  # not checked yet: no format chosen
            format_options = dict(current)
        elif overrides.get("format", self.format) != self.format or current is None:
            format_options = {}
        else:
            format_options = dataclasses.asdict(current)
        format_options.update(overrides.pop("format_options", None) or {})
        format_options.update({k: overrides.pop(k) for k in list(overrides) if k not in names})
        values.update(overrides)
        return ConvertOptions(**values, format_options=format_options)

    # --- what other parts derive from the fields --------------------------------------------

    @property
    def geometry(self) -> Geometry:
        return Geometry(resize=self.resize, center_crop=self.center_crop, max_side=self.max_side)

    @property
    def read(self) -> ReadOptions:
        return ReadOptions(max_pixels=self.max_pixels, exif_transpose=self.exif_transpose)

    @property
    def source_arguments(self) -> dict[str, Any]:
        """Keywords for :func:`fastdata.sources.resolve_source`."""
        return {"root": self.root, "split": self.split, "download": self.download,
                "source_options": self.source_options or None}

    def key_fields(self) -> dict[str, Any]:
        """The options that determine the output's bytes (journal key and manifest)."""
        fields = {}
        for item in dataclasses.fields(self):
            if item.metadata.get("key"):
                value = getattr(self, item.name)
                if item.name == "format_options":
                    value = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else dict(value or {})
                fields[item.name] = list(value) if isinstance(value, tuple) else value
        return fields

    def describe(self) -> dict[str, Any]:
        """The manifest's ``options`` entry."""
        fields = self.key_fields()
        return {"mode": fields["mode"], **self.geometry.describe(), "reencode": fields["reencode"],
                "format_options": fields["format_options"]}


def cli_fields() -> list[dataclasses.Field]:
    """The fields that are ``fastdata convert`` flags, in order."""
    return [f for f in dataclasses.fields(ConvertOptions) if f.metadata.get("kind") != "format"]
