"""The on-disk format, pinned byte for byte.

The expected bytes below were derived by hand from the spec in ``codec.py``'s docstring
(only the xxh64 checksums and the SHA-256 digest were computed with the reference hash
functions) and then hard-coded. If one of these tests fails, the format changed: bump
``FORMAT_VERSION`` and add a **format** line to CHANGELOG.md instead of editing the bytes.
"""

from __future__ import annotations

import datetime
import io
import pickle
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import numpy as np
import pytest
import xxhash
from harness import band_table_entry, kept_band_key, raw_digest, raw_dump

from neardup_store import codec
from neardup_store._version import __version__
from neardup_store.errors import (
    CorruptRecordError,
    CorruptStoreError,
    IdsExhaustedError,
    MetadataError,
)
from neardup_store.hashing import derive_keys
from neardup_store.lsh import LSHParams, band_keys
from neardup_store.store import Store

SIGNATURE_1 = np.array([1, 2, 0xFFFFFFFF, 0x12345678], dtype=np.uint32)
METADATA_1 = {"n": 1, "b": b"\x00"}
RECORD_1 = bytes.fromhex(
    "01"  # record version 1
    "03"  # flags: str key (bit 0) and metadata (bit 1)
    "0400"  # num_perm 4, uint16 LE
    "05000000"  # key length 5, uint32 LE
    "646f632d31"  # "doc-1"
    "01000000" "02000000" "ffffffff" "78563412"  # the signature, uint32 LE each
    "82" "a16e" "01" "a162" "c40100"  # msgpack {"n": 1, "b": bin b"\x00"}
    "9090d3df694c4a22"  # xxh64 (seed 0) of the bytes above, LE
)  # fmt: skip

SIGNATURE_2 = np.array([0, 7, 0x80000000, 0xDEADBEEF], dtype=np.uint32)
RECORD_2 = bytes.fromhex(
    "01"  # record version 1
    "00"  # flags: bytes key, no metadata
    "0400"  # num_perm 4
    "03000000"  # key length 3
    "00ff6b"  # b"\x00\xffk"
    "00000000" "07000000" "00000080" "efbeadde"  # the signature
    "c27ebfb05a97023d"  # xxh64 of the bytes above, LE
)  # fmt: skip


def reseal(body: bytes) -> bytes:
    """A record body with a valid checksum appended (to test checks past the checksum)."""
    return body + xxhash.xxh64_intdigest(body).to_bytes(8, "little")


