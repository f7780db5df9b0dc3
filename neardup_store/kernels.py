"""Compiled loops for the hot passes of signing text.

Profiles of the numpy versions (``tools/README.md``, "Where the time goes") showed that
signing spent most of its time in passes that numpy can only express as several
whole-array operations each: folding and collapsing white space (``str.casefold``,
``str.split`` and ``str.join`` per document), hashing every character window, and taking
each OPH bin's minimum (``np.minimum.at``). Each is one loop here, compiled by numba to
machine code, so a batch is read once per pass instead of once per array operation:

* :func:`_table_fold_length` checks that a text may be folded by table, and
  :func:`_fold_spaces` folds it and applies the white-space rules (:mod:`.foldtables`
  says why the tables give exactly NFKC and casefold);
* :func:`_char_windows` hashes the character windows, straight into the OPH bins when a
  signature is all that is wanted; :func:`_oph_bins` bins hashes given by a caller.

The loops compute exactly the values of the definitions they replace (the
readable rules in :mod:`.text` and the prefix-sum spans of
:func:`.hashing.span_hashes`), which tests check; they are not a second algorithm.

numba is imported and the loops compiled on first use, not on ``import neardup_store``:
a process that only opens a store and queries by signature never pays for it. Compiled
code is cached on disk (``cache=True``: in ``__pycache__`` beside this file, or in the
user's cache directory when that is read-only; ``NUMBA_CACHE_DIR`` overrides both), so a
later process loads it in a fraction of a second instead of compiling for about 1.5 s.
A Ctrl-C while that happens is held back until it is done (:func:`_interrupts_held`).
"""

from __future__ import annotations

import contextlib
import functools
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType, SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt

from .hashing import FMIX_C1, FMIX_C2

Codes = npt.NDArray[np.uint32]
Bounds = npt.NDArray[np.int64]
Hashes = npt.NDArray[np.uint64]

_U32_MASK = np.uint64(0xFFFFFFFF)


# Bits of an entry of a fold table (:func:`.foldtables.fold_tables`).
COLLAPSE_FLAG = 1 << 31
"""White space that the collapse step turns, with the rest of its run, into one U+0020
(set only when that step is on)."""
SPACE_FLAG = 1 << 30
"""White space (what the strip step removes)."""
UNFOLDABLE_FLAG = 1 << 29
"""The table cannot give the code point's fold: a text holding it is folded by Python."""
EXPANDS_FLAG = 1 << 28
"""The fold is several code points: the low bits are where it starts in the pool."""
FOLD_MASK = (1 << 21) - 1
"""The code point XOR its fold (0: kept as it is), or a pool offset."""

# Bits of an entry of the NFKC checks table (:func:`.foldtables.nfkc_checks`).
CLASS_MASK = 0xFF
"""The canonical combining class."""
QUICK_CHECK_NO = 1 << 8
"""NFKC changes the code point on its own."""
QUICK_CHECK_MAYBE = 1 << 9
"""The code point may compose with what precedes it."""
CUT_BEFORE = 1 << 10
"""NFKC may cut any text before the code point."""


def _table_fold_length(
    codes: Codes,
    table: npt.NDArray[np.uint32],
    checks: npt.NDArray[np.uint32],
    pool: npt.NDArray[np.uint32],
    check_nfkc: bool,
) -> int:
    """The length of the text's fold by ``table`` (row 1 of the fold tables), or -1 where
    that is not :func:`.text.fold` of the text: a code point is unfoldable or, with
    ``check_nfkc``, its NFKC is not the concatenation of its code points' NFKC. That is
    the quick check's "yes" (no "maybe", classes of non-starters in order), except that a
    code point NFKC changes on its own is allowed where NFKC may cut before it and before
    the next code point (:mod:`.foldtables`)."""
    last = np.uint32(len(table) - 1)
    plain = np.uint32(CUT_BEFORE)  # the checks of a starter NFKC keeps and may cut before
    special = np.uint32(UNFOLDABLE_FLAG | EXPANDS_FLAG)
    length = 0
    previous_class = np.uint32(0)
    cut_needed = False
    for i in range(len(codes)):
        index = min(codes[i], last)
        entry = table[index]
        check = checks[index] if check_nfkc else plain
        if check == plain and not entry & special:  # the common case, one test
            length += 1
            previous_class = np.uint32(0)
            cut_needed = False
            continue
        if entry & np.uint32(UNFOLDABLE_FLAG):
            return -1
        if check_nfkc:
            cut_here = check & np.uint32(CUT_BEFORE) != 0
            klass = check & np.uint32(CLASS_MASK)
            if check & np.uint32(QUICK_CHECK_MAYBE) or (cut_needed and not cut_here):
                return -1
            if klass != 0 and previous_class > klass:
                return -1
            cut_needed = check & np.uint32(QUICK_CHECK_NO) != 0
            if cut_needed and not cut_here:
                return -1
            previous_class = klass
        length += pool[entry & np.uint32(FOLD_MASK)] if entry & np.uint32(EXPANDS_FLAG) else 1
    return length


