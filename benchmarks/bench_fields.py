"""Fields: what named fields cost, side by side in one run.

1. Classic ``(image, label)`` read speed, this checkout against ``main`` (a ``git worktree`` of it
   at ``--base``, made when missing): the same converted datasets (npy, hdf5, tar; raw and
   encoded) read by each version's reader in its own subprocess, alternating, best of
   ``--repeats``, and the Python calls each version makes for the same reads (cProfile; equal
   counts mean the same work, where timings on a loaded machine are noisy). Target: >= 0.95x.
2. Map-style tar reads (``--part tar``), this checkout against ``--base`` as in 1: the classic
   datasets and a dataset with fields (image, mask, boxes, labels, caption, JSON), random
   batches (sorted indices), adjacent batches and single samples, and the ``os.pread`` calls
   each version makes for 10 batches of 64 and 100 samples (deterministic, unlike time).
3. Detection (image + variable boxes + labels): torchvision's ``CocoDetection`` +
   ``wrap_dataset_for_transforms_v2`` read by a DataLoader with a list collate, against the same
   samples converted by fastdata (encoded, and raw after ``--resize``) read by ``fastdata.loader``;
   each at its best ``num_workers`` of ``--workers``.

    python benchmarks/bench_fields.py --samples 2000 --repeats 3
    PYTHONPATH=. python benchmarks/bench_fields.py --part tar --repeats 5 --passes 8 --base /tmp/base

Each version runs in its own process from a neutral directory, with ``PYTHONPATH`` naming it,
and checks that it imported that version's fastdata.

Prints one table per part and the ratios; the numbers are this machine's (``os.cpu_count()`` is
printed). Nothing here is a test: speed is never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

READ = r"""
import json, sys, time
import numpy as np
import fastdata
from fastdata.formats import find_manifest, get_format
path, batch, passes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
spec = get_format(find_manifest(path)["format"])
ds = spec.map_dataset(path)
n = len(ds)
order = np.random.default_rng(0).permutation(n)
best = {}
for name in ("batches", "sequential", "samples"):
    times, cpu = [], []
    for number in range(passes + 1):  # the first pass warms the page cache and the imports: not counted
        start, start_cpu = time.perf_counter(), time.thread_time()
        if name == "batches":  # random samples, each batch's indices sorted
            for first in range(0, n, batch):
                ds[np.sort(order[first:first + batch])]
        elif name == "sequential":  # adjacent samples
            for first in range(0, n, batch):
                ds[np.arange(first, min(first + batch, n))]
        else:
            for i in order[: min(n, 2000)].tolist():
                ds[i]
        if number:
            times.append(time.perf_counter() - start)
            cpu.append(time.thread_time() - start_cpu)
    count = min(n, 2000) if name == "samples" else n
    best[name] = count / min(times)
    best[name + "_cpu"] = count / min(cpu)  # this thread's CPU time: what other jobs on the machine change least
print(json.dumps(best))
"""


CALLS = r"""
import cProfile, json, pstats, sys
import numpy as np
from fastdata.formats import find_manifest, get_format
ds = get_format(find_manifest(sys.argv[1])["format"]).map_dataset(sys.argv[1])
ds[0]; ds[np.arange(8)]
counts = {}
for name, call in (("samples", lambda: [ds[i] for i in range(100)]), ("batches", lambda: [ds[np.arange(64)] for _ in range(10)])):
    profile = cProfile.Profile(); profile.enable(); call(); profile.disable()
    counts[name] = pstats.Stats(profile).total_calls
print(json.dumps(counts))
"""


PREADS = r"""
import json, os, sys
import numpy as np
from fastdata.formats.tar import TarIndexedDataset
calls = [0]
real = os.pread
def counted(*args):
    calls[0] += 1
    return real(*args)
os.pread = counted
ds = TarIndexedDataset(sys.argv[1])
order = np.random.default_rng(0).permutation(len(ds))
counts = {}
for name, run in (("batches", lambda: [ds[np.sort(order[b * 64:(b + 1) * 64])] for b in range(10)]),
                  ("sequential", lambda: [ds[np.arange(b * 64, (b + 1) * 64)] for b in range(10)]),
                  ("samples", lambda: [ds[int(i)] for i in order[:100]])):
    calls[0] = 0
    run()
    counts[name] = calls[0]
