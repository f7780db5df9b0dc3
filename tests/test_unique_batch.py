"""Batched ``add_many_if_unique`` / ``add_signatures_if_unique`` (``WriteTxn._add_unique_batch``).

The batch finds stored near-duplicates with one batched query, the batch's own with an
in-memory index of its buckets, and writes the added documents in one multi-put. Its
answers must be exactly those of ``add_if_unique`` called once per document, in order:
the same results (matches and their order included) and the same store afterwards (the
same keys under the same ids). So each test builds two identical stores, feeds one the
documents one at a time and the other as a batch, and compares everything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_band_cache import (
    PARAMS,
    Sigs,
    band_lookups,
    bucket_mate,
    items,
    near_copies,
    random_sigs,
)
from test_format import rewrite_as_old_format

from neardup_store import codec
from neardup_store.errors import DuplicateKeyError, InvalidParameterError
from neardup_store.lsh import LSHParams
from neardup_store.store import Store
from neardup_store.txn import ReadTxn, UniqueResult, WriteTxn

Item = tuple[Any, ...]


def one_at_a_time(txn: WriteTxn, batch: list[Item], threshold: float | None) -> list[Any]:
    return [
        txn.add_if_unique(
            item[0], signature=item[1], metadata=item[2] if len(item) > 2 else None,
            threshold=threshold,
        )
        for item in batch
    ]  # fmt: skip


def contents(store: Store) -> list[tuple[Any, bytes, bytes, Any]]:
    """Every document as (key, id, signature bytes, metadata), in id order."""
    with store.read() as txn:
        rows, stored = [], txn.keys()
        for key in stored:
            found = txn._lookup(key)
            assert found is not None
            doc = txn.get(key)
            rows.append((key, bytes(found[0]), doc.signature.tobytes(), doc.metadata))
    return sorted(rows, key=lambda row: row[1])


def twin_stores(tmp_path: Path, stored: Sigs, version: int = codec.FORMAT_VERSION) -> list[Path]:
    """Two stores holding ``stored`` (keys ``s0``…), with ``s1``, ``s3``… removed, so
    that ids have gaps, in format ``version`` (from format 5 on, the removed documents'
    band entries await a purge: candidates the queries must skip)."""
    paths = []
    for name in ("one", "batch"):
        path = tmp_path / name
        with Store.open(path, create=True, **PARAMS) as store:
            store.add_signatures(items("s", stored))
            doomed = [f"s{i}" for i in range(1, len(stored), 2)][:20]
            store.remove_many(doomed)
            with store.read() as reader:
                assert reader.awaiting_purge() == len(doomed)
        if version != codec.FORMAT_VERSION:
            rewrite_as_old_format(path, version)
        paths.append(path)
    return paths


def chain(rng: np.random.Generator) -> Sigs:
    """x; y with 8 of x's values changed; z with 8 more of y's changed (others than x's):
    y is 0.94 like x and z 0.94 like y but 0.88 like x."""
    x = random_sigs(rng, 1)[0]
    y, z = x.copy(), x.copy()
    y[5:13] ^= 1
    z[5:13] ^= 1
    z[60:68] ^= 1
    return np.stack([x, y, z])


def mixed_batch(rng: np.random.Generator, stored: Sigs) -> list[Item]:
    """Near copies of stored documents (and of removed ones), near and exact copies of
    the batch's own earlier documents, chains, and new documents, some with metadata."""
    own = np.concatenate(
        [
            near_copies(rng, stored[:40]),  # odd ones near copies of removed documents
            random_sigs(rng, 30),
            *(chain(rng) for _ in range(5)),
            near_copies(rng, stored[:5], 0.0, 0.0),  # exact copies of stored ones
        ]
    )
    own = own[rng.permutation(len(own))]
    sigs = np.concatenate([own, near_copies(rng, own[:30]), own[30:35]])
    return [
        (f"n{i}", sig, {"i": i}) if i % 3 == 0 else (f"n{i}", sig) for i, sig in enumerate(sigs)
    ]


def assert_same_as_one_at_a_time(
    paths: list[Path], batch: list[Item], threshold: float | None = None, **open_options: Any
) -> list[UniqueResult]:
    with Store.open(paths[0], **open_options) as store, store.write() as txn:
        expected = one_at_a_time(txn, batch, threshold)
    with Store.open(paths[1], **open_options) as store:
        got = store.add_signatures_if_unique(batch, threshold=threshold)
    assert got == expected
    with Store.open(paths[0]) as one, Store.open(paths[1]) as batched:
        assert contents(batched) == contents(one)
    return got  # type: ignore[no-any-return]


@pytest.mark.parametrize("band_cache", [False, True])
def test_a_batch_decides_every_document_as_one_call_per_document_would(
    tmp_path: Path, band_cache: bool
) -> None:
    rng = np.random.default_rng(1)
    stored = random_sigs(rng, 300)
    paths = twin_stores(tmp_path, stored)
    batch = mixed_batch(rng, stored)
    got = assert_same_as_one_at_a_time(paths, batch, band_cache=band_cache)
    added = [r.key for r in got if r.added]
    refused = [r for r in got if not r.added]
    # Every kind of outcome happened: stored and in-batch matches, and plenty added.
    assert 40 <= len(added) < len(batch) and len(refused) >= 40
    assert any(m.key.startswith("s") for r in refused for m in r.matches)
    assert any(m.key.startswith("n") for r in refused for m in r.matches)
    assert all(r.matches for r in refused) and all(not r.matches for r in got if r.added)


def test_a_document_is_matched_only_against_earlier_ones_that_were_added(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(2)
    paths = twin_stores(tmp_path, random_sigs(rng, 50))
    x, y, z = chain(rng)
    batch: list[Item] = [("x", x), ("y", y), ("z", z)]
    # At 0.9: y (0.94 like x) is refused, and z (0.88 like x) is added, though it is
    # 0.94 like y, because y never was.
    got = assert_same_as_one_at_a_time(paths, batch, threshold=0.9)
    assert [r.added for r in got] == [True, False, True]
    assert [(m.key, m.score) for m in got[1].matches] == [("x", 120 / 128)]


def test_keys_given_as_buffers_are_reported_as_bytes_the_caller_cannot_change(
    tmp_path: Path,
) -> None:
    """The results carried the caller's own bytearray: reused afterwards, a reported match
    named a key never stored (a review's finding)."""
    rng = np.random.default_rng(3)
    x, y, _ = chain(rng)
    buffer = bytearray(b"first")
    with Store.open(tmp_path / "s", create=True, **PARAMS) as store:
        first, second = store.add_signatures_if_unique([(buffer, x), (b"second", y)], threshold=0.9)
        alone = store.add_if_unique(bytearray(b"third"), signature=rng.integers(0, 2**32, 128))
        buffer[:] = b"XXXXX"
        assert type(first.key) is bytes and first.key == b"first" and first.added
        assert [m.key for m in second.matches] == [b"first"] and not second.added
        assert type(second.matches[0].key) is bytes
        assert type(alone.key) is bytes and alone.key == b"third"
        assert sorted(store) == [b"first", b"third"]


def test_matches_are_ordered_by_score_then_id_across_stored_and_batch_documents(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(3)
    base = random_sigs(rng, 1)[0]
    stored = random_sigs(rng, 30)
    stored[10] = base
    stored[12] = base
    stored[12][:3] ^= 1
    paths = twin_stores(tmp_path, stored)
    close = base.copy()
    close[100:103] ^= 1  # as like base as s12 is
    batch: list[Item] = [("fresh", random_sigs(rng, 1)[0]), ("close", close), ("q", base)]
    got = assert_same_as_one_at_a_time(paths, batch, threshold=0.5)
    # "close" is refused (s10 and s12 are stored), so "q" matches only stored documents.
    assert [r.added for r in got] == [True, False, False]
    assert [m.key for m in got[2].matches] == ["s10", "s12"]
    (tmp_path / "again").mkdir()
    paths = twin_stores(tmp_path / "again", stored[:10])
    batch = [("close", close), ("q", base), ("q2", stored[12])]
    got = assert_same_as_one_at_a_time(paths, batch, threshold=0.5)
    assert [r.added for r in got] == [True, False, False]
    assert [(m.key, m.score) for m in got[2].matches] == [("close", 122 / 128)]
    # A batch document ahead of a stored one when its score is higher.
    (tmp_path / "third").mkdir()
    stored = random_sigs(rng, 30)
    stored[0] = base
    stored[0][20:30] ^= 1  # 118/128 like base
    paths = twin_stores(tmp_path / "third", stored)
    nearer = base.copy()
    nearer[40:46] ^= 1  # 122/128 like base, 112/128 like s0
    got = assert_same_as_one_at_a_time(paths, [("nearer", nearer), ("q", base)], threshold=0.9)
    assert [r.added for r in got] == [True, False]
    assert [(m.key, m.score) for m in got[1].matches] == [
        ("nearer", 122 / 128),
        ("s0", 118 / 128),
    ]


def test_writes_earlier_in_the_transaction_are_seen_by_the_batch(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    stored = random_sigs(rng, 100)
    paths = twin_stores(tmp_path, stored)
    early = random_sigs(rng, 10)
    copies = near_copies(rng, np.concatenate([early, stored[:20]]), 0.02, 0.04)
    batch = [(f"n{i}", sig) for i, sig in enumerate(copies)]
    results = []
    for path, batched in zip(paths, (False, True), strict=True):
        with Store.open(path, band_cache=True) as store:
            store.query(signature=stored[0])  # the cache is built
            with store.write() as txn:
                txn.add_signatures(items("early", early))
                txn.remove_many([f"s{i}" for i in range(0, 20, 4)])
                with band_lookups() as lookups:
                    if batched:
                        results.append(txn.add_signatures_if_unique(batch))
                    else:
                        results.append(one_at_a_time(txn, batch, None))
                # After its own writes a transaction must ask the band tables.
                assert lookups[0] > 0
    assert results[0] == results[1]
    found = {m.key for r in results[1] for m in r.matches}
    assert {f"early{i}" for i in range(10)} <= found
    assert not found & {f"s{i}" for i in range(0, 20, 4)}
    with Store.open(paths[0]) as one, Store.open(paths[1]) as batched:
        assert contents(batched) == contents(one)


def test_a_transaction_that_has_not_written_asks_the_band_cache(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    stored = random_sigs(rng, 200)
    paths = twin_stores(tmp_path, stored)
    fresh = random_sigs(rng, 1)[0]
    copies = near_copies(rng, stored[:60:2], 0.02, 0.04)
    batch = [("fresh", fresh), *((f"n{i}", sig) for i, sig in enumerate(copies))]
    with Store.open(paths[1], band_cache=True) as store:
        store.query(signature=stored[0])
        store.add_signatures([("between", random_sigs(rng, 1)[0])])  # the cache lags
        with store.write() as txn:
            with band_lookups() as batch_lookups:
                got = txn.add_signatures_if_unique(batch)
            with band_lookups() as later_lookups:  # after the batch's writes
                single = txn.add_if_unique("again", signature=fresh)
        assert batch_lookups == [0] and later_lookups[0] > 0
        assert [r.added for r in got] == [True] + [False] * len(copies)
        assert [[m.key for m in r.matches] for r in got[1:]] == [[f"s{i}"] for i in range(0, 60, 2)]
        assert not single.added and [m.key for m in single.matches] == ["fresh"]
        # The cache caught up for the snapshot the write transaction began on, not for
        # its own: a later reader finds what that transaction added.
        with band_lookups() as lookups, store.read() as txn:
            assert [m.key for m in txn.query(signature=fresh)] == ["fresh"]
            assert [m.key for m in txn.query_many(signatures=np.stack([fresh, fresh]))[0]] == [
                "fresh"
            ]
        assert lookups == [0]


def test_the_single_add_if_unique_asks_the_band_cache_before_writing(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    stored = random_sigs(rng, 200)
    with Store.open(tmp_path / "s", create=True, band_cache=True, **PARAMS) as store:
        store.add_signatures(items("s", stored))
        copies = near_copies(rng, stored[:10])
        with band_lookups() as lookups:
            results = [store.add_if_unique(f"c{i}", signature=s) for i, s in enumerate(copies)]
            fresh = store.add_if_unique("fresh", signature=random_sigs(rng, 1)[0])
        assert lookups == [0]
        assert [[m.key for m in r.matches] for r in results] == [[f"s{i}"] for i in range(10)]
        assert fresh.added and "fresh" in store


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_every_format_gives_the_same_batch_answers(tmp_path: Path, version: int) -> None:
    rng = np.random.default_rng(10 + version)
    stored = random_sigs(rng, 200)
    paths = twin_stores(tmp_path, stored, version)
    got = assert_same_as_one_at_a_time(paths, mixed_batch(rng, stored), band_cache=True)
    assert sum(r.added for r in got) >= 40


@pytest.mark.parametrize(("version", "merged"), [(4, True), (3, False)])
def test_batch_documents_share_buckets_as_the_band_tables_would(
    tmp_path: Path, version: int, merged: bool
) -> None:
    """Format 4 keeps 5 bytes of a band key: two documents whose band 0 keys differ only
    after them share a bucket there, in the band tables and among a batch's documents."""
    rng = np.random.default_rng(20)
    sig = random_sigs(rng, 1)[0]
    sig[:2] = 3 << 30
    mate = bucket_mate(sig, LSHParams(PARAMS["bands"], PARAMS["rows"]))
    paths = twin_stores(tmp_path, random_sigs(rng, 50), version)
    got = assert_same_as_one_at_a_time(paths, [("sig", sig), ("mate", mate)])
    assert got[1].added is not merged
    assert [m.key for m in got[1].matches] == (["sig"] if merged else [])


def test_a_batch_that_outgrows_the_map_is_redone_with_the_same_answers(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    stored = random_sigs(rng, 40)
    paths = []
    for name in ("one", "batch"):
        with Store.open(tmp_path / name, create=True, map_size=256 * 1024, **PARAMS) as store:
            store.add_signatures(items("s", stored))
            assert store._env is not None
            small = int(store._env.info()["map_size"])
        paths.append(tmp_path / name)
    sigs = np.concatenate([near_copies(rng, stored), random_sigs(rng, 400)])
    batch = [(f"n{i}", sig, "m" * 2000) for i, sig in enumerate(sigs)]  # ~1 MiB of metadata
    got = assert_same_as_one_at_a_time(paths, batch)
    with Store.open(paths[1]) as store:
        assert store._env is not None and int(store._env.info()["map_size"]) > small
    assert sum(r.added for r in got) >= 400


def test_bad_batches_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    stored = random_sigs(rng, 20)
    with Store.open(tmp_path / "s", create=True, **PARAMS) as store:
        store.add_signatures(items("s", stored))
        before = contents(store)
        fresh = random_sigs(rng, 3)
        with pytest.raises(DuplicateKeyError):
            store.add_signatures_if_unique([("a", fresh[0]), ("s3", fresh[1])])
        with pytest.raises(DuplicateKeyError):
            store.add_signatures_if_unique([("a", fresh[0]), ("b", fresh[1]), ("a", fresh[2])])
        with pytest.raises(InvalidParameterError, match="signature"):
            store.add_signatures_if_unique([("a", fresh[0]), ("b", fresh[1][:64])])
        with pytest.raises(InvalidParameterError, match="threshold"):
            store.add_signatures_if_unique([("a", fresh[0])], threshold=1.5)
        assert contents(store) == before
        assert store.add_signatures_if_unique([]) == []
        assert store.add_many_if_unique([]) == []


def test_texts_in_a_batch_are_decided_as_one_at_a_time(tmp_path: Path) -> None:
    words = [f"word{i}" for i in range(400)]
    rng = np.random.default_rng(9)
    texts = [" ".join(rng.choice(words, 120)) for _ in range(30)]
    edited = [t.replace("word1 ", "WORD ", 1) for t in texts[:15]]
    batch = [(f"t{i}", t) for i, t in enumerate(texts + edited + texts[:5])]
    got = []
    for name in ("one", "batch"):
        with Store.open(tmp_path / name, create=True) as store:
            store.add_many(batch[:10])
            rest = [(f"x{k}", t) for k, t in batch]
            if name == "one":
                with store.write() as txn:
                    got.append([txn.add_if_unique(k, t) for k, t in rest])
            else:
                got.append(store.add_many_if_unique(rest))
    assert got[0] == got[1]
    assert sum(r.added for r in got[1]) == 20  # 30 texts, 10 of them stored already


def test_ingest_decides_a_repeated_key_after_its_earlier_occurrence(tmp_path: Path) -> None:
    from neardup_store.ingest import ingest

    words = [f"w{i}" for i in range(300)]
    rng = np.random.default_rng(11)
    a, b, c = (" ".join(rng.choice(words, 150)) for _ in range(3))
    with Store.open(tmp_path / "s", create=True) as store:
        store.add("a", a)
        batch = [
            ("b", a),  # refused: a near-duplicate of "a"
            ("b", b),  # the key is free still: added
            ("b", c),  # the key is taken now
            ("c", c),
            ("d", b),  # a near-duplicate of the batch's "b"
        ]
        report = ingest(store, batch, unique=True, batch_size=10)
        assert report.added == 2
        assert [(s.key, s.reason, s.matching_keys) for s in report.skipped] == [
            ("b", "near-duplicate", ["a"]),
            ("b", "key already in the store", []),
            ("d", "near-duplicate", ["b"]),
        ]
        assert sorted(store) == ["a", "b", "c"]
        assert [m.key for m in store.query(b)] == ["b"]


@pytest.mark.parametrize("band_cache", [False, True])
def test_batches_read_each_candidate_record_once(tmp_path: Path, band_cache: bool) -> None:
    """A batch query and a batched dedup read each candidate's record from the docs
    table once, for its signature and its key alike (through the B-tree path's
    ``_live_records``, which reads those not already read, or ``_record``; or the
    cache's presence check)."""
    rng = np.random.default_rng(21)
    stored = random_sigs(rng, 300)
    with Store.open(tmp_path / "s", create=True, band_cache=band_cache, **PARAMS) as store:
        store.add_signatures(items("s", stored))
        copies = near_copies(rng, stored[:50])
        queries = np.concatenate([copies, copies[:20]])  # candidates shared by two queries
        reads: list[bytes] = []
        original_get = ReadTxn._record
        original_live = ReadTxn._live_records
        original_cached = ReadTxn._cached_records

        def record(self: ReadTxn, doc_id: bytes) -> bytes:
            reads.append(doc_id)
            return original_get(self, doc_id)

        def live(
            self: ReadTxn, ids: Any, records: dict[bytes, bytes] | None = None
        ) -> list[tuple[bytes, bytes]]:
            ids = list(ids)
            reads.extend(i for i in ids if records is None or i not in records)
            return original_live(self, ids, records)

        def cached(self: ReadTxn, ids: Any) -> dict[bytes, bytes]:
            found = original_cached(self, ids)
            reads.extend(found)
            return found

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ReadTxn, "_record", record)
            patch.setattr(ReadTxn, "_live_records", live)
            patch.setattr(ReadTxn, "_cached_records", cached)
            answers = store.query_many(signatures=queries)
            assert [[m.key for m in found] for found in answers] == [
                [f"s{i}"] for i in [*range(50), *range(20)]
            ]
            assert sorted(reads) == sorted(set(reads)) and len(reads) == 50
            reads.clear()
            results = store.add_signatures_if_unique(items("c", queries))
            assert [[m.key for m in r.matches] for r in results] == [
                [f"s{i}"] for i in [*range(50), *range(20)]
            ]
            assert sorted(reads) == sorted(set(reads)) and len(reads) == 50
