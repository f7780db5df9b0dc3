"""A pure-Python reader of LMDB's page structure, to verify a ``data.mdb`` file.

LMDB keeps no checksums and trusts every byte it reads: a flipped page number or length
reads back as wrong data, makes the engine raise, or makes it read outside the map and
crash the process. :func:`walk` reads the file itself, with plain ``struct`` parsing and
a bounds check before every read, so no byte pattern can crash it, and verifies what the
engine assumes:

* both meta pages are well formed, and their transaction ids are consecutive with the
  parity of their page (LMDB writes transaction ``t`` to meta page ``t % 2``), so a
  flipped id cannot silently make the engine open an older snapshot;
* every B-tree (the free list, the main table of names, each named table and each
  duplicate sub-table) has pages of the right kind, number and depth, nodes inside their
  page, keys in order and inside the range their parent gives them, and the page and entry
  counts its table record claims;
* every page up to the last one in use belongs to exactly one tree or to the free list,
  so a damaged free list cannot later hand out a page that still holds data. The last
  page in use may lie past the end of the file, inside the map: LMDB counts the pages
  a transaction allocated and freed again before its commit, and never writes them (a
  transaction that deletes much of what it wrote, such as one ending with a purge,
  leaves them). Those must be free; a tree page past the end is damage.

It reads the on-disk format of LMDB 0.9 (data version 1) on 64-bit builds. Only the pages
of one snapshot are read; while a read transaction holds that snapshot, writers of other
processes never overwrite them, so a live store can be walked.

:func:`walk` also returns, when asked, where each part of the file lies (for the
corruption trials, which classify a flipped byte by what it hit).
"""

from __future__ import annotations

import itertools
import mmap
import os
import platform
import struct
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
PAGE_HEADER = 16
NODE_HEADER = 8
NO_PAGE = 0xFFFFFFFFFFFFFFFF

P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_LEAF2, P_SUBP = 0x01, 0x02, 0x04, 0x08, 0x20, 0x40
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
DUPSORT, INTEGERKEY, DUPFIXED = 0x04, 0x08, 0x10
_UNSUPPORTED = 0x02 | 0x20 | 0x40  # REVERSEKEY, INTEGERDUP, REVERSEDUP: other orders
MAX_DEPTH = 32  # LMDB's cursor stack

_PAGE = struct.Struct("<QHHHH")  # pgno, pad (LEAF2 key size), flags, lower, upper
_OVERFLOW_PAGES = struct.Struct("<I")  # at offset 12 of an overflow page
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, ksize
_DB = struct.Struct("<IHHQQQQQ")  # pad, flags, depth, branch, leaf, overflow, entries, root
_META = struct.Struct("<IIQQ")  # magic, version, address, map size; then two _DB, last, txn
_U64 = struct.Struct("<Q")

FREE_LIST = "(free list)"
MAIN = "(main)"
STRAY_ENTRY = "main table entry "
"""How the walk names an entry of the main table that is no table record (a problem that
leaves every table readable)."""
FREE = "(free)"


@dataclass(frozen=True)
class TableRecord:
    """An ``MDB_db`` record: a B-tree's root and the counts LMDB keeps about it."""

    pad: int
    flags: int
    depth: int
    branch_pages: int
    leaf_pages: int
    overflow_pages: int
    entries: int
    root: int

    @classmethod
    def parse(cls, raw: bytes | memoryview) -> TableRecord:
        return cls(*_DB.unpack(raw))


@dataclass(frozen=True)
class MetaPage:
    """One of LMDB's two meta pages."""

    page: int
    magic: int
    version: int
    map_size: int
    free_list: TableRecord
    main: TableRecord
    last_page: int
    txnid: int

    @property
    def page_size(self) -> int:
        return self.free_list.pad  # LMDB keeps the page size in the free list's pad


@dataclass(frozen=True)
class Span:
    """Bytes ``[start, end)`` of the file: what they hold (``part``) and in which tree."""

    start: int
    end: int
    tree: str
    part: str  # [branch-]page-header, node-header, key; value, slack, free, meta, unused
    key: bytes = b""  # for a value: the key it belongs to


