"""An in-memory copy of the band tables, kept in step with the store, for fast queries.

A query through LMDB costs one B-tree descent per band, and most of a descent is waiting
for memory: about 1.4 µs a band at 1M documents (``tools/README.md``, "Where the time
goes"). This cache holds every document's bucket in each band in one open-addressing hash
table per band, so a query's candidates take one compiled call of about one cache miss
per band. The store stays the only truth: the cache is derived from the document records,
never written to disk, and rebuilt whenever it cannot vouch for a snapshot.

Why it can answer for a snapshot without replaying what each commit changed:

* Document ids are handed out in increasing order and never reused (an aborted
  transaction's ids are handed out again, but no snapshot ever sees them). So the
  documents a newer snapshot adds are exactly its records from the cache's ``next_id``
  on, read in id order from the ``docs`` table.
* Removals are not applied. The cache is a superset of a snapshot's band entries: its
  candidates are read from the snapshot's records like any others, and a candidate with
  no record in the snapshot (removed, or added by a later commit) is skipped.
* A snapshot older than the one the cache last caught up to may hold a document removed
  in between, which the cache never saw: such a snapshot queries through LMDB instead.
  So does a write transaction once it has written: its own documents are in no
  cache. Before its first write it reads the snapshot it began on (numbered one below
  its own transaction id), and the cache catches up with that, never with records the
  transaction wrote, which an abort could hand out again.
* A record the cache cannot parse (damage) has no entries in it: a snapshot that still
  holds one queries through LMDB, whose band tables find the document and whose read of
  it raises :class:`~.CorruptRecordError`, as without a cache.

Candidates are the same as LMDB's: the cache keys each entry by the bytes of the band key
the store's :class:`~.codec.BandLayout` keeps (40 bits in formats 4 and 5). Entries of removed
documents stay until they outnumber the live ones, when the cache is rebuilt.

Memory is 16 bytes a slot per band, between 60 % and 80 % full (linear probing slows
sharply past that): about 180-240 bytes per document with 9 bands. Thread-safe: the
compiled loops hold the GIL, catching up is serialised, and a reader keeps the tables it
was handed (a rebuild makes new ones) with the snapshot they were caught up for.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any

import lmdb
import numpy as np
import numpy.typing as npt

from . import codec, kernels
from .lsh import band_keys, multilinear_multipliers

if TYPE_CHECKING:
    from .store import Store

Table = npt.NDArray[np.uint64]
"""``(bands, capacity, 2)``: each slot's kept band key and its document id + 1 (0: empty)."""

# A key's first slot: its top 32 bits after a Fibonacci multiply (2**64 / golden ratio,
# which spreads every bit of the key into them), scaled to the capacity (below 2**32).
_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)
_HALF = np.uint64(32)
_MAX_LOAD = 0.8  # a table this full grows to
_GROWN_LOAD = 0.6  # this load (open addressing slows down sharply past 0.8)
_MIN_CAPACITY = 1 << 10
_CHUNK = 8192  # records read and indexed per step while catching up
_NO_KEYS = np.empty((0, 0), dtype=np.uint64)
_NO_MULTIPLIERS = np.empty(0, dtype=np.uint64)


def _insert(table: Table, kept: Table, ids: Table) -> int:
    """Add document ``ids[i]``'s bucket ``kept[i, band]`` to each band; returns the
    number of entries added (an entry already present is not added twice)."""
    bands, capacity = table.shape[0], table.shape[1]
    added = 0
    for i in range(kept.shape[0]):
        tag = ids[i] + np.uint64(1)
        for band in range(bands):
            key = kept[i, band]
            slot = np.int64((((key * _FIBONACCI) >> _HALF) * np.uint64(capacity)) >> _HALF)
            while True:
                found = table[band, slot, 1]
                if found == 0:
                    table[band, slot, 0] = key
                    table[band, slot, 1] = tag
                    added += 1
                    break
                if found == tag and table[band, slot, 0] == key:
                    break
                slot = slot + 1 if slot + 1 < capacity else 0
    return added


def _probe(
    table: Table,
    sigs: npt.NDArray[np.uint32],
    multipliers: Table,
    keep: np.uint64,
    kept: Table,
    out: Table,
    ends: Table,
) -> int:
    """The ids sharing a bucket with each query: query ``q``'s are
    ``out[ends[q - 1]:ends[q]]`` (a document found in several bands appears once per band).

    A query's bucket keys are ``kept[q]`` when ``multipliers`` is empty; otherwise they
    are computed here from ``sigs[q]``, a query's keys and lookups in one call: the
    ``multilinear`` band keys of :mod:`.lsh` (``sum(m[j] * v[j]) mod 2**64`` over each
    band's positions) shifted right by ``keep``, as the layout keeps them.

    Returns how many ids were found; if that exceeds ``len(out)``, ``out`` holds only the
    first ones and the caller asks again with room for all.
    """
    bands, capacity = table.shape[0], table.shape[1]
    queries = len(kept) if len(multipliers) == 0 else len(sigs)
    rows = len(multipliers) // bands
    n = 0
    for q in range(queries):
        for band in range(bands):
            if rows:
                key = np.uint64(0)
                for j in range(band * rows, (band + 1) * rows):
                    key += np.uint64(sigs[q, j]) * multipliers[j]
                key >>= keep
            else:
                key = kept[q, band]
            slot = np.int64((((key * _FIBONACCI) >> _HALF) * np.uint64(capacity)) >> _HALF)
            while True:
                tag = table[band, slot, 1]
                if tag == 0:
                    break
                if table[band, slot, 0] == key:
                    if n < len(out):
                        out[n] = tag - np.uint64(1)
                    n += 1
                slot = slot + 1 if slot + 1 < capacity else 0
        ends[q] = n
    return n


