"""Maintenance against real stores: pairs, clusters, stats, check/repair, compact, rebuild,
export/import and backup. Corruption is injected with raw LMDB writes, and the exclusive
lock is tested with a real second process."""

from __future__ import annotations

import io
import json
import lzma
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import numpy as np
import pytest
from click.testing import CliRunner
from harness import (
    LineDrivenProcess,
    band_table_entry,
    interrupted_at_call,
    kept_band_key,
    older_export,
    raw_digest,
    raw_dump,
)
from test_format import rewrite_as_old_format

from neardup_store import _faults, codec, integrity, maintenance
from neardup_store.cli import cli
from neardup_store.clusters import duplicate_groups, verified_pairs
from neardup_store.demo import DemoCorpus, make_corpus
from neardup_store.errors import (
    CorruptRecordError,
    CorruptStoreError,
    DuplicateKeyError,
    InvalidParameterError,
    InvalidStreamError,
    OutputWriteError,
    ReadOnlyError,
    StoreBusyError,
    StoreFullError,
    StreamReadError,
)
from neardup_store.lsh import LSHParams, band_keys, choose_params
from neardup_store.store import Store, holds_store

THRESHOLD = 0.7


@pytest.fixture(scope="module")
def corpus() -> DemoCorpus:
    return make_corpus(300, 30, seed=11)


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "store"


def _items(corpus: DemoCorpus) -> list[tuple[Any, str, Any]]:
    """The corpus with metadata on every third document, and one bytes key."""
    items: list[tuple[Any, str, Any]] = [
        (key, text, {"n": i, "raw": b"\x00\xff"} if i % 3 == 0 else None)
        for i, (key, text) in enumerate(corpus.documents.items())
    ]
    items.append((b"\x00bytes-key", "a document stored under a bytes key, with no twin", [1.5]))
    return items


@pytest.fixture(scope="module")
def loaded_data(tmp_path_factory: pytest.TempPathFactory, corpus: DemoCorpus) -> Path:
    """``data.mdb`` of a store holding the demo corpus, built once per module."""
    path = tmp_path_factory.mktemp("template") / "store"
    with Store.open(path, create=True, threshold=THRESHOLD) as template:
        template.add_many(_items(corpus))
    return path / "data.mdb"


@pytest.fixture
def store(store_path: Path, loaded_data: Path) -> Iterator[Store]:
    """A store holding the demo corpus (threshold 0.7, default signature parameters):
    a fresh copy of the module's template for each test."""
    store_path.mkdir()
    shutil.copyfile(loaded_data, store_path / "data.mdb")
    with Store.open(store_path) as opened:
        yield opened


def _texts(corpus: DemoCorpus) -> list[str]:
    return list(corpus.documents.values())


def _answers(store: Store, corpus: DemoCorpus) -> list[list[Any]]:
    return store.query_many(_texts(corpus))


def _contents(store: Store) -> dict[Any, Any]:
    with store.read() as txn:
        return {key: txn.get(key) for key in txn}


# -- pairs and clusters ---------------------------------------------------------------------


@pytest.mark.parametrize("batch", [7, 1024])
def test_pairs_and_clusters_equal_the_in_memory_result(
    store: Store, corpus: DemoCorpus, monkeypatch: pytest.MonkeyPatch, batch: int
) -> None:
    monkeypatch.setattr(maintenance, "BATCH", batch)  # 7: many batch boundaries
    keys = [key for key, _, _ in _items(corpus)]
    sigs = store.hasher.signatures([text for _, text, _ in _items(corpus)])
    found, scores = verified_pairs(sigs, store.banding, THRESHOLD, store.config.seed)
    expected = [(keys[i], keys[j], float(s)) for (i, j), s in zip(found, scores, strict=True)]

    got = [(p.first, p.second, p.score) for p in store.pairs()]

    assert got == expected and len(got) > 40
    groups = duplicate_groups(sigs, store.banding, THRESHOLD, store.config.seed)
    assert store.clusters() == [[keys[i] for i in group] for group in groups]


def test_pairs_respect_a_threshold_and_stream_lazily(store: Store) -> None:
    everything = list(store.pairs())
    strict = list(store.pairs(threshold=0.9))
    assert strict == [p for p in everything if p.score >= 0.9] and strict
    iterator = store.pairs()
    first = next(iterator)
    iterator.close()  # ends its snapshot
    assert first == everything[0]
    with pytest.raises(InvalidParameterError):
        store.pairs(threshold=1.5)  # at the call, not at the first next()


def test_pairs_and_clusters_of_a_store_without_duplicates(store_path: Path) -> None:
    with Store.open(store_path, create=True) as empty:
        assert list(empty.pairs()) == [] and empty.clusters() == []
        empty.add("one", "a single document about nothing in particular at all")
        assert empty.clusters() == []


# -- stats ----------------------------------------------------------------------------------


def test_stats_describe_the_store(store: Store, corpus: DemoCorpus) -> None:
    documents = len(corpus.documents) + 1
    stats = store.stats()
    assert stats.documents == documents
    assert stats.params == store.params.flat() and stats.generation == 0
    assert stats.file_bytes == (store.path / "data.mdb").stat().st_size
    assert 0 < stats.used_bytes <= stats.file_bytes <= stats.map_size
    assert stats.commit_counter == 1  # one add_many batch
    assert len(stats.bands) == store.banding.bands
    for band in stats.bands:
        assert band.entries == documents and sum(band.histogram) == band.buckets
        sizes = sum(maintenance.bucket_size_range(i)[0] * n for i, n in enumerate(band.histogram))
        assert sizes <= band.entries  # each bucket counted at least at its lower bound
    assert [maintenance.bucket_size_range(i) for i in range(4)] == [(1, 1), (2, 2), (3, 4), (5, 8)]
    store.add("late", "one more document, committed in a second transaction")
    with store.read():
        later = store.stats()
    assert later.commit_counter == 2 and later.active_readers >= 1


def test_stats_show_boilerplate_as_the_largest_bucket(store: Store) -> None:
    boilerplate = "This page intentionally left blank. All rights reserved by the publisher."
    store.add_many((f"blank-{i}", boilerplate) for i in range(25))
    top = store.stats(largest=3).largest_buckets
    assert len(top) == 3 and top[0].size == 25
    assert [b.size for b in top] == sorted((b.size for b in top), reverse=True)
    assert len(top[0].sample_keys) == 3 and all(k.startswith("blank-") for k in top[0].sample_keys)


def _expected_bands(
    sigs: np.ndarray, store: Store
) -> tuple[list[tuple[int, int, tuple[int, ...]]], list[tuple[int, int]]]:
    """(buckets, entries, histogram) of each band and the (size, band) of every bucket of
    two or more, largest first, from a plain count of the band keys of ``sigs``."""
    keys = band_keys(sigs, store.banding, store.config.seed)
    bands, top = [], []
    for band in range(keys.shape[1]):
        counts: dict[bytes, int] = {}
        for key in codec.encode_band_keys(keys[:, band]):
            counts[kept_band_key(key)] = counts.get(kept_band_key(key), 0) + 1
        histogram = [0] * ((max(counts.values()) - 1).bit_length() + 1)
        for size in counts.values():
            histogram[(size - 1).bit_length()] += 1
        bands.append((len(counts), len(sigs), tuple(histogram)))
        top += [(size, band) for size in counts.values() if size > 1]
    top.sort(key=lambda item: (-item[0], item[1]))
    return bands, top


