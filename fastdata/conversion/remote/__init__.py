"""A conversion whose output is a URL (``fastdata convert SOURCE s3://bucket/out.tar``, ``fastdata
merge URL``): the write side of :mod:`fastdata.remote`, built on its filesystems and retries.

- :mod:`fastdata.conversion.remote.upload`: the uploads: tar shards as they are closed (then
  removed locally), the rest when the conversion is done, the manifest last.
- :mod:`fastdata.conversion.remote.locks`: one writer of a URL at a time, through lock objects in
  the bucket.
- :mod:`fastdata.conversion.remote.units`: a job array's units shared through the bucket.

See docs/remote.md.
"""