FOLDED, TABLE_FOLD, TABLE_FOLD_EXPANDING, ASCII_FOLD = 0, 1, 2, 3
"""How :func:`_fold_spaces` reads a document: folded already, to fold by table, to fold by
table where some code points fold into several, ASCII to fold by table."""
ASCII_BLOCK = 1024
"""Code points of an ASCII document folded together before they are compacted."""


def _fold_spaces(
    codes: Codes,
    bounds: Bounds,
    tables: npt.NDArray[np.uint32],
    pool: npt.NDArray[np.uint32],
    modes: npt.NDArray[np.uint8],
    strip: bool,
    out: Codes,
) -> Bounds:
    """The per-character fold and the white-space rules of :func:`.text.normalize` on the
    code points of a batch, written to ``out``; returns where each document starts there
    (then the end).

    Document ``doc`` is read as ``modes[doc]`` says, with row 1 of ``tables`` to fold
    (texts that :func:`_table_fold_length` vouched for) or row 0, which only tells white
    space (texts folded already). A code point ``c`` is described by
    ``table[min(c, len(table) - 1)]``: its flags, and the bits that XOR ``c`` into its
    fold, or where its fold starts in ``pool`` (length first). With ``strip``, the white
    space at both ends of each document is dropped; each remaining run of
    :data:`COLLAPSE_FLAG` code points becomes one U+0020.

    Written for the compiler: XOR and flag bits instead of choices, and unsigned indices
    (numba adds a wrap-around check to each signed one), so that the loop is a dozen
    instructions without a branch that depends on the text: white space is too frequent
    to predict. Only documents with folds into several code points test for them (the
    test is the same in every pass of the loop, so the compiler makes two loops).

    ASCII documents, most of most corpora, take a faster way with the same result: their
    white space is U+0009–U+000D and U+001C–U+0020 and their folds add 32 to A–Z or
    nothing (:func:`.foldtables.fold_tables` checks that its tables say so), so a block
    of code points is folded by comparisons, several at a time, and only the compaction
    is a loop of one code point a step.
    """
    last = np.uint32(tables.shape[1] - 1)
    collapse = tables[1, 32] >> np.uint32(31)  # the switches, as the table has them
    case_delta = tables[1, 65] & np.uint32(FOLD_MASK)
    block = np.empty(ASCII_BLOCK, dtype=np.uint32)
    spaces = np.empty(ASCII_BLOCK, dtype=np.uint32)
    out_bounds = np.empty(len(bounds), dtype=np.int64)
    n = np.uint64(0)
    out_bounds[0] = 0
    for doc in range(len(bounds) - 1):
        lo, hi = bounds[doc], bounds[doc + 1]
        table = tables[np.uint64(min(modes[doc], TABLE_FOLD))]
        expanding = modes[doc] == TABLE_FOLD_EXPANDING
        if strip:
            while lo < hi and table[min(codes[lo], last)] & np.uint32(SPACE_FLAG):
                lo += 1
            while hi > lo and table[min(codes[hi - 1], last)] & np.uint32(SPACE_FLAG):
                hi -= 1
        text = codes[lo:hi]
        in_run = np.uint32(0)
        if modes[doc] == ASCII_FOLD:
            for first in range(0, len(text), ASCII_BLOCK):
                part = text[first : first + ASCII_BLOCK]
                for i in range(len(part)):  # vectorised: no table lookup, no choice
                    code = part[i]
                    upper = np.uint32(code - np.uint32(65) < np.uint32(26))
                    space = np.uint32(code - np.uint32(9) < np.uint32(5))
                    space |= np.uint32(code - np.uint32(28) < np.uint32(5))
                    space &= collapse
                    block[i] = np.uint32(32) if space else code + upper * case_delta
                    spaces[i] = space
                for i in range(len(part)):
                    space = spaces[i]
                    out[n] = block[i]
                    n += np.uint64(1 - (space & in_run))
                    in_run = space
            out_bounds[doc + 1] = n
            continue
        for i in range(len(text)):
            code = text[i]
            entry = table[min(code, last)]
            if expanding and entry & np.uint32(EXPANDS_FLAG):
                start = np.uint64(entry & np.uint32(FOLD_MASK))
                for j in range(np.uint64(1), np.uint64(pool[start]) + np.uint64(1)):
                    out[n] = pool[start + j]
                    n += np.uint64(1)
                in_run = np.uint32(0)
                continue
            space = entry >> np.uint32(31)
            out[n] = np.uint32(32) if space else code ^ (entry & np.uint32(FOLD_MASK))
            n += np.uint64(1 - (space & in_run))
            in_run = space
        out_bounds[doc + 1] = n
    return out_bounds