@pytest.mark.parametrize("chunk", [maintenance._SIZES_CHUNK, 7])
def test_stats_count_every_bucket_as_a_count_of_the_band_keys_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Bucket counts, histograms and the largest buckets against a plain count of each
    document's band keys (as the store keeps them: those of removed documents too until
    a purge), read in one chunk or in many."""
    monkeypatch.setattr(maintenance, "_SIZES_CHUNK", chunk)
    rng = np.random.default_rng(8)
    sigs = rng.integers(0, 2**32, size=(2000, 8), dtype=np.uint32)
    start = 0
    for size in (2, 3, 4, 5, 9, 17, 40):  # buckets of these sizes in band 0
        sigs[start : start + size, :4] = size
        start += size
    sigs[100:133, 4:] = 1  # and one of 33 in band 1
    removed = {*range(0, 2000, 11), 40, 41}  # the first two of the largest bucket too
    kept = [i for i in range(2000) if i not in removed]
    with Store.open(tmp_path / "s", create=True, num_perm=8, bands=2, rows=4) as store:
        store.add_signatures([(f"d{i}", sig) for i, sig in enumerate(sigs)])
        store.remove_many(f"d{i}" for i in sorted(removed))
        pending = store.stats(largest=4)
        assert store.purge() == 2000 - len(kept)
        stats = store.stats(largest=4)
        everyone, everyone_top = _expected_bands(sigs, store)
        expected, expected_top = _expected_bands(sigs[kept], store)
    # Before the purge the removed documents' entries are still counted.
    assert (pending.documents, pending.awaiting_purge) == (len(kept), 2000 - len(kept))
    assert [(b.buckets, b.entries, b.histogram) for b in pending.bands] == everyone
    assert [(b.size, b.band) for b in pending.largest_buckets] == everyone_top[:4]
    assert pending.largest_buckets[0].size == 40  # all planted, the removed ones too
    planted = {f"d{i}" for i in range(40, 80) if i in kept}
    for found in (pending, stats):  # sample keys are of stored documents only
        assert len(found.largest_buckets[0].sample_keys) == 3
        assert set(found.largest_buckets[0].sample_keys) <= planted
    assert (stats.documents, stats.awaiting_purge) == (len(kept), 0)
    assert [(b.buckets, b.entries, b.histogram) for b in stats.bands] == expected
    assert [(b.size, b.band) for b in stats.largest_buckets] == expected_top[:4]
    assert stats.largest_buckets[0].size == len(planted)  # of the 40 planted


# -- check and repair -----------------------------------------------------------------------


@contextmanager
def raw_env(path: Path) -> Iterator[tuple[lmdb.Environment, dict[bytes, Any]]]:
    """The store's environment opened with plain LMDB, and a handle for each of its tables.

    The Store must be closed: LMDB forbids opening one environment twice in a process.
    """
    env = lmdb.open(str(path), max_dbs=128, map_size=1 << 30)
    try:
        with env.begin() as txn:
            names = [bytes(name) for name, _ in txn.cursor()]
        yield env, {name: env.open_db(name, create=False) for name in names}
    finally:
        env.close()


def _doc_id(path: Path, key: str) -> bytes:
    with raw_env(path) as (env, dbs), env.begin() as txn:
        return bytes(txn.get(b"s" + key.encode(), db=dbs[codec.KEYS_DB]))


def _band_key(path: Path, key: str, band: int) -> bytes:
    with Store.open(path) as store, store.read() as txn:
        return txn._band_key_rows(store.get(key).signature[None, :])[0][band]


def _put(path: Path, table: bytes, key: bytes, value: bytes) -> None:
    with raw_env(path) as (env, dbs), env.begin(write=True) as txn:
        txn.put(key, value, db=dbs[table])


def _delete(path: Path, table: bytes, key: bytes, value: bytes = b"") -> None:
    with raw_env(path) as (env, dbs), env.begin(write=True) as txn:
        assert txn.delete(key, value, db=dbs[table])


def _wrong_bucket(path: Path) -> None:
    entry = band_table_entry(b"\x01" * 8, _doc_id(path, "doc-0003"))
    _put(path, codec.band_table_name(0, 0), *entry)


def _dangling_band_entry(path: Path) -> None:
    _put(
        path, codec.band_table_name(0, 1), *band_table_entry(b"\x02" * 8, codec.encode_id(999_999))
    )


def _missing_band_entry(path: Path) -> None:
    entry = band_table_entry(_band_key(path, "doc-0005", 2), _doc_id(path, "doc-0005"))
    _delete(path, codec.band_table_name(0, 2), *entry)


def _missing_key_entry(path: Path) -> None:
    _delete(path, codec.KEYS_DB, b"sdoc-0007")


def _key_to_another_doc(path: Path) -> None:
    _put(path, codec.KEYS_DB, b"sdoc-0008", _doc_id(path, "doc-0009"))


def _dangling_key_entry(path: Path) -> None:
    _put(path, codec.KEYS_DB, b"sghost", codec.encode_id(123_456))


def _stray_table(path: Path) -> None:
    with raw_env(path) as (env, _), env.begin(write=True) as txn:
        stray = env.open_db(codec.band_table_name(7, 0), txn=txn, dupsort=True)
        txn.put(b"\x00" * 8, codec.encode_id(1), db=stray)


def _next_id_too_low(path: Path) -> None:
    _put(path, codec.META_DB, b"next_doc_id", codec.pack_meta(5))


def _id_beyond_the_format(path: Path) -> None:
    """A copy of a record under an id the band tables cannot hold: its entries would be
    those of the id's last 5 bytes, the original's."""
    doc_id = _doc_id(path, "doc-0012")
    far = codec.decode_id(doc_id) + 2**40
    with raw_env(path) as (env, dbs), env.begin(write=True) as txn:
        record = bytes(txn.get(doc_id, db=dbs[codec.DOCS_DB]))
        txn.put(codec.encode_id(far), record, db=dbs[codec.DOCS_DB])
        txn.put(b"next_doc_id", codec.pack_meta(far + 1), db=dbs[codec.META_DB])


def _flipped_byte(path: Path) -> None:
    doc_id = _doc_id(path, "doc-0010")
    with raw_env(path) as (env, dbs), env.begin(write=True) as txn:
        record = bytearray(txn.get(doc_id, db=dbs[codec.DOCS_DB]))
        record[20] ^= 0x40  # inside the signature: only the checksum can tell
        txn.put(doc_id, bytes(record), db=dbs[codec.DOCS_DB])


def _short_signature(path: Path) -> None:
    record = codec.encode_record(b"doc-0011", True, np.arange(64, dtype=np.uint32), None)
    _put(path, codec.DOCS_DB, _doc_id(path, "doc-0011"), record)


def _stored_and_removed(path: Path) -> None:
    """A stored document's record also in ``removed``, as if its removal were pending."""
    doc_id = _doc_id(path, "doc-0013")
    with raw_env(path) as (env, dbs), env.begin(write=True) as txn:
        record = bytes(txn.get(doc_id, db=dbs[codec.DOCS_DB]))
        txn.put(doc_id, record, db=dbs[codec.REMOVED_DB])


def _flipped_byte_of_a_removed_record(path: Path) -> None:
    """A removed document awaiting a purge whose record no longer matches its checksum:
    it can no longer vouch for the band entries it left."""
    doc_id = _doc_id(path, "doc-0014")
    with Store.open(path) as store:
        store.remove("doc-0014")
    with raw_env(path) as (env, dbs), env.begin(write=True) as txn:
        record = bytearray(txn.get(doc_id, db=dbs[codec.REMOVED_DB]))
        record[20] ^= 0x40
        txn.put(doc_id, bytes(record), db=dbs[codec.REMOVED_DB])


def _missing_meta_entry(path: Path) -> None:
    _delete(path, codec.META_DB, b"package_version")


def _damaged_page(path: Path) -> None:
    """A flipped bit in a page count LMDB keeps but never reads back: only the walk sees it."""
    with open(path / "data.mdb", "r+b") as file:
        pages = [file.read(4096), file.read(4096)]
        newest = max((0, 1), key=lambda i: int.from_bytes(pages[i][144:152], "little"))
        file.seek(newest * 4096 + 104)  # mm_dbs[MAIN].md_leaf_pages: only a count
        file.write(bytes([pages[newest][104] ^ 0x04]))


CORRUPTIONS = [
    # (inject, the kinds check must report, repair fixes it)
    (_wrong_bucket, {"band-orphan"}, True),
    (_dangling_band_entry, {"band-orphan"}, True),
    (_missing_band_entry, {"band-missing"}, True),
    (_missing_key_entry, {"key-missing"}, True),
    (_key_to_another_doc, {"key-mismatch", "key-orphan"}, True),
    (_dangling_key_entry, {"key-orphan"}, True),
    (_stray_table, {"stray-table"}, True),
    (_next_id_too_low, {"doc-id"}, True),
    (_id_beyond_the_format, {"doc-id", "meta"}, False),  # its next_doc_id is past them too
    (_flipped_byte, {"corrupt-record"}, False),
    (_short_signature, {"signature-length"}, False),
    (_stored_and_removed, {"removed-record"}, True),
    (_flipped_byte_of_a_removed_record, {"removed-record"}, True),
    (_missing_meta_entry, {"meta"}, False),
    (_damaged_page, {"structure"}, False),
]


def test_check_is_clean_on_a_healthy_store(store: Store, corpus: DemoCorpus) -> None:
    report = store.check()
    assert report.ok and report.violations == [] and not report.repaired
    assert report.documents_checked == len(corpus.documents) + 1
    store.remove_many(["doc-0001", "doc-0002"])
    with store.read() as reader:
        assert reader.awaiting_purge() == 2  # their band entries are still there: fine
    report = store.check()
    assert report.ok and report.documents_checked == len(corpus.documents) - 1
    assert store.purge() == 2
    report = store.check()
    assert report.ok and report.documents_checked == len(corpus.documents) - 1


def test_check_and_clusters_report_progress(store: Store) -> None:
    """They gave no sign of life on a large store (review 20): check counts the documents
    it checked, on through the check after a repair; clusters counts the pairs found."""
    documents = len(store)
    seen: list[int] = []
    assert store.check(progress=seen.append).ok
    assert seen == [*range(1000, documents, 1000), documents]
    path = store.path
    store.close()
    _delete(path, codec.META_DB, b"commit_counter")  # damage for a repair to mend
    with Store.open(path) as damaged:
        seen.clear()
        assert damaged.check(repair=True, progress=seen.append).repaired
        assert seen[-1] == 2 * documents and seen == sorted(seen)
        found: list[int] = []
        groups = damaged.clusters(progress=found.append)
        assert found[-1] == sum(1 for _ in damaged.pairs()) and groups
        for bad in ("not callable", 3):
            with pytest.raises(InvalidParameterError, match="progress"):
                damaged.check(progress=bad)  # type: ignore[arg-type]
            with pytest.raises(InvalidParameterError, match="progress"):
                damaged.clusters(progress=bad)  # type: ignore[arg-type]


def test_check_is_clean_on_a_store_whose_band_buckets_are_huge(store_path: Path) -> None:
    """Regression: thousands of near-identical documents make LMDB move band entries
    between duplicate sub-pages and sub-tables, after which its page counters of a band
    table no longer match the tree (one leaf page too many). The page walk once reported
    that healthy store as damaged; only the entry count of such tables is compared now."""
    words = ["alpha", "beta", "gamma", "delta", "eps"]
    rng = np.random.default_rng(1)
    texts = [" ".join(rng.choice(words, 60)) + f" {i}" for i in range(1200)]
    with Store.open(store_path, create=True, num_perm=32) as store:
        for start in range(0, len(texts), 100):
            store.add_many((f"d{i}", texts[i]) for i in range(start, start + 100))
            assert store.check().ok, start
        store.remove_many(f"d{i}" for i in range(0, len(texts), 3))
        report = store.check()
        assert report.ok, report.violations
        largest = store.stats().largest_buckets[0]
    assert largest.size > 100  # the buckets really are huge


def test_the_corruptions_cover_every_violation_kind() -> None:
    assert {kind for _, found, _ in CORRUPTIONS for kind in found} == set(integrity.VIOLATION_KINDS)


@pytest.mark.parametrize(
    ("inject", "kinds", "repairable"), CORRUPTIONS, ids=[c[0].__name__ for c in CORRUPTIONS]
)
def test_check_finds_real_corruption_and_repair_fixes_what_it_can(
    store: Store,
    corpus: DemoCorpus,
    inject: Callable[[Path], None],
    kinds: set[str],
    repairable: bool,
) -> None:
    path = store.path
    store.close()
    inject(path)
    with Store.open(path) as damaged:
        report = damaged.check()
        assert not report.ok and report.kinds() == kinds, report.violations
        assert all(v.detail for v in report.violations)

        repaired = damaged.check(repair=True)

        # Writing through damaged LMDB pages could only spread the damage: no repair.
        assert repaired.repaired == (kinds != {"structure"}) and repaired.kinds() == kinds
        if repairable:
            assert repaired.ok and repaired.remaining == [] and damaged.check().ok
            with damaged.read() as reader:
                assert reader.awaiting_purge() == 0  # re-derived from the stored documents
            text = corpus.documents["doc-0005"]
            assert damaged.query(text)[0].key == "doc-0005"
            damaged.add("after-repair", text + " And one more sentence.")
        else:
            assert {v.kind for v in repaired.remaining} == kinds and not repaired.ok


