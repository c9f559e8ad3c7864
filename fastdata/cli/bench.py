"""``fastdata bench``: every format x num_workers on this machine, and why the best wins."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fastdata.cli.common import DeprecatedAlias, add_command, backend_list, human_bytes
from fastdata.cli.mixing import HELP as MIX_HELP
from fastdata.errors import InvalidOptionError
from fastdata.conversion.options import parse_source_option
from fastdata.extras import install_command


EXAMPLES = """
  fastdata bench --demo                                  # a generated image folder: under 3 minutes on 2 cores
  fastdata bench ./photos --resize 64x64 --formats npy,hdf5 --num-workers 0,2,4
  fastdata bench torchvision:CIFAR10 --root ~/data --resize 32x32 --step-ms 20
  fastdata bench mydata:train_set --batch-size 64        # any map-style Dataset (module:name)
  fastdata bench ./photos --resize 224 --transform augment --stores encoded   # training crops, fused decode
  fastdata bench --mix out/a.npy:3,out/b-shards:1        # a weighted mix of converted datasets
"""


def add_parser(commands) -> None:
    from fastdata.formats import available_formats

    parser = add_command(
        commands, "bench",
        help="measure every format x num_workers on this machine, and say why the best wins",
        description="Convert SOURCE to every format (cached under --out), read each one with every "
        "num_workers in a fresh process, and print one recommendation, the table (median and spread of "
        "samples/s per num_workers) and short reasons. Each format is read two ways: 'fast' is "
        "fastdata.loader (one ds[indices] read per batch), 'standard' is DataLoader(ds, batch_size=N) "
        "(per-sample reads and collate); tar is also read as a stream ('stream').",
        examples=EXAMPLES,
    )
    parser.add_argument("source", nargs="?", metavar="SOURCE",
                        help="image folder, torchvision:NAME, a converted dataset, or module:name (any map-style "
                        "Dataset, or a zero-argument function returning one)")
    parser.add_argument("--demo", action="store_true", help="generate a demo image folder and benchmark it")
    parser.add_argument("--mix", metavar="PATH:W,PATH:W|MIX.json", help=MIX_HELP)
    parser.add_argument("--formats", "--format", dest="formats", default=None, metavar="LIST",
                        help=f"comma-separated formats (default: all: {','.join(available_formats())}; "
                        f"{','.join(DEMO['formats'])} with --demo)")
    parser.add_argument("--stores", "--store", dest="store", default="raw,encoded", metavar="LIST",
                        help="comma-separated stores of the converted formats (default: raw,encoded)")
    parser.add_argument("--resize", metavar="HxW",
                        help="raw conversions store this size; encoded/folder reads resize to it")
    parser.add_argument("--num-workers", dest="workers", default="auto", metavar="LIST",
                        help="DataLoader num_workers to measure, e.g. 0,1,2,4,8, or auto (0,1,2,4.. up to the cores; "
                        "0,2,4 up to the cores with --demo)")
    parser.add_argument("--workers", dest="workers", action=DeprecatedAlias, command="bench", replacement="--num-workers")
    parser.add_argument("--batch-size", type=int, default=None, metavar="N",
                        help="DataLoader batch_size (default: 256; 128 with --demo, so that its epochs are 24 batches "
                        "long: fewer are too short to time)")
    parser.add_argument("--epochs", type=int, default=None, metavar="N",
                        help="measured epochs per configuration (median reported; default: 3, 2 with --demo)")
    parser.add_argument("--warmup", type=int, default=1, metavar="N", help="unmeasured epochs first")
    parser.add_argument("--step-ms", type=float, default=0.0, metavar="MS",
                        help="simulated training step per batch (a sleep)")
    parser.add_argument("--step", metavar="MODULE:FUNCTION", help="the training step: a function called with each batch")
    parser.add_argument("--transform", default="none", metavar="NAME",
                        help="none, normalize or augment (torchvision.transforms.v2), or MODULE:FUNCTION, a "
                        "per-sample transform of your own")
    parser.add_argument("--start-method", metavar="METHOD",
                        help="DataLoader worker start method: fork, spawn or forkserver (default: the platform's)")
    parser.add_argument("--pin-memory", action="store_true", help="DataLoader pin_memory=True")
    parser.add_argument("--persistent-workers", action="store_true",
                        help="DataLoader persistent_workers=True (always with --demo: its epochs are short, and "
                        "starting workers every epoch would measure start-up, not loading)")
    parser.add_argument("--prefetch-factor", type=int, default=2, metavar="N",
                        help="DataLoader prefetch_factor (batches loaded ahead per worker)")
    parser.add_argument("--cache", default="warm", metavar="warm|cold",
                        help="warm, or cold: evict the dataset's files from the page cache each epoch (a SOURCE at a URL: "
                        "also start from a cache emptied of it, so its download throughput is measured)")
    parser.add_argument("--timeout-s", type=float, default=600.0, metavar="S", help="time limit per configuration")
    parser.add_argument("--memory-s", type=float, default=None, metavar="S",
                        help="peak memory is sampled in untimed epochs after the timed ones, lasting at least S "
                        "seconds per configuration (default 1; 0: one epoch)")
    parser.add_argument("--backends", "--backend", dest="backend", metavar="LIST",
                        help="comma-separated fastdata.loader backends to measure on the fast path of map-style "
                        "formats (default: every backend; at num_workers=0 they are one serial loop)")
    parser.add_argument("--no-auto", dest="auto", action="store_false",
                        help="leave out the num_workers='auto' row (measured after the grid on its fastest dataset)")
    parser.add_argument("--out", default="bench-out", metavar="DIR",
                        help="results and cached conversions (default: ./bench-out); a URL (s3://...) gets "
                        "results.json, results.csv and throughput.png, the conversions stay cached under the "
                        "cache directory")
    parser.add_argument("--root", metavar="DIR", help="torchvision sources: the dataset's root folder")
    parser.add_argument("--split", default=None, metavar="NAME",
                        help="torchvision sources: the dataset's own split name (when not given, the one the dataset "
                        "uses by itself)")
    parser.add_argument("--download", action="store_true", help="torchvision sources: download if missing")
    parser.add_argument("--source-option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra keyword for the torchvision dataset, e.g. size=1000 (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    parser.add_argument("--json", action="store_true", help="print results.json's document on stdout instead of "
                        "the report (progress still goes to stderr; exit status as without it)")
    parser.set_defaults(run=run_bench)


# 3,030 images: 24 batches of 128 an epoch (fewer are too short to time); 30 large JPEGs and 2
# measured epochs keep the whole demo, fastdata's backends included, under 3 minutes on 2 cores, and
# so does leaving tar out (its reader streams: the backends do not apply to it); persistent workers,
# so that an epoch of 24 batches measures loading rather than worker start-up. num_workers 0 and 2
# (and 4 where there are 4 cores): 28 configurations on 2 cores, and no more than 45 however many
# cores there are (--num-workers auto would measure 0, 1, 2, 4, ... up to the core count)
DEMO = {"small": 3000, "large": 30, "resize": "32x32", "batch_size": 128, "epochs": 2, "persistent_workers": True,
        "formats": ("folder", "npy", "hdf5"), "workers": (0, 2, 4)}
EPOCHS = 3
BATCH_SIZE = 256


def demo_workers(cores: int | None = None) -> tuple[int, ...]:
    """The num_workers ``--demo`` measures: 0, 2 and 4, those the usable cores allow (0 and 1 on
    one core), so that the demo takes about as long on any machine."""
    from fastdata.machine import usable_cores

    cores = usable_cores() if cores is None else cores
    return (0,) + (tuple(w for w in DEMO["workers"][1:] if w <= cores) or (1,))


def batch_size_of(args: argparse.Namespace) -> int:
    """``--batch-size``, or its default: smaller for ``--demo``, whose folder is small."""
    if args.batch_size is not None:
        return args.batch_size
    return DEMO["batch_size"] if args.demo else BATCH_SIZE


def run_bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from fastdata.bench import bench_dataset, run_bench

    from fastdata.urls import is_url

    out_url = args.out if is_url(args.out) else None
    if out_url is not None:  # results written locally (conversions cached there too), then uploaded
        from fastdata.remote import RemoteOptions
        from fastdata.conversion.remote.upload import check_writable, staging_path

        check_writable(out_url, RemoteOptions())
        out = staging_path(out_url).with_name("bench-out")
    else:
        out = Path(args.out)
    source = args.source
    resize = args.resize
    if args.demo:
        from fastdata.bench.demo import demo_folder

        source = str(demo_folder(out / "demo-images", small=DEMO["small"], large=DEMO["large"]))
        resize = resize or DEMO["resize"]
    elif args.mix is not None:
        if source is not None:
            raise InvalidOptionError("Give a SOURCE or --mix PATH:WEIGHT,..., not both.")
    elif source is None:
        raise InvalidOptionError("Give a SOURCE to benchmark (image folder, torchvision:NAME, converted dataset), "
                                 "--mix PATH:WEIGHT,... or --demo.")
    config = config_of(args, resize)
    if config.resize is not None or config.transform in ("normalize", "augment"):
        from fastdata.errors import DependencyMismatchError
        from fastdata.extras import torchvision_problem, torchvision_suspect

        if torchvision_suspect() and torchvision_problem():  # once, before any configuration: each would fail on it
            raise DependencyMismatchError(f"bench --resize/--transform needs torchvision, but {torchvision_problem()}")
    source_options = {"root": args.root, "split": args.split, "download": args.download}
    if args.source_option:
        source_options["source_options"] = dict(parse_source_option(text) for text in args.source_option)
    bar = None

    def on_case(case, number, total):
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, unit="config", disable=args.quiet, file=sys.stderr)
        bar.set_description(f"{case.label} nw={case.num_workers}")
        bar.update(1 if number else 0)

    def progress(message):
        if not args.quiet:
            print(message, file=sys.stderr)

    from fastdata.importing import is_import_string

    try:
        if args.mix is not None:
            from fastdata.cli.mixing import mix_lines, open_mix

            source = f"--mix {args.mix}"
            result = bench_dataset(source, config, out, on_case, dataset=open_mix(args.mix), opened=mix_lines(args.mix))
        elif is_import_string(source):
            result = bench_dataset(source, config, out, on_case)
        else:
            result = run_bench(source, config, out, source_options=source_options, progress=progress, on_case=on_case,
                               url=getattr(args, "source_url", None))
    finally:
        if bar is not None:
            bar.update(bar.total - bar.n)
            bar.close()
    written = None
    if out_url is not None:
        from fastdata.remote import RemoteOptions
        from fastdata.conversion.remote.upload import upload_results

        names = ["results.json", "results.csv"] + (["throughput.png"] if result.plot else [])
        written = upload_results([out / name for name in names], out_url, RemoteOptions())
    results = written[0] if written else out / "results.json"
    if result.all_failed:
        failed = (f"fastdata: error: every configuration failed (see the table above); nothing to recommend. "
                  f"Rows with each failure: {results}")
    else:
        failed = (f"fastdata: error: {len(result.failed)} of {result.summary['configurations']} configurations failed "
                  f"(see the table above; each reason is in the warning); the others were measured and are in "
                  f"{results}")
    if args.json:
        import json

        print(json.dumps(result.document, indent=2, default=str))
        if result.failed:
            print(failed.replace(" (see the table above; each reason is in the warning)", "").replace(
                " (see the table above)", ""), file=sys.stderr)
        return 1 if result.failed else 0
    display = "./my-images" if args.demo else getattr(args, "source_url", None) or source
    report = report_text(result, getattr(args, "source_url", None) or source, config, written, usage_source=display)
    if result.all_failed:
        print(report, file=sys.stderr)
        print(failed, file=sys.stderr)
        return 1
    print(report)
    if result.failed:  # measured, but not everything: say so where scripts look (the exit status)
        print(failed, file=sys.stderr)
        return 1
    return 0


def config_of(args: argparse.Namespace, resize: str | None):
    """The grid ``fastdata bench`` measures, from its options (``resize``: ``--resize``, or the
    demo's)."""
    from fastdata.bench import BenchConfig, parse_workers
    from fastdata.formats import available_formats

    if args.formats is not None:
        formats = tuple(f for f in args.formats.split(",") if f)
    else:
        formats = DEMO["formats"] if args.demo else tuple(available_formats())
    return BenchConfig(
        formats=formats,
        stores=tuple(s for s in args.store.split(",") if s),
        workers=demo_workers() if args.demo and args.workers == "auto" else tuple(parse_workers(args.workers)),
        resize=resize, batch_size=batch_size_of(args), warmup=args.warmup,
        epochs=args.epochs if args.epochs is not None else DEMO["epochs"] if args.demo else EPOCHS,
        step_ms=args.step_ms, transform=args.transform, start_method=args.start_method,
        pin_memory=args.pin_memory,
        persistent_workers=args.persistent_workers or (args.demo and DEMO["persistent_workers"]),
        prefetch_factor=args.prefetch_factor, cache=args.cache, timeout_s=args.timeout_s,
        **({} if args.memory_s is None else {"memory_s": args.memory_s}),
        backends=backend_list(args.backend), step=args.step,
        auto=args.auto and not args.demo,
    )


def fused_line(rows: list[dict]) -> str | None:
    """Which datasets decoded the transform's leading crop with the image (the readers' fused
    decode, docs/reading.md) and which ran it after decoding; None when no row fused."""
    fused, after = [], []
    for row in rows:
        if row.get("status") != "ok" or row.get("read_path") == "transfer":
            continue
        name = row["format"] if row.get("store") in (None, "-") else f"{row['format']} {row['store']}"
        (fused if row.get("fused_decode") else after).append(name)
    if not fused:
        return None
    fused, after = sorted(set(fused)), sorted(set(after) - set(fused))
    kinds = {row["fused_decode"] for row in rows if row.get("fused_decode")}
    what = "RandomResizedCrop (+ flip)" if "random_resized_crop" in kinds else "Resize + CenterCrop"
    line = f"fused decode: {', '.join(fused)} decode the transform's leading {what} with the JPEG (fuse=True)"
    return line + (f"; not fused (stored pixels): {', '.join(after)}" if after else "")


def report_text(result, source: str, config, written: list[str] | None = None, *,
                usage_source: str | None = None) -> str:
    """What ``fastdata bench`` prints: the setting, the recommendation and how to train with it
    (the commands for ``usage_source``: the demo's says ./my-images, for the user's own folder),
    warnings, the table, the short reasons and the files written."""
    from fastdata.bench import machine_info
    from fastdata.bench.advice import how_lines, how_to_use

    info = machine_info()
    lines = [f"fastdata bench: {source}, batch {config.batch_size}, os.cpu_count()={info['cpu_count']}, "
             f"{info['ram_gb']} GiB RAM, torch {info['torch']}"]
    for item in result.conversions:
        if item["conversion_s"] is not None:
            state = "cached" if item["cached"] else "converted"
            lines.append(f"  {item['format']} {item['store']}: {human_bytes(item['disk_bytes'])}, "
                         f"{state} in {item['conversion_s']:.1f} s")
    if result.recommendation:
        lines += ["", "recommendation: " + result.recommendation]
        picked = result.summary["recommendation"]
        if usage_source not in (None, source):  # the demo: the same advice for the user's own folder
            how = how_to_use(picked, source=usage_source, config=config, baseline=result.document["baseline"],
                             converted=False)
            lines += how_lines(how, f"your own image folder ({usage_source})")
        elif picked.get("how"):
            lines += how_lines(picked["how"], source)
    if result.backends:
        lines.append("backends: " + result.backends)
    if result.remote:
        lines.append("remote: " + result.remote)
    if getattr(result, "auto", None):
        lines.append("auto: " + result.auto)
    fused = fused_line(result.rows)
    if fused:
        lines.append(fused)
    lines += ["", *result.warnings, *([""] if result.warnings else []), result.table, "", "why:"]
    lines += [f"  {line}" for line in result.verdicts]
    if written is None:  # written: the URLs they were uploaded to (--out URL)
        names = ["results.json", "results.csv"] + (["throughput.png"] if result.plot else [])
        written = [str(result.out / name) for name in names]
    lines.append(f"\nwrote {', '.join(written)}")
    if result.plot is None and not result.all_failed:
        lines.append(f"(no plot: install matplotlib, e.g. {install_command('plot')})")
    return "\n".join(lines)
