"""``--engine ray`` on a local Ray cluster (``ray.init(num_cpus=2)``): the output equals the local
engine's, a worker killed mid-task is retried and leaves nothing behind, bad input fails alike.
Skipped when Ray is not installed (``pip install 'torch-fastdata[ray]'``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fastdata
from fastdata.conversion import driver
from fastdata.errors import BadSampleError
from conftest import pattern, save
from PIL import Image
from conftest import make_folder
from test_parts import same_output

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One local cluster for the module; its workers kill themselves once while converting unit 2 of
    an output in the ``kill`` folder: a Ray ``worker_process_setup_hook`` wraps ``UnitWriter.write``
    in every worker so that the worker exits (``os._exit``) after writing that unit's first batch.
    Writing unit 4 fails (a full disk) for an output whose folder holds ``fail-unit-4``."""
    kill = tmp_path_factory.mktemp("kill")
    marker = kill / "killed"

    def die_in_unit_2() -> None:  # runs in each Ray worker as it starts (pickled by value: a local function)
        from fastdata.conversion import units

        write = units.UnitWriter.write

        def write_then_die(self, batch, offset=0):
            if self.unit.number == 4 and (self.final.parent.parent / "fail-unit-4").exists():
                raise OSError(28, "No space left on device (injected by the test)")
            write(self, batch, offset)
            if self.unit.number == 2 and self.final.parent.parent == kill and not marker.exists():
                marker.touch()
                os._exit(1)

        units.UnitWriter.write = write_then_die

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"worker_process_setup_hook": die_in_unit_2})
    try:
        yield kill, marker
    finally:
        ray.shutdown()


def test_a_killed_worker_is_retried_and_the_output_is_identical(cluster, tmp_path: Path) -> None:
    kill, marker = cluster
    source = make_folder(tmp_path / "src", 40)
    options = dict(format="tar", store="encoded", shard_bytes="3000", skip_bad=True)
    local = tmp_path / "local"
    fastdata.convert(source, local, workers=0, **options)
    out = kill / "out"
    manifest = fastdata.convert(source, out, engine="ray", unit_samples=4, **options)
    assert marker.exists()  # the worker of unit 2 did die mid-task
    assert manifest["count"] == 40 and [s["key"] for s in manifest["skipped"]] == ["a/007-bad.png"]
    same_output(local, out)
    assert sorted(p.name for p in kill.iterdir()) == ["killed", "out"]  # no unit, staging, lock or journal left


@pytest.mark.parametrize("fmt,store,extra", [("npy", "encoded", {}), ("npy", "raw", {"mode": "L"}),
                                             ("hdf5", "raw", {"compression": "lzf"})])
def test_ray_output_equals_the_local_engines(cluster, tmp_path: Path, fmt: str, store: str, extra: dict) -> None:
    source = make_folder(tmp_path / "src", 30)
    local, out = tmp_path / "local", tmp_path / "ray"
    fastdata.convert(source, local, format=fmt, store=store, skip_bad=True, workers=0, **extra)
    fastdata.convert(source, out, format=fmt, store=store, skip_bad=True, engine="ray", unit_samples=7, **extra)
    same_output(local, out)


def test_auto_mode_on_ray_turns_rgb_when_a_later_unit_meets_colour(cluster, tmp_path: Path) -> None:
    source = make_folder(tmp_path / "src", 80, bad=False, colour_at=70)
    local, out = tmp_path / "local", tmp_path / "ray"
    fastdata.convert(source, local, format="npy", store="raw", workers=0)
    assert fastdata.convert(source, out, format="npy", store="raw", engine="ray", unit_samples=8)["image"]["mode"] == "RGB"
    same_output(local, out)


