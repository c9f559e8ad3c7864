"""Named fields: what a sample is made of beyond ``(image, label)`` (docs/fields.md).

- :mod:`fastdata.fields.schema`: a field (:class:`Field`: name, kind, dtype, shape, encoding)
  and a dataset's :class:`Schema`, as the manifest records them; its public names are
  importable from here.
- :mod:`fastdata.fields.kinds`: one class per field kind (:class:`FieldKind`) in one table
  (:data:`KINDS`, name -> instance): how its values are inferred, checked, stored, kept as tar
  members, moved with the image and read back. :func:`register_kind` adds one. fastdata's own
  kinds: :mod:`~fastdata.fields.image_kinds` (image, mask), :mod:`~fastdata.fields.scalar_kinds`
  (int, float), :mod:`~fastdata.fields.array_kind` (array), :mod:`~fastdata.fields.text_kinds`
  (text, text_list, json, bytes).
- :mod:`fastdata.fields.values`: Python values -> fields (the kind of a value, the schema the
  first samples make, whether a later sample fits it, a nested item as flat named values).
- :mod:`fastdata.fields.codecs`: tar member names.
"""

from fastdata.fields.kinds import KINDS, FieldKind, Hint, Stored, kind_named, register_kind, unregister_kind
from fastdata.fields.schema import (
    ARRAY_DTYPES, BOX_FORMATS, CLASS_IDS, LAYOUTS, MEMBER_KEY, RAGGED, SOURCE_META, VARIABLE, Field, FieldError, Schema,
    classic_schema, name_problem, select, unflatten,
)
from fastdata.fields.image_kinds import ImageKind, MaskKind
from fastdata.fields.scalar_kinds import FloatKind, IntKind
from fastdata.fields.array_kind import ArrayKind
from fastdata.fields.text_kinds import BytesKind, JsonKind, TextKind, TextListKind

# fastdata's own kinds, in the order error messages list them
for _kind in (ImageKind(), MaskKind(), IntKind(), FloatKind(), ArrayKind(), TextKind(), TextListKind(), JsonKind(),
              BytesKind()):
    if _kind.name not in KINDS:  # a re-import (importlib.reload) keeps what is registered
        register_kind(_kind)

__all__ = [
    "ARRAY_DTYPES", "BOX_FORMATS", "CLASS_IDS", "KINDS", "LAYOUTS", "MEMBER_KEY", "RAGGED", "SOURCE_META", "VARIABLE",
    "Field", "FieldError", "FieldKind", "Hint", "Schema", "Stored", "classic_schema", "kind_named", "name_problem",
    "register_kind", "select", "unflatten", "unregister_kind",
]
