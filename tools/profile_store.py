"""Profiles behind the store figures of ``tools/README.md`` (cProfile, one process).

    python tools/profile_store.py ingest --documents 1000000
    python tools/profile_store.py remove --documents 400000
    python tools/profile_store.py query --documents 1000000
    python tools/profile_store.py size --documents 200000
    python tools/profile_store.py phases --documents 1000000
    python tools/profile_store.py transactions --documents 10000000
    python tools/profile_store.py purge --documents 1000000 --sizes 20000,100000
    python tools/profile_store.py idle --documents 1000000

Each builds a store of random signatures (num_perm 128, 9 x 13 bands, as the benchmark's
store), 10k documents per transaction (``transactions``, ``purge``, ``idle`` and with
``--auto``: the library's default, ``batch_size="auto"``) with ``durable=False``, in a
temporary directory:

* ``ingest`` profiles five more 10k-document transactions at that size;
* ``remove`` profiles ``remove_many`` of 2% of the store in 10k batches;
* ``query`` times single signature queries (2000 fresh random signatures: the path of a
  query without matches) in three passes, with the minor page faults of each pass (first
  touches of the map's pages), profiles one more pass, and times its parts without the
  profiler (band keys, candidate lookups, the bare LMDB seeks alone), and those of
  near-duplicate queries that find a candidate (lookups, reading and verifying records);
* ``phases`` times, without the profiler, each step of ``_insert_new`` (transactions of
  10k, 30k and 100k documents, or ``--sizes``), of ``_unlink`` (removals of 10k, 50k
  and 100k) and of ``_purge`` (purging each removal's documents in a transaction of its
  own), in µs per document: the steps the store runs, in its order, timed one by one
  (three rounds; the store grows by the inserts' sum a round, then the removals take
  480k);
* ``size`` prints each table's pages per document (``txn.stat``) beside the file size,
  which also holds the free pages copy-on-write leaves;
* ``transactions`` adds one transaction each of ``--sizes`` documents (default: the
  store's ``transaction_size()``, 500k and a tenth of the store), twice in turn, with
  docs/s, the growth of the process's peak memory (Linux ``VmHWM``, reset before each)
  during the transaction, and per document its CPU time, minor page faults and bytes
  written; with ``--perf-control FIFO`` it enables a ``perf record -D -1 --control
  fifo:FIFO`` only while a transaction runs (``tools/perf_breakdown.py`` reads it);
* ``purge`` alternates, on one store, removals that delete their band entries in their
  own transaction (the path of format 4 stores, taken by hiding the ``removed`` table)
  with removals that leave them followed by a purge of the same documents, for each of
  ``--sizes`` (default 20k and 100k) documents per transaction, four rounds each, with
  each purge's CPU time, faults and bytes written (``--perf-control`` samples them);
* ``idle`` reads every page of the store's tables, then times ``ReadTxn.get`` of 2000
  random keys never read since, at once and after each of ``--sizes`` more seconds of
  sleep (default 20, 40 and 60), with the page faults of each round: what the first
  touch of a page costs once it has sat unused, and whether the process's CPU time
  (as the guest counts it) covers that wait or the process sat in a page fault.

Pin it to an idle core (``taskset -c 1``) and compare runs made minutes apart only.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_store import perturbed

from neardup_store import ReadTxn, Store, codec
from neardup_store import store as store_module
from neardup_store.lsh import band_keys
from neardup_store.txn import prepare_batch

BATCH = 10_000
OPTIONS = {"threshold": 0.8, "num_perm": 128, "bands": 9, "rows": 13}


def build(path: Path, documents: int, rng: np.random.Generator, auto: bool = False) -> Store:
    """A store of ``documents`` random signatures, 10k per transaction (or as
    ``batch_size="auto"`` commits)."""
    store = Store.open(path, create=True, durable=False, **OPTIONS)
    lo = 0
    while lo < documents:
        size = min(documents - lo, store.transaction_size() if auto else BATCH)
        add_batch(store, lo, rng, size)
        lo += size
    return store


def add_batch(store: Store, lo: int, rng: np.random.Generator, size: int = BATCH) -> None:
    sigs = rng.integers(0, 2**32, size=(size, 128), dtype=np.uint32)
    store.add_signatures([(f"d{lo + i}", sig) for i, sig in enumerate(sigs)], batch_size=None)


def _status_mib(field: str) -> int:
    """A memory figure of this process from ``/proc/self/status``, in MiB."""
    status = Path("/proc/self/status").read_text()
    return int(status.split(f"{field}:")[1].split()[0]) // 1024


def transactions(
    store: Store,
    documents: int,
    rng: np.random.Generator,
    sizes: Sequence[int] = (),
    perf_control: Path | None = None,
) -> None:
    sizes = sizes or (store.transaction_size(), 500_000, documents // 10)
    added = documents
    for size in [*sizes, *sizes]:
        sigs = rng.integers(0, 2**32, size=(size, 128), dtype=np.uint32)
        items = [(f"x{added + i}", sig) for i, sig in enumerate(sigs)]
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current size
        before = _status_mib("VmRSS")
        with _perf_enabled(perf_control), _Usage(size) as usage:
            store.add_signatures(items, batch_size=None)
        growth = _status_mib("VmHWM") - before
        rate = size / usage.wall
        print(f"at {added}: {size} per transaction, {rate:.0f} docs/s, {usage}, peak +{growth} MiB")
        added += size


@contextmanager
def _perf_enabled(control: Path | None) -> Iterator[None]:
    """Counts ``perf record -D -1 --control fifo:CONTROL`` samples only inside the block."""
    if control is not None:
        control.write_text("enable\n")
    try:
        yield
    finally:
        if control is not None:
            control.write_text("disable\n")


class _Usage:
    """What a block cost this process, per document: wall, user and system CPU time (µs),
    minor page faults, and KB handed to ``write`` calls (``wchar``: LMDB writes a
    transaction's copied pages at commit)."""

    def __init__(self, documents: int) -> None:
        self.documents = documents

    @staticmethod
    def _now() -> tuple[float, resource.struct_rusage, int]:
        written = Path("/proc/self/io").read_text().split("wchar: ")[1].split()[0]
        return time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF), int(written)

    def __enter__(self) -> _Usage:
        self._start = self._now()
        return self

    def __exit__(self, *_: object) -> None:
        (t0, r0, w0), (t1, r1, w1) = self._start, self._now()
        self.wall = t1 - t0
        per = 1e6 / self.documents
        self.figures = (
            f"wall {self.wall * per:.1f}, user {(r1.ru_utime - r0.ru_utime) * per:.1f}, "
            f"system {(r1.ru_stime - r0.ru_stime) * per:.1f} µs/doc, "
            f"{(r1.ru_minflt - r0.ru_minflt) / self.documents:.2f} minor faults/doc, "
            f"{(w1 - w0) / self.documents / 1024:.2f} KB written/doc"
        )

    def __str__(self) -> str:
        return self.figures


