"""The registry and the shape of the package: every format keeps the contract of
fastdata.testing, the registry describes what callers need, and the public names import
without traps."""

from __future__ import annotations

import importlib
import io
import json
import pkgutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata.errors import InvalidOptionError
from fastdata.formats import FormatSpec, available_formats, get_format, registered
from fastdata.formats.npy import MemmapDataset, MemmapWriter
from fastdata.formats.npyfile import npy_header
from fastdata.conversion.options import ConvertOptions
from fastdata.conversion.plan import decide_options
from conftest import WRITABLE_FORMATS
import fastdata.testing
from fastdata.testing import CONTRACTS

@pytest.mark.parametrize("name", WRITABLE_FORMATS)
def test_every_writable_format_has_a_contract_test_file(name: str) -> None:
    """Adding a format means one package plus tests/test_<name>.py with a FormatContract subclass."""
    importlib.import_module(f"test_{name}")
    assert name in CONTRACTS, f"tests/test_{name}.py defines no FormatContract subclass with format = {name!r}"


def test_registry_describes_what_callers_need() -> None:
    tar, npy, folder = get_format("tar"), get_format("npy"), get_format("folder")
    assert tar.iterable and tar.self_batching and tar.map_dataset is fastdata.TarIndexedDataset
    assert not npy.iterable and npy.map_dataset is MemmapDataset and not npy.baseline
    assert folder.baseline and not folder.writable and folder.map_dataset is fastdata.FolderDataset


def test_every_package_under_formats_is_discovered() -> None:
    """No list of formats anywhere: each package under fastdata/formats/ registers itself (or
    declares its missing dependency) when discovered."""
    packages = {module.name for module in pkgutil.iter_modules(fastdata.formats.__path__) if module.ispkg}
    found = set(available_formats()) | {missing.name for missing in fastdata.formats.missing_formats()}
    assert packages == found and {"folder", "hdf5", "npy", "tar"} <= packages


def test_registry_refuses_a_taken_name_and_registered_restores_it() -> None:
    imposter = FormatSpec(name="npy", dataset=MemmapDataset, writer=None)
    with pytest.raises(InvalidOptionError, match=r"^Format 'npy' is already registered \(reader MemmapDataset\)"):
        fastdata.formats.register(imposter)
    original = get_format("npy")
    with registered(imposter):
        assert get_format("npy") is imposter
    assert get_format("npy") is original
    extra = FormatSpec(name="scratch", dataset=MemmapDataset, writer=MemmapWriter, stores=("raw",))
    with registered(extra):
        assert "scratch" in available_formats(writable=True)
    assert "scratch" not in available_formats()


def test_loader_refuses_an_iterable_reader_naming_the_map_style_one(uniform_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "shards"
    fastdata.convert(uniform_folder, out, format="tar", workers=0)
    with pytest.raises(InvalidOptionError) as info:
        fastdata.loader(fastdata.open_dataset(out), batch_size=4)
    assert str(info.value) == (
        "fastdata.loader needs a map-style dataset (random access by index), but got the iterable TarDataset. "
        f"Use fastdata.TarIndexedDataset({str(out)!r}) for the same data, map-style. Or iterate it with a plain "
        "DataLoader."
    )
    images, labels = next(iter(fastdata.loader(fastdata.TarIndexedDataset(out), batch_size=4, shuffle=False)))
    assert images.shape == (4, 3, 12, 10) and labels.tolist() == [0, 0, 0, 0]


def test_public_names_import_without_traps() -> None:
    import fastdata.conversion
    import fastdata.loading as loading_module
    import fastdata.verification

    assert callable(fastdata.loader) and fastdata.loader is loading_module.loader
    assert fastdata.convert is fastdata.conversion.convert and fastdata.verify is fastdata.verification.verify
    assert type(loading_module).__name__ == "module"
    with mock.patch("fastdata.loading.TorchLoader") as patched:
        fastdata.loader(torch.utils.data.TensorDataset(torch.zeros(4)), batch_size=2)
    assert patched.called
    built = fastdata.loader(torch.utils.data.TensorDataset(torch.zeros(4)), batch_size=2)
    assert isinstance(built, torch.utils.data.DataLoader) and type(built).__name__ == "TorchLoader"
    assert fastdata.__version__ == importlib.import_module("fastdata._version").__version__
    assert fastdata.BatchIndexSampler is importlib.import_module("fastdata.loading.samplers").BatchIndexSampler
    for name in fastdata.__all__:
        assert getattr(fastdata, name) is not None
    with pytest.raises(AttributeError, match="module 'fastdata' has no attribute 'nothing_here'"):
        fastdata.nothing_here


def test_import_fastdata_is_light() -> None:
    """The CLI answers Ctrl-C before torch loads: the package root imports nothing heavy."""
    code = "import sys, fastdata, fastdata.cli; print(sorted(m for m in ('torch', 'numpy', 'h5py', 'PIL') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


def test_the_contract_ships_in_the_package_and_only_it_imports_pytest() -> None:
    """A format package imports the contract from fastdata.testing; using fastdata (converting,
    loading, reading) never imports pytest, and without pytest fastdata.testing is one error
    that names the install command."""
    code = ("import sys, fastdata, fastdata.formats, fastdata.conversion, fastdata.loading, fastdata.api, "
            "fastdata.verification, fastdata.cli\n"
            "print('pytest' in sys.modules)\n"
            "sys.modules['pytest'] = None\n"
            "try:\n    import fastdata.testing\nexcept fastdata.errors.DependencyMissingError as exc:\n    print(exc)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.splitlines() == [
        "False",
        "fastdata.testing (the format contract suite) needs the pytest package, which is not installed. Install it "
        "with: pip install 'torch-fastdata[testing]' or, in a checkout of fastdata, pip install '.[testing]'"], \
        result.stderr
    npy_contract = importlib.import_module("test_npy").TestNpyFormat
    assert issubclass(npy_contract, fastdata.testing.FormatContract) and CONTRACTS["npy"] is npy_contract


@pytest.mark.parametrize("shape", [(0, 2, 2, 3), (7, 32, 32, 3), (10**6, 224, 224, 1), (1,)])
def test_the_one_npy_header_writer_equals_numpys(shape: tuple[int, ...]) -> None:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "|u1", "fortran_order": False, "shape": shape})
    assert npy_header(shape) == buffer.getvalue()
    padded = npy_header((5, 2), length=256)  # rewritten in place after skipped samples: same length
    assert len(padded) == 256
    assert np.lib.format.read_array_header_1_0(io.BytesIO(padded[8:])) == ((5, 2), False, np.dtype("u1"))