@pytest.mark.parametrize("byte", ["first", "last kept"])
def test_check_finds_an_entry_in_the_bucket_next_to_its_documents_own(
    store: Store, byte: str
) -> None:
    """An extra band entry of a stored document in a bucket one bit away from its own:
    in the top bit of the band key's first byte, or the low bit of the last byte a store
    keeps. The other corruptions put entries far from their bucket, so a check comparing
    all but the last kept byte passed them (review 49)."""
    path = store.path
    store.close()
    kept = codec.band_layout(codec.FORMAT_VERSION).band_key_bytes
    own = _band_key(path, "doc-0003", 1)
    assert len(kept_band_key(own)) == kept
    wrong = bytearray(own)
    if byte == "first":
        wrong[0] ^= 0x80
    else:
        wrong[kept - 1] ^= 0x01
    doc_id = _doc_id(path, "doc-0003")
    _put(path, codec.band_table_name(0, 1), *band_table_entry(bytes(wrong), doc_id))
    with Store.open(path) as damaged:
        (violation,) = damaged.check().violations
        assert (violation.kind, violation.doc_id) == ("band-orphan", codec.decode_id(doc_id))
        bucket = kept_band_key(bytes(wrong)).hex()
        assert f"bucket {bucket} of band 1 lists document {violation.doc_id}," in violation.detail
        repaired = damaged.check(repair=True)
        assert repaired.repaired and repaired.ok and damaged.check().ok


def test_check_finds_a_corrupt_record_without_failing_itself(store: Store) -> None:
    path = store.path
    store.close()
    _flipped_byte(path)
    with Store.open(path) as damaged:
        (violation,) = damaged.check().violations
        assert violation.kind == "corrupt-record" and "checksum" in violation.detail
        assert violation.doc_id == codec.decode_id(_doc_id_open(damaged, "doc-0010"))
        with pytest.raises(CorruptRecordError, match="names its key"):
            damaged.get("doc-0010")


def test_check_names_a_corrupt_records_key_and_its_advice_restores_the_store(
    store: Store, corpus: DemoCorpus
) -> None:
    """The record cannot say its key, the keys table can: following the advice (remove
    by that key, repair, add again) gives a sound store that finds the document."""
    path = store.path
    store.close()
    _flipped_byte(path)
    with Store.open(path) as damaged:
        (violation,) = damaged.check().violations
        assert "key doc-0010: remove it by that key, run check --repair" in violation.detail
        assert violation.key == "doc-0010"
        damaged.remove(violation.key)
        assert damaged.check(repair=True).remaining == []
        text = corpus.documents["doc-0010"]
        damaged.add("doc-0010", text)
        assert damaged.check().ok and damaged.query(text)[0].key == "doc-0010"


def test_a_repair_before_the_advice_keeps_the_damaged_records_key(
    store: Store, corpus: DemoCorpus
) -> None:
    """A repair run first dropped the keys entry of the damaged record, the only place its
    key was left: the advice went with it, the document could no longer be removed, and
    the store could never pass check again (a review's finding)."""
    path = store.path
    store.close()
    _flipped_byte(path)
    with Store.open(path) as damaged:
        repaired = damaged.check(repair=True)
        (left,) = repaired.remaining
        assert left.kind == "corrupt-record" and "key doc-0010: remove it" in left.detail
        damaged.remove("doc-0010")
        damaged.add("doc-0010", corpus.documents["doc-0010"])
        assert damaged.check(repair=True).remaining == [] and damaged.check().ok


_KEYS_THAT_READ_ALIKE = {b"\x00\xff": "hex:00ff", "hex:00ff": "\\hex:00ff", "x\ny": "str:780a79"}
"""Keys whose Python reprs are no keys to type (and two of which read alike once a user
drops the quotes), each with how every command prints it."""


def test_check_names_keys_as_the_cli_prints_them_and_carries_each_key(tmp_path: Path) -> None:
    """check wrote keys as Python reprs (``'hex:00ff'``, ``b'\\x00\\xff'``, ``'x\\ny'``):
    read without the quotes, the str key ``hex:00ff`` named the bytes key, and ``remove``
    took out a healthy document (review 45). Each is now named as keys print, the key
    itself attached; a keys entry of no record too."""
    path = tmp_path / "keys.ndx"
    with Store.open(path, create=True) as store:
        for i, key in enumerate(_KEYS_THAT_READ_ALIKE):
            store.add(key, f"document number {i} of a store whose keys read alike")
    for key in _KEYS_THAT_READ_ALIKE:
        raw, is_str = (key.encode(), True) if isinstance(key, str) else (key, False)
        _delete(path, codec.KEYS_DB, codec.key_index(raw, is_str))
    _put(path, codec.KEYS_DB, codec.key_index(b"\x01", False), codec.encode_id(999))
    with Store.open(path) as store:
        found = store.check().violations
    missing = {v.key: v.detail for v in found if v.kind == "key-missing"}
    assert set(missing) == set(_KEYS_THAT_READ_ALIKE)
    for key, printed in _KEYS_THAT_READ_ALIKE.items():
        assert missing[key].startswith(f"key {printed} of record "), missing[key]
    (orphan,) = [v for v in found if v.kind == "key-orphan"]
    assert orphan.key == b"\x01" and orphan.detail == "keys entry of key hex:01 points to no record"


@pytest.mark.parametrize("entry", ["commit_counter", "next_doc_id", "map_size"])
def test_a_repair_rewrites_missing_bookkeeping_meta(store: Store, entry: str) -> None:
    """check reported these as meta violations; check --repair then failed with a raw
    TypeError (its own commit reads them, a review's finding)."""
    path = store.path
    documents = len(store)
    store.close()
    _delete(path, codec.META_DB, entry.encode())
    with Store.open(path) as damaged:
        assert damaged.check().kinds() == {"meta"}
        assert damaged.check(repair=True).ok and damaged.check().ok
        damaged.add("after-repair", "a document added once the store was repaired")
        assert len(damaged) == documents + 1


@pytest.mark.parametrize(
    ("entry", "value", "kind"),
    [("next_doc_id", "7", "meta"), ("next_doc_id", -1, "meta"), ("next_doc_id", 3, "doc-id"),
     ("commit_counter", "x", "meta"), ("commit_counter", 2**64 - 1, "meta")],
)  # fmt: skip
def test_a_damaged_bookkeeping_count_stops_a_write_typed_until_a_repair(
    store: Store, entry: str, value: object, kind: str
) -> None:
    """These counts are outside the parameters' checksum. Damaged, they were trusted: a
    next_doc_id below the stored ids had the next add report success while its record
    was refused and its key pointed at another document; a string or an out-of-range
    number failed the write with a raw TypeError or OverflowError (a review's finding)."""
    path = store.path
    documents = len(store)
    store.close()
    with raw_env(path) as (env, dbs), env.begin(write=True) as txn:
        txn.put(entry.encode(), codec.pack_meta(value), db=dbs[codec.META_DB])
    before = raw_digest(path)
    refused = pytest.raises(CorruptStoreError, match=f"meta {entry} is .*check --repair")
    with Store.open(path) as damaged, refused:
        damaged.add("new", "a document added after the damage")
    assert raw_digest(path) == before
    with Store.open(path) as damaged:
        assert kind in damaged.check().kinds()
        assert damaged.check(repair=True).ok and damaged.check().ok
        damaged.add("new", "a document added after the damage")
        assert damaged.get("new").key == "new" and len(damaged) == documents + 1
        assert [m.key for m in damaged.query("a document added after the damage")] == ["new"]


@pytest.mark.parametrize("value", [2**62, "x", -1])
def test_a_damaged_map_size_is_ignored_reported_and_rewritten(store: Store, value: object) -> None:
    """One past the largest map made every open fail as 'not a neardup_store store'. A
    string or a negative one was refused as corruption, read-only too, so the repair
    that rewrites it could not run (review 23)."""
    path = store.path
    store.close()
    with raw_env(path) as (env, dbs), env.begin(write=True) as txn:
        txn.put(b"map_size", codec.pack_meta(value), db=dbs[codec.META_DB])
    with Store.open(path, read_only=True) as reader:
        assert reader.check().kinds() == {"meta"}
    with Store.open(path) as damaged:
        assert damaged.check().kinds() == {"meta"}
        damaged.add("new", "a document added after the damage")
        assert damaged.check().ok


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [("rows", 200, "need more than its"), ("threshold", 2.0, "meta threshold is 2.0"),
     ("threshold", float("nan"), "meta threshold is nan")],
)  # fmt: skip
def test_parameters_no_store_can_have_are_refused_at_open(
    store: Store, field: str, value: object, reason: str
) -> None:
    """A store without ``meta_checksum`` (written before it existed) is read unverified.
    Bands of more rows than its signatures hold opened, then check() failed with
    InvalidParameterError telling the user to pass fewer bands (review 23)."""
    path = store.path
    store.close()
    with raw_env(path) as (env, dbs), env.begin(write=True) as txn:
        banding = codec.unpack_meta(txn.get(b"banding", db=dbs[codec.META_DB]))
        txn.put(b"banding", codec.pack_meta({**banding, field: value}), db=dbs[codec.META_DB])
        assert txn.delete(b"meta_checksum", db=dbs[codec.META_DB])
    before = raw_digest(path)
    for read_only in (True, False):
        with pytest.raises(CorruptStoreError, match=reason):
            Store.open(path, read_only=read_only)
    assert raw_digest(path) == before


