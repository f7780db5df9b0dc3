"""Text → normalised text → shingles → 64-bit shingle hashes.

Shingling follows Leskovec, Rajaraman and Ullman, *Mining of Massive Datasets*, section
3.2: a document is represented by the set (or bag) of its k-shingles. Three kinds:

``char``
    Every run of ``size`` consecutive characters. With about 20 likely characters, there
    are roughly 20**k likely shingles; k must be large enough that any one shingle is
    unlikely in a given document. MMDS suggests k=5 for short documents such as e-mails and
    k=9 for long ones such as research articles; 5 is the default.
``word``
    Every run of ``size`` consecutive words. A word is a maximal run of non-white-space
    characters (punctuation stays attached to its word).
``stopword``
    For news articles (MMDS 3.2.4, after Theobald et al.'s SpotSigs): a stop word followed
    by the next ``size - 1`` words (default size 3: the stop word and the next two). Stop
    words are matched in lower case, as written, Capitalised or in UPPER CASE, against
    :data:`ENGLISH_STOP_WORDS` (with ``casefold=False``, "THE" starts a shingle as "the"
    and "The" do; other mixed cases such as "tHe" do not).

A non-empty document that has fewer than ``size`` units (characters or words), or for
``stopword`` no complete stop-word shingle, has exactly one shingle: all of its units. A
document with no units at all raises :class:`EmptyDocumentError`, unless the
configuration says ``allow_empty``: it then has no shingles and gets the empty signature.

Sets are the default. With ``bag=True`` the i-th repetition (i ≥ 1) of a shingle in a
document becomes its own element (the shingle labelled with i), so MinHash estimates the
bag similarity ``sum(min counts) / sum(max counts)``. The first occurrence keeps the plain
shingle hash, so a document without repetitions has the same elements in both modes.

Hashing is vectorised over a whole batch of documents: texts are laid out as code points
in one array, folded by table where that is exact (:mod:`.foldtables`), and every
shingle is a span hashed as :func:`neardup_store.hashing.span_hashes` defines it, by the
compiled loops of :mod:`.kernels` (no Python call per character or shingle). Words are
hashed as spans of characters, and word shingles as spans of word hashes.
``HASH_VERSION`` names this algorithm; any change to it must bump the number.

Specification (``HASH_VERSION`` 1). ``span(codes, key)`` is the span hash,
``derive_keys`` and ``fmix64`` as :mod:`.hashing` specifies them, and ``word_key,
shingle_key, bag_key = derive_keys(seed, "shingle", 3)``. A document's shingle hashes are
made in this order:

1. Normalise (:func:`normalize`), each step only if its switch is on: NFKC
   (``unicodedata.normalize``), then ``str.casefold``, then every maximal run of white
   space becomes one U+0020, then white space at both ends is removed. White space is
   exactly Python's ``str.isspace()``: Unicode's White_Space property plus the
   information separators U+001C–U+001F, that is the 29 code points U+0009–U+000D,
   U+001C–U+0020, U+0085, U+00A0, U+1680, U+2000–U+200A, U+2028, U+2029, U+202F, U+205F
   and U+3000 (not U+180E, U+200B or U+FEFF). NFKC, casefold and this set follow the
   interpreter's Unicode database (:func:`unicode_version`).
2. Units and their codes. The code of a character is its code point; a lone surrogate
   (a Python ``str`` can hold one, for instance from ``json.loads``) is one character
   whose code is its own value, 0xD800–0xDFFF (UTF-32 with ``surrogatepass``). ``char``:
   the units are the characters, their codes the code points. ``word``/``stopword``: the
   units are the words (maximal runs of non-white-space characters), the code of a word
   ``span(its characters' codes, word_key)``.
3. Shingles, in text order, each ``span(the codes of units i to i + size - 1,
   shingle_key)``: ``char`` and ``word`` at every ``i`` from 0 to ``units - size``;
   ``stopword`` at those ``i`` whose word is a stop word (in :data:`ENGLISH_STOP_WORDS`
   as written, Capitalised or UPPER CASE). The implementation compares word hashes, so a
   word whose 64-bit hash equals a stop form's counts as one (about a 2**-55 chance a
   word). A document with units but no such ``i`` has one shingle, ``span(the codes of
   all its units, shingle_key)``; one without units has none.
4. Bags (``bag=True``): within a document, equal hashes ``h`` are counted (by hash, not by
   text); the i-th repeat (``i >= 1``, the first occurrence being ``i = 0``) becomes
   ``fmix64(h ^ fmix64(i + bag_key))``, the first keeps ``h``. :meth:`Shingler.hash_batch`
   returns a bag document's hashes in order of their plain hash, a set's in text order;
   a signature does not depend on the order.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from . import foldtables, kernels
from .errors import (
    BatchTypeError,
    DocumentError,
    EmptyDocumentError,
    InputTypeError,
    InvalidParameterError,
    TextDecodeError,
    choice,
    integer,
)
from .hashing import SPAN_CONSTANTS, derive_keys, fmix64, span_hashes

HASH_VERSION = 1
"""Version of the normalisation + shingle-hash algorithm; recorded with every signature."""

ShingleKind = Literal["char", "word", "stopword"]
SHINGLE_KINDS: tuple[str, ...] = ("char", "word", "stopword")
_DEFAULT_SIZE = {"char": 5, "word": 3, "stopword": 3}
MAX_SHINGLE_SIZE = 1 << 16
"""The largest shingle size: longer shingles only make a whole document one shingle, and
the hashing kernels take sizes as 64-bit integers."""

ENGLISH_STOP_WORDS: frozenset[str] = frozenset(
    """
    a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for
    from further had has have having he her here hers herself him himself his how i if in
    into is it its itself just me more most my myself no nor not now of off on once only or
    other our ours ourselves out over own same she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up
    very was we were what when where which while who whom why will with would you your
    yours yourself yourselves
    """.split()
)
"""A built-in list of common English function words, used by the ``stopword`` kind."""

_WHITESPACE_RUN = re.compile(r"\s+")
_NO_OFFSETS = np.zeros(1, dtype=np.int64)
_NO_HASHES = np.empty(0, dtype=np.uint64)


@dataclass(frozen=True)
class ShingleConfig:
    """How a document becomes shingles. Every field is part of a store's identity.

    Args:
        kind: ``"char"``, ``"word"`` or ``"stopword"``.
        size: units per shingle; ``None`` picks the kind's default (5, 3, 3).
        bag: count repeated shingles (bag semantics) instead of a set.
        nfkc: apply Unicode NFKC normalisation.
        casefold: apply ``str.casefold`` (aggressive lower-casing).
        collapse_whitespace: turn every run of white space into one blank.
        strip: remove leading and trailing white space.
        allow_empty: give documents without shingles the empty signature instead of
            raising :class:`EmptyDocumentError`.
    """

    kind: ShingleKind = "char"
    size: int | None = None
    bag: bool = False
    nfkc: bool = True
    casefold: bool = True
    collapse_whitespace: bool = True
    strip: bool = True
    allow_empty: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", choice("kind", self.kind, SHINGLE_KINDS))
        if self.size is None:
            object.__setattr__(self, "size", _DEFAULT_SIZE[self.kind])
        size = integer(self.size)
        if size is None or not 1 <= size <= MAX_SHINGLE_SIZE:
            raise InvalidParameterError("size", self.size, f"an integer in [1, {MAX_SHINGLE_SIZE}]")
        object.__setattr__(self, "size", size)  # numpy's integers are made plain ints
        if self.kind == "stopword" and self.size < 2:
            raise InvalidParameterError("size", self.size, "an integer >= 2 for stop-word shingles")
        for flag in ("bag", "nfkc", "casefold", "collapse_whitespace", "strip", "allow_empty"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidParameterError(flag, getattr(self, flag), "True or False")

    @property
    def shingle_size(self) -> int:
        """The resolved size (never ``None``)."""
        assert self.size is not None
        return self.size

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for storing in a store's metadata, with the algorithm version."""
        return {**asdict(self), "hash_version": HASH_VERSION}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShingleConfig:
        """Inverse of :meth:`to_dict`; rejects a different ``hash_version``, and, as
        :meth:`MinHashConfig.from_dict` does, a field it does not know or a missing one."""
        if isinstance(data, Mapping):  # before the fields: a later hashing explains them
            version = data.get("hash_version", HASH_VERSION)
            if version != HASH_VERSION:
                raise InvalidParameterError(
                    "hash_version", version, f"{HASH_VERSION} (this release's shingle hashing)"
                )
        names = tuple(field.name for field in fields(cls))
        data = exact_fields(data, names, "shingles", optional=("hash_version",))
        data.pop("hash_version", None)
        return cls(**data)


