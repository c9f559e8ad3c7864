"""Named fields: what a sample is made of beyond ``(image, label)`` (docs/fields.md).

- :mod:`fastdata.fields.schema`: a field (:class:`Field`: name, kind, dtype, shape, encoding)
  and a dataset's :class:`Schema`, as the manifest records them; its public names are
  importable from here.
- :mod:`fastdata.fields.values`: Python values -> fields (the kind of a value, the schema the
  first samples make, whether a later sample fits it, a nested item as flat named values).
- :mod:`fastdata.fields.codecs`: how each kind's values are kept as bytes, and as tar members.
"""

from fastdata.fields.schema import (
    ARRAY_DTYPES, BOX_FORMATS, CLASS_IDS, KINDS, LAYOUTS, MEMBER_KEY, RAGGED, SOURCE_META, SPATIAL, VARIABLE, Field,
    FieldError, Schema, classic_schema, name_problem, select, unflatten,
)

__all__ = [
    "ARRAY_DTYPES", "BOX_FORMATS", "CLASS_IDS", "KINDS", "LAYOUTS", "MEMBER_KEY", "RAGGED", "SOURCE_META", "SPATIAL",
    "VARIABLE", "Field", "FieldError", "Schema", "classic_schema", "name_problem", "select", "unflatten",
]
