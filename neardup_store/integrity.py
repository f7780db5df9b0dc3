"""The integrity check: does every table agree with the records, as :mod:`.codec` specifies?

The document records are the truth; the ``keys`` table and the band tables are indexes
derived from them. :func:`check` verifies, in one snapshot:

* LMDB's page structure, read from the file without the engine (:mod:`.lmdbfile`): meta
  pages, every B-tree, page and entry counts, and that every page is in use or free
  exactly once. When that finds damage, the engine is not asked to read the tables
  (it trusts every byte and could crash the process); the damage is the finding;
* ``meta`` is well formed: the format marker and version, a decodable ``config`` and
  ``banding`` equal to what the store was opened with and matching ``meta_checksum``,
  ``next_doc_id`` above every id, integer counters; and no table exists that the format
  does not name;
* every record decodes, its checksum is right and its signature has ``num_perm`` values;
* every record's key index is in ``keys`` and points back to it, and every ``keys``
  entry points to a record with that key;
* every record in ``removed`` (documents whose band entries await a purge) decodes like
  one in ``docs``, and its id is not also a stored document's;
* every document, stored or awaiting a purge, is in its bucket of every band, and every
  band entry is one of them in that bucket. Counting makes the second half cheap: a band
  holding exactly as many entries as the documents found in it has no others, so only a
  band with extra entries is walked to name them.

``repair=True`` rebuilds the derived tables (keys and bands, with ``removed`` emptied)
from the records in one write transaction and checks again. A damaged record or ``meta``
cannot be re-derived: those stay reported, for a restore from a backup or an export. Nor
is a store repaired whose page structure is damaged: writing through a damaged B-tree
can only spread it.

Errors the engine raises while reading (``lmdb.CorruptedError`` and the like) become
``structure`` findings, never exceptions. The engine reads the tables only after the walk
found their pages sound, so a damaged length or page number cannot make it read outside
the map. Opening the store reads ``meta`` and the table of tables through the engine
before the walk; LMDB checks the pages it reads there itself, and every damage the
corruption trials (``tools/corruption_trials.py``) put there became a typed
:class:`~.errors.CorruptStoreError`, never a crash.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import lmdb
import numpy as np
import numpy.typing as npt

from . import codec, lmdbfile
from .band_cache import BandCache
from .errors import PROGRESS_EVERY, check_flags, check_progress
from .ingest import key_text
from .lsh import LSHParams, band_keys
from .minhash import MinHashConfig
from .store import META_COUNT_LIMITS, id_after, meta_count_ok

if TYPE_CHECKING:
    from .store import Store
    from .txn import Key, ReadTxn, WriteTxn

_Progress = Callable[[int], None]

VIOLATION_KINDS: tuple[str, ...] = (
    "structure",  # LMDB's pages are damaged, or LMDB failed reading: restore from a backup
    "meta",  # a meta entry is missing, undecodable or disagrees with the store
    "stray-table",  # a table the format does not name (repair drops it)
    # a docs key that is not an id or is past the format's ids (repair gives the record a
    # new id), or an id >= next_doc_id (repair raises next_doc_id)
    "doc-id",
    "corrupt-record",  # checksum, version or lengths wrong: restore from a backup
    "signature-length",  # a record's signature is not num_perm values long
    "key-missing",  # a record's key index is not in the keys table (repair fixes)
    "key-mismatch",  # a record's key index points to another document (repair fixes)
    "key-orphan",  # a keys entry whose document is missing or has another key (repair fixes)
    "band-missing",  # a document is not in its bucket of some band (repair fixes)
    "band-orphan",  # a band entry that is not a document of that bucket (repair fixes)
    "removed-record",  # a record awaiting a purge is damaged or also stored (repair fixes)
)
"""Every ``Violation.kind``, with what it means."""

_UNREADABLE = ("corrupt-record", "signature-length")  # kinds whose record cannot name its key
_BATCH = 1024
_BAND_FLAGS = lmdbfile.DUPSORT | lmdbfile.DUPFIXED


@dataclass(frozen=True)
class Violation:
    """One broken invariant.

    Attributes:
        kind: one of :data:`VIOLATION_KINDS`.
        detail: what is wrong, in words. A key in it is written as ``neardup-admin``
            prints keys (:func:`.ingest.key_text`: ``b"\\x00\\xff"`` as ``hex:00ff``, the
            str key ``"hex:00ff"`` as ``\\hex:00ff``), the form ``remove`` takes back.
        doc_id: the internal id of the document involved, if one is.
        key: the document's key itself, where one is involved and can be read (a
            damaged record's, from the keys table), for a program to act on.
    """

    kind: str
    detail: str
    doc_id: int | None = None
    key: Key | None = None


@dataclass(frozen=True)
class CheckReport:
    """What :func:`check` found.

    Attributes:
        documents_checked: records read.
        violations: what the check found (before any repair).
        repaired: whether a repair ran (only when something was found and asked for).
        remaining: what a check after the repair still found; without a repair, the
            same as ``violations``.
    """

    documents_checked: int
    violations: list[Violation]
    repaired: bool = False
    remaining: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the store is consistent now (after the repair, if one ran)."""
        return not (self.remaining if self.repaired else self.violations)

    def kinds(self) -> set[str]:
        """The kinds of violation found (before any repair)."""
        return {v.kind for v in self.violations}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _table_names(store: Store) -> set[bytes]:
    names = {codec.META_DB, codec.DOCS_DB, codec.KEYS_DB}
    if store._removed_db is not None:
        names.add(codec.REMOVED_DB)
    names.update(
        codec.band_table_name(store._generation, band) for band in range(store.banding.bands)
    )
    return names


