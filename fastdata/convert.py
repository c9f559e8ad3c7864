"""The conversion engine: source -> parallel decode/resize/encode -> format writer -> dataset.

Output is written under ``<output>.partial`` and renamed to ``<output>`` only when complete,
so a failed or interrupted conversion never leaves something that looks like a dataset.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fastdata import __version__, journal
from fastdata.errors import BadSampleError, FastdataError, InvalidOptionError, OutputExistsError, OutputWriteError
from fastdata.formats import FormatSpec, find_manifest, get_format
from fastdata.images import DEFAULT_MAX_PIXELS, MODES, Geometry
from fastdata.pipeline import Job, ModeConflict, WorkerPool, batches, plan_job
from fastdata.plan import STORES, ConvertOptions
from fastdata.sources import Source, resolve_source

PARTIAL_SUFFIX = ".partial"


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
        workers=(os.cpu_count() or 1) if workers is None else workers,
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
    if output.exists() and not overwrite and not resume:
        raise OutputExistsError(f"Output {str(output)!r} already exists. Pass --overwrite to replace it.")
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
        return self.output.with_name(self.output.name + PARTIAL_SUFFIX)

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
    output.parent.mkdir(parents=True, exist_ok=True)
    target = _Target(output, spec, writer_options, _key(spec, src, options, writer_options), progress)
    state = None
    if options.resume:
        complete = _complete_output(target)
        if complete is not None:
            return complete
        state = journal.load(output, target.key) if target.partial.exists() and spec.writer.supports_resume else None
    if state is None:  # stale partial output of an earlier run is removed
        remove_path(target.partial)
        journal.remove(output)
    job = plan_job(src, options, mode=state["mode"] if state else None)
    try:
        manifest = _write(job, target, state)
    except ModeConflict:
        # auto mode planned grayscale from the first images, then met a colour one: redo as RGB
        manifest = _write(plan_job(src, options, mode="RGB"), target, None)
    _publish(target.partial, output, overwrite=options.overwrite or options.resume)
    journal.remove(output)
    return manifest


def _key(spec: FormatSpec, src: Source, options: ConvertOptions, writer_options: Any) -> str:
    return journal.conversion_key({
        "format": spec.name, "layout_version": spec.layout_version, "source": src.describe(),
        "store": options.store, "mode": options.mode, "geometry": options.geometry.describe(),
        "reencode": options.reencode, "skip_bad": options.skip_bad, "max_pixels": options.max_pixels,
        "exif_transpose": options.exif_transpose,
        "format_options": dataclasses.asdict(writer_options) if writer_options else {},
    })


def _complete_output(target: _Target) -> dict[str, Any] | None:
    """``--resume`` on a finished output: its manifest when written from the same source and options."""
    if not target.output.exists():
        return None
    manifest = find_manifest(target.output)
    if manifest is not None and manifest.get("conversion_key") == target.key:
        return manifest
    if manifest is None:
        raise OutputExistsError(
            f"Output {str(target.output)!r} exists and is not a fastdata dataset. Pass --overwrite to replace it."
        )
    raise OutputExistsError(
        f"Output {str(target.output)!r} was converted from another source or with other options; "
        "--resume does not replace it. Pass --overwrite to convert again."
    )


def _write(job: "Job", target: _Target, state: dict[str, Any] | None) -> dict[str, Any]:
    """Run the job through the format's writer into the partial output; remove it on any failure.

    With a journal ``state``, the writer reopens the partial output at that checkpoint and the
    samples before ``state["next_index"]`` are not converted again.
    """
    src, plan, options, spec = job.src, job.plan, job.options, target.spec
    writer = None
    start = state["next_index"] if state else 0
    written = state["written"] if state else 0
    skipped = {int(i): entry for i, entry in state["skipped"].items()} if state else {}
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
                    journal.save(target.output, {
                        "key": target.key, "mode": plan.mode, "next_index": next_index, "written": written,
                        "skipped": skipped, "writer": writer.checkpoint(),
                    })
                    last_checkpoint = time.monotonic()
        if written == 0:
            raise BadSampleError(f"No sample could be converted; all {len(src)} were skipped as unreadable.")
        manifest = _manifest(spec, plan, src, options, target.writer_options, written, skipped)
        manifest["conversion_key"] = target.key
        return writer.close(manifest)
    except BaseException as exc:
        if writer is not None:
            with contextlib.suppress(Exception):  # closing may fail the same way; report the first error
                writer.abort()
        remove_path(target.partial)
        journal.remove(target.output)
        if isinstance(exc, ModeConflict):
            target.report(-reported, len(src))
        if isinstance(exc, OSError) and not isinstance(exc, FastdataError):
            raise OutputWriteError(
                f"Cannot write {str(target.output)!r}: {exc.strerror or exc}. Free disk space (or raise the "
                "file-size limit) and convert again; no partial output was left behind."
            ) from exc
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


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _publish(partial: Path, output: Path, *, overwrite: bool) -> None:
    """Rename the complete temporary output into place (replacing the old one if asked)."""
    if output.exists() or output.is_symlink():
        if not overwrite:
            remove_path(partial)
            raise OutputExistsError(f"Output {str(output)!r} appeared during conversion; not replaced.")
        old = output.with_name(output.name + ".old")
        remove_path(old)
        os.replace(output, old)
        os.replace(partial, output)
        remove_path(old)
    else:
        os.replace(partial, output)
