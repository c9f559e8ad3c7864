"""The storage schemes, one row each: :data:`SCHEMES` maps a URL scheme's canonical name to a
:class:`Scheme` that says what differs between stores: its aliases (``s3a://`` is ``s3://``),
the fsspec protocol that serves it, the extra that installs that backend, what a top-level
name is called there (bucket, container), how to give it credentials, and its capabilities:
conditional writes (``If-Match`` on a put: what the output locks rely on), botocore's retry
settings, a reusable session, an endpoint from the environment.

The filesystem layer (:mod:`fastdata.remote.filesystem`) and the output locks
(:mod:`fastdata.conversion.remote.locks`) read this table and nothing else, so a new store is
one row here (and its fsspec backend). A scheme without a row (``memory://``, ``file://``) is
passed to fsspec as it is, with none of these capabilities.

>>> scheme_of_url("S3A://bucket/data").name
's3'
>>> [row.name for row in SCHEMES.values() if row.conditional_writes]
['s3']
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SCHEMES", "Scheme", "find_scheme", "scheme_of_url"]


@dataclass(frozen=True)
class Scheme:
    """One storage scheme (see the module docstring)."""

    name: str  # canonical: "s3"
    aliases: tuple[str, ...]  # other names of the same store in URLs: ("s3a",)
    protocol: str  # the fsspec protocol serving it
    extra: str  # fastdata's extra that installs its backend (fastdata.extras.EXTRAS)
    container: str = "bucket"  # what the first part of a URL names there ("" : no such thing, e.g. a web host)
    credentials: str = ""  # how to give it credentials (the fix named when none were found)
    conditional_writes: bool = False  # a put honours If-Match: a stale lock is taken over atomically
    botocore: bool = False  # served by s3fs over botocore: its own retries switched off, its session reused
    endpoint_variable: str = ""  # the environment variable that points it at another endpoint

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a URL may use for it."""
        return (self.name, *self.aliases)


SCHEMES: dict[str, Scheme] = {row.name: row for row in (
    Scheme(name="s3", aliases=("s3a",), protocol="s3", extra="s3", conditional_writes=True, botocore=True,
           endpoint_variable="AWS_ENDPOINT_URL",
           credentials="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass "
                       "storage_options={'anon': True} for a public bucket (from the CLI: FSSPEC_S3_ANON=true)"),
    Scheme(name="gs", aliases=("gcs",), protocol="gcs", extra="gcs",
           credentials="run 'gcloud auth application-default login' or set GOOGLE_APPLICATION_CREDENTIALS, or pass "
                       "storage_options={'token': 'anon'} for a public bucket (from the CLI: FSSPEC_GCS_TOKEN=anon)"),
    Scheme(name="az", aliases=("abfs", "abfss"), protocol="abfs", extra="azure", container="container",
           credentials="set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with "
                       "AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN (or sign in with 'az login' and set "
                       "AZURE_STORAGE_ACCOUNT_NAME), or pass connection_string= or account_name= with account_key= "
                       "or sas_token= in storage_options"),
    Scheme(name="http", aliases=("https",), protocol="http", extra="http", container=""),
    # hf://datasets/ORG/NAME: huggingface_hub's file system (Parquet sources)
    Scheme(name="hf", aliases=(), protocol="hf", extra="hf", container=""),
)}
_BY_NAME = {name: row for row in SCHEMES.values() for name in row.names}


def find_scheme(name: str) -> Scheme | None:
    """The row of the scheme written ``name`` (any alias, any case), or None for one without a row."""
    return _BY_NAME.get(name.lower())


def scheme_of_url(url: str) -> Scheme | None:
    """The row of ``url``'s scheme (``s3a://b/k`` -> the ``s3`` row), or None."""
    return find_scheme(url.split("://", 1)[0])
