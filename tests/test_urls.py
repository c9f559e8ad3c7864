"""A URL where fastdata still takes only a local path (``preview --out``) is refused, never
taken for a relative path (``Path("s3://bucket/x")`` would be the local folder ``s3:/bucket/x``);
where it reads one, an unreachable server or a missing backend is one clear error. Reading from
real servers is tests/test_remote.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import fastdata
from fastdata.cli import main
from fastdata.errors import DependencyMissingError, InvalidOptionError, RemoteUnavailableError
from fastdata.remote import Retry
from fastdata.urls import is_url

REFUSED = ("is a {scheme}:// URL, and this writes to local paths only (of the writing commands only 'fastdata "
           "convert', 'fastdata merge' and 'fastdata bench --out' upload to a URL). Write to a local directory, then copy it to the bucket (e.g. 'aws s3 cp "
           "--recursive DIR URL').")


def test_what_counts_as_a_url() -> None:
    assert is_url("s3://bucket/x") and is_url("https://host/a.tar") and is_url("gs://b") and is_url("az://c/d")
    assert not is_url("torchvision:CIFAR10") and not is_url("mydata:train_set") and not is_url("out/s3:x")
    assert not is_url(Path("s3://bucket/x"))  # already a local path: the URL is lost by then
    assert not is_url(3)


@pytest.mark.parametrize("command", [
    ["preview", "{folder}", "--out", "s3://bucket/preview.png"],
])
def test_the_cli_refuses_a_url_it_would_write_and_writes_nothing(command, uniform_folder: Path, tmp_path: Path,
                                                                 capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = [part.format(folder=uniform_folder, tmp=tmp_path) for part in command]
    url = next(part for part in args if "://" in part)
    role = "OUT" if args[0] in ("bench", "preview") else "OUTPUT"
    assert main(args) == 1
    captured = capsys.readouterr()
    assert captured.err == f"fastdata: error: {url!r}: {role} " + REFUSED.format(scheme="s3") + "\n"
    assert sorted(os.listdir(tmp_path)) == ["uniform"]  # no ./s3:/bucket/... folder


@pytest.mark.parametrize("command", [["info", "{url}"], ["verify", "{url}"], ["tune", "{url}"],
                                     ["bench", "{url}", "--out", "{tmp}/bench"]])
def test_reading_a_url_with_no_server_is_one_error_naming_it_and_nothing_local(command, tmp_path: Path, capsys,
                                                                                monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FASTDATA_RETRY_ATTEMPTS", "2")
    monkeypatch.setenv("FASTDATA_RETRY_DELAY", "0")
    url = "http://127.0.0.1:9/digits.tar"  # the discard port: nothing answers
    assert main([part.format(url=url, tmp=tmp_path) for part in command]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"fastdata: error: '{url}/manifest.json': the server did not answer after 2 attempts (")
    assert err.endswith("). Check the network or the endpoint, then run again; the cache keeps what arrived.\n")
    assert "Traceback" not in err and not (tmp_path / "http:").exists()


def test_open_dataset_retries_as_told_then_names_the_url(tmp_path: Path) -> None:
    with pytest.raises(RemoteUnavailableError, match=r"^'http://127.0.0.1:9/d.npy/manifest.json': the server did "
                                                     r"not answer after 3 attempts") as caught:
        fastdata.open_dataset("http://127.0.0.1:9/d.npy", cache_dir=tmp_path, retry=Retry(attempts=3, delay=0))
    assert isinstance(caught.value, ConnectionError) and isinstance(caught.value, OSError)


def test_a_missing_backend_names_the_extra_that_installs_it(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "s3fs", None)
    with pytest.raises(DependencyMissingError, match=r"^Reading s3:// URLs \('s3://bucket/d.npy'\) needs the s3fs "
                                                     r"package, which is not installed. Install it with: pip install "
                                                     r"'torch-fastdata\[s3\]' or, in a checkout of fastdata, pip install '\.\[s3\]'$"):
        fastdata.open_dataset("s3://bucket/d.npy", cache_dir=tmp_path)
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # missing, whether or not it is installed here
    with pytest.raises(DependencyMissingError, match=r"^Reading gs:// URLs \('gs://bucket/d.npy'\) needs the gcsfs "
                                                     r"package, .* pip install 'torch-fastdata\[gcs\]' or, in a checkout of "
                                                     r"fastdata, pip install '\.\[gcs\]'$"):
        fastdata.open_dataset("gs://bucket/d.npy", cache_dir=tmp_path)
    monkeypatch.setitem(sys.modules, "adlfs", None)
    with pytest.raises(DependencyMissingError, match=r"^Reading az:// URLs \('az://container/d.npy'\) needs the adlfs "
                                                     r"package, .* pip install 'torch-fastdata\[azure\]' or, in a checkout of "
                                                     r"fastdata, pip install '\.\[azure\]'$"):
        fastdata.open_dataset("az://container/d.npy", cache_dir=tmp_path)


def test_credentials_are_scrubbed_from_what_is_shown() -> None:
    from fastdata.remote import scrub

    signed = "https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAEXAMPLE%2F1&X-Amz-Signature=abc123&x=1"
    assert scrub(signed) == "https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Signature=***&x=1"
    assert scrub("https://user:hunter22@host/d.tar") == "https://***@host/d.tar"
    assert scrub("failed with key AKIAEXAMPLE and secret s3cr3t-value",
                 {"key": "AKIAEXAMPLE", "secret": "s3cr3t-value", "client_kwargs": {"aws_session_token": "tok-123456"},
                  "endpoint_url": "http://127.0.0.1:9000"}) == "failed with key *** and secret ***"



def test_azure_keys_and_the_values_of_secret_environment_variables_are_scrubbed(monkeypatch) -> None:
    from fastdata.remote import scrub

    key = "c2VjcmV0LWtleS12YWx1ZQ=="
    assert scrub(f"DefaultEndpointsProtocol=http;AccountName=acct;AccountKey={key};BlobEndpoint=http://h/acct;") == (
        "DefaultEndpointsProtocol=http;AccountName=acct;AccountKey=***;BlobEndpoint=http://h/acct;")
    assert scrub("https://acct.blob.core.windows.net/c/d.tar?sv=2024-01-01&sig=abc%2Bdef") == (
        "https://acct.blob.core.windows.net/c/d.tar?sv=2024-01-01&sig=***")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "plain-secret-value")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "other-secret-value")
    assert scrub("refused plain-secret-value, then other-secret-value") == "refused ***, then ***"


def test_retry_options_are_checked_up_front() -> None:
    assert Retry(attempts=4, delay=0.5, max_delay=1.0).waits() == [0.5, 1.0, 1.0]
    with pytest.raises(InvalidOptionError, match=r"^Invalid retry attempts 0\. Use an integer >= 1\.$"):
        Retry(attempts=0)
    with pytest.raises(InvalidOptionError, match=r"^Invalid cache_limit -1\. Use a positive number of bytes\.$"):
        fastdata.open_dataset("s3://bucket/d.npy", cache_limit=-1)
