"""Capacity: map growth under readers, reopening with another map size, a full disk.

Known ways an LMDB store breaks that this file covers end to end, on real stores with real
child processes:

* 2: ``MapFullError`` raised by ``commit()`` itself ends the transaction; the whole batch
  must be redone after growing the map, and commit once.
* 3: readers in other processes adopt a grown map (``MapResizedError``); reopening with a
  smaller configured map size must not shrink the map below the recorded size.
* 9: a full disk (here a capped file size, ``RLIMIT_FSIZE``, and where root may mount one,
  a real full tmpfs) is a typed :class:`StoreFullError`, the last commit stays intact,
  reads go on, and the same batch commits once there is room; ``writemap`` is never used.

The long setting is ``tools/disk_full_trials.py``.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
from capacity_worker import (
    PARAMS,
    SMALLEST_MAP,
    WAIT_S,
    Batch,
    child_env,
    disk_full_trial,
    spawn,
    write_ack,
)
from harness import Model, raw_digest

from neardup_store import codec
from neardup_store.errors import (
    InvalidParameterError,
    StoreFullError,
    StoreIOError,
)
from neardup_store.minhash import MinHasher
from neardup_store.store import Store
from neardup_store.txn import WriteTxn

KiB, MiB = 1024, 1024 * 1024


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "store"


def new_store(path: Path, map_size: int = SMALLEST_MAP) -> tuple[Model, MinHasher]:
    """Create a store; return an empty model of it and its hasher."""
    with Store.open(path, create=True, map_size=map_size, **PARAMS) as store:
        return Model(store.banding, store.config.seed), store.hasher


def commit(store: Store, batch: Batch, model: Model, hasher: MinHasher) -> None:
    with store.write() as txn:
        batch.write(txn)
    batch.apply(model, hasher)


def recorded_map_size(path: Path) -> int:
    """The map size the store recorded in its meta table (read with plain LMDB)."""
    env = lmdb.open(str(path), max_dbs=4, readonly=True)
    try:
        with env.begin(db=env.open_db(codec.META_DB, create=False)) as txn:
            return int(codec.unpack_meta(txn.get(b"map_size")))
    finally:
        env.close()


def map_size(store: Store) -> int:
    assert store._env is not None
    return int(store._env.info()["map_size"])


class RedoOrigins:
    """Where each map-full redo came from: the innermost frame of the ``MapFullError``.

    ``_close_txn`` means LMDB's ``commit()`` itself ran out of room; ``_write_counters`` a
    put of the commit counters; ``_insert``/``_unlink`` a document write. The real redo
    runs unchanged.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[str] = []
        real = WriteTxn._redo_after_growth

        def recording(txn: WriteTxn) -> None:
            error = sys.exc_info()[1]
            tb = error.__traceback__ if error is not None else None
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            self.seen.append(tb.tb_frame.f_code.co_name if tb is not None else "replay")
            return real(txn)

        monkeypatch.setattr(WriteTxn, "_redo_after_growth", recording)


# -- known way 3 (readers adopt) and 2 (redo after growth), past 50 MiB ------------------------


