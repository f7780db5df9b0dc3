"""The on-disk format of a store: the one place that says what every byte means.

A store is one LMDB environment (a directory holding ``data.mdb`` and ``lock.mdb``, plus
our lock files ``neardup.lock`` and ``neardup.create.lock``) with these named tables.
Document ids and band keys are big-endian wherever they appear (table keys, the ``keys``
table's values, the band tables' values), so LMDB's byte order is numeric order; the other
integers, inside document records, are little-endian.

``meta`` — text key → msgpack value
    ``format``           the string ``"neardup_store"``: marks the environment as a store.
    ``format_version``   int, :data:`FORMAT_VERSION` of the writer; this release also reads
                         and writes format 1 to 4 stores (:data:`READABLE_FORMATS`).
                         Format 4 differs from 5 only in having no ``removed`` table;
                         formats 2 and 3 also in the layout of the band tables; format 1
                         also in its band keys. A rebuild moves a store to the current
                         format.
    ``package_version``  str, the neardup_store release that created the store.
    ``lmdb``             map ``{"binding": py-lmdb version, "engine": [major, minor, patch]}``,
                         for information only (optional, as ``meta_checksum``; every
                         other entry listed here is required).
    ``config``           map ``{"num_perm", "scheme", "seed", "shingles"}``
                         (:meth:`MinHashConfig.to_dict`); ``shingles`` is the map
                         ``{"kind", "size", "bag", "nfkc", "casefold",
                         "collapse_whitespace", "strip", "allow_empty", "hash_version"}``
                         (:class:`~.text.ShingleConfig`'s fields and the shingle
                         hashing's version, :data:`~.text.HASH_VERSION`). A key not named
                         here is refused: it would be a later release's parameter.
    ``banding``          map ``{"bands", "rows", "threshold", "generation", "keys"}``;
                         ``keys`` names the band key scheme (:data:`lsh.KEY_SCHEMES`). A
                         format 1 store has no ``keys`` entry and uses ``"fold"``; format 2
                         stores record it (``"multilinear"`` when made by this release).
    ``commit_counter``   int, 0 when the store is created, then +1 on every committed
                         write transaction (one that wrote nothing ends without a commit).
    ``next_doc_id``      int, the next internal document id to hand out.
    ``map_size``         int, the map size in bytes the store last grew to.
    ``meta_checksum``    int, xxh64 (seed 0) of the stored bytes of ``format``,
                         ``format_version``, ``config`` and ``banding``, each preceded by
                         its length (uint32 LE), in that order (:func:`meta_checksum`).
                         These entries give the data its meaning and nothing else in the
                         store can vouch for them (a changed ``threshold`` or shingle
                         size reads back as valid). Stores written before it was added
                         lack it and are read unverified.

``docs`` — document id (8 bytes, big-endian uint64) → document record
    ==========  =====================================================================
    bytes       meaning
    ==========  =====================================================================
    1           record version, :data:`RECORD_VERSION` (1)
    1           flags: bit 0 key is ``str`` (UTF-8), else ``bytes``; bit 1 has metadata;
                the other bits are 0
    2           num_perm, uint16 LE
    4           key length in bytes, uint32 LE
    key length  the external key
    4·num_perm  the signature, uint32 LE each
    rest − 8    metadata, msgpack: present (not empty) exactly when flag bit 1 is set
    8           xxh64 (seed 0) of every preceding byte of the record, LE
    ==========  =====================================================================

``keys`` — key index → document id (8 bytes, big-endian)
    The key index is one tag byte (``s`` for a ``str`` key, ``b`` for ``bytes``) followed by
    the key's bytes when they are at most :data:`INLINE_KEY_BYTES` long, or else by tag ``S``
    / ``B`` and the 32-byte SHA-256 of the key (LMDB keys are limited to 511 bytes). The
    record holds the full key, which a lookup compares, so a hashed index is never trusted
    alone.

``band.<generation>.<index>`` — one table per band (``index`` is four decimal digits)
    ``index`` is the 0-based band number. Each document has one entry per band: its band
    key (an 8-byte big-endian uint64) and its id. The key in table ``index`` is
    ``lsh.band_keys(signature, LSHParams(bands, rows, keys), seed)[index]``, with
    ``bands``, ``rows`` and ``keys`` from the ``banding`` entry and ``seed`` from the
    ``config`` entry (:mod:`.lsh` specifies both key schemes).
    The tables are duplicate-sorted with fixed-size values, so an entry's place is the
    band key followed by the id, and the entries of one band key (its bucket) are
    adjacent. The :class:`BandLayout` of the store's format says which bytes of the two
    are kept and where they go:

    * formats 4 and 5: the table key is the band key's first byte; the value (9 bytes) is the
      band key's next 4 bytes followed by the id's last 5. A table has at most 256 keys,
      each holding its entries as LMDB's packed fixed-size duplicates (no per-entry node
      header). A bucket is thus named by the band key's first 5 bytes (40 bits): band keys
      that differ only after them share a bucket, and their documents become candidates
      of each other's queries, verified like any other (about one in 10^5 lookups at 10M
      documents). Ids are below 2^40; a store that has handed out that many refuses
      further adds with :class:`~.errors.IdsExhaustedError`.
    * format 3: as format 5, keeping all of both: the value (15 bytes) is the band key's
      other 7 bytes followed by the whole id.
    * formats 1 and 2: the table key is the whole band key; the value is the id (8 bytes).

    Fewer bytes per entry means fewer pages, and fewer pages copied on write by each
    batch of adds, the main cost of ingest (``tools/README.md``, "Where the time goes").
    Adding a document touches one entry per band. A rebuild writes a new generation in
    the current layout and drops the old one in the same transaction.

``removed`` — document id (8 bytes, big-endian) → document record (format 5 on)
    The records of removed documents whose band entries have not been deleted yet. A
    removal moves the record here from ``docs`` and deletes its ``keys`` entry, the two
    pages it touches; its one entry per band stays until a purge deletes them and then
    this entry, in one transaction. So a band entry names a document in ``docs`` or one
    here, never neither, and a reader skips the ids it finds here (they have no record in
    ``docs``). Purging many removals at once deletes their entries in key order, several
    on each page copied, where deleting each removal's entries at once copies a page per
    entry (``tools/README.md``, "Where the time goes"). Stores of formats 1 to 4 have no
    such table: a removal there deletes its band entries in its own transaction.

Export stream (:func:`export_header`, :func:`export_record`, :func:`export_trailer`): a
sequence of msgpack objects. What a reader acts on is *sealed* (:func:`sealed`): packed
into a msgpack bin ``body``, beside ``checksum``, the xxh64 (seed 0) of the body's bytes
as an int. A reader unpacks a body only once its checksum matches, so a file damaged at
rest or in transit is refused instead of imported as other keys or signatures.

1. The header map ``{"format": "neardup_store-export", "version": 3, "body": …,
   "checksum": …}``, whose sealed body is the map ``{"config": …, "banding": …,
   "package_version": …}``: ``config`` and ``banding`` as the store's ``meta`` holds
   them (above), ``package_version`` the exporting release.
2. One array ``[body, checksum]`` per document, in id order, whose sealed body is the
   array ``[key, signature, metadata]``: key a msgpack str or bin exactly as stored, the
   signature as a bin of num_perm uint32 LE values, metadata or nil.
3. The trailer map ``{"end": "neardup_store-export", "documents": n}``, n counting the
   records, and nothing after it.

Records are written whole, so an export cut short (failed, interrupted) still decodes:
the missing trailer is how a reader tells. Version 2 streams hold the same header fields
in the header map itself and each ``[key, signature, metadata]`` array bare; version 1
streams are version 2 without the trailer. Both are read as they are.

Nothing is ever unpickled: msgpack is decoded with ``raw=False``, ``strict_map_key=True``
and no hooks (an extension type decodes to an inert ``ExtType`` value), so reading a file
cannot run code. Stored values are decoded with every length bounded by the value's size; export
streams with explicit limits (:func:`stream_unpacker`), so a crafted file cannot make the
reader allocate more than about a megabyte per object.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt
import xxhash

from .errors import BAD_ID_ADVICE, CorruptRecordError, InvalidKeyError, MetadataError
from .lsh import LSHParams

FORMAT_NAME = "neardup_store"
FORMAT_VERSION = 5
READABLE_FORMATS = (1, 2, 3, 4, 5)
LAZY_REMOVAL_FORMAT = 5  # the first format with a ``removed`` table
RECORD_VERSION = 1
EXPORT_FORMAT = "neardup_store-export"
EXPORT_VERSION = 3
READABLE_EXPORT_VERSIONS = (1, 2, 3)
"""Export versions this release imports (version 1 has no trailer, versions 1 and 2 no
checksums)."""

META_DB = b"meta"
DOCS_DB = b"docs"
KEYS_DB = b"keys"
REMOVED_DB = b"removed"

MAX_KEY_BYTES = 16 * 1024
INLINE_KEY_BYTES = 400
MAX_METADATA_BYTES = 64 * 1024

REQUIRED_META = (
    "format",
    "format_version",
    "package_version",
    "config",
    "banding",
    "commit_counter",
    "next_doc_id",
    "map_size",
)
"""The ``meta`` entries every store has (``meta_checksum`` is optional: older stores)."""
SEALED_META = ("format", "format_version", "config", "banding")
"""The ``meta`` entries :func:`meta_checksum` covers."""

_HEADER = struct.Struct("<BBHI")
RECORD_HEADER_BYTES = _HEADER.size
"""Bytes of a record before its key: version, flags, num_perm, key length."""
_CHECKSUM = struct.Struct("<Q")
_ID = struct.Struct(">Q")
_FLAG_STR_KEY = 1
_FLAG_METADATA = 2
_KNOWN_FLAGS = _FLAG_STR_KEY | _FLAG_METADATA


def band_table_name(generation: int, index: int) -> bytes:
    """Name of band table ``index`` of banding ``generation``."""
    return f"band.{generation}.{index:04d}".encode("ascii")


def banding_meta(banding: LSHParams, threshold: float, generation: int) -> dict[str, Any]:
    """The ``banding`` meta entry of a store of the current format."""
    return {
        "bands": banding.bands,
        "rows": banding.rows,
        "threshold": threshold,
        "generation": generation,
        "keys": banding.keys,
    }


def banding_from_meta(value: Any, format_version: int) -> tuple[LSHParams, float, int]:
    """``(banding, threshold, generation)`` from a ``banding`` meta entry.

    Raises:
        TypeError, KeyError, ValueError (also InvalidParameterError): it does not decode,
        or its key scheme disagrees with ``format_version``.
    """
    if not isinstance(value, dict):
        raise TypeError("banding is not a map")
    if format_version == 1:
        if "keys" in value:
            raise ValueError("a format 1 store names a band key scheme")
        keys = "fold"
    else:
        keys = value["keys"]
    banding = LSHParams(value["bands"], value["rows"], keys)
    return banding, float(value["threshold"]), value["generation"]


@dataclass(frozen=True)
class BandLayout:
    """Where a band entry (band key, then document id, 8 bytes each, big-endian) goes in a
    band table: the first ``key_bytes`` of the band key form the table key; the value is
    the rest of the band key's first ``band_key_bytes`` followed by the id's last
    ``id_bytes``.

    The table's order is therefore the order of (kept band key bytes, id), and the entries
    of one bucket are adjacent. Dropping the band key's last bytes merges buckets whose
    keys share their first ``band_key_bytes`` (a few spurious candidates, each verified
    like any other); dropping the id's first bytes bounds the ids (:attr:`id_limit`).
    """

    key_bytes: int
    band_key_bytes: int = 8
    id_bytes: int = 8

    @property
    def lead_bytes(self) -> int:
        """How many bytes of the band key lead the value."""
        return self.band_key_bytes - self.key_bytes

    @property
    def value_bytes(self) -> int:
        """The size of a table value: the lead bytes, then the kept id bytes."""
        return self.lead_bytes + self.id_bytes

    @property
    def id_limit(self) -> int:
        """One more than the largest document id the layout can hold."""
        return 1 << (8 * self.id_bytes)

    @functools.cached_property
    def kept_shift(self) -> np.uint64:
        """The right shift that leaves a band key's kept bytes (as an integer)."""
        return np.uint64(64 - 8 * self.band_key_bytes)

    def kept(self, band_keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        """``band_keys`` cut to the bytes that name their buckets: equal exactly when
        the band tables put two entries in one bucket."""
        return band_keys >> self.kept_shift

    @functools.cached_property  # read by every query
    def lowest_value(self) -> bytes:
        """The least value a table can hold: where a bucket with no lead starts."""
        return bytes(self.value_bytes)

    @functools.cached_property
    def id_pad(self) -> bytes:
        """The id's leading zero bytes the layout drops."""
        return bytes(8 - self.id_bytes)

    def bucket(self, band_key: bytes) -> tuple[bytes, bytes]:
        """``(table key, value lead)`` of ``band_key``'s bucket (8 bytes, or as kept)."""
        return band_key[: self.key_bytes], band_key[self.key_bytes : self.band_key_bytes]

    def buckets(self, band_keys: npt.NDArray[np.uint64]) -> list[tuple[bytes, bytes]]:
        """:meth:`bucket` of each of ``band_keys`` (a 1-d array), made by numpy at once.

        A query needs all its bands' buckets; one view of the big-endian keys as
        (table key, lead) records makes every ``bytes`` object in C, where slicing each
        key in Python costs as much again as computing the keys.
        """
        as_buckets = _bucket_view(self.key_bytes, self.lead_bytes)
        return np.ascontiguousarray(band_keys, dtype=">u8").view(as_buckets).tolist()  # type: ignore[no-any-return]

    def entry(self, band_key: bytes, doc_id: bytes) -> tuple[bytes, bytes]:
        """The ``(table key, value)`` of one document's entry."""
        key, lead = self.bucket(band_key)
        return key, lead + doc_id[8 - self.id_bytes :]

    def entries(
        self, band_keys: npt.NDArray[np.uint64], ids: npt.NDArray[np.uint64]
    ) -> Iterator[tuple[bytes, bytes]]:
        """The entries of documents ``ids`` with ``band_keys`` (one band), in table order."""
        order = np.lexsort((ids, self.kept(band_keys)))
        pairs = np.empty((len(order), 2), dtype=">u8")
        pairs[:, 0], pairs[:, 1] = band_keys[order], ids[order]
        raw = pairs.view(np.uint8)
        cut = self.key_bytes
        columns = np.r_[cut : self.band_key_bytes, 16 - self.id_bytes : 16]
        keys = np.ascontiguousarray(raw[:, :cut]).view(f"V{cut}").ravel().tolist()
        values = np.ascontiguousarray(raw[:, columns]).view(f"V{len(columns)}").ravel().tolist()
        return zip(keys, values, strict=True)

    def split(self, key: bytes, value: bytes) -> tuple[bytes, bytes]:
        """``(band key as kept, 8-byte id)`` of a stored entry."""
        lead = self.lead_bytes
        return bytes(key) + bytes(value[:lead]), self.id_pad + bytes(value[lead:])


@functools.cache
def _bucket_view(key_bytes: int, lead_bytes: int) -> np.dtype[Any]:
    """An 8-byte big-endian band key seen as its table key and its value lead."""
    return np.dtype(
        {
            "names": ["key", "lead"],
            "formats": [f"V{key_bytes}", f"V{lead_bytes}"],
            "offsets": [0, key_bytes],
            "itemsize": 8,
        }
    )


PACKED_BAND_ENTRIES = BandLayout(key_bytes=1, band_key_bytes=5, id_bytes=5)
"""Formats 4 and 5: 256 table keys, each holding packed 9-byte values (40-bit band keys, 40-bit
ids)."""
SPLIT_BAND_KEYS = BandLayout(key_bytes=1)
"""Format 3: 256 table keys, each holding packed 15-byte values."""
WHOLE_BAND_KEYS = BandLayout(key_bytes=8)
"""Formats 1 and 2: the band key is the table key, the id the value."""


def band_layout(format_version: int) -> BandLayout:
    """The band table layout of a store of ``format_version``."""
    if format_version >= 4:
        return PACKED_BAND_ENTRIES
    return SPLIT_BAND_KEYS if format_version == 3 else WHOLE_BAND_KEYS


def encode_id(doc_id: int) -> bytes:
    """8-byte big-endian document id (sorts numerically)."""
    return _ID.pack(doc_id)


ID_BYTES = _ID.size
"""Bytes of a document id as ``docs`` and ``removed`` key it."""


def is_id(raw: bytes, limit: int) -> bool:
    """Whether a ``docs`` or ``removed`` key is a document id below ``limit`` (the ids the
    format holds); any other is damage that :func:`~.integrity.check` reports."""
    return len(raw) == ID_BYTES and decode_id(raw) < limit


def decode_id(raw: bytes) -> int:
    """Inverse of :func:`encode_id`.

    Raises:
        CorruptRecordError: ``raw`` (a ``docs`` or ``removed`` key) is not 8 bytes long.
    """
    try:
        return int(_ID.unpack(raw)[0])
    except struct.error:
        raise CorruptRecordError(
            None, f"a document id reads {bytes(raw)!r}, not 8 bytes", BAD_ID_ADVICE
        ) from None


def encode_ids(doc_ids: npt.NDArray[np.uint64]) -> list[bytes]:
    """:func:`encode_id` of each of ``doc_ids``, in one step."""
    return band_key_bytes(doc_ids)


def decode_ids(raw_ids: Iterable[bytes]) -> npt.NDArray[np.uint64]:
    """:func:`decode_id` of each of ``raw_ids`` (8-byte big-endian ids), as one array.

    Raises:
        CorruptRecordError: one of them is not 8 bytes long (as :func:`decode_id`).
    """
    listed = list(raw_ids)
    joined = b"".join(listed)
    if len(joined) != _ID.size * len(listed):
        decode_id(next(raw for raw in listed if len(raw) != _ID.size))
    return np.frombuffer(joined, dtype=">u8").astype(np.uint64)


def encode_band_keys(keys: npt.NDArray[np.uint64]) -> list[bytes]:
    """Band keys as 8-byte big-endian table keys."""
    return band_key_bytes(np.ravel(keys))  # type: ignore[return-value]


def band_key_bytes(values: npt.NDArray[np.uint64]) -> list[Any]:
    """8-byte big-endian ``bytes`` of each value, nested like ``values`` (``tolist``).

    Not ``k.tobytes()`` per element (numpy scalars are native, little-endian order), and
    not slices of one buffer: viewing big-endian words as 8-byte void items lets numpy
    make the ``bytes`` objects, several times faster than slicing in Python.
    """
    return np.ascontiguousarray(values, dtype=">u8").view("V8").tolist()  # type: ignore[no-any-return]


def key_bytes(key: object) -> tuple[bytes, bool]:
    """Validate an external key; return its bytes and whether it is a ``str``.

    Raises:
        InvalidKeyError: wrong type, empty, too long, or a str that is not valid Unicode.
    """
    if isinstance(key, str):
        try:
            raw = key.encode("utf-8")
        except UnicodeEncodeError as err:
            raise InvalidKeyError(key, f"it is not encodable as UTF-8 ({err.reason})") from None
        is_str = True
    elif isinstance(key, (bytes, bytearray, memoryview)):
        raw, is_str = bytes(key), False
    else:
        raise InvalidKeyError(key, f"keys are str or bytes, not {type(key).__name__}")
    if not raw:
        raise InvalidKeyError(key, "keys must not be empty")
    if len(raw) > MAX_KEY_BYTES:
        raise InvalidKeyError(
            key, f"it is {len(raw)} bytes long; keys are at most {MAX_KEY_BYTES} bytes"
        )
    return raw, is_str


def key_index(raw: bytes, is_str: bool) -> bytes:
    """The ``keys`` table key for an external key (see the module docstring)."""
    if len(raw) <= INLINE_KEY_BYTES:
        return (b"s" if is_str else b"b") + raw
    return (b"S" if is_str else b"B") + hashlib.sha256(raw).digest()


def key_of_index(index: bytes) -> str | bytes | None:
    """The external key a ``keys`` table key holds (``None`` for a long key, which only
    its hash names): how a damaged record can still be named by its key."""
    tag, raw = index[:1], index[1:]
    if tag == b"b":
        return raw
    if tag == b"s":
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def pack_metadata(metadata: object) -> bytes | None:
    """Validate and encode user metadata (msgpack, at most 64 KiB); ``None`` stays ``None``.

    Raises:
        MetadataError: not msgpack-serialisable or too large.
    """
    if metadata is None:
        return None
    try:
        packed = msgpack.packb(metadata, use_bin_type=True, strict_types=False)
    except (TypeError, ValueError, OverflowError) as err:
        raise MetadataError(f"it cannot be stored ({err})") from None
    if len(packed) > MAX_METADATA_BYTES:
        raise MetadataError(
            f"it encodes to {len(packed)} bytes; metadata is at most {MAX_METADATA_BYTES} bytes"
        )
    try:  # the safe decoder rejects some encodable values (maps with int or tuple keys)
        _unpack(packed)
    except ValueError as err:
        key_type = _bad_map_key(metadata)
        if key_type is None:
            raise MetadataError(f"it would not read back ({err})") from None
        raise MetadataError(
            f"it would not read back: map keys must be str or bytes, not {key_type.__name__}"
        ) from None
    return packed


def _bad_map_key(value: object) -> type | None:
    """The type of the first map key in ``value`` that is no str or bytes (the decoder
    refuses any other, as a guard against hash flooding), or ``None``. ``value`` packed,
    so its nesting is bounded by msgpack's limit."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, (str, bytes)):
                    return type(key)
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return None


def _unpack(data: bytes) -> Any:
    # unpackb bounds every declared length by len(data), so decoding takes memory
    # proportional to the input; nesting is bounded by msgpack's own stack (StackError).
    return msgpack.unpackb(data, raw=False, strict_map_key=True)


@dataclass(frozen=True)
class DocumentRecord:
    """A decoded ``docs`` record."""

    key: str | bytes
    signature: npt.NDArray[np.uint32]
    metadata: Any


def encode_record(
    raw_key: bytes, is_str: bool, signature: npt.NDArray[np.uint32], metadata: bytes | None
) -> bytes:
    """Encode a document record; ``metadata`` is already packed (:func:`pack_metadata`)."""
    return encode_records([raw_key], [is_str], np.asarray(signature)[None, :], [metadata])[0]


def encode_records(
    raw_keys: Sequence[bytes],
    str_keys: Sequence[bool],
    signatures: npt.NDArray[np.uint32],
    metadata: Sequence[bytes | None],
) -> list[bytes]:
    """:func:`encode_record` of each row of ``signatures`` (``(n, num_perm)``), whose
    little-endian bytes are made for the whole batch in one conversion."""
    signatures = np.ascontiguousarray(signatures, dtype="<u4")
    num_perm = signatures.shape[1]
    rows = signatures.view(f"V{4 * num_perm}").ravel().tolist()
    header, checksum, digest = _HEADER.pack, _CHECKSUM.pack, xxhash.xxh64_intdigest
    records = []
    for raw_key, is_str, row, meta in zip(raw_keys, str_keys, rows, metadata, strict=True):
        flags = (_FLAG_STR_KEY if is_str else 0) | (_FLAG_METADATA if meta is not None else 0)
        body = b"".join(
            (header(RECORD_VERSION, flags, num_perm, len(raw_key)), raw_key, row, meta or b"")
        )
        records.append(body + checksum(digest(body)))
    return records


def _split_record(data: bytes, doc_id: int | None) -> tuple[int, int, bytes, memoryview, bytes]:
    if len(data) < _HEADER.size + _CHECKSUM.size:
        raise CorruptRecordError(doc_id, "record shorter than its header")
    body, (stored,) = data[: -_CHECKSUM.size], _CHECKSUM.unpack(data[-_CHECKSUM.size :])
    if xxhash.xxh64_intdigest(body) != stored:
        raise CorruptRecordError(doc_id, "checksum mismatch")
    version, flags, num_perm, key_len = _HEADER.unpack_from(body)
    if version != RECORD_VERSION:
        raise CorruptRecordError(doc_id, f"record version {version}, expected {RECORD_VERSION}")
    start = _HEADER.size
    sig_end = start + key_len + 4 * num_perm
    if sig_end > len(body):
        raise CorruptRecordError(doc_id, "lengths overrun the record")
    if not _layout_ok(flags, sig_end, len(body)):
        raise CorruptRecordError(doc_id, _layout_fault(flags, sig_end, len(body)))
    raw_key = body[start : start + key_len]
    return flags, num_perm, raw_key, memoryview(body)[start + key_len : sig_end], body[sig_end:]


def _layout_ok(flags: int, sig_end: int, body_end: int) -> bool:
    """Whether the flags are known and metadata follows the signature exactly when flag
    bit 1 says so (a record is nothing but its parts)."""
    return flags <= _KNOWN_FLAGS and (sig_end < body_end) == (flags >= _FLAG_METADATA)


def _layout_fault(flags: int, sig_end: int, body_end: int) -> str:
    if flags & ~_KNOWN_FLAGS:
        return f"unknown flags {flags:#04x}"
    if flags & _FLAG_METADATA:
        return "the metadata flag is set but no metadata follows the signature"
    return f"{body_end - sig_end} bytes follow the signature without the metadata flag"


def decode_record(data: bytes, doc_id: int | None = None) -> DocumentRecord:
    """Decode and verify a document record.

    Raises:
        CorruptRecordError: checksum mismatch, unknown record version or bad lengths.
    """
    flags, _, raw_key, signature, metadata = _split_record(data, doc_id)
    try:  # msgpack's and UTF-8's decoding errors are all ValueErrors
        key: str | bytes = raw_key.decode("utf-8") if flags & _FLAG_STR_KEY else raw_key
        meta = _unpack(metadata) if flags & _FLAG_METADATA else None
    except ValueError as err:
        raise CorruptRecordError(doc_id, f"undecodable key or metadata ({err})") from None
    return DocumentRecord(key, np.frombuffer(signature, dtype="<u4").astype(np.uint32), meta)


def decode_signature(data: bytes, doc_id: int | None = None) -> npt.NDArray[np.uint32]:
    """Only the signature of a record (verified), without decoding key or metadata."""
    _, _, _, signature, _ = _split_record(data, doc_id)
    return np.frombuffer(signature, dtype="<u4")


def decode_signatures(
    records: Sequence[tuple[bytes, bytes]], num_perm: int
) -> npt.NDArray[np.uint32]:
    """The signatures of ``(id, record)`` pairs as one ``(n, num_perm)`` matrix, each record
    verified as by :func:`decode_signature` and holding ``num_perm`` values.

    Per record only the checksum, the header and one slice: the matrix is made in one
    step, not an array per record (removal and rebuilds read signatures by the thousand).
    """
    width = 4 * num_perm
    least = _HEADER.size + width  # and the checksum after it
    header, stored, digest = _HEADER.unpack_from, _CHECKSUM.unpack_from, xxhash.xxh64_intdigest
    rows = []
    for raw_id, data in records:
        end = len(data) - _CHECKSUM.size
        if end < least or digest(data[:end]) != stored(data, end)[0]:
            _split_record(bytes(data), decode_id(raw_id))  # raises the exact reason
        version, flags, perm, key_len = header(data)
        start = _HEADER.size + key_len
        if (
            version != RECORD_VERSION
            or perm != num_perm
            or start + width > end
            or flags > _KNOWN_FLAGS  # :func:`_layout_ok`, inline: this runs once a record
            or (start + width < end) != (flags >= _FLAG_METADATA)
        ):
            doc_id = decode_id(raw_id)
            _split_record(bytes(data), doc_id)
            raise CorruptRecordError(doc_id, f"signature of {perm} values, expected {num_perm}")
        rows.append(data[start : start + width])
    signatures = np.frombuffer(b"".join(rows), dtype="<u4").reshape(len(rows), num_perm)
    return signatures.astype(np.uint32)


def record_key_and_signature(
    data: bytes, doc_id: int | None = None
) -> tuple[bytes, bool, npt.NDArray[np.uint32]]:
    """The key (bytes, is it a ``str``) and signature of a record, verified once."""
    flags, _, raw_key, signature, _ = _split_record(data, doc_id)
    return raw_key, bool(flags & _FLAG_STR_KEY), np.frombuffer(signature, dtype="<u4")


def record_key(data: bytes, doc_id: int | None = None) -> tuple[bytes, bool]:
    """Only the key of a record (verified): its bytes and whether it is a ``str``."""
    flags, _, raw_key, _, _ = _split_record(data, doc_id)
    return raw_key, bool(flags & _FLAG_STR_KEY)


def meta_checksum(raw: dict[str, bytes]) -> int:
    """Checksum of the stored bytes of the :data:`SEALED_META` entries (missing: empty)."""
    digest = xxhash.xxh64()
    for name in SEALED_META:
        value = raw.get(name, b"")
        digest.update(struct.pack("<I", len(value)) + value)
    return digest.intdigest()


def pack_meta(value: object) -> bytes:
    """Encode a ``meta`` value."""
    return msgpack.packb(value, use_bin_type=True)


def unpack_meta(data: bytes) -> Any:
    """Decode a ``meta`` value (never executes code)."""
    return _unpack(data)


def read_meta(txn: Any, db: Any, name: str) -> Any:
    """The value of ``meta`` entry ``name`` in ``db``, or ``None`` when it is missing or
    does not decode (damage, which check reports)."""
    raw = txn.get(name.encode(), db=db)
    try:
        return None if raw is None else unpack_meta(raw)
    except ValueError:
        return None


def sealed(value: Any) -> tuple[bytes, int]:
    """``value`` packed, and the xxh64 of those bytes: how an export (version 3 on) carries
    what a reader acts on, so that damage to the file is refused, not imported."""
    body = msgpack.packb(value, use_bin_type=True)
    return body, xxhash.xxh64_intdigest(body)


def unsealed(body: object, checksum: object) -> Any:
    """Inverse of :func:`sealed`.

    Raises:
        ValueError: ``body`` is not bytes with that checksum, or not msgpack.
    """
    if not isinstance(body, bytes) or xxhash.xxh64_intdigest(body) != checksum:
        raise ValueError("its checksum does not match its bytes")
    return _unpack(body)


def export_header(config: dict[str, Any], banding: dict[str, Any], package_version: str) -> bytes:
    """The first object of an export stream."""
    body, checksum = sealed(
        {"config": config, "banding": banding, "package_version": package_version}
    )
    return msgpack.packb(
        {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "body": body, "checksum": checksum},
        use_bin_type=True,
    )


def export_item(key: str | bytes, signature: bytes, metadata: Any) -> bytes:
    """One record of an export stream, from its parts (``signature``: uint32 LE bytes)."""
    return msgpack.packb(list(sealed([key, signature, metadata])), use_bin_type=True)


def export_record(record: DocumentRecord) -> bytes:
    """One document of an export stream."""
    signature = np.ascontiguousarray(record.signature, dtype="<u4").tobytes()
    return export_item(record.key, signature, record.metadata)


def export_trailer(documents: int) -> bytes:
    """The last object of an export stream: its end, and how many records came before."""
    return msgpack.packb({"end": EXPORT_FORMAT, "documents": documents}, use_bin_type=True)


STREAM_MAX_OBJECT_BYTES = 1 << 20
"""The largest object an export stream may hold: a record is at most a key
(:data:`MAX_KEY_BYTES`), a signature (4 bytes × 8192) and metadata
(:data:`MAX_METADATA_BYTES`), about 112 KiB, so 1 MiB leaves room and bounds the memory a
crafted stream can make the reader take."""
STREAM_MAX_ITEMS = MAX_METADATA_BYTES
"""Elements of one array or map: metadata of 64 KiB cannot hold more."""


def stream_unpacker(stream: Any) -> msgpack.Unpacker:
    """A safe msgpack reader for an export stream: no code execution (no hooks: an
    extension type comes back as inert ``ExtType`` data) and bounded memory (no object
    may need more than :data:`STREAM_MAX_OBJECT_BYTES` of buffer, and every declared
    length is checked against a limit)."""
    return msgpack.Unpacker(
        stream,
        raw=False,
        strict_map_key=True,
        max_buffer_size=STREAM_MAX_OBJECT_BYTES,
        max_bin_len=STREAM_MAX_OBJECT_BYTES // 2,
        max_str_len=STREAM_MAX_OBJECT_BYTES // 2,
        max_array_len=STREAM_MAX_ITEMS,
        max_map_len=STREAM_MAX_ITEMS,
    )
