"""Parquet sources: converting Hugging Face Parquet shards, side by side in one run.

Two sets, written here with ``datasets`` (an ``Image`` column of encoded bytes and a
``ClassLabel``, row groups of 100 rows as ``datasets`` writes image tables): ``--small`` 32x32
PNGs (CIFAR-like) and ``--large`` ImageNet-size JPEGs (500x375, quality 90). For each set, one
process per case, whole runs including start-up:

* ``pyarrow``: the ceiling, every row's image bytes read with pyarrow alone, row group by row group;
* ``fastdata``: ``fastdata convert DATA OUT.npy --store encoded`` (the Parquet's bytes kept), and
  ``--store raw`` for the small set (decoded pixels);
* ``datasets``: what users did before fastdata read Parquet: ``load_dataset("parquet")`` and the
  ``datasets.Dataset`` wrapped as a map-style dataset of ``{"image": PIL, "label": int}`` items
  through fastdata's Python-dataset path (a ``datasets.IterableDataset`` has no length, which
  that path needs), same store.

Then the peak memory (RSS of the process tree, sampled every 20 ms) of converting one file holding
the large set's rows ``--copies`` times (250 MB by default) in one process (``--workers 0``),
above that of a process that only imports what the conversion imports (fastdata, pyarrow,
Pillow), against ``--budget-mb`` (the file is larger than that budget). Last, the peak memory of
converting one file that is a single row group of ``--group-mb`` MB (the large set's rows repeated;
``df.to_parquet()`` writes groups of up to 1 Mi rows): in one process, and with the default
workers under fork and under spawn (the whole process tree).

    python benchmarks/bench_parquet.py --small 20000 --large 2000 --out /tmp/bench-parquet
    python benchmarks/bench_parquet.py --memory-only --out /tmp/bench-parquet   # the memory lines alone

Rows are printed as JSON, then a table; ``os.cpu_count()`` is printed. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

PYARROW = r"""
import sys, pyarrow.parquet as pq, glob
rows = size = 0
for path in sorted(glob.glob(sys.argv[1] + "/*.parquet")):
    f = pq.ParquetFile(path)
    for g in range(f.metadata.num_row_groups):
        table = f.read_row_group(g, columns=["image", "label"])
        for cell in table.column("image").to_pylist():
            size += len(cell["bytes"])
            rows += 1
print(rows, size)
"""

FASTDATA = r"""
import multiprocessing, sys, fastdata
workers = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] != "default" else None
if len(sys.argv) > 5:
    multiprocessing.set_start_method(sys.argv[5])  # the conversion pool's start method
m = fastdata.convert(sys.argv[1], sys.argv[2], store=sys.argv[3], workers=workers)
print(m["count"])
"""

BASELINE = r"""
import fastdata, fastdata.conversion, fastdata.sources.parquet, pyarrow.parquet, PIL.Image  # what convert imports
print("imported")
"""

DATASETS = r"""
import sys, glob, fastdata, datasets
ds = datasets.load_dataset("parquet", data_files=sorted(glob.glob(sys.argv[1] + "/*.parquet")), split="train")

class Items:  # the map-style dataset users wrote: items as datasets gives them, PIL image and int label
    def __init__(self, ds): self.ds = ds
    def __len__(self): return len(self.ds)
    def __getitem__(self, i):
        row = self.ds[i]
        return row["image"], row["label"]

