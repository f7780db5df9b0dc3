"""Signatures of very long documents in bounded memory, identical to the ordinary path.

The batch path (:meth:`Shingler.hash_batch`) holds a whole document at once: its
normalised copy, its UTF-32 code points (4 bytes a character) and one 64-bit hash per
shingle (8 bytes a character), about 22 bytes per character for character sets, so a
100 MB text needs over 2 GB. A signature needs none of that at once: it is a minimum per
position (``kperm``) or per bin (``oph``, before densification), and minima fold: the
minimum over a document is the minimum of the minima over pieces of it. For *sets* a
shingle seen twice changes nothing, so pieces may even overlap.

So a long document is normalised piece by piece, each piece's shingles are hashed with
the last ``k - 1`` units (characters or words) of the previous piece in front of it, so
every shingle that crosses a cut is hashed too, and the partial minima are folded.
``oph`` densifies once, at the end. The result is byte-identical to the batch path
(``tests/test_bad_input.py`` checks it with tiny pieces on tricky text).

Normalisation in pieces gives the same text because:

* NFKC of ``a + b`` is NFKC(a) + NFKC(b) when ``b`` starts with a character ``c`` that
  never interacts with what precedes it: ``c`` has canonical combining class 0, NFKC
  leaves it as it is, and neither ``c`` nor the first code point of its decomposition
  is the second code point of any two-code-point canonical decomposition or a Hangul
  medial vowel or final consonant jamo (U+1161–U+1175, U+11A8–U+11C2, which compose by
  rule and have no decomposition entry). Its decomposition then starts with a starter
  (composition never changes a leading non-starter, so NFKC would not give ``c`` back),
  which no canonical reordering moves anything across and which canonical composition
  never joins to the starter before it; everything after it is blocked from that
  starter. (Reordering, composition and the Hangul rules are those of the Unicode
  Standard, sections 3.11 and 3.12; ``tests/test_text.py`` checks the rule by brute
  force.) ASCII characters are such characters, and the cheap case: a piece is cut
  before the first ASCII character within ``size`` characters of where it should end.
  Failing that (Chinese or Japanese prose may have none), before the first character of
  the whole set, which a scan of every code point finds once per process
  (:func:`_cut_before`, about half a second). A text with no such character after the wanted
  cut (only full-width Latin letters, say, or only combining marks) stays one piece.
* ``str.casefold`` maps each code point on its own (unlike ``lower``, it has no final-sigma
  context).
* The white-space steps are redone across cuts by a small state machine that matches
  ``" ".join(text.split())``, ``re.sub(r"\\s+", " ")`` and ``strip`` exactly.

Not streamed: bags (``bag=True``) need each shingle's occurrence count over the whole
document, and ``stopword`` shingles fall back to "all words" only when the whole
document has no stop-word shingle. Both take the batch path: about 80 bytes a character
for character bags (a 100 MB bag document needs about 8 GB).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
import unicodedata
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .foldtables import cut_before
from .text import _WHITESPACE_RUN, ShingleConfig, Shingler, as_text

if TYPE_CHECKING:
    from .minhash import MinHasher

STREAM_MIN_CHARACTERS = 1 << 22
"""Documents longer than this (4 Mi characters) are signed in pieces."""
PIECE_CHARACTERS = 1 << 18
"""Characters per piece: about 10 MB of working memory, whatever the document's size."""

_ASCII = re.compile(r"[\x00-\x7f]")
_SPACE = re.compile(r"\s")


def length(document: object) -> int | None:
    """How long a document counts as when it is routed and batched: the characters of a
    ``str``, the bytes of a binary one (of a ``memoryview`` its ``nbytes``: :func:`as_text`
    decodes ``bytes(document)``, which holds that many), ``None`` for any other object
    (refused by :func:`as_text`, as is a released memoryview)."""
    if isinstance(document, (str, bytes, bytearray)):
        return len(document)
    if isinstance(document, memoryview):
        try:
            return document.nbytes
        except ValueError:  # released: as_text reports it
            return None
    return None


def streams(config: ShingleConfig, document: object) -> bool:
    """Whether :func:`signature` is used for this document under this configuration."""
    if config.bag or config.kind not in ("char", "word"):
        return False
    size = length(document)
    return size is not None and size > STREAM_MIN_CHARACTERS


def _raw_pieces(text: str, size: int, nfkc: bool) -> Iterator[str]:
    """Consecutive slices of about ``size`` characters; with NFKC on, each is cut where
    NFKC may cut the text (see the module docstring)."""
    start, end = 0, len(text)
    while start < end:
        cut = min(start + size, end)
        if nfkc and cut < end:
            found = _ASCII.search(text, cut, cut + size) or _cut_before().search(text, cut)
            cut = found.start() if found else end
        yield text[start:cut]
        start = cut


