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
  on, read in id order from the ``docs`` table. Only a repair breaks this: one that
  restores a damaged ``next_doc_id`` can lower it below ids of removed and purged
  documents, which are then handed out again. The cache starts over when it sees that
  (``next_doc_id`` below its ``next_id``, or another record under the newest id it read;
  a repair in this process resets it outright). A docs key that is no id the cache can
  hold (damage, which the repair moves to a new id) counts as a record it cannot parse.
* Removals are not applied. The cache is a superset of a snapshot's band entries: its
  candidates are read from the snapshot's records like any others, and a candidate with
  no record in the snapshot (removed, or added by a later commit) is skipped.
* A snapshot older than the one the cache last caught up to may hold a document removed
  in between, which the cache never saw: such a snapshot queries through LMDB instead.
  So does a write transaction once it has written: its own documents are in no
  cache. Before its first write it reads the snapshot it began on (numbered one below
  its own transaction id), and the cache catches up with that, never with records the
  transaction wrote, which an abort could hand out again.
* A record the cache cannot parse or whose checksum fails (damage) has no entries in
  it: a snapshot that still holds one queries through LMDB, whose band tables find the
  document under its original buckets and whose read of it raises
  :class:`~.CorruptRecordError`, as without a cache. (Indexed from damaged bytes that
  still parse, it would sit under the wrong buckets: missed where LMDB raises.)

Candidates are the same as LMDB's: the cache keys each entry by the bytes of the band key
the store's :class:`~.codec.BandLayout` keeps (40 bits in formats 4 and 5). Entries of removed
documents stay until they would outnumber the live ones after a catch-up, which then
builds new tables from the records instead.

Each distinct bucket has one slot on the probe paths (its head); a bucket of several
documents chains them through slots of their own, so that boilerplate shared by k
documents costs O(1) an insert and does not lengthen other keys' probes. Memory is 16
bytes a slot per band (a slot a document, one more for each bucket of several), between
60 % and 80 % full (linear probing slows sharply past that): about 190-240 bytes per
document with 9 bands, and up to about 2.5 times that while removed documents' entries
are kept (measured: at most 480 under random replacements, 597 under near-duplicate ones,
whose buckets turn into chains that take a slot more; a growth also holds the old tables
until it is done).
Thread-safe: the compiled loops hold the GIL, catching up is serialised, and a reader
keeps the tables it was handed (a rebuild makes new ones) with the snapshot they were
caught up for. Safe from interrupts too: a compiled insert counts what it added itself,
so a Ctrl-C or a timeout raised as it returns leaves no slot uncounted, and no loop writes
past an array on the strength of a count.
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
"""``(bands, capacity, 2)``, two words a slot (second word 0: empty). A bucket's *head*
holds its kept band key and either its one document's id + 1 or ``_CHAIN`` + the slot
of its newest *member*; a member holds the next (older) member's slot + 1 (0: none) and
``_MEMBER`` + a document's id + 1. Ids are below 2**62."""

# A key's first slot: its top 32 bits after a Fibonacci multiply (2**64 / golden ratio,
# which spreads every bit of the key into them), scaled to the capacity (below 2**32).
_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)
_HALF = np.uint64(32)
_MEMBER = np.uint64(1 << 63)
_CHAIN = np.uint64(1 << 62)
_MAX_LOAD = 0.8  # a table this full grows to
_GROWN_LOAD = 0.6  # this load (open addressing slows down sharply past 0.8)
_MIN_CAPACITY = 1 << 10
_REBUILD_SLACK = _MIN_CAPACITY // 4  # removed entries a band may hold beyond the live ones
_CHUNK = 8192  # records read and indexed per step while catching up
_NO_KEYS = np.empty((0, 0), dtype=np.uint64)
_NO_MULTIPLIERS = np.empty(0, dtype=np.uint64)
# xxh64's primes: a record's checksum is xxh64 (seed 0) of its bytes before it.
_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)
_MINUS_P1 = np.uint64(2**64 - 0x9E3779B185EBCA87)


