"""Converted datasets in object storage: ``s3://``, ``gs://``, ``az://``, ``https://``, anything
fsspec knows, read through one bounded cache shared by every process on the machine. This is the
read side, which the readers use; writing a dataset to a URL is :mod:`fastdata.conversion.remote`.

- :mod:`fastdata.remote.filesystem`: a URL -> its fsspec filesystem (``storage_options`` passed
  through, ``AWS_ENDPOINT_URL`` honoured by botocore), retries with backoff (:class:`Retry`), and
  errors that name the URL and the fix, never a credential; :mod:`fastdata.remote.failures` reads
  what s3fs, gcsfs and adlfs raise (an HTTP status, missing credentials) one way for it.
- :mod:`fastdata.remote.schemes`: :data:`SCHEMES`, one row per store (aliases, fsspec protocol,
  the extra to install, credentials, capabilities such as conditional writes).
- :mod:`fastdata.remote.cache`: :class:`Cache`, ``cache_dir`` bounded by ``cache_limit``, least
  recently used files evicted first, never one in use (file locks and atomic renames only); a
  folder of its own (marked ``.fastdata-cache``), refused when it holds anything else.
- :mod:`fastdata.remote.dataset`: :func:`locate`, what every reader calls with its path: a URL
  becomes the dataset's directory in the cache, each file checked against the manifest's
  checksum as it arrives; tar shards are fetched as they are streamed (prefetched per worker),
  npy and HDF5 files before they are memory-mapped.

Readers take ``storage_options=``, ``cache_dir=``, ``cache_limit=`` and ``retry=`` (docs/remote.md).
"""

from fastdata.remote.cache import Cache, CacheStats, Lease, default_cache_dir, default_cache_limit
from fastdata.remote.dataset import LocalFiles, RemoteFiles, RemoteOptions, fetch_dataset, locate, open_remote
from fastdata.remote.filesystem import Retry, filesystem, scrub
from fastdata.remote.schemes import SCHEMES, Scheme

__all__ = [
    "Cache", "CacheStats", "Lease", "LocalFiles", "RemoteFiles", "RemoteOptions", "Retry", "SCHEMES", "Scheme", "default_cache_dir",
    "default_cache_limit", "fetch_dataset", "filesystem", "locate", "open_remote", "scrub",
]
