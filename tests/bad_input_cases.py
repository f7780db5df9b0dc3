"""The bad-input table, shared by ``tests/test_bad_input.py`` and ``tools/bad_input_report.py``.

Each :class:`Case` is one operation on a real store (or on a path that should be one) that
must be refused with a specific :class:`NeardupError` subclass whose message names the
problem, and must leave every byte of every table as it was (:func:`harness.raw_digest`).
Paths that are not stores have no tables: their state is every byte of every file in them
(see :func:`state_digest`).

Store-level cases are written once against "a target" that is either an open
:class:`Store` (the operation runs as its own transaction) or a :class:`WriteTxn` (the
operation is one of several inside a ``store.write()`` block), because the two expose the
same methods; :func:`run_in_write_block` runs the second form.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import string
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import numpy as np
import xxhash
from harness import raw_digest

from neardup_store import codec
from neardup_store.errors import (
    BatchTypeError,
    CorruptRecordError,
    DuplicateKeyError,
    EmptyDocumentError,
    InputTypeError,
    InvalidKeyError,
    InvalidParameterError,
    InvalidStreamError,
    KeyNotFoundError,
    MetadataError,
    NeardupError,
    NotAStoreError,
    ParamsMismatchError,
    ReadOnlyError,
    StoreBusyError,
    StoreNotFoundError,
    TextDecodeError,
)
from neardup_store.store import Store
from neardup_store.text import ShingleConfig

NUM_PERM = 64
PARAMS: dict[str, Any] = {"threshold": 0.7, "num_perm": NUM_PERM, "bands": 16, "rows": 4}
# Files LMDB and the store rewrite on every open (reader table, flock targets): not data.
LOCK_FILES = frozenset({"lock.mdb", "neardup.lock", "neardup.create.lock"})


def texts(count: int, seed: int = 0, length: int = 300) -> list[str]:
    """Random-letter texts: no two share more than a few 5-shingles."""
    rng = random.Random(seed)
    return ["".join(rng.choices(string.ascii_lowercase + " ", k=length)) for _ in range(count)]


TEXT, OTHER, THIRD = texts(3, seed=11)
SEEDED: list[tuple[Any, str, Any]] = [
    ("alpha", texts(1, seed=1)[0], {"n": 1, "tags": ["a", "b"]}),
    (b"beta", texts(1, seed=2)[0], None),
    ("gamma", texts(1, seed=3)[0], [1, 2.5, "three", b"four", None, True]),
]
"""What every standard store holds before a case runs: str and bytes keys, metadata."""


def make_store(path: Path) -> None:
    """The standard store: :data:`SEEDED` in one committed transaction, then closed."""
    with Store.open(path, create=True, **PARAMS) as store, store.write() as txn:
        txn.add_many(SEEDED)


def good_signature() -> np.ndarray:
    return np.arange(1, NUM_PERM + 1, dtype=np.uint32)


# -- what is at the path, for the open cases ---------------------------------------------------


def make_random_file(path: Path) -> None:
    path.write_bytes(random.Random(5).randbytes(64 * 1024))


def make_random_data_mdb(path: Path) -> None:
    path.mkdir()
    (path / "data.mdb").write_bytes(random.Random(6).randbytes(64 * 1024))


def make_foreign_lmdb(path: Path) -> None:
    """Another application's LMDB environment: named tables, none of them ours."""
    env = lmdb.open(str(path), max_dbs=4)
    users = env.open_db(b"users")
    with env.begin(write=True) as txn:
        txn.put(b"version", b"3")
        txn.put(b"u:1", b"alice", db=users)
    env.close()


def make_nothing(path: Path) -> None:
    del path


def make_directory_of_notes(path: Path) -> None:
    """A directory that holds someone's files and no store (a mistyped store path)."""
    path.mkdir()
    (path / "notes.txt").write_text("not a store")


def export_bytes(path: Path) -> bytes:
    """An export of a store with :data:`SEEDED` (made in a scratch directory)."""
    with tempfile.TemporaryDirectory() as scratch:
        make_store(Path(scratch) / "s")
        with Store.open(Path(scratch) / "s") as store:
            out = io.BytesIO()
            store.export(out)
            return out.getvalue()


def _header(**changes: Any) -> bytes:
    """The standard store's export header, its sealed fields changed by ``changes``."""
    fields = {**codec.unsealed(*_sealed_fields()), **changes}
    return codec.export_header(fields["config"], fields["banding"], fields["package_version"])


def _sealed_fields() -> tuple[bytes, int]:
    """The sealed body and checksum of the standard store's export header."""
    header = next(msgpack.Unpacker(io.BytesIO(export_bytes_cached()), raw=False))
    return header["body"], header["checksum"]


_EXPORT: list[bytes] = []


