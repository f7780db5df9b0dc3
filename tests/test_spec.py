"""A second implementation of the signature pipeline, written from the docstrings alone.

Every helper below follows one section of a module docstring ("Specification" in
``neardup_store/hashing.py``, ``text.py``, ``minhash.py`` and ``lsh.py``) in plain Python
integers, and the tests compare it with the library's public API on a seeded corpus of
awkward text. So the docstrings are a complete specification: if a constant or a step of
the code changes, or the text stops describing it, these tests fail. ``unicodedata`` gives
NFKC; numpy is used only to call the library and read its answers.
"""

from __future__ import annotations

import random
import re
import unicodedata
from dataclasses import dataclass
from functools import cache

import numpy as np
import pytest

import neardup_store as nd
from neardup_store import hashing, lsh, minhash, text

M64 = (1 << 64) - 1
U32_MAX = (1 << 32) - 1

# --- hashing.py, Specification --------------------------------------------------------

FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3
SPLITMIX_GAMMA, SPLITMIX_M1, SPLITMIX_M2 = (
    0x9E3779B97F4A7C15,
    0xBF58476D1CE4E5B9,
    0x94D049BB133111EB,
)
FMIX_M1, FMIX_M2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53
SPAN_BASE, SPAN_LENGTH_MULT = 0x9E3779B97F4A7C15, 0xD6E8FEB86659FD93


def fmix64(x: int) -> int:
    """hashing.py, Specification, ``fmix64(x)``."""
    x &= M64
    x ^= x >> 33
    x = (x * FMIX_M1) & M64
    x ^= x >> 33
    x = (x * FMIX_M2) & M64
    return x ^ (x >> 33)


def splitmix64(state: int, count: int) -> list[int]:
    """hashing.py, Specification, "SplitMix64 from state ``s``"."""
    out = []
    for _ in range(count):
        state = (state + SPLITMIX_GAMMA) & M64
        z = state
        z = ((z ^ (z >> 30)) * SPLITMIX_M1) & M64
        z = ((z ^ (z >> 27)) * SPLITMIX_M2) & M64
        out.append(z ^ (z >> 31))
    return out


@cache
def derive_keys(seed: int, domain: str, count: int) -> tuple[int, ...]:
    """hashing.py, Specification, ``derive_keys(seed, domain, count)`` steps 1-3."""
    tag = FNV_OFFSET
    for byte in domain.encode("ascii"):
        tag = ((tag ^ byte) * FNV_PRIME) & M64
    (start,) = splitmix64(seed ^ tag, 1)
    return tuple(splitmix64(start, count))


def span(codes: list[int], key: int) -> int:
    """hashing.py, Specification, ``span_hashes``."""
    raw, power = 0, 1
    for code in codes:
        raw = (raw + code * power) & M64
        power = (power * SPAN_BASE) & M64
    return fmix64((raw + len(codes) * SPAN_LENGTH_MULT + key) & M64)


def multiply_shift(h: int, bound: int) -> int:
    """hashing.py, Specification, ``high_bits_below(h, bound)``."""
    return ((h >> 32) * bound) >> 32


# --- text.py, Specification -----------------------------------------------------------

# The 29 code points text.py lists, copied from its docstring (not from str.isspace).
WHITE_SPACE = frozenset(
    map(
        chr,
        [
            *range(0x09, 0x0E),
            *range(0x1C, 0x21),
            0x85,
            0xA0,
            0x1680,
            *range(0x2000, 0x200B),
            0x2028,
            0x2029,
            0x202F,
            0x205F,
            0x3000,
        ],
    )
)
STOP_FORMS = frozenset(
    form for word in nd.ENGLISH_STOP_WORDS for form in (word, word.capitalize(), word.upper())
)


@dataclass(frozen=True)
class Shingles:
    """The switches of a ``ShingleConfig`` (allow_empty is on: blank documents are hashed)."""

    kind: text.ShingleKind = "char"
    size: int = 5
    bag: bool = False
    nfkc: bool = True
    casefold: bool = True
    collapse: bool = True
    strip: bool = True

    def library(self) -> nd.ShingleConfig:
        """The library's configuration with these switches."""
        return nd.ShingleConfig(
            kind=self.kind,
            size=self.size,
            bag=self.bag,
            nfkc=self.nfkc,
            casefold=self.casefold,
            collapse_whitespace=self.collapse,
            strip=self.strip,
            allow_empty=True,
        )


def normalise(doc: str, cfg: Shingles) -> str:
    """text.py, Specification, step 1 (each step only when switched on, in this order)."""
    if cfg.nfkc:
        doc = unicodedata.normalize("NFKC", doc)
    if cfg.casefold:
        doc = doc.casefold()
    if cfg.collapse:
        doc = re.sub(f"[{re.escape(''.join(sorted(WHITE_SPACE)))}]+", " ", doc)
    if cfg.strip:
        doc = doc.strip("".join(WHITE_SPACE))
    return doc