def _rehash(old: Table, table: Table) -> None:
    """Move every entry of ``old`` into the empty, larger ``table``."""
    capacity = table.shape[1]
    for band in range(old.shape[0]):
        for i in range(old.shape[1]):
            tag = old[band, i, 1]
            if tag == 0:
                continue
            key = old[band, i, 0]
            slot = np.int64((((key * _FIBONACCI) >> _HALF) * np.uint64(capacity)) >> _HALF)
            while table[band, slot, 1] != 0:
                slot = slot + 1 if slot + 1 < capacity else 0
            table[band, slot, 0] = key
            table[band, slot, 1] = tag


def _record_signatures(
    buf: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    num_perm: int,
    out: npt.NDArray[np.uint32],
    ok: npt.NDArray[np.bool_],
) -> None:
    """The signatures of the records ``buf[starts[i]:starts[i + 1]]`` (the layout of
    :mod:`.codec`: version, flags, num_perm uint16 LE, key length uint32 LE, key,
    signature). ``ok[i]`` is false for a record that does not parse as one of
    ``num_perm`` values; its checksum is verified when a query reads it."""
    for i in range(len(starts) - 1):
        lo, hi = starts[i], starts[i + 1]
        ok[i] = False
        if hi - lo < codec.RECORD_HEADER_BYTES + 8:
            continue
        perms = np.int64(buf[lo + 2]) | (np.int64(buf[lo + 3]) << 8)
        key_len = np.int64(0)
        for b in range(4):
            key_len |= np.int64(buf[lo + 4 + b]) << (8 * b)
        sig = lo + codec.RECORD_HEADER_BYTES + key_len
        if buf[lo] != codec.RECORD_VERSION or perms != num_perm or sig + 4 * num_perm + 8 > hi:
            continue
        for j in range(num_perm):
            p = sig + 4 * j
            value = np.uint32(0)
            for b in range(4):
                value |= np.uint32(buf[p + b]) << np.uint32(8 * b)
            out[i, j] = value
        ok[i] = True


@functools.cache
def _loops() -> Any:
    return kernels.compile_loops(
        {
            "insert": _insert,
            "probe": _probe,
            "rehash": _rehash,
            "signatures": _record_signatures,
        },
        nogil=False,  # readers and the catching-up thread must not interleave inside a loop
    )


class _Tables:
    """One state of the cache: its hash tables and what they hold.

    Catching up adds entries in place (a superset stays right for every snapshot it
    answered for) or moves them into a larger copy; a state is never emptied in place, so
    a reader holding one is never left with less than its snapshot needs.
    """

    __slots__ = ("entries", "next_id", "table", "unparsed")

    def __init__(self, bands: int, capacity: int = _MIN_CAPACITY) -> None:
        self.table: Table = np.zeros((bands, capacity, 2), dtype=np.uint64)
        self.entries = 0
        self.next_id = 0  # records from this id on are not in the tables yet
        self.unparsed: tuple[bytes, ...] = ()  # ids of damaged records, not in the tables

    def grown(self, entries: int) -> _Tables:
        """These tables, or a larger copy if ``entries`` would fill them past the maximum
        load (sized for the grown load, so that memory follows the entries)."""
        bands, capacity = self.table.shape[0], self.table.shape[1]
        needed = entries // bands
        if needed <= _MAX_LOAD * capacity:
            return self
        copy = _Tables(bands, int(needed / _GROWN_LOAD) + 1)
        _loops().rehash(self.table, copy.table)
        copy.entries, copy.next_id, copy.unparsed = self.entries, self.next_id, self.unparsed
        return copy


