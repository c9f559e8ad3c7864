"""Source fingerprints: what ``--resume`` and "already complete" compare before trusting a
partial or finished output.

* An image folder: every file's relative path, size and modification time, digested per class
  folder (so a change can be named: a class folder added, files added, removed or modified).
* A torchvision or Python dataset: its length and a digest of a sample of its items (up to 16,
  spread over the whole dataset), each digested on its own (so the changed item can be named).
  A dataset whose items are random on every access can therefore not be resumed.
* Array-backed datasets (MNIST family, CIFAR): a digest of all their pixels and labels.
* A converted fastdata dataset: its manifest's own checksum (which covers every data file).

A fingerprint is a small JSON-able dict; :func:`describe_changes` compares two of them.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Callable, Iterable

import numpy as np

SAMPLED_ITEMS = 16
_SHORT = 16  # hex digits kept of each per-group / per-item digest


def _digest(lines: Iterable[bytes]) -> hashlib._Hash:
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line)
    return digest


def of_files(root: str, keys: list[str], class_to_idx: dict[str, int]) -> dict[str, Any]:
    """Fingerprint of an image folder: ``keys`` are paths relative to ``root`` whose first part
    is the class folder. Empty class folders count (they still take a label)."""
    groups: dict[str, list[bytes]] = {name: [] for name in class_to_idx}
    overall = hashlib.sha256("\0".join(sorted(class_to_idx)).encode("utf-8", "surrogateescape"))
    for key in keys:
        try:
            stat = os.stat(os.path.join(root, key))
            size, mtime = stat.st_size, stat.st_mtime_ns
        except OSError:  # a broken link: recorded as such (it fails or is skipped at conversion)
            size, mtime = -1, -1
        line = os.fsencode(key) + b"\0%d\0%d\n" % (size, mtime)
        groups.setdefault(key.split("/", 1)[0], []).append(line)
        overall.update(line)
    summary = {}
    for name, lines in groups.items():
        names = _digest(line.split(b"\0", 1)[0] + b"\n" for line in lines).hexdigest()[:_SHORT]
        summary[name] = [len(lines), names, _digest(lines).hexdigest()[:_SHORT]]
    return {"kind": "files", "count": len(keys), "digest": overall.hexdigest(), "groups": summary}


def sampled_indices(length: int, count: int = SAMPLED_ITEMS) -> list[int]:
    if length <= 0:
        return []
    return sorted({int(i) for i in np.linspace(0, length - 1, min(count, length))})


def of_items(length: int, item_digest: Callable[[int], bytes]) -> dict[str, Any]:
    """Fingerprint of a dataset: its length and the digests of up to 16 items spread over it."""
    sampled = [[index, hashlib.sha256(item_digest(index)).hexdigest()[:_SHORT]] for index in sampled_indices(length)]
    overall = _digest(f"{index}:{digest}\n".encode() for index, digest in sampled)
    overall.update(b"length %d" % length)
    return {"kind": "items", "count": length, "digest": overall.hexdigest(), "sampled": sampled}


def of_arrays(*arrays: np.ndarray) -> dict[str, Any]:
    """Fingerprint of array-backed data (every byte of every array, with its shape)."""
    digest = hashlib.blake2b(digest_size=32)
    for array in arrays:
        digest.update(repr((array.shape, str(array.dtype))).encode())
        digest.update(memoryview(np.ascontiguousarray(array)).cast("B"))
    return {"kind": "arrays", "count": int(len(arrays[0])), "digest": digest.hexdigest()}


def of_manifest(manifest: dict[str, Any], manifest_digest: str) -> dict[str, Any]:
    return {"kind": "manifest", "count": manifest.get("count"), "digest": manifest_digest}


def same(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    return isinstance(old, dict) and (old.get("kind"), old.get("count"), old.get("digest")) == (
        new["kind"], new["count"], new["digest"]
    )


def describe_changes(old: dict[str, Any] | None, new: dict[str, Any]) -> str | None:
    """None when the fingerprints match; otherwise what changed, in words."""
    if same(old, new):
        return None
    if not isinstance(old, dict) or "kind" not in old:
        return "no fingerprint of the source was recorded (written by an older fastdata), so a change cannot be ruled out"
    if old["kind"] != new["kind"]:
        return f"the source is now a different kind of source ({new['kind']}, was {old['kind']})"
    if new["kind"] == "files":
        return _folder_changes(old, new)
    if new["kind"] == "items":
        return _item_changes(old, new)
    if old.get("count") != new["count"]:
        return f"it holds {new['count']:,} samples now, {old.get('count')} before"
    return "its contents differ (same number of samples)"


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def _folder_changes(old: dict[str, Any], new: dict[str, Any]) -> str:
    before, now = old.get("groups") or {}, new["groups"]
    changes = []
    for name in sorted(set(now) - set(before)):
        changes.append(f"class folder {name!r} was added ({_plural(now[name][0], 'file')})")
    for name in sorted(set(before) - set(now)):
        changes.append(f"class folder {name!r} was removed ({_plural(before[name][0], 'file')})")
    for name in sorted(set(before) & set(now)):
        (count_then, names_then, stats_then), (count_now, names_now, stats_now) = before[name], now[name]
        if count_now != count_then:
            verb = "added" if count_now > count_then else "removed"
            changes.append(f"{name!r}: {_plural(abs(count_now - count_then), 'file')} {verb} "
                           f"({count_now:,} now, {count_then:,} before)")
        elif names_now != names_then:
            changes.append(f"{name!r}: files renamed or replaced (same number, {count_now:,})")
        elif stats_now != stats_then:
            changes.append(f"{name!r}: files modified (same names, other sizes or modification times)")
    if not changes:
        changes.append("the files changed")
    shown = "; ".join(changes[:6]) + (f"; and {len(changes) - 6} more changes" if len(changes) > 6 else "")
    return shown


def _item_changes(old: dict[str, Any], new: dict[str, Any]) -> str:
    if old.get("count") != new["count"]:
        return f"the dataset has {new['count']:,} items now, {old.get('count')} before"
    then = {index: digest for index, digest in old.get("sampled") or []}
    differing = [index for index, digest in new["sampled"] if then.get(index) != digest]
    if differing:
        shown = ", ".join(str(i) for i in differing[:5])
        return (f"item{'s' if len(differing) > 1 else ''} {shown} differ{'' if len(differing) > 1 else 's'} "
                "(a dataset with random items cannot be resumed)")
    return "its items differ"
