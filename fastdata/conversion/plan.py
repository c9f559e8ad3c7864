"""Plan, the first of a conversion's three steps (plan, run, write; see docs/converting.md).

Whatever the engine, a conversion starts here: the output's name and the options decide the
format (:func:`decide_options`, the only place that does), what the user gave becomes a
:class:`~fastdata.sources.Source` (:func:`open_source`), the first readable samples decide mode,
shape and encoding (:func:`plan_job`), and :func:`conversion_key` names what determines the
output's bytes. The units of work, ranges of source indices, come from the sample count alone
(:func:`fastdata.conversion.units.plan_units`; and a Parquet source's row groups,
:meth:`~fastdata.sources.Source.unit_bounds`), so every engine plans the same ones.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from fastdata.conversion import journal
from fastdata.conversion.options import STORES, ConvertOptions
from fastdata.errors import BadSampleError, InvalidOptionError, fix_option
from fastdata.conversion.pipeline import Job
from fastdata.formats import FormatSpec, find_manifest, format_for_output, get_format
from fastdata.formats.base import Plan, check_stored_names
from fastdata.fields import Field, FieldError, Schema
from fastdata.fields.values import check_record, infer
from fastdata.images import CHANNELS, is_grayscale, to_pil
from PIL import Image
from fastdata.importing import is_import_string, load_dataset
from fastdata.sources.parquet import is_table_source, table_source
from fastdata.urls import is_url
from fastdata.sources import (
    ArraySource, make_dataset_source, FastdataSource, Source, WebDatasetSource, is_shard_source, resolve_source,
)


def decide_options(output: str | os.PathLike, options: ConvertOptions | None = None, **overrides: Any) -> ConvertOptions:
    """``options`` with ``overrides`` and the format decided for ``output``: its extension,
    checked against an explicit ``format`` (:func:`fastdata.formats.format_for_output`), then the
    store and the format's own options checked against it (:func:`with_format`)."""
    overrides["format"] = format_for_output(output, overrides.get("format", options.format if options else None))
    return with_format(ConvertOptions.build(options, **overrides))


def with_format(options: ConvertOptions) -> ConvertOptions:
    """``options`` (their format given) checked against the format: a store it writes, and its own
    options made into its options dataclass (refusing options it does not know)."""
    spec = get_format(options.format, writable=True)
    if options.store not in STORES or options.store not in spec.stores:
        allowed = ", ".join(repr(s) for s in spec.stores)
        raise InvalidOptionError(f"Unknown store {options.store!r} for format {options.format!r}. Allowed: {allowed}.")
    given = options.format_options
    if given is None or isinstance(given, dict):
        made = spec.make_options(dict(given or {}))
    elif spec.options is None or not isinstance(given, spec.options):
        raise InvalidOptionError(f"format_options {given!r} are not options of format {options.format!r}.")
    else:
        made = given
    return dataclasses.replace(options, format_options=made)


def open_source(source: Any, options: ConvertOptions | None = None) -> Source:
    """What the user gave as a :class:`~fastdata.sources.Source`: a path holding a converted
    dataset is read through its format's map-style reader (as PIL images, with its classes);
    WebDataset shards that fastdata did not write (a folder of ``.tar`` files, a ``.tar``, a brace
    pattern) through :class:`~fastdata.sources.WebDatasetSource`; the rest as
    :func:`~fastdata.sources.resolve_source` says."""
    options = options or ConvertOptions()
    if is_table_source(source) and not _holds_manifest(source):  # Parquet, save_to_disk, a datasets object
        return table_source(source, columns=options.columns, label_column=options.label_column, split=options.split,
                            config=options.config)
    if options.columns is not None or options.label_column is not None:
        given = [fix_option(name, value) for name, value in (("columns", ",".join(options.columns or ())),
                                                             ("label_column", options.label_column)) if value]
        raise InvalidOptionError("--columns and --label-column apply to Parquet files, saved Hugging Face datasets "
                                 f"and datasets objects; this source has no columns. Drop {' and '.join(given)}.")
    if options.config is not None:
        raise InvalidOptionError(f"{fix_option('config', options.config)} applies to Parquet files (a Hugging Face dataset's "
                                 "configurations); this source has none. Drop it.")
    if is_import_string(source):  # module:name, a Python dataset (or a function returning one)
        dataset = load_dataset(source)
        return make_dataset_source(dataset, {"type": "dataset", "import": source,
                                             "class": f"{type(dataset).__module__}.{type(dataset).__qualname__}"})
    if isinstance(source, (str, os.PathLike)) and not str(source).startswith("torchvision:"):
        path = Path(source)
        manifest = find_manifest(path) if path.exists() else None
        if manifest is not None:
            reader = get_format(manifest["format"]).map_dataset
            return FastdataSource(path, manifest, reader(path, image_format="pil"))
        if is_shard_source(source):
            return WebDatasetSource(source)
    return resolve_source(source, **options.source_arguments)