def walk_snapshot(store: Store, txn: lmdb.Transaction) -> lmdbfile.FileReport:
    """LMDB's pages of ``txn``'s snapshot walked with every offset bounds-checked
    (:func:`.lmdbfile.walk`), the store's tables with their flags required."""
    expected = {
        name: _BAND_FLAGS if name.startswith(b"band.") else 0 for name in _table_names(store)
    }
    return lmdbfile.walk(store.path / "data.mdb", txnid=txn.id(), tables=expected)


def _stray_tables(store: Store, txn: lmdb.Transaction) -> list[bytes]:
    expected = _table_names(store)
    with txn.cursor() as cursor:  # the main DB: one entry per named table
        return [bytes(name) for name in cursor.iternext(values=False) if name not in expected]


def _keys_entry(index: bytes) -> tuple[str, Key | None]:
    """How a violation names a ``keys`` table entry, and the key it holds: by that key
    as the CLI prints keys, else (a long key, which only its hash names, or a damaged
    entry) by the entry itself in hex."""
    key = codec.key_of_index(index)
    if key is not None:
        return f"keys entry of key {key_text(key)}", key
    hashed = " (a long key's hash)" if index[:1] in (b"S", b"B") else ""
    return f"keys entry {index.hex()}{hashed}", None


class _Checker:
    """One pass of the check over one snapshot, collecting violations."""

    def __init__(self, store: Store, reader: ReadTxn, progress: _Progress | None = None) -> None:
        self.store, self.reader, self.txn = store, reader, reader.txn
        self.progress = progress
        self.found: list[Violation] = []
        self.bad_ids: set[bytes] = set()  # records that cannot vouch for band entries
        self.good = 0
        self.checked = 0
        self.missing = [0] * store.banding.bands
        self.stale = False  # the snapshot's meta page was overwritten before the walk

    def add(
        self, kind: str, detail: str, doc_id: int | None = None, key: Key | None = None
    ) -> None:
        self.found.append(Violation(kind, detail, doc_id, key))

    def run(self, walk: bool = True) -> None:
        if walk and (not self.structure() or self.stale):
            return
        try:
            self.tables()
        except lmdb.Error as err:  # the walk found nothing, yet the engine failed
            self.add("structure", f"LMDB failed reading the tables: {err}")

    def structure(self) -> bool:
        """Walk LMDB's pages of this snapshot; whether they are sound."""
        report = walk_snapshot(self.store, self.txn)
        self.stale = report.stale
        for problem in report.problems:
            self.add("structure", problem)
        return not report.problems

    def tables(self) -> None:
        next_id = self.meta()
        for name in _stray_tables(self.store, self.txn):
            self.add("stray-table", f"table {name!r} is not part of this store's format")
        self.documents(next_id)
        self.keys()
        for band, db in enumerate(self.store._band_dbs):
            if int(self.txn.stat(db)["entries"]) > self.good - self.missing[band]:
                self.band_orphans(band, db)

    # -- meta ----------------------------------------------------------------------------

    def meta(self) -> int | None:
        meta: dict[str, Any] = {}
        raw: dict[str, bytes] = {}
        with self.txn.cursor(db=self.store._meta_db) as cursor:
            for name, value in cursor:
                try:
                    text = bytes(name).decode()
                    meta[text] = codec.unpack_meta(value)
                    raw[text] = bytes(value)
                except ValueError as err:
                    self.add("meta", f"meta entry {bytes(name)!r} does not decode ({err})")
        checksum = meta.get("meta_checksum")
        if checksum is not None and checksum != codec.meta_checksum(raw):
            self.add("meta", "meta_checksum does not match format, config and banding")
        for name in codec.REQUIRED_META:
            if name not in meta:
                self.add("meta", f"meta entry {name!r} is missing")
        if meta.get("format", codec.FORMAT_NAME) != codec.FORMAT_NAME:
            self.add("meta", f"format is {meta['format']!r}, not {codec.FORMAT_NAME!r}")
        version = meta.get("format_version", codec.FORMAT_VERSION)
        if version not in codec.READABLE_FORMATS:
            self.add("meta", f"format_version is {meta['format_version']!r}")
        if "config" in meta:
            self.config(meta["config"])
        if "banding" in meta:
            self.banding(meta["banding"], version)
        for name, limit in META_COUNT_LIMITS.items():
            if name in meta and not meta_count_ok(name, meta[name]):
                self.add("meta", f"{name} is {meta[name]!r}, not an integer in [0, {limit}]")
        next_id = meta.get("next_doc_id")
        id_limit = self.store._band_layout.id_limit
        if _is_int(next_id) and next_id > id_limit:
            self.add(
                "meta",
                f"next_doc_id {next_id} is past the format's {id_limit:,} ids: every add "
                "would be refused; export the store and import it into a new one",
            )
        return next_id if _is_int(next_id) else None

    def config(self, value: object) -> None:
        try:
            config = MinHashConfig.from_dict(value)  # type: ignore[arg-type]
        except (TypeError, ValueError, KeyError) as err:
            self.add("meta", f"config does not decode ({type(err).__name__}: {err})")
            return
        if config != self.store.config:
            self.add("meta", f"config is {config}, but the store was opened with another")

    def banding(self, value: object, format_version: object) -> None:
        try:
            banding, threshold, generation = codec.banding_from_meta(value, format_version)
        except (TypeError, ValueError, KeyError) as err:
            self.add("meta", f"banding {value!r} does not decode ({type(err).__name__})")
            return
        stored = (banding, threshold, generation)
        expected = (self.store.banding, self.store.threshold, self.store._generation)
        if stored != expected:
            self.add("meta", f"banding {value!r} differs from the one the store opened with")

    # -- documents -----------------------------------------------------------------------

    def documents(self, next_id: int | None) -> None:
        batch: list[tuple[bytes, npt.NDArray[np.uint32]]] = []
        with self.txn.cursor(db=self.store._docs_db) as cursor:
            for raw_id, value in cursor:
                raw_id = bytes(raw_id)
                self.checked += 1
                if self.progress is not None and self.checked % PROGRESS_EVERY == 0:
                    self.progress(self.checked)
                record = self.record(raw_id, value, next_id)
                if record is None:
                    self.bad_ids.add(raw_id)
                    continue
                self.key_entry(raw_id, codec.decode_id(raw_id), record.key)
                batch = self.in_bands(batch, raw_id, record.signature)
        if self.progress is not None and self.checked % PROGRESS_EVERY:
            self.progress(self.checked)  # the last, partial step
        if self.store._removed_db is not None:
            batch = self.removed(batch, next_id)
        if batch:
            self.band_entries(batch)

    def removed(
        self, batch: list[tuple[bytes, npt.NDArray[np.uint32]]], next_id: int | None
    ) -> list[tuple[bytes, npt.NDArray[np.uint32]]]:
        """Check the records awaiting a purge, whose band entries must all still be there."""
        docs = self.store._docs_db
        with self.txn.cursor(db=self.store._removed_db) as cursor:
            for raw_id, value in cursor:
                raw_id = bytes(raw_id)
                record = self.record(raw_id, value, next_id, removed=True)
                stored = self.txn.get(raw_id, db=docs) is not None
                if stored:
                    self.add("removed-record", f"id {raw_id.hex()} is stored and removed")
                if record is None or stored:
                    self.bad_ids.add(raw_id)
                    continue
                batch = self.in_bands(batch, raw_id, record.signature)
        return batch

    def record(
        self, raw_id: bytes, value: bytes, next_id: int | None, removed: bool = False
    ) -> codec.DocumentRecord | None:
        """The decoded record of ``raw_id`` if it can vouch for band entries (else what
        is wrong with it is reported: for one in ``removed``, as a ``removed-record``,
        which a repair fixes by dropping it with its band entries)."""
        num_perm, id_limit = self.store.config.num_perm, self.store._band_layout.id_limit

        def report(kind: str, detail: str, doc_id: int | None = None) -> None:
            if removed:
                kind, detail = "removed-record", f"removed {detail}"
            self.add(kind, detail, doc_id)

        if len(raw_id) != 8:
            report("doc-id", f"{'' if removed else 'docs '}key {raw_id!r} is not an 8-byte id")
            return None
        doc_id = codec.decode_id(raw_id)
        if doc_id >= id_limit:  # its band entries would name another id
            report("doc-id", f"id {doc_id} is beyond the format's {id_limit:,}", doc_id)
            return None
        if next_id is not None and doc_id >= next_id:
            report("doc-id", f"id {doc_id} is not below next_doc_id {next_id}", doc_id)
        try:
            record = codec.decode_record(value, doc_id)
        except ValueError as err:  # CorruptRecordError, or undecodable metadata
            reason = getattr(err, "reason", str(err))
            report("corrupt-record", f"record {doc_id}: {reason}", doc_id)
            return None
        if len(record.signature) != num_perm:
            size = len(record.signature)
            report("signature-length", f"record {doc_id} has {size} values, not {num_perm}", doc_id)
            return None
        return record

    def in_bands(
        self,
        batch: list[tuple[bytes, npt.NDArray[np.uint32]]],
        raw_id: bytes,
        signature: npt.NDArray[np.uint32],
    ) -> list[tuple[bytes, npt.NDArray[np.uint32]]]:
        """Queue a sound record's band entries for checking (a batch at a time)."""
        self.good += 1
        batch.append((raw_id, signature))
        if len(batch) < _BATCH:
            return batch
        self.band_entries(batch)
        return []

    def key_entry(self, raw_id: bytes, doc_id: int, key: str | bytes) -> None:
        raw, is_str = (key.encode("utf-8"), True) if isinstance(key, str) else (key, False)
        found = self.txn.get(codec.key_index(raw, is_str), db=self.store._keys_db)
        shown = key_text(key)
        if found is None:
            self.add("key-missing", f"key {shown} of record {doc_id} is not indexed", doc_id, key)
        elif bytes(found) != raw_id:
            self.add(
                "key-mismatch",
                f"key {shown} of record {doc_id} is indexed to id {bytes(found).hex()}",
                doc_id,
                key,
            )

    def band_entries(self, batch: list[tuple[bytes, npt.NDArray[np.uint32]]]) -> None:
        rows = self.reader._band_key_rows(np.stack([sig for _, sig in batch]))
        for (raw_id, _), keys in zip(batch, rows, strict=True):
            for band, band_key in enumerate(keys):
                entry = self.store._band_layout.entry(band_key, raw_id)
                if not self.reader._band_cursor(band).set_key_dup(*entry):
                    self.missing[band] += 1
                    doc_id = codec.decode_id(raw_id)
                    self.add(
                        "band-missing",
                        f"document {doc_id} is not in bucket {band_key.hex()} of band {band}",
                        doc_id,
                    )

    # -- the derived tables, walked from their side ---------------------------------------

    def keys(self) -> None:
        docs_db = self.store._docs_db
        with self.txn.cursor(db=self.store._keys_db) as cursor:
            for index, value in cursor:
                index, value = bytes(index), bytes(value)
                if value in self.bad_ids:  # already reported with its record
                    self.name_damaged(value, index)
                    continue
                record = self.txn.get(value, db=docs_db) if len(value) == 8 else None
                entry, key = _keys_entry(index)
                if record is None:
                    self.add("key-orphan", f"{entry} points to no record", key=key)
                    continue
                doc_id = codec.decode_id(value)
                if codec.key_index(*codec.record_key(record, doc_id)) != index:
                    self.add(
                        "key-orphan",
                        f"{entry} points to record {doc_id}, which has another key",
                        doc_id,
                        key,
                    )

    def name_damaged(self, raw_id: bytes, index: bytes) -> None:
        """Add to a damaged record's violation the key its ``keys`` entry names, and what
        to do: the record cannot say it, and removing the document needs the key."""
        key = codec.key_of_index(index)
        doc_id = codec.decode_id(raw_id) if len(raw_id) == codec.ID_BYTES else None
        advice = (
            f"key {key_text(key)}: remove it by that key, run check --repair, then add it again"
            if key is not None
            else "its key is too long to read back from the keys table; restore from a backup"
        )
        for i, violation in enumerate(self.found):
            if violation.doc_id == doc_id and violation.kind in _UNREADABLE:
                detail = f"{violation.detail} ({advice})"
                self.found[i] = replace(violation, detail=detail, key=key)

    def band_orphans(self, band: int, db: Any) -> None:
        split = self.store._band_layout.split
        for batch in _table_batches(self.txn, db):
            ids, sigs = [], []
            for band_key, raw_id in (split(key, value) for key, value in batch):
                if raw_id in self.bad_ids:
                    continue
                record = self.vouching_record(raw_id)
                if record is None:
                    self.add(
                        "band-orphan",
                        f"bucket {band_key.hex()} of band {band} lists id {raw_id.hex()}, "
                        "which has no record",
                    )
                    continue
                ids.append((band_key, raw_id))
                sigs.append(codec.decode_signature(record, codec.decode_id(raw_id)))
            if not ids:
                continue
            store = self.store
            actual = band_keys(np.stack(sigs), store.banding, store.config.seed)[:, band]
            kept = store._band_layout.band_key_bytes
            for (band_key, raw_id), key in zip(ids, codec.encode_band_keys(actual), strict=True):
                if key[:kept] != band_key:
                    doc_id = codec.decode_id(raw_id)
                    self.add(
                        "band-orphan",
                        f"bucket {band_key.hex()} of band {band} lists document {doc_id}, "
                        f"whose bucket is {key.hex()}",
                        doc_id,
                    )

    def vouching_record(self, raw_id: bytes) -> bytes | None:
        """The record, stored or awaiting a purge, of the id a band entry names."""
        if len(raw_id) != 8:
            return None
        record = self.txn.get(raw_id, db=self.store._docs_db)
        removed = self.store._removed_db
        if record is None and removed is not None:
            record = self.txn.get(raw_id, db=removed)
        return None if record is None else bytes(record)