# --- ConvertOptions: one dataclass owns every option ---------------------------------------


def test_convert_options_parse_text_like_the_command_line() -> None:
    given = ConvertOptions(format="hdf5", resize="64x48", center_crop="32x32", workers="2", max_pixels="1000",
                           reencode=None, format_options={"compression": "GZIP"})
    assert given.format_options == {"compression": "GZIP"}  # the format's own options: checked once it is decided
    options = decide_options("out.h5", given)
    assert options.resize == (64, 48) and options.center_crop == (32, 32) and options.workers == 2
    assert options.max_pixels == 1000 and options.format_options.compression == "gzip:4"
    assert ConvertOptions(resize=64).resize == (64,) and ConvertOptions(resize=(8, 9)).resize == (8, 9)
    assert ConvertOptions(store="encoded", reencode="jpg:80").reencode == ("jpeg", 80)
    assert decide_options("out.h5", options, compression="lzf").format_options.compression == "lzf"
    assert decide_options("out", options, format="tar").format_options == get_format("tar").options()  # reset
    assert decide_options("out", resize="8", shard_bytes="1MB", format="tar").format_options.shard_bytes == 10**6


@pytest.mark.parametrize("overrides,message", [
    ({"resize": "32by32"}, "Invalid --resize '32by32'. Use 'HxW' (e.g. '64x64') or 'S' (shorter side), with positive integers."),
    ({"center_crop": "8"}, "Invalid --center-crop '8'. Use 'HxW' (e.g. '56x56'), with positive integers."),
    ({"workers": -1}, "Invalid --workers -1. Use 0 or a positive integer."),
    ({"workers": "many"}, "Invalid --workers 'many'. Use 0 or a positive integer."),
    ({"store": "zip", "format": "npy"}, "Unknown store 'zip' for format 'npy'. Allowed: 'raw', 'encoded'."),
    ({"store": "zip"}, "Unknown store 'zip'. Allowed: 'raw', 'encoded'."),
    ({"mode": "CMYK"}, "Unknown mode 'CMYK'. Allowed: 'auto', 'RGB', 'L'."),
    ({"split": 3}, "Invalid split 3. Use the dataset's split name, e.g. 'train'."),
    ({"reencode": "gif"}, "Invalid --reencode 'gif'. Use 'jpeg:Q' (Q in 1..100) or 'png'."),
    ({"format": "zarr"}, "Unknown format 'zarr'. Available formats: 'hdf5', 'npy', 'tar'."),
    ({"compression": "lzf", "format": "npy"}, "Option 'compression' does not apply to format 'npy'. Its options: none."),
])
def test_convert_options_refuse_bad_values(overrides: dict, message: str) -> None:
    with pytest.raises(InvalidOptionError) as info:  # a format given: decided (and its options checked) by the plan
        decide_options("out", **overrides) if "format" in overrides else ConvertOptions.build(**overrides)
    assert str(info.value) == message


def test_key_fields_and_manifest_options_come_from_the_fields() -> None:
    options = decide_options("out", ConvertOptions(format="tar", store="encoded", reencode="png",
                                                   format_options={"shard_samples": 9}))
    assert options.key_fields() == {
        "format": "tar", "store": "encoded", "mode": "auto", "resize": None, "center_crop": None, "max_side": None,
        "reencode": ["png", None], "skip_bad": False, "max_pixels": 89_478_485, "exif_transpose": False,
        "format_options": {"shard_samples": 9, "shard_bytes": 256_000_000},
    }
    assert options.describe() == {"mode": "auto", "resize": None, "center_crop": None, "max_side": None,
                                  "reencode": ["png", None],
                                  "format_options": {"shard_samples": 9, "shard_bytes": 256_000_000}}


