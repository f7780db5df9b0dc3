"""The store API on real LMDB stores: open, transactions, documents, queries, growth, processes."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import io
import itertools
import json
import os
import pickle
import platform
import random
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import lmdb
import numpy as np
import numpy.typing as npt
import pytest
from harness import interrupted_at_call
from test_band_cache import cached_and_direct
from test_format import rewrite_sealed_meta

from neardup_store import codec, lmdbfile, maintenance
from neardup_store import store as store_module
from neardup_store.errors import (
    CorruptStoreError,
    DuplicateKeyError,
    EmptyDocumentError,
    ForkedStoreError,
    FormatVersionError,
    InvalidKeyError,
    InvalidParameterError,
    InvalidStreamError,
    KeyNotFoundError,
    MetadataError,
    NotAStoreError,
    ParamsMismatchError,
    ReadOnlyError,
    StoreBusyError,
    StoreClosedError,
    StoreNotFoundError,
    StorePermissionError,
    TransactionAbortedError,
    TransactionConflictError,
)
from neardup_store.lsh import LSHParams
from neardup_store.minhash import MinHashConfig, MinHasher
from neardup_store.similarity import estimate_jaccard, hashed_jaccard
from neardup_store.store import Store
from neardup_store.text import ShingleConfig
from neardup_store.txn import Document, WriteTxn, prepare_batch

PROJECT_ROOT = Path(__file__).resolve().parent.parent

# 32 bands of 4 rows: pairs above 0.7 become candidates with probability > 0.999, so the
# near-duplicate pairs of the corpus (Jaccard 0.8 and 0.9) are found for certain.
PARAMS: dict[str, Any] = {"threshold": 0.7, "num_perm": 128, "bands": 32, "rows": 4}
KiB = 1024


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    """Where a store goes (nothing there yet)."""
    return tmp_path / "store"


@pytest.fixture
def store(store_path: Path) -> Iterator[Store]:
    """A new store with :data:`PARAMS`, closed after the test."""
    with Store.open(store_path, create=True, **PARAMS) as opened:
        yield opened


def random_texts(count: int, seed: int = 0, length: int = 200) -> list[str]:
    """Texts of random letters: no two share more than a few 5-shingles."""
    rng = random.Random(seed)
    return ["".join(rng.choices(string.ascii_lowercase + " ", k=length)) for _ in range(count)]


def commit_counter(store: Store) -> int:
    with store.read() as txn:
        return int(store._read_meta(txn.txn, "commit_counter"))


def awaiting_purge(store: Store) -> int:
    with store.read() as txn:
        return txn.awaiting_purge()


def raw_meta(path: Path) -> dict[str, Any]:
    """The ``meta`` table of a closed store, read with plain LMDB."""
    env = lmdb.open(str(path), max_dbs=4, readonly=True, lock=False)
    try:
        with env.begin(db=env.open_db(codec.META_DB, create=False)) as txn:
            return {bytes(k).decode(): codec.unpack_meta(v) for k, v in txn.cursor()}
    finally:
        env.close()


def write_raw_meta(path: Path, name: str, value: object) -> None:
    """Overwrite one ``meta`` value of a closed store with plain LMDB."""
    env = lmdb.open(str(path), max_dbs=4)
    try:
        meta_db = env.open_db(codec.META_DB, create=False)
        with env.begin(write=True) as txn:
            txn.put(name.encode(), codec.pack_meta(value), db=meta_db)
    finally:
        env.close()


def snapshot(store: Store) -> list[tuple[object, bytes, object]]:
    """Every document (key, signature bytes, metadata), in order: to compare whole states."""
    with store.read() as txn:
        return [(key, (doc := txn.get(key)).signature.tobytes(), doc.metadata) for key in txn]


class CountingHasher(MinHasher):
    """A real hasher that records the size of each batch it signs."""

    def __init__(self, config: MinHashConfig) -> None:
        super().__init__(config)
        self.batches: list[int] = []

    def signatures(self, documents: Any, encoding: str | None = None) -> npt.NDArray[np.uint32]:
        documents = list(documents)
        self.batches.append(len(documents))
        return super().signatures(documents, encoding)


# -- opening -----------------------------------------------------------------------------------


CREATE_PARAMS: dict[str, Any] = {
    "threshold": 0.6,
    "num_perm": 64,
    "scheme": "kperm",
    "seed": 7,
    "shingles": ShingleConfig(kind="word", size=2),
    "bands": 8,
    "rows": 4,
}


def test_create_then_reopen_reads_the_parameters_back(store_path: Path) -> None:
    with Store.open(store_path, create=True, **CREATE_PARAMS) as created:
        created.add("a", "the parameters of this store were chosen on purpose")
        params = created.params
    assert params.config == MinHashConfig(64, "kperm", 7, ShingleConfig(kind="word", size=2))
    assert params.banding == LSHParams(8, 4) and params.threshold == 0.6
    with Store.open(store_path) as reopened:
        assert reopened.params == params
        assert reopened.hasher.config == params.config
        assert reopened.get("a").signature.shape == (64,)
    with Store.open(store_path, create=True, **CREATE_PARAMS) as same:  # equal: fine
        assert same.params == params and len(same) == 1


@pytest.mark.parametrize(
    ("asked", "names"),
    [
        ({"threshold": 0.7}, {"threshold"}),
        ({"num_perm": 128}, {"num_perm"}),
        ({"scheme": "oph"}, {"scheme"}),
        ({"seed": 8}, {"seed"}),
        ({"shingles": ShingleConfig(kind="word", size=3)}, {"shingle_size"}),
        ({"shingles": ShingleConfig(kind="char", size=2)}, {"shingle_kind"}),
        ({"shingles": ShingleConfig(kind="word", size=2, bag=True)}, {"bag"}),
        ({"bands": 16, "rows": 4}, {"bands"}),
        ({"bands": 8, "rows": 2}, {"rows"}),
        ({"num_perm": 32, "seed": 1}, {"num_perm", "seed"}),
    ],
)
def test_reopen_with_conflicting_parameters_names_them(
    store_path: Path, asked: dict[str, Any], names: set[str]
) -> None:
    Store.open(store_path, create=True, **CREATE_PARAMS).close()
    with pytest.raises(ParamsMismatchError) as raised:
        Store.open(store_path, **asked)
    assert set(raised.value.conflicts) == names
    assert all(name in str(raised.value) for name in names)
    with Store.open(store_path) as still_fine:  # the failed open left nothing behind
        assert still_fine.params.config.num_perm == 64


def test_params_mismatch_advice_is_the_one_that_works_for_the_parameters(
    store_path: Path,
) -> None:
    """Every conflict was told to "rebuild/export into a new store", which cannot change
    num_perm, scheme, seed or shingles (review 53). A banding conflict is told to rebuild,
    and following that works; a conflict in what makes the signatures is told to add the
    texts again to a new store made with the new parameters."""
    Store.open(store_path, create=True, **CREATE_PARAMS).close()
    with pytest.raises(ParamsMismatchError) as banding:
        Store.open(store_path, threshold=0.7)
    assert str(banding.value).endswith(
        "; open it without threshold to use the store's own, or rebuild it with the new "
        "threshold (Store.rebuild, neardup-admin rebuild) to change its banding"
    )
    with Store.open(store_path) as store:
        store.rebuild(threshold=0.7)
    Store.open(store_path, threshold=0.7).close()  # the advice followed
    for asked, names, signing in [
        ({"num_perm": 128}, "num_perm", "num_perm"),
        ({"seed": 8, "threshold": 0.9}, "seed and threshold", "seed"),
        ({"shingles": ShingleConfig(kind="word", size=3)}, "shingles", "shingles"),
    ]:
        with pytest.raises(ParamsMismatchError) as raised:
            Store.open(store_path, **asked)
        assert str(raised.value).endswith(
            f"; open it without {names} to use the store's own, or add the texts again to a "
            "new store made with the new ones (a rebuild or an export keeps the signatures, "
            f"made with the store's {signing})"
        )


@pytest.mark.parametrize(
    ("asked", "names", "other"),
    [
        ({"bands": 16}, "bands", "rows"),
        ({"rows": 2}, "rows", "bands"),
        ({"threshold": 0.7, "bands": 16}, "bands and threshold", "rows"),
    ],
)
def test_a_bands_or_rows_conflict_is_told_to_rebuild_with_both(
    store_path: Path, asked: dict[str, Any], names: str, other: str
) -> None:
    """ "rebuild it with the new bands" was refused when followed: a rebuild takes bands
    and rows together (review 54). The advice names the other one too, and followed (the
    other one at the store's own value), it works."""
    Store.open(store_path, create=True, **CREATE_PARAMS).close()
    with pytest.raises(ParamsMismatchError) as raised:
        Store.open(store_path, **asked)
    assert str(raised.value).endswith(
        f"; open it without {names} to use the store's own, or rebuild it with the new {names}, "
        f"and {other} to go with them (a rebuild takes bands and rows together: Store.rebuild, "
        "neardup-admin rebuild) to change its banding"
    )
    with Store.open(store_path) as store:
        store.rebuild(**asked, **{other: CREATE_PARAMS[other]})
    Store.open(store_path, **asked).close()  # the advice followed


def test_rebuild_to_a_banding_wider_than_the_signatures_advises_fewer_bands_or_rows(
    store_path: Path,
) -> None:
    """It advised "or more num_perm", which a rebuild, keeping the signatures, cannot
    change (review 53)."""
    with Store.open(store_path, create=True, num_perm=64) as store:
        store.add("a", "the quick brown fox jumps over the lazy dog")
        banding = store.banding
        with pytest.raises(InvalidParameterError) as raised:
            store.rebuild(bands=20, rows=4)
        assert str(raised.value) == (
            "bands*rows='20*4=80' is not valid: expected at most the store's num_perm=64 "
            "(fixed when its signatures were made); use fewer bands or rows"
        )
        assert store.banding == banding  # nothing changed
        store.rebuild(bands=16, rows=4)  # the advice followed
        assert store.banding == LSHParams(16, 4)


def test_missing_store_raises_store_not_found(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError) as raised:
        Store.open(tmp_path / "nothing-here")
    assert raised.value.path == str(tmp_path / "nothing-here")
    assert not (tmp_path / "nothing-here").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreNotFoundError):
        Store.open(tmp_path / "empty")


def test_a_read_only_open_of_a_missing_store_does_not_advise_create(tmp_path: Path) -> None:
    """A read-only open advised create=True, which it refuses (review 22)."""
    with pytest.raises(StoreNotFoundError) as caught:
        Store.open(tmp_path / "missing", read_only=True)
    assert "create=True" not in str(caught.value) and "check the path" in str(caught.value)
    assert caught.value.path == str(tmp_path / "missing")
    with pytest.raises(StoreNotFoundError, match="pass create=True"):
        Store.open(tmp_path / "missing")


def test_open_takes_numpy_integers_for_map_size_and_max_readers(tmp_path: Path) -> None:
    """map_size=np.int64(...) and max_readers=np.int64(...) were refused as "expected an
    integer", unlike every other integer parameter (review 22)."""
    with Store.open(
        tmp_path / "s", create=True, num_perm=32, map_size=np.int64(1 << 20),
        max_readers=np.int64(10),
    ) as store:  # fmt: skip
        store.add("k", "some text of a document")
        assert store._require_env().info()["max_readers"] == 10
    with Store.open(tmp_path / "s", map_size=np.uint32(1 << 21)) as store:
        assert store.get("k").key == "k"
    for bad in ({"map_size": np.int64(1)}, {"max_readers": np.int64(0)}, {"map_size": 2.0**20}):
        with pytest.raises(InvalidParameterError):
            Store.open(tmp_path / "s", **bad)  # type: ignore[arg-type]


def _make_file(path: Path) -> None:
    path.write_bytes(b"not a directory")


def _make_plain_env(path: Path) -> None:
    env = lmdb.open(str(path))
    with env.begin(write=True) as txn:
        txn.put(b"some", b"data")
    env.close()


def _make_foreign_env(path: Path) -> None:
    env = lmdb.open(str(path), max_dbs=2)
    other = env.open_db(b"other")
    with env.begin(write=True) as txn:
        txn.put(b"meta", b"a plain key in the main table")
        txn.put(b"k", b"v", db=other)
    env.close()


def _make_env_with_other_meta(path: Path) -> None:
    env = lmdb.open(str(path), max_dbs=2)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        txn.put(b"format", codec.pack_meta("something_else"), db=meta)
    env.close()


def _make_env_with_garbled_meta(path: Path) -> None:
    env = lmdb.open(str(path), max_dbs=2)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        txn.put(b"format", b"\xc1 not msgpack", db=meta)
    env.close()


def _make_garbage_data_file(path: Path) -> None:
    path.mkdir()
    (path / "data.mdb").write_bytes(bytes(range(256)) * 64)


@pytest.mark.parametrize(
    "make",
    [
        _make_file,
        _make_plain_env,
        _make_foreign_env,
        _make_env_with_other_meta,
        _make_env_with_garbled_meta,
        _make_garbage_data_file,
    ],
)
@pytest.mark.parametrize("create", [False, True])
def test_something_else_at_the_path_raises_not_a_store(
    tmp_path: Path, make: Callable[[Path], None], create: bool
) -> None:
    path = tmp_path / "thing"
    make(path)
    with pytest.raises(NotAStoreError) as raised:
        Store.open(path, create=create)
    assert raised.value.path == str(path)