def _table_batches(
    txn: lmdb.Transaction, db: Any, size: int = _BATCH
) -> Iterator[list[tuple[bytes, bytes]]]:
    """The ``(key, value)`` entries of a table in key order, ``size`` at a time."""
    batch: list[tuple[bytes, bytes]] = []
    with txn.cursor(db=db) as cursor:
        for key, value in cursor:
            batch.append((bytes(key), bytes(value)))
            if len(batch) == size:
                yield batch
                batch = []
    if batch:
        yield batch


def _fill_bands(
    txn: lmdb.Transaction,
    band_dbs: list[Any],
    ids: list[bytes],
    sigs: npt.NDArray[np.uint32],
    banding: LSHParams,
    seed: int,
    layout: codec.BandLayout,
) -> None:
    """Put every document of a batch into its bucket of every band (repair and rebuild)."""
    keys = band_keys(sigs, banding, seed)
    id_values = codec.decode_ids(ids)
    for band, db in enumerate(band_dbs):
        with txn.cursor(db=db) as cursor:
            cursor.putmulti(layout.entries(keys[:, band], id_values), dupdata=True)


_STALE_RETRIES = 5


def _run_check(store: Store, progress: _Progress | None = None) -> tuple[int, list[Violation]]:
    # Two commits of other processes between beginning the snapshot and reading its meta
    # page leave no snapshot to walk: begin again. If writers keep outrunning the walk,
    # the last try checks the tables without it.
    for attempt in range(_STALE_RETRIES + 1):
        with store.read() as reader:
            checker = _Checker(store, reader, progress)
            checker.run(walk=attempt < _STALE_RETRIES)
            if not checker.stale:
                break
    return checker.checked, checker.found


