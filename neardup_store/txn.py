"""Read and write transactions: every document operation runs inside one.

A :class:`ReadTxn` is a consistent snapshot: nothing another process commits after it
began is visible, so a query never sees half of a write. A :class:`WriteTxn` adds the
writing operations; all of them commit together or not at all. Inputs are validated and
signatures computed *before* the first write of an operation, and an operation that fails
after writing has begun poisons the transaction, so a caller that catches the error cannot
commit half a document.

When the LMDB map fills up, the store grows it and the transaction is redone: every
operation is logged with its result and replayed in a fresh transaction; if the replay's
results differ (another process committed in between), the transaction fails with
:class:`TransactionConflictError` instead of silently changing meaning.
"""

from __future__ import annotations

import dataclasses
import itertools
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

import lmdb
import numpy as np
import numpy.typing as npt
import xxhash

from . import _faults, codec
from .errors import (
    BAD_ID_ADVICE,
    MISSING_RECORD_ADVICE,
    PURGE_ADVICE,
    CorruptRecordError,
    DocumentError,
    DuplicateKeyError,
    ForkedStoreError,
    IdsExhaustedError,
    InvalidItemError,
    InvalidKeyError,
    InvalidParameterError,
    KeyNotFoundError,
    MetadataError,
    NeardupError,
    StoreClosedError,
    TransactionAbortedError,
    TransactionConflictError,
    after_commit,
    check_flags,
    integer,
)
from .lsh import LSHParams, band_keys
from .similarity import hashed_jaccard
from .text import ShingleBatch, Shingler, check_batch, single_document

if TYPE_CHECKING:
    from .band_cache import CacheLookup
    from .store import Store

Key = str | bytes

# What each batch call takes, and the call for one item, for :func:`check_batch`.
TEXT_ITEMS = ("(key, text) items", "add()")
SIGNATURE_ITEMS = ("(key, signature) items", "add(key, signature=...)")
UNIQUE_TEXT_ITEMS = ("(key, text) items", "add_if_unique()")
UNIQUE_SIGNATURE_ITEMS = ("(key, signature) items", "add_if_unique(key, signature=...)")
KEYS = ("keys", "remove()")
UNIQUE_STORED_KEY = "the *_if_unique calls never overwrite a stored key: remove it first"
"""What to do about a stored key in a call that takes no ``replace``."""


@dataclass(frozen=True)
class Match:
    """A stored document similar to a query.

    Attributes:
        key: the stored document's key.
        score: estimated Jaccard similarity (fraction of equal signature values).
        exact: exact Jaccard of the shingle sets, when exact verification was asked for.
    """

    key: Key
    score: float
    exact: float | None = None