def test_create_refuses_a_directory_of_other_files_and_leaves_it_untouched(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    for name in ("a.txt", "b.txt", "c.txt", "d.txt"):
        (home / name).write_text(name)
    with pytest.raises(NotAStoreError, match=r"other files: 'a.txt', 'b.txt', 'c.txt' and 1 more"):
        Store.open(home, create=True)
    assert sorted(p.name for p in home.iterdir()) == ["a.txt", "b.txt", "c.txt", "d.txt"]


def test_create_goes_ahead_where_a_killed_creation_left_only_lock_files(tmp_path: Path) -> None:
    path = tmp_path / "store"
    path.mkdir()
    for name in ("neardup.create.lock", "neardup.lock", "lock.mdb"):
        (path / name).write_bytes(b"")
    with Store.open(path, create=True) as store:
        store.add("a", "some text to keep")
    with Store.open(path) as store:
        assert "a" in store


def test_unknown_format_version_raises_format_version_error(store_path: Path) -> None:
    Store.open(store_path, create=True).close()
    write_raw_meta(store_path, "format_version", codec.FORMAT_VERSION + 1)
    with pytest.raises(FormatVersionError) as raised:
        Store.open(store_path)
    assert raised.value.found == codec.FORMAT_VERSION + 1
    assert raised.value.supported == codec.READABLE_FORMATS
    with pytest.raises(FormatVersionError):
        Store.open(store_path, read_only=True)


def test_a_store_of_another_signature_hashing_is_refused_as_another_release_s(
    store_path: Path,
) -> None:
    """It opened as a corrupt store, with the advice to restore it from a backup (a
    review's finding); the parameters are sealed, so this is another release's store."""
    Store.open(store_path, create=True).close()
    rewrite_sealed_meta(
        store_path, lambda sealed: sealed["config"]["shingles"].update(hash_version=2)
    )
    with pytest.raises(FormatVersionError, match=r"signature hashing v2.*cannot be compared"):
        Store.open(store_path, read_only=True)


def test_an_export_or_output_with_a_parameter_this_release_does_not_know_is_refused() -> None:
    """Dropped, it made a store whose text queries signed otherwise than its imported
    signatures (import into a new store and spark-load took it; a review's finding)."""
    config = MinHashConfig().to_dict()
    assert MinHashConfig.from_dict(config) == MinHashConfig()
    with pytest.raises(InvalidParameterError, match="stemming"):
        MinHashConfig.from_dict({**config, "stemming": "porter"})


def test_read_only_store_reads_and_refuses_writes(
    store_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    with Store.open(store_path, create=True, **PARAMS) as writable:
        writable.add_many(near_dup_corpus.items())
        before = snapshot(writable)
    with Store.open(store_path, read_only=True) as store:
        assert store.read_only and "read-only" in repr(store)
        assert snapshot(store) == before and len(store) == 5 and "storm-a" in store
        assert [m.key for m in store.query(near_dup_corpus["recipe-a"])] == [
            "recipe-a",
            "recipe-b",
        ]
        refused: list[Callable[[], object]] = [
            lambda: store.add("new", "a new document text"),
            lambda: store.add_many([("new", "a new document text")]),
            lambda: store.remove("storm-a"),
            lambda: store.remove_many(["storm-a"]),
            lambda: store.add_if_unique("new", "a new document text"),
            lambda: store.add_many_if_unique([("new", "a new document text")]),
            lambda: store.write().__enter__(),
        ]
        for attempt in refused:
            with pytest.raises(ReadOnlyError):
                attempt()
        store.sync()  # nothing to flush: not an error
        assert snapshot(store) == before
    with pytest.raises(InvalidParameterError):
        Store.open(store_path, create=True, read_only=True)


def test_context_manager_closes_and_later_use_raises(store_path: Path) -> None:
    with Store.open(store_path, create=True) as store:
        store.add("a", "some text to store and read back")
        with store.read() as txn:
            pass
    assert "closed" in repr(store)
    closed_calls: list[Callable[[], object]] = [
        lambda: store.get("a"),
        lambda: len(store),
        lambda: "a" in store,
        lambda: list(store),
        lambda: store.add("b", "another text"),
        lambda: store.remove("a"),
        lambda: store.query("some text to store and read back"),
        lambda: store.read().__enter__(),
        lambda: store.sync(),
        lambda: txn.get("a"),  # a transaction used after its block
    ]
    for call in closed_calls:
        with pytest.raises(StoreClosedError):
            call()
    store.close()  # idempotent


# -- transactions ------------------------------------------------------------------------------


def test_write_block_commits_everything_together(store: Store) -> None:
    texts = random_texts(4)
    store.add("old", texts[0])
    counter = commit_counter(store)
    with store.write() as txn:
        txn.add("a", texts[1])
        txn.add_many([("b", texts[2]), ("c", texts[3], {"n": 3})])
        txn.remove("old")
        assert len(txn) == 3  # the transaction sees its own writes
    assert list(store) == ["a", "b", "c"]
    assert commit_counter(store) == counter + 1


NO_WRITE_BLOCKS: list[tuple[str, Callable[[WriteTxn, list[str]], object]]] = [
    ("an empty block", lambda txn, t: None),
    ("reads and queries", lambda txn, t: (txn.get("stored"), txn.query(t[0]), len(txn))),
    ("a refused add_if_unique", lambda txn, t: txn.add_if_unique("copy", t[0])),
    ("a removal of an absent key, missing_ok", lambda txn, t: txn.remove("x", missing_ok=True)),
    ("remove_many of absent keys", lambda txn, t: txn.remove_many(["x", "y"], missing_ok=True)),
    ("a purge with nothing to purge", lambda txn, t: txn.purge()),
]


@pytest.mark.parametrize(
    "block", [b for _, b in NO_WRITE_BLOCKS], ids=[name for name, _ in NO_WRITE_BLOCKS]
)
def test_a_write_block_that_writes_nothing_ends_without_a_commit(
    store: Store, block: Callable[[WriteTxn, list[str]], object]
) -> None:
    """Nothing to make durable: no commit (and so no sync), the counter unchanged."""
    texts = random_texts(1)
    store.add("stored", texts[0])
    before, counter = snapshot(store), commit_counter(store)
    with store.write() as txn:
        block(txn, texts)
    assert snapshot(store) == before and commit_counter(store) == counter
    store.add("later", random_texts(2, seed=5)[1])  # the store takes writes after it
    assert commit_counter(store) == counter + 1


def test_a_write_through_the_raw_transaction_commits(store: Store) -> None:
    """The LMDB transaction handed out by a write transaction counts as written to, so
    its writes are committed even though the store's own methods wrote nothing."""
    counter = commit_counter(store)
    with store.write() as txn:
        raw = txn.txn
        raw.put(b"probe", codec.pack_meta(1), db=store._meta_db)
    with store.read() as reader:
        assert codec.unpack_meta(reader.txn.get(b"probe", db=store._meta_db)) == 1
    assert commit_counter(store) == counter + 1


def test_raw_writes_that_a_map_growth_cannot_replay_fail_the_block(tmp_path: Path) -> None:
    """A growth redoes the block from its log of operations; a raw write is in none, so
    the block fails (nothing of it kept) instead of committing without it (a review
    found it committed silently). Each failure leaves the map larger, so running the
    block again gets through."""
    texts = random_texts(300)

    def block(store: Store) -> None:
        with store.write() as txn:
            txn.txn.put(b"probe", codec.pack_meta(1), db=store._meta_db)
            txn.add_many((f"d{i}", text) for i, text in enumerate(texts))

    with Store.open(tmp_path / "s", create=True, map_size=1 << 16, num_perm=64) as store:
        counter, failures = commit_counter(store), []
        while True:
            try:
                block(store)
                break
            except TransactionAbortedError as err:
                failures.append((str(err), len(store), commit_counter(store)))
                assert len(failures) < 10, "the map never grew enough"
        assert failures and len(store) == 300
        for message, documents, commits in failures:  # each failure kept nothing
            assert "WriteTxn.txn cannot be replayed" in message
            assert (documents, commits) == (0, counter)
        with store.read() as reader:
            assert codec.unpack_meta(reader.txn.get(b"probe", db=store._meta_db)) == 1


def test_a_growth_is_not_starved_by_threads_that_keep_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A growth waits for other threads' reads to end; new reads from threads that hold
    none wait for it, or two threads querying without pause would keep it out until it
    gives up with StoreBusyError (a review found every growth failing so)."""
    monkeypatch.setattr(store_module, "RESIZE_WAIT_S", 3.0)
    texts = random_texts(40)
    with Store.open(tmp_path / "s", create=True, map_size=1 << 16, num_perm=64) as store:
        store.add_many((f"k{i}", text) for i, text in enumerate(texts))
        stop, errors, queries = threading.Event(), [], [0]

        def query_without_pause() -> None:
            try:
                while not stop.is_set():
                    assert store.query(texts[3])[0].key == "k3"
                    queries[0] += 1
            except Exception as err:  # reported by the main thread
                errors.append(err)

        threads = [threading.Thread(target=query_without_pause) for _ in range(2)]
        for thread in threads:
            thread.start()
        try:
            epoch = store.map_epoch
            store.add_many((f"n{i}", text) for i, text in enumerate(random_texts(2000)))
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        assert store.map_epoch > epoch and len(store) == 2040
        assert not errors and queries[0] > 0
        assert store._active_readers == 0


def test_two_threads_that_each_read_then_write_past_the_map_both_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread that reads, then writes in the read's block and needs a growth, waited for
    the other writer's growth to end its read and the other for it, until one gave up
    after RESIZE_WAIT_S with StoreBusyError (and a message about other processes)."""
    monkeypatch.setattr(store_module, "RESIZE_WAIT_S", 30.0)
    with Store.open(tmp_path / "s", create=True, map_size=256 * KiB) as store:
        store.add("a", "a first document to read")
        reading, writing, outcome = threading.Event(), threading.Event(), {}

        def read_then_write() -> None:
            try:
                with store.read() as snapshot:
                    assert snapshot.get("a").key == "a"
                    reading.set()
                    writing.wait()
                    time.sleep(0.2)  # the other block is writing past the map meanwhile
                    store.add("from-reader", "a document the reading thread adds")
                outcome["reader"] = "committed"
            except Exception as err:  # reported by the main thread
                outcome["reader"] = err

        thread = threading.Thread(target=read_then_write)
        thread.start()
        reading.wait()
        started = time.monotonic()
        with store.write() as writer:
            writing.set()
            writer.add_many(
                (f"k{i}", t, {"p": b"x" * 2048}) for i, t in enumerate(random_texts(400))
            )
        thread.join()
        assert time.monotonic() - started < 15  # not a wait for one side to give up
        assert outcome == {"reader": "committed"}
        assert len(store) == 402 and store.get("from-reader").key == "from-reader"
        assert store._active_readers == store._parked_reads == 0


def test_writer_threads_sharing_a_store_through_many_map_growths_all_commit(
    tmp_path: Path,
) -> None:
    """A thread that had begun its LMDB write transaction, not yet counted, let a growth
    in another thread call set_mapsize, which waited inside LMDB for that write lock
    while holding the lock the first thread waited for: every run hung for good within a
    few batches (a review's finding). Transactions are counted before they begin now.
    The store is closed only once the writers are done, so that a hang fails the test
    instead of hanging its close."""
    store = Store.open(tmp_path / "s", create=True, num_perm=64, map_size=1 << 16)
    failures: list[BaseException] = []

    def writer(number: int) -> None:
        rng = np.random.default_rng(number)
        try:
            for batch in range(15):
                sigs = rng.integers(0, 2**32, (200, 64), dtype=np.uint32)
                items = [(f"w{number}-{batch}-{i}", sig) for i, sig in enumerate(sigs)]
                store.add_signatures(items, batch_size=None)
        except BaseException as err:  # reported by the main thread
            failures.append(err)

    threads = [threading.Thread(target=writer, args=(n,), daemon=True) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert not any(thread.is_alive() for thread in threads), "writers hung"
    with store:
        assert not failures and len(store) == 4 * 15 * 200 and store.check().ok
        assert store._active_readers == store._parked_reads == 0


def test_an_interrupt_as_a_read_begins_leaves_no_reader_counted(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C can land after the reader was counted and before the block began: the
    count must come back down, or every later map growth would wait for a reader that
    does not exist."""
    from neardup_store import txn as txn_module

    def interrupted(*args: Any) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(txn_module.ReadTxn, "__init__", interrupted)
        with pytest.raises(KeyboardInterrupt):
            store.query("some text")
    assert store._active_readers == 0 and store._thread_state.readers == 0
    store._resize(0)  # a growth does not wait for a phantom reader


def test_exception_in_write_block_rolls_back_everything(store: Store) -> None:
    texts = random_texts(6)
    store.add_many([("keep", texts[0]), ("replaced", texts[1]), ("removed", texts[2])])
    before, counter = snapshot(store), commit_counter(store)

    def write_then_fail() -> None:
        with store.write() as txn:
            txn.add("new", texts[3])
            txn.add("replaced", texts[4], replace=True)
            txn.remove("removed")
            txn.add_many([("x", texts[5])])
            assert len(txn) == 4
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write_then_fail()
    assert snapshot(store) == before and commit_counter(store) == counter
    assert [m.key for m in store.query(texts[2])] == ["removed"]
    assert store.query(texts[3]) == [] and store.query(texts[4]) == []


FAILING_OPERATIONS: list[tuple[str, Callable[[WriteTxn, list[str]], object], type[Exception]]] = [
    ("empty key", lambda txn, t: txn.add("", t[0]), InvalidKeyError),
    ("int key", lambda txn, t: txn.add(7, t[0]), InvalidKeyError),  # type: ignore[arg-type]
    ("object metadata", lambda txn, t: txn.add("m", t[0], metadata=object()), MetadataError),
    ("int map key", lambda txn, t: txn.add("m", t[0], metadata={1: "x"}), MetadataError),
    ("huge metadata", lambda txn, t: txn.add("m", t[0], metadata=b"x" * 70_000), MetadataError),
    ("empty text", lambda txn, t: txn.add("m", "   "), EmptyDocumentError),
    ("bad signature", lambda txn, t: txn.add("m", signature=[1, 2, 3]), InvalidParameterError),
    ("duplicate add", lambda txn, t: txn.add("existing", t[0]), DuplicateKeyError),
    (
        "add_many hitting a stored key",
        lambda txn, t: txn.add_many([("m1", t[0]), ("existing", t[1]), ("m2", t[2])]),
        DuplicateKeyError,
    ),
    (
        "add_many repeating a key",
        lambda txn, t: txn.add_many([("m1", t[0]), ("m2", t[1]), ("m1", t[2])]),
        DuplicateKeyError,
    ),
    (
        "add_many with a bad item",
        lambda txn, t: txn.add_many([("m1", t[0]), ("m2", t[1], {2: 2})]),
        MetadataError,
    ),
    (
        "add_many_if_unique hitting a stored key",
        lambda txn, t: txn.add_many_if_unique([("m1", t[0]), ("existing", t[1])]),
        DuplicateKeyError,
    ),
    ("remove of a missing key", lambda txn, t: txn.remove("missing"), KeyNotFoundError),
    (
        "remove_many with a missing key",
        lambda txn, t: txn.remove_many(["existing", "missing"]),
        KeyNotFoundError,
    ),
]


@pytest.mark.parametrize(
    ("operation", "error"),
    [(op, err) for _, op, err in FAILING_OPERATIONS],
    ids=[name for name, _, _ in FAILING_OPERATIONS],
)
def test_caught_error_inside_a_write_changes_nothing_and_the_rest_commits(
    store: Store,
    operation: Callable[[WriteTxn, list[str]], object],
    error: type[Exception],
) -> None:
    texts = random_texts(6, seed=1)
    store.add("existing", texts[5], metadata={"v": 1})
    existing = store.get("existing")
    with store.write() as txn:
        txn.add("before", texts[3])
        with pytest.raises(error):
            operation(txn, texts)
        txn.add("after", texts[4])
    assert list(store) == ["existing", "before", "after"]
    assert store.get("existing") == existing
    for text in texts[:3]:  # no band entry of a failed document was left behind
        assert store.query(text, threshold=0.1) == []


def test_read_transaction_is_a_snapshot(store: Store) -> None:
    texts = random_texts(3)
    store.add("a", texts[0])
    with store.read() as snap:
        store.add("b", texts[1])
        store.remove("a")
        assert len(snap) == 1 and list(snap.keys()) == ["a"] and "b" not in snap
        assert [m.key for m in snap.query(texts[0])] == ["a"] and snap.query(texts[1]) == []
        assert snap.get("a").key == "a"
        with pytest.raises(KeyNotFoundError):
            snap.get("b")
    with store.read() as fresh:
        assert list(fresh.keys()) == ["b"]


def test_read_transaction_does_not_see_another_process_commit(store: Store) -> None:
    texts = random_texts(2)
    store.add("a", texts[0])
    with store.read() as snap:
        writer = _python(
            "-c",
            "import sys; from neardup_store.store import Store\n"
            "with Store.open(sys.argv[1]) as s:\n"
            "    with s.write() as txn:\n"
            "        txn.add('b', sys.argv[2]); txn.remove('a')\n",
            str(store.path),
            texts[1],
        )
        _finish(writer)
        assert list(snap.keys()) == ["a"] and len(snap) == 1 and snap.query(texts[1]) == []
    assert list(store) == ["b"] and [m.key for m in store.query(texts[1])] == ["b"]


def test_write_transaction_sees_its_own_writes(store: Store) -> None:
    texts = random_texts(2)
    with store.write() as txn:
        txn.add("a", texts[0], metadata=[1])
        assert "a" in txn and len(txn) == 1 and txn.get("a").metadata == [1]
        assert [m.key for m in txn.query(texts[0])] == ["a"]
        txn.add("a", texts[1], metadata=[2], replace=True)
        assert [m.key for m in txn.query(texts[1])] == ["a"] and txn.query(texts[0]) == []
        txn.remove("a")
        assert "a" not in txn and len(txn) == 0 and list(txn) == []
    assert len(store) == 0


# -- documents ---------------------------------------------------------------------------------


METADATA = {
    "url": "https://example.com/ü",
    "tags": ["a", "b", {"nested": [1, 2.5, None, True]}],
    "raw": b"\x00\xff bytes",
    "count": -3,
    "big": 2**63,
    "empty": {},
}


def test_get_returns_the_signature_of_the_text_and_the_metadata(store: Store) -> None:
    text = "Get returns what was stored: the signature and the metadata."
    assert store.add("doc", text, metadata=METADATA) is False
    doc = store.get("doc")
    expected = MinHasher(store.config).signature(text)
    assert doc.key == "doc" and doc.signature.dtype == np.uint32
    assert np.array_equal(doc.signature, expected)
    assert doc.metadata == METADATA and isinstance(doc.metadata["raw"], bytes)
    assert doc == Document("doc", expected, METADATA)
    store.add("no-meta", text)
    assert store.get("no-meta").metadata is None


def test_add_by_signature(store: Store, near_dup_corpus: dict[str, str]) -> None:
    signature = store.hasher.signature(near_dup_corpus["storm-a"])
    store.add(b"by-sig", signature=signature, metadata={"k": "v"})
    store.add("by-sig-int64", signature=signature.astype(np.int64))
    assert np.array_equal(store.get(b"by-sig").signature, signature)
    assert [m.key for m in store.query(near_dup_corpus["storm-a"])] == [b"by-sig", "by-sig-int64"]
    with pytest.raises(InvalidParameterError):
        store.add("both", near_dup_corpus["storm-a"], signature=signature)
    with pytest.raises(InvalidParameterError):
        store.add("neither")
    with pytest.raises(InvalidParameterError):
        store.add("float", signature=signature.astype(np.float64))
    with pytest.raises(InvalidParameterError):
        store.add("short", signature=signature[:64])
    with pytest.raises(InvalidParameterError):
        store.add("negative", signature=-signature.astype(np.int64) - 1)
    assert len(store) == 2


def test_duplicate_key_and_replace(store: Store, near_dup_corpus: dict[str, str]) -> None:
    old, new = near_dup_corpus["storm-a"], near_dup_corpus["recipe-a"]
    store.add("k", old, metadata=1)
    with pytest.raises(DuplicateKeyError) as raised:
        store.add("k", new)
    assert raised.value.key == "k" and store.get("k").metadata == 1
    assert store.add("k", new, metadata=2, replace=True) is True
    assert len(store) == 1 and store.get("k").metadata == 2
    assert np.array_equal(store.get("k").signature, store.hasher.signature(new))
    assert [m.key for m in store.query(new)] == ["k"]
    assert store.query(old) == []  # the old band entries are gone
    assert store.add("other", old, replace=True) is False


def test_add_many_signs_the_whole_batch_at_once(store: Store) -> None:
    hasher = store.hasher = CountingHasher(store.config)
    texts = random_texts(7)
    assert store.add_many([(f"k{i}", text) for i, text in enumerate(texts)], batch_size=None) == 7
    assert hasher.batches == [7]
    for i, text in enumerate(texts):
        assert np.array_equal(store.get(f"k{i}").signature, MinHasher(store.config).signature(text))


def test_add_many_commits_in_bounded_batches(store: Store) -> None:
    hasher = store.hasher = CountingHasher(store.config)
    texts = random_texts(10)
    counter = commit_counter(store)
    assert store.add_many(((f"k{i}", t, {"i": i}) for i, t in enumerate(texts)), batch_size=4) == 10
    assert hasher.batches == [4, 4, 2] and commit_counter(store) == counter + 3
    assert list(store) == [f"k{i}" for i in range(10)] and store.get("k9").metadata == {"i": 9}
    # A failing batch rolls back alone: batches before it stay committed.
    items = [(f"n{i}", t) for i, t in enumerate(random_texts(7, seed=1))] + [("n0", texts[0])]
    with pytest.raises(DuplicateKeyError):
        store.add_many(items, batch_size=3)
    assert list(store)[10:] == [f"n{i}" for i in range(6)]
    with pytest.raises(InvalidParameterError):
        store.add_many(items, batch_size=0)
    with pytest.raises(InvalidParameterError):
        store.add_many(["not a tuple"])  # type: ignore[list-item]


def test_a_failing_batch_names_its_document_in_the_whole_call_and_what_was_committed(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service resuming after an error needs the bad item's place in what it passed and
    how many items are already stored, whatever the batches were."""
    monkeypatch.setattr(store_module, "MIN_TRANSACTION", 4)  # text batches prepared by 4
    texts = random_texts(12)
    items = [(f"k{i}", t) for i, t in enumerate(texts)]
    items[9] = ("k9", "   ")
    with pytest.raises(EmptyDocumentError) as caught:
        store.add_many(items, batch_size=8)  # the second batch fails in its first part
    assert caught.value.index == 9 and "document #9" in str(caught.value)
    assert caught.value.committed == 8 and len(store) == 8  # type: ignore[attr-defined]
    assert "resume from item #8" in "".join(caught.value.__notes__)
    rest = items[8:9] + items[10:]
    assert store.add_many(rest) == 3 and len(store) == 11
    with pytest.raises(EmptyDocumentError) as caught:
        store.add_many([("x0", texts[0] + " x"), ("x1", "")], batch_size=5)
    assert caught.value.index == 1 and caught.value.committed == 0  # type: ignore[attr-defined]
    assert not hasattr(caught.value, "__notes__")
    with pytest.raises(EmptyDocumentError) as caught:  # one document: not numbered
        store.add("x2", "")
    assert caught.value.index is None and str(caught.value).startswith("the document is empty")


def _fails_after(count: int, error: BaseException) -> Iterator[tuple[str, str]]:
    """``count`` items of random text, then ``error``: a source that fails part-way."""
    yield from ((f"g{i}", text) for i, text in enumerate(random_texts(count, seed=3)))
    raise error


class _SealedError(Exception):
    """A caller's exception type that refuses attributes of its own making."""

    def __setattr__(self, name: str, value: object) -> None:
        if not name.startswith("__"):
            raise AttributeError(f"{name}: this error is sealed")
        super().__setattr__(name, value)


def _resume_note(error: BaseException) -> str:
    return "".join(getattr(error, "__notes__", []))


def test_a_batched_call_whose_source_fails_part_way_says_what_was_committed(
    store: Store,
) -> None:
    """The items' own error (an OSError reading them, say) left the call without
    ``committed`` or the note, though earlier batches were committed (review 22)."""
    with pytest.raises(OSError, match="Input/output error") as caught:
        store.add_many(_fails_after(7, OSError(5, "Input/output error")), batch_size=3)
    assert type(caught.value) is OSError and caught.value.errno == 5
    assert caught.value.committed == 6 and len(store) == 6  # type: ignore[attr-defined]
    assert "resume from item #6" in _resume_note(caught.value)
    with pytest.raises(_SealedError) as sealed:  # stamped all the same
        store.add_many(((f"f{i}", t) for i, t in _fails_after(2, _SealedError())), batch_size=1)
    assert sealed.value.committed == 2 and len(store) == 8  # type: ignore[attr-defined]
    assert "resume from item #2" in _resume_note(sealed.value)
    signatures = store.hasher.signatures(random_texts(5, seed=4))

    def signature_items() -> Iterator[tuple[str, npt.NDArray[np.uint32]]]:
        yield from ((f"s{i}", signatures[i]) for i in range(5))
        raise RuntimeError("the source went away")

    with pytest.raises(RuntimeError) as caught_again:
        store.add_signatures(signature_items(), batch_size=2)
    assert caught_again.value.committed == 4 and len(store) == 12  # type: ignore[attr-defined]


def _export_of(tmp_path: Path, count: int) -> bytes:
    with Store.open(tmp_path / "source", create=True, **PARAMS) as source:
        source.add_many((f"k{i}", text) for i, text in enumerate(random_texts(count, seed=6)))
        out = io.BytesIO()
        source.export(out)
    return out.getvalue()


class _FailingReader(io.RawIOBase):
    """``data`` read 64 bytes at a time, then an I/O error half way."""

    def __init__(self, data: bytes) -> None:
        self.data, self.position = data, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.position > len(self.data) // 2:
            raise OSError(5, "Input/output error")
        size = min(len(buffer), 64, len(self.data) - self.position)
        buffer[:size] = self.data[self.position : self.position + size]
        self.position += size
        return size


def test_an_import_whose_stream_cannot_be_read_is_typed_and_says_what_was_committed(
    store: Store, tmp_path: Path
) -> None:
    """An import stream whose read failed gave the raw OSError, without ``committed``
    (review 22)."""
    from neardup_store.errors import StreamReadError  # new here: the others run on old code

    data = _export_of(tmp_path, 40)
    with pytest.raises(InvalidStreamError) as caught:
        store.import_(io.BufferedReader(_FailingReader(data), 64), batch_size=5)
    error = caught.value
    assert isinstance(error, StreamReadError) and isinstance(error, OSError)
    assert "could not be read" in str(error) and "Input/output error" in str(error)
    assert isinstance(error.__cause__, OSError)
    assert error.committed == len(store) > 0  # type: ignore[attr-defined]
    assert f"resume from item #{len(store)}" in _resume_note(error)


def test_a_progress_callback_that_raises_leaves_an_import_saying_what_was_committed(
    store: Store, tmp_path: Path
) -> None:
    """A progress callback's own error left no ``committed`` either (review 22)."""
    data = _export_of(tmp_path, 12)

    def progress(done: int) -> None:
        if done >= 8:
            raise ValueError("the progress bar broke")

    with pytest.raises(ValueError, match="progress bar broke") as caught:
        store.import_(io.BytesIO(data), batch_size=4, progress=progress)
    assert caught.value.committed == 8 == len(store)  # type: ignore[attr-defined]
    assert "resume from item #8" in _resume_note(caught.value)


def test_a_bad_encoding_is_refused_before_the_first_batch_commits(store: Store) -> None:
    """add_many checked ``encoding`` only at its first bytes document, after earlier
    batches had committed, and not at all for str documents (review 22)."""
    items = [(f"k{i}", text) for i, text in enumerate(random_texts(30))]
    for replace in (False, True):
        with pytest.raises(InvalidParameterError, match="encoding='utf-9'") as caught:
            store.add_many(
                [*items, ("b", b"bytes text")], encoding="utf-9", batch_size=10, replace=replace
            )
        assert len(store) == 0 and not getattr(caught.value, "committed", 0)
        with pytest.raises(InvalidParameterError, match="encoding="):
            store.add_many(items, encoding="no-such-codec", replace=replace)
        assert len(store) == 0


def test_a_refused_signature_of_a_batch_is_named_by_its_place_in_the_call(
    store: Store,
) -> None:
    """A signature out of range, of another length or of floats in a batch was refused
    for the whole batch, without saying which item (review 22)."""
    good = store.hasher.signatures(random_texts(25, seed=7)).astype(np.int64)
    bad_rows: dict[str, Any] = {
        "values out of range": np.full(PARAMS["num_perm"], -1, np.int64),
        "rows of different shapes": good[17][:-1],
        "float64": np.full(PARAMS["num_perm"], 1.5),
    }
    for what, row in bad_rows.items():
        items = [(f"s{i}", good[i]) for i in range(25)]
        items[17] = ("s17", row)
        before = len(store)
        with pytest.raises(InvalidParameterError, match=what) as caught:
            store.add_signatures(items, batch_size=10)  # the second batch: #17 of the call
        error = caught.value
        assert error.index == 17 and "signature #17" in str(error)  # type: ignore[attr-defined]
        assert error.committed == 10 and len(store) == before + 10  # type: ignore[attr-defined]
        store.remove_many([f"s{i}" for i in range(10)])
        with store.write() as txn, pytest.raises(InvalidParameterError) as in_block:
            txn.add_signatures(items)
        assert in_block.value.index == 17  # type: ignore[attr-defined]
        assert len(store) == before
    with pytest.raises(InvalidParameterError) as single:  # one signature: not numbered
        store.add("one", signature=np.full(PARAMS["num_perm"], -1, np.int64))
    assert single.value.index is None and "#" not in str(single.value)  # type: ignore[attr-defined]


def test_error_types_take_what_other_calls_need_to_say(store: Store) -> None:
    """DuplicateKeyError takes its own advice (calls without replace= gave the advice to
    pass it) and MetadataError the key and place of its item (review 22)."""
    duplicate = DuplicateKeyError("k", advice="remove it first, or use add(..., replace=True)")
    assert str(duplicate) == (
        "key 'k' is already in the store; remove it first, or use add(..., replace=True)"
    )
    assert "pass replace=True" in str(DuplicateKeyError("k")) and duplicate.key == "k"
    assert "give each item its own key" in str(DuplicateKeyError("k", True))
    error = MetadataError("it cannot be stored", key="k17", index=17)
    assert (error.key, error.index, error.reason) == ("k17", 17, "it cannot be stored")
    assert str(error).startswith("item #17 (key 'k17') metadata rejected: it cannot be stored")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.key, copy.index, str(copy)) == ("k17", 17, str(error))
    plain = MetadataError("too large")
    assert plain.key is None and plain.index is None
    assert str(plain).startswith("metadata rejected: too large;")


def test_transaction_size_grows_with_the_store_within_its_bounds(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "MIN_TRANSACTION", 100)
    most = 300  # documents whose signatures fill the byte budget
    monkeypatch.setattr(
        store_module, "TRANSACTION_SIGNATURE_BYTES", most * 4 * store.config.num_perm
    )
    rng = np.random.default_rng(5)
    sizes = []
    for stored in (0, 1_500, 2_000, 4_000):
        fresh = rng.integers(
            0, 2**32, size=(stored - len(store), store.config.num_perm), dtype=np.uint32
        )
        store.add_signatures([(f"s{len(store) + i}", sig) for i, sig in enumerate(fresh)])
        assert len(store) == stored
        sizes.append(store.transaction_size())
    assert sizes == [100, 150, 200, 300]


def test_auto_batches_commit_at_the_transaction_size_of_their_start(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "MIN_TRANSACTION", 4)
    hasher = store.hasher = CountingHasher(store.config)
    texts = random_texts(60, length=60)
    counter = commit_counter(store)
    assert store.add_many([(f"k{i}", t) for i, t in enumerate(texts)]) == 60
    # Stored when each transaction begins: 0, 4, ..., 48 (the minimum, 4), then 52 (a
    # tenth: 5, signed as 4 and 1) and 57 (5, of which 3 remain).
    assert commit_counter(store) == counter + 15
    assert hasher.batches == [4] * 13 + [4, 1, 3]
    assert list(store) == [f"k{i}" for i in range(60)]
    with pytest.raises(InvalidParameterError, match="auto"):
        store.add_many([("x", "text")], batch_size="big")  # type: ignore[arg-type]


def test_one_transaction_signs_its_texts_a_part_at_a_time(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "MIN_TRANSACTION", 4)
    hasher = store.hasher = CountingHasher(store.config)
    texts = random_texts(10)
    counter = commit_counter(store)
    assert store.add_many([(f"k{i}", t) for i, t in enumerate(texts)], batch_size=None) == 10
    assert hasher.batches == [4, 4, 2] and commit_counter(store) == counter + 1
    # A key repeated in a later part rolls back the whole transaction.
    items = [(f"n{i}", t) for i, t in enumerate(random_texts(6, seed=1))] + [("n1", texts[0])]
    with pytest.raises(DuplicateKeyError):
        store.add_many(items, batch_size=None)
    assert len(store) == 10 and commit_counter(store) == counter + 1


def test_add_many_duplicate_keys_within_a_batch(store: Store) -> None:
    texts = random_texts(3)
    with pytest.raises(DuplicateKeyError) as raised:
        store.add_many([("a", texts[0]), ("b", texts[1]), ("a", texts[2])])
    assert raised.value.key == "a" and len(store) == 0
    assert store.add_many([("a", texts[0]), ("b", texts[1]), ("a", texts[2])], replace=True) == 3
    assert list(store) == ["b", "a"]
    assert np.array_equal(store.get("a").signature, store.hasher.signature(texts[2]))
    assert store.query(texts[0]) == []


def test_remove_and_remove_many(store: Store) -> None:
    texts = random_texts(5)
    store.add_many([(f"k{i}", t) for i, t in enumerate(texts)])
    assert store.remove("k0") is True and "k0" not in store
    assert store.query(texts[0], threshold=0.1) == []
    with pytest.raises(KeyNotFoundError) as raised:
        store.remove("k0")
    assert isinstance(raised.value, KeyError) and raised.value.key == "k0"
    assert "k0" in str(raised.value) and not str(raised.value).startswith('"')
    assert store.remove("k0", missing_ok=True) is False
    with pytest.raises(KeyNotFoundError):
        store.remove_many(["k1", "k0"])
    assert len(store) == 4  # k1 was not removed
    assert store.remove_many(["k1", "k0", "k1"], missing_ok=True) == 1
    assert store.remove_many(["k2", "k3", "k2"]) == 2  # a key listed twice goes once
    assert list(store) == ["k4"]
    with pytest.raises(KeyError):
        store.get("k2")


def test_remove_many_in_batches(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches commit on their own; a missing key still raises before any of them, a key
    listed twice goes once even across batches, and the matches follow."""
    monkeypatch.setattr(store_module, "MIN_TRANSACTION", 4)
    # No purge on its own (the removals would exceed a tenth of the documents): only the
    # removals' commits are counted here (test_a_large_removal_purges_on_its_own).
    monkeypatch.setattr(store_module, "PURGE_FRACTION", 10.0)
    texts = random_texts(30)
    store.add_many([(f"k{i}", t) for i, t in enumerate(texts)], batch_size=None)
    counter = commit_counter(store)
    with pytest.raises(KeyNotFoundError) as raised:
        store.remove_many([f"k{i}" for i in range(10)] + ["absent"], batch_size=3)
    assert raised.value.key == "absent" and len(store) == 30
    assert commit_counter(store) == counter
    doomed = [f"k{i}" for i in range(0, 20, 2)]
    assert store.remove_many([*doomed, "k0", "absent"], batch_size=4, missing_ok=True) == 10
    assert commit_counter(store) == counter + 3  # 11 distinct keys, 4 at a time
    # "auto": the minimum (4) while the store holds under 40 documents.
    assert store.remove_many([f"k{i}" for i in range(1, 20, 2)], batch_size="auto") == 10
    assert commit_counter(store) == counter + 6
    assert list(store) == [f"k{i}" for i in range(20, 30)]
    assert awaiting_purge(store) == 20  # their band entries are still there
    assert store.query(texts[4], threshold=0.1) == []
    assert [m.key for m in store.query(texts[25])] == ["k25"]
    assert store.purge() == 20 and awaiting_purge(store) == 0 and store.check().ok
    assert store.query(texts[4], threshold=0.1) == []
    assert [m.key for m in store.query(texts[25])] == ["k25"]
    with pytest.raises(InvalidParameterError, match="auto"):
        store.remove_many(["k25"], batch_size=0)
    assert len(store) == 10


def test_contains_len_and_iteration_in_insertion_order(store: Store) -> None:
    keys: list[str | bytes] = ["zeta", b"alpha", "mid", b"\x00", "Ω"]
    store.add_many(zip(keys, random_texts(len(keys)), strict=True))
    assert list(store) == keys and len(store) == 5
    assert all(key in store for key in keys) and "alpha" not in store and b"zeta" not in store
    with store.read() as txn:
        assert list(txn) == keys and list(txn.keys()) == keys


def test_a_write_blocks_key_iterator_yields_the_keys_stored_when_it_began(store: Store) -> None:
    """Replacing each document as the loop reaches it (re-tagging them all) never ended:
    each replacement is a new document at the end, and the iterator reached it again (a
    review's finding). Removals ahead of it are not yielded."""
    store.add_many((f"k{i}", f"document number {i} of the set") for i in range(10))
    with store.write() as txn:
        seen = []
        for key in txn:
            seen.append(key)
            document = txn.get(key)
            txn.add_signatures([(key, document.signature, {"tag": 1})], replace=True)
            if key == "k3":
                txn.remove("k7")
            if key == "k5":
                txn.add("new", "a document the loop adds")
    assert seen == [f"k{i}" for i in range(10) if i != 7]
    assert sorted(store) == sorted([*seen, "new"])
    assert all(store.get(key).metadata == {"tag": 1} for key in seen)


def test_iteration_crosses_chunk_boundaries(store: Store) -> None:
    # Store.__iter__ reads 1024 keys per short transaction.
    count = 2100
    store.add_many((f"key-{i:05d}", f"document number {i} of many") for i in range(count))
    store.remove_many([f"key-{i:05d}" for i in (0, 1023, 1024, 2047, 2099)])
    expected = [f"key-{i:05d}" for i in range(count) if i not in (0, 1023, 1024, 2047, 2099)]
    assert list(store) == expected and len(store) == len(expected)


def test_iterating_the_store_ends_at_the_last_document_stored_when_it_began(
    store: Store,
) -> None:
    """`for key in store:` replacing (or adding) documents never ended: each replacement is
    a new document after the others, which the next chunk yielded again (review 22)."""
    store.add_many((f"k{i}", f"text of document number {i} with words") for i in range(5))
    seen = []
    for key in store:
        seen.append(key)
        store.add(key, f"updated text for {key} with other words", replace=True)
        store.add(f"new-{key}", f"a document the loop adds after {key}", replace=True)
        if len(seen) >= 50:
            break
    assert seen == [f"k{i}" for i in range(5)]
    assert list(store) == [*(f"new-k{i}" if j else f"k{i}" for i in range(5) for j in (0, 1))]


def test_iterating_the_store_past_a_chunk_stops_at_its_first_last_document(
    tmp_path: Path,
) -> None:
    """The bound holds across the short transactions of the chunks, too (review 22)."""
    rng = np.random.default_rng(5)
    count = store_module.ITER_CHUNK + 30 if hasattr(store_module, "ITER_CHUNK") else 1054
    signatures = rng.integers(0, 2**32, (count + 3, 32), dtype=np.uint32)
    with Store.open(tmp_path / "s", create=True, num_perm=32, durable=False) as store:
        store.add_signatures((f"k{i:05d}", signatures[i]) for i in range(count))
        seen = []
        for key in store:
            if not seen:  # after the whole first chunk: these come after the bound
                store.add_signatures((f"z{i}", signatures[count + i]) for i in range(3))
            seen.append(key)
            if len(seen) > count + 3:
                break
        assert seen == [f"k{i:05d}" for i in range(count)] and len(store) == count + 3


def test_str_and_bytes_keys_are_distinct(store: Store) -> None:
    texts = random_texts(2)
    store.add("k", texts[0], metadata="str")
    store.add(b"k", texts[1], metadata="bytes")
    assert len(store) == 2 and list(store) == ["k", b"k"]
    assert store.get("k").metadata == "str" and store.get(b"k").metadata == "bytes"
    assert store.get(b"k").key == b"k" and isinstance(store.get("k").key, str)
    assert store.get(bytearray(b"k")).metadata == "bytes"
    assert [m.key for m in store.query(texts[1])] == [b"k"]
    store.remove("k")
    assert "k" not in store and b"k" in store


def _long_url(length: int, tail: str = "") -> str:
    head = "https://example.com/search?q="
    return head + "x" * (length - len(head) - len(tail)) + tail


@pytest.mark.parametrize("length", [1, 400, 401, 511, 512, 4096, codec.MAX_KEY_BYTES])
@pytest.mark.parametrize("kind", [str, bytes])
def test_long_keys(store: Store, length: int, kind: type) -> None:
    key: str | bytes = _long_url(length, "a") if length > 40 else "a" * length
    twin: str | bytes = _long_url(length, "b") if length > 40 else "b" * length
    if kind is bytes:
        key, twin = str(key).encode(), str(twin).encode()
    texts = random_texts(2)
    store.add(key, texts[0], metadata={"n": 1})
    store.add(twin, texts[1], metadata={"n": 2})  # same long prefix, different end
    assert key in store and twin in store and len(store) == 2
    assert store.get(key).key == key and store.get(key).metadata == {"n": 1}
    assert store.get(twin).metadata == {"n": 2}
    assert [m.key for m in store.query(texts[0])] == [key] and list(store) == [key, twin]
    with pytest.raises(DuplicateKeyError):
        store.add(key, texts[1])
    assert store.remove(key) is True and key not in store and twin in store
    assert store.add_if_unique(key, texts[0]).added


def test_longest_key_in_multibyte_characters(store: Store) -> None:
    key = "é" * (codec.MAX_KEY_BYTES // 2)  # 2 bytes each: exactly the limit
    store.add(key, "a document with a very long key")
    assert store.get(key).key == key
    with pytest.raises(InvalidKeyError):
        store.add(key + "e", "one byte too long")


BAD_KEYS: list[object] = [
    "",
    b"",
    "x" * (codec.MAX_KEY_BYTES + 1),
    b"x" * (codec.MAX_KEY_BYTES + 1),
    "é" * (codec.MAX_KEY_BYTES // 2 + 1),
    "\ud800",
    7,
    None,
    1.5,
    ("a",),
]


@pytest.mark.parametrize("key", BAD_KEYS, ids=[repr(k)[:20] for k in BAD_KEYS])
def test_invalid_keys_raise_and_change_nothing(store: Store, key: Any) -> None:
    store.add("fine", "a document that is stored already")
    before, counter = snapshot(store), commit_counter(store)
    text = "a perfectly good document"
    calls: list[Callable[[], object]] = [
        lambda: store.add(key, text),
        lambda: store.add_many([("ok", text), (key, text)]),
        lambda: store.add_if_unique(key, text),
        lambda: store.add_many_if_unique([("ok", text), (key, text)]),
        lambda: store.remove(key),
        lambda: store.remove(key, missing_ok=True),
        lambda: store.remove_many(["fine", key]),
        lambda: store.get(key),
        lambda: key in store,
    ]
    for call in calls:
        with pytest.raises(InvalidKeyError):
            call()
    assert snapshot(store) == before and commit_counter(store) == counter


# -- queries -----------------------------------------------------------------------------------


@pytest.fixture
def corpus_store(store: Store, near_dup_corpus: dict[str, str]) -> Store:
    store.add_many(near_dup_corpus.items())
    return store


def test_query_by_text_and_by_signature(
    corpus_store: Store, near_dup_corpus: dict[str, str]
) -> None:
    store = corpus_store
    for key, text in near_dup_corpus.items():
        matches = store.query(text)
        assert matches[0].key == key and matches[0].score == 1.0 and matches[0].exact is None
        assert [m.score for m in matches] == sorted((m.score for m in matches), reverse=True)
        assert store.query(signature=store.hasher.signature(text)) == matches
    assert [m.key for m in store.query(near_dup_corpus["storm-b"])] == ["storm-b", "storm-a"]
    score = store.query(near_dup_corpus["storm-b"])[1].score
    expected = estimate_jaccard(
        store.hasher.signature(near_dup_corpus["storm-a"]),
        store.hasher.signature(near_dup_corpus["storm-b"]),
    )
    assert score == pytest.approx(expected) and 0.7 <= score < 1.0
    assert [m.key for m in store.query(near_dup_corpus["unrelated"])] == ["unrelated"]
    assert store.query("nothing like any stored document at all") == []


def test_query_threshold_and_limit(corpus_store: Store, near_dup_corpus: dict[str, str]) -> None:
    text = near_dup_corpus["recipe-a"]
    assert [m.key for m in corpus_store.query(text)] == ["recipe-a", "recipe-b"]
    assert [m.key for m in corpus_store.query(text, threshold=1.0)] == ["recipe-a"]
    assert [m.key for m in corpus_store.query(text, limit=1)] == ["recipe-a"]
    assert len(corpus_store.query(text, limit=10)) == 2


def test_query_many_equals_query_one_by_one(
    corpus_store: Store, near_dup_corpus: dict[str, str]
) -> None:
    texts = [*near_dup_corpus.values(), "a text that matches nothing stored here"]
    singles = [corpus_store.query(t, threshold=0.75, limit=3) for t in texts]
    assert corpus_store.query_many(texts, threshold=0.75, limit=3) == singles
    assert corpus_store.query_many(iter(texts), threshold=0.75, limit=3) == singles
    signatures = corpus_store.hasher.signatures(texts)
    assert corpus_store.query_many(signatures=signatures, threshold=0.75, limit=3) == singles
    with corpus_store.read() as txn:
        assert txn.query_many(texts, threshold=0.75, limit=3) == singles
    assert corpus_store.query_many([]) == []


def test_query_with_exact_verification(
    corpus_store: Store, near_dup_corpus: dict[str, str]
) -> None:
    store, shingler = corpus_store, corpus_store.hasher.shingler
    text, near = near_dup_corpus["recipe-a"], near_dup_corpus["recipe-b"]
    exact = hashed_jaccard(shingler.hash_document(text), shingler.hash_document(near))
    estimate = estimate_jaccard(store.hasher.signature(text), store.hasher.signature(near))
    assert estimate < 0.9 <= exact  # the corpus is chosen so the two disagree at 0.9
    assert [m.key for m in store.query(text, threshold=0.9)] == ["recipe-a"]
    matches = store.query(text, threshold=0.9, exact=near_dup_corpus.__getitem__)
    assert [(m.key, m.exact) for m in matches] == [("recipe-a", 1.0), ("recipe-b", exact)]
    assert matches[1].score == pytest.approx(estimate)
    strict = store.query(text, threshold=0.95, exact=near_dup_corpus.__getitem__)
    assert [m.key for m in strict] == ["recipe-a"]
    many = store.query_many([text, near], threshold=0.9, exact=near_dup_corpus.__getitem__)
    assert many[0] == matches and [m.key for m in many[1]] == ["recipe-b", "recipe-a"]


SIG = np.zeros(PARAMS["num_perm"], dtype=np.uint32)
BAD_QUERIES: list[tuple[str, dict[str, Any]]] = [
    ("both", {"document": "text", "signature": SIG}),
    ("neither", {}),
    ("threshold 0", {"document": "some text", "threshold": 0}),
    ("threshold 1.5", {"document": "some text", "threshold": 1.5}),
    ("threshold str", {"document": "some text", "threshold": "0.5"}),
    ("threshold bool", {"document": "some text", "threshold": True}),
    ("limit 0", {"document": "some text", "limit": 0}),
    ("limit -1", {"signature": SIG, "limit": -1}),
    ("limit float", {"document": "some text", "limit": 1.5}),
    ("limit bool", {"document": "some text", "limit": True}),
    ("short signature", {"signature": SIG[:10]}),
    ("2-d signature", {"signature": SIG[None, :]}),
    ("float signature", {"signature": SIG.astype(np.float32)}),
    ("exact with signature", {"signature": SIG, "exact": str}),
]


@pytest.mark.parametrize(
    "kwargs", [kw for _, kw in BAD_QUERIES], ids=[name for name, _ in BAD_QUERIES]
)
def test_query_bad_arguments(corpus_store: Store, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidParameterError):
        corpus_store.query(**kwargs)


def test_query_many_bad_arguments(corpus_store: Store) -> None:
    with pytest.raises(InvalidParameterError):
        corpus_store.query_many(["a text"], signatures=SIG[None, :])
    with pytest.raises(InvalidParameterError):
        corpus_store.query_many()
    with pytest.raises(InvalidParameterError):
        corpus_store.query_many(signatures=SIG)


@pytest.mark.parametrize("signatures", [SIG[None, :], []], ids=["one", "none"])
def test_query_many_refuses_exact_with_signatures_as_query_does(
    corpus_store: Store, signatures: object
) -> None:
    """exact= needs the query texts: with signatures= it met a bare assert (an
    AssertionError, or under python -O a raw TypeError; review 42), or an empty batch
    answered []; query(signature=, exact=) was refused with InvalidParameterError."""
    with pytest.raises(InvalidParameterError, match=r"exact=.*text quer"):
        corpus_store.query_many(signatures=signatures, exact=str)
    with corpus_store.read() as txn, pytest.raises(InvalidParameterError, match="exact="):
        txn.query_many(signatures=signatures, exact=str)


def test_removed_document_no_longer_matches(
    corpus_store: Store, near_dup_corpus: dict[str, str]
) -> None:
    corpus_store.remove("storm-a")
    assert [m.key for m in corpus_store.query(near_dup_corpus["storm-a"])] == ["storm-b"]
    corpus_store.remove("storm-b")
    assert corpus_store.query(near_dup_corpus["storm-a"], threshold=0.1) == []


# -- lazy removal: band entries wait for a purge ---------------------------------------------


class _RollBackError(Exception):
    """Raised inside a write block to roll it back."""


def near_twins(rng: np.random.Generator, count: int) -> tuple[npt.NDArray[np.uint32], ...]:
    """``count`` random signatures of :data:`PARAMS` and a copy of each with 12 of its 128
    values changed (0.91 alike: candidates of each other for certain, in 32 bands of 4)."""
    num_perm = PARAMS["num_perm"]
    bases = rng.integers(0, 2**32, size=(count, num_perm), dtype=np.uint32)
    copies = bases.copy()
    for row in copies:
        row[rng.choice(num_perm, size=12, replace=False)] ^= 1
    return bases, copies


def expected_answers(
    live: dict[str, npt.NDArray[np.uint32]], queries: npt.NDArray[np.uint32], threshold: float
) -> list[list[tuple[str, float]]]:
    """Every stored document scoring ``threshold`` or more against each query, best first
    and then in insertion order, from the signatures alone (no store)."""
    keys, stored = list(live), np.stack(list(live.values()))
    answers = []
    for query in queries:
        scores = np.count_nonzero(stored == query, axis=1) / stored.shape[1]
        found = sorted(np.flatnonzero(scores >= threshold).tolist(), key=lambda i: -scores[i])
        answers.append([(keys[i], float(scores[i])) for i in found])
    return answers


def signature_answers(
    store: Store, queries: npt.NDArray[np.uint32]
) -> list[list[list[tuple[Any, float]]]]:
    """One query per signature, and all of them as one batch."""
    with store.read() as txn:
        single = [txn.query(signature=q) for q in queries]
        batch = txn.query_many(signatures=queries)
    return [[[(m.key, m.score) for m in found] for found in asked] for asked in (single, batch)]


def answers_of(store: Store, queries: npt.NDArray[np.uint32]) -> list[Any]:
    """:func:`signature_answers`, through the band cache if the store keeps one (which must
    then answer, and agree with LMDB's band tables)."""
    if store._band_cache is None:
        return signature_answers(store, queries)
    cached, direct = cached_and_direct(store, lambda: signature_answers(store, queries))
    assert cached == direct
    return cached


def in_buckets(store: Store, doc_id: bytes, signature: npt.NDArray[np.uint32]) -> list[bool]:
    """Whether each band table lists ``doc_id`` in the bucket of ``signature``."""
    with store.read() as txn:
        (keys,) = txn._band_key_rows(signature[None, :])
        return [doc_id in txn._bucket(band, key) for band, key in enumerate(keys)]


def band_entries(store: Store) -> list[int]:
    with store.read() as txn:
        return [int(txn.txn.stat(db)["entries"]) for db in store._band_dbs]


def doc_id_of(store: Store, key: Any) -> bytes:
    with store.read() as txn:
        found = txn._lookup(key)
    assert found is not None
    return found[0]


@pytest.mark.parametrize("band_cache", [False, True])
def test_removed_documents_leave_every_answer_at_once_and_the_band_tables_at_a_purge(
    store_path: Path, band_cache: bool
) -> None:
    bases, copies = near_twins(np.random.default_rng(5), 30)
    items = [
        (f"{side}{i}", sigs[i]) for i in range(30) for side, sigs in (("a", bases), ("b", copies))
    ]
    doomed = [f"a{i}" for i in range(0, 30, 2)] + [f"b{i}" for i in range(0, 30, 3)]
    signatures = dict(items)
    live = {key: sig for key, sig in items if key not in doomed}
    queries = np.concatenate([bases, copies])
    with Store.open(store_path, create=True, band_cache=band_cache, **PARAMS) as store:
        store.add_signatures(items)
        before = answers_of(store, queries)  # (the cache, if kept, knows every document)
        assert before[0] == before[1] == expected_answers(signatures, queries, 0.7)
        ids = {key: doc_id_of(store, key) for key in doomed}
        assert store.remove_many(doomed) == len(doomed)

        # Out of every answer at once; their band entries (and records) stay for a purge.
        pending = answers_of(store, queries)
        assert pending[0] == pending[1] == expected_answers(live, queries, 0.7)
        assert pending != before
        with store.read() as txn:
            assert txn.awaiting_purge() == len(doomed) and len(txn) == len(live)
            assert all(txn.txn.get(i, db=store._removed_db) is not None for i in ids.values())
        assert band_entries(store) == [len(items)] * store.banding.bands
        assert all(all(in_buckets(store, ids[key], signatures[key])) for key in doomed)
        report = store.check()
        assert report.ok and report.documents_checked == len(live), report.violations
        # Nor does a removed document keep a near copy out (this write is rolled back).
        found: list[Any] = []
        with contextlib.suppress(_RollBackError), store.write() as txn:
            found = txn.add_signatures_if_unique([("x0", bases[0]), ("x2", bases[2])])
            raise _RollBackError
        assert [(r.added, [m.key for m in r.matches]) for r in found] == [
            (True, []),  # a0 and b0 were removed
            (False, ["b2"]),  # a2 was removed
        ]
        assert len(store) == len(live)

        assert store.purge() == len(doomed)
        with store.read() as txn:
            assert txn.awaiting_purge() == 0 and len(txn) == len(live)
        assert band_entries(store) == [len(live)] * store.banding.bands
        assert not any(any(in_buckets(store, ids[key], signatures[key])) for key in doomed)
        assert all(all(in_buckets(store, doc_id_of(store, key), sig)) for key, sig in live.items())
        report = store.check()
        assert report.ok and report.documents_checked == len(live), report.violations
        assert answers_of(store, queries) == pending
        assert store.purge() == 0


@pytest.mark.parametrize("band_cache", [False, True])
def test_a_large_batch_answers_as_the_signatures_do_however_its_queries_share_buckets(
    store_path: Path, band_cache: bool
) -> None:
    """A batch hands each bucket's ids to every query that has the bucket as arrays of
    (query, id) pairs: twins share their buckets, some queries come twice, many match
    nothing, and some of the stored documents are removed and await a purge. Its answers,
    threshold and limit applied, are the brute-force ones, through LMDB and the cache."""
    rng = np.random.default_rng(17)
    bases, copies = near_twins(rng, 400)
    items = [
        (f"{side}{i}", sigs[i]) for i in range(400) for side, sigs in (("a", bases), ("b", copies))
    ]
    fresh = rng.integers(0, 2**32, size=(300, PARAMS["num_perm"]), dtype=np.uint32)
    queries = np.concatenate([bases[:250], copies[150:], bases[:60], fresh])
    rng.shuffle(queries)
    doomed = [f"a{i}" for i in range(0, 400, 7)]
    live = {key: sig for key, sig in items if key not in doomed}
    with Store.open(store_path, create=True, band_cache=band_cache, **PARAMS) as store:
        store.add_signatures(items)
        store.remove_many(doomed)
        with store.read() as txn:
            assert txn.awaiting_purge() == len(doomed)
        for threshold, limit in ((0.7, None), (0.7, 1), (0.95, 3)):

            def ask(threshold: float = threshold, limit: int | None = limit) -> list[Any]:
                with store.read() as txn:
                    found = txn.query_many(signatures=queries, threshold=threshold, limit=limit)
                return [[(m.key, m.score) for m in matches] for matches in found]

            answers = cached_and_direct(store, ask) if band_cache else (ask(), ask())
            expected = [found[:limit] for found in expected_answers(live, queries, threshold)]
            assert answers[0] == answers[1] == expected
            assert sum(map(len, expected)) > len(queries) // 2  # most queries have matches


@pytest.mark.parametrize("band_cache", [False, True])
def test_a_batch_whose_every_candidate_awaits_a_purge_finds_nothing(
    store_path: Path, band_cache: bool
) -> None:
    bases, copies = near_twins(np.random.default_rng(19), 3)
    with Store.open(store_path, create=True, band_cache=band_cache, **PARAMS) as store:
        store.add_signatures([(f"a{i}", sig) for i, sig in enumerate(bases)])
        store.remove_many(["a0", "a1", "a2"])
        with store.read() as txn:
            assert txn.awaiting_purge() == 3
            assert txn.query_many(signatures=np.concatenate([bases, copies])) == [[]] * 6
            assert txn.query_many(signatures=bases, threshold=0.5, limit=1) == [[]] * 3


def test_a_transaction_purges_the_lowest_ids_first_up_to_its_limit(store: Store) -> None:
    bases, _ = near_twins(np.random.default_rng(6), 10)
    store.add_signatures([(f"k{i}", sig) for i, sig in enumerate(bases)])
    doomed = ["k7", "k1", "k4", "k8", "k2"]  # ids 1, 2, 4, 7 and 8
    ids = {key: doc_id_of(store, key) for key in doomed}
    by_id = sorted(doomed, key=ids.__getitem__)
    store.remove_many(doomed)

    def waiting() -> list[bytes]:
        with store.read() as txn, txn.txn.cursor(db=store._removed_db) as cursor:
            return [bytes(doc_id) for doc_id in cursor.iternext(values=False)]

    def still_in_buckets() -> list[str]:
        return [key for key in by_id if all(in_buckets(store, ids[key], bases[int(key[1:])]))]

    assert waiting() == [ids[key] for key in by_id] and still_in_buckets() == by_id
    counter = commit_counter(store)
    with store.write() as txn:
        for bad in (0, -1, True, 1.5):
            with pytest.raises(InvalidParameterError, match="limit"):
                txn.purge(bad)  # type: ignore[arg-type]
        assert txn.awaiting_purge() == 5 and not txn._wrote  # nothing changed
    with pytest.raises(InvalidParameterError, match="progress=5"):  # before a batch commits
        store.purge(batch_size=1, progress=5)  # type: ignore[arg-type]
    assert waiting() == [ids[key] for key in by_id] and still_in_buckets() == by_id
    assert band_entries(store) == [10] * store.banding.bands
    assert commit_counter(store) == counter  # nothing written: no commit

    with store.write() as txn:
        assert txn.purge(2) == 2
        assert txn.awaiting_purge() == 3
    assert waiting() == [ids[key] for key in by_id[2:]] and still_in_buckets() == by_id[2:]
    assert band_entries(store) == [8] * store.banding.bands and store.check().ok
    with store.write() as txn:
        assert txn.purge(1) == 1 and txn.purge(10) == 2 and txn.purge() == 0
    assert waiting() == [] and still_in_buckets() == []
    assert band_entries(store) == [5] * store.banding.bands and store.check().ok
    assert list(store) == [f"k{i}" for i in (0, 3, 5, 6, 9)]
    for i, sig in enumerate(bases):
        assert [m.key for m in store.query(signature=sig)] == ([] if f"k{i}" in ids else [f"k{i}"])


def test_a_large_removal_purges_on_its_own(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a write that removed documents, a purge runs once more of them await one than
    max(MIN_TRANSACTION, PURGE_FRACTION of the stored documents), and not before."""
    assert (store_module.MIN_TRANSACTION, store_module.PURGE_FRACTION) == (10_000, 0.1)
    sigs = np.random.default_rng(7).integers(0, 2**32, size=(12_000, 32), dtype=np.uint32)
    with Store.open(store_path, create=True, num_perm=32) as store:
        store.add_signatures(((f"k{i}", sig) for i, sig in enumerate(sigs)), batch_size=None)

        def awaiting() -> tuple[int, int]:
            with store.read() as txn:
                return txn.awaiting_purge(), len(txn)

        # 10,000 in one write: not more than MIN_TRANSACTION (nor than 10 % of 2,000).
        assert store.remove_many(f"k{i}" for i in range(10_000)) == 10_000
        assert awaiting() == (10_000, 2_000)
        assert band_entries(store) == [12_000] * store.banding.bands
        # One more, in a write block of its own: 10,001 await, and all are purged.
        with store.write() as txn:
            assert txn.remove("k10000")
        assert awaiting() == (0, 1_999)
        assert band_entries(store) == [1_999] * store.banding.bands and store.check().ok

        # Past MIN_TRANSACTION, it is the fraction of the documents left that decides.
        monkeypatch.setattr(store_module, "MIN_TRANSACTION", 100)
        assert store.remove_many(f"k{i}" for i in range(10_001, 10_151)) == 150
        assert awaiting() == (150, 1_849)  # 150 <= 184.9
        assert store.remove_many(f"k{i}" for i in range(10_151, 10_191)) == 40
        assert awaiting() == (0, 1_809)  # 190 > 180.9: purged
        assert band_entries(store) == [1_809] * store.banding.bands and store.check().ok
        for i in (0, 10_000, 10_150, 10_190, 10_191, 11_999):
            assert [m.key for m in store.query(signature=sigs[i])] == (
                [f"k{i}"] if i > 10_190 else []
            )


@pytest.mark.parametrize("band_cache", [False, True])
def test_a_removed_key_added_again_is_a_new_document(store_path: Path, band_cache: bool) -> None:
    """Under a new id: queries find it and never the removed one, before and after the
    purge of the old one's band entries (same signature, another one, or a replace)."""
    bases, copies = near_twins(np.random.default_rng(8), 6)
    with Store.open(store_path, create=True, band_cache=band_cache, **PARAMS) as store:
        store.add_signatures([(f"k{i}", sig) for i, sig in enumerate(bases)])
        answers_of(store, bases)  # (the cache, if kept, knows the first documents)
        old = {key: doc_id_of(store, key) for key in ("k0", "k1", "k2")}
        store.remove_many(["k0", "k1"])
        store.add_signatures([("k0", bases[0]), ("k1", copies[4])])  # k1: now a near copy of k4
        store.add("k2", signature=copies[5], replace=True)  # k2: now a near copy of k5
        new = {key: doc_id_of(store, key) for key in old}
        assert all(new[key] > old[key] for key in old)  # ids are never reused
        assert codec.decode_id(new["k0"]) == len(bases)
        with store.read() as txn:
            assert txn.awaiting_purge() == 3
        assert all(all(in_buckets(store, old[key], bases[int(key[1:])])) for key in old)

        queries = np.concatenate([bases, copies])
        live = {
            "k0": bases[0], "k1": copies[4], "k2": copies[5],
            "k3": bases[3], "k4": bases[4], "k5": bases[5],
        }  # fmt: skip
        by_id = dict(sorted(live.items(), key=lambda item: doc_id_of(store, item[0])))
        expected = expected_answers(by_id, queries, store.threshold)
        assert [[key for key, _ in found] for found in expected[:6]] == [
            ["k0"],
            [],
            [],
            ["k3"],
            ["k4", "k1"],
            ["k5", "k2"],
        ]
        pending = answers_of(store, queries)
        assert pending[0] == pending[1] == expected
        assert store.get("k0").signature.tolist() == bases[0].tolist()
        assert store.get("k1").signature.tolist() == copies[4].tolist()
        assert store.check().ok

        assert store.purge() == 3
        assert not any(any(in_buckets(store, old[key], bases[int(key[1:])])) for key in old)
        assert all(in_buckets(store, new["k0"], bases[0]))  # the same buckets, the new id
        with store.read() as txn:
            assert txn.awaiting_purge() == 0
        assert answers_of(store, queries) == pending and store.check().ok


# -- add_if_unique -----------------------------------------------------------------------------


def test_add_if_unique(store: Store, near_dup_corpus: dict[str, str]) -> None:
    first = store.add_if_unique("storm-a", near_dup_corpus["storm-a"], metadata={"first": True})
    assert first.added and first.matches == [] and first.key == "storm-a"
    second = store.add_if_unique("storm-b", near_dup_corpus["storm-b"])
    assert not second.added and [m.key for m in second.matches] == ["storm-a"]
    assert "storm-b" not in store and len(store) == 1
    assert store.add_if_unique("storm-b", near_dup_corpus["storm-b"], threshold=0.9).added
    assert store.add_if_unique("unrelated", near_dup_corpus["unrelated"]).added
    by_signature = store.add_if_unique(
        "copy", signature=store.hasher.signature(near_dup_corpus["unrelated"])
    )
    assert not by_signature.added and by_signature.matches[0].key == "unrelated"
    with pytest.raises(DuplicateKeyError):
        store.add_if_unique("storm-a", "a completely different text now")
    assert list(store) == ["storm-a", "storm-b", "unrelated"]


def test_add_many_if_unique_catches_duplicates_within_the_batch(
    store: Store, near_dup_corpus: dict[str, str]
) -> None:
    store.add("unrelated", near_dup_corpus["unrelated"])
    counter = commit_counter(store)
    results = store.add_many_if_unique(
        [
            ("recipe-a", near_dup_corpus["recipe-a"], {"m": 1}),
            ("storm-a", near_dup_corpus["storm-a"]),
            ("recipe-b", near_dup_corpus["recipe-b"]),  # near-duplicate of item 0
            ("again", near_dup_corpus["unrelated"]),  # near-duplicate of a stored one
            ("storm-b", near_dup_corpus["storm-b"]),
        ]
    )
    assert [(r.key, r.added) for r in results] == [
        ("recipe-a", True),
        ("storm-a", True),
        ("recipe-b", False),
        ("again", False),
        ("storm-b", False),
    ]
    assert [m.key for m in results[2].matches] == ["recipe-a"]
    assert [m.key for m in results[3].matches] == ["unrelated"]
    assert [m.key for m in results[4].matches] == ["storm-a"]
    assert list(store) == ["unrelated", "recipe-a", "storm-a"]
    assert commit_counter(store) == counter + 1 and store.get("recipe-a").metadata == {"m": 1}
    with pytest.raises(DuplicateKeyError):
        store.add_many_if_unique([("x", "some new text here"), ("x", "other new text here")])
    assert "x" not in store


# -- map growth --------------------------------------------------------------------------------


def test_tiny_map_grows_while_ingesting(store_path: Path) -> None:
    small = 256 * KiB
    payload = bytes(range(256)) * 8  # 2 KiB of metadata per document
    with Store.open(store_path, create=True, map_size=small) as store:
        assert store._env is not None and store._env.info()["map_size"] == small
        for batch in range(10):
            texts = random_texts(200, seed=batch)
            store.add_many(
                ((f"{batch}-{i}", t, {"p": payload}) for i, t in enumerate(texts)),
                batch_size=None,
            )
        grown = int(store._env.info()["map_size"])
        assert grown >= 4 * 1024 * KiB > small  # 2000 documents of over 2 KiB each
        assert len(store) == 2000 and store.get("9-199").metadata == {"p": payload}
    assert raw_meta(store_path)["map_size"] == grown
    with Store.open(store_path, map_size=small) as reopened:  # never shrinks
        assert reopened._env is not None and reopened._env.info()["map_size"] == grown
        assert len(reopened) == 2000
    with Store.open(store_path) as reopened:
        assert reopened._env is not None and reopened._env.info()["map_size"] >= grown


def test_transaction_larger_than_the_map_is_redone_and_commits_once(store_path: Path) -> None:
    small = 256 * KiB
    payload = b"\x01" * (16 * KiB)
    with Store.open(store_path, create=True, map_size=small) as store:
        store.add_many([("old-0", "the first old document"), ("old-1", "the second old one")])
        counter = commit_counter(store)
        assert store._env is not None and store._env.info()["map_size"] == small
        with store.write() as txn:
            assert txn.get("old-0").key == "old-0"  # logged reads are replayed too
            txn.remove("old-1")
            for i, text in enumerate(random_texts(200)):  # over 3 MiB in one transaction
                txn.add(f"new-{i}", text, metadata={"p": payload, "i": i})
            assert len(txn) == 201
        assert store._env.info()["map_size"] >= 4 * 1024 * KiB
        assert commit_counter(store) == counter + 1
        assert len(store) == 201 and "old-1" not in store
        assert list(store) == ["old-0"] + [f"new-{i}" for i in range(200)]
        assert store.get("new-199").metadata == {"p": payload, "i": 199}
    assert raw_meta(store_path)["next_doc_id"] == 202


def finished_writes(store: Store) -> list[tuple[str, Callable[[], None]]]:
    """Write transactions of every kind, each ended by its call (committed, aborted, or
    redone after a map growth), named by what it did."""
    rng = np.random.default_rng(7)
    sigs = rng.integers(0, 2**32, size=(300, store.config.num_perm), dtype=np.uint32)

    def add() -> None:
        with store.write() as txn:
            txn.add_signatures([(f"s{i}", sig) for i, sig in enumerate(sigs[:200])])

    def dedup_and_read() -> None:
        with store.write() as txn:
            txn.add_signatures_if_unique([(f"u{i}", sig) for i, sig in enumerate(sigs[150:])])
            txn.query_many(signatures=sigs[:20])
            txn.get("s0")

    def remove() -> None:
        with store.write() as txn:
            txn.remove_many([f"s{i}" for i in range(50)])

    def abort() -> None:
        try:
            with store.write() as txn:
                txn.add("aborted", "a document that is rolled back")
                raise KeyError("roll back")
        except KeyError:
            return
        raise AssertionError("the block's error did not propagate")

    def grow() -> None:  # past the small map: the log is replayed, then dropped
        with store.write() as txn:
            txn.add_many([(f"big{i}", text) for i, text in enumerate(random_texts(60))])
            for i in range(40):
                txn.add(f"meta{i}", f"document {i}", metadata={"p": b"\x01" * (16 * KiB)})

    return [
        ("add_signatures", add),
        ("add_signatures_if_unique, query_many, get", dedup_and_read),
        ("remove_many", remove),
        ("abort", abort),
        ("map growth", grow),
    ]


def test_a_finished_write_transaction_is_freed_without_the_cyclic_collector(
    store_path: Path,
) -> None:
    """The replay log refers back to its transaction; once the transaction ends nothing
    may keep it (and the batches it logged) alive until ``gc`` runs."""
    import gc
    import weakref

    transactions: list[weakref.ref[WriteTxn]] = []
    original = WriteTxn.__init__

    def tracked(self: WriteTxn, *args: Any) -> None:
        original(self, *args)
        transactions.append(weakref.ref(self))

    with Store.open(store_path, create=True, map_size=256 * KiB) as store:
        gc.collect()
        gc.disable()
        try:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(WriteTxn, "__init__", tracked)
                for done, write in finished_writes(store):
                    write()
                    assert transactions, done
                    assert transactions[-1]() is None, f"{done}: the transaction outlived its block"
        finally:
            gc.enable()
        # 200 added, 100 of the next 150 (50 were copies), 50 removed, 100 more.
        assert len(store) == 350 and "aborted" not in store
        assert store._env is not None and store._env.info()["map_size"] > 256 * KiB


@pytest.mark.parametrize("count", range(2, 25, 2))
def test_commit_that_runs_out_of_room_is_redone(store_path: Path, count: int) -> None:
    # With this map, some of these counts fill it exactly at commit time (when the counters
    # are written or the commit allocates its pages) rather than during an add.
    rng = np.random.default_rng(count)
    params: dict[str, Any] = {"num_perm": 16, "bands": 4, "rows": 4, "map_size": 64 * KiB}
    with Store.open(store_path, create=True, **params) as store:
        signatures = rng.integers(0, 2**32, size=(count, 16), dtype=np.uint32)
        with store.write() as txn:
            for i in range(count):
                txn.add(f"key-{i:05d}" + "x" * 100, signature=signatures[i], metadata="p" * 200)
        assert len(store) == count and commit_counter(store) == 1
        assert np.array_equal(
            store.get(f"key-{count - 1:05d}" + "x" * 100).signature, signatures[-1]
        )


def test_growth_ends_the_growing_threads_own_snapshot_with_a_typed_error(
    store_path: Path,
) -> None:
    with Store.open(store_path, create=True, map_size=256 * KiB) as store:
        store.add("a", "a first document to read")
        with store.read() as snapshot:
            signature = snapshot.get("a").signature
            assert [m.key for m in snapshot.query(signature=signature)] == ["a"]  # cursors open
            store.add_many(
                ((f"k{i}", t, {"p": b"x" * 2048}) for i, t in enumerate(random_texts(400))),
                batch_size=None,
            )
            with pytest.raises(StoreClosedError, match="map grew"):
                snapshot.get("a")
            with pytest.raises(StoreClosedError, match="map grew"):
                snapshot.query(signature=signature)
            with pytest.raises(StoreClosedError, match="map grew"):
                snapshot.query_many(signatures=[signature, signature])
        assert len(store) == 401 and store.get("a").key == "a"


def test_a_key_iterator_outliving_its_transaction_raises_a_typed_error(
    store_path: Path,
) -> None:
    """A key iterator holds an LMDB cursor; read on after its transaction ended (the
    block closed, or a growth ended or replaced it) it raised a raw lmdb.Error."""
    extra = ((f"k{i}", t, {"p": b"x" * 2048}) for i, t in enumerate(random_texts(400)))
    with Store.open(store_path, create=True, map_size=256 * KiB) as store:
        store.add_many([("a", "a first document to read"), ("b", "a second one")])
        with store.read() as snapshot:
            after_block = snapshot.keys()
            assert next(after_block) == "a"
        with pytest.raises(StoreClosedError, match="key iterator"):
            next(after_block)
        with store.read() as snapshot:
            after_growth = iter(snapshot)
            assert next(after_growth) == "a"
            store.add_many(extra, batch_size=None)  # this thread's write grows the map
            with pytest.raises(StoreClosedError, match="key iterator"):
                next(after_growth)
        with store.write() as writer:
            own, epoch = writer.keys(), store.map_epoch
            assert next(own) == "a"
            writer.add_many(
                (f"w{i}", t, {"p": b"y" * 4096}) for i, t in enumerate(random_texts(400, seed=1))
            )  # past the map again: the block is redone in a new LMDB transaction
            assert store.map_epoch > epoch
            with pytest.raises(StoreClosedError, match="key iterator"):
                next(own)
            assert next(writer.keys()) == "a"
        assert len(store) == 802


def test_growth_waits_for_readers_of_other_threads(store_path: Path) -> None:
    import threading

    with Store.open(store_path, create=True, map_size=256 * KiB) as store:
        store.add("a", "a first document to read")
        started, seen, failures = threading.Event(), [], []

        def reader() -> None:
            try:
                with store.read() as snapshot:
                    started.set()
                    for _ in range(50):
                        seen.append(snapshot.get("a").key)
                        time.sleep(0.005)
                    seen.append(len(snapshot))
            except Exception as err:  # the assertion below reports it
                failures.append(err)

        thread = threading.Thread(target=reader)
        thread.start()
        started.wait()
        store.add_many(
            ((f"k{i}", t, {"p": b"x" * 2048}) for i, t in enumerate(random_texts(400))),
            batch_size=None,
        )
        thread.join()
        assert failures == [] and seen == ["a"] * 50 + [1]  # a snapshot from before
        assert len(store) == 401


# -- several processes -------------------------------------------------------------------------


WORKER = r"""
import json, sys, time
from pathlib import Path

from neardup_store import store as store_module
from neardup_store.store import Store

role, path = sys.argv[1], sys.argv[2]
if role == "writer":
    prefix, batches, size = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    with Store.open(path) as store:
        for batch in range(batches):
            with store.write() as txn:
                txn.add_many(
                    (f"{prefix}-{batch}-{i}",
                     f"{prefix} writes batch {batch}, document {i}: " + "lorem ipsum " * 20,
                     {"writer": prefix, "batch": batch, "pad": b"p" * 1024})
                    for i in range(size)
                )
elif role == "reader":
    ready, stop, size = Path(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5])
    rounds, seen, last = 0, set(), 0
    with Store.open(path, read_only=True) as store:
        while True:
            finished = stop.exists()
            with store.read() as txn:
                keys = list(txn.keys())
                assert len(txn) == len(keys), (len(txn), len(keys))
                groups = {}
                for key in keys:
                    doc = txn.get(key)
                    writer, batch, _ = key.split("-")
                    assert doc.metadata["writer"] == writer, key
                    groups[(writer, batch)] = groups.get((writer, batch), 0) + 1
                assert all(n == size for n in groups.values()), groups  # whole batches only
                assert len(keys) >= last, (len(keys), last)
            last = len(keys)
            seen.add(last)
            rounds += 1
            ready.touch()
            if finished:
                break
    print(json.dumps({"rounds": rounds, "states": len(seen), "final": last}))
"""


def _python(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    return subprocess.Popen(
        [sys.executable, *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str], timeout_s: float = 120) -> str:
    out, err = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, err
    return out


def test_writers_and_readers_in_several_processes(tmp_path: Path, store_path: Path) -> None:
    batches, size = 12, 20
    # A small map, so the writers grow it while the others read and write.
    Store.open(store_path, create=True, num_perm=32, map_size=256 * KiB).close()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    stop = tmp_path / "stop"
    ready = [tmp_path / f"ready-{n}" for n in range(2)]
    readers = [
        _python(str(script), "reader", str(store_path), str(r), str(stop), str(size)) for r in ready
    ]
    writers: list[subprocess.Popen[str]] = []
    try:
        deadline = time.monotonic() + 60
        while not all(r.exists() for r in ready):  # both readers are reading
            for reader in readers:
                if reader.poll() is not None:
                    _finish(reader)  # it stopped early: show why
            assert time.monotonic() < deadline, "the readers did not start"
            time.sleep(0.02)
        writers = [
            _python(str(script), "writer", str(store_path), name, str(batches), str(size))
            for name in ("a", "b")
        ]
        for writer in writers:
            _finish(writer)
    finally:
        stop.touch()
        for process in [*writers, *readers]:  # leave no process behind if a check failed
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
    reports = [json.loads(_finish(reader)) for reader in readers]
    total = 2 * batches * size
    assert all(r["final"] == total and r["rounds"] >= 2 for r in reports)
    with Store.open(store_path, read_only=True) as store:
        assert len(store) == total and store._env is not None
        assert store._env.info()["map_size"] > 256 * KiB
        expected = {f"{w}-{b}-{i}" for w in "ab" for b in range(batches) for i in range(size)}
        assert set(store) == expected
        assert commit_counter(store) == 2 * batches


def _in_a_forked_child(run: Callable[[], object]) -> Any:
    """Fork, and what ``run()`` returns in the child (JSON-able), sent through a pipe:
    the child never returns into pytest, and must exit with 0."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            os.write(write_end, json.dumps(run()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        report = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(report)


def _outcomes_in_a_forked_child(calls: Sequence[Callable[[], object]], store: Store) -> list[str]:
    """In a forked child, each call's outcome (the name of what it raised, or "no
    error"), then ``store`` closed there, which must leave the parent's environment
    alone."""

    def outcomes() -> list[str]:
        found = []
        for call in calls:
            try:
                call()
                found.append("no error")
            except BaseException as err:
                found.append(type(err).__name__)
        store.close()
        return found

    return _in_a_forked_child(outcomes)  # type: ignore[no-any-return]


def test_forked_child_cannot_use_the_parents_store(store: Store) -> None:
    store.add("a", "a document the parent stored before the fork")
    with store.read() as snap:  # the parent reads across the fork
        begun = snap.keys()  # an iterator begun before the fork read on in the child,
        next(begun)  # through the parent's transaction (review 21)
        calls: Sequence[Callable[[], object]] = [
            lambda: store.get("a"),
            lambda: len(store),
            lambda: "a" in store,
            lambda: list(store),
            lambda: store.add("b", "the child tries to add a document"),
            lambda: store.query("a document the parent stored before the fork"),
            lambda: store.read().__enter__(),
            lambda: store.write().__enter__(),
            lambda: store.sync(),
            # the parent's open snapshot, carried across the fork
            lambda: snap.get("a"),
            lambda: len(snap),
            lambda: list(snap.keys()),
            lambda: snap.query("a document the parent stored before the fork"),
            lambda: next(begun, None),
        ]
        outcomes = _outcomes_in_a_forked_child(calls, store)
        assert outcomes == ["ForkedStoreError"] * 14
        assert store._env is not None and str(os.getpid()) in store._env.readers()
        assert snap.get("a").key == "a"
    store.add("b", "the parent's store still works after the fork")
    assert list(store) == ["a", "b"]


def test_forked_child_cannot_use_the_parents_write_transaction(store: Store) -> None:
    """A write transaction carried across fork() refuses in the child (it answered, and
    its adds went nowhere), and the parent's block commits as if the child were not there."""
    read_end, write_end = os.pipe()
    with store.write() as txn:
        txn.add("parent", "the parent adds this before the fork")
        pid = os.fork()
        if pid == 0:
            outcome = "no error"
            try:
                os.close(read_end)
                try:
                    txn.add("child", "the child adds through the parent's transaction")
                except ForkedStoreError:
                    outcome = "forked"
                except BaseException as err:
                    outcome = type(err).__name__
                os.write(write_end, outcome.encode())
            finally:
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            report = pipe.read()
        os.waitpid(pid, 0)
        assert report == b"forked"
        txn.add("after", "the parent adds this after the fork")
    assert sorted(store) == ["after", "parent"]
    assert store.check().ok


def test_a_child_forked_while_another_thread_holds_the_stores_lock_is_told_at_once(
    store: Store,
) -> None:
    """The fork check came after the store's internal lock, which a compaction in another
    thread holds throughout: the child's first call waited for ever (review 21)."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store._readers_lock:
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                store.query("any text at all, for the child")
            except ForkedStoreError:
                code = 0
            finally:
                os._exit(code)
        for _ in range(200):  # up to 20 s
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the child's first call hung on the lock the parent's thread held")
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        holder.join()


# -- durability --------------------------------------------------------------------------------


@pytest.mark.parametrize("attempt", range(2))
def test_a_ctrl_c_during_a_commit_counts_the_batch_it_committed(
    store_path: Path, attempt: int
) -> None:
    """A Ctrl-C that comes while LMDB commits (a C call: Python raises it once the commit
    has returned) was reported as the batch not committed: ``committed`` fell a batch
    short of what was stored, and a resume there met DuplicateKeyError (a review's
    finding). Here the Ctrl-C is sent the moment the data file grows, which it does only
    while a commit writes; wherever it lands, ``committed`` must be what is stored."""
    rng = np.random.default_rng(attempt)
    sigs = rng.integers(0, 2**32, size=(60_000, 64), dtype=np.uint32)
    with Store.open(store_path, create=True, num_perm=64) as store:
        data = store_path / "data.mdb"
        start = data.stat().st_size

        def interrupt_when_the_file_grows() -> None:
            deadline = time.monotonic() + 60
            while data.stat().st_size == start and time.monotonic() < deadline:
                time.sleep(0.0005)
            os.kill(os.getpid(), signal.SIGINT)

        def load() -> None:
            store.add_signatures([(f"k{i}", sig) for i, sig in enumerate(sigs)], batch_size=20_000)
            time.sleep(5)  # all committed before the signal: it lands here

        watcher = threading.Thread(target=interrupt_when_the_file_grows)
        watcher.start()
        try:
            with pytest.raises(KeyboardInterrupt) as stopped:
                load()
        finally:
            watcher.join()
        assert getattr(stopped.value, "committed", len(store)) == len(store)


@pytest.mark.parametrize("at", range(26))  # the 24 calls of a batch's end, and past them
def test_a_ctrl_c_at_any_call_of_a_commit_frees_the_writer_and_counts_true(
    store_path: Path, at: int
) -> None:
    """A Ctrl-C raised at each Python call made while a batch ends (before, around and
    after LMDB's commit; placed by a trace hook where a SIGINT arriving then is raised):
    ``committed`` is what is stored, and the write lock is free at once. One landing
    between the writer letting go of its LMDB transaction and the commit left that
    transaction open and the lock held while the error lived (a review's finding)."""
    rng = np.random.default_rng(at)
    items = [(f"k{i}", rng.integers(0, 2**32, 64, dtype=np.uint32)) for i in range(300)]
    calls = 0

    def hook(frame: Any, event: str, arg: object) -> None:
        nonlocal calls
        ending = frame.f_back
        while ending is not None and ending.f_code.co_name != "_end":
            ending = ending.f_back
        if event == "call" and ending is not None:
            calls += 1
            if calls == at + 1:
                raise KeyboardInterrupt

    with Store.open(store_path, create=True, num_perm=64) as store:
        stopped: KeyboardInterrupt | None = None
        sys.settrace(hook)
        try:
            store.add_signatures(items, batch_size=100)
        except KeyboardInterrupt as error:
            stopped = error
        finally:
            sys.settrace(None)
        assert stopped is not None or calls <= at  # raised, unless fewer calls came
        if stopped is not None:
            assert getattr(stopped, "committed", None) == len(store), calls
            start = time.perf_counter()
            store.add_signatures(items[len(store) :], batch_size=100)  # the lock is free
            assert time.perf_counter() - start < 5
        assert list(store) == [key for key, _ in items] and store.check().ok


def test_non_durable_store_commits_and_syncs(store_path: Path) -> None:
    texts = random_texts(3)
    with Store.open(store_path, create=True, durable=False) as store:
        assert store.durable is False
        store.add_many([(f"k{i}", t) for i, t in enumerate(texts)])
        checker = _python(
            "-c",
            "import sys; from neardup_store.store import Store; "
            "s = Store.open(sys.argv[1], read_only=True); print(len(s), list(s))",
            str(store_path),
        )
        assert _finish(checker).split(maxsplit=1)[0] == "3"  # another process sees the commit
        store.sync()
    with Store.open(store_path) as reopened:
        assert list(reopened) == ["k0", "k1", "k2"] and reopened.durable is True
        assert np.array_equal(reopened.get("k1").signature, reopened.hasher.signature(texts[1]))


def test_opening_the_same_store_twice_in_one_process_is_a_clear_error(store_path: Path) -> None:
    with Store.open(store_path, create=True) as store:
        with pytest.raises(StoreBusyError, match="has it open already; use the open Store"):
            Store.open(store_path)
        assert len(store) == 0  # the first one is untouched


HOLD_READER = r"""
import sys, time
from neardup_store import store as store_module
from neardup_store.store import Store

store = Store.open(sys.argv[1], read_only=True, max_readers=int(sys.argv[2]))
with store.read() as txn:
    print(len(txn), flush=True)
    time.sleep(600)
"""


def test_reader_slots_of_killed_processes_are_reclaimed(store_path: Path) -> None:
    """Killed readers leave their slots taken; the next reader that finds the table full
    clears them instead of failing with ReadersFullError."""
    slots = 3
    with Store.open(store_path, create=True, max_readers=slots) as store:
        store.add("a", "a document to read")
        holders = [_python("-c", HOLD_READER, str(store_path), str(slots)) for _ in range(slots)]
        for holder in holders:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "1"
        for holder in holders:
            holder.kill()
            holder.wait()
        assert store._env is not None and str(holders[0].pid) in store._env.readers()
        with store.read() as txn:  # every slot is held by a dead process
            assert txn.get("a").key == "a"
        assert str(holders[0].pid) not in store._env.readers()


def test_put_failing_part_way_poisons_the_transaction(store_path: Path) -> None:
    """A document whose writes fail after some of them went through (here LMDB rejects an
    empty band key, after the record and key were written) must not be committed even
    if the caller catches the error and carries on."""
    with Store.open(store_path, create=True) as store:
        store.add("before", "a document committed earlier")
        writing = store.write()
        txn = writing.__enter__()
        (doc,) = prepare_batch(store, [("half", "a document that will fail", None)]).docs()
        broken = doc._replace(band_keys=[b"", *doc.band_keys[1:]])
        with pytest.raises(TransactionAbortedError, match="BadValsizeError"):
            txn._run(txn._store_prepared, broken, False)
        with pytest.raises(TransactionAbortedError):
            txn.add("after", "the caller carries on regardless")
        with pytest.raises(TransactionAbortedError, match="part-way"):
            writing.__exit__(None, None, None)  # a clean exit of the with block
        assert list(store) == ["before"]
        assert store.check().ok


HOLD_WRITE = r"""
import sys
from neardup_store import store as store_module
from neardup_store.store import Store

with Store.open(sys.argv[1]) as store:
    print("opened", flush=True)
    sys.stdin.readline()
    print("adding", flush=True)
    if len(sys.argv) > 2:
        exec(sys.argv[2])
    else:
        store.add("contested", "the other process's text for this key")
    print("committed", flush=True)
"""


def _wait_until_blocked(pid: int, timeout_s: float = 30) -> None:
    """Wait until the process sleeps on a futex (LMDB's shared mutex) for a moment."""
    wchan = Path(f"/proc/{pid}/wchan")
    deadline, steady = time.monotonic() + timeout_s, 0
    while steady < 3:
        assert time.monotonic() < deadline, "the other process never blocked"
        time.sleep(0.05)
        steady = steady + 1 if wchan.read_text().startswith("futex") else 0


_OURS, _THEIRS = "this process's text for the key", "the other process's text for this key"


class _ContestedReplay(NamedTuple):
    store: Store
    writing: Any  # the write block's context manager, entered
    txn: WriteTxn
    other: subprocess.Popen[str]


@contextlib.contextmanager
def _replay_meeting_another_commit(
    path: Path, monkeypatch: pytest.MonkeyPatch, theirs: tuple[str, ...] = (), stored: int = 0
) -> Iterator[_ContestedReplay]:
    """A write block of this process, and another process (HOLD_WRITE) that adds
    "contested" (or runs the statement ``theirs``, after this process has added
    "contested" and removed it) once told to: after the block's first operations,
    :func:`_replay` lets it commit between the block's abort and its replay, and replays.
    ``stored`` documents (``s0``, ``s1``, ...) are committed before it all.

    LMDB's write lock is not fair: left alone, this process often takes it back before
    the woken one runs. So the growth step, which runs after the abort, waits until the
    other process says it has committed; the replay then meets its write.
    """
    with Store.open(path, create=True) as store:
        store.add_many((f"s{i}", f"stored document number {i} " * 5) for i in range(stored))
        if theirs:
            store.add("contested", _OURS)
            store.remove("contested")
        other = _python("-c", HOLD_WRITE, str(path), *theirs)
        assert other.stdout is not None and other.stdout.readline().strip() == "opened"
        grow_and_begin = store._grow_and_begin_write

        def after_the_other_commits() -> lmdb.Transaction:
            assert other.stdout is not None and other.stdout.readline().strip() == "committed"
            return grow_and_begin()

        monkeypatch.setattr(store, "_grow_and_begin_write", after_the_other_commits)
        writing = store.write()
        yield _ContestedReplay(store, writing, writing.__enter__(), other)
        _finish(other)
        assert store.check().ok
        if theirs:
            return
        assert list(store) == [*(f"s{i}" for i in range(stored)), "contested"]
        assert store.get("contested").signature.tolist() == (
            store.hasher.signature(_THEIRS).tolist()
        )


def _replay(contested: _ContestedReplay) -> None:
    """Let the other process add "contested" (it blocks on LMDB's write lock, which this
    process holds), then do what a full map triggers: abort, grow, replay."""
    other = contested.other
    assert other.stdin is not None and other.stdout is not None
    other.stdin.write("go\n")
    other.stdin.flush()
    assert other.stdout.readline().strip() == "adding"
    _wait_until_blocked(other.pid)
    contested.txn._redo_after_growth()


@pytest.mark.parametrize("caught", [False, True])
def test_replay_that_diverges_raises_conflict_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caught: bool
) -> None:
    """If another process commits while a transaction is being redone after map growth,
    and that changes an operation's result, the redo is refused instead of changing the
    meaning of what the caller already saw.

    A caller that catches the conflict inside the block cannot commit what is left: the
    block's later operations and its end raise (the first operation is the one that
    failed to replay, so nothing was rewritten before the conflict; a review found that
    end passing silently as a transaction that wrote nothing).
    """
    with _replay_meeting_another_commit(tmp_path / "store", monkeypatch) as contested:
        txn, writing = contested.txn, contested.writing
        assert txn.add("contested", _OURS) is False
        with pytest.raises(TransactionConflictError, match="DuplicateKeyError") as conflict:
            _replay(contested)
        if caught:
            with pytest.raises(TransactionAbortedError, match="TransactionConflictError"):
                txn.add("later", _OURS)
            with pytest.raises(TransactionAbortedError, match="TransactionConflictError"):
                writing.__exit__(None, None, None)  # the block's clean end cannot commit
        else:  # the with block ends with the error: rolled back, and it propagates
            assert writing.__exit__(type(conflict.value), conflict.value, None) is False


@pytest.mark.parametrize("first", ["add_many", "add_many_if_unique", "exact query", "in"])
def test_a_replay_checks_again_what_a_batch_add_or_a_read_decided(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    """The key check of a batch add, an exact query and ``key in txn`` ran outside the
    logged operations: a replay after another process's commit overwrote its key entry
    (two records for one key, one unreachable) or kept a decision its answer no longer
    supported (a review's finding). Each is now checked again, as add() was."""
    with _replay_meeting_another_commit(tmp_path / "store", monkeypatch) as contested:
        txn = contested.txn
        if first == "add_many":
            assert txn.add_many([("contested", _OURS)]) == 1
        elif first == "add_many_if_unique":
            assert txn.add_many_if_unique([("contested", _OURS)])[0].added
        elif first == "exact query":
            assert txn.query(_THEIRS, exact={"contested": _THEIRS}.__getitem__) == []
        else:
            assert "contested" not in txn
        with pytest.raises(TransactionConflictError) as conflict:
            _replay(contested)
        assert contested.writing.__exit__(type(conflict.value), conflict.value, None) is False


@pytest.mark.parametrize("read", ["get", "remove", "keys", "iteration", "awaiting_purge"])
def test_a_replay_checks_again_a_refusal_and_every_other_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read: str
) -> None:
    """A read whose answer the block may act on must give the same answer in a replay,
    or the replay conflicts. A review found three that did not: a refusal (get or remove
    raising KeyNotFoundError, which the caller caught: failed operations were not
    logged), the key iterator read to the end, and awaiting_purge(). Each let a block
    commit a decision that another process's commit had made wrong."""
    theirs = ("store.purge()",) if read == "awaiting_purge" else ()
    with _replay_meeting_another_commit(tmp_path / "store", monkeypatch, theirs) as contested:
        txn = contested.txn
        if read in ("get", "remove"):
            with pytest.raises(KeyNotFoundError):
                getattr(txn, read)("contested")
        elif read == "keys":
            assert list(txn.keys()) == []
        elif read == "iteration":
            assert [key for key in txn] == []
        else:
            assert txn.awaiting_purge() == 1
        with pytest.raises(TransactionConflictError) as conflict:
            _replay(contested)
        assert contested.writing.__exit__(type(conflict.value), conflict.value, None) is False


def test_a_replay_goes_on_past_a_key_iterator_read_in_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An iterator that read its first keys only, then another process's add (a new last
    document) met in a replay: the keys read are the same, so the block goes on. The
    check of where an iterator ends conflicted here, and the block was lost (a review of
    a fix's finding); it matters only to an iterator read to the end."""
    stored = 3
    with _replay_meeting_another_commit(
        tmp_path / "store", monkeypatch, stored=stored
    ) as contested:
        assert list(itertools.islice(contested.txn.keys(), 2)) == ["s0", "s1"]
        _replay(contested)  # no TransactionConflictError
        assert contested.writing.__exit__(None, None, None) is False  # committed


def test_a_replay_meeting_the_same_refusal_goes_on(tmp_path: Path) -> None:
    """A refusal the replay meets again is the same answer: the block commits."""
    rng = np.random.default_rng(8)
    with Store.open(tmp_path / "s", create=True, num_perm=64, map_size=1 << 16) as store:
        epoch = store.map_epoch
        with store.write() as txn:
            with pytest.raises(KeyNotFoundError):
                txn.remove("absent")
            partial = iter(txn)
            assert next(partial, None) is None
            sigs = rng.integers(0, 2**32, size=(300, 64), dtype=np.uint32)
            txn.add_signatures([(f"k{i}", s, {"p": "x" * 200}) for i, s in enumerate(sigs)])
        assert store.map_epoch > epoch and len(store) == 300


def test_a_key_buffer_reused_by_the_caller_does_not_change_what_was_removed(
    tmp_path: Path,
) -> None:
    """remove(bytearray) logged the caller's buffer: a replay after a map growth removed
    whatever key the buffer held by then, and kept the one asked for (a review's
    finding)."""
    rng = np.random.default_rng(7)
    with Store.open(tmp_path / "s", create=True, num_perm=64, map_size=1 << 16) as store:
        store.add_signatures(
            [(f"doc-{i}".encode(), rng.integers(0, 2**32, 64, dtype=np.uint32)) for i in range(9)]
        )
        epoch, buffer = store.map_epoch, bytearray(b"doc-0")
        with store.write() as txn:
            assert txn.remove(buffer) is True
            assert txn.remove_many([buffer], missing_ok=True) == 0
            buffer[:] = b"doc-5"
            sigs = rng.integers(0, 2**32, size=(300, 64), dtype=np.uint32)
            txn.add_signatures([(f"new-{i}", s, {"p": "x" * 200}) for i, s in enumerate(sigs)])
        assert store.map_epoch > epoch
        assert b"doc-0" not in store and b"doc-5" in store
        assert store.check().ok


def test_a_signature_array_reused_by_the_caller_does_not_change_what_was_added(
    tmp_path: Path,
) -> None:
    """add(signature=buf) kept a view of the caller's array: a map growth later in the
    block replayed the add with whatever the buffer held by then (200 of 300 stored
    signatures were not the ones added, and check failed; a review's finding)."""
    rng = np.random.default_rng(6)
    wanted = rng.integers(0, 2**32, size=(300, 64), dtype=np.uint32)
    buffer = np.empty(64, dtype=np.uint32)
    with Store.open(tmp_path / "s", create=True, num_perm=64, map_size=1 << 16) as store:
        epoch = store.map_epoch
        with store.write() as txn:
            for i, sig in enumerate(wanted):
                buffer[:] = sig
                txn.add(f"k{i}", signature=buffer, metadata={"p": "x" * 200})
                assert txn.query(signature=buffer)[0].key == f"k{i}"
        assert store.map_epoch > epoch  # the block was replayed
        assert all(
            np.array_equal(store.get(f"k{i}").signature, sig) for i, sig in enumerate(wanted)
        )
        assert store.check().ok


CREATE = r"""
import sys
from neardup_store import store as store_module
from neardup_store.store import Store

sys.stdin.readline()
with Store.open(sys.argv[1], create=True, num_perm=64) as store:
    store.add(sys.argv[2], "a document from " + sys.argv[2])
print(sys.argv[2], flush=True)
"""


def test_processes_racing_to_create_a_store_all_end_up_in_one(store_path: Path) -> None:
    racers = [_python("-c", CREATE, str(store_path), f"racer-{i}") for i in range(4)]
    for racer in racers:
        assert racer.stdin is not None
        racer.stdin.write("go\n")
        racer.stdin.flush()
    for racer in racers:
        _finish(racer)
    with Store.open(store_path) as store:
        assert sorted(store) == [f"racer-{i}" for i in range(4)]
        assert store.config.num_perm == 64 and store.check().ok


def test_add_signatures_equals_adding_the_texts(store_path: Path, tmp_path: Path) -> None:
    texts = random_texts(30, seed=4)
    with Store.open(store_path, create=True) as by_text:
        by_text.add_many((f"k{i}", t, {"i": i}) for i, t in enumerate(texts))
        signatures = by_text.hasher.signatures(texts)
        with Store.open(tmp_path / "other", create=True) as by_signature:
            added = by_signature.add_signatures(
                ((f"k{i}", sig, {"i": i}) for i, sig in enumerate(signatures)), batch_size=7
            )
            assert added == 30
            assert list(by_signature) == list(by_text)
            for i in range(30):
                assert by_signature.get(f"k{i}") == by_text.get(f"k{i}")
            assert by_signature.query(texts[3]) == by_text.query(texts[3])
            with pytest.raises(InvalidParameterError, match="different shapes"):
                by_signature.add_signatures([("x", signatures[0]), ("y", signatures[0][:5])])
            with pytest.raises(InvalidParameterError, match="shape"):
                by_signature.add_signatures([("x", signatures[0][:5])])
            with pytest.raises(DuplicateKeyError):
                by_signature.add_signatures([("new", signatures[0]), ("k1", signatures[1])])
            assert len(by_signature) == 30 and "new" not in by_signature


def test_a_read_only_open_needs_no_write_access_to_the_lock_file(tmp_path: Path) -> None:
    """A read-only open opened neardup.lock for writing: on read-only media (a snapshot,
    a backup disk) it failed with a raw OSError where LMDB reads the store fine (a
    review's finding). Root may write any file, so the lock file here is one nobody can
    open for writing, a directory (which can be opened to read and flock-ed)."""
    path = tmp_path / "s"
    with Store.open(path, create=True) as store:
        store.add("a", "a document a reader without write access reads")
    (path / "neardup.lock").unlink()
    (path / "neardup.lock").mkdir()
    with Store.open(path, read_only=True) as reader:
        assert list(reader) == ["a"]


def test_creating_many_bands_in_a_small_map_grows_it(tmp_path: Path) -> None:
    """The empty tables of 1024 bands filled a 64 KiB map: a raw lmdb.MapFullError, and
    a half-made directory that a plain open called an unfinished creation."""
    path = tmp_path / "s"
    with Store.open(path, create=True, num_perm=1024, bands=1024, rows=1, map_size=1 << 16):
        pass
    with Store.open(path) as store:
        assert store.banding.bands == 1024 and store.check().ok


@pytest.mark.parametrize("call", ["query_many", "add_signatures"])
def test_signature_rows_of_different_lengths_are_a_typed_error(store: Store, call: str) -> None:
    """query_many raised numpy's ValueError for them (add_signatures did not)."""
    sig = store.hasher.signature("a document")
    rows = [sig, sig[:8]]
    run: Callable[[], object] = (
        (lambda: store.query_many(signatures=rows))
        if call == "query_many"
        else (lambda: store.add_signatures(list(zip(["a", "b"], rows, strict=True))))
    )
    with pytest.raises(InvalidParameterError, match="different"):
        run()


def test_close_inside_a_transaction_of_its_thread_is_refused(store_path: Path) -> None:
    """Closing under an open block ended it: its next call raised a raw lmdb.Error (a
    review's finding). The store stays open, and the block goes on."""
    store = Store.open(store_path, create=True)
    with store.write() as txn:
        with pytest.raises(StoreBusyError, match="inside a transaction of this thread"):
            store.close()
        txn.add("a", "a document added after the refused close")
    store.close()
    with Store.open(store_path) as again:
        assert list(again) == ["a"]


def test_close_waits_for_another_threads_write_to_commit(store_path: Path) -> None:
    """A writer thread whose store another thread closed lost its add to a raw lmdb.Error."""
    store = Store.open(store_path, create=True)
    inside, failures = threading.Event(), []

    def writer() -> None:
        try:
            with store.write() as txn:
                txn.add("b", "a document a writer thread adds")
                inside.set()
                time.sleep(0.3)  # the close comes meanwhile
                txn.add("c", "and another after it")
        except BaseException as err:  # reported by the main thread
            failures.append(err)

    thread = threading.Thread(target=writer)
    thread.start()
    assert inside.wait(30)
    store.close()
    thread.join(30)
    assert not failures
    with Store.open(store_path) as again:
        assert sorted(again) == ["b", "c"]


def test_an_error_leaving_a_store_block_is_not_replaced_by_a_refused_close(
    store_path: Path,
) -> None:
    """A pairs() iterator still open when an error leaves the with block: the close that
    would be refused (its snapshot is open) closes anyway, and the error goes on."""
    store = Store.open(store_path, create=True)
    store.add_many([("a", "one text about storms"), ("b", "one text about storms!")])
    walk = store.pairs(0.5)
    next(walk)
    with pytest.raises(StoreBusyError):  # without an error on its way out: refused
        store.__exit__(None, None, None)
    error = ZeroDivisionError("the block's own error")
    assert store.__exit__(type(error), error, None) is None  # closes, does not raise
    assert repr(store).endswith("closed>")


HOLD_READ_ONLY = r"""
import sys
from neardup_store import Store
with Store.open(sys.argv[1], read_only=True) as store:
    print(len(store), flush=True)
    sys.stdin.readline()
"""


def test_a_read_only_open_of_a_store_without_a_lock_file_is_seen_by_compact(
    store_path: Path,
) -> None:
    """A fresh backup has no neardup.lock; a read-only open of it went without a lock,
    so another process compacted and rebuilt under it (a review of a fix's finding)."""
    with Store.open(store_path, create=True) as store:
        store.add("a", "a document a reader holds open")
    (store_path / "neardup.lock").unlink()
    reader = _python("-c", HOLD_READ_ONLY, str(store_path))
    assert reader.stdout is not None and reader.stdout.readline().strip() == "1"
    try:
        with Store.open(store_path) as writer, pytest.raises(StoreBusyError):
            writer.compact()
    finally:
        reader.communicate("go\n", timeout=60)
    assert reader.returncode == 0


def test_close_wakes_as_soon_as_another_threads_read_ends(store_path: Path) -> None:
    """A transaction's end woke only a waiting growth: close() slept its whole 60 s wait
    behind a read of a few tenths of a second."""
    store = Store.open(store_path, create=True)
    reading = threading.Event()

    def reader() -> None:
        with store.read():
            reading.set()
            time.sleep(0.3)

    thread = threading.Thread(target=reader)
    thread.start()
    assert reading.wait(30)
    started = time.monotonic()
    store.close()
    assert time.monotonic() - started < store_module.RESIZE_WAIT_S / 2
    thread.join(30)


def test_a_pairs_walk_advanced_in_one_thread_and_closed_in_another_lets_the_store_close(
    store_path: Path,
) -> None:
    """The walk's read was counted in the worker thread and uncounted in this one: close()
    then refused for good, with no transaction open anywhere."""
    store = Store.open(store_path, create=True, num_perm=64)
    store.add_many(
        [("a", "one text about storms and rain"), ("b", "one text about storms and rain!")]
    )
    walk = store.pairs(0.3)
    with ThreadPoolExecutor(1) as worker:  # one thread: the close below runs in it
        assert worker.submit(next, walk).result(30)  # the walk's read counted in it
        walk.close()  # ended in this thread
        worker.submit(store.close).result(30)
    assert repr(store).endswith("closed>")


def test_a_key_iterator_read_across_the_blocks_own_adds_survives_a_replay(tmp_path: Path) -> None:
    """The iterator is read across the block's own adds (which it does not yield: they
    come after the last key stored when it began). Its one log entry, where it began, was
    checked in a replay before those adds were replayed: a conflict with no other writer,
    and the block lost (a review of a fix's finding)."""
    rng = np.random.default_rng(9)
    with Store.open(tmp_path / "s", create=True, num_perm=64, map_size=1 << 20) as store:
        store.add_signatures([("a", rng.integers(0, 2**32, 64, dtype=np.uint32))])
        epoch = store.map_epoch
        with store.write() as txn:
            keys = iter(txn)
            assert next(keys) == "a"
            txn.add_signatures([("b", rng.integers(0, 2**32, 64, dtype=np.uint32))])
            assert list(keys) == [] and list(txn) == ["a", "b"]
            sigs = rng.integers(0, 2**32, size=(3000, 64), dtype=np.uint32)
            txn.add_signatures([(f"k{i}", s, {"p": "x" * 200}) for i, s in enumerate(sigs)])
        assert store.map_epoch > epoch and len(store) == 3002


def test_a_replay_reads_each_row_of_a_key_iterator_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``for key in txn: txn.get(key)`` logs a read between every two rows: each row's
    check re-read every row before it, n^2 / 2 rows in a replay (20 s for 3000 keys; a
    review of a fix's finding). Each check now goes on from the last id read before."""
    rng = np.random.default_rng(10)
    rows_read = 0
    key_rows = WriteTxn._key_rows

    def counted(
        self: WriteTxn, after: bytes | None = None, until: bytes | None = None
    ) -> Iterator[tuple[bytes, Any]]:
        nonlocal rows_read
        for row in key_rows(self, after, until):
            rows_read += 1
            yield row

    with Store.open(tmp_path / "s", create=True, num_perm=64, map_size=1 << 20) as store:
        sigs = rng.integers(0, 2**32, size=(1000, 64), dtype=np.uint32)
        store.add_signatures([(f"k{i}", s) for i, s in enumerate(sigs)])
        epoch = store.map_epoch
        monkeypatch.setattr(WriteTxn, "_key_rows", counted)
        with store.write() as txn:
            for key in txn:
                txn.get(key)
            more = rng.integers(0, 2**32, size=(3000, 64), dtype=np.uint32)
            txn.add_signatures([(f"n{i}", s, {"p": "x" * 200}) for i, s in enumerate(more)])
        assert store.map_epoch > epoch  # replayed
    assert rows_read <= 3 * 1000 + 10


NOBODY = 65534
"""The user id a child takes to be a member of a store's group but not its owner."""

_AS_GROUP_MEMBER = """
import contextlib, io, json, os, shutil, sys, tempfile
import numpy as np
from neardup_store import Store, StorePermissionError
from neardup_store.cli import main

def as_member(shared):
    team, owner_only = (os.path.join(shared, name) for name in ("team", "owner-only"))
    seen = {{}}
    with Store.open(team) as store:
        store.add_signatures([("member", np.arange(store.config.num_perm, dtype=np.uint32))])
        seen["team"] = sorted(store)
    for read_only in (True, False):
        try:
            Store.open(owner_only, read_only=read_only).close()
        except StorePermissionError as err:
            seen[f"refused read_only={{read_only}}"] = str(err)
    for name, options in (("private", {{}}), ("not-mine/new", {{"create": True}})):
        try:
            Store.open(os.path.join(shared, name), **options).close()
        except StorePermissionError as err:
            seen[name] = str(err)
    return seen

def info(shared):
    sys.argv = ["neardup-admin", "info", os.path.join(shared, "owner-only")]
    main()

# Modules loaded on first use (lmdb's, numpy's) may lie where only root may read, as under
# a Python installed in /root: the same run, first as root on a copy, loads them.
shared = sys.argv[1]
rehearsal = tempfile.mkdtemp()
shutil.copytree(shared, rehearsal, dirs_exist_ok=True)
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    as_member(rehearsal)
    info(rehearsal)
shutil.rmtree(rehearsal)
os.setgroups([]); os.setgid(os.stat(os.path.join(shared, "team")).st_gid); os.setuid({nobody})
print(json.dumps(as_member(shared)), flush=True)
info(shared)
"""


def _others_may_enter(directory: Path) -> bool:
    """Whether a user who is neither owner nor in the group reaches ``directory``: it and
    every directory above it let others pass (o+x)."""
    resolved = directory.resolve()
    return all(os.stat(part).st_mode & 0o001 for part in (resolved, *resolved.parents))


@pytest.fixture
def shared_directory() -> Iterator[Path]:
    """A directory other users may enter (pytest's own are owner-only), removed after: in
    the temporary directory, or in /tmp when TMPDIR is out of their reach (pam_tmpdir's
    /tmp/user/0, a directory under /root), where the member found nothing (review 39)."""
    if os.geteuid() != 0:
        pytest.skip("acting as another member of a store's group needs root")
    bases = list(dict.fromkeys([Path(tempfile.gettempdir()), Path("/tmp")]))
    base = next((b for b in bases if b.is_dir() and _others_may_enter(b)), None)
    if base is None:
        tried = " nor ".join(map(str, bases))
        pytest.skip(f"another user may enter neither {tried}, so no directory can be shared")
    directory = Path(tempfile.mkdtemp(prefix="neardup-shared-", dir=base))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


def test_a_group_uses_a_store_made_for_it_and_others_get_a_permission_error(
    shared_directory: Path,
) -> None:
    """`init --mode 750` was said to let the group read a store, but opening one, even
    read-only, writes LMDB's lock file: a group member was told the store was "not a
    neardup_store store" (read-only) or got a raw PermissionError (review 32), as did
    another user opening an owner-only store or creating one where they may not write
    (review 34). 770 under umask 002 lets the group in; otherwise the error says what is
    needed."""
    team, owner_only = shared_directory / "team", shared_directory / "owner-only"
    private = shared_directory / "private"  # the default mode: owner-only
    Store.open(private, create=True, num_perm=16, bands=4, rows=4).close()
    (shared_directory / "not-mine").mkdir(mode=0o755)
    for path, mode, umask in ((team, 0o770, 0o002), (owner_only, 0o750, 0o022)):
        old = os.umask(umask)
        try:
            Store.open(path, create=True, mode=mode, num_perm=16, bands=4, rows=4).close()
        finally:
            os.umask(old)
    script = _AS_GROUP_MEMBER.format(nobody=NOBODY)
    done = subprocess.run(
        [sys.executable, "-c", script, str(shared_directory)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.stdout, done.stderr  # the member's child failed before it could tell
    seen = json.loads(done.stdout.splitlines()[0])
    assert seen["team"] == ["member"]
    for read_only in (True, False):
        message = seen[f"refused read_only={read_only}"]
        assert "permission denied" in message and "write access to lock.mdb" in message
    # review 34: these were a raw PermissionError
    assert f"({private}/data.mdb: Permission denied)" in seen["private"]
    assert "not-mine/new: Permission denied)" in seen["not-mine/new"]
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"Error: {owner_only}: permission denied") and "0o770" in line


TEAM_GID = 65530
"""The group of a team store in the backup test; its members' primary groups differ."""

_BACKUP_FOR_THE_TEAM = """
import json, os, shutil, sys, tempfile
from neardup_store import Store

def member_a(shared):
    # backs the team's store up, then checks the backup: the first to open it
    backup = os.path.join(shared, "backups", "team.bk")
    with Store.open(os.path.join(shared, "team")) as store:
        store.backup(backup)
    with Store.open(backup) as copy:
        return copy.check().ok

def member_b(shared):
    with Store.open(os.path.join(shared, "backups", "team.bk"), read_only=True) as copy:
        return len(copy)

def as_member(uid, gid, run, shared):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.setgroups([{team}]); os.setgid(gid); os.setuid(uid)
            said = repr(run(shared))
        except BaseException as err:
            said = f"{{type(err).__name__}}: {{err}}"
        os.write(write, said.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        said = pipe.read()
    os.waitpid(pid, 0)
    return said

# Modules loaded on first use may lie where only root may read (a Python under /root):
# the same run, first as root on a copy, loads them.
shared = sys.argv[1]
rehearsal = tempfile.mkdtemp()
shutil.copytree(shared, rehearsal, dirs_exist_ok=True)
member_a(rehearsal), member_b(rehearsal)
shutil.rmtree(rehearsal)
a = as_member({nobody}, {team} + 1, member_a, shared)
print(json.dumps({{"a": a, "b": as_member({nobody} - 1, {team} + 2, member_b, shared)}}))
"""


def test_a_backup_of_a_team_store_opens_for_the_whole_team(shared_directory: Path) -> None:
    """A backup holds data.mdb alone. The first member to open it (say, to check it) made
    its lock files with that open's mode (0600 by default) in their primary group, and
    the backup's directory took that group too: the rest of the team could open the
    store but not its backup, nor a store restored from it (review 40). Both members
    here are in the team's group only as a supplementary group."""
    team, backups = shared_directory / "team", shared_directory / "backups"
    old = os.umask(0o002)
    try:
        with Store.open(team, create=True, mode=0o770, num_perm=16, bands=4, rows=4) as store:
            store.add_signatures([("doc", np.arange(16, dtype=np.uint32))])
    finally:
        os.umask(old)
    backups.mkdir()
    backups.chmod(0o770)
    for path in (team, *team.iterdir(), backups):  # the team's group, as `sg TEAM` gives
        os.chown(path, -1, TEAM_GID)
    script = _BACKUP_FOR_THE_TEAM.format(nobody=NOBODY, team=TEAM_GID)
    done = subprocess.run(
        [sys.executable, "-c", script, str(shared_directory)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.stdout, done.stderr
    assert json.loads(done.stdout) == {"a": "True", "b": "1"}
    backup = backups / "team.bk"
    for path in ("data.mdb", "lock.mdb", "neardup.lock"):
        info = (backup / path).stat()
        assert (info.st_mode & 0o7777, info.st_gid) == (0o660, TEAM_GID), path
    info = backup.stat()
    assert (info.st_mode & 0o7777, info.st_gid) == (team.stat().st_mode & 0o7777, TEAM_GID)


@pytest.mark.parametrize("at", range(40))  # every call from the commit to the block's end
@pytest.mark.parametrize("replace", [False, True])
def test_a_ctrl_c_anywhere_in_a_write_s_end_says_whether_the_block_is_stored(
    store: Store, at: int, replace: bool
) -> None:
    """A Ctrl-C raised at each Python call from the start of the commit until ``write()``
    returns (placed by a trace hook where a pending SIGINT is raised) carries
    ``transaction_committed`` exactly when the block is stored. One after the commit
    returned, on the way out of the block, carried no mark: ``add --replace`` then
    counted a stored batch as not committed, since its replacements leave no new key to
    probe (review 40's fixer)."""
    signature = np.arange(PARAMS["num_perm"], dtype=np.uint32)
    if replace:
        store.add_signatures([("k", signature)])

    def write() -> None:
        with store.write() as writer:
            writer.add_signatures([("k", signature + 1)], replace=replace)

    stopped, calls = interrupted_at_call(at, write)
    if stopped is None:
        assert calls <= at  # fewer calls came than this case's place
        return
    stored = np.array_equal(store.get("k").signature, signature + 1) if "k" in store else False
    assert getattr(stopped, "transaction_committed", False) is stored
    # A Ctrl-C at the very entry of the transaction's uncounting leaves it to the
    # generator's cleanup, which runs once nothing refers to the interrupted frames.
    del stopped
    gc.collect()


# -- a data.mdb cut short or cut to nothing (review 43) ------------------------------------------

_OPEN_CUT_STORE = r"""
import json, sys
from neardup_store import CorruptStoreError, Store
from neardup_store.cli import main

path = sys.argv[1]
seen = {}
for name, options in (("read-write", {}), ("read-only", {"read_only": True}),
                      ("create", {"create": True})):
    try:
        Store.open(path, **options).close()
        seen[name] = "opened"
    except CorruptStoreError as err:
        seen[name] = str(err)
print(json.dumps(seen), flush=True)
sys.argv = ["neardup-admin", "check", path]
main()
"""


def _copy_cut_to(source: Path, target: Path, size: int) -> Path:
    """A copy of the store at ``source`` whose ``data.mdb`` is cut to ``size`` bytes."""
    shutil.copytree(source, target)
    os.truncate(target / "data.mdb", size)
    return target


def test_a_data_file_cut_short_is_refused_at_every_open_unless_only_free_pages_are_cut(
    tmp_path: Path,
) -> None:
    """LMDB reads its pages through a map larger than the file: a data.mdb cut short (an
    interrupted copy or restore) killed Store.open, read-only too, and `neardup-admin
    check` with SIGBUS (review 43). A file whose pages past its end are all free is
    sound (LMDB never writes the pages a transaction took and freed again) and opens."""
    source = tmp_path / "store"
    texts = [(f"k{i}", f"document number {i} with some words in it {i * 7}") for i in range(2000)]
    with Store.open(source, create=True, num_perm=16, bands=4, rows=4) as store:
        store.add_many(texts)
    size = (source / "data.mdb").stat().st_size
    cut = _copy_cut_to(source, tmp_path / "cut", size // 2 // 4096 * 4096)
    done = subprocess.run(
        [sys.executable, "-c", _OPEN_CUT_STORE, str(cut)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
    )  # fmt: skip
    assert done.returncode == 1, done  # a SIGBUS was -7; check: a finding (review 59)
    seen = json.loads(done.stdout.splitlines()[0])
    for name in ("read-write", "read-only", "create"):
        assert f"data.mdb is {size // 2 // 4096 * 4096} bytes, short of the {size}" in seen[name]
        assert "the file was cut short" in seen[name]
    assert done.stderr == ""
    assert f"{cut}: the store is corrupt" in done.stdout and "cut short" in done.stdout
    assert done.stdout.endswith("VIOLATIONS: 0 documents checked, 1 violations found.\n")
    assert (cut / "data.mdb").stat().st_size == size // 2 // 4096 * 4096  # left as it was

    emptied = tmp_path / "emptied"  # its last pages are free: cutting them off loses nothing
    with Store.open(emptied, create=True, num_perm=16, bands=4, rows=4) as store:
        store.add_many(texts)
        store.remove_many([key for key, _ in texts])
        store.purge()
        store.add("z", "the one document left in the store")
    report = lmdbfile.walk(emptied / "data.mdb")
    in_use = max(page for page, owner in report.owners.items() if owner != lmdbfile.FREE)
    assert in_use < report.last_page - 10
    free_cut = _copy_cut_to(emptied, tmp_path / "free-cut", (in_use + 1) * report.page_size)
    with Store.open(free_cut) as store:
        assert list(store) == ["z"] and store.check().ok
        store.add_many(texts[:100])
        assert len(store) == 101 and store.check().ok
    one_more = _copy_cut_to(emptied, tmp_path / "one-more", in_use * report.page_size)
    with pytest.raises(CorruptStoreError, match=f"page {in_use} of .* lies past its end"):
        Store.open(one_more, read_only=True)


def test_a_commit_between_mapping_and_reading_the_meta_is_no_cut_short_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check maps the file, then reads its meta page through the map: a commit of
    another process in between writes its pages past the mapped length and then the
    meta page the map shows, which read as a file cut short (the same transaction id
    read again), and a healthy store being written was refused. Here the map is made
    before a commit by handing the check the file as it was then."""
    path = tmp_path / "store"
    with Store.open(path, create=True, num_perm=16, bands=4, rows=4) as store:
        store.add_many((f"k{i}", f"document {i} and its words {i * 3}") for i in range(500))
        before = (path / "data.mdb").read_bytes()
        store.add_many((f"n{i}", f"a newer document {i} of more words {i}") for i in range(3000))
    assert len(before) < (path / "data.mdb").stat().st_size
    whole = (path / "data.mdb").read_bytes()
    mapped_early = whole[: 4096 * 2] + before[4096 * 2 :]  # new meta pages, old length

    @contextlib.contextmanager
    def map_made_before_the_commit(_: Path) -> Iterator[bytes]:
        yield mapped_early

    assert lmdbfile.cut_short(path / "data.mdb") is None
    monkeypatch.setattr(lmdbfile, "_mapped", map_made_before_the_commit)
    assert lmdbfile.cut_short(path / "data.mdb") is None


@pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"),
    reason="the commits LMDB's lock file records are read where its layout is known",
)
def test_a_data_file_cut_to_nothing_is_told_from_a_creation_that_never_wrote(
    store_path: Path,
) -> None:
    """A committed store's data.mdb cut to 0 bytes was taken for a creation that never
    committed: the open advised create=True, and a read-write open (or create=True) made
    an empty store over it (review 43). The directory decides: lock.mdb records the
    commits, and every creation first makes neardup.create.lock (create=True makes one
    too, so it goes on without)."""
    with Store.open(store_path, create=True) as store:
        store.add("a", "a document of the store that is lost")
    os.truncate(store_path / "data.mdb", 0)
    for options in ({}, {"read_only": True}, {"create": True}):
        with pytest.raises(CorruptStoreError, match=r"empty, though lock\.mdb records 2 commits"):
            Store.open(store_path, **options)
    assert (store_path / "data.mdb").stat().st_size == 0  # nothing made over it
    (store_path / "lock.mdb").unlink()  # nothing tells any more: both are said
    with pytest.raises(NotAStoreError, match=r"restore its data\.mdb from a backup") as unknown:
        Store.open(store_path)
    assert unknown.value.found == store_module.EMPTY_DATA_FILE
    assert not store_module.holds_store(store_path)  # so `init` goes on, as create=True does
    (store_path / store_module.CREATE_LOCK_FILE).unlink()  # no creation was ever begun
    for read_only in (False, True):
        with pytest.raises(CorruptStoreError, match="no creation was begun here"):
            Store.open(store_path, read_only=read_only)
    assert sorted(p.name for p in store_path.iterdir()) == ["data.mdb", "neardup.lock"]
    with Store.open(store_path, create=True) as store:  # a killed creation: it goes on
        store.add("b", "a document of the new store")
    with Store.open(store_path) as store:
        assert list(store) == ["b"]


@pytest.mark.parametrize("size", [1, 100, lmdbfile.FIRST_META_END - 1])
def test_a_data_file_cut_inside_its_first_meta_page_is_corrupt(store_path: Path, size: int) -> None:
    """Cut to fewer bytes than a meta page, data.mdb was "not a neardup_store store" with
    advice to create one, and LMDB's failed open reset the commits lock.mdb records, the
    evidence the 0-byte check reads (review 47). Whatever the open, it is cut short."""
    with Store.open(store_path, create=True) as store:
        store.add("a", "a document of the store that is lost")
    os.truncate(store_path / "data.mdb", size)
    (store_path / "lock.mdb").unlink()  # nothing else tells that a store was here
    for options in ({}, {"read_only": True}, {"create": True}):
        with pytest.raises(CorruptStoreError, match=f"data.mdb is {size} bytes, shorter than"):
            Store.open(store_path, **options)
    assert (store_path / "data.mdb").stat().st_size == size


# -- close() and other threads (review 43) -------------------------------------------------------


def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait (polling, at most 30 s) until ``condition()`` holds."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting until {what}"
        time.sleep(0.001)


def test_close_holds_back_the_transactions_of_threads_that_hold_none(store_path: Path) -> None:
    """New transactions did not wait for a pending close(), as its docstring says: under
    steady short reads from two threads it waited its whole 60 s, then refused (review
    43). A thread that holds a read still begins another (the close waits for it)."""
    store = Store.open(store_path, create=True)
    store.add("a", "a document the threads read")
    holding, release = threading.Event(), threading.Event()
    nested: list[int] = []
    late: list[object] = []

    def holder() -> None:
        with store.read() as txn:
            holding.set()
            release.wait(30)
            nested.extend((len(store), len(txn)))  # begun while the close waits

    def newcomer() -> None:
        try:
            with store.read() as txn:
                late.append(len(txn))
        except StoreClosedError as err:
            late.append(err)

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    assert holding.wait(30)
    threads.append(threading.Thread(target=store.close))
    threads[-1].start()
    _until(lambda: store._closers_waiting == 1, "the close waits")
    threads.append(threading.Thread(target=newcomer))
    threads[-1].start()
    # The newcomer waits on the same condition as the close (or, before the fix, read).
    _until(lambda: len(store._readers_done._waiters) == 2 or bool(late), "the newcomer waits")  # type: ignore[attr-defined]
    assert not late
    release.set()
    for thread in threads:
        thread.join(30)
    assert nested == [1, 1]
    assert repr(store).endswith("closed>")
    assert len(late) == 1 and isinstance(late[0], StoreClosedError)


def _store_with_removals(path: Path) -> Store:
    """A store whose compaction purges (and so writes) before it copies."""
    store = Store.open(path, create=True, num_perm=32, bands=8, rows=4)
    store.add_many((f"k{i}", f"document {i} with words {i * 7} and {i % 13}") for i in range(300))
    store.remove_many([f"k{i}" for i in range(0, 300, 2)])
    return store


def test_a_compaction_or_rebuild_does_not_wait_for_a_close_it_holds_off(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compact() and rebuild() hold the other threads off by holding the store's lock;
    their own first transaction waited for a close() pending in another thread, and
    that wait released the lock: the close ended the environment and the lock file under
    the running operation, which failed with a raw EBADF (review 47). Here a close is
    pending, not yet woken, as the operations begin."""
    store = _store_with_removals(store_path)
    waited: list[int] = []
    monkeypatch.setattr(store, "_let_waiters_go_first", lambda: waited.append(1))
    store._closers_waiting = 1
    try:
        assert store.compact().bytes_after > 0
        assert store.rebuild(bands=4, rows=8).documents == 150
    finally:
        store._closers_waiting = 0
    assert waited == [] and len(store) == 150 and store.check().ok
    store.close()


def test_a_close_that_wins_the_lock_first_leaves_compact_a_typed_error(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compact() read the lock file's descriptor before it held the other threads off: a
    close() of another thread in between left it locking a closed descriptor, a raw
    OSError (EBADF; a number reused meanwhile would have been another file's; review
    47). The store is now asked once the others are held off."""
    store = _store_with_removals(store_path)
    hold_off = maintenance._threads_held_off

    @contextlib.contextmanager
    def closed_first(held: Store, operation: str) -> Iterator[None]:
        held.close()  # what another thread's close() does when it takes the lock first
        with hold_off(held, operation):
            yield

    monkeypatch.setattr(maintenance, "_threads_held_off", closed_first)
    with pytest.raises(StoreClosedError):
        store.compact()


def test_the_stores_own_purge_question_is_not_logged_for_a_replay(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the end of a write block that removed, the store asks whether a purge is due
    (removals awaiting one against the stored count). Asked through the writer, both
    reads went into the block's log: a growth at the commit replayed them, and another
    process's commit in between changed the count, so a block that never read it was
    refused as a conflict ("__len__ returned 60"; review 47)."""
    monkeypatch.setattr(store_module, "MIN_TRANSACTION", 1)
    store = _store_with_removals(store_path)
    logged: list[str] = []
    finish = WriteTxn._finish

    def finish_logged(writer: WriteTxn, commit: bool) -> None:
        logged.extend(operation.__name__ for operation, *_ in writer._log)
        finish(writer, commit)

    monkeypatch.setattr(WriteTxn, "_finish", finish_logged)
    with store.write() as txn:
        txn.remove_many([f"k{i}" for i in range(1, 300, 2)])
    assert "_remove_found" in logged  # what the block did is logged
    assert not {"__len__", "awaiting_purge"} & set(logged), logged
    with store.read() as reader:
        assert reader.awaiting_purge() == 0  # the purge was due, and ran
    store.close()


# -- paths no store can be at, and advice that works (review 43) ----------------------------------


def _file_on_the_way(base: Path) -> Path:
    (base / "afile").write_text("a file where a directory would go")
    return base / "afile" / "store"


def _dangling_link(base: Path) -> Path:
    (base / "link").symlink_to(base / "nowhere")
    return base / "link"


def _loop_of_links(base: Path) -> Path:
    (base / "one").symlink_to(base / "two")
    (base / "two").symlink_to(base / "one")
    return base / "one" / "store"


def _name_too_long(base: Path) -> Path:
    return base / ("x" * 300)


@pytest.mark.parametrize(
    ("make", "found"),
    [
        (_file_on_the_way, r"afile is a file"),
        (_dangling_link, r"link is a link to '.*nowhere', which does not exist"),
        (_loop_of_links, r"one is in a loop of symbolic links"),
        (_name_too_long, r"its name 'x{37}\.\.\.' \(300 bytes\) or the whole path is longer"),
    ],
)
@pytest.mark.parametrize("create", [False, True])
def test_a_path_no_store_can_be_at_is_a_typed_error_that_names_the_part_at_fault(
    tmp_path: Path, make: Callable[[Path], Path], found: str, create: bool
) -> None:
    """Raw NotADirectoryError, FileExistsError and OSError (File name too long) came out
    of Store.open (review 43); an open without create advised create=True for a path
    where creating is refused in turn."""
    base = tmp_path / "base"
    base.mkdir()
    path = make(base)
    before = sorted(base.iterdir())
    with pytest.raises((NotAStoreError, StoreNotFoundError), match=found) as raised:
        Store.open(path, create=create)
    assert "create=True to make one" not in str(raised.value)
    if create:
        assert isinstance(raised.value, NotAStoreError)
    assert sorted(base.iterdir()) == before  # nothing made


def test_a_lock_file_that_is_a_directory_is_a_typed_error(store_path: Path) -> None:
    """A raw IsADirectoryError (review 43)."""
    Store.open(store_path, create=True).close()
    (store_path / "neardup.lock").unlink()
    (store_path / "neardup.lock").mkdir()
    with pytest.raises(CorruptStoreError, match=r"lock file neardup\.lock is a directory: remove"):
        Store.open(store_path)


def test_opening_a_directory_of_other_files_does_not_advise_create(tmp_path: Path) -> None:
    """The advice was to pass create=True, which then refused: such a directory is most
    likely a mistyped path (review 43)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "notes.txt").write_text("my own files")
    with pytest.raises(StoreNotFoundError) as raised:
        Store.open(docs)
    message = str(raised.value)
    assert "create=True" not in message
    assert "it holds other files ('notes.txt'): check the path" in message


# -- a fork inside a write block, a full reader table, a dropped store (review 43) ----------------


def test_a_child_forked_inside_a_write_block_is_told_it_is_a_child(store: Store) -> None:
    """The write flag it inherits was tested first: store.add, remove, add_if_unique and
    write() raised StoreBusyError, "inside another one of the same thread" (review 43)."""
    with store.write() as txn:
        txn.add("parent", "the parent adds this before the fork")
        calls: list[Callable[[], object]] = [
            lambda: store.add("child", "the child tries to add this"),
            lambda: store.remove("parent"),
            lambda: store.add_if_unique("child", "the child tries to add this"),
            lambda: store.write().__enter__(),
        ]
        assert _outcomes_in_a_forked_child(calls, store) == ["ForkedStoreError"] * 4
    assert list(store) == ["parent"]


def test_stats_and_a_dry_run_compaction_type_a_full_reader_table(tmp_path: Path) -> None:
    """Each began a second read transaction through env.open_db(None) while its own was
    open: with max_readers=1 a raw lmdb.ReadersFullError came out (review 43)."""
    with Store.open(tmp_path / "s", create=True, num_perm=16, max_readers=1) as store:
        store.add("a", "a document of some words")
        assert store.stats().documents == 1
        assert store.compact(dry_run=True) is not None


def _descriptors_on(path: Path) -> list[str]:
    """This process's open descriptors of files under ``path``."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(path)):
                held.append(target)
    return held


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_a_store_dropped_without_close_gives_its_lock_back(
    store_path: Path, tmp_path: Path
) -> None:
    """Its neardup.lock descriptor, with its shared lock, stayed open until the process
    exited, so compact and rebuild elsewhere refused (review 43). A store that was
    closed never closes its old descriptor number again, which another file may hold."""
    Store.open(store_path, create=True).close()
    assert len(Store.open(store_path)) == 0  # opened and dropped
    gc.collect()
    assert _descriptors_on(store_path) == []
    fd = os.open(store_path / "neardup.lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no other holder left
    finally:
        os.close(fd)
    closed = Store.open(store_path)
    number = closed._lock_fd
    assert number is not None
    closed.close()
    other = os.open(tmp_path / "other.txt", os.O_WRONLY | os.O_CREAT, 0o600)
    if other != number:
        os.dup2(other, number)  # the number, handed out again
        os.close(other)
    try:
        del closed
        gc.collect()
        os.write(number, b"still open")  # EBADF, had it been closed under its new owner
    finally:
        os.close(number)
    assert (tmp_path / "other.txt").read_text() == "still open"


def test_a_writable_open_of_a_data_file_this_user_may_only_read_says_so(
    shared_directory: Path,
) -> None:
    """Its StorePermissionError listed only what was granted already (read access to
    data.mdb, write access to the lock files), and not that writing needs write access
    to data.mdb, nor that read_only=True opens it (review 43)."""
    path = shared_directory / "s"
    with Store.open(path, create=True, num_perm=16, bands=4, rows=4, mode=0o777) as store:
        store.add("a", "some document text")
    path.chmod(0o777)
    for name in ("lock.mdb", "neardup.lock"):
        (path / name).chmod(0o666)
    (path / "data.mdb").chmod(0o444)

    def as_another_user() -> dict[str, str]:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        seen = {}
        try:
            Store.open(path).close()
            seen["read-write"] = "opened"
        except StorePermissionError as err:
            seen["read-write"] = str(err)
        with Store.open(path, read_only=True) as store:
            seen["read-only"] = str(len(store))
        return seen

    seen = _in_a_forked_child(as_another_user)
    assert seen["read-only"] == "1"
    assert f"{path}/data.mdb is not writable by this user" in seen["read-write"]
    assert "write access to data.mdb: open the store with read_only=True" in seen["read-write"]


# -- batches: items placed, bools in signatures, ended transactions (review 44) ------------------


def _items_with(bad: object, count: int = 10, at: int = 7) -> Iterator[object]:
    for i in range(count):
        yield bad if i == at else (f"key-{i}", f"generated text number {i} of the batch")


@pytest.mark.parametrize(
    ("bad", "error", "said"),
    [
        ((None, "text"), InvalidKeyError, "invalid document key None"),
        (("", "text"), InvalidKeyError, "invalid document key ''"),
        (("x" * 20000, "text"), InvalidKeyError, "20000 bytes long"),
        ("k", InvalidParameterError, "expected a (key, text)"),
    ],
)
def test_a_refused_key_or_item_of_a_batch_is_placed_in_the_whole_call(
    store: Store, bad: object, error: type[Exception], said: str
) -> None:
    """A bad text or metadata was placed by its index in the whole call, a bad key or a
    malformed item not at all: "invalid document key None" names nothing in a million
    items (review 44)."""
    for batch_size in (None, 3):
        with pytest.raises(error) as raised:
            store.add_many(_items_with(bad), batch_size=batch_size)
        caught = raised.value
        assert caught.index == 7 and str(caught).startswith("item #7: ")  # type: ignore[attr-defined]
        assert said in str(caught)
        assert pickle.loads(pickle.dumps(caught)).index == 7  # type: ignore[attr-defined]
    with store.write() as txn, pytest.raises(error) as in_block:
        txn.add_many_if_unique(list(_items_with(bad)))
    assert in_block.value.index == 7  # type: ignore[attr-defined]
    assert len(store) == 6 == caught.committed  # type: ignore[attr-defined]
    if isinstance(bad, tuple):
        with pytest.raises(InvalidKeyError) as removing:
            store.remove_many(["key-0", "key-1", bad[0]])  # type: ignore[list-item]
        assert removing.value.index == 2  # type: ignore[attr-defined]
        with pytest.raises(InvalidKeyError) as single:  # one item: not numbered
            store.add(bad[0], "text")  # type: ignore[arg-type]
        assert single.value.index is None and "#" not in str(single.value)  # type: ignore[attr-defined]


def test_a_bool_anywhere_in_a_signature_of_python_values_is_refused(store: Store) -> None:
    """A row was judged by its first value: numpy stacks ints and bools as ints, so
    [0] + [True] * (n - 1) was stored as 0, 1, 1, ... (review 44)."""
    n = PARAMS["num_perm"]
    rows = ([0] + [True] * (n - 1), [*range(n - 1), np.False_], (*range(n - 1), True))
    for row in rows:
        with pytest.raises(InvalidParameterError, match="bool values"):
            store.add("k", signature=row)
        with pytest.raises(InvalidParameterError, match="bool values") as in_batch:
            store.add_signatures([("a", list(range(n))), ("b", row)])
        assert in_batch.value.index == 1  # type: ignore[attr-defined]
        with pytest.raises(InvalidParameterError, match="bool values"):
            store.query(signature=row)
        with pytest.raises(InvalidParameterError, match="bool values"):
            store.query_many(signatures=[list(range(n)), row])
    assert len(store) == 0
    store.add("ints", signature=list(range(n)))  # a row of ints still goes in
    assert store.get("ints").signature.tolist() == list(range(n))


def test_every_batch_call_on_an_ended_transaction_refuses_an_empty_batch(store: Store) -> None:
    """add_signatures([]), add_signatures_if_unique([]), remove_many([]) and
    query_many(signatures=[]) answered 0 or [] after their block had ended, where
    add_many([]) raised StoreClosedError (review 44)."""
    with store.write() as writer:
        pass
    with store.read() as reader:
        pass
    calls: list[Callable[[], object]] = [
        lambda: writer.add_many([]),
        lambda: writer.add_many_if_unique([]),
        lambda: writer.add_signatures([]),
        lambda: writer.add_signatures_if_unique([]),
        lambda: writer.remove_many([]),
        lambda: writer.query_many([]),
        lambda: writer.query_many(signatures=[]),
        lambda: reader.query_many([]),
        lambda: reader.query_many(signatures=[]),
    ]
    for call in calls:
        with pytest.raises(StoreClosedError, match="the transaction is closed"):
            call()


def test_a_store_whose_path_is_not_utf8_opens_compacts_and_is_backed_up(tmp_path: Path) -> None:
    """A directory name in another encoding (a byte that is not UTF-8, which Python holds
    as a surrogate) reaches LMDB as the bytes it is on disk (review 59: every command
    failed with a UnicodeEncodeError, and a creation left its lock files behind)."""
    path = tmp_path / os.fsdecode(b"caf\xe9.ndx")
    with Store.open(path, create=True, num_perm=64) as store:
        store.add_many([("a", "the quick brown fox jumps over the lazy dog"), ("b", "lorem ipsum")])
        store.remove("b")
        report = store.compact()
        assert report.bytes_after <= report.bytes_before
        store.backup(tmp_path / os.fsdecode(b"copy\xff"))
    with Store.open(tmp_path / os.fsdecode(b"copy\xff"), read_only=True) as copy:
        assert [m.key for m in copy.query("the quick brown fox jumps over the lazy dog")] == ["a"]
    assert sorted(os.listdir(os.fsencode(tmp_path))) == [b"caf\xe9.ndx", b"copy\xff"]
