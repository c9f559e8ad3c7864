"""Real servers on 127.0.0.1 for the tests of datasets in object storage (the fixtures that start
them are in conftest.py): moto's S3 server, whose request log counts what was downloaded, and an
HTTP server answering range requests. Nothing here mocks fsspec or s3fs: bytes travel over sockets."""

from __future__ import annotations

import contextlib
import http.server
import io
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import wait_until

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "fastdata-test"
KEYS = {"AWS_ACCESS_KEY_ID": "testing-key-id", "AWS_SECRET_ACCESS_KEY": "testing-secret-value",
        "AWS_DEFAULT_REGION": "us-east-1"}


class RequestLog(logging.Handler):
    """A server's request lines (werkzeug and gcp-storage-emulator log one per request), kept in
    ``lines`` (a list of the caller's, or a new one)."""

    def __init__(self, lines: list[str] | None = None) -> None:
        super().__init__()
        self.lines: list[str] = [] if lines is None else lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def gets(self, key: str) -> int:
        return sum(1 for line in self.lines if re.search(rf"(?<![A-Z])GET /{BUCKET}/{re.escape(key)}[ ?]", line))


class S3:
    """A moto S3 server on a free loopback port that can be stopped and started again (its
    objects live in this process, so they outlast a restart)."""

    def __init__(self) -> None:
        from moto import server as moto_server

        self.server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        self.host, self.port = self.server.get_host_and_port()
        self.endpoint = f"http://{self.host}:{self.port}"
        self.log = RequestLog()
        logging.getLogger("werkzeug").addHandler(self.log)
        logging.getLogger("werkzeug").setLevel(logging.INFO)

    def fs(self):
        import s3fs

        return s3fs.S3FileSystem(endpoint_url=self.endpoint, key=KEYS["AWS_ACCESS_KEY_ID"],
                                 secret=KEYS["AWS_SECRET_ACCESS_KEY"], skip_instance_cache=True)

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        from moto import server as moto_server

        self.server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()


def upload(s3: S3, local: Path, key: str) -> str:
    """``local`` (a dataset folder or file) put under ``key`` in the test bucket; its URL."""
    s3.fs().put(str(local), f"{BUCKET}/{key}", recursive=local.is_dir())
    return f"s3://{BUCKET}/{key}"


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Static files with ``Range: bytes=a-b`` answered 206 (http.server answers 200 to it)."""

    def log_message(self, *args) -> None:  # quiet
        pass

    def send_head(self):
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return None
        data = path.read_bytes()
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if match:
            start = int(match[1])
            end = min(int(match[2]) if match[2] else len(data) - 1, len(data) - 1)
            body = data[start : end + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        else:
            body = data
            self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return io.BytesIO(body)


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler], directory: Path | None = None):
    """Requests to 127.0.0.1 answered by ``handler`` in a thread (with ``directory``, a
    :class:`RangeHandler` serving it) while the block runs: the server's base URL."""
    make = handler if directory is None else (
        lambda *args, **kwargs: handler(*args, directory=str(directory), **kwargs))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class Unavailable:
    """An HTTP server on 127.0.0.1 that answers every request ``503 Service Unavailable`` (what
    an overloaded store says; every retry layer would retry it) and counts them in
    :attr:`requests`."""

    def __init__(self) -> None:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def answer(self) -> None:
                owner.requests += 1
                body = b"" if self.command == "HEAD" else (
                    b"<Error><Code>ServiceUnavailable</Code><Message>Please reduce your request rate.</Message></Error>")
                self.send_response(503)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = answer

        self.requests = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class CacheSizes:
    """The bytes a :class:`fastdata.remote.Cache` holds, sampled in a thread while the block runs
    (``with CacheSizes(cache) as sizes: ...``; then ``sizes.samples``)."""

    def __init__(self, cache) -> None:
        self.cache, self.samples = cache, []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample)

    def _sample(self) -> None:
        while not self._done.is_set():
            self.samples.append(self.cache.usage())
            time.sleep(0.001)

    def __enter__(self) -> "CacheSizes":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


_STUCK = """
import pathlib, sys, threading
import fastdata
from fastdata.conversion.remote import upload

closed = upload.ShardSink.closed

def closed_then_stuck(self, path):  # the test kills this process here, the shard up and removed locally
    closed(self, path)
    if path.name == {shard!r}:
        pathlib.Path({marker!r}).write_text("stuck")
        threading.Event().wait()

upload.ShardSink.closed = closed_then_stuck
{call}
"""


def stuck_after_upload(call: str, shard: str, marker: Path) -> subprocess.Popen:
    """A process running ``call`` (Python, after ``import fastdata``) that stops for good once it
    has uploaded ``shard`` of a conversion or merge to a URL, holding whatever it holds; returned
    once it is there (``marker`` written), to be killed with ``os.killpg``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), FASTDATA_CHECKPOINT_INTERVAL_S="0")  # a checkpoint per unit
    process = subprocess.Popen([sys.executable, "-c", _STUCK.format(shard=shard, marker=str(marker), call=call)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    wait_until(marker.exists, f"the upload of {shard}", process=process)
    return process


def kill(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=30)


def downloaded(s3: S3, url: str, local: Path) -> Path:
    """The objects at ``url``, downloaded as they are (to compare byte for byte)."""
    s3.fs().get(url[len("s3://"):] + "/", str(local) + "/", recursive=True)
    return local