@dataclass
class FileReport:
    """What :func:`walk` found.

    Attributes:
        problems: every broken structural rule, in words (empty when sound).
        txnid: the snapshot walked.
        page_size: LMDB's page size.
        last_page: the last page in use in that snapshot.
        entries: entries per named table (duplicates counted), as walked.
        owners: which tree each page belongs to (``FREE`` for the free list's pages).
        spans: byte ranges by meaning, when :func:`walk` was asked for them.
        stale: the snapshot asked for is no longer on a meta page (writers committed
            twice since it began): nothing was walked, and nothing is wrong.
    """

    problems: list[str] = field(default_factory=list)
    txnid: int | None = None
    page_size: int = 0
    last_page: int = 0
    entries: dict[bytes, int] = field(default_factory=dict)
    owners: dict[int, str] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    stale: bool = False


class _DamagedError(Exception):
    """A tree cannot be walked further (its problem is already recorded)."""


META_BYTES = _META.size + 2 * _DB.size + 16
"""A meta page's fields after its page header (the last page and transaction ids last)."""
FIRST_META_END = PAGE_HEADER + META_BYTES
"""The bytes a ``data.mdb`` needs before LMDB can read anything of it (its first meta
page's): a shorter one is "not an LMDB file" to LMDB."""


def read_meta_pages(data: bytes | memoryview | mmap.mmap) -> list[MetaPage | str]:
    """Both meta pages, each parsed or a description of why it cannot be."""
    pages: list[MetaPage | str] = []
    size = META_BYTES
    for index in range(2):
        # The page size is not known before a meta page is read; LMDB finds page 1 at the
        # page size recorded in page 0. The header reads need only the first bytes.
        offset = index * _page_size_hint(data)
        if offset + PAGE_HEADER + size > len(data):
            pages.append(f"meta page {index} lies beyond the end of the file")
            continue
        pgno, _, flags, _, _ = _PAGE.unpack_from(data, offset)
        if not flags & P_META or pgno != index:
            pages.append(f"meta page {index} has page number {pgno} and flags {flags:#x}")
            continue
        base = offset + PAGE_HEADER
        magic, version, _, map_size = _META.unpack_from(data, base)
        free_list = TableRecord.parse(data[base + _META.size : base + _META.size + _DB.size])
        main_at = base + _META.size + _DB.size
        main = TableRecord.parse(data[main_at : main_at + _DB.size])
        last, txnid = struct.unpack_from("<QQ", data, main_at + _DB.size)
        pages.append(MetaPage(index, magic, version, map_size, free_list, main, last, txnid))
    return pages


def _page_size_hint(data: bytes | memoryview | mmap.mmap) -> int:
    at = PAGE_HEADER + _META.size
    if len(data) < at + 4:
        return 4096
    size = struct.unpack_from("<I", data, at)[0]
    return size if size in _PAGE_SIZES else 4096


_PAGE_SIZES = frozenset(1 << n for n in range(9, 17))


def check_meta_pages(metas: list[MetaPage | str]) -> list[str]:
    """What is wrong with LMDB's meta pages (see the module docstring)."""
    problems = [m for m in metas if isinstance(m, str)]
    good = [m for m in metas if isinstance(m, MetaPage)]
    for meta in good:
        where = f"meta page {meta.page}"
        if meta.magic != MAGIC:
            problems.append(f"{where}: magic {meta.magic:#x}, not an LMDB meta page")
        if meta.version != DATA_VERSION:
            problems.append(f"{where}: data version {meta.version}, expected {DATA_VERSION}")
        if meta.page_size not in _PAGE_SIZES:
            problems.append(f"{where}: page size {meta.page_size} is not a power of two")
        elif (meta.last_page + 1) * meta.page_size > meta.map_size:
            problems.append(f"{where}: last page {meta.last_page} lies beyond the map")
        if meta.main.pad or meta.main.flags & (_UNSUPPORTED | DUPSORT | DUPFIXED):
            problems.append(f"{where}: the main table's record is damaged")
        if meta.txnid and meta.txnid % 2 != meta.page:
            problems.append(f"{where}: transaction {meta.txnid} cannot be on this page")
    if len(good) == 2:
        first, second = good
        if abs(first.txnid - second.txnid) != 1:
            problems.append(
                f"meta pages hold transactions {first.txnid} and {second.txnid}, "
                "which are not consecutive"
            )
        if first.page_size != second.page_size:
            problems.append("the meta pages disagree on the page size")
    return problems


