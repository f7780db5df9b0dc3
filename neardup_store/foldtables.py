"""Per-code-point tables that let compiled code fold text exactly as :func:`.text.fold`.

:func:`.text.fold` (NFKC, then ``str.casefold``) runs in C, but at 5–16 ns a character it
cost more than all of the shingling and hashing together on text that is not ASCII. Most
such text needs little of it: NFKC leaves it as it is, and ``casefold`` maps each code point
on its own, without context. The compiled pass (:func:`.kernels._fold_spaces`) therefore
folds a text by looking each code point up, after a check (:func:`.kernels._table_fold_length`)
that the lookup gives exactly ``fold(text)``. A text it cannot vouch for is put in NFKC by
``unicodedata`` first and casefolded by table (each code point of NFKC's output is its own
NFKC). Only code points below U+3001 are in the tables (the range of :data:`IS_SPACE`);
under ``casefold`` (the default), a text with any code point above is folded by
:func:`.text.fold`, as before.

Why the check is sufficient (the Unicode Standard, sections 3.11 and 3.12, and UAX #15):

* A text whose every code point has ``NFKC_Quick_Check=Yes``, with the canonical combining
  classes of each run of non-starters in non-decreasing order, is in NFKC (the quick
  check's "yes" answer). A code point is ``No`` exactly when NFKC changes it on its own,
  and ``Maybe`` when it may compose with what precedes it; here every second code point of
  a two-code-point canonical decomposition and every Hangul medial vowel or final jamo
  (a superset of ``Maybe``: a larger set only sends more texts to Python) counts as that.
* A code point ``c`` with ``No`` is accepted where NFKC may cut the text on both of its
  sides: before ``c`` (its class is 0, it joins nothing back, and the first code point of
  its decomposition is a starter that joins nothing back; the rule of
  :mod:`.streamed`, there for NFKC-stable ``c``) and before the next code point (one of
  the same kind). Then ``NFKC(a + c + b) = NFKC(a) + NFKC(c) + NFKC(b)``.
* So the NFKC of an accepted text is the concatenation of each code point's NFKC, and its
  fold the concatenation of each code point's :func:`.text.fold`: a table entry.

A code point's fold may be several code points (``ß`` → ``ss``, ``…`` → ``...``): its
entry points into a pool of such expansions. Folds that would change what is white space
(``¨`` → space and a combining diaeresis) are left to Python, so the white-space steps
that follow read each input code point's flags.
"""

from __future__ import annotations

import functools
import sys
import unicodedata

import numpy as np
import numpy.typing as npt

from . import kernels

TABLE_SIZE = 0x3002
"""Entries per table: every code point below U+3001, then one for all above."""
IS_SPACE = np.array([chr(code).isspace() for code in range(TABLE_SIZE - 1)] + [False])
"""Which code points below U+3001 ``str.isspace()`` holds for (the largest is U+3000),
then ``False`` for all above."""

HANGUL_JOINING_JAMO = (range(0x1161, 0x1176), range(0x11A8, 0x11C3))
"""Medial vowels and final consonants: they compose with a preceding Hangul leading
consonant or LV syllable by rule (the Unicode Standard, section 3.12), with no entry in
the decomposition data."""


@functools.cache
def composition_seconds() -> frozenset[int]:
    """Every code point that canonical composition may join to what precedes it: the
    second code point of every two-code-point canonical decomposition (composition
    exclusions included) and the Hangul jamo of :data:`HANGUL_JOINING_JAMO`.

    Found in the interpreter's Unicode database. Blocks of 256 code points that NFD leaves
    as they are (most of the code space) hold no decomposition and are skipped whole, so
    this takes about 60 ms instead of the 160 ms of a call per code point.
    """
    seconds = {code for block in HANGUL_JOINING_JAMO for code in block}
    for base in range(0, sys.maxunicode + 1, 256):
        codes = range(base, min(base + 256, sys.maxunicode + 1))
        if unicodedata.is_normalized("NFD", "".join(map(chr, codes))):
            continue
        for code in codes:
            parts = unicodedata.decomposition(chr(code)).split()
            if len(parts) == 2 and not parts[0].startswith("<"):
                seconds.add(int(parts[1], 16))
    return frozenset(seconds)


