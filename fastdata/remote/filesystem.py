"""A URL -> its fsspec filesystem, every remote call retried and its errors explained.

fsspec and its backends (s3fs, gcsfs, adlfs, aiohttp for https://) do the talking; this module
only picks the backend by scheme (its extra named when missing), passes ``storage_options``
through, retries what is transient, and turns what is not (404, 403, no credentials) into one
line that names the URL and the fix, with credentials scrubbed from it.

S3-compatible stores (MinIO, R2, Ceph, moto) are reached through the standard
``AWS_ENDPOINT_URL`` environment variable, which botocore (under s3fs) honours itself, or
``storage_options={"endpoint_url": ...}`` (s3fs's ``client_kwargs`` work too).

fastdata's :class:`Retry` is the one retry layer: for S3, botocore's own retries are off and
s3fs's retry loop makes one attempt (:func:`single_attempts`), so ``attempts=2`` is two requests,
each bounded by botocore's connect timeout (unless ``storage_options`` set ``config_kwargs`` of
their own).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

from fastdata.errors import (
    DependencyMissingError, FastdataError, InvalidOptionError, RemoteAccessError, RemoteNotFoundError, RemoteUnavailableError,
)
from fastdata.extras import EXTRAS, require
from fastdata.remote.failures import TRANSIENT_NAMES, is_transient_status, lacks_credentials, one_line, status_of

logger = logging.getLogger(__name__)
T = TypeVar("T")

# scheme -> the extra whose modules (fastdata.extras.EXTRAS) its backend needs, named when missing
BACKENDS: dict[str, str] = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure",
                            "abfss": "azure", "http": "http", "https": "http",
                            "hf": "hf"}
_CREDENTIAL_HINTS = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass "
          "storage_options={'anon': True} for a public bucket (from the CLI: FSSPEC_S3_ANON=true)",
    "gs": "run 'gcloud auth application-default login' or set GOOGLE_APPLICATION_CREDENTIALS, or pass "
          "storage_options={'token': 'anon'} for a public bucket (from the CLI: FSSPEC_GCS_TOKEN=anon)",
    "az": "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or "
          "AZURE_STORAGE_SAS_TOKEN (or sign in with 'az login' and set AZURE_STORAGE_ACCOUNT_NAME), or pass "
          "connection_string= or account_name= with account_key= or sas_token= in storage_options",
}
# environment variables whose values are secrets: never shown, whatever a backend puts in its message
_SECRET_ENVIRONMENT = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_CONNECTION_STRING",
                       "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CLIENT_SECRET")
# exception class names (anywhere in the MRO) of errors worth another attempt: the connection
# dropped, timed out or was refused, or the server answered 5xx / "slow down"
_TRANSIENT = {
    "ConnectionError", "TimeoutError", "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
    "ConnectionClosedError", "ClientConnectorError", "ServerDisconnectedError", "ClientPayloadError",
    "ClientOSError", "IncompleteReadError", "ResponseStreamingError", "ProtocolError",
}
_TRANSIENT_TEXT = re.compile(r"\b(50[0-4]|SlowDown|Throttl|InternalError|ServiceUnavailable|RequestTimeout)",
                             re.IGNORECASE)
_SECRET_QUERY = re.compile(r"(?i)((?:X-Amz-[A-Za-z-]+|X-Goog-[A-Za-z-]+|Signature|AWSAccessKeyId|sig|se|sp|"
                           r"token|access_token|key|secret)=)[^&;\s'\"]+")
_SESSIONS: dict[str, Any] = {}  # scheme -> a botocore session to reuse (see remember_session)
# botocore's settings for every s3 filesystem fastdata opens, under the user's own config_kwargs:
# no botocore retry (fastdata's Retry retries), a bounded wait for a connection
S3_CONFIG = {"retries": {"total_max_attempts": 1}, "connect_timeout": 5}
# what S3, GCS and Azure answer when the bucket (container) itself is missing
_NO_BUCKET = re.compile(r"NoSuchBucket|ContainerNotFound|(bucket|container) does not exist", re.IGNORECASE)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s'\"]+@")


@dataclass(frozen=True)
class Retry:
    """How transient remote errors are retried: ``attempts`` in all (1: no retry), the first
    wait ``delay`` seconds, doubling up to ``max_delay``."""

    attempts: int = 5
    delay: float = 0.5
    max_delay: float = 8.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise InvalidOptionError(f"Invalid retry attempts {self.attempts!r}. Use an integer >= 1.")
        for name in ("delay", "max_delay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise InvalidOptionError(f"Invalid retry {name} {value!r}. Use seconds >= 0.")

    @classmethod
    def from_env(cls) -> "Retry":
        """The default, or what ``$FASTDATA_RETRY_ATTEMPTS`` and ``$FASTDATA_RETRY_DELAY`` (seconds) say."""
        values: dict[str, Any] = {}
        for key, name, kind in (("attempts", "FASTDATA_RETRY_ATTEMPTS", int), ("delay", "FASTDATA_RETRY_DELAY", float)):
            text = os.environ.get(name)
            if text:
                try:
                    values[key] = kind(text)
                except ValueError:
                    raise InvalidOptionError(f"${name} is {text!r}; expected a number.") from None
        return cls(**values)

    def waits(self) -> list[float]:
        """The pauses between attempts."""
        return [min(self.delay * 2**n, self.max_delay) for n in range(self.attempts - 1)]


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower()


def bucket_of(url: str) -> str:
    """The bucket (or container, or host) a URL names: what follows ``scheme://`` up to the next '/'."""
    return url.split("://", 1)[-1].split("/", 1)[0]