def profiled(run: Callable[[], object], lines: int = 15) -> float:
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.runcall(run)
    seconds = time.perf_counter() - start
    pstats.Stats(profile).sort_stats("tottime").print_stats(lines)
    return seconds


def ingest(store: Store, documents: int, rng: np.random.Generator) -> None:
    def five() -> None:
        for lo in range(documents, documents + 5 * BATCH, BATCH):
            add_batch(store, lo, rng)

    seconds = profiled(five)
    print(f"{5 * BATCH / seconds:.0f} docs/s under the profiler at {documents} documents")


def remove(store: Store, documents: int, rng: np.random.Generator) -> None:
    keys = [f"d{i}" for i in rng.permutation(documents)[: documents // 50]]

    def batches() -> None:
        for lo in range(0, len(keys), BATCH):
            store.remove_many(keys[lo : lo + BATCH])

    seconds = profiled(batches)
    print(f"{len(keys) / seconds:.0f} removals/s under the profiler at {documents} documents")


def query(store: Store, documents: int, rng: np.random.Generator) -> None:
    queries = rng.integers(0, 2**32, size=(2000, 128), dtype=np.uint32)
    with store.read() as txn:
        for attempt in range(3):
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            times = []
            for sig in queries:
                start = time.perf_counter()
                txn.query(signature=sig)
                times.append(time.perf_counter() - start)
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            p50, p99 = np.percentile(times, [50, 99]) * 1e6
            print(f"pass {attempt + 1}: p50 {p50:.1f} µs, p99 {p99:.1f} µs, "
                  f"{faults / len(queries):.2f} minor faults per query")  # fmt: skip
        profiled(lambda: [txn.query(signature=sig) for sig in queries])
        query_parts(txn, queries, documents)


def query_parts(txn: ReadTxn, queries: np.ndarray, documents: int) -> None:
    """Where a query's time goes, without the profiler's overhead, each part the best of
    three passes, per query. Fresh signatures take the usual miss path: their band keys
    and buckets, their candidate lookups (keys included), and the bare LMDB seeks alone
    (one per band, in a loop that does nothing else). Near-duplicates of stored
    signatures (10 % of values replaced, as the benchmark's) that share a bucket take the
    hit path: candidate lookups, then reading and verifying each candidate's record."""
    store = txn._store
    layout, cursors = store._band_layout, txn._all_band_cursors()

    def buckets_of(sig: np.ndarray) -> list[tuple[bytes, bytes]]:
        return layout.buckets(band_keys(sig, store.banding, store.config.seed)[0])

    buckets = [buckets_of(sig) for sig in queries]
    hits = near_duplicates(txn, documents, np.random.default_rng(len(queries)))
    candidates = [txn._candidates_of(sig) for sig in hits]

    def bare_seeks() -> None:
        for row in buckets:
            for cursor, (table_key, lead) in zip(cursors, row, strict=True):
                cursor.set_range_dup(table_key, lead)

    def verify() -> None:
        for sig, ids in zip(hits, candidates, strict=True):
            for doc_id in ids:
                record = txn._record(doc_id)
                _, _, stored = codec.record_key_and_signature(record, codec.decode_id(doc_id))
                np.count_nonzero(stored == sig)

    parts = {
        "fresh: whole query": (queries, lambda: [txn.query(signature=q) for q in queries]),
        "fresh: band keys and buckets": (queries, lambda: [buckets_of(q) for q in queries]),
        "fresh: candidate lookups": (queries, lambda: [txn._candidates_of(q) for q in queries]),
        "fresh: bare set_range_dup per band": (queries, bare_seeks),
        "hit: whole query": (hits, lambda: [txn.query(signature=q) for q in hits]),
        "hit: candidate lookups": (hits, lambda: [txn._candidates_of(q) for q in hits]),
        "hit: read and verify candidates": (hits, verify),
    }
    print(f"{len(hits)} near-duplicates with a candidate, "
          f"{sum(map(len, candidates)) / len(hits):.2f} candidates each")  # fmt: skip
    for name, (items, run) in parts.items():
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
        print(f"{name:36} {best / len(items) * 1e6:6.1f} µs per query")


def near_duplicates(txn: ReadTxn, documents: int, rng: np.random.Generator) -> np.ndarray:
    """Stored signatures with 10 % of their values replaced, those that share a bucket."""
    picked = rng.choice(documents, 2000, replace=False)
    near = perturbed(np.stack([txn.get(f"d{i}").signature for i in picked]), rng)
    return near[[bool(txn._candidates_of(sig)) for sig in near]]


def size(store: Store, documents: int, rng: np.random.Generator) -> None:
    env = store._require_env()
    tables = {"docs": store._docs_db, "keys": store._keys_db}
    tables.update({f"band {i}": db for i, db in enumerate(store._band_dbs)})
    total = 0
    with store.read() as reader:
        for name, db in tables.items():
            stat = reader.txn.stat(db)
            pages = stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]
            total += pages
            print(f"{name:8} {pages * 4096 / documents:7.1f} B/doc")
    used = (int(env.info()["last_pgno"]) + 1) * 4096
    print(f"tables   {total * 4096 / documents:7.1f} B/doc; file up to the last page "
          f"{used / documents:.1f} B/doc")  # fmt: skip


class Clock:
    """Microseconds per document of named steps, printed on one line."""

    def __init__(self, label: str, documents: int) -> None:
        self.label, self.documents = label, documents
        self.steps: list[tuple[str, float]] = []
        self.last = time.perf_counter()

    def step(self, name: str) -> None:
        now = time.perf_counter()
        self.steps.append((name, (now - self.last) * 1e6 / self.documents))
        self.last = now

    def print(self) -> None:
        total = sum(us for _, us in self.steps)
        parts = ", ".join(f"{name} {us:.2f}" for name, us in self.steps)
        print(f"{self.label}: {total:.2f} µs/doc ({parts})")


def phases(
    store: Store, documents: int, rng: np.random.Generator, sizes: Sequence[int] = ()
) -> None:
    """Mirrors ``WriteTxn._insert_new``, ``_unlink`` and ``_purge`` step by step (keep in
    step); ``sizes`` are the insert transactions' (default 10k, 30k and 100k)."""
    layout, bands = store._band_layout, store.banding.bands
    added = documents
    for size in tuple(sizes or (10_000, 30_000, 100_000)) * 3:
        sigs = rng.integers(0, 2**32, size=(size, 128), dtype=np.uint32)
        clock = Clock(f"add {size} at {added}", size)
        batch = prepare_batch(store, [(f"d{added + i}", None, None) for i in range(size)], sigs)
        clock.step("prepare")
        with store.write() as txn:
            txn._check_new_keys(batch)
            clock.step("key check")
            id_values = txn._allocate_ids(size)
            ids = codec.band_key_bytes(id_values)
            records = codec.encode_records(
                batch.raw_keys, batch.str_keys, batch.signatures, batch.metadata
            )
            indexes = sorted(zip(batch.indexes, ids, strict=True))
            clock.step("encode")
            with txn._writing():
                with txn.txn.cursor(db=store._docs_db) as cursor:
                    cursor.putmulti(zip(ids, records, strict=True), append=True)
                with txn.txn.cursor(db=store._keys_db) as cursor:
                    cursor.putmulti(indexes)
                clock.step("docs and keys")
                entries = [
                    list(layout.entries(batch.band_keys[:, b], id_values)) for b in range(bands)
                ]
                clock.step("band entries")
                for band, band_entries in enumerate(entries):
                    with txn.txn.cursor(db=store._band_dbs[band]) as cursor:
                        cursor.putmulti(band_entries, dupdata=True)
                clock.step("band puts")
        clock.step("commit")
        clock.print()
        added += size
    keys = [f"d{i}" for i in rng.permutation(added)]
    for size in (10_000, 50_000, 100_000) * 3:
        if len(keys) < size:
            print(f"stopped: {len(keys)} documents left, fewer than the {size} to remove")
            break
        chosen, keys = keys[:size], keys[size:]
        clock = Clock(f"remove {size} at {added}", size)
        with store.write() as txn:
            found = sorted(
                {bytes(hit[0]): hit[1] for hit in map(txn._lookup, chosen) if hit}.items()
            )
            clock.step("lookup")
            ids = [doc_id for doc_id, _ in found]
            with txn.txn.cursor(db=store._docs_db) as cursor:
                rows = [(bytes(i), bytes(record)) for i, record in cursor.getmulti(ids)]
            clock.step("read records")
            with txn._writing():
                txn._delete_sorted(store._docs_db, ((doc_id, None) for doc_id in ids))
                txn._delete_sorted(store._keys_db, ((i, None) for i in sorted(i for _, i in found)))
                clock.step("docs and keys")
                with txn.txn.cursor(db=store._removed_db) as cursor:
                    cursor.putmulti(rows)
                clock.step("move records")
        clock.step("commit")
        clock.print()
        added -= size
        clock = Clock(f"purge {size}", size)
        with store.write() as txn:
            with txn.txn.cursor(db=store._removed_db) as cursor:
                rows = [(bytes(k), bytes(v)) for k, v in cursor]
            clock.step("read records")
            sigs = codec.decode_signatures(rows, store.config.num_perm)
            keys_of = band_keys(sigs, store.banding, store.config.seed)
            id_values = codec.decode_ids(i for i, _ in rows)
            entries = [list(layout.entries(keys_of[:, b], id_values)) for b in range(bands)]
            clock.step("band entries")
            with txn._writing():
                for band, band_entries in enumerate(entries):
                    txn._delete_sorted(store._band_dbs[band], band_entries)
                clock.step("band deletes")
                txn._delete_sorted(store._removed_db, ((i, None) for i, _ in rows))
                clock.step("removed deletes")
        clock.step("commit")
        clock.print()


def eager_or_purge(
    store: Store,
    documents: int,
    rng: np.random.Generator,
    sizes: Sequence[int],
    perf_control: Path | None = None,
) -> None:
    """Removal rates, docs/s: deleting band entries at once against leaving them for a
    purge of the same documents, alternated on one store (medians of four rounds); a
    ``perf record`` on ``perf_control`` samples the purges alone."""
    removed_db = store._removed_db
    store_module.PURGE_FRACTION = float("inf")  # each round purges its own removals
    left = [f"d{i}" for i in rng.permutation(documents)]
    for size in sizes or (20_000, 100_000):
        rates: dict[str, list[float]] = {"eager": [], "removal": [], "purge": [], "both": []}
        for round_ in range(4):
            for eager in (True, False) if round_ % 2 == 0 else (False, True):
                keys, left = left[:size], left[size:]
                store._removed_db = None if eager else removed_db
                start = time.perf_counter()
                store.remove_many(keys)
                removing = time.perf_counter() - start
                store._removed_db = removed_db
                if eager:
                    rates["eager"].append(size / removing)
                    continue
                with _perf_enabled(perf_control), _Usage(size) as usage:
                    store.purge(batch_size=None)
                purging = usage.wall
                print(f"  purge of {size}: {usage}")
                rates["removal"].append(size / removing)
                rates["purge"].append(size / purging)
                rates["both"].append(size / (removing + purging))
        eager_rate = statistics.median(rates["eager"])
        print(f"{size} per transaction, {len(store)} documents left:")
        for name, values in rates.items():
            median = statistics.median(values)
            shown = " ".join(f"{v / 1000:.1f}k" for v in values)
            print(f"  {name:8} {shown}  median {median / 1000:.1f}k ({median / eager_rate:.2f}×)")


def idle(store: Store, documents: int, rng: np.random.Generator, sleeps: Sequence[int]) -> None:
    """Latency of reading random documents never read since every page was touched,
    after each of ``sleeps`` more seconds of idle."""
    with store.read() as txn:
        start = time.perf_counter()
        touched = 0
        for db in (store._docs_db, store._keys_db, *store._band_dbs):
            with txn.txn.cursor(db=db) as cursor:
                touched += sum(len(value) for _, value in cursor)
        seconds_taken = time.perf_counter() - start
        print(f"read every page ({touched >> 20} MiB of values) in {seconds_taken:.1f} s")
        unread = rng.permutation(documents)
        waited = 0
        for sleep in (0, *(sleeps or (20, 40, 60))):
            time.sleep(sleep)
            waited += sleep
            picked, unread = unread[:2000], unread[2000:]
            before = resource.getrusage(resource.RUSAGE_SELF)
            cpu = time.process_time()
            seconds = []
            for i in picked:
                start = time.perf_counter()
                txn.get(f"d{i}")
                seconds.append((time.perf_counter() - start) * 1e6)
            cpu = time.process_time() - cpu
            after = resource.getrusage(resource.RUSAGE_SELF)
            p50, p90, p99 = np.percentile(seconds, [50, 90, 99])
            print(
                f"{waited:4d} s after: get p50 {p50:.1f}, p90 {p90:.1f}, p99 {p99:.1f} µs; "
                f"{after.ru_majflt - before.ru_majflt} major, "
                f"{after.ru_minflt - before.ru_minflt} minor faults; "
                f"CPU time {cpu / (sum(seconds) / 1e6):.0%} of the wall time"
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "what",
        choices=["ingest", "remove", "query", "size", "phases", "transactions", "purge", "idle"],
    )
    parser.add_argument("--documents", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--sizes", type=lambda text: [int(x) for x in text.split(",")], default=[],
        help="transactions, purge, phases (inserts): documents per timed transaction; idle:"
        " seconds of each"
        " sleep (comma-separated)",
    )  # fmt: skip
    parser.add_argument(
        "--auto", action="store_true",
        help='build the store with batch_size="auto" (as the benchmark) for every command',
    )  # fmt: skip
    parser.add_argument(
        "--perf-control", type=Path, metavar="FIFO",
        help="transactions, purge: enable a 'perf record -D -1 --control fifo:FIFO' only"
        " while a timed transaction (purge) runs",
    )  # fmt: skip
    args = parser.parse_args(argv)
    documents = args.documents - args.documents % BATCH
    rng = np.random.default_rng(args.seed)
    run = {
        "ingest": ingest,
        "remove": remove,
        "query": query,
        "size": size,
        "phases": lambda store, n, rng: phases(store, n, rng, args.sizes),
        "transactions": lambda store, n, rng: transactions(
            store, n, rng, args.sizes, args.perf_control
        ),
        "purge": lambda store, n, rng: eager_or_purge(store, n, rng, args.sizes, args.perf_control),
        "idle": lambda store, n, rng: idle(store, n, rng, args.sizes),
    }[args.what]
    auto = args.auto or args.what in ("transactions", "purge", "idle")
    with (
        tempfile.TemporaryDirectory(prefix="neardup-profile-") as scratch,
        build(Path(scratch) / "store", documents, rng, auto) as store,
    ):
        run(store, documents, rng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
