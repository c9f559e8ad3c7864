"""The README's results: ``fastdata bench`` on two seeded workloads, side by side per workload.

    python benchmarks/readme_bench.py [--quick]

1. small: 20,000 32x32 PNGs (CIFAR-like; ``fastdata.bench.demo.make_demo_folder``), every format and
   store, num_workers auto, 1 warm-up + 3 measured epochs.
2. large: 500 JPEGs with sides of 256-512 px (ImageNet-like), ``--resize 224x224`` (raw
   conversions store 224x224; the folder and encoded rows decode and resize per sample),
   batch 16 (32 batches an epoch: fewer than 20 is mostly worker start-up), 1 warm-up + 2
   measured epochs.

Results (recommendation, tables, reasons, results.json/csv, throughput.png) go to benchmarks/out/readme-*/.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from fastdata.bench import BenchConfig, machine_info, run_bench
from fastdata.bench.demo import demo_folder

HERE = Path(__file__).resolve().parent


def folder(name: str, **kwargs) -> Path:
    return demo_folder(HERE / "data" / name, seed=0, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the script runs")
    args = parser.parse_args()
    scale = 20 if args.quick else 1
    workloads = [
        ("small", folder(f"readme-small-{20000 // scale}", small=20000 // scale, small_size=32),
         BenchConfig(epochs=3, warmup=1)),
        ("large", folder(f"readme-large-{500 // scale}", small=0, large=500 // scale, large_sides=(256, 512)),
         BenchConfig(epochs=2, warmup=1, resize="224x224", batch_size=16)),  # 32 batches an epoch
    ]
    info = machine_info()
    print(f"machine: {info}")
    for name, source, config in workloads:
        start = time.perf_counter()
        result = run_bench(source, config, HERE / "out" / f"readme-{name}",
                           progress=lambda message: print(message, file=sys.stderr))
        print(f"\n## {name}: {source.name} ({time.perf_counter() - start:.0f} s)\n")
        for item in result.conversions:
            if item["conversion_s"] is not None:
                print(f"- {item['format']} {item['store']}: {item['disk_bytes'] / 1e6:.1f} MB, "
                      f"converted in {item['conversion_s']:.1f} s")
        print(f"\nrecommendation: {result.recommendation}")
        print("\n".join(result.warnings))
        print("\n```\n" + result.table + "\n```\n")
        print("\n".join(f"- {line}" for line in result.verdicts))


if __name__ == "__main__":
    main()
