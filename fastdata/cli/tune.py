"""``fastdata tune``: recommend loader settings for a dataset, with the measurements behind them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fastdata.cli.common import add_command, backend_list
from fastdata.cli.mixing import HELP
from fastdata.errors import InvalidOptionError
from fastdata.conversion.options import parse_source_option

EXAMPLES = """
  fastdata tune ./photos --resize 64x64          # an image folder (also predicts converting it)
  fastdata tune out/photos.npy --step-ms 30      # a converted dataset, a 30 ms training step
  fastdata tune mydata:train_set --batch-size 32 # any Dataset: module:name (a Dataset or a
                                                 # zero-argument function returning one)
  fastdata tune torchvision:MNIST --root ~/data --step mytrain:step --json
  fastdata tune out/train.npy --transform augment --resize 224   # RandomResizedCrop + flip, fused decode
  fastdata tune --mix out/a.npy:3,out/b-shards:1  # a weighted mix of converted datasets
"""


def add_parser(commands) -> None:
    parser = add_command(
        commands, "tune",
        help="recommend backend, num_workers and loader options for a dataset, and say why",
        description="Measure the fetch, the cost of handing a batch from a worker to the loop, worker start-up, "
        "the training step and the usable cores; predict every backend x num_workers; confirm the best few with "
        "short probes within --budget-s; print the recommendation, what was measured, and why.",
        examples=EXAMPLES,
    )
    parser.add_argument("source", nargs="?", metavar="SOURCE",
                        help="module:name (a Dataset or a function returning one), an image folder, "
                        "torchvision:NAME, or a converted dataset")
    parser.add_argument("--mix", metavar="PATH:W,PATH:W|MIX.json", help=HELP)
    parser.add_argument("--batch-size", type=int, default=256, metavar="N", help="batch size (default: 256)")
    step = parser.add_mutually_exclusive_group()
    step.add_argument("--step-ms", type=float, default=0.0, metavar="MS",
                      help="the training step per batch, simulated by a sleep (default: 0)")
    step.add_argument("--step", metavar="MODULE:FUNCTION", help="the training step: a function called with each batch")
    parser.add_argument("--budget-s", type=float, default=60.0, metavar="S", help="time limit for the whole run (default: 60)")
    parser.add_argument("--backends", "--backend", dest="backend", metavar="LIST",
                        help="comma-separated backends to choose among (default: every backend)")
    parser.add_argument("--start-method", choices=("fork", "spawn", "forkserver"),
                        help="worker start method to plan for (default: this platform's; spawn on Windows/macOS)")
    parser.add_argument("--resize", metavar="HxW", help="image folders and torchvision sources: resize each image "
                        "(needed when image sizes differ)")
    parser.add_argument("--transform", default="none", choices=("none", "augment"),
                        help="augment: tune for the training transform v2.RandomResizedCrop(--resize) + "
                        "RandomHorizontalFlip; encoded images (image folders, encoded datasets) decode it fused "
                        "with the JPEG (docs/reading.md). Default: none")
    parser.add_argument("--root", metavar="DIR", help="torchvision sources: the dataset's root folder")
    parser.add_argument("--split", default=None, metavar="NAME",
                        help="torchvision sources: the dataset's own split name (when not given, the one the dataset "
                        "uses by itself)")
    parser.add_argument("--source-option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra keyword for the torchvision dataset (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the recommendation as JSON only")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    parser.set_defaults(run=run_tune)


def open_source(args: argparse.Namespace) -> tuple[Any, Any, str | None]:
    """The Dataset to tune, the source to predict a conversion for, and when none applies
    (None) the reason, for ``--json``'s ``conversion``."""
    from fastdata.importing import is_import_string, load_dataset

    source = args.source
    augment = _augment(args)
    if (source is None) == (args.mix is None):
        raise InvalidOptionError("Give a SOURCE to tune (image folder, torchvision:NAME, converted dataset, module:name) "
                                 f"or --mix PATH:WEIGHT,...{', not both' if source else ''}.")
    if args.mix is not None:
        from fastdata.cli.mixing import open_mix

        return open_mix(args.mix, transform=augment), None, "the source is a mix of converted datasets"
    if is_import_string(source):
        if augment is not None:
            raise InvalidOptionError("--transform augment applies to image folders, converted datasets and torchvision "
                                     "sources; a module:name Dataset brings its own transform. Drop --transform.")
        from fastdata.bench import refuse_pil_samples  # only for module:name sources

        dataset = load_dataset(source)
        refuse_pil_samples(dataset, source)
        return dataset, None, ("the source is a Python Dataset (module:name): a conversion is predicted "
                                            "for an image folder or a torchvision source")
    resize = _size(args.resize)
    if source.startswith("torchvision:"):
        from torchvision.transforms.v2.functional import pil_to_tensor

        from fastdata.bench.measure import TransformChain
        from fastdata.sources import torchvision_dataset

        steps: list[Any] = [pil_to_tensor]
        if augment is not None:
            steps.append(augment)
        elif resize:
            from torchvision.transforms import v2

            steps.append(v2.Resize(resize, antialias=True))
        options = {parse_source_option(text)[0]: parse_source_option(text)[1] for text in args.source_option}
        options["transform"] = TransformChain(steps)
        dataset = torchvision_dataset(source[len("torchvision:"):], root=args.root, split=args.split, options=options)
        return dataset, source, None
    path = Path(source)
    if not path.exists():
        raise InvalidOptionError(
            f"Source {source!r} does not exist. Give an image folder, a converted dataset, torchvision:NAME, "
            "or module:name for a Python Dataset."
        )
    from fastdata.formats import find_manifest

    manifest = find_manifest(path)
    if manifest:
        from fastdata.formats import get_format

        spec = get_format(manifest["format"])
        # tune needs random access (tar: TarIndexedDataset)
        dataset = (spec.map_dataset or spec.dataset)(path, transform=augment)
        return dataset, None, f"the source is already converted ({manifest['format']} {manifest['store']})"
    from fastdata.formats.folder import FolderDataset

    if augment is not None:
        return FolderDataset(path, transform=augment), source, None
    return FolderDataset(path, resize=resize), source, None


