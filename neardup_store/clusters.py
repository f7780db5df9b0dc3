"""From candidate pairs to verified near-duplicate groups, for in-memory batches."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from . import codec
from .errors import InvalidParameterError, integer
from .lsh import LSHParams, band_keys, candidate_pairs
from .params import valid_threshold

STORE_KEY_BITS = 8 * codec.band_layout(codec.FORMAT_VERSION).band_key_bytes
"""The leading band-key bits by which a store of the current format names a bucket."""


def connected_components(count: int, pairs: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Label of each of ``count`` nodes: the smallest node index in its component.

    Vectorised min-label propagation with pointer jumping; converges in a number of rounds
    logarithmic in the component diameter on typical inputs.

    Raises:
        InvalidParameterError: ``count`` is no integer >= 0 or more labels than memory
            holds, or ``pairs`` is not ``(m, 2)`` integers or names a node outside
            ``range(count)``.
    """
    nodes = integer(count)
    expected = "an integer >= 0: the number of nodes, one int64 label each in memory"
    if nodes is None or not 0 <= nodes <= np.iinfo(np.int64).max:
        raise InvalidParameterError("count", count, expected)
    try:
        labels = np.arange(nodes, dtype=np.int64)
    except (ValueError, MemoryError):  # numpy's "Maximum allowed size exceeded", or no room
        raise InvalidParameterError("count", count, expected) from None
    pairs = np.asarray(pairs)
    if pairs.ndim and len(pairs) == 0:
        return labels
    if (
        pairs.ndim != 2
        or pairs.shape[1] != 2
        or not np.issubdtype(pairs.dtype, np.integer)  # float indexes failed in numpy
        or pairs.min() < 0
        or pairs.max() >= nodes
    ):
        raise InvalidParameterError(
            "pairs",
            f"{pairs.dtype} array of shape {pairs.shape}",
            f"(m, 2) integer node indexes in range({nodes})",
        )
    left, right = pairs[:, 0], pairs[:, 1]
    while True:
        low = np.minimum(labels[left], labels[right])
        updated = labels.copy()
        np.minimum.at(updated, left, low)
        np.minimum.at(updated, right, low)
        updated = updated[updated]  # jump to the label's label
        if np.array_equal(updated, labels):
            return labels
        labels = updated


def verified_pairs(
    signatures: npt.NDArray[np.uint32], params: LSHParams, threshold: float, seed: int = 1
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Candidate pairs from banding whose estimated Jaccard is at least ``threshold``:
    the pairs a store of these signatures lists (buckets are named by the band-key bits
    its format keeps, :data:`STORE_KEY_BITS`).

    Returns the pairs ``(m, 2)`` and their estimated similarities.
    """
    valid_threshold(threshold)
    signatures = np.asarray(signatures)
    if signatures.ndim != 2:  # band_keys takes one signature, the scores below do not
        raise InvalidParameterError(
            "signatures", f"shape {signatures.shape}", "(n, num_perm): one row per document"
        )
    pairs = candidate_pairs(band_keys(signatures, params, seed), key_bits=STORE_KEY_BITS)
    scores = (signatures[pairs[:, 0]] == signatures[pairs[:, 1]]).mean(axis=1)
    keep = scores >= threshold
    return pairs[keep], scores[keep]


def duplicate_groups(
    signatures: npt.NDArray[np.uint32], params: LSHParams, threshold: float, seed: int = 1
) -> list[list[int]]:
    """Groups (of two or more) of rows linked by verified near-duplicate pairs.

    Each group is sorted; groups are ordered by their first member.
    """
    pairs, _ = verified_pairs(signatures, params, threshold, seed)
    labels = connected_components(len(signatures), pairs)
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    starts = np.flatnonzero(np.r_[True, sorted_labels[1:] != sorted_labels[:-1]])
    groups = np.split(order, starts[1:])
    return [sorted(int(i) for i in g) for g in groups if len(g) > 1]
