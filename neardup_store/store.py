"""The store: one LMDB environment holding signatures, keys and band tables.

Opening creates or validates the environment (format, parameters), takes a shared lock on
``neardup.lock`` (so :func:`compact` can refuse while others use the store), cleans stale
reader slots and adopts the recorded map size. Transactions come from :meth:`Store.read`
and :meth:`Store.write`; single calls on the store run in their own transaction.

Operational rules the store enforces:

* The map grows before it fills: a write transaction starts by growing the map when less
  than a quarter of it is free, and a transaction that still runs out is redone after
  growing (see :mod:`.txn`). A map grown by another process is adopted. The size reached
  is recorded, so a later open never shrinks it.
* Committed means synced to disk, unless the store was opened with ``durable=False``
  (bulk loads): then a commit survives a crash of the process but not of the machine.
* Opening a store waits while another process is inside a write transaction: py-lmdb
  opens table handles under LMDB's write lock. Already open stores never wait for a
  writer to read; writers should keep transactions to bounded batches (``add_many`` does,
  sized by :meth:`Store.transaction_size`). The one wait a read can meet is its own
  process's: adopting a map another process grew ends every snapshot of the process
  (py-lmdb), so the read waits for the others to end (:meth:`Store._resize`).
* A full disk (or file-size limit) is a :class:`StoreFullError` and rolls the transaction
  back; the same transaction commits once there is room. The environment is never opened
  with LMDB's ``writemap``: writing through a shared map turns a full disk into SIGBUS,
  which kills the process, while ordinary writes fail with an error that can be typed.
* A store object belongs to the process that opened it: using it in a forked child
  raises :class:`ForkedStoreError` (LMDB environments must not cross ``fork()``). Workers
  open their own store; py-lmdb refuses to open an environment a forked child inherited
  open, so start workers with ``spawn``/``forkserver``, or fork before opening.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import os
import resource
import shutil
import stat
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import lmdb
import numpy as np
import numpy.typing as npt

from . import _faults, codec, lmdbfile
from ._version import __version__
from .band_cache import BandCache
from .errors import (
    READ_ONLY_NOT_FOUND_ADVICE,
    CorruptStoreError,
    DocumentError,
    ForkedStoreError,
    FormatVersionError,
    InvalidParameterError,
    InvalidSignatureError,
    KeyNotFoundError,
    NeardupError,
    NotAStoreError,
    ParamsMismatchError,
    ReadOnlyError,
    StoreBusyError,
    StoreClosedError,
    StoreFullError,
    StoreIOError,
    StoreNotFoundError,
    StorePermissionError,
    TooManyReadersError,
    after_commit,
    check_flags,
    check_progress,
    integer,
    path_of,
)
from .lsh import LSHParams
from .minhash import MinHashConfig, MinHasher
from .params import StoreParams, resolve_params, shingle_fields, valid_threshold
from .text import HASH_VERSION, ShingleConfig, check_batch, check_encoding, single_document
from .txn import (
    KEYS,
    SIGNATURE_ITEMS,
    TEXT_ITEMS,
    Document,
    Key,
    Match,
    ReadTxn,
    UniqueResult,
    WriteTxn,
    document_items,
    key_bytes_of_item,
    prepare_batch,
)

if TYPE_CHECKING:
    from . import maintenance  # imported when called: it builds on this module

AUTO = "auto"
BatchSize = int | Literal["auto"] | None
"""Documents per write transaction: a count, ``None`` for one, ``"auto"`` for
:meth:`Store.transaction_size`."""
MIN_TRANSACTION = 10_000
"""The fewest documents ``batch_size="auto"`` commits at once (and the most a text batch
signs at once)."""
TRANSACTION_SIGNATURE_BYTES = 64 << 20
"""The most signature bytes ``batch_size="auto"`` puts in one transaction. Records,
band keys and LMDB's copied pages come on top: such a transaction at num_perm 256 into
a 1M-document store raised the process's peak memory by 293 MiB."""
PURGE_FRACTION = 0.1
"""A write transaction that removes documents is followed by :meth:`Store.purge` once the
removals awaiting one outnumber this fraction of the stored documents (and
:data:`MIN_TRANSACTION`): their band entries cost space and candidate lookups until then."""
DEFAULT_MAP_SIZE = 1 << 30
"""Initial map size (1 GiB of address space; the file only grows with its data)."""
MIN_FREE_FRACTION = 0.25
RESIZE_WAIT_S = 60.0
OPEN_ATTEMPTS = 5
"""How many times an open starts again when another process grows the map under it."""
DEFAULT_MODE = 0o700
"""Permissions of a new store's directory; its files get the same without execute bits
(0o600). Owner-only by default: a store holds the keys and metadata of private documents."""
STALE_READER_CHECK_S = 1.0
"""A read begins with a sweep of reader slots left by killed processes at most this often
(a write always sweeps first)."""
ITER_CHUNK = 1024
"""Keys ``iter(store)`` reads per short read transaction."""
LOCK_FILE = "neardup.lock"
CREATE_LOCK_FILE = "neardup.create.lock"
_DISK_FULL = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
_OPENED_BY: dict[tuple[int, int] | None, int] = {}
"""Store directory (device, inode) -> pid of the process whose environment has it open: a
forked child inherits the map, and must be told it is a child, not that it opened twice."""
UNFINISHED_CREATION = (
    "an empty LMDB environment: its creation has not committed (it was interrupted, or "
    "another process is still creating it); open it with create=True to create the store"
)
"""What :class:`NotAStoreError` finds where a creation never committed (``init`` may go on)."""
EMPTY_DATA_FILE = (
    "data.mdb is empty (0 bytes): a creation killed before it wrote anything leaves that, "
    "and so does a copy or restore of a store cut to nothing; if a store was here, restore "
    "its data.mdb from a backup, else create the store again (with create=True)"
)
"""What :class:`NotAStoreError` finds where ``data.mdb`` is empty and nothing tells whether
a store was ever committed there (``init`` may go on, as after :data:`UNFINISHED_CREATION`)."""
MAX_MAP_SIZE = 1 << 46
"""The largest map asked for: an x86-64 process has 2**47 bytes of address space, and LMDB
maps the whole map at once."""
MAX_READERS = 1 << 16
"""The most reader slots: each is 64 bytes of the lock file (4 MiB at this limit)."""
META_COUNT_LIMITS = {
    "commit_counter": (1 << 63) - 1,
    "next_doc_id": (1 << 63) - 1,
    "map_size": MAX_MAP_SIZE,
}
"""The largest value of each bookkeeping count of ``meta`` (outside the parameters'
checksum) that is not damage."""
REPAIR_COUNT = "check(repair=True) or neardup-admin check --repair rewrites it"


def id_after(txn: lmdb.Transaction, db: Any, id_limit: int) -> int:
    """One more than the highest document id ``db`` (``docs`` or ``removed``) holds among
    those the format can hold, 0 if none. Keys that are no id (damage that
    :func:`~.integrity.check` reports, and its repair moves) are passed over."""
    with txn.cursor(db=db) as cursor:
        found = cursor.last()
        while found:
            raw_id = cursor.key()
            if codec.is_id(raw_id, id_limit):
                return codec.decode_id(raw_id) + 1
            found = cursor.prev()
    return 0


def _hash_version_of(config: object) -> object:
    """The ``hash_version`` a store's ``config`` records (``None`` where the config is
    not shaped as one: decoding it reports that)."""
    shingles = config.get("shingles") if isinstance(config, dict) else None
    return shingles.get("hash_version", HASH_VERSION) if isinstance(shingles, dict) else None


def meta_count_ok(name: str, value: object) -> bool:
    """Whether ``value`` can be ``meta``'s count ``name`` (:data:`META_COUNT_LIMITS`)."""
    return type(value) is int and 0 <= value <= META_COUNT_LIMITS[name]


FULL_DISK_SLACK = 1 << 20
"""Free bytes below which a disk counts as full when LMDB reports a write as an I/O error."""

_DAMAGE = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.InvalidError,
    lmdb.VersionMismatchError,
    lmdb.BadValsizeError,
    lmdb.BadTxnError,
    lmdb.IncompatibleError,
    lmdb.PanicError,
    lmdb.CursorFullError,
)
"""LMDB errors that mean its file is damaged (LMDB keeps no checksums, so a flipped byte
surfaces as one of these, if at all)."""

_FOUND_DAMAGE = (lmdb.CorruptedError, lmdb.PageNotFoundError)
"""The errors of :data:`_DAMAGE` that only a damaged page gives in an open store (a bad
size or a bad transaction can also be a bad call, which must stay what it is)."""

DAMAGE_ADVICE = "`Store.check()` names the damaged table"
"""What a :class:`CorruptStoreError` met in a transaction adds (the store did open)."""


def _identity(directory: Path) -> tuple[int, int]:
    info = directory.stat()
    return info.st_dev, info.st_ino


