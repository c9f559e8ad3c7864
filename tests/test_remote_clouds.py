"""``gs://`` and ``az://`` against real emulators on 127.0.0.1, each started once per session:
gcp-storage-emulator (a Python GCS server; gcsfs finds it through ``STORAGE_EMULATOR_HOST``) and
Azurite (Microsoft's Azure Storage emulator, installed with npm; adlfs finds it through a
connection string). No mock of fsspec, gcsfs or adlfs: the bytes travel over sockets.

What the emulators lack, worked around here and only here:
- gcp-storage-emulator serves the JSON API but no gRPC. gcsfs's default filesystem asks GCS's
  storage-control gRPC API for each bucket's layout and waits 60 s for an answer that never
  comes, so ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` (set below, before gcsfs is imported)
  selects gcsfs's plain JSON-API filesystem.
- gcp-storage-emulator checks no credentials: GCS's 401 and 403 answers come from a small HTTP
  server below that refuses every request as GCS does (status and JSON error body).
- gcp-storage-emulator does not implement cancelling a resumable upload (``DELETE`` on the upload
  session answers 501), which gcsfs sends when a chunk fails; no test needs it.
- Azurite speaks http, and adlfs builds an https URL from an account name: the tests reach it
  through connection strings. An account name without a credential, where adlfs asks
  azure-identity for a token, is tested through azure-identity's own exception: azure-storage-blob
  retries that failure for about 86 s before adlfs raises it.
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from PIL import Image

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # before gcsfs is imported: see above

import fastdata
from conftest import WRITABLE_FORMATS, convert_to, output_contents, pattern, run_fastdata, same_samples, save, wait_until
from fastdata.cli import main
from fastdata.errors import CorruptDataError, RemoteAccessError, RemoteNotFoundError
from fastdata.formats.tar import TarDataset
from fastdata.remote import Retry
from servers import BUCKET, ROOT, RequestLog, serving

# Azurite's install: the README's test command puts it here (npm install --prefix .ci/node ...)
AZURITE = ROOT / ".ci" / "node" / "node_modules" / ".bin" / "azurite-blob"
AZURITE_INSTALL = "npm install --prefix .ci/node azurite@3.35.0"
# Azurite's well-known development account (public, in Microsoft's documentation)
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
WRONG_KEY = "d3Jvbmcta2V5LXRoYXQtbXVzdC1uZXZlci1zaG93LWFueXdoZXJlLi4uLi4uLi4uLg=="
HINTS = {
    "gs": "run 'gcloud auth application-default login' or set GOOGLE_APPLICATION_CREDENTIALS, or pass "
          "storage_options={'token': 'anon'} for a public bucket (from the CLI: FSSPEC_GCS_TOKEN=anon)",
    "az": "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or "
          "AZURE_STORAGE_SAS_TOKEN (or sign in with 'az login' and set AZURE_STORAGE_ACCOUNT_NAME), or pass "
          "connection_string= or account_name= with account_key= or sas_token= in storage_options",
}
AZURE_VARIABLES = ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY",
                   "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CLIENT_ID", "AZURE_STORAGE_ANON")


def connection_string(endpoint: str, key: str = AZURE_KEY) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={key};"
            f"BlobEndpoint={endpoint}/{AZURE_ACCOUNT};")


@dataclass
class Cloud:
    """One emulated store: its URL scheme, the environment a process needs to reach it (the
    variables a user sets), and a filesystem of its own to put objects there directly."""

    scheme: str
    endpoint: str
    env: dict[str, str]
    make_fs: Callable[[], Any]
    requests: list[str] = field(default_factory=list)  # the server's request lines, where it logs them

    def url(self, key: str) -> str:
        return f"{self.scheme}://{BUCKET}/{key}"

    def fs(self) -> Any:
        return self.make_fs()


@pytest.fixture(scope="session")
def gcs_server():
    """gcp-storage-emulator in this process, in memory, with the test bucket."""
    gcsfs = pytest.importorskip("gcsfs")
    emulator = pytest.importorskip("gcp_storage_emulator.server")
    import fsspec

    if fsspec.get_filesystem_class("gs") is not gcsfs.core.GCSFileSystem:
        pytest.fail("gcsfs was imported before GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false was set: its default "
                    "filesystem waits 60 s per bucket for the gRPC API the emulator lacks")
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    port = server.server_address[1]  # a free port: the emulator takes a number, not 0
    server.server_close()
    gcs = emulator.create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    gcs.start()
    endpoint = f"http://127.0.0.1:{port}"
    cloud = Cloud("gs", endpoint, {"STORAGE_EMULATOR_HOST": endpoint, "FSSPEC_GCS_TOKEN": "anon"},
                  lambda: gcsfs.GCSFileSystem(token="anon", endpoint_url=endpoint, skip_instance_cache=True))
    log = RequestLog(cloud.requests)
    server_logger = logging.getLogger("gcp_storage_emulator.server")
    server_logger.addHandler(log)
    server_logger.setLevel(logging.INFO)
    yield cloud
    server_logger.removeHandler(log)
    server_logger.setLevel(logging.NOTSET)
    gcs.stop()


def azurite_program() -> str | None:
    if AZURITE.exists() and shutil.which("node"):
        return str(AZURITE)
    return shutil.which("azurite-blob")


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory):
    """Azurite's blob service as a subprocess, its data in a temporary folder, telemetry off."""
    adlfs = pytest.importorskip("adlfs")
    program = azurite_program()
    if program is None:
        pytest.skip(f"Azurite (Azure Storage's emulator, a Node program) is not installed: run "
                    f"'{AZURITE_INSTALL}' in the repository (the README's test command does)")
    folder = tmp_path_factory.mktemp("azurite")
    log = folder / "azurite.log"
    with open(log, "w") as out:
        process = subprocess.Popen([program, "--blobHost", "127.0.0.1", "--blobPort", "0", "--location", str(folder),
                                    "--skipApiVersionCheck", "--loose", "--silent", "--disableTelemetry"],
                                   stdout=out, stderr=subprocess.STDOUT)
    listening = lambda: re.search(r"listens on (http://127\.0\.0\.1:\d+)", log.read_text())  # noqa: E731
    wait_until(listening, f"Azurite's start ({log})", process=process, timeout_s=60)
    endpoint = listening()[1]
    text = connection_string(endpoint)
    cloud = Cloud("az", endpoint, {"AZURE_STORAGE_CONNECTION_STRING": text},
                  lambda: adlfs.AzureBlobFileSystem(connection_string=text, skip_instance_cache=True))
    cloud.fs().mkdir(BUCKET)
    yield cloud
    process.terminate()
    process.wait(timeout=30)


