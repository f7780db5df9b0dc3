"""The compiled fold by table gives exactly ``normalize`` (NFKC, casefold, white space).

Every text the check vouches for is folded by table; the others by Python. So a wrong
table entry or a check that vouches for a text whose NFKC has context would change
signatures: these tests compare the compiled result with :func:`normalize` on every code
point the tables cover, alone and between the neighbours that can interact with it.
"""

from __future__ import annotations

import itertools
import sys
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neardup_store import Shingler, foldtables, kernels
from neardup_store.text import ShingleConfig, _code_points, normalize

_RAW = ShingleConfig(collapse_whitespace=False, strip=False, allow_empty=True)
"""Only the fold: the white-space steps would hide a wrong space."""

_LEFT = ["", "a", "e", "\u1100", "\uac00", "\u0301", "\u0316"]
"""Neighbours before a code point: starters that compose with what follows (a Latin
letter, a Hangul leading jamo and LV syllable) and non-starters of two classes."""
_RIGHT = [
    *["", "b", "\u0301", "\u0316", "\u0327", "\u05b0", "\u0f71"],
    *["\u1161", "\u11a8", "\u0cd5", "\u00a0"],
]
"""Neighbours after: combining marks of five classes (10 and 129 sort before the marks
that some folds end with, such as U+0F77's), Hangul vowel and final jamo, a class-0
vowel sign that composes, and a code point NFKC changes on its own."""


def _compiled_folds(texts: list[str], config: ShingleConfig) -> list[str]:
    codes, bounds = Shingler(config)._normalised_codes(texts)
    text = codes.astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")
    return [text[start:end] for start, end in itertools.pairwise(bounds)]


def _vouched(texts: list[str], config: ShingleConfig) -> list[bool]:
    """Whether the compiled NFKC check vouches for each text as it is."""
    shingler = Shingler(config)
    (_, table), pool = shingler._folding
    checks = foldtables.nfkc_checks()
    return [
        kernels.compiled().table_fold_length(_code_points(text), table, checks, pool, True) >= 0
        for text in texts
    ]


def _python_folded(texts: list[str], config: ShingleConfig) -> list[bool]:
    """Whether each text is folded by Python's fold rather than by the tables."""
    shingler = Shingler(config)
    return [shingler._code_units(text)[1] == kernels.FOLDED for text in texts]


@pytest.mark.parametrize(
    "config",
    [
        _RAW,
        ShingleConfig(casefold=False, collapse_whitespace=False, strip=False, allow_empty=True),
        ShingleConfig(nfkc=False, collapse_whitespace=False, strip=False, allow_empty=True),
        ShingleConfig(allow_empty=True),
    ],
    ids=["fold", "nfkc-only", "casefold-only", "defaults"],
)
def test_every_table_code_point_between_tricky_neighbours_folds_as_normalize(
    config: ShingleConfig,
) -> None:
    texts = [
        left + chr(code) + right
        for code in range(foldtables.TABLE_SIZE - 1)
        for left in _LEFT
        for right in _RIGHT
    ]
    compiled = _compiled_folds(texts, config)
    wrong = [
        (text, got) for text, got in zip(texts, compiled, strict=True)
        if got != normalize(text, config)
    ]  # fmt: skip
    assert not wrong, [(ascii(text), ascii(got)) for text, got in wrong[:10]]


def test_the_tables_fold_most_text_themselves() -> None:
    """The check must not be vacuous: it vouches for plain non-ASCII text, text with code
    points NFKC changes on its own, and folds into several code points; it refuses a
    composing mark (that text is put in NFKC by unicodedata, then casefolded by table)
    and text above U+3000 (folded by Python)."""
    texts = {
        "plain": "café “quoted” naïve – résumé",
        "nfkc changes alone": "no\u00a0break and \u2139 and 5\u00b5m",
        "expands": "stra\u00dfe \u2026 \u0130",
        "composes": "ta\u0301r",
        "mark on a changed one": "\u00a0\u0301",
        "above the tables": "\u4e00 and \U0001f600",
    }
    vouched = dict(zip(texts, _vouched(list(texts.values()), _RAW), strict=True))
    assert vouched == {
        "plain": True,
        "nfkc changes alone": True,
        "expands": True,
        "composes": False,
        "mark on a changed one": False,
        "above the tables": False,
    }
    by_python = dict(zip(texts, _python_folded(list(texts.values()), _RAW), strict=True))
    assert by_python == {name: name == "above the tables" for name in texts}
    compiled = _compiled_folds(list(texts.values()), _RAW)
    assert compiled == [normalize(text, _RAW) for text in texts.values()]