def exact_fields(
    data: object, names: Sequence[str], name: str, optional: Sequence[str] = ()
) -> dict[str, Any]:
    """``data`` as a dict of exactly ``names`` (and any of ``optional``), for a
    ``from_dict``: a field this release does not know (a later release's, from an export
    or a job's output) is refused rather than dropped, and a missing one rather than
    defaulted or left to a raw ``KeyError``, so a configuration is never read as another.

    Raises:
        InvalidParameterError: ``data`` is no mapping, or its fields differ.
    """
    if not isinstance(data, Mapping):
        raise InvalidParameterError(name, data, "a dict as to_dict() returns")
    unknown = sorted(map(str, set(data) - {*names, *optional}))
    if unknown:
        known = ", ".join([*names, *optional])
        raise InvalidParameterError(name, unknown, f"only {known} (a later release's?)")
    missing = [field for field in names if field not in data]
    if missing:
        raise InvalidParameterError(
            name, data, f"every one of {', '.join(names)}; {', '.join(missing)} missing"
        )
    return dict(data)


def valid_seed(seed: object) -> int:
    """``seed`` as a plain ``int`` if it is one of the 64-bit seeds every hash here is
    derived from (numpy's integers included), else :class:`InvalidParameterError`."""
    value = integer(seed)
    if value is None or not 0 <= value < 1 << 64:
        raise InvalidParameterError("seed", seed, "an integer in [0, 2**64)")
    return value