def reach(found: Cloud, monkeypatch, tmp_path: Path) -> Cloud:
    """This process's environment set as a user would set it to reach ``found``."""
    for name in AZURE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in found.env.items():
        monkeypatch.setenv(name, value)
    if found.scheme == "gs":  # FSSPEC_GCS_TOKEN=anon, as fsspec read it when it was imported
        import fsspec.config

        monkeypatch.setitem(fsspec.config.conf, "gcs", {"token": "anon"})
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    return found


@pytest.fixture(params=["gs", "az"])
def cloud(request, monkeypatch, tmp_path: Path) -> Cloud:
    """Each emulated store in turn."""
    return reach(request.getfixturevalue({"gs": "gcs_server", "az": "azure_server"}[request.param]), monkeypatch,
                 tmp_path)


def listing(cloud: Cloud, key: str) -> list[str]:
    return sorted(name.rsplit("/", 1)[-1] for name in cloud.fs().find(f"{BUCKET}/{key}"))


# --- writing and reading ---------------------------------------------------------------------


@pytest.mark.parametrize("name", WRITABLE_FORMATS)
def test_a_dataset_converted_to_the_url_reads_back_as_the_local_conversion(
        cloud: Cloud, name: str, uniform_folder: Path, tmp_path: Path) -> None:
    local = convert_to(uniform_folder, tmp_path, name, "encoded")
    url = cloud.url(f"written/{local.name}")
    options = {"shard_samples": 5} if name == "tar" else {}
    fastdata.convert(uniform_folder, url, format=name, store="encoded", workers=0, **options)
    if local.is_dir():
        assert listing(cloud, f"written/{local.name}") == sorted(p.name for p in local.iterdir())
    else:
        got = tmp_path / "got.h5"  # the local engine's datasets; "created" may differ by a second
        got.write_bytes(cloud.fs().cat_file(f"{BUCKET}/written/{local.name}"))
        assert output_contents(got) == output_contents(local)
    order = {"shuffle": False} if name == "tar" else {}
    remote = fastdata.open_dataset(url, cache_dir=tmp_path / "read", **order)
    assert remote.url == url
    same_samples(remote, fastdata.open_dataset(local, **order), 12)
    if name != "tar":
        images, labels = remote[[11, 0, 5]]
        local_images, local_labels = fastdata.open_dataset(local)[[11, 0, 5]]
        assert torch.equal(images, local_images) and torch.equal(labels, local_labels)


