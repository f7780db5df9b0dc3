"""Multi-process scenarios of the concurrency suite, shared with ``tools/concurrency_soak.py``.

Each ``run_*`` function starts real processes (multiprocessing's ``spawn`` context, so no
LMDB environment crosses a ``fork()``), drives one scenario on a store directory and returns
its figures as a plain dict; the tests assert on them, the soak tool sums them over a long
run. The worker functions run in the child processes.

The churn writer follows a fixed schedule, so any commit counter names one exact state:
commit ``c`` adds the documents ``d{(c-1)·batch}`` … ``d{c·batch-1}`` and removes those
that commit ``c - window`` added; every ``PURGE_EVERY``-th commit also purges, in the same
transaction, the band entries the removals since the last purge left. Documents ``d{2k}``
and ``d{2k+1}`` are near-duplicates (one character apart), and ``batch`` is even, so pairs
come and go together.
"""

from __future__ import annotations

import fcntl
import hashlib
import multiprocessing
import os
import queue
import random
import string
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import Any

from harness import Model, consistency_problems, raw_dump, spread_consistency_problems

from neardup_store import codec
from neardup_store.errors import StoreBusyError
from neardup_store.minhash import MinHasher
from neardup_store.store import LOCK_FILE, Store
from neardup_store.txn import WriteTxn

PARAMS: dict[str, Any] = {"threshold": 0.7, "num_perm": 64, "bands": 16, "rows": 4}
"""Small signatures and 16 bands keep a full table check of a few hundred documents fast."""
BATCH = 10
PURGE_EVERY = 4
"""The churn commits whose number is a multiple of this purge (so snapshots see both
removed documents awaiting a purge and purges deleting their band entries)."""
WINDOW = 20
JOIN_S = 120.0
"""Bound on waiting for a process that was asked to stop: generous for a loaded machine."""

SPAWN = multiprocessing.get_context("spawn")


# -- the documents and the churn schedule --------------------------------------------------------


def text_of(key: str) -> str:
    """The deterministic text of document ``key`` (``d{j}``, ``w{n}-{seq}-{i}``, ...).

    ``d{2k+1}`` is ``d{2k}`` with one character changed: estimated Jaccard about 0.9.
    """
    base, twin = key, False
    if key.startswith("d") and key[1:].isdigit() and int(key[1:]) % 2:
        base, twin = f"d{int(key[1:]) - 1}", True
    seed = int.from_bytes(hashlib.sha256(base.encode()).digest()[:8], "big")
    letters = random.Random(seed).choices(string.ascii_lowercase + " ", k=200)
    if twin:
        letters[100] = "#"
    return "".join(letters)


def batch_keys(commit: int, batch: int = BATCH) -> list[str]:
    """The documents commit ``commit`` (1-based) of the churn schedule adds."""
    return [f"d{(commit - 1) * batch + i}" for i in range(batch)]


def schedule_keys(commit: int, batch: int = BATCH, window: int = WINDOW) -> set[str]:
    """Exactly the documents stored after ``commit`` commits of the churn schedule."""
    first = max(0, commit - window) * batch
    return {f"d{j}" for j in range(first, commit * batch)}


def schedule_model(commit: int, batch: int = BATCH, window: int = WINDOW) -> Model:
    """The reference model of the store after ``commit`` churn commits."""
    return model_of(sorted(schedule_keys(commit, batch, window), key=lambda k: int(k[1:])))


def model_of(keys: list[str], metadata: dict[str, Any] | None = None) -> Model:
    """A reference model holding ``keys`` (texts from :func:`text_of`) in this order."""
    store_params = _store_params()
    model = Model(store_params.banding, store_params.config.seed)
    hasher = MinHasher(store_params.config)
    if keys:
        sigs = hasher.signatures([text_of(k) for k in keys])
        for key, sig in zip(keys, sigs, strict=True):
            model.add(key, sig, (metadata or {}).get(key))
    return model


def _store_params() -> Any:
    from neardup_store.params import resolve_params

    p = PARAMS
    return resolve_params(p["threshold"], p["num_perm"], None, None, None, p["bands"], p["rows"])


def expected_pairs(keys: set[str]) -> list[list[str]]:
    """The clusters the churn documents ``keys`` must form: each planted pair present."""
    numbers = sorted(int(k[1:]) for k in keys)
    present = set(numbers)
    return [[f"d{j}", f"d{j + 1}"] for j in numbers if j % 2 == 0 and j + 1 in present]


def create_store(path: Path, **options: Any) -> None:
    """Create the store the scenarios use (no commits: the commit counter stays 0)."""
    Store.open(path, create=True, **PARAMS, **options).close()