m = fastdata.convert(Items(ds), sys.argv[2], store=sys.argv[3], format="npy")
print(m["count"])
"""


def make_set(folder: Path, count: int, size: tuple[int, int], fmt: str, shards: int) -> int:
    """``count`` images in ``shards`` Parquet files written by datasets; their total bytes."""
    import datasets
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    width, height = size
    ramp = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
    per = -(-count // shards)
    for shard in range(shards):
        images, labels = [], []
        for index in range(shard * per, min(count, (shard + 1) * per)):
            base = ramp + index % 255 + rng.normal(0, 18, (height, 1, 3)) + rng.normal(0, 10, (height, width, 3))
            pixels = base.clip(0, 255).astype(np.uint8)  # about ImageNet's JPEG size at 500x375
            out = io.BytesIO()
            Image.fromarray(pixels).save(out, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
            images.append({"bytes": out.getvalue(), "path": None})
            labels.append(index % 10)
        dataset = datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)
        dataset.to_parquet(str(folder / f"train-{shard:05d}-of-{shards:05d}.parquet"), batch_size=100)
    return sum(p.stat().st_size for p in folder.glob("*.parquet"))


def repeated(data: Path, folder: Path, copies: int) -> Path:
    """One Parquet file holding ``data``'s rows ``copies`` times (row groups of 100, its schema's metadata)."""
    import pyarrow.parquet as pq

    target = folder / "train-00000-of-00001.parquet"
    if target.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    files = sorted(data.glob("*.parquet"))
    schema = pq.ParquetFile(files[0]).schema_arrow
    with pq.ParquetWriter(target, schema) as writer:
        for _ in range(copies):
            for path in files:
                source = pq.ParquetFile(path)
                for group in range(source.metadata.num_row_groups):
                    writer.write_table(source.read_row_group(group), row_group_size=100)
    return folder


def one_group(data: Path, folder: Path, group_mb: int) -> Path:
    """One Parquet file holding ``data``'s rows repeated to ``group_mb`` MB, in a single row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = folder / "train-00000-of-00001.parquet"
    if target.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    tables = [pq.read_table(path) for path in sorted(data.glob("*.parquet"))]
    table = pa.concat_tables(tables)
    copies = max(1, -(-group_mb * 2**20 // table.nbytes))
    whole = pa.concat_tables([table] * copies)
    pq.write_table(whole, target, row_group_size=whole.num_rows)
    return folder


def tree_rss(pid: int) -> int:
    import psutil

    try:
        process = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)])
    except psutil.Error:
        return 0