def _augment(args: argparse.Namespace) -> Any:
    """``--transform augment``: RandomResizedCrop(--resize) + RandomHorizontalFlip (None: none)."""
    if args.transform != "augment":
        return None
    size = _size(args.resize)
    if size is None:
        raise InvalidOptionError("--transform augment needs the crop size: pass --resize HxW (or S).")
    from torchvision.transforms import v2

    return v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])


def fused_note(dataset: Any) -> str | None:
    """The line saying the dataset's transform is decoded fused with its images (None: it is not)."""
    plan = getattr(getattr(dataset, "decoder", None), "plan", None)
    if plan is None:
        return None
    what = "RandomResizedCrop (+ flip)" if plan.kind == "random_resized_crop" else "Resize + CenterCrop"
    return f"fused decode: the transform's leading {what} is decoded with each JPEG (fuse=True; docs/reading.md)"


def _size(text: str | None) -> Any:
    if not text:
        return None
    from fastdata.images import parse_size

    size = parse_size(text, flag="--resize", allow_single=True)
    return size[0] if len(size) == 1 else tuple(size)


def run_tune(args: argparse.Namespace) -> int:
    from fastdata.tuning import tune

    dataset, convert_source, no_conversion = open_source(args)
    step: Any = args.step if args.step else (args.step_ms or None)
    backends = backend_list(args.backend)

    def progress(message: str) -> None:
        if not args.quiet and not args.json:
            print(f"fastdata tune: {message}", file=sys.stderr, flush=True)

    recommendation = tune(dataset, batch_size=args.batch_size, step=step, budget_s=args.budget_s, backends=backends,
                          start_method=args.start_method, convert_source=convert_source, progress=progress)
    if no_conversion:
        recommendation.conversion = {"skipped": no_conversion}
    note = fused_note(dataset)
    if args.json:
        plan = dataset.decoder.plan if note else None
        print(json.dumps(dict(recommendation.to_dict(), fused_decode=plan.kind if plan else None), indent=2,
                         default=str))
        return 0
    label = args.source if args.source is not None else f"--mix {args.mix}"
    print(render(recommendation, label) + (f"\n{note}" if note else ""))
    return 0


def _spread(m: Any, name: str) -> str:
    spread = m.spreads.get(name)
    if spread is None or len(spread.values) < 2:
        return ""
    text = f" +-{spread.relative:.0%}" if spread.relative != float("inf") else ""
    return text + f" ({len(spread.values)} repeats{', noisy' if spread.noisy else ''})"