def _rederive(store: Store, damaged: set[bytes]) -> Any:
    """The repair's write operation (re-runnable after the map grows). ``damaged``: the
    ids of records the check found unreadable, whose keys entries are kept (the record
    cannot name its key, and removing the document needs it)."""

    def run(writer: WriteTxn) -> int:
        txn, env = writer.txn, store._require_env()
        for name in _stray_tables(store, txn):
            try:
                txn.drop(env.open_db(name, txn=txn, create=False), delete=True)
            except lmdb.IncompatibleError:  # a plain key in the main DB, not a table
                txn.delete(name)
        _reset_bad_counters(store, txn)
        naming: list[tuple[bytes, bytes]] = []
        if damaged:
            with txn.cursor(db=store._keys_db) as cursor:
                naming = [(bytes(k), bytes(v)) for k, v in cursor if bytes(v) in damaged]
        txn.drop(store._keys_db, delete=False)
        next_id = codec.read_meta(txn, store._meta_db, "next_doc_id")
        next_id = next_id if meta_count_ok("next_doc_id", next_id) else 0
        id_limit = store._band_layout.id_limit
        if store._removed_db is not None:  # the bands are re-derived from docs alone
            next_id = max(next_id, id_after(txn, store._removed_db, id_limit))  # never reused
            txn.drop(store._removed_db, delete=False)
        for db in store._band_dbs:
            txn.drop(db, delete=False)
        next_id = max(next_id, id_after(txn, store._docs_db, id_limit))  # readable or not

        def fill(batch: list[tuple[bytes, npt.NDArray[np.uint32]]]) -> None:
            if batch:
                _fill_bands(
                    txn, store._band_dbs, [raw_id for raw_id, _ in batch],
                    np.stack([sig for _, sig in batch]), store.banding, store.config.seed,
                    store._band_layout,
                )  # fmt: skip

        def index_records(
            batch: list[tuple[bytes, bytes]], overwrite: bool = True
        ) -> tuple[int, list[tuple[bytes, npt.NDArray[np.uint32]]]]:
            """Index the readable records of ``batch``: how many, and those whose key
            another record held (only without ``overwrite``)."""
            indexed, held = [], []
            for raw_id, value in batch:
                try:  # an undecodable record cannot be indexed: it stays reported
                    record = codec.decode_record(value, codec.decode_id(raw_id))
                    raw, is_str = codec.key_bytes(record.key)
                except ValueError:
                    continue
                if len(record.signature) != store.config.num_perm:
                    continue
                # The last record of a key (the newest) wins, as a replacement's record
                # comes after the one it replaced; an older duplicate stays reported.
                index = codec.key_index(raw, is_str)
                if txn.put(index, raw_id, db=store._keys_db, overwrite=overwrite):
                    indexed.append((raw_id, record.signature))
                else:
                    held.append((raw_id, record.signature))
            fill(indexed)
            return len(indexed), held

        restored = 0
        misplaced: list[tuple[bytes, bytes]] = []
        for batch in _table_batches(txn, store._docs_db):
            placed: list[tuple[bytes, bytes]] = []
            for raw_id, value in batch:
                (placed if codec.is_id(raw_id, id_limit) else misplaced).append((raw_id, value))
            restored += index_records(placed)[0]
        moved: list[tuple[bytes, bytes]] = []
        for raw_id, value in misplaced:  # a record under a key that is no id gets an id
            if next_id >= id_limit:
                break  # no id left to give: it stays reported
            moved.append((codec.encode_id(next_id), value))
            txn.delete(raw_id, db=store._docs_db)
            next_id += 1
        for new_id, value in moved:  # (not appended: a misplaced key may still sort last)
            txn.put(new_id, value, db=store._docs_db)
        count, held = index_records(moved, overwrite=False)
        restored += count
        # A moved record whose key a record with an id holds is, having no id to say
        # otherwise, that key's older version: it is removed, as a replacement leaves the
        # record it replaced (awaiting a purge, or at once in formats without one). Kept
        # under its new, newest id, it would take the key at the next repair.
        records = dict(moved)
        for new_id, _ in held:
            txn.delete(new_id, db=store._docs_db)
            if store._removed_db is not None:
                txn.put(new_id, records[new_id], db=store._removed_db)
        if store._removed_db is not None:
            fill(held)
        for index, raw_id in naming:  # unless a readable record holds the key now
            txn.put(index, raw_id, db=store._keys_db, overwrite=False)
        txn.put(b"next_doc_id", codec.pack_meta(next_id), db=store._meta_db)
        return restored

    return run


