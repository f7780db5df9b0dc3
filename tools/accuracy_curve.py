"""Recall and precision of every cut of the agreement count at num_perm 128.

With 128 values, what a pair's signatures say about it is how many values agree; a rule on
that count is a cut ``k``, and banding only removes pairs that a low cut would keep. This
prints the curve the cuts trace on the benchmark's seeded corpora, with and without the
banding, so that the accuracy target (recall at least rensa's with precision at least
datasketch's) can be checked against every rule on the count at once.

    python tools/accuracy_curve.py            # seeds 0 and 1 (seed 0 is the benchmark's)
    python tools/accuracy_curve.py --seeds 0 1 2 --cuts 100 108
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ground_truth
from corpus import real_documents, with_near_duplicates

from neardup_store import MinHashConfig
from neardup_store.minhash import MinHasher

NUM_PERM = 128
BANDINGS = ((16, 8), (32, 4))  # ours by the default weights; one that misses nothing above 0.7


def curve(seed: int, cuts: range) -> list[tuple[str, int, float, float]]:
    """``(banding, cut, recall, precision)`` on the corpus the benchmark builds for ``seed``."""
    docs, _ = with_near_duplicates(real_documents(2000, seed + 7), 1000, seed)
    truth = ground_truth.all_pairs(ground_truth.shingle_sets(docs), 0.5)
    pairs = np.array(list(truth))
    exact = np.array(list(truth.values()))
    positives = int((exact >= 0.8).sum())
    sigs = MinHasher(MinHashConfig(num_perm=NUM_PERM)).signatures(docs)
    agree = sigs[pairs[:, 0]] == sigs[pairs[:, 1]]
    counts = agree.sum(axis=1)
    rows = []
    for bands, rows_per_band in BANDINGS:
        banded = agree[:, : bands * rows_per_band].reshape(len(pairs), bands, rows_per_band)
        candidate = banded.all(axis=2).any(axis=1)
        for cut in cuts:
            returned = candidate & (counts >= cut)
            hits = int((returned & (exact >= 0.8)).sum())
            rows.append(
                (f"{bands}x{rows_per_band}", cut, hits / positives, hits / max(1, returned.sum()))
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--cuts", type=int, nargs=2, default=[100, 108], metavar=("LOW", "HIGH"))
    args = parser.parse_args(argv)
    print("| seed | banding | cut k (k / 128) | recall | precision |\n|---|---|---|---:|---:|")
    for seed in args.seeds:
        for banding, cut, recall, precision in curve(seed, range(*args.cuts)):
            share = cut / NUM_PERM
            print(f"| {seed} | {banding} | {cut} ({share:.3f}) | {recall:.3f} | {precision:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