@pytest.mark.parametrize("stored_under", [b"abc", bytes(9)])  # after every id; before them
def test_a_record_under_a_key_that_is_no_id_is_given_one_by_a_repair(
    store: Store, stored_under: bytes
) -> None:
    """check reported such a record, but adds, exports and rebuilds then failed with a
    raw struct.error, and a repair left the record where it was (review 23). An export
    or a rebuild now names the damage and the repair that mends it, and so does an add
    when the key sorts after every id (LMDB would not append a record after it: its keys
    and band entries went in, pointing at nothing). The repair gives the record an id."""
    path = store.path
    expected = _contents(store)
    doc_id = _doc_id_open(store, "doc-0005")
    store.close()
    with raw_env(path) as (env, dbs), env.begin(write=True) as txn:
        record = txn.pop(doc_id, db=dbs[codec.DOCS_DB])
        txn.put(stored_under, record, db=dbs[codec.DOCS_DB])
    advice = "is corrupt .*check --repair"
    add = lambda store: store.add("new", "a document added after the damage")  # noqa: E731
    with Store.open(path) as damaged:
        assert "doc-id" in damaged.check().kinds()
        with pytest.raises(CorruptRecordError, match=advice):
            damaged.export(io.BytesIO())
        with pytest.raises(CorruptRecordError, match=advice):
            damaged.rebuild()
        if stored_under > doc_id:  # LMDB will not append a record after it
            with pytest.raises(CorruptRecordError, match=advice):
                add(damaged)
            assert "new" not in damaged
        else:
            add(damaged)
        assert damaged.check(repair=True).remaining == [] and damaged.check().ok
        if "new" not in damaged:
            add(damaged)
        expected["new"] = damaged.get("new")
        assert _contents(damaged) == expected and damaged.check().ok
        assert damaged.export(io.BytesIO()) == len(expected)


def test_a_record_under_no_id_whose_key_a_newer_one_holds_is_removed_by_the_repair(
    store: Store,
) -> None:
    """The repair gave such a record the newest id without indexing it: check then found
    the repair's own damage, and a second repair made that stale record the key's
    document (review 24). It is that key's older version: removed, awaiting a purge."""
    path = store.path
    stale = _doc_id_open(store, "doc-0007")
    fresh_text = "the text of doc-0007 that the user added again"
    store.add("doc-0007", fresh_text, replace=True)
    expected = _contents(store)
    store.close()
    with raw_env(path) as (env, dbs), env.begin(write=True) as txn:
        record = bytes(txn.get(stale, db=dbs[codec.REMOVED_DB]))
        txn.put(b"\xffstale", record, db=dbs[codec.DOCS_DB])  # the old version, under no id
    with Store.open(path) as damaged:
        assert "doc-id" in damaged.check().kinds()
        for _ in range(2):  # a second repair finds nothing to do
            assert damaged.check(repair=True).remaining == [] and damaged.check().ok
            assert _contents(damaged) == expected
            signature = damaged.get("doc-0007").signature
            assert np.array_equal(signature, damaged.hasher.signature(fresh_text))
            with damaged.read() as reader:
                assert reader.awaiting_purge() == 1  # the stale record (the repair re-derives
                # the rest from the stored documents)
        assert damaged.purge() == 1 and damaged.check().ok and _contents(damaged) == expected


def test_a_damaged_id_in_the_keys_table_or_a_missing_record_advises_the_repair(
    store: Store,
) -> None:
    """A keys value that is no id was said to be a record 'stored under' it, and a key
    whose record is missing advised removing the document, which raised the same error
    (review 24): both advise check --repair, which mends them."""
    path = store.path
    store.close()
    with raw_env(path) as (env, dbs), env.begin(write=True) as txn:
        txn.put(codec.key_index(b"doc-0003", True), b"abc", db=dbs[codec.KEYS_DB])
        missing = bytes(txn.get(codec.key_index(b"doc-0004", True), db=dbs[codec.KEYS_DB]))
        assert txn.delete(missing, db=dbs[codec.DOCS_DB])
    with Store.open(path) as damaged:
        for key, reason in (("doc-0003", "a document id reads b'abc'"),
                            ("doc-0004", "indexed but missing")):  # fmt: skip
            for call in (damaged.get, damaged.remove):
                with pytest.raises(CorruptRecordError, match=re.escape(reason)) as caught:
                    call(key)
                assert "check --repair" in str(caught.value)
                assert "remove that document" not in str(caught.value)
        assert damaged.check(repair=True).remaining == [] and damaged.check().ok
        assert "doc-0004" not in damaged and damaged.get("doc-0003").key == "doc-0003"


