"""Each extra installs what its feature imports, and a missing one is one clear error up front.

The import check reads every module of the package (no import needed); the feature checks run
each extra's feature in a fresh interpreter where every *other* optional module is unimportable,
as in a venv that installed that extra alone (``sys.modules[name] = None`` makes ``import name``
raise ImportError, which is what a missing package does).
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

import fastdata
from conftest import run_fastdata, save
from fastdata.bench.demo import demo_image
from fastdata.errors import DependencyMissingError
from fastdata.extras import DISTRIBUTION, EXTRAS, install_command, require

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# what a requirement installs, where its import name differs from its distribution name
IMPORT_NAMES = {"pillow": "PIL"}
OPTIONAL = sorted({module for modules in EXTRAS.values() for module in modules})
# extras that install tools for working on fastdata, not a feature of it (so not in EXTRAS)
TOOLING_EXTRAS = {"test", "dev", "docs", "lint"}


def requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()


def imported_modules() -> dict[str, list[tuple[str, int, bool]]]:
    """Top-level module -> (file, line, at module level) of every import in the package."""
    found: dict[str, list[tuple[str, int, bool]]] = {}
    for path in sorted((ROOT / "fastdata").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], []).append(
                    (str(path.relative_to(ROOT)), node.lineno, id(node) in top_level))
    return found


def test_the_distribution_name_is_the_one_the_code_names() -> None:
    assert PYPROJECT["name"] == DISTRIBUTION == "torch-fastdata"
    assert PYPROJECT["scripts"] == {"fastdata": "fastdata.cli:main"}
    readme = (ROOT / "README.md").read_text()
    assert f"pip install {DISTRIBUTION}" in readme or f'"{DISTRIBUTION}[' in readme or f"'{DISTRIBUTION}[" in readme


def installs(requirements: list[str]) -> set[str]:
    """The modules a list of requirements installs."""
    return {IMPORT_NAMES.get(name, name) for name in map(requirement_name, requirements)}


def test_every_extra_in_pyproject_is_in_the_extras_table_with_the_same_requirements_and_vice_versa() -> None:
    declared = {extra: installs(requirements) for extra, requirements in PYPROJECT["optional-dependencies"].items()
                if extra not in TOOLING_EXTRAS}
    assert declared == {extra: set(modules) for extra, modules in EXTRAS.items()}


def test_the_test_extra_installs_every_optional_module_the_tests_run() -> None:
    tested = installs(PYPROJECT["optional-dependencies"]["test"])
    assert sorted(set(OPTIONAL) - tested) == []


def test_every_import_is_the_standard_library_a_dependency_or_an_extra_imported_where_used() -> None:
    runtime = {IMPORT_NAMES.get(name, name) for name in map(requirement_name, PYPROJECT["dependencies"])}
    imports = imported_modules()
    unknown = {name: places[0] for name, places in imports.items()
               if name not in sys.stdlib_module_names and name != "fastdata" and name not in runtime
               and name not in OPTIONAL}
    assert unknown == {}, "imported but installed by neither the dependencies nor an extra"
    at_module_level = {name: [place for place in imports.get(name, []) if place[2]] for name in OPTIONAL}
    assert {name: places for name, places in at_module_level.items() if places} == {}, \
        "an optional module imported when fastdata is imported"
    unused = sorted(name for name in runtime if name not in imports)
    assert unused == [], "a runtime dependency that nothing imports is not a dependency"


def test_require_names_the_module_and_the_install_command(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "simplejpeg", None)
    with pytest.raises(DependencyMissingError, match=re.escape(
            "decoder='fast' needs the simplejpeg package, which is not installed. Install it with: "
            "pip install 'torch-fastdata[jpeg]' or, in a checkout of fastdata, pip install '.[jpeg]'")) as caught:
        require("simplejpeg", extra="jpeg", feature="decoder='fast'")
    assert isinstance(caught.value, ImportError)
    # the index's name and, until it is published there, the command that works in a checkout
    assert install_command("ray") == "pip install 'torch-fastdata[ray]' or, in a checkout of fastdata, pip install '.[ray]'"
    with pytest.raises(ValueError, match="Unknown extra 'jpg'"):
        install_command("jpg")


def run_without(blocked: list[str], code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter in which the modules ``blocked`` cannot be imported."""
    script = f"import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n" + code
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)