def commit_counter(path: Path) -> int:
    """The ``commit_counter`` of a store nobody in this process has open."""
    meta = dict(raw_dump(path)[codec.META_DB])
    return int(codec.unpack_meta(meta[b"commit_counter"]))


def churn_commit(store: Store, commit: int, batch: int = BATCH, window: int = WINDOW) -> None:
    """Commit number ``commit`` of the churn schedule, in one write transaction."""
    with store.write() as txn:
        txn.add_many([(key, text_of(key)) for key in batch_keys(commit, batch)])
        if commit > window:
            txn.remove_many(batch_keys(commit - window, batch))
            if commit % PURGE_EVERY == 0:
                txn.purge()


# -- worker processes -----------------------------------------------------------------------------


def churn_writer(path: str, stop: Any, acks: Any, batch: int, window: int, start: int) -> None:
    """Commit the churn schedule from commit ``start + 1`` until ``stop``; ack each commit."""
    with Store.open(path) as store:
        commit = start
        while not stop.is_set():
            commit += 1
            churn_commit(store, commit, batch, window)
            acks.put(commit)


def checking_reader(
    path: str, stop: Any, progress: Any, results: Any, batch: int, window: int
) -> None:
    """Check, inside one read transaction each time, that the tables agree and that the
    snapshot is exactly the churn state its commit counter names; report the counts."""
    checks = torn = 0
    states: set[int] = set()
    examples: list[str] = []
    with Store.open(path, read_only=True) as store:
        while not stop.is_set():
            with store.read() as reader:
                counter = int(store._read_meta(reader.txn, "commit_counter"))
                problems = consistency_problems(reader)
                keys = set(reader.keys())
            if keys != schedule_keys(counter, batch, window):
                problems.append(f"documents differ from churn state {counter}")
            checks += 1
            states.add(counter)
            if problems:
                torn += 1
                examples.extend(problems[: 3 - len(examples)])
            with progress.get_lock():
                progress.value += 1
    results.put({"pid": os.getpid(), "checks": checks, "torn": torn, "states": len(states),
                 "examples": examples})  # fmt: skip


def sequence_writer(path: str, writer: int, commits: int, batch: int, go: Any, acks: Any) -> None:
    """One of two concurrent writers: commit ``commits`` batches of its own documents,
    ``w{writer}-{seq}-{i}`` with metadata ``{"writer", "seq"}``, acking each ``seq``."""
    with Store.open(path) as store:
        go.wait(JOIN_S)
        for seq in range(commits):
            with store.write() as txn:
                txn.add_many(
                    (key, text_of(key), {"writer": writer, "seq": seq})
                    for key in sequence_keys(writer, seq, batch)
                )
            acks.put((writer, seq))


def sequence_keys(writer: int, seq: int, batch: int) -> list[str]:
    return [f"w{writer}-{seq}-{i}" for i in range(batch)]


def reopening_writer(
    path: str, stop: Any, acks: Any, opens: Any, blocked: Any, per_open: int, batch: int,
    window: int,
) -> None:  # fmt: skip
    """Commit the churn schedule, reopening the store every ``per_open`` commits after a
    short random pause (like a batch job), so compaction can get in between; count the
    opens that found compaction holding the store (the shared lock was not free)."""
    rng = random.Random(os.getpid())
    commit = 0
    while not stop.is_set():
        waits = _shared_lock_blocked(Path(path))  # then the open below waits for compaction
        with Store.open(path) as store:
            with opens.get_lock():
                opens.value += 1
            with blocked.get_lock():
                blocked.value += waits
            for _ in range(per_open):
                commit += 1
                churn_commit(store, commit, batch, window)
                acks.put(commit)
        time.sleep(rng.uniform(0, 0.02))