def check_config(config: object) -> None:
    """Raise :class:`InvalidParameterError` unless ``config`` is a :class:`ShingleConfig`
    (a wrong one failed deep inside with a raw ``AttributeError``)."""
    if not isinstance(config, ShingleConfig):
        raise InvalidParameterError("config", config, "a ShingleConfig")


def fold(text: str, config: ShingleConfig = ShingleConfig()) -> str:
    """The character steps of :func:`normalize`: NFKC, then casefold.

    ASCII text takes the cheaper equal path: it is always in NFKC, and its casefold is
    its lower case.
    """
    ascii_only = text.isascii()
    if config.nfkc and not ascii_only:
        text = unicodedata.normalize("NFKC", text)
    if config.casefold:
        text = text.lower() if ascii_only else text.casefold()
    return text


def normalize(text: str, config: ShingleConfig = ShingleConfig()) -> str:
    """Apply the configured normalisation steps, in order: NFKC, casefold, collapse, strip.

    Raises:
        InputTypeError: ``text`` is not a ``str``.
        InvalidParameterError: ``config`` is not a :class:`ShingleConfig`.
    """
    if not isinstance(text, str):
        raise InputTypeError(text)
    check_config(config)
    text = fold(text, config)
    if config.collapse_whitespace and config.strip:
        return " ".join(text.split())
    if config.collapse_whitespace:
        text = _WHITESPACE_RUN.sub(" ", text)
    if config.strip:
        text = text.strip()
    return text