def scrub(text: str, storage_options: dict[str, Any] | None = None) -> str:
    """``text`` without credentials: signed-URL query values, ``user:password@``, the string
    values given in ``storage_options`` (keys, secrets, tokens) and those of the environment
    variables that hold secrets."""
    text = _USERINFO.sub(r"\1***@", _SECRET_QUERY.sub(r"\1***", text))
    secrets = [os.environ.get(name, "") for name in _SECRET_ENVIRONMENT]
    for value in _secret_values(storage_options or {}) + [value for value in secrets if len(value) >= 6]:
        text = text.replace(value, "***")
    return text


def _secret_values(options: dict[str, Any]) -> list[str]:
    found = []
    for key, value in options.items():
        if isinstance(value, dict):
            found += _secret_values(value)
        elif isinstance(value, str) and len(value) >= 6 and key not in ("endpoint_url", "region_name"):
            found.append(value)
    return found


def filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem serving ``url`` and the path on it (fsspec's own name for the
    object, e.g. ``bucket/key`` for s3)."""
    scheme = scheme_of(url)
    _require_backend(scheme, url)
    import fsspec  # imported here: only remote datasets need it, and `import fastdata` stays light

    options = dict(storage_options or {})
    reused = _SESSIONS.get(scheme) if not options else None  # credentials from the environment only
    if reused is not None:
        options["session"] = reused
    try:
        fs, path = fsspec.core.url_to_fs(url, **single_attempts(scheme, options))
    except Exception as exc:  # noqa: BLE001 - gcsfs and adlfs look for credentials here, before any request
        if lacks_credentials(exc):
            raise explain(exc, url, storage_options) from None
        if not isinstance(exc, (ImportError, ValueError)):
            raise
        if isinstance(exc, ImportError) or "Protocol not known" in str(exc):
            raise DependencyMissingError(
                f"{scrub(url)!r}: no fsspec backend for {scheme}:// is installed ({exc}). Install the fsspec "
                "implementation for it (see https://filesystem-spec.readthedocs.io/en/latest/api.html#other-known-"
                "implementations)."
            ) from None
        raise InvalidOptionError(f"{scrub(url)!r}: {scrub(str(exc), storage_options)}") from None
    if scheme in ("s3", "s3a"):
        fs.retries = 1  # s3fs's own retry loop: one attempt (a class attribute, not an option)
    return fs, path


def single_attempts(scheme: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with :data:`S3_CONFIG` under their ``config_kwargs`` for s3 (a key the user
    set wins), so that botocore makes one attempt per fastdata attempt."""
    if scheme not in ("s3", "s3a"):
        return options
    return {**options, "config_kwargs": {**S3_CONFIG, **(options.get("config_kwargs") or {})}}


def remember_session(url: str, fs: Any, storage_options: dict[str, Any] | None) -> None:
    """Keep an s3 filesystem's botocore session (once it has one) for the filesystems this
    process and its forked DataLoader workers open next: a new session loads botocore's service
    model again, ~0.2 s of CPU per worker and epoch. It holds configuration, not connections."""
    scheme = scheme_of(url)
    if storage_options or scheme not in ("s3", "s3a") or scheme in _SESSIONS:
        return  # a session made from storage_options (a profile, keys) is never handed to another URL
    if getattr(fs, "session", None) is not None:
        _SESSIONS[scheme] = fs.session


def _require_backend(scheme: str, url: str) -> None:

    require("fsspec", extra="remote", feature=f"Reading {scrub(url)!r}")
    extra = BACKENDS.get(scheme)
    for module in EXTRAS.get(extra, ()):
        require(module, extra=extra, feature=f"Reading {scheme}:// URLs ({scrub(url)!r})")


