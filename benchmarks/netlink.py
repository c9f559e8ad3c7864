"""A network link in front of a server on 127.0.0.1, for benchmarks (stdlib only, not part of
fastdata): a TCP proxy whose downlink carries at most ``--bandwidth`` bytes per second, shared by
every connection, and that holds each chunk a client sends for ``--latency-ms`` before passing
it on, so each request pays one round trip. On loopback a server answers at memory speed with no
latency; behind this proxy the download is the bottleneck, as it is across a real network.

    python benchmarks/netlink.py --target 127.0.0.1:9000 --bandwidth 25e6 --latency-ms 20
    # prints "listening on 127.0.0.1:PORT", then serves until killed
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Callable

CHUNK = 64 * 1024
SLACK_S = 0.005


class Link:
    """The shared downlink: each chunk occupies it for ``size / bandwidth`` seconds, in turn."""

    def __init__(self, bandwidth: float, latency_s: float):
        self.bandwidth, self.latency_s = bandwidth, latency_s
        self.free_at = 0.0

    def crossed_at(self, size: int) -> float:
        """When ``size`` bytes sent now have crossed the link (the clock of ``time.monotonic``); a
        link idle for a moment may catch up on the time its proxy lost waking up late (SLACK_S)."""
        start = max(time.monotonic() - SLACK_S, self.free_at)
        self.free_at = start + size / self.bandwidth
        return self.free_at


async def _until(moment: float) -> None:
    delay = moment - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, when: Callable[[int], float]) -> None:
    """Copy ``reader`` to ``writer``, each chunk held until ``when(its size)``; reading goes on
    meanwhile, so the proxy's own delays never slow a single connection down."""
    queue: asyncio.Queue = asyncio.Queue()

    async def deliver() -> None:
        while True:
            moment, data = await queue.get()
            if data is None:
                break
            await _until(moment)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    task = asyncio.create_task(deliver())
    try:
        while data := await reader.read(CHUNK):
            queue.put_nowait((when(len(data)), data))
    finally:
        queue.put_nowait((0.0, None))
        await task


async def serve(target: tuple[str, int], link: Link, port: int = 0) -> None:
    async def connection(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*target)
        except OSError:
            client_writer.close()
            return
        try:
            await asyncio.gather(  # uplink: each request held one round trip; downlink: the shared bandwidth
                _pump(client_reader, server_writer, lambda size: time.monotonic() + link.latency_s),
                _pump(server_reader, client_writer, link.crossed_at))
        except (ConnectionError, OSError):
            pass
        finally:
            for writer in (client_writer, server_writer):
                writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", port)
    print(f"listening on 127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="HOST:PORT of the server behind the link")
    parser.add_argument("--bandwidth", type=float, required=True, help="downlink bytes per second, e.g. 25e6")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added to each request (one round trip)")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    host, port = args.target.rsplit(":", 1)
    asyncio.run(serve((host, int(port)), Link(args.bandwidth, args.latency_ms / 1000), args.port))


if __name__ == "__main__":
    main()