def test_the_cli_converts_to_the_url_then_info_and_verify_read_it(cloud: Cloud, uniform_folder: Path,
                                                                  tmp_path: Path) -> None:
    url = cloud.url("cli/ds.tar")
    assert main(["convert", str(uniform_folder), url, "--shard-samples", "5", "--quiet"]) == 0
    env = {"FASTDATA_CACHE_DIR": str(tmp_path / "cli-cache")}
    info = run_fastdata("info", url, env=env)
    assert info.returncode == 0, info.stderr
    assert f"path:     {url}\n" in info.stdout and "samples:  12\n" in info.stdout
    verify = run_fastdata("verify", url, env=env)
    assert verify.returncode == 0, verify.stderr
    assert verify.stdout.startswith(f"{url}: OK (tar, 12 samples; 4 checksums match)")


# gcsfs hands aiohttp each chunk of a resumable upload as bytes, and aiohttp warns about a large
# bytes body (a ResourceWarning, hidden by Python's default filters); under this suite's
# warnings-as-errors the warning would abort the upload inside gcsfs
@pytest.mark.filterwarnings("ignore:Sending a large body directly with raw bytes:ResourceWarning")
def test_a_file_past_gcsfs_resumable_threshold_goes_up_in_a_resumable_upload_and_reads_back(
        gcs_server: Cloud, tmp_path: Path, monkeypatch) -> None:
    reach(gcs_server, monkeypatch, tmp_path)
    folder = tmp_path / "large"  # 8 x 512x512 RGB stored raw: one 6.3 MB images file, past gcsfs's 5 MiB
    for i in range(8):
        save(Image.fromarray(pattern(512, 512, seed=i)), folder / f"c{i % 2}" / f"{i}.png", compress_level=0)
    local = convert_to(folder, tmp_path, "npy", "raw")
    big = max(local.iterdir(), key=lambda p: p.stat().st_size)
    assert big.stat().st_size > 5 * 2**20
    url = gcs_server.url("large/ds.npy")
    start = len(gcs_server.requests)
    fastdata.convert(folder, url, format="npy", store="raw", workers=0)
    uploads = [line for line in gcs_server.requests[start:] if "uploadType=resumable" in line]
    assert uploads, "no resumable upload reached the emulator"
    remote = fastdata.open_dataset(url, cache_dir=tmp_path / "read")
    assert torch.equal(remote[list(range(8))][0], fastdata.open_dataset(local)[list(range(8))][0])


# --- damage and failures ---------------------------------------------------------------------


def test_a_changed_object_is_named_by_verify_and_by_the_reader(cloud: Cloud, uniform_folder: Path,
                                                               tmp_path: Path) -> None:
    local = convert_to(uniform_folder, tmp_path, "tar", "raw", shard_samples=4)
    url = cloud.url("changed/ds.tar")
    cloud.fs().put(str(local) + "/", f"{BUCKET}/changed/ds.tar/", recursive=True)
    shard = bytearray((local / "shard-000001.tar").read_bytes())
    shard[1024] ^= 0xFF  # inside the first image member: same size, other bytes
    cloud.fs().pipe_file(f"{BUCKET}/changed/ds.tar/shard-000001.tar", bytes(shard))
    report = fastdata.verify(url, cache_dir=tmp_path / "cache")
    assert not report.ok and report.path == url and len(report.problems) == 1
    assert report.problems[0].startswith(f"'{url}/shard-000001.tar': its blake2b ")
    assert "does not match the manifest's" in report.problems[0]
    with pytest.raises(CorruptDataError) as caught:
        list(TarDataset(url, cache_dir=tmp_path / "cache", shuffle=False, prefetch=0))
    assert str(caught.value).startswith(f"'{url}/shard-000001.tar': its blake2b ")
    assert "(the same after fetching it again)" in str(caught.value)


def test_a_missing_bucket_is_named_with_the_fix_when_reading_and_when_writing(cloud: Cloud, uniform_folder: Path,
                                                                              tmp_path: Path) -> None:
    url = f"{cloud.scheme}://no-such-bucket/ds.npy"
    with pytest.raises(RemoteNotFoundError) as read:
        fastdata.open_dataset(url, cache_dir=tmp_path / "cache", retry=Retry(attempts=1))
    with pytest.raises(RemoteNotFoundError) as written:
        fastdata.convert(uniform_folder, url, workers=0)
    for caught in (read, written):
        message = str(caught.value)
        what = "container" if cloud.scheme == "az" else "bucket"
        assert message == (f"{url!r}: the {what} 'no-such-bucket' does not exist (404). Check the {what}'s name in "
                           f"the URL, or create the {what} first."), message
        assert "\n" not in message and AZURE_KEY not in message