def test_ingest_past_50_mib_from_the_smallest_map_while_readers_hold_snapshots(
    tmp_path: Path, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InvalidParameterError):  # SMALLEST_MAP really is the smallest
        Store.open(store_path, create=True, map_size=SMALLEST_MAP - 1)
    redos = RedoOrigins(monkeypatch)
    acks, stop = tmp_path / "acks.jsonl", tmp_path / "stop"
    readers: list[subprocess.Popen[str]] = []
    with Store.open(store_path, create=True, map_size=SMALLEST_MAP, **PARAMS) as store:
        assert map_size(store) == SMALLEST_MAP
        model, hasher = Model(store.banding, store.config.seed), store.hasher
        write_ack(store, acks)  # the state of commit 0, before any reader looks
        ready = [tmp_path / f"ready-{n}" for n in range(2)]
        readers = [spawn("reader", str(store_path), str(acks), str(stop), str(r)) for r in ready]
        try:
            deadline = time.monotonic() + WAIT_S
            while not all(r.exists() for r in ready):  # each holds its first snapshot
                assert all(p.poll() is None for p in readers), _stderr(readers)
                assert time.monotonic() < deadline, "the readers did not start"
                time.sleep(0.02)
            rng = np.random.default_rng(5)
            number = awaited = purges = 0
            while (store_path / "data.mdb").stat().st_size <= 50 * MiB:
                removes: tuple[str, ...] = ()
                if number % 4 == 3:  # remove some earlier documents too
                    keys = list(model.documents)
                    picked = rng.choice(len(keys), size=100, replace=False)
                    removes = tuple(keys[int(i)] for i in picked)
                # Now and then a purge deletes band entries under the readers' snapshots.
                batch = Batch(
                    f"b{number}", number, adds=1000, texts=10 if number % 3 == 0 else 0,
                    meta_bytes=1024, removes=removes, purge=number % 8 == 5,
                )  # fmt: skip
                commit(store, batch, model, hasher)
                ack = write_ack(store, acks)
                awaited = max(awaited, ack["removed"])
                if batch.purge:
                    assert ack["removed"] == 0, ack
                    purges += 1
                number += 1
            final_map = map_size(store)
        finally:
            stop.touch()
            reports = [_report(r) for r in readers]
    grown_to = {json.loads(line)["map_size"] for line in acks.read_text().splitlines()}
    assert final_map >= 64 * MiB and redos.seen, (final_map, redos.seen)
    assert awaited >= 200 and purges >= 2, (awaited, purges)
    docs = len(model.documents)
    for report in reports:
        assert report["snapshots"] >= 2 and report["held_across_growth"] >= 1, report
        assert report["first_map_size"] == SMALLEST_MAP and report["adoptions"] >= 1, report
        # LMDB makes a reader adopt once the data outgrows its map: its map ends at one
        # of the sizes the writer reached, large enough for everything it read.
        assert report["final_map_size"] in grown_to and report["final_used"] >= 50 * MiB, report
        assert report["final"]["docs"] == docs, report
    assert model.differences(store_path) == []
    assert recorded_map_size(store_path) == final_map
    with Store.open(store_path, read_only=True, map_size=SMALLEST_MAP) as reopened:
        assert map_size(reopened) == final_map and len(reopened) == docs
        assert reopened.check().ok


