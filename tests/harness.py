"""What the reliability suites share with their long settings in ``tools/``.

* :func:`raw_dump` reads every table of a store with plain LMDB, byte for byte: the
  strictest "nothing changed" there is (commit counter and map size included).
* :func:`logical_dump` is what a store *means*: parameters, documents by key, and each
  band's entries by key. It ignores internal ids, the commit counter, the band generation
  and the file layout, so a compacted or rebuilt store must dump equal to the original;
  band entries of removed documents awaiting a purge mean nothing, and are left out.
* :func:`orphan_band_entries` lists band entries that point at no document record
  (neither a stored one nor one in ``removed``, awaiting a purge).
* :class:`Model` is an in-memory reference: the documents a store should hold and the
  band entries and query answers that follow from them, computed without the store.
* :func:`older_export` rewrites an export as an earlier release wrote it (versions 1
  and 2: nothing sealed; version 1 without the end marker).
* :func:`interrupted_at_call` raises a Ctrl-C at a chosen Python call of a write's end,
  where a pending SIGINT would be raised.
* :func:`consistency_problems` checks, inside one read transaction of an open store, that
  its tables agree with each other (counts, keys, band entries against signatures);
  :func:`spread_consistency_problems` is the same check spread over several transactions.

Each dump opens the environment with plain LMDB, so the store must not be open in the
calling process (LMDB forbids opening one environment twice in a process); other
processes may hold it open.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lmdb
import msgpack
import numpy as np
import numpy.typing as npt

from neardup_store import codec
from neardup_store.lsh import LSHParams, band_keys

if TYPE_CHECKING:
    from neardup_store.store import Store
    from neardup_store.txn import ReadTxn

Key = str | bytes


def band_table_entry(
    band_key: bytes, doc_id: bytes, format_version: int = codec.FORMAT_VERSION
) -> tuple[bytes, bytes]:
    """The ``(table key, value)`` holding a band entry, restated from ``codec``'s docstring
    so that the tests do not take the layout from the code they test: format 4 keys by the
    band key's first byte and puts its next four, then the id's last five, in the value;
    format 3 keys by the first byte and leads the value with the other seven; older
    formats key by the whole band key."""
    if format_version >= 4:
        return band_key[:1], band_key[1:5] + doc_id[3:]
    if format_version == 3:
        return band_key[:1], band_key[1:] + doc_id
    return band_key, doc_id


def band_entry_of(
    key: bytes, value: bytes, format_version: int = codec.FORMAT_VERSION
) -> tuple[bytes, bytes]:
    """``(band key as kept, document id)`` of a stored band table entry (see
    :func:`band_table_entry` and :func:`kept_band_key`)."""
    if format_version >= 4:
        return key + value[:4], bytes(3) + value[4:]
    if format_version == 3:
        return key + value[:7], value[7:]
    return key, value


def kept_band_key(band_key: bytes, format_version: int = codec.FORMAT_VERSION) -> bytes:
    """The bytes of an 8-byte band key that a store of ``format_version`` keeps."""
    return band_key[:5] if format_version >= 4 else band_key


def format_version_of(tables: dict[bytes, list[tuple[bytes, bytes]]]) -> int:
    """The ``format_version`` meta entry of a :func:`raw_dump`."""
    meta = dict(tables[codec.META_DB])
    return int(codec.unpack_meta(meta[b"format_version"]))


def removed_ids(tables: dict[bytes, list[tuple[bytes, bytes]]]) -> set[bytes]:
    """The ids in the ``removed`` table of a :func:`raw_dump` (documents awaiting a purge)."""
    return {doc_id for doc_id, _ in tables.get(codec.REMOVED_DB, [])}


def raw_dump(path: str | Path) -> dict[bytes, list[tuple[bytes, bytes]]]:
    """Every (key, value) of every named table, in LMDB order (duplicates included)."""
    env = lmdb.open(str(path), readonly=True, max_dbs=1024, lock=True)
    try:
        with env.begin() as txn:
            names = [bytes(name) for name, _ in txn.cursor()]
        tables: dict[bytes, list[tuple[bytes, bytes]]] = {}
        for name in names:
            db = env.open_db(name, create=False)
            with env.begin(db=db) as txn:
                tables[name] = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
        return tables
    finally:
        env.close()


def raw_digest(path: str | Path) -> str:
    """SHA-256 of :func:`raw_dump`: equal digests mean byte-identical table contents."""
    return _digest(sorted(raw_dump(path).items()))


def logical_dump(path: str | Path) -> dict[str, Any]:
    """The store's meaning, independent of ids, generation, counters and file layout."""
    tables = raw_dump(path)
    meta = {k.decode(): codec.unpack_meta(v) for k, v in tables[codec.META_DB]}
    banding = dict(meta["banding"])
    generation = banding.pop("generation")
    keys_by_id: dict[bytes, Key] = {}
    documents: dict[Key, tuple[bytes, Any]] = {}
    for raw_id, data in tables[codec.DOCS_DB]:
        record = codec.decode_record(data, codec.decode_id(raw_id))
        key = record.key
        keys_by_id[raw_id] = key
        documents[key] = (record.signature.tobytes(), record.metadata)
    bands: dict[int, list[tuple[bytes, Key]]] = {}
    removed = removed_ids(tables)
    for index in range(int(banding["bands"])):
        entries = tables.get(codec.band_table_name(generation, index), [])
        version = meta["format_version"]
        bands[index] = sorted(
            (
                (band_key, keys_by_id.get(doc_id, doc_id))
                for band_key, doc_id in (band_entry_of(k, v, version) for k, v in entries)
                if doc_id not in removed
            ),
            key=_sort_key,
        )
    return {
        "format_version": meta["format_version"],
        "config": meta["config"],
        "banding": banding,
        "documents": dict(sorted(documents.items(), key=lambda item: _sort_key(item[0]))),
        "bands": bands,
        "keys": sorted((k for k, _ in tables[codec.KEYS_DB]), key=_sort_key),
    }


