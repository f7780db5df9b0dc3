"""One command for every benchmark: neardup_store beside datasketch and rensa, same run.

    python tools/bench.py            # full run: 1M-document store (about 30 min)
    python tools/bench.py --quick    # 100k-document store, smaller corpora (a few minutes)
    python tools/bench.py --long     # adds the 10M-document scale point

It pins one core, creates ``tools/.venv-bench`` with the peers (datasketch, rensa, the
Redis client, scipy) and re-executes there, then runs, in order: text → signature
throughput (``bench_signatures``), the store figures (``bench_store``: ingest, queries,
removal, size, scale, end to end; datasketch in memory and on a private local
redis-server when one is installed) and accuracy against the exact truth
(``bench_accuracy`` with ``ground_truth``). It writes ``tools/results/bench-<time>.json``
and ``.md``; the Markdown closes with every target, its figure, and met or not met.
"""

from __future__ import annotations

import argparse
import atexit
import json
import random
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench_signatures as sig_bench
from arguments import at_least
from corpus import real_documents, with_near_duplicates

TOOLS = Path(__file__).resolve().parent
RESULTS = TOOLS / "results"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a few minutes)")
    parser.add_argument("--long", action="store_true", help="also the 10M-document point")
    parser.add_argument("--large", type=at_least(1000),
                        help="documents in the large store (1M; quick 100k)")  # fmt: skip
    parser.add_argument("--skip", action="append", default=[],
                        choices=["signatures", "store", "accuracy", "end_to_end"],
                        help="leave a section out (repeatable)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-install", action="store_true", help="do not build the venv")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="only print the Markdown report of an earlier run's JSON")  # fmt: skip
    args = parser.parse_args(argv)
    if args.render and not args.render.is_file():
        parser.error(f"--render: no such file: {args.render}")
    if args.large is None:
        args.large = 10_000_000 if args.long else (100_000 if args.quick else 1_000_000)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        report = json.loads(args.render.read_text())
        report["targets"] = targets(report)
        print(render(report))
        return 0
    cpu = sig_bench.pin_to_one_core()
    problem = None if args.no_install else sig_bench.enter_bench_venv()
    sys.path.insert(0, str(sig_bench.REPO_ROOT))
    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f} s] {message}", file=sys.stderr, flush=True)

    import bench_accuracy
    import bench_store
    import ground_truth

    peers, missing = sig_bench.available_peers()
    given = sys.argv[1:] if argv is None else list(argv)
    report: dict[str, Any] = {
        "command": " ".join(["python tools/bench.py", *map(shlex.quote, given)]),
        "machine": sig_bench.machine_info(cpu),
        "peers_unavailable": missing,
        "venv_problem": problem,
        "settings": {"quick": args.quick, "long": args.long, "large": args.large,
                     "seed": args.seed, "shingles": "char 5", "num_perm": 128,
                     "threshold": 0.8},
    }  # fmt: skip
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)

    if "signatures" not in args.skip:
        log("text -> signature throughput (bench_signatures)")
        out = RESULTS / f"signatures-{stamp}.json"
        # Full mode: 1500 documents (about 15 MB) keep the slowest peer's five passes short.
        size = ["--quick"] if args.quick else ["--docs", "1500"]
        sig_args = ["--json", str(out), "--no-install", *size]
        sig_bench.main(sig_args)
        report["signatures"] = json.loads(out.read_text())

    workdir = Path(tempfile.mkdtemp(prefix="neardup-bench-"))
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)  # stores, copies, the corpus
    # 8000 documents (about 75 MB): signing is fast enough now that a smaller set made each
    # end-to-end run a fraction of a second, short enough for process noise to decide it.
    # Quick mode's 3000 (about 28 MB) keep each run near 0.3 s; 600 took 40-130 ms, and
    # the two-process ratio came out anywhere from 1.4x to 2.6x. Since signing became 2.3x
    # faster (S36), 8000 took 0.25-0.4 s a run again and the ratio fell to 1.65x, against
    # 1.79x for 17000 documents (0.8 s; scratch runs, the same hour): the first and last
    # batches and closing the store weighed more. So the end-to-end set is each document
    # twice, under two keys (nothing is cached between them; machines have too little
    # distinct text for 16000).
    real = real_documents(3000 if args.quick else 8000, args.seed)
    if "end_to_end" not in args.skip:
        log("end to end ingest")
        report["end_to_end"] = bench_store.end_to_end(
            real * 2, 3 if args.quick else 5, workdir, sig_bench.REPO_ROOT, log
        )

    if "store" not in args.skip:
        log(f"signatures of {args.large} streamed documents")
        sigs = bench_store.large_signatures(args.large, args.seed, log)
        checkpoints = [size for size in (100_000, 1_000_000) if size < args.large]
        checkpoints = checkpoints or [args.large // 10]
        # Near-duplicates of documents stored by the first checkpoint: every checkpoint then
        # answers the same mix of hits and misses (drawn from all documents, most of the
        # near-duplicates asked at 100k had no original stored yet and timed as misses).
        per_set = 1000 if args.quick else 2000
        report["query_sets"] = {"sets": bench_store.QUERY_SETS, "queries_per_set": per_set}
        queries = bench_store.near_queries(
            sigs[: checkpoints[0]], bench_store.QUERY_SETS * per_set, args.seed
        )
        dedup = bench_store.dedup_signatures(
            sigs[: checkpoints[0]], 20_000 if args.quick else 40_000, args.seed + 1
        )
        log("our store")
        dsk_n = min(args.large, 1_000_000)
        report["store_ours"] = bench_store.ours_large(
            sigs, queries, real[:1000], checkpoints, dedup, workdir, log, peer_size=dsk_n
        )
        log("datasketch in memory")
        copy = report["store_ours"].get("peer_copy")
        report["store_datasketch_memory"] = bench_store.datasketch_memory(
            sigs[:dsk_n], queries, dedup, 100_000 if not args.quick else 20_000, log,
            ours_copy=Path(copy) if copy else None,
        )  # fmt: skip
        log("datasketch on Redis")
        report["store_datasketch_redis"] = bench_store.datasketch_redis(
            sigs, queries, 10_000 if args.quick else 20_000, log
        )

    if "accuracy" not in args.skip:
        base, copies = (500, 300) if args.quick else (2000, 1000)
        docs, seeded = with_near_duplicates(real_documents(base, args.seed + 7), copies, args.seed)
        # The brute-force check runs on 100 seeded copies with their sources and as many
        # other documents: the first documents alone are originals, with next to no pairs.
        checked = {i for copy, source, _ in seeded[:100] for i in (copy, source)}
        checked.update(random.Random(args.seed).sample(range(len(docs)), 100))
        log(f"exact truth for {len(docs)} documents")
        sets = ground_truth.shingle_sets(docs)
        truth = ground_truth.all_pairs(sets, 0.5)
        report["truth"] = {
            "documents": len(docs),
            "seeded_copies": copies,
            "pairs_ge_0.5": len(truth),
            "pairs_ge_0.8": sum(1 for j in truth.values() if j >= 0.8),
            "brute_force_check": ground_truth.check_against_brute_force(sets, sorted(checked)),
        }
        report["accuracy"] = bench_accuracy.run(
            docs, truth, set(peers), sig_bench.python_shingler(), log
        )

    report["run_seconds"] = time.perf_counter() - started
    report["targets"] = targets(report)
    (RESULTS / f"bench-{stamp}.json").write_text(json.dumps(report, indent=2, default=str))
    markdown = render(report)
    (RESULTS / f"bench-{stamp}.md").write_text(markdown)
    print(markdown)
    print(f"wrote {RESULTS / f'bench-{stamp}.json'} and .md")
    return 0


# -- targets and report -------------------------------------------------------------------------


def _get(report: dict[str, Any], *path: Any) -> Any:
    node: Any = report
    for part in path:
        if node is None:
            return None
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _throughput(report: dict[str, Any], key: str, figure: str) -> float | None:
    for row in _get(report, "signatures", "throughput") or []:
        if row["key"] == key and row["figure"] == figure:
            return float(row["mb_per_s"])
    return None


def _cpu_mb_per_s(row: dict[str, Any], megabytes: float) -> float:
    """MB per CPU second (median of the passes): what the code costs, whatever share of
    the core a loaded machine's scheduler gave it during that pass."""
    return megabytes / sorted(row["cpu_seconds"])[len(row["cpu_seconds"]) // 2]


def _cpu_throughput(report: dict[str, Any], key: str, figure: str) -> float | None:
    megabytes = _get(report, "signatures", "corpus", "megabytes")
    for row in _get(report, "signatures", "throughput") or []:
        if row["key"] == key and row["figure"] == figure:
            return _cpu_mb_per_s(row, megabytes)
    return None


def _with_purge(run: dict[str, Any], peer: float) -> str:
    """The removal's rate with the purge of its band entries added, when the run has it
    (runs before format 5 deleted them in the removal)."""
    if "remove_and_purge_per_s" not in run:
        return ""
    both = run["remove_and_purge_per_s"]
    return f"; band entries purged after it: {both:.0f} /s with the purge = {both / peer:.2f}×"


def _removal_batch(run: dict[str, Any]) -> str:
    """``, N per transaction`` when the run recorded it (runs before it used 10k)."""
    return f", {run['remove_transaction']} per transaction" if "remove_transaction" in run else ""


def _per_transaction(point: dict[str, Any]) -> str:
    """`` (N)``: the most documents one transaction of the checkpoint's window committed
    (reports from before ``batch_size="auto"`` lack it: they used 10k throughout)."""
    return f" ({point['transaction_documents']})" if "transaction_documents" in point else ""


def _checkpoints(mine: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """Our store's checkpoints by size (sizes are strings in a JSON read back)."""
    return sorted((int(size), point) for size, point in mine["checkpoints"].items())


def _reference_point(mine: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The checkpoint the peer comparisons use: the largest at or below 1M documents."""
    return [(size, point) for size, point in _checkpoints(mine) if size <= 1_000_000][-1]


_QUERY_FIGURES = (
    ("query_signature_cached_per_call", "band cache, one `store.query()` call a query"),
    ("query_signature_cached", "band cache"),
    ("query_signature", "LMDB lookups"),
)
"""Our single-query figures, the one targets judge first: a query service's plain
`store.query()` calls with the band cache, each its own read transaction (older reports
have only the queries of one read transaction, or only LMDB lookups)."""


def _query_p50(point: dict[str, Any]) -> float:
    """Our single-query p50 at a checkpoint (the first of :data:`_QUERY_FIGURES`)."""
    return float(next(point[k] for k, _ in _QUERY_FIGURES if k in point)["p50_us"])


def _query_label(point: dict[str, Any]) -> str:
    label = next(label for k, label in _QUERY_FIGURES if k in point)
    if "query_signature_cached_per_call" in point:
        shared = point["query_signature_cached"]["p50_us"]
        label += f" (queries sharing one read transaction: {shared:.1f} µs)"
    return label


def _lmdb_beside(point: dict[str, Any], peer_us: float, faster: bool = False) -> str:
    """The same comparison for queries through LMDB, beside the band cache's."""
    if "query_signature_cached" not in point:
        return ""
    p50 = point["query_signature"]["p50_us"]
    ratio = peer_us / p50 if faster else p50 / peer_us
    return f"; through LMDB (no cache) {p50:.1f} µs = {ratio:.2f}×"


def _placed(best: dict[str, str], figure: str) -> str:
    """``, server on <placement>`` for a Redis figure that names where it was best."""
    return f", server on {best[figure]}" if figure in best else ""


def redis_placements_note(red: dict[str, Any]) -> str:
    """Where the Redis server ran, and each placement's figures (the table shows the
    peer's best of each); reports made before placements were measured ran it on the
    client's core."""
    runs = red.get("placements")
    if not runs:
        return "local redis-server on the client's core"
    parts = [
        f"{name} (cpu {', '.join(map(str, run['server_cpus']))}): "
        f"{run['insert_per_s']:.0f} inserts/s, query p50 / p99 "
        f"{run['query_signature']['p50_us']:.0f} / {run['query_signature']['p99_us']:.0f} µs, "
        f"{run['remove_per_s']:.0f} removals/s"
        for name, run in runs.items()
    ]
    return (
        f"local redis-server; the table has the peer's best of each figure over "
        f"{len(runs)} placements of the server: " + "; ".join(parts)
    )


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of the brief, its measured figure, and whether it is met."""
    rows: list[dict[str, Any]] = []

    def add(name: str, figure: str, met: bool | None) -> None:
        rows.append({"target": name, "figure": figure, "met": met})

    ours = _throughput(report, "ours-oph", "raw text")
    dsk = _throughput(report, "datasketch-bulk", "end-to-end")
    fastest = max(
        (row["mb_per_s"] for row in _get(report, "signatures", "throughput") or []
         if row["system"] == "rensa" and row["figure"] == "end-to-end"
         and row["key"] != "rensa-rho"),
        default=None,
    )  # fmt: skip
    megabytes = _get(report, "signatures", "corpus", "megabytes")
    cpu_ours = _cpu_throughput(report, "ours-oph", "raw text")
    cpu_dsk = _cpu_throughput(report, "datasketch-bulk", "end-to-end")
    cpu_fastest = max(
        (_cpu_mb_per_s(row, megabytes) for row in _get(report, "signatures", "throughput") or []
         if row["system"] == "rensa" and row["figure"] == "end-to-end"
         and row["key"] != "rensa-rho"),
        default=None,
    )  # fmt: skip
    # Judged on CPU time: on a machine loaded by other jobs, wall-clock passes of different
    # methods got very different shares of the pinned core; both figures are shown.
    if ours and fastest and cpu_ours and cpu_fastest:
        add("text→signature ≥ 4× rensa's fastest Python-facing path",
            f"CPU time {cpu_ours:.1f} vs {cpu_fastest:.2f} MB/s = {cpu_ours / cpu_fastest:.1f}×; "
            f"wall {ours:.1f} vs {fastest:.2f} MB/s = {ours / fastest:.1f}×",
            cpu_ours >= 4 * cpu_fastest)  # fmt: skip
    if ours and dsk and cpu_ours and cpu_dsk:
        add("text→signature ≥ 25× datasketch MinHash.bulk",
            f"CPU time {cpu_ours:.1f} vs {cpu_dsk:.2f} MB/s = {cpu_ours / cpu_dsk:.1f}×; "
            f"wall {ours:.1f} vs {dsk:.2f} MB/s = {ours / dsk:.1f}×",
            cpu_ours >= 25 * cpu_dsk)  # fmt: skip
    mine = _get(report, "store_ours")
    mem = _get(report, "store_datasketch_memory")
    red = _get(report, "store_datasketch_redis")
    size, point = _reference_point(mine) if mine else (0, {})
    ingest = point.get("ingest_average_docs_per_s", _get(mine, "ingest_docs_per_s"))
    if mine and mem:
        r = ingest / mem["insert_per_s"]
        add(f"signature ingest into {size} docs ≥ 2× datasketch in-memory insert",
            f"{ingest:.0f} vs {mem['insert_per_s']:.0f} docs/s = {r:.2f}×", r >= 2)  # fmt: skip
        p50, dp50 = _query_p50(point), mem["query_signature"]["p50_us"]
        same = _get(mem, "query_signature_verified", "p50_us")
        beside = (
            f"; datasketch with the estimate check that gives our answer {same:.0f} µs = "
            f"{p50 / same:.2f}×"
            if same
            else ""
        )
        paired = mem.get("query_side_by_side")
        apart = (
            f"{_query_label(point)} {p50:.1f} µs vs {dp50:.1f} µs = {p50 / dp50:.2f}×{beside}"
            f"{_lmdb_beside(point, dp50)}"
        )
        if paired:
            ratio = paired["p50_ratio"]
            words = (
                f"timed side by side (one `store.query()` call a query with the band cache, "
                f"alternated sets): {paired['ours_p50_us']:.1f} µs vs "
                f"{paired['datasketch_p50_us']:.1f} µs, median of the sets' ratios "
                f"{ratio:.2f}×; timed minutes apart: {apart}"
            )
        else:
            ratio, words = p50 / dp50, apart
        add(f"query p50 at {size} docs within 1.2× of datasketch in memory", words,
            ratio <= 1.2)  # fmt: skip
        # Judged with the purge charged: datasketch's removal deletes its band entries,
        # ours leaves them to a purge (runs before format 5 deleted them at once).
        removal = mine.get("remove_and_purge_per_s", mine["remove_per_s"])
        add("batched remove ≥ datasketch in memory (with the purge of its band entries)",
            f"{mine['remove_per_s']:.0f} vs {mem['remove_per_s']:.0f} /s"
            f"{_with_purge(mine, mem['remove_per_s'])}",
            removal >= mem["remove_per_s"])  # fmt: skip
        used = point["used_bytes_per_doc"]
        add(f"bytes on disk per document at {size} docs ≤ 1.2 KB",
            f"{used:.0f} B as ingested, {mine['bytes_per_doc_compacted']:.0f} B compacted at "
            f"{mine['documents']} (datasketch pickle {mem['pickle_bytes_per_doc']:.0f} B)",
            used <= 1200)  # fmt: skip
    if mine and red and "skipped" not in red:
        where = red.get("best_placement", {})
        r = ingest / red["insert_per_s"]
        add(
            "signature ingest ≥ 20× datasketch on Redis",
            f"{r:.1f}× ({red['insert_per_s']:.0f} docs/s on Redis{_placed(where, 'insert_per_s')})",
            r >= 20,
        )
        redis_p50 = red["query_signature"]["p50_us"]
        r = redis_p50 / _query_p50(point)
        add(
            "query p50 ≥ 30× faster than datasketch on Redis",
            f"{_query_label(point)} {r:.1f}× ({redis_p50:.0f} µs on Redis"
            f"{_placed(where, 'query_signature')}){_lmdb_beside(point, redis_p50, faster=True)}",
            r >= 30,
        )
    points = _checkpoints(mine) if mine else []
    if len(points) >= 2:
        (first, small), later = points[0], points[1:]
        p99 = "query_signature_cached" if "query_signature_cached" in small else "query_signature"
        ratios = [
            (n, small["ingest_docs_per_s"] / big["ingest_docs_per_s"],
             big[p99]["p99_us"] / small[p99]["p99_us"],
             big["query_signature"]["p99_us"] / small["query_signature"]["p99_us"],
             big.get("paired_with_first"))
            for n, big in later
        ]  # fmt: skip
        lmdb = p99 != "query_signature"

        def judged(rq: float, rl: float, paired: dict[str, Any] | None) -> tuple[float, str]:
            """The p99 ratio the target is judged by, and its words: side by side with a
            copy of the first checkpoint's store where the run timed one."""
            if paired is None:
                return rq, f"p99 {rq:.2f}× higher" + (f" (through LMDB {rl:.2f}×)" if lmdb else "")
            cached, through = paired["cached"]["p99_ratio"], paired["lmdb"]["p99_ratio"]
            return cached, (
                f"p99 {cached:.2f}× higher timed side by side with a copy of the {first} "
                f"store (through LMDB {through:.2f}×; timed minutes apart {rq:.2f}× and "
                f"{rl:.2f}×)"
            )

        p99_ratios = [judged(rq, rl, paired) for _, _, rq, rl, paired in ratios]
        add(f"scale: ingest rate and query p99 within 1.5× of the {first} values",
            "; ".join(f"at {n}: ingest {ri:.2f}× slower, {words}"
                      for (n, ri, *_), (_, words) in zip(ratios, p99_ratios, strict=True))
            + ("; p99 with the band cache" if lmdb else ""),
            all(r[1] <= 1.5 and rq <= 1.5
                for r, (rq, _) in zip(ratios, p99_ratios, strict=True)))  # fmt: skip
    e2e = _get(report, "end_to_end")
    if e2e:
        add(
            "end-to-end ingest ≥ 25 MB/s per core",
            f"{e2e['one_core_mb_per_s']:.1f} MB/s",
            e2e["one_core_mb_per_s"] >= 25,
        )
        add(
            "two processes on two cores ≥ 1.7× one",
            f"{e2e['two_process_speedup']:.2f}×{_pair_ratios(e2e)}",
            e2e["two_process_speedup"] >= 1.7,
        )
    acc = _get(report, "accuracy") or {}
    default = next((v for k, v in acc.items() if k.startswith("ours defaults")), None)
    if default:
        add("accuracy at the defaults: recall and precision ≥ 0.95",
            f"recall {default['recall']:.3f}, precision {default['precision']:.3f}",
            default["recall"] >= 0.95 and default["precision"] >= 0.95)  # fmt: skip
        peers = [v for k, v in acc.items() if "estimate >= 0.8" in k]
        at_128 = next((v for k, v in acc.items() if k.startswith("ours num_perm 128 (")), None)
        if peers and at_128:
            ok = all(at_128["recall"] >= p["recall"] and at_128["precision"] >= p["precision"]
                     for p in peers)  # fmt: skip
            add("at num_perm 128, recall and precision each ≥ datasketch's and rensa's",
                "; ".join(f"{k.split(' (')[0]} {v['recall']:.3f}/{v['precision']:.3f}"
                          for k, v in acc.items() if "estimate >= 0.8" in k)
                + f" vs ours {at_128['recall']:.3f}/{at_128['precision']:.3f}"
                + "".join(f" (exact re-verification, texts kept: {v['recall']:.3f}/"
                          f"{v['precision']:.3f})" for k, v in acc.items()
                          if k.startswith("ours num_perm 128") and "exact" in k), ok)  # fmt: skip
        exact = [v for k, v in acc.items() if "exact" in k]
        if exact:
            best = max(exact, key=lambda v: v["recall"])
            add("exact re-verification: precision 1.0, recall ≥ 0.99",
                f"precision {best['precision']:.3f}, recall {best['recall']:.3f} (best setting)",
                best["precision"] == 1.0 and best["recall"] >= 0.99)  # fmt: skip
    return rows


def purge_rows(mine: dict[str, Any]) -> list[str]:
    """Table rows of the purge after the removal (runs before format 5 lack it)."""
    if "purge_per_s" not in mine:
        return []
    return [
        f"| … purge of their band entries, docs/s | {mine['purge_per_s']:.0f} | | |",
        f"| … remove and purge together, docs/s | {mine['remove_and_purge_per_s']:.0f} | | |",
    ]


def dedup_rows(mine: dict[str, Any], mem: dict[str, Any] | None) -> list[str]:
    """Table rows of the dedup-on-ingest figure (runs before it lack it)."""
    ours = mine.get("dedup")
    if not ours:
        return []
    peer = (mem or {}).get("dedup_docs_per_s")
    first = (mem or {}).get("dedup_first_docs_per_s")  # the same first slice (newer runs)
    ratio = f" ({ours['batched_docs_per_s'] / peer:.2f}×)" if peer else ""
    return [
        f"| dedup on ingest (`add_signatures_if_unique`, 10k per transaction; datasketch: "
        f"query, check estimates, insert), docs/s | {ours['batched_docs_per_s']:.0f}{ratio} | "
        f"{'n/a' if peer is None else f'{peer:.0f}'} | |",
        f"| … `add_if_unique` one document at a time, docs/s | "
        f"{ours['one_at_a_time_docs_per_s']:.0f} | {'' if first is None else f'{first:.0f}'} | |",
    ]


def _query_sets(report: dict[str, Any]) -> str:
    """How the signature queries were timed (reports before the sets say nothing)."""
    sets = report.get("query_sets")
    if not sets:
        return ""
    return (
        f"Signature queries are {sets['sets']} sets of {sets['queries_per_set']} (half "
        "near-duplicates of stored documents, half without a match), each set timed on its "
        "own; each latency percentile is the median of the sets'. "
    )


def _pair_ratios(e2e: dict[str, Any]) -> str:
    """The alternated pairs' ratios behind the two-process speedup (reports before they
    were alternated have none: their speedup is the ratio of the two blocks' medians)."""
    ratios = e2e.get("two_process_ratios")
    if not ratios:
        return ", the ratio of the medians of two blocks of runs"
    return f", the median of {len(ratios)} alternated pairs: " + ", ".join(
        f"{r:.2f}" for r in ratios
    )


def render(report: dict[str, Any]) -> str:
    """The Markdown report: settings, every figure, and the targets."""
    m = report["machine"]
    lines = [
        f"## Benchmark report ({report['command']})",
        "",
        f"Checkout {m['neardup_store_checkout']}; {m['cpu_model']}, {m['cpu_count']} CPUs, "
        f"pinned to cpu {m['pinned_cpu']}; load average at start {m['load_average_at_start']}; "
        f"Python {m['python']}, numpy {m['numpy']}, datasketch {m['datasketch']}, "
        f"rensa {m['rensa']}; run time {report['run_seconds'] / 60:.1f} min.",
        "",
    ]
    if m.get("proactive_pageout"):
        lines += [
            f"The kernel runs {'; '.join(m['proactive_pageout'])}: cached pages of the store "
            "that no query or batch touched for that long are dropped, however much memory "
            "is free, and read from the disk again on the next access.",
            "",
        ]
    sigs = _get(report, "signatures")
    if sigs:
        c = sigs["corpus"]
        lines += [
            f"### Text → signature ({c['docs']} real documents, {c['megabytes']:.1f} MB, "
            f"median of {sigs['settings']['repeats']})",
            "",
            "| system | method | figure | docs/s | MB/s (wall) | MB per CPU second |",
            "|---|---|---|---:|---:|---:|",
        ]
        for row in sigs["throughput"]:
            lines.append(
                f"| {row['system']} | {row['label']} | {row['figure']} | "
                f"{row['docs_per_s']:.0f} | {row['mb_per_s']:.2f} | "
                f"{_cpu_mb_per_s(row, c['megabytes']):.2f} |"
            )
        lines.append("")
    e2e = _get(report, "end_to_end")
    if e2e:
        lines += [
            f"### End-to-end ingest, text → committed store ({e2e['documents']} documents, "
            f"{e2e['megabytes']:.1f} MB, `add_many`, durable=False)",
            "",
            f"- in-process, one core: **{e2e['one_core_mb_per_s']:.1f} MB/s**",
            f"- one worker process: {e2e['one_process_mb_per_s']:.1f} MB/s; two worker processes "
            f"on two cores, same store: {e2e['two_processes_mb_per_s']:.1f} MB/s "
            f"(**{e2e['two_process_speedup']:.2f}×**{_pair_ratios(e2e)})",
            "",
        ]
    mine = _get(report, "store_ours")
    mem = _get(report, "store_datasketch_memory")
    red = _get(report, "store_datasketch_redis")
    if mine:
        size, last = _reference_point(mine)
        at_end = (
            ""
            if size == mine["documents"]
            else f"; ours removes, answers text and batch queries and compacts at "
            f"{mine['documents']} documents"
        )
        lines += [
            f"### Store at {size} documents (precomputed signatures{at_end})",
            "",
            "| figure | ours | datasketch in memory | datasketch on Redis |",
            "|---|---:|---:|---:|",
        ]

        def cell(d: Any, *path: str, fmt: str = "{:.0f}") -> str:
            value = _get(d, *path) if d else None
            return "n/a" if value is None else fmt.format(value)

        redis_note = red.get("skipped") if red else "not run"
        if red and not redis_note:
            redis_note = redis_placements_note(red)
        q, qt = last["query_signature"], mine["query_text"]
        sig = "query_signature"
        cached = last.get("query_signature_cached")
        cache_rows = (
            [
                f"| … with the band cache (`band_cache=True`), p50 / p99, µs | "
                f"{cached['p50_us']:.1f} / {cached['p99_us']:.1f} | | |",
                *(
                    [
                        f"| … with the band cache, one `store.query()` call a query (its "
                        f"own read transaction), p50 / p99, µs | {per_call['p50_us']:.1f} / "
                        f"{per_call['p99_us']:.1f} | | |"
                    ]
                    if (per_call := last.get("query_signature_cached_per_call"))
                    else []
                ),
                f"| batch query by signature with the band cache, queries/s | "
                f"{mine['batch_query_signature_cached_per_s']:.0f} | | |",
                f"| query by text with the band cache, p50 / p99, µs | "
                f"{mine['query_text_cached']['p50_us']:.0f} / "
                f"{mine['query_text_cached']['p99_us']:.0f} | | |",
                f"| batch query by text with the band cache, docs/s | "
                f"{mine['batch_query_text_cached_per_s']:.0f} | | |",
                f"| memory of the index in the querying process, bytes per document | "
                f"{last['band_cache_bytes_per_doc']:.0f} (band cache) | "
                f"{cell(mem, 'resident_growth_bytes_per_doc')} (resident growth) | |",
            ]
            if cached
            else []
        )
        lines += [
            f"| batched ingest, docs/s | "
            f"{last.get('ingest_average_docs_per_s', mine['ingest_docs_per_s']):.0f} | "
            f"{cell(mem, 'insert_per_s')} | {cell(red, 'insert_per_s')} |",
            f"| query by signature p50 / p99, µs | {q['p50_us']:.0f} / {q['p99_us']:.0f} | "
            f"{cell(mem, sig, 'p50_us')} / {cell(mem, sig, 'p99_us')} | "
            f"{cell(red, sig, 'p50_us')} / {cell(red, sig, 'p99_us')} |",
            f"| query by signature, then each candidate's estimate ≥ 0.8 (our answer), "
            f"p50 / p99, µs | {q['p50_us']:.0f} / {q['p99_us']:.0f} | "
            f"{cell(mem, sig + '_verified', 'p50_us')} / {cell(mem, sig + '_verified', 'p99_us')} "
            f"| |",
            f"| batch query by signature, queries/s | "
            f"{mine['batch_query_signature_per_s']:.0f} | | |",
            f"| query by text p50 / p99, µs | {qt['p50_us']:.0f} / {qt['p99_us']:.0f} | | |",
            f"| batch query by text, docs/s | {mine['batch_query_text_per_s']:.0f} | | |",
            *cache_rows,
            *dedup_rows(mine, mem),
            f"| remove (batched{_removal_batch(mine)}), docs/s | {mine['remove_per_s']:.0f} | "
            f"{cell(mem, 'remove_per_s')} | {cell(red, 'remove_per_s')} |",
            *purge_rows(mine),
            f"| bytes per document | {last['used_bytes_per_doc']:.0f} on disk "
            f"({mine['bytes_per_doc_compacted']:.0f} compacted) | "
            f"{cell(mem, 'pickle_bytes_per_doc')} pickled | "
            f"{cell(red, 'used_memory_bytes_per_doc')} Redis memory |",
            "",
            f"datasketch in memory at {cell(mem, 'documents')} documents (bands "
            f"{cell(mem, 'bands')}×{cell(mem, 'rows')}); pickle at {cell(mem, 'pickle_docs')}; "
            f"Redis at {cell(red, 'documents')} documents ({redis_note}).",
            "",
            "Scale (ours):",
            "",
            "| documents | ingest docs/s (largest transaction) | query p50 µs | query p99 µs "
            "| major faults "
            "| same queries again: p50 / p99 µs, major faults | used bytes/doc "
            "| band cache: p50 / p99 µs (again) | band cache: catch-up s, bytes/doc |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for size, point in _checkpoints(mine):
            q, again = point["query_signature"], point.get("query_signature_again")
            repeat = (
                f"{again['p50_us']:.0f} / {again['p99_us']:.0f}, "
                f"{point['query_again_major_faults']}"
                if again
                else ""
            )
            cached, cached_again = (
                point.get("query_signature_cached"),
                point.get("query_signature_cached_again"),
            )
            faults = (
                f", {point['query_cached_major_faults']} / "
                f"{point['query_cached_again_major_faults']} major faults"
                if "query_cached_major_faults" in point
                else ""
            ) + (
                f", {point['query_cached_minor_faults']} / "
                f"{point['query_cached_again_minor_faults']} minor"
                if "query_cached_minor_faults" in point
                else ""
            )
            cache_cells = (
                f"{cached['p50_us']:.1f} / {cached['p99_us']:.1f} "
                f"({cached_again['p50_us']:.1f} / {cached_again['p99_us']:.1f}){faults} | "
                f"{point['band_cache_catch_up_s']:.2f}, {point['band_cache_bytes_per_doc']:.0f}"
                if cached and cached_again
                else " | "
            )
            lines.append(
                f"| {size} | {point['ingest_docs_per_s']:.0f}"
                f"{_per_transaction(point)} | {q['p50_us']:.0f} | "
                f"{q['p99_us']:.0f} | {point.get('query_major_faults', '')} | {repeat} | "
                f"{point['used_bytes_per_doc']:.0f} | {cache_cells} |"
            )
        lines += [
            "",
            _query_sets(report) + "Major faults are page faults that waited for the disk. "
            "The second pass asks the "
            "same queries again, so it shows the latency once their pages are in memory. "
            "The band cache columns time the same queries with `band_cache=True`; catch-up "
            "is the first cached query at the checkpoint, which reads the documents added "
            "since the previous one (all of them at the first checkpoint).",
            "",
        ]
    acc = _get(report, "accuracy")
    if acc:
        t = report["truth"]
        lines += [
            f"### Accuracy at t = 0.8 ({t['documents']} documents incl. {t['seeded_copies']} "
            f"seeded copies; {t['pairs_ge_0.8']} true pairs ≥ 0.8; exact join checked against "
            f"brute force: {t['brute_force_check']})",
            "",
            "| system | recall | 0.80–0.85 | 0.85–0.90 | 0.90–0.95 | 0.95–1 | precision "
            "| returned |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]

        def f(value: Any) -> str:
            return "n/a" if value is None else f"{value:.3f}"

        for name, row in acc.items():
            lines.append(
                f"| {name} | {f(row['recall'])} | {f(row['recall_0.80-0.85'])} | "
                f"{f(row['recall_0.85-0.90'])} | {f(row['recall_0.90-0.95'])} | "
                f"{f(row['recall_0.95-1.00'])} | {f(row['precision'])} | {row['returned']} |"
            )
        lines.append("")
    lines += ["### Targets", "", "| target | measured | met |", "|---|---|---|"]
    for row in report["targets"]:
        met = {True: "met", False: "**not met**", None: "n/a"}[row["met"]]
        lines.append(f"| {row['target']} | {row['figure']} | {met} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