WINDOW_BLOCK = 256
"""Windows hashed together: a block's values stay in the CPU's first-level cache."""
DIRECT_WIDTH_LIMIT = 16
"""Windows at most this wide are summed term by term, wider ones rolled (see below)."""


def _char_windows(
    codes: Codes,
    bounds: Bounds,
    width: int,
    key: np.uint64,
    base: np.uint64,
    base_inv: np.uint64,
    length_mult: np.uint64,
    offsets: Bounds,
    out: Hashes,
    num_bins: int,
    empty: np.uint64,
) -> Hashes:
    """Hash every ``width``-character window of each document, in order, and either write
    the hashes to ``out`` (document ``d`` at ``out[offsets[d]:offsets[d + 1]]``) or, when
    ``num_bins`` is positive, keep only each OPH bin's minimum.

    The value of a window is :func:`.hashing.span_hashes` of it: the polynomial
    ``sum(codes[j] * base**(j - start))`` modulo 2**64, plus ``length * length_mult``
    and ``key``, finished with MurmurHash3's fmix64. A document shorter than ``width``
    has one shingle, its whole text, hashed the same way with its own length.

    Windows go in blocks of :data:`WINDOW_BLOCK`. Up to :data:`DIRECT_WIDTH_LIMIT`
    characters wide, a block's polynomials are summed one term at a time over the whole
    block: each step is independent across windows, so the compiler runs it on several
    windows per instruction, which is several times faster than rolling. Wider windows
    are rolled in O(1) each (``base`` is odd, so it has the inverse ``base_inv``),
    keeping the cost linear in the text whatever the width. The bins are as
    :func:`_oph_bins` makes them, ``len(bounds) - 1`` rows of ``num_bins``.
    """
    bins = np.full((len(bounds) - 1) * max(num_bins, 0), empty, dtype=np.uint64)
    block = np.empty(WINDOW_BLOCK, dtype=np.uint64)
    top = np.uint64(1)
    for _ in range(width - 1):
        top *= base
    for doc in range(len(bounds) - 1):
        lo, hi = bounds[doc], bounds[doc + 1]
        span = min(width, hi - lo)
        if span == 0:
            continue
        addend = np.uint64(span) * length_mult + key
        end = hi - span + 1  # windows start in [lo, end)
        raw = np.uint64(0)
        for first in range(lo, end, WINDOW_BLOCK):
            m = min(WINDOW_BLOCK, end - first)
            acc = block[:m] if num_bins > 0 else out[offsets[doc] + first - lo :][:m]
            text = codes[first : first + m + span - 1]
            if span <= DIRECT_WIDTH_LIMIT:
                for i in range(m):
                    acc[i] = np.uint64(text[i])
                power = np.uint64(1)
                for j in range(1, span):
                    power *= base
                    for i in range(m):
                        acc[i] += np.uint64(text[i + j]) * power
            else:
                for i in range(m):
                    start = first + i
                    if start == lo:
                        raw, power = np.uint64(0), np.uint64(1)
                        for j in range(lo, lo + span):
                            raw += np.uint64(codes[j]) * power
                            power *= base
                    else:
                        raw = (raw - np.uint64(codes[start - 1])) * base_inv
                        raw += np.uint64(codes[start + span - 1]) * top
                    acc[i] = raw
            for i in range(m):
                x = acc[i] + addend
                x ^= x >> np.uint64(33)
                x *= FMIX_C1
                x ^= x >> np.uint64(33)
                x *= FMIX_C2
                x ^= x >> np.uint64(33)
                acc[i] = x
            if num_bins > 0:
                row = bins[doc * num_bins : (doc + 1) * num_bins]
                for i in range(m):  # no branch: a few percent of the values are new minima
                    slot = ((acc[i] >> np.uint64(32)) * np.uint64(num_bins)) >> np.uint64(32)
                    row[slot] = min(row[slot], acc[i] & _U32_MASK)
    return bins


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
            "fold_spaces": _fold_spaces,
            "table_fold_length": _table_fold_length,
            "char_windows": _char_windows,
            "oph_bins": _oph_bins,
        }
    )


def compile_loops(loops: dict[str, Any], nogil: bool = True) -> SimpleNamespace:
    """``loops`` compiled by numba with its disk cache, as attributes of one namespace.

    Where numba finds no writable cache directory (a read-only install and home, as in
    some containers) it refuses ``cache=True``; the loops are then compiled in every
    process instead of failing. numba compiles (or loads) a loop at its first call with
    new argument types; a Ctrl-C is held back during that, as during the import.
    """
    with _interrupts_held():
        numba = _import_numba()

        def build(cache: bool) -> SimpleNamespace:
            jit = numba.njit(cache=cache, nogil=nogil)
            return SimpleNamespace(
                **{name: _holding_interrupts(jit(loop)) for name, loop in loops.items()}
            )

        try:
            return build(cache=True)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return build(cache=False)


