"""The command line: exit codes, output and error messages (run as a real subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from conftest import run_fastdata


def test_convert_then_info(uniform_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "u.npy"
    result = run_fastdata("convert", uniform_folder, out, "--format", "npy", "--resize", "6x5", "--workers", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote 12 samples to {out} (")
    assert np.load(out / "images.npy").shape == (12, 6, 5, 3)
    info = run_fastdata("info", out)
    assert info.returncode == 0
    lines = dict(line.split(":", 1) for line in info.stdout.splitlines())
    assert lines["format"].strip() == "npy (layout 1), store raw"
    assert lines["samples"].strip() == "12"
    assert lines["image"].strip() == "6x5x3 uint8, mode RGB"
    assert lines["classes"].strip() == "3: ant, bee, cow"
    as_json = json.loads(run_fastdata("info", out, "--json").stdout)
    assert as_json["count"] == 12 and as_json["size_bytes"] == sum(f.stat().st_size for f in out.iterdir())


FIELDS_SOURCE = """
import numpy as np
from PIL import Image

class Points:
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return {"image": Image.fromarray(np.full((8, 8, 3), index, np.uint8)), "points": np.zeros((3, 2), np.float32)}

dataset = Points()
"""


def test_info_shows_no_internal_placeholders(tmp_path: Path) -> None:
    """A dataset without class labels says so (not 'classes: 0'); a mode the manifest does not
    record is left out (not 'mode None')."""
    from fastdata.cli.inspect import describe
    from fastdata.formats import require_manifest

    (tmp_path / "points.py").write_text(FIELDS_SOURCE)
    out = tmp_path / "p.npy"
    converted = run_fastdata("convert", "points:dataset", out, "--store", "encoded", "--quiet", cwd=tmp_path,
                             env={"PYTHONPATH": str(tmp_path)})
    assert converted.returncode == 0, converted.stderr
    lines = run_fastdata("info", out).stdout.splitlines()
    assert "classes:  none (no class labels)" in lines and "image:    encoded (png), mode RGB" in lines
    assert "            image: image png, mode RGB" in lines
    manifest = require_manifest(out)
    manifest["image"]["mode"] = None
    manifest["fields"]["fields"][0]["mode"] = None
    shown = describe(out, manifest).splitlines()
    assert "image:    encoded (png)" in shown and "            image: image png" in shown
    assert not [line for line in shown if "None" in line]


def test_errors_are_one_line_without_traceback(uniform_folder: Path, tmp_path: Path) -> None:
    cases = [
        (["convert", tmp_path / "missing", tmp_path / "o.npy"], "does not exist"),
        (["convert", uniform_folder, tmp_path / "o.npy", "--format", "hfd5"], "Unknown output format 'hfd5'|Unknown format 'hfd5'"),
        (["convert", uniform_folder, tmp_path / "o.npy", "--store", "zip"], "Unknown store 'zip'"),
        (["info", uniform_folder], "is not a dataset written by 'fastdata convert'"),
        (["info", tmp_path / "nothing"], "does not exist"),
    ]
    for args, message in cases:
        result = run_fastdata(*args)
        assert result.returncode == 1, (args, result.stderr)
        assert result.stderr.startswith("fastdata: error: ") and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert any(m in result.stderr for m in message.split("|")), result.stderr


def test_existing_output_and_bad_image(uniform_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "u.npy"
    assert run_fastdata("convert", uniform_folder, out, "--quiet").returncode == 0
    again = run_fastdata("convert", uniform_folder, out, "--quiet")
    assert again.returncode == 1 and "already exists. Pass --overwrite (overwrite=True) to replace it." in again.stderr
    (uniform_folder / "ant" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    bad = run_fastdata("convert", uniform_folder, tmp_path / "b.npy", "--quiet")
    assert bad.returncode == 1 and "ant/broken.png: cannot read image" in bad.stderr
    assert not (tmp_path / "b.npy").exists()
    skipped = run_fastdata("convert", uniform_folder, tmp_path / "b.npy", "--quiet", "--skip-bad")
    assert skipped.returncode == 0 and "wrote 12 samples" in skipped.stdout
    assert "skipped 1: ant/broken.png (" in skipped.stdout


def test_torchvision_fakedata_from_the_cli(tmp_path: Path) -> None:
    result = run_fastdata(
        "convert", "torchvision:FakeData", tmp_path / "f.npy", "--source-option", "size=9",
        "--source-option", "image_size=(3, 8, 8)", "--store", "encoded", "--quiet",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "f.npy" / "manifest.json").read_text())["image"]["encoding"] == "png"


def test_version_and_help() -> None:
    assert run_fastdata("--version").stdout.startswith("fastdata ")
    help_text = run_fastdata("convert", "--help").stdout
    assert "--skip-bad" in help_text and "--resize" in help_text


def test_max_side_and_reencode_store_small_jpegs_and_info_shows_their_sizes(tmp_path: Path) -> None:
    from PIL import Image

    source = tmp_path / "photos"
    (source / "a").mkdir(parents=True)
    sizes = [(300, 500), (600, 200), (100, 80), (256, 256)]  # (H, W); the last two are not resized
    for index, (height, width) in enumerate(sizes):
        pixels = np.random.default_rng(index).integers(0, 256, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(source / "a" / f"{index}.jpg", quality=95)
    out = tmp_path / "small.npy"
    result = run_fastdata("convert", source, out, "--store", "encoded", "--max-side", "256", "--reencode", "jpeg:80",
                      "--workers", "0", "--quiet")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["max_side"] == 256 and manifest["options"]["reencode"] == ["jpeg", 80]
    assert manifest["image"]["encoding"] == "jpeg"
    import fastdata as library

    dataset = library.open_dataset(out)
    assert [tuple(dataset[i][0].shape[1:]) for i in range(4)] == [(154, 256), (256, 85), (100, 80), (256, 256)]
    blobs = np.diff(np.load(out / "offsets.npy"))
    info = run_fastdata("info", out)
    lines = dict(line.split(":", 1) for line in info.stdout.splitlines())
    assert lines["image"].strip() == "encoded (jpeg quality 80, longest side at most 256), mode RGB"
    kb = [f"{value / 1000:.1f} kB" for value in (blobs.min(), np.median(blobs), blobs.max())]
    assert lines["stored"].strip() == (f"width 80/170/256, height 100/205/256, bytes {kb[0]}/{kb[1]}/{kb[2]} "
                                       "(min/median/max; sizes from every header)")
    stored = json.loads(run_fastdata("info", out, "--json").stdout)["stored_sizes"]
    assert stored == {"width": [80, 170, 256], "height": [100, 205, 256],
                      "bytes": [int(blobs.min()), int(np.median(blobs)), int(blobs.max())], "headers_read": 4}


def test_max_side_must_be_a_positive_integer(uniform_folder: Path, tmp_path: Path) -> None:
    result = run_fastdata("convert", uniform_folder, tmp_path / "o.npy", "--max-side", "0")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip() == "fastdata: error: Invalid --max-side '0'. Use a positive integer."
    assert not (tmp_path / "o.npy").exists()


def test_max_side_geometry_caps_the_longest_side_after_resize_and_crop() -> None:
    from PIL import Image

    from fastdata.images import Geometry

    cap = Geometry(max_side=256)
    assert [cap.output_size(w, h) for w, h in [(500, 300), (200, 600), (80, 100), (256, 256), (2000, 3)]] == \
        [(256, 154), (85, 256), (80, 100), (256, 256), (256, 1)]
    assert cap.apply(Image.new("RGB", (500, 300))).size == (256, 154)
    small = Image.new("RGB", (80, 100))
    assert cap.apply(small) is small  # not resized at all
    assert Geometry(resize=(300, 600), max_side=200).fixed_size == (100, 200)
    assert Geometry(resize=(300,), center_crop=(224, 224), max_side=512).fixed_size == (224, 224)
    assert Geometry(max_side=512).describe() == {"resize": None, "center_crop": None, "max_side": 512}


LIGHT = """
import sys
from fastdata.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:  # --version and --help exit from argparse
    code = exc.code
print("heavy:", sorted(name for name in ("torch", "torchvision") if name in sys.modules), "exit:", code)
"""


def test_version_help_and_info_start_without_torch(tmp_path: Path, uniform_folder: Path) -> None:
    """torch takes seconds to import: only commands that read samples load it."""
    import fastdata as library

    paths = [tmp_path / name for name in ("u.npy", "u.h5", "u-tar")]
    for path in paths:
        library.convert(uniform_folder, path, resize="6x5", workers=0)
    commands = [["--version"], ["--help"], ["info", "--help"], ["bench", "--help"],
                *(["info", str(path)] for path in paths), ["info", str(paths[1]), "--json"]]
    for args in commands:
        result = subprocess.run([sys.executable, "-c", LIGHT, *args], capture_output=True, text=True, timeout=120)
        assert result.stdout.splitlines()[-1] == "heavy: [] exit: 0", (args, result.stdout[-300:], result.stderr)
    heavy = subprocess.run([sys.executable, "-c", LIGHT, "verify", str(paths[0])], capture_output=True, text=True,
                           timeout=120)  # verify opens the reader (counts, labels): the one check that it can
    assert heavy.stdout.splitlines()[-1] == "heavy: ['torch'] exit: 0", heavy.stderr
