"""The local engine: runs a planned job through the format's writer, batch by batch, making
checkpoints for ``--resume`` as it goes, and builds the manifest at the end.

:mod:`fastdata.conversion` decides *whether* and *where* to write (output rules, lock, resume);
this module does the writing, into the partial output only.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fastdata.conversion import journal
from fastdata._version import __version__
from fastdata.errors import BadSampleError
from fastdata.formats import FormatSpec
from fastdata.formats.base import Plan
from fastdata.conversion.options import ConvertOptions
from fastdata.conversion.outputs import partial_path, remove_path
from fastdata.conversion.pipeline import Job, ModeConflict, WorkerPool, batches


@dataclass
class Target:
    """Where and how one conversion writes: the output, its format and options, the journal key,
    the progress callback."""

    output: Path
    spec: FormatSpec
    key: str
    fingerprint: dict[str, Any]
    progress: Callable[[int, int], None] | None = None

    @property
    def partial(self) -> Path:
        return partial_path(self.output)

    def report(self, count: int, total: int) -> None:
        if self.progress is not None and count:
            self.progress(count, total)


def write_job(job: Job, target: Target, state: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the job through the format's writer into the partial output; remove it on any failure.

    With a journal ``state``, the writer reopens the partial output at that checkpoint and the
    samples before ``state["next_index"]`` are not converted again.
    """
    src, plan, options, spec = job.src, job.plan, job.options, target.spec
    writer_options = options.format_options
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
            writer = spec.writer.resume(target.partial, plan, writer_options, state["writer"])
        else:
            writer = spec.writer(target.partial, plan, writer_options)
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
        return close_writer(writer, spec, plan, options, src.describe(), written, skipped, total=len(src),
                            key=target.key, fingerprint=target.fingerprint)
    except BaseException as exc:
        abort_writer(writer)
        remove_path(target.partial)
        if isinstance(exc, ModeConflict):
            target.report(-reported, len(src))
        raise


def close_writer(writer: Any, spec: FormatSpec, plan: Plan, options: ConvertOptions, source: dict[str, Any],
                 written: int, skipped: dict[int, dict[str, str]], *, total: int, key: str,
                 fingerprint: dict[str, Any]) -> dict[str, Any]:
    """Finish a conversion's writer with its manifest (refused when nothing of the ``total``
    samples could be converted); the manifest as written."""
    if written == 0:
        raise BadSampleError(f"No sample could be converted; all {total} were skipped as unreadable.")
    manifest = build_manifest(spec, plan, options, source, written, skipped)
    manifest["conversion_key"] = key
    manifest["source_fingerprint"] = fingerprint
    return writer.close(manifest)


def abort_writer(writer: Any) -> None:
    """Abandon a writer after a failure (if it was made); its own errors would hide the first one."""
    if writer is not None:
        with contextlib.suppress(Exception):
            writer.abort()


def build_manifest(spec: FormatSpec, plan: Plan, options: ConvertOptions, source: dict[str, Any], written: int,
                   skipped: dict[int, dict[str, str]]) -> dict[str, Any]:
    """The manifest of a finished conversion (the writer adds ``files`` and its layout); ``source``
    is the source's description."""
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
        "source": source,
        "options": options.describe(),
        "skipped": [skipped[i] for i in sorted(skipped)],
    }
