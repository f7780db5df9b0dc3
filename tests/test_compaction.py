"""Compaction and rebuild of a store that has lost 90% of its documents.

A store of a few thousand documents (signature families in bulk, texts with planted
near-duplicates for the probes) has 90% removed; then compaction and a rebuild with the
same parameters must each keep the answers to a fixed set of probe queries and the
logical dump exactly, and compaction must shrink ``data.mdb``. Both need the store to
themselves: with another process holding it open (a real subprocess) they raise
``StoreBusyError`` and change nothing, and succeed once it has closed it. A compaction
SIGKILLed at a chosen point or at a random moment leaves a store that opens with the same
logical dump; its scratch directory is deleted by the next writable open.

(Compaction racing a concurrent writer is covered by the concurrency suite.)
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from harness import LineDrivenProcess, Model, logical_dump, raw_dump

from neardup_store.demo import make_corpus
from neardup_store.errors import StoreBusyError
from neardup_store.minhash import MinHashConfig, MinHasher
from neardup_store.store import Store

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CHILD_ENV = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
TIMEOUT_S = 60  # generous: the machine is shared and loaded

NUM_PERM = 128
SEED = 1
FAMILIES = 700  # bulk: signature families of 4 (a base and 3 near-copies)
FAMILY_SIZE = 4
CORPUS = make_corpus(documents=120, planted_groups=30, seed=21)
TEXT_SIGNATURES = MinHasher(MinHashConfig(num_perm=NUM_PERM, seed=SEED)).signatures(
    list(CORPUS.documents.values())
)


def bulk_signatures() -> list[tuple[str, npt.NDArray[np.uint32]]]:
    """Families of near-identical signatures (about 10% of the values changed per copy)."""
    rng = np.random.default_rng(5)
    items = []
    for family in range(FAMILIES):
        base = rng.integers(0, 2**32, size=NUM_PERM, dtype=np.uint64).astype(np.uint32)
        for member in range(FAMILY_SIZE):
            sig = base.copy()
            if member:
                changed = rng.choice(NUM_PERM, size=12, replace=False)
                sig[changed] = rng.integers(0, 2**32, size=12, dtype=np.uint64).astype(np.uint32)
            items.append((f"bulk-{family:04d}-{member}", sig))
    return items


BULK = bulk_signatures()


def probe_answers(store: Store) -> list[list[tuple[Any, float]]]:
    """Answers to the fixed probes, from one snapshot: every corpus text (kept or
    removed), and a sample of bulk signatures, at the store's threshold and a lower one."""
    sigs = np.stack([sig for _, sig in BULK[::37]])
    with store.read() as txn:
        found = [
            *txn.query_many(list(CORPUS.documents.values())),
            *txn.query_many(list(CORPUS.documents.values()), threshold=0.5, limit=3),
            *txn.query_many(signatures=sigs),
            *txn.query_many(signatures=sigs, threshold=0.6),
        ]
    return [[(m.key, m.score) for m in matches] for matches in found]


def data_bytes(path: Path) -> int:
    return (path / "data.mdb").stat().st_size


def leftovers(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.startswith(".compact-"))