def words_of(doc: str) -> list[str]:
    """text.py, Specification, step 2: maximal runs of non-white-space characters."""
    words, current = [], ""
    for char in doc + " ":  # the blank ends the last word
        if char in WHITE_SPACE:
            if current:
                words.append(current)
            current = ""
        else:
            current += char
    return words


def codes_of(chars: str) -> list[int]:
    """text.py, Specification, step 2: a character's code point; a lone surrogate is its
    own value, which ``ord`` gives."""
    return [ord(char) for char in chars]


def shingle_hashes(doc: str, cfg: Shingles, seed: int) -> list[int]:
    """text.py, Specification, steps 1-4: a document's shingle hashes, in text order."""
    word_key, shingle_key, bag_key = derive_keys(seed, "shingle", 3)
    norm = normalise(doc, cfg)
    if cfg.kind == "char":
        units = codes_of(norm)
        is_start = [True] * len(units)
    else:
        words = words_of(norm)
        units = [span(codes_of(word), word_key) for word in words]
        is_start = [cfg.kind == "word" or word in STOP_FORMS for word in words]
    k = cfg.size
    starts = [i for i in range(len(units) - k + 1) if is_start[i]]
    if units and not starts:
        hashes = [span(units, shingle_key)]  # the one shingle: every unit
    else:
        hashes = [span(units[i : i + k], shingle_key) for i in starts]
    return bag_labels(hashes, bag_key) if cfg.bag else hashes


def bag_labels(hashes: list[int], bag_key: int) -> list[int]:
    """text.py, Specification, step 4: the i-th repeat of a hash h (i >= 1) is relabelled."""
    seen: dict[int, int] = {}
    out = []
    for h in hashes:
        i = seen.get(h, 0)
        seen[h] = i + 1
        out.append(h if i == 0 else fmix64(h ^ fmix64((i + bag_key) & M64)))
    return out


# --- minhash.py, Specification --------------------------------------------------------


def kperm(hashes: list[int], num_perm: int, seed: int) -> list[int]:
    """minhash.py, Specification, ``kperm``."""
    a = [key | 1 for key in derive_keys(seed, "kperm-a", num_perm)]
    b = derive_keys(seed, "kperm-b", num_perm)
    return [
        min(((a[i] * x + b[i]) & M64 for x in hashes), default=M64) >> 32 for i in range(num_perm)
    ]


def oph(hashes: list[int], num_perm: int, seed: int) -> list[int]:
    """minhash.py, Specification, ``oph`` steps 1-3."""
    if not hashes:
        return [U32_MAX] * num_perm
    bins: list[int | None] = [None] * num_perm
    for x in hashes:
        j, value = multiply_shift(x, num_perm), x & U32_MAX
        current = bins[j]
        bins[j] = value if current is None else min(current, value)
    probe_keys = derive_keys(seed, "oph-densify", num_perm)
    signature = []
    for j, value in enumerate(bins):
        t = 0
        while value is None:  # borrow from a bin filled in step 1 only
            t += 1
            value = bins[multiply_shift(fmix64((probe_keys[j] + t) & M64), num_perm)]
        signature.append(value)
    return signature


# --- lsh.py, the band key schemes -------------------------------------------------------

FOLD_MULT = 0x9FB21C651E98DF25


def multilinear_keys(sig: list[int], bands: int, rows: int, seed: int) -> list[int]:
    """lsh.py, ``multilinear``: ``sum(m[j] * v[j])`` over band b's positions."""
    m = derive_keys(seed, "band-multilinear", bands * rows)
    return [sum(m[j] * sig[j] for j in range(b * rows, (b + 1) * rows)) & M64 for b in range(bands)]


def fold_keys(sig: list[int], bands: int, rows: int, seed: int) -> list[int]:
    """lsh.py, ``fold``: a start value per band, three steps per value, then fmix64."""
    keys = []
    for b, k in enumerate(derive_keys(seed, "band", bands)):
        for j in range(b * rows, (b + 1) * rows):
            k = (k + sig[j]) & M64
            k = (k * FOLD_MULT) & M64
            k ^= k >> 29
        keys.append(fmix64(k))
    return keys


# --- the corpus ---------------------------------------------------------------------