def export_bytes_cached() -> bytes:
    if not _EXPORT:
        with tempfile.TemporaryDirectory() as scratch:
            _EXPORT.append(export_bytes(Path(scratch)))
    return _EXPORT[0]


def crafted_stream(*records: bytes, trailer: bytes | None = None) -> Callable[[], bytes]:
    """A valid export header (``new-*`` keys free in the standard store), ``records``, then
    the end marker counting them (or ``trailer``)."""
    end = codec.export_trailer(len(records)) if trailer is None else trailer
    return lambda: _header() + b"".join(records) + end


def _record(key: Any, signature: Any, metadata: Any = None) -> bytes:
    return codec.export_item(key, signature, metadata)


def _sealed_object(value: Any) -> bytes:
    """``value`` as a record of an export stream would carry it: sealed, right or not."""
    return msgpack.packb(list(codec.sealed(value)), use_bin_type=True)


GOOD_SIG_BYTES = good_signature().astype("<u4").tobytes()
STREAMS: dict[str, tuple[Callable[[], bytes], str]] = {
    "empty stream": (lambda: b"", "the stream is empty"),
    "random bytes": (lambda: random.Random(7).randbytes(4096), "not"),
    "a msgpack value that is no header": (lambda: msgpack.packb([1, 2, 3]), "no export header"),
    "unknown export version": (
        lambda: msgpack.packb({"format": codec.EXPORT_FORMAT, "version": 99}),
        "export version 99",
    ),
    "config of another store": (
        lambda: _header(config={**codec.unsealed(*_sealed_fields())["config"], "seed": 2}),
        "another configuration",
    ),
    "header with a threshold no store can have": (
        lambda: _header(banding={**codec.unsealed(*_sealed_fields())["banding"], "threshold": 2}),
        "parameters do not decode",
    ),
    "header whose body does not match its checksum": (
        lambda: msgpack.packb(
            {
                "format": codec.EXPORT_FORMAT,
                "version": codec.EXPORT_VERSION,
                "body": _sealed_fields()[0].replace(b"threshold", b"threshol\xe4"),
                "checksum": _sealed_fields()[1],
            }
        ),
        "its header is damaged",
    ),
    "header cut short": (lambda: _header()[:30], "ends inside its header"),
    "record of wrong arity": (
        crafted_stream(_sealed_object(["new-1", GOOD_SIG_BYTES])),
        "not a [key, signature, metadata] record",
    ),
    "record whose body does not match its checksum": (
        crafted_stream(_record("new-1", GOOD_SIG_BYTES).replace(b"new-1", b"new-2")),
        "record #1 is damaged (its checksum does not match",
    ),
    "a bare record in a stream of sealed ones": (
        crafted_stream(msgpack.packb(["new-1", GOOD_SIG_BYTES, None], use_bin_type=True)),
        "neither a [body, checksum] record",
    ),
    "record with a short signature": (
        crafted_stream(_record("new-1", GOOD_SIG_BYTES[:-4])),
        f"expected {4 * NUM_PERM}",
    ),
    "record with an int signature": (crafted_stream(_record("new-1", 12)), "signature is int"),
    "record with an int key": (crafted_stream(_record(17, GOOD_SIG_BYTES)), "keys are str or"),
    "record with an empty key": (crafted_stream(_record("", GOOD_SIG_BYTES)), "must not be empty"),
    "record declaring a 64 MiB signature, 2 MiB given": (
        crafted_stream(b"\x93\xa5new-1\xc6\x04\x00\x00\x00" + b"\x00" * (2 << 20)),
        "is larger than 1048576 bytes",
    ),
    "record declaring a 4 GiB key, 2 MiB given": (
        crafted_stream(b"\x93\xdb\xff\xff\xff\xf0" + b"x" * (2 << 20)),
        "is larger than 1048576 bytes",
    ),
    "record declaring a 4 GiB key, then the stream ends": (
        crafted_stream(b"\x93\xdb\xff\xff\xff\xf0" + b"x" * 64),
        "ends inside object #1",
    ),
    "record declaring 2**32-1 elements": (
        crafted_stream(b"\xdd\xff\xff\xff\xff" + b"\xc0" * 64),
        "exceeds max_array_len",
    ),
    "metadata declaring 2**32-1 map entries": (
        crafted_stream(b"\x93\xa5new-1\xc4\x00\xdf\xff\xff\xff\xff"),
        "exceeds max_map_len",
    ),
    "metadata nested 100000 deep": (
        crafted_stream(b"\x93\xa5new-1" + msgpack.packb(GOOD_SIG_BYTES) + b"\x91" * 100_000),
        "not valid msgpack",
    ),
    "cut short between records (no end marker)": (
        crafted_stream(_record("new-1", GOOD_SIG_BYTES), trailer=b""),
        "without the export's end marker",
    ),
    "end marker counting other records": (
        crafted_stream(_record("new-1", GOOD_SIG_BYTES), trailer=codec.export_trailer(2)),
        "counts 2 records, the stream holds 1",
    ),
    "an object after the end marker": (
        crafted_stream(trailer=codec.export_trailer(0) + _record("new-1", GOOD_SIG_BYTES)),
        "follows the export's end marker",
    ),
    "truncated after a good record": (
        lambda: crafted_stream(_record("new-1", GOOD_SIG_BYTES))()[:-3],
        "ends inside object",
    ),
    "a bad record after good ones (one batch)": (
        crafted_stream(
            _record("new-1", GOOD_SIG_BYTES), _record("new-2", GOOD_SIG_BYTES), _record("x", b"")
        ),
        "record #3",
    ),
}


