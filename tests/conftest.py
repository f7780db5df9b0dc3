"""Shared fixtures: hand-written near-duplicates and synthetic set pairs of known Jaccard."""

from __future__ import annotations

import signal

import numpy as np
import numpy.typing as npt
import pytest

from neardup_store.text import ShingleBatch


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C raises ``KeyboardInterrupt``, however the run was started.

    A shell without job control starts a background command (``.ci/run &``) with SIGINT
    ignored, and Python then leaves it ignored: the tests that send themselves or their
    children a SIGINT to check what a Ctrl-C leaves saw nothing happen (review 49 ran
    into it). A handled signal is reset to the default action in a child at exec, so the
    children get their Ctrl-C back too."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def near_dup_corpus() -> dict[str, str]:
    """A few hand-written texts: two near-duplicate pairs and one unrelated text."""
    return {
        "storm-a": (
            "Heavy rain and strong winds are expected across the northern coast tonight, "
            "and residents are advised to stay indoors until the storm has passed."
        ),
        "storm-b": (
            "Heavy rain and strong winds are expected across the northern coast tonight; "
            "residents are advised to stay inside until the storm has passed."
        ),
        "recipe-a": (
            "Whisk two eggs with a cup of milk, fold in the flour slowly, and let the "
            "batter rest for twenty minutes before frying thin pancakes in butter."
        ),
        "recipe-b": (
            "Whisk two eggs with a cup of milk, fold in the flour slowly, and let the "
            "batter rest for thirty minutes before frying thin pancakes in butter."
        ),
        "unrelated": (
            "The committee approved the annual budget after a long debate about funding "
            "for public libraries, parks and the repair of several bridges."
        ),
    }


def set_pair_batch(
    similarities: npt.ArrayLike, union_size: int | npt.ArrayLike, seed: int
) -> ShingleBatch:
    """Pairs of random 64-bit hash sets, pair ``i`` with exact Jaccard ``similarities[i]``.

    Document ``2i`` is ``common ∪ only_a`` and ``2i + 1`` is ``common ∪ only_b``, where
    ``|common| = round(s * union)`` and the rest of the union is split between the two.
    The exact similarity of each pair is ``|common| / union`` (see :func:`exact_of`).
    """
    rng = np.random.default_rng(seed)
    sims = np.asarray(similarities, dtype=float)
    unions = np.broadcast_to(np.asarray(union_size), sims.shape)
    docs: list[npt.NDArray[np.uint64]] = []
    for s, union in zip(sims, unions, strict=True):
        values = rng.integers(0, 2**64, size=int(union), dtype=np.uint64, endpoint=False)
        common = round(s * union)
        rest = int(union) - common
        split = common + rest // 2
        docs.append(values[:split])
        docs.append(np.concatenate([values[:common], values[split:]]))
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum([len(d) for d in docs], out=offsets[1:])
    return ShingleBatch(np.concatenate(docs), offsets)


def exact_of(batch: ShingleBatch) -> npt.NDArray[np.float64]:
    """Exact Jaccard of each (2i, 2i+1) pair of a batch."""
    out = []
    for i in range(0, len(batch), 2):
        a, b = batch.document(i), batch.document(i + 1)
        out.append(len(np.intersect1d(a, b)) / len(np.union1d(a, b)))
    return np.array(out)