def test_a_compressed_export_cut_short_is_a_stream_error(store: Store, tmp_path: Path) -> None:
    """A gzip, bz2 or xz export cut short raised the decompressor's raw EOFError (review
    24): it is a StreamReadError, with what the batches before it committed."""
    import bz2
    import gzip

    data = _export(store)
    for module in (gzip, bz2, lzma):
        packed = module.compress(data)
        cut = io.BytesIO(packed[: len(packed) * 3 // 4])
        with Store.open(tmp_path / module.__name__, create=True, threshold=THRESHOLD) as target:
            with pytest.raises(StreamReadError) as caught:
                target.import_(module.open(cut), batch_size=50)
            # (a read that fails before the first batch has committed nothing to tell)
            assert getattr(caught.value, "committed", 0) == len(target)


def test_every_damaged_byte_of_an_export_is_refused_and_imports_nothing(tmp_path: Path) -> None:
    """An export carried no checksum: of one bit flipped at each byte of a 23-document
    export, 5319 of 5570 imported as other keys or signatures into a store that then
    checked clean (review 23). An export cut short anywhere in its header was 'empty'."""
    options = {"num_perm": 16, "bands": 4, "rows": 4}
    with Store.open(tmp_path / "source", create=True, **options) as source:
        source.add("doc-a", "the quick brown fox jumps over the lazy dog", metadata={"n": 1})
        source.add(b"doc-\x00b", "a second document, of other words", metadata=[1.5, None])
        data = _export(source)
    objects = msgpack.Unpacker(io.BytesIO(data))
    next(objects)
    header_end = objects.tell()
    with Store.open(tmp_path / "target", create=True, **options) as target:
        for position in range(len(data)):
            for bit in (0x01, 0x80):
                damaged = bytearray(data)
                damaged[position] ^= bit
                with pytest.raises(InvalidStreamError):
                    target.import_(io.BytesIO(bytes(damaged)))
        for end in range(len(data)):
            with pytest.raises(InvalidStreamError) as cut:
                target.import_(io.BytesIO(data[:end]))
            if end == 0:
                assert "empty" in str(cut.value)
            elif end < header_end:
                assert "ends inside its header: the export was cut short" in str(cut.value)
        assert len(target) == 0 and target.stats().commit_counter == 0
        assert target.import_(io.BytesIO(data)) == 2


def test_a_repair_never_hands_out_the_id_of_a_record_it_cannot_read(store: Store) -> None:
    """With next_doc_id missing, the repair took the next id from the readable records
    only: the next add reused the id of a damaged newest record, and the document it
    added could not be read back (a review of the repair's fix)."""
    path = store.path
    store.add("newest", "the newest document of the store, soon damaged")
    newest = _doc_id_open(store, "newest")
    store.close()
    with raw_env(path) as (env, dbs), env.begin(write=True) as txn:
        txn.put(newest, b"\x01\x00", db=dbs[codec.DOCS_DB])  # shorter than a header
        txn.delete(b"next_doc_id", db=dbs[codec.META_DB])
    with Store.open(path) as damaged:
        damaged.check(repair=True)
        damaged.add("after", "a document added once the store was repaired")
        assert damaged.get("after").key == "after"
        assert codec.decode_id(_doc_id_open(damaged, "after")) > codec.decode_id(newest)


def test_a_repair_gives_a_key_held_by_two_records_to_the_newest(store: Store) -> None:
    """The first record won, so a key whose replacement had left the old record behind
    (an older bug's damage) went back to the stale version (a review's finding)."""
    path = store.path
    old_id = _doc_id_open(store, "doc-0007")
    store.add("doc-0007", "the replacement text of this document", replace=True)
    new_id = _doc_id_open(store, "doc-0007")
    store.close()
    with raw_env(path) as (env, dbs), env.begin() as txn:
        old_record = bytes(txn.get(new_id, db=dbs[codec.DOCS_DB]))
    _put(path, codec.DOCS_DB, old_id, old_record)  # a second record of the same key
    with Store.open(path) as damaged:
        damaged.check(repair=True)
        assert _doc_id_open(damaged, "doc-0007") == new_id
        assert damaged.get("doc-0007").signature.tolist() == (
            damaged.hasher.signature("the replacement text of this document").tolist()
        )


def test_check_reports_a_next_doc_id_past_the_formats_ids(store: Store) -> None:
    path = store.path
    store.close()
    limit = codec.band_layout(codec.FORMAT_VERSION).id_limit
    _put(path, codec.META_DB, b"next_doc_id", codec.pack_meta(2 * limit))
    with Store.open(path) as damaged:
        (violation,) = damaged.check().violations
        assert violation.kind == "meta" and "past the format's" in violation.detail


@pytest.mark.parametrize("format_version", [4, 5])
def test_a_damaged_record_stops_a_removal_or_purge_before_anything_is_deleted(
    store: Store, format_version: int
) -> None:
    """The band entries a removal (formats 1 to 4) or a purge (format 5) deletes are
    computed from the records, every record verified first: a damaged one raises
    before the first delete, so the transaction is still whole and usable. The caller
    can go on in it and commit, and nothing of the refused operation is committed."""
    path = store.path
    store.close()
    doomed = ["doc-0003", "doc-0010", "doc-0020"]
    if format_version == 4:
        rewrite_as_old_format(path, 4)
        _flipped_byte(path)  # doc-0010, still stored
    else:
        with Store.open(path) as opened:
            opened.remove_many([doomed[0], doomed[2]])
        _flipped_byte_of_a_removed_record(path)  # doc-0014, removed, awaiting a purge
    with Store.open(path) as damaged:
        documents, entries = len(damaged), [b.entries for b in damaged.stats().bands]
        with damaged.write() as txn:
            awaiting = txn.awaiting_purge()
            refused = (lambda: txn.remove_many(doomed)) if format_version == 4 else txn.purge
            # The advice fits: remove a stored document by its key; a removed one has none
            # left, and the repair drops it (review 23: the purge advised the removal).
            advice = "remove that document" if format_version == 4 else "check --repair.*drops the"
            with pytest.raises(CorruptRecordError, match=advice):
                refused()
            assert txn.remove("doc-0050")  # the transaction goes on, and commits
        assert len(damaged) == documents - 1 and "doc-0050" not in damaged
        stats = damaged.stats()
        assert stats.awaiting_purge == awaiting + (format_version == 5)
        assert [b.entries for b in stats.bands] == [e - (format_version == 4) for e in entries]
        if format_version == 4:
            assert all(key in damaged for key in doomed)


def _doc_id_open(store: Store, key: str) -> bytes:
    with store.read() as txn:
        found = txn._lookup(key)
    assert found is not None
    return found[0]


def test_repair_needs_a_writable_store(store: Store) -> None:
    path = store.path
    store.close()
    with Store.open(path, read_only=True) as reader:
        assert reader.check().ok
        with pytest.raises(ReadOnlyError):
            reader.check(repair=True)


def test_read_only_stores_can_be_inspected_exported_and_backed_up(
    store: Store, tmp_path: Path
) -> None:
    clusters, path = store.clusters(), store.path
    store.close()
    with Store.open(path, read_only=True) as reader:
        assert reader.clusters() == clusters and reader.stats().documents == len(reader)
        assert reader.backup(tmp_path / "backup").documents == len(reader)
        data = io.BytesIO()
        assert reader.export(data) == len(reader)
        with pytest.raises(ReadOnlyError):
            reader.import_(io.BytesIO(data.getvalue()))


# -- compaction -----------------------------------------------------------------------------


def test_a_dry_run_is_an_upper_bound_even_with_nothing_to_purge(tmp_path: Path) -> None:
    """Pages that removals left partly empty stay so after a purge; the dry run counts
    them whole, and the compacted copy fills them. Once compacted, the dry run is exact.
    (The state machine found a store where the estimate was larger with nothing awaiting
    a purge, which its check had wrongly required to be exact.)"""
    rng = np.random.default_rng(23)
    sigs = rng.integers(0, 2**32, size=(60, 64), dtype=np.uint32)
    options = {"threshold": 0.7, "num_perm": 64, "bands": 16, "rows": 4}
    with Store.open(tmp_path / "s", create=True, **options) as store:
        store.add_signatures([(f"{i:04d}" + "k" * 600, sig) for i, sig in enumerate(sigs)])
        store.remove_many([f"{i:04d}" + "k" * 600 for i in range(0, 60, 3)])
        store.purge()
        assert store.stats().awaiting_purge == 0
        estimate = store.compact(dry_run=True)
        report = store.compact()
        assert report.bytes_after < estimate.bytes_after
        assert store.compact(dry_run=True).bytes_after == report.bytes_after


def test_a_dry_run_bounds_a_copy_committed_in_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy commits every _COPY_CHUNK entries, and each commit after the first leaves
    pages that earlier ones wrote free in the copy. The dry run counted the tables' pages
    only: on a compacted store it was below what compaction leaves, and said space could
    be reclaimed where none could (review 40). Copied in one transaction, it is exact."""
    monkeypatch.setattr(maintenance, "_COPY_CHUNK", 2000)  # 54,000 entries: 27 commits
    sigs = np.random.default_rng(40).integers(0, 2**32, size=(3000, 64), dtype=np.uint32)
    with Store.open(tmp_path / "s", create=True, num_perm=64, bands=16, rows=4) as store:
        store.add_signatures([(f"k{i}", sig) for i, sig in enumerate(sigs)])
        compacted = store.compact()
        estimate = store.compact(dry_run=True)
        report = store.compact()
        assert report.bytes_after == compacted.bytes_after  # the same copy again
        assert report.bytes_after <= estimate.bytes_after
        assert estimate.reclaimed_bytes <= 0
        assert estimate.bytes_after - report.bytes_after <= 40 * store._page_size()
        monkeypatch.setattr(maintenance, "_COPY_CHUNK", 10**9)
        exact = store.compact(dry_run=True)
        assert store.compact().bytes_after == exact.bytes_after < report.bytes_after


def test_compact_reclaims_the_space_removals_leave(store: Store, corpus: DemoCorpus) -> None:
    keep = {key for group in corpus.planted for key in group}
    store.remove_many([key for key in corpus.documents if key not in keep])
    before_answers = _answers(store, corpus)
    before_contents = _contents(store)
    stats_before = store.stats()
    free_before = stats_before.free_pages
    assert stats_before.awaiting_purge == len(corpus.documents) - len(keep)
    estimate = store.compact(dry_run=True)

    seen: list[int] = []
    report = store.compact(progress=seen.append)

    assert seen == sorted(seen) and seen[-1] == len(store)  # in documents, up to all of them
    assert estimate.dry_run and estimate.bytes_before == report.bytes_before
    assert report.bytes_after <= estimate.bytes_after  # the estimate is an upper bound

    assert report.bytes_after < 0.7 * report.bytes_before
    assert report.bytes_after == (store.path / "data.mdb").stat().st_size
    assert report.reclaimed_bytes == report.bytes_before - report.bytes_after
    stats_after = store.stats()
    assert stats_after.free_pages < free_before
    assert stats_after.awaiting_purge == 0  # compaction purges first
    assert all(band.entries == len(store) for band in stats_after.bands)
    assert _answers(store, corpus) == before_answers
    assert _contents(store) == before_contents
    assert store.check().ok
    assert not [p for p in store.path.iterdir() if p.name.startswith(".compact-")]
    store.add("after-compact", "the store stays writable after it was compacted")
    store.close()
    with Store.open(store.path) as reopened:
        assert _answers(reopened, corpus) == before_answers and "after-compact" in reopened


_COMPACT_AND_BACK_UP = """
import sys
from neardup_store.store import Store
with Store.open(sys.argv[1]) as store:
    store.backup(sys.argv[2])
    store.compact()
"""


def test_compact_and_backup_copy_a_band_bucket_of_many_documents(tmp_path: Path) -> None:
    """A bucket this large is a sub-database of fixed-size duplicates in every band table:
    the case where LMDB's own compacting copy (py-lmdb 3.0.0) dereferences a null pointer
    and kills the process. Run in a child, so that such a crash fails only this test."""
    path, backup = tmp_path / "store", tmp_path / "backup"
    same = np.arange(32, dtype=np.uint32)
    with Store.open(path, create=True, num_perm=32, bands=4, rows=8) as store:
        store.add_signatures([(f"copy-{i}", same) for i in range(2000)])
        store.add("other", "a document of its own")
    before = raw_dump(path)
    child = subprocess.run(
        [sys.executable, "-c", _COMPACT_AND_BACK_UP, str(path), str(backup)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    assert raw_dump(backup) == before
    # Compaction purges first; with nothing to purge it commits nothing.
    assert raw_dump(path) == before
    for copy in (path, backup):
        with Store.open(copy) as store:
            assert store.check().ok
            assert len(store.query(signature=same)) == 2000


def test_compact_and_rebuild_refuse_a_read_only_store(store: Store) -> None:
    path = store.path
    store.close()
    with Store.open(path, read_only=True) as reader:
        with pytest.raises(ReadOnlyError):
            reader.compact()
        with pytest.raises(ReadOnlyError):
            reader.rebuild(threshold=0.8)


_CHILD = """
import sys
from neardup_store.store import Store
from neardup_store.errors import StoreBusyError
path, store = sys.argv[1], None
for line in sys.stdin:
    command, *args = line.split()
    if command == "open":
        store = Store.open(path)
        reply = "opened"
    elif command == "add":
        store.add(args[0], " ".join(args[1:]))
        reply = "added"
    elif command == "compact":
        try:
            store.compact()
            reply = "compacted"
        except StoreBusyError:
            reply = "busy"
    elif command == "close":
        store.close()
        reply = "closed"
    else:
        break
    print(reply, flush=True)
"""


def test_compact_and_rebuild_refuse_while_another_process_has_the_store(
    store: Store, corpus: DemoCorpus
) -> None:
    child = LineDrivenProcess(_CHILD, str(store.path), timeout=10)
    try:
        assert child("open") == "opened"
        assert child("add from-child a document the other process committed") == "added"
        size = (store.path / "data.mdb").stat().st_size
        with pytest.raises(StoreBusyError) as caught:
            store.compact()
        assert caught.value.operation == "compact"
        with pytest.raises(StoreBusyError):
            store.rebuild(threshold=0.8)
        assert store.threshold == THRESHOLD and (store.path / "data.mdb").stat().st_size == size
        # The failed upgrades kept this process's shared lock: the child is refused too.
        assert child("compact") == "busy"
        assert child("close") == "closed"

        assert store.compact().bytes_after > 0
        assert "from-child" in store and store.check().ok

        # Compaction restored the shared lock: a process opening now is refused in turn.
        assert child("open") == "opened"
        assert child("compact") == "busy"
        assert store.query(corpus.documents["doc-0004"])[0].key == "doc-0004"
    finally:
        child.stop()


# -- other threads of this process ------------------------------------------------------------


@contextmanager
def _transaction_in_another_thread(store: Store, kind: str) -> Iterator[list[str]]:
    """Another thread holds a read or write transaction open for the block, then ends it
    (a write adds ``from-thread``); yields what it reports: ``ok`` or its error, as text
    (an error object kept alive once hung ``env.close()``)."""
    inside, release, outcome = threading.Event(), threading.Event(), []

    def hold() -> None:
        try:
            if kind == "read":
                with store.read() as txn:
                    inside.set()
                    release.wait(timeout=5)  # bounded: a compaction that does not refuse
                    assert txn.get("doc-0001") is not None
            else:
                with store.write() as txn:
                    txn.add("from-thread", "a document another thread adds")
                    inside.set()
                    release.wait(timeout=5)
            outcome.append("ok")
        except Exception as err:
            outcome.append(f"{type(err).__module__}.{type(err).__name__}: {err}")

    thread = threading.Thread(target=hold)
    thread.start()
    assert inside.wait(timeout=10)
    try:
        yield outcome
    finally:
        release.set()
        thread.join(timeout=30)
        assert not thread.is_alive()


@pytest.mark.parametrize("kind", ["read", "write"])
def test_compact_and_rebuild_refuse_while_another_thread_has_a_transaction_open(
    store: Store, kind: str
) -> None:
    """Closing the environment under it gave that thread a raw LMDB error and lost its
    write (or hung compact in ``env.close()``)."""
    with _transaction_in_another_thread(store, kind) as outcome:
        with pytest.raises(StoreBusyError, match="other threads of this process"):
            store.compact()
        with pytest.raises(StoreBusyError, match="other threads of this process"):
            store.rebuild(threshold=0.8)
    assert outcome == ["ok"] and store.threshold == THRESHOLD
    assert ("from-thread" in store) == (kind == "write") and store.check().ok
    assert store.compact().bytes_after > 0  # once the thread is done


@pytest.mark.parametrize("kind", ["read", "write"])
def test_compact_and_rebuild_refuse_inside_a_transaction_of_their_own_thread(
    store: Store, kind: str
) -> None:
    """The block goes on and (a write) commits; compacting inside it lost its writes."""
    opened = store.read() if kind == "read" else store.write()
    with opened as txn:
        if kind == "write":
            txn.add("in-the-block", "a document added in the caller's own block")
        with pytest.raises(StoreBusyError, match="inside a transaction of this thread"):
            store.compact()
        with pytest.raises(StoreBusyError, match="inside a transaction of this thread"):
            store.rebuild(threshold=0.8)
        assert txn.get("doc-0001") is not None
    assert ("in-the-block" in store) == (kind == "write")
    assert store.threshold == THRESHOLD and store.check().ok


@pytest.mark.parametrize("kind", ["read", "write"])
def test_a_transaction_another_thread_begins_during_compaction_waits_for_the_new_file(
    store: Store, kind: str
) -> None:
    """It begins on the compacted environment, not on the one being swapped out."""
    seen: list[Any] = []

    def transact() -> None:
        try:
            with store.read() if kind == "read" else store.write() as txn:
                seen.append(store._env)
                time.sleep(0.2)  # still open when a compaction that let it in swaps
                seen.append(txn.get("doc-0001"))
        except Exception as err:
            seen.append(f"{type(err).__module__}.{type(err).__name__}: {err}")

    thread = threading.Thread(target=transact)

    def progress(done: int) -> None:
        if not thread.is_alive() and not seen:
            thread.start()
            time.sleep(0.1)  # let it reach the transaction's begin

    expected = store.get("doc-0001")
    store.compact(progress=progress)
    thread.join(timeout=30)
    assert seen == [store._env, expected]


# -- rebuild --------------------------------------------------------------------------------


@pytest.mark.parametrize(("before", "after"), [((4, 4), (8, 4)), ((8, 4), (4, 8))])
def test_a_batch_banded_before_a_rebuild_is_written_with_the_new_banding(
    tmp_path: Path, before: tuple[int, int], after: tuple[int, int]
) -> None:
    """Store.add_many signs and bands each batch before its transaction begins; a
    rebuild() of another thread in between changed the banding, and the batch was
    written with the old keys: a raw IndexError (more bands), or entries no query
    through the tables finds (review 48). Here the batch is prepared as add_many
    prepares it, then the store is rebuilt, then the batch is written."""
    texts = [(f"k{i}", f"document {i} with words {i * 7} and {i % 13} " * 3) for i in range(40)]
    bands, rows = before
    with Store.open(tmp_path / "s", create=True, num_perm=32, bands=bands, rows=rows) as store:
        store.add_many(texts[:20])
        prepared = store._prepared(texts[20:], None)
        store.rebuild(bands=after[0], rows=after[1])
        with store.write() as txn:
            assert txn._add_prepared(prepared) == 20
        assert store.check().ok
        for key, text in texts:
            assert key in [match.key for match in store.query(text)]  # through the tables


def test_rebuild_with_a_new_threshold(store: Store, corpus: DemoCorpus) -> None:
    before = store.clusters()

    report = store.rebuild(threshold=0.8)

    assert report.generation == 1 and report.documents == len(corpus.documents) + 1
    assert report.old_params.threshold == THRESHOLD and report.new_params.threshold == 0.8
    assert store.banding == choose_params(0.8, store.config.num_perm) != report.old_params.banding
    assert store.check().ok
    sigs = np.stack([store.get(k).signature for k in corpus.documents])
    keys = list(corpus.documents)
    groups = duplicate_groups(sigs, store.banding, 0.8, store.config.seed)
    after = store.clusters()
    assert after == [[keys[i] for i in g] for g in groups]
    assert all(any(set(a) <= set(b) for b in before) for a in after)  # stricter: subsets
    for pair in store.pairs():  # every duplicate is still found by a query
        assert pair.second in {m.key for m in store.query(corpus.documents[str(pair.first)])}
    store.close()
    with Store.open(store.path) as reopened:
        assert reopened.params == report.new_params and reopened.stats().generation == 1
    with raw_env(store.path) as (env, dbs), env.begin() as txn:  # never with a Store open
        names = [bytes(k) for k, _ in txn.cursor()]
        assert not [n for n in names if n.startswith(b"band.0.")]
        assert len([n for n in names if n.startswith(b"band.1.")]) == store.banding.bands
        # The rewritten tables follow the format: big-endian band key and id, kept and
        # split as the current format says.
        doc_id = bytes(txn.get(b"sdoc-0004", db=dbs[codec.KEYS_DB]))
        signature = codec.decode_signature(txn.get(doc_id, db=dbs[codec.DOCS_DB]))
        expected = band_keys(signature, store.banding, store.config.seed)[0]
        for band, value in enumerate(expected):
            with txn.cursor(db=dbs[codec.band_table_name(1, band)]) as cursor:
                assert cursor.set_key_dup(*band_table_entry(int(value).to_bytes(8, "big"), doc_id))


def test_rebuild_to_many_more_bands_reopens_the_environment(
    store: Store, corpus: DemoCorpus
) -> None:
    answers = _answers(store, corpus)
    store.rebuild(bands=42, rows=3)  # more tables than the environment was opened for
    assert store.banding == LSHParams(42, 3) and store.threshold == THRESHOLD
    assert store.check().ok
    found = _answers(store, corpus)
    for old, new in zip(answers, found, strict=True):  # more bands: at least the same matches
        assert {m.key for m in old} <= {m.key for m in new}
    store.rebuild(bands=4, rows=8)
    assert store.check().ok and store.stats().generation == 2


def test_rebuild_that_fills_the_map_grows_it_and_redoes_the_transaction(
    store: Store, corpus: DemoCorpus
) -> None:
    env = store._env
    assert env is not None
    # Leave just over a quarter of the map free: the write does not grow it up front, and
    # the new band tables (written before the old pages can be reused) do not fit.
    env.set_mapsize((int(store._used_bytes() / 0.74) // 4096 + 1) * 4096)
    size = env.info()["map_size"]
    store.rebuild(bands=42, rows=3)  # also reopens the environment, for more tables
    assert store._env is not None and store._env.info()["map_size"] > size
    assert store.banding == LSHParams(42, 3) and store.check().ok
    assert store.query(corpus.documents["doc-0004"])[0].key == "doc-0004"


def test_rebuild_rejects_bad_banding_and_changes_nothing(store: Store) -> None:
    with pytest.raises(InvalidParameterError):
        store.rebuild(bands=10)
    with pytest.raises(InvalidParameterError):
        store.rebuild(bands=30, rows=10)  # 300 values > num_perm 256
    with pytest.raises(InvalidParameterError):
        store.rebuild(threshold=0.0)
    assert store.params.threshold == THRESHOLD and store.stats().generation == 0


def test_rebuild_stops_on_a_corrupt_record_and_leaves_the_store_usable(
    store: Store, corpus: DemoCorpus
) -> None:
    path = store.path
    store.close()
    _flipped_byte(path)
    with Store.open(path) as damaged:
        params = damaged.params
        with pytest.raises(CorruptRecordError):
            damaged.rebuild(threshold=0.8)
        assert damaged.params == params and damaged.stats().generation == 0
        assert damaged.query(corpus.documents["doc-0004"])[0].key == "doc-0004"
        assert damaged.check().kinds() == {"corrupt-record"}


_REBUILT = np.random.default_rng(31).integers(0, 2**32, size=(200, 32), dtype=np.uint32)


def _store_to_rebuild(path: Path) -> Store:
    store = Store.open(path, create=True, num_perm=32, bands=8, rows=4)
    store.add_signatures([(f"k{i}", sig) for i, sig in enumerate(_REBUILT)])
    return store


def _interrupting_at(point: str) -> Callable[[str], None]:
    """A fault checkpoint that raises one Ctrl-C at ``point``, where a SIGINT that came
    while the code before it ran is raised."""
    real, armed = _faults.checkpoint, [True]

    def checkpoint(name: str) -> None:
        if name == point and armed[0]:
            armed[0] = False
            raise KeyboardInterrupt
        real(name)

    return checkpoint


def test_a_ctrl_c_as_rebuild_commits_keeps_the_new_banding_and_the_cli_exits_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C during LMDB's commit of a rebuild comes out once the commit has returned
    (the after-commit point). rebuild then re-attached the old band tables, which the
    commit had dropped: a raw lmdb.NotFoundError hid the Ctrl-C, the CLI printed a
    traceback and exited 1, and the Store object failed every query after (review 40)."""
    path = tmp_path / "s"
    with _store_to_rebuild(path) as store:
        monkeypatch.setattr(_faults, "checkpoint", _interrupting_at("after-commit"))
        with pytest.raises(KeyboardInterrupt) as stopped:
            store.rebuild(bands=4, rows=8)
        assert stopped.value.transaction_committed is True  # type: ignore[attr-defined]
        assert store.banding == LSHParams(4, 8) and store.stats().generation == 1
        assert store.query(signature=_REBUILT[7])[0].key == "k7"
        assert store.check().ok
    monkeypatch.setattr(_faults, "checkpoint", _interrupting_at("after-commit"))
    result = CliRunner().invoke(cli, ["rebuild", str(path), "--bands", "16", "--rows", "2"])
    assert result.exit_code == 130, result.output
    assert result.stderr.splitlines() == [
        "interrupted",
        "the write block had committed: its changes are stored",
    ]
    with Store.open(path) as reopened:
        assert reopened.banding == LSHParams(16, 2) and reopened.check().ok


@pytest.mark.parametrize("at", range(28))  # every call from the write's end to its return
def test_a_ctrl_c_anywhere_in_the_end_of_rebuilds_write_leaves_the_store_on_what_is_stored(
    tmp_path: Path, at: int
) -> None:
    """A Ctrl-C raised at each Python call from the start of the rebuild's commit until
    its write block lets go of the transaction (placed by a trace hook where a SIGINT is
    raised): the Store object uses the banding that is stored and answers queries, and
    the Ctrl-C says whether it committed. Those after the commit, marked or not, ended in
    a raw lmdb.NotFoundError; those as the commit began, in a wait for the write lock
    this thread held (review 40)."""
    path = tmp_path / "s"
    with _store_to_rebuild(path) as store:
        # Up to the block's end; uncounting the transaction after it is not rebuild's.
        stopped, calls = interrupted_at_call(
            at,
            lambda: store.rebuild(bands=4, rows=8),
            lambda: getattr(store._thread_state, "writing", False),
        )
        assert stopped is not None or calls <= at  # raised, unless fewer calls came
        stored = store.stats().generation == 1
        if stopped is not None:
            assert getattr(stopped, "transaction_committed", False) is stored
        assert store.banding == (LSHParams(4, 8) if stored else LSHParams(8, 4))
        assert store.query(signature=_REBUILT[7])[0].key == "k7"
        assert store.check().ok
        banding = store.banding
    with Store.open(path) as reopened:
        assert reopened.banding == banding


# -- export and import ----------------------------------------------------------------------


def _export(store: Store) -> bytes:
    out = io.BytesIO()
    assert store.export(out) == len(store)
    return out.getvalue()


def test_export_import_round_trip_into_a_store_with_other_banding(
    store: Store, tmp_path: Path, corpus: DemoCorpus
) -> None:
    data = _export(store)
    with Store.open(tmp_path / "other", create=True, threshold=0.85) as other:
        assert other.banding != store.banding
        assert other.import_(io.BytesIO(data), batch_size=64) == len(store)
        assert _contents(other) == _contents(store)
        assert list(other) == list(store)  # insertion order kept
        assert other.check().ok
        with pytest.raises(DuplicateKeyError):
            other.import_(io.BytesIO(data))
        assert other.import_(io.BytesIO(data), replace=True) == len(store)


def test_create_from_export_gives_equal_contents_and_answers(
    store: Store, tmp_path: Path, corpus: DemoCorpus
) -> None:
    data = _export(store)
    with Store.create_from_export(tmp_path / "copy", io.BytesIO(data)) as copy:
        assert copy.params == store.params
        assert _contents(copy) == _contents(store)
        assert _answers(copy, corpus) == _answers(store, corpus)
    with pytest.raises(InvalidParameterError):
        Store.create_from_export(store.path, io.BytesIO(data))


@pytest.mark.parametrize("directory_existed", [False, True])
def test_a_failed_create_from_export_leaves_the_path_as_it_was(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, directory_existed: bool
) -> None:
    """A stream that breaks after batches were committed: the store made for it goes, so
    a retry with the whole stream can create it."""
    from neardup_store import store as store_module

    monkeypatch.setattr(store_module, "MIN_TRANSACTION", 20)
    data = _export(store)
    target = tmp_path / "new" / "nested" / "copy"  # parents the call makes go too
    if directory_existed:
        target.mkdir(parents=True)
    with pytest.raises(InvalidStreamError, match="ends inside"):
        Store.create_from_export(target, io.BytesIO(data[: len(data) * 3 // 4]))
    assert target.exists() == (tmp_path / "new").exists() == directory_existed
    assert not directory_existed or list(target.iterdir()) == []
    with Store.create_from_export(target, io.BytesIO(data)) as copy:
        assert _contents(copy) == _contents(store)


def test_imports_commit_at_the_transaction_size_by_default(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from neardup_store import store as store_module

    monkeypatch.setattr(store_module, "MIN_TRANSACTION", 50)
    data, total = _export(store), len(store)
    commits: list[int] = []
    with Store.create_from_export(tmp_path / "copy", io.BytesIO(data), progress=commits.append):
        pass
    # 50 at a time until 500 are stored, then a tenth of those stored.
    expected, stored = [], 0
    while stored < total:
        stored = min(total, stored + max(50, stored // 10))
        expected.append(stored)
    assert commits == expected and len(expected) > 2
    with Store.open(tmp_path / "other", create=True) as other:
        with pytest.raises(InvalidParameterError, match="auto"):
            other.import_(io.BytesIO(data), batch_size=0)
        assert len(other) == 0
    with pytest.raises(InvalidParameterError, match="auto"):
        Store.create_from_export(tmp_path / "third", io.BytesIO(data), batch_size="all")
    assert not (tmp_path / "third").exists()


def test_import_refuses_another_signature_configuration(store: Store, tmp_path: Path) -> None:
    data = _export(store)
    with Store.open(tmp_path / "small", create=True, num_perm=64, seed=9) as small:
        with pytest.raises(InvalidStreamError) as caught:
            small.import_(io.BytesIO(data))
        assert "num_perm: store has 64, stream has 256" in str(caught.value)
        assert "seed: store has 9, stream has 1" in str(caught.value)
        assert len(small) == 0


def _header(store: Store) -> bytes:
    banding = {"bands": store.banding.bands, "rows": store.banding.rows, "threshold": 0.5}
    return codec.export_header(store.config.to_dict(), banding, "0")


def _record(key: Any, signature: bytes, metadata: Any = None) -> bytes:
    return codec.export_item(key, signature, metadata)


BAD_STREAMS: dict[str, Callable[[Store, bytes], bytes]] = {
    "empty": lambda store, good: b"",
    "not msgpack": lambda store, good: b"\xc1\xc1\xc1",
    "not an export": lambda store, good: msgpack.packb({"format": "something-else"}),
    "future version": lambda store, good: msgpack.packb(
        {"format": codec.EXPORT_FORMAT, "version": 99, "config": {}, "banding": {}}
    ),
    "truncated": lambda store, good: good[:-5],
    "short signature": lambda store, good: _header(store) + _record("k", b"\x00" * 12),
    "record not an array": lambda store, good: _header(store) + msgpack.packb({"k": 1}),
    "empty key": lambda store, good: _header(store) + _record("", b"\x00" * 512),
    "integer key": lambda store, good: _header(store) + _record(7, b"\x00" * 512),
}


@pytest.mark.parametrize("name", list(BAD_STREAMS))
def test_bad_streams_raise_and_import_nothing(store: Store, tmp_path: Path, name: str) -> None:
    stream = BAD_STREAMS[name](store, _export(store))
    with Store.open(tmp_path / "target", create=True, threshold=THRESHOLD) as target:
        with pytest.raises(InvalidStreamError):
            target.import_(io.BytesIO(stream))
        assert len(target) == 0 and target.stats().commit_counter == 0


def _with_record_added(export: bytes, documents: int, record: bytes) -> bytes:
    """An export of ``documents`` records with ``record`` added last (before the end
    marker, which then counts it)."""
    body = export[: -len(codec.export_trailer(documents))]
    return body + record + codec.export_trailer(documents + 1)


def test_a_bad_record_keeps_earlier_batches_and_drops_its_own(store: Store, tmp_path: Path) -> None:
    good = _export(store)
    stream = _with_record_added(good, len(store), _record("bad", b"\x00" * 3))
    with Store.open(tmp_path / "target", create=True, threshold=THRESHOLD) as target:
        with pytest.raises(InvalidStreamError, match="record #302") as caught:
            target.import_(io.BytesIO(stream), batch_size=100)
        assert len(target) == 300  # three full batches; the fourth held the bad record
        assert caught.value.committed == 300  # type: ignore[attr-defined]
        assert "committed the first 300 items" in "".join(caught.value.__notes__)
        # Importing the good stream again with replace goes over what was committed.
        assert target.import_(io.BytesIO(good), replace=True) == len(store)
        assert _contents(target) == _contents(store)


@pytest.mark.parametrize("entry", [b"xyz", bytes(48)])
def test_backup_and_compact_leave_out_a_main_table_entry_that_is_not_a_table(
    tmp_path: Path, entry: bytes
) -> None:
    """Such an entry (damage: this package never writes one) made backup and compact fail
    with a raw struct.error or lmdb.IncompatibleError, so the backup that check's advice
    asks for could not be taken (a review's finding). The copies leave it out."""
    path = tmp_path / "s.ndx"
    with Store.open(path, create=True, num_perm=32) as store:
        store.add_many([(f"k{i}", f"document {i} alpha beta gamma") for i in range(100)])
        expected = _contents(store)
    env = lmdb.open(str(path), max_dbs=80)
    with env.begin(write=True) as txn:
        txn.put(b"zz-plain", entry)
    env.close()
    with Store.open(path) as store:
        assert not store.check().ok
        store.backup(tmp_path / "backup.ndx")
        store.compact()
        assert store.check().ok and _contents(store) == expected
    with Store.open(tmp_path / "backup.ndx") as copy:
        assert copy.check().ok and _contents(copy) == expected


def test_a_loop_of_links_as_an_export_or_backup_path_is_no_raw_error(
    store: Store, tmp_path: Path
) -> None:
    """Path.resolve raised a raw RuntimeError on a loop of links (review 25): the export
    replaces the link with its file, as over any link; the backup cannot go there."""
    first, second = tmp_path / "loop-1", tmp_path / "loop-2"
    first.symlink_to(second)
    second.symlink_to(first)
    with pytest.raises(OutputWriteError):
        store.backup(second)
    assert store.export_file(first) == len(store)
    assert first.is_file() and not first.is_symlink()


def test_export_file_appears_whole_or_not_at_all(store: Store, tmp_path: Path) -> None:
    out = tmp_path / "exports" / "corpus.export"
    out.parent.mkdir()
    assert store.export_file(out) == len(store)
    assert out.read_bytes() == _export(store)

    def interrupt(done: int) -> None:
        raise KeyboardInterrupt

    other = out.with_name("other.export")
    with pytest.raises(KeyboardInterrupt):
        store.export_file(other, progress=interrupt)
    assert sorted(p.name for p in out.parent.iterdir()) == ["corpus.export"]
    with pytest.raises(InvalidParameterError, match="outside the store"):
        store.export_file(store.path / "data.mdb")
    with pytest.raises(InvalidParameterError, match="not a directory"):
        store.export_file(out.parent)


_HOLD_LOCK = """
import fcntl, sys, time
with open(sys.argv[1], "wb") as held:
    fcntl.flock(held.fileno(), fcntl.LOCK_EX)
    print("locked", flush=True)
    time.sleep(60)
"""
_KILLED_EXPORT = """
import os, signal, sys
from neardup_store import Store
with Store.open(sys.argv[1], read_only=True) as store:
    store.export_file(sys.argv[2], progress=lambda done: os.kill(os.getpid(), signal.SIGKILL))
"""


def test_an_export_killed_part_way_leaves_a_file_the_next_export_deletes(
    store: Store, tmp_path: Path
) -> None:
    """A killed export's temporary file stayed for good beside the target (a review's
    finding): the next export to that target deletes it. A live export's stays."""
    out = tmp_path / "exports" / "corpus.export"
    out.parent.mkdir()
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_EXPORT, str(store.path), str(out)], timeout=120
    )
    assert killed.returncode == -signal.SIGKILL
    (left,) = out.parent.iterdir()
    assert left.name.startswith(".corpus.export.partial-") and not out.exists()
    live = out.with_name(f".corpus.export.partial-{os.getppid()}")  # pytest's parent: alive
    live.write_bytes(b"")
    # An export whose process this one cannot see (another PID namespace, another host on
    # a shared directory) holds the lock on its file: it was deleted under it (a review's
    # finding on the fix).
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    unseen = out.with_name(f".corpus.export.partial-{gone.stdout.strip()}")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(unseen)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    try:
        assert store.export_file(out) == len(store)
        names = sorted(p.name for p in out.parent.iterdir())
        assert names == sorted([live.name, unseen.name, "corpus.export"])
    finally:
        holder.kill()
        holder.wait()


def test_an_export_cut_short_between_records_is_refused_and_versions_1_and_2_still_import(
    store: Store, tmp_path: Path
) -> None:
    """Records are written whole, so an export that failed or was interrupted between two
    of them decoded as a complete, shorter export and imported without a word; version 2
    on ends with a marker counting the records. Streams of the earlier versions (1: no
    marker; 2: no checksums) still import."""
    good = _export(store)
    unpacker = msgpack.Unpacker(io.BytesIO(good), raw=False)
    ends = [unpacker.tell() for _ in unpacker]  # after the header, each record, the marker
    assert len(ends) == len(store) + 2
    with Store.open(tmp_path / "target", create=True, threshold=THRESHOLD) as target:
        with pytest.raises(InvalidStreamError, match="cut short") as caught:
            target.import_(io.BytesIO(good[: ends[150]]), batch_size=100)
        assert len(target) == caught.value.committed == 100  # type: ignore[attr-defined]
    for version in (1, 2):
        old = older_export(good, version)
        with Store.open(tmp_path / f"v{version}", create=True, threshold=THRESHOLD) as target:
            assert target.import_(io.BytesIO(old)) == len(store)
            assert _contents(target) == _contents(store)
        with pytest.raises(InvalidStreamError, match="cut short"):
            Store.create_from_export(tmp_path / f"cut{version}", io.BytesIO(old[:-30]))


def test_a_failed_create_from_export_deletes_its_store_and_says_nothing_is_left(
    store: Store, tmp_path: Path
) -> None:
    stream = _with_record_added(_export(store), len(store), _record("bad", b"\x00" * 3))
    with pytest.raises(InvalidStreamError, match="record #302") as caught:
        Store.create_from_export(tmp_path / "copy", io.BytesIO(stream), batch_size=100)
    assert not (tmp_path / "copy").exists()
    assert caught.value.committed == 0  # type: ignore[attr-defined]
    assert caught.value.__notes__ == [
        "the store this call created was deleted: nothing of it is left"
    ]

    class Interrupted(io.BytesIO):
        """A Ctrl-C while the third batch is read, two having committed."""

        def read1(self, size: int = -1) -> bytes:
            if self.tell() > len(self.getbuffer()) * 2 // 3:
                raise KeyboardInterrupt
            return super().read1(1024)  # in small reads, as from a pipe

    with pytest.raises(KeyboardInterrupt) as stopped:
        Store.create_from_export(tmp_path / "copy", Interrupted(_export(store)), batch_size=100)
    assert not (tmp_path / "copy").exists()
    assert stopped.value.committed == 0  # type: ignore[attr-defined]
    assert stopped.value.__notes__ == [  # not 'resume from item #200' of a deleted store
        "the store this call created was deleted: nothing of it is left"
    ]


# -- backup ---------------------------------------------------------------------------------


def test_backup_is_a_hot_consistent_copy(store: Store, tmp_path: Path, corpus: DemoCorpus) -> None:
    with store.write() as txn:  # a writer in progress is not part of the copy
        txn.add("uncommitted-yet", "written before the backup, committed after it")
        report = maintenance.backup(store, tmp_path / "backup")
    assert report.documents == len(corpus.documents) + 1
    with Store.open(tmp_path / "backup", read_only=True) as copy:
        assert copy.params == store.params and copy.check().ok
        assert "uncommitted-yet" not in copy and "uncommitted-yet" in store
        expected = _contents(store)
        del expected["uncommitted-yet"]
        assert _contents(copy) == expected
        assert _answers(copy, corpus) == _answers(store, corpus)
        assert report.file_bytes == (tmp_path / "backup" / "data.mdb").stat().st_size
    with pytest.raises(InvalidParameterError):
        store.backup(tmp_path / "backup")


def test_backup_goes_only_to_a_new_or_empty_directory_outside_the_store(
    store: Store, tmp_path: Path
) -> None:
    """Not beside someone's files, not inside the live store, not where no directory can
    be made; each refused before anything is written."""
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("important")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for target, expected in [
        (occupied, "a new or empty directory"),
        (store.path / "inner", "outside the store"),
        (blocker / "sub", "can be made"),
    ]:
        with pytest.raises(InvalidParameterError, match=expected):
            store.backup(target)
    assert sorted(p.name for p in occupied.iterdir()) == ["notes.txt"]
    assert not (store.path / "inner").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert store.backup(empty).documents == len(store)


_BACKUP_CHILD = """
import sys, time
from neardup_store import maintenance
from neardup_store.store import Store
path, target, stop_at = sys.argv[1:]
maintenance._COPY_CHUNK = 97  # many commits, as a large store's copy has
real_fsync, synced = maintenance._fsync, []

def pause(point):
    print(point, flush=True)
    time.sleep(3600)  # until the parent's SIGKILL

def progress(done):
    if stop_at == "copying" and done > len(store) // 2:
        pause("copying")

def fsync_then_maybe_pause(path):
    # backup() fsyncs the copied file, its directory (before the rename into place),
    # then the parent directory (after it).
    real_fsync(path)
    synced.append(path)
    if {2: "synced", 3: "renamed"}.get(len(synced)) == stop_at:
        pause(stop_at)

maintenance._fsync = fsync_then_maybe_pause
store = Store.open(path)
store.backup(target, progress=progress)
print("finished", flush=True)
"""


def _leftovers(target: Path) -> list[str]:
    return sorted(p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}."))


@pytest.mark.parametrize("point", ["copying", "synced", "renamed"])
def test_backup_killed_part_way_leaves_no_store_or_a_whole_one(
    store: Store, tmp_path: Path, point: str
) -> None:
    """A backup process SIGKILLed mid-copy (after some of its commits), with the copy
    synced but not renamed into place, or just after the rename. A killed copy written
    in place opened as a store with band orphans, or refused the retry."""
    target = tmp_path / "backups" / "nightly"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen(
        [sys.executable, "-c", _BACKUP_CHILD, str(store.path), str(target), point],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == point
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    if point == "renamed":
        assert _leftovers(target) == []
        with Store.open(target, read_only=True) as copy:
            assert copy.check().ok and _contents(copy) == _contents(store)
        return
    assert not holds_store(target) and not target.exists()
    assert len(_leftovers(target)) == 1  # the killed backup's scratch directory
    report = store.backup(target)
    assert report.documents == len(store) and _leftovers(target) == []
    with Store.open(target, read_only=True) as copy:
        assert copy.check().ok and _contents(copy) == _contents(store)


_FULL_BACKUP_CHILD = """
import json, resource, signal, sys
from neardup_store.store import Store
path, target = sys.argv[1:]
store = Store.open(path)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
try:
    store.backup(target)
    print(json.dumps(["fitted"]))
except Exception as err:  # JSON: the path may hold a space (a TMPDIR with one)
    print(json.dumps([type(err).__name__, str(getattr(err, "path", None))]))
"""


def test_backup_past_the_file_size_limit_blames_the_backup_not_the_store(
    store: Store, tmp_path: Path
) -> None:
    """The source store is only read: a full disk (here a file-size limit) at the target
    is StoreFullError naming the target, and leaves nothing there."""
    target = tmp_path / "backup"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", _FULL_BACKUP_CHILD, str(store.path), str(target)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.stdout, done.stderr
    assert json.loads(done.stdout) == [StoreFullError.__name__, str(target)], done.stderr
    assert not target.exists() and _leftovers(target) == []
    assert store.backup(target).documents == len(store)  # without the limit


def test_backup_into_an_existing_empty_directory_or_a_link_to_one(
    store: Store, tmp_path: Path
) -> None:
    """A backup disk's mount point, or a link to an empty directory, cannot be replaced by
    a rename: the copy is built inside it and its data file renamed in (the previous
    fix's scratch directory beside the target failed on both, after writing the whole
    copy to the parent's disk). A killed backup's leftover inside is no obstacle."""
    disk = tmp_path / "disk"
    disk.mkdir()
    killed = disk / ".neardup-backup-killed"  # what a backup killed part-way leaves
    killed.mkdir()
    (killed / ".neardup-backup").touch()
    (killed / "data.mdb").write_bytes(b"half a copy")
    (disk / ".neardup-backup-early").mkdir()  # killed before its mark: empty
    link = tmp_path / "link"
    link.symlink_to(disk, target_is_directory=True)
    report = store.backup(link)
    assert sorted(p.name for p in disk.iterdir()) == ["data.mdb"]
    with Store.open(disk, read_only=True) as copy:
        assert len(copy) == report.documents == len(store) and copy.check().ok


def test_backup_leaves_directories_it_did_not_make_alone(store: Store, tmp_path: Path) -> None:
    """A directory named like a backup's scratch directory but not marked as one is the
    user's: the target is not empty, and nothing in it is deleted (the previous fix
    deleted any unlocked .backup-* directory; a review of a fix's finding)."""
    for name in (".backup-2024", ".neardup-backup-2024"):
        disk = tmp_path / name.strip(".")
        (disk / name).mkdir(parents=True)
        (disk / name / "photos.tar").write_bytes(b"irreplaceable")
        with pytest.raises(InvalidParameterError, match="empty directory"):
            store.backup(disk)
        assert (disk / name / "photos.tar").read_bytes() == b"irreplaceable"