@pytest.fixture(scope="module")
def thinned_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed store: 2,920 documents added (bulk by signature, corpus by text, some
    with metadata), then 90% of them removed in bounded batches (too few for an automatic
    purge: their band entries stay, awaiting one)."""
    path = tmp_path_factory.mktemp("template") / "store"
    with Store.open(path, create=True, num_perm=NUM_PERM, seed=SEED, durable=False) as store:
        store.add_signatures(
            [(key, sig, {"n": i} if i % 5 == 0 else None) for i, (key, sig) in enumerate(BULK)],
            batch_size=500,
        )
        store.add_many(list(CORPUS.documents.items()), batch_size=50)
        keys = [key for key, _ in BULK] + list(CORPUS.documents)
        doomed = random.Random(9).sample(keys, k=len(keys) * 9 // 10)
        for start in range(0, len(doomed), 300):
            store.remove_many(doomed[start : start + 300])
        assert len(store) == len(keys) - len(doomed)
        assert store.stats().awaiting_purge == len(doomed)
    return path


@pytest.fixture
def store_path(thinned_template: Path, tmp_path: Path) -> Path:
    """A private copy of the thinned store (closed)."""
    path = tmp_path / "store"
    shutil.copytree(thinned_template, path)
    return path


@pytest.fixture
def before(store_path: Path) -> dict[str, Any]:
    """Logical dump, probe answers, file size, free pages and removed documents awaiting
    a purge of the thinned store."""
    dump = logical_dump(store_path)
    with Store.open(store_path) as store:
        answers = probe_answers(store)
        stats = store.stats()
    assert sum(map(len, answers)) > 40  # the probes do find matches
    return {
        "dump": dump,
        "answers": answers,
        "bytes": data_bytes(store_path),
        "free": stats.free_pages,
        "awaiting": stats.awaiting_purge,
        "band_entries": [band.entries for band in stats.bands],
    }


def test_the_thinned_store_matches_a_model_of_what_was_kept(
    store_path: Path, before: dict[str, Any]
) -> None:
    """The starting point is right: every kept document and band entry, nothing else
    but the band entries of the removed documents, awaiting a purge."""
    with Store.open(store_path) as store:
        model = Model(store.banding, SEED)
        kept = set(store)
        assert store.check().ok
    for key, sig in BULK:
        if key in kept:
            model.add(key, sig, before["dump"]["documents"][key][1])
    for (key, _), sig in zip(CORPUS.documents.items(), TEXT_SIGNATURES, strict=True):
        if key in kept:
            model.add(key, sig)
    assert len(model.documents) == len(kept) == 292
    assert model.differences(store_path) == []
    assert before["free"] > 0
    assert before["awaiting"] == 2920 - 292
    assert before["band_entries"] == [292 + 2628] * len(before["band_entries"])


def test_compact_keeps_answers_and_dump_and_shrinks_the_file(
    store_path: Path, before: dict[str, Any]
) -> None:
    with Store.open(store_path) as store:
        estimate = store.compact(dry_run=True)
        assert store.stats().awaiting_purge == before["awaiting"]  # a dry run purges nothing
        report = store.compact()
        assert probe_answers(store) == before["answers"]
        assert store.check().ok
        stats = store.stats()
        assert stats.free_pages < before["free"]
        # It purged first: only the kept documents' band entries were copied.
        assert stats.awaiting_purge == 0
        assert [band.entries for band in stats.bands] == [292] * len(stats.bands)
    assert report.bytes_before == before["bytes"]
    assert report.bytes_after == data_bytes(store_path) <= estimate.bytes_after
    assert report.bytes_after < 0.25 * report.bytes_before  # 90% of the documents went
    assert logical_dump(store_path) == before["dump"]
    assert leftovers(store_path) == []
    with Store.open(store_path) as store:  # and it reopens the same
        assert probe_answers(store) == before["answers"]


def test_rebuild_with_the_same_parameters_keeps_answers_and_dump(
    store_path: Path, before: dict[str, Any]
) -> None:
    """A rebuild rewrites the band tables under a new generation in one transaction. It
    does not shrink the file (LMDB never truncates it; the old tables' pages become free
    pages), so a compaction afterwards is what gives the space back."""
    with Store.open(store_path) as store:
        banding, threshold = store.banding, store.threshold
        report = store.rebuild()
        assert report.new_params == report.old_params and store.banding == banding
        assert store.threshold == threshold and report.documents == 292
        assert probe_answers(store) == before["answers"]
        assert store.check().ok
        # The new band tables hold the kept documents only: nothing is left to purge.
        stats = store.stats()
        assert stats.awaiting_purge == 0
        assert [band.entries for band in stats.bands] == [292] * len(stats.bands)
    rebuilt_bytes = data_bytes(store_path)
    assert rebuilt_bytes >= before["bytes"]
    assert logical_dump(store_path) == before["dump"]
    names = {name.decode() for name in raw_dump(store_path)}
    assert f"band.{report.generation}.0000" in names and "band.0.0000" not in names

    with Store.open(store_path) as store:
        compacted = store.compact()
        assert probe_answers(store) == before["answers"]
    assert compacted.bytes_after < 0.25 * rebuilt_bytes
    assert logical_dump(store_path) == before["dump"]


# -- another process holding the store ------------------------------------------------------------

_HOLDER = """
import sys
from neardup_store.store import Store
path, store = sys.argv[1], None
for line in sys.stdin:
    command, *args = line.split()
    if command == "open":
        store = Store.open(path)
        reply = f"opened {len(store)}"
    elif command == "add":
        store.add(args[0], " ".join(args[1:]))
        reply = "added"
    elif command == "close":
        store.close()
        reply = "closed"
    else:
        break
    print(reply, flush=True)
