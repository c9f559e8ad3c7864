"""Seeded permutations of ``range(size)`` computed where they are needed, never stored: the image of
any few positions costs the same whatever ``size`` (a mix over a source of 10**9 samples holds no
array of them).

:func:`permuted` is a Feistel network over the smallest even number of bits that holds ``size``,
walked until it lands in ``range(size)`` ("cycle walking", Black & Rogaway): a bijection of
``range(size)`` for every key, deterministic in the key and the same on every machine (uint64
arithmetic only). Its round keys come from :func:`round_keys` (a SeedSequence of the caller's
integers) mixed with a per-position stream number by :func:`stream_keys`, so positions of several
permutations (a source's cycles) are permuted in one vectorised call.

Invariant (property-tested): for every ``size >= 1`` and key, ``permuted(np.arange(size), size, k)``
is a permutation of ``range(size)``.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 6
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def round_keys(*words: int) -> np.ndarray:
    """``ROUNDS`` uint64 keys from non-negative integers (a seed, a source number, a salt)."""
    return np.random.SeedSequence(list(words)).generate_state(ROUNDS, dtype=np.uint64)


def _mixed(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every output bit depends on every input bit."""
    with np.errstate(over="ignore"):
        values = (values ^ (values >> _S30)) * _M1
        values = (values ^ (values >> _S27)) * _M2
    return values ^ (values >> _S31)


def stream_keys(keys: np.ndarray, streams: np.ndarray) -> np.ndarray:
    """Round keys of shape ``(ROUNDS, len(streams))``: ``keys`` made distinct per stream number
    (uint64; a cycle through a source, an epoch)."""
    return _mixed(keys[:, None] ^ _mixed(np.asarray(streams, dtype=np.uint64))[None, :])


def permuted(values: np.ndarray, size: int, keys: np.ndarray) -> np.ndarray:
    """The images of ``values`` (ints in ``range(size)``) under the bijection of ``range(size)``
    keyed by ``keys`` (``(ROUNDS,)``, or ``(ROUNDS, len(values))``: one permutation per value's
    stream); int64."""
    values = np.asarray(values, dtype=np.int64)
    if size <= 1 or not values.size:
        return values.copy()
    half = max(1, ((size - 1).bit_length() + 1) // 2)
    keys = np.broadcast_to(keys.reshape(ROUNDS, -1), (ROUNDS, values.size))
    out = values.astype(np.uint64)
    pending = np.arange(values.size)
    while pending.size:  # at most 4 ** half / size < 4 walks on average
        out[pending] = _feistel(out[pending], half, keys[:, pending])
        pending = pending[out[pending] >= np.uint64(size)]
    return out.astype(np.int64)


def _feistel(values: np.ndarray, half: int, keys: np.ndarray) -> np.ndarray:
    """One pass of the network over ``2 * half``-bit values."""
    shift, mask = np.uint64(half), np.uint64((1 << half) - 1)
    left, right = values >> shift, values & mask
    for key in keys:
        left, right = right, left ^ (_mixed(right ^ key) & mask)
    return (left << shift) | right