HARD = [
    *("ﬁ", "ﬂ", "ﬃ", "Ｔｈｅ", "ＡＢＣ", "１２", "①"),  # ligatures, fullwidth, circled
    *("e\u0301", "a\u0308", "n\u0303", "\u0301"),  # combining marks (one alone)
    *("ß", "ẞ", "İ", "ı", "ΟΔΟΣ", "ς", "σ", "Σ"),  # special casing and final sigma
    *("😀", "𝔘", "𐍈", "\U0001f1fa\U0001f1f8"),  # astral
    *("\ud800", "\udfff", "x\udc00y"),  # lone surrogates
    *("\u180e", "\u200b", "\ufeff", "\x00"),  # look like white space, are not
]
WORDS = [
    *("the", "The", "THE", "tHe", "and", "is", "of", "a", "I", "Ｔｈｅ"),  # stop words
    *("rose", "fox", "alpha", "beta", "gamma", "straße", "naïve", "über", "x"),
]
BLANKS = sorted(WHITE_SPACE)
FIXED = [
    "",
    " ",
    "\x1c\x1d\x1e\x1f",
    "\u3000\x85\u2028",
    "a",
    "\ud800",
    "😀",
    "ﬁ",
    "ab",
    "a rose is a rose is a rose",
    "the the the the the the",
    "alpha\x1cbeta\x1dgamma\x1edelta\x1fomega",
    "aaaaaaaaaaaa",
    "The fox and the dog of the farm",
]


def make_corpus(count: int, seed: int) -> list[str]:
    """The fixed documents, then random ones of words, hard characters and white space."""
    rng = random.Random(seed)
    docs = list(FIXED)
    while len(docs) < count:
        pieces = []
        for _ in range(rng.randrange(0, 16)):
            pieces.append(rng.choice(WORDS) if rng.random() < 0.6 else rng.choice(HARD))
            pieces.append("".join(rng.choices(BLANKS, k=rng.randrange(0, 3))))
        if rng.random() < 0.3:
            pieces *= 2  # repeats, for the bags
        docs.append("".join(pieces))
    return docs


CORPUS = make_corpus(60, seed=20261127)

# (shingles, scheme, num_perm, seed, bands, rows): every kind in set and bag mode, each
# normalisation switch off somewhere, num_perm 1 and non-powers of two, extreme seeds.
Case = tuple[Shingles, minhash.Scheme, int, int, int, int]
CASES: list[Case] = [
    (Shingles(), "oph", 128, 1, 16, 8),
    (Shingles(size=3, bag=True, casefold=False), "oph", 100, 0, 12, 8),
    (Shingles(size=1, bag=True, collapse=False), "oph", 3, 7, 1, 2),
    (Shingles(size=9, nfkc=False, strip=False), "oph", 64, 2**64 - 1, 8, 8),
    (Shingles("word", 2, bag=True), "kperm", 7, 2**64 - 1, 3, 2),
    (Shingles("word", 1, nfkc=False, collapse=False, strip=False), "kperm", 10, 12345, 5, 2),
    (Shingles("stopword", 3), "oph", 1, 42, 1, 1),
    (Shingles("stopword", 2, bag=True, casefold=False), "kperm", 5, 3, 2, 2),
    (Shingles("word", 3, bag=True), "oph", 33, 99, 4, 8),
]
CASE_IDS = [f"{c[0].kind}{c[0].size}{'-bag' if c[0].bag else ''}-{c[1]}{c[2]}" for c in CASES]


# --- the tests ----------------------------------------------------------------------


def test_the_derive_keys_test_vector_of_the_docstring_holds() -> None:
    vector = (0x2E55529B226832E1, 0x51E87A62D92176C1, 0xCDFB33432BA3E4A6)
    assert derive_keys(1, "shingle", 3) == vector
    assert [int(k) for k in hashing.derive_keys(1, "shingle", 3)] == list(vector)
    assert fmix64(1) == 0xB456BCFC34C2CB2C
    doc = " ".join((hashing.__doc__ or "").split())
    assert 'derive_keys(1, "shingle", 3) == [0x2E55529B226832E1, 0x51E87A62D92176C1, ' in doc
    assert "0xCDFB33432BA3E4A6]" in doc and "fmix64(1) == 0xB456BCFC34C2CB2C" in doc


def test_the_docstrings_state_the_constants_this_reference_uses() -> None:
    """The reference's constants are the documented ones (a constant written here but
    missing from the docs would make this a reference from the code, not from the docs)."""
    docs = {
        "hashing": hashing.__doc__ or "",
        "text": text.__doc__ or "",
        "minhash": minhash.__doc__ or "",
        "lsh": lsh.__doc__ or "",
    }
    for constant in (FNV_OFFSET, FNV_PRIME, SPLITMIX_GAMMA, SPLITMIX_M1, SPLITMIX_M2):
        assert f"{constant:#X}".replace("0X", "0x") in docs["hashing"]
    for constant in (FMIX_M1, FMIX_M2, SPAN_BASE, SPAN_LENGTH_MULT):
        assert f"{constant:#X}".replace("0X", "0x") in docs["hashing"]
    assert "0x9FB21C651E98DF25" in docs["lsh"] and "k >> 29" in docs["lsh"]
    for domain in ("shingle", "oph-densify", "kperm-a", "kperm-b", "band-multilinear", "band"):
        assert f'``"{domain}"``' in docs["hashing"]
        assert f'"{domain}"' in docs["text"] + docs["minhash"] + docs["lsh"]


