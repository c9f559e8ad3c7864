"""How many times the fused read of one image lets go of the GIL, and where: counted, not timed.

    python benchmarks/gil_releases.py [--count 100] [--images DIR]

Each release (``PyEval_SaveThread``) is a point where another loader thread of the thread backend
takes the GIL, and taking it back costs a context switch (docs/reading.md, "Threads and the
GIL"). This runs ``fastdata.reader.fused.fused_pixels`` (RandomResizedCrop(224) + flip, the
readers' decoder and seeds) on ``--count`` ImageNet-size JPEGs (the set of benchmarks/bench_fused.py,
or ``--images``) in one thread under gdb, with a breakpoint on ``PyEval_SaveThread`` that counts,
between two markers around the images, each release by the C function that made it and the
innermost fastdata line on the Python stack. Needs gdb (``apt-get install gdb``); the Python
lines need the interpreter's gdb extension (``python3.X-gdb.py`` next to it; without it, the C
callers alone). An older checkout on ``PYTHONPATH`` counts its own code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

GDB_SCRIPT = r'''
import collections, re
import gdb

counts, active = collections.Counter(), [False]


def fastdata_line():
    try:
        stack = gdb.execute("py-bt", to_string=True)
    except gdb.error:
        return ""
    for line in stack.splitlines():
        found = re.search(r'File ".*?/(fastdata/[^"]+)", line (\d+)', line)
        if found:
            return "%s:%s" % found.groups()
    return ""


class Release(gdb.Breakpoint):
    def stop(self):
        if active[0]:
            caller = gdb.newest_frame().older()
            name = caller.name() if caller is not None else None
            counts[(str(name).split("(")[0], fastdata_line())] += 1
        return False


class Marker(gdb.Breakpoint):
    def stop(self):
        active[0] = not active[0]
        return False


gdb.execute("set pagination off")
gdb.execute("set breakpoint pending on")
gdb.execute("handle SIGCHLD nostop noprint pass")
Release("PyEval_SaveThread")
Marker("getppid")
gdb.execute("run")
total = sum(counts.values())
print("RELEASES %d" % total)
for (caller, line), count in counts.most_common():
    print("RELEASE %d %s %s" % (count, caller, line))
'''


def child(args: argparse.Namespace) -> None:
    """The images decoded between the markers (``os.getppid()``, a system call nothing else makes here)."""
    import numpy as np

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_gil import load_images

    from fastdata.reader import fused

    images = load_images(args)
    plan = fused.FusedPlan("random_resized_crop", (224, 224), flip_p=0.5)
    decoder, row = fused.default_decoder(), np.empty((224, 224, 3), np.uint8)
    for index in range(min(10, len(images))):  # every path warmed up (imports, caches, the replay's check)
        fused.fused_pixels(images[index], plan, decoder=decoder, out=row, seed=fused.seed_for(0, 0, index))
    os.getppid()
    for index in range(len(images)):
        fused.fused_pixels(images[index], plan, decoder=decoder, out=row, seed=fused.seed_for(1, 0, index))
    os.getppid()
    print(f"DECODER {decoder} IMAGES {len(images)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", help="a folder of JPEGs (default: generate the ImageNet-size set)")
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.count < 1:
        parser.error("--count takes 1 or more")
    if args.child:
        child(args)
        return
    gdb = shutil.which("gdb")
    if gdb is None:
        sys.exit("gdb is not installed: apt-get install gdb (or your system's package), then run this again.")
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "count.py"
        script.write_text(GDB_SCRIPT)
        command = [gdb, "-q", "-batch", "-iex", f"add-auto-load-safe-path {Path(sys.executable).resolve().parent}",
                   "-x", str(script), "--args", sys.executable, __file__, "--child", "--count", str(args.count)]
        if args.images:
            command += ["--images", args.images]
        output = subprocess.run(command, capture_output=True, text=True).stdout
    lines = output.splitlines()
    header = next((line.split() for line in lines if line.startswith("DECODER ")), None)
    total = next((int(line.split()[1]) for line in lines if line.startswith("RELEASES ")), None)
    if header is None or total is None:
        sys.exit(f"gdb did not run the images to the end; its output:\n{output}")
    images = int(header[3])
    print(f"os.cpu_count() = {os.cpu_count()}, {images} JPEGs, fused decoder {header[1]}: "
          f"{total / images:.2f} GIL releases per image")
    print(f"{'per image':>9}  {'C caller':48} fastdata line")
    for line in lines:
        if line.startswith("RELEASE "):
            _, count, caller, *where = line.split(maxsplit=3)
            print(f"{int(count) / images:9.2f}  {caller:48} {' '.join(where)}")


if __name__ == "__main__":
    main()