def test_every_option_is_a_convert_flag_with_help() -> None:
    from fastdata.cli import build_parser
    from fastdata.conversion.options import cli_fields

    parser = build_parser()
    convert = parser._subparsers._group_actions[0].choices["convert"]
    flags = {option: action for action in convert._actions for option in action.option_strings}
    for field in cli_fields():
        flag = "--source-option" if field.name == "source_options" else "--" + field.name.replace("_", "-")
        assert flag in flags and flags[flag].help, flag
    for name in ("--compression", "--chunk-images", "--shard-samples", "--shard-bytes"):
        assert flags[name].help and flags[name].metavar and "FORMAT_OPTION" not in flags[name].metavar


# --- the two defects found while reshaping ---------------------------------------------------


def test_pil_images_with_a_transform_come_back_as_a_collated_batch(uniform_folder: Path, tmp_path: Path) -> None:
    from torchvision.transforms import v2

    out = tmp_path / "p.npy"
    fastdata.convert(uniform_folder, out, workers=0)
    to_tensor = v2.Compose([v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True)])
    ds = fastdata.open_dataset(out, image_format="pil", transform=to_tensor)
    images, labels = ds[[0, 5, 11]]
    assert isinstance(images, torch.Tensor) and images.shape == (3, 3, 12, 10) and images.dtype == torch.float32
    assert labels.tolist() == [0, 1, 2]
    plain = fastdata.open_dataset(out)
    assert torch.allclose(images, plain[[0, 5, 11]][0].float() / 255)
    pil_images, pil_labels = fastdata.open_dataset(out, image_format="pil")[[0, 5]]  # no transform: PIL stays PIL
    assert all(isinstance(image, Image.Image) for image in pil_images) and pil_labels.tolist() == [0, 1]


def test_verify_reports_a_damaged_hdf5_manifest_attribute(uniform_folder: Path, tmp_path: Path) -> None:
    """Flipping single bytes in and around the manifest attribute used to raise UnicodeEncodeError."""
    out = tmp_path / "m.h5"
    fastdata.convert(uniform_folder, out, format="hdf5", workers=0)
    data = out.read_bytes()
    start = data.index(b'{"format": "hdf5"')
    damaged = tmp_path / "d.h5"
    for offset in range(start - 40, start + 400, 3):
        flipped = bytearray(data)
        flipped[offset] ^= 0x80  # high bit: invalid UTF-8 where it lands in the text
        damaged.write_bytes(bytes(flipped))
        try:
            report = fastdata.verify(damaged)
        except fastdata.FastdataError as exc:  # refused with a reason (e.g. no manifest left): also fine
            assert "Traceback" not in str(exc)
            continue
        assert not report.ok, offset
        assert json.dumps(report.problems)  # plain text, printable


# --- ReaderOptions: one frozen dataclass every reader takes -----------------------------------


def test_every_reader_takes_the_reader_options_by_their_names(uniform_folder: Path, tmp_path: Path) -> None:
    import dataclasses
    import inspect

    from fastdata.reader import ReaderOptions

    shared = [field.name for field in dataclasses.fields(ReaderOptions)]
    for spec in fastdata.formats.all_formats():
        for reader in {spec.dataset, spec.map_dataset}:
            parameters = inspect.signature(reader).parameters
            assert all(name in parameters for name in shared), (reader, list(parameters))
            assert issubclass(reader.Options, ReaderOptions)
    out = tmp_path / "e.npy"
    fastdata.convert(uniform_folder, out, store="encoded", workers=0)
    ds = fastdata.open_dataset(out, transform=None, image_format="numpy", resize="6x5", center_crop=4)
    assert ds.options == ReaderOptions(image_format="numpy", resize=(6, 5), center_crop=(4, 4))
    assert ds[0][0].shape == (4, 4, 3)
    ds.image_format = "tensor"  # settable like torchvision's transform, and validated again
    assert ds.options.image_format == "tensor" and ds[0][0].shape == (3, 4, 4)
    with pytest.raises(InvalidOptionError, match="^Unknown image_format 'jpeg'. Allowed: 'tensor', 'numpy', 'pil'.$"):
        ds.image_format = "jpeg"
    with pytest.raises(TypeError) as info:
        fastdata.MemmapDataset(out, sizes=3)
    assert str(info.value).startswith("MemmapDataset() got an unexpected keyword argument 'sizes'. Its options: "
                                      "'transform', 'target_transform', 'image_format',")
    with pytest.raises(InvalidOptionError, match="^Invalid resize '6by5'"):  # up front, before any file is read
        fastdata.MemmapDataset(tmp_path / "nothing-here", resize="6by5")
    with pytest.raises(InvalidOptionError, match="^Invalid cache_bytes -1"):
        fastdata.HDF5Dataset(tmp_path / "nothing-here.h5", cache_bytes=-1)
