"""The command line's surface: messages that quote what was typed, help for every option, examples
that parse, and deprecated spellings that still work (run in this process through ``main``)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest

import fastdata
from fastdata.cli import main
from fastdata.cli.common import DeprecatedAlias


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


# --- every "Invalid ..." message quotes the value as it was typed --------------------------------

INVALID = [
    (["--resize", "32by32"],
     "Invalid --resize '32by32'. Use 'HxW' (e.g. '64x64') or 'S' (shorter side), with positive integers."),
    (["--resize", "0x4"], "Invalid --resize '0x4'. Use 'HxW' (e.g. '64x64') or 'S' (shorter side), with positive integers."),
    (["--center-crop", "8"], "Invalid --center-crop '8'. Use 'HxW' (e.g. '56x56'), with positive integers."),
    (["--store", "encoded", "--reencode", "gif"], "Invalid --reencode 'gif'. Use 'jpeg:Q' (Q in 1..100) or 'png'."),
    (["--store", "encoded", "--reencode", "jpeg:200"],
     "Invalid --reencode 'jpeg:200': JPEG quality 200 is not in 1..100. Use e.g. 'jpeg:90'."),
    (["--format", "tar", "--shard-bytes", "12XB"],
     "Invalid --shard-bytes '12XB'. Use bytes or a number with kB, MB, GB, KiB, MiB or GiB (e.g. '256MB')."),
    (["--format", "tar", "--shard-bytes", "0"], "Invalid --shard-bytes '0'. Use a positive size such as '256MB'."),
    (["--format", "tar", "--shard-samples", "0"], "Invalid --shard-samples '0'. Use a positive integer."),
    (["--format", "hdf5", "--compression", "gzip:12"],
     "Invalid --compression 'gzip:12': the gzip level must be in 0..9. Use e.g. 'gzip:4'."),
    (["--format", "hdf5", "--compression", "lzf:3"], "Invalid --compression 'lzf:3': lzf takes no level. Use 'lzf'."),
    (["--format", "hdf5", "--chunk-images", "x"], "Invalid --chunk-images 'x'. Use a positive integer."),
    (["--workers", "-1"], "Invalid --workers '-1'. Use 0 or a positive integer."),
    (["--max-pixels", "lots"], "Invalid --max-pixels 'lots'. Use a positive integer."),
]


@pytest.mark.parametrize("flags,message", INVALID, ids=[" ".join(flags) for flags, _ in INVALID])
def test_invalid_values_are_quoted_as_typed(uniform_folder: Path, tmp_path: Path, capsys, flags, message) -> None:
    out = tmp_path / "out"
    assert cli(capsys, "convert", uniform_folder, out, "--quiet", *flags) == (1, "", f"fastdata: error: {message}\n")
    assert not out.exists()


# --- help for every option, readable metavars, a description and runnable examples --------------


def subcommands() -> dict[str, argparse.ArgumentParser]:
    from fastdata.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


def test_every_option_of_every_command_has_help_and_a_readable_metavar() -> None:
    commands = subcommands()
    assert sorted(commands) == ["bench", "convert", "info", "merge", "preview", "tune", "verify"]
    for name, parser in commands.items():
        for action in parser._actions:
            shown = action.option_strings or [action.dest]
            if action.help == argparse.SUPPRESS:  # only deprecated spellings are hidden
                assert isinstance(action, DeprecatedAlias), (name, shown)
                continue
            assert action.help and action.help.strip(), (name, shown)
            if action.nargs == 0 or action.choices is not None:
                continue  # a flag, or shown as its choices
            metavar = action.metavar
            assert metavar is not None, (name, shown)  # never argparse's dest spelled in capitals
            assert "_" not in metavar and not (action.option_strings and metavar == action.dest.upper()), \
                (name, shown, metavar)


def test_defaults_are_shown_once_and_none_or_false_never() -> None:
    for name, parser in subcommands().items():
        formatter = parser._get_formatter()
        for action in (a for a in parser._actions if a.help != argparse.SUPPRESS):
            text = formatter._expand_help(action)
            assert text.count("default") <= 1 and "default: None" not in text and "default: False" not in text, text
    helps = {name: " ".join(parser.format_help().split()) for name, parser in subcommands().items()}
    assert "--batch-size N DataLoader batch_size (default: 256; 128 with --demo, so that its epochs are 24 batches " \
           "long: fewer are too short to time)" in helps["bench"]
    assert "--epochs N measured epochs per configuration (median reported; default: 3, 2 with --demo)" in helps["bench"]
    writable = fastdata.formats.available_formats(writable=True)  # from the registry, whatever it holds
    assert f"--format {'|'.join(writable)} output format: {', '.join(writable)} (default: from OUTPUT's name: " \
           in helps["convert"]
    assert "--store raw|encoded raw: decoded pixels" in helps["convert"] and "read) (default: raw)" in helps["convert"]


def example_lines(parser: argparse.ArgumentParser) -> list[list[str]]:
    lines = parser.epilog.split("Examples:\n", 1)[1].splitlines()
    commands = [line.split("#", 1)[0] for line in lines if line.strip().startswith("fastdata ")]
    return [shlex.split(command)[1:] for command in commands]


@pytest.mark.parametrize("name", ["bench", "convert", "info", "merge", "preview", "tune", "verify"])
def test_every_command_has_a_description_and_examples_that_parse(name: str) -> None:
    from fastdata.cli import build_parser

    parser = subcommands()[name]
    assert parser.description and parser.epilog.startswith("Examples:\n")
    examples = example_lines(parser)
    assert 2 <= len(examples) <= 6 and all(args[0] == name for args in examples)
    for args in examples:
        parsed = build_parser().parse_args(args)  # an example that does not parse exits here
        assert parsed.command == name
    assert "Examples:" in parser.format_help()


def test_the_top_level_examples_parse() -> None:
    from fastdata.cli import build_parser

    parser = build_parser()
    examples = example_lines(parser)
    assert len(examples) == 3
    for args in examples:
        assert build_parser().parse_args(args).command == args[0]


# --- one spelling per meaning; the old ones still work for a release ------------------------------

SPELLINGS = [  # (command, old, new, deprecation warning or "")
    ("bench", ["--workers", "0,2"], ["--num-workers", "0,2"], "fastdata: --workers is deprecated for bench; use "
                                                              "--num-workers\n"),
    ("bench", ["--store", "raw"], ["--stores", "raw"], ""),
    ("bench", ["--format", "npy"], ["--formats", "npy"], ""),
    ("bench", ["--backend", "thread"], ["--backends", "thread"], ""),
    ("tune", ["--backend", "thread"], ["--backends", "thread"], ""),
]


@pytest.mark.parametrize("command,old,new,warning", SPELLINGS, ids=[f"{c} {o[0]}" for c, o, _, _ in SPELLINGS])
def test_old_and_new_spellings_parse_alike(capsys, command: str, old: list[str], new: list[str], warning: str) -> None:
    from fastdata.cli import build_parser

    parsed_new = build_parser().parse_args([command, "src", *new])
    assert capsys.readouterr().err == ""
    parsed_old = build_parser().parse_args([command, "src", *old])
    assert capsys.readouterr().err == warning
    assert vars(parsed_old) == vars(parsed_new)
    assert vars(build_parser().parse_args([command, "src"])) != vars(parsed_new)  # the value did arrive


def test_deprecated_workers_is_hidden_and_the_bench_runs_with_it(tmp_path: Path, capsys) -> None:
    bench_help = subcommands()["bench"].format_help()
    assert "--num-workers LIST" in bench_help and "--workers" not in bench_help
    assert "--stores LIST, --store LIST" in bench_help and "--formats LIST, --format LIST" in bench_help
    code, _, err = cli(capsys, "bench", "torchvision:FakeData", "--source-option", "size=8", "--source-option",
                       "image_size=(3, 6, 5)", "--formats", "npy", "--stores", "raw", "--workers", "x", "--quiet",
                       "--out", tmp_path / "b")
    assert (code, err) == (1, "fastdata: --workers is deprecated for bench; use --num-workers\n"
                              "fastdata: error: Invalid --num-workers 'x'. Use a list like '0,1,2,4' or 'auto'.\n")


def test_an_unknown_bench_store_is_refused_not_skipped(tmp_path: Path, capsys) -> None:
    code, out, err = cli(capsys, "bench", "torchvision:FakeData", "--source-option", "size=8", "--formats", "npy",
                         "--stores", "raw,zip", "--quiet", "--out", tmp_path / "b")
    assert (code, out, err) == (1, "", "fastdata: error: Unknown --stores 'raw,zip'. Allowed: 'raw', 'encoded'.\n")
    assert not (tmp_path / "b").exists()


def test_bench_batch_size_defaults_to_256_and_to_128_for_the_small_demo() -> None:
    from fastdata.cli import build_parser
    from fastdata.cli.bench import batch_size_of

    parser = build_parser()
    assert batch_size_of(parser.parse_args(["bench", "photos"])) == 256
    assert batch_size_of(parser.parse_args(["bench", "--demo"])) == 128  # 3,030 images: 24 batches an epoch
    assert batch_size_of(parser.parse_args(["bench", "--demo", "--batch-size", "64"])) == 64


def test_bench_and_its_demo_measure_fastdatas_backends_beside_the_dataloader() -> None:
    from fastdata.bench import _grid
    from fastdata.bench.runner import Prepared
    from fastdata.cli import build_parser
    from fastdata.cli.bench import DEMO, config_of
    from fastdata.formats import available_formats

    parser = build_parser()
    for argv in (["bench", "--demo"], ["bench", "photos"]):
        config = config_of(parser.parse_args([*argv, "--num-workers", "0,1,2"]), DEMO["resize"])
        assert config.backends == ("torch", "thread", "process")
        demo = argv[1] == "--demo"  # short epochs: persistent workers, so start-up is not what is measured
        assert (config.epochs, config.persistent_workers) == ((2, True) if demo else (3, False))
        assert config.formats == (("folder", "npy", "hdf5") if demo else tuple(available_formats()))
        npy = set(_grid(Prepared("npy", "raw", "npy-raw", 0), config))
        assert npy == {("fast", backend, w) for backend in ("torch", "thread", "process") for w in (1, 2)} | {
            ("fast", "torch", 0), *(("standard", "torch", w) for w in (0, 1, 2))}  # nw=0: one serial loop
        tar = set(_grid(Prepared("tar", "raw", "tar-raw", 0), config))
        assert {backend for _, backend, _ in tar} == {"torch"}  # an iterable reader: the DataLoader only
    from fastdata.cli.bench import demo_workers

    assert config_of(parser.parse_args(["bench", "--demo"]), DEMO["resize"]).workers == demo_workers()
    assert (demo_workers(1), demo_workers(2), demo_workers(3), demo_workers(64)) == ((0, 1), (0, 2), (0, 2), (0, 2, 4))
    assert config_of(parser.parse_args(["bench", "--demo", "--num-workers", "0,1"]), None).workers == (0, 1)
    only = config_of(parser.parse_args(["bench", "photos", "--backends", "torch"]), None)
    assert only.backends == ("torch",)
    assert (DEMO["small"] + DEMO["large"]) // DEMO["batch_size"] >= 20  # MIN_TIMED_BATCHES


def test_the_resume_example_says_what_ctrl_c_leaves() -> None:
    # after a checkpoint, Ctrl-C (and SIGTERM) keep the partial output for --resume, as a crash or
    # SIGKILL does (docs/reliability.md; tests/test_faults.py); HDF5 cannot resume
    epilog = subcommands()["convert"].epilog
    line = next(line for line in epilog.splitlines() if "--resume" in line)
    assert line == ("  fastdata convert ./photos out/photos.npy --resize 64x64 --resume   # go on after Ctrl-C, a crash "
                    "or kill -9, from the last checkpoint (npy, tar)")