def measured_table(m: Any) -> list[tuple[str, str]]:
    """``fastdata tune``'s "measured:" rows: each figure with its spread, a hand-over too small to
    tell from the noise said as such, a ratio above what the machine allows shown as capped."""
    from fastdata.bench.explain import ms
    from fastdata.tuning.noise import thread_limit

    table = []
    noise = m.spreads.get("noise")
    if noise is not None:
        table.append(("machine noise", f"{noise.median * 1000:.1f} ms of fixed work took {noise.low * 1000:.1f}-"
                                       f"{noise.high * 1000:.1f} ms ({len(noise.values)} runs"
                                       f"{'; busy' if noise.noisy else '; steady'})"))
    table.append(("fetch per batch, num_workers=0",
                  f"{ms(m.fetch_ms)}{_spread(m, 'fetch_ms')} (the loop with it: {ms(m.loop_ms)})"))
    if m.standard_fetch_ms is not None:
        table.append(("per-sample fetch + collate", ms(m.standard_fetch_ms)))
    for backend, cost in m.transfer_ms.items():
        name = f"transfer_ms.{backend}"
        value = (f"below the noise ({m.spreads[name].low:+.3g} to {m.spreads[name].high:+.3g} ms over "
                 f"{len(m.spreads[name].values)} repeats)" if backend in m.hand_over_below_noise
                 else f"{ms(cost)}{_spread(m, name)}")
        table.append((f"hand-over per batch, {backend}", value))
        table.append((f"start-up of one {backend} worker",
                      f"{ms(m.startup_s[backend] * 1000)}{_spread(m, 'startup_s.' + backend)}"))
    if m.thread_speedup is not None:
        raw = m.spreads.get("thread_speedup")
        capped = raw is not None and raw.median > m.thread_speedup
        table.append(("2 threads fetching vs 1 (GIL)", f"{m.thread_speedup:.2f}x" + (
            f" (measured {raw.median:.2f}x, above the {thread_limit(m.usable_cores):.0f}x 2 threads can reach: noise)"
            if capped else _spread(m, "thread_speedup"))))
    if m.step_ms:
        table.append(("training step", ms(m.step_ms)))
    return table


def render(rec: Any, source: str) -> str:
    """The recommendation, the measured table (with the figures noise makes untrustworthy) and the
    explanation, as ``fastdata tune`` prints them."""
    m = rec.measurements
    lines = [f"fastdata tune: {source}, batch {rec.batch_size}, {m.usable_cores} usable cores "
             f"(os.cpu_count()={m.cpu_count}), start method {m.start_method}, {rec.elapsed_s:.1f} s "
             + (f"(budget {rec.budget_s:g} s; a dataset this small needs about {rec.effective_budget_s:.0f} s)"
                if rec.effective_budget_s < rec.budget_s else f"of {rec.budget_s:g} s"), ""]
    kwargs = ", ".join(f"{key}={value!r}" for key, value in rec.loader_kwargs.items())
    lines.append(f"recommended: fastdata.loader(dataset, {kwargs})")
    measured = f"{rec.measured_samples_per_s:,.0f}" if rec.measured_samples_per_s is not None else "not probed"
    lines.append(f"  predicted {rec.predicted_samples_per_s:,.0f} samples/s, measured {measured} samples/s"
                 + (f", data wait {rec.wait_fraction:.0%} of the loop" if rec.wait_fraction is not None and m.step_ms else ""))
    if getattr(rec, "use_auto", None):
        lines.append(f"  or {rec.use_auto}")
    if rec.backend != "torch":
        dl = ", ".join(f"{key}={value!r}" for key, value in rec.dataloader_kwargs.items())
        lines.append(f"  with a plain DataLoader instead: DataLoader(dataset, {dl})")
    table = measured_table(m)
    width = max(len(name) for name, _ in table)
    lines += ["", "measured (median, and +- half the spread of its repeats):",
              *(f"  {name:<{width}}  {value}" for name, value in table)]
    doubts = rec.doubts()
    if doubts:
        lines += ["", "not to be trusted (noise; rerun on a quieter machine for firm figures):",
                  *(f"  - {doubt}" for doubt in doubts)]
    lines += ["", "probed:", f"  {'backend':<8} {'num_workers':>11} {'predicted/s':>12} {'measured/s':>12} {'wait':>6} {'PSS/worker':>11}"]
    for row in rec.candidates:
        if "measured_samples_per_s" not in row:
            continue
        pss = f"{row['pss_mb_per_worker']:.0f} MB" if row.get("pss_mb_per_worker") else "-"
        wait = f"{row['wait_fraction']:.0%}" if m.step_ms else "-"
        backend = "any" if row.get("same_for_backends") else row["backend"]
        lines.append(f"  {backend:<8} {row['num_workers']:>11} {row['predicted_samples_per_s']:>12,.0f} "
                     f"{row['measured_samples_per_s']:>12,.0f} {wait:>6} {pss:>11}")
    if any(row.get("same_for_backends") and "measured_samples_per_s" in row for row in rec.candidates):
        lines.append("  (any: num_workers=0 is one serial loop in the calling thread on every backend, probed once)")
    lines += ["", "why: " + rec.explain()]
    return "\n".join(lines)