def cut_before(char: str) -> bool:
    """Whether NFKC may cut any text before ``char``: its class is 0, it joins nothing
    back, and the first code point of its decomposition is a starter that joins nothing
    back. :mod:`.streamed` cuts long texts before such characters (those NFKC keeps), and
    :func:`nfkc_checks` records it for every code point of the tables."""
    seconds = composition_seconds()
    if unicodedata.combining(char) or ord(char) in seconds:
        return False
    first = unicodedata.normalize("NFKD", char)[0]
    return unicodedata.combining(first) == 0 and ord(first) not in seconds


NO_CHECKS = np.zeros(TABLE_SIZE, dtype=np.uint32)
"""A checks table for configurations without NFKC, which the check never reads."""


@functools.cache
def nfkc_checks() -> npt.NDArray[np.uint32]:
    """What :func:`.kernels._table_fold_length` needs to know of each code point below
    U+3001 to vouch that a text's NFKC is the concatenation of its code points' NFKC. The
    last entry, for every code point above, says "maybe": a text holding one is folded
    by Python. Built on first use, in about 0.1 s."""
    seconds = composition_seconds()
    checks = np.zeros(TABLE_SIZE, dtype=np.uint32)
    for code in range(TABLE_SIZE - 1):
        char = chr(code)
        klass = unicodedata.combining(char)
        entry = klass
        if unicodedata.normalize("NFKC", char) != char:
            entry |= kernels.QUICK_CHECK_NO
        elif code in seconds:
            entry |= kernels.QUICK_CHECK_MAYBE
        if cut_before(char):
            entry |= kernels.CUT_BEFORE
        checks[code] = entry
    checks[-1] = kernels.QUICK_CHECK_MAYBE
    return checks


@functools.cache
def fold_tables(
    nfkc: bool, casefold: bool, collapse: bool
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]]:
    """The tables of :func:`.kernels._fold_spaces` for one configuration's switches: two
    rows (row 1 for text the pass folds, row 0 for text folded already) and the pool of
    multi-code-point folds.

    Every entry holds the white-space flags (the collapse flag only with ``collapse``).
    In row 1 it also holds the code point's fold (:func:`.text.fold` of it alone): XORed
    with the code point when the fold is one code point, else the offset in the pool of
    its length followed by its code points. A fold that would change what is white space
    is marked unfoldable. The last entry, for every code point above, is unfoldable under
    ``casefold`` and kept as it is otherwise (NFKC is :func:`nfkc_checks`' concern).
    """
    from .text import ShingleConfig, fold  # text imports this module

    switches = ShingleConfig(nfkc=nfkc, casefold=casefold)
    tables = np.zeros((2, TABLE_SIZE), dtype=np.uint32)
    pool: list[int] = []
    for code in range(TABLE_SIZE - 1):
        folded = fold(chr(code), switches)
        spaces = [part.isspace() for part in folded]
        if (spaces != [True]) if IS_SPACE[code] else any(spaces):
            tables[1, code] = kernels.UNFOLDABLE_FLAG
        elif len(folded) == 1:
            tables[1, code] = ord(folded) ^ code
        else:
            tables[1, code] = kernels.EXPANDS_FLAG | len(pool)
            pool += [len(folded), *map(ord, folded)]
    # What kernels._fold_spaces assumes of ASCII (Unicode never changes it): white space
    # is U+0009-U+000D and U+001C-U+0020, and folds add 32 to A-Z or nothing.
    ascii_space = IS_SPACE[:128].tolist()
    assert ascii_space == [code in range(9, 14) or code in range(28, 33) for code in range(128)]
    ascii_delta = [int(tables[1, code] & kernels.FOLD_MASK) for code in range(128)]
    assert ascii_delta == [32 * (casefold and code in range(65, 91)) for code in range(128)]
    tables[1, -1] = kernels.UNFOLDABLE_FLAG if casefold else 0
    tables[:, IS_SPACE] |= np.uint32(
        kernels.SPACE_FLAG | (kernels.COLLAPSE_FLAG if collapse else 0)
    )
    return tables, np.array(pool or [0], dtype=np.uint32)