def test_an_azure_key_given_in_storage_options_or_the_environment_never_shows(
        azure_server: Cloud, uniform_folder: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection_string(azure_server.endpoint, WRONG_KEY))
    url = azure_server.url("denied/ds.npy")
    with pytest.raises(RemoteAccessError) as from_environment:
        fastdata.open_dataset(url, cache_dir=tmp_path / "cache", retry=Retry(attempts=1),
                              storage_options={"skip_instance_cache": True})
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    options = {"connection_string": connection_string(azure_server.endpoint, WRONG_KEY), "skip_instance_cache": True}
    with pytest.raises(RemoteAccessError) as from_options:
        fastdata.open_dataset(url, cache_dir=tmp_path / "cache", retry=Retry(attempts=1), storage_options=options)
    for caught in (from_environment, from_options):
        message = str(caught.value)
        assert message.startswith(f"'{url}/manifest.json': access denied (403: HttpResponseError: Server failed to "
                                  "authenticate the request.")
        assert message.endswith(f"To fix: check the credentials in use ({HINTS['az']}), and that they may read this "
                                "bucket.")
        assert "ErrorCode:AuthorizationFailure" in message and "\n" not in message, message
        assert WRONG_KEY not in message and WRONG_KEY[:20] not in message


def test_no_azure_credentials_is_one_error_with_the_fix(azure_server: Cloud, tmp_path: Path, monkeypatch,
                                                        capsys) -> None:
    for name in AZURE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    url = azure_server.url("nocreds/ds.npy")
    with pytest.raises(RemoteAccessError) as caught:  # adlfs refuses when the filesystem is made
        fastdata.open_dataset(url, cache_dir=tmp_path / "cache", retry=Retry(attempts=1),
                              storage_options={"skip_instance_cache": True})
    assert str(caught.value) == (f"{url!r}: no credentials found (ValueError: unable to connect to account for Must "
                                 f"provide either a connection_string or account_name with credentials!!). To fix: "
                                 f"{HINTS['az']}.")
    pytest.importorskip("adlfs").AzureBlobFileSystem.clear_instance_cache()  # one made with credentials earlier
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["info", url]) == 1
    assert capsys.readouterr().err == f"fastdata: error: {caught.value}\n"


def test_an_azure_account_name_without_a_credential_is_explained_as_no_credentials(monkeypatch) -> None:
    """adlfs given an account name alone asks azure-identity for a token at the first request;
    azure-storage-blob retries that failure for about 86 s (backoff 15, 25, 43 s) before adlfs
    raises it, so the exception is made here by azure-identity itself, told to look in the
    environment only, and explained as a request's failure would be."""
    identity = pytest.importorskip("azure.identity")
    from fastdata.remote.filesystem import explain

    monkeypatch.setenv("AZURE_TOKEN_CREDENTIALS", "EnvironmentCredential")
    for name in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_USERNAME"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(Exception) as raised:
        identity.DefaultAzureCredential().get_token("https://storage.azure.com/.default")
    assert type(raised.value).__name__ == "ClientAuthenticationError"
    error = explain(raised.value, "az://container/ds.npy/manifest.json")
    assert isinstance(error, RemoteAccessError)
    assert str(error).startswith("'az://container/ds.npy/manifest.json': no credentials found "
                                 "(ClientAuthenticationError: DefaultAzureCredential failed to retrieve a token from "
                                 "the included credentials.")
    assert str(error).endswith(f"To fix: {HINTS['az']}.") and "\n" not in str(error)


def test_no_gcs_credentials_is_one_error_with_the_fix(gcs_server: Cloud, tmp_path: Path, monkeypatch) -> None:
    missing = tmp_path / "no-such-key.json"
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(missing))  # google-auth looks there first
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.endpoint)
    url = gcs_server.url("nocreds/ds.npy")
    with pytest.raises(RemoteAccessError) as caught:
        fastdata.open_dataset(url, cache_dir=tmp_path / "cache", retry=Retry(attempts=1),
                              storage_options={"token": "google_default", "skip_instance_cache": True})
    assert str(caught.value) == (f"{url!r}: no credentials found (DefaultCredentialsError: File {missing} was not "
                                 f"found.). To fix: {HINTS['gs']}.")


class _RefusingGCS(http.server.BaseHTTPRequestHandler):
    """What GCS answers a request it refuses (gcp-storage-emulator checks no credentials): 401
    to an anonymous caller, 403 to one whose credentials may not read the bucket."""

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        status = 403 if self.headers.get("Authorization") else 401
        who = "reader@example.iam.gserviceaccount.com" if status == 403 else "Anonymous caller"
        message = (f"{who} does not have storage.objects.get access to the Google Cloud Storage object. "
                   "Permission 'storage.objects.get' denied on resource (or it may not exist).")
        body = json.dumps({"error": {"code": status, "message": message,
                                     "errors": [{"message": message, "domain": "global", "reason": "required"}]}})
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())