print(json.dumps(counts))
"""


_WHICH = ("import os, fastdata\n"
          "assert os.path.realpath(fastdata.__file__).startswith(os.path.realpath(os.environ['PYTHONPATH']) + os.sep), "
          "fastdata.__file__\n")


def run_version(pythonpath: Path, script: str, *args: object) -> dict:
    """``script``'s JSON line, run with the fastdata at ``pythonpath``: from a neutral directory
    (``python -c`` puts the current directory first on ``sys.path``, so run from a checkout it
    would import that checkout's fastdata whatever ``PYTHONPATH`` says), checked by its path."""
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    done = subprocess.run([sys.executable, "-c", _WHICH + script, *map(str, args)], env=env, cwd=tempfile.gettempdir(),
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def count_preads(pythonpath: Path, path: Path) -> dict[str, int]:
    """``os.pread`` calls of 10 batches of 64 (random, sorted; adjacent) and of 100 ``ds[i]``."""
    return run_version(pythonpath, PREADS, path)


def count_calls(pythonpath: Path, path: Path) -> dict[str, int]:
    """Python function calls of 100 ``ds[i]`` and 10 ``ds[64 indices]``: deterministic, unlike time
    on a shared machine; equal counts mean the same work per sample."""
    return run_version(pythonpath, CALLS, path)


def run_reader(pythonpath: Path, path: Path, batch: int, passes: int) -> dict[str, float]:
    return run_version(pythonpath, READ, path, batch, passes)


def ensure_base(base: Path) -> None:
    if not (base / "fastdata").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), "main"], check=True)


class Classic:
    """(PIL image, int) pairs of a fixed size: the classic sample."""

    def __init__(self, count: int, size: int):
        self.count, self.size = count, size

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        from PIL import Image

        rng = np.random.default_rng(index)
        return Image.fromarray(rng.integers(0, 256, (self.size, self.size, 3), dtype=np.uint8)), index % 10


def part_classic(folder: Path, args: argparse.Namespace) -> None:
    import fastdata

    ensure_base(args.base)
    print(f"\n1. classic (image, label) reads: this checkout / main ({args.base}), samples/s, best of {args.repeats}")
    print(f"{'dataset':<16} {'path':<8} {'main':>10} {'fields':>10} {'ratio':>7}")
    for fmt, suffix in (("npy", ".npy"), ("hdf5", ".h5"), ("tar", ".tar")):
        for store in ("raw", "encoded"):
            out = folder / f"classic-{store}{suffix}"
            fastdata.convert(Classic(args.samples, args.size), out, store=store, workers=0)
            results = {"main": [], "fields": []}
            for repeat in range(args.repeats):  # alternate (and swap who goes first), so drift hits both alike
                order = [("main", args.base), ("fields", ROOT)]
                for name, code in order if repeat % 2 == 0 else order[::-1]:
                    results[name].append(run_reader(code, out, 64, 3))
            calls = {"main": count_calls(args.base, out), "fields": count_calls(ROOT, out)}
            for what in ("batches", "samples"):
                main = max(r[what] for r in results["main"])
                new = max(r[what] for r in results["fields"])
                print(f"{fmt + ' ' + store:<16} {what:<8} {main:>10.0f} {new:>10.0f} {new / main:>6.2f}x   "
                      f"python calls main {calls['main'][what]}, fields {calls['fields'][what]}")


class Segmented(Classic):
    """Fields: an image, a P-mode mask, boxes, labels, a caption and a JSON record per sample."""

    fastdata_kinds = {"mask": "mask"}

    def __getitem__(self, index: int):
        import torch
        from PIL import Image
        from torchvision import tv_tensors

        rng = np.random.default_rng(index)
        image = Image.fromarray(rng.integers(0, 256, (self.size, self.size, 3), dtype=np.uint8))
        mask = Image.fromarray(rng.integers(0, 21, (self.size, self.size), dtype=np.uint8)).convert("P")
        count = int(rng.integers(1, 6))
        corners = np.sort(rng.uniform(0, self.size, (count, 2, 2)), axis=1).reshape(count, 4).astype(np.float32)
        boxes = tv_tensors.BoundingBoxes(torch.from_numpy(corners), format="XYXY", canvas_size=(self.size, self.size))
        return {"image": image, "mask": mask, "boxes": boxes, "labels": rng.integers(1, 21, count),
                "caption": f"sample {index} with {count} objects", "meta": {"index": index, "split": "train"}}


def part_tar(folder: Path, args: argparse.Namespace) -> None:
    import fastdata

    ensure_base(args.base)
    print(f"\n2. map-style tar reads: this checkout / {args.base}, samples/s, best of {args.repeats}: by wall time, "
          "and by the reading thread's CPU time")
    print(f"{'dataset':<20} {'path':<10} {'base':>10} {'this':>10} {'ratio':>7} {'base cpu':>10} {'this cpu':>10} "
          f"{'ratio':>7}")
    for name, source in (("classic", Classic(args.samples, args.size)), ("fields", Segmented(args.samples, args.size))):
        for store in ("raw", "encoded"):
            out = folder / f"tar-{name}-{store}.tar"
            fastdata.convert(source, out, store=store, workers=0)
            results = {"base": [], "this": []}
            for repeat in range(args.repeats):  # alternate (and swap who goes first), so drift hits both alike
                order = [("base", args.base), ("this", ROOT)]
                for who, code in order if repeat % 2 == 0 else order[::-1]:
                    results[who].append(run_reader(code, out, 64, args.passes))
            preads = {"base": count_preads(args.base, out), "this": count_preads(ROOT, out)}
            for what in ("batches", "sequential", "samples"):
                base, new = (max(r[what] for r in results[who]) for who in ("base", "this"))
                base_cpu, new_cpu = (max(r[what + "_cpu"] for r in results[who]) for who in ("base", "this"))
                print(f"{name + ' ' + store:<20} {what:<10} {base:>10.0f} {new:>10.0f} {new / base:>6.2f}x "
                      f"{base_cpu:>10.0f} {new_cpu:>10.0f} {new_cpu / base_cpu:>6.2f}x   "
                      f"preads base {preads['base'][what]}, this {preads['this'][what]}")


