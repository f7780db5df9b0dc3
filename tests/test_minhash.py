"""MinHash signatures (MMDS section 3.3): shape, determinism, accuracy, both schemes."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
from conftest import exact_of, set_pair_batch

import neardup_store as nd
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
