"""Recall and precision of returned matches against the exact truth, per similarity bucket.

The corpus is real documents plus seeded near-duplicates (``corpus.with_near_duplicates``);
the truth is every pair with exact Jaccard >= 0.5 of the char 5-shingle sets
(``ground_truth.all_pairs``, checked against brute force on a subset). Each system indexes
every document and is queried with every document; a returned pair ``{i, j}`` (i ≠ j) is
a match. Recall is over the true pairs with J >= 0.8 (overall and per bucket of J);
precision is the share of returned pairs whose exact J is >= 0.8.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

BUCKETS = ((0.80, 0.85), (0.85, 0.90), (0.90, 0.95), (0.95, 1.0001))
THRESHOLD = 0.8


def score(found: set[tuple[int, int]], truth: dict[tuple[int, int], float]) -> dict[str, Any]:
    """Recall per bucket and overall, and precision, of ``found`` against ``truth``."""
    positives = {pair for pair, j in truth.items() if j >= THRESHOLD}
    result: dict[str, Any] = {"returned": len(found), "true_pairs": len(positives)}
    result["recall"] = len(found & positives) / max(1, len(positives))
    result["precision"] = len(found & positives) / len(found) if found else 1.0
    for lo, hi in BUCKETS:
        bucket = {pair for pair in positives if lo <= truth[pair] < hi}
        result[f"recall_{lo:.2f}-{min(hi, 1.0):.2f}"] = (
            len(found & bucket) / len(bucket) if bucket else None
        )
    below = [truth.get(pair, 0.0) for pair in found - positives]
    result["false_positives_exact_J_median"] = float(np.median(below)) if below else None
    return result


def _pairs(results: Sequence[Sequence[int]]) -> set[tuple[int, int]]:
    return {(min(i, j), max(i, j)) for i, hits in enumerate(results) for j in hits if j != i}


def ours(
    docs: Sequence[str],
    num_perm: int | None = None,
    exact: bool = False,
    banding: tuple[int, int] | None = None,
) -> set[tuple[int, int]]:
    """Our store: the defaults, or the given ``num_perm`` and ``(bands, rows)``; matches
    verified by signature, or by exact Jaccard."""
    from neardup_store import Store

    options: dict[str, Any] = {"threshold": THRESHOLD}
    if num_perm is not None:
        options["num_perm"] = num_perm
    if banding is not None:
        options.update(bands=banding[0], rows=banding[1])
    source: Callable[[Any], str] | None = (lambda key: docs[int(key)]) if exact else None
    with (
        tempfile.TemporaryDirectory() as tmp,
        Store.open(Path(tmp) / "acc.ndx", create=True, durable=False, **options) as store,
    ):
        store.add_many([(str(i), d) for i, d in enumerate(docs)], batch_size=None)
        results = store.query_many(docs, exact=source)
    return _pairs([[int(m.key) for m in hits] for hits in results])


def datasketch_lsh(docs: Sequence[str], shingle: Callable[[str], list[str]]) -> dict[str, set]:
    """datasketch MinHash.bulk + MinHashLSH(0.8, 128): candidates, and candidates whose
    estimated Jaccard is >= 0.8."""
    from datasketch import MinHash, MinHashLSH

    sketches = MinHash.bulk([[s.encode() for s in shingle(d)] for d in docs], num_perm=128)
    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=128)
    for i, sketch in enumerate(sketches):
        lsh.insert(i, sketch, check_duplication=False)
    raw = [lsh.query(sketch) for sketch in sketches]
    verified = [
        [j for j in hits if sketches[i].jaccard(sketches[j]) >= THRESHOLD]
        for i, hits in enumerate(raw)
    ]
    return {"candidates": _pairs(raw), "verified": _pairs(verified), "bands": (lsh.b, lsh.r)}


def rensa_lsh(docs: Sequence[str], shingle: Callable[[str], list[str]]) -> dict[str, set]:
    """rensa RMinHash + RMinHashLSH(0.8, 128, 16 bands): candidates, and verified ones."""
    from rensa import RMinHash, RMinHashLSH

    sketches = []
    for d in docs:
        sketch = RMinHash(num_perm=128, seed=42)
        sketch.update(shingle(d))
        sketches.append(sketch)
    lsh = RMinHashLSH(threshold=THRESHOLD, num_perm=128, num_bands=16)
    for i, sketch in enumerate(sketches):
        lsh.insert(i, sketch)
    raw = [lsh.query(sketch) for sketch in sketches]
    verified = [
        [j for j in hits if sketches[i].jaccard(sketches[j]) >= THRESHOLD]
        for i, hits in enumerate(raw)
    ]
    return {"candidates": _pairs(raw), "verified": _pairs(verified), "bands": (16, 8)}


def run(
    docs: Sequence[str],
    truth: dict[tuple[int, int], float],
    peers: set[str],
    shingle: Callable[[str], list[str]],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Every system's scores on the same documents and truth."""
    from neardup_store import MinHashConfig, choose_params

    rows: dict[str, Any] = {}
    default_perm = MinHashConfig().num_perm
    default = choose_params(THRESHOLD, default_perm)
    at_128 = choose_params(THRESHOLD, 128)
    low = choose_params(0.6, default_perm)
    systems: list[tuple[str, Callable[[], set[tuple[int, int]]]]] = [
        (
            f"ours defaults (num_perm {default_perm}, {default.bands}x{default.rows}, "
            "signature-verified)",
            lambda: ours(docs),
        ),
        (
            f"ours num_perm 128 ({at_128.bands}x{at_128.rows} by the default weights, "
            "signature-verified)",
            lambda: ours(docs, 128),
        ),
        ("ours num_perm 128 (9x13 as datasketch, signature-verified)",
         lambda: ours(docs, 128, banding=(9, 13))),
        ("ours defaults, exact re-verification", lambda: ours(docs, exact=True)),
        (f"ours num_perm 128 ({at_128.bands}x{at_128.rows}), exact re-verification",
         lambda: ours(docs, 128, exact=True)),
        (
            f"ours num_perm {default_perm}, bands for t=0.6 ({low.bands}x{low.rows}), "
            "exact re-verification",
            lambda: ours(docs, exact=True, banding=(low.bands, low.rows)),
        ),
    ]  # fmt: skip
    for name, build in systems:
        log(f"accuracy: {name}")
        rows[name] = score(build(), truth)
    if "datasketch" in peers:
        log("accuracy: datasketch")
        found = datasketch_lsh(docs, shingle)
        b, r = found["bands"]
        rows[f"datasketch MinHashLSH ({b}x{r}), candidates as returned"] = score(
            found["candidates"], truth
        )
        rows[f"datasketch MinHashLSH ({b}x{r}), candidates with estimate >= 0.8"] = score(
            found["verified"], truth
        )
    if "rensa" in peers:
        log("accuracy: rensa")
        found = rensa_lsh(docs, shingle)
        rows["rensa RMinHashLSH (16x8), candidates as returned"] = score(found["candidates"], truth)
        rows["rensa RMinHashLSH (16x8), candidates with estimate >= 0.8"] = score(
            found["verified"], truth
        )
    return rows