"""


class Holder(LineDrivenProcess):
    """A second process that opens, writes to and closes the store when told to; every
    command waits for its acknowledgement line."""

    def __init__(self, path: Path) -> None:
        super().__init__(_HOLDER, str(path), timeout=TIMEOUT_S)

    def __call__(self, command: str) -> str:
        reply = super().__call__(command)
        assert reply, f"the holder process died on {command!r}"
        return reply


@pytest.fixture
def holder(store_path: Path) -> Iterator[Holder]:
    child = Holder(store_path)
    try:
        yield child
    finally:
        child.stop()


CHILD_TEXT = "a document the other process committed while it held the store open"


@pytest.mark.parametrize("operation", ["compact", "rebuild"])
def test_refused_while_another_process_has_the_store_then_done_after_it_closes(
    store_path: Path, before: dict[str, Any], holder: Holder, operation: str
) -> None:
    with Store.open(store_path) as store:
        assert holder("open") == "opened 292"
        assert holder(f"add from-child {CHILD_TEXT}") == "added"
        generation = raw_generation(store)
        with pytest.raises(StoreBusyError) as caught:
            store.compact() if operation == "compact" else store.rebuild()
        assert caught.value.operation == operation
        assert "other processes have the store open" in str(caught.value)
        assert raw_generation(store) == generation and leftovers(store_path) == []
        assert store.stats().awaiting_purge == before["awaiting"]  # not even purged
        # Nothing changed and both processes go on working: the child still writes.
        assert holder("add from-child-2 and one more after the refusal") == "added"
        assert "from-child-2" in store and len(store) == 294
        answers = probe_answers(store)
        assert holder("close") == "closed"

        if operation == "compact":
            report = store.compact()
            assert report.bytes_after < 0.25 * report.bytes_before
        else:
            assert store.rebuild().generation == generation + 1
        assert probe_answers(store) == answers
        assert store.check().ok and "from-child" in store and len(store) == 294
        assert store.stats().awaiting_purge == 0
    expected = logical_dump(store_path)
    for key in ("from-child", "from-child-2"):
        del expected["documents"][key]
    assert expected["documents"] == before["dump"]["documents"]
    # the holder sees the result when it opens again
    assert holder("open") == "opened 294" and holder("close") == "closed"


def raw_generation(store: Store) -> int:
    with store.read() as txn:
        return int(store._read_meta(txn.txn, "banding")["generation"])


# -- a compaction killed part-way ----------------------------------------------------------------

_COMPACTOR = """
import sys, time
from neardup_store import maintenance
from neardup_store.store import Store
path, stop_at = sys.argv[1], sys.argv[2]
real_fsync, calls = maintenance._fsync, []

def fsync_then_maybe_wait(target):
    # Pause at a chosen point for the parent's SIGKILL: compact() fsyncs the copied file
    # (before the rename), then the directory (after it).
    real_fsync(target)
    calls.append(target)
    point = {1: "copied", 2: "renamed"}[len(calls)]
    if point == stop_at:
        print(point, flush=True)
        time.sleep(3600)

store = Store.open(path)
if stop_at == "random":
    print("compacting", flush=True)
    while True:
        store.compact()
else:
    maintenance._fsync = fsync_then_maybe_wait
    store.compact()
    print("finished", flush=True)
"""


def compactor(path: Path, stop_at: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _COMPACTOR, str(path), stop_at],
        stdout=subprocess.PIPE,
        text=True,
        env=CHILD_ENV,
    )


def kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=TIMEOUT_S)
    assert process.returncode == -signal.SIGKILL


def assert_intact(path: Path, before: dict[str, Any]) -> None:
    """The store opens, its scratch directory is gone, and nothing else changed."""
    with Store.open(path) as store:
        assert leftovers(path) == []  # the writable open deleted it
        assert store.check().ok
        assert probe_answers(store) == before["answers"]
        store.add("after-the-kill", CORPUS.documents["doc-0001"] + " and a few more words")
        store.remove("after-the-kill")
    assert logical_dump(path) == before["dump"]


@pytest.mark.parametrize("point", ["copied", "renamed"])
def test_compaction_killed_at_a_chosen_point_leaves_the_store_intact(
    store_path: Path, before: dict[str, Any], point: str
) -> None:
    """``copied``: the compacted copy is complete and synced, not yet renamed over
    ``data.mdb``; ``renamed``: the rename is done, the directory not yet synced."""
    process = compactor(store_path, point)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == point
    finally:
        kill(process)
    scratch = leftovers(store_path)
    assert len(scratch) == 1  # the killed compaction's scratch directory
    if point == "copied":
        assert data_bytes(store_path) == before["bytes"]  # the old file is still in place
        assert (store_path / scratch[0] / "data.mdb").stat().st_size < before["bytes"]
    else:
        assert data_bytes(store_path) < 0.25 * before["bytes"]  # the new one is
    # A read-only open works and leaves the directory (it may not write here).
    with Store.open(store_path, read_only=True) as reader:
        assert probe_answers(reader) == before["answers"]
        with reader.read() as txn:  # the purge before the copy had committed
            assert txn.awaiting_purge() == 0
    assert leftovers(store_path) == scratch
    assert_intact(store_path, before)


def test_compaction_killed_at_random_moments_leaves_the_store_intact(
    store_path: Path, before: dict[str, Any]
) -> None:
    """A child compacts in a loop; it is SIGKILLed after a random delay, several times."""
    rng = random.Random(2024)
    for _ in range(4):
        process = compactor(store_path, "random")
        try:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "compacting"
            # The kill lands somewhere in the first few compactions (each a few ms).
            process.stdout.close()
            time.sleep(rng.uniform(0.0, 0.15))  # the child never exits on its own
        finally:
            kill(process)
        assert_intact(store_path, before)