@dataclass(frozen=True, eq=False)
class Document:
    """A stored document: its key, signature and user metadata."""

    key: Key
    signature: npt.NDArray[np.uint32]
    metadata: Any

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Document):
            return NotImplemented
        return (
            self.key == other.key
            and np.array_equal(self.signature, other.signature)
            and self.metadata == other.metadata
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Document(key={self.key!r}, signature=<{len(self.signature)} x uint32>, "
            f"metadata={self.metadata!r})"
        )


@dataclass(frozen=True)
class UniqueResult:
    """Outcome of ``add_if_unique``: added, or the near-duplicates that prevented it."""

    key: Key
    added: bool
    matches: list[Match]


class _Prepared(NamedTuple):
    """A validated document ready to write: nothing here can fail any more."""

    key: Key
    raw_key: bytes
    is_str: bool
    signature: npt.NDArray[np.uint32]
    band_keys: list[bytes]  # 8 big-endian bytes each
    metadata: bytes | None
    index: bytes  # the ``keys`` table key (codec.key_index)


@dataclass(frozen=True, eq=False)
class _PreparedBatch:
    """A validated batch, column by column (nothing here can fail any more): the batch
    writer takes the columns whole, the one-at-a-time paths take :meth:`docs`."""

    keys: list[Key]
    raw_keys: list[bytes]
    str_keys: list[bool]
    indexes: list[bytes]  # the ``keys`` table keys (codec.key_index)
    metadata: list[bytes | None]
    signatures: npt.NDArray[np.uint32]  # (n, num_perm)
    band_keys: npt.NDArray[np.uint64]  # (n, bands)
    banding: LSHParams  # what the band keys were made for

    def __len__(self) -> int:
        return len(self.keys)

    def take(self, rows: Sequence[int]) -> _PreparedBatch:
        """The documents at ``rows``, in that order."""
        return _PreparedBatch(
            keys=[self.keys[i] for i in rows],
            raw_keys=[self.raw_keys[i] for i in rows],
            str_keys=[self.str_keys[i] for i in rows],
            indexes=[self.indexes[i] for i in rows],
            metadata=[self.metadata[i] for i in rows],
            signatures=self.signatures[list(rows)],
            band_keys=self.band_keys[list(rows)],
            banding=self.banding,
        )

    def docs(self) -> list[_Prepared]:
        """One :class:`_Prepared` per document."""
        columns = (self.keys, self.raw_keys, self.str_keys, self.signatures)
        rows = codec.band_key_bytes(self.band_keys)
        return [
            _Prepared(*fields, row, meta, index)
            for *fields, row, meta, index in zip(
                *columns, rows, self.metadata, self.indexes, strict=True
            )
        ]


class ReadTxn:
    """A consistent snapshot of the store: ``get``, ``query``, iteration, counts."""

    def __init__(self, store: Store, txn: lmdb.Transaction) -> None:
        self._store = store
        self._txn: lmdb.Transaction | None = txn
        self._band_cursors: list[lmdb.Cursor] = []
        self.epoch = store.map_epoch

    # -- plumbing ------------------------------------------------------------------------

    @property
    def txn(self) -> lmdb.Transaction:
        """The LMDB transaction, for callers that read the tables directly."""
        return self._live

    @property
    def _live(self) -> lmdb.Transaction:
        """The LMDB transaction, checked to be open (this package's own reads use it) and
        to be this process's (one carried across ``fork()`` reads pages the parent's
        writers may have handed out again)."""
        if self._store._forked():
            raise ForkedStoreError(str(self._store.path))
        if self._txn is None:
            raise StoreClosedError("transaction")
        if self.epoch != self._store.map_epoch:
            raise StoreClosedError(
                "read transaction (the map grew while it was open, which ends it; begin a new one)"
            )
        return self._txn

    def _require_open(self) -> lmdb.Transaction:
        """:attr:`_live`, asked first by every batch call: an empty batch reads nothing,
        and would otherwise answer on an ended transaction as if it were open, where a
        full one raises."""
        return self._live

    def _band_cursor(self, band: int) -> lmdb.Cursor:
        return self._all_band_cursors()[band]

    def _all_band_cursors(self) -> list[lmdb.Cursor]:
        """Every band's cursor, in band order, opened once per LMDB transaction."""
        txn = self._live  # even kept cursors: their transaction may have ended (map growth)
        if not self._band_cursors:
            self._band_cursors.extend(txn.cursor(db=db) for db in self._store._band_dbs)
        return self._band_cursors

    def _close(self) -> None:
        self._close_cursors()
        self._txn = None

    def _close_cursors(self) -> None:
        """Close the band cursors, which belong to the LMDB transaction that is ending."""
        for cursor in self._band_cursors:
            cursor.close()
        self._band_cursors.clear()

    def _lookup(self, key: object) -> tuple[bytes, bytes] | None:
        """``(id bytes, key index)`` of a stored key, or ``None``."""
        raw, is_str = codec.key_bytes(key)
        index = codec.key_index(raw, is_str)
        found = self._live.get(index, db=self._store._keys_db)
        if found is None:
            return None
        if len(raw) > codec.INLINE_KEY_BYTES:  # hashed index: confirm against the record
            record = self._live.get(found, db=self._store._docs_db)
            if record is None or codec.record_key(record, codec.decode_id(found)) != (raw, is_str):
                return None
        return found, index

    def _record(self, doc_id: bytes) -> bytes:
        record = self._live.get(doc_id, db=self._store._docs_db)
        if record is None:
            raise CorruptRecordError(
                codec.decode_id(doc_id), "indexed but missing", MISSING_RECORD_ADVICE
            )
        return bytes(record)

    # -- reading -------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._live.stat(self._store._docs_db)["entries"])

    def __contains__(self, key: object) -> bool:
        return self._lookup(key) is not None

    def get(self, key: Key) -> Document:
        """The stored signature and metadata of ``key``.

        Raises:
            KeyNotFoundError: the key is not stored (also a ``KeyError``).
        """
        found = self._lookup(key)
        if found is None:
            raise KeyNotFoundError(key, "ask `key in store` first to tell")
        record = codec.decode_record(self._record(found[0]), codec.decode_id(found[0]))
        return Document(record.key, record.signature, record.metadata)

    def keys(self) -> Iterator[Key]:
        """Every stored key, in insertion order (of this snapshot). In a write block, the
        keys stored when the iteration began: what the loop adds or replaces is not
        yielded (a replacement is a new document, after them).

        Raises:
            StoreClosedError: the iterator was read on after its transaction ended (the
                block closed, or a map growth replaced a writer's transaction).
        """
        for _, key in self._key_rows():
            yield key

    def _key_rows(
        self, after: bytes | None = None, until: bytes | None = None
    ) -> Iterator[tuple[bytes, Key]]:
        """``(document id, key)`` of every stored document, in id order, from the first
        id past ``after`` (from the first if ``None``) up to ``until`` (to the last if
        ``None``)."""
        txn = self._live
        with txn.cursor(db=self._store._docs_db) as cursor:
            step = cursor.first if after is None else (lambda: cursor.set_range(after))
            while True:
                if self._store._forked():  # each step: the iterator may cross a fork()
                    raise ForkedStoreError(str(self._store.path))
                try:
                    found = step()
                    if found and after is not None and cursor.key() == after:
                        found = cursor.next()
                    after = None
                    step = cursor.next
                    if not found or (until is not None and cursor.key() > until):
                        return
                    raw_id, record = cursor.item()
                except lmdb.Error:
                    if self._txn is txn and self.epoch == self._store.map_epoch:
                        raise
                    raise StoreClosedError(
                        "transaction under this key iterator (its block ended, or a map "
                        "growth replaced it)"
                    ) from None
                raw, is_str = codec.record_key(record, codec.decode_id(raw_id))
                yield raw_id, raw.decode("utf-8") if is_str else raw

    __iter__ = keys

    def query(
        self,
        document: object = None,
        *,
        signature: npt.ArrayLike | None = None,
        threshold: float | None = None,
        limit: int | None = None,
        exact: Callable[[Key], str] | None = None,
        encoding: str | None = None,
    ) -> list[Match]:
        """Stored documents similar to ``document`` (text) or to ``signature``.

        Candidates are the documents that share a band key with the query; each is then
        verified against its stored signature. Matches are sorted best first.

        Args:
            threshold: minimum estimated Jaccard (default: the store's threshold).
                Candidates only come from the bands, so a threshold far below the
                store's misses most of the pairs it would admit.
            limit: keep at most this many matches.
            exact: ``key -> text`` of stored documents. Every band candidate is then
                checked by the exact Jaccard of the shingle sets, which decides
                membership (reported as ``Match.exact``); needs a text query.

        Raises:
            InvalidParameterError: bad threshold, limit, exact or encoding, both or
                neither of document and signature, or a signature of the wrong shape.
            InvalidSignatureError: a signature whose values are not uint32 integers.
            InputTypeError: a document that is not a str (nor bytes with ``encoding``).
            TextDecodeError: bytes that are not valid in ``encoding``.
            EmptyDocumentError: a text with nothing left to shingle once normalised.
            StoreClosedError: the transaction's block has ended.
        """
        _check_one_of(document, signature, "document/signature")
        if exact is not None and document is None:
            raise InvalidParameterError("exact", "with signature=", "a text query")
        if document is not None:
            with single_document():
                return self.query_many(
                    [document], threshold=threshold, limit=limit, exact=exact, encoding=encoding
                )[0]
        sig = self._store._check_signature(signature)
        return self._query_signatures(sig[None, :], threshold, limit)[0]

    def query_many(
        self,
        documents: Iterable[object] | None = None,
        *,
        signatures: npt.ArrayLike | None = None,
        threshold: float | None = None,
        limit: int | None = None,
        exact: Callable[[Key], str] | None = None,
        encoding: str | None = None,
    ) -> list[list[Match]]:
        """:meth:`query` for many texts (signed in one batch) or many signatures."""
        self._require_open()
        _check_one_of(documents, signatures, "documents/signatures")
        if exact is not None and not callable(exact):
            raise InvalidParameterError(
                "exact", type(exact).__name__, "a function from a stored key to its text"
            )
        if exact is not None and documents is None:  # as query() refuses it
            raise InvalidParameterError("exact", "with signatures=", "text queries")
        if documents is not None:
            check_batch(documents, "documents", "query()")
            texts = list(documents) if exact is not None else documents
            sigs = self._store.hasher.signatures(texts, encoding)
        elif isinstance(signatures, (list, tuple)) and not signatures:
            # An empty batch has no shape to check, but its options are checked as a
            # full batch's are: a bad threshold must not pass while the batch is empty.
            self._store._check_threshold(threshold)
            _check_limit(limit)
            return []
        else:
            sigs = self._store._check_signatures(signatures)
            texts = None
        if texts is None or exact is None:
            return self._query_signatures(sigs, threshold, limit)
        return self._query_exact(texts, sigs, threshold, limit, exact, encoding)

    def _query_signatures(
        self,
        sigs: npt.NDArray[np.uint32],
        threshold: float | None,
        limit: int | None,
    ) -> list[list[Match]]:
        threshold = self._store._check_threshold(threshold)
        limit = _check_limit(limit)
        if len(sigs) == 1:
            return [self._query_one(sigs[0], threshold, limit)]
        scored = self._scored_many(sigs, threshold)
        matches: list[list[Match]] = [[] for _ in range(len(sigs))]
        for query, doc_id, score in scored.hits():
            found = matches[query]
            if limit is None or len(found) < limit:
                found.append(Match(self._key_of(doc_id, scored.records), score))
        return matches

    def _scored_many(self, sigs: npt.NDArray[np.uint32], threshold: float) -> _Scored:
        """Each signature's stored near-duplicates, and the candidates' records, read once
        here, for the matches' keys.

        The batch's candidates and hits stay numpy arrays of ``(query, id)`` pairs: a
        container per query or per hit would be thousands of objects living as long as
        the call, which Python's cyclic collector walks over and over (``tools/README.md``,
        "Batch queries and the garbage collector").
        """
        askers, ids, records = self._candidate_pairs(sigs)
        if not len(ids):
            return _Scored.nothing(records)
        distinct, rows = np.unique(ids, return_inverse=True)
        wanted = codec.encode_ids(distinct)
        # Every candidate's signature is read and checked once, however many queries of
        # the batch share it; all (query, candidate) pairs are then one comparison.
        live = self._live_records(wanted, records)
        if len(live) < len(wanted):  # removed documents whose band entries await a purge
            if not live:
                return _Scored.nothing(records)
            alive = np.fromiter((doc_id in records for doc_id in wanted), bool, len(wanted))
            stays = alive[rows]
            askers, rows = askers[stays], (np.cumsum(alive) - 1)[rows[stays]]
            wanted = [doc_id for doc_id, _ in live]
        stored = codec.decode_signatures(live, self._store.config.num_perm)
        num_perm = stored.shape[1]
        parts = []
        for lo in range(0, len(rows), _PAIRS_PER_COMPARISON):
            asker, row = (
                askers[lo : lo + _PAIRS_PER_COMPARISON],
                rows[lo : lo + _PAIRS_PER_COMPARISON],
            )
            scores = np.count_nonzero(stored[row] == sigs[asker], axis=1) / num_perm
            hits = np.flatnonzero(scores >= threshold)
            parts.append((asker[hits], row[hits], scores[hits]))
        queries, at, score = (np.concatenate(part) for part in zip(*parts, strict=True))
        # By query, then score descending, then id (``wanted`` is in id order).
        order = np.lexsort((at, -score, queries))
        return _Scored(queries[order], at[order], score[order], wanted, records)

    def _query_one(
        self, sig: npt.NDArray[np.uint32], threshold: float, limit: int | None
    ) -> list[Match]:
        """One signature's matches: the same answer as a batch of one, with less overhead
        (each candidate's record is read and verified once, for its key and signature)."""
        cache = self._band_cache()
        if cache is None:
            found = self._live_records(self._candidates_of(sig))
        else:
            ids, _ = cache.candidates(sig[None, :])
            distinct = map(codec.encode_id, set(ids.tolist()))
            found = self._cached_records(distinct).items() if len(ids) else ()
        if not found:
            return []
        num_perm = len(sig)
        scored = []
        for doc_id, record in found:
            raw, is_str, stored = codec.record_key_and_signature(record, codec.decode_id(doc_id))
            score = int(np.count_nonzero(stored == sig)) / num_perm
            if score >= threshold:
                scored.append((score, doc_id, raw.decode("utf-8") if is_str else raw))
        scored.sort(key=lambda item: (-item[0], item[1]))
        return [Match(key, score) for score, _, key in scored[:limit]]

    def _query_exact(
        self,
        texts: Sequence[object],
        sigs: npt.NDArray[np.uint32],
        threshold: float | None,
        limit: int | None,
        source: Callable[[Key], str],
        encoding: str | None,
    ) -> list[list[Match]]:
        threshold = self._store._check_threshold(threshold)
        limit = _check_limit(limit)
        shingler = self._store.hasher.shingler
        results: list[list[Match]] = []
        # Chunks bound the memory of candidate texts; within one, every text (query or
        # candidate) is shingled once in one batch, however many queries share it.
        for lo in range(0, len(texts), _EXACT_CHUNK):
            chunk, chunk_sigs = texts[lo : lo + _EXACT_CHUNK], sigs[lo : lo + _EXACT_CHUNK]
            mine = shingler.hash_batch(chunk, encoding, lo)
            hits = self._scored_many(chunk_sigs, 0.0)
            records = hits.records
            # In id order, which the sorts below keep among ties.
            scored = [sorted(found) for found in hits.by_query(len(chunk))]
            keys = {
                doc_id: self._key_of(doc_id, records) for found in scored for doc_id, _ in found
            }
            order = {doc_id: n for n, doc_id in enumerate(keys)}
            theirs = _source_shingles(shingler, source, list(keys.values())) if keys else None
            for query, found_ids in enumerate(scored):
                found = []
                for doc_id, score in found_ids:
                    assert theirs is not None
                    exact = hashed_jaccard(mine.document(query), theirs.document(order[doc_id]))
                    if exact >= threshold:
                        found.append(Match(keys[doc_id], score, exact))
                found.sort(key=lambda m: (-(m.exact or 0.0), -m.score))
                results.append(found[:limit] if limit is not None else found)
        return results

    # -- shared machinery ----------------------------------------------------------------

    def _band_key_rows(self, sigs: npt.NDArray[np.uint32]) -> list[list[bytes]]:
        store = self._store
        keys = band_keys(sigs, store.banding, store.config.seed)
        return codec.band_key_bytes(keys)  # type: ignore[return-value]

    def _bucket(self, band: int, band_key: bytes) -> list[bytes]:
        """The ids in ``band_key``'s bucket of ``band`` (one B-tree descent)."""
        bucket = self._store._band_layout.bucket(band_key)
        return self._bucket_ids([(self._band_cursor(band), bucket)])

    def _bucket_ids(
        self,
        lookups: Iterable[tuple[lmdb.Cursor, tuple[bytes, bytes]]],
        counts: list[int] | None = None,
    ) -> list[bytes]:
        """The ids in the buckets ``(table key, lead)``, each read through its cursor, one
        after another; ``counts``, if given, receives how many each bucket held.

        The same steps serve every :class:`~neardup_store.codec.BandLayout`: seek the
        first value at or after the lead (LMDB orders a prefix before its extensions; id 0
        when the table key is the whole band key) and read values while they lead with
        it. The usual miss is told by one comparison, without an iterator.
        """
        layout = self._store._band_layout
        lowest, pad = layout.lowest_value, layout.id_pad
        ids: list[bytes] = []
        for cursor, (table_key, lead) in lookups:
            before = len(ids)
            if cursor.set_range_dup(table_key, lead or lowest) and cursor.value().startswith(lead):
                width = len(lead)
                for value in cursor.iternext_dup(keys=False, values=True):
                    if not value.startswith(lead):
                        break
                    ids.append(pad + value[width:])
            if counts is not None:
                counts.append(len(ids) - before)
        return ids

    def _candidates(self, keys: Sequence[bytes]) -> set[bytes]:
        """Candidate ids of one query, given its band keys (8 bytes each)."""
        buckets = map(self._store._band_layout.bucket, keys)
        return set(self._bucket_ids(zip(self._all_band_cursors(), buckets, strict=True)))

    def _candidates_of(self, sig: npt.NDArray[np.uint32]) -> set[bytes]:
        """:meth:`_candidates` of one signature, the path of a single query: its buckets
        made in one numpy pass, each band's cursor kept for the whole transaction."""
        store = self._store
        keys = band_keys(sig, store.banding, store.config.seed)[0]
        buckets = store._band_layout.buckets(keys)
        return set(self._bucket_ids(zip(self._all_band_cursors(), buckets, strict=True)))

    def _band_cache(self) -> CacheLookup | None:
        """The store's band cache for this snapshot, if it can answer for it (caught up
        first)."""
        cache = self._store._band_cache
        return None if cache is None else cache.ready_for(self._live)

    def _cached_records(self, ids: Iterable[bytes]) -> dict[bytes, bytes]:
        """The records, by id, of the band cache's candidates ``ids`` (distinct, encoded)
        that this snapshot holds (the cache also keeps removed documents and may know
        newer ones)."""
        txn, docs = self._live, self._store._docs_db
        found = {}
        for doc_id in ids:
            record = txn.get(doc_id, db=docs)
            if record is not None:
                found[doc_id] = record
        return found

    def _candidate_pairs(
        self, sigs: npt.NDArray[np.uint32]
    ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.uint64], dict[bytes, bytes]]:
        """Each ``(query, candidate id)`` pair of ``sigs`` once, as two arrays, and the
        records already read on the way: from the band cache when it can answer for this
        snapshot (which reads each candidate's record to drop those the snapshot lacks),
        else from the band tables (each distinct bucket read once, no records)."""
        cache = self._band_cache()
        if cache is None:
            store = self._store
            keys = band_keys(sigs, store.banding, store.config.seed)
            askers, ids = self._candidates_many(keys)
            records: dict[bytes, bytes] = {}
        else:
            ids, ends = cache.candidates(sigs)
            askers = np.repeat(np.arange(len(sigs)), np.diff(ends.astype(np.intp), prepend=0))
            distinct = np.unique(ids)
            records = self._cached_records(codec.encode_ids(distinct))
            if len(records) < len(distinct):
                present = np.isin(ids, codec.decode_ids(records))
                askers, ids = askers[present], ids[present]
        return *_distinct_pairs(askers, ids), records

    def _candidates_many(
        self, keys: npt.NDArray[np.uint64]
    ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.uint64]]:
        """``(query, candidate id)`` pairs of many queries (one row of band keys each),
        perhaps repeated: each distinct bucket of a band read once, in table order through
        the band's one cursor (neighbouring lookups share pages), and handed to every
        query that has it by numpy, not by a container per query."""
        layout = self._store._band_layout
        askers: list[npt.NDArray[np.intp]] = []
        found: list[npt.NDArray[np.uint64]] = []
        for band in range(keys.shape[1]):
            _, first, bucket_of = np.unique(
                layout.kept(keys[:, band]), return_index=True, return_inverse=True
            )
            cursor = self._band_cursor(band)
            counts: list[int] = []
            ids = self._bucket_ids(
                ((cursor, bucket) for bucket in layout.buckets(keys[first, band])), counts
            )
            if not ids:
                continue
            # Each query's bucket's ids: where they start among ``ids``, and how many.
            starts = (np.cumsum(counts) - counts)[bucket_of]
            sizes = np.array(counts, dtype=np.intp)[bucket_of]
            taken = np.repeat(starts - np.cumsum(sizes) + sizes, sizes) + np.arange(sizes.sum())
            askers.append(np.repeat(np.arange(len(keys)), sizes))
            found.append(codec.decode_ids(ids)[taken])
        if not found:
            return np.empty(0, dtype=np.intp), np.empty(0, dtype=np.uint64)
        return np.concatenate(askers), np.concatenate(found)

    def _live_records(
        self, ids: Iterable[bytes], records: dict[bytes, bytes] | None = None
    ) -> list[tuple[bytes, bytes]]:
        """``(id, record)`` of the band candidates ``ids`` that are stored documents.

        A candidate without a record is a removed document whose band entries await a
        purge, and is skipped; one that is not in ``removed`` either is damage, and
        raises. ``records``, if given, holds records already read and receives those
        read here.
        """
        txn, docs = self._live, self._store._docs_db
        found = []
        for doc_id in ids:
            record = records.get(doc_id) if records is not None else None
            if record is None:
                record = txn.get(doc_id, db=docs)
                if record is None:
                    self._check_removed(doc_id)
                    continue
                if records is not None:
                    records[doc_id] = record
            found.append((doc_id, record))
        return found

    def _check_removed(self, doc_id: bytes) -> None:
        """Raise unless ``doc_id`` is a removed document awaiting a purge."""
        removed = self._store._removed_db
        if removed is None or self._live.get(doc_id, db=removed) is None:
            raise CorruptRecordError(
                codec.decode_id(doc_id), "indexed but missing", MISSING_RECORD_ADVICE
            )

    def awaiting_purge(self) -> int:
        """How many removed documents still have band entries for a purge to delete (a
        count LMDB keeps, so asking costs no walk): what :meth:`Store.purge` would purge
        as of this snapshot."""
        removed = self._store._removed_db
        return 0 if removed is None else int(self._live.stat(removed)["entries"])

    def _verify(
        self, sig: npt.NDArray[np.uint32], ids: Iterable[bytes], threshold: float
    ) -> list[tuple[bytes, float]]:
        rows = self._live_records(sorted(ids))
        if not rows:
            return []
        stored = codec.decode_signatures(rows, self._store.config.num_perm)
        scores = np.count_nonzero(stored == sig, axis=1) / stored.shape[1]
        return [(i, float(s)) for (i, _), s in zip(rows, scores, strict=True) if s >= threshold]

    def _key_of(self, doc_id: bytes, records: dict[bytes, bytes] | None = None) -> Key:
        """The key of document ``doc_id``, from ``records`` if it holds its record."""
        record = records.get(doc_id) if records else None
        if record is None:
            record = self._record(doc_id)
        raw, is_str = codec.record_key(record, codec.decode_id(doc_id))
        return raw.decode("utf-8") if is_str else raw