def write_coco(folder: Path, count: int, size: int) -> tuple[Path, Path]:
    """A COCO detection dataset in its real layout: JPEG files and an instances JSON."""
    from PIL import Image

    images = folder / "coco" / "images"
    images.mkdir(parents=True)
    rng = np.random.default_rng(0)
    document = {"images": [], "annotations": [], "categories": [{"id": c, "name": f"c{c}"} for c in range(1, 11)]}
    annotation = 1
    for index in range(count):
        name = f"{index:08d}.jpg"
        Image.fromarray(rng.integers(0, 256, (size, size + 16, 3), dtype=np.uint8)).save(images / name, quality=90)
        document["images"].append({"id": index + 1, "file_name": name, "width": size + 16, "height": size})
        for _ in range(int(rng.integers(1, 8))):  # >= 1: the v2 wrapper drops "boxes" for an image without any
            x, y = float(rng.uniform(0, size / 2)), float(rng.uniform(0, size / 2))
            w, h = float(rng.uniform(4, size / 2)), float(rng.uniform(4, size / 2))
            document["annotations"].append({"id": annotation, "image_id": index + 1, "category_id": int(rng.integers(1, 11)),
                                            "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0,
                                            "segmentation": [[x, y, x + w, y, x + w, y + h]]})
            annotation += 1
    ann = folder / "coco" / "instances.json"
    ann.write_text(json.dumps(document))
    return images, ann


def _list_collate(batch):
    return list(zip(*batch))


def _time_epoch(loader) -> float:
    start = time.perf_counter()
    count = 0
    for batch in loader:
        count += len(batch[0])
    return count / (time.perf_counter() - start)


def part_detection(folder: Path, args: argparse.Namespace) -> None:
    import torch
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2

    import fastdata
    from fastdata.formats.tar import TarIndexedDataset  # noqa: F401 - the map-style tar reader exists

    images, ann = write_coco(folder, args.samples, args.size)

    def coco():
        return wrap_dataset_for_transforms_v2(CocoDetection(str(images), str(ann)), target_keys=("boxes", "labels"))

    encoded = folder / "det-encoded.npy"
    raw = folder / "det-raw.npy"
    fastdata.convert(coco(), encoded, store="encoded", workers=args.workers[-1])
    fastdata.convert(coco(), raw, store="raw", resize=f"{args.size // 2}x{args.size // 2}", workers=args.workers[-1])
    print(f"\n3. detection: {args.samples} COCO images {args.size}x{args.size + 16}, 1-7 boxes each; samples/s "
          f"(best num_workers of {args.workers})")
    rows = {}
    for workers in args.workers:
        loader = torch.utils.data.DataLoader(coco(), batch_size=32, num_workers=workers, collate_fn=_list_collate)
        rows.setdefault("torchvision CocoDetection+v2 wrap", []).append((_time_epoch(loader), workers))
        for name, path in (("fastdata npy encoded", encoded), (f"fastdata npy raw {args.size // 2}px", raw)):
            for backend in ("torch", "thread", "process"):
                if workers == 0 and backend != "torch":
                    continue
                ds = fastdata.open_dataset(path)
                loader = fastdata.loader(ds, batch_size=32, shuffle=False, num_workers=workers, backend=backend)
                rows.setdefault(name, []).append((_time_epoch_dict(loader), f"{workers} {backend}"))
    baseline = max(rows["torchvision CocoDetection+v2 wrap"])[0]
    for name, found in rows.items():
        best, how = max(found, key=lambda item: item[0])
        print(f"{name:<36} {best:>9.0f}/s  (num_workers {how})  {best / baseline:>6.2f}x")


def _time_epoch_dict(loader) -> float:
    start = time.perf_counter()
    count = 0
    for images, target in loader:
        count += len(target["boxes"])
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--passes", type=int, default=3, help="timed passes per reader process (--part tar)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--base", type=Path, default=Path("/tmp/fields-base"))
    parser.add_argument("--part", choices=("classic", "tar", "detection", "both"), default="both")
    args = parser.parse_args()
    print(f"os.cpu_count() = {os.cpu_count()}")
    with tempfile.TemporaryDirectory() as folder:
        if args.part in ("classic", "both"):
            part_classic(Path(folder), args)
        if args.part == "tar":
            part_tar(Path(folder), args)
        if args.part in ("detection", "both"):
            part_detection(Path(folder), args)


if __name__ == "__main__":
    main()