def test_the_listed_white_space_is_exactly_str_isspace() -> None:
    assert {chr(c) for c in range(0x110000) if chr(c).isspace()} == WHITE_SPACE
    assert len(WHITE_SPACE) == 29


def test_the_corpus_has_the_hard_cases() -> None:
    joined = "".join(CORPUS)
    for needle in ("\ud800", "\udfff", "ß", "İ", "ς", "ﬁ", "Ｔ", "\u0301", "😀", "\x85", "\u3000"):
        assert needle in joined
    assert set(joined) >= WHITE_SPACE
    assert {"", " ", "a"} <= set(CORPUS)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_normalisation_follows_the_spec(case: Case) -> None:
    cfg = case[0]
    assert [nd.normalize(doc, cfg.library()) for doc in CORPUS] == [
        normalise(doc, cfg) for doc in CORPUS
    ]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_shingle_hashes_follow_the_spec(case: Case) -> None:
    cfg, _, _, seed, _, _ = case
    batch = nd.Shingler(cfg.library(), seed).hash_batch(CORPUS)
    for i, doc in enumerate(CORPUS):
        got = [int(h) for h in batch.document(i)]
        expected = shingle_hashes(doc, cfg, seed)
        if cfg.bag:  # a bag's hashes come in order of their plain hash
            got, expected = sorted(got), sorted(expected)
        assert got == expected, (i, doc)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_signatures_and_band_keys_follow_the_spec(case: Case) -> None:
    cfg, scheme, num_perm, seed, bands, rows = case
    config = nd.MinHashConfig(num_perm, scheme, seed, cfg.library())
    sigs = nd.MinHasher(config).signatures(CORPUS)
    minhash_of = oph if scheme == "oph" else kperm
    expected = [minhash_of(shingle_hashes(doc, cfg, seed), num_perm, seed) for doc in CORPUS]
    assert sigs.tolist() == expected
    for keys, reference in (("multilinear", multilinear_keys), ("fold", fold_keys)):
        got = nd.band_keys(sigs, nd.LSHParams(bands, rows, keys), seed=seed)
        assert got.tolist() == [reference(sig, bands, rows, seed) for sig in expected], keys


def test_the_corpus_reaches_a_probe_that_lands_on_its_own_bin() -> None:
    """At seed 1 and num_perm 128 (the first case), bin 85's first probe is bin 85 itself
    (minhash.py, ``oph`` step 2): documents where that bin is empty must probe on."""
    keys = derive_keys(1, "oph-densify", 128)
    assert [j for j in range(128) if multiply_shift(fmix64(keys[j] + 1), 128) == j] == [85]
    hashes = [shingle_hashes(doc, Shingles(), 1) for doc in CORPUS]
    reached = [
        i
        for i, h in enumerate(hashes)
        if len(h) > 1 and 85 not in {multiply_shift(x, 128) for x in h}
    ]
    assert len(reached) >= 10
    sigs = nd.MinHasher(nd.MinHashConfig(num_perm=128)).signatures([CORPUS[i] for i in reached])
    assert sigs.tolist() == [oph(hashes[i], 128, 1) for i in reached]


def test_band_keys_of_all_max_signatures_follow_the_spec() -> None:
    """The empty signature (every value 2**32 - 1) is banded like any other."""
    sig = [U32_MAX] * 12
    array = np.array([sig], dtype=np.uint32)
    for keys, reference in (("multilinear", multilinear_keys), ("fold", fold_keys)):
        got = nd.band_keys(array, nd.LSHParams(4, 3, keys), seed=5)
        assert got.tolist() == [reference(sig, 4, 3, 5)]


def test_a_one_shingle_document_can_have_the_empty_signature_under_oph() -> None:
    """minhash.py: 2**32 - 1 is not reserved, so a shingle hash ending in 32 one bits
    signs like an empty document (the README's ``allow_empty`` row says so)."""
    hasher = nd.MinHasher(nd.MinHashConfig(num_perm=16))
    batch = nd.ShingleBatch(
        np.array([0x0123456789ABCDEF | U32_MAX], dtype=np.uint64), np.array([0, 1, 1])
    )
    one_shingle, empty = hasher.signatures_from_hashes(batch).tolist()
    assert one_shingle == empty == [U32_MAX] * 16