class _Walker:
    def __init__(self, data: bytes | memoryview | mmap.mmap, meta: MetaPage, spans: bool) -> None:
        self.data = data
        self.psize = meta.page_size
        self.last = meta.last_page
        self.report = FileReport(txnid=meta.txnid, page_size=self.psize, last_page=self.last)
        self.record_spans = spans

    # -- bookkeeping ------------------------------------------------------------------

    def problem(self, text: str) -> None:
        self.report.problems.append(text)

    def fail(self, text: str) -> _DamagedError:
        self.problem(text)
        return _DamagedError(text)

    def span(self, start: int, end: int, tree: str, part: str, key: bytes = b"") -> None:
        if self.record_spans and end > start:
            self.report.spans.append(Span(start, end, tree, part, key))

    def claim(self, pgno: int, tree: str) -> None:
        if not 2 <= pgno <= self.last:
            raise self.fail(f"{tree}: page {pgno} is outside pages 2..{self.last}")
        owner = self.report.owners.get(pgno)
        if owner is not None:
            raise self.fail(f"{tree}: page {pgno} is also used by {owner}")
        self.report.owners[pgno] = tree

    def page(self, pgno: int, tree: str) -> tuple[int, memoryview]:
        """Claim a page; return its file offset and bytes, header checked."""
        self.claim(pgno, tree)
        offset = pgno * self.psize
        page = memoryview(self.data)[offset : offset + self.psize]
        if len(page) < self.psize:
            raise self.fail(f"{tree}: page {pgno} lies beyond the end of the file")
        number = _U64.unpack_from(page)[0]
        if number != pgno:
            raise self.fail(f"{tree}: page {pgno} says it is page {number}")
        self.span(offset, offset + PAGE_HEADER, tree, "page-header")
        return offset, page

    # -- trees ------------------------------------------------------------------------

    def tree(self, record: TableRecord, tree: str, *, fixed: int = 0) -> int:
        """Walk one B-tree; return its entry count (duplicates included).

        ``fixed`` is the value size of a DUPFIXED duplicate sub-table (its leaves are
        LEAF2 pages of keys only).
        """
        if record.flags & _UNSUPPORTED:
            raise self.fail(f"{tree}: table flags {record.flags:#x} are not ones a store uses")
        counts = [0, 0, 0, 0]  # branch, leaf, overflow pages; entries
        if record.root == NO_PAGE:
            if record.depth or record.entries:
                raise self.fail(f"{tree}: empty table records depth {record.depth}")
            return 0
        if not 1 <= record.depth <= MAX_DEPTH:
            raise self.fail(f"{tree}: depth {record.depth} is out of range")
        self.node_tree(record, tree, fixed, record.root, 1, None, None, counts)
        claimed = (record.branch_pages, record.leaf_pages, record.overflow_pages, record.entries)
        if record.flags & DUPSORT:
            # LMDB's page counters of a duplicate-sorted table drift when duplicates move
            # between sub-pages and sub-tables (seen on healthy stores: one leaf page too
            # many), so only its entry count is compared; every page is still accounted
            # for by the walk itself.
            counts[:3] = claimed[:3]
        if tuple(counts) != claimed:
            self.problem(
                f"{tree}: table record says (branch, leaf, overflow pages, entries) = "
                f"{claimed}, the tree has {tuple(counts)}"
            )
        return counts[3]

    def node_tree(
        self,
        record: TableRecord,
        tree: str,
        fixed: int,
        pgno: int,
        depth: int,
        low: bytes | None,
        high: bytes | None,
        counts: list[int],
    ) -> None:
        offset, page = self.page(pgno, tree)
        _, pad, flags, lower, upper = _PAGE.unpack_from(page)
        is_leaf = depth == record.depth
        if is_leaf:
            want = P_LEAF | (P_LEAF2 if fixed else 0)
            if flags & ~0x10 != want:  # P_DIRTY may linger on written pages
                raise self.fail(f"{tree}: page {pgno} has flags {flags:#x}, expected a leaf")
            counts[1] += 1
        else:
            if flags & ~0x10 != P_BRANCH:
                raise self.fail(f"{tree}: page {pgno} has flags {flags:#x}, expected a branch")
            counts[0] += 1
        if fixed and is_leaf:
            keys = self.fixed_keys(page, offset, tree, pgno, pad, fixed, lower)
            self.in_order(keys, tree, pgno, low, high, record.flags)
            counts[3] += len(keys)
            return
        nodes = self.nodes(page, offset, tree, pgno, lower, upper, "" if is_leaf else "branch-")
        if (not is_leaf and len(nodes) < 2) or not nodes:
            raise self.fail(f"{tree}: page {pgno} has {len(nodes)} nodes")
        keys = [key for _, key, _, _ in nodes]
        self.in_order(keys[0 if is_leaf else 1 :], tree, pgno, low, high, record.flags)
        if is_leaf:
            for node_flags, key, size, data_at in nodes:
                counts[3] += self.leaf_value(record, tree, key, node_flags, size, data_at, counts)
            return
        for index, (node_flags, key, size, _) in enumerate(nodes):
            child = size | node_flags << 32  # branch nodes keep the child in lo, hi, flags
            child_low = low if index == 0 else key
            child_high = nodes[index + 1][1] if index + 1 < len(nodes) else high
            self.node_tree(record, tree, fixed, child, depth + 1, child_low, child_high, counts)

    def nodes(
        self,
        page: memoryview,
        offset: int,
        tree: str,
        pgno: int,
        lower: int,
        upper: int,
        kind: str = "",
    ) -> list[tuple[int, bytes, int, int]]:
        """``(flags, key, data size, data offset in file)`` of each node of a page."""
        size = len(page)
        if not PAGE_HEADER <= lower <= upper <= size or (lower - PAGE_HEADER) % 2:
            raise self.fail(f"{tree}: page {pgno} has free-space bounds {lower}..{upper}")
        self.span(offset + PAGE_HEADER, offset + lower, tree, "page-header")
        self.span(offset + lower, offset + upper, tree, "slack")
        count = (lower - PAGE_HEADER) // 2
        found = []
        for index in range(count):
            at = struct.unpack_from("<H", page, PAGE_HEADER + 2 * index)[0]
            if not upper <= at <= size - NODE_HEADER:
                raise self.fail(f"{tree}: page {pgno} node {index} starts outside the page")
            lo, hi, flags, ksize = _NODE.unpack_from(page, at)
            key_at = at + NODE_HEADER
            if key_at + ksize > size:
                raise self.fail(f"{tree}: page {pgno} node {index} key overruns the page")
            self.span(offset + at, offset + key_at, tree, kind + "node-header")
            self.span(offset + key_at, offset + key_at + ksize, tree, kind + "key")
            found.append((flags, bytes(page[key_at : key_at + ksize]), lo | hi << 16,
                          offset + key_at + ksize))  # fmt: skip
        return found

    def fixed_keys(
        self,
        page: memoryview,
        offset: int,
        tree: str,
        pgno: int,
        pad: int,
        fixed: int,
        lower: int,
    ) -> list[bytes]:
        count = (lower - PAGE_HEADER) // 2
        end = PAGE_HEADER + count * fixed
        if pad != fixed or lower < PAGE_HEADER or end > len(page):
            raise self.fail(f"{tree}: fixed-size page {pgno} has a bad key size or count")
        self.span(offset + PAGE_HEADER, offset + end, tree, "key")
        self.span(offset + end, offset + len(page), tree, "slack")
        return [bytes(page[i : i + fixed]) for i in range(PAGE_HEADER, end, fixed)]

    def in_order(
        self,
        keys: list[bytes],
        tree: str,
        pgno: int,
        low: bytes | None,
        high: bytes | None,
        flags: int,
    ) -> None:
        order = _integer_order if flags & INTEGERKEY else bytes
        values = [order(key) for key in keys]
        if low is not None:
            values.insert(0, order(low))  # the first key may equal the parent's separator
            if values[1:] and values[1] < values[0]:
                raise self.fail(f"{tree}: keys of page {pgno} are below their parent's range")
            values = values[1:]
        if any(a >= b for a, b in itertools.pairwise(values)):  # type: ignore[operator]
            raise self.fail(f"{tree}: keys of page {pgno} are out of order")
        if high is not None and values and not values[-1] < order(high):  # type: ignore[operator]
            raise self.fail(f"{tree}: keys of page {pgno} pass the bound its parent sets")

    def leaf_value(
        self,
        record: TableRecord,
        tree: str,
        key: bytes,
        flags: int,
        size: int,
        data_at: int,
        counts: list[int],
    ) -> int:
        """Check one leaf node's value; return how many entries it holds."""
        if flags & F_BIGDATA:
            if flags & (F_SUBDATA | F_DUPDATA):
                raise self.fail(f"{tree}: node {key!r} has flags {flags:#x}")
            value = self.overflow(tree, key, size, data_at, counts)
        else:  # a page of duplicates is recorded by its parts
            value = self.inline(tree, key, size, data_at, not flags & F_DUPDATA)
        if tree == MAIN:
            if flags != F_SUBDATA or size != _DB.size:
                # Its bytes lie within the page (read above), and no other table depends
                # on it: the walk goes on to the tables after it.
                self.problem(f"{STRAY_ENTRY}{key!r} is not a table record")
                return 1
            self.named_tables[key] = TableRecord.parse(value)
            return 1
        if tree == FREE_LIST:
            self.free_pages(key, value)
            return 1
        if not flags & F_DUPDATA:
            if flags & F_SUBDATA:
                raise self.fail(f"{tree}: node {key!r} has flags {flags:#x}")
            return 1
        if not record.flags & DUPSORT:
            raise self.fail(f"{tree}: node {key!r} holds duplicates in a unique table")
        dupfixed = bool(record.flags & DUPFIXED)
        if flags & F_SUBDATA:
            if size != _DB.size:
                raise self.fail(f"{tree}: node {key!r} has a bad duplicate table record")
            sub = TableRecord.parse(value)
            if dupfixed != bool(sub.flags & DUPFIXED) or (dupfixed and not sub.pad):
                raise self.fail(f"{tree}: duplicates of {key!r} have flags {sub.flags:#x}")
            return self.tree(sub, tree, fixed=sub.pad if dupfixed else 0)
        return self.sub_page(tree, key, value, data_at, dupfixed, record.flags)

    def inline(self, tree: str, key: bytes, size: int, data_at: int, record: bool = True) -> bytes:
        page_end = (data_at // self.psize + 1) * self.psize
        if data_at + size > page_end:
            raise self.fail(f"{tree}: the value of {key!r} overruns its page")
        if record:
            self.span(data_at, data_at + size, tree, "value", key)
        return bytes(self.data[data_at : data_at + size])

    def overflow(self, tree: str, key: bytes, size: int, data_at: int, counts: list[int]) -> bytes:
        pointer = self.inline(tree, key, 8, data_at)
        first = _U64.unpack(pointer)[0]
        pages = (PAGE_HEADER - 1 + size) // self.psize + 1
        offset, page = self.page(first, tree)
        _, _, flags, _, _ = _PAGE.unpack_from(page)
        recorded = _OVERFLOW_PAGES.unpack_from(page, 12)[0]
        if flags & ~0x10 != P_OVERFLOW or recorded != pages:
            raise self.fail(f"{tree}: overflow page {first} of {key!r} is damaged")
        for extra in range(first + 1, first + pages):
            self.claim(extra, tree)
        end = offset + PAGE_HEADER + size
        if end > len(self.data):
            raise self.fail(f"{tree}: overflow pages of {key!r} lie beyond the file")
        counts[2] += pages
        self.span(offset + PAGE_HEADER, end, tree, "value", key)
        self.span(end, offset + pages * self.psize, tree, "slack")
        return bytes(self.data[offset + PAGE_HEADER : end])

    def sub_page(
        self, tree: str, key: bytes, value: bytes, data_at: int, dupfixed: bool, flags: int
    ) -> int:
        if len(value) < PAGE_HEADER:
            raise self.fail(f"{tree}: duplicates of {key!r} are shorter than a page header")
        _, pad, page_flags, lower, upper = _PAGE.unpack_from(value)
        want = P_LEAF | P_SUBP | (P_LEAF2 if dupfixed else 0)
        if page_flags & ~0x10 != want:
            raise self.fail(f"{tree}: duplicates of {key!r} have page flags {page_flags:#x}")
        page = memoryview(value)
        self.span(data_at, data_at + PAGE_HEADER, tree, "page-header")
        if dupfixed:
            if not pad:
                raise self.fail(f"{tree}: duplicates of {key!r} have value size 0")
            keys = self.fixed_keys(page, data_at, tree, 0, pad, pad, lower)
        else:
            keys = [k for _, k, _, _ in self.nodes(page, data_at, tree, 0, lower, upper)]
        if not keys:
            raise self.fail(f"{tree}: duplicates of {key!r} are empty")
        self.in_order(keys, tree, 0, None, None, flags)
        return len(keys)

    def free_pages(self, key: bytes, value: bytes) -> None:
        if len(key) != 8 or len(value) < 8 or len(value) % 8:
            raise self.fail(f"free list entry {key.hex()} is malformed")
        numbers = struct.unpack(f"<{len(value) // 8}Q", value)
        if numbers[0] != len(numbers) - 1:
            raise self.fail(f"free list entry {key.hex()} has a wrong page count")
        for pgno in numbers[1:]:
            self.claim(pgno, FREE)
            if self.record_spans:
                self.span(pgno * self.psize, (pgno + 1) * self.psize, FREE, "free")

    # -- the whole file -----------------------------------------------------------------

    def run(self, meta: MetaPage, tables: dict[bytes, int] | None) -> FileReport:
        self.named_tables: dict[bytes, TableRecord] = {}
        for name, record in ((FREE_LIST, meta.free_list), (MAIN, meta.main)):
            plain = record if name == MAIN else _without_env_flags(record)
            with suppress(_DamagedError):
                self.tree(plain, name)
        for name, record in sorted(self.named_tables.items()):
            label = name.decode("ascii", "backslashreplace")
            if tables is not None and name in tables and record.flags != tables[name]:
                self.problem(f"{label}: table flags {record.flags:#x}, expected {tables[name]:#x}")
                continue
            with suppress(_DamagedError):
                self.report.entries[name] = self.tree(record, label)
        for name in sorted(set(tables or ()) - set(self.named_tables)):
            self.problem(f"table {name!r} is not in the main table")
        unowned = [p for p in range(2, self.last + 1) if p not in self.report.owners]
        if unowned and not self.report.problems:
            shown = ", ".join(map(str, unowned[:5])) + (" ..." if len(unowned) > 5 else "")
            self.problem(f"{len(unowned)} pages are neither in use nor free: {shown}")
        if self.record_spans:
            for pgno in unowned:
                self.span(pgno * self.psize, (pgno + 1) * self.psize, "(unowned)", "unused")
        return self.report


def _without_env_flags(record: TableRecord) -> TableRecord:
    """The free list's record with its page size and environment flags set aside."""
    return TableRecord(0, INTEGERKEY, *_astuple(record)[2:])


def _astuple(record: TableRecord) -> tuple[int, ...]:
    return (
        record.pad, record.flags, record.depth, record.branch_pages, record.leaf_pages,
        record.overflow_pages, record.entries, record.root,
    )  # fmt: skip


def _integer_order(key: bytes) -> int:
    return int.from_bytes(key, "little")


@contextmanager
def _mapped(path: Path) -> Iterator[mmap.mmap | bytes]:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            yield b""
            return
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        try:
            yield mapped
        finally:
            _unmap(mapped)
    finally:
        os.close(fd)


def _unmap(mapped: mmap.mmap) -> None:
    """Unmap now unless views of the map are alive, as they are in the frames of an error
    propagating from the walk: then the garbage collector unmaps it once they are gone, and
    the error (a Ctrl-C, say) goes on as itself instead of becoming ``BufferError``."""
    with suppress(BufferError):
        mapped.close()


CUT_SHORT_ATTEMPTS = 3
"""How many times :func:`cut_short` reads the file again when a writer committed while it
read (its answer is then about a snapshot that may be gone)."""


def cut_short(path: str | os.PathLike[str]) -> str | None:
    """Why ``data.mdb`` at ``path`` is too short for the newest snapshot its meta pages
    describe, or ``None`` when every page of that snapshot's trees lies in the file (or
    the meta pages cannot tell; LMDB's own open then says what is wrong).

    LMDB reads the file through a map as large as the map size, so a tree page past the
    end of a cut file (an interrupted copy or restore, a full disk) kills the process
    with SIGBUS at the first read of it, and the meta table's leaf, copied on every
    write, is usually among the last pages. A sound file may end before its last page
    too (the pages a transaction took and freed again are counted but never written,
    see the module docstring); those are free. So this costs two page reads when the
    file holds every page, and otherwise one walk of the free list, which must hold
    every page from the end of the file on; only a damaged file is walked whole
    (:func:`_pages_past_end`). A writer of another process never overwrites the pages
    of the newest snapshot before it commits the next one, so a read that began and
    ended on the same newest transaction, with the file as long as it was mapped, is of
    one snapshot; one that did not is read again.
    """
    for _ in range(CUT_SHORT_ATTEMPTS):
        with _mapped(Path(path)) as data:
            newest, mapped = _newest_meta(data), len(data)
            if newest is None:
                return None
            problem = _pages_past_end(data, newest)
        if problem is None:
            return None
        # The map's length is the file's when it was mapped; a commit between that and
        # the meta read wrote its pages past it (LMDB writes the pages, then the meta).
        # So the answer stands only if neither the snapshot nor the file has changed.
        with open(path, "rb") as file:
            again = _newest_meta(file.read(2 * max(_PAGE_SIZES)))
            grown = os.fstat(file.fileno()).st_size != mapped
        if again is not None and again.txnid == newest.txnid and not grown:
            return problem
    return None  # writers keep committing: a live file, which LMDB itself is writing


def _newest_meta(data: bytes | mmap.mmap) -> MetaPage | None:
    """The meta page LMDB opens (the higher transaction id), if one is usable."""
    good = [
        meta
        for meta in read_meta_pages(data)
        if isinstance(meta, MetaPage) and meta.magic == MAGIC and meta.page_size in _PAGE_SIZES
    ]
    return max(good, key=lambda meta: meta.txnid, default=None)


def _pages_past_end(data: bytes | mmap.mmap, meta: MetaPage) -> str | None:
    """Which page of ``meta``'s trees lies past the end of ``data``, in words, or ``None``
    if none does.

    The free list is walked first: when every page past the end is in it, that is all.
    Otherwise the whole snapshot is walked (the file is damaged either way), to tell a
    file cut short, whose trees reach past its end, from a damaged meta page or free
    list, which leave the pages past the end unowned: the open passes those over, and
    :func:`walk` (``check``) reports them.
    """
    size, psize = len(data), meta.page_size
    reach = (meta.last_page + 1) * psize
    if size >= reach or reach > meta.map_size:  # (past the map: a damaged meta page)
        return None
    start = max(size // psize, 2)  # the first page not wholly in the file (or no meta)
    walker = _Walker(data, meta, spans=False)
    with suppress(_DamagedError):
        walker.tree(_without_env_flags(meta.free_list), FREE_LIST)
    free = sum(page >= start for page, owner in walker.report.owners.items() if owner == FREE)
    # Free pages are distinct and at most the last page, so counting those past the end
    # tells whether all of them are free, without a loop over a damaged, huge last page.
    if not walker.report.problems and free == meta.last_page + 1 - start:
        return None
    owners = _Walker(data, meta, spans=False).run(meta, None).owners
    beyond = sorted((page, tree) for page, tree in owners.items() if page >= start and tree != FREE)
    if not beyond:
        return None
    page, tree = beyond[0]
    return (
        f"data.mdb is {size} bytes, short of the {reach} its pages reach, and page {page} "
        f"of {tree} lies past its end: the file was cut short"
    )


LOCK_FORMAT = 0x10001
"""``mtb_format`` of the lock file LMDB 0.9 writes with POSIX mutexes (``MDB_LOCK_FORMAT``:
lock version 1, ``MDB_PIDLOCK``; LMDB's ``mdb.c``)."""
_LOCK_TXNID_AT = {"x86_64": 48, "amd64": 48}
"""Where the lock file keeps the id of the last committed transaction (``mtb_txnid``):
after the magic, the format and the reader table's ``pthread_mutex_t`` (40 bytes on
x86-64; LMDB's ``mdb.c``, struct ``MDB_txbody``). Elsewhere it is not read."""


def lock_file_txnid(path: str | os.PathLike[str]) -> int | None:
    """The id of the last transaction committed to the environment, as its lock file
    ``lock.mdb`` at ``path`` records it, or ``None`` where that is not known (no such
    file, another layout, or a machine whose layout is not listed above).

    LMDB keeps the id there for its own convenience, and sets it at each commit and when
    a process opens the environment first; it survives the data file, so it tells a
    ``data.mdb`` cut to nothing from one a creation never wrote.
    """
    offset = _LOCK_TXNID_AT.get(platform.machine().lower())
    if offset is None:
        return None
    try:
        with open(path, "rb") as file:
            head = file.read(offset + 8)
    except OSError:
        return None
    if len(head) < offset + 8:
        return None
    magic, layout = struct.unpack_from("<II", head)
    if magic != MAGIC or layout != LOCK_FORMAT:
        return None
    return int(_U64.unpack_from(head, offset)[0])


def walk(
    source: str | os.PathLike[str] | bytes,
    txnid: int | None = None,
    tables: dict[bytes, int] | None = None,
    spans: bool = False,
) -> FileReport:
    """Verify LMDB's structure of a ``data.mdb`` (a path, or the file's bytes).

    Args:
        txnid: the snapshot to walk (the meta page holding it); ``None``: the newest, as
            LMDB itself picks. Pass the id of an open read transaction to walk a live
            store safely.
        tables: named tables that must exist, with their LMDB flags.
        spans: also record what every byte range holds (:attr:`FileReport.spans`).

    Returns:
        A :class:`FileReport`; ``report.problems`` is empty when the structure is sound.
    """
    if isinstance(source, bytes):
        return _walk_bytes(source, txnid, tables, spans)
    with _mapped(Path(source)) as data:
        return _walk_bytes(data, txnid, tables, spans)


def _walk_bytes(
    data: bytes | mmap.mmap, txnid: int | None, tables: dict[bytes, int] | None, spans: bool
) -> FileReport:
    metas = read_meta_pages(data)
    problems = check_meta_pages(metas)
    good = [m for m in metas if isinstance(m, MetaPage) and m.magic == MAGIC]
    chosen = (
        max(good, key=lambda m: m.txnid, default=None)
        if txnid is None
        else next((m for m in good if m.txnid == txnid), None)
    )
    moved_on = txnid is not None and good and min(m.txnid for m in good) > txnid
    if chosen is None and moved_on and not problems:  # meta pages only move forward
        return FileReport(txnid=txnid, stale=True)
    if chosen is None or chosen.page_size not in _PAGE_SIZES:
        report = FileReport(problems=problems or ["no usable meta page"])
        if txnid is not None and not problems:
            report.problems = [f"no meta page holds transaction {txnid}"]
        return report
    if (chosen.last_page + 1) * chosen.page_size > chosen.map_size:
        return FileReport(problems=problems, txnid=chosen.txnid)
    walker = _Walker(data, chosen, spans)
    report = walker.run(chosen, tables)
    report.problems[:0] = problems
    if spans:
        fields = PAGE_HEADER + _META.size + 2 * _DB.size + 16
        for meta in good:
            start = meta.page * chosen.page_size
            walker.span(start, start + fields, "(meta)", "meta")
            walker.span(start + fields, start + chosen.page_size, "(meta)", "unused")
    return report