class BandCache:
    """Every document's bucket per band, in memory (see the module docstring)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._keep = store._band_layout.kept_shift
        # (snapshot the tables last caught up to, the tables): one attribute, so that a
        # reader never pairs a snapshot with tables made for another.
        self._state: tuple[int, _Tables] = (-1, _Tables(store.banding.bands))

    @property
    def nbytes(self) -> int:
        """Memory held by the hash tables."""
        return int(self._state[1].table.nbytes)

    @property
    def entries(self) -> int:
        """Entries held, those of removed documents included."""
        return self._state[1].entries

    def ready_for(self, txn: lmdb.Transaction, snapshot: int | None = None) -> CacheLookup | None:
        """Lookups that answer for the snapshot ``txn`` reads (after catching up with it),
        or ``None`` if the cache cannot answer for it: an older snapshot, or one holding a
        record the cache could not parse (LMDB's band tables find that document, and
        reading it raises :class:`~.CorruptRecordError`). ``snapshot`` numbers it when
        ``txn.id()`` does not: a write transaction that has not written reads the snapshot
        before its own number."""
        snapshot = txn.id() if snapshot is None else snapshot
        synced, tables = self._state
        if snapshot < synced:
            return None
        if snapshot > synced:
            with self._lock:
                synced, tables = self._state
                if snapshot < synced:
                    return None
                if snapshot > synced:
                    tables = self._catch_up(txn, tables)
                    self._state = (snapshot, tables)
        if tables.unparsed and any(
            txn.get(doc_id, db=self._store._docs_db) is not None for doc_id in tables.unparsed
        ):
            return None
        return CacheLookup(self, tables)

    def kept(self, sigs: npt.NDArray[np.uint32]) -> Table:
        """Each signature's band keys as the cache keys them (the bytes the layout keeps)."""
        store = self._store
        return store._band_layout.kept(band_keys(sigs, store.banding, store.config.seed))

    def _candidates(self, tables: _Tables, sigs: npt.NDArray[np.uint32]) -> tuple[Table, Table]:
        banding = self._store.banding
        if banding.keys == "multilinear":  # keys computed inside the compiled loop
            seed = self._store.config.seed
            multipliers, kept = multilinear_multipliers(seed, banding.width), _NO_KEYS
        else:
            multipliers, kept = _NO_MULTIPLIERS, self.kept(sigs)
        args = (tables.table, sigs, multipliers, self._keep, kept)
        ends = np.empty(len(sigs), dtype=np.uint64)
        out = np.empty(64 * len(sigs), dtype=np.uint64)
        while True:
            found = _loops().probe(*args, out, ends)
            if found <= len(out):
                return out[:found], ends
            # Probe again with room for all. Another thread's catch-up may add entries in
            # between, so only a call whose ids all fit pairs its ids with its ends.
            out = np.empty(found + found // 4, dtype=np.uint64)

    # -- keeping up ------------------------------------------------------------------------------

    def _catch_up(self, txn: lmdb.Transaction, tables: _Tables) -> _Tables:
        """``tables`` with the records of ``txn`` they lack; new tables built from every
        record when removed documents' entries would outnumber the live ones."""
        store = self._store
        bands = store.banding.bands
        live = int(txn.stat(store._docs_db)["entries"])
        if tables.entries > 2 * bands * live + tables.table.shape[1] // 4:
            tables = _Tables(bands)  # readers of the old tables keep them whole
        if tables.entries == 0:
            tables = tables.grown(bands * live)
        with txn.cursor(db=store._docs_db) as cursor:
            if not cursor.set_range(codec.encode_id(tables.next_id)):
                return tables
            ids: list[bytes] = []
            records: list[bytes] = []
            for doc_id, record in cursor.iternext():
                ids.append(doc_id)
                records.append(record)
                if len(ids) == _CHUNK:
                    tables = self._add_records(tables, ids, records)
                    ids, records = [], []
            if ids:
                tables = self._add_records(tables, ids, records)
        return tables

    def _add_records(self, tables: _Tables, ids: list[bytes], records: list[bytes]) -> _Tables:
        num_perm = self._store.config.num_perm
        starts = np.zeros(len(records) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in records], out=starts[1:])
        buf = np.frombuffer(b"".join(records), dtype=np.uint8)
        sigs = np.empty((len(records), num_perm), dtype=np.uint32)
        ok = np.empty(len(records), dtype=np.bool_)
        _loops().signatures(buf, starts, num_perm, sigs, ok)
        doc_ids = codec.decode_ids(ids)
        tables = tables.grown(tables.entries + self._store.banding.bands * int(ok.sum()))
        added = _loops().insert(tables.table, self.kept(sigs[ok]), doc_ids[ok])
        tables.entries += added
        if not ok.all():
            tables.unparsed += tuple(ids[i] for i in np.flatnonzero(~ok).tolist())
        tables.next_id = max(tables.next_id, int(doc_ids[-1]) + 1)
        return tables


class CacheLookup:
    """The cache's lookups for one snapshot it has caught up with."""

    __slots__ = ("_cache", "_tables")

    def __init__(self, cache: BandCache, tables: _Tables) -> None:
        self._cache, self._tables = cache, tables

    def candidates(self, sigs: npt.NDArray[np.uint32]) -> tuple[Table, Table]:
        """Ids sharing a bucket with each of ``sigs`` (rows), as ``(ids, ends)``: row
        ``q``'s are ``ids[ends[q - 1]:ends[q]]``, perhaps repeated, perhaps not in the
        snapshot."""
        return self._cache._candidates(self._tables, sigs)
