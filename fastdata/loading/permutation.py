"""Seeded permutations of ``range(size)`` computed where they are needed, never stored: the image of
any few positions costs the same whatever ``size`` (a mix over a source of 10**9 samples holds no
array of them).

:func:`permuted` is a 6-round (12 below 2**16 values, 24 below 2**10: fewer left some pairings of
a position and its image likelier than others) Feistel network over ``range(a * b)`` with mixed
radices ``a, b`` (about ``sqrt(size)`` each, ``a * b - size < a``: halves added modulo ``a`` and
``b``, as format-preserving encryption does), walked until it lands in ``range(size)`` ("cycle
walking", Black & Rogaway; almost never more than one step): a bijection of ``range(size)`` for
every key, deterministic in the key and the same on every machine (uint64 arithmetic only). Its
round keys come from :func:`round_keys` (a SeedSequence of the caller's integers) mixed with a
per-position stream number by :func:`stream_keys`, so positions of several permutations (a
source's cycles) are permuted in one vectorised call.

Invariant (property-tested): for every ``size >= 1`` and key, ``permuted(np.arange(size), size, k)``
is a permutation of ``range(size)``.
"""

from __future__ import annotations

import math

import numpy as np

ROUNDS = 24  # below 2**10 values: with 12, some position -> image pairs were 13% likelier (at 10 values)
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # a multiplicative hash's odd constant (2**64 / golden ratio)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S32 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(32)


def round_keys(*words: int) -> np.ndarray:
    """``ROUNDS`` uint64 keys from non-negative integers (a seed, a source number, a salt)."""
    return np.random.SeedSequence(list(words)).generate_state(ROUNDS, dtype=np.uint64)


def _mixed(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every output bit depends on every input bit (uint64 arrays wrap)."""
    values = (values ^ (values >> _S30)) * _M1
    values = (values ^ (values >> _S27)) * _M2
    return values ^ (values >> _S31)


def stream_keys(keys: np.ndarray, streams: np.ndarray) -> np.ndarray:
    """Round keys of shape ``(ROUNDS, len(streams))``: ``keys`` made distinct per stream number
    (uint64; a cycle through a source, an epoch); ``(ROUNDS, 1)`` when every stream is the same."""
    streams = np.asarray(streams, dtype=np.uint64)
    if streams.size and (streams == streams[0]).all():
        streams = streams[:1]
    return _mixed(keys[:, None] ^ _mixed(streams)[None, :])


def permuted(values: np.ndarray, size: int, keys: np.ndarray) -> np.ndarray:
    """The images of ``values`` (ints in ``range(size)``) under the bijection of ``range(size)``
    keyed by ``keys`` (``(ROUNDS,)`` or ``(ROUNDS, 1)``: one permutation; ``(ROUNDS,
    len(values))``: one per value's stream); int64."""
    values = np.asarray(values, dtype=np.int64)
    if size <= 1 or not values.size:
        return values.copy()
    radix = math.isqrt(size - 1) + 1  # a: the smallest with a * a >= size
    radices = (radix, -(-size // radix))  # a * b >= size, a * b - size < a
    keys = keys.reshape(ROUNDS, -1)[: ROUNDS if size < 2**10 else 12 if size < 2**16 else 6]  # the first: as before
    out = _feistel(values.astype(np.uint64), radices, keys)
    pending = np.flatnonzero(out >= np.uint64(size))
    while pending.size:  # rare: a * b - size < sqrt(size) of the a * b values lie outside
        out[pending] = _feistel(out[pending], radices, keys if keys.shape[1] == 1 else keys[:, pending])
        pending = pending[out[pending] >= np.uint64(size)]
    return out.astype(np.int64)


def _feistel(values: np.ndarray, radices: tuple[int, int], keys: np.ndarray) -> np.ndarray:
    """One pass of the network over ``range(a * b)``: ``x = left * b + right`` (``left < a``,
    ``right < b``); each round ``left, right = right, (left + F(right)) % a`` (then the radices
    swap), ``F`` a multiplicative hash of ``right ^ key``; an even number of rounds ends in the
    radices it began with."""
    first, second = np.uint64(radices[0]), np.uint64(radices[1])
    left, right = values // second, values % second
    for key in keys:
        hashed = ((right ^ key) * _MULTIPLIER) >> _S32
        left, right = right, (left + hashed) % first
        first, second = second, first
    return left * second + right