def refusal(blocked: list[str], statement: str) -> str:
    """What ``statement`` (a call of fastdata's) prints, ``refused: <message>``, when it raises
    DependencyMissingError in a fresh interpreter without the modules ``blocked``."""
    result = run_without(blocked, (
        "import fastdata\n"
        "from fastdata.errors import DependencyMissingError\n"
        "try:\n"
        f"    {statement}\n"
        "except DependencyMissingError as exc:\n"
        "    print('refused:', exc)\n"))
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def encoded_jpegs(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    root = tmp_path / "photos"
    for i in range(6):
        save(demo_image(rng, 70 + i, 90, i % 2), root / f"c{i % 2}" / f"{i}.jpg", quality=90)
    out = tmp_path / "jpegs.npy"
    fastdata.convert(root, out, store="encoded", workers=0)
    return out


def test_the_jpeg_extra_alone_runs_the_fast_decoder(encoded_jpegs: Path) -> None:
    others = [module for module in OPTIONAL if module != "simplejpeg"]
    result = run_without(others, (
        "import fastdata, json\n"
        f"ds = fastdata.open_dataset({str(encoded_jpegs)!r}, resize=32, center_crop=32, decoder='fast')\n"
        "images, labels = ds[[0, 1, 2, 3, 4, 5]]\n"
        "print(json.dumps([list(images.shape), labels.tolist()]))\n"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [[6, 3, 32, 32], [0, 0, 0, 1, 1, 1]]


def test_without_the_jpeg_extra_the_fast_decoder_is_refused_when_the_dataset_is_opened(encoded_jpegs: Path) -> None:
    refused = refusal(["simplejpeg"], f"fastdata.open_dataset({str(encoded_jpegs)!r}, resize=32, decoder='fast')")
    assert refused == ("refused: decoder='fast' needs the simplejpeg package, which is not installed. "
                             "Install it with: pip install 'torch-fastdata[jpeg]' or, in a checkout of fastdata, "
                             "pip install '.[jpeg]'\n")


def test_the_torchvision_extra_alone_converts_a_torchvision_dataset(tmp_path: Path) -> None:
    others = [module for module in OPTIONAL if module != "torchvision"]
    out = tmp_path / "fake.npy"
    result = run_without(others, (
        "import fastdata\n"
        f"fastdata.convert('torchvision:FakeData', {str(out)!r}, workers=0,\n"
        "                 source_options={'size': 5, 'image_size': (3, 8, 8)})\n"
        f"print(len(fastdata.open_dataset({str(out)!r})))\n"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "5\n"


def test_a_torchvision_source_without_torchvision_is_one_error_naming_the_extra(tmp_path: Path) -> None:
    out = tmp_path / "fake.npy"
    refused = refusal(["torchvision"], f"fastdata.convert('torchvision:FakeData', {str(out)!r}, workers=0)")
    assert refused == ("refused: A torchvision source needs the torchvision package, which is not installed. "
                             "Install it with: pip install 'torch-fastdata[torchvision]' or, in a checkout of "
                             "fastdata, pip install '.[torchvision]'\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_hdf5plugin_extra_alone_compresses_with_zstd(encoded_jpegs: Path, tmp_path: Path) -> None:
    others = [module for module in OPTIONAL if module != "hdf5plugin"]
    out = tmp_path / "z.h5"
    result = run_without(others, (
        "import fastdata\n"
        f"fastdata.convert({str(encoded_jpegs)!r}, {str(out)!r}, workers=0, store='raw', resize='16x16',\n"
        "                 compression='zstd')\n"
        f"print(len(fastdata.open_dataset({str(out)!r})))\n"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "6\n"


def test_the_plot_extra_alone_draws_the_bench_figure() -> None:
    others = [module for module in OPTIONAL if module != "matplotlib"]
    rows = [{"format": "npy", "store": "raw", "path": "fast", "num_workers": workers, "epoch": epoch,
             "warmup": epoch == 0, "samples_per_s": speed, "first_batch_s": 0.1, "wait_fraction": 1.0, "cpu_s": 1.0,
             "uss_mb": 10.0, "status": "ok", "batch_size": 8}
            for workers, speed in ((0, 100.0), (1, 80.0)) for epoch in range(2)]
    result = run_without(others, (
        "from fastdata.bench.plot import figure\n"
        f"print(type(figure({rows!r})).__name__)\n"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Figure\n"


# --- torch and torchvision installed apart: torchvision's compiled operators do not load ----------


@pytest.fixture
def unpaired_torchvision(tmp_path: Path) -> dict[str, str]:
    """A torchvision 0.24.0 (the release for torch 2.9) in front of the real one, whose import fails
    as an unpaired torchvision's does (its operator registrations find no compiled operators):
    the environment for a fastdata subprocess, and the line fastdata says about it."""
    site = tmp_path / "site"
    (site / "torchvision").mkdir(parents=True)
    (site / "torchvision" / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n')
    (site / "torchvision-0.24.0.dist-info").mkdir()
    (site / "torchvision-0.24.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torchvision\nVersion: 0.24.0\n")
    torch_version = importlib.metadata.version("torch")
    paired = f"0.{int(torch_version.split('.')[1]) + 15}.{re.match(r'[0-9]+', torch_version.split('.')[2]).group()}"
    line = (f"torchvision 0.24.0 does not work with torch {torch_version}: its compiled operators do not load "
            "(operator torchvision::nms does not exist). Install the two built together, from the same index (CPU "
            f"or the same CUDA): pip install torch=={torch_version.split('+')[0]} torchvision=={paired} (torch 2.M "
            "goes with torchvision 0.(M+15)).")
    return {"PYTHONPATH": str(site), "line": line}


def test_an_unpaired_torchvision_is_named_once_at_start_with_the_pair_to_install(unpaired_torchvision, tmp_path,
                                                                                 uniform_folder):
    env = {"PYTHONPATH": unpaired_torchvision["PYTHONPATH"]}
    line = unpaired_torchvision["line"]
    until = (" Until then, what uses torchvision fails (torchvision: sources, bench --resize/--transform, fields "
             "such as boxes and masks).")
    converted = run_fastdata("convert", uniform_folder, tmp_path / "u.npy", "--workers", "0", "--quiet", env=env)
    assert (converted.returncode, converted.stderr) == (0, f"fastdata: {line}{until}\n")  # a folder needs no torchvision
    source = run_fastdata("convert", "torchvision:FakeData", tmp_path / "f.npy", "--quiet", env=env)
    assert (source.returncode, source.stdout) == (1, "")
    assert source.stderr == (f"fastdata: {line}{until}\n"
                             f"fastdata: error: A torchvision source needs torchvision, but {line}\n")
    bench = run_fastdata("bench", uniform_folder, "--resize", "8x8", "--out", tmp_path / "b", env=env)
    assert (bench.returncode, bench.stdout) == (1, "")
    assert bench.stderr == (f"fastdata: {line}{until}\n"
                            f"fastdata: error: bench --resize/--transform needs torchvision, but {line}\n")
    assert not (tmp_path / "b").exists()  # no configuration ran


def test_require_names_an_unpaired_torchvision_from_python(unpaired_torchvision, tmp_path):
    statement = ("import fastdata\n"
                 "try:\n"
                 f"    fastdata.convert('torchvision:FakeData', {str(tmp_path / 'f.npy')!r}, workers=0)\n"
                 "except Exception as exc:\n"
                 "    print(type(exc).__name__, isinstance(exc, fastdata.FastdataError) and isinstance(exc, ImportError), exc)\n")
    result = subprocess.run([sys.executable, "-c", statement], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([unpaired_torchvision["PYTHONPATH"],
                                                                              str(ROOT)])})
    assert result.returncode == 0, result.stderr
    assert result.stdout == ("DependencyMismatchError True A torchvision source needs torchvision, but "
                             f"{unpaired_torchvision['line']}\n")