def _import(name: str) -> Callable[[Any], object]:
    make = STREAMS[name][0]
    return lambda store: store.import_(io.BytesIO(make()))


# -- crafted records inside a store ------------------------------------------------------------


def _sealed(body: bytes) -> bytes:
    return body + codec._CHECKSUM.pack(xxhash.xxh64_intdigest(body))


def _record_body(key: bytes, flags: int, metadata: bytes, num_perm: int = NUM_PERM) -> bytes:
    return (
        codec._HEADER.pack(codec.RECORD_VERSION, flags, num_perm, len(key))
        + key
        + good_signature().astype("<u4").tobytes()[: 4 * num_perm].ljust(4 * num_perm, b"\0")
        + metadata
    )


CRAFTED_RECORDS: dict[str, tuple[bytes, str]] = {
    "metadata declaring 2**32-1 elements": (
        _sealed(_record_body(b"crafted", 3, b"\xdd\xff\xff\xff\xff\xc0")),
        "exceeds max_array_len",
    ),
    "metadata nested 100000 deep": (
        _sealed(_record_body(b"crafted", 3, b"\x91" * 100_000 + b"\xc0")),
        "undecodable",
    ),
    "str key that is not UTF-8": (_sealed(_record_body(b"\xff\xfe", 1, b"")), "undecodable"),
    "key length past the end": (
        _sealed(codec._HEADER.pack(1, 1, NUM_PERM, 1 << 30) + b"crafted"),
        "overrun",
    ),
    "checksum that does not match": (
        _record_body(b"crafted", 1, b"") + b"\0" * 8,
        "checksum mismatch",
    ),
}


def plant_record(path: Path, record: bytes, key: bytes = b"crafted") -> None:
    """Put ``record`` into a closed store's ``docs`` table as the next document, indexed
    under the str key ``key``, the way an attacker who can write the file would."""
    env = lmdb.open(str(path), max_dbs=64)
    docs, keys, meta = (env.open_db(n, create=False) for n in (b"docs", b"keys", b"meta"))
    with env.begin(write=True) as txn:
        doc_id = codec.unpack_meta(txn.get(b"next_doc_id", db=meta))
        txn.put(codec.encode_id(doc_id), record, db=docs)
        txn.put(codec.key_index(key, True), codec.encode_id(doc_id), db=keys)
        txn.put(b"next_doc_id", codec.pack_meta(doc_id + 1), db=meta)
    env.close()


def _store_with(record: bytes) -> Callable[[Path], None]:
    def prepare(path: Path) -> None:
        make_store(path)
        plant_record(path, record)

    return prepare