def _shared_lock_blocked(path: Path) -> bool:
    """Whether an exclusive holder (compaction) keeps the store's shared lock from us now."""
    fd = os.open(path / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's lock
    return False


def snapshot_holder(
    path: str, max_readers: int, ready: Any, release: Any, threads: int = 1
) -> None:
    """Hold ``threads`` read transactions (one reader slot each) until ``release`` is set
    (or until killed)."""
    with Store.open(path, read_only=True, max_readers=max_readers) as store:
        held = threading.Barrier(threads + 1)

        def hold() -> None:
            with store.read():
                held.wait()
                release.wait()

        workers = [threading.Thread(target=hold) for _ in range(threads)]
        for worker in workers:
            worker.start()
        held.wait()
        ready.set()
        for worker in workers:
            worker.join()


def uncommitted_writer(path: str, keys: list[str], ready: Any) -> None:
    """Add ``keys`` inside a write transaction and never commit: wait to be killed."""
    with Store.open(path) as store, store.write() as txn:
        txn.add_many([(key, text_of(key)) for key in keys])
        ready.set()
        while True:
            time.sleep(60)


def one_commit(path: str, keys: list[str], acks: Any) -> None:
    """Open the store, add ``keys`` in one commit, acknowledge."""
    with Store.open(path) as store:
        store.add_many([(key, text_of(key)) for key in keys])
    acks.put(keys)


def try_read(path: str, max_readers: int, results: Any) -> None:
    """Open the store and count its documents; report the count or the error's type."""
    try:
        with Store.open(path, read_only=True, max_readers=max_readers) as store:
            results.put(len(store))
    except Exception as err:
        results.put(type(err).__name__)


# -- process plumbing -----------------------------------------------------------------------------


def start(target: Any, *args: Any) -> SpawnProcess:
    process = SPAWN.Process(target=target, args=args, daemon=True)
    process.start()
    return process


@contextmanager
def reaped(processes: list[SpawnProcess]) -> Iterator[list[SpawnProcess]]:
    """Make sure no process outlives the block: after a failure, SIGKILL the ones still
    running at once; after success, give them a bounded time to end first."""
    failed = True
    try:
        yield processes
        failed = False
    finally:
        for process in processes:
            if not failed:
                process.join(timeout=JOIN_S)
            if process.exitcode is None:
                process.kill()
            process.join()


def drain(q: Any) -> list[Any]:
    """Everything queued so far."""
    items = []
    with suppress(queue.Empty):
        while True:
            items.append(q.get_nowait())
    return items


def collect(q: Any, count: int) -> list[Any]:
    """``count`` results, waiting for each (bounded)."""
    return [q.get(timeout=JOIN_S) for _ in range(count)]


def stop_and_join(stop: Any, processes: list[SpawnProcess]) -> None:
    stop.set()
    for process in processes:
        process.join(timeout=JOIN_S)
        if process.exitcode != 0:
            raise AssertionError(f"process {process.pid} ended with {process.exitcode}")


# -- scenarios ------------------------------------------------------------------------------------


def run_readers_and_writer(
    path: Path,
    *,
    readers: int,
    seconds: float = 0.0,
    min_checks: int = 1,
    min_commits: int = 1,
    min_detections: int = 1,
    deadline_s: float = 300.0,
    batch: int = BATCH,
    window: int = WINDOW,
) -> dict[str, Any]:
    """One churn writer and ``readers`` checking readers; this process meanwhile runs the
    spread-over-transactions negative control. Runs at least ``seconds``, and until every
    reader checked ``min_checks`` times, the writer committed ``min_commits`` times and
    the control detected tearing ``min_detections`` times, or ``deadline_s`` passes."""
    create_store(path)
    stop, acks, results = SPAWN.Event(), SPAWN.Queue(), SPAWN.Queue()
    progress = [SPAWN.Value("q", 0) for _ in range(readers)]
    workers = [start(checking_reader, str(path), stop, p, results, batch, window) for p in progress]
    workers.append(start(churn_writer, str(path), stop, acks, batch, window, 0))
    attempts = detections = 0
    examples: list[str] = []
    acked: list[int] = []
    began = time.monotonic()
    with reaped(workers), Store.open(path, read_only=True) as store:
        while True:
            acked += drain(acks)
            done = (
                time.monotonic() - began >= seconds
                and min(p.value for p in progress) >= min_checks
                and len(acked) >= min_commits
                and detections >= min_detections
            )
            if done or time.monotonic() - began > deadline_s:
                break
            if not acked:  # the control is only meaningful while the writer writes
                time.sleep(0.01)
                continue
            attempts += 1
            problems = spread_consistency_problems(store)
            if problems:
                detections += 1
                examples.extend(problems[: 3 - len(examples)])
        stop.set()
        reports = collect(results, readers)
        stop_and_join(stop, workers)
        acked += drain(acks)
    return {
        "seconds": round(time.monotonic() - began, 1),
        "readers": readers,
        "writer_commits": len(acked),
        "reader_checks": sum(r["checks"] for r in reports),
        "torn_views": sum(r["torn"] for r in reports),
        "min_reader_checks": min(r["checks"] for r in reports),
        "min_states_seen": min(r["states"] for r in reports),
        "torn_examples": [e for r in reports for e in r["examples"]][:5],
        "negative_control_attempts": attempts,
        "negative_control_detections": detections,
        "negative_control_examples": examples,
        "final_differences": schedule_model(max(acked, default=0), batch, window).differences(path),
    }


def run_two_writers(path: Path, *, commits: int, batch: int = 5) -> dict[str, Any]:
    """Two writer processes committing concurrently, each its own sequence of batches."""
    create_store(path)
    go, acks = SPAWN.Event(), SPAWN.Queue()
    workers = [start(sequence_writer, str(path), n, commits, batch, go, acks) for n in (0, 1)]
    with reaped(workers):
        go.set()
        acked = collect(acks, 2 * commits)
        for process in workers:
            process.join(timeout=JOIN_S)
            if process.exitcode != 0:
                raise AssertionError(f"writer {process.pid} ended with {process.exitcode}")
    keys, metadata = [], {}
    for writer, seq in acked:  # acknowledgement order is one valid commit order
        for key in sequence_keys(writer, seq, batch):
            keys.append(key)
            metadata[key] = {"writer": writer, "seq": seq}
    stored = raw_dump(path)[codec.DOCS_DB]
    seqs: dict[int, set[int]] = {0: set(), 1: set()}
    for raw_id, data in stored:
        meta = codec.decode_record(data, codec.decode_id(raw_id)).metadata
        seqs[meta["writer"]].add(meta["seq"])
    gaps = sum(len(set(range(max(s, default=-1) + 1)) - s) for s in seqs.values())
    differences = model_of(keys, metadata).differences(path)
    return {
        "writer_commits": len(acked),
        "commit_counter": commit_counter(path),
        "gaps": gaps,
        "lost_commits": sum(seq not in seqs[writer] for writer, seq in acked),
        "sequences": {str(n): sorted(s) == list(range(commits)) for n, s in seqs.items()},
        "differences": differences,
    }


def run_compaction_hammer(
    path: Path,
    *,
    seconds: float = 0.0,
    min_compactions: int = 1,
    min_refusals: int = 1,
    min_blocked_opens: int = 1,
    deadline_s: float = 300.0,
    per_open: int = 3,
    batch: int = BATCH,
    window: int = WINDOW,
) -> dict[str, Any]:
    """A writer process commits (reopening the store now and then) while this process
    compacts the store as often as it can; every acknowledged commit must survive.

    Compaction purges first, so the commits of this process are those purges: counted,
    with those that purged nothing, so that the commit counter can be accounted for."""
    create_store(path)
    stop, acks = SPAWN.Event(), SPAWN.Queue()
    opens, blocked = SPAWN.Value("q", 0), SPAWN.Value("q", 0)
    writer = start(reopening_writer, str(path), stop, acks, opens, blocked, per_open, batch, window)
    attempts = compactions = refusals = 0
    acked: list[int] = []
    began = time.monotonic()
    with reaped([writer]):
        with Store.open(path) as store:
            purges = _count_purge_commits(store)
            while True:
                acked += drain(acks)
                done = (
                    time.monotonic() - began >= seconds
                    and compactions >= min_compactions
                    and refusals >= min_refusals
                    and blocked.value >= min_blocked_opens
                )
                if done or time.monotonic() - began > deadline_s:
                    break
                attempts += 1
                try:
                    store.compact()
                    compactions += 1
                except StoreBusyError:
                    refusals += 1
                time.sleep(0.002)  # leave the writer's open a chance on a loaded machine
        stop_and_join(stop, [writer])
        acked += drain(acks)
    last = max(acked, default=0)
    differences = schedule_model(last, batch, window).differences(path)
    stored = set(model_keys(path))
    lost = sum(
        1
        for commit in range(max(1, last - window + 1), last + 1)
        if not set(batch_keys(commit, batch)) <= stored
    )
    return {
        "seconds": round(time.monotonic() - began, 1),
        "compaction_attempts": attempts,
        "compactions": compactions,
        "refused": refusals,
        "writer_commits": len(acked),
        "writer_opens": opens.value,
        "opens_during_compaction": blocked.value,
        "commit_counter": commit_counter(path),
        "purge_commits": purges["commits"],
        "empty_purge_commits": purges["empty"],
        "lost_commits": lost,
        "differences": differences,
    }


def _count_purge_commits(store: Store) -> dict[str, int]:
    """Count the write transactions ``store`` commits from now on (in the compacting
    process, the purges compaction runs first) and how many of them purged nothing."""
    counts = {"commits": 0, "empty": 0}
    write = store.write

    @contextmanager
    def counted() -> Iterator[WriteTxn]:
        with write() as txn:
            before = txn.awaiting_purge()
            yield txn
            purged = before - txn.awaiting_purge()
        counts["commits"] += 1
        counts["empty"] += purged == 0

    store.write = counted  # type: ignore[method-assign]
    return counts


def model_keys(path: Path) -> list[str | bytes]:
    """The keys stored in a store nobody in this process has open."""
    return [
        codec.decode_record(data, codec.decode_id(raw_id)).key
        for raw_id, data in raw_dump(path)[codec.DOCS_DB]
    ]