def _insert(
    table: Table,
    keys: Table,
    tags: Table,
    used: npt.NDArray[np.int64],
    band: int,
    limit: int,
    entries: npt.NDArray[np.int64],
) -> int:
    """Add the entries ``(keys[i], tags[i])`` (tag: a document's id + 1) to one band's
    ``(capacity, 2)`` table, of which ``used[band]`` slots are taken, stopping before an
    entry that could take it past ``limit``. Returns how many entries were done; an entry
    its bucket holds already (a retried catch-up's) is not added twice.

    ``used[band]`` and ``entries[0]`` (entries held) are counted here, not by the caller:
    a signal handler that raises (Ctrl-C, a request timeout) runs when a compiled call
    returns, and must not find the table changed and its counts not.

    A bucket has one head, so each of its k documents costs O(1) to add and the bucket
    one slot on other keys' probe paths; its members lie where ``(key, tag)`` hashes.
    (Linear probing over plain entries kept a key's k entries in one run: O(k) an insert,
    and a run that every probe landing in it had to cross.)
    """
    capacity = table.shape[0]
    size = np.uint64(capacity)
    taken, added = used[band], 0
    done = len(keys)
    for i in range(len(keys)):
        if taken + 2 > limit:  # a bucket of one turning into a chain takes two slots
            done = i
            break
        key, tag = keys[i], tags[i]
        head = np.int64((((key * _FIBONACCI) >> _HALF) * size) >> _HALF)
        while table[head, 1] != 0 and (table[head, 1] >= _MEMBER or table[head, 0] != key):
            head = head + 1 if head + 1 < capacity else 0
        value = table[head, 1]
        if value == 0:  # a new bucket
            table[head, 0], table[head, 1] = key, tag
            taken, added = taken + 1, added + 1
            continue
        if value < _CHAIN:  # a bucket of one: its id moves to a member first
            if value == tag:
                continue
            spot = key ^ (value * _FIBONACCI)  # members spread out, not in one run
            at = np.int64((((spot * _FIBONACCI) >> _HALF) * size) >> _HALF)
            while table[at, 1] != 0:
                at = at + 1 if at + 1 < capacity else 0
            table[at, 0], table[at, 1] = 0, _MEMBER | value
            table[head, 1] = _CHAIN | np.uint64(at)
            taken += 1
        newest = table[head, 1] & ~_CHAIN
        # A chain is in id order. A catch-up interrupted after this band's insert reads
        # its records again: an entry it added then is at the chain's end, among tags no
        # smaller than its own (one comparison when the tag is new, as it usually is).
        at, held = newest, False
        while True:
            member = table[np.int64(at), 1] & ~_MEMBER
            if member <= tag:
                held = member == tag
                break
            if table[np.int64(at), 0] == 0:
                break
            at = table[np.int64(at), 0] - np.uint64(1)
        if held:
            continue
        spot = key ^ (tag * _FIBONACCI)
        at = np.int64((((spot * _FIBONACCI) >> _HALF) * size) >> _HALF)
        while table[at, 1] != 0:
            at = at + 1 if at + 1 < capacity else 0
        table[at, 0], table[at, 1] = newest + np.uint64(1), _MEMBER | tag
        table[head, 1] = _CHAIN | np.uint64(at)
        taken, added = taken + 1, added + 1
    used[band] = taken
    entries[0] += added
    return done


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
    size = np.uint64(capacity)
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
            slot = np.int64((((key * _FIBONACCI) >> _HALF) * size) >> _HALF)
            value = table[band, slot, 1]
            while value != 0 and (value >= _MEMBER or table[band, slot, 0] != key):
                slot = slot + 1 if slot + 1 < capacity else 0
                value = table[band, slot, 1]
            if value != 0 and value < _CHAIN:  # a bucket of one
                if n < len(out):
                    out[n] = value - np.uint64(1)
                n += 1
            elif value != 0:  # a chain, newest member first
                at = value & ~_CHAIN
                while True:
                    if n < len(out):
                        out[n] = (table[band, at, 1] & ~_MEMBER) - np.uint64(1)
                    n += 1
                    at = table[band, at, 0]
                    if at == 0:
                        break
                    at -= np.uint64(1)
        ends[q] = n
    return n