def rewrite_sealed_meta(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``change`` to the sealed ``meta`` entries of the closed store at ``path``
    (decoded, by name) and seal them again: a store another release could have written."""
    env = lmdb.open(str(path), max_dbs=64)
    try:
        meta_db = env.open_db(codec.META_DB, create=False)
        with env.begin(write=True) as txn:
            sealed = {
                name: codec.unpack_meta(txn.get(name.encode(), db=meta_db))
                for name in codec.SEALED_META
            }
            change(sealed)
            for name, value in sealed.items():
                txn.put(name.encode(), codec.pack_meta(value), db=meta_db)
            raw = {name: bytes(txn.get(name.encode(), db=meta_db)) for name in codec.SEALED_META}
            txn.put(b"meta_checksum", codec.pack_meta(codec.meta_checksum(raw)), db=meta_db)
    finally:
        env.close()


# -- constants ---------------------------------------------------------------------------------


def test_format_constants() -> None:
    assert codec.FORMAT_NAME == "neardup_store" and codec.FORMAT_VERSION == 5
    assert codec.READABLE_FORMATS == (1, 2, 3, 4, 5)
    assert codec.REMOVED_DB == b"removed" and codec.LAZY_REMOVAL_FORMAT == 5
    assert codec.RECORD_VERSION == 1
    assert codec.EXPORT_FORMAT == "neardup_store-export" and codec.EXPORT_VERSION == 3
    assert codec.READABLE_EXPORT_VERSIONS == (1, 2, 3)
    assert (codec.META_DB, codec.DOCS_DB, codec.KEYS_DB) == (b"meta", b"docs", b"keys")
    assert codec.MAX_KEY_BYTES == 16 * 1024 and codec.INLINE_KEY_BYTES == 400
    assert codec.MAX_METADATA_BYTES == 64 * 1024
    assert codec.INLINE_KEY_BYTES + 1 <= 511  # an inline key index fits an LMDB key


# -- document records --------------------------------------------------------------------------


def test_encode_record_with_str_key_and_metadata() -> None:
    packed = codec.pack_metadata(METADATA_1)
    assert packed == bytes.fromhex("82a16e01a162c40100")
    assert codec.encode_record(b"doc-1", True, SIGNATURE_1, packed) == RECORD_1


def test_encode_record_with_bytes_key_without_metadata() -> None:
    assert codec.encode_record(b"\x00\xffk", False, SIGNATURE_2, None) == RECORD_2
    # Any integer dtype is written as uint32 LE.
    as_int64 = SIGNATURE_2.astype(np.int64)
    assert codec.encode_record(b"\x00\xffk", False, as_int64, None) == RECORD_2


def test_a_batch_of_records_encodes_each_to_its_pinned_bytes() -> None:
    """The batch writer's encoder: one conversion for every signature, the same bytes."""
    records = codec.encode_records(
        [b"doc-1", b"\x00\xffk"],
        [True, False],
        np.stack([SIGNATURE_1, SIGNATURE_2]),
        [codec.pack_metadata(METADATA_1), None],
    )
    assert records == [RECORD_1, RECORD_2]


def test_decode_pinned_records() -> None:
    first = codec.decode_record(RECORD_1, doc_id=0)
    assert first.key == "doc-1" and first.metadata == METADATA_1
    assert first.signature.dtype == np.uint32 and np.array_equal(first.signature, SIGNATURE_1)
    second = codec.decode_record(RECORD_2)
    assert second.key == b"\x00\xffk" and second.metadata is None
    assert np.array_equal(second.signature, SIGNATURE_2)
    assert np.array_equal(codec.decode_signature(RECORD_1), SIGNATURE_1)
    assert codec.record_key(RECORD_1) == (b"doc-1", True)
    assert codec.record_key(RECORD_2) == (b"\x00\xffk", False)


@pytest.mark.parametrize("position", range(len(RECORD_1)))
def test_any_flipped_byte_is_detected(position: int) -> None:
    damaged = bytearray(RECORD_1)
    damaged[position] ^= 0x20
    for decode in (codec.decode_record, codec.decode_signature, codec.record_key, _in_a_batch):
        with pytest.raises(CorruptRecordError) as raised:
            decode(bytes(damaged), 17)
        assert raised.value.doc_id == 17 and raised.value.reason == "checksum mismatch"


def _in_a_batch(record: bytes, doc_id: int) -> np.ndarray:
    """decode_signatures of ``record`` between two sound records."""
    pairs = [(codec.encode_id(1), RECORD_2), (codec.encode_id(doc_id), record)]
    return codec.decode_signatures([*pairs, (codec.encode_id(99), RECORD_1)], 4)


def test_a_batch_of_records_decodes_to_their_signatures() -> None:
    """Keys of different lengths, with and without metadata: the same signatures as one
    record at a time, as a writable uint32 matrix."""
    got = _in_a_batch(RECORD_1, 2)
    assert got.dtype == np.uint32 and got.flags.writeable
    assert np.array_equal(got, np.stack([SIGNATURE_2, SIGNATURE_1, SIGNATURE_1]))
    assert codec.decode_signatures([], 4).shape == (0, 4)


def test_a_batch_refuses_a_record_with_another_number_of_values() -> None:
    with pytest.raises(CorruptRecordError, match="signature of 4 values, expected 8") as raised:
        codec.decode_signatures([(codec.encode_id(7), RECORD_2)], 8)
    assert raised.value.doc_id == 7


BAD_BODIES: list[tuple[str, bytes]] = [
    ("unknown record version", b"\x02" + RECORD_1[1:-8]),
    ("key length overruns", RECORD_1[:4] + (1000).to_bytes(4, "little") + RECORD_1[8:-8]),
    ("num_perm overruns", RECORD_1[:2] + (900).to_bytes(2, "little") + RECORD_1[4:-8]),
    # A record is its parts and nothing more (review 23: these read as valid, where a
    # reader following the table above refuses them).
    ("metadata flag without metadata", RECORD_1[:29]),
    ("bytes after the signature without the metadata flag", RECORD_2[:-8] + b"\x01\x02"),
    ("an unknown flag", RECORD_2[:1] + b"\x04" + RECORD_2[2:-8]),
    ("metadata not msgpack", RECORD_1[:29] + b"\xc1"),
    ("metadata with trailing bytes", RECORD_1[:-8] + b"\x01"),
    ("metadata map with an int key", RECORD_1[:29] + bytes.fromhex("8101a178")),
    ("str key not UTF-8", RECORD_1[:8] + b"doc\xff1" + RECORD_1[13:-8]),
]
SIGNATURE_DAMAGE = BAD_BODIES[:6]
"""The bad bodies that a batch of signatures refuses too (it reads no key or metadata)."""


@pytest.mark.parametrize(
    ("body", "reason"),
    [(RECORD_1[:29], "the metadata flag is set but no metadata follows the signature"),
     (RECORD_2[:-8] + b"\x01\x02", "2 bytes follow the signature without the metadata flag"),
     (RECORD_2[:1] + b"\x06" + RECORD_2[2:-8], "unknown flags 0x06")],
)  # fmt: skip
def test_a_record_of_more_or_less_than_its_parts_says_what_is_wrong(
    body: bytes, reason: str
) -> None:
    with pytest.raises(CorruptRecordError, match=re.escape(reason)):
        codec.decode_record(reseal(body), 3)


@pytest.mark.parametrize("body", [b for _, b in BAD_BODIES], ids=[n for n, _ in BAD_BODIES])
def test_records_that_pass_the_checksum_but_do_not_decode(body: bytes) -> None:
    with pytest.raises(CorruptRecordError):
        codec.decode_record(reseal(body), 3)


@pytest.mark.parametrize(
    "body", [b for _, b in SIGNATURE_DAMAGE], ids=[n for n, _ in SIGNATURE_DAMAGE]
)
def test_a_batch_refuses_records_whose_signature_does_not_decode(body: bytes) -> None:
    with pytest.raises(CorruptRecordError) as raised:
        _in_a_batch(reseal(body), 5)
    assert raised.value.doc_id == 5


@pytest.mark.parametrize("length", [0, 1, 15])
def test_truncated_record(length: int) -> None:
    with pytest.raises(CorruptRecordError, match="shorter than its header"):
        codec.decode_record(RECORD_1[:length])


# -- keys, ids and tables ----------------------------------------------------------------------


def test_key_index_inline_and_hashed() -> None:
    assert codec.key_index(b"abc", True) == bytes.fromhex("73616263")  # "s" + key
    assert codec.key_index(b"abc", False) == bytes.fromhex("62616263")  # "b" + key
    inline = b"u" * codec.INLINE_KEY_BYTES
    assert codec.key_index(inline, True) == b"s" + inline
    assert codec.key_index(inline, False) == b"b" + inline
    long_key = ("https://example.com/" + "a" * 381).encode()
    assert len(long_key) == codec.INLINE_KEY_BYTES + 1
    digest = bytes.fromhex("109040f8684651858a62ba2cbb3116ad6322f4147f5188eaf3b6daf796d0f0d1")
    assert codec.key_index(long_key, True) == b"S" + digest
    assert codec.key_index(long_key, False) == b"B" + digest
    assert len(codec.key_index(b"k" * codec.MAX_KEY_BYTES, False)) == 33


def test_key_bytes() -> None:
    assert codec.key_bytes("é") == (b"\xc3\xa9", True)
    assert codec.key_bytes(b"\xc3\xa9") == (b"\xc3\xa9", False)
    assert codec.key_bytes(bytearray(b"ab")) == (b"ab", False)
    assert codec.key_bytes(memoryview(b"ab")) == (b"ab", False)


@pytest.mark.parametrize(
    ("doc_id", "encoded"),
    [
        (0, "0000000000000000"),
        (1, "0000000000000001"),
        (256, "0000000000000100"),
        (0x0102030405060708, "0102030405060708"),
        (2**64 - 1, "ffffffffffffffff"),
    ],
)
def test_encode_id(doc_id: int, encoded: str) -> None:
    assert codec.encode_id(doc_id) == bytes.fromhex(encoded)
    assert codec.decode_id(bytes.fromhex(encoded)) == doc_id


def test_ids_sort_numerically() -> None:
    ids = [0, 1, 255, 256, 65535, 65536, 2**40, 2**64 - 1]
    assert sorted(codec.encode_id(i) for i in reversed(ids)) == [codec.encode_id(i) for i in ids]


def test_band_keys_and_table_names() -> None:
    keys = np.array([1, 0x0102030405060708, 2**64 - 1], dtype=np.uint64)
    assert codec.encode_band_keys(keys) == [
        bytes.fromhex("0000000000000001"),
        bytes.fromhex("0102030405060708"),
        bytes.fromhex("ffffffffffffffff"),
    ]
    assert codec.band_table_name(0, 0) == b"band.0.0000"
    assert codec.band_table_name(3, 42) == b"band.3.0042"
    assert codec.band_table_name(12, 9999) == b"band.12.9999"


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_band_table_entries_follow_the_layout_of_their_format(version: int) -> None:
    layout = codec.band_layout(version)
    keys = np.array([0x0102030405060708, 0x01FFFFFFFFFFFFFF, 0x0102030405060708, 5],
                    dtype=np.uint64)  # fmt: skip
    last_id = 2**40 - 1 if version == 4 else 2**64 - 1  # the largest id of the format
    assert layout.id_limit == last_id + 1
    ids = np.array([9, 3, 2, last_id], dtype=np.uint64)
    entries = list(layout.entries(keys, ids))
    if version == 4:  # first byte, then the next four and the id's last five
        assert entries == [
            (bytes.fromhex("00"), bytes.fromhex("00000000ffffffffff")),
            (bytes.fromhex("01"), bytes.fromhex("020304050000000002")),
            (bytes.fromhex("01"), bytes.fromhex("020304050000000009")),
            (bytes.fromhex("01"), bytes.fromhex("ffffffff0000000003")),
        ]
    elif version == 3:  # first byte, then the other seven and the id (pinned by hand)
        assert entries == [
            (bytes.fromhex("00"), bytes.fromhex("00000000000005ffffffffffffffff")),
            (bytes.fromhex("01"), bytes.fromhex("020304050607080000000000000002")),
            (bytes.fromhex("01"), bytes.fromhex("020304050607080000000000000009")),
            (bytes.fromhex("01"), bytes.fromhex("ffffffffffffff0000000000000003")),
        ]
    else:
        assert entries == [
            (bytes.fromhex("0000000000000005"), bytes.fromhex("ffffffffffffffff")),
            (bytes.fromhex("0102030405060708"), bytes.fromhex("0000000000000002")),
            (bytes.fromhex("0102030405060708"), bytes.fromhex("0000000000000009")),
            (bytes.fromhex("01ffffffffffffff"), bytes.fromhex("0000000000000003")),
        ]
    # The table's order (key, then value) is the order of (band key, id).
    assert entries == sorted(entries)
    assert {len(value) for _, value in entries} == {layout.value_bytes}
    assert layout.value_bytes == {1: 8, 2: 8, 3: 15, 4: 9}[version]
    for key, value in entries:
        band_key, doc_id = layout.split(key, value)
        assert layout.entry(band_key, doc_id) == (key, value)
        assert band_table_entry(band_key, doc_id, version) == (key, value)
    # A query makes all its buckets at once; each is the bucket of its band key's entry.
    buckets = layout.buckets(keys)
    encoded = codec.encode_band_keys(keys)
    assert buckets == [layout.bucket(key) for key in encoded]
    for (table_key, lead), band_key, doc_id in zip(buckets, encoded, ids.tolist(), strict=True):
        key, value = band_table_entry(band_key, doc_id.to_bytes(8, "big"), version)
        assert table_key == key and value.startswith(lead) and len(lead) == layout.lead_bytes


def test_a_bucket_holds_exactly_the_documents_with_that_band_key(tmp_path: Path) -> None:
    """Buckets sharing a table key sit side by side in one run of values: a lookup must
    stop at its own band key's last entry, and a band key that is absent (between two
    stored ones, or past the last) finds nothing. A bucket is named by the band key's
    kept bytes: band keys that differ only after them find the same bucket."""
    rng = np.random.default_rng(5)
    sigs = rng.integers(0, 2**32, size=(3000, 8), dtype=np.uint32)
    sigs[::7, :4] = sigs[0, :4]  # a bucket of 429 documents in band 0
    sigs[1::50, :4] = 11  # and one of 60
    sigs[2::40, 4:] = 12  # a bucket of 75 in band 1
    with Store.open(tmp_path / "s", create=True, num_perm=8, bands=2, rows=4) as store:
        store.add_signatures([(f"d{i}", sig) for i, sig in enumerate(sigs)])
        store.remove_many(f"d{i}" for i in range(0, 3000, 13))  # removals in the middle of runs
        store.purge()  # a bucket lists the entries of removed documents until then
        kept = [i for i in range(3000) if i % 13]
        keys = band_keys(sigs[kept], store.banding, store.config.seed)
        width = len(kept_band_key(bytes(8)))
        with store.read() as txn:
            ids = {i: txn._lookup(f"d{i}")[0] for i in kept}  # type: ignore[index]
            expected_by_band = []
            for band in range(2):
                expected: dict[bytes, set[bytes]] = {}
                expected_by_band.append(expected)
                for doc, key in zip(kept, codec.encode_band_keys(keys[:, band]), strict=True):
                    expected.setdefault(kept_band_key(key), set()).add(ids[doc])
                assert max(len(found) for found in expected.values()) >= 60
                for prefix, found in expected.items():
                    for tail in (bytes(8 - width), b"\xff" * (8 - width)):
                        bucket = txn._bucket(band, prefix + tail)
                        assert sorted(bucket) == sorted(found) and len(bucket) == len(found)
                    value = int.from_bytes(prefix, "big")
                    below = (value - 1).to_bytes(width, "big") + b"\xff" * (8 - width)
                    above = (value + 1).to_bytes(width, "big") + bytes(8 - width)
                    for absent in (below, above):
                        wanted = expected.get(kept_band_key(absent), ())
                        assert txn._bucket(band, absent) == sorted(wanted)
                last = expected.get(kept_band_key(b"\xff" * 8), ())
                assert txn._bucket(band, b"\xff" * 8) == sorted(last)
            # A single query reads all its bands' buckets in one pass: the same ids.
            for doc in kept[::97]:
                row = codec.encode_band_keys(keys[kept.index(doc)])
                buckets = [expected_by_band[b][kept_band_key(k)] for b, k in enumerate(row)]
                wanted = set().union(*buckets)
                assert txn._candidates_of(sigs[doc]) == wanted


# -- meta values and the export stream ---------------------------------------------------------


def multilinear_by_definition(signature: Any, bands: int, rows: int, seed: int) -> list[int]:
    """The ``multilinear`` band keys as the docstring states them, in Python integers."""
    multipliers = [int(m) for m in derive_keys(seed, "band-multilinear", bands * rows)]
    values = [int(v) for v in signature]
    return [
        sum(m * v for m, v in zip(multipliers[b * rows : (b + 1) * rows],
                                  values[b * rows : (b + 1) * rows], strict=True)) % 2**64
        for b in range(bands)
    ]  # fmt: skip


def test_multilinear_band_keys_follow_their_definition() -> None:
    rng = np.random.default_rng(3)
    sigs = rng.integers(0, 2**32, size=(50, 128), dtype=np.uint32)
    sigs[0] = 2**32 - 1  # the largest values: every product and sum wraps
    for bands, rows in ((9, 13), (16, 8), (1, 128)):
        keys = band_keys(sigs, LSHParams(bands, rows), seed=7)
        assert keys.tolist() == [multilinear_by_definition(s, bands, rows, 7) for s in sigs]


def test_meta_values() -> None:
    assert codec.pack_meta(1) == b"\x01"
    assert codec.pack_meta("neardup_store") == bytes.fromhex("ad6e6561726475705f73746f7265")
    assert codec.pack_meta({"bands": 2}) == bytes.fromhex("81a562616e647302")
    assert codec.unpack_meta(bytes.fromhex("81a562616e647302")) == {"bands": 2}


# (the stored meta entries, the bytes the spec says are hashed, their xxh64 as an int)
META_CHECKSUMS = [
    (
        {"format": b"ab", "format_version": b"c"},  # config and banding missing: empty
        "02000000" "6162" "01000000" "63" "00000000" "00000000",
        9906207230970535375,
    ),
    (
        {"format": b"a", "format_version": b"bc"},  # the same bytes run together
        "01000000" "61" "02000000" "6263" "00000000" "00000000",
        5286555367328720237,
    ),
    (
        {
            "banding": bytes.fromhex("81a562616e647302"),  # {"bands": 2}
            "config": bytes.fromhex("81a86e756d5f7065726d04"),  # {"num_perm": 4}
            "format_version": b"\x05",
            "format": bytes.fromhex("ad6e6561726475705f73746f7265"),  # "neardup_store"
            "package_version": b"\xa50.1.0",  # not sealed: left out
        },
        "0e000000" "ad6e6561726475705f73746f7265" "01000000" "05"
        "0b000000" "81a86e756d5f7065726d04" "08000000" "81a562616e647302",
        895794013853590766,
    ),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "hashed", "pinned"), META_CHECKSUMS)
