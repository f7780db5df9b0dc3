"""Exact and estimated similarity of sets and bags."""

from __future__ import annotations

import numpy as np
import pytest

import neardup_store as nd


def test_set_jaccard() -> None:
    # MMDS Figure 3.1: |S ∩ T| = 3, |S ∪ T| = 8.
    assert nd.jaccard("abcdef", "cdeghi") == pytest.approx(3 / 9)
    assert nd.jaccard({1, 2, 3, 4, 5}, {3, 4, 5, 6, 7, 8, 9, 10}) == pytest.approx(3 / 10)
    assert nd.jaccard(set(), set()) == 1.0
    assert nd.jaccard({1}, {2}) == 0.0


def test_bag_similarity_mmds_example() -> None:
    # MMDS Example 3.2: {a,a,a,b} and {a,a,b,b,c} have bag similarity 1/3 (sum union).
    a, b = ["a", "a", "a", "b"], ["a", "a", "b", "b", "c"]
    assert nd.bag_jaccard(a, b) == pytest.approx(1 / 3)
    assert nd.bag_jaccard(a, b, union="max") == pytest.approx(1 / 2)
    assert nd.sum_union_from_max_union(0.5) == pytest.approx(1 / 3)


def test_bag_similarity_maxima() -> None:
    bag = ["x", "x", "y"]
    assert nd.bag_jaccard(bag, bag) == 0.5
    assert nd.bag_jaccard(bag, bag, union="max") == 1.0
    assert nd.bag_jaccard([], []) == 0.5 and nd.bag_jaccard([], [], union="max") == 1.0
    with pytest.raises(nd.InvalidParameterError, match="union"):
        nd.bag_jaccard(bag, bag, union="min")  # type: ignore[arg-type]


def test_hashed_jaccard_treats_arrays_as_sets() -> None:
    a = np.array([1, 2, 2, 3], dtype=np.uint64)
    b = np.array([3, 4, 2], dtype=np.uint64)
    assert nd.hashed_jaccard(a, b) == pytest.approx(2 / 4)


def test_estimate_jaccard_one_and_many() -> None:
    sig = np.array([1, 2, 3, 4], dtype=np.uint32)
    others = np.array([[1, 2, 3, 4], [1, 0, 3, 0], [9, 9, 9, 9]], dtype=np.uint32)
    assert nd.estimate_jaccard(sig, others[1]) == 0.5
    assert nd.estimate_jaccard(sig, others).tolist() == [1.0, 0.5, 0.0]
    with pytest.raises(nd.InvalidParameterError, match="same num_perm"):
        nd.estimate_jaccard(sig, np.zeros(5, dtype=np.uint32))


def test_the_pure_helpers_refuse_what_they_cannot_mean() -> None:
    """Typed errors, not a number that looks like an answer or a bare IndexError."""
    with pytest.raises(nd.InvalidParameterError, match="similarity=2"):
        nd.sum_union_from_max_union(2)
    with pytest.raises(nd.InvalidParameterError, match=r"range\(3\)"):
        nd.connected_components(3, np.array([[0, 7]]))
    with pytest.raises(nd.InvalidParameterError, match="range"):
        nd.connected_components(3, np.array([[-1, 2]]))
    with pytest.raises(nd.InvalidParameterError, match=r"\(documents, bands\)"):
        nd.candidate_pairs(np.arange(4, dtype=np.uint64))
    assert nd.connected_components(3, np.array([[0, 2]])).tolist() == [0, 1, 0]


@pytest.mark.parametrize(
    "call",
    [
        lambda: nd.estimate_jaccard(np.arange(8, dtype=np.uint32), 5),
        lambda: nd.estimate_jaccard(np.arange(8, dtype=np.uint32), None),
        lambda: nd.sum_union_from_max_union("0.5"),
        lambda: nd.sum_union_from_max_union(None),
    ],
)
def test_similarity_helpers_refuse_wrong_inputs_with_a_typed_error(call: object) -> None:
    """IndexError and TypeError escaped for a number or a str in place of signatures (review 22)."""
    with pytest.raises(nd.InvalidParameterError):
        call()  # type: ignore[operator]
    assert nd.sum_union_from_max_union(np.float32(0.5)) == pytest.approx(1 / 3)


_HASHES = np.array([1, 2], dtype=np.uint64)


_NO_COLLECTIONS = {
    "jaccard of None": (lambda: nd.jaccard(None, [1]), "a"),
    "jaccard of a number": (lambda: nd.jaccard([1], 5), "b"),
    "jaccard of unhashable items": (lambda: nd.jaccard([[1], [2]], [1]), "a"),
    "bag_jaccard of None": (lambda: nd.bag_jaccard(None, [1]), "a"),  # Counter(None): 0.0
    "bag_jaccard of a 0-d array": (lambda: nd.bag_jaccard([1], np.array("ab")), "b"),
    "bag_jaccard union as an array": (
        lambda: nd.bag_jaccard([1], [1], union=np.array(["sum", "max"])),
        "union",
    ),
    "hashed_jaccard of True": (lambda: nd.hashed_jaccard(True, _HASHES), "a"),  # was 1.0
    "hashed_jaccard of None": (lambda: nd.hashed_jaccard(None, _HASHES), "a"),
    "hashed_jaccard of a dict": (lambda: nd.hashed_jaccard({}, _HASHES), "a"),
    "hashed_jaccard of floats": (lambda: nd.hashed_jaccard(_HASHES, np.array([1.0, 2.0])), "b"),
    "hashed_jaccard of a 2-D array": (
        lambda: nd.hashed_jaccard(_HASHES, np.array([[1, 2]], np.uint64)),
        "b",
    ),
    "estimate_jaccard of empty signatures": (
        lambda: nd.estimate_jaccard(np.array([], np.uint32), np.array([], np.uint32)),
        "signature",
    ),
}


@pytest.mark.parametrize("case", sorted(_NO_COLLECTIONS))
def test_exact_and_estimated_similarity_refuse_what_is_no_collection(case: str) -> None:
    """Raw TypeError/ValueError, or a number for nonsense: bag_jaccard(None, [1]) was 0.0,
    hashed_jaccard(True, [1]) 1.0 and an empty signature's estimate NaN (review 44)."""
    call, name = _NO_COLLECTIONS[case]
    with pytest.raises(nd.InvalidParameterError, match=f"^{name}"):
        call()  # type: ignore[operator]
    assert nd.hashed_jaccard([], []) == 1.0 == nd.hashed_jaccard([1, 2], (2, 1))
    assert nd.jaccard("ab", np.array(["b", "a"])) == 1.0 == nd.bag_jaccard((1,), {1}, "max")