def _band_entries(table: Table, keys: Table, tags: Table) -> int:
    """Every entry of one band's ``(capacity, 2)`` table into ``keys`` and ``tags``, each
    bucket's in the order they were added (so that a rehash keeps each chain's order);
    returns how many the table holds. Only those that fit are written: a larger count
    says that ``keys`` was too short and holds a part, for the caller to ask again."""
    room = len(keys)
    n = 0
    for slot in range(table.shape[0]):
        value = table[slot, 1]
        if value == 0 or value >= _MEMBER:
            continue
        key = table[slot, 0]
        if value < _CHAIN:
            if n < room:
                keys[n], tags[n] = key, value
            n += 1
            continue
        count, at = 0, value & ~_CHAIN
        while True:  # the chain's length first: it lists the newest first
            count += 1
            at = table[at, 0]
            if at == 0:
                break
            at -= np.uint64(1)
        if n + count <= room:
            at = value & ~_CHAIN
            for back in range(n + count - 1, n - 1, -1):
                keys[back], tags[back] = key, table[at, 1] & ~_MEMBER
                at = table[at, 0] - np.uint64(1)
        n += count
    return n


def _record_checksums(
    words: Table, starts: npt.NDArray[np.int64], ok: npt.NDArray[np.bool_]
) -> None:
    """Clear ``ok[i]`` unless the record ``starts[i]:starts[i + 1]`` ends with the xxh64
    (seed 0) of its other bytes, as :mod:`.codec` writes it: a damaged record that still
    parses must not be indexed under the damaged values. ``words[p]`` is the uint64 LE at
    byte ``p`` of the records (:func:`_words`), and a byte is ``words[p] & 0xFF``."""
    lanes = np.empty(4, dtype=np.uint64)
    for i in range(len(starts) - 1):
        lo, end = starts[i], starts[i + 1] - 8
        if end < lo:
            ok[i] = False
            continue
        p, h = lo, _P5
        if end - lo >= 32:
            lanes[0], lanes[1], lanes[2], lanes[3] = _P1 + _P2, _P2, 0, _MINUS_P1
            while p + 32 <= end:
                for lane in range(4):
                    v = lanes[lane] + words[p] * _P2
                    lanes[lane] = ((v << np.uint64(31)) | (v >> np.uint64(33))) * _P1
                    p += 8
            h = np.uint64(0)
            for lane, turn in enumerate((1, 7, 12, 18)):
                v = lanes[lane]
                h += (v << np.uint64(turn)) | (v >> np.uint64(64 - turn))
            for lane in range(4):
                v = lanes[lane] * _P2
                h ^= ((v << np.uint64(31)) | (v >> np.uint64(33))) * _P1
                h = h * _P1 + _P4
        h += np.uint64(end - lo)
        while p + 8 <= end:
            v = words[p] * _P2
            h ^= ((v << np.uint64(31)) | (v >> np.uint64(33))) * _P1
            h = ((h << np.uint64(27)) | (h >> np.uint64(37))) * _P1 + _P4
            p += 8
        if p + 4 <= end:
            h ^= (words[p] & np.uint64(0xFFFFFFFF)) * _P1
            h = ((h << np.uint64(23)) | (h >> np.uint64(41))) * _P2 + _P3
            p += 4
        while p < end:
            h ^= (words[p] & np.uint64(0xFF)) * _P5
            h = ((h << np.uint64(11)) | (h >> np.uint64(53))) * _P1
            p += 1
        h = (h ^ (h >> np.uint64(33))) * _P2
        h = (h ^ (h >> np.uint64(29))) * _P3
        h ^= h >> np.uint64(32)
        ok[i] = ok[i] and h == words[end]


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
            "band_entries": _band_entries,
            "checksums": _record_checksums,
            "signatures": _record_signatures,
        },
        nogil=False,  # readers and the catching-up thread must not interleave inside a loop
    )


