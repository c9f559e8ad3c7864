"""``fastdata bench`` and ``fastdata tune`` run unchanged on datasets with fields (issue 21,
item 6): segmentation (image + mask), detection (image + variable boxes + labels) and captions
(image + a list of captions), converted to npy and tar; and a Python dataset returning PIL
images is refused with one line saying what to do."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import fastdata
from conftest import run_fastdata

DATASETS = '''
import numpy as np, torch
from PIL import Image
from torchvision import tv_tensors

def image(i, h=12, w=16):
    return Image.fromarray(np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8))

class Seg:
    fastdata_kinds = {"mask": "mask"}
    def __len__(self): return 12
    def __getitem__(self, i):
        return image(i), Image.fromarray((np.arange(12 * 16).reshape(12, 16) % 5).astype(np.uint8), "L")

class Det:
    def __len__(self): return 12
    def __getitem__(self, i):
        boxes = torch.arange(4 * (i % 3), dtype=torch.float32).reshape(-1, 4)
        return image(i), {"boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(12, 16)),
                          "labels": torch.arange(i % 3, dtype=torch.int64)}

class Cap:
    def __len__(self): return 12
    def __getitem__(self, i):
        return image(i), [f"a photo {i}", "another"]

class Pil:
    def __len__(self): return 12
    def __getitem__(self, i):
        return image(i, 12 + i % 2), i % 3

seg, det, cap, pil = Seg(), Det(), Cap(), Pil()
'''


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fieldbench")
    (folder / "benchdata.py").write_text(DATASETS)
    sys.path.insert(0, str(folder))
    try:
        import benchdata

        for name in ("seg", "det", "cap"):
            for fmt in ("npy", "tar"):
                fastdata.convert(getattr(benchdata, name), folder / f"{name}.{fmt}", format=fmt, workers=0)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("benchdata", None)
    return folder


@pytest.mark.parametrize("fmt", ["npy", "tar"])
@pytest.mark.parametrize("name", ["seg", "det", "cap"])
def test_bench_runs_on_datasets_with_fields(converted: Path, name: str, fmt: str) -> None:
    out = f"bench-{name}-{fmt}"
    result = run_fastdata("bench", f"{name}.{fmt}", "--formats", fmt, "--stores", "encoded", "--epochs", "1",
                          "--warmup", "0", "--num-workers", "0", "--backends", "torch", "--batch-size", "4", "--out",
                          out, "--quiet", "--memory-s", "0", cwd=converted)  # benchdata imports from the working folder
    assert result.returncode == 0, result.stderr
    rows = json.loads((converted / out / "results.json").read_text())["rows"]
    measured = [r for r in rows if r["samples_per_s"] is not None]
    assert rows and {r["status"] for r in rows} == {"ok"}
    assert {r["read_path"] for r in measured} == {"fast", "standard"} and {r["format"] for r in measured} == {fmt}


@pytest.mark.parametrize("name", ["seg", "det", "cap"])
def test_tune_runs_on_datasets_with_fields(converted: Path, name: str) -> None:
    result = run_fastdata("tune", f"{name}.tar" if name != "det" else "det.npy", "--budget-s", "5", "--backends",
                          "torch", "--batch-size", "4", "--json", "--quiet", cwd=converted)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["batch_size"] == 4 and document["measured_samples_per_s"] > 0


def test_a_python_dataset_of_pil_images_is_refused_with_what_to_do(converted: Path) -> None:
    for command in (["bench", "benchdata:pil", "--epochs", "1", "--quiet", "--out", "bench-pil"],
                    ["tune", "benchdata:pil", "--budget-s", "5", "--quiet"]):
        result = run_fastdata(*command, cwd=converted)
        assert result.returncode != 0 and "Traceback" not in result.stderr
        assert result.stderr.strip() == (
            "fastdata: error: benchdata:pil: sample 0 holds a PIL image, which DataLoader's default_collate cannot "
            "batch (a training loop over it fails the same way). Give the dataset a transform that makes tensors of "
            "one size, e.g. transform=v2.Compose([v2.PILToTensor(), v2.Resize((224, 224))]) "
            "(torchvision.transforms.v2), or convert it and bench that: fastdata convert benchdata:pil out.npy "
            "--resize 224x224, then fastdata bench out.npy.")