_ALPHABET = st.sampled_from(
    [*"aAzZ .\t\n", "\u00a0", "\u00df", "\u0130", "\u2026", "\u00b5", "\u2139", "\u00a8",
     "\u0301", "\u0316", "\u0327", "\u0344", "\u0345", "\u1100", "\u1161", "\u11a8",
     "\uac00", "\u0cc6", "\u0cd5", "\u212a", "\u212b", "\u0958", "\u03a3", "\u01c5",
     "\u2000", "\u3000", "\u4e00", "\U0001d538", "\ud800", "\u0f73", "\u1e9e"]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    texts=st.lists(st.lists(_ALPHABET, max_size=12).map("".join), min_size=1, max_size=6),
    nfkc=st.booleans(),
    casefold=st.booleans(),
    collapse=st.booleans(),
    strip=st.booleans(),
)
def test_random_text_of_tricky_code_points_folds_as_normalize(
    texts: list[str], nfkc: bool, casefold: bool, collapse: bool, strip: bool
) -> None:
    config = ShingleConfig(
        nfkc=nfkc, casefold=casefold, collapse_whitespace=collapse, strip=strip, allow_empty=True
    )
    assert _compiled_folds(texts, config) == [normalize(text, config) for text in texts]


def test_composition_seconds_match_a_scan_of_every_code_point() -> None:
    """The scan skips blocks that NFD leaves as they are; the result must be the same."""
    seconds = {code for block in foldtables.HANGUL_JOINING_JAMO for code in block}
    for code in range(sys.maxunicode + 1):
        parts = unicodedata.decomposition(chr(code)).split()
        if len(parts) == 2 and not parts[0].startswith("<"):
            seconds.add(int(parts[1], 16))
    assert foldtables.composition_seconds() == seconds


def test_a_fold_that_would_change_white_space_is_left_to_python() -> None:
    """NFKC makes U+00A8 a space and a combining diaeresis: the table cannot say which of
    its code points are white space, so it is unfoldable (and still folded right)."""
    tables, _ = foldtables.fold_tables(True, True, True)
    assert tables[1, 0xA8] & kernels.UNFOLDABLE_FLAG
    assert not tables[1, 0xA0] & kernels.UNFOLDABLE_FLAG  # NBSP: white space either way
    assert _compiled_folds(["a\u00a8b"], _RAW) == [normalize("a\u00a8b", _RAW)]


def test_the_folded_lengths_size_the_output_exactly() -> None:
    """The compiled pass writes as many code points as the check counted: no more (it
    would write past its buffer) and no fewer."""
    shingler = Shingler(_RAW)
    for text in ["stra\u00dfe", "\u2026" * 50, "\ufdfa", "a\u0130b", "x"]:
        length = shingler._code_units(text)[2]
        assert length == len(normalize(text, _RAW)), ascii(text)
    assert np.array_equal(
        np.frombuffer(normalize("\u2026\u00df", _RAW).encode("utf-32-le"), "<u4"),
        shingler._normalised_codes(["\u2026\u00df"])[0],
    )


@pytest.mark.parametrize("casefold", [True, False])
@pytest.mark.parametrize("collapse", [True, False])
@pytest.mark.parametrize("strip", [True, False])
def test_ascii_text_takes_its_own_way_to_the_same_result(
    casefold: bool, collapse: bool, strip: bool
) -> None:
    """ASCII documents are folded by comparisons instead of the table: every ASCII code
    point, and every pair of them, must come out as normalize() says."""
    config = ShingleConfig(
        casefold=casefold, collapse_whitespace=collapse, strip=strip, allow_empty=True
    )
    every = "".join(map(chr, range(128)))
    pairs = ["x" + chr(a) + chr(b) + "Y" for a in range(128) for b in range(128)]
    texts = [every, every[::-1], f" {every}  {every}\t", *pairs]
    assert all(text.isascii() for text in texts)
    assert _compiled_folds(texts, config) == [normalize(text, config) for text in texts]