def is_transient(exc: BaseException) -> bool:
    """Whether another attempt may succeed (a dropped/refused/timed-out connection, a 5xx)."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _TRANSIENT or names & TRANSIENT_NAMES or type(exc).__module__.startswith("aiohttp"):
        return True
    status = status_of(exc)
    if status is not None:
        return is_transient_status(status)
    return isinstance(exc, OSError) and bool(_TRANSIENT_TEXT.search(str(exc)))


def explain(exc: BaseException, url: str, storage_options: dict[str, Any] | None = None, *,
            attempts: int = 1) -> Exception:
    """The fastdata error for ``exc`` raised while reading ``url``: what failed and the fix."""
    shown = scrub(url)
    cause = scrub(f"{type(exc).__name__}: {one_line(str(exc))}", storage_options)
    scheme = scheme_of(url)
    hint = _CREDENTIAL_HINTS.get({"s3a": "s3", "gcs": "gs", "abfs": "az", "abfss": "az"}.get(scheme, scheme), "")
    status = status_of(exc)
    if lacks_credentials(exc):
        return RemoteAccessError(f"{shown!r}: no credentials found ({cause}). To fix: {hint or 'pass them in storage_options'}.")
    if status == 401:  # the request went out without credentials (gcsfs falls back to anonymous) or with stale ones
        return RemoteAccessError(f"{shown!r}: no valid credentials were sent (401: {cause}). To fix: "
                                 f"{hint or 'pass them in storage_options'}.")
    if _NO_BUCKET.search(str(exc)):  # the bucket (container) itself: reading and writing alike
        return missing_bucket(url)
    if isinstance(exc, FileNotFoundError) or status == 404 or re.search(r"\b404\b|NoSuchKey|NoSuchBucket|Not Found",
                                                                         str(exc)):
        return RemoteNotFoundError(f"{shown!r} does not exist (404: {cause}). Check the URL: it names the dataset "
                                   "directory (or .h5 file) that 'fastdata convert' wrote.")
    if isinstance(exc, PermissionError) or status == 403 or re.search(
            r"\b403\b|AccessDenied|Forbidden|InvalidAccessKeyId|SignatureDoesNotMatch", str(exc)):
        fix = f"check the credentials in use ({hint})" if hint else "check the credentials in storage_options"
        return RemoteAccessError(f"{shown!r}: access denied (403: {cause}). To fix: {fix}, and that they may read "
                                 "this bucket.")
    if is_transient(exc):
        endpoint = os.environ.get("AWS_ENDPOINT_URL") if scheme in ("s3", "s3a") else None
        where = f" (endpoint {scrub(endpoint)!r} from AWS_ENDPOINT_URL)" if endpoint else ""
        what = f"the server answered {status}" if status else "the server did not answer"
        return RemoteUnavailableError(
            f"{shown!r}: {what}{where} after {attempts} attempt{'s' if attempts > 1 else ''} "
            f"({cause}). Check the network or the endpoint, then run again; the cache keeps what arrived."
        )
    return RemoteUnavailableError(f"{shown!r}: cannot read ({cause}).")


def missing_bucket(url: str) -> RemoteNotFoundError:
    """The error for a URL whose bucket (Azure: container) does not exist, reading or writing."""
    what = "container" if scheme_of(url) in ("az", "abfs", "abfss") else "bucket"
    shown = scrub(url)
    return RemoteNotFoundError(f"{shown!r}: the {what} {bucket_of(shown)!r} does not exist (404). Check the {what}'s "
                               f"name in the URL, or create the {what} first.")


@contextlib.contextmanager
def naming_the_bucket(url: str, storage_options: dict[str, Any] | None = None) -> Iterator[None]:
    """Around the first requests made for ``url``: a 404 that came because its bucket does not
    exist (not every store says so in its answer) is reported as such, after one more request
    asking for the bucket."""
    try:
        yield
    except RemoteNotFoundError as exc:
        if scheme_of(url) in ("http", "https") or "does not exist (404)." in str(exc):
            raise
        try:
            fs, _ = filesystem(url, storage_options)
            exists = fs.exists(bucket_of(url))
        except Exception:  # noqa: BLE001 - the first error is the one to report
            raise exc from None
        if exists:
            raise
        raise missing_bucket(url) from None


def with_retry(call: Callable[[], T], url: str, retry: Retry, storage_options: dict[str, Any] | None = None) -> T:
    """``call()``, again after each transient error (waiting as ``retry`` says); any other error,
    or the last one, raised as :func:`explain` words it."""
    waits = retry.waits()
    for attempt in range(retry.attempts):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - classified below, re-raised explained
            if isinstance(exc, FastdataError):  # already ours (a checksum mismatch, a missing backend)
                raise
            if attempt < len(waits) and is_transient(exc):
                logger.info("%s: %s; attempt %d of %d in %.1f s", scrub(url), scrub(type(exc).__name__),
                            attempt + 2, retry.attempts, waits[attempt])
                time.sleep(waits[attempt])
                continue
            raise explain(exc, url, storage_options, attempts=attempt + 1) from None
    raise AssertionError("unreachable")  # pragma: no cover