_EXACT_CHUNK = 1000  # queries per batch of exact re-verification
_PAIRS_PER_COMPARISON = 8192  # (query, candidate) pairs compared at once: 8 MB at 256 values


class _Scored(NamedTuple):
    """The hits of a batch query: ``(query, row, score)`` as three arrays, by query, then
    score descending, then id; ``ids[row]`` is the stored document's id, ``records`` holds
    the records read on the way (by id)."""

    queries: npt.NDArray[np.intp]
    rows: npt.NDArray[np.intp]
    scores: npt.NDArray[np.float64]
    ids: list[bytes]
    records: dict[bytes, bytes]

    @classmethod
    def nothing(cls, records: dict[bytes, bytes]) -> _Scored:
        empty = np.empty(0, dtype=np.intp)
        return cls(empty, empty, np.empty(0), [], records)

    def hits(self) -> Iterator[tuple[int, bytes, float]]:
        """``(query, id, score)`` of every hit, in order."""
        ids = self.ids
        for query, row, score in zip(
            self.queries.tolist(), self.rows.tolist(), self.scores.tolist(), strict=True
        ):
            yield query, ids[row], score

    def by_query(self, count: int) -> list[Sequence[tuple[bytes, float]]]:
        """``(id, score)`` of each of ``count`` queries' hits (an empty tuple if none)."""
        grouped: list[Sequence[tuple[bytes, float]]] = [()] * count
        for query, doc_id, score in self.hits():
            if not grouped[query]:
                grouped[query] = []
            grouped[query].append((doc_id, score))  # type: ignore[union-attr]
        return grouped