@pytest.fixture
def refusing_gcs(monkeypatch):
    pytest.importorskip("gcsfs")
    with serving(_RefusingGCS) as base:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", base)
        yield


def test_gcs_refusals_are_explained_with_the_fix_and_never_show_the_token(refusing_gcs, tmp_path: Path,
                                                                          monkeypatch) -> None:
    with pytest.raises(RemoteAccessError) as anonymous:
        fastdata.open_dataset("gs://private/ds.npy", cache_dir=tmp_path, retry=Retry(attempts=1),
                              storage_options={"token": "anon", "skip_instance_cache": True})
    assert str(anonymous.value) == (
        "'gs://private/ds.npy/manifest.json': no valid credentials were sent (401: HttpError: Anonymous caller does "
        "not have storage.objects.get access to the Google Cloud Storage object. Permission 'storage.objects.get' "
        f"denied on resource (or it may not exist)., 401). To fix: {HINTS['gs']}.")
    monkeypatch.setenv("FETCH_RAW_TOKEN_EXPIRY", "false")  # gcsfs would ask Google for the token's expiry first
    token = "ya29.an-access-token-that-must-never-show"
    with pytest.raises(RemoteAccessError) as denied:
        fastdata.open_dataset("gs://private/ds.npy", cache_dir=tmp_path, retry=Retry(attempts=1),
                              storage_options={"token": token, "skip_instance_cache": True})
    message = str(denied.value)
    assert message.startswith("'gs://private/ds.npy/manifest.json': access denied (403: OSError: Forbidden: ")
    assert "reader@example.iam.gserviceaccount.com does not have storage.objects.get access" in message
    assert message.endswith(f"To fix: check the credentials in use ({HINTS['gs']}), and that they may read this "
                            "bucket.") and "\n" not in message
    assert token not in message and token not in repr(denied.value)


def test_the_readme_test_command_installs_azurite_where_these_tests_look_and_ci_runs_that_command() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```\n(python3 -m venv \.venv .*-m pytest)\n```", readme)  # "The tests", "Development"
    assert len(commands) == 2 and commands[0] == commands[1]
    assert f"&& {AZURITE_INSTALL} &&" in commands[0]
    assert f"\n{commands[0]}\n" in (ROOT / ".ci" / "run").read_text()


# --- locks ------------------------------------------------------------------------------------


def test_an_azure_bucket_lock_has_one_holder_at_a_time(azure_server: Cloud, monkeypatch, tmp_path: Path) -> None:
    from fastdata.remote import RemoteOptions
    from fastdata.conversion.remote.locks import BucketLock

    cloud = reach(azure_server, monkeypatch, tmp_path)
    url = cloud.url("locked/out.tar")
    first = BucketLock(f"{url}.partial.lock", "merge", url, RemoteOptions())
    second = BucketLock(f"{url}.partial.lock", "convert", url, RemoteOptions())
    assert first.try_acquire() is None  # the exclusive create was granted
    try:
        holder = second.try_acquire()  # Azurite refuses the second create (overwrite=False: If-None-Match: *)
        assert holder is not None and holder["operation"] == "merge" and holder["token"] == first.token
        assert holder["pid"] == os.getpid() and not second.held
        first.check()  # still its own
    finally:
        first.release()
    assert not cloud.fs().exists(f"{BUCKET}/locked/out.tar.partial.lock")
    assert second.try_acquire() is None and second.held
    second.release()


def test_a_gcs_bucket_lock_is_created_only_if_absent(gcs_server: Cloud, monkeypatch, tmp_path: Path) -> None:
    """The emulator ignores GCS's preconditions (it stores both creates), so what is checked is
    that the lock is written with ``ifGenerationMatch=0``, which GCS itself enforces."""
    from fastdata.remote import RemoteOptions
    from fastdata.conversion.remote.locks import BucketLock

    cloud = reach(gcs_server, monkeypatch, tmp_path)
    url = cloud.url("locked/out.tar")
    start = len(cloud.requests)
    lock = BucketLock(f"{url}.partial.lock", "merge", url, RemoteOptions())
    assert lock.try_acquire() is None and lock.held
    lock.release()
    uploads = [line for line in cloud.requests[start:] if "POST /upload/" in line]
    assert len(uploads) == 1 and "ifGenerationMatch=0" in uploads[0], uploads
    assert not cloud.fs().exists(f"{BUCKET}/locked/out.tar.partial.lock")