# -- the table ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One refused operation.

    Attributes:
        call: the operation on a target (an open ``Store``, or a ``WriteTxn`` when
            ``in_write``); ``None`` for open cases.
        open_path: for open cases, the operation given the path.
        prepare: makes what is at the path beforehand.
        in_write: also run ``call`` inside a write block between good operations.
        is_store: the path holds a store (state: :func:`raw_digest`), else files.
    """

    name: str
    operation: str
    error: type[NeardupError]
    fragment: str
    call: Callable[[Any], object] | None = None
    open_path: Callable[[Path], object] | None = None
    prepare: Callable[[Path], None] = make_store
    read_only: bool = False
    in_write: bool = True
    is_store: bool = True


def _open(**options: Any) -> Callable[[Path], object]:
    def attempt(path: Path) -> object:
        Store.open(path, **options).close()
        return None

    return attempt


def _add_with_key(key: object) -> Callable[[Any], object]:
    return lambda target: target.add(key, TEXT)


def _add_signatures_with_key(key: object) -> Callable[[Any], object]:
    items = [("new", good_signature()), (key, good_signature())]
    return lambda target: target.add_signatures(items)


def _remove_key(key: object) -> Callable[[Any], object]:
    return lambda target: target.remove(key, missing_ok=True)


def _nested_write(store: Store) -> None:
    """Add in a write block, then open a second one inside it (the first rolls back)."""
    with store.write() as txn:
        txn.add("new", TEXT)
        with store.write():
            pass


def _sig(values: Any, dtype: Any = None) -> Any:
    return np.asarray(values, dtype=dtype)


KEY_ERRORS: list[tuple[str, object, str]] = [
    ("empty str key", "", "must not be empty"),
    ("empty bytes key", b"", "must not be empty"),
    (f"key of {codec.MAX_KEY_BYTES + 1} bytes", "k" * (codec.MAX_KEY_BYTES + 1), "at most"),
    ("key of 100000 bytes", b"k" * 100_000, "100000 bytes long"),
    ("str key with a lone surrogate", "a\ud800b", "not encodable as UTF-8"),
    ("int key", 7, "not int"),
    ("None key", None, "not NoneType"),
    ("float key", 1.5, "not float"),
    ("tuple key", ("a", "b"), "not tuple"),
]

CASES: list[Case] = [
    # documents
    Case("empty document", "add", EmptyDocumentError, "empty after normalisation",
         lambda t: t.add("new", "")),
    Case("whitespace-only document", "add", EmptyDocumentError, "empty after normalisation",
         lambda t: t.add("new", " \t\n\u00a0\u3000 ")),
    Case("empty document in a batch", "add_many", EmptyDocumentError, "document #1",
         lambda t: t.add_many([("new-1", TEXT), ("new-2", "   ")])),
    Case("invalid UTF-8 with an encoding", "add", TextDecodeError, "not valid utf-8",
         lambda t: t.add("new", b"caf\xe9 au lait", encoding="utf-8")),
    Case("invalid UTF-8 in a batch", "add_many", TextDecodeError, "document #1",
         lambda t: t.add_many([("new-1", TEXT), ("new-2", b"\xff\xfe\xfa")], encoding="utf-8")),
    Case("bytes without an encoding", "add", InputTypeError, "pass encoding=",
         lambda t: t.add("new", TEXT.encode())),
    Case("None as the document of a batch item", "add_many", InputTypeError, "got NoneType",
         lambda t: t.add_many([("new-1", TEXT), ("new-2", None)])),
    Case("unknown encoding", "add", InvalidParameterError, "encoding=",
         lambda t: t.add("new", b"abc", encoding="no-such-codec")),
    # a NUL in the name made Python's decode raise a plain ValueError (review 44)
    Case("encoding with a NUL", "add", InvalidParameterError, "encoding='utf-8\\x00'",
         lambda t: t.add("new", b"abc", encoding="utf-8\x00")),
    Case("encoding with a NUL in a batch", "add_many", InvalidParameterError,
         "a codec name", lambda t: t.add_many([("new", b"abc")], encoding="utf-8\x00")),
    Case("query with bytes and no encoding", "query", InputTypeError, "got bytes",
         lambda t: t.query(TEXT.encode())),
    Case("query with an empty document", "query", EmptyDocumentError, "empty",
         lambda t: t.query("  ")),
    # keys
    *[
        Case(name, "add", InvalidKeyError, fragment, _add_with_key(key))
        for name, key, fragment in KEY_ERRORS
    ],
    *[
        Case(f"{name} (add_signatures)", "add_signatures", InvalidKeyError, fragment,
             _add_signatures_with_key(key))
        for name, key, fragment in KEY_ERRORS[:3]
    ],
    *[
        Case(f"{name} (remove)", "remove", InvalidKeyError, fragment,
             _remove_key(key))
        for name, key, fragment in KEY_ERRORS[::2]
    ],
    # one str where a batch belongs (iterated, it would be one item per character)
    Case("remove_many of one str", "remove", BatchTypeError, "iterable of keys, got str",
         lambda t: t.remove_many("alpha")),
    Case("add_many of one str", "add_many", BatchTypeError, "call add()",
         lambda t: t.add_many(TEXT)),
    Case("add_signatures of one bytes", "add_signatures", BatchTypeError,
         "iterable of (key, signature) items", lambda t: t.add_signatures(b"ab")),
    Case("add_many_if_unique of one str", "add_many", BatchTypeError, "call add_if_unique()",
         lambda t: t.add_many_if_unique("ab")),
    Case("add_signatures_if_unique of one str", "add_signatures", BatchTypeError,
         "add_if_unique(key, signature=...)", lambda t: t.add_signatures_if_unique("ab")),
    Case("query_many of one str", "query", BatchTypeError, "call query()",
         lambda t: t.query_many(TEXT)),
    # a 0-d array is an Iterable by its type, then its iteration failed raw (review 44)
    Case("add_many of a 0-d array", "add_many", BatchTypeError, "got a 0-d ndarray",
         lambda t: t.add_many(np.array(TEXT))),
    Case("add_many_if_unique of a 0-d array", "add_many", BatchTypeError, "call add_if_unique()",
         lambda t: t.add_many_if_unique(np.array(TEXT))),
    Case("add_signatures of a 0-d array", "add_signatures", BatchTypeError, "got a 0-d ndarray",
         lambda t: t.add_signatures(np.array(None))),
    Case("remove_many of a 0-d array", "remove", BatchTypeError, "got a 0-d ndarray",
         lambda t: t.remove_many(np.array("alpha"))),
    Case("query_many of a 0-d array", "query", BatchTypeError, "call query()",
         lambda t: t.query_many(np.array(TEXT))),
    Case("add with neither text nor signature", "add", InvalidParameterError, "neither given",
         lambda t: t.add("new")),
    Case("query by a signature passed as the text", "query", InputTypeError, "signature=",
         lambda t: t.query(good_signature())),
    Case("remove of a missing key", "remove", KeyNotFoundError, "not in the store",
         lambda t: t.remove("missing")),
    Case("remove_many with a missing key", "remove", KeyNotFoundError, "'missing'",
         lambda t: t.remove_many(["alpha", "missing"])),
    Case("duplicate key within a batch", "add_many", DuplicateKeyError, "more than once",
         lambda t: t.add_many([("new", TEXT), ("other", OTHER), ("new", THIRD)])),
    Case("duplicate str/bytes key within a batch", "add_signatures", DuplicateKeyError,
         "more than once",
         lambda t: t.add_signatures([(b"new", good_signature()), (b"new", good_signature())])),
    Case("key stored by an earlier batch", "add_many", DuplicateKeyError, "already in the store",
         lambda t: t.add_many([("new", TEXT), ("alpha", OTHER)])),
    Case("key stored by an earlier batch (single add)", "add", DuplicateKeyError,
         "already in the store", lambda t: t.add(b"beta", TEXT)),
    # flags: a truthy string or a None must not decide whether data is replaced or removed
    Case("replace='no' on a stored key", "add", InvalidParameterError, "replace='no'",
         lambda t: t.add("alpha", TEXT, replace="no")),
    Case("replace='yes' in a batch", "add_many", InvalidParameterError, "replace='yes'",
         lambda t: t.add_many([("alpha", OTHER)], replace="yes")),
    Case("replace=1 for signatures", "add_signatures", InvalidParameterError, "replace=1",
         lambda t: t.add_signatures([("alpha", good_signature())], replace=1)),
    Case("missing_ok='no' with a missing key", "remove", InvalidParameterError,
         "missing_ok='no'", lambda t: t.remove_many(["alpha", "missing"], missing_ok="no")),
    Case("missing_ok=None", "remove", InvalidParameterError, "missing_ok=None",
         lambda t: t.remove("alpha", missing_ok=None)),
    Case("check with repair='no'", "check", InvalidParameterError, "repair='no'",
         lambda store: store.check(repair="no"), in_write=False),
    Case("compact with dry_run=None", "compact", InvalidParameterError, "dry_run=None",
         lambda store: store.compact(dry_run=None), in_write=False),
    Case("import with replace='no'", "import", InvalidParameterError, "replace='no'",
         lambda store: store.import_(io.BytesIO(export_bytes_cached()), replace="no"),
         in_write=False),
    # progress= is first called after a batch commits: it must be refused before that
    *(
        Case(f"{operation} with progress=5", operation, InvalidParameterError, "progress=5",
             call, in_write=False)
        for operation, call in (
            ("import", lambda store: store.import_(
                io.BytesIO(export_bytes_cached()), batch_size=1, progress=5, replace=True)),
            ("compact", lambda store: store.compact(progress=5)),
            ("rebuild", lambda store: store.rebuild(progress=5)),
            ("export", lambda store: store.export(io.BytesIO(), progress=5)),
            ("export_file", lambda store: store.export_file(
                store.path.parent / "out.export", progress=5)),
            ("backup", lambda store: store.backup(store.path.parent / "copy", progress=5)),
        )
    ),
    *(
        Case(f"{operation} to path None", operation, InvalidParameterError, "path=None",
             call, in_write=False)
        for operation, call in (
            ("backup", lambda store: store.backup(None)),
            ("export_file", lambda store: store.export_file(None)),
        )
    ),
    *(
        Case(f"{operation} to a path with {what}", operation, InvalidParameterError, fragment,
             lambda store, call=call, end=end: call(store, f"{store.path.parent}/out{end}"),
             in_write=False)
        for operation, call in (
            ("backup", lambda store, path: store.backup(path)),
            ("export_file", lambda store, path: store.export_file(path)),
        )
        for what, end, fragment in (
            ("a NUL", "\x00", "without a NUL character"),
            ("a lone surrogate", "\udfff", "the file name encoding"),
        )
    ),
    Case("open with path None", "open", InvalidParameterError, "path=None",
         open_path=lambda path: Store.open(None), is_store=True),  # type: ignore[arg-type]
    Case("create_from_export at path 5", "import", InvalidParameterError, "path=5",
         open_path=lambda path: Store.create_from_export(  # type: ignore[arg-type]
             5, io.BytesIO(export_bytes_cached()))),
    # metadata
    Case("metadata that is a set", "add", MetadataError, "cannot be stored",
         lambda t: t.add("new", TEXT, metadata={1, 2})),
    Case("metadata over 64 KiB", "add", MetadataError, "at most 65536 bytes",
         lambda t: t.add("new", TEXT, metadata="x" * 70_000)),
    # the reason named msgpack's option, not the rule (review 44)
    Case("metadata map with int keys", "add", MetadataError,
         "would not read back: map keys must be str or bytes, not int",
         lambda t: t.add("new", TEXT, metadata={1: "a"})),
    Case("metadata map with a tuple key, nested", "add", MetadataError,
         "map keys must be str or bytes, not tuple",
         lambda t: t.add("new", TEXT, metadata={"pages": [{"a": 1}, {(1, 2): "b"}]})),
    # the item a batch's bad metadata belongs to was not named (review 22)
    Case("bad metadata in a batch", "add_many", MetadataError,
         "item #1 (key 'new-2') metadata rejected",
         lambda t: t.add_many([("new-1", TEXT), ("new-2", OTHER, {1, 2})])),
    Case("bad metadata in a batch of signatures", "add_signatures", MetadataError,
         "item #0 (key b'new') metadata rejected",
         lambda t: t.add_signatures_if_unique([(b"new", good_signature(), object())])),
    # the *_if_unique calls advised replace=True, which none of them takes (review 22)
    Case("add_if_unique of a stored key", "add", DuplicateKeyError,
         "never overwrite a stored key: remove it first", lambda t: t.add_if_unique("alpha", TEXT)),
    Case("add_many_if_unique of a stored key", "add_many", DuplicateKeyError,
         "never overwrite a stored key", lambda t: t.add_many_if_unique([(b"beta", TEXT)])),
    # signatures
    Case("signature one value short", "add", InvalidParameterError, f"(n, {NUM_PERM})",
         lambda t: t.add("new", signature=good_signature()[:-1])),
    Case("signatures one value long", "add_signatures", InvalidParameterError,
         f"shape (1, {NUM_PERM + 1})",
         lambda t: t.add_signatures([("new", np.arange(NUM_PERM + 1, dtype=np.uint32))])),
    Case("signature rows of different lengths", "add_signatures", InvalidParameterError,
         "different shapes",
         lambda t: t.add_signatures([("new-1", good_signature()),
                                     ("new-2", good_signature()[:-1])])),
    *(
        Case(f"a {kind} signature among integer ones", "add_signatures", InvalidParameterError,
             f"signature of {kind} values",
             lambda t, rows=rows: t.add_signatures(
                 [("new-1", good_signature()), ("new-2", rows)]))
        for kind, rows in (("bool", np.ones(NUM_PERM, dtype=bool)),
                           ("float64", [1.5] * NUM_PERM))
    ),
    Case("float signature", "add", InvalidParameterError, "float64",
         lambda t: t.add("new", signature=_sig(good_signature(), np.float64))),
    Case("int64 signature over 2**32", "add_signatures", InvalidParameterError, "out of range",
         lambda t: t.add_signatures([("new", _sig([2**32 + 5] * NUM_PERM, np.int64))])),
    Case("negative signature value", "add", InvalidParameterError, "out of range",
         lambda t: t.add("new", signature=_sig([-1] + [3] * (NUM_PERM - 1), np.int64))),
    Case("two-dimensional signature", "add", InvalidParameterError, "one signature",
         lambda t: t.add("new", signature=np.stack([good_signature()] * 2))),
    Case("string signature", "add", InvalidParameterError, "<U",
         lambda t: t.add("new", signature=["x"] * NUM_PERM)),
    Case("add_signatures of a bare signature array", "add_signatures", InvalidParameterError,
         "zip(keys, signatures)",
         lambda t: t.add_signatures(np.stack([good_signature()] * 40))),
    Case("query by a short signature", "query", InvalidParameterError, f"(n, {NUM_PERM})",
         lambda t: t.query(signature=good_signature()[:10])),
    Case("both text and signature", "add", InvalidParameterError, "exactly one",
         lambda t: t.add("new", TEXT, signature=good_signature())),
    # crafted records inside a store
    *[
        Case(f"crafted docs record: {name}", "query", CorruptRecordError, fragment,
             lambda t: t.get("crafted"), prepare=_store_with(record))
        for name, (record, fragment) in CRAFTED_RECORDS.items()
    ],
    # imports
    *[
        Case(f"import: {name}", "import", InvalidStreamError, fragment, _import(name),
             in_write=False)
        for name, (_, fragment) in STREAMS.items()
    ],
    Case("import from a text stream", "import", InvalidParameterError, "binary stream",
         lambda store: store.import_(io.StringIO("x")), in_write=False),
    Case("export to a text stream", "export", InvalidParameterError, "open the file with 'wb'",
         lambda store: store.export(io.StringIO()), in_write=False),
    Case("exact given as a string", "query", InvalidParameterError, "a function from a stored",
         lambda t: t.query(TEXT, exact="texts.jsonl")),
    # The source's bad text was blamed on the caller's query, "document #0" (review 22).
    Case("exact giving no text for a stored key", "query", InvalidParameterError,
         "exact('alpha')=None is not valid", lambda t: t.query(SEEDED[0][1], exact=lambda k: None)),
    Case("exact giving an empty text in a batch", "query", InvalidParameterError,
         "exact('alpha')='' is not valid",
         lambda t: t.query_many([TEXT, SEEDED[0][1]], exact=lambda k: "")),
    Case("export to a path", "export", InvalidParameterError, "open the file with 'wb'",
         lambda store: store.export("corpus.export"), in_write=False),  # type: ignore[arg-type]
    Case("import from a path", "import", InvalidParameterError, "open the file with 'rb'",
         lambda store: store.import_("corpus.export"), in_write=False),  # type: ignore[arg-type]
    Case("write block inside a write block", "add", StoreBusyError, "inside another one",
         lambda store: _nested_write(store), in_write=False),
    Case("import of a key already stored", "import", DuplicateKeyError, "already in the store",
         lambda store: store.import_(io.BytesIO(export_bytes_cached())), in_write=False),
    # opening
    Case("conflicting num_perm on reopen", "open", ParamsMismatchError,
         f"num_perm: store has {NUM_PERM}, asked for 128", open_path=_open(num_perm=128)),
    Case("conflicting threshold and seed on reopen", "open", ParamsMismatchError,
         "seed: store has 1, asked for 9", open_path=_open(threshold=0.5, seed=9)),
    Case("reopen with a threshold given as a string", "open", InvalidParameterError,
         "threshold='0.8'", open_path=_open(threshold="0.8")),
    Case("reopen with num_perm 0", "open", InvalidParameterError, "num_perm=0",
         open_path=_open(num_perm=0)),
    Case("reopen with durable='no'", "open", InvalidParameterError, "durable='no'",
         open_path=_open(durable="no")),
    Case("create with max_readers 0: nothing made", "open", InvalidParameterError,
         "max_readers=0", open_path=_open(create=True, max_readers=0), prepare=make_nothing,
         is_store=False),
    Case("create with a map_size past the address space: nothing made", "open",
         InvalidParameterError, "map_size=", open_path=_open(create=True, map_size=2**62),
         prepare=make_nothing, is_store=False),
    Case("create with 2**31 reader slots: nothing made", "open", InvalidParameterError,
         "max_readers=", open_path=_open(create=True, max_readers=2**31),
         prepare=make_nothing, is_store=False),
    Case("reopen with a map_size past the address space", "open", InvalidParameterError,
         "map_size=", open_path=_open(map_size=2**62)),
    Case("random-bytes file at the path", "open", NotAStoreError, "it is a file",
         open_path=_open(create=True), prepare=make_random_file, is_store=False),
    Case("random bytes as data.mdb", "open", NotAStoreError, "LMDB could not open it",
         open_path=_open(create=True), prepare=make_random_data_mdb, is_store=False),
    Case("random bytes as data.mdb, read-only", "open", NotAStoreError, "LMDB could not open",
         open_path=_open(read_only=True), prepare=make_random_data_mdb, is_store=False),
    Case("another application's LMDB", "open", NotAStoreError, "without a meta table",
         open_path=_open(create=True), prepare=make_foreign_lmdb, is_store=False),
    Case("create in a directory of other files", "open", NotAStoreError,
         "other files: 'notes.txt'", open_path=_open(create=True),
         prepare=make_directory_of_notes, is_store=False),
    # numpy compared the choices element by element: a 0-d array passed them, and the
    # create failed raw in msgpack, leaving an environment behind (review 44)
    Case("create with scheme as a 0-d array: nothing made", "open", InvalidParameterError,
         "scheme=array('oph'", open_path=_open(create=True, scheme=np.array("oph")),
         prepare=make_nothing, is_store=False),
    Case("create with a shingle kind as a 0-d array: nothing made", "open",
         InvalidParameterError, "kind=array('word'", open_path=lambda path: Store.open(
             path, create=True, shingles=ShingleConfig(kind=np.array("word"), size=3)),
         prepare=make_nothing, is_store=False),
    # the first file system call raised a raw ValueError / UnicodeEncodeError (review 44)
    Case("create at a path with a NUL: nothing made", "open", InvalidParameterError,
         "without a NUL character",
         open_path=lambda path: Store.open(f"{path}\x00", create=True),
         prepare=make_nothing, is_store=False),
    Case("create at a path with a lone surrogate: nothing made", "open",
         InvalidParameterError, "the file name encoding",
         open_path=lambda path: Store.open(f"{path}\ud800", create=True),
         prepare=make_nothing, is_store=False),
    Case("create with threshold 0: nothing made", "open", InvalidParameterError, "threshold=0",
         open_path=_open(create=True, threshold=0), prepare=make_nothing, is_store=False),
    Case("create with num_perm 0: nothing made", "open", InvalidParameterError, "num_perm=0",
         open_path=_open(create=True, num_perm=0), prepare=make_nothing, is_store=False),
    Case("create with threshold 1 and no bands", "open", InvalidParameterError,
         "bands= and rows=", open_path=_open(create=True, threshold=1.0), prepare=make_nothing,
         is_store=False),
    Case("missing path without create", "open", StoreNotFoundError, "pass create=True",
         open_path=_open(), prepare=make_nothing, is_store=False),
    Case("missing path, read-only", "open", StoreNotFoundError, "no store here",
         open_path=_open(read_only=True), prepare=make_nothing, is_store=False),
    # read-only store: every write is refused
    *[
        Case(f"read-only store: {operation}", operation, ReadOnlyError, "open read-only", call,
             read_only=True, in_write=False)
        for operation, call in [
            ("add", lambda s: s.add("new", TEXT)),
            ("add_many", lambda s: s.add_many([("new", TEXT)])),
            ("add_signatures", lambda s: s.add_signatures([("new", good_signature())])),
            ("remove", lambda s: s.remove("alpha")),
            ("import", lambda s: s.import_(io.BytesIO(export_bytes_cached()))),
        ]
    ],
]  # fmt: skip


# -- running a case -----------------------------------------------------------------------------


def files_digest(path: Path) -> str:
    """Every byte of every file under ``path`` (lock files aside), and whether it exists."""
    digest = hashlib.sha256()
    if not path.exists():
        return "absent"
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    for file in sorted(p for p in path.rglob("*") if p.is_file() and p.name not in LOCK_FILES):
        digest.update(str(file.relative_to(path)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def state_digest(path: Path, is_store: bool) -> str:
    """Every byte of every table of a store; of every file of anything else."""
    return raw_digest(path) if is_store else files_digest(path)


@dataclass(frozen=True)
class Outcome:
    """What running a :class:`Case` did."""

    name: str
    operation: str
    expected: str
    raised: str
    message: str
    typed: bool
    names_problem: bool
    state_changed: bool

    @property
    def ok(self) -> bool:
        return self.typed and self.names_problem and not self.state_changed


def run_case(case: Case, directory: Path) -> Outcome:
    """Prepare the path, run the operation once, and compare the state before and after."""
    path = directory / "store"
    case.prepare(path)
    is_store = case.is_store
    before = state_digest(path, is_store)
    error: BaseException | None = None
    try:
        if case.open_path is not None:
            case.open_path(path)
        else:
            assert case.call is not None
            with Store.open(path, read_only=case.read_only) as store:
                case.call(store)
    except Exception as raised:  # the table records every kind, typed or not
        error = raised
    after = state_digest(path, is_store)
    return Outcome(
        name=case.name,
        operation=case.operation,
        expected=case.error.__name__,
        raised="nothing" if error is None else type(error).__name__,
        message="" if error is None else str(error),
        typed=isinstance(error, case.error),
        names_problem=error is not None and case.fragment in str(error),
        state_changed=before != after,
    )


GOOD_BEFORE = ("good-before", texts(1, seed=21)[0])
GOOD_AFTER = ("good-after", texts(1, seed=22)[0])


def run_in_write_block(path: Path, call: Callable[[Any], object] | None) -> BaseException | None:
    """In one write block: a good add, ``call`` (its error caught), another good add.

    With ``call=None`` the same block without it: the reference the store must equal.
    """
    make_store(path)
    caught: BaseException | None = None
    with Store.open(path) as store, store.write() as txn:
        txn.add(*GOOD_BEFORE)
        if call is not None:
            try:
                call(txn)
            except NeardupError as error:
                caught = error
        txn.add(*GOOD_AFTER)
    return caught


def environment_note() -> dict[str, Any]:
    return {"lmdb": lmdb.__version__, "msgpack": msgpack.version, "pid": os.getpid()}