def _read_signatures(
    records: list[bytes], num_perm: int
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.bool_]]:
    """The signatures of ``records``, and which records are sound: verified by their
    checksum and parsed as ``num_perm`` values (the other rows are undefined)."""
    starts = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in records], out=starts[1:])
    buf = np.frombuffer(b"".join([*records, bytes(8)]), dtype=np.uint8)
    sigs = np.empty((len(records), num_perm), dtype=np.uint32)
    ok = np.empty(len(records), dtype=np.bool_)
    _loops().signatures(buf, starts, num_perm, sigs, ok)
    _loops().checksums(_words(buf), starts, ok)
    return sigs, ok


def _words(buf: npt.NDArray[np.uint8]) -> Table:
    """The uint64 LE at each byte of ``buf`` but its last 7 (unaligned, overlapping): the
    checksum reads 8 bytes a load, not one byte at a time (5x faster)."""
    return np.ndarray((len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))


class _Tables:
    """One state of the cache: its hash tables and what they hold.

    Catching up adds entries in place (a superset stays right for every snapshot it
    answered for) or moves them into a larger copy; a state is never emptied in place, so
    a reader holding one is never left with less than its snapshot needs.
    """

    __slots__ = ("_entries", "newest", "next_id", "table", "unparsed", "used")

    def __init__(self, bands: int, capacity: int = _MIN_CAPACITY) -> None:
        self.table: Table = np.zeros((bands, capacity, 2), dtype=np.uint64)
        # Slots taken in each band, and entries held: counted by the compiled insert.
        self.used = np.zeros(bands, dtype=np.int64)
        self._entries = np.zeros(1, dtype=np.int64)
        self.next_id = 0  # records from this id on are not in the tables yet
        self.newest = b""  # the record of id next_id - 1 as read (to tell if it changed)
        self.unparsed: tuple[bytes, ...] = ()  # keys of damaged records, not in the tables

    @property
    def entries(self) -> int:
        """Entries held, those of removed documents included."""
        return int(self._entries[0])

    @property
    def limit(self) -> int:
        """Slots a band may take before its table must grow."""
        return int(_MAX_LOAD * self.table.shape[1])

    def grown(self, slots: int) -> _Tables:
        """These tables, or a larger copy if a band taking ``slots`` would fill them past
        the maximum load (sized for the grown load, so that memory follows the entries)."""
        if slots <= self.limit:
            return self
        bands = self.table.shape[0]
        copy = _Tables(bands, int(slots / _GROWN_LOAD) + 1)
        keys = np.empty(int(self.used.max()), dtype=np.uint64)
        tags = np.empty_like(keys)
        for band in range(bands):
            count = _loops().band_entries(self.table[band], keys, tags)
            if count > len(keys):  # more than the counts said: never guess, ask again
                keys, tags = np.empty(count, dtype=np.uint64), np.empty(count, dtype=np.uint64)
                count = _loops().band_entries(self.table[band], keys, tags)
            copy.add(band, keys[:count], tags[:count])
        copy.next_id, copy.newest, copy.unparsed = self.next_id, self.newest, self.unparsed
        return copy

    def add(self, band: int, keys: Table, tags: Table) -> int:
        """Add the entries ``(keys[i], tags[i])`` to ``band`` in place; returns how many
        were done: fewer than all when the band is full, which must grow first."""
        done = _loops().insert(
            self.table[band], keys, tags, self.used, band, self.limit, self._entries
        )
        return int(done)

    def with_documents(self, kept: Table, tags: Table) -> _Tables:
        """These tables, or a larger copy, with the band keys ``kept`` (a row each) of the
        documents ``tags`` (ids + 1)."""
        tables = self.grown(int(self.used.max()) + len(tags))
        for band, keys in enumerate(np.ascontiguousarray(kept.T)):
            done = tables.add(band, keys, tags)
            while done < len(keys):  # a bucket turning into a chain takes two slots
                tables = tables.grown(int(tables.used[band]) + len(keys) - done + 2)
                done += tables.add(band, keys[done:], tags[done:])
        return tables


