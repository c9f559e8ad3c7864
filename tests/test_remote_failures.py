"""An unreachable endpoint fails fast and once: fastdata's Retry is the only retry layer under a
read (botocore's retries off, s3fs's loop one attempt), so ``FASTDATA_RETRY_ATTEMPTS=2`` is two
requests, counted here on the client (botocore logs each request it sends) or on the server
(one that answers 503 to every request counts them); never a timing check."""

from __future__ import annotations

import logging
import socket

import pytest

import fastdata
from fastdata.errors import RemoteUnavailableError
from fastdata.remote import Retry

pytest.importorskip("s3fs")
from servers import KEYS, Unavailable  # noqa: E402 - after the skip

URL = "s3://bucket/ds.tar"


def sent(caplog) -> int:
    """HTTP requests botocore sent (one log record each)."""
    return sum(1 for record in caplog.records if record.getMessage().startswith("Sending http request"))


@pytest.fixture
def credentials(monkeypatch):
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # fsspec's cached filesystems keep the endpoint they were made with
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FASTDATA_RETRY_DELAY", "0")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed when this returns: a connection to it is refused


def test_a_closed_port_fails_with_one_clear_error_after_exactly_the_attempts_asked(
        credentials, tmp_path, monkeypatch, caplog, capsys) -> None:
    from fastdata.cli import main

    endpoint = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("FASTDATA_RETRY_ATTEMPTS", "2")
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    caplog.set_level(logging.DEBUG, logger="botocore.endpoint")
    assert main(["info", URL]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"fastdata: error: '{URL}/manifest.json': the server did not answer (endpoint '{endpoint}' "
                          "from AWS_ENDPOINT_URL) after 2 attempts (EndpointConnectionError: Could not connect to the "
                          f"endpoint URL: \"{endpoint}/bucket/ds.tar/manifest.json\"). Check the network or the endpoint")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert sent(caplog) == 2


def test_every_request_is_counted_by_the_server_two_attempts_are_two_requests(credentials, tmp_path) -> None:
    server = Unavailable()  # 503 to every request: a transient error every layer would retry
    try:
        options = {"endpoint_url": f"http://127.0.0.1:{server.port}", "skip_instance_cache": True}
        with pytest.raises(RemoteUnavailableError) as caught:
            fastdata.open_dataset(URL, cache_dir=tmp_path / "cache", storage_options=options,
                                  retry=Retry(attempts=2, delay=0))
        assert str(caught.value).startswith(f"'{URL}/manifest.json': the server answered 503 after 2 attempts (OSError: ")
        assert server.requests == 2
        # botocore retries set by the user in storage_options are theirs to keep: 2 requests per attempt
        mine = {**options, "config_kwargs": {"retries": {"total_max_attempts": 2}}}
        with pytest.raises(RemoteUnavailableError):
            fastdata.open_dataset(URL, cache_dir=tmp_path / "cache", storage_options=mine,
                                  retry=Retry(attempts=2, delay=0))
        assert server.requests == 2 + 2 * 2
    finally:
        server.close()


def test_a_blackholed_address_times_out_once_per_attempt(credentials, tmp_path, caplog) -> None:
    hole = socket.create_server(("127.0.0.1", 0), backlog=0)  # a listener that never accepts
    filler = socket.create_connection(hole.getsockname())  # fills its queue: later SYNs are dropped
    try:
        options = {"endpoint_url": f"http://127.0.0.1:{hole.getsockname()[1]}", "skip_instance_cache": True,
                   "config_kwargs": {"connect_timeout": 0.2}}  # the user's own connect timeout is kept
        caplog.set_level(logging.DEBUG, logger="botocore.endpoint")
        with pytest.raises(RemoteUnavailableError) as caught:
            fastdata.open_dataset(URL, cache_dir=tmp_path / "cache", storage_options=options,
                                  retry=Retry(attempts=2, delay=0))
        assert str(caught.value).startswith(f"'{URL}/manifest.json': the server did not answer after 2 attempts "
                                            "(ConnectTimeoutError: Connect timeout on endpoint URL: ")
        assert sent(caplog) == 2
    finally:
        filler.close()
        hole.close()