def logical_digest(path: str | Path) -> str:
    """SHA-256 of :func:`logical_dump`."""
    return _digest(logical_dump(path))


def orphan_band_entries(path: str | Path) -> list[tuple[bytes, bytes, bytes]]:
    """(table, band key, document id) of every band entry whose document record is missing
    (from ``docs``, and from ``removed``, where it would await a purge).

    Every band table counts, of any generation, so a table a rebuild failed to drop shows
    up too when it still points at removed documents.
    """
    tables = raw_dump(path)
    ids = {doc_id for doc_id, _ in tables[codec.DOCS_DB]} | removed_ids(tables)
    version = format_version_of(tables)
    return [
        (name, band_key, doc_id)
        for name, entries in sorted(tables.items())
        if name.startswith(b"band.")
        for band_key, doc_id in (band_entry_of(k, v, version) for k, v in entries)
        if doc_id not in ids
    ]


@dataclass
class Model:
    """The documents a store should hold, and everything that follows from them.

    Args:
        banding: the store's :class:`LSHParams`.
        seed: the store's MinHash seed (band keys are seeded with it).
    """

    banding: LSHParams
    seed: int
    documents: dict[Key, tuple[npt.NDArray[np.uint32], Any]] = field(default_factory=dict)

    def add(self, key: Key, signature: npt.ArrayLike, metadata: Any = None) -> None:
        """Add or replace ``key``; a replaced document moves last, as the store gives it a
        new id (which breaks query ties)."""
        self.documents.pop(key, None)
        self.documents[key] = (np.asarray(signature, dtype=np.uint32).copy(), metadata)

    def remove(self, key: Key) -> None:
        del self.documents[key]

    def band_entries(
        self, format_version: int = codec.FORMAT_VERSION
    ) -> dict[int, list[tuple[bytes, Key]]]:
        """Each band's (band key as kept, document key) entries the store must hold, sorted."""
        bands: dict[int, list[tuple[bytes, Key]]] = {i: [] for i in range(self.banding.bands)}
        if self.documents:
            keys = list(self.documents)
            sigs = np.stack([self.documents[k][0] for k in keys])
            for key, row in zip(keys, band_keys(sigs, self.banding, self.seed), strict=True):
                for index, band_key in enumerate(codec.encode_band_keys(row)):
                    bands[index].append((kept_band_key(band_key, format_version), key))
        return {i: sorted(entries, key=_sort_key) for i, entries in bands.items()}

    def query(
        self, signature: npt.ArrayLike, threshold: float, limit: int | None = None
    ) -> list[tuple[Key, float]]:
        """(key, score) of the documents a query must return, best score first.

        Ties are broken by insertion order, as the store breaks them by internal id.
        """
        sig = np.asarray(signature, dtype=np.uint32)
        mine = self._kept_band_keys(sig)
        found = []
        for order, (key, (stored, _)) in enumerate(self.documents.items()):
            theirs = self._kept_band_keys(stored)
            if any(a == b for a, b in zip(mine, theirs, strict=True)):
                score = float((stored == sig).mean())
                if score >= threshold:
                    found.append((-score, order, key))
        found.sort()
        return [(key, -neg) for neg, _, key in found[:limit]]

    def _kept_band_keys(self, signature: npt.NDArray[np.uint32]) -> list[bytes]:
        """The signature's band keys as a current store keeps them (its buckets)."""
        row = band_keys(signature[None, :], self.banding, self.seed)[0]
        return [kept_band_key(band_key) for band_key in codec.encode_band_keys(row)]

    def differences(self, path: str | Path) -> list[str]:
        """How the store at ``path`` differs from the model (empty when it matches)."""
        dump = logical_dump(path)
        problems = []
        banding = (dump["banding"]["bands"], dump["banding"]["rows"])
        if banding != (self.banding.bands, self.banding.rows):
            return [f"banding {banding} differs from the model's"]
        stored = dump["documents"]
        for key in sorted(set(stored) | set(self.documents), key=_sort_key):
            if key not in stored:
                problems.append(f"missing document {key!r}")
            elif key not in self.documents:
                problems.append(f"unexpected document {key!r}")
            else:
                sig, metadata = self.documents[key]
                if stored[key][0] != sig.tobytes():
                    problems.append(f"signature of {key!r} differs")
                if stored[key][1] != metadata:
                    problems.append(f"metadata of {key!r} differs")
        expected = self.band_entries(dump["format_version"])
        for index, entries in dump["bands"].items():
            if entries != expected[index]:
                extra = set(entries) - set(expected[index])
                lost = set(expected[index]) - set(entries)
                problems.append(
                    f"band {index}: {len(extra)} unexpected entries, {len(lost)} missing"
                )
        return problems


