"""The conversion engine: source -> parallel decode/resize/encode -> format writer -> dataset.

Output is written under ``<output>.partial`` and renamed to ``<output>`` only when complete,
so a failed or interrupted conversion never leaves something that looks like a dataset.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fastdata import __version__, journal
from fastdata.errors import (
    BadSampleError, FastdataError, InvalidOptionError, OutputExistsError, SourceChangedError,
)
from fastdata.fingerprint import describe_changes
from fastdata.formats import FormatSpec, get_format
from fastdata.images import DEFAULT_MAX_PIXELS, MODES, Geometry
from fastdata.machine import usable_cores
from fastdata.outputs import (
    PARTIAL_SUFFIX, ConversionLock, check_existing, check_not_source, check_output_path, partial_path, publish,
    remove_path, write_error,
)
from fastdata.pipeline import Job, ModeConflict, WorkerPool, batches, plan_job
from fastdata.plan import STORES, ConvertOptions
from fastdata.sources import Source, resolve_source

__all__ = ["PARTIAL_SUFFIX", "convert", "make_options", "parse_reencode", "parse_size", "remove_path", "run_conversion"]
logger = logging.getLogger("fastdata")


def parse_size(value: Any, *, flag: str, allow_single: bool) -> tuple[int, ...] | None:
    """``"64x48"`` -> (64, 48); ``"64"`` -> (64,) when ``allow_single``; ints and tuples pass."""
    if value is None:
        return None
    if isinstance(value, int):
        value = (value,)
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?", value)
        value = tuple(int(g) for g in match.groups() if g is not None) if match else ()
    value = tuple(value)
    allowed = (1, 2) if allow_single else (2,)
    if len(value) not in allowed or not all(isinstance(v, int) and v > 0 for v in value):
        forms = "'HxW' (e.g. '64x64') or 'S' (shorter side)" if allow_single else "'HxW' (e.g. '56x56')"
        raise InvalidOptionError(f"Invalid {flag} {value!r}. Use {forms}, with positive integers.")
    return value


def parse_reencode(value: Any) -> tuple[str, int | None] | None:
    """``"jpeg:90"`` -> ("jpeg", 90); ``"png"`` -> ("png", None)."""
    if value is None or isinstance(value, tuple):
        return value
    match = re.fullmatch(r"(jpeg|jpg|png)(?::(\d+))?", str(value).strip().lower())
    if not match or (match.group(1) == "png" and match.group(2)):
        raise InvalidOptionError(f"Invalid --reencode {value!r}. Use 'jpeg:Q' (Q in 1..100) or 'png'.")
    codec = "png" if match.group(1) == "png" else "jpeg"
    quality = int(match.group(2)) if match.group(2) else (90 if codec == "jpeg" else None)
    if quality is not None and not 1 <= quality <= 100:
        raise InvalidOptionError(f"Invalid JPEG quality {quality} in --reencode {value!r}. Use 1..100.")
    return codec, quality


def make_options(
    *,
    format: str = "npy",  # noqa: A002 - the public keyword the issue names
    store: str = "raw",
    mode: str = "auto",
    resize: Any = None,
    center_crop: Any = None,
    reencode: Any = None,
    workers: int | None = None,
    overwrite: bool = False,
    skip_bad: bool = False,
    resume: bool = False,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    exif_transpose: bool = False,
) -> ConvertOptions:
    spec = get_format(format, writable=True)
    if store not in STORES or store not in spec.stores:
        allowed = ", ".join(repr(s) for s in spec.stores)
        raise InvalidOptionError(f"Unknown store {store!r} for format {format!r}. Allowed: {allowed}.")
    if mode not in MODES:
        raise InvalidOptionError(f"Unknown mode {mode!r}. Allowed: {', '.join(map(repr, MODES))}.")
    if max_pixels is not None and (not isinstance(max_pixels, int) or max_pixels <= 0):
        raise InvalidOptionError(f"Invalid --max-pixels {max_pixels!r}. Use a positive pixel count.")
    if workers is not None and workers < 0:
        raise InvalidOptionError(f"Invalid workers {workers!r}. Use 0 (in-process) or a positive count.")
    geometry = Geometry(
        resize=parse_size(resize, flag="--resize", allow_single=True),
        center_crop=parse_size(center_crop, flag="--center-crop", allow_single=False),
    )
    return ConvertOptions(
        format=format,
        store=store,
        mode=mode,
        geometry=geometry,
        reencode=parse_reencode(reencode),
        workers=usable_cores() if workers is None else workers,
        overwrite=overwrite,
        skip_bad=skip_bad,
        resume=resume,
        max_pixels=max_pixels,
        exif_transpose=exif_transpose,
    )


def convert(
    source: Any,
    output: str | os.PathLike,
    *,
    format: str = "npy",  # noqa: A002
    store: str = "raw",
    mode: str = "auto",
    resize: Any = None,
    center_crop: Any = None,
    reencode: Any = None,
    workers: int | None = None,
    overwrite: bool = False,
    skip_bad: bool = False,
    resume: bool = False,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    exif_transpose: bool = False,
    root: str | os.PathLike | None = None,
    split: str = "train",
    download: bool = False,
    source_options: dict[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    **format_options: Any,
) -> dict[str, Any]:
    """Convert ``source`` into ``output`` in the given format; return the written manifest.

    ``source`` is an image folder, ``"torchvision:NAME"`` (with ``root``/``split``/``download``)
    or a map-style dataset of ``(image, label)``. ``resize`` is ``"HxW"`` or ``S`` (shorter side),
    ``center_crop`` ``"HxW"``; ``mode`` is ``auto``, ``RGB`` or ``L``; ``reencode`` ``"jpeg:Q"``
    or ``"png"`` (encoded store). ``workers`` processes decode in parallel (default: all cores;
    0 = in this process). ``resume`` continues an interrupted conversion from its last checkpoint
    (or returns a finished output's manifest untouched when source and options match).
    ``max_pixels`` refuses larger images before decoding them (default: Pillow's limit; None: no
    limit); ``exif_transpose`` applies EXIF orientation (off by default, like torchvision).
    ``progress(n, total)`` is called as each n more samples complete. Remaining keyword
    arguments are the format's own options (e.g. ``compression`` for hdf5).
    """
    options = make_options(
        format=format, store=store, mode=mode, resize=resize, center_crop=center_crop,
        reencode=reencode, workers=workers, overwrite=overwrite, skip_bad=skip_bad, resume=resume,
        max_pixels=max_pixels, exif_transpose=exif_transpose,
    )
    spec = get_format(format, writable=True)
    writer_options = spec.make_options(format_options)
    output = Path(output)
    check_output_path(output)
    src = resolve_source(source, root=root, split=split, download=download, source_options=source_options)
    return run_conversion(src, output, spec, options, writer_options, progress)


@dataclass
class _Target:
    """Where and how one conversion writes: the format, its options, the journal key, progress."""

    output: Path
    spec: FormatSpec
    writer_options: Any
    key: str
    progress: Callable[[int, int], None] | None

    @property
    def partial(self) -> Path:
        return partial_path(self.output)

    def report(self, count: int, total: int) -> None:
        if self.progress is not None and count:
            self.progress(count, total)


def run_conversion(
    src: Source,
    output: Path,
    spec: FormatSpec,
    options: ConvertOptions,
    writer_options: Any,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Convert ``src`` into ``output`` under the output rules of :mod:`fastdata.outputs`."""
    check_output_path(output)
    check_not_source(output, src.protected())
    if not (options.overwrite or options.resume):  # refuse at once, before fingerprinting the source
        check_existing(output, overwrite=False, resume=False)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(output, exc) from exc
    fields = _key_fields(spec, src, options, writer_options)
    target = _Target(output, spec, writer_options, journal.conversion_key(fields), progress)
    options = dataclasses.replace(options, workers=_cap_workers(options.workers, len(src)))
    fingerprint = src.fingerprint()
    with ConversionLock(output):
        existing = check_existing(output, overwrite=options.overwrite, resume=options.resume)
        if options.resume and existing is not None:
            kept = _keep_complete(output, existing, target.key, fingerprint, overwrite=options.overwrite)
            if kept is not None:
                return kept
        state = _claim_partial(target, fields, fingerprint, options)
        try:
            if state is None:
                journal.start(output, key=target.key, fields=fields, fingerprint=fingerprint)
            job = plan_job(src, options, mode=state["mode"] if state else None)
            try:
                manifest = _write(job, target, state, fingerprint)
            except ModeConflict:
                # auto mode planned grayscale from the first images, then met a colour one: redo as RGB
                journal.start(output, key=target.key, fields=fields, fingerprint=fingerprint)
                manifest = _write(plan_job(src, options, mode="RGB"), target, None, fingerprint)
            publish(target.partial, output, replace=existing is not None)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                remove_path(target.partial)  # ours: the lock is held and the journal names it
            journal.remove(output)
            if isinstance(exc, OSError) and not isinstance(exc, FastdataError):
                raise write_error(output, exc) from exc
            raise
        journal.remove(output)
    return manifest


def _cap_workers(requested: int, count: int) -> int:
    """Conversion processes: at most the cores this process may use and the sample count."""
    cores = usable_cores()
    capped = max(0, min(requested, cores, count))
    if capped < requested and requested > 1:
        limit = "the usable cores" if capped == cores else "the sample count"
        logger.warning("--workers %d capped at %d (%s)", requested, capped, limit)
    return capped


def _key_fields(spec: FormatSpec, src: Source, options: ConvertOptions, writer_options: Any) -> dict[str, Any]:
    """What determines the output's bytes: the journal's and the manifest's conversion key."""
    source = {key: value for key, value in src.describe().items() if key != "length"}  # the fingerprint's part
    return {
        "format": spec.name, "layout_version": spec.layout_version, "source": source,
        "store": options.store, "mode": options.mode, "geometry": options.geometry.describe(),
        "reencode": options.reencode, "skip_bad": options.skip_bad, "max_pixels": options.max_pixels,
        "exif_transpose": options.exif_transpose,
        "format_options": dataclasses.asdict(writer_options) if writer_options else {},
    }


def _keep_complete(output: Path, manifest: dict[str, Any], key: str, fingerprint: dict[str, Any], *,
                   overwrite: bool) -> dict[str, Any] | None:
    """``--resume`` on a finished output: its manifest when written from the same, unchanged
    source with the same options; None to convert again (``--overwrite`` given); else a refusal."""
    if manifest.get("conversion_key") != key:
        if overwrite:
            return None
        raise OutputExistsError(
            f"Output {str(output)!r} was converted from another source or with other options; "
            "--resume does not replace it. Pass --overwrite to convert again."
        )
    changes = describe_changes(manifest.get("source_fingerprint"), fingerprint)
    if changes is None:
        return manifest
    if overwrite:
        return None
    raise SourceChangedError(
        f"Output {str(output)!r} is complete, but its source changed since it was converted: {changes}. "
        "--resume keeps an output only when its source is unchanged; pass --overwrite to convert again."
    )


def _claim_partial(target: _Target, fields: dict[str, Any], fingerprint: dict[str, Any],
                   options: ConvertOptions) -> dict[str, Any] | None:
    """The checkpoint to resume from, or None after removing a stale partial output of ours.

    A partial output that fastdata has no journal for is refused, never removed; with
    ``--resume``, one made from other options or a changed source is refused too.
    """
    output, partial = target.output, target.partial
    if not (partial.exists() or partial.is_symlink()):
        journal.remove(output)
        return None
    record = journal.read(output)
    if record is None or partial.is_symlink():
        raise OutputExistsError(
            f"{str(partial)!r} exists, but fastdata has no record of writing it (no journal "
            f"{journal.journal_path(output).name!r}); it is not removed. Move it away, or choose another output path."
        )
    if options.resume and not options.overwrite:
        shown = str(output)
        if record.get("version") != journal.JOURNAL_VERSION or "fields" not in record:
            raise OutputExistsError(
                f"Cannot resume {shown!r}: its partial output was written by another fastdata version. "
                "Convert again without --resume to start over (the partial output is replaced)."
            )
        if record["key"] != target.key:
            raise InvalidOptionError(
                f"Cannot resume {shown!r}: its partial conversion was started with {_field_changes(record['fields'], fields)}. "
                "Resume with the same source and options, or convert without --resume to start over."
            )
        changes = describe_changes(record.get("source_fingerprint"), fingerprint)
        if changes is not None:
            raise SourceChangedError(
                f"Cannot resume {shown!r}: the source changed since the conversion began: {changes}. Resuming "
                "would mix samples and labels of both. Convert without --resume (--overwrite if the output "
                "exists) to start over."
            )
        if target.spec.writer.supports_resume and record.get("writer") is not None:
            return record
    remove_path(partial)
    journal.remove(output)
    return None


def _field_changes(before: dict[str, Any], now: dict[str, Any]) -> str:
    names = sorted(name for name in set(before) | set(now) if before.get(name) != now.get(name))
    if "source" in names:
        return f"another source ({before.get('source')!r}, now {now.get('source')!r})"
    return "other options (" + ", ".join(f"{name} {before.get(name)!r}, now {now.get(name)!r}" for name in names) + ")"


def _write(job: "Job", target: _Target, state: dict[str, Any] | None, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """Run the job through the format's writer into the partial output; remove it on any failure.

    With a journal ``state``, the writer reopens the partial output at that checkpoint and the
    samples before ``state["next_index"]`` are not converted again.
    """
    src, plan, options, spec = job.src, job.plan, job.options, target.spec
    writer = None
    start = state["next_index"] if state else 0
    written = state["written"] if state else 0
    skipped = {int(i): entry for i, entry in state["skipped"].items()} if state else {}
    record = journal.read(target.output)
    target.report(start, len(src))
    reported = start
    last_checkpoint = time.monotonic()
    try:
        if state:
            writer = spec.writer.resume(target.partial, plan, target.writer_options, state["writer"])
        else:
            writer = spec.writer(target.partial, plan, target.writer_options)
        with WorkerPool(job, options.workers, len(src) - start) as pool:
            for batch, next_index in batches(job, pool, start):
                writer.write(batch)
                written += len(batch)
                skipped.update(dict(batch.skipped))
                target.report(len(batch) + len(batch.skipped), len(src))
                reported += len(batch) + len(batch.skipped)
                if spec.writer.supports_resume and time.monotonic() - last_checkpoint > journal.CHECKPOINT_INTERVAL_S:
                    record.update(mode=plan.mode, next_index=next_index, written=written, skipped=skipped,
                                  writer=writer.checkpoint())
                    journal.save(target.output, record)
                    last_checkpoint = time.monotonic()
        if written == 0:
            raise BadSampleError(f"No sample could be converted; all {len(src)} were skipped as unreadable.")
        manifest = _manifest(spec, plan, src, options, target.writer_options, written, skipped)
        manifest["conversion_key"] = target.key
        manifest["source_fingerprint"] = fingerprint
        return writer.close(manifest)
    except BaseException as exc:
        if writer is not None:
            with contextlib.suppress(Exception):  # closing may fail the same way; report the first error
                writer.abort()
        remove_path(target.partial)
        if isinstance(exc, ModeConflict):
            target.report(-reported, len(src))
        raise


def _manifest(spec, plan, src, options, writer_options, written, skipped) -> dict[str, Any]:
    classes = sorted(plan.class_to_idx, key=plan.class_to_idx.__getitem__)
    return {
        "format": spec.name,
        "layout_version": spec.layout_version,
        "fastdata_version": __version__,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "count": written,
        "store": plan.store,
        "image": {
            "mode": plan.mode,
            "channels": plan.channels,
            "dtype": "uint8",
            "shape": list(plan.shape) if plan.shape else None,
            "encoding": plan.encoding,
        },
        "label_dtype": "int64",
        "classes": classes,
        "class_to_idx": plan.class_to_idx,
        "source": src.describe(),
        "options": {
            "mode": options.mode,
            **plan.geometry.describe(),
            "reencode": list(options.reencode) if options.reencode else None,
            "format_options": dataclasses.asdict(writer_options) if writer_options else {},
        },
        "skipped": [skipped[i] for i in sorted(skipped)],
    }