def _holding_interrupts(dispatcher: Any) -> Any:
    """``dispatcher`` with its compilations run under :func:`_interrupts_held`.

    numba's dispatcher (C code, ``compile_and_invoke`` in ``numba/_dispatcher.cpp``) looks
    ``_compile_for_args`` up on the instance whenever a call finds no compiled version for
    its argument types, and that method compiles or loads one. Wrapping it there holds a
    Ctrl-C back exactly while a loop is compiled or loaded, at no cost to later calls
    (a wrapper around every call would add microseconds to each band-cache probe).

    Under ``NUMBA_DISABLE_JIT=1`` (numba's debugging switch) ``numba.njit`` returns the
    plain Python function, which never compiles: it is passed through
    (:func:`_wrapping_quietly`).
    """
    compile_for_args = getattr(dispatcher, "_compile_for_args", None)
    if compile_for_args is None:
        return _wrapping_quietly(dispatcher)

    def compile_holding_interrupts(*args: Any, **kws: Any) -> Any:
        with _interrupts_held():
            return compile_for_args(*args, **kws)

    dispatcher._compile_for_args = compile_holding_interrupts
    return dispatcher


def _wrapping_quietly(loop: Any) -> Any:
    """``loop`` run as plain Python without numpy's overflow warnings. The loops rely on
    ``uint64`` arithmetic wrapping modulo 2**64, which compiled code does silently but
    numpy's scalars report as an overflow each time (an error under the tests' warning
    filter); the values are the compiled ones either way."""

    @functools.wraps(loop)
    def run(*args: Any, **kws: Any) -> Any:
        with np.errstate(over="ignore"):
            return loop(*args, **kws)

    return run


class _HeldInterrupt:
    """A SIGINT handler that only notes the signal (see :func:`_interrupts_held`)."""

    def __init__(self) -> None:
        self.frame: FrameType | None = None
        self.arrived = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.arrived, self.frame = True, frame


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """Run the block with Ctrl-C held back, then hand it to the SIGINT handler found.

    While numba loads or compiles, llvmlite calls back into Python through ctypes
    (``ExecutionEngine._raw_object_cache_notify`` / ``_getbuffer``). An exception raised
    in such a callback, as the ``KeyboardInterrupt`` of a Ctrl-C that arrives then, is
    printed as "Exception ignored" and dropped: the command went on and exited 0
    (review 41). Here, a handler that only takes note replaces the Python SIGINT handler
    for the block; on the way out (also on an exception) the previous one is put back and
    called once if a SIGINT came, so the default one raises ``KeyboardInterrupt`` as the
    block returns.

    A Python handler, not a blocked signal mask: ``pthread_sigmask`` acts on one thread,
    and the kernel hands a SIGINT to any thread that does not block it, after which
    CPython runs the handler in the main thread anyway, inside the callback if that is
    where the main thread is. Python runs signal handlers only in the main thread, so
    other threads have nothing to hold back and run the block as it is; so does a process
    where SIGINT is ignored, left to the default action (which ends the process), or
    handled by C code (which Python could not put back).
    """
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.getsignal(signal.SIGINT)
    if not callable(previous) or isinstance(previous, _HeldInterrupt):
        yield  # nothing to hold back, or an outer block holds it already
        return
    held: _HeldInterrupt | None = _HeldInterrupt()
    try:
        signal.signal(signal.SIGINT, held)
    except ValueError:  # the main thread of a subinterpreter: handlers are not its own
        held = None
    try:
        yield
    finally:
        if held is not None:
            if signal.getsignal(signal.SIGINT) is held:  # not replaced by the block itself
                signal.signal(signal.SIGINT, previous)
            if held.arrived:
                previous(signal.SIGINT, held.frame)


def _import_numba() -> Any:
    """numba, imported whole or not at all. An exception while it imports (a Ctrl-C in the
    half second the first signing or cached query spends there) leaves its modules half
    made in ``sys.modules``, where every later import finds them and fails with a raw
    ``AttributeError``; they are dropped, so that the next call imports numba again.
    (:func:`compile_loops` holds a Ctrl-C in the main thread back until the import is
    done; any other exception still arrives here.)"""
    try:
        import numba
    except BaseException:
        for name in [name for name in sys.modules if name.partition(".")[0] in _NUMBA_PACKAGES]:
            del sys.modules[name]
        raise
    return numba


_NUMBA_PACKAGES = ("numba", "llvmlite")
