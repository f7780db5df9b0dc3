"""LSH banding (MMDS section 3.4): parameters, the S-curve, band keys, candidate pairs.

A signature is cut into ``bands`` bands of ``rows`` values each (values past
``bands * rows`` are ignored by banding but still used to verify candidates). Two
documents of Jaccard similarity ``s`` agree on a whole band with probability ``s**rows``,
so they become candidates with probability ``1 - (1 - s**rows)**bands``: the S-curve,
whose steepest rise is near ``(1/bands)**(1/rows)``.

:func:`choose_params` picks ``(bands, rows)`` for a threshold ``t`` by minimising a weighted
sum of the false-positive area ``∫_0^t P(s) ds`` and the false-negative area
``∫_t^1 (1 - P(s)) ds``, as datasketch does (Zhu 2016), but integrates exactly: ``P`` is a
polynomial of degree ``bands * rows <= num_perm``, which Gauss–Legendre quadrature with
``num_perm // 2 + 1`` nodes integrates without error (so no scipy is needed). Only the
bandings that Riemann-sum bounds of their areas leave in contention are integrated so.

A band key is a 64-bit seeded digest of the band's ``rows`` values, in one of two schemes
(:data:`KEY_SCHEMES`, recorded with the banding of every store). This is their
specification. Band ``b`` (0-based) of a signature ``v`` holds positions ``j = b * rows``
to ``(b + 1) * rows - 1``; values are taken as 64-bit integers, arithmetic wraps modulo
2**64, and the keys come from :func:`.hashing.derive_keys` with the signatures' seed (a
store uses its ``config.seed``):

``multilinear`` (stores of format 2)
    ``sum(m[j] * v[j])`` over the band's positions ``j``, with ``m = derive_keys(seed,
    "band-multilinear", bands * rows)`` (not forced odd): one multiplier per signature
    position, the same in every banding, as a shorter ``derive_keys`` stream is a prefix
    of a longer one. For two different bands some difference ``v[j] - v'[j]`` is non-zero
    and, being below ``2**32`` in size, divisible by at most ``2**31``; fixing the other
    multipliers, at most ``2**31`` of the ``2**64`` values of ``m[j]`` make the sums
    equal, so two different bands collide with probability at most ``2**-33``. One
    signature's keys are three array operations (about 5 µs), which is what a single
    query pays.
``fold`` (stores of format 1)
    ``k = derive_keys(seed, "band", bands)[b]``; then, for each of the band's values in
    order, ``k += v[j]; k *= 0x9FB21C651E98DF25; k ^= k >> 29``; the key is
    ``fmix64(k)``: thirteen dependent steps per band, about 80 µs for one signature.

A collision only adds a candidate, which verification against the signatures rejects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from .errors import InvalidParameterError, check_flags, choice, integer, real
from .hashing import U64, derive_keys, fmix64
from .minhash import DEFAULT_NUM_PERM, MAX_NUM_PERM
from .text import valid_seed

_ROW_MULT = U64(0x9FB21C651E98DF25)
_S29 = U64(29)


def _check_threshold(threshold: float) -> float:
    value = real(threshold)
    if value is None or not 0.0 < value < 1.0:
        expected = "a number strictly between 0 and 1 to choose bands and rows for"
        if value == 1.0:  # the one value outside that a store can still be made for
            expected += " (a threshold of 1 needs bands= and rows= given)"
        raise InvalidParameterError("threshold", threshold, expected)
    return value


def s_curve(similarity: float | npt.ArrayLike, bands: int, rows: int) -> npt.NDArray[np.float64]:
    """Probability ``1 - (1 - s**rows)**bands`` that a pair of similarity ``s`` is a candidate.

    Raises:
        InvalidParameterError: a similarity outside [0, 1], or ``bands``/``rows`` below 1.
    """
    LSHParams(bands, rows)  # checks both
    try:
        raw = np.asarray(similarity)  # not as float64: numpy would read "0.5" as a number
        s = None if raw.dtype.kind in "bSUV" else raw.astype(np.float64)
    except (TypeError, ValueError):  # ragged, or objects that are no numbers
        s = None
    if s is None or (s.size and not (np.all(s >= 0.0) and np.all(s <= 1.0))):  # and NaN
        raise InvalidParameterError("similarity", similarity, "numbers in [0, 1]")
    return 1.0 - (1.0 - s**rows) ** bands


KEY_SCHEMES = ("multilinear", "fold")
"""Band key schemes (see the module docstring); the first is the one new stores use."""


@dataclass(frozen=True)
class LSHParams:
    """A banding: ``bands`` bands of ``rows`` rows, keyed by ``keys`` (a :data:`KEY_SCHEMES`).

    Example:
        >>> p = LSHParams(bands=20, rows=5)
        >>> round(float(p.probability(0.8)), 5)
        0.99964
    """

    bands: int
    rows: int
    keys: str = KEY_SCHEMES[0]

    def __post_init__(self) -> None:
        for name in ("bands", "rows"):
            value = integer(getattr(self, name))
            if value is None or value < 1:
                raise InvalidParameterError(name, getattr(self, name), "an integer >= 1")
            object.__setattr__(self, name, value)  # numpy's integers are made plain ints
        object.__setattr__(self, "keys", choice("keys", self.keys, KEY_SCHEMES))

    @property
    def width(self) -> int:
        """Signature values the bands use: ``bands * rows``."""
        return self.bands * self.rows

    @property
    def approx_threshold(self) -> float:
        """``(1/bands)**(1/rows)``: roughly where the S-curve rises most steeply."""
        return float((1.0 / self.bands) ** (1.0 / self.rows))

    def probability(self, similarity: float | npt.ArrayLike) -> npt.NDArray[np.float64]:
        """The S-curve at ``similarity``."""
        return s_curve(similarity, self.bands, self.rows)

    def false_positive_area(self, threshold: float) -> float:
        """``∫_0^t P(s) ds``: candidate probability mass below the threshold.

        Raises:
            InvalidParameterError: ``threshold`` is not in (0, 1), or ``bands * rows``
                exceeds ``MAX_NUM_PERM`` (see :meth:`_exact_areas`).
        """
        return self._exact_areas(threshold)[0]

    def false_negative_area(self, threshold: float) -> float:
        """``∫_t^1 (1 - P(s)) ds``: missed probability mass above the threshold.

        Raises:
            InvalidParameterError: as :meth:`false_positive_area`.
        """
        return self._exact_areas(threshold)[1]

    def _exact_areas(self, threshold: float) -> tuple[float, float]:
        """Both areas, exactly, for a banding no wider than the longest signature: the
        quadrature needs about ``width / 2`` nodes, made from a dense matrix of that
        size squared, which from 16384 values on did not fit in memory (a raw
        ``MemoryError``) and from 8192 on took minutes."""
        threshold = _check_threshold(threshold)
        if self.width > MAX_NUM_PERM:
            raise InvalidParameterError(
                "bands*rows",
                f"{self.bands}*{self.rows}={self.width}",
                f"at most {MAX_NUM_PERM} (MAX_NUM_PERM, the longest signature) for the areas "
                "and rates; use fewer bands or rows (probability() has no such limit)",
            )
        fp, fn = _areas(np.array([self.bands]), np.array([self.rows]), threshold)
        return float(fp[0]), float(fn[0])

    def false_positive_rate(self, threshold: float) -> float:
        """Mean candidate probability of a pair whose similarity is uniform on ``[0, t)``."""
        return self.false_positive_area(threshold) / _check_threshold(threshold)

    def false_negative_rate(self, threshold: float) -> float:
        """Mean miss probability of a pair whose similarity is uniform on ``[t, 1]``."""
        return self.false_negative_area(threshold) / (1.0 - _check_threshold(threshold))

    def check_fits(self, num_perm: int, *, num_perm_fixed: bool = False) -> None:
        """Raise :class:`InvalidParameterError` if the bands need more than ``num_perm`` values.

        ``num_perm_fixed``: the signatures exist already (a store's, for a rebuild), so their
        length cannot give way, and the advice names only the banding.
        """
        if integer(num_perm) is None:
            raise InvalidParameterError("num_perm", num_perm, "an integer: the signature length")
        if self.width > num_perm:
            expected = (
                f"at most the store's num_perm={num_perm} (fixed when its signatures were "
                "made); use fewer bands or rows"
                if num_perm_fixed
                else f"at most num_perm={num_perm}; use fewer bands or rows, or more num_perm"
            )
            raise InvalidParameterError(
                "bands*rows", f"{self.bands}*{self.rows}={self.width}", expected
            )


@lru_cache(maxsize=16)
def _nodes(num_points: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    return np.polynomial.legendre.leggauss(num_points)


_AREA_CHUNK = 1 << 22
"""Most (pair, node) values :func:`_areas` evaluates at once: at num_perm 8192 the pairs
times the nodes were billions, gigabytes in one matrix."""


def _areas(
    bands: npt.NDArray[np.int64], rows: npt.NDArray[np.int64], threshold: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Exact false-positive and false-negative areas for many (bands, rows) at once.

    Pairs go in order of their width, in chunks, each with the nodes its widest needs.
    """
    fp, fn = np.empty(len(bands)), np.empty(len(bands))
    widths = bands * rows
    order = np.argsort(widths, kind="stable")
    start = 0
    while start < len(order):
        # A power of two at least the first pair's needs: few distinct rules to compute.
        nodes = 1 << (int(widths[order[start]]) // 2).bit_length()
        stop = start + max(1, _AREA_CHUNK // nodes)
        stop = start + int(np.searchsorted(widths[order[start:stop]], 2 * nodes, "left"))
        chunk = order[start:stop]  # every pair of it has degree < 2 * nodes
        fp[chunk], fn[chunk] = _areas_with(bands[chunk], rows[chunk], threshold, nodes)
        start = stop
    return fp, fn


def _areas_with(
    bands: npt.NDArray[np.int64], rows: npt.NDArray[np.int64], threshold: float, nodes: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    x, w = _nodes(nodes)  # exact for polynomials of degree <= 2 * nodes - 1
    low = threshold * (x + 1.0) / 2.0  # nodes mapped to [0, t]
    high = threshold + (1.0 - threshold) * (x + 1.0) / 2.0  # and to [t, 1]
    b, r = bands[:, None].astype(np.float64), rows[:, None].astype(np.float64)
    fp = (1.0 - (1.0 - low[None, :] ** r) ** b) @ w * (threshold / 2.0)
    fn = ((1.0 - high[None, :] ** r) ** b) @ w * ((1.0 - threshold) / 2.0)
    return fp, fn


_BOUND_STEPS = (64, 1024)
"""Riemann-sum resolutions with which :func:`_contenders` rules bandings out, coarse first."""
_BOUND_SLACK = 1e-9
"""Rounding a bound or an exact area may hold (far above it: values in [0, 1], weights at
most 1), by which a banding must miss before it is ruled out."""


def _contenders(
    bands: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    threshold: float,
    weights: tuple[float, float],
) -> npt.NDArray[np.intp]:
    """Indexes, ascending, of the bandings whose weighted error can still be the least:
    every other's lower bound exceeds some banding's upper bound.

    ``P(s)`` rises with ``s`` and ``1 - P(s)`` falls, so left and right Riemann sums of
    ``steps`` values bound both areas from below and above, within ``1 / steps``. They cost
    ``steps`` values a banding where the exact areas cost up to ``num_perm``: at num_perm
    8192 the exact areas of every banding took minutes; the few contenders' take well under
    a second once the quadrature nodes are made (about ten seconds, once a process).
    """
    keep = np.arange(len(bands))
    for steps in _BOUND_STEPS:
        low, high = _error_bounds(bands[keep], rows[keep], threshold, weights, steps)
        keep = keep[low <= high.min() * (1.0 + _BOUND_SLACK) + _BOUND_SLACK]
    return keep


def _error_bounds(
    bands: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    threshold: float,
    weights: tuple[float, float],
    steps: int,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Lower and upper bounds of each banding's weighted error, from Riemann sums."""
    below = np.linspace(0.0, threshold, steps + 1)
    above = np.linspace(threshold, 1.0, steps + 1)
    fp_step, fn_step = weights[0] * threshold / steps, weights[1] * (1.0 - threshold) / steps
    low, high = np.empty(len(bands)), np.empty(len(bands))
    size = max(1, _AREA_CHUNK // (steps + 1))
    for lo in range(0, len(bands), size):
        b = bands[lo : lo + size, None].astype(np.float64)
        r = rows[lo : lo + size, None].astype(np.float64)
        hit = 1.0 - (1.0 - below[None, :] ** r) ** b  # rises along each row
        miss = (1.0 - above[None, :] ** r) ** b  # falls along each row
        low[lo : lo + size] = fp_step * hit[:, :-1].sum(1) + fn_step * miss[:, 1:].sum(1)
        high[lo : lo + size] = fp_step * hit[:, 1:].sum(1) + fn_step * miss[:, :-1].sum(1)
    return low, high


def choose_params(
    threshold: float,
    num_perm: int = DEFAULT_NUM_PERM,
    false_positive_weight: float = 0.05,
    false_negative_weight: float = 0.95,
    use_all: bool = False,
) -> LSHParams:
    """Choose ``(bands, rows)`` minimising the weighted false-positive and -negative areas.

    Args:
        threshold: Jaccard similarity that should count as a near-duplicate, in (0, 1).
        num_perm: signature length; ``bands * rows`` never exceeds it.
        false_positive_weight / false_negative_weight: relative cost of each error kind
            (non-negative, not both zero). The defaults (0.05 / 0.95, where datasketch
            uses 0.5 / 0.5) count a miss 19 times a false candidate: a false candidate
            costs one record read and is then rejected by verification, a miss is lost
            for good. At t = 0.8 and num_perm 256 they give 25 x 10 instead of 17 x 15.
        use_all: only consider bandings with ``bands * rows == num_perm``.

    Raises:
        InvalidParameterError: an argument is out of range (``num_perm`` as
            :class:`MinHashConfig` has it: a larger one ran for hours).
    """
    threshold = _check_threshold(threshold)
    perms = integer(num_perm)
    if perms is None or not 1 <= perms <= MAX_NUM_PERM:
        raise InvalidParameterError("num_perm", num_perm, f"an integer in [1, {MAX_NUM_PERM}]")
    num_perm = perms
    check_flags(use_all=use_all)
    weights = []
    for name, weight in (
        ("false_positive_weight", false_positive_weight),
        ("false_negative_weight", false_negative_weight),
    ):
        value = real(weight)
        if value is None or not 0 <= value < math.inf:
            raise InvalidParameterError(name, weight, "a finite non-negative number")
        weights.append(value)
    false_positive_weight, false_negative_weight = weights
    if false_positive_weight + false_negative_weight <= 0:
        raise InvalidParameterError(
            "false_positive_weight+false_negative_weight", 0, "a positive sum"
        )
    # Only their ratio matters: scaled to at most 1, two huge weights cannot overflow.
    scale = max(false_positive_weight, false_negative_weight)
    false_positive_weight, false_negative_weight = (
        false_positive_weight / scale,
        false_negative_weight / scale,
    )
    pairs = [
        (b, r)
        for b in range(1, num_perm + 1)
        for r in range(1, num_perm // b + 1)
        if not use_all or b * r == num_perm
    ]
    bands = np.array([b for b, _ in pairs], dtype=np.int64)
    rows = np.array([r for _, r in pairs], dtype=np.int64)
    keep = _contenders(bands, rows, threshold, (false_positive_weight, false_negative_weight))
    bands, rows = bands[keep], rows[keep]
    fp, fn = _areas(bands, rows, threshold)
    error = false_positive_weight * fp + false_negative_weight * fn
    best = int(np.argmin(error))  # first minimum: fewest bands among equals
    return LSHParams(int(bands[best]), int(rows[best]))


def band_keys(
    signatures: npt.NDArray[np.uint32], params: LSHParams, seed: int = 1
) -> npt.NDArray[np.uint64]:
    """Band keys of a batch of signatures, shape ``(n, bands)``, dtype uint64.

    Key ``[i, j]`` digests band ``j`` of signature ``i`` with ``params.keys``' scheme and
    ``seed`` (see the module docstring), checked as :class:`MinHashConfig` checks its own.
    """
    seed = valid_seed(seed)
    if not isinstance(params, LSHParams):
        raise InvalidParameterError("params", params, "an LSHParams(bands, rows)")
    sigs = np.asarray(signatures)
    if sigs.ndim == 1:
        sigs = sigs[None, :]
    if sigs.ndim != 2 or sigs.dtype != np.uint32:
        raise InvalidParameterError(
            "signatures",
            f"{sigs.dtype} array of shape {sigs.shape}",
            "uint32 of shape (n, num_perm)",
        )
    params.check_fits(sigs.shape[1])
    if params.keys == "fold":
        return _fold_keys(sigs, params, seed)
    return _multilinear_keys(sigs, params, seed)


# Signatures per block of the multilinear keys: its uint64 products stay in the CPU cache.
_KEY_BLOCK = 2048


def _multilinear_keys(
    sigs: npt.NDArray[np.uint32], params: LSHParams, seed: int
) -> npt.NDArray[np.uint64]:
    n, width = len(sigs), params.width
    multipliers = multilinear_multipliers(seed, width)
    # uint64 products wrap modulo 2**64, as the scheme says; np.add.reduce rather than
    # np.sum, whose dispatch costs more than the arithmetic for a single query.
    if n <= _KEY_BLOCK:  # one block (a query): no output array to allocate and slice
        products = np.multiply(sigs[:, :width], multipliers, dtype=np.uint64)
        return np.add.reduce(products.reshape(n, params.bands, params.rows), axis=2)
    keys = np.empty((n, params.bands), dtype=np.uint64)
    for lo in range(0, n, _KEY_BLOCK):
        products = np.multiply(sigs[lo : lo + _KEY_BLOCK, :width], multipliers, dtype=np.uint64)
        np.add.reduce(
            products.reshape(-1, params.bands, params.rows), axis=2, out=keys[lo : lo + _KEY_BLOCK]
        )
    return keys


@lru_cache(maxsize=64)
def multilinear_multipliers(seed: int, width: int) -> npt.NDArray[np.uint64]:
    """One multiplier per banded signature position (cached: every query needs them)."""
    multipliers = derive_keys(seed, "band-multilinear", width)
    multipliers.flags.writeable = False
    return multipliers


def _fold_keys(
    sigs: npt.NDArray[np.uint32], params: LSHParams, seed: int
) -> npt.NDArray[np.uint64]:
    n = len(sigs)
    # Row-major (rows, n, bands) copy: each step of the fold below reads one contiguous
    # slab, and all steps run in place.
    rows = np.ascontiguousarray(
        sigs[:, : params.width].reshape(n, params.bands, params.rows).transpose(2, 0, 1),
        dtype=np.uint64,
    )
    keys = np.empty((n, params.bands), dtype=np.uint64)
    keys[...] = _band_starts(seed, params.bands)
    scratch = np.empty_like(keys)
    for row in rows:
        keys += row
        keys *= _ROW_MULT
        np.right_shift(keys, _S29, out=scratch)
        keys ^= scratch
    return fmix64(keys)


@lru_cache(maxsize=64)
def _band_starts(seed: int, bands: int) -> npt.NDArray[np.uint64]:
    """Start value of each band's fold (cached: a query needs them every time)."""
    starts = derive_keys(seed, "band", bands)
    starts.flags.writeable = False
    return starts


def candidate_pairs(keys: npt.NDArray[np.uint64], key_bits: int = 64) -> npt.NDArray[np.int64]:
    """Every pair ``(i, j)``, ``i < j``, of rows of ``keys`` that share a key in some band.

    Returns a ``(m, 2)`` array of unique pairs. All pairs within a bucket are produced,
    so this is meant for in-memory batches; the store verifies candidates per query.

    Args:
        keys: ``(documents, bands)`` band keys, as :func:`band_keys` returns them.
        key_bits: compare only each key's first (highest) ``key_bits`` bits. A store
            names a bucket by the bits its format keeps (40 for formats 4 and 5:
            ``8 * codec.band_layout(version).band_key_bytes``), so keys that differ only
            after them are candidates there; pass that width to get the store's pairs.
    """
    keys = np.asarray(keys)
    if keys.ndim != 2:
        raise InvalidParameterError(
            "keys", f"shape {keys.shape}", "(documents, bands), as band_keys returns"
        )
    if keys.size and not np.issubdtype(keys.dtype, np.integer):  # NaN, str, object keys
        raise InvalidParameterError(
            "keys", f"{keys.dtype} array", "integer band keys (uint64), as band_keys returns"
        )
    bits = integer(key_bits)
    if bits is None or not 1 <= bits <= 64:
        raise InvalidParameterError("key_bits", key_bits, "an integer from 1 to 64")
    key_bits = bits
    if key_bits < 64:
        keys = keys.astype(np.uint64) >> np.uint64(64 - key_bits)
    n = len(keys)
    found: list[npt.NDArray[np.int64]] = []
    for band in range(keys.shape[1]):
        order = np.argsort(keys[:, band], kind="stable")
        sorted_keys = keys[order, band]
        run_start = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
        run_len = np.diff(np.r_[run_start, n])
        for start, length in zip(run_start[run_len > 1], run_len[run_len > 1], strict=True):
            members = np.sort(order[start : start + length])
            i, j = np.triu_indices(length, k=1)
            found.append(np.stack([members[i], members[j]], axis=1))
    if not found:
        return np.empty((0, 2), dtype=np.int64)
    return np.unique(np.concatenate(found).astype(np.int64), axis=0)
