"""Test suites that a package extending fastdata runs on its own code, with pytest (like
``zarr.testing``): :class:`FormatContract`, the contract every writable storage format keeps.

A third-party format's test file subclasses it::

    from fastdata.testing import FormatContract

    class TestZarrFormat(FormatContract):
        format = "zarr"

        def damage(self, out):
            ...  # make a data file unreadable; return what the error must name

Importing this package needs pytest (``pip install 'torch-fastdata[testing]'``); ``import
fastdata`` never imports it.
"""

from __future__ import annotations

from fastdata.extras import require

# before the suite is imported: pytest rewrites its asserts, so a failure shows the values
require("pytest", extra="testing", feature="fastdata.testing (the format contract suite)").register_assert_rewrite(
    "fastdata.testing.contract")

from fastdata.testing.contract import CONTRACTS, FormatContract, Numbered, sample_pixels  # noqa: E402

__all__ = ["CONTRACTS", "FormatContract", "Numbered", "sample_pixels"]
