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
