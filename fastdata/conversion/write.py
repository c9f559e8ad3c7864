"""Write, the last of a conversion's three steps (plan, run, write; see docs/converting.md).

Every engine (this process, a local pool, the parts of a job array, Ray tasks) yields finished
units in source order; :func:`write_units` streams them through the format's writer, the only
one that writes the output, and writes index and manifest last. That is why the output's bytes
never depend on the engine. :func:`written_once` wraps it in the output rules: the partial output
claimed (or resumed), removed on failure, renamed into place when complete. The journal's
checkpoints, made here at unit boundaries, are how every engine keeps the units already in the
partial output (:mod:`fastdata.conversion.resume`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from typing import Any, Callable, Iterable

from fastdata.conversion import journal
from fastdata._version import __version__
from fastdata.errors import BadSampleError, ConversionInterrupted, CorruptManifestError
from fastdata.formats import FormatSpec, manifest_problems
from fastdata.formats.base import Plan
from fastdata.conversion.options import ConvertOptions
from fastdata.files import remove_path
from fastdata.conversion.outputs import Target, partial_removed_on_failure, publish
from fastdata.conversion.pipeline import ModeConflict
from fastdata.conversion.resume import claim_partial
from fastdata.conversion.units import Finished


def write_units(target: Target, plan: Plan, options: ConvertOptions, finished: Iterable[Finished], *,
                source: dict[str, Any], state: dict[str, Any] | None = None,
                keep_on_interrupt: bool = False) -> dict[str, Any]:
    """The one write loop of every conversion: stream the engine's finished units, in order,
    through the format's writer into the partial output, then write index and manifest (the
    writer's ``close``); the manifest as written. ``source`` is the source's description.

    With a journal ``state`` (``--resume``), the writer reopens the partial output at that
    checkpoint, and ``finished`` starts at unit ``state["next_unit"]``. At the end of a unit, at
    most every ``journal.CHECKPOINT_INTERVAL_S`` seconds, a resumable writer's checkpoint is
    recorded in the journal with the number of units the partial output holds. On any
    failure the partial output is removed (and the engine stopped), except on Ctrl-C or SIGTERM
    after a checkpoint when ``keep_on_interrupt`` (a local conversion, which ``--resume``
    continues): :class:`~fastdata.errors.ConversionInterrupted`, the partial output kept; after a
    :class:`ModeConflict` the progress reported so far is taken back.
    """
    spec = target.spec
    writer = None
    start, written = (state["next_index"], state["written"]) if state else (0, 0)
    skipped = {int(i): entry for i, entry in state["skipped"].items()} if state else {}
    record = journal.read(target.output) if spec.writer.supports_resume else None
    target.report(start, plan.count)
    reported, last_checkpoint = start, time.monotonic()
    try:
        streaming = {"sink": target.sink} if target.sink is not None and spec.writer.streams_files else {}
        if state:
            writer = spec.writer.resume(target.partial, plan, options.format_options, state["writer"], **streaming)
        else:
            writer = spec.writer(target.partial, plan, options.format_options, **streaming)
        for unit in finished:
            for batch in unit.batches:
                writer.write(batch)
                written += len(batch)
                target.report(len(batch), plan.count)
                reported += len(batch)
            skipped.update(unit.skipped)
            target.report(len(unit.skipped), plan.count)
            reported += len(unit.skipped)
            if record is not None and time.monotonic() - last_checkpoint > journal.CHECKPOINT_INTERVAL_S:
                record.update(mode=plan.mode, unit_samples=options.unit_samples, next_unit=unit.unit.number + 1,
                              next_index=unit.unit.stop, written=written, skipped=skipped,
                              writer=writer.checkpoint())
                journal.save(target.output, record)
                last_checkpoint = time.monotonic()
        return close_writer(writer, spec, plan, options, source, written, skipped, total=plan.count,
                            key=target.key, fingerprint=target.fingerprint)
    except BaseException as exc:
        close = getattr(finished, "close", None)
        if close is not None:  # a generator engine: stop its pool or tasks now, not when collected
            close()
        abort_writer(writer)
        if keep_on_interrupt and isinstance(exc, KeyboardInterrupt) and (record or {}).get("writer") is not None:
            # Ctrl-C or SIGTERM (a scheduler's preemption) after a checkpoint: the partial output and
            # journal stay, as a killed process leaves them, for --resume
            raise ConversionInterrupted(str(target.output), record["next_index"], plan.count, str(target.partial)) from None
        remove_path(target.partial)
        if isinstance(exc, ModeConflict):
            target.report(-reported, plan.count)
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


def written_once(target: Target, fields: dict[str, Any], options: ConvertOptions, existing: dict[str, Any] | None,
                 write: Callable[[dict[str, Any] | None], dict[str, Any]]) -> dict[str, Any]:
    """Write ``target``'s output under the output rules (the caller holds the exclusive lock):
    claim its partial output (a journal ``state`` to resume from, or None after a fresh journal is
    started), ``write(state)`` into it (:func:`write_units`), rename it into place (replacing the
    ``existing`` dataset, if any); on failure the partial output and the journal are removed."""
    state = claim_partial(target, fields, options)
    with partial_removed_on_failure(target.output, target.partial):
        if state is None:
            journal.start(target.output, key=target.key, fields=fields, fingerprint=target.fingerprint)
        manifest = write(state)
        check_written(target, manifest)
        publish(target.partial, target.output, replace=existing is not None)
    return manifest


def check_written(target: Target, manifest: dict[str, Any]) -> None:
    """Refuse to publish an output whose manifest its own readers would refuse (the partial
    output is then removed): a conversion never reports "wrote" for a dataset that cannot be opened."""
    problems = manifest_problems(target.partial, manifest)
    if problems:
        raise CorruptManifestError(f"{problems[0]} Nothing was written to {str(target.output)!r}: this is a fastdata "
                                   "bug; please report it with the source's description.")


def build_manifest(spec: FormatSpec, plan: Plan, options: ConvertOptions, source: dict[str, Any], written: int,
                   skipped: dict[int, dict[str, str]]) -> dict[str, Any]:
    """The manifest of a finished conversion (the writer adds ``files`` and its layout); ``source``
    is the source's description."""
    classes = plan.class_list
    manifest = {
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
    if plan.schema is not None:  # samples with fields beyond (image, label): docs/fields.md
        manifest["fields"] = plan.schema.to_json()
    return manifest
