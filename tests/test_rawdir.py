"""A format that is not fastdata's: ``rawdir`` (tests/plugins/fastdata_rawdir), installed the way
pip installs a third-party package (its code and a ``.dist-info`` with a ``fastdata.formats``
entry point on the path), keeps the whole contract and works from the command line; a plugin
whose dependency is missing is listed with its install command instead of breaking fastdata."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

import fastdata
from fastdata.errors import DependencyMissingError
from conftest import run_fastdata
from fastdata.testing import FormatContract

PLUGINS = Path(__file__).parent / "plugins"
ENTRY_POINTS = "[fastdata.formats]\nrawdir = fastdata_rawdir\nabsent = fastdata_absent\n"
ABSENT = "Format 'absent' needs the 'fastdata_test_module_that_is_not_installed' package: pip install fastdata-absent-backend"


def write_dist_info(site: Path) -> Path:
    """What ``pip install`` leaves for the plugin: its metadata and entry points."""
    info = site / "fastdata_test_plugins-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fastdata-test-plugins\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return site


@contextlib.contextmanager
def installed() -> Iterator[Path]:
    """The plugins on sys.path and found by :func:`fastdata.formats.discover`, for the block only."""
    with tempfile.TemporaryDirectory() as site, fastdata.formats.restored():
        paths = [str(write_dist_info(Path(site))), str(PLUGINS)]
        sys.path[:0] = paths
        try:
            fastdata.formats.discover()
            yield Path(site)
        finally:
            del sys.path[:2]
            for name in ("fastdata_rawdir", "fastdata_absent"):
                sys.modules.pop(name, None)


with installed():  # the contract class is made while the format is known (as for fastdata's own)
    class TestRawdirContract(FormatContract):
        format = "rawdir"

        def damage(self, out: Path) -> str:
            sample = out / "000003.npy" if (out / "000003.npy").exists() else out / "000003.bin"
            sample.write_bytes(sample.read_bytes()[:-7])
            return "000003.* is .* bytes but the manifest says"


@pytest.fixture(autouse=True, scope="module")
def plugins() -> Iterator[Path]:
    with installed() as site:
        yield site


def test_the_plugin_is_found_through_its_entry_point_and_the_missing_one_is_listed() -> None:
    assert "rawdir" in fastdata.formats.available_formats(writable=True)
    assert "absent" not in fastdata.formats.available_formats()
    missing = fastdata.formats.missing_formats()
    assert [(m.name, m.install, m.suffixes) for m in missing] == [("absent", "pip install fastdata-absent-backend",
                                                                  (".absent",))]
    with pytest.raises(DependencyMissingError) as info:
        fastdata.formats.get_format("absent")
    assert str(info.value) == ABSENT
    with pytest.raises(DependencyMissingError) as info:
        fastdata.formats.format_for_output("out/x.absent")
    assert str(info.value) == f"{ABSENT} ('out/x.absent' is named for it)."
    assert fastdata.formats.format_for_output("out/x.rawdir") == "rawdir"


def test_the_registry_is_restored_after_the_plugin_is_gone() -> None:
    with fastdata.formats.restored():
        pass
    assert "rawdir" in fastdata.formats.available_formats()


def fastdata_cli(site: Path, *args: object) -> subprocess.CompletedProcess:
    """The command line in a fresh process that finds the plugins the way an installed one is found."""
    return run_fastdata(*args, env={"PYTHONPATH": os.pathsep.join([str(site), str(PLUGINS)])}, timeout=300)


def test_convert_info_verify_on_the_command_line(plugins: Path, uniform_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "photos.rawdir"
    converted = fastdata_cli(plugins, "convert", uniform_folder, out, "--workers", "0", "--quiet")
    assert (converted.returncode, converted.stderr) == (0, ""), converted.stderr
    assert sorted(p.name for p in out.iterdir())[:2] == ["000000.npy", "000001.npy"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["format"], manifest["count"], manifest["store"]) == ("rawdir", 12, "raw")
    info = fastdata_cli(plugins, "info", out, "--json")
    assert info.returncode == 0 and json.loads(info.stdout)["format"] == "rawdir"
    verified = fastdata_cli(plugins, "verify", out)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    pixels = np.load(out / "000005.npy")
    pixels[0, 0, 0] ^= 1
    np.save(out / "000005.npy", pixels)
    damaged = fastdata_cli(plugins, "verify", out)
    assert damaged.returncode != 0 and "000005.npy" in damaged.stdout + damaged.stderr
    assert "Traceback" not in damaged.stderr


def test_info_shows_the_stored_sizes_the_plugins_reader_gives(plugins: Path, uniform_folder: Path,
                                                                tmp_path: Path) -> None:
    """``fastdata info`` asks the format's reader for its sizes (``encoded_sizes``, ``_encoded``):
    a third-party format shows them as fastdata's own formats do."""
    out = tmp_path / "photos.rawdir"
    fastdata.convert(uniform_folder, out, store="encoded", workers=0)
    blobs = [len((out / f"{index:06d}.bin").read_bytes()) for index in range(12)]
    info = fastdata_cli(plugins, "info", out, "--json")
    assert info.returncode == 0, info.stderr
    from PIL import Image

    with Image.open(out / "000000.bin") as image:
        width, height = image.size  # every image of uniform_folder has one size
    assert json.loads(info.stdout)["stored_sizes"] == {
        "width": [width] * 3, "height": [height] * 3, "bytes": [min(blobs), int(np.median(blobs)), max(blobs)],
        "headers_read": 12}


def test_a_format_whose_dependency_is_missing_is_listed_with_its_install_command(plugins: Path, uniform_folder: Path,
                                                                                 tmp_path: Path) -> None:
    helped = fastdata_cli(plugins, "convert", "--help")
    assert helped.returncode == 0
    assert "not installed: absent (pip install fastdata-absent-backend)" in " ".join(helped.stdout.split())
    refused = fastdata_cli(plugins, "convert", uniform_folder, tmp_path / "x", "--format", "absent", "--quiet")
    assert (refused.returncode, refused.stdout, refused.stderr) == (1, "", f"fastdata: error: {ABSENT}\n")
    assert not (tmp_path / "x").exists()


def test_a_broken_plugin_is_left_out_with_a_warning(tmp_path: Path) -> None:
    info = tmp_path / "broken_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fastdata.formats]\nbroken = fastdata_no_such_plugin_module\n")
    with fastdata.formats.restored():
        sys.path.insert(0, str(tmp_path))
        try:
            with pytest.warns(RuntimeWarning, match="The format plugin entry point broken = "
                                                    "fastdata_no_such_plugin_module failed to load"):
                fastdata.formats.discover()
            assert "broken" not in fastdata.formats.available_formats() and "npy" in fastdata.formats.available_formats()
        finally:
            sys.path.remove(str(tmp_path))