def _sort_key(item: Any) -> Any:
    """Order str and bytes keys together (str first) without comparing across types."""
    if isinstance(item, tuple):
        return tuple(_sort_key(part) for part in item)
    if isinstance(item, str):
        return (0, item.encode("utf-8"))
    if isinstance(item, bytes):
        return (1, item)
    return (2, item)


def _digest(value: Any) -> str:
    return hashlib.sha256(msgpack.packb(_plain(value), use_bin_type=True)).hexdigest()


def _plain(value: Any) -> Any:
    """A msgpack-ready copy with mappings turned into sorted lists of pairs."""
    if isinstance(value, Mapping):
        return [[_plain(k), _plain(v)] for k, v in sorted(value.items(), key=_sort_key)]
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tobytes()
    return value


# -- table agreement inside one snapshot ---------------------------------------------------------


def consistency_problems(reader: ReadTxn) -> list[str]:
    """How the tables of one read snapshot disagree (empty when they agree).

    Checks, all inside ``reader``: as many key entries as documents, and entries in every
    band table as documents and removed ones awaiting a purge; every key entry names a
    document whose record holds that key; every band entry names a document, stored or
    removed, and equals the band key derived from its signature; every document has
    exactly its band entries.
    """
    return _table_agreement(reader._store, lambda: nullcontext(reader))


def spread_consistency_problems(store: Store) -> list[str]:
    """The same check as :func:`consistency_problems`, but the documents, the key table and
    each band table are read in read transactions of their own.

    A negative control: while another process commits, the views come from different
    states, so this must report problems sooner or later. It shows the check can fail.
    """
    return _table_agreement(store, store.read)


