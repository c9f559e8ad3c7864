"""Benchmark of a tar dataset read from an S3 server (moto, a subprocess on 127.0.0.1) against the
same dataset on local disk, in one run, ratios side by side, from two servers:

- ``loopback``: moto itself. No latency, memory-speed "network"; on a machine of few cores the
  server competes with the decoding for the CPU, so a cold read is bound by the CPU, not the
  download;
- ``link``: the same moto behind ``benchmarks/netlink.py``, a proxy whose downlink carries
  ``--bandwidth`` bytes/s (shared by all connections) and that adds ``--latency-ms`` to each
  request: the download is the bottleneck, as across a real network.

Per store and server:

- warm: every shard already in fastdata's cache; target >= 0.95x the local-disk read;
- cold: the cache emptied before each epoch, so every shard is downloaded while it is decoded;
  its time against the server's own download of the same bytes by a plain fsspec read of every
  shard, one after the other (``fs.cat_file``, the yardstick; target >= 0.8x), and all at
  once (``fs.cat`` of every shard: what the link carries at best), and against the bound
  max(local read, plain download);
- a grid of cold epochs over ``--grid-workers`` x ``--grid-prefetch`` (and local-disk epochs over
  the workers): how the best ``num_workers`` / ``prefetch`` shift when reads wait on the network.

Each figure is the median of ``--repeats`` epochs after a warm-up epoch, DataLoader(num_workers=W,
batch_size=None) over ``TarDataset(..., batch_size=256)``. The data is small on purpose (the
machine may be shared): ``--count`` 32x32 PNGs in ``--shards`` shards, stored two ways: encoded
(each PNG decoded: decode-bound on few cores) and raw (a frombuffer per sample).

    python benchmarks/bench_remote.py --data /tmp/bench_remote --out benchmarks/out/bench_remote.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from torch.utils.data import DataLoader

import fastdata
from fastdata.bench.demo import demo_folder
from fastdata.formats.tar import TarDataset

KEYS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_DEFAULT_REGION": "us-east-1"}
HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server() -> tuple[subprocess.Popen, str]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return server, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise SystemExit("moto server did not start")


def start_link(endpoint: str, bandwidth: float, latency_ms: float) -> tuple[subprocess.Popen, str]:
    """``benchmarks/netlink.py`` in front of ``endpoint``: the link's endpoint."""
    proxy = subprocess.Popen([sys.executable, str(HERE / "netlink.py"), "--target", endpoint.split("//", 1)[1],
                              "--bandwidth", str(bandwidth), "--latency-ms", str(latency_ms)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proxy.stdout.readline()
    if not line.startswith("listening on "):
        proxy.kill()
        raise SystemExit(f"netlink did not start: {line!r}")
    return proxy, "http://" + line.split()[-1]


def use_endpoint(endpoint: str):
    """Point fastdata (``AWS_ENDPOINT_URL``) and a plain s3fs filesystem at ``endpoint``."""
    import s3fs

    os.environ["AWS_ENDPOINT_URL"] = endpoint
    s3fs.S3FileSystem.clear_instance_cache()  # cached filesystems know the previous endpoint
    return s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)


def epoch_seconds(dataset: TarDataset, workers: int) -> float:
    started = time.perf_counter()
    for _ in DataLoader(dataset, batch_size=None, num_workers=workers):
        pass
    return time.perf_counter() - started


def median_epoch(make, workers: int, repeats: int, before=lambda: None) -> float:
    before()
    epoch_seconds(make(), workers)  # warm-up (and, warm, fills the cache)
    times = []
    for _ in range(repeats):
        before()
        times.append(epoch_seconds(make(), workers))
    return statistics.median(times)


def plain_reads(fs, shards: list[str], repeats: int) -> tuple[float, float]:
    """Median seconds of a plain fsspec read of every shard: one after the other, and all at once."""
    sequential, concurrent = [], []
    fs.cat_file(shards[0])  # the client made (once per filesystem), as fastdata's is by its warm-up epoch
    for _ in range(repeats):
        started = time.perf_counter()
        for shard in shards:
            fs.cat_file(shard)
        sequential.append(time.perf_counter() - started)
        started = time.perf_counter()
        fs.cat(shards)
        concurrent.append(time.perf_counter() - started)
    return statistics.median(sequential), statistics.median(concurrent)


def measure(store: str, server: str, local: Path, url: str, shards: list[str], fs, args: argparse.Namespace,
            local_s: float) -> dict:
    """One store's warm, cold and plain-download epochs from one server (the same run)."""
    cache = args.data / "cache"
    total = sum((local / Path(s).name).stat().st_size for s in shards)

    def remote(prefetch: int = 2) -> TarDataset:
        return TarDataset(url, cache_dir=cache, batch_size=256, shuffle=False, prefetch=prefetch)

    def cold() -> None:
        shutil.rmtree(cache, ignore_errors=True)

    shutil.rmtree(cache, ignore_errors=True)
    warm_s = median_epoch(remote, args.workers, args.repeats)
    grid = [{"store": store, "server": server, "num_workers": workers, "prefetch": prefetch,
             "cold_s": median_epoch(lambda: remote(prefetch), workers, args.repeats, before=cold)}
            for workers in args.grid_workers for prefetch in args.grid_prefetch]
    cold_s = next((cell["cold_s"] for cell in grid if (cell["num_workers"], cell["prefetch"]) == (args.workers, 2)),
                  None)  # the headline setting, measured once: from the grid when it is there
    if cold_s is None:
        cold_s = median_epoch(remote, args.workers, args.repeats, before=cold)
    sequential_s, concurrent_s = plain_reads(fs, shards, args.repeats)
    return {
        "store": store, "server": server, "samples": args.count, "shards": len(shards), "bytes": total,
        "local_disk_s": local_s, "warm_cache_s": warm_s, "cold_cache_s": cold_s,
        "plain_sequential_s": sequential_s, "plain_concurrent_s": concurrent_s,
        "warm_vs_local": local_s / warm_s, "cold_MBps": total / cold_s / 1e6,
        "cold_vs_plain_sequential": sequential_s / cold_s, "cold_vs_plain_concurrent": concurrent_s / cold_s,
        # the best a cold epoch can do is overlap download and decode fully: max of the two alone
        "cold_vs_overlap_bound": max(local_s, min(sequential_s, concurrent_s)) / cold_s,
        "bound": "decode" if local_s > min(sequential_s, concurrent_s) else "download",
        "grid": grid,
    }


def local_grid(store: str, local: Path, args: argparse.Namespace) -> list[dict]:
    return [{"store": store, "server": "local disk", "num_workers": workers, "prefetch": None,
             "seconds": median_epoch(lambda: TarDataset(local, batch_size=256, shuffle=False), workers, args.repeats)}
            for workers in args.grid_workers]


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("benchmarks/data/bench_remote"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/bench_remote.json"))
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stores", default="encoded,raw")
    parser.add_argument("--servers", default="loopback,link")
    parser.add_argument("--bandwidth", type=float, default=25e6, help="the link's downlink, bytes/s")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="the link's round trip per request")
    parser.add_argument("--grid-workers", type=lambda text: [int(v) for v in text.split(",")], default=[0, 1, 2, 4])
    parser.add_argument("--grid-prefetch", type=lambda text: [int(v) for v in text.split(",")], default=[0, 2, 4])
    return parser.parse_args()


def main() -> None:
    args = arguments()
    folder = demo_folder(args.data / f"demo-{args.count}", small=args.count, small_size=32)
    moto, endpoint = start_server()
    link = None
    os.environ.update(KEYS)
    rows, local_rows = [], []
    try:
        fs = use_endpoint(endpoint)
        fs.mkdir("bench")
        for store in args.stores.split(","):
            local = args.data / f"demo-{args.count}-{args.shards}-{store}.tar"
            fastdata.convert(folder, local, format="tar", store=store, shard_samples=max(args.count // args.shards, 1),
                             resize="32x32" if store == "raw" else None, resume=True)
            key = f"bench/{local.name}"
            fs.put(str(local), key, recursive=True)
            shards = sorted(f"{key}/{p.name}" for p in local.glob("shard-*.tar"))
            cells = local_grid(store, local, args)
            local_rows += cells
            local_s = next((cell["seconds"] for cell in cells if cell["num_workers"] == args.workers), None)
            if local_s is None:  # not in the grid: measured on its own
                local_s = median_epoch(lambda: TarDataset(local, batch_size=256, shuffle=False), args.workers,
                                       args.repeats)
            for server in args.servers.split(","):
                if server == "link" and link is None:
                    link, link_endpoint = start_link(endpoint, args.bandwidth, args.latency_ms)
                fs = use_endpoint(endpoint if server == "loopback" else link_endpoint)
                rows.append(measure(store, server, local, f"s3://{key}", shards, fs, args, local_s))
    finally:
        for process in (link, moto):
            if process is not None:
                process.terminate()
                process.wait()
    document = {"cpu_count": os.cpu_count(), "loadavg": os.getloadavg(), "num_workers": args.workers,
                "repeats": args.repeats, "link": {"bandwidth": args.bandwidth, "latency_ms": args.latency_ms},
                "rows": rows, "local_grid": local_rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    report(document)


def report(document: dict) -> None:
    print(f"os.cpu_count()={document['cpu_count']} load average {document['loadavg']}")
    for row in document["rows"]:
        print(f"{row['store']:8} {row['server']:8}: warm {row['warm_vs_local']:.2f}x local disk; cold "
              f"{row['cold_cache_s']:.3f} s ({row['cold_MBps']:.1f} MB/s) = {row['cold_vs_plain_sequential']:.2f}x a "
              f"plain read of every shard in turn ({row['plain_sequential_s']:.3f} s), "
              f"{row['cold_vs_plain_concurrent']:.2f}x all at once ({row['plain_concurrent_s']:.3f} s), "
              f"{row['cold_vs_overlap_bound']:.2f}x max(local {row['local_disk_s']:.3f} s, download) "
              f"({row['bound']}-bound)")
        best = min(row["grid"], key=lambda cell: cell["cold_s"])
        cells = " ".join(f"nw={c['num_workers']}/pf={c['prefetch']}:{c['cold_s']:.3f}" for c in row["grid"])
        print(f"{'':19}cold grid: {cells}; best nw={best['num_workers']} prefetch={best['prefetch']}")
    for store in sorted({row["store"] for row in document["local_grid"]}):
        cells = [c for c in document["local_grid"] if c["store"] == store]
        best = min(cells, key=lambda cell: cell["seconds"])
        print(f"{store:8} local disk: " + " ".join(f"nw={c['num_workers']}:{c['seconds']:.3f}" for c in cells)
              + f"; best nw={best['num_workers']}")


if __name__ == "__main__":
    main()
