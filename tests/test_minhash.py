"""MinHash signatures (MMDS section 3.3): shape, determinism, accuracy, both schemes."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import exact_of, set_pair_batch

import neardup_store as nd
from neardup_store import minhash
from neardup_store.demo import _edit
from neardup_store.errors import EmptyDocumentError, InvalidParameterError
from neardup_store.minhash import EMPTY_VALUE, MinHashConfig, MinHasher
from neardup_store.text import ShingleConfig, Shingler

SCHEMES = ["oph", "kperm"]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_signature_shape_dtype_and_determinism(
    scheme: str, near_dup_corpus: dict[str, str]
) -> None:
    hasher = MinHasher(MinHashConfig(num_perm=96, scheme=scheme))  # type: ignore[arg-type]
    sigs = hasher.signatures(near_dup_corpus.values())
    assert sigs.shape == (5, 96) and sigs.dtype == np.uint32
    again = MinHasher(MinHashConfig(num_perm=96, scheme=scheme)).signatures(  # type: ignore[arg-type]
        near_dup_corpus.values()
    )
    assert np.array_equal(sigs, again)
    for i, text in enumerate(near_dup_corpus.values()):
        assert np.array_equal(hasher.signature(text), sigs[i])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_near_duplicates_score_higher_than_unrelated(
    scheme: str, near_dup_corpus: dict[str, str]
) -> None:
    hasher = MinHasher(MinHashConfig(scheme=scheme))  # type: ignore[arg-type]
    sig = dict(zip(near_dup_corpus, hasher.signatures(near_dup_corpus.values()), strict=True))
    assert nd.estimate_jaccard(sig["storm-a"], sig["storm-a"]) == 1.0
    assert nd.estimate_jaccard(sig["recipe-a"], sig["recipe-b"]) > 0.7
    assert nd.estimate_jaccard(sig["storm-a"], sig["storm-b"]) > 0.5
    assert nd.estimate_jaccard(sig["storm-a"], sig["unrelated"]) < 0.15


@pytest.mark.parametrize("scheme", SCHEMES)
def test_estimate_error_within_the_bound_num_perm_implies(scheme: str) -> None:
    """1000 pairs of sets with known Jaccard: the estimate is unbiased and its error has
    the binomial spread sqrt(J(1 - J) / num_perm) (one-permutation hashing is a little
    tighter: it samples without replacement)."""
    rng = np.random.default_rng(11)
    sims = rng.uniform(0.05, 0.95, 1000)
    batch = set_pair_batch(sims, rng.integers(200, 2000, 1000), seed=12)
    exact = exact_of(batch)
    sigs = MinHasher(MinHashConfig(num_perm=128, scheme=scheme)).signatures_from_hashes(batch)  # type: ignore[arg-type]
    estimate = (sigs[0::2] == sigs[1::2]).mean(axis=1)
    z = (estimate - exact) / np.sqrt(exact * (1 - exact) / 128)
    assert abs(z.mean()) < 0.15  # unbiased: the mean of 1000 z-scores has s.d. ~0.03
    assert 0.8 < z.std() < 1.15
    assert np.abs(z).max() < 5.0


@pytest.mark.parametrize("scheme", SCHEMES)
def test_small_sets_stay_unbiased_with_densification(scheme: str) -> None:
    """Sets smaller than num_perm leave most OPH bins empty: densification must keep the
    estimate unbiased and close to k-permutation accuracy."""
    rng = np.random.default_rng(21)
    sims = rng.uniform(0.05, 0.95, 800)
    batch = set_pair_batch(sims, rng.integers(4, 60, 800), seed=22)
    exact = exact_of(batch)
    sigs = MinHasher(MinHashConfig(scheme=scheme)).signatures_from_hashes(batch)  # type: ignore[arg-type]
    error = (sigs[0::2] == sigs[1::2]).mean(axis=1) - exact
    assert abs(error.mean()) < 0.006
    assert np.sqrt((error**2).mean()) < 0.055


@pytest.mark.parametrize("scheme", SCHEMES)
def test_estimates_on_edited_texts_match_exact_jaccard(scheme: str) -> None:
    rng = random.Random(5)
    vocabulary = [f"w{i}x{i % 7}" for i in range(2000)]
    originals = [" ".join(rng.choices(vocabulary, k=rng.randint(50, 300))) for _ in range(120)]
    copies = [
        " ".join(_edit(rng, vocabulary, o.split(), rate=rng.uniform(0.005, 0.12)))
        for o in originals
    ]
    config = MinHashConfig(num_perm=256, scheme=scheme)  # type: ignore[arg-type]
    sigs = MinHasher(config).signatures(originals + copies)
    shingler = Shingler(config.shingles, config.seed)
    for i in range(len(originals)):
        exact = nd.hashed_jaccard(
            shingler.hash_document(originals[i]), shingler.hash_document(copies[i])
        )
        estimate = nd.estimate_jaccard(sigs[i], sigs[len(originals) + i])
        bound = 5 * np.sqrt(max(exact * (1 - exact), 0.01) / 256)
        assert abs(estimate - exact) < bound, (i, exact, estimate)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_bag_signatures_estimate_max_union_bag_similarity(scheme: str) -> None:
    config = MinHashConfig(
        num_perm=1024,
        scheme=scheme,  # type: ignore[arg-type]
        shingles=ShingleConfig(kind="word", size=1, bag=True),
    )
    rng = random.Random(3)
    words = [f"t{i}" for i in range(40)]
    first = rng.choices(words, k=400)
    second = first[:250] + rng.choices(words, k=150)
    a, b = " ".join(first), " ".join(second)
    exact = nd.bag_jaccard(first, second, union="max")
    sig_a, sig_b = MinHasher(config).signatures([a, b])
    estimate = nd.estimate_jaccard(sig_a, sig_b)
    assert abs(estimate - exact) < 5 * np.sqrt(exact * (1 - exact) / 1024)
    assert nd.sum_union_from_max_union(exact) == pytest.approx(nd.bag_jaccard(first, second))
    # As sets the two texts hold the same words: only the bag view tells them apart.
    assert set(first) == set(second) and exact < 0.9
    set_sigs = MinHasher(MinHashConfig(num_perm=1024, shingles=ShingleConfig(kind="word", size=1)))
    assert nd.estimate_jaccard(*set_sigs.signatures([a, b])) == 1.0


def test_kperm_arithmetic_raises_no_overflow_warnings() -> None:
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        sig = MinHasher(MinHashConfig(scheme="kperm")).signature("x" * 50 + "some text" * 30)
    assert sig.dtype == np.uint32 and (sig < EMPTY_VALUE).all()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_empty_document_gets_the_empty_signature_when_allowed(scheme: str) -> None:
    config = MinHashConfig(scheme=scheme, shingles=ShingleConfig(allow_empty=True))  # type: ignore[arg-type]
    sigs = MinHasher(config).signatures(["", "short", "  "])
    assert (sigs[0] == EMPTY_VALUE).all() and (sigs[2] == EMPTY_VALUE).all()
    assert (sigs[1] < EMPTY_VALUE).all()  # densified: every value comes from its one shingle
    with pytest.raises(EmptyDocumentError):
        MinHasher(MinHashConfig(scheme=scheme)).signature("")  # type: ignore[arg-type]


def test_one_shingle_document_has_one_value_everywhere_with_oph() -> None:
    sig = MinHasher().signature("abc")
    assert len(np.unique(sig)) == 1


def test_schemes_and_seeds_give_different_signatures() -> None:
    text = "a document signed under four configurations"
    sigs = [
        MinHasher(MinHashConfig(scheme=s, seed=seed)).signature(text)  # type: ignore[arg-type]
        for s in SCHEMES
        for seed in (1, 2)
    ]
    for i in range(len(sigs)):
        for j in range(i + 1, len(sigs)):
            assert nd.estimate_jaccard(sigs[i], sigs[j]) < 0.2


def test_large_batch_spanning_many_kperm_blocks_equals_single_calls() -> None:
    rng = random.Random(8)
    texts = [
        "".join(rng.choices("abcdefgh ", k=rng.randint(1, 900))).strip() or "z" for _ in range(60)
    ]
    hasher = MinHasher(MinHashConfig(num_perm=32, scheme="kperm"))
    batch = hasher.signatures(texts)
    for i, text in enumerate(texts):
        assert np.array_equal(batch[i], hasher.signature(text))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_perm": 0}, "num_perm"),
        ({"num_perm": -5}, "num_perm"),
        ({"num_perm": 1.5}, "num_perm"),
        ({"num_perm": 10**6}, "num_perm"),
        ({"scheme": "minhash"}, "scheme"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"shingles": {"kind": "char"}}, "shingles"),
    ],
)
def test_invalid_minhash_configuration(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(InvalidParameterError, match=f"^{name}=") as info:
        MinHashConfig(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, nd.NeardupError)


def test_configuration_round_trips_through_a_plain_dict() -> None:
    config = MinHashConfig(
        num_perm=64, scheme="kperm", seed=2**63 + 5, shingles=ShingleConfig(kind="word", size=2)
    )
    assert MinHashConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    "documents",
    # a 0-d array passed as an Iterable, then raised numpy's raw TypeError (review 44)
    ["one document as a str", b"bytes", None, 5, np.array("one document"), np.array(None)],
)
def test_batch_calls_reject_a_single_document_or_non_iterable(documents: object) -> None:
    with pytest.raises(nd.BatchTypeError, match="expected an iterable of documents") as info:
        MinHasher().signatures(documents)  # type: ignore[arg-type]
    assert isinstance(info.value, TypeError)
    if isinstance(documents, str | np.ndarray):
        assert "signature()" in str(info.value)


def test_configuration_objects_are_type_checked() -> None:
    with pytest.raises(InvalidParameterError, match=r"^config=128"):
        MinHasher(128)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match=r"^config="):
        Shingler({"kind": "char"})  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match=r"^params="):
        nd.band_keys(MinHasher().signatures(["abcdef"]), (9, 13))  # type: ignore[arg-type]


def test_batches_larger_than_one_internal_chunk() -> None:
    """Large batches are signed in internal chunks; results and error positions must not
    depend on where the chunks fall."""
    rng = random.Random(2)
    texts = ["".join(rng.choices("abcdefghij ", k=450_000)) for _ in range(3)] + ["short one"]
    hasher = MinHasher()
    batch = hasher.signatures(texts)
    for i, text in enumerate(texts):
        assert np.array_equal(batch[i], hasher.signature(text))
    with pytest.raises(EmptyDocumentError) as info:
        hasher.signatures([*texts, "   "])
    assert info.value.index == 4
    assert hasher.signatures([]).shape == (0, hasher.config.num_perm)


def test_minhash_config_from_dict_names_a_missing_field() -> None:
    """A missing field was a raw KeyError (review 22)."""
    with pytest.raises(InvalidParameterError, match="scheme, seed, shingles missing"):
        MinHashConfig.from_dict({"num_perm": 4})
    with pytest.raises(InvalidParameterError, match="config="):
        MinHashConfig.from_dict(None)  # type: ignore[arg-type]
    data = MinHashConfig().to_dict()
    del data["shingles"]["kind"]
    with pytest.raises(InvalidParameterError, match="kind missing"):
        MinHashConfig.from_dict(data)


def test_signatures_refuse_a_bad_encoding_even_for_str_documents() -> None:
    """signatures(["text"], encoding="nope") took the bad name for str documents (review 22)."""
    hasher = MinHasher(MinHashConfig(num_perm=16))
    for call in (
        lambda: hasher.signatures(["some text"], encoding="nope"),
        lambda: hasher.signatures([], encoding="nope"),
        lambda: hasher.signature("some text", encoding="nope"),
    ):
        with pytest.raises(InvalidParameterError, match="encoding='nope'"):
            call()
    assert hasher.signatures([b"some text"], encoding="utf-8").shape == (1, 16)


_U3 = np.array([1, 2, 3], dtype=np.uint64)
_BAD_BATCHES = [
    # offsets past the end were read out of bounds by the compiled OPH loop (review 52)
    (_U3, np.array([0, 4]), r"offsets from 0 to len\(hashes\) = 3 .* run from 0 to 4"),
    (_U3, np.array([1, 3]), r"run from 1 to 3"),
    (_U3, np.array([0, 3, 1, 3]), r"offsets\[2\] = 1 is below offsets\[1\] = 3"),
    (_U3, np.array([], dtype=np.int64), r"one value or more"),
    (_U3, np.array([0.0, 3.0]), r"^batch\.offsets=.*1-D numpy array of integers"),
    (_U3, [0, 3], r"^batch\.offsets=\[0, 3\]"),
    (_U3, np.array([[0, 3]]), r"^batch\.offsets="),
    (np.array([1.0, 2.0]), np.array([0, 2]), r"^batch\.hashes=.*1-D numpy array of integers"),
    (np.array([True, False]), np.array([0, 2]), r"^batch\.hashes="),
    (_U3.reshape(3, 1), np.array([0, 3]), r"^batch\.hashes="),
    ([1, 2, 3], np.array([0, 3]), r"^batch\.hashes="),
]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize(("hashes", "offsets", "message"), _BAD_BATCHES)
def test_signatures_from_hashes_refuses_a_malformed_batch(
    scheme: str, hashes: object, offsets: object, message: str
) -> None:
    """The public entry point checks its batch: offsets past the end made the OPH loop read
    outside the hashes (garbage, or a segfault for large ones), the rest raised raw numpy
    or numba errors (review 52)."""
    hasher = MinHasher(MinHashConfig(num_perm=8, scheme=scheme))  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match=message):
        hasher.signatures_from_hashes(nd.ShingleBatch(hashes, offsets))  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match=r"^batch=.*a ShingleBatch"):
        hasher.signatures_from_hashes([_U3])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        ("np.array([0, 1 << 40])", "these run from 0 to 1099511627776"),
        ("np.array([0, 2**64 - 1, 3], dtype=np.uint64)", "offsets[2] = 3 is below offsets[1]"),
    ],
)
def test_offsets_far_past_the_hashes_are_refused_not_read(offsets: str, message: str) -> None:
    """An offset far past the end made the OPH loop read unmapped memory: the process died
    of SIGSEGV, or read on for minutes (review 52). In a child process, so that a
    regression fails this test rather than ending or stalling the test run."""
    script = (
        "import numpy as np, neardup_store as nd\n"
        f"batch = nd.ShingleBatch(np.array([1, 2, 3], dtype=np.uint64), {offsets})\n"
        "try:\n"
        "    nd.MinHasher(nd.MinHashConfig(num_perm=8)).signatures_from_hashes(batch)\n"
        "except nd.InvalidParameterError as error:\n"
        "    print(error)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert message in done.stdout


@pytest.mark.parametrize("scheme", SCHEMES)
def test_signatures_from_hashes_reads_any_integer_hashes_modulo_2_64(scheme: str) -> None:
    """int64 hashes are the uint64 of the same bits under both schemes (kperm raised a raw
    UFuncTypeError); offsets of any integer type, strided or big-endian arrays give the
    same signatures as the native uint64/int64 batch."""
    hasher = MinHasher(MinHashConfig(num_perm=32, scheme=scheme))  # type: ignore[arg-type]
    rng = np.random.default_rng(52)
    hashes = rng.integers(0, 2**64, 40, dtype=np.uint64, endpoint=False)
    hashes[:20] |= np.uint64(1 << 63)  # negative as int64
    offsets = np.array([0, 15, 15, 40], dtype=np.int64)
    expected = hasher.signatures_from_hashes(nd.ShingleBatch(hashes, offsets))
    strided = np.empty(80, dtype=np.uint64)
    strided[::2] = hashes
    for other in (
        nd.ShingleBatch(hashes.view(np.int64), offsets),
        nd.ShingleBatch(hashes, offsets.astype(np.uint32)),
        nd.ShingleBatch(hashes, offsets.astype(np.uint64)),
        nd.ShingleBatch(strided[::2], offsets),
        nd.ShingleBatch(hashes.astype(">u8"), offsets.astype(">i8")),
    ):
        assert np.array_equal(hasher.signatures_from_hashes(other), expected)
    small = np.array([-1, 5], dtype=np.int32)  # a narrower type: -1 is 2**64 - 1
    assert np.array_equal(
        hasher.signatures_from_hashes(nd.ShingleBatch(small, np.array([0, 2]))),
        hasher.signatures_from_hashes(
            nd.ShingleBatch(np.array([2**64 - 1, 5], dtype=np.uint64), np.array([0, 2]))
        ),
    )
    empty = nd.ShingleBatch(np.empty(0, dtype=np.uint64), np.array([0]))
    assert hasher.signatures_from_hashes(empty).shape == (0, 32)


def test_memoryview_documents_are_batched_by_their_bytes() -> None:
    """A memoryview counted as one character: any number of them shared one internal
    batch (review 52). They count as many as the bytes as_text decodes (nbytes, also for
    a view of wider items), as bytes documents do."""
    data = b"x" * 100_000
    as_bytes = list(minhash._chunks([data] * 50))
    assert len(as_bytes) > 10
    assert list(minhash._chunks([memoryview(data)] * 50)) == as_bytes
    wide = memoryview(data).cast("H")  # 50,000 items, 100,000 bytes
    assert list(minhash._chunks([wide] * 50)) == as_bytes
    hasher = MinHasher(MinHashConfig(num_perm=16))
    texts = [f"document number {i} with a few words" for i in range(5)]
    views = [memoryview(text.encode("utf-16-le")).cast("H") for text in texts]
    assert np.array_equal(hasher.signatures(views, encoding="utf-16-le"), hasher.signatures(texts))
