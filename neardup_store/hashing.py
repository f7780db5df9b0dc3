"""Vectorised 64-bit hashing primitives shared by shingling, MinHash and banding.

Everything that shapes a stored value is pinned here, in integer arithmetic modulo 2**64,
so results are identical on every machine, process and release (numpy wraps unsigned
array arithmetic silently; no platform-dependent width or byte order is involved).

* ``fmix64`` is the 64-bit finaliser of MurmurHash3 (Austin Appleby, public domain): a
  bijection on 64-bit words with full avalanche.
* ``derive_keys`` expands a user seed into any number of 64-bit constants with the
  SplitMix64 generator (Steele, Lea and Flood 2014, constants as published by Vigna), in
  separate named domains, so adding a new use of the seed never shifts an old one. We do
  not use numpy's random generators: their streams are not promised to stay the same
  across numpy releases.
* ``span_hashes`` hashes many contiguous spans of one code array at once with a
  polynomial over Z/2**64 computed from prefix sums, so the cost is a handful of array
  operations whatever the span length (words, word k-grams, short documents). Fixed-width
  character windows take the compiled rolling loop of :mod:`.kernels`, which gives the
  same values.

Specification (``tests/test_spec.py`` recomputes every value from it in plain Python).
All arithmetic is on unsigned 64-bit integers, wrapping modulo 2**64; ``>>`` is a
logical shift and ``^`` is xor.

``fmix64(x)``
    ``x ^= x >> 33; x *= 0xFF51AFD7ED558CCD; x ^= x >> 33; x *= 0xC4CEB9FE1A85EC53;
    x ^= x >> 33``. Test vector: ``fmix64(1) == 0xB456BCFC34C2CB2C``.
SplitMix64 from state ``s``
    Each output first advances ``s += 0x9E3779B97F4A7C15``, then computes ``z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB``
    and outputs ``z ^ (z >> 31)``.
``derive_keys(seed, domain, count)``
    1. ``tag`` is the 64-bit FNV-1a hash of the domain name's ASCII bytes: start at
       ``0xCBF29CE484222325``; for each byte ``c``: ``tag = (tag ^ c) * 0x100000001B3``.
    2. ``start`` is the first SplitMix64 output from state ``seed ^ tag``.
    3. The keys are the first ``count`` SplitMix64 outputs from state ``start``. So the
       keys of a shorter ``count`` are a prefix of a longer one's.

    Test vector: ``derive_keys(1, "shingle", 3) == [0x2E55529B226832E1,
    0x51E87A62D92176C1, 0xCDFB33432BA3E4A6]``.
Seed domains
    Every seeded constant of a signature or a band key comes from ``derive_keys(seed,
    domain, count)``, where ``seed`` is ``MinHashConfig.seed`` (a store's ``config.seed``):

    ======================  ============  ==================================================
    domain                  count         use
    ======================  ============  ==================================================
    ``"shingle"``           3             ``[0]`` word key: hashes each word's characters;
                                          ``[1]`` shingle key: hashes char shingles *and*
                                          word shingles; ``[2]`` bag key: labels repeats
                                          (:mod:`.text`)
    ``"oph-densify"``       num_perm      ``p[j]``: probe key of OPH bin ``j`` (:mod:`.minhash`)
    ``"kperm-a"``           num_perm      ``a[i] = key[i] | 1``: multiplier of permutation
                                          ``i`` (forced odd)
    ``"kperm-b"``           num_perm      ``b[i]``: addend of permutation ``i``
    ``"band-multilinear"``  bands × rows  ``m[j]``: multiplier of signature position ``j``
                                          (not forced odd), multilinear band keys (:mod:`.lsh`)
    ``"band"``              bands         start value of band ``b``, fold band keys (format 1)
    ======================  ============  ==================================================
``span_hashes``: the hash of codes ``c[0..n-1]`` (n ≥ 1) under ``key``
    ``fmix64(sum(c[j] * B**j for j < n) + n * 0xD6E8FEB86659FD93 + key)`` with ``B =``
    :data:`POLY_BASE` ``= 0x9E3779B97F4A7C15``. The codes are a character span's code
    points (each below 2**32) or a word shingle's 64-bit word hashes (:mod:`.text` says
    which key each use takes). The length term keeps spans that differ only by trailing
    zero codes apart.
``high_bits_below(h, bound)``
    ``((h >> 32) * bound) >> 32``: the top 32 bits of ``h`` mapped onto ``[0, bound)`` by
    multiply-shift (exact for ``bound <= 2**32``).
"""

from __future__ import annotations

import threading

import numpy as np
import numpy.typing as npt

U64 = np.uint64
MASK64 = (1 << 64) - 1

FMIX_C1 = U64(0xFF51AFD7ED558CCD)
FMIX_C2 = U64(0xC4CEB9FE1A85EC53)
_S33 = U64(33)

# Odd multiplier of the span polynomial (the 64-bit golden ratio) and its inverse mod 2**64.
POLY_BASE = 0x9E3779B97F4A7C15
_POLY_BASE_INV = pow(POLY_BASE, -1, 1 << 64)
# Mixed into a span's hash with its length, so spans that differ only by trailing zero
# codes still hash apart.
_LENGTH_MULT = U64(0xD6E8FEB86659FD93)
SPAN_CONSTANTS = (U64(POLY_BASE), U64(_POLY_BASE_INV), _LENGTH_MULT)
"""``(base, base inverse, length multiplier)`` of the span hash, for the compiled window
loop of :mod:`.kernels`, which must give exactly :func:`span_hashes`' values."""