def _holds_manifest(source: Any) -> bool:
    """Whether a local path holds a dataset fastdata wrote (which is read as one, whatever else it holds)."""
    if not isinstance(source, (str, os.PathLike)) or is_url(source):
        return False
    path = Path(source)
    try:
        return path.exists() and find_manifest(path) is not None
    except Exception:  # noqa: BLE001 - a damaged manifest is reported where the dataset is opened
        return True


def conversion_key(spec: FormatSpec, src: Source, options: ConvertOptions) -> tuple[dict[str, Any], str]:
    """What determines the output's bytes (the journal's, the parts' and the manifest's key
    fields), and their digest, the manifest's ``conversion_key``."""
    source = {key: value for key, value in src.describe().items() if key != "length"}  # the fingerprint's part
    fields = {"layout_version": spec.layout_version, "source": source, **options.key_fields()}
    return fields, journal.conversion_key(fields)


_PROBE_SAMPLES = 64


def _probe(src: Source, options: ConvertOptions) -> list[tuple[int, tuple[str, int, int]]]:
    """Headers (mode, width, height) of the first readable samples (up to 64)."""
    if isinstance(src, ArraySource):
        return [(0, src.header(0))]
    found, first_error = [], None
    for index in range(len(src)):
        try:
            found.append((index, src.header(index, options.read)))
        except FieldError:  # a sample unlike the others: its message says how, and --skip-bad does not fix that
            if not options.skip_bad:
                raise
        except Exception as exc:
            first_error = first_error or (index, exc)
            if not options.skip_bad:
                break
        if len(found) >= _PROBE_SAMPLES:
            break
    _fail_unless_found(src, options, found, first_error)
    return found


def _fail_unless_found(src: Source, options: ConvertOptions, found: list,
                       first_error: tuple[int, Exception] | None) -> None:
    """A probe's end: the first unreadable sample's error, as the conversion would raise it, when
    no sample was readable or (without --skip-bad) one was not."""
    if not found or (first_error and not options.skip_bad):
        index, exc = first_error
        error = Job(src, None, options).fail(index, exc, "read")
        if options.skip_bad:  # every sample was tried and skipped: the advice to skip them is no fix
            first = str(error).rsplit(" Re-run with --skip-bad", 1)[0].rstrip(".")
            raise BadSampleError(f"No sample of the {len(src)} could be read, so nothing was converted (the first: "
                                 f"{first}). Check the source: are these files images, is it the right folder?") from exc
        raise error from exc


_SCHEMA_SAMPLES = 8


def _probe_records(src: Source, options: ConvertOptions) -> tuple[list[tuple[int, tuple[str, int, int]]], Schema]:
    """Headers of the first readable samples' images and the schema their records make
    (:func:`fastdata.fields.values.infer`), for a source whose samples have fields."""
    records, found, first_error, known = [], [], None, src.schema
    # raw without --resize needs one image size, so arrays of the image's size are of one size too
    images_may_vary = options.store != "raw" or not options.geometry.is_identity
    for index in range(len(src)):
        try:
            values = src.load_record(index, options.read)
            if len(records) < _SCHEMA_SAMPLES:
                records.append((src.sample_name(index), values))
                if known is None:  # a sample that cannot join fails here
                    infer(records, src.kinds, src.layout, src.structure, images_may_vary)
                else:
                    check_record(known, values, src.sample_name(index))
            image = values.get(known.image.name) if known is not None else next(
                (v for k, v in values.items() if src.kinds.get(k) == "image" or (
                    src.kinds.get(k) is None and (isinstance(v, Image.Image) or type(v).__name__ == "Image"))), None)
            if image is None:
                raise FieldError(f"{src.sample_name(index)}: has no image field (a PIL image or tv_tensors.Image); "
                                 "fastdata stores samples with at least one image.")
            image = to_pil(image)
            found.append((index, (image.mode, image.width, image.height)))
        except FieldError:
            if not options.skip_bad:
                raise
            records = records[:-1] if records and records[-1][0] == src.sample_name(index) else records
        except InvalidOptionError:  # the samples' names or hints, not one sample: --skip-bad cannot help
            raise
        except Exception as exc:
            first_error = first_error or (index, exc)
            if not options.skip_bad:
                break
        if len(found) >= _SCHEMA_SAMPLES:
            break
    _fail_unless_found(src, options, found, first_error)
    schema = known if known is not None else infer(records, src.kinds, src.layout, src.structure, images_may_vary)
    return found, schema.with_meta(src.field_meta)


