"""Tar member names (docs/fields.md, "How each format stores it"): a field's member is
``<key>.<suffix>`` under WebDataset's conventions (``.cls`` ints, ``.json`` floats and lists,
``.txt`` text, ``.npy`` arrays), so stock ``webdataset`` decodes them with its default decoders.
How each kind's values become stored bytes and members is the kind's
(:class:`fastdata.fields.kinds.FieldKind`: ``store`` / ``load`` / ``member`` / ``from_member``);
:func:`member_key_problem` says which sample keys can name such members.
"""

from __future__ import annotations

import re


def member_suffix(name: str, extension: str) -> str:
    """The member name after ``<key>.`` of field ``name``: the name itself when it already ends
    in the ``extension`` WebDataset decodes it by (``txt``, ``seg.png``), else ``<name>.<extension>``."""
    if name == extension or name.endswith("." + extension):
        return name
    return f"{name}.{extension}"


MEMBER_NAME_BYTES = 100  # a ustar header's name field (fastdata's tar writer writes no prefix field)
_KEY_CHARACTERS = re.compile(r"[!-~]+")  # printable ASCII, no space


def member_key_problem(key: str, longest_suffix: int = 0) -> str | None:
    """Why ``key`` cannot be the ``<key>`` of member names ``<key>.<suffix>`` (suffixes up to
    ``longest_suffix`` characters), or None when it can: stock ``webdataset`` reads such members
    back as one sample of exactly that ``__key__`` (it ends a key at the first dot of the file
    name), and extracting the shard with ``tar`` writes inside the current directory only."""
    if not isinstance(key, str) or not key:
        return "it is empty"
    if not _KEY_CHARACTERS.fullmatch(key) or "\\" in key:
        return "it holds characters other than printable ASCII without spaces and backslashes"
    parts = key.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "it is not a relative path of plain names"
    if "." in parts[-1]:
        return "its file name holds a dot, where webdataset would end the key"
    if len(key) + 1 + longest_suffix > MEMBER_NAME_BYTES:
        return f"with a {longest_suffix}-character suffix it is longer than a tar header's {MEMBER_NAME_BYTES} characters"
    return None
