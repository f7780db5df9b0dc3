"""Maintenance of a store: duplicate pairs and clusters, statistics, rebuild, compaction, backup.

Every function takes an open :class:`~neardup_store.store.Store`, returns a small frozen
report (or an iterator of them) and never prints; the CLI renders the reports. The
integrity check lives in :mod:`.integrity` and the export stream in :mod:`.transfer`;
both are re-exported here, so ``maintenance`` is the one place to look.

Two operations replace what other processes have open, so they need the store to
themselves: :func:`compact` swaps ``data.mdb`` and :func:`rebuild` drops the band tables
other processes hold handles to. Both upgrade this process's shared lock on
``neardup.lock`` to an exclusive one without waiting, and raise
:class:`~neardup_store.errors.StoreBusyError` if any other process has the store open,
or if a transaction (or a :func:`pairs` iterator) of this process is open, in any
thread. While they run, other threads' new transactions wait for them to finish.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import heapq
import itertools
import os
import shutil
import stat
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lmdb
import numpy as np
import numpy.typing as npt

from . import codec, lmdbfile
from .errors import (
    PROGRESS_EVERY,
    CorruptStoreError,
    IdsExhaustedError,
    InvalidParameterError,
    NeardupError,
    OutputWriteError,
    StoreBusyError,
    StoreFullError,
    check_flags,
    check_progress,
    integer,
    path_of,
    real_path,
)
from .integrity import (
    VIOLATION_KINDS,
    CheckReport,
    Violation,
    _fill_bands,
    _table_batches,
    check,
    walk_snapshot,
)
from .lsh import LSHParams, choose_params
from .store import DAMAGE_ADVICE, write_failure
from .transfer import create_from_export, export, export_file, import_

if TYPE_CHECKING:
    from .params import StoreParams
    from .store import Store
    from .txn import Key, ReadTxn, WriteTxn

__all__ = [
    "VIOLATION_KINDS",
    "BackupReport",
    "BandStats",
    "CheckReport",
    "CompactReport",
    "LargeBucket",
    "Pair",
    "RebuildReport",
    "StoreStats",
    "Violation",
    "backup",
    "bucket_size_range",
    "check",
    "clusters",
    "compact",
    "create_from_export",
    "export",
    "export_file",
    "import_",
    "pairs",
    "rebuild",
    "stats",
]

BATCH = 1024
"""Signatures per batch when walking the documents: bounds memory, amortises numpy calls."""
_META_PAGES = 2  # LMDB's two meta pages precede every table page


# -- reports ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    """Two stored near-duplicates (``first`` inserted before ``second``) and their estimated
    Jaccard similarity (the fraction of equal signature values)."""

    first: Key
    second: Key
    score: float


@dataclass(frozen=True)
class BandStats:
    """How the documents spread over the buckets (band keys) of one band.

    Attributes:
        band: band index.
        buckets: distinct band keys.
        entries: document ids in the band (one per document when healthy).
        histogram: ``histogram[i]`` counts the buckets whose size lies in
            :func:`bucket_size_range` ``(i)``: sizes 1, 2, 3-4, 5-8, 9-16, ...
    """

    band: int
    buckets: int
    entries: int
    histogram: tuple[int, ...]


@dataclass(frozen=True)
class LargeBucket:
    """One of the largest buckets: many documents agreeing on a whole band is usually
    shared boilerplate (templates, licences, empty pages), which makes queries slow."""

    band: int
    size: int
    sample_keys: tuple[Key, ...]


@dataclass(frozen=True)
class StoreStats:
    """What :func:`stats` reports. Sizes are in bytes.

    Attributes:
        awaiting_purge: removed documents whose band entries are still in the band
            tables (and in ``bands``' counts) until a purge (:meth:`Store.purge`).
        params: :meth:`StoreParams.flat` of the store.
        generation: how many rebuilds have re-banded the store (its band tables are
            named by it, so a rebuild can build new ones beside the old).
        commit_counter: write transactions committed since the store was created (those
            that wrote something).
        format_version: the store's on-disk format. Stores made by an older release keep
            theirs (and its band table layout) until a :func:`rebuild`.
        file_bytes: size of ``data.mdb``.
        map_size: the LMDB map size (address space reserved, not disk used).
        used_bytes: pages up to the highest one in use, times the page size.
        free_pages: estimate of pages inside ``used_bytes`` holding no table data (free
            pages, and the free list itself): roughly what :func:`compact` reclaims.
        readers: LMDB reader slots taken (when the call began, so not counting its own);
            ``active_readers`` of them hold a snapshot.
        oldest_snapshot_lag: write transactions committed since the oldest snapshot in a
            reader slot began (0 without one; this call's own is not counted). While a
            snapshot is held, LMDB cannot reuse the pages freed after it, so the file
            grows with every commit: a lag that keeps rising points at a read
            transaction left open.
        oldest_snapshot_pid: the process holding that snapshot, or ``None``.
    """

    documents: int
    awaiting_purge: int
    params: dict[str, Any]
    generation: int
    format_version: int
    file_bytes: int
    map_size: int
    used_bytes: int
    page_size: int
    free_pages: int
    commit_counter: int
    readers: int
    active_readers: int
    oldest_snapshot_lag: int
    oldest_snapshot_pid: int | None
    bands: list[BandStats]
    largest_buckets: list[LargeBucket]

    @property
    def free_bytes(self) -> int:
        """``free_pages`` in bytes."""
        return self.free_pages * self.page_size


@dataclass(frozen=True)
class CompactReport:
    """Sizes of ``data.mdb`` before and after :func:`compact`. With ``dry_run``, the size
    after is an estimate: the pages holding data now, plus those that committing the copy
    in parts can leave free. On a store not written since it was last compacted it is an
    upper bound of what compaction leaves; after removals it is usually above it (the
    rewrite fills pages they left partly empty), but not always (see :func:`compact`)."""

    bytes_before: int
    bytes_after: int
    dry_run: bool = False

    @property
    def reclaimed_bytes(self) -> int:
        return self.bytes_before - self.bytes_after


@dataclass(frozen=True)
class RebuildReport:
    """What :func:`rebuild` changed: the parameters before and after, and the new
    banding generation (the suffix of the band tables' names)."""

    documents: int
    generation: int
    old_params: StoreParams
    new_params: StoreParams


@dataclass(frozen=True)
class BackupReport:
    """Where :func:`backup` wrote the copy, how many documents it holds, its size."""

    path: str
    documents: int
    file_bytes: int


def bucket_size_range(index: int) -> tuple[int, int]:
    """Smallest and largest bucket size counted by ``BandStats.histogram[index]``."""
    return (1, 1) if index == 0 else ((1 << (index - 1)) + 1, 1 << index)


# -- walking the documents ----------------------------------------------------------------------


def _key_of(raw: bytes, is_str: bool) -> Key:
    return raw.decode("utf-8") if is_str else raw


def _id_pairs(store: Store, threshold: float) -> Iterator[tuple[int, int, Key, Key, float]]:
    """Verified pairs as ``(first id, second id, first key, second key, score)``.

    Each document looks up its candidates in the band tables (like a query) and keeps
    those with a larger id, so every pair is found once, from its earlier member, and
    only the current batch of signatures is in memory.
    """
    with store.read() as reader:
        for batch in _table_batches(reader.txn, store._docs_db, BATCH):
            ids = [raw_id for raw_id, _ in batch]
            sigs = codec.decode_signatures(batch, store.config.num_perm)
            for raw_id, (_, record), sig, keys in zip(
                ids, batch, sigs, reader._band_key_rows(sigs), strict=True
            ):
                later = {other for other in reader._candidates(keys) if other > raw_id}
                if not later:
                    continue
                verified = reader._verify(sig, later, threshold)
                if not verified:
                    continue
                first_id = codec.decode_id(raw_id)
                first = _key_of(*codec.record_key(record, first_id))
                for other, score in verified:
                    yield first_id, codec.decode_id(other), first, reader._key_of(other), score


def pairs(store: Store, threshold: float | None = None) -> Iterator[Pair]:
    """Every near-duplicate pair in the store, each once, streamed.

    Candidates come from the band buckets (never from comparing all pairs) and are
    verified against the stored signatures. Pairs come ordered by their first member's
    insertion, then their second's. The iterator reads one snapshot: close it (or
    exhaust it) promptly, since an open snapshot keeps LMDB from reusing freed pages.

    Args:
        threshold: minimum estimated Jaccard (default: the store's threshold). The
            bands were chosen for the store's threshold, so far lower values miss pairs.

    Raises:
        InvalidParameterError: threshold outside (0, 1].
        CorruptRecordError: a record failed its checksum (run :func:`check`).

    Example:
        >>> for pair in store.pairs():  # doctest: +SKIP
        ...     print(pair.first, pair.second, round(pair.score, 2))
    """
    threshold = store._check_threshold(threshold)  # now, not at the first next()
    return (
        Pair(first, second, score) for _, _, first, second, score in _id_pairs(store, threshold)
    )


def clusters(
    store: Store, threshold: float | None = None, progress: Callable[[int], None] | None = None
) -> list[list[Key]]:
    """Groups of near-duplicates: the connected components of :func:`pairs`.

    Args:
        progress: called with the number of pairs found so far, every
            :data:`~.errors.PROGRESS_EVERY` of them and once at the end.

    Returns:
        Clusters of two or more keys, each in insertion order, ordered by their first
        member's insertion. Memory grows with the documents that have a duplicate only.
    """
    threshold = store._check_threshold(threshold)
    check_progress(progress)
    parent: dict[int, int] = {}
    keys: dict[int, Key] = {}

    def root(node: int) -> int:
        while parent[node] != node:
            parent[node] = parent[parent[node]]  # path halving keeps the trees shallow
            node = parent[node]
        return node

    found = 0
    for first_id, second_id, first, second, _ in _id_pairs(store, threshold):
        found += 1
        if progress is not None and found % PROGRESS_EVERY == 0:
            progress(found)
        for node, key in ((first_id, first), (second_id, second)):
            if node not in keys:
                keys[node], parent[node] = key, node
        a, b = root(first_id), root(second_id)
        if a != b:
            parent[max(a, b)] = min(a, b)
    if progress is not None:
        progress(found)
    groups: dict[int, list[int]] = {}
    for node in sorted(keys):
        groups.setdefault(root(node), []).append(node)
    return [[keys[n] for n in members] for _, members in sorted(groups.items())]


# -- statistics ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Readers:
    slots: int
    active: int
    oldest_lag: int
    oldest_pid: int | None


def _readers(store: Store) -> _Readers:
    """Reader slots in use, those holding a snapshot, and the oldest snapshot's lag behind
    the last commit, from ``env.readers()``."""
    with store._readers_lock:  # not while a compaction swaps the environment
        table = store._require_env().readers()
    rows = [line.split() for line in table.splitlines()[1:]]
    rows = [row for row in rows if len(row) == 3]  # pid, thread, txnid (or "-")
    held = sorted((int(txnid), int(pid)) for pid, _, txnid in rows if txnid != "-")
    if not held:
        return _Readers(len(rows), 0, 0, None)
    oldest, pid = held[0]
    lag = max(0, int(store._env_info()["last_txnid"]) - oldest)
    return _Readers(len(rows), len(held), lag, pid)


def _pages(stat: dict[str, int]) -> int:
    return int(stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"])


def _table_stats(store: Store, txn: lmdb.Transaction) -> list[dict[str, int]]:
    """LMDB's figures (pages, depth, entries) of every table of this store."""
    tables = [store._meta_db, store._docs_db, store._keys_db, *store._band_dbs]
    if store._removed_db is not None:
        tables.append(store._removed_db)
    return [txn.stat(db) for db in tables]


def _table_pages(store: Store, txn: lmdb.Transaction) -> int:
    """Pages holding table data: the main DB's and every table's of this store."""
    return _main_pages(store, txn) + sum(_pages(table) for table in _table_stats(store, txn))


def _main_pages(store: Store, txn: lmdb.Transaction) -> int:
    """Pages of LMDB's main table (of table names) in ``txn``'s snapshot. Its handle is
    fetched through ``txn``: without one, ``open_db`` begins a read transaction of its
    own, which a full reader table refused with a raw ``lmdb.ReadersFullError``."""
    return _pages(txn.stat(store._require_env().open_db(None, txn=txn)))


def stats(store: Store, largest: int = 5) -> StoreStats:
    """Sizes, counters and the bucket-size distribution of every band, from one snapshot.

    It walks every entry of every band table, so it costs about as much as reading the
    band tables once.

    Args:
        largest: how many of the largest buckets (over all bands) to report.
    """
    count = integer(largest)
    if count is None or count < 0:
        raise InvalidParameterError("largest", largest, "a non-negative integer")
    largest = count
    store._require_env()  # a closed store fails here, before anything is read
    store._sweep_readers(force=True)  # report live readers, not killed ones
    readers = _readers(store)
    with store.read() as reader:
        txn = reader.txn
        info, page_size = store._env_info(), store._page_size()
        used_pages = _table_pages(store, txn)
        bands: list[BandStats] = []
        heap: list[tuple[int, int, bytes]] = []  # (size, -band, band key): the smallest on top
        for band, db in enumerate(store._band_dbs):
            counts = np.zeros(65, dtype=np.int64)  # by bit length of size - 1
            buckets = entries = 0
            for band_keys, sizes in _bucket_sizes(txn, db, store._band_layout, store.path):
                _, bit_lengths = np.frexp((sizes - 1).astype(np.float64))
                counts += np.bincount(bit_lengths, minlength=len(counts))
                buckets, entries = buckets + len(sizes), entries + int(sizes.sum())
                # The chunk's largest by (size, band key), as the heap orders them.
                for i in np.lexsort((band_keys, sizes))[-largest:] if largest else ():
                    if sizes[i] < 2:
                        continue
                    kept = int(band_keys[i]).to_bytes(8, "big")[: store._band_layout.band_key_bytes]
                    item = (int(sizes[i]), -band, kept)
                    if len(heap) < largest:
                        heapq.heappush(heap, item)
                    elif item > heap[0]:
                        heapq.heapreplace(heap, item)
            used = np.flatnonzero(counts)
            histogram = tuple(int(n) for n in counts[: used[-1] + 1]) if len(used) else ()
            bands.append(BandStats(band, buckets, entries, histogram))
        top = [
            LargeBucket(-neg_band, size, _sample_keys(reader, -neg_band, key))
            for size, neg_band, key in sorted(heap, reverse=True)
        ]
        last_pgno = int(info["last_pgno"])
        return StoreStats(
            documents=len(reader),
            awaiting_purge=reader.awaiting_purge(),
            params=store.params.flat(),
            generation=int(store._read_meta(txn, "banding")["generation"]),
            format_version=int(store._read_meta(txn, "format_version")),
            file_bytes=(store.path / "data.mdb").stat().st_size,
            map_size=int(info["map_size"]),
            used_bytes=(last_pgno + 1) * page_size,
            page_size=page_size,
            free_pages=max(0, last_pgno + 1 - _META_PAGES - used_pages),
            commit_counter=store._read_count(txn, "commit_counter"),
            readers=readers.slots,
            active_readers=readers.active,
            oldest_snapshot_lag=readers.oldest_lag,
            oldest_snapshot_pid=readers.oldest_pid,
            bands=bands,
            largest_buckets=top,
        )


_SIZES_CHUNK = 1 << 20  # entries read into memory at once by _bucket_sizes


def _bucket_sizes(
    txn: Any, db: Any, layout: codec.BandLayout, path: Path
) -> Iterator[tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]]:
    """The buckets of a band table in key order, in chunks: each chunk's band keys as kept
    (left-aligned in a uint64) and sizes.

    The entries come as packed runs of (table key, value) bytes (``getmulti`` over the
    table keys, LMDB's multiple-value reads of fixed-size duplicates), about a million at a
    time, and are told apart with numpy. A bucket never spans table keys, so never chunks.
    """
    width = layout.key_bytes + layout.value_bytes
    with txn.cursor(db=db) as keys_cursor, txn.cursor(db=db) as reader:
        chunk: list[bytes] = []
        pending = 0
        for key in keys_cursor.iternext_nodup(keys=True, values=False):
            if len(key) != layout.key_bytes:
                raise CorruptStoreError(
                    str(path), f"a band table key is {len(key)} bytes, not {layout.key_bytes}"
                )
            chunk.append(bytes(key))
            pending += keys_cursor.count()
            if pending >= _SIZES_CHUNK:
                yield _runs(reader, chunk, width, layout)
                chunk, pending = [], 0
        if chunk:
            yield _runs(reader, chunk, width, layout)


def _runs(
    cursor: Any, keys: list[bytes], width: int, layout: codec.BandLayout
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """Band keys (as in :func:`_bucket_sizes`) and sizes of the buckets under ``keys``."""
    packed = cursor.getmulti(keys, dupdata=True, dupfixed_bytes=layout.value_bytes, keyfixed=True)
    rows = np.frombuffer(packed, dtype=np.uint8).reshape(-1, width)
    padded = np.zeros((len(rows), 8), dtype=np.uint8)
    padded[:, : layout.band_key_bytes] = rows[:, : layout.band_key_bytes]
    band_keys = padded.view(">u8").ravel().astype(np.uint64)
    starts = np.flatnonzero(np.r_[True, band_keys[1:] != band_keys[:-1]])
    return band_keys[starts], np.diff(np.r_[starts, len(band_keys)])


def _sample_keys(reader: ReadTxn, band: int, band_key: bytes, count: int = 3) -> tuple[Key, ...]:
    """Keys of the first ``count`` stored documents of a bucket (it may also list removed
    ones awaiting a purge, which have no key)."""
    found: dict[bytes, bytes] = {}
    for doc_id in reader._bucket(band, band_key):
        found.update(reader._live_records([doc_id]))
        if len(found) == count:
            break
    return tuple(reader._key_of(doc_id, found) for doc_id in found)


# -- exclusive access ---------------------------------------------------------------------------


@contextmanager
def _exclusive(store: Store, operation: str) -> Iterator[None]:
    """Hold ``neardup.lock`` exclusively for the block, or raise StoreBusyError at once.

    Every open store holds a shared ``flock``; upgrading ours fails while any other
    process has the store open. On Linux a failed upgrade has already released the
    shared lock, so two processes upgrading at once could let one through while the
    other still uses the store: a POSIX lock (independent of ``flock``) on the same
    file first admits one upgrader at a time.
    """
    store._check_writable()
    store._require_env()  # a forked child is told so, not that it holds a transaction
    with _threads_held_off(store, operation):
        # Asked again once the others are held off: a close() of another thread before
        # that left a closed descriptor here, which the lock calls below then used.
        store._require_env()
        fd = store._lock_fd
        if fd is None:  # pragma: no cover - an open store always holds its lock
            raise RuntimeError("the store holds no lock")
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EAGAIN, errno.EACCES):
                raise StoreBusyError(str(store.path), operation) from None
            raise
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fcntl.flock(fd, fcntl.LOCK_SH)  # take back the shared lock the attempt dropped
                raise StoreBusyError(str(store.path), operation) from None
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_SH)
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN)


@contextmanager
def _threads_held_off(store: Store, operation: str) -> Iterator[None]:
    """Refuse while this process has a transaction open, and keep other threads from
    beginning one until the block ends.

    Closing the environment (or dropping tables) under an open transaction ends it with
    a raw LMDB error, loses its writes, and can hang ``env.close()``. Every transaction
    is counted under ``store._readers_lock`` before it begins (``Store._begin_tracked``),
    so holding that lock for the block makes other threads wait there; this thread's own
    transactions (a purge, the rebuild's write) go through, as the lock is reentrant,
    and never wait inside it: with no other transaction and no growth pending, a map
    growth finds nothing to wait for, and a close of another thread waits for the block.
    """
    with store._readers_done:
        store._wait_for_transactions(operation, wait_s=0)
        # Marked, so that this thread's own transactions never wait for a close pending
        # in another thread (a wait releases the lock that holds the others off, and the
        # close then ended the environment under the operation), and so that such a close
        # waits for the block to end.
        store._holding_off = threading.get_ident()
        try:
            yield
        finally:
            store._holding_off = None
            store._readers_done.notify_all()


def _reopen(store: Store, max_dbs: int, swap: Callable[[], None] | None = None) -> None:
    """Close the environment, run ``swap`` and reopen in place (exclusive access required)."""
    env = store._require_env()
    info = env.info()
    env.close()
    store._env = None
    try:
        if swap is not None:
            swap()
    finally:  # reopen whichever file is in place, so the store stays usable
        store._env = store._open_env(max_dbs, int(info["map_size"]), int(info["max_readers"]))
        _reattach(store, store.params, store._generation, store._format_version)


def _reattach(store: Store, params: StoreParams, generation: int, format_version: int) -> None:
    """Reopen the table handles; the signature parameters never change, so the hasher stays."""
    hasher = store.hasher
    store._attach(params, generation, format_version)
    store.hasher = hasher


def _max_dbs(bands: int) -> int:
    return 2 * bands + 8  # what Store.open uses


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- compaction and backup ----------------------------------------------------------------------


def compact(
    store: Store, dry_run: bool = False, progress: Callable[[int], None] | None = None
) -> CompactReport:
    """Rewrite ``data.mdb`` without free pages, reclaiming the space removals leave.

    LMDB never shrinks its file: pages freed by removals are only reused. This purges
    the band entries of removed documents (:meth:`Store.purge`), then writes a
    compacted copy (every table rewritten in key order, pages filled) into a temporary
    directory inside the store, syncs it, swaps it in with an atomic rename and reopens
    the environment in this store object. A crash at
    any point leaves either the old file or the new one, both complete (and perhaps a
    ``.compact-*`` scratch directory, which the next writable open of the store deletes).

    Args:
        dry_run: change nothing; estimate the size compaction leaves from the pages the
            tables use now (works on a read-only store and while others use it). On a
            store not written since it was last compacted, the estimate is an upper
            bound. Otherwise the copy's band tables can take more pages than the store's
            do: the copy writes them key by key, and where a band table holds some 40 to
            220 entries under each key (stores of about 10,000 to 60,000 documents),
            LMDB fills their pages less than batches of writes did. A store of 45,000
            documents with 8 bands, written in batches of 1,000, was estimated at 2,862
            pages and compacted to 3,599 (then estimated at 3,610).
        progress: called now and then with how far the copy is, in documents.

    Raises:
        CorruptStoreError: the walk of the pages found damage; nothing was written.
        ReadOnlyError: the store is open read-only.
        StoreBusyError: another process has the store open (its commits would be lost
            if it kept writing to the replaced file).

    Example:
        >>> report = store.compact()  # doctest: +SKIP
        >>> report.bytes_before - report.bytes_after  # doctest: +SKIP
    """
    check_flags(dry_run=dry_run)
    check_progress(progress)
    data = store.path / "data.mdb"
    if dry_run:
        with store.read() as reader:
            page_size = store._page_size()
            pages = _META_PAGES + _table_pages(store, reader.txn) + _chunk_pages(store, reader.txn)
        return CompactReport(data.stat().st_size, pages * page_size, dry_run=True)
    with _exclusive(store, "compact"):
        before = data.stat().st_size
        with store.read() as reader:  # before the purge writes
            _refuse_damage(store, reader.txn)
        store.purge()
        with _scratch(store.path, ".compact-") as scratch:
            copy = _synced_copy(store, scratch, progress=progress)

            def swap() -> None:
                os.replace(copy, data)
                _fsync(store.path)  # make the rename itself durable

            _reopen(store, _max_dbs(store.banding.bands), swap)
        return CompactReport(before, data.stat().st_size)


def _refuse_damage(store: Store, txn: lmdb.Transaction) -> None:
    """Walk the snapshot's pages, bounds-checked, before a copy reads them all: LMDB
    trusts the pages it reads, and a damaged one can abort the process (an assertion,
    SIGBUS) instead of raising. It costs about one more read of the file (0.80 s against
    the compaction's 0.83 at 100k documents). A walk that other writers' commits made
    stale proves nothing either way, and the copy goes on. So does one that finds only
    entries of the main table that are no table records: the copy leaves them out
    (:func:`_named_tables`), so that the backup ``check`` asks for can still be taken."""
    report = walk_snapshot(store, txn)
    problems = [p for p in report.problems if not p.startswith(lmdbfile.STRAY_ENTRY)]
    if problems:
        raise CorruptStoreError(str(store.path), f"{problems[0]}; {DAMAGE_ADVICE}")


@contextmanager
def _scratch(parent: Path, prefix: str) -> Iterator[Path]:
    """A new directory in ``parent`` to build a copy in, deleted when the block ends: a
    copy renamed into place only when complete never shows half-written at its place."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _synced_copy(
    store: Store,
    scratch: Path,
    txn: lmdb.Transaction | None = None,
    progress: Callable[[int], None] | None = None,
    typed: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
) -> Path:
    """:func:`_copy` into ``scratch``, with the store's permissions, synced: on disk whole
    before anything renames it into place. Returns the copy's ``data.mdb``."""
    _copy(store, scratch, txn, progress, typed)
    copy = scratch / "data.mdb"
    _keep_mode(store.path / "data.mdb", copy)
    _fsync(copy)
    return copy


def _keep_mode(original: Path, copy: Path) -> None:
    """Give an LMDB copy (or a backup's directory) the original's group and permissions.
    LMDB creates it 0o666 less the umask, which would turn an owner-only store readable
    by everyone, and in the creator's primary group, which would lock the rest of a group
    out of a store one of its members compacted."""
    info = original.stat()
    if copy.stat().st_gid != info.st_gid:
        with contextlib.suppress(PermissionError):  # a group this user is not in
            os.chown(copy, -1, info.st_gid)
    os.chmod(copy, stat.S_IMODE(info.st_mode))  # after chown, which may clear bits


def backup(
    store: Store, path: str | os.PathLike[str], progress: Callable[[int], None] | None = None
) -> BackupReport:
    """Write a consistent, compacted copy of the store to ``path`` while it stays in use.

    The copy is taken from one snapshot, so it holds exactly the commits before the call
    began; open it with :meth:`Store.open` like any store. It is built in a scratch
    directory (inside ``path`` if that is an existing empty directory, such as a backup
    disk's mount point, else beside it) and renamed into place once synced, so a backup
    that fails or is killed leaves no store at ``path`` (a killed one's scratch directory
    is deleted by the next backup to ``path``).

    Raises:
        InvalidParameterError: ``path`` is not a new or empty directory, lies inside the
            store, or its parent cannot be made.
        StoreFullError: the disk (or file-size limit) of ``path`` is full.
        OutputWriteError: the copy could not be written at ``path`` for another reason.
        CorruptStoreError: the walk of the snapshot's pages found damage.
    """
    target = path_of(path)
    check_progress(progress)
    place, exists = _backup_place(store, target)
    # In an existing directory the data file is what is renamed into it (a mount point
    # cannot be replaced, nor can a symbolic link to a directory); else the directory.
    parent, prefix = (
        (place, _BACKUP_PREFIX) if exists else (place.parent, f".{place.name}{_BACKUP_PREFIX}")
    )
    with store.read() as reader, _typed_as_output(target, parent):
        _refuse_damage(store, reader.txn)
        documents = len(reader)
        with _scratch(parent, prefix) as scratch, _claim(scratch):
            typed = functools.partial(_typed_as_output, target, scratch)
            copy = _synced_copy(store, scratch, reader.txn, progress, typed)
            if exists:
                os.replace(copy, place / copy.name)
                _fsync(place)
            else:
                _keep_mode(store.path, scratch)  # the directory too: the group enters it
                _fsync(scratch)
                os.replace(scratch, place)
                (place / _BACKUP_MARK).unlink()  # a backup now, no scratch directory
                _fsync(place)
                _fsync(place.parent)
    return BackupReport(str(target), documents, (place / "data.mdb").stat().st_size)


def _backup_place(store: Store, target: Path) -> tuple[Path, bool]:
    """Where the backup goes (absolute, links resolved), once checked, and whether it is an
    existing directory; killed backups' leftovers there are deleted, a missing parent made."""
    if real_path(target).is_relative_to(real_path(store.path)):
        raise InvalidParameterError("path", str(target), "a directory outside the store")
    if target.exists():
        if not target.is_dir():
            raise InvalidParameterError("path", str(target), "a new or empty directory")
        place = real_path(target)
        try:
            _remove_backup_leftovers(place, _BACKUP_PREFIX)
            empty = not any(place.iterdir())
        except OSError as err:
            raise OutputWriteError(str(target), err.strerror or str(err)) from None
        if not empty:
            raise InvalidParameterError("path", str(target), "a new or empty directory")
        return place, True
    place = Path(os.path.abspath(target))  # "." and "x/.." have a name and a parent
    try:
        mode = stat.S_IMODE(store.path.stat().st_mode)
        place.parent.mkdir(parents=True, exist_ok=True, mode=mode)
    except OSError as err:
        raise InvalidParameterError(
            "path", str(target), f"a directory that can be made ({err.strerror})"
        ) from None
    try:
        _remove_backup_leftovers(place.parent, f".{place.name}{_BACKUP_PREFIX}")
    except OSError as err:
        raise OutputWriteError(str(target), err.strerror or str(err)) from None
    return place, False


@contextmanager
def _claim(scratch: Path) -> Iterator[None]:
    """Mark a backup's scratch directory as one and hold an ``flock`` on it while it is
    built: a marked one nobody holds is a killed backup's leftover (the kernel drops a
    dead process's locks)."""
    fd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.close(os.open(scratch / _BACKUP_MARK, os.O_WRONLY | os.O_CREAT, 0o600))
        yield
    finally:
        os.close(fd)


_BACKUP_PREFIX = ".neardup-backup-"
_BACKUP_MARK = ".neardup-backup"
"""The file in a backup's scratch directory that tells it from any other directory."""


def _remove_backup_leftovers(parent: Path, prefix: str) -> None:
    """Delete the scratch directories of killed backups to the same path (they can be as
    large as the store): named so, marked by :data:`_BACKUP_MARK` (or empty: killed
    before the mark) and locked by no one (those of running backups are locked and stay;
    a directory with other contents and no mark is not ours)."""
    for leftover in parent.iterdir():
        if (
            not leftover.name.startswith(prefix)
            or leftover.is_symlink()
            or not leftover.is_dir()
            or not ((leftover / _BACKUP_MARK).is_file() or not any(leftover.iterdir()))
        ):
            continue
        try:
            fd = os.open(leftover, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(leftover, ignore_errors=True)
        except OSError:
            continue  # a running backup holds it
        finally:
            os.close(fd)


@contextmanager
def _typed_as_output(target: Path, scratch: Path) -> Iterator[None]:
    """Raise a failure to write a backup (being built in ``scratch``) against its
    ``target``: the source store was only read, so its path and disk are not to blame."""
    try:
        yield
    except NeardupError:
        raise
    except (lmdb.Error, OSError) as err:
        typed = _output_error(target, scratch, err)
        if typed is None:
            raise
        raise typed from err


def _output_error(target: Path, scratch: Path, err: Exception) -> Exception | None:
    """The typed error for ``err`` raised while writing a backup (``None`` for an engine
    error that is not about writing), judged as a write to the store is."""
    failure = write_failure(err, scratch, "the copy", "the backup")
    if failure is not None:
        full, detail = failure
        return (StoreFullError if full else OutputWriteError)(str(target), detail)
    if isinstance(err, OSError):
        return OutputWriteError(str(target), err.strerror or str(err))
    return None


def _copy(
    store: Store,
    target: Path,
    txn: lmdb.Transaction | None = None,
    progress: Callable[[int], None] | None = None,
    typed: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
) -> None:
    """A compacted copy of every table of ``txn``'s snapshot (a new one if ``None``) in a
    new environment at ``target``, with engine errors typed by ``typed`` (default: as any
    write to the store, whose disk a compaction's copy shares: a full one is
    StoreFullError); ``progress`` gets the share copied so far, scaled to the documents.

    Each table is read in key order and appended to its copy, so pages come out full and
    free pages stay behind. LMDB's own compacting copy (``Environment.copy(compact=True)``)
    is not used: in py-lmdb 3.0.0 it dereferences a null pointer, killing the process,
    as soon as a table holds a sub-database of fixed-size duplicates, i.e. a band bucket
    of a few hundred documents (``tests/test_maintenance.py`` has the case).
    """
    env = store._require_env()
    copy = None
    try:
        with (typed or store._typed_engine_errors)(), contextlib.ExitStack() as stack:
            if txn is None:
                txn = stack.enter_context(env.begin())
            copy = lmdb.open(
                os.fsencode(target),
                map_size=store._map_size(),
                max_dbs=_max_dbs(store.banding.bands),
                sync=False,  # synced once at the end
                lock=False,  # a private scratch directory
                meminit=False,
            )
            documents = int(txn.stat(store._docs_db)["entries"])
            try:
                _copy_tables(env, txn, copy, documents, progress or (lambda done: None))
            except lmdb.BadTxnError as err:  # the snapshot's reads failed on a damaged page
                raise store._translate_read(err) from err
            copy.sync(True)
    finally:
        if copy is not None:
            copy.close()


_COPY_CHUNK = 200_000  # entries per write transaction of a table copy
_FREE_LIST_PAGES = 2  # pages of a copy's free list (a few short records of page numbers)


def _chunk_pages(store: Store, txn: lmdb.Transaction) -> int:
    """At most how many pages a copy of ``txn``'s snapshot holds beyond its tables' for
    being committed every :data:`_COPY_CHUNK` entries (:func:`_copy_tables`); none when
    one transaction holds it all.

    Each commit after the first rewrites pages that an earlier one wrote, and the old
    ones are left free: the path down to the last page of the table it goes on with, and
    to that of its last key's duplicates (no deeper than the deepest table), the main
    table and the free list. LMDB reuses a freed page two commits later, and a whole
    chunk takes far more new pages than a commit frees, so only what the last three
    commits freed stays free in the copy, beside its free list.
    """
    tables = _table_stats(store, txn)
    commits = sum(int(table["entries"]) for table in tables) // _COPY_CHUNK
    if not commits:
        return 0
    main = _main_pages(store, txn)
    depth = max(int(table["depth"]) for table in tables)
    return min(commits, 3) * (2 * depth + main + _FREE_LIST_PAGES) + _FREE_LIST_PAGES


# The persistent flags of an LMDB table (``MDB_db.md_flags``) as ``open_db`` arguments.
_TABLE_FLAGS = {
    0x02: "reverse_key", 0x04: "dupsort", 0x08: "integerkey", 0x10: "dupfixed",
    0x20: "integerdup",
}  # fmt: skip


_TABLE_RECORD_BYTES = 48  # LMDB's MDB_db on a 64-bit machine


def _named_tables(txn: lmdb.Transaction) -> list[tuple[bytes, dict[str, bool]]]:
    """Every named table of the environment and its flags, read from the main table
    (whose other entries, which this package never writes, are damage: not copied)."""
    tables = []
    with txn.cursor() as cursor:
        for name, record in cursor:
            if len(record) != _TABLE_RECORD_BYTES:
                continue
            (flags,) = struct.unpack_from("<H", record, 4)  # MDB_db: md_pad u32, md_flags u16
            tables.append(
                (bytes(name), {arg: bool(flags & bit) for bit, arg in _TABLE_FLAGS.items()})
            )
    return tables


def _copy_tables(
    env: lmdb.Environment,
    txn: lmdb.Transaction,
    copy: lmdb.Environment,
    documents: int,
    progress: Callable[[int], None],
) -> None:
    """Append every entry of every table to ``copy`` in key order, committing every
    ``_COPY_CHUNK`` entries (a small store is copied in one transaction, so its copy
    has no free pages at all); ``progress`` gets the share done, scaled to ``documents``."""
    tables = []
    for name, flags in _named_tables(txn):
        try:
            tables.append((name, flags, env.open_db(name, txn=txn, create=False, **flags)))
        except lmdb.IncompatibleError:  # an entry of the table's size that is not one
            continue
    total = max(1, sum(int(txn.stat(db)["entries"]) for _, _, db in tables))
    copied = 0
    out = copy.begin(write=True)
    try:
        targets = [copy.open_db(name, txn=out, create=True, **flags) for name, flags, _ in tables]
        room = _COPY_CHUNK
        for (_, _, source), target in zip(tables, targets, strict=True):
            with txn.cursor(db=source) as reading:
                entries = iter(reading)
                while chunk := list(itertools.islice(entries, room)):
                    with out.cursor(db=target) as cursor:
                        cursor.putmulti(chunk, dupdata=True, append=True)
                    copied += len(chunk)
                    progress(documents * copied // total)
                    room -= len(chunk)
                    if not room:
                        out.commit()
                        out, room = copy.begin(write=True), _COPY_CHUNK
        out.commit()
    except BaseException:
        out.abort()
        raise


# -- rebuild ------------------------------------------------------------------------------------


def _resolve_banding(
    store: Store, threshold: float | None, bands: int | None, rows: int | None
) -> tuple[LSHParams, float]:
    keep_banding = threshold is None
    threshold = store._check_threshold(threshold)
    if (bands is None) != (rows is None):
        raise InvalidParameterError("bands/rows", (bands, rows), "both bands and rows, or neither")
    if bands is None or rows is None:
        if keep_banding:  # a format upgrade: the banding the store was given stays
            current = store.params.banding
            return LSHParams(current.bands, current.rows), threshold
        return choose_params(threshold, store.config.num_perm), threshold
    banding = LSHParams(bands, rows)
    banding.check_fits(store.config.num_perm, num_perm_fixed=True)
    return banding, threshold


def _rebanding(
    store: Store,
    banding: LSHParams,
    threshold: float,
    generation: int,
    progress: Callable[[int], None] | None = None,
) -> Any:
    """The write operation of :func:`rebuild`, re-runnable after the map grows."""

    def run(writer: WriteTxn) -> int:
        txn, env = writer.txn, store._require_env()
        layout = codec.band_layout(codec.FORMAT_VERSION)
        if store._next_doc_id(txn) > layout.id_limit:  # ids it cannot hold
            raise IdsExhaustedError(str(store.path), layout.id_limit)
        # Drop first: a dropped table's handle slot is free at once, for the new tables.
        for band in range(store.banding.bands):  # the store is still on the old generation
            name = codec.band_table_name(store._generation, band)
            txn.drop(env.open_db(name, txn=txn, create=False), delete=True)
        new_dbs = []
        for band in range(banding.bands):
            db = env.open_db(
                codec.band_table_name(generation, band), txn=txn, dupsort=True, dupfixed=True
            )
            txn.drop(db, delete=False)  # a leftover table of that name must not add entries
            new_dbs.append(db)
        # Removed documents get no entries in the new tables: nothing is left to purge.
        txn.drop(env.open_db(codec.REMOVED_DB, txn=txn), delete=False)
        count = 0
        for batch in _table_batches(txn, store._docs_db, BATCH):
            ids = [raw_id for raw_id, _ in batch]
            sigs = codec.decode_signatures(batch, store.config.num_perm)
            _fill_bands(txn, new_dbs, ids, sigs, banding, store.config.seed, layout)
            count += len(batch)
            if progress is not None:
                progress(count)
        # The new band keys and tables are the current format's, and so is the store now.
        meta = codec.banding_meta(banding, threshold, generation)
        txn.put(b"banding", codec.pack_meta(meta), db=store._meta_db)
        txn.put(b"format_version", codec.pack_meta(codec.FORMAT_VERSION), db=store._meta_db)
        store._seal_meta(txn)
        return count

    return run


def rebuild(
    store: Store,
    threshold: float | None = None,
    bands: int | None = None,
    rows: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> RebuildReport:
    """Re-band the store from its stored signatures (no source texts needed).

    Writes the band tables of a new generation, drops the old ones, empties ``removed``
    (nothing is left to purge) and records the new banding, all in one write transaction:
    readers see the old banding or the new, never a mix. Signature parameters (num_perm,
    scheme, seed, shingles) cannot change here, since the signatures would have to be
    recomputed from the texts, which the store does not keep: make a new store with them
    and add the texts again for that (an export carries the signatures as they are).

    Args:
        threshold: the new threshold (default: keep the current one).
        bands / rows: the new banding, both or neither (default: :func:`choose_params`
            for a new threshold; with no threshold either, the current banding, so that
            ``rebuild()`` only rewrites an older store in the current format).
        progress: called with the number of documents re-banded so far.

    Raises:
        ReadOnlyError: the store is open read-only.
        StoreBusyError: another process has the store open (its band table handles
            would point at dropped tables).
        InvalidParameterError: bad threshold or banding (a banding wider than the
            store's num_perm included).
        CorruptRecordError: a record failed its checksum; nothing was changed (run
            :func:`check`).

    Example:
        >>> store.rebuild(threshold=0.9).new_params.banding  # doctest: +SKIP
        LSHParams(bands=..., rows=...)
    """
    from .params import StoreParams

    store._check_writable()
    check_progress(progress)
    banding, threshold = _resolve_banding(store, threshold, bands, rows)
    old = store.params
    new = StoreParams(old.config, banding, threshold)
    generation = store._generation + 1
    with _exclusive(store, "rebuild"):
        # The new tables reuse the old ones' slots; the environment's limit is the one it
        # was opened with, which an earlier rebuild to more bands may not have raised.
        if banding.bands + 4 > store._max_dbs:
            _reopen(store, _max_dbs(banding.bands))
        operation = _rebanding(store, banding, threshold, generation, progress)
        try:
            with store.write() as writer:
                count = int(writer._run(operation, writer))
        except BaseException as error:
            # Dropping closed the old handles: reopen the tables of whichever generation
            # is stored. A Ctrl-C during the commit, or after it on the way out of the
            # block, comes out here marked (Store.write) though the new banding is
            # stored and the old tables are gone.
            if not getattr(error, "transaction_committed", False):
                _reattach(store, old, store._generation, store._format_version)
                raise
            _reattach(store, new, generation, codec.FORMAT_VERSION)
            raise
        _reattach(store, new, generation, codec.FORMAT_VERSION)
    return RebuildReport(count, generation, old, new)