def test_meta_checksum_is_pinned(raw: dict[str, bytes], hashed: str, pinned: int) -> None:
    """Every store holds this checksum: computed any other way, every store written
    before reads as corrupt. The other tests make their stores with the code under test,
    so only a pinned value notices; without the length prefixes the first two inputs
    would hash alike (review 49)."""
    assert xxhash.xxh64_intdigest(bytes.fromhex(hashed)) == pinned  # the spec, restated
    assert codec.meta_checksum(raw) == pinned


# Version 2 of the export stream, which this release still reads: the header's fields and
# each record bare. Version 3 seals them (below): the same bytes, as a bin beside their
# xxh64.
EXPORT_V2_HEADER = bytes.fromhex(
    "85"  # a map of 5
    "a6666f726d6174" "b46e6561726475705f73746f72652d6578706f7274"  # format
    "a776657273696f6e" "02"  # version: 2
    "a6636f6e666967" "81" "a86e756d5f7065726d" "04"  # config: {"num_perm": 4}
    "a762616e64696e67" "82" "a562616e6473" "02" "a4726f7773" "02"  # banding
    "af7061636b6167655f76657273696f6e" "a5302e312e30"  # package_version: "0.1.0"
)  # fmt: skip
EXPORT_V2_RECORD_1 = bytes.fromhex(
    "93"  # an array of 3
    "a5646f632d31"  # key: str "doc-1"
    "c410" "01000000" "02000000" "ffffffff" "78563412"  # signature: bin of 16 bytes
    "82a16e01a162c40100"  # metadata
)  # fmt: skip
EXPORT_V2_RECORD_2 = bytes.fromhex(
    "93"
    "c40300ff6b"  # key: bin b"\x00\xffk"
    "c410" "00000000" "07000000" "00000080" "efbeadde"
    "c0"  # metadata: nil
)  # fmt: skip
HEADER_BODY = bytes.fromhex(
    "83"  # a map of 3
    "a6636f6e666967" "81" "a86e756d5f7065726d" "04"  # config: {"num_perm": 4}
    "a762616e64696e67" "82" "a562616e6473" "02" "a4726f7773" "02"  # banding
    "af7061636b6167655f76657273696f6e" "a5302e312e30"  # package_version: "0.1.0"
)  # fmt: skip
EXPORT_HEADER = (
    bytes.fromhex(
        "84"  # a map of 4
        "a6666f726d6174" "b46e6561726475705f73746f72652d6578706f7274"  # format
        "a776657273696f6e" "03"  # version: 3
        "a4626f6479" "c43f"  # body: bin of 63 bytes
    )
    + HEADER_BODY
    + bytes.fromhex("a8636865636b73756d" "cf" "2f53e17abcfd8314")  # checksum: uint64
)  # fmt: skip
EXPORT_RECORD_1 = (
    bytes.fromhex("92" "c422")  # an array of 2; the body, a bin of 34 bytes
    + EXPORT_V2_RECORD_1
    + bytes.fromhex("cf" "99cd5f514b48f654")  # its xxh64
)  # fmt: skip
EXPORT_RECORD_2 = (
    bytes.fromhex("92" "c419") + EXPORT_V2_RECORD_2 + bytes.fromhex("cf" "c6fca5fca67a11e2")
)  # fmt: skip


