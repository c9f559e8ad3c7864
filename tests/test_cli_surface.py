"""The command line's surface: messages that quote what was typed, help for every option, examples
that parse, and deprecated spellings that still work (run in this process through ``main``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastdata.cli import main


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
