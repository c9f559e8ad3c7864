"""A URL where fastdata takes a local path is refused, never taken for a relative path (until
object storage is supported, ``Path("s3://bucket/x")`` would be the local folder ``s3:/bucket/x``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fastdata
from fastdata.cli import main
from fastdata.errors import InvalidOptionError, UnsupportedURLError
from fastdata.urls import is_url


def test_what_counts_as_a_url() -> None:
    assert is_url("s3://bucket/x") and is_url("https://host/a.tar") and is_url("gs://b") and is_url("az://c/d")
    assert not is_url("torchvision:CIFAR10") and not is_url("mydata:train_set") and not is_url("out/s3:x")
    assert not is_url(Path("s3://bucket/x"))  # already a local path: the URL is lost by then
    assert not is_url(3)


@pytest.mark.parametrize("command", [
    ["convert", "{folder}", "s3://bucket/digits.tar"],
    ["convert", "s3://bucket/in.npy", "{tmp}/out.npy"],
    ["info", "s3://bucket/digits.tar"],
    ["verify", "gs://bucket/digits.h5"],
    ["bench", "https://example.org/photos", "--out", "{tmp}/bench"],
    ["tune", "s3://bucket/digits.npy"],
    ["merge", "s3://bucket/digits.tar"],
])
def test_the_cli_refuses_a_url_and_writes_nothing(command, uniform_folder: Path, tmp_path: Path, capsys,
                                                  monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = [part.format(folder=uniform_folder, tmp=tmp_path) for part in command]
    url = next(part for part in args if "://" in part)
    roles = {"info": "PATH", "verify": "PATH", "bench": "SOURCE", "tune": "SOURCE", "merge": "OUTPUT"}
    role = ("OUTPUT" if args[2] == url else "SOURCE") if args[0] == "convert" else roles[args[0]]
    assert main(args) == 1
    captured = capsys.readouterr()
    scheme = url.split("://")[0]
    assert captured.err == (f"fastdata: error: {url!r}: {role} is a {scheme}:// URL, and fastdata reads and writes "
                            "local paths only (object storage is not supported yet). Copy the dataset to a local "
                            "directory, or mount the bucket and give its local path.\n")
    assert sorted(os.listdir(tmp_path)) == ["uniform"]  # no ./s3:/bucket/... folder


def test_the_python_api_refuses_urls(uniform_folder: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsupportedURLError, match=r"^'s3://bucket/d.npy': path is a s3:// URL"):
        fastdata.open_dataset("s3://bucket/d.npy")
    with pytest.raises(UnsupportedURLError, match=r"^'s3://bucket/d.npy': path is a s3:// URL"):
        fastdata.verify("s3://bucket/d.npy")
    with pytest.raises(UnsupportedURLError, match=r"^'s3://bucket/out.tar': output is a s3:// URL") as caught:
        fastdata.convert(uniform_folder, "s3://bucket/out.tar", workers=0)
    assert isinstance(caught.value, InvalidOptionError) and isinstance(caught.value, ValueError)
    assert sorted(os.listdir(tmp_path)) == ["uniform"]
