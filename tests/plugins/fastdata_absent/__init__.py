"""A third-party format whose dependency is not installed: it declares it first
(:func:`fastdata.formats.require`), so fastdata lists it with the install command instead of
failing when it imports the format."""

from fastdata.formats import require

require("absent", "fastdata_test_module_that_is_not_installed", install="pip install fastdata-absent-backend",
        suffixes=(".absent",), description="needs a package that is not installed (a test plugin)")

import fastdata_test_module_that_is_not_installed  # noqa: E402,F401 - never reached here
