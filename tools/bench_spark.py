"""Spark path against the local path on the same corpus, on this machine.

Both paths start from the same JSON-lines file (the demo generator's corpus, with planted
near-duplicate groups) and end with the same results:

* local: parse and sign (``ingest``: the library's MinHasher), write an LMDB store,
  ``store.pairs()``, ``store.clusters()``;
* Spark: ``run_dedup`` (signatures on the executors, banding and verification, connected
  components, writing the outputs) and ``load_output`` (bulk load into a store).

Each path runs ``--repeats`` times; the table shows medians per stage and end to end,
throughput in documents/s and MB/s of input, and the Spark/local ratio from the same
run. The JVM start is timed once and kept out of the per-run figures. On a shared or
loaded machine only the ratios measured in one run are comparable.

    python tools/bench_spark.py                      # 20,000 documents, 3 repeats, local[2]
    python tools/bench_spark.py --docs 2000 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from neardup_store import Store, ingest
from neardup_store.demo import make_corpus
from neardup_store.params import StoreParams, resolve_params

RESULTS = Path(__file__).resolve().parent / "results"


def write_corpus(path: Path, documents: int, seed: int) -> int:
    corpus = make_corpus(documents, planted_groups=documents // 10, seed=seed)
    with path.open("w", encoding="utf-8") as out:
        for key, text in corpus.documents.items():
            out.write(json.dumps({"id": key, "text": text}) + "\n")
    return path.stat().st_size


def open_store(path: Path, params: StoreParams) -> Store:
    return Store.open(
        path,
        create=True,
        durable=False,
        **params.open_options(),
    )


def local_run(source: Path, work: Path, params: StoreParams) -> dict[str, Any]:
    """The local path, stage by stage."""
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    with open_store(work / "local.ndx", params) as store:
        records = [r for r in ingest.read_inputs([source], jsonl=True)]
        seconds["parse"] = time.perf_counter() - started
        mark = time.perf_counter()
        signed, failed = ingest.sign_records(store.hasher, records)
        seconds["sign"] = time.perf_counter() - mark
        mark = time.perf_counter()
        store.add_signatures(
            [(s.record.key, s.signature, s.record.metadata) for s in signed], batch_size=10_000
        )
        store.sync()
        seconds["load"] = time.perf_counter() - mark
        mark = time.perf_counter()
        pairs = sum(1 for _ in store.pairs())
        seconds["pairs"] = time.perf_counter() - mark
        mark = time.perf_counter()
        clusters = store.clusters()
        seconds["components"] = time.perf_counter() - mark
    seconds["total"] = time.perf_counter() - started
    assert not failed
    return {"seconds": seconds, "pairs": pairs, "clusters": len(clusters)}


def spark_run(session: Any, source: Path, work: Path, params: StoreParams) -> dict[str, Any]:
    """The Spark path: the whole job, then the bulk load."""
    from neardup_store import spark as nds

    started = time.perf_counter()
    report = nds.run_dedup(session, [str(source)], work / "out", params)
    loaded = nds.load_output(session, work / "out", work / "spark.ndx")
    seconds = {name: float(value) for name, value in report.seconds.items()}
    seconds["load"] = loaded.seconds
    seconds["total"] = time.perf_counter() - started
    return {"seconds": seconds, "pairs": report.pairs, "clusters": report.clusters}


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    stages = runs[0]["seconds"].keys()
    return {s: statistics.median(r["seconds"][s] for r in runs) for s in stages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=20_000, help="documents in the corpus")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each path")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument("--threshold", type=float, default=0.8)
    parser.add_argument("--num-perm", type=int, default=128)
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7, help="corpus generator seed")
    args = parser.parse_args()

    from neardup_store import spark as nds

    params = resolve_params(args.threshold, args.num_perm, None, None, None, None, None)
    base = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    try:
        source = base / "corpus.jsonl"
        size = write_corpus(source, args.docs, args.seed)
        mark = time.perf_counter()
        session = nds.spark_session(
            args.master,
            "bench_spark",
            {
                "spark.sql.shuffle.partitions": args.shuffle_partitions,
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.local.dir": str(base / "spark-local"),
                "spark.driver.memory": "2g",
            },
            log_level="ERROR",
        )
        jvm_start = time.perf_counter() - mark
        java = nds.find_java()
        local_runs, spark_runs = [], []
        for repeat in range(args.repeats):
            for name, runs in (("local", local_runs), ("spark", spark_runs)):
                work = base / f"{name}-{repeat}"
                work.mkdir()
                run = (
                    local_run(source, work, params)
                    if name == "local"
                    else spark_run(session, source, work, params)
                )
                runs.append(run)
                print(f"  {name} run {repeat + 1}: {run['seconds']['total']:.1f} s", flush=True)
                shutil.rmtree(work)
        session.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)

    local, spark = medians(local_runs), medians(spark_runs)
    same = {(r["pairs"], r["clusters"]) for r in local_runs + spark_runs}
    result = {
        "docs": args.docs,
        "input_bytes": size,
        "repeats": args.repeats,
        "master": args.master,
        "params": {"threshold": args.threshold, "num_perm": args.num_perm,
                   "bands": params.banding.bands, "rows": params.banding.rows},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "java": f"{java.source} {java.version}",
                    "load_average_at_end": os.getloadavg()},
        "jvm_start_s": jvm_start,
        "local_s": local,
        "spark_s": spark,
        "pairs_and_clusters": sorted(same),
    }  # fmt: skip
    print(f"\n{args.docs} documents, {size / 1e6:.1f} MB, {args.repeats} repeats (medians), "
          f"{args.master}, JVM start {jvm_start:.1f} s (not included)")  # fmt: skip
    print(f"{'stage':<12}{'local s':>10}{'spark s':>10}")
    for stage in ("parse", "sign", "pairs", "components", "write", "load", "total"):
        a, b = local.get(stage), spark.get(stage)
        print(
            f"{stage:<12}{'' if a is None else f'{a:.2f}':>10}{'' if b is None else f'{b:.2f}':>10}"
        )
    for name, totals in (("local", local), ("spark", spark)):
        rate = args.docs / totals["total"]
        print(f"{name}: {rate:,.0f} docs/s, {size / 1e6 / totals['total']:.2f} MB/s end to end")
    print(f"spark/local time ratio: {spark['total'] / local['total']:.2f} (same run)")
    print(f"pairs/clusters (all runs): {sorted(same)}  (one entry = both paths agree)")
    RESULTS.mkdir(exist_ok=True)
    target = RESULTS / "bench_spark.json"
    target.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