EXPORT_TRAILER_2 = bytes.fromhex(
    "82"  # a map of 2
    "a3656e64" "b46e6561726475705f73746f72652d6578706f7274"  # end: "neardup_store-export"
    "a9646f63756d656e7473" "02"  # documents: 2
)  # fmt: skip


def test_export_header_records_and_trailer() -> None:
    header = codec.export_header({"num_perm": 4}, {"bands": 2, "rows": 2}, "0.1.0")
    assert header == EXPORT_HEADER
    assert codec.export_record(codec.decode_record(RECORD_1)) == EXPORT_RECORD_1
    assert codec.export_record(codec.decode_record(RECORD_2)) == EXPORT_RECORD_2
    assert codec.export_trailer(2) == EXPORT_TRAILER_2


def test_export_stream_reads_back() -> None:
    stream = io.BytesIO(EXPORT_HEADER + EXPORT_RECORD_1 + EXPORT_RECORD_2 + EXPORT_TRAILER_2)
    objects = list(codec.stream_unpacker(stream))
    assert objects[3] == {"end": "neardup_store-export", "documents": 2}
    assert {**objects[0], "body": None} == {
        "format": "neardup_store-export",
        "version": 3,
        "body": None,
        "checksum": 0x2F53E17ABCFD8314,
    }
    fields = codec.unsealed(objects[0]["body"], objects[0]["checksum"])
    assert fields == {
        "config": {"num_perm": 4},
        "banding": {"bands": 2, "rows": 2},
        "package_version": "0.1.0",
    }
    sig_1, sig_2 = (sig.astype("<u4").tobytes() for sig in (SIGNATURE_1, SIGNATURE_2))
    assert codec.unsealed(*objects[1]) == ["doc-1", sig_1, METADATA_1]
    assert codec.unsealed(*objects[2]) == [b"\x00\xffk", sig_2, None]
    v2 = io.BytesIO(EXPORT_V2_HEADER + EXPORT_V2_RECORD_1 + EXPORT_V2_RECORD_2 + EXPORT_TRAILER_2)
    assert list(codec.stream_unpacker(v2)) == [
        {"format": "neardup_store-export", "version": 2, **fields},
        ["doc-1", sig_1, METADATA_1],
        [b"\x00\xffk", sig_2, None],
        objects[3],
    ]