def _reset_bad_counters(store: Store, txn: lmdb.Transaction) -> None:
    """Give ``commit_counter`` and ``map_size`` a value every commit can count on when
    they are missing or not non-negative integers (the repair's own commit reads them).

    The commit counter is reset to LMDB's id of this transaction, not to 0: a dedup job
    tells its store, and a batch's commit, by a counter that only grows (:mod:`.ingest`),
    and LMDB counts every commit, ours among them (a compaction starts its count over, so
    this is a best guess there)."""
    for name, value in (("commit_counter", txn.id()), ("map_size", store._map_size())):
        current = codec.read_meta(txn, store._meta_db, name)
        if not meta_count_ok(name, current):
            txn.put(name.encode(), codec.pack_meta(value), db=store._meta_db)


def check(
    store: Store, repair: bool = False, progress: Callable[[int], None] | None = None
) -> CheckReport:
    """Verify every invariant of the on-disk format (see the module docstring).

    Args:
        repair: if something is found, rebuild the keys table and the band tables from
            the records (in one write transaction, dropping tables the format does not
            name and raising ``next_doc_id`` above every id), then check again.
        progress: called with the number of documents checked so far, every
            :data:`~.errors.PROGRESS_EVERY` of them and at the last; the check after a repair
            counts on from the first one's total.

    Returns:
        A :class:`CheckReport`; ``report.ok`` says whether the store is consistent now.

    Raises:
        ReadOnlyError: ``repair`` on a store opened read-only.

    Example:
        >>> report = store.check()  # doctest: +SKIP
        >>> report.ok, [v.kind for v in report.violations]  # doctest: +SKIP
        (True, [])
    """
    check_flags(repair=repair)
    check_progress(progress)
    if repair:
        store._check_writable()
    checked, found = _run_check(store, progress)
    damaged = any(v.kind == "structure" for v in found)
    if not (repair and found) or damaged:
        return CheckReport(checked, found, False, list(found))
    unreadable = {
        codec.encode_id(v.doc_id) for v in found if v.kind in _UNREADABLE and v.doc_id is not None
    }
    operation = _rederive(store, unreadable)
    try:
        with store.write() as writer:
            writer._run(operation, writer)
    finally:
        # Also when a Ctrl-C comes out of a repair whose commit went through (a new cache
        # is right whatever the store holds). The repair may give records new ids or
        # hand out again ids this cache holds other documents under; the cache also
        # notices from the records (another process's repair), but not when the reused
        # ids were removed again since.
        if store._band_cache is not None:
            store._band_cache = BandCache(store)
    again = None if progress is None else (lambda done: progress(checked + done))
    _, remaining = _run_check(store, again)
    return CheckReport(checked, found, True, remaining)
