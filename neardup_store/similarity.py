"""Set and bag similarity, exact and estimated from signatures (MMDS sections 3.1 and 3.3).

Bag (multiset) Jaccard has two definitions in use. MMDS 3.1.1 takes the union of bags as
their *sum*, so the largest possible value is 1/2 ({a,a,a,b} and {a,a,b,b,c} have
similarity 3/9 = 1/3). The other takes the element-wise *max*, so identical bags score 1
(the same pair: 3/6 = 1/2). MinHash over labelled repeats (``ShingleConfig(bag=True)``)
estimates the max-union value; :func:`sum_union_from_max_union` converts it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from .errors import InvalidParameterError, choice, real

_C = TypeVar("_C")
_COLLECTION = "an iterable of hashable items (a set, list, str or array)"


def _collected(name: str, items: object, collect: Callable[[Any], _C]) -> _C:
    """``collect(items)``, or :class:`InvalidParameterError` for what is no collection:
    ``None`` (``Counter(None)`` is an empty bag, which answered a number), a number, a
    0-d array or unhashable items (raw ``TypeError`` from ``set`` or ``Counter``)."""
    if items is None:
        raise InvalidParameterError(name, items, _COLLECTION)
    try:
        return collect(items)
    except TypeError:  # not iterable (a 0-d array says so only here), or unhashable items
        raise InvalidParameterError(name, items, _COLLECTION) from None


def jaccard(a: Iterable[Hashable], b: Iterable[Hashable]) -> float:
    """Exact Jaccard similarity ``|A ∩ B| / |A ∪ B|`` of two sets (two empty sets: 1.0).

    Raises:
        InvalidParameterError: ``a`` or ``b`` is not an iterable of hashable items.
    """
    set_a, set_b = _collected("a", a, set), _collected("b", b, set)
    union = len(set_a | set_b)
    return 1.0 if union == 0 else len(set_a & set_b) / union


def bag_jaccard(
    a: Iterable[Hashable], b: Iterable[Hashable], union: Literal["sum", "max"] = "sum"
) -> float:
    """Exact Jaccard similarity of two bags (multisets).

    Args:
        union: ``"sum"`` (MMDS: the union's size is ``|A| + |B|``, values in [0, 1/2]) or
            ``"max"`` (element-wise maximum of counts, values in [0, 1]).

    Raises:
        InvalidParameterError: ``a`` or ``b`` is not an iterable of hashable items, or
            ``union`` is neither choice.
    """
    max_union = choice("union", union, ("sum", "max")) == "max"
    count_a, count_b = _collected("a", a, Counter), _collected("b", b, Counter)
    common = sum((count_a & count_b).values())
    if max_union:
        total = sum((count_a | count_b).values())
    else:
        total = sum(count_a.values()) + sum(count_b.values())
    if total == 0:  # two empty bags are identical: the definition's maximum
        return 1.0 if max_union else 0.5
    return common / total


def sum_union_from_max_union(similarity: float) -> float:
    """Convert a max-union bag similarity ``J`` to the sum-union one: ``J / (1 + J)``."""
    value = real(similarity)
    if value is None or not 0.0 <= value <= 1.0:
        raise InvalidParameterError("similarity", similarity, "a number in [0, 1]")
    return value / (1.0 + value)


def hashed_jaccard(a: npt.NDArray[np.uint64], b: npt.NDArray[np.uint64]) -> float:
    """Exact Jaccard of two arrays of shingle hashes taken as sets (vectorised).

    Raises:
        InvalidParameterError: ``a`` or ``b`` is not a 1-D array of integers (an empty
            one of any type is an empty set): ``True`` answered 1.0, ``None`` raised a raw
            ``TypeError``.
    """
    set_a, set_b = np.unique(_hashes("a", a)), np.unique(_hashes("b", b))
    union = len(np.union1d(set_a, set_b))
    return 1.0 if union == 0 else len(np.intersect1d(set_a, set_b, assume_unique=True)) / union


def estimate_jaccard(
    signature: npt.NDArray[np.uint32], others: npt.NDArray[np.uint32]
) -> float | npt.NDArray[np.float64]:
    """Fraction of positions where signatures agree: the MinHash estimate of Jaccard.

    ``others`` may be one signature (returns a float) or a 2-D array of them (returns one
    estimate per row).

    Raises:
        InvalidParameterError: the shapes differ, a signature is empty (no position to
            agree on: the mean was NaN) or its values are no integers.
    """
    signature, others = np.asarray(signature), np.asarray(others)
    if (
        signature.ndim != 1
        or signature.shape[0] == 0
        or others.ndim not in (1, 2)  # a number or None had no last axis to compare
        or others.shape[-1] != signature.shape[0]
        or not (_integers(signature) and _integers(others))
    ):
        raise InvalidParameterError(
            "signature shapes",
            (signature.shape, others.shape),
            "a 1-D signature of one value or more and signatures with the same num_perm,"
            " of integer values",
        )
    agree = (others == signature).mean(axis=-1)
    return float(agree) if others.ndim == 1 else agree


def _hashes(name: str, values: object) -> npt.NDArray[np.integer[Any]]:
    try:
        array = np.asarray(values)
    except (TypeError, ValueError):  # a ragged list
        array = None
    if array is None or array.ndim != 1 or (array.size and not _integers(array)):
        raise InvalidParameterError(
            name, values, "a 1-D array of integer shingle hashes, as Shingler returns"
        )
    return array


def _integers(values: npt.NDArray[np.generic]) -> bool:
    return bool(np.issubdtype(values.dtype, np.integer))