def test_a_sealed_body_is_unpacked_only_with_its_checksum() -> None:
    body, checksum = codec.sealed(["doc-1", b"\x01", None])
    assert codec.unsealed(body, checksum) == ["doc-1", b"\x01", None]
    for damaged in (body[:-1] + b"\xc3", body[:-1]):  # nil turned true; cut short
        with pytest.raises(ValueError, match="checksum"):
            codec.unsealed(damaged, checksum)
    with pytest.raises(ValueError, match="checksum"):
        codec.unsealed(body, checksum ^ 1)
    with pytest.raises(ValueError, match="checksum"):
        codec.unsealed("not bytes", checksum)


# -- decoding never runs code ------------------------------------------------------------------


class Explosive:
    """Records any attempt to rebuild it from stored bytes."""

    built = 0

    def __init__(self) -> None:
        Explosive.built += 1

    def __reduce__(self) -> tuple[Any, ...]:
        return (Explosive, ())


EXT_42 = bytes.fromhex("d42a00")  # fixext 1: type 42, data b"\x00"
TIMESTAMP_0 = bytes.fromhex("d6ff00000000")  # the timestamp extension (-1), 1970-01-01


def test_extension_types_in_metadata_come_back_as_data() -> None:
    record = codec.decode_record(reseal(RECORD_1[:29] + EXT_42))
    assert record.metadata == msgpack.ExtType(42, b"\x00")
    record = codec.decode_record(reseal(RECORD_1[:29] + TIMESTAMP_0))
    assert record.metadata == msgpack.Timestamp(0)
    assert codec.unpack_meta(EXT_42) == msgpack.ExtType(42, b"\x00")
    assert list(codec.stream_unpacker(io.BytesIO(EXT_42))) == [msgpack.ExtType(42, b"\x00")]


def test_metadata_is_never_pickled() -> None:
    bomb = Explosive()
    pickled = pickle.dumps(bomb)
    Explosive.built = 0
    # Pickle bytes stored as metadata are just bytes, never loaded.
    packed = codec.pack_metadata({"payload": pickled})
    assert packed is not None
    record = codec.decode_record(codec.encode_record(b"k", True, SIGNATURE_1, packed))
    assert record.metadata == {"payload": pickled} and Explosive.built == 0
    # Objects msgpack cannot represent are refused, not pickled.
    with pytest.raises(MetadataError):
        codec.pack_metadata(bomb)
    with pytest.raises(MetadataError):
        codec.pack_metadata({"when": datetime.datetime(2024, 1, 1)})
    assert Explosive.built == 0


@pytest.mark.parametrize(
    "metadata",
    [{1: "int key"}, {(1, 2): "tuple key"}, {None: "nil key"}, [{"deep": {2.5: "float key"}}]],
)
def test_metadata_that_would_not_read_back_is_refused(metadata: object) -> None:
    with pytest.raises(MetadataError, match="would not read back"):
        codec.pack_metadata(metadata)


def test_metadata_size_limit() -> None:
    assert codec.pack_metadata(b"x" * (codec.MAX_METADATA_BYTES - 5)) is not None  # bin32 header
    with pytest.raises(MetadataError):
        codec.pack_metadata(b"x" * codec.MAX_METADATA_BYTES)
    assert codec.pack_metadata(None) is None


# -- a real store writes what the spec says ----------------------------------------------------