def _distinct_pairs(
    askers: npt.NDArray[np.intp], ids: npt.NDArray[np.uint64]
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.uint64]]:
    """The distinct ``(query, id)`` pairs, by query then id."""
    order = np.lexsort((ids, askers))
    askers, ids = askers[order], ids[order]
    first = np.ones(len(ids), dtype=bool)
    first[1:] = (askers[1:] != askers[:-1]) | (ids[1:] != ids[:-1])
    return askers[first], ids[first]


def _check_one_of(text: object, signature: object, name: str) -> None:
    """Raise unless exactly one of a text and a signature was given, saying which case."""
    if (text is None) == (signature is None):
        given = "both given" if text is not None else "neither given"
        raise InvalidParameterError(name, given, "exactly one: a text, or signature=")


def _check_limit(limit: int | None, expected: str = "a positive integer or None") -> int | None:
    if limit is None:
        return None
    value = integer(limit)
    if value is None or value < 1:
        raise InvalidParameterError("limit", limit, expected)
    return value


class WriteTxn(ReadTxn):
    """A read transaction that can also add and remove documents (see module docstring)."""

    def __init__(self, store: Store, txn: lmdb.Transaction) -> None:
        super().__init__(store, txn)
        self._log: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Any]] = []
        self._poisoned: str | None = None
        self._next_id: int | None = None
        self._replaying = False
        self._wrote = False  # since the LMDB transaction began
        self._unlinked = False  # whether it removed documents (a purge may be due after it)
        self._committing: lmdb.Transaction | None = None  # the LMDB commit begun, if any
        self._operating = 0  # logged operations running (their raw writes are replayed)
        self._raw = False  # the raw transaction was handed out outside them

    @property
    def txn(self) -> lmdb.Transaction:
        """The LMDB transaction, for callers that write the tables directly: handing it
        out counts as a write, so the transaction commits (one that wrote nothing ends
        without a commit, :meth:`_end`). Such writes are not in the operation log, so a
        map growth later in the block cannot replay them: the block then fails with
        :class:`TransactionAbortedError` (retry it; the map has grown)."""
        self._wrote = True
        if not self._operating:
            self._raw = True
        return self._live

    def _band_cache(self) -> CacheLookup | None:
        """The cache, until this transaction writes: before its first write it sees the
        snapshot it began on (LMDB numbers a write transaction one past that), after it
        holds documents of its own that no cache has."""
        cache = self._store._band_cache
        if cache is None or self._wrote:
            return None
        return cache.ready_for(self._live, self._live.id() - 1)

    # Reads inside a write transaction are logged too: after a replay they must still say
    # what the caller based its writes on. Keys are logged as values the caller cannot
    # change (a bytearray it reuses would make the replay ask for another key).
    def get(self, key: Key) -> Document:
        return self._run(super().get, _frozen_key(key))  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return self._run(super().__len__)  # type: ignore[no-any-return]

    def __contains__(self, key: object) -> bool:
        return self._run(super().__contains__, _frozen_key(key))  # type: ignore[no-any-return]

    def awaiting_purge(self) -> int:
        return self._run(super().awaiting_purge)  # type: ignore[no-any-return]

    def keys(self) -> Iterator[Key]:
        # Its rows are read as the caller goes, so the log holds an entry that grows with
        # them, which a replay reads again (and, if the caller read to the end, checks
        # that no more follow). Once the block has logged other operations, the rows read
        # from then on (which may include what those wrote) go into a new entry after
        # them, which goes on from the last id read: each row is read once by a replay.
        # A replay ends the iterator itself (StoreClosedError on its next row).
        if self._operating:
            yield from ReadTxn.keys(self)
            return
        # It ends at the last document stored when it began: a document the loop adds or
        # replaces gets a new id, and yielded again, a loop replacing each never ended.
        bound = _KeysBound(self._last_doc_id())
        read, placed, last = _KeysRead(None, bound), -1, None
        for raw_id, key in self._key_rows(until=bound.until):
            if placed != len(self._log):
                read = _KeysRead(last, bound)
                self._log.append((self._keys_read_again, (read,), {}, "the same"))
                placed = len(self._log)
            read.add(key)
            last = raw_id
            yield key
        if placed != len(self._log):  # also where it ended, if none was read
            read = _KeysRead(last, bound)
            self._log.append((self._keys_read_again, (read,), {}, "the same"))
        read.ended = True

    __iter__ = keys

    def _last_doc_id(self) -> bytes:
        """The id of the last document stored now (``b""`` if there is none)."""
        with self._live.cursor(db=self._store._docs_db) as cursor:
            return bytes(cursor.key()) if cursor.last() else b""

    def _keys_read_again(self, read: _KeysRead) -> str:
        """Whether the keys ``read`` holds still follow its ``after`` in this snapshot
        (and, if the iterator ended, are the last ones): ``"the same"`` or what differs."""
        bound = read.bound
        if read.after is None:  # where the iterator began, in the replay
            bound.again = self._last_doc_id()
        again = _KeysRead(read.after, bound)
        rows = self._key_rows(read.after, bound.until)
        for _, key in itertools.islice(rows, read.count):
            again.add(key)
        if again.count != read.count:
            return f"{again.count} keys where the block read {read.count}"
        if again.digest.intdigest() != read.digest.intdigest():
            return f"other keys among the {read.count} the block read"
        if read.ended and next(rows, None) is not None:
            return f"more keys than the {read.count} the block read to the end"
        if read.ended and bound.again != bound.until:  # it would have gone on, or stopped short
            return "another last document where the iterator, read to the end, began"
        return "the same"

    def _query_exact(
        self, texts: Sequence[object], sigs: npt.NDArray[np.uint32], *options: Any
    ) -> list[list[Match]]:
        return self._run(super()._query_exact, list(texts), sigs.copy(), *options)  # type: ignore[no-any-return]

    def _query_signatures(
        self, sigs: npt.NDArray[np.uint32], threshold: float | None, limit: int | None
    ) -> list[list[Match]]:
        # Logged with a copy: a replay must ask what the caller asked, whatever the
        # caller's array holds by then.
        return self._run(super()._query_signatures, sigs.copy(), threshold, limit)  # type: ignore[no-any-return]

    # -- the operation log and map growth ----------------------------------------------------

    def _run(self, operation: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._poisoned is not None:
            raise TransactionAbortedError(self._poisoned)
        if self._operating:  # inside a logged operation (or a replay): logged with it
            return operation(*args, **kwargs)
        while True:
            self._operating += 1
            try:
                result = operation(*args, **kwargs)
            except lmdb.MapFullError:
                self._redo_after_growth()
                continue
            except NeardupError as err:
                # A refusal (a key absent or taken) is an answer the caller may act on: a
                # replay must meet it again. (One that poisoned the block never commits.)
                self._log.append((operation, args, kwargs, _Refusal.of(err)))
                raise
            finally:
                self._operating -= 1
            self._log.append((operation, args, kwargs, _fingerprint(result)))
            return result

    def _redo_after_growth(self) -> None:
        """Abort, grow the map, and replay every logged operation in a new transaction."""
        self._close_txn(commit=False)
        self._txn = self._store._grow_and_begin_write()
        self.epoch = self._store.map_epoch
        self._next_id = None
        self._wrote = False
        if self._raw:  # writes made through .txn are in no log: they cannot be redone
            self._close_txn(commit=False)
            self._poisoned = (
                "the map had to grow, and writes made through WriteTxn.txn cannot be "
                "replayed; run the block again (the map is larger now)"
            )
            raise TransactionAbortedError(self._poisoned)
        for operation, args, kwargs, expected in self._log:
            self._operating += 1
            try:
                again = _fingerprint(operation(*args, **kwargs))
            except lmdb.MapFullError:
                return self._redo_after_growth()
            except Exception as err:
                if isinstance(err, NeardupError) and _Refusal.of(err) == expected:
                    continue  # refused again, as it was the first time
                self._refuse_replay(f"{type(err).__name__}: {err}", err)
            finally:
                self._operating -= 1
            if isinstance(expected, _Refusal):
                self._refuse_replay(f"{operation.__name__} no longer raises {expected.error}")
            if again != expected:
                self._refuse_replay(f"{operation.__name__} returned {again!r}")
        return None

    def _refuse_replay(self, why: str, cause: BaseException | None = None) -> NoReturn:
        """End a replay that another process's commit made diverge: nothing of the
        block is kept, and the block cannot go on, even if its caller catches this."""
        self._close_txn(commit=False)
        conflict = TransactionConflictError(why)
        self._poisoned = f"{type(conflict).__name__}: {conflict}"
        raise conflict from cause

    def _close_txn(self, commit: bool) -> None:
        """Commit or abort the LMDB transaction. Until it has ended it stays reachable from
        ``_txn`` or ``_committing``, whichever line a Ctrl-C interrupts, so that the
        error path can abort it (left to the collector, it held the write lock)."""
        self._close_cursors()
        txn = self._txn
        if txn is None:
            return
        if self._store._forked():  # never a parent's, forked
            self._txn = None
            return
        if commit:
            self._committing = txn
            self._txn = None
            try:
                txn.commit()  # LMDB ends the transaction even when the commit fails
            except lmdb.Error:
                self._committing = None  # ended, not committed (a replay may follow)
                raise
        else:
            if self._committing is txn:
                self._committing = None  # aborted here: not a commit that returned
            txn.abort()
            self._txn = None

    def _writing(self) -> _Poisoner:
        self._wrote = True
        return _Poisoner(self)

    def _finish(self, commit: bool) -> None:
        """Commit (growing the map and replaying if the commit needs room) or abort, then
        drop the operation log: its bound methods refer back to this transaction, a cycle
        that would keep every logged batch (signatures, results) alive until Python's
        cyclic collector ran."""
        try:
            self._end(commit)
        finally:
            self._log.clear()

    def _end(self, commit: bool) -> None:
        if commit and self._poisoned is not None:
            self._close_txn(commit=False)
            raise TransactionAbortedError(self._poisoned)
        if not commit or not self._wrote:
            # Nothing written (a refused add_if_unique, a removal of absent keys with
            # missing_ok): the snapshot is the store, so ending it is the commit, without
            # a counter to bump or a page to sync.
            self._close_txn(commit=False)
            return
        while True:
            try:
                self._store._write_counters(self)
                _faults.checkpoint("before-commit")
                self._close_txn(commit=True)
                _faults.checkpoint("after-commit")
                return
            except lmdb.MapFullError:
                # The txn is still open if a put failed (a failed commit already ended it;
                # aborting it again is harmless): the redo must abort it before growing.
                try:
                    self._redo_after_growth()
                except BaseException:  # a refused replay, a Ctrl-C in it: free the lock
                    self._close_txn(commit=False)
                    raise
            except BaseException as error:
                # Anything else (a full disk at commit, say): never leave the write lock held.
                self._close_txn(commit=False)
                if self._commit_returned():
                    if isinstance(error, KeyboardInterrupt):
                        after_commit(error)  # signalled during the commit, raised after it
                elif self._committing is not None:  # interrupted before the commit began
                    self._committing.abort()
                    self._committing = None
                raise

    def _commit_returned(self) -> bool:
        """Whether the LMDB commit begun by :meth:`_close_txn` returned: the transaction
        is ended (a commit that failed raised its own error, not a Ctrl-C)."""
        if self._committing is None:
            return False
        try:
            self._committing.id()
        except lmdb.Error:
            return True
        return False

    def _allocate_id(self) -> bytes:
        return codec.encode_id(int(self._allocate_ids(1)[0]))

    def _allocate_ids(self, count: int) -> npt.NDArray[np.uint64]:
        """The next ``count`` document ids (consecutive, never reused)."""
        if self._next_id is None:
            self._next_id = self._store._next_doc_id(self._live)
        limit = self._store._band_layout.id_limit
        if self._next_id + count > limit:
            raise IdsExhaustedError(str(self._store.path), limit)
        first, self._next_id = self._next_id, self._next_id + count
        return np.arange(first, first + count, dtype=np.uint64)

    # -- inserting prepared batches (prepare_batch: validation and signatures, no writes) ------

    def _add_prepared(self, batch: _PreparedBatch) -> int:
        """Insert a batch of new keys prepared by :func:`prepare_batch` (perhaps before
        this transaction began); DuplicateKeyError before any write if a key is taken."""
        self._store._check_writable()
        return int(self._run(self._insert_checked, self._banded_now(batch)))

    def _insert_checked(self, batch: _PreparedBatch) -> int:
        """:meth:`_insert_new` after :meth:`_check_new_keys`, as one logged operation: a
        replay after a map growth checks the keys again, so a key another process
        committed in between is a conflict, not an entry silently overwritten."""
        self._check_new_keys(batch)
        return self._insert_new(batch)

    # -- writing primitives -------------------------------------------------------------------

    def _insert(self, doc: _Prepared, doc_id: bytes | None = None) -> None:
        store, txn = self._store, self._live
        doc_id = self._allocate_id() if doc_id is None else doc_id
        record = codec.encode_record(doc.raw_key, doc.is_str, doc.signature, doc.metadata)
        with self._writing():
            self._check_appended(txn.put(doc_id, record, db=store._docs_db, append=True), 1)
            txn.put(doc.index, doc_id, db=store._keys_db)
            _faults.checkpoint("after-put")
            for band, band_key in enumerate(doc.band_keys):
                entry = store._band_layout.entry(band_key, doc_id)
                txn.put(*entry, db=store._band_dbs[band], dupdata=True)
            _faults.checkpoint("after-bands")

    def _check_appended(self, added: int, wanted: int) -> None:
        """Raise (inside :meth:`_writing`, so the block cannot commit) if LMDB refused to
        append new records: only a key sorting after every id it hands out can be in
        their way, damage that would otherwise leave their keys pointing at nothing."""
        if added == wanted:
            return
        with self._live.cursor(db=self._store._docs_db) as cursor:
            last = bytes(cursor.key()) if cursor.last() else b""
        raise CorruptRecordError(
            None, f"it is stored under {last!r}, past every id new records take", BAD_ID_ADVICE
        )

    def _insert_new(self, docs: _PreparedBatch) -> int:
        """Insert documents whose keys are known to be new, one sorted multi-put per table.

        The same entries as :meth:`_insert` per document, but each table receives its
        entries in key order in one call: ids are appended, and sorted band keys land next
        to each other in the B-tree instead of at random pages one Python call at a time.
        """
        if not docs:
            return 0
        store, txn = self._store, self._live
        id_values = self._allocate_ids(len(docs))
        ids = codec.band_key_bytes(id_values)
        records = codec.encode_records(docs.raw_keys, docs.str_keys, docs.signatures, docs.metadata)
        indexes = sorted(zip(docs.indexes, ids, strict=True))
        with self._writing():
            with txn.cursor(db=store._docs_db) as cursor:
                _, added = cursor.putmulti(zip(ids, records, strict=True), append=True)
            self._check_appended(added, len(docs))
            with txn.cursor(db=store._keys_db) as cursor:
                cursor.putmulti(indexes)
            _faults.checkpoint("after-put")
            for band in range(store.banding.bands):
                entries = store._band_layout.entries(docs.band_keys[:, band], id_values)
                with txn.cursor(db=store._band_dbs[band]) as cursor:
                    cursor.putmulti(entries, dupdata=True)
            _faults.checkpoint("after-bands")
        return len(docs)

    def _unlink(self, found: Sequence[tuple[bytes, bytes]]) -> None:
        """Remove the documents ``(id, key index)``: each record leaves ``docs`` and its
        index ``keys``. In a store with a ``removed`` table the records move there and
        their band entries stay for a purge (:meth:`purge`), which deletes many at once
        in key order; in an older format they are deleted here. Every table is written in
        key order through one cursor, so that LMDB finds most entries on the page it is
        already on instead of descending from the root."""
        if not found:
            return
        store = self._store
        ids = sorted(doc_id for doc_id, _ in found)
        with self._live.cursor(db=store._docs_db) as cursor:
            rows = [(bytes(doc_id), bytes(record)) for doc_id, record in cursor.getmulti(ids)]
        if len(rows) < len(ids):
            missing = min(set(ids).difference(doc_id for doc_id, _ in rows))
            raise CorruptRecordError(
                codec.decode_id(missing), "indexed but missing", MISSING_RECORD_ADVICE
            )
        doomed = self._band_entries_of(rows) if store._removed_db is None else []
        self._unlinked = True
        with self._writing():
            self._delete_sorted(store._docs_db, ((doc_id, None) for doc_id in ids))
            indexes = sorted(index for _, index in found)
            self._delete_sorted(store._keys_db, ((index, None) for index in indexes))
            if store._removed_db is None:
                self._delete_band_entries(doomed)
            else:
                with self._live.cursor(db=store._removed_db) as cursor:
                    cursor.putmulti(rows)
            _faults.checkpoint("after-remove")

    def _band_entries_of(
        self, rows: Sequence[tuple[bytes, bytes]]
    ) -> list[Iterable[tuple[bytes, bytes]]]:
        """Each band's entries of the documents ``(id, record)``, in table order (every
        record verified before anything is deleted)."""
        store = self._store
        sigs = codec.decode_signatures(rows, store.config.num_perm)
        keys = band_keys(sigs, store.banding, store.config.seed)
        id_values = codec.decode_ids(doc_id for doc_id, _ in rows)
        layout = store._band_layout
        return [layout.entries(keys[:, band], id_values) for band in range(keys.shape[1])]

    def _delete_band_entries(self, doomed: list[Iterable[tuple[bytes, bytes]]]) -> None:
        """Delete each band's entries of :meth:`_band_entries_of`."""
        for db, entries in zip(self._store._band_dbs, doomed, strict=True):
            self._delete_sorted(db, entries)

    def _purge(self, limit: int | None) -> int:
        removed = self._store._removed_db
        if removed is None:
            return 0
        with self._live.cursor(db=removed) as cursor:
            rows = [(bytes(k), bytes(v)) for k, v in itertools.islice(cursor, limit)]
        if not rows:
            return 0
        try:
            doomed = self._band_entries_of(rows)
        except CorruptRecordError as err:  # its document is removed: no key can name it now
            raise CorruptRecordError(err.doc_id, err.reason, PURGE_ADVICE) from None
        with self._writing():
            self._delete_band_entries(doomed)
            self._delete_sorted(removed, ((doc_id, None) for doc_id, _ in rows))
            _faults.checkpoint("after-purge")
        return len(rows)

    def _delete_sorted(self, db: Any, entries: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Delete ``(key, value)`` entries of ``db`` (value ``None``: the key's only entry)."""
        with self._live.cursor(db=db) as cursor:
            for key, value in entries:
                if cursor.set_key(key) if value is None else cursor.set_key_dup(key, value):
                    cursor.delete()

    def _store_prepared(self, doc: _Prepared, replace: bool) -> bool:
        existing = self._live.get(doc.index, db=self._store._keys_db)
        if existing is None:
            self._insert(doc)
            return False
        if not replace:
            raise DuplicateKeyError(doc.key)
        doc_id = self._allocate_id()  # first: with the ids used up, nothing is removed
        self._unlink([(bytes(existing), doc.index)])
        self._insert(doc, doc_id)
        return True

    # -- public writing operations --------------------------------------------------------------

    def add(
        self,
        key: Key,
        document: object = None,
        *,
        signature: npt.ArrayLike | None = None,
        metadata: Any = None,
        replace: bool = False,
        encoding: str | None = None,
    ) -> bool:
        """Add one document by text or by precomputed ``signature``.

        Returns:
            True if an existing document with this key was replaced.

        Raises:
            DuplicateKeyError: the key exists and ``replace`` is false.
            InvalidKeyError / MetadataError / InputTypeError / EmptyDocumentError /
                TextDecodeError: bad input (nothing is written); TextDecodeError for bytes
                that are not valid in ``encoding``.
            InvalidSignatureError: a ``signature`` whose values are not uint32 integers.
            InvalidParameterError: both or neither of document and ``signature``, a
                signature of the wrong shape, a bad ``encoding``, or a ``replace`` that is
                not a bool.
            ReadOnlyError: the store is open read-only.
            IdsExhaustedError: the store has handed out every document id its format holds.
            StoreClosedError: the transaction's block has ended.
        """
        self._store._check_writable()
        check_flags(replace=replace)
        _check_one_of(document, signature, "document/signature")
        sigs = self._own_signature(signature)
        with single_document():
            (doc,) = prepare_batch(self._store, [(key, document, metadata)], sigs, encoding).docs()
        return bool(self._run(self._store_prepared, doc, replace))

    def _own_signature(self, signature: npt.ArrayLike | None) -> npt.NDArray[np.uint32] | None:
        """``signature`` checked, as a one-row matrix of its own: the caller may reuse the
        array, and a replay after a map growth must write what this call was given."""
        if signature is None:
            return None
        return self._store._check_signature(signature)[None, :].copy()

    def add_many(
        self,
        items: Iterable[tuple[Key, object] | tuple[Key, object, Any]],
        *,
        replace: bool = False,
        encoding: str | None = None,
    ) -> int:
        """Add ``(key, text)`` or ``(key, text, metadata)`` items, signed as one batch.

        Every item is validated before anything is written. Returns the number added.
        """
        self._store._check_writable()
        self._require_open()
        check_batch(items, *TEXT_ITEMS)
        check_flags(replace=replace)
        batch = document_items(items)
        return self._add_batch(prepare_batch(self._store, batch, encoding=encoding), replace)

    def add_signatures(
        self,
        items: Iterable[tuple[Key, npt.ArrayLike] | tuple[Key, npt.ArrayLike, Any]],
        *,
        replace: bool = False,
    ) -> int:
        """Add ``(key, signature)`` or ``(key, signature, metadata)`` items computed
        elsewhere (another process, Spark, an export) with this store's configuration.

        Every item is validated before anything is written. Returns the number added.
        """
        self._store._check_writable()
        self._require_open()
        check_batch(items, *SIGNATURE_ITEMS)
        check_flags(replace=replace)
        batch = document_items(items, "signature")
        if not batch:
            return 0
        return self._add_batch(
            prepare_batch(self._store, batch, self._stack_signatures(batch)), replace
        )

    def _banded_now(self, batch: _PreparedBatch) -> _PreparedBatch:
        """``batch`` with the band keys of the store's banding as this transaction sees
        it: a batch banded before its transaction began (``Store.add_many`` prepares
        outside it) may meet a ``rebuild()`` of another thread in between, whose new
        banding took the old keys (a raw ``IndexError``, or entries no query finds)."""
        banding = self._store.banding
        if batch.banding == banding:
            return batch
        keys = band_keys(batch.signatures, banding, self._store.config.seed)
        return dataclasses.replace(batch, band_keys=keys, banding=banding)

    def _add_batch(self, prepared: _PreparedBatch, replace: bool) -> int:
        """Write a prepared batch: new keys in one multi-put, or each document in turn
        when ``replace`` may meet a stored key."""
        if not replace:
            return self._add_prepared(prepared)
        for doc in self._banded_now(prepared).docs():
            self._run(self._store_prepared, doc, replace)
        return len(prepared)

    def _stack_signatures(
        self, batch: Sequence[tuple[object, object, object]]
    ) -> npt.NDArray[np.uint32]:
        """The signatures of ``(key, signature, metadata)`` items as one checked matrix."""
        return self._store._check_signatures([sig for _, sig, _ in batch])

    def _check_new_keys(self, batch: _PreparedBatch, advice: str | None = None) -> None:
        """DuplicateKeyError before any write if a key repeats in the batch or is stored
        (``advice`` for a stored key: that of a call without ``replace``)."""
        seen = set(batch.indexes)
        if len(seen) < len(batch):
            seen.clear()
            for key, index in zip(batch.keys, batch.indexes, strict=True):
                if index in seen:
                    raise DuplicateKeyError(key, in_batch=True)
                seen.add(index)
        # One sorted multi-get for the whole batch instead of a lookup per key.
        with self._live.cursor(db=self._store._keys_db) as cursor:
            stored = {bytes(index) for index, _ in cursor.getmulti(sorted(seen))}
        if stored:
            raise DuplicateKeyError(
                next(k for k, i in zip(batch.keys, batch.indexes, strict=True) if i in stored),
                advice=advice,
            )

    def _remove_one(self, key: Key, missing_ok: bool) -> bool:
        found = self._lookup(key)
        if found is None:
            if missing_ok:
                return False
            raise KeyNotFoundError(key)
        self._unlink([found])
        return True

    def remove(self, key: Key, *, missing_ok: bool = False) -> bool:
        """Remove a document. Returns False if it was absent and ``missing_ok``.

        Queries stop finding it at once; its band entries stay until a purge
        (:meth:`purge`, :meth:`Store.purge`), which deletes many at a time.

        Raises:
            KeyNotFoundError: the key is not stored and ``missing_ok`` is false.
        """
        self._store._check_writable()
        check_flags(missing_ok=missing_ok)
        codec.key_bytes(key)
        return bool(self._run(self._remove_one, _frozen_key(key), missing_ok))

    def remove_many(self, keys: Iterable[Key], *, missing_ok: bool = False) -> int:
        """Remove many documents; returns how many were removed."""
        self._store._check_writable()
        self._require_open()
        check_batch(keys, *KEYS)
        check_flags(missing_ok=missing_ok)
        keys = [_frozen_key(key) for key in keys]
        for index, key in enumerate(keys):
            key_bytes_of_item(key, index)
        return int(self._run(self._remove_found, keys, missing_ok))

    def _remove_found(self, keys: Sequence[Key], missing_ok: bool) -> int:
        """Remove the stored ones among ``keys`` (each once); returns how many.

        Every key is looked up before the first removal, so a missing one (unless
        ``missing_ok``) raises with nothing changed; a key listed twice is removed once.
        """
        found: dict[bytes, bytes] = {}
        for key in keys:
            hit = self._lookup(key)
            if hit is not None:
                found[bytes(hit[0])] = hit[1]
            elif not missing_ok:
                raise KeyNotFoundError(key)
        self._unlink(list(found.items()))
        return len(found)

    def purge(self, limit: int | None = None) -> int:
        """Delete the band entries of removed documents, up to ``limit`` of them (lowest
        id first), and their records in ``removed``; returns how many were purged.

        Queries skip removed documents either way: a purge only gives back their space
        (and the candidate lookups that find them). :meth:`Store.purge` purges all.
        """
        self._store._check_writable()
        count = _check_limit(limit, "a positive number of documents, or None")
        return int(self._run(self._purge, count))

    def _add_unique(self, doc: _Prepared, threshold: float) -> UniqueResult:
        if self._live.get(doc.index, db=self._store._keys_db) is not None:
            raise DuplicateKeyError(doc.key, advice=UNIQUE_STORED_KEY)
        matches = self._query_one(doc.signature, threshold, None)
        if matches:
            return UniqueResult(doc.key, False, matches)
        self._insert(doc)
        return UniqueResult(doc.key, True, [])

    def add_if_unique(
        self,
        key: Key,
        document: object = None,
        *,
        signature: npt.ArrayLike | None = None,
        threshold: float | None = None,
        metadata: Any = None,
        encoding: str | None = None,
    ) -> UniqueResult:
        """Add the document unless near-duplicates are stored; report them if so."""
        self._store._check_writable()
        _check_one_of(document, signature, "document/signature")
        threshold = self._store._check_threshold(threshold)
        sigs = self._own_signature(signature)
        with single_document():
            (doc,) = prepare_batch(self._store, [(key, document, metadata)], sigs, encoding).docs()
        result: UniqueResult = self._run(self._add_unique, doc, threshold)
        return result

    def add_many_if_unique(
        self,
        items: Iterable[tuple[Key, object] | tuple[Key, object, Any]],
        *,
        threshold: float | None = None,
        encoding: str | None = None,
    ) -> list[UniqueResult]:
        """:meth:`add_if_unique` for a batch, in order: an item that near-duplicates an
        earlier item of the same batch is not added (the earlier one is its match)."""
        self._store._check_writable()
        self._require_open()
        threshold = self._store._check_threshold(threshold)
        check_batch(items, *UNIQUE_TEXT_ITEMS)
        batch = document_items(items)
        return self._add_unique_prepared(
            prepare_batch(self._store, batch, encoding=encoding), threshold
        )

    def add_signatures_if_unique(
        self,
        items: Iterable[tuple[Key, npt.ArrayLike] | tuple[Key, npt.ArrayLike, Any]],
        *,
        threshold: float | None = None,
    ) -> list[UniqueResult]:
        """:meth:`add_many_if_unique` for ``(key, signature[, metadata])`` items computed
        elsewhere, as :meth:`add_signatures` takes them."""
        self._store._check_writable()
        self._require_open()
        threshold = self._store._check_threshold(threshold)
        check_batch(items, *UNIQUE_SIGNATURE_ITEMS)
        batch = document_items(items, "signature")
        if not batch:
            return []
        prepared = prepare_batch(self._store, batch, self._stack_signatures(batch))
        return self._add_unique_prepared(prepared, threshold)

    def _add_unique_prepared(self, batch: _PreparedBatch, threshold: float) -> list[UniqueResult]:
        if not batch:  # (the call asked that the block is open: _require_open)
            return []
        batch = self._banded_now(batch)
        return self._run(self._add_unique_checked, batch, threshold)  # type: ignore[no-any-return]

    def _add_unique_checked(self, batch: _PreparedBatch, threshold: float) -> list[UniqueResult]:
        """:meth:`_add_unique_batch` after the key check, as one logged operation (see
        :meth:`_insert_checked`)."""
        self._check_new_keys(batch, UNIQUE_STORED_KEY)
        return self._add_unique_batch(batch, threshold)

    def _add_unique_batch(self, batch: _PreparedBatch, threshold: float) -> list[UniqueResult]:
        """:meth:`_add_unique` of every document of ``batch`` in order, with the answers
        of doing them one at a time, but the stored near-duplicates found by one batched
        query and the added documents written by one :meth:`_insert_new`.

        A document is checked against what the transaction held before the batch and
        against the batch's earlier documents that were added, found through the same
        buckets (the band key bytes the layout keeps) that the band tables would find
        them in. Matches sort by score, then id; the batch's documents get ids above
        every stored one, in the order they are added.
        """
        hits = self._scored_many(batch.signatures, threshold)
        stored, records = hits.by_query(len(batch.signatures)), hits.records
        kept = self._store._band_layout.kept(batch.band_keys)
        shared = _shares_a_bucket(kept)
        buckets: list[dict[int, list[int]]] = [{} for _ in range(self._store.banding.bands)]
        sigs, num_perm = batch.signatures, batch.signatures.shape[1]
        added: list[int] = []
        outcomes: list[list[tuple[float, int, Any]] | None] = []
        for row, scored in enumerate(stored):
            found: list[tuple[float, int, Any]] = [(-score, 0, i) for i, score in scored]
            keys = kept[row].tolist() if shared[row] else ()
            earlier = {j for band, key in enumerate(keys) for j in buckets[band].get(key, ())}
            if earlier:
                ordered = sorted(earlier)
                scores = np.count_nonzero(sigs[ordered] == sigs[row], axis=1) / num_perm
                found += [
                    (-x, 1, j)
                    for j, x in zip(ordered, scores.tolist(), strict=True)
                    if x >= threshold
                ]
            if found:
                outcomes.append(sorted(found))
                continue
            outcomes.append(None)
            added.append(row)
            for band, key in enumerate(keys):  # only a later document can find it here
                buckets[band].setdefault(key, []).append(row)
        self._insert_new(batch.take(added))
        results = []
        for key, matches in zip(batch.keys, outcomes, strict=True):
            if matches is None:
                results.append(UniqueResult(key, True, []))
                continue
            results.append(
                UniqueResult(
                    key,
                    False,
                    [
                        Match(
                            self._key_of(ref, records) if tier == 0 else batch.keys[ref],
                            -negative,
                        )
                        for negative, tier, ref in matches
                    ],
                )
            )
        return results


class _Poisoner:
    """Marks the transaction unusable if the block raises after writes began, and turns
    an LMDB error (a put the engine rejected) into a typed one."""

    def __init__(self, owner: WriteTxn) -> None:
        self._owner = owner

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: Any
    ) -> None:
        if kind is None or issubclass(kind, lmdb.MapFullError):
            return
        cause = f"{kind.__name__}: {error}"
        self._owner._poisoned = cause
        if isinstance(error, lmdb.Error):  # an engine error must not reach the caller raw
            typed = self._owner._store._translate(error)
            raise (typed if typed is not error else TransactionAbortedError(cause)) from error


def _shares_a_bucket(kept: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
    """Which rows of a batch's kept band keys (one row per document, one column per
    band) share a bucket with another row of the batch in some band."""
    shared = np.zeros(len(kept), dtype=bool)
    for column in kept.T:
        order = np.argsort(column, kind="stable")
        ordered = column[order]
        same = ordered[1:] == ordered[:-1]
        shared[order[1:][same]] = True
        shared[order[:-1][same]] = True
    return shared


def _source_shingles(
    shingler: Shingler, source: Callable[[Key], str], keys: list[Key]
) -> ShingleBatch:
    """The shingles of the text ``exact=`` gives for each stored key. A text it cannot give
    is the source's fault, named by the stored key: not the fault of the caller's query
    document, as the batch code's own error would have it (review 22)."""
    texts = [source(key) for key in keys]
    try:
        return shingler.hash_batch(texts)
    except DocumentError as err:
        position = err.index or 0
        raise InvalidParameterError(
            f"exact({keys[position]!r})",
            texts[position],
            f"the stored document's text, a str with shingles ({type(err).__name__})",
        ) from None


def prepare_batch(
    store: Store,
    items: Sequence[tuple[object, object, object]],
    signatures: npt.NDArray[np.uint32] | None = None,
    encoding: str | None = None,
) -> _PreparedBatch:
    """Validate keys and metadata, then sign (unless ``signatures`` are given) and band a
    batch of ``(key, text, metadata)`` items. Reads nothing from the tables, so it can run
    outside a write transaction."""
    checked = [key_bytes_of_item(key, index) for index, (key, _, _) in enumerate(items)]
    metadata = []
    for index, (key, _, meta) in enumerate(items):
        try:
            metadata.append(codec.pack_metadata(meta))
        except MetadataError as err:  # named, as a bad key or text is (review 22)
            raise MetadataError(err.reason, key=_frozen_key(key), index=index) from None
    if signatures is None:
        signatures = store.hasher.signatures([text for _, text, _ in items], encoding)
    return _PreparedBatch(
        keys=[_frozen_key(key) for key, _, _ in items],  # reported back: never the caller's buffer
        raw_keys=[raw for raw, _ in checked],
        str_keys=[is_str for _, is_str in checked],
        indexes=[codec.key_index(raw, is_str) for raw, is_str in checked],
        metadata=metadata,
        signatures=signatures,
        band_keys=band_keys(signatures, store.banding, store.config.seed),
        banding=store.banding,
    )


def document_item(
    entry: object, second: str = "text", index: int | None = None
) -> tuple[object, object, object]:
    """``(key, document)`` or ``(key, document, metadata)`` as a triple (metadata ``None``);
    ``second`` names what the document is (``"text"`` or ``"signature"``) in the error,
    ``index`` the item's position among its batch's (as a document's error does)."""
    if not isinstance(entry, (tuple, list)) or len(entry) not in (2, 3):
        expected = f"a (key, {second}) or (key, {second}, metadata) tuple"
        if second == "signature":
            expected += "; pair an array's rows with keys: zip(keys, signatures)"
        raise InvalidItemError(entry, expected, index)
    return (entry[0], entry[1], entry[2] if len(entry) == 3 else None)


def document_items(entries: Iterable[object], second: str = "text") -> list[Any]:
    """:func:`document_item` of each of a batch's ``entries``, numbered."""
    return [document_item(entry, second, index) for index, entry in enumerate(entries)]


def key_bytes_of_item(key: object, index: int | None) -> tuple[bytes, bool]:
    """:func:`codec.key_bytes` of the key of a batch's item ``index``, a refused key
    placed by its position (:class:`InvalidKeyError`'s ``index``)."""
    try:
        return codec.key_bytes(key)
    except InvalidKeyError as err:
        err.index = index
        raise


def _frozen_key(key: object) -> object:
    """``key`` as a value its caller cannot change afterwards (for the operation log, and
    for the keys reported back)."""
    return bytes(key) if isinstance(key, (bytearray, memoryview)) else key


class _Refusal(NamedTuple):
    """What the log keeps of an operation that raised: a replay must raise the same."""

    error: str
    message: str

    @classmethod
    def of(cls, err: BaseException) -> _Refusal:
        return cls(type(err).__name__, str(err))


class _KeysBound:
    """Where a write block's key iterator ends: ``until``, the last document id when it
    began, and ``again``, the same in a replay (a difference matters only to an iterator
    read to the end: one that stopped earlier read rows before both)."""

    __slots__ = ("again", "until")

    def __init__(self, until: bytes) -> None:
        self.until: bytes = until
        self.again: bytes | None = None


class _KeysRead:
    """Keys a key iterator has yielded, from the first id past ``after`` up to its bound:
    their count and a digest of them."""

    __slots__ = ("after", "bound", "count", "digest", "ended")

    def __init__(self, after: bytes | None, bound: _KeysBound) -> None:
        self.after, self.bound = after, bound
        self.count = 0
        self.digest = xxhash.xxh64()
        self.ended = False

    def add(self, key: Key) -> None:
        raw = key.encode("utf-8") if isinstance(key, str) else key
        self.digest.update(struct.pack("<I?", len(raw), isinstance(key, str)))
        self.digest.update(raw)
        self.count += 1


def _fingerprint(result: Any) -> Any:
    """A comparable summary of an operation's result, for replay checks."""
    if isinstance(result, Document):
        return (result.key, result.signature.tobytes(), repr(result.metadata))
    if isinstance(result, list):
        return tuple(_fingerprint(r) for r in result)
    return result