class Store:
    """A persistent near-duplicate index. Open it with :meth:`Store.open`.

    Example:
        >>> import neardup_store as nd, tempfile
        >>> with nd.Store.open(tempfile.mkdtemp() + "/s", create=True) as store:
        ...     store.add("a", "the quick brown fox jumps over the lazy dog")
        ...     [m.key for m in store.query("the quick brown fox jumps over the lazy dog!")]
        False
        ['a']
    """

    def __init__(
        self, path: Path, read_only: bool, durable: bool, mode: int = DEFAULT_MODE
    ) -> None:
        self.path = path
        self.mode = mode
        self.read_only = read_only
        self.durable = durable
        self.created_here = False  # whether this open made the store (a failed import undoes it)
        self._pid = os.getpid()
        self._env: lmdb.Environment | None = None
        self._lock_fd: int | None = None
        self._lock_release: weakref.finalize | None = None  # closes _lock_fd if never closed
        self._identity: tuple[int, int] | None = None
        self._swept_at = -STALE_READER_CHECK_S
        # Map growth must not pull the map from under this process's open transactions.
        self._readers_lock = threading.RLock()  # taken as it is where no one waits
        self._readers_done = threading.Condition(self._readers_lock)
        self._active_readers = 0
        self._closers_waiting = 0  # threads in _wait_for_transactions
        self._growth_waiting = 0  # threads waiting in _resize: only they need a notify
        # The thread running a compaction or rebuild, which holds the others off
        # (maintenance._threads_held_off): it never waits for them, nor a close for it.
        self._holding_off: int | None = None
        self._parked_reads = 0  # transactions held by the threads waiting in _resize
        self._thread_state = threading.local()
        self.map_epoch = 0
        self.params: StoreParams
        self.hasher: MinHasher
        self._band_dbs: list[Any] = []
        self._removed_db: Any = None  # formats before codec.LAZY_REMOVAL_FORMAT have none
        self._band_cache: BandCache | None = None
        self._keeps_band_cache = False
        self._max_dbs = 0  # named-table slots of the open environment (rebuild may need more)

    # -- opening ---------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        create: bool = False,
        *,
        read_only: bool = False,
        threshold: float | None = None,
        num_perm: int | None = None,
        scheme: str | None = None,
        seed: int | None = None,
        shingles: ShingleConfig | None = None,
        bands: int | None = None,
        rows: int | None = None,
        map_size: int | None = None,
        durable: bool = True,
        max_readers: int = 126,
        mode: int = DEFAULT_MODE,
        band_cache: bool = False,
    ) -> Store:
        """Open the store at ``path`` (a directory), creating it if asked: ``create``
        makes a store only in a new or empty directory, never beside other files.

        Parameters (threshold, num_perm, scheme, seed, shingles, bands/rows) are used when
        creating; on a reopen they may be omitted, and any that are passed must equal the
        stored ones. Unset ones default to threshold 0.8, num_perm 256, scheme ``oph``,
        seed 1, character 5-shingles, and bands/rows from :func:`choose_params`.

        ``mode`` sets the permissions of a store this call creates: the directory gets
        ``mode`` and the files ``mode`` without execute bits, less the process umask
        (like ``mkdir``). The default 0o700 makes the store owner-only; 0o750 lets the
        owner's group read its files (to copy them; opening a store, even read-only, needs
        write access to LMDB's ``lock.mdb``, as 0o770 gives). An existing store keeps its
        permissions. A store on read-only media opens with ``read_only=True``.

        ``band_cache=True`` keeps an in-memory copy of the band tables
        (:mod:`.band_cache`), built from the records at the first query and kept in step
        with later commits: each query's candidates then take one compiled call instead
        of a B-tree descent per band. It costs 21-27 bytes per band per document in
        this process (16 a slot, the tables 60-80 % full), up to 2.5 times that while
        entries of removed documents are kept (until they would outnumber the live
        ones), and the first query reads every record.

        Raises:
            StoreNotFoundError: nothing at ``path`` and ``create`` is false.
            NotAStoreError: ``path`` is a file, an environment without our metadata,
                (with ``create``) a directory of other files and no store, or a path no
                directory can be at (a file on the way, a dangling link, a name too long).
            FormatVersionError: written by an unknown format version.
            ParamsMismatchError: a passed parameter conflicts with the stored one.
            InvalidParameterError: a bad parameter (a threshold outside (0, 1], a banding
                wider than num_perm...), ``create`` with ``read_only``, a flag that is not
                a bool, or a bad ``map_size``, ``max_readers`` or ``mode``; nothing is made.
            StoreBusyError: this process has the store open already (share that
                ``Store``), or other processes kept growing its map while this one tried
                to open it.
            ForkedStoreError: this process was forked from one that had the store open,
                which py-lmdb does not open again in the child.
            TooManyReadersError: every reader slot of the store's lock file is taken.
            StorePermissionError: this user may not enter the directory, read the data
                file or write the lock files (or, to create, write the directory).
            CorruptStoreError: the store is damaged, ``data.mdb`` cut short included (an
                interrupted copy or restore): checked at every open, since LMDB would
                read the missing pages through its map, which kills the process.
        """
        check_flags(create=create, read_only=read_only, durable=durable, band_cache=band_cache)
        if read_only and create:
            raise InvalidParameterError("create", create, "False when read_only=True")
        if map_size is not None:
            size = integer(map_size)
            if size is None or not 1 << 16 <= size <= MAX_MAP_SIZE:
                raise InvalidParameterError(
                    "map_size", map_size, "an integer of bytes from 65536 to 2**46 (64 TiB)"
                )
            map_size = size  # LMDB takes a Python int, not numpy's
        readers = integer(max_readers)
        if readers is None or not 1 <= readers <= MAX_READERS:
            raise InvalidParameterError(
                "max_readers", max_readers, f"an integer in [1, {MAX_READERS}]"
            )
        max_readers = readers
        if isinstance(mode, bool) or not isinstance(mode, int) or mode & ~0o777 or mode < 0o700:
            shown = oct(mode) if isinstance(mode, int) else mode
            raise InvalidParameterError(
                "mode", shown, "permission bits in [0o700, 0o777]: the owner needs rwx"
            )
        directory = path_of(path)
        try:
            asked = (threshold, num_perm, scheme, seed, shingles, bands, rows)
            if directory.exists() and not directory.is_dir():
                raise NotAStoreError(str(directory), "it is a file, not a store directory")
            if create:
                _refuse_foreign_files(directory)
            # Checked before anything is made, so that bad parameters leave no directory.
            params = (
                resolve_params(*asked) if create and not (directory / "data.mdb").exists() else None
            )
            store = cls(directory, read_only, durable, mode)
            store._keeps_band_cache = bool(band_cache)
            with _creation_lock(directory, create, mode):
                exists = (directory / "data.mdb").exists()
                if not exists and not create:
                    if read_only:  # create=True is refused with it: advise what it can do
                        raise StoreNotFoundError(str(directory), READ_ONLY_NOT_FOUND_ADVICE)
                    # Where create=True would refuse too, a mistyped path most likely.
                    foreign, blocked = _foreign_files(directory), _blocked(directory)
                    if foreign:
                        raise StoreNotFoundError(
                            str(directory),
                            f"it holds other files ({foreign}): check the path (a store is "
                            "made only in a new or empty directory)",
                        )
                    if blocked:
                        raise StoreNotFoundError(
                            str(directory), f"{blocked}, so none can be there: check the path"
                        )
                    raise StoreNotFoundError(str(directory))
                if not exists:
                    _refuse_foreign_files(directory)  # made meanwhile by someone else
                try:
                    if exists:
                        store._open_existing(asked, map_size, max_readers, create)
                    else:
                        store._create(params or resolve_params(*asked), map_size, max_readers)
                except BaseException:
                    store.close()
                    raise
            return store
        except OSError as err:  # ours (ReadOnlyError, StoreNotFoundError) are typed already
            if isinstance(err, NeardupError):
                raise
            if isinstance(err, PermissionError):
                raise StorePermissionError(
                    str(directory), f"{err.filename or directory}: {err.strerror or err}"
                ) from None
            typed = _unusable_path(directory, err)
            if typed is None:
                raise
            raise typed from None

    def _open_env(self, max_dbs: int, map_size: int, max_readers: int) -> lmdb.Environment:
        self.path.mkdir(parents=True, exist_ok=True, mode=self.mode)
        if self._lock_fd is None:
            fd = self._lock_fd = self._open_lock_file()
            if fd is not None:
                # A Store dropped without close() must not keep the shared lock until the
                # process exits (compact and rebuild elsewhere would refuse): the
                # collector closes the descriptor then, and _close through this too.
                self._lock_release = weakref.finalize(self, os.close, fd)
                fcntl.flock(fd, fcntl.LOCK_SH)
            if not self.read_only:
                _remove_compaction_leftovers(self.path)
            # Once an open, under the shared lock just taken, which no compaction swaps
            # the file under: the probe's environment and the store's read the same file.
            problem = _cut_short(self.path / "data.mdb")
            if problem is not None:
                raise CorruptStoreError(
                    str(self.path), f"{problem} (an interrupted copy or restore, or a full disk?)"
                )
        _make_as_data(self.path / "lock.mdb")  # else LMDB makes it with self.mode
        try:
            env = lmdb.open(
                os.fsencode(self.path),  # bytes: py-lmdb encodes a str as UTF-8
                map_size=map_size,
                max_dbs=max_dbs,
                max_readers=max_readers,
                readonly=self.read_only,
                sync=self.durable,
                metasync=self.durable,
                lock=True,
                writemap=False,  # a full disk must be an error, not SIGBUS
                meminit=False,
                create=not self.read_only,
                mode=self.mode & 0o666,
            )
        except lmdb.ReadersFullError:  # the limit is the lock file's, not max_readers
            raise TooManyReadersError(str(self.path), None) from None
        except lmdb.MapResizedError:
            raise  # another process grew the map meanwhile: the open is retried
        except lmdb.ReadonlyError as err:  # py-lmdb's name for EACCES
            raise StorePermissionError(str(self.path), self._denied(err)) from None
        except lmdb.Error as err:
            if "already open in this process" in str(err):
                if _OPENED_BY.get(_identity(self.path), os.getpid()) != os.getpid():
                    raise ForkedStoreError(str(self.path)) from None
                raise StoreBusyError(
                    str(self.path),
                    "open a second Store on it",
                    "in a process that has it open already; use the open Store (it is"
                    " safe to share between threads)",
                ) from None
            damage = _lmdb_file_damage(self.path / "data.mdb", err)
            if damage is not None:
                raise CorruptStoreError(str(self.path), f"LMDB cannot open it: {damage}") from None
            raise NotAStoreError(str(self.path), f"LMDB could not open it: {err}") from None
        env.reader_check()  # slots left by killed processes
        self._identity = _identity(self.path)
        _OPENED_BY[self._identity] = os.getpid()
        self._max_dbs = max_dbs
        return env

    def _denied(self, err: lmdb.Error) -> str:
        """What LMDB's EACCES means here: a writable open of a ``data.mdb`` this user may
        read but not write (a shared store) is told so, and that a read-only open works;
        anything else is LMDB's own words."""
        data = self.path / "data.mdb"
        effective = os.access in os.supports_effective_ids
        if (
            not self.read_only
            and os.access(data, os.R_OK, effective_ids=effective)
            and not os.access(data, os.W_OK, effective_ids=effective)
        ):
            return (
                f"{data} is not writable by this user, and opening it to write needs write "
                "access to data.mdb: open the store with read_only=True to read it, or ask "
                "its owner for write access"
            )
        return f"LMDB: {err}"

    def _open_lock_file(self) -> int | None:
        """Our lock file, made if missing: every process that has the store open holds a
        shared lock on it, which compact and rebuild must see. A reader needs only to be
        seen (``flock`` works on a read-only descriptor), so where it cannot open it to
        write (read-only media, which LMDB reads fine) it opens it to read. With none on
        read-only media it goes without (nothing can write there either); elsewhere that
        is refused, as a writer could not see it.

        Raises:
            StorePermissionError: a read-only open finds no lock file and cannot make one.
        """
        path, file_mode = self.path / LOCK_FILE, self.mode & 0o666
        _make_as_data(path)
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT, file_mode)
        except OSError as err:
            if not self.read_only:
                raise  # a PermissionError becomes StorePermissionError in open()
            cause = err
        try:
            return os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            if cause.errno == errno.EROFS:
                return None
            # Others can write here (the owner can): unseen, this reader would let them
            # compact the store under it.
            raise StorePermissionError(
                str(self.path), f"{path} is missing and cannot be made: {cause.strerror}"
            ) from None

    def _create(self, params: StoreParams, map_size: int | None, max_readers: int) -> None:
        size = map_size or DEFAULT_MAP_SIZE
        env = self._env = self._open_env(2 * params.banding.bands + 8, size, max_readers)
        while True:
            try:
                self._write_new_store(env, params, size)
                break
            except lmdb.MapFullError:  # the empty tables of many bands filled a small map
                size *= 2
                env.set_mapsize(size)
        self.created_here = True
        self._attach(params, generation=0, format_version=codec.FORMAT_VERSION)

    def _write_new_store(self, env: lmdb.Environment, params: StoreParams, size: int) -> None:
        # Every table is made in the one transaction that writes the meta entries, so a
        # crash before its commit leaves an empty environment, which a create may reuse.
        with env.begin(write=True) as txn:
            meta_db = env.open_db(codec.META_DB, txn=txn)
            if txn.get(b"format", db=meta_db) is not None:
                raise NotAStoreError(str(self.path), "created concurrently by another process")
            values = {
                "format": codec.FORMAT_NAME,
                "format_version": codec.FORMAT_VERSION,
                "package_version": __version__,
                "lmdb": {"binding": lmdb.__version__, "engine": list(lmdb.version())},
                "config": params.config.to_dict(),
                "banding": codec.banding_meta(params.banding, params.threshold, 0),
                "commit_counter": 0,
                "next_doc_id": 0,
                "map_size": size,
            }
            for name, value in values.items():
                txn.put(name.encode(), codec.pack_meta(value), db=meta_db)
            self._seal_meta(txn, meta_db)
            env.open_db(codec.DOCS_DB, txn=txn)
            env.open_db(codec.KEYS_DB, txn=txn)
            env.open_db(codec.REMOVED_DB, txn=txn)
            for band in range(params.banding.bands):
                env.open_db(codec.band_table_name(0, band), txn=txn, dupsort=True, dupfixed=True)
            _faults.checkpoint("before-create")

    def _open_existing(
        self, asked: tuple[Any, ...], map_size: int | None, max_readers: int, create: bool
    ) -> None:
        """Open a store whose data file exists. Another process growing the map while this
        one reads (LMDB's MAP_RESIZED) is not damage: the open starts again, a few times."""
        for attempt in range(OPEN_ATTEMPTS):
            try:
                return self._open_existing_once(asked, map_size, max_readers, create)
            except lmdb.MapResizedError:
                self.close()
                if attempt == OPEN_ATTEMPTS - 1:
                    raise StoreBusyError(
                        str(self.path),
                        "open it",
                        "while other processes keep growing its "
                        "map; retry, or open it with a larger map_size",
                    ) from None
        return None

    def _open_existing_once(
        self, asked: tuple[Any, ...], map_size: int | None, max_readers: int, create: bool
    ) -> None:
        if self._creation_never_wrote(create):
            self._create(resolve_params(*asked), map_size, max_readers)
            return
        unfinished, meta = self._probe(map_size, max_readers)
        if unfinished and not create and _wait_for_creator(self.path):
            unfinished, meta = self._probe(map_size, max_readers)  # created meanwhile?
        if unfinished:
            # A process died while creating the store: nothing was committed, so there is
            # nothing to keep, and refusing would leave the directory unusable for good.
            if not create:
                raise NotAStoreError(str(self.path), UNFINISHED_CREATION)
            self._create(resolve_params(*asked), map_size, max_readers)
            return
        params = self._params_from_meta(meta)
        self._check_asked(params, asked)
        # An explicit map_size is honoured as at creation, but never below the size reached
        # (as recorded; one past what any map can be is damage, and LMDB keeps the map at
        # least as large as the file anyway).
        recorded = meta.get("map_size", 0)
        reached = recorded if meta_count_ok("map_size", recorded) else 0
        size = max(map_size or DEFAULT_MAP_SIZE, reached)
        self._env = self._open_env(2 * params.banding.bands + 8, size, max_readers)
        try:
            self._attach(
                params,
                generation=meta["banding"]["generation"],
                format_version=meta["format_version"],
            )
        except lmdb.MapResizedError:
            raise
        except lmdb.Error as err:  # a table is missing or its record is damaged
            raise CorruptStoreError(str(self.path), f"LMDB cannot open its tables: {err}") from None

    def _creation_never_wrote(self, create: bool) -> bool:
        """Whether ``data.mdb`` is empty where ``create`` may go on: a creation killed
        before LMDB wrote its first page leaves a 0-byte file. (One of fewer bytes than a
        meta page is a store cut short, refused: LMDB calls it no LMDB file.) So does a
        copy or restore cut to nothing, so the directory decides: a ``lock.mdb`` that
        records commits is a store cut short, refused even with ``create``. Without
        ``create``, so is an empty file beside no creation lock, which every creation
        makes first (an open with ``create`` has made one itself by now, so it goes on);
        else the open says both. Decided before LMDB opens the file, since a writable open
        of an empty file makes an empty environment of it, and its ``lock.mdb`` forgets
        the commits.

        Raises:
            CorruptStoreError: a store was committed here (without ``create``: no
                creation was begun). NotAStoreError: without ``create``, an empty file
                that no creation in progress fills.
        """
        data = self.path / "data.mdb"
        size = _regular_size(data)
        if size is None or size >= lmdbfile.FIRST_META_END:
            return False
        path = str(self.path)
        if size:  # no creation leaves this; LMDB's open would also reset lock.mdb's count
            raise CorruptStoreError(
                path,
                f"data.mdb is {size} bytes, shorter than its first meta page "
                f"({lmdbfile.FIRST_META_END} bytes): the file was cut short (an interrupted "
                "copy or restore?)",
            )
        cut = "the file was cut to nothing (an interrupted copy or restore?)"
        committed = lmdbfile.lock_file_txnid(self.path / "lock.mdb")
        if committed:
            raise CorruptStoreError(
                path, f"data.mdb is empty, though lock.mdb records {committed} commits: {cut}"
            )
        if create:
            return True  # this open holds the creation lock: nobody else is creating it
        if not (self.path / CREATE_LOCK_FILE).exists():
            raise CorruptStoreError(
                path,
                f"data.mdb is empty, and no creation was begun here ({CREATE_LOCK_FILE}, "
                f"which each creation makes first, is missing): {cut}",
            )
        if _wait_for_creator(self.path) and _regular_size(data) != 0:
            return False  # created meanwhile
        raise NotAStoreError(path, EMPTY_DATA_FILE)

    def _probe(self, map_size: int | None, max_readers: int) -> tuple[bool, dict[str, Any]]:
        """``(unfinished creation, meta entries)`` read through a short-lived environment."""
        probe = self._open_env(4, map_size or DEFAULT_MAP_SIZE, max_readers)
        try:
            if _never_created(probe):
                return True, {}
            return False, self._read_all_meta(probe)
        finally:
            probe.close()

    def _read_all_meta(self, env: lmdb.Environment) -> dict[str, Any]:
        path = str(self.path)
        try:
            meta_db = env.open_db(codec.META_DB, create=False)
            with env.begin(db=meta_db) as txn:
                raw = {bytes(k): bytes(v) for k, v in txn.cursor()}
        except lmdb.ReadersFullError:
            raise TooManyReadersError(path, int(env.info()["max_readers"])) from None
        except lmdb.MapResizedError:
            raise  # another process grew the map meanwhile: the open is retried
        except lmdb.NotFoundError:
            if self._names_store_tables(env):
                raise CorruptStoreError(path, "its meta table is missing") from None
            raise NotAStoreError(path, "an LMDB environment without a meta table") from None
        except lmdb.Error as err:
            # INCOMPATIBLE: "meta" is a plain key here, as in other applications' files.
            damage = isinstance(err, _DAMAGE) and not isinstance(err, lmdb.IncompatibleError)
            if damage or self._names_store_tables(env):
                raise CorruptStoreError(path, f"LMDB cannot read its meta table: {err}") from None
            raise NotAStoreError(path, f"unreadable: {err}") from None
        meta: dict[str, Any] = {}
        undecodable = []
        for name, value in raw.items():
            try:  # UTF-8 and msgpack decoding errors are ValueErrors
                meta[name.decode()] = codec.unpack_meta(value)
            except ValueError as err:
                undecodable.append(f"meta entry {name!r} does not decode ({err})")
        # Ours if marked so, or if it holds our other entries: then damage is corruption.
        ours = meta.get("format") == codec.FORMAT_NAME or (
            len(set(meta) & set(codec.REQUIRED_META[1:])) >= 2
        )
        if not ours:
            detail = undecodable[0] if undecodable else "its meta table does not mark a store"
            raise NotAStoreError(path, f"{detail}; not a neardup_store")
        if undecodable:
            raise CorruptStoreError(path, undecodable[0])
        # Only what opening needs; check reports the others as missing.
        missing = [name for name in codec.SEALED_META if name not in meta]
        if missing:
            raise CorruptStoreError(path, f"meta entries {missing} are missing")
        if meta["format"] != codec.FORMAT_NAME:
            raise CorruptStoreError(path, f"its format marker reads {meta['format']!r}")
        version = meta["format_version"]
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise CorruptStoreError(path, f"format_version is {version!r}")
        if version not in codec.READABLE_FORMATS:
            raise FormatVersionError(path, version, codec.READABLE_FORMATS)
        checksum = meta.get("meta_checksum")
        expected = codec.meta_checksum({k.decode(): v for k, v in raw.items()})
        if checksum is not None and checksum != expected:
            raise CorruptStoreError(path, "the checksum of its parameters in meta does not match")
        hashing = _hash_version_of(meta["config"])
        if hashing is not None and hashing != HASH_VERSION:  # sealed: another release's
            raise FormatVersionError(
                path,
                hashing,
                (HASH_VERSION,),
                "signature hashing",
                "its signatures cannot be compared with this release's: use it with the "
                "release that wrote it, or add the texts again to a new store made here",
            )
        return meta

    def _names_store_tables(self, env: lmdb.Environment) -> bool:
        """Whether LMDB's table of tables names any of ours (then damage is corruption)."""
        try:
            with env.begin() as txn:
                names = {bytes(name) for name, _ in txn.cursor()}
        except lmdb.Error:
            return True  # the table of tables itself is unreadable: LMDB file, damaged
        return bool(names & {codec.DOCS_DB, codec.KEYS_DB}) or any(
            n.startswith(b"band.") for n in names
        )

    def _params_from_meta(self, meta: dict[str, Any]) -> StoreParams:
        try:
            banding, threshold, generation = codec.banding_from_meta(
                meta["banding"], meta["format_version"]
            )
            params = StoreParams(MinHashConfig.from_dict(meta["config"]), banding, threshold)
        except (TypeError, ValueError, KeyError, AttributeError) as err:
            raise CorruptStoreError(
                str(self.path),
                f"its parameters in meta do not decode ({type(err).__name__}: {err})",
            ) from None
        # Each part decodes; together they must still be parameters a store can be made with.
        if not 0.0 < threshold <= 1.0:
            raise CorruptStoreError(str(self.path), f"meta threshold is {threshold!r}")
        if banding.width > params.config.num_perm:
            raise CorruptStoreError(
                str(self.path),
                f"its {banding.bands} bands of {banding.rows} rows need more than its "
                f"{params.config.num_perm} signature values",
            )
        # (A damaged map_size is only passed over: the open sizes the map without it, check
        # reports it and the next commit rewrites it, as it does one past any map.)
        if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
            raise CorruptStoreError(str(self.path), f"meta generation is {generation!r}")
        return params

    def _check_asked(self, params: StoreParams, asked: tuple[Any, ...]) -> None:
        threshold, num_perm, scheme, seed, shingles, bands, rows = asked
        # Each given value is checked as creating checks it, so that a bad one is reported
        # as bad, not as a conflict with the stored one.
        if threshold is not None:
            threshold = valid_threshold(threshold)
        config, banding = params.config, params.banding
        MinHashConfig(
            config.num_perm if num_perm is None else num_perm,
            config.scheme if scheme is None else scheme,
            config.seed if seed is None else seed,
            config.shingles if shingles is None else shingles,
        )
        LSHParams(banding.bands if bands is None else bands, banding.rows if rows is None else rows)
        given: dict[str, Any] = {
            "threshold": threshold, "num_perm": num_perm, "scheme": scheme, "seed": seed,
            "bands": bands, "rows": rows,
        }  # fmt: skip
        if shingles is not None:
            given.update(shingle_fields(shingles))
        stored = params.flat()
        conflicts = {
            name: (stored[name], value)
            for name, value in given.items()
            if value is not None and stored[name] != value
        }
        if conflicts:
            raise ParamsMismatchError(str(self.path), conflicts)

    def _attach(self, params: StoreParams, generation: int, format_version: int) -> None:
        env = self._require_env()
        self.params = params
        self.hasher = MinHasher(params.config)
        self._generation = generation
        self._format_version = format_version
        self._band_layout = codec.band_layout(format_version)
        self._meta_db = env.open_db(codec.META_DB, create=False)
        self._docs_db = env.open_db(codec.DOCS_DB, create=False)
        self._keys_db = env.open_db(codec.KEYS_DB, create=False)
        lazy = format_version >= codec.LAZY_REMOVAL_FORMAT
        self._removed_db = env.open_db(codec.REMOVED_DB, create=False) if lazy else None
        self._band_dbs = [
            env.open_db(codec.band_table_name(generation, band), create=False, dupsort=True,
                        dupfixed=True)
            for band in range(params.banding.bands)
        ]  # fmt: skip
        # A new banding, or a rewritten file (compaction), starts from an empty cache.
        self._band_cache = BandCache(self) if self._keeps_band_cache else None

    # -- properties ------------------------------------------------------------------------------

    @property
    def config(self) -> MinHashConfig:
        return self.params.config

    @property
    def banding(self) -> LSHParams:
        return self.params.banding

    @property
    def threshold(self) -> float:
        return self.params.threshold

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the environment and release the lock (idempotent).

        Closing ends every transaction of the environment, so it waits for those of
        other threads (up to :data:`RESIZE_WAIT_S`), and new ones wait for it: a thread
        that holds no transaction waits before it begins one (and then finds the store
        closed, :class:`StoreClosedError`), while one that holds a transaction goes on,
        so that it can end it.

        Raises:
            StoreBusyError: the calling thread has a transaction (or a :meth:`pairs`
                iterator) open, or other threads kept theirs open past the wait; the
                store stays open.
        """
        self._close(force=False)

    def _close(self, force: bool) -> None:
        """:meth:`close`; with ``force`` (an error is on its way out of a ``with`` block,
        and must not be replaced by a refusal) it closes under this thread's own open
        reads, and leaves the store open, without raising, while other threads have
        transactions open (closing under them would end their work or hang them)."""
        if self._env is not None and os.getpid() == self._pid:
            with self._readers_done:
                try:
                    self._wait_for_transactions("close the store")
                except StoreBusyError:
                    if not force:
                        raise
                    if self._active_readers > self._thread_state.__dict__.get("readers", 0):
                        return  # left open: closing under other threads' would hang them
                self._env.close()
                self._env = None
            _OPENED_BY.pop(self._identity, None)
        self._env = None
        self._band_cache = None
        # The finaliser closes the descriptor, once: called here, it is spent, and never
        # closes the number again after the system hands it out anew.
        release, self._lock_fd, self._lock_release = self._lock_release, None, None
        if release is not None:
            release()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._close(force=exc_type is not None)

    def __repr__(self) -> str:
        state = "closed" if self._env is None else ("read-only" if self.read_only else "open")
        return f"<Store {str(self.path)!r} {state}>"

    def _forked(self) -> bool:
        """Whether this is a child forked from the process that opened the store."""
        return self._pid != _PID

    def _require_env(self) -> lmdb.Environment:
        if self._pid != _PID:
            raise ForkedStoreError(str(self.path))
        if self._env is None:
            raise StoreClosedError("store")
        return self._env

    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyError(str(self.path))

    # -- transactions ----------------------------------------------------------------------------

    def _begin(self, write: bool) -> lmdb.Transaction:
        env = self._require_env()
        for attempt in range(3):
            try:
                return env.begin(write=write)
            except lmdb.MapResizedError:
                self._resize(0)  # another process grew the map: adopt its size
            except lmdb.ReadersFullError:
                if attempt:
                    raise TooManyReadersError(
                        str(self.path), int(self._env_info()["max_readers"])
                    ) from None
                env.reader_check()
        return env.begin(write=write)

    def _resize(self, size: int) -> None:
        """Set the map size (0: adopt the file's), once this process's other readers end.

        py-lmdb invalidates every open transaction of the environment when the map size
        changes, so growth waits for read transactions of other threads to finish. A read
        transaction of the calling thread itself cannot be waited for: it is marked stale
        and its next use raises :class:`StoreClosedError` instead of a raw LMDB error.
        Nor can those of another thread waiting here too (one that read, then wrote, and
        needs a growth as well): each would wait for the other's reads until one gave up.
        Their transactions are parked, unused while they wait (py-lmdb's read
        transactions are not tied to a thread), and end the same way; a growth that finds
        the map grown enough by another meanwhile leaves it.
        """
        env = self._require_env()
        with self._readers_done:
            own = getattr(self._thread_state, "readers", 0)
            epoch = self.map_epoch
            self._growth_waiting += 1
            self._parked_reads += own
            self._readers_done.notify_all()  # a growth waiting for these reads can go on
            try:
                if not self._readers_done.wait_for(
                    lambda: self._active_readers <= self._parked_reads, timeout=RESIZE_WAIT_S
                ):
                    raise StoreBusyError(
                        str(self.path),
                        "grow the map" if size else "adopt the map another process grew",
                        f"while other threads keep read transactions open (waited "
                        f"{RESIZE_WAIT_S:.0f} s); keep reads short, or open the store with a "
                        "larger map_size",
                    )
                if not (size and self.map_epoch != epoch and self._map_size() >= size):
                    env.set_mapsize(size)
                    self.map_epoch += 1
            finally:
                self._growth_waiting -= 1
                self._parked_reads -= own
                self._readers_done.notify_all()  # the reads held back for the growth
        _faults.checkpoint("after-grow")

    @contextmanager
    def _tracked(self, write: bool) -> Iterator[lmdb.Transaction]:
        """A transaction counted as active (:meth:`_begin_tracked`) for the block."""
        txn = self._begin_tracked(write)
        try:
            yield txn
        finally:
            # :meth:`_end_tracked`'s work, with no Python call before the counts drop: a
            # Ctrl-C raised at such a call's entry (where a pending signal is handled)
            # left this thread counted inside a transaction, and close() refused.
            counts = self._thread_state.__dict__
            with self._readers_lock:
                self._active_readers, counts["readers"] = (
                    self._active_readers - 1,
                    counts["readers"] - 1,
                )
                if self._growth_waiting or self._closers_waiting:
                    self._readers_done.notify_all()

    def _begin_tracked(self, write: bool) -> lmdb.Transaction:
        """Begin a transaction counted as active, so :meth:`_resize` waits for it; the
        caller must call :meth:`_end_tracked` once it has ended."""
        # Before the lock: a child forked while another thread held it would wait for ever.
        self._require_env()
        state = self._thread_state
        if (
            (self._growth_waiting or self._closers_waiting)
            and not getattr(state, "readers", 0)
            and self._holding_off != threading.get_ident()
        ):
            self._let_waiters_go_first()
        # Counted before it begins: a growth cannot change the map under a transaction
        # that is beginning, nor wait inside LMDB for the write lock such a transaction
        # holds while this thread waits for the lock the growth holds.
        with self._readers_lock:
            # Both counts in one statement, with no call between the two stores for a
            # pending signal to interrupt.
            self._active_readers, state.readers = (
                self._active_readers + 1,
                getattr(state, "readers", 0) + 1,
            )
        try:
            return self._begin(write)  # outside the lock: a write begin may block
        except BaseException:
            self._end_tracked()
            raise

    def _let_waiters_go_first(self) -> None:
        """Wait while a map growth or a close waits for transactions to end, in a thread
        that holds none (one that holds a read must go on, or the growth or close would
        wait for it forever): a stream of new reads from other threads would otherwise
        never let them in. After a close, the transaction then finds the store closed."""
        with self._readers_done:
            self._readers_done.wait_for(
                lambda: not (self._growth_waiting or self._closers_waiting),
                timeout=RESIZE_WAIT_S,
            )

    def _end_tracked(self, counts: dict[str, Any] | None = None) -> None:
        """Uncount a transaction; ``counts`` is the thread's state it was counted in (by
        default this thread's, ``_thread_state.__dict__``: a generator's read may end in
        another thread)."""
        with self._readers_lock:
            self._active_readers -= 1
            (self._thread_state.__dict__ if counts is None else counts)["readers"] -= 1
            if self._growth_waiting or self._closers_waiting:  # set under this lock
                self._readers_done.notify_all()

    def _sweep_readers(self, force: bool) -> None:
        """Free the reader slots of killed processes.

        LMDB frees them only when asked. Until then a killed reader's snapshot keeps the
        pages it could see from being reused (the file grows with every commit), and a
        table full of them refuses every new process, which cannot sweep before it has
        a slot itself: so every open store sweeps, before each write and now and then
        before a read.
        """
        self._require_env()  # before the lock, as in _begin_tracked
        now = time.monotonic()
        if force or now - self._swept_at >= STALE_READER_CHECK_S:
            with self._readers_lock:  # (the environment a compaction swapped in under it)
                self._require_env().reader_check()
            self._swept_at = now

    def read(self) -> AbstractContextManager[ReadTxn]:
        """A consistent read snapshot; use it with ``with``."""
        return _Reading(self)

    @contextmanager
    def write(self) -> Iterator[WriteTxn]:
        """A write transaction: commits on a clean exit, rolls back if the block raises.

        After a commit that removed documents, :meth:`purge` runs when the removals
        awaiting one have passed :data:`PURGE_FRACTION` of the documents (and
        :data:`MIN_TRANSACTION`); if it cannot (a full disk), the removals stay awaiting
        one, which the next removal's purge or :meth:`compact` does, and the block's
        caller is not told of a failure that is not its own. A Ctrl-C raised once the
        block has committed (during the commit, or that purge) carries
        ``transaction_committed = True`` and a note saying so.
        """
        # First: a child forked inside a write block inherits this thread's ``writing``
        # flag, and must be told it is a child, not that it nests a write.
        self._require_env()
        self._check_writable()
        state = self._thread_state
        if getattr(state, "writing", False):
            raise StoreBusyError(
                str(self.path),
                "begin a write transaction",
                "inside another one of the same thread (LMDB has one writer at a time); do"
                " the work through the open transaction, or after its block",
            )
        self._sweep_readers(force=True)
        self._ensure_headroom()
        writer: WriteTxn | None = None
        try:
            with self._tracked(write=True) as txn:
                writer = WriteTxn(self, txn)
                state.writing = True
                try:
                    with self._typed_engine_errors():
                        try:
                            yield writer
                        except BaseException:
                            writer._finish(commit=False)
                            raise
                    # A poisoned writer (a replay conflict caught in the block) may be
                    # closed: its end raises TransactionAbortedError, no purge is due.
                    purge_due = (
                        writer._unlinked and writer._poisoned is None and self._purge_due(writer)
                    )
                    with self._typed_engine_errors():
                        writer._finish(commit=True)
                finally:
                    state.writing = False
        except BaseException as error:
            if writer is not None:
                # A Ctrl-C after the commit returned, on the way out of the block (the
                # commit's own window is marked by the writer): the block is stored.
                if isinstance(error, KeyboardInterrupt) and writer._commit_returned():
                    after_commit(error)
                # One at the entry of the writer's end leaves its transaction open, and
                # with it the write lock that this thread's next write would wait for.
                writer._close_txn(commit=False)
            raise
        if purge_due:
            try:
                self.purge()
            except NeardupError:
                pass  # the block is stored; its removals await the next purge (see above)
            except BaseException as error:  # a Ctrl-C: the block is stored, say so
                after_commit(error)
                raise

    @contextmanager
    def _typed_engine_errors(self) -> Iterator[None]:
        """Raise an engine error from the block as its typed error (:meth:`_translate`),
        or as it is when none fits."""
        try:
            yield
        except lmdb.Error as err:
            typed = self._translate(err)
            if typed is err:
                raise
            raise typed from err

    def _translate(self, err: lmdb.Error) -> Exception:
        """The typed error for an engine error raised in a transaction (``err`` if none
        fits): a damaged page is :class:`CorruptStoreError`, a full disk
        :class:`StoreFullError`, another failed write :class:`StoreIOError`
        (:func:`write_failure` tells which), never a raw LMDB error."""
        if isinstance(err, _FOUND_DAMAGE):
            return self._damaged(err)
        failure = write_failure(err, self.path, "the data file", "the store")
        if failure is None:
            return err
        full, detail = failure
        return (StoreFullError if full else StoreIOError)(str(self.path), detail)

    def _translate_read(self, err: lmdb.Error) -> Exception:
        """:meth:`_translate` for an engine error of a read snapshot, which LMDB marks bad
        (``BadTxnError``) only after a failure on a damaged page, one that a step of the
        reader may have caught."""
        return self._damaged(err) if isinstance(err, lmdb.BadTxnError) else self._translate(err)

    def _damaged(self, err: lmdb.Error) -> CorruptStoreError:
        return CorruptStoreError(str(self.path), f"{err}; {DAMAGE_ADVICE}")

    def _wait_for_transactions(self, operation: str, wait_s: float = RESIZE_WAIT_S) -> None:
        """Refuse while the calling thread has a transaction open, and wait up to
        ``wait_s`` (holding ``_readers_done``) until other threads' have ended: ending
        one under its thread lost its writes and gave that thread a raw LMDB error.
        Meanwhile threads that hold no transaction wait before beginning one, so that a
        steady stream of short reads cannot keep the count above zero for the whole wait."""
        state = self._thread_state
        if getattr(state, "readers", 0) > 0 or getattr(state, "writing", False):
            raise StoreBusyError(
                str(self.path),
                operation,
                "inside a transaction of this thread; do it after the block (or once the "
                "pairs() iterator is done)",
            )
        # Transactions that end wake this wait; new ones of threads that hold none wait
        # for it (_begin_tracked), and are woken when it ends.
        self._closers_waiting += 1
        try:
            ended = self._readers_done.wait_for(
                lambda: (
                    self._active_readers == 0
                    and not self._growth_waiting
                    and self._holding_off is None  # a compaction or rebuild runs to its end
                ),
                timeout=wait_s,
            )
        finally:
            self._closers_waiting -= 1
            self._readers_done.notify_all()
        if not ended:
            waited = f" (waited {wait_s:.0f} s)" if wait_s else ""
            raise StoreBusyError(
                str(self.path),
                operation,
                f"while other threads of this process have transactions open{waited}; end "
                "them first, then retry",
            )

    def _env_info(self) -> dict[str, int]:
        """LMDB's ``env.info()``, with the lock a map growth holds: asked while another
        thread's ``set_mapsize`` ran, py-lmdb failed it (``Invalid argument``)."""
        self._require_env()  # before the lock, as in _begin_tracked
        with self._readers_lock:
            return self._require_env().info()  # type: ignore[no-any-return]

    def _page_size(self) -> int:
        self._require_env()
        with self._readers_lock:  # as in _env_info
            return int(self._require_env().stat()["psize"])

    def _used_bytes(self) -> int:
        return (int(self._env_info()["last_pgno"]) + 1) * self._page_size()

    def _ensure_headroom(self) -> None:
        size = self._map_size()
        if self._used_bytes() > (1 - MIN_FREE_FRACTION) * size:
            self._resize(2 * size)

    def _grow_and_begin_write(self) -> lmdb.Transaction:
        self._resize(max(2 * self._map_size(), 2 * self._used_bytes()))
        return self._begin(write=True)

    def _map_size(self) -> int:
        return int(self._env_info()["map_size"])

    def _seal_meta(self, txn: lmdb.Transaction, meta_db: Any = None) -> None:
        """Record :func:`codec.meta_checksum` after a sealed ``meta`` entry was written."""
        meta_db = self._meta_db if meta_db is None else meta_db
        raw = {name: bytes(txn.get(name.encode(), b"", db=meta_db)) for name in codec.SEALED_META}
        txn.put(b"meta_checksum", codec.pack_meta(codec.meta_checksum(raw)), db=meta_db)

    def _read_meta(self, txn: lmdb.Transaction, name: str) -> Any:
        return codec.unpack_meta(txn.get(name.encode(), db=self._meta_db))

    def _read_count(self, txn: lmdb.Transaction, name: str) -> int:
        """A bookkeeping count of ``meta`` (``commit_counter``, ``next_doc_id``), checked:
        these are outside the parameters' checksum, and a damaged one must stop a write
        with a typed error, not be trusted or raise a raw ``TypeError``."""
        value = self._read_meta(txn, name)
        if not meta_count_ok(name, value):
            raise CorruptStoreError(
                str(self.path), f"meta {name} is {value!r}, not a count; {REPAIR_COUNT}"
            )
        return int(value)  # type: ignore[call-overload]

    def _next_doc_id(self, txn: lmdb.Transaction) -> int:
        """``meta`` ``next_doc_id``, checked to lie past every stored id (``docs`` and
        ``removed``): one at or below them would hand out a stored id again, and the
        appended record of the new document would be refused while its key and band
        entries went in, pointing at another document."""
        next_id = self._read_count(txn, "next_doc_id")
        for db in (self._docs_db, self._removed_db):
            if (
                db is not None
                and (stored := id_after(txn, db, self._band_layout.id_limit)) > next_id
            ):
                raise CorruptStoreError(
                    str(self.path),
                    f"meta next_doc_id is {next_id}, but document id {stored - 1} is stored; "
                    f"{REPAIR_COUNT}",
                )
        return next_id

    def _write_counters(self, writer: WriteTxn) -> None:
        txn = writer._live  # not .txn: these writes are redone by _end after a growth
        counter = self._read_count(txn, "commit_counter") + 1
        txn.put(b"commit_counter", codec.pack_meta(counter), db=self._meta_db)
        if writer._next_id is not None:
            txn.put(b"next_doc_id", codec.pack_meta(writer._next_id), db=self._meta_db)
        size = self._map_size()
        recorded = self._read_meta(txn, "map_size")
        if not meta_count_ok("map_size", recorded) or recorded < size:
            txn.put(b"map_size", codec.pack_meta(size), db=self._meta_db)

    # -- validation helpers used by transactions -------------------------------------------------

    def _check_threshold(self, threshold: float | None) -> float:
        return self.threshold if threshold is None else valid_threshold(threshold)

    def _check_signatures(self, signatures: npt.ArrayLike) -> npt.NDArray[np.uint32]:
        """``signatures`` as a contiguous uint32 matrix of this store's width. A refused
        row is named by its position among them (the first refused one), as a bad text
        is by its ``index``: in a long batch the caller could not find it otherwise."""
        num_perm = self.config.num_perm
        if isinstance(signatures, list | tuple):
            _check_row_types(signatures)
        try:
            array = np.asarray(signatures)
        except (ValueError, TypeError):
            raise InvalidSignatureError(
                "rows of different shapes",
                "one shape (num_perm,) for every signature",
                _first_misshapen(signatures, num_perm),
            ) from None
        if array.ndim != 2 or array.shape[1] != num_perm or array.dtype.kind not in "ui":
            raise InvalidParameterError(
                "signatures", f"{array.dtype} array of shape {array.shape}",
                f"integers of shape (n, {num_perm}) made with this store's configuration",
            )  # fmt: skip
        if array.dtype == np.uint32:
            return np.ascontiguousarray(array)  # in range by its type; no copy of a batch
        if array.size and (array.min() < 0 or array.max() > 0xFFFFFFFF):
            outside = ((array < 0) | (array > 0xFFFFFFFF)).any(axis=1)
            raise InvalidSignatureError(
                "values out of range", "uint32 values", int(np.argmax(outside))
            )
        return array.astype(np.uint32)

    def _check_signature(self, signature: npt.ArrayLike) -> npt.NDArray[np.uint32]:
        if isinstance(signature, list | tuple):
            with single_document():  # one signature: not "signature #0"
                _check_row_types([signature])
        array = _numbers(signature, "signature")
        if array.dtype == np.uint32 and array.shape == (self.config.num_perm,):
            return array  # the common case, and every value is in range by its type
        if array.ndim != 1:
            raise InvalidParameterError(
                "signature",
                f"shape {array.shape}",
                f"one signature of {self.config.num_perm} values",
            )
        with single_document():  # one signature: not "signature #0"
            return self._check_signatures(array[None, :])[0]

    # -- single-call conveniences (each its own transaction) -------------------------------------

    def __len__(self) -> int:
        with self.read() as txn:
            return len(txn)

    def __contains__(self, key: object) -> bool:
        with self.read() as txn:
            return key in txn

    def __iter__(self) -> Iterator[Key]:
        """Keys in insertion order, read in chunks of short transactions (not one snapshot).

        It ends at the last document stored when it began: what the loop (or anyone)
        adds or replaces meanwhile is not yielded, since a replacement is a new document
        after them. Without that bound, a loop replacing each document met its
        replacements again and never ended. A document removed before its chunk is read
        is not yielded.
        """
        with self.read() as txn, txn.txn.cursor(db=self._docs_db) as cursor:
            if not cursor.last():
                return
            until = bytes(cursor.key())
        after: bytes | None = None
        while True:
            with self.read() as txn:
                rows = txn._key_rows(after, until)
                try:  # the cursor is closed before its transaction ends
                    chunk = [(bytes(raw), key) for raw, key in itertools.islice(rows, ITER_CHUNK)]
                finally:
                    rows.close()
            yield from (key for _, key in chunk)
            if len(chunk) < ITER_CHUNK:
                return
            after = chunk[-1][0]

    def get(self, key: Key) -> Document:
        """See :meth:`ReadTxn.get`."""
        with self.read() as txn:
            return txn.get(key)

    def query(self, document: object = None, **options: Any) -> list[Match]:
        """See :meth:`ReadTxn.query`."""
        with self.read() as txn:
            return txn.query(document, **options)

    def query_many(
        self, documents: Iterable[object] | None = None, **options: Any
    ) -> list[list[Match]]:
        """See :meth:`ReadTxn.query_many`."""
        with self.read() as txn:
            return txn.query_many(documents, **options)

    def add(self, key: Key, document: object = None, **options: Any) -> bool:
        """See :meth:`WriteTxn.add`."""
        with self.write() as txn:
            return txn.add(key, document, **options)

    def add_many(
        self,
        items: Iterable[tuple[Key, object] | tuple[Key, object, Any]],
        *,
        batch_size: BatchSize = AUTO,
        replace: bool = False,
        encoding: str | None = None,
    ) -> int:
        """Add many items, committing every ``batch_size`` items: a number, ``None`` for
        one transaction, or ``"auto"`` for :meth:`transaction_size` at each commit.

        If a batch fails, nothing of it is written and the batches before it stay
        committed: the error's ``committed`` attribute is how many items they held (where
        to resume), and an error about one document numbers it (``index``) from the
        call's first item. So does an error of ``items`` itself (a generator reading a
        file that raises), or a Ctrl-C. A bad ``encoding`` is refused before anything is
        written.
        """
        check_batch(items, *TEXT_ITEMS)
        check_flags(replace=replace)
        if encoding is not None:  # before the first batch commits, not at its first bytes
            check_encoding(encoding)
        if replace:
            return self._in_batches(
                items,
                batch_size,
                lambda txn, batch: txn.add_many(batch, replace=True, encoding=encoding),
            )
        # Each batch is signed before its write transaction begins: LMDB lets one writer
        # in at a time, so signing inside would make concurrent writers take turns at the
        # costliest step instead of only at the writes.
        return self._in_batches(
            items,
            batch_size,
            lambda txn, batch: txn._add_prepared(batch),
            prepare=lambda batch: self._prepared(batch, encoding),
        )

    def _prepared(self, batch: list[Any], encoding: str | None) -> Any:
        """``(key, text[, metadata])`` items validated, signed and banded (no transaction)."""
        self._check_writable()
        return prepare_batch(self, document_items(batch), encoding=encoding)

    def add_signatures(
        self,
        items: Iterable[tuple[Key, Any] | tuple[Key, Any, Any]],
        *,
        batch_size: BatchSize = AUTO,
        replace: bool = False,
    ) -> int:
        """:meth:`WriteTxn.add_signatures`, committing every ``batch_size`` items (as for
        :meth:`add_many`)."""
        check_batch(items, *SIGNATURE_ITEMS)
        check_flags(replace=replace)
        return self._in_batches(
            items, batch_size, lambda txn, batch: txn.add_signatures(batch, replace=replace)
        )

    def transaction_size(self) -> int:
        """Documents per write transaction that keep the cost of adding one about the
        same as the store grows; what ``batch_size="auto"`` commits at.

        A transaction copies each B-tree page it changes once. A batch of random band keys
        changes nearly every page of a band table once the table has fewer pages than the
        batch has documents, so a fixed batch pays more per document the larger the store
        (1.7x more at 1M than at 100k with 10k per transaction; ``tools/README.md``,
        "Where the time goes"). A tenth of the stored documents keeps the pages copied
        per document level; at least :data:`MIN_TRANSACTION`, and no more than
        :data:`TRANSACTION_SIGNATURE_BYTES` of signatures, which a transaction keeps in
        memory until it commits.
        """
        most = max(MIN_TRANSACTION, TRANSACTION_SIGNATURE_BYTES // (4 * self.config.num_perm))
        return min(most, max(MIN_TRANSACTION, len(self) // 10))

    def _batch_sizes(
        self, batch_size: BatchSize, *, allow_none: bool = True
    ) -> Callable[[], int | None]:
        """What :func:`batches` asks for the size of each batch: ``batch_size``, or
        :meth:`transaction_size` for ``"auto"`` (checked by :func:`check_batch_size`)."""
        size = check_batch_size(batch_size, allow_none=allow_none)
        return self.transaction_size if size == AUTO else lambda: size  # type: ignore[return-value]

    def _in_batches(
        self,
        items: Iterable[Any],
        batch_size: BatchSize,
        add: Callable[[WriteTxn, Any], int],
        prepare: Callable[[list[Any]], Any] | None = None,
    ) -> int:
        """Run ``add`` on consecutive batches, one write transaction each; sum the counts.

        ``prepare`` turns up to :data:`MIN_TRANSACTION` items at a time into what ``add``
        takes, all of a batch before its transaction begins, so that a large batch holds
        its prepared form in memory rather than its texts.
        """
        next_size = self._batch_sizes(batch_size)
        total, committed = 0, _Committed()
        with committed.stamped():
            for batch in batches(items, next_size):
                with _placed(committed.earlier):
                    parts = [batch]
                    if prepare is not None:
                        parts = []
                        for lo in range(0, len(batch), MIN_TRANSACTION):
                            with _placed(lo):
                                parts.append(prepare(batch[lo : lo + MIN_TRANSACTION]))
                    with self.write() as txn:
                        committed.begin(txn, len(batch))
                        for part in parts:
                            total += add(txn, part)
                committed.end()
        return total

    def remove(self, key: Key, *, missing_ok: bool = False) -> bool:
        """See :meth:`WriteTxn.remove`."""
        with self.write() as txn:
            return txn.remove(key, missing_ok=missing_ok)

    def remove_many(
        self, keys: Iterable[Key], *, missing_ok: bool = False, batch_size: BatchSize = None
    ) -> int:
        """:meth:`WriteTxn.remove_many`: one transaction, all or nothing, unless
        ``batch_size`` (a number or ``"auto"``, as for :meth:`add_many`) asks for a commit
        every that many keys, which bounds the memory and the pages one transaction holds.

        A key listed twice is removed once. Unless ``missing_ok``, every key is looked up
        before the first commit, so a missing one raises with nothing removed (a key that
        another process removes meanwhile fails its batch, the ones before it stay).
        """
        check_batch(keys, *KEYS)
        check_flags(missing_ok=missing_ok)
        wanted = list(
            {
                codec.key_index(*key_bytes_of_item(key, index)): key
                for index, key in enumerate(keys)
            }.values()
        )
        next_size = self._batch_sizes(batch_size)
        first = next_size()
        if not missing_ok and first is not None and len(wanted) > first:
            with self.read() as reader:
                absent = next((key for key in wanted if key not in reader), None)
            if absent is not None:
                raise KeyNotFoundError(absent)
        return self._in_batches(
            wanted, batch_size, lambda txn, batch: txn.remove_many(batch, missing_ok=missing_ok)
        )

    def purge(
        self, batch_size: BatchSize = AUTO, progress: Callable[[int], None] | None = None
    ) -> int:
        """Delete the band entries of every removed document (:meth:`WriteTxn.purge`),
        committing every ``batch_size`` documents (``None``: all in one transaction);
        returns how many were purged.

        Removing moves a document out of every index but the band tables, whose entries
        it leaves for this to delete many at a time. It runs on its own after a removal
        once they exceed :data:`PURGE_FRACTION` of the documents and
        :data:`MIN_TRANSACTION`, and before a compaction.
        ``progress`` is called with the number purged so far after each commit.
        """
        self._check_writable()
        check_progress(progress)
        next_size = self._batch_sizes(batch_size)
        total = 0
        while True:
            size = next_size()
            with self.read() as reader:  # nothing to purge: not even the write lock
                if not reader.awaiting_purge():
                    return total
            with self.write() as txn:
                done = txn.purge(size)
            total += done
            if progress is not None and done:
                progress(total)
            if size is None or done < size:
                return total

    @staticmethod
    def _purge_due(txn: ReadTxn) -> bool:
        """Whether the removals awaiting a purge in ``txn`` have passed
        :data:`PURGE_FRACTION` of its documents (and :data:`MIN_TRANSACTION`).

        Read through :class:`ReadTxn`'s methods, which a write transaction does not log:
        logged, this question of the store's own was asked again when a growth at the
        commit replayed the block, and a commit of another process in between (a
        different count) refused the block as a conflict (review 47)."""
        awaiting, stored = ReadTxn.awaiting_purge(txn), ReadTxn.__len__(txn)
        return awaiting > max(MIN_TRANSACTION, PURGE_FRACTION * stored)

    def add_if_unique(self, key: Key, document: object = None, **options: Any) -> UniqueResult:
        """See :meth:`WriteTxn.add_if_unique`."""
        with self.write() as txn:
            return txn.add_if_unique(key, document, **options)

    def add_many_if_unique(self, items: Iterable[Any], **options: Any) -> list[UniqueResult]:
        """See :meth:`WriteTxn.add_many_if_unique` (one transaction)."""
        with self.write() as txn:
            return txn.add_many_if_unique(items, **options)

    def add_signatures_if_unique(self, items: Iterable[Any], **options: Any) -> list[UniqueResult]:
        """See :meth:`WriteTxn.add_signatures_if_unique` (one transaction)."""
        with self.write() as txn:
            return txn.add_signatures_if_unique(items, **options)

    def sync(self) -> None:
        """Flush to disk (useful after bulk work with ``durable=False``)."""
        env = self._require_env()
        if not self.read_only:  # nothing to flush, and LMDB refuses with EACCES
            env.sync(True)

    # -- maintenance (see maintenance.py) --
    # Thin delegations; the work and the documentation live in maintenance.py.

    def pairs(self, threshold: float | None = None) -> Iterator[maintenance.Pair]:
        """See :func:`maintenance.pairs`."""
        from . import maintenance

        return maintenance.pairs(self, threshold)

    def clusters(
        self, threshold: float | None = None, progress: Callable[[int], None] | None = None
    ) -> list[list[Key]]:
        """See :func:`maintenance.clusters`."""
        from . import maintenance

        return maintenance.clusters(self, threshold, progress)

    def stats(self, largest: int = 5) -> maintenance.StoreStats:
        """See :func:`maintenance.stats`."""
        from . import maintenance

        return maintenance.stats(self, largest)

    def check(
        self, repair: bool = False, progress: Callable[[int], None] | None = None
    ) -> maintenance.CheckReport:
        """See :func:`maintenance.check`."""
        from . import maintenance

        return maintenance.check(self, repair, progress)

    def compact(
        self, dry_run: bool = False, progress: Callable[[int], None] | None = None
    ) -> maintenance.CompactReport:
        """See :func:`maintenance.compact`."""
        from . import maintenance

        return maintenance.compact(self, dry_run, progress)

    def rebuild(
        self,
        threshold: float | None = None,
        bands: int | None = None,
        rows: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> maintenance.RebuildReport:
        """See :func:`maintenance.rebuild`."""
        from . import maintenance

        return maintenance.rebuild(self, threshold, bands, rows, progress)

    def export(self, stream: IO[bytes], progress: Callable[[int], None] | None = None) -> int:
        """See :func:`maintenance.export`."""
        from . import maintenance

        return maintenance.export(self, stream, progress)

    def export_file(
        self, path: str | os.PathLike[str], progress: Callable[[int], None] | None = None
    ) -> int:
        """See :func:`maintenance.export_file`."""
        from . import maintenance

        return maintenance.export_file(self, path, progress)

    def import_(self, stream: IO[bytes], **options: Any) -> int:
        """See :func:`maintenance.import_`."""
        from . import maintenance

        return maintenance.import_(self, stream, **options)

    def backup(
        self, path: str | os.PathLike[str], progress: Callable[[int], None] | None = None
    ) -> maintenance.BackupReport:
        """See :func:`maintenance.backup`."""
        from . import maintenance

        return maintenance.backup(self, path, progress)

    @classmethod
    def create_from_export(
        cls, path: str | os.PathLike[str], stream: IO[bytes], **options: Any
    ) -> Store:
        """See :func:`maintenance.create_from_export`."""
        from . import maintenance

        return maintenance.create_from_export(path, stream, **options)


def _never_created(env: lmdb.Environment) -> bool:
    """Whether ``env`` holds nothing but, at most, an empty ``meta`` table.

    That is what a creation killed before its commit leaves (an empty ``meta`` table too,
    from stores created before the tables moved into the creating transaction). Another
    application's environment holds more, so it is still refused. An environment LMDB
    cannot read counts as created: reading its meta table then says what is wrong.
    """
    try:
        with env.begin() as txn:
            names = [bytes(name) for name, _ in txn.cursor()]
        if not names:
            return True
        if names != [codec.META_DB]:
            return False
        meta_db = env.open_db(codec.META_DB, create=False)
        with env.begin() as txn:
            return int(txn.stat(meta_db)["entries"]) == 0
    except lmdb.MapResizedError:
        raise  # another process grew the map meanwhile: the open is retried
    except lmdb.Error:
        return False


class _Reading:
    """What :meth:`Store.read` returns: a plain context manager rather than a generator,
    since every ``Store.query`` pays for one (two generator frames cost about as much
    as a query through the band cache)."""

    __slots__ = ("_counts", "_reader", "_store", "_txn")

    def __init__(self, store: Store) -> None:
        self._store = store
        self._reader: ReadTxn | None = None
        self._txn: lmdb.Transaction | None = None
        self._counts: dict[str, Any] | None = None  # the thread's state it is counted in

    def __enter__(self) -> ReadTxn:
        store = self._store
        store._sweep_readers(force=False)
        # This thread's own namespace (the threading.local object itself would resolve
        # to whichever thread ends the read).
        self._counts = store._thread_state.__dict__
        txn = store._begin_tracked(write=False)
        try:  # counted from here: an error (a Ctrl-C) before the block must uncount it
            self._reader = ReadTxn(store, txn)
            self._txn = txn
        except BaseException:
            txn.abort()
            store._end_tracked()
            raise
        return self._reader

    def __exit__(self, kind: object, error: BaseException | None, _: object) -> None:
        self._end()
        if isinstance(error, lmdb.Error):  # a damaged page met by the block's reads
            typed = self._store._translate_read(error)
            if typed is not error:
                raise typed from error

    def _end(self) -> None:
        txn, self._txn = self._txn, None
        if txn is None or self._store._forked():
            # A child forked in the block must not end the parent's snapshot: LMDB's
            # reader table is shared, and writers would reuse the pages it still reads.
            return
        try:
            reader, self._reader = self._reader, None
            assert reader is not None  # set before _txn by __enter__
            stale = reader.epoch != self._store.map_epoch
            reader._close()
            if not stale:  # a stale one was ended by the map's growth
                txn.abort()
        finally:
            self._store._end_tracked(self._counts)


_BOOLS = frozenset((bool, np.bool_))


def _check_row_types(rows: Sequence[object]) -> None:
    """Refuse a row that is not integers by its own type: stacked, numpy casts the rows to
    one type, and a row of bools (or floats) among integer rows passed as their values.
    An array row is judged by its dtype. A row of Python numbers is judged by its first
    value (a conversion of each row to read its type made lists of ints a third slower),
    and refused if any value is a bool: numpy stacks ints and bools as ints, so a bool
    after the first value was stored as 0 or 1 (a float there makes the stack float,
    which is refused). The bools are looked for by one pass in C over the row's types,
    about 4 µs a row of 256 values (add_signatures of such lists: a seventh more)."""
    for index, row in enumerate(rows):
        if isinstance(row, np.ndarray):
            dtype = row.dtype
        elif isinstance(row, list | tuple) and row:
            if not _BOOLS.isdisjoint(map(type, row)):
                raise InvalidSignatureError(
                    "a signature with bool values", "integers in every signature", index
                )
            first = row[0]
            if type(first) is int or isinstance(first, np.integer):
                continue  # the usual row of Python numbers, told without numpy
            try:
                dtype = np.asarray([first]).dtype
            except (ValueError, TypeError):
                continue  # stacking reports it
        else:
            continue  # stacking reports what is neither
        if dtype.kind not in "ui":
            raise InvalidSignatureError(
                f"a signature of {dtype} values", "integers in every signature", index
            )


def _first_misshapen(rows: object, num_perm: int) -> int | None:
    """The position of the first of ``rows`` that is not one signature of ``num_perm``
    values (``None`` if none is found so)."""
    if not isinstance(rows, list | tuple):
        return None
    for index, row in enumerate(rows):
        try:
            shape = np.shape(row)
        except (ValueError, TypeError):  # itself ragged
            return index
        if shape != (num_perm,):
            return index
    return None


def _numbers(values: npt.ArrayLike, name: str) -> npt.NDArray[Any]:
    """``values`` as an array; rows of different lengths are a typed error, not numpy's."""
    try:
        return np.asarray(values)
    except (ValueError, TypeError):
        raise InvalidParameterError(
            name, "rows of different shapes", "one shape (num_perm,) for every signature"
        ) from None


def write_failure(
    err: Exception, directory: Path, file: str, holder: str
) -> tuple[bool, str] | None:
    """Whether ``err``, raised writing ``directory``'s ``data.mdb``, is a full disk (and
    its detail), or ``None`` if it is no failure of the write itself.

    LMDB reports a full disk in two ways: the errno of a write that could not start
    (ENOSPC, EFBIG, EDQUOT), or ``EIO`` for a write that stopped part-way, as a write
    does at the end of the disk or of the process's file-size limit. So an ``EIO`` is a
    full disk when the file cannot grow any more (:func:`out_of_space`; ``file`` and
    ``holder`` name the two in the reason), and otherwise an I/O error of the device.
    """
    code = getattr(err, "errno", None)
    text = (err.strerror if isinstance(err, OSError) else None) or str(err)
    if code in _DISK_FULL or any(os.strerror(e) in text for e in _DISK_FULL):
        return True, text
    if code == errno.EIO or os.strerror(errno.EIO) in text:
        reason = out_of_space(directory, file, holder)
        return (False, text) if reason is None else (True, f"{text}: {reason}")
    return None


def out_of_space(directory: Path, file: str, holder: str) -> str | None:
    """Why ``directory``'s ``data.mdb`` cannot grow (this process's file-size limit or
    the disk reached), or ``None``; ``file`` and ``holder`` name the two in the reason."""
    try:
        size = (directory / "data.mdb").stat().st_size
        disk = os.statvfs(directory)
    except OSError:
        return None
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit != resource.RLIM_INFINITY and size + FULL_DISK_SLACK > limit:
        return f"{file} reached this process's file-size limit of {limit} bytes"
    # root may write into the blocks a file system reserves; other users may not
    blocks = disk.f_bfree if os.geteuid() == 0 else disk.f_bavail
    if blocks * disk.f_frsize < FULL_DISK_SLACK:
        return f"the disk holding {holder} has {blocks * disk.f_frsize} bytes free"
    return None


def holds_store(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a store whose creation committed: nothing there, or what a
    creation killed before its first commit left (which ``Store.open(create=True)`` goes
    on with), is none.

    Raises:
        NotAStoreError: something else is there; StoreBusyError: this process has it open.
    """
    try:
        Store.open(path, read_only=True).close()
    except StoreNotFoundError:
        return False
    except NotAStoreError as err:
        if err.found in (UNFINISHED_CREATION, EMPTY_DATA_FILE):
            return False
        raise
    return True


def _wait_for_creator(directory: Path) -> bool:
    """Wait while another process creates the store at ``directory`` (it holds the
    creation lock until its first commit). Returns whether there was a lock to wait on:
    an open that meets a creation in progress waits for it, as it waits for any write,
    instead of refusing a store that is about to exist."""
    try:
        fd = os.open(directory / CREATE_LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)  # closing releases the lock
    return True


_PID = os.getpid()
"""This process's id, kept current across forks: a cheaper check than ``os.getpid()``, a
system call, on every transaction."""


def _note_fork() -> None:
    global _PID
    _PID = os.getpid()


os.register_at_fork(after_in_child=_note_fork)


@contextmanager
def _creation_lock(directory: Path, create: bool, mode: int) -> Iterator[None]:
    """Serialise processes that may create the store, so none sees it half made."""
    if not create:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True, mode=mode)
    _make_as_data(directory / CREATE_LOCK_FILE)
    fd = os.open(directory / CREATE_LOCK_FILE, os.O_RDWR | os.O_CREAT, mode & 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _make_as_data(path: Path) -> None:
    """Make the lock file ``path`` of an existing store, if missing, with the group and
    permission bits of its ``data.mdb``.

    A backup holds ``data.mdb`` alone, and so does a store restored from one. Made with
    the opener's ``mode`` (owner-only by default) and primary group, the lock files
    would keep the rest of the group a store was made for from opening it, since even a
    read-only open writes them. A new store's files get the mode it is made with.
    """
    try:
        data = (path.parent / "data.mdb").stat()
    except OSError:
        return  # no store yet (or none this user can see: the open says so)
    bits = stat.S_IMODE(data.st_mode) & 0o666
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, bits)
    except OSError:
        return  # there already, or not to be made here: the open that follows says why
    try:
        if os.fstat(fd).st_gid != data.st_gid:
            with contextlib.suppress(PermissionError):  # a group this user is not in
                os.fchown(fd, -1, data.st_gid)
        os.fchmod(fd, bits)  # past the umask, and after chown, which may clear bits
    finally:
        os.close(fd)


STORE_FILES = ("data.mdb", "lock.mdb", LOCK_FILE, CREATE_LOCK_FILE)
"""The files a store directory holds of its own (a killed creation leaves some of them)."""


def _refuse_foreign_files(directory: Path) -> None:
    """Refuse to create a store in a directory that holds files of its own (a mistyped
    path such as a home directory): a store is made only in a new or empty directory,
    or where a killed creation left nothing but a store's own files."""
    if (directory / "data.mdb").exists():
        return
    foreign = _foreign_files(directory)
    if foreign:
        raise NotAStoreError(str(directory), f"no store, but other files: {foreign}")


def _foreign_files(directory: Path) -> str:
    """The first names (quoted) of the files in ``directory`` that are not a store's own,
    or ``""`` if it holds none (or is no directory)."""
    if not directory.is_dir():
        return ""
    foreign = sorted(
        entry.name
        for entry in directory.iterdir()
        if entry.name not in STORE_FILES and not entry.name.startswith(".compact-")
    )
    shown = ", ".join(repr(name) for name in foreign[:3])
    return shown + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")


def _regular_size(path: Path) -> int | None:
    """The size of ``path`` if it is a regular file, else ``None``."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _cut_short(data: Path) -> str | None:
    """:func:`lmdbfile.cut_short` of the regular file ``data`` (``None`` for anything
    else, or a file that cannot be read: LMDB's open reports those)."""
    if _regular_size(data) is None:
        return None
    try:
        return lmdbfile.cut_short(data)
    except (OSError, ValueError):  # ValueError: mmap of a file that shrank to nothing
        return None


def _unusable_path(directory: Path, err: OSError) -> NeardupError | None:
    """The typed error for an ``OSError`` that ``directory`` itself caused on its way to
    being opened or made (``None`` for other failures, which stay as they are): the part
    of the path at fault is named."""
    code, path = err.errno, str(directory)
    if code in (errno.ENOTDIR, errno.EEXIST, errno.ELOOP):
        blocked = _blocked(directory) or f"{err.filename or path} is not a directory"
        return NotAStoreError(path, f"{blocked}, so no store directory can be there")
    if code == errno.ENAMETOOLONG:
        longest = max(directory.parts, key=lambda part: len(os.fsencode(part)))
        shown = longest if len(longest) <= 40 else f"{longest[:37]}..."
        return NotAStoreError(
            path,
            f"its name {shown!r} ({len(os.fsencode(longest))} bytes) or the whole path is "
            "longer than the file system allows",
        )
    if code == errno.EISDIR:
        name = Path(err.filename or path).name
        return CorruptStoreError(
            path,
            f"its lock file {name} is a directory: remove that directory (a lock file holds "
            "no data, and opening the store makes it again)",
        )
    if code == errno.ENOENT:
        return NotAStoreError(path, f"no directory can be made there ({err.strerror})")
    if code == errno.EROFS:
        return StorePermissionError(
            path,
            "the file system is read-only: a store there opens only with read_only=True, and "
            "none can be made there",
        )
    return None


def _blocked(directory: Path) -> str | None:
    """What in ``directory``'s path keeps a directory from being there (a file on the way,
    a link to nothing, a loop of links), or ``None``."""
    for part in [*reversed(directory.parents), directory]:
        try:
            info = os.stat(part)
        except FileNotFoundError:
            if os.path.islink(part):
                return f"{part} is a link to {os.readlink(part)!r}, which does not exist"
            return None  # the rest of the path can be made
        except OSError as err:
            return f"{part} is in a loop of symbolic links" if err.errno == errno.ELOOP else None
        if not stat.S_ISDIR(info.st_mode):
            return f"{part} is a file"
    return None


def _remove_compaction_leftovers(directory: Path) -> None:
    """Delete ``.compact-*`` scratch directories that a killed compaction left behind.

    Safe while holding the shared lock: a compaction holds ``neardup.lock`` exclusively
    from before it creates its scratch directory until after it removes it, so no
    compaction is running while anyone holds the lock shared.
    """
    for leftover in directory.glob(".compact-*"):
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)


def _lmdb_file_damage(path: Path, err: lmdb.Error) -> str | None:
    """What is wrong with a file that starts like an LMDB file but that LMDB refused, or
    ``None`` when it is not an LMDB file or the refusal is not about its bytes (such as
    a permission error)."""
    try:
        with open(path, "rb") as file:
            head = file.read(2 * 65536)
    except OSError:
        return None
    metas = lmdbfile.read_meta_pages(head)
    if not any(isinstance(m, lmdbfile.MetaPage) and m.magic == lmdbfile.MAGIC for m in metas):
        return None
    problems = lmdbfile.check_meta_pages(metas)
    if problems:
        return problems[0]
    return str(err) if isinstance(err, _DAMAGE) else None


def check_batch_size(
    batch_size: object, *, allow_none: bool = False, allow_auto: bool = True
) -> BatchSize:
    """``batch_size`` if it is a positive integer, or ``"auto"`` or ``None`` where allowed.

    Raises:
        InvalidParameterError: it is not.
    """
    if (batch_size is None and allow_none) or (
        isinstance(batch_size, str) and batch_size == AUTO and allow_auto
    ):
        return batch_size  # type: ignore[return-value]
    size = integer(batch_size)
    if size is not None and 0 < size <= sys.maxsize:
        return size
    expected = "a positive integer"
    others = [name for name, allowed in (("None", allow_none), ('"auto"', allow_auto)) if allowed]
    if others:
        expected = ", ".join([expected, *others[:-1]]) + f" or {others[-1]}"
    raise InvalidParameterError("batch_size", batch_size, expected)


@contextmanager
def _placed(start: int) -> Iterator[None]:
    """Around a batch that begins at item ``start`` of its call: an error about one of its
    documents counts ``index`` from the call's first item."""
    try:
        yield
    except DocumentError as error:
        if error.index is not None:
            error.index += start
        raise


class _Committed:
    """How many items of a batched call are stored, for the ``committed`` of its error: the
    earlier batches', and the current one's once its commit has returned. A Ctrl-C can
    come at any point, during the commit's own C call too (Python raises it after the
    call returns), so the transaction is asked, not the control flow; the state is one
    tuple, replaced whole, so that it is never seen half updated."""

    def __init__(self) -> None:
        self._state: tuple[int, WriteTxn | None, int] = (0, None, 0)

    @property
    def earlier(self) -> int:
        """Items of the batches committed before the current one."""
        return self._state[0]

    def begin(self, writer: WriteTxn, size: int) -> None:
        """The current batch, of ``size`` items, is written by ``writer``."""
        self._state = (self._state[0], writer, size)

    def end(self) -> None:
        """The current batch is committed."""
        earlier, _, size = self._state
        self._state = (earlier + size, None, 0)

    @property
    def count(self) -> int:
        earlier, writer, size = self._state
        return earlier + (size if writer is not None and writer._commit_returned() else 0)

    @contextmanager
    def stamped(self) -> Iterator[None]:
        """Any exception leaving the block carries :attr:`count` as ``committed`` (and a
        note saying where to resume, unless nothing was committed): ours, a Ctrl-C, and
        also the caller's own, from the items it iterates or a progress callback, since
        earlier batches are committed whatever ended the call."""
        try:
            yield
        except BaseException as error:
            committed = self.count
            mark(error, "committed", committed)
            if committed:
                note(
                    error,
                    f"earlier batches committed the first {committed} items; "
                    f"resume from item #{committed}",
                )
            raise


def mark(error: BaseException, name: str, value: object) -> None:
    """Set attribute ``name`` of ``error``, also on an exception type of the caller's that
    refuses new attributes (a frozen dataclass): BaseException always has a ``__dict__``."""
    try:
        setattr(error, name, value)
    except Exception:
        with contextlib.suppress(Exception):
            object.__setattr__(error, name, value)


def note(error: BaseException, text: str) -> None:
    """``error.add_note(text)``, falling back as :func:`mark` does; an exception whose
    ``__notes__`` is no list keeps them (its ``committed`` still says it)."""
    try:
        error.add_note(text)
    except Exception:
        if getattr(error, "__notes__", None) is None:
            mark(error, "__notes__", [text])


def batches(items: Iterable[Any], next_size: Callable[[], int | None]) -> Iterator[list[Any]]:
    """Consecutive lists of ``items``, each as long as ``next_size()`` said when it began
    (``None``: all that remain)."""
    batch: list[Any] = []
    size = next_size()
    for item in items:
        batch.append(item)
        if size is not None and len(batch) >= size:
            yield batch
            batch = []
            size = next_size()
    if batch:
        yield batch