class BandCache:
    """Every document's bucket per band, in memory (see the module docstring)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._keep = store._band_layout.kept_shift
        # Ids the tables can hold (a tag is an id + 1, below _CHAIN) and the layout keeps.
        self._id_limit = min(store._band_layout.id_limit, int(_CHAIN) - 1)
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
        record the cache could not parse or verify (LMDB's band tables find that document,
        and reading it raises :class:`~.CorruptRecordError`). ``snapshot`` numbers it when
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
        record when the snapshot's history is not the one they were built from, or when
        removed documents' entries would outnumber the live ones."""
        bands = self._store.banding.bands
        live = int(txn.stat(self._store._docs_db)["entries"])
        if self._rewritten(txn, tables) or self._crowded(tables, live):
            tables = _Tables(bands)  # readers of the old tables keep them whole
        if tables.entries == 0:
            tables = tables.grown(live)
        tables = self._read_from(txn, tables)
        if self._crowded(tables, live):  # the records just added tipped it
            tables = self._read_from(txn, _Tables(bands).grown(live))
        return tables

    def _crowded(self, tables: _Tables, live: int) -> bool:
        """Whether entries of removed documents outnumber the ``live`` ones' (by more than
        a few hundred a band, so that a small store is not rebuilt at every catch-up)."""
        bands = self._store.banding.bands
        return tables.entries > bands * (2 * live + _REBUILD_SLACK)

    def _rewritten(self, txn: lmdb.Transaction, tables: _Tables) -> bool:
        """Whether ``txn`` may hold records under ids below the tables' ``next_id`` that
        they never read: ids are never handed out twice, except after a repair
        (``check --repair``, perhaps by another process) lowered ``next_doc_id`` from a
        damaged value, which hands out again the ids of removed and purged documents.
        Seen as ``next_doc_id`` below ``next_id``, or as another record under the newest
        id the tables read (in ``docs``, or in ``removed`` awaiting a purge). Not seen if
        that id's new document was removed and purged too before this catch-up."""
        if tables.next_id == 0:
            return False
        store = self._store
        next_doc_id = codec.read_meta(txn, store._meta_db, "next_doc_id")  # None if damaged
        if type(next_doc_id) is int and 0 <= next_doc_id < tables.next_id:
            return True
        newest = codec.encode_id(tables.next_id - 1)
        record = txn.get(newest, db=store._docs_db)
        if record is None and store._removed_db is not None:
            record = txn.get(newest, db=store._removed_db)
        return record is not None and bytes(record) != tables.newest

    def _read_from(self, txn: lmdb.Transaction, tables: _Tables) -> _Tables:
        """``tables`` with the records of ``txn`` from their ``next_id`` on."""
        with txn.cursor(db=self._store._docs_db) as cursor:
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
        sigs, ok = _read_signatures(records, self._store.config.num_perm)
        doc_ids, is_id = self._ids(ids)
        ok &= is_id
        tables = tables.with_documents(self.kept(sigs[ok]), doc_ids[ok] + np.uint64(1))
        if not ok.all():
            known = set(tables.unparsed)
            bad = [bytes(ids[i]) for i in np.flatnonzero(~ok).tolist()]
            tables.unparsed += tuple(doc_id for doc_id in bad if doc_id not in known)
        valid = np.flatnonzero(is_id)  # the largest id is the last key that is one (ids
        last = int(valid[-1]) if len(valid) else -1  # sort as numbers)
        if last >= 0 and int(doc_ids[last]) >= tables.next_id:
            newest, next_id = bytes(records[last]), int(doc_ids[last]) + 1
            tables.newest, tables.next_id = newest, next_id  # (no call between: no signal)
        return tables

    def _ids(self, keys: list[bytes]) -> tuple[Table, npt.NDArray[np.bool_]]:
        """The ids of the docs ``keys``, and which keys are ids the tables can hold: any
        other (damage, which check reports and its repair moves) is a record the cache
        cannot parse, which must neither raise here nor move ``next_id``."""
        if set(map(len, keys)) == {codec.ID_BYTES}:
            doc_ids = codec.decode_ids(keys)
            return doc_ids, doc_ids < np.uint64(self._id_limit)
        is_id = np.array([len(key) == codec.ID_BYTES for key in keys], dtype=np.bool_)
        doc_ids = np.zeros(len(keys), dtype=np.uint64)
        doc_ids[is_id] = codec.decode_ids(keys[i] for i in np.flatnonzero(is_id).tolist())
        return doc_ids, is_id & (doc_ids < np.uint64(self._id_limit))


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