# Elementwise chains run over blocks of this many values, so each block's temporaries stay
# in the CPU cache between operations (about twice as fast as whole-array passes).
BLOCK = 1 << 15


def _fmix_in_place(x: npt.NDArray[np.uint64], scratch: npt.NDArray[np.uint64]) -> None:
    np.right_shift(x, _S33, out=scratch)
    x ^= scratch
    x *= FMIX_C1
    np.right_shift(x, _S33, out=scratch)
    x ^= scratch
    x *= FMIX_C2
    np.right_shift(x, _S33, out=scratch)
    x ^= scratch


def fmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """MurmurHash3's 64-bit finaliser, applied elementwise (returns a new array)."""
    out = np.array(x, dtype=np.uint64, copy=True)
    flat = out.reshape(-1)
    scratch = np.empty(min(BLOCK, flat.size), dtype=np.uint64)
    for lo in range(0, flat.size, BLOCK):
        block = flat[lo : lo + BLOCK]
        _fmix_in_place(block, scratch[: len(block)])
    return out


def _splitmix64(state: int, count: int) -> list[int]:
    out = []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        out.append(z ^ (z >> 31))
    return out


def derive_keys(seed: int, domain: str, count: int) -> npt.NDArray[np.uint64]:
    """``count`` 64-bit constants for one named use (``domain``) of ``seed``.

    The domain name is folded in with a fixed FNV-1a hash, so different domains give
    independent-looking streams from the same seed.
    """
    tag = 0xCBF29CE484222325
    for byte in domain.encode("ascii"):
        tag = ((tag ^ byte) * 0x100000001B3) & MASK64
    (start,) = _splitmix64(seed ^ tag, 1)
    return np.array(_splitmix64(start, count), dtype=np.uint64)


POWER_TABLE_LIMIT = 1 << 20
"""Most powers the shared table keeps (16 bytes each); longer calls build their own."""

_Powers = tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]


class _PowerTable:
    """Cached powers ``POLY_BASE**j`` and ``POLY_BASE**-j`` (mod 2**64), grown on demand.

    Both arrays are published together as one tuple, replaced (never changed) under a
    lock, so a thread signing while another grows the table never pairs one size's
    forward powers with another's inverse ones. The table stops at
    :data:`POWER_TABLE_LIMIT`: one long document must not leave its size in memory for
    the life of the process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pair: _Powers = _power_pair(1)

    @property
    def forward(self) -> npt.NDArray[np.uint64]:
        return self.pair[0]

    @property
    def inverse(self) -> npt.NDArray[np.uint64]:
        return self.pair[1]

    def at_least(self, length: int) -> _Powers:
        """Forward and inverse powers with at least ``length`` entries each."""
        pair = self.pair
        if length <= len(pair[0]):
            return pair
        if length > POWER_TABLE_LIMIT:
            return _power_pair(length)  # for this call only
        with self._lock:
            pair = self.pair
            if length > len(pair[0]):
                size = min(max(length, 2 * len(pair[0]), 1 << 16), POWER_TABLE_LIMIT)
                pair = self.pair = _power_pair(size)
            return pair


def _power_pair(size: int) -> _Powers:
    return _powers(POLY_BASE, size), _powers(_POLY_BASE_INV, size)


def _powers(base: int, size: int) -> npt.NDArray[np.uint64]:
    steps = np.full(size, base, dtype=np.uint64)
    steps[0] = 1
    return np.cumprod(steps, dtype=np.uint64)


_POWERS = _PowerTable()


def _prefix_sums(
    codes: npt.NDArray[np.unsignedinteger], forward: npt.NDArray[np.uint64]
) -> npt.NDArray[np.uint64]:
    """``prefix[j] = sum(codes[i] * B**i for i < j)`` mod 2**64, with ``prefix[0] = 0``."""
    n = len(codes)
    prefix = np.empty(n + 1, dtype=np.uint64)
    prefix[0] = 0
    np.cumsum(np.multiply(codes, forward[:n], dtype=np.uint64), out=prefix[1:])
    return prefix


def _finish(raw: npt.NDArray[np.uint64], lengths: object, key: np.uint64) -> npt.NDArray[np.uint64]:
    raw += np.asarray(lengths, dtype=np.uint64) * _LENGTH_MULT
    raw += key
    return fmix64(raw)


def span_hashes(
    codes: npt.NDArray[np.unsignedinteger],
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    key: np.uint64,
) -> npt.NDArray[np.uint64]:
    """Hash the spans ``codes[starts[i]:ends[i]]`` (each non-empty) to 64-bit values.

    The raw value of a span is ``sum(codes[j] * B**(j - start))`` mod 2**64, obtained as a
    difference of prefix sums rescaled by ``B**-start``; it depends only on the span's
    content, not on where it sits. Its length and ``key`` are added and the result is
    finalised with :func:`fmix64`.
    """
    forward, inverse = _POWERS.at_least(len(codes) + 1)
    prefix = _prefix_sums(codes, forward)
    raw = prefix[ends] - prefix[starts]
    raw *= inverse[starts]
    return _finish(raw, ends - starts, key)


def high_bits_below(values: npt.NDArray[np.uint64], bound: int) -> npt.NDArray[np.int64]:
    """Map 64-bit hashes to ``[0, bound)`` by their top 32 bits (multiply-shift: no modulo bias)."""
    return (((values >> U64(32)) * U64(bound)) >> U64(32)).astype(np.int64)