def _report(process: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        out, err = process.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    assert process.returncode == 0, err
    report: dict[str, Any] = json.loads(out)
    return report


def _stderr(processes: list[subprocess.Popen[str]]) -> str:
    return "\n".join(p.communicate()[1] for p in processes if p.poll() is not None)


def test_map_full_raised_by_commit_itself_is_redone_and_commits_once(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch that frees pages (removals) and then fills the map almost exactly: LMDB's
    # commit needs pages of its own for the free list and runs out there, after every
    # put succeeded. Search a small grid for such a batch; each redo must commit once.
    redos = RedoOrigins(monkeypatch)
    small: dict[str, Any] = {"num_perm": 16, "bands": 4, "rows": 4, "map_size": SMALLEST_MAP}
    hits = 0
    # Where such batches lie depends on how the write path fills pages, so the grid spans
    # the base size and the metadata size too (each combination takes a few milliseconds).
    grid = itertools.product((40, 20, 5), (100, 200, 350), range(1, 30))
    for base, meta_bytes, count in grid:
        shutil.rmtree(store_path, ignore_errors=True)
        with Store.open(store_path, create=True, **small) as store:
            model = Model(store.banding, store.config.seed)
            first = Batch("base", 0, adds=base, meta_bytes=100)
            commit(store, first, model, store.hasher)
            redos.seen.clear()
            batch = Batch(
                "new", count, adds=count, meta_bytes=meta_bytes, removes=tuple(model.documents)
            )
            commit(store, batch, model, store.hasher)
            with store.read() as txn:
                assert store._read_meta(txn.txn, "commit_counter") == 2
        if "_close_txn" in redos.seen:
            hits += 1
            assert model.differences(store_path) == []
            with Store.open(store_path, read_only=True) as reopened:
                assert reopened.check().ok
        if hits >= 3:
            break
    assert hits, "no batch of the grid ran out of map inside commit()"


def test_queries_before_and_after_a_map_growth_in_one_transaction_use_the_new_one(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A write transaction keeps its band cursors for its queries; growing the map replays
    # the transaction in a new LMDB one, whose cursors the queries (replayed and later)
    # must use instead of the closed ones.
    redos = RedoOrigins(monkeypatch)
    rng = np.random.default_rng(3)
    sigs = rng.integers(0, 2**32, size=(400, PARAMS["num_perm"]), dtype=np.uint32)
    with Store.open(store_path, create=True, map_size=SMALLEST_MAP, **PARAMS) as store:
        with store.write() as txn:
            assert txn.query(signature=sigs[0]) == []
            txn.add_signatures([(f"d{i}", sig) for i, sig in enumerate(sigs)])
            assert redos.seen, "the batch did not outgrow the smallest map"
            assert [m.key for m in txn.query(signature=sigs[7])] == ["d7"]
            unique = txn.add_if_unique("again", signature=sigs[9])
            assert not unique.added and [m.key for m in unique.matches] == ["d9"]
        assert map_size(store) > SMALLEST_MAP
        assert [m.key for m in store.query(signature=sigs[399])] == ["d399"]


# -- known way 3: reopening with another map size ----------------------------------------------


def test_reopen_with_a_smaller_map_size_keeps_the_recorded_size(store_path: Path) -> None:
    model, hasher = new_store(store_path)
    with Store.open(store_path, map_size=SMALLEST_MAP) as store:
        for number in range(4):
            commit(store, Batch(f"b{number}", number, adds=1000, meta_bytes=512), model, hasher)
        grown = map_size(store)
    assert grown >= 2 * MiB and recorded_map_size(store_path) == grown
    before = raw_digest(store_path)
    with Store.open(store_path, map_size=1 * MiB) as store:
        assert map_size(store) == grown
        assert len(store) == len(model.documents)
    assert raw_digest(store_path) == before  # opening wrote nothing
    with Store.open(store_path, map_size=1 * MiB) as store:  # and writes keep working
        commit(store, Batch("after", 9, adds=1000, meta_bytes=512), model, hasher)
        assert map_size(store) >= grown
        grown = map_size(store)
    assert model.differences(store_path) == []
    with Store.open(store_path, map_size=4 * grown) as store:  # a larger size grows it
        assert map_size(store) == 4 * grown
        commit(store, Batch("big", 10, adds=10), model, hasher)
    assert recorded_map_size(store_path) == 4 * grown
    assert model.differences(store_path) == []


def test_a_foreign_small_open_shrinks_the_map_and_the_store_restores_it(store_path: Path) -> None:
    # The hazard itself: plain LMDB opened with a small size shrinks the map to the used
    # size, and a commit writes that size into LMDB's own header. The recorded size wins.
    model, hasher = new_store(store_path)
    with Store.open(store_path, map_size=SMALLEST_MAP) as store:
        commit(store, Batch("b", 1, adds=3000, meta_bytes=512), model, hasher)
        grown = map_size(store)
    env = lmdb.open(str(store_path), max_dbs=64, map_size=SMALLEST_MAP)
    used = int(env.info()["map_size"])  # LMDB raised the tiny size to the used size
    env.close()
    env = lmdb.open(str(store_path), max_dbs=64, map_size=used + 256 * KiB)
    try:
        shrunk = int(env.info()["map_size"])
        meta = env.open_db(codec.META_DB, create=False)
        with env.begin(write=True, db=meta) as txn:  # a commit (same bytes) records the
            txn.put(b"commit_counter", txn.get(b"commit_counter"))  # shrunk size in LMDB
    finally:
        env.close()
    assert shrunk < grown
    with Store.open(store_path, map_size=SMALLEST_MAP) as store:
        assert map_size(store) == grown
        commit(store, Batch("more", 2, adds=500, meta_bytes=512), model, hasher)
    assert model.differences(store_path) == []


# -- known way 9: a full disk ----------------------------------------------------------------


@pytest.fixture
def filled_store(store_path: Path) -> tuple[Path, Model, MinHasher]:
    """A store with committed documents and a map with room to spare."""
    model, hasher = new_store(store_path, map_size=64 * MiB)
    with Store.open(store_path) as store:
        for number in range(3):
            commit(store, Batch(f"c{number}", number, adds=300, meta_bytes=256), model, hasher)
    return store_path, model, hasher


def removals(model: Model, count: int) -> tuple[str, ...]:
    return tuple(list(model.documents)[:count])


@pytest.mark.parametrize(
    ("limit_extra", "written_as"),
    [
        (0, "File too large"),  # the first write past the end fails outright (EFBIG)
        (4 * KiB, "Input/output error"),  # a write stops part-way: LMDB says EIO
        (256 * KiB, ""),  # either
    ],
)
def test_file_size_limit_at_commit_is_typed_and_the_same_batch_commits_later(
    filled_store: tuple[Path, Model, MinHasher], limit_extra: int, written_as: str
) -> None:
    path, model, hasher = filled_store
    batch = Batch("full", 77, adds=800, texts=20, meta_bytes=512, removes=removals(model, 50))
    trial = disk_full_trial(path, model, hasher, batch, limit_extra)
    assert trial.kind == "typed", trial
    first, retry = trial.messages
    assert first["error"] == "StoreFullError" and written_as in first["message"], first
    assert "Free disk space" in first["message"] and not trial.grew
    assert first["reads"] == "ok" and retry["outcome"] == "committed", trial
    assert model.differences(path) == [] and "full-t19" in model.documents
    with Store.open(path) as store:
        assert store.check().ok


def test_file_size_limit_while_the_map_grows_is_typed_too(store_path: Path) -> None:
    # The batch is far bigger than the map: it fills it, the store grows the map and redoes
    # the batch, and then the commit cannot grow the file.
    model, hasher = new_store(store_path)
    with Store.open(store_path, map_size=SMALLEST_MAP) as store:
        commit(store, Batch("first", 1, adds=50), model, hasher)
    before = recorded_map_size(store_path)
    batch = Batch("huge", 2, adds=3000, meta_bytes=256, removes=removals(model, 10))
    trial = disk_full_trial(
        store_path, model, hasher, batch, limit_extra=16 * KiB, map_size=SMALLEST_MAP
    )
    assert trial.kind == "typed" and trial.grew, trial
    assert trial.messages[1]["outcome"] == "committed"
    assert model.differences(store_path) == []
    assert recorded_map_size(store_path) > before


def test_a_purge_at_the_file_size_limit_is_typed_and_the_same_purge_commits_later(
    filled_store: tuple[Path, Model, MinHasher],
) -> None:
    # Removals leave their band entries for a purge, which deletes them by copying the
    # band tables' pages: at the file-size limit that is a typed error like any write,
    # the removed documents stay removed and awaiting, and the same purge commits later.
    path, model, hasher = filled_store
    with Store.open(path) as store:
        commit(store, Batch("gone", 0, adds=0, removes=removals(model, 600)), model, hasher)
        assert store.stats().awaiting_purge == 600
    trial = disk_full_trial(path, model, hasher, Batch("purge", 0, adds=0, purge=True), 0)
    assert trial.kind == "typed", trial
    first, retry = trial.messages
    assert first["error"] == "StoreFullError" and "File too large" in first["message"], first
    assert first["reads"] == "ok" and retry["outcome"] == "committed", trial
    assert model.differences(path) == []
    with Store.open(path) as store:
        assert store.stats().awaiting_purge == 0 and len(store) == len(model.documents)
        with store.read() as txn:
            assert all(
                txn.txn.stat(db)["entries"] == len(model.documents) for db in store._band_dbs
            )
        assert store.check().ok


_REMOVE_AT_LIMIT = """
import resource, signal, sys
from neardup_store.store import Store
with Store.open(sys.argv[1]) as store:
    if int(sys.argv[2]):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
    try:
        removed = store.remove_many([f"d{i}" for i in range(0, 30_000, 2)])
        print("removed", removed, len(store), store.stats().awaiting_purge)
    except Exception as err:
        print("raised", type(err).__name__, err)
"""


def test_an_automatic_purge_at_the_file_size_limit_leaves_the_committed_removal_said(
    store_path: Path,
) -> None:
    """A removal large enough to start a purge, with room for its own commit and none for
    the purge's: remove_many raised StoreFullError saying nothing was written, though
    the removal had committed (a retry met KeyNotFoundError; a review's finding). The
    removal is reported done, and its documents stay awaiting the next purge."""
    rng = np.random.default_rng(5)
    with Store.open(store_path, create=True, num_perm=16, durable=False) as store:
        sigs = rng.integers(0, 2**32, size=(30_000, 16), dtype=np.uint32)
        store.add_signatures([(f"d{i}", sig) for i, sig in enumerate(sigs)])
    probe = store_path.with_name("probe")
    shutil.copytree(store_path, probe)
    run = [sys.executable, "-c", _REMOVE_AT_LIMIT]
    env = {**os.environ, "NEARDUP_FAULT": "after-commit:1"}  # the removal's own commit
    subprocess.run([*run, str(probe), "0"], env=env, capture_output=True, timeout=300)
    limit = (probe / "data.mdb").stat().st_size  # what the removal needs, the purge more
    done = subprocess.run(
        [*run, str(store_path), str(limit)], capture_output=True, text=True, timeout=300
    )
    assert done.stdout.split() == ["removed", "15000", "15000", "15000"], done
    with Store.open(store_path) as store:
        assert len(store) == 15_000 and store.stats().awaiting_purge == 15_000
        assert store.check().ok
        assert store.purge() == 15_000 and store.check().ok


def _interrupt_the_replay_of_a_growth_at_commit(path: Path, adds: int) -> bool:
    """A block whose commit needs a map growth, with a Ctrl-C raised (by a trace hook, where
    a SIGINT arriving then is raised) at the first operation its replay redoes. Whether it
    came there (the commit did need the growth)."""
    shutil.rmtree(path, ignore_errors=True)
    options = {"num_perm": 16, "bands": 4, "rows": 4, "map_size": SMALLEST_MAP}
    with Store.open(path, create=True, **options) as store:  # type: ignore[arg-type]
        with store.write() as txn:
            Batch("base", 0, adds=40, meta_bytes=100).write(txn)
        batch = Batch("new", adds, adds=adds, meta_bytes=100, removes=tuple(store))
        redo: Any = None
        fired = False

        def hook(frame: Any, event: str, arg: object) -> None:
            nonlocal redo, fired
            caller, name = frame.f_back, frame.f_code.co_name
            if event != "call" or fired or caller is None:
                return
            if name == "_redo_after_growth" and caller.f_code.co_name == "_end":
                redo = frame
            elif caller is redo and name not in ("_close_txn", "_grow_and_begin_write"):
                fired = True
                raise KeyboardInterrupt

        sys.settrace(hook)
        try:
            with store.write() as txn:
                batch.write(txn)
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        if fired:  # the write lock is free: this process writes, and so does another
            store.add_signatures([("same-process", list(range(1, 17)))])
        return fired


def test_a_ctrl_c_in_the_replay_of_a_growth_at_commit_frees_the_write_lock(
    store_path: Path,
) -> None:
    """The replay a full map starts at commit was outside the end's cleanup: a Ctrl-C in
    it left the new LMDB transaction open, and the write lock held while the error lived
    (this process's next write raised a raw lmdb.Error; a review's finding)."""
    assert any(_interrupt_the_replay_of_a_growth_at_commit(store_path, n) for n in range(1, 40))
    other = subprocess.run(
        [sys.executable, "-c", _ADD_ONE, str(store_path)], capture_output=True, timeout=60
    )
    assert other.returncode == 0, other.stderr
    with Store.open(store_path) as store:
        assert "same-process" in store and "other" in store and store.check().ok


_ADD_ONE = """
import sys
from neardup_store.store import Store
with Store.open(sys.argv[1]) as store:
    store.add_signatures([("other", list(range(16)))])
"""


def test_an_io_error_without_a_full_disk_is_typed_as_an_io_error(store_path: Path) -> None:
    # LMDB says EIO both for a short write (a full disk) and for a failing device; the
    # store tells them apart by the room left. Here there is room: a device error.
    new_store(store_path)
    with Store.open(store_path) as store:
        error = store._translate(lmdb.Error("mdb_txn_commit: Input/output error"))
        assert isinstance(error, StoreIOError) and "Input/output error" in str(error)
        full = store._translate(lmdb.Error("mdb_txn_commit: No space left on device"))
        assert isinstance(full, StoreFullError)
        unrelated = lmdb.Error("mdb_put: something else")
        assert store._translate(unrelated) is unrelated


TMPFS_SIZE = 8 * MiB


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 8 MiB tmpfs, or a skip where this sandbox may not mount one."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8); RLIMIT tests cover ENOSPC")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"this sandbox does not permit mounting a tmpfs: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """Take all but ``leave`` bytes of ``disk`` with a file; return the file."""
    filler = disk / "filler"
    stat = os.statvfs(disk)
    with filler.open("wb") as out:
        out.write(b"\0" * max(0, stat.f_bfree * stat.f_frsize - leave))
    return filler


def test_a_really_full_disk_is_typed_and_the_same_batch_commits_once_freed(
    small_disk: Path,
) -> None:
    path = small_disk / "store"
    model, hasher = new_store(path, map_size=4 * MiB)
    with Store.open(path) as store:
        commit(store, Batch("before", 1, adds=300, meta_bytes=256), model, hasher)
    filler = fill(small_disk, leave=32 * KiB)
    batch = Batch("full", 3, adds=2000, meta_bytes=512, removes=removals(model, 20))
    trial = disk_full_trial(path, model, hasher, batch, limit_extra=None, between=filler.unlink)
    assert trial.kind == "typed", trial
    first, retry = trial.messages
    assert first["reads"] == "ok" and retry["outcome"] == "committed", trial
    assert model.differences(path) == []
    with Store.open(path) as store:
        assert store.check().ok


def test_backup_and_compact_on_a_full_disk_are_typed_and_change_nothing(
    small_disk: Path,
) -> None:
    path = small_disk / "store"
    model, hasher = new_store(path, map_size=4 * MiB)
    with Store.open(path) as store:
        commit(store, Batch("before", 1, adds=1500, meta_bytes=1024), model, hasher)
    before = raw_digest(path)
    filler = fill(small_disk, leave=32 * KiB)
    with Store.open(path) as store:
        with pytest.raises(StoreFullError):
            store.backup(small_disk / "copy")
        with pytest.raises(StoreFullError):
            store.compact()
        assert len(store) == len(model.documents)
        filler.unlink()
        assert store.backup(small_disk / "copy").documents == len(model.documents)
    assert raw_digest(path) == before and model.differences(path) == []
    assert model.differences(small_disk / "copy") == []


WRITEMAP_CHILD = r"""
import sys, lmdb
env = lmdb.open(sys.argv[1], map_size=64 << 20, writemap=True)
with env.begin(write=True) as txn:
    for i in range(200000):
        txn.put(b"%08d" % i, b"v" * 200)
print("survived")
"""


def test_writemap_on_a_full_disk_kills_the_process_which_is_why_the_store_never_uses_it(
    small_disk: Path,
) -> None:
    # The control: plain LMDB with writemap=True dies of SIGBUS on a full disk. The store
    # opened the same way raised a typed error above.
    fill(small_disk, leave=32 * KiB)
    done = subprocess.run(
        [sys.executable, "-c", WRITEMAP_CHILD, str(small_disk / "raw")],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert done.returncode == -signal.SIGBUS, done


@pytest.mark.parametrize("read_only", [False, True])
def test_the_store_never_maps_the_file_writable(store_path: Path, read_only: bool) -> None:
    new_store(store_path)
    with Store.open(store_path, read_only=read_only) as store:
        assert store._env is not None
        assert store._env.flags()["writemap"] is False
    assert "writemap" in (sys.modules[Store.__module__].__doc__ or "")  # and why