def _table_agreement(
    store: Store, view: Callable[[], AbstractContextManager[ReadTxn]]
) -> list[str]:
    """Compare docs, keys and band tables, each read through ``view()`` (one or many txns)."""
    problems: list[str] = []
    with view() as reader:
        indexes: dict[bytes, bytes] = {}
        signatures = []
        with reader.txn.cursor(db=store._docs_db) as cursor:
            for raw_id, data in cursor:
                record = codec.decode_record(bytes(data), codec.decode_id(raw_id))
                raw, is_str = codec.key_bytes(record.key)
                indexes[bytes(raw_id)] = codec.key_index(raw, is_str)
                signatures.append(record.signature)
        removed = []
        if store._removed_db is not None:
            with reader.txn.cursor(db=store._removed_db) as cursor:
                for raw_id, data in cursor:
                    removed.append(bytes(raw_id))
                    signatures.append(codec.decode_signature(bytes(data)))
    ids = list(indexes)
    expected: list[set[tuple[bytes, bytes]]] = [set() for _ in range(store.banding.bands)]
    version = store._format_version
    if signatures:
        rows = band_keys(np.stack(signatures), store.banding, store.config.seed)
        for doc_id, row in zip(ids + removed, rows, strict=True):
            for band, band_key in enumerate(codec.encode_band_keys(row)):
                expected[band].add((kept_band_key(band_key, version), doc_id))
    with view() as reader, reader.txn.cursor(db=store._keys_db) as cursor:
        key_entries = [(bytes(k), bytes(v)) for k, v in cursor]
    if len(key_entries) != len(ids):
        problems.append(f"{len(key_entries)} key entries for {len(ids)} documents")
    wrong = sum(indexes.get(doc_id) != index for index, doc_id in key_entries)
    if wrong:
        problems.append(f"{wrong} key entries name a missing document or another key")
    for band, wanted in enumerate(expected):
        with view() as reader, reader.txn.cursor(db=store._band_dbs[band]) as cursor:
            entries = [band_entry_of(bytes(k), bytes(v), version) for k, v in cursor]
        if len(entries) != len(ids) + len(removed):
            problems.append(
                f"band {band}: {len(entries)} entries for {len(ids)} documents "
                f"and {len(removed)} awaiting a purge"
            )
        found = set(entries)
        stray, missing = len(found - wanted), len(wanted - found)
        if stray or missing:
            problems.append(
                f"band {band}: {stray} entries match no document's signature, "
                f"{missing} documents lack their entry"
            )
    return problems


PROJECT_ROOT = Path(__file__).resolve().parents[1]


class LineDrivenProcess:
    """A Python child running ``script`` (with ``args``), driven one command line at a
    time: each call writes a line and returns the child's one-line reply. The child reads
    the project's own package, and ``stop`` sends ``quit``."""

    def __init__(self, script: str, *args: str, timeout: float = 60.0) -> None:
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
        self.timeout = timeout
        self.process = subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def __call__(self, command: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.communicate("quit\n", timeout=self.timeout)


def older_export(data: bytes, version: int) -> bytes:
    """An export stream of this release (version 3) as version ``version`` (1 or 2) holds
    the same documents: its header's fields and each record bare, without checksums, and
    for version 1 no end marker."""
    header, *records, trailer = msgpack.Unpacker(io.BytesIO(data), raw=False)
    fields = codec.unsealed(header["body"], header["checksum"])
    parts = [msgpack.packb({"format": codec.EXPORT_FORMAT, "version": version, **fields})]
    parts += [msgpack.packb(codec.unsealed(*record), use_bin_type=True) for record in records]
    if version > 1:
        parts.append(msgpack.packb(trailer))
    return b"".join(parts)


def interrupted_at_call(
    at: int, run: Callable[[], object], counting: Callable[[], bool] = lambda: True
) -> tuple[KeyboardInterrupt | None, int]:
    """Run ``run`` with a ``KeyboardInterrupt`` raised at the entry of its ``at``-th Python
    call (from 0) since a write transaction's ``_finish`` began, of those made while
    ``counting()`` holds: a function's entry is where CPython handles a pending signal.
    Returns the interrupt (``None`` if fewer calls came) and how many calls were counted."""
    calls, ending = 0, False

    def hook(frame: Any, event: str, arg: object) -> None:
        nonlocal calls, ending
        if event != "call":
            return
        ending = ending or frame.f_code.co_name == "_finish"
        if ending and counting():
            calls += 1
            if calls == at + 1:
                raise KeyboardInterrupt

    stopped: KeyboardInterrupt | None = None
    sys.settrace(hook)
    try:
        run()
    except KeyboardInterrupt as error:
        stopped = error
    finally:
        sys.settrace(None)
    return stopped, calls


def read_error_at_call(function: Callable[..., Any], number: int) -> Callable[..., Any]:
    """``function`` failing at its call ``number`` (from 1) with the ``OSError`` of a
    read that fails part-way (EIO: a failing disk, NFS, FUSE), as itself otherwise."""
    calls = 0

    def failing(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == number:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return function(*args, **kwargs)

    return failing
