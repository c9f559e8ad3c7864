"""Flip every metadata byte of a converted ``.h5`` dataset, one at a time, and time
``fastdata.verify`` and ``fastdata.open_dataset`` on each damaged copy (with HDF5 layout 1, a
flipped byte made h5py spin for minutes inside a manifest read no signal could interrupt).

Each flip runs in a long-lived child process; the parent kills the child when one flip takes
longer than ``--limit-s`` and records that offset as a hang, then goes on from the next byte.
Bytes inside the datasets' own data are skipped (a flip there is a checksum mismatch, found by
reading, never a metadata parse). Prints one JSON summary: flips, outcomes, slowest flips.

    python benchmarks/flip_hdf5.py --images 1797 [--step 1] [--limit-s 10]
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

CHILD = r"""
import sys, time, json, shutil
from pathlib import Path
import fastdata
from fastdata.errors import FastdataError
source, work = Path(sys.argv[1]), Path(sys.argv[2])
data = source.read_bytes()
for line in sys.stdin:
    offset, value = map(int, line.split())
    damaged = bytearray(data); damaged[offset] = value
    work.write_bytes(bytes(damaged))
    start = time.perf_counter()
    outcome = "ok"
    try:
        report = fastdata.verify(work)
        outcome = "finding" if not report.ok else "verify-ok"
        ds = fastdata.open_dataset(work)
        ds[[0, len(ds) - 1]]
    except FastdataError as exc:
        outcome = outcome if outcome == "finding" else type(exc).__name__
    except Exception as exc:
        outcome = "UNEXPECTED " + type(exc).__name__ + ": " + str(exc)[:120]
    print(json.dumps([offset, outcome, time.perf_counter() - start]), flush=True)
"""


def make_dataset(folder: Path, out: Path, images: int) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(images):
        target = folder / str(i % 10) / f"{i:05d}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray((rng.integers(0, 17, (8, 8)) * 15).astype(np.uint8)).save(target)
    import fastdata

    fastdata.convert(folder, out, workers=0)


def data_ranges(path: Path) -> list[tuple[int, int]]:
    import h5py

    with h5py.File(path, "r") as file:
        return [(file[name].id.get_offset(), file[name].id.get_offset() + file[name].id.get_storage_size())
                for name in file if file[name].id.get_offset() is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=1797)
    parser.add_argument("--step", type=int, default=1, help="flip every STEP-th metadata byte")
    parser.add_argument("--limit-s", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        dataset = tmp / "digits.h5"
        make_dataset(tmp / "digits", dataset, args.images)
        skip = data_ranges(dataset)
        size = dataset.stat().st_size
        original = dataset.read_bytes()
        offsets = [o for o in range(512, size, args.step) if not any(a <= o < b for a, b in skip)]
        results, pending = [], list(offsets)
        while pending:
            child = subprocess.Popen([sys.executable, "-c", CHILD, str(dataset), str(tmp / "damaged.h5")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            while pending:
                offset = pending.pop(0)
                child.stdin.write(f"{offset} {original[offset] ^ 0xFF}\n")
                child.stdin.flush()
                started = time.monotonic()
                line = _read_line(child, args.limit_s)
                if line is None:
                    results.append([offset, "HANG", time.monotonic() - started])
                    child.kill()
                    break
                results.append(json.loads(line))
            child.kill()
            child.wait()
    outcomes: dict[str, int] = {}
    for _, outcome, _ in results:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    slowest = sorted(results, key=lambda row: -row[2])[:5]
    print(json.dumps({"cpu_count": os.cpu_count(), "file_bytes": size, "flips": len(results), "outcomes": outcomes,
                      "slowest": [[o, r, round(s, 3)] for o, r, s in slowest]}, indent=1))


def _read_line(child: subprocess.Popen, limit_s: float) -> str | None:
    import selectors

    selector = selectors.DefaultSelector()
    selector.register(child.stdout, selectors.EVENT_READ)
    if not selector.select(timeout=limit_s):
        return None
    return child.stdout.readline() or None


if __name__ == "__main__":
    main()