def test_store_tables_hold_the_specified_bytes(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path, create=True, num_perm=4, bands=2, rows=2, seed=1) as store:
        store.add("doc-1", signature=SIGNATURE_1, metadata=METADATA_1)
        store.add(b"\x00\xffk", signature=SIGNATURE_2)
        config, banding = store.config, store.banding
    expected_bands = band_keys(np.stack([SIGNATURE_1, SIGNATURE_2]), banding, seed=1)
    assert banding.keys == "multilinear"
    assert expected_bands.tolist() == [
        multilinear_by_definition(sig, 2, 2, seed=1) for sig in (SIGNATURE_1, SIGNATURE_2)
    ]
    env = lmdb.open(str(path), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            names = sorted(bytes(k) for k, _ in txn.cursor())
        assert names == [b"band.0.0000", b"band.0.0001", b"docs", b"keys", b"meta", b"removed"]
        docs, keys, meta = (env.open_db(n, create=False) for n in (b"docs", b"keys", b"meta"))
        bands = [env.open_db(codec.band_table_name(0, i), create=False) for i in range(2)]
        with env.begin() as txn:
            assert list(txn.cursor(db=docs)) == [
                (bytes.fromhex("0000000000000000"), RECORD_1),
                (bytes.fromhex("0000000000000001"), RECORD_2),
            ]
            assert sorted(txn.cursor(db=keys)) == [
                (b"b\x00\xffk", bytes.fromhex("0000000000000001")),
                (b"sdoc-1", bytes.fromhex("0000000000000000")),
            ]
            for band, table in enumerate(bands):
                # Formats 4 and 5: the band key's first byte is the table key; the value
                # is its next four bytes, then the id's last five.
                first, second = (int(k).to_bytes(8, "big") for k in expected_bands[:, band])
                assert sorted(txn.cursor(db=table)) == sorted(
                    [
                        (first[:1], first[1:5] + bytes.fromhex("0000000000")),
                        (second[:1], second[1:5] + bytes.fromhex("0000000001")),
                    ]
                )
            raw = {bytes(k).decode(): bytes(v) for k, v in txn.cursor(db=meta)}
    finally:
        env.close()
    values: dict[str, Any] = {name: codec.unpack_meta(value) for name, value in raw.items()}
    assert values.pop("meta_checksum") == codec.meta_checksum(raw)
    map_size = values.pop("map_size")
    assert isinstance(map_size, int) and map_size > 0
    assert values == {
        "format": "neardup_store",
        "format_version": 5,
        "package_version": __version__,
        "lmdb": {"binding": lmdb.__version__, "engine": list(lmdb.version())},
        "config": config.to_dict(),
        "banding": {
            "bands": 2,
            "rows": 2,
            "threshold": 0.8,
            "generation": 0,
            "keys": "multilinear",
        },
        "commit_counter": 2,
        "next_doc_id": 2,
    }
    assert values["config"] == {
        "num_perm": 4,
        "scheme": "oph",
        "seed": 1,
        "shingles": {
            "kind": "char",
            "size": 5,
            "bag": False,
            "nfkc": True,
            "casefold": True,
            "collapse_whitespace": True,
            "strip": True,
            "allow_empty": False,
            "hash_version": values["config"]["shingles"]["hash_version"],
        },
    }


def test_a_removal_moves_the_record_to_removed_and_a_purge_deletes_its_band_entries(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    with Store.open(path, create=True, num_perm=4, bands=2, rows=2, seed=1) as store:
        store.add("doc-1", signature=SIGNATURE_1, metadata=METADATA_1)
        store.add(b"\x00\xffk", signature=SIGNATURE_2)
        banding = store.banding
    expected_bands = band_keys(np.stack([SIGNATURE_1, SIGNATURE_2]), banding, seed=1)
    entries = [
        [
            band_table_entry(int(key).to_bytes(8, "big"), doc_id.to_bytes(8, "big"))
            for doc_id, key in enumerate(expected_bands[:, band])
        ]
        for band in range(2)
    ]
    band_names = [codec.band_table_name(0, band) for band in range(2)]
    tables = raw_dump(path)
    assert tables[codec.REMOVED_DB] == []
    assert [sorted(tables[name]) for name in band_names] == [sorted(e) for e in entries]

    with Store.open(path) as store:
        store.remove("doc-1")
    tables = raw_dump(path)
    # The record moves, byte for byte; the key goes; the band entries stay.
    assert tables[codec.REMOVED_DB] == [(bytes(8), RECORD_1)]
    assert tables[codec.DOCS_DB] == [(bytes.fromhex("0000000000000001"), RECORD_2)]
    assert tables[codec.KEYS_DB] == [(b"b\x00\xffk", bytes.fromhex("0000000000000001"))]
    assert [sorted(tables[name]) for name in band_names] == [sorted(e) for e in entries]

    with Store.open(path) as store:
        assert store.purge() == 1
    tables = raw_dump(path)
    assert tables[codec.REMOVED_DB] == []
    assert [tables[name] for name in band_names] == [[e[1]] for e in entries]


# -- stores of formats 1 to 4 --------------------------------------------------------------------


def rewrite_as_old_format(path: Path, version: int) -> None:
    """Turn a closed store into what format ``version`` wrote: no ``removed`` table, band
    tables in that format's layout (:func:`harness.band_table_entry`) holding the stored
    documents only; format 1 also has fold band keys and no ``keys`` entry in its
    banding."""
    env = lmdb.open(str(path), max_dbs=64)
    try:
        meta_db = env.open_db(codec.META_DB, create=False)
        with env.begin(write=True) as txn:
            meta = {bytes(k).decode(): codec.unpack_meta(v) for k, v in txn.cursor(db=meta_db)}
            banding = meta["banding"]
            scheme = "fold" if version == 1 else banding["keys"]
            params = LSHParams(banding["bands"], banding["rows"], scheme)
            docs = env.open_db(codec.DOCS_DB, txn=txn, create=False)
            ids, sigs = [], []
            for raw_id, record in txn.cursor(db=docs):
                ids.append(bytes(raw_id))
                sigs.append(codec.decode_signature(bytes(record)))
            keys = band_keys(np.stack(sigs), params, meta["config"]["seed"])
            for band in range(params.bands):
                name = codec.band_table_name(banding["generation"], band)
                table = env.open_db(name, txn=txn, create=False, dupsort=True, dupfixed=True)
                txn.drop(table, delete=False)
                for raw_id, key in zip(ids, codec.encode_band_keys(keys[:, band]), strict=True):
                    txn.put(*band_table_entry(key, raw_id, version), db=table)
            txn.drop(env.open_db(codec.REMOVED_DB, txn=txn, create=False), delete=True)
            if version == 1:
                del banding["keys"]
            txn.put(b"banding", codec.pack_meta(banding), db=meta_db)
            txn.put(b"format_version", codec.pack_meta(version), db=meta_db)
            raw = {name: bytes(txn.get(name.encode(), db=meta_db)) for name in codec.SEALED_META}
            txn.put(b"meta_checksum", codec.pack_meta(codec.meta_checksum(raw)), db=meta_db)
    finally:
        env.close()


def twin_stores(
    tmp_path: Path, sigs: np.ndarray, queries: np.ndarray, version: int
) -> tuple[Path, Path, list[list[Any]]]:
    """The same documents in a store of this release and in one rewritten as format
    ``version``: both paths, and the current store's answers to ``queries``."""
    current, old = tmp_path / "current", tmp_path / "old"
    for path in (current, old):
        with Store.open(path, create=True, num_perm=128, bands=9, rows=13) as store:
            store.add_signatures([(f"d{i}", sig) for i, sig in enumerate(sigs)])
    rewrite_as_old_format(old, version)
    with Store.open(current) as store, store.read() as txn:
        expected = [txn.query(signature=q) for q in queries]
        assert txn.query_many(signatures=queries) == expected
    assert sum(len(m) for m in expected) >= 40  # every near copy finds its original
    return current, old, expected


def test_a_format_1_store_reads_writes_checks_and_rebuilds_to_format_5(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    sigs = rng.integers(0, 2**32, size=(300, 128), dtype=np.uint32)
    near = sigs[:40].copy()
    near[:, :13] = 7  # the first band changed: 115 of 128 values still agree
    queries = np.concatenate([near, rng.integers(0, 2**32, size=(10, 128), dtype=np.uint32)])
    _, old, expected = twin_stores(tmp_path, sigs, queries, 1)

    with Store.open(old) as store:
        assert store.banding.keys == "fold" and store.check().ok
        with store.read() as txn:
            assert [txn.query(signature=q) for q in queries] == expected
            assert txn.query_many(signatures=queries) == expected
        store.add_signatures([("late", near[0])])  # written with fold keys, as format 1 says
        assert store.check().ok
        assert [m.key for m in store.query(signature=near[0])] == ["late", "d0"]
        store.remove("late")
        report = store.rebuild()  # no arguments: the format changes, the banding stays
        assert store.banding.keys == "multilinear" and store.check().ok
        assert report.new_params.banding == LSHParams(9, 13, "multilinear")
        with store.read() as txn:
            assert [txn.query(signature=q) for q in queries] == expected
    with Store.open(old) as store:  # what the rebuild wrote is what reopening reads
        assert store.banding.keys == "multilinear"
        with store.read() as txn:
            assert store._read_meta(txn.txn, "format_version") == 5
            assert store._read_meta(txn.txn, "banding")["keys"] == "multilinear"


@pytest.mark.parametrize(("version", "value_bytes"), [(2, 8), (3, 15), (4, 9)])
def test_an_older_store_keeps_its_layout_until_a_rebuild_moves_it_to_format_5(
    tmp_path: Path, version: int, value_bytes: int
) -> None:
    rng = np.random.default_rng(12)
    sigs = rng.integers(0, 2**32, size=(300, 128), dtype=np.uint32)
    sigs[100:200, :13] = 5  # one bucket of 100 documents in band 0
    near = sigs[:40].copy()
    near[:, 13:26] = 9
    queries = np.concatenate([near, rng.integers(0, 2**32, size=(10, 128), dtype=np.uint32)])
    current, old, expected = twin_stores(tmp_path, sigs, queries, version)
    with Store.open(current) as store:
        current_stats = store.stats()

    with Store.open(old) as store:
        assert store.check().ok
        with store.read() as txn:
            assert [txn.query(signature=q) for q in queries] == expected
            assert txn.query_many(signatures=queries) == expected
        assert [b.entries for b in store.stats().bands] == [b.entries for b in current_stats.bands]
        assert store.stats().bands[0].histogram == current_stats.bands[0].histogram
        assert (store.stats().format_version, current_stats.format_version) == (version, 5)
        store.add_signatures([("late", near[0]), ("later", near[1])])
        store.remove("d7")
        assert store.check().ok
        assert [m.key for m in store.query(signature=near[0])][:2] == ["late", "d0"]
    # What this release wrote into the older store is in that format's layout, and its
    # removal deleted the band entries at once: an older format has no removed table.
    tables = raw_dump(old)
    assert codec.REMOVED_DB not in tables
    entries = [v for name, t in tables.items() if name.startswith(b"band.") for _, v in t]
    assert {len(value) for value in entries} == {value_bytes}
    assert len(entries) == 9 * 301

    with Store.open(old) as store:
        store.rebuild()
        assert store.banding == LSHParams(9, 13, "multilinear") and store.check().ok
        with store.read() as txn:
            assert store._read_meta(txn.txn, "format_version") == 5
            assert [txn.query(signature=q) for q in queries[40:]] == expected[40:]
        assert store.stats().format_version == 5
        store.remove("d8")  # now a removal of the current format: the entries wait
        assert store.stats().awaiting_purge == 1 and store.check().ok
        store.purge()
    tables = raw_dump(old)
    assert tables[codec.REMOVED_DB] == []
    entries = [(k, v) for name, t in tables.items() if name.startswith(b"band.1.") for k, v in t]
    assert {(len(k), len(v)) for k, v in entries} == {(1, 9)}
    assert len(entries) == 9 * 300


def set_next_doc_id(path: Path, next_id: int) -> None:
    """Make a closed store's id counter read ``next_id`` (as if that many were handed out)."""
    env = lmdb.open(str(path), max_dbs=64)
    try:
        with env.begin(write=True) as txn:
            meta_db = env.open_db(codec.META_DB, txn=txn, create=False)
            txn.put(b"next_doc_id", codec.pack_meta(next_id), db=meta_db)
    finally:
        env.close()


def test_a_store_out_of_ids_refuses_the_batch_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s"
    rng = np.random.default_rng(4)
    sigs = rng.integers(0, 2**32, size=(5, 16), dtype=np.uint32)
    with Store.open(path, create=True, num_perm=16, bands=4, rows=4) as store:
        store.add_signatures([("a", sigs[0])])
    limit = codec.band_layout(codec.FORMAT_VERSION).id_limit
    assert limit == 2**40
    set_next_doc_id(path, limit - 2)
    before = raw_digest(path)
    with Store.open(path) as store:
        with pytest.raises(IdsExhaustedError, match="Export the store and import") as err:
            store.add_signatures([("b", sigs[1]), ("c", sigs[2]), ("d", sigs[3])])
        assert err.value.limit == limit and "1,099,511,627,776" in str(err.value)
    assert raw_digest(path) == before  # nothing written, not even a commit counter
    with Store.open(path) as store:
        store.add_signatures([("b", sigs[1]), ("c", sigs[2])])  # the last two ids fit
        with pytest.raises(IdsExhaustedError):
            store.add("d", signature=sigs[3])
        # A replacement needs a new id: the old document stays.
        with store.write() as txn, pytest.raises(IdsExhaustedError):
            txn.add("b", signature=sigs[4], replace=True)
        assert np.array_equal(store.get("b").signature, sigs[1])
        assert store.check().ok and len(store) == 3
        assert [m.key for m in store.query(signature=sigs[2])] == ["c"]
        with store.read() as txn:
            assert codec.decode_id(txn._lookup("c")[0]) == limit - 1  # type: ignore[index]


def test_a_rebuild_refuses_a_store_whose_ids_the_current_format_cannot_hold(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s"
    rng = np.random.default_rng(6)
    with Store.open(path, create=True, num_perm=16, bands=4, rows=4) as store:
        store.add_signatures([(f"d{i}", s) for i, s in enumerate(rng.integers(0, 2**32, (20, 16)))])
    rewrite_as_old_format(path, 3)  # format 3 holds 64-bit ids
    set_next_doc_id(path, 2**40 + 5)
    with Store.open(path) as store:
        store.add_signatures([("late", rng.integers(0, 2**32, 16))])  # id 2**40 + 5: fine here
        with store.read() as txn:
            assert codec.decode_id(txn._lookup("late")[0]) == 2**40 + 5  # type: ignore[index]
    before = raw_digest(path)
    with Store.open(path) as store:
        with pytest.raises(IdsExhaustedError):
            store.rebuild()
        assert store.check().ok and store.stats().format_version == 3
        assert [m.key for m in store.query(signature=store.get("late").signature)] == ["late"]
    assert raw_digest(path) == before


@pytest.mark.parametrize(
    ("version", "banding_change", "problem"),
    [
        (1, {"keys": "fold"}, "format 1 store names a band key scheme"),
        (2, {"keys": None}, "keys"),
        (2, {"keys": "sha1"}, "keys"),
    ],
)
def test_a_banding_that_contradicts_its_format_is_a_corrupt_store(
    tmp_path: Path, version: int, banding_change: dict[str, Any], problem: str
) -> None:
    path = tmp_path / "store"
    Store.open(path, create=True).close()

    def change(sealed: dict[str, Any]) -> None:
        for name, value in banding_change.items():
            if value is None:
                del sealed["banding"][name]
            else:
                sealed["banding"][name] = value
        sealed["format_version"] = version

    rewrite_sealed_meta(path, change)
    with pytest.raises(CorruptStoreError, match=problem):
        Store.open(path)


# -- a corrupt store's advice ------------------------------------------------------------------


def _edit_meta_unsealed(path: Path, edit: Callable[[lmdb.Transaction, Any], None]) -> None:
    """Apply ``edit(txn, meta_db)`` to the closed store at ``path`` without sealing again."""
    env = lmdb.open(str(path), max_dbs=64)
    try:
        with env.begin(write=True) as txn:
            edit(txn, env.open_db(codec.META_DB, txn=txn, create=False))
    finally:
        env.close()


def _another_seed(txn: lmdb.Transaction, meta_db: Any) -> None:
    config = codec.unpack_meta(txn.get(b"config", db=meta_db))
    txn.put(b"config", codec.pack_meta({**config, "seed": config["seed"] + 1}), db=meta_db)


def _drop_a_band_table(path: Path) -> None:
    env = lmdb.open(str(path), max_dbs=64)
    try:
        with env.begin(write=True) as txn:
            txn.drop(env.open_db(codec.band_table_name(0, 0), txn=txn, create=False))
    finally:
        env.close()


_DAMAGES: dict[str, Callable[[Path], None]] = {
    "checksum": lambda path: _edit_meta_unsealed(path, _another_seed),
    "undecodable": lambda path: _edit_meta_unsealed(
        path, lambda txn, db: txn.put(b"banding", b"\xc1", db=db)
    ),
    "missing": lambda path: _edit_meta_unsealed(
        path, lambda txn, db: txn.delete(b"banding", db=db)
    ),
    "table": _drop_a_band_table,
    # Raised by the first write, on a store that opens: its detail names the repair.
    "count": lambda path: _edit_meta_unsealed(
        path, lambda txn, db: txn.put(b"commit_counter", codec.pack_meta("x"), db=db)
    ),
}


@pytest.mark.parametrize("damage", list(_DAMAGES))
def test_every_way_a_corrupt_store_error_advises_works_when_followed_on_a_copy(
    tmp_path: Path, damage: str
) -> None:
    """It advised "export what is readable from a copy and import it into a new store",
    but an export opens the store first, and the open is what fails: the export failed
    alike, with the same error (a review's finding). So does ``check --repair``."""
    path, saved = tmp_path / "store", tmp_path / "saved"
    documents = [(f"k{i}", f"document number {i} of a small corpus") for i in range(30)]
    with Store.open(path, create=True, num_perm=16, bands=4, rows=4) as store:
        store.add_many(documents)
        store.backup(saved)
    _DAMAGES[damage](path)
    with pytest.raises(CorruptStoreError) as raised, Store.open(path) as store:
        store.add("late", "a document added after the damage")
    advice = str(raised.value)

    def copy(name: str) -> Path:
        shutil.copytree(path, tmp_path / name)
        return tmp_path / name

    def restored() -> Store:  # as the README says: the store aside, the backup in its place
        restoring = copy("restoring")
        restoring.rename(tmp_path / "aside")
        shutil.copytree(saved, restoring)
        return Store.open(restoring)

    def repaired() -> Store:
        with Store.open(copy("repairing")) as store:
            store.check(repair=True)
        return Store.open(tmp_path / "repairing")

    def exported() -> Store:
        with Store.open(copy("exporting"), read_only=True) as store:
            store.export_file(tmp_path / "salvaged.export")
        with (tmp_path / "salvaged.export").open("rb") as stream:
            return Store.create_from_export(tmp_path / "imported", stream)

    def added_again() -> Store:
        store = Store.open(tmp_path / "anew", create=True, num_perm=16, bands=4, rows=4)
        store.add_many(documents)
        return store

    ways = {
        "restore it from a backup": restored,
        "check --repair": repaired,
        "export": exported,
        "add its documents again to a new store": added_again,
    }
    offered = [way for way in ways if way in advice]
    assert "restore it from a backup" in offered and "export" not in offered, advice
    assert ("check --repair" in offered) == (damage == "count"), advice
    for way in offered:
        with ways[way]() as store:
            assert sorted(store) == sorted(key for key, _ in documents), way
            store.add("late", "a document added after the damage")
            assert store.check().ok, way