def run_case(script: str, *args: str) -> dict:
    """Run one case in its own process: wall seconds, CPU seconds of the tree, peak tree RSS."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    before = os.times()
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", script, *args], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    peak = [0]

    def sample() -> None:
        while process.poll() is None:
            peak[0] = max(peak[0], tree_rss(process.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = process.communicate()
    wall = time.perf_counter() - start
    sampler.join()
    after = os.times()
    if process.returncode != 0:
        raise SystemExit(f"case failed: {args}\n{err[-2000:]}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "peak_rss_mb": round(peak[0] / 2**20, 1),
            "output": out.strip()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=20000)
    parser.add_argument("--large", type=int, default=2000)
    parser.add_argument("--memory-only", action="store_true",
                        help="only the memory measurement (the large set made by an earlier run in --out)")
    parser.add_argument("--copies", type=int, default=3,
                        help="the memory measurement's file: the large set's rows this many times over, one file")
    parser.add_argument("--budget-mb", type=int, default=100,
                        help="the memory budget (above an import-only process) that the large file exceeds")
    parser.add_argument("--group-mb", type=int, default=300,
                        help="the single row group's size for the last memory measurement (MB)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work = args.out or Path(tempfile.mkdtemp(prefix="bench-parquet-"))
    print(f"os.cpu_count() = {os.cpu_count()}; work folder {work}", flush=True)
    sets = {"small": (args.small, (32, 32), "PNG", 4), "large": (args.large, (500, 375), "JPEG", 1)}
    rows = []
    for name, (count, size, fmt, shards) in ({} if args.memory_only else sets).items():
        data = work / f"{name}-data"
        if not data.exists():
            made = make_set(data, count, size, fmt, shards)
        else:
            made = sum(p.stat().st_size for p in data.glob("*.parquet"))
        print(f"{name}: {count} {size[0]}x{size[1]} {fmt} in {shards} file(s), {made / 2**20:.1f} MB", flush=True)
        cases = [("pyarrow", PYARROW, (str(data),))]
        for store in (("encoded", "raw") if name == "small" else ("encoded",)):
            for label, script in (("fastdata", FASTDATA), ("datasets", DATASETS)):
                out = work / f"{name}-{label}-{store}.npy"
                subprocess.run(["rm", "-rf", str(out)], check=True)
                cases.append((f"{label} {store}", script, (str(data), str(out), store)))
        for label, script, case_args in cases:
            row = {"set": name, "case": label, "samples": count, "parquet_mb": round(made / 2**20, 1),
                   **run_case(script, *case_args)}
            row["samples_per_s"] = round(count / row["wall_s"], 1)
            row["cpu_ms_per_sample"] = round(1000 * row["cpu_s"] / count, 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    data = work / "large-data"
    if not data.exists():
        make_set(data, *sets["large"])
    data = repeated(data, work / f"large-x{args.copies}", args.copies)
    made = sum(p.stat().st_size for p in data.glob("*.parquet")) / 2**20
    out = work / "large-memory.npy"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    baseline = run_case(BASELINE)
    memory = run_case(FASTDATA, str(data), str(out), "encoded", "0")
    print(json.dumps({"case": "memory", "baseline": baseline, "convert_workers_0": memory}), flush=True)
    grouped = _one_group_memory(work, args.group_mb)
    print(f"\nos.cpu_count() = {os.cpu_count()}")
    if not rows:
        _memory_line(made, memory, baseline, args.budget_mb, None)
        return _group_line(grouped, baseline)
    print(f"{'set':6} {'case':18} {'samples/s':>10} {'wall s':>8} {'CPU ms/sample':>14} {'peak RSS MB':>12}")
    for row in rows:
        print(f"{row['set']:6} {row['case']:18} {row['samples_per_s']:>10} {row['wall_s']:>8} "
              f"{row['cpu_ms_per_sample']:>14} {row['peak_rss_mb']:>12}")
    large = next(r for r in rows if r["set"] == "large" and r["case"] == "fastdata encoded")
    _memory_line(made, memory, baseline, args.budget_mb, large["peak_rss_mb"])
    _group_line(grouped, baseline)


def _one_group_memory(work: Path, group_mb: int) -> dict:
    """Peak RSS converting one file of a single ``group_mb`` MB row group: in one process, and
    with the default workers forked and spawned."""
    data = one_group(work / "large-data", work / f"large-group-{group_mb}mb", group_mb)
    made = sum(p.stat().st_size for p in data.glob("*.parquet")) / 2**20
    cases = {"workers 0": ("0",), "default workers, fork": ("default", "fork"),
             "default workers, spawn": ("default", "spawn")}
    result = {"group_mb": round(made, 1)}
    for label, extra in cases.items():
        out = work / "large-group.npy"
        subprocess.run(["rm", "-rf", str(out)], check=True)
        result[label] = run_case(FASTDATA, str(data), str(out), "encoded", *extra)
    print(json.dumps({"case": "one row group", **result}), flush=True)
    return result


def _group_line(grouped: dict, baseline: dict) -> None:
    print(f"peak memory converting one file of a single {grouped['group_mb']} MB row group (the whole process "
          f"tree; a process that only imports: {baseline['peak_rss_mb']} MB):")
    for label, case in grouped.items():
        if label != "group_mb":
            print(f"  {label:24} {case['peak_rss_mb']:>8} MB RSS  {case['wall_s']:>7} s")


def _memory_line(made_mb: float, memory: dict, baseline: dict, budget_mb: int, pooled_mb: float | None) -> None:
    above = memory["peak_rss_mb"] - baseline["peak_rss_mb"]
    print(f"\npeak memory converting one file of the large set's rows repeated ({made_mb:.1f} MB) in one process "
          "(--workers 0): "
          f"{memory['peak_rss_mb']} MB RSS, {above:.1f} MB above a process that only imports what the conversion "
          f"imports (fastdata, pyarrow, Pillow: {baseline['peak_rss_mb']} MB); budget {budget_mb} MB above that "
          f"baseline: {'within' if above <= budget_mb else 'OVER'}"
          + (f"; with the default workers: {pooled_mb} MB for the whole process tree" if pooled_mb else ""))


if __name__ == "__main__":
    main()