@functools.cache
def _cut_before() -> re.Pattern[str]:
    """A pattern for one character before which NFKC may cut any text
    (:func:`.foldtables.cut_before`: class 0, and neither it nor the first code point of
    its decomposition joins back to what precedes it) and which NFKC keeps as it is.

    Built on first use from the interpreter's Unicode database (that of NFKC itself), by
    a scan of every code point (about half a second), so only a long document without ASCII
    near a wanted cut pays for it, once per process.
    """
    ranges: list[list[int]] = []
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        if not (unicodedata.is_normalized("NFKC", char) and cut_before(char)):
            continue
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1][1] = code
        else:
            ranges.append([code, code])
    return re.compile("[" + "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in ranges) + "]")


def normalized_pieces(text: str, config: ShingleConfig, size: int) -> Iterator[str]:
    """Pieces whose concatenation is ``normalize(text, config)``."""
    emitted = pending_space = False  # state of the collapse+strip machine
    started, held = False, ""  # state of the strip-only machine
    for piece in _raw_pieces(text, size, config.nfkc):
        if config.nfkc:
            piece = unicodedata.normalize("NFKC", piece)
        if config.casefold:
            piece = piece.casefold()
        if not piece:
            continue
        if config.collapse_whitespace and config.strip:
            words = piece.split()
            if not words:
                pending_space = pending_space or emitted
                continue
            out = " ".join(words)
            if emitted and (pending_space or piece[0].isspace()):
                out = " " + out
            emitted, pending_space = True, piece[-1].isspace()
            yield out
        elif config.collapse_whitespace:
            out = _WHITESPACE_RUN.sub(" ", piece)
            if pending_space and piece[0].isspace():
                out = out[1:]
            pending_space = piece[-1].isspace()
            if out:
                yield out
        elif config.strip:
            piece = held + piece
            if not started:
                piece = piece.lstrip()
                started = bool(piece)
            body = piece.rstrip()
            held = piece[len(body) :]
            if body:
                yield body
        else:
            yield piece


def _word_pieces(pieces: Iterator[str]) -> Iterator[str]:
    """Re-cut normalised pieces after white space, so no word spans two pieces."""
    carry = ""
    for piece in pieces:
        found = _SPACE.search(piece[::-1])
        if found is None:
            carry += piece
            continue
        cut = len(piece) - found.start()
        yield carry + piece[:cut]
        carry = piece[cut:]
    if carry:
        yield carry


class _Fold:
    """Running minima of one document's signature, per scheme."""

    def __init__(self, hasher: MinHasher) -> None:
        self.hasher = hasher
        self.value: npt.NDArray[np.generic] | None = None

    def add(self, hashes: npt.NDArray[np.uint64]) -> None:
        from .text import ShingleBatch

        batch = ShingleBatch(hashes, np.array([0, len(hashes)], dtype=np.int64))
        if self.hasher.config.scheme == "kperm":
            part: npt.NDArray[np.generic] = self.hasher._kperm(batch)[0]
        else:
            part = self.hasher._oph_bins(batch)
        self.value = part if self.value is None else np.minimum(self.value, part)

    def result(self) -> npt.NDArray[np.uint32]:
        assert self.value is not None
        if self.hasher.config.scheme == "kperm":
            return self.value.astype(np.uint32)
        return self.hasher._oph_finish(self.value, np.array([True]))[0]


def signature(
    hasher: MinHasher,
    document: object,
    encoding: str | None = None,
    index: int = 0,
    piece_characters: int = PIECE_CHARACTERS,
) -> npt.NDArray[np.uint32]:
    """The signature of one document, computed piece by piece (see the module docstring).

    Equal to ``hasher.signature(document, encoding)`` for set shingles of kind ``char``
    or ``word``; ``index`` numbers the document in error messages.
    """
    config = hasher.config.shingles
    if config.bag or config.kind not in ("char", "word"):
        raise ValueError(f"streamed signatures need set shingles of kind char or word: {config}")
    text = as_text(document, encoding, index)
    # The pieces are normalised already: hash them with every normalisation step off (the
    # shingle hashes depend on the seed only, not on these flags).
    plain = dataclasses.replace(
        config, nfkc=False, casefold=False, collapse_whitespace=False, strip=False
    )
    shingler = Shingler(plain, hasher.shingler.seed)
    k = config.shingle_size
    fold = _Fold(hasher)
    pieces = normalized_pieces(text, config, piece_characters)
    if config.kind == "char":
        tail = ""
        for piece in pieces:
            window = tail + piece
            if len(window) >= k:  # else the whole text so far stays in the tail
                fold.add(shingler.hash_document(window))
                window = window[len(window) - (k - 1) :] if k > 1 else ""
            tail = window
        rest = tail
    else:
        tail_words: list[str] = []
        for piece in _word_pieces(pieces):
            words = tail_words + piece.split()
            if len(words) >= k:
                fold.add(shingler.hash_document(" ".join(words)))
                words = words[len(words) - (k - 1) :] if k > 1 else []
            tail_words = words
        rest = " ".join(tail_words)
    if fold.value is None:  # fewer than k units in all: the batch path's rules decide
        short = Shingler(dataclasses.replace(plain, allow_empty=config.allow_empty), shingler.seed)
        return hasher._signatures_from_hashes(short.hash_batch([rest], None, index))[0]
    return fold.result()