def test_a_bad_image_in_a_task_fails_as_in_the_local_engine(cluster, tmp_path: Path) -> None:
    source = make_folder(tmp_path / "src", 80, bad=False)
    for name in ("b/070.png", "b/078.png"):  # after the 64 images the plan reads; in two units
        (source / name).write_bytes(b"not a png")
    with pytest.raises(BadSampleError) as local:
        fastdata.convert(source, tmp_path / "local", format="npy", workers=0)
    with pytest.raises(BadSampleError) as remote:
        fastdata.convert(source, tmp_path / "ray", format="npy", engine="ray", unit_samples=4)
    assert str(remote.value) == str(local.value) == (
        f"{source / 'b' / '070.png'}: cannot decode image (not a recognised image file). Re-run with --skip-bad (skip_bad=True) "
        "to leave it out."
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ray.partial.units", "src"]  # finished units kept for a rerun
    fastdata.convert(source, tmp_path / "ray", format="npy", skip_bad=True, workers=0)  # a local run clears them
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ray", "src"]



def test_units_kept_from_a_failed_run_are_converted_again_when_the_source_changed(cluster, tmp_path: Path) -> None:
    source = make_folder(tmp_path / "src", 160, bad=False)
    (source / "a" / "141.png").write_bytes(b"not a png")  # sample 70, in unit 4 (units of 16)
    out = tmp_path / "ray"
    with pytest.raises(BadSampleError):
        fastdata.convert(source, out, format="npy", engine="ray", unit_samples=16)
    staged = sorted(p.name for p in (tmp_path / "ray.partial.units").iterdir() if p.name.startswith("unit-"))
    assert staged[:4] == [f"unit-{i:06d}" for i in range(4)] and "unit-000004" not in staged
    save(Image.fromarray(pattern(10, 12, seed=500)), source / "a" / "011.png")  # sample 5: in kept unit 0
    save(Image.fromarray(pattern(10, 12, seed=141)), source / "a" / "141.png")  # the bad file mended
    fastdata.convert(source, out, format="npy", engine="ray", unit_samples=16)
    fastdata.convert(source, tmp_path / "local", format="npy", workers=0)
    same_output(tmp_path / "local", out)


def test_a_local_resume_keeps_the_units_a_failed_ray_run_finished(cluster, tmp_path: Path, monkeypatch) -> None:
    source = make_folder(tmp_path / "src", 160, bad=False)
    out = tmp_path / "ray"
    (tmp_path / "fail-unit-4").touch()
    with pytest.raises(OSError, match="no space left on the device"):
        fastdata.convert(source, out, format="npy", engine="ray", unit_samples=16)
    (tmp_path / "fail-unit-4").unlink()
    computed = []
    run_here = driver.run_here

    def noted(job, workers, units):
        computed.extend(unit.number for unit in units)
        return run_here(job, workers, units)

    monkeypatch.setattr(driver, "run_here", noted)
    fastdata.convert(source, out, format="npy", unit_samples=16, workers=0, resume=True)
    assert computed and 4 in computed and not {0, 1, 2, 3} & set(computed)  # the finished units were reused
    assert not (tmp_path / "ray.partial.units").exists()
    fastdata.convert(source, tmp_path / "local", format="npy", workers=0)
    same_output(tmp_path / "local", out)

def test_samples_with_fields_on_ray_equal_the_local_engines(cluster, tmp_path: Path) -> None:
    """WebDataset shards with captions, JSON and masks (issue 21): the staged units carry every field."""
    import io
    import json

    import numpy as np
    import webdataset as wds
    from PIL import Image

    def png(array: np.ndarray) -> bytes:
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format="PNG")
        return buffer.getvalue()

    shards = tmp_path / "shards"
    shards.mkdir()
    with wds.TarWriter(str(shards / "x.tar")) as sink:
        for index in range(30):
            sink.write({"__key__": f"k{index:03d}", "png": png(np.full((6, 8, 3), index, np.uint8)),
                        "txt": f"caption {index}".encode(), "json": json.dumps({"i": index}).encode(),
                        "seg.png": png(np.full((6, 8), index % 4, np.uint8))})
    for fmt in ("npy", "tar"):
        local, out = tmp_path / f"local-{fmt}", tmp_path / f"ray-{fmt}"
        fastdata.convert(shards, local, format=fmt, workers=0)
        manifest = fastdata.convert(shards, out, format=fmt, engine="ray", unit_samples=7)
        assert [f["name"] for f in manifest["fields"]["fields"]] == ["__key__", "png", "json", "seg.png", "txt"]
        same_output(local, out)