def _bounds(lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``[0, l0, l0 + l1, ...]``: where each of consecutive segments starts, then the end."""
    bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    return bounds


def _is_space(codes: npt.NDArray[np.uint32]) -> npt.NDArray[np.bool_]:
    return foldtables.IS_SPACE[np.minimum(codes, foldtables.TABLE_SIZE - 1)]


def check_batch(
    items: object, what: str = "documents", single: str = "signature() / hash_document()"
) -> None:
    """Raise :class:`BatchTypeError` unless ``items`` is an iterable of ``what``: one str
    or bytes would pass as an iterable of characters, one item each, and a numpy scalar
    or 0-d array (``np.array("text")``, one value) as an ``Iterable`` by its type, whose
    iteration then raises a raw ``TypeError``."""
    if (
        isinstance(items, (str, bytes, bytearray, memoryview, np.generic))
        or not isinstance(items, Iterable)
        or (isinstance(items, np.ndarray) and items.ndim == 0)
    ):
        raise BatchTypeError(items, what, single)


def check_encoding(encoding: str) -> None:
    """Refuse a codec Python cannot decode text with: a name it does not know (or cannot
    look up, holding a NUL), a known codec that is not a text one (base64), which
    ``codecs.lookup`` accepts, or one that decodes nothing (``undefined``).

    Raises:
        InvalidParameterError: ``encoding`` names no text codec.
    """
    try:
        b"a".decode(encoding)  # not b"": Python decodes an empty string without the codec
    except UnicodeDecodeError:
        pass  # a text codec, which wants more than one byte (utf-16)
    except (LookupError, TypeError, ValueError):  # a NUL in the name is a ValueError
        raise InvalidParameterError("encoding", encoding, "a codec name such as 'utf-8'") from None


def decode_text(data: bytes, encoding: str) -> str:
    """``data`` decoded, without one leading byte-order mark (U+FEFF): editors write one
    at the start of UTF-8 files, and it is no part of the text (codecs such as utf-16
    drop it themselves, utf-8 does not).

    Raises:
        UnicodeError: ``data`` is not valid in ``encoding`` (idna and punycode raise this
            base class, not only UnicodeDecodeError).
    """
    return data.decode(encoding).removeprefix("\ufeff")


@contextmanager
def single_document() -> Iterator[None]:
    """Around a call that takes one document through the batch code: an error about it
    does not number it as ``document #0``."""
    try:
        yield
    except DocumentError as error:
        error.index = None
        raise


def as_text(document: object, encoding: str | None = None, index: int | None = None) -> str:
    """Return ``document`` as ``str``: bytes only with an explicit ``encoding``, decoded by
    :func:`decode_text` (one leading byte-order mark is dropped)."""
    if isinstance(document, str):
        return document
    if isinstance(document, (bytes, bytearray, memoryview)) and encoding is not None:
        check_encoding(encoding)
        try:
            data = bytes(document)
        except ValueError:  # a released memoryview: its bytes are gone
            raise InputTypeError(document, index) from None
        try:
            return decode_text(data, encoding)
        except UnicodeError as err:
            raise TextDecodeError(encoding, str(err), index) from err
    raise InputTypeError(document, index)


def _units(text: str, config: ShingleConfig) -> list[str]:
    if config.kind == "char":
        return list(text)
    return text.split()


def shingle_strings(text: str, config: ShingleConfig = ShingleConfig()) -> list[str]:
    """The shingles of one document as strings, in order, with repeats (for inspection).

    This is the readable twin of :meth:`Shingler.hash_batch` and follows the same rules; word
    shingles are joined with one blank. It runs in Python, so it is not for bulk work.
    """
    norm = normalize(as_text(text), config)
    units = _units(norm, config)
    if not units:
        if config.allow_empty:
            return []
        raise EmptyDocumentError()
    joiner = "" if config.kind == "char" else " "
    k = config.shingle_size
    if config.kind == "stopword":
        starts = [i for i in range(len(units) - k + 1) if _is_stop_word(units[i])]
    else:
        starts = list(range(len(units) - k + 1))
    if not starts:
        return [joiner.join(units)]
    return [joiner.join(units[i : i + k]) for i in starts]


def _is_stop_word(word: str) -> bool:
    return word in _STOP_FORMS


_STOP_FORMS = frozenset(form for w in ENGLISH_STOP_WORDS for form in (w, w.capitalize(), w.upper()))


@dataclass(frozen=True)
class ShingleBatch:
    """Shingle hashes of a batch: document ``i`` owns ``hashes[offsets[i]:offsets[i + 1]]``."""

    hashes: npt.NDArray[np.uint64]
    offsets: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def document(self, index: int) -> npt.NDArray[np.uint64]:
        """The shingle hashes of one document."""
        return self.hashes[self.offsets[index] : self.offsets[index + 1]]


class Shingler:
    """Turns documents into 64-bit shingle hashes for one configuration and seed."""

    def __init__(self, config: ShingleConfig = ShingleConfig(), seed: int = 1) -> None:
        check_config(config)
        seed = valid_seed(seed)
        self.config = config
        self.seed = seed
        self._word_key, self._shingle_key, self._bag_key = derive_keys(seed, "shingle", 3)
        if config.kind == "stopword":
            self._stop_hashes = np.unique(self._hash_words(list(_STOP_FORMS)))

    def hash_batch(
        self, documents: Iterable[object], encoding: str | None = None, start_index: int = 0
    ) -> ShingleBatch:
        """Shingle hashes of many documents at once (sets, or labelled bags).

        ``start_index`` is the number of the first document, used in error messages when
        the batch is part of a larger one.

        Raises:
            BatchTypeError: ``documents`` is a single str/bytes or not iterable.
            InputTypeError: a document is not ``str`` (or bytes without ``encoding``).
            TextDecodeError: bytes are invalid in ``encoding``.
            EmptyDocumentError: a document has no shingles and empties are not allowed.
            InvalidParameterError: ``encoding`` names no text codec, or ``start_index``
                is no integer >= 0.
        """
        batch = self._hash_batch(documents, encoding, start_index)
        hashes = batch.hashes if batch.hashes.flags.owndata else batch.hashes.copy()
        return ShingleBatch(hashes, batch.offsets)

    def _hash_batch(
        self, documents: Iterable[object], encoding: str | None = None, start_index: int = 0
    ) -> ShingleBatch:
        """:meth:`hash_batch` whose hashes may be this thread's scratch memory
        (:func:`.kernels.scratch`): for callers that are done with them before their next
        call."""
        codes, doc_starts, start_index = self._normalised_batch(documents, encoding, start_index)
        if self.config.kind == "char":
            self._check_empty(np.diff(doc_starts), start_index)
            hashes, counts = self._char_shingles(codes, doc_starts)
        else:
            words, word_bounds = self._words(codes, doc_starts)
            self._check_empty(np.diff(word_bounds), start_index)
            starts, ends, owners = self._word_shingle_spans(words, word_bounds)
            hashes = span_hashes(words, starts, ends, self._shingle_key)
            counts = np.bincount(owners, minlength=len(doc_starts) - 1)
        offsets = _bounds(counts)
        if self.config.bag:
            hashes = _label_repeats(hashes, offsets, self._bag_key)
        return ShingleBatch(hashes, offsets)

    def _window_bins(
        self,
        documents: Iterable[object],
        encoding: str | None,
        start_index: int,
        num_bins: int,
        empty: np.uint64,
    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_]]:
        """For a set of ``char`` shingles: each OPH bin's minimum of every document's
        shingle hashes (as :func:`.kernels._oph_bins` takes them from
        :meth:`hash_batch`'s), taken as the windows are hashed, without storing a hash;
        and which documents have shingles."""
        codes, doc_starts, start_index = self._normalised_batch(documents, encoding, start_index)
        lengths = np.diff(doc_starts)
        self._check_empty(lengths, start_index)
        bins = self._char_windows(codes, doc_starts, _NO_OFFSETS, _NO_HASHES, num_bins, empty)
        return bins, lengths > 0

    def hash_document(
        self, document: object, encoding: str | None = None
    ) -> npt.NDArray[np.uint64]:
        """Shingle hashes of one document."""
        with single_document():
            return self.hash_batch([document], encoding).hashes

    # -- internals -------------------------------------------------------------------

    def _normalised_batch(
        self, documents: Iterable[object], encoding: str | None, start_index: int
    ) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64], int]:
        """The checked documents of a batch as :meth:`_normalised_codes`, and the number of
        the first as an ``int`` (a numpy integer would wrap around in error messages)."""
        check_batch(documents)
        first = integer(start_index)
        if first is None or first < 0:
            raise InvalidParameterError(
                "start_index", start_index, "an integer >= 0: the number of the first document"
            )
        if encoding is not None:  # refused up front, even when every document is a str
            check_encoding(encoding)
        texts = [as_text(doc, encoding, index) for index, doc in enumerate(documents, first)]
        return *self._normalised_codes(texts), first

    @functools.cached_property
    def _folding(self) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]]:
        """The fold tables and pool of this configuration (built on first use, in about
        10 ms: a store opened only to query by signature never needs them)."""
        config = self.config
        return foldtables.fold_tables(config.nfkc, config.casefold, config.collapse_whitespace)

    def _normalised_codes(
        self, texts: list[str]
    ) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]]:
        """Code points of the texts after :func:`normalize`, and where each document
        starts (then the end)."""
        units = [self._code_units(text) for text in texts]
        lengths = np.fromiter((len(codes) for codes, _, _ in units), np.int64, len(units))
        bounds = _bounds(lengths)
        codes = kernels.scratch("codes", int(bounds[-1]), np.uint32)
        for (unit_codes, _, _), start, end in zip(
            units, bounds[:-1].tolist(), bounds[1:].tolist(), strict=True
        ):
            codes[start:end] = unit_codes
        modes = np.fromiter((mode for _, mode, _ in units), np.uint8, len(units))
        folded = kernels.scratch("folded", sum(length for _, _, length in units), np.uint32)
        tables, pool = self._folding
        bounds = kernels.compiled().fold_spaces(
            codes, bounds, tables, pool, modes, self.config.strip, folded
        )
        return folded[: bounds[-1]], bounds

    def _code_units(self, text: str) -> tuple[npt.NDArray[np.unsignedinteger], int, int]:
        """A text's code points, how the compiled pass is to read them (a mode of
        :func:`.kernels._fold_spaces`: ASCII, to fold with the fold tables of
        :mod:`.foldtables`, or folded already) and the length of the folded text.

        ASCII text is always folded there, read one byte a character. Other text is
        when :func:`.kernels._table_fold_length` vouches for it. Failing its NFKC check (a
        composing mark, say), the text is put in NFKC by ``unicodedata`` (in C) and its
        casefold is taken by table: a code point of NFKC's output is its own NFKC, and
        ``casefold`` has no context. Any other text (above U+3000 under ``casefold``) is
        folded by :func:`fold`: the tables only save time.
        """
        if text.isascii():
            codes = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
            return codes, kernels.ASCII_FOLD, len(text)
        codes = _code_points(text)
        nfkc = self.config.nfkc
        checks = foldtables.nfkc_checks() if nfkc else foldtables.NO_CHECKS
        (_, table), pool = self._folding
        length = kernels.compiled().table_fold_length(codes, table, checks, pool, nfkc)
        if length < 0 and nfkc:
            normalized = unicodedata.normalize("NFKC", text)
            if normalized is not text:  # the same object when it was in NFKC already
                text, codes = normalized, _code_points(normalized)
            length = kernels.compiled().table_fold_length(codes, table, checks, pool, False)
        if length == len(codes):
            return codes, kernels.TABLE_FOLD, length
        if length >= 0:
            return codes, kernels.TABLE_FOLD_EXPANDING, length
        codes = _code_points(fold(text, self.config))
        return codes, kernels.FOLDED, len(codes)

    def _hash_words(self, words: Sequence[str]) -> npt.NDArray[np.uint64]:
        codes = _code_points("".join(words))
        bounds = _bounds(np.array([len(w) for w in words], dtype=np.int64))
        return span_hashes(codes, bounds[:-1], bounds[1:], self._word_key)

    def _words(
        self, codes: npt.NDArray[np.uint32], doc_starts: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
        """Word hashes of the whole batch and the word index where each document starts."""
        space = _is_space(codes)
        boundary = np.zeros(len(codes) + 1, dtype=bool)
        boundary[doc_starts] = True
        before_space = np.ones(len(codes), dtype=bool)  # previous char is a space or a doc start
        before_space[1:] = space[:-1]
        before_space |= boundary[:-1]
        after_space = np.ones(len(codes), dtype=bool)
        after_space[:-1] = space[1:]
        after_space |= boundary[1:]
        word_starts = np.flatnonzero(~space & before_space)
        word_ends = np.flatnonzero(~space & after_space) + 1
        words = span_hashes(codes, word_starts, word_ends, self._word_key)
        return words, np.searchsorted(word_starts, doc_starts).astype(np.int64)

    def _check_empty(self, unit_counts: npt.NDArray[np.int64], start_index: int) -> None:
        empty = np.flatnonzero(unit_counts == 0)
        if len(empty) and not self.config.allow_empty:
            raise EmptyDocumentError(start_index + int(empty[0]))

    def _char_shingles(
        self, codes: npt.NDArray[np.uint32], doc_starts: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
        """Hashes of all character k-shingles of the batch, and how many each document has.

        A document shorter than k has one shingle, its whole text, hashed as a span of its
        own length: the value the window would have if it were k long.
        """
        k = self.config.shingle_size
        lengths = np.diff(doc_starts)
        counts = np.where(lengths >= k, lengths - k + 1, np.minimum(lengths, 1))
        offsets = _bounds(counts)
        hashes = kernels.scratch("char shingles", int(offsets[-1]), np.uint64)
        self._char_windows(codes, doc_starts, offsets, hashes, 0, np.uint64(0))
        return hashes, counts

    def _char_windows(
        self,
        codes: npt.NDArray[np.uint32],
        doc_starts: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
        hashes: npt.NDArray[np.uint64],
        num_bins: int,
        empty: np.uint64,
    ) -> npt.NDArray[np.uint64]:
        width, key = self.config.shingle_size, self._shingle_key
        return kernels.compiled().char_windows(
            codes, doc_starts, width, key, *SPAN_CONSTANTS, offsets, hashes, num_bins, empty
        )

    def _word_shingle_spans(
        self, words: npt.NDArray[np.uint64], bounds: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Start, end and owning document of every shingle span over the word hashes."""
        k = self.config.shingle_size
        counts = np.diff(bounds)
        doc_ends = bounds[1:]
        if self.config.kind == "stopword":
            is_stop = np.isin(words, self._stop_hashes)
            owner_of_word = np.repeat(np.arange(len(counts)), counts)
            starts = np.flatnonzero(is_stop)
            starts = starts[starts + k <= doc_ends[owner_of_word[starts]]]
            owners = owner_of_word[starts]
            spans_per_doc = np.bincount(owners, minlength=len(counts))
            fallback = np.flatnonzero((spans_per_doc == 0) & (counts > 0))
            # A document without a complete stop-word shingle is one shingle: all its words.
            starts = np.concatenate([starts, bounds[fallback]])
            ends = np.concatenate([starts[: len(owners)] + k, doc_ends[fallback]])
            owners = np.concatenate([owners, fallback])
            order = np.argsort(owners, kind="stable")
            return starts[order], ends[order], owners[order]
        spans_per_doc = np.where(counts > 0, np.maximum(counts - k + 1, 1), 0)
        owners = np.repeat(np.arange(len(counts)), spans_per_doc)
        starts = bounds[owners] + _segment_indices(np.zeros_like(counts), spans_per_doc)
        ends = np.minimum(starts + k, doc_ends[owners])
        return starts, ends, owners


def _segment_indices(
    starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """Concatenation of ``arange(starts[i], starts[i] + lengths[i])`` over all ``i``."""
    begin = _bounds(lengths)
    shift = np.repeat(starts - begin[:-1], lengths)
    return np.arange(begin[-1], dtype=np.int64) + shift


def _code_points(text: str) -> npt.NDArray[np.uint32]:
    # surrogatepass: a lone surrogate is one code unit like any other character, so
    # len(text) always equals the number of codes.
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


def _label_repeats(
    hashes: npt.NDArray[np.uint64], offsets: npt.NDArray[np.int64], key: np.uint64
) -> npt.NDArray[np.uint64]:
    """Bag semantics: the i-th repeat of a hash within a document becomes its own element.

    The result is grouped by document like the input (sorted by hash within each).
    """
    owners = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    order = np.lexsort((hashes, owners))
    sorted_hashes = hashes[order]
    sorted_owners = owners[order]
    new_run = np.ones(len(order), dtype=bool)
    new_run[1:] = (sorted_hashes[1:] != sorted_hashes[:-1]) | (
        sorted_owners[1:] != sorted_owners[:-1]
    )
    run_start = np.maximum.accumulate(np.where(new_run, np.arange(len(order)), 0))
    repeat = (np.arange(len(order)) - run_start).astype(np.uint64)
    labelled = np.where(repeat == 0, sorted_hashes, fmix64(sorted_hashes ^ fmix64(repeat + key)))
    return labelled


def unicode_version() -> str:
    """The Unicode database behind NFKC and casefold in this interpreter."""
    return (
        f"{unicodedata.unidata_version} (Python {sys.version_info.major}.{sys.version_info.minor})"
    )