def complete_schema(schema: Schema, plan: Plan, probe_values: dict[str, Any] | None = None,
                    field_files: frozenset[str] = frozenset()) -> Schema:
    """The schema with how each image and mask is stored: the image field as the plan says,
    masks lossless (raw uint8 (H, W) or PNG), extra images like the image; where the plan keeps
    the image's original bytes, the fields in ``field_files`` (the source's own image and mask
    files) keep theirs too (encoding ``original``)."""
    fields = []
    for f in schema.fields:
        if f is schema.image or f.name == schema.image.name:
            f = Field(f.name, "image", "uint8", plan.shape, plan.encoding, plan.mode, f.meta)
        else:
            keeps_file = plan.encoding == "original" and f.name in field_files and f.kind_spec.spatial
            f = f.kind_spec.planned(f, plan, (probe_values or {}).get(f.name), keeps_file)
        fields.append(f)
    return Schema(tuple(fields), schema.layout, schema.structure)


def plan_job(src: Source, options: ConvertOptions, mode: str | None = None) -> "Job":
    """Decide mode, shape and encoding from the first readable samples.

    ``--mode auto`` gives RGB as soon as one probed image is in colour; when all probed
    images are grayscale it plans L, and the workers report a later colour image
    (:class:`ModeConflict`), after which the conversion restarts as RGB.
    """
    schema = None
    if not src.is_classic:
        probe, schema = _probe_records(src, options)
        if schema.is_classic:
            schema = None
        elif options.format and not get_format(options.format).fields:
            raise InvalidOptionError(
                f"Format {options.format!r} stores (image, label) samples only; this source's samples have fields "
                f"{', '.join(schema.names)}. Use {fix_option('format', 'npy')}, hdf5 or tar (docs/fields.md)."
            )
    else:
        probe = _probe(src, options)
    reference, (_, width, height) = probe[0]
    gray_guess = False
    if mode is None and options.mode == "auto":
        gray_guess = all(is_grayscale(header[0]) for _, header in probe)
        mode = "L" if gray_guess else "RGB"
    mode = mode or options.mode
    channels = CHANNELS[mode]
    shape = None
    if options.store == "raw":
        out_width, out_height = options.geometry.output_size(width, height)
        shape = (out_height, out_width, channels)
    encoding = "raw"
    if options.store == "encoded":
        keeps_files = (src.has_files and options.geometry.is_identity and not options.reencode
                       and not options.exif_transpose)
        encoding = "original" if keeps_files else (options.reencode or ("png", None))[0]
    plan = Plan(
        count=len(src),
        store=options.store,
        mode=mode,
        channels=channels,
        shape=shape,
        encoding=encoding,
        class_to_idx=src.class_to_idx,
        classes=src.classes,
        geometry=options.geometry,
        jpeg_quality=options.reencode[1] if options.reencode else None,
    )
    if schema is not None:
        values = {k: to_pil(v) if k != schema.image.name and schema[k].kind == "image" else v
                  for k, v in src.load_record(reference, options.read).items()}
        plan = dataclasses.replace(plan, schema=complete_schema(schema, plan, values, src.field_files))
        if options.format:
            check_stored_names(get_format(options.format), plan)  # before anything is written
    return Job(src, plan, options, reference=reference, gray_guess=gray_guess)


def plan_record(job: Job) -> dict[str, Any]:
    """A job's plan as JSON (a part's record), for :func:`plan_from_record`."""
    plan = job.plan
    return {"count": plan.count, "store": plan.store, "mode": plan.mode, "shape": list(plan.shape) if plan.shape else None,
            "encoding": plan.encoding, "class_to_idx": plan.class_to_idx, "classes": plan.classes,
            "jpeg_quality": plan.jpeg_quality,
            "schema": plan.schema.to_json() if plan.schema is not None else None}


def plan_from_record(record: dict[str, Any], options: ConvertOptions) -> Plan:
    return Plan(count=record["count"], store=record["store"], mode=record["mode"], channels=CHANNELS[record["mode"]],
                shape=tuple(record["shape"]) if record["shape"] else None, encoding=record["encoding"],
                class_to_idx=record["class_to_idx"], classes=record.get("classes"), geometry=options.geometry,
                jpeg_quality=record["jpeg_quality"],
                schema=Schema.from_json(record["schema"]) if record.get("schema") else None)
