"""Compiled loops for the three hot passes of signing text.

Profiles of the numpy versions (``tools/README.md``, "Where the time goes") showed that
signing spent most of its time in passes that numpy can only express as several
whole-array operations each: collapsing white space (done per document by ``str.split``
and ``str.join``), hashing every character window, and taking each OPH bin's minimum
(``np.minimum.at``). Each is one loop here, compiled by numba to machine code, so a
batch is read once per pass instead of once per array operation.

The loops compute exactly the values of the definitions they replace (the
readable rules in :mod:`.text` and the prefix-sum spans of
:func:`.hashing.span_hashes`), which tests check; they are not a second algorithm.

numba is imported and the loops compiled on first use, not on ``import neardup_store``:
a process that only opens a store and queries by signature never pays for it. Compiled
code is cached on disk (``cache=True``: in ``__pycache__`` beside this file, or in the
user's cache directory when that is read-only; ``NUMBA_CACHE_DIR`` overrides both), so a
later process loads it in a fraction of a second instead of compiling for about 1.5 s.
"""

from __future__ import annotations

import functools
import sys
import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt

from .hashing import FMIX_C1, FMIX_C2

Codes = npt.NDArray[np.uint32]
Bounds = npt.NDArray[np.int64]
Hashes = npt.NDArray[np.uint64]

_U32_MASK = np.uint64(0xFFFFFFFF)


def _normalise_spaces(
    codes: Codes, bounds: Bounds, is_space: npt.NDArray[np.bool_], collapse: bool, strip: bool
) -> Bounds:
    """White-space rules of :func:`.text.normalize` on the code points of a batch, in place.

    ``strip`` drops the white space at both ends of each document, ``collapse`` turns
    each remaining run into one U+0020. Returns the new document bounds; the codes move
    towards the front (a write never passes the read), so ``codes[:bounds[-1]]`` is the
    result.
    """
    out = codes
    out_bounds = np.empty(len(bounds), dtype=np.int64)
    last = np.uint32(len(is_space) - 1)
    n = 0
    out_bounds[0] = 0
    for doc in range(len(bounds) - 1):
        lo, hi = bounds[doc], bounds[doc + 1]
        if strip:
            while lo < hi and is_space[min(codes[lo], last)]:
                lo += 1
            while hi > lo and is_space[min(codes[hi - 1], last)]:
                hi -= 1
        in_run = False
        for i in range(lo, hi):  # branch-free: white space is too frequent to predict
            code = codes[i]
            space = collapse and is_space[min(code, last)]
            out[n] = np.uint32(32) if space else code
            n += not (space and in_run)
            in_run = space
        out_bounds[doc + 1] = n
    return out_bounds


def _char_shingle_hashes(
    codes: Codes,
    bounds: Bounds,
    offsets: Bounds,
    width: int,
    key: np.uint64,
    base: np.uint64,
    base_inv: np.uint64,
    length_mult: np.uint64,
    out: Hashes,
) -> None:
    """Hash of every ``width``-character window of each document, in order.

    The value of a window is :func:`.hashing.span_hashes` of it: the polynomial
    ``sum(codes[j] * base**(j - start))`` modulo 2**64, plus ``length * length_mult``
    and ``key``, finished with MurmurHash3's fmix64. Consecutive windows are rolled in
    O(1) (``base`` is odd, so it has the inverse ``base_inv``). A document shorter than
    ``width`` has one shingle, its whole text, hashed the same way with its own length.
    Document ``d`` writes ``out[offsets[d]:offsets[d + 1]]``.
    """
    top = np.uint64(1)
    for _ in range(width - 1):
        top *= base
    for doc in range(len(bounds) - 1):
        lo, hi = bounds[doc], bounds[doc + 1]
        span = min(width, hi - lo)
        if span == 0:
            continue
        raw = np.uint64(0)
        power = np.uint64(1)
        for j in range(lo, lo + span):
            raw += np.uint64(codes[j]) * power
            power *= base
        addend = np.uint64(span) * length_mult + key
        slot = offsets[doc]
        for start in range(lo, hi - span + 1):
            if start > lo:
                raw = (raw - np.uint64(codes[start - 1])) * base_inv
                raw += np.uint64(codes[start + span - 1]) * top
            x = raw + addend
            x ^= x >> np.uint64(33)
            x *= FMIX_C1
            x ^= x >> np.uint64(33)
            x *= FMIX_C2
            x ^= x >> np.uint64(33)
            out[slot] = x
            slot += 1


