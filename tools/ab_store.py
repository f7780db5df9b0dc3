"""Store figures without a profiler, from any checkout, for A/B runs of two versions.

    git worktree add /tmp/before c5cb11e
    taskset -c 1 python tools/ab_store.py --repo /tmp/before --documents 1000000
    taskset -c 1 python tools/ab_store.py --documents 1000000

Builds a store of seeded random signatures like the benchmark's (num_perm 128, 9 x 13
bands, 10k documents per transaction, ``durable=False``) with the ``neardup_store`` of
``--repo`` (default: this checkout), and prints one JSON line: the ingest rate (median
over the second half of the batches, as the benchmark's checkpoints), each table's pages
per document (``txn.stat``) and the file up to its last page, single-query p50 (2000
fresh signatures, third pass) and p50 / p99 of the benchmark's mix (half of them
stored signatures with 10 % of values replaced), batch query of that mix, ``stats()``
(median of three), and batched removal of 2 %
of the documents spread over the store (10k per transaction). Runs minutes apart differ
by 10-30 % on a shared host, so alternate the two checkouts and compare runs made side by
side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from arguments import at_least

BATCH = 10_000
OPTIONS = {"threshold": 0.8, "num_perm": 128, "bands": 9, "rows": 13}


def _pages(stat: dict[str, int]) -> int:
    return stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]


def measure(documents: int, seed: int, directory: Path) -> dict[str, Any]:
    from neardup_store import Store, codec

    rng = np.random.default_rng(seed)
    rates, kept = [], []
    result: dict[str, Any] = {"format_version": codec.FORMAT_VERSION, "documents": documents}
    with Store.open(directory / "store", create=True, durable=False, **OPTIONS) as store:
        for lo in range(0, documents, BATCH):
            sigs = rng.integers(0, 2**32, size=(BATCH, 128), dtype=np.uint32)
            items = [(f"d{lo + i}", sig) for i, sig in enumerate(sigs)]
            start = time.perf_counter()
            store.add_signatures(items, batch_size=None)
            rates.append(BATCH / (time.perf_counter() - start))
            kept.append(sigs[: max(1, 1000 * BATCH // documents)])
        result["ingest_docs_per_s"] = statistics.median(rates[len(rates) // 2 :])
        env = store._env
        page = int(env.stat()["psize"])
        tables = {"docs": store._docs_db, "keys": store._keys_db}
        with store.read() as reader:
            sizes = {name: _pages(reader.txn.stat(db)) for name, db in tables.items()}
            sizes["bands"] = sum(_pages(reader.txn.stat(db)) for db in store._band_dbs)
            result["table_bytes_per_doc"] = {k: v * page / documents for k, v in sizes.items()}
            result["file_bytes_per_doc"] = (int(env.info()["last_pgno"]) + 1) * page / documents
            fresh = rng.integers(0, 2**32, size=(2000, 128), dtype=np.uint32)
            mixed = _near_queries(np.concatenate(kept), fresh[:1000], rng)
            for name, queries in (("query", fresh), ("query_mixed", mixed)):
                for _ in range(3):
                    times = []
                    for sig in queries:
                        start = time.perf_counter()
                        reader.query(signature=sig)
                        times.append(time.perf_counter() - start)
                p50, p99 = np.percentile(times, [50, 99]) * 1e6
                result[f"{name}_p50_us"], result[f"{name}_p99_us"] = float(p50), float(p99)
            batch_seconds = []
            for _ in range(3):
                start = time.perf_counter()
                reader.query_many(signatures=mixed)
                batch_seconds.append(time.perf_counter() - start)
            result["batch_query_mixed_per_s"] = len(mixed) / statistics.median(batch_seconds)
        stats_seconds = []
        for _ in range(3):
            start = time.perf_counter()
            store.stats()
            stats_seconds.append(time.perf_counter() - start)
        result["stats_s"] = statistics.median(stats_seconds)
        keys = [f"d{i}" for i in range(0, documents, 50)]
        start = time.perf_counter()
        for lo in range(0, len(keys), BATCH):
            store.remove_many(keys[lo : lo + BATCH])
        result["remove_per_s"] = len(keys) / (time.perf_counter() - start)
    return result


def _near_queries(stored: np.ndarray, fresh: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """As the benchmark's: ``stored`` signatures perturbed, shuffled with ``fresh`` ones."""
    from bench_store import perturbed

    queries = np.concatenate([perturbed(stored, rng), fresh])
    rng.shuffle(queries)
    return queries


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="checkout whose neardup_store is measured")  # fmt: skip
    parser.add_argument("--documents", type=at_least(BATCH), default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    if not (repo / "neardup_store" / "__init__.py").is_file():
        parser.error(f"--repo {args.repo}: no neardup_store package there (give a checkout)")
    sys.path.insert(0, str(repo))
    documents = args.documents - args.documents % BATCH
    with tempfile.TemporaryDirectory(prefix="neardup-ab-") as scratch:
        result = measure(documents, args.seed, Path(scratch))
    import neardup_store

    package = Path(neardup_store.__file__).resolve().parent
    if package != repo / "neardup_store":  # another copy was imported first
        raise SystemExit(f"measured {package}, not the package of --repo {repo}")
    result["package"] = str(package)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
