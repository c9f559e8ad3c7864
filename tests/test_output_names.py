"""The output's name picks the format when --format is not given, the same way for the command
line and ``fastdata.convert``; a --format that contradicts the name is refused before anything is
written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fastdata
from fastdata.errors import InvalidOptionError, OutputExistsError
from fastdata.formats import NO_EXTENSION_FORMAT, all_formats, format_for_output, get_format

# every extension a writable format claims (and one in upper case), and a name without one
NAMES = [(f"d{suffix}", spec.name) for spec in all_formats() if spec.writable for suffix in spec.suffixes]
NAMES += [(f"d{spec.suffixes[0].upper()}", spec.name) for spec in all_formats() if spec.writable and spec.suffixes]
NAMES += [("d", NO_EXTENSION_FORMAT)]


def cli(capsys, *args) -> tuple[int, str, str]:
    from fastdata.cli import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name,expected", NAMES)
def test_the_extension_picks_the_format_for_the_cli_and_the_api(uniform_folder: Path, tmp_path: Path, capsys,
                                                                name: str, expected: str) -> None:
    api, command_line = tmp_path / "api" / name, tmp_path / "cli" / name
    assert fastdata.convert(uniform_folder, api, workers=0)["format"] == expected
    code, out, err = cli(capsys, "convert", uniform_folder, command_line, "--workers", "0", "--quiet")
    assert (code, err) == (0, "") and out.startswith(f"wrote 12 samples to {command_line} (")
    for path in (api, command_line):
        assert type(fastdata.open_dataset(path)) is get_format(expected).dataset
        assert path.is_file() == (get_format(expected).read_manifest is not None)  # single-file formats
        code, out, _ = cli(capsys, "info", path, "--json")
        assert code == 0 and json.loads(out)["format"] == expected
    assert format_for_output(api) == expected


MISMATCHES = [
    ("npy", "x.h5", "--format npy does not match the output name {out!r} (.h5 is hdf5). Leave out --format npy "
                    "(format='npy') (or pass --format hdf5 (format='hdf5')) to write hdf5, or name the output "
                    "{renamed!r} to write npy.", "x.npy"),
    ("hdf5", "x.tar", "--format hdf5 does not match the output name {out!r} (.tar is tar). Leave out --format hdf5 "
                      "(format='hdf5') (or pass --format tar (format='tar')) to write tar, or name the output "
                      "{renamed!r} to write hdf5.", "x.h5"),
    ("tar", "x.npy", "--format tar does not match the output name {out!r} (.npy is npy). Leave out --format tar "
                     "(format='tar') (or pass --format npy (format='npy')) to write npy, or name the output "
                     "{renamed!r} to write tar.", "x.tar"),
    ("npy", "x.hdf5", "--format npy does not match the output name {out!r} (.hdf5 is hdf5). Leave out --format npy "
                      "(format='npy') (or pass --format hdf5 (format='hdf5')) to write hdf5, or name the output "
                      "{renamed!r} to write npy.", "x.npy"),
    ("hdf5", "x.NPY", "--format hdf5 does not match the output name {out!r} (.NPY is npy). Leave out --format hdf5 "
                      "(format='hdf5') (or pass --format npy (format='npy')) to write npy, or name the output "
                      "{renamed!r} to write hdf5.", "x.h5"),
]


@pytest.mark.parametrize("fmt,name,message,renamed", MISMATCHES, ids=[m[1] + "-" + m[0] for m in MISMATCHES])
@pytest.mark.parametrize("flags", [[], ["--overwrite"], ["--resume"]], ids=["new", "overwrite", "resume"])
def test_a_format_that_contradicts_the_extension_is_refused(uniform_folder: Path, tmp_path: Path, capsys, fmt: str,
                                                            name: str, message: str, renamed: str, flags) -> None:
    out = tmp_path / "out" / name
    expected = message.format(out=str(out), renamed=str(out.with_name(renamed)))
    code, stdout, err = cli(capsys, "convert", uniform_folder, out, "--format", fmt, "--quiet", *flags)
    assert (code, stdout, err) == (1, "", f"fastdata: error: {expected}\n")
    with pytest.raises(InvalidOptionError) as info:
        fastdata.convert(uniform_folder, out, format=fmt, workers=0, overwrite="--overwrite" in flags,
                         resume="--resume" in flags)
    assert str(info.value) == expected
    assert not (tmp_path / "out").exists()


def test_an_unknown_extension_needs_format(uniform_folder: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "cifar.v2"
    expected = (f"Cannot tell the output format from the name {str(out)!r}: no format uses '.v2' (known: .h5, "
                ".hdf5, .npy, .tar; no extension is tar). Pass --format NAME (format='NAME') (hdf5, npy, tar), or rename the output.")
    assert cli(capsys, "convert", uniform_folder, out, "--quiet") == (1, "", f"fastdata: error: {expected}\n")
    with pytest.raises(InvalidOptionError) as info:
        fastdata.convert(uniform_folder, out, workers=0)
    assert str(info.value) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["uniform"]
    code, _, err = cli(capsys, "convert", uniform_folder, out, "--format", "hdf5", "--workers", "0", "--quiet")
    assert (code, err) == (0, "") and fastdata.open_dataset(out).manifest["format"] == "hdf5"


def test_an_explicit_format_without_an_extension_is_kept_and_resume_names_the_format(
        uniform_folder: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "digits"
    assert fastdata.convert(uniform_folder, out, format="npy", workers=0)["format"] == "npy"
    with pytest.raises(OutputExistsError) as info:  # without --format, "digits" means tar
        fastdata.convert(uniform_folder, out, workers=0, resume=True)
    assert str(info.value) == (
        f"Output {str(out)!r} is a npy dataset, but this conversion writes tar (from --format or the output's "
        "name); --resume does not replace it. Pass --format npy (format='npy') to resume it, or --overwrite (overwrite=True) to convert again."
    )
    code, stdout, _ = cli(capsys, "convert", uniform_folder, out, "--format", "npy", "--resume", "--quiet")
    assert code == 0 and stdout.startswith(f"{out} is already complete (12 samples")
    assert fastdata.convert(uniform_folder, out, workers=0, overwrite=True)["format"] == "tar"


def test_options_given_before_the_format_is_known_are_checked_by_it(uniform_folder: Path, tmp_path: Path) -> None:
    manifest = fastdata.convert(uniform_folder, tmp_path / "x.h5", compression="lzf", workers=0)
    assert manifest["format"] == "hdf5" and manifest["options"]["format_options"]["compression"] == "lzf"
    with pytest.raises(InvalidOptionError) as info:
        fastdata.convert(uniform_folder, tmp_path / "x.npy", compression="lzf", workers=0)
    assert str(info.value) == "Option 'compression' does not apply to format 'npy'. Its options: none."