def _oph_bins(hashes: Hashes, offsets: Bounds, num_perm: int, empty: np.uint64) -> Hashes:
    """Each OPH bin's minimum, ``len(offsets) - 1`` rows of ``num_perm`` (``empty`` if none).

    A hash's top 32 bits pick its bin by multiply-shift, its low 32 bits are the value.
    """
    k = np.uint64(num_perm)
    bins = np.full((len(offsets) - 1) * num_perm, empty, dtype=np.uint64)
    for doc in range(len(offsets) - 1):
        row = bins[doc * num_perm : (doc + 1) * num_perm]
        for i in range(offsets[doc], offsets[doc + 1]):
            h = hashes[i]
            slot = ((h >> np.uint64(32)) * k) >> np.uint64(32)
            row[slot] = min(row[slot], h & _U32_MASK)
    return bins


SCRATCH_LIMIT = 1 << 20
"""Largest buffer (in elements) that :func:`scratch` keeps for reuse."""


class _Scratch(threading.local):
    buffers: dict[str, npt.NDArray[Any]]

    def __init__(self) -> None:
        self.buffers = {}


_SCRATCH = _Scratch()


def scratch(name: str, size: int, dtype: type[np.generic]) -> npt.NDArray[Any]:
    """An uninitialised array of ``size`` that this thread reuses for ``name``.

    The loops above are fast enough that fresh output arrays cost as much as the loops:
    glibc hands large freed blocks back to the kernel, so every batch faulted its pages in
    again (80k minor faults per 30 MB of text, about half the signing time). Each thread
    keeps one buffer per name, grown on demand up to :data:`SCRATCH_LIMIT` elements;
    larger requests get a fresh array. The contents are valid until this thread asks for
    the same name again.
    """
    if size > SCRATCH_LIMIT:
        return np.empty(size, dtype=dtype)
    buffer = _SCRATCH.buffers.get(name)
    if buffer is None or len(buffer) < size or buffer.dtype != dtype:
        grown = max(size, 2 * len(buffer)) if buffer is not None else size
        buffer = _SCRATCH.buffers[name] = np.empty(min(grown, SCRATCH_LIMIT), dtype=dtype)
    return buffer[:size]


@functools.cache
def compiled() -> Any:
    """The loops above as numba functions (compiled, or loaded from the disk cache)."""
    return compile_loops(
        {
            "normalise_spaces": _normalise_spaces,
            "char_shingle_hashes": _char_shingle_hashes,
            "oph_bins": _oph_bins,
        }
    )


def compile_loops(loops: dict[str, Any], nogil: bool = True) -> SimpleNamespace:
    """``loops`` compiled by numba with its disk cache, as attributes of one namespace.

    Where numba finds no writable cache directory (a read-only install and home, as in
    some containers) it refuses ``cache=True``; the loops are then compiled in every
    process instead of failing.
    """
    numba = _import_numba()

    def build(cache: bool) -> SimpleNamespace:
        jit = numba.njit(cache=cache, nogil=nogil)
        return SimpleNamespace(**{name: jit(loop) for name, loop in loops.items()})

    try:
        return build(cache=True)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return build(cache=False)


def _import_numba() -> Any:
    """numba, imported whole or not at all. An exception while it imports (a Ctrl-C in the
    half second the first signing or cached query spends there) leaves its modules half
    made in ``sys.modules``, where every later import finds them and fails with a raw
    ``AttributeError``; they are dropped, so that the next call imports numba again."""
    try:
        import numba
    except BaseException:
        for name in [name for name in sys.modules if name.partition(".")[0] in _NUMBA_PACKAGES]:
            del sys.modules[name]
        raise
    return numba


_NUMBA_PACKAGES = ("numba", "llvmlite")
