"""Deprecated: the writer interface moved to :mod:`fastdata.formats.base` and
:class:`ConvertOptions` to :mod:`fastdata.conversion.options`."""

import warnings

from fastdata.formats.base import Batch, Plan, Writer
from fastdata.conversion.options import STORES, ConvertOptions

warnings.warn(
    "fastdata.plan is deprecated: import Plan, Batch and Writer from fastdata.formats.base, and "
    "ConvertOptions from fastdata.conversion.options.",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["STORES", "Batch", "ConvertOptions", "Plan", "Writer"]
