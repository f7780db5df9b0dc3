"""Export and import: a store's documents as a portable msgpack stream.

The stream (specified in :mod:`.codec`) carries each document's key, signature and
metadata, never band keys: an import recomputes them for the receiving store's banding,
so a stream moves between stores whose bandings differ. Signatures are only comparable
under one configuration, so the receiving store's configuration must equal the stream's.

Reading is safe on untrusted input: msgpack is decoded without extension hooks, every
object is checked before use and a stream that ends inside an object is an error, not
a silent early end.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import lzma
import os
import shutil
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, NamedTuple

import msgpack
import numpy as np
import numpy.typing as npt

from . import codec
from ._version import __version__
from .errors import (
    PROGRESS_EVERY,
    InvalidParameterError,
    InvalidStreamError,
    NeardupError,
    OutputWriteError,
    StoreBusyError,
    StreamReadError,
    check_flags,
    check_progress,
    path_of,
    real_path,
)
from .lsh import LSHParams
from .minhash import MinHashConfig
from .params import valid_threshold
from .store import (
    STORE_FILES,
    Store,
    _Committed,
    _placed,
    batches,
    check_batch_size,
    holds_store,
    mark,
)

if TYPE_CHECKING:
    from .txn import Key


_Record = tuple["Key", npt.NDArray[np.uint32], Any]


def export(store: Store, stream: IO[bytes], progress: Callable[[int], None] | None = None) -> int:
    """Write every document (key, signature, metadata) to a binary stream, in id order.

    The export is one snapshot: documents committed while it runs are not in it.

    Returns:
        The number of documents written.

    Example:
        >>> with open("corpus.ndexport", "wb") as out:  # doctest: +SKIP
        ...     store.export(out)
    """
    _check_binary(stream, "wb")
    check_progress(progress)
    count = 0
    with store.read() as reader:
        banding = store._read_meta(reader.txn, "banding")
        stream.write(codec.export_header(store.config.to_dict(), banding, __version__))
        with reader.txn.cursor(db=store._docs_db) as cursor:
            for raw_id, value in cursor:
                record = codec.decode_record(value, codec.decode_id(raw_id))
                stream.write(codec.export_record(record))
                count += 1
                if progress is not None and count % PROGRESS_EVERY == 0:
                    progress(count)
    stream.write(codec.export_trailer(count))
    if progress is not None:
        progress(count)
    return count


def export_file(
    store: Store, path: str | os.PathLike[str], progress: Callable[[int], None] | None = None
) -> int:
    """:func:`export` into a file, which appears whole or not at all: the stream goes to a
    temporary file beside ``path``, synced and renamed over it once complete, and is deleted
    if the export fails or is interrupted (one left by a killed export to ``path`` is
    deleted by the next). A path that is no regular file (a named pipe,
    ``/dev/stdout``, a shell's ``>(...)``) is written as it is: a reader there sees the
    end marker or knows the stream was cut short.

    Raises:
        InvalidParameterError: ``path`` lies inside the store's directory (writing there
            could destroy the store), or is a directory.
        OutputWriteError: the file could not be written (a full disk, say).
    """
    target = path_of(path)
    check_progress(progress)
    if real_path(target).is_relative_to(real_path(store.path)):
        raise InvalidParameterError("path", str(target), "a file outside the store's directory")
    if target.is_dir():
        raise InvalidParameterError("path", str(target), "a file, not a directory")
    streamed = target.exists() and not target.is_file()  # a pipe or a device: as it is
    written = target if streamed else target.with_name(_partial_name(target, os.getpid()))
    if not streamed:
        _delete_killed_partials(target)
    try:
        with written.open("wb") as out:
            if not streamed:  # held while it is written (:func:`_delete_killed_partials`)
                fcntl.flock(out.fileno(), fcntl.LOCK_EX)
            count = export(store, out, progress)
            if not streamed:
                out.flush()
                os.fsync(out.fileno())
        if not streamed:
            os.replace(written, target)
    except BaseException as err:
        if not streamed:  # a failure here must not hide the one that ended the export
            with contextlib.suppress(OSError):
                written.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise OutputWriteError(str(target), err.strerror or str(err)) from err
        raise
    return count


_PARTIAL_NAME_MAX = 64
"""The most bytes :func:`_partial_name` names a temporary file with: a target's name that
the file system accepts (up to 255 bytes on most) must not be refused for its temporary
file, which is longer."""


def _partial_prefixes(target: Path) -> tuple[str, str]:
    """The two prefixes, before the exporting process's id, of a temporary file of an
    export to ``target``: its name, for a short one (and as earlier releases named every
    one), and a fixed-length digest of it for a long one."""
    digest = hashlib.blake2b(os.fsencode(target.name), digest_size=8).hexdigest()
    return f".{target.name}.partial-", f".neardup-export-{digest}.partial-"


def _partial_name(target: Path, pid: int) -> str:
    """The temporary file's name for an export to ``target`` by process ``pid``: at most
    :data:`_PARTIAL_NAME_MAX` bytes (the digest form is 48 at most, with a 7-digit id)."""
    named, digested = _partial_prefixes(target)
    if len(os.fsencode(f"{named}{pid}")) <= _PARTIAL_NAME_MAX:
        return f"{named}{pid}"
    return f"{digested}{pid}"


def _delete_killed_partials(target: Path) -> None:
    """Delete the temporary files of exports to ``target`` that were killed (one that ends
    deletes its own), under either name :func:`_partial_prefixes` gives. An export holds a
    lock on its file while it writes: a file whose process is alive here, or whose lock is
    held (an export in another PID namespace, a container or another host sharing the
    directory), stays."""
    prefixes = _partial_prefixes(target)
    try:
        names = os.listdir(target.parent)
    except OSError:
        return  # a missing or unreadable directory: the export's own open reports it
    for name in names:
        prefix = next((p for p in prefixes if name.startswith(p)), None)
        if prefix is None:
            continue
        pid = name[len(prefix) :]
        if not (pid.isascii() and pid.isdigit()) or int(pid) == os.getpid():
            continue  # ("²".isdigit() holds, and int() refuses it)
        partial = target.parent / name
        try:
            os.kill(int(pid), 0)
            continue  # alive here (or another user's process)
        except ProcessLookupError:
            pass
        except OSError:
            continue
        with contextlib.suppress(OSError), partial.open("rb") as held:
            fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # else: in use
            partial.unlink()


def _check_binary(stream: object, mode: str) -> None:
    """Refuse a text stream, or something that is no stream (a path, say), before anything
    is read or written: exports are bytes."""
    needed = "write" if "w" in mode else "read"
    if isinstance(stream, io.TextIOBase) or not callable(getattr(stream, needed, None)):
        raise InvalidParameterError(
            "stream", type(stream).__name__, f"a binary stream (open the file with {mode!r})"
        )


_READ_FAILURES = (OSError, EOFError, zlib.error, lzma.LZMAError)
"""What a source stream raises when it cannot be read: an I/O error, or a compressed file
(``gzip.open``, ``bz2``, ``lzma``) cut short (``EOFError``) or damaged."""


class _Counting:
    """A read-only stream wrapper counting the bytes handed to the unpacker.

    It reads what a buffered stream has (``read1``) rather than waiting for a whole chunk:
    from a pipe fed slowly, each record is imported once it has arrived, not once the
    next 16 KiB have.
    """

    def __init__(self, stream: IO[bytes]) -> None:
        self._read = getattr(stream, "read1", stream.read)
        self.consumed = 0

    def read(self, size: int = -1) -> bytes:
        try:
            data = self._read(size)
        except _READ_FAILURES as err:  # the source's failure, typed: the stream could not be read
            detail = getattr(err, "strerror", None) or str(err) or type(err).__name__
            raise StreamReadError(self.consumed, detail) from err
        self.consumed += len(data)
        return data


_SEALED_VERSION = 3
"""The first export version whose header and records carry checksums."""


class _Header(NamedTuple):
    """What an export's header says, checked."""

    raw_config: dict[str, Any]  # as the stream holds it, compared with a store's
    config: MinHashConfig
    params: dict[str, Any]  # threshold, bands, rows


class _ExportReader:
    """Validated objects of an export stream: the header, then the records."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._source = _Counting(stream)
        self._unpacker = codec.stream_unpacker(self._source)
        self._position = 0  # objects read so far
        self._version = codec.EXPORT_VERSION

    def _next(self) -> Any:
        try:
            item = next(self._unpacker)
        except StopIteration:
            # The unpacker ends quietly on a truncated object: the byte count tells.
            if self._unpacker.tell() != self._source.consumed:
                raise self._cut_short() from None
            raise
        except StreamReadError:
            raise  # a ValueError too: not to be taken for bad msgpack below
        except msgpack.BufferFull:
            raise InvalidStreamError(
                f"object #{self._position} is larger than {codec.STREAM_MAX_OBJECT_BYTES} "
                "bytes, more than any export record can be (crafted or corrupt?)"
            ) from None
        except (msgpack.UnpackException, ValueError) as err:
            raise InvalidStreamError(
                f"object #{self._position} is not valid msgpack ({err})"
            ) from None
        self._position += 1
        return item

    def header(self) -> _Header:
        """The header, checked: its configuration and banding are ones a store can have."""
        try:
            header = self._next()
        except StopIteration:  # msgpack can stop between a map's parts without a word
            if self._source.consumed:
                raise self._cut_short() from None
            raise InvalidStreamError("the stream is empty") from None
        if not isinstance(header, dict) or header.get("format") != codec.EXPORT_FORMAT:
            raise InvalidStreamError("it is not a neardup_store export (no export header)")
        if header.get("version") not in codec.READABLE_EXPORT_VERSIONS:
            readable = ", ".join(map(str, codec.READABLE_EXPORT_VERSIONS))
            raise InvalidStreamError(
                f"export version {header.get('version')!r}; this release reads versions "
                f"{readable}: import with the release that wrote it"
            )
        self._version = header["version"]
        if self._version >= _SEALED_VERSION:
            header = self._unsealed(header.get("body"), header.get("checksum"), "its header")
            if not isinstance(header, dict):
                raise InvalidStreamError("its header's body is not a map")
        for name in ("config", "banding"):
            if not isinstance(header.get(name), dict):
                raise InvalidStreamError(f"the header's {name!r} is not a map")
        banding = header["banding"]
        try:  # a bad header is a stream error, not a parameter error
            config = MinHashConfig.from_dict(header["config"])
            params = {name: banding[name] for name in ("threshold", "bands", "rows")}
            LSHParams(params["bands"], params["rows"]).check_fits(config.num_perm)
            valid_threshold(params["threshold"])
        except (KeyError, TypeError, ValueError) as err:
            raise InvalidStreamError(f"the header's parameters do not decode ({err})") from None
        return _Header(header["config"], config, params)

    def _cut_short(self) -> InvalidStreamError:
        """The stream ended inside the object it was reading."""
        where = "its header" if self._position == 0 else f"object #{self._position}"
        return InvalidStreamError(
            f"the stream ends inside {where}: the export was cut short (it failed or was "
            "interrupted); export again"
        )

    @staticmethod
    def _unsealed(body: object, checksum: object, what: str) -> Any:
        try:
            return codec.unsealed(body, checksum)
        except ValueError as err:
            raise InvalidStreamError(
                f"{what} is damaged ({err}): the file changed after it was written; "
                "export again from the store"
            ) from None

    def records(self, num_perm: int) -> Iterator[_Record]:
        """The records, checked; the trailer (from version 2) must end the stream."""
        while True:
            number = self._position
            try:
                item = self._next()
            except StopIteration:
                if self._version == 1:
                    return
                raise InvalidStreamError(
                    f"the stream ends after record #{number - 1} without the export's end "
                    "marker: the export was cut short (it failed or was interrupted); "
                    "export again"
                ) from None
            if isinstance(item, dict) and self._version > 1:
                self._check_trailer(item, number)
                return
            if self._version >= _SEALED_VERSION:
                if not isinstance(item, list) or len(item) != 2:
                    raise InvalidStreamError(
                        f"object #{number} is neither a [body, checksum] record nor the end marker"
                    )
                item = self._unsealed(*item, f"record #{number}")
            yield _check_record(item, number, num_perm)

    def _check_trailer(self, trailer: dict[Any, Any], number: int) -> None:
        """The end marker counts the records before it, and nothing follows it."""
        if trailer.get("end") != codec.EXPORT_FORMAT:
            raise InvalidStreamError(f"object #{number} is neither a record nor the end marker")
        if trailer.get("documents") != number - 1:
            raise InvalidStreamError(
                f"the end marker counts {trailer.get('documents')!r} records, the stream "
                f"holds {number - 1} (records lost or added?)"
            )
        try:
            self._next()
        except StopIteration:
            return
        raise InvalidStreamError(f"object #{number + 1} follows the export's end marker")


def _check_record(item: object, number: int, num_perm: int) -> _Record:
    if not isinstance(item, (list, tuple)) or len(item) != 3:
        raise InvalidStreamError(f"object #{number} is not a [key, signature, metadata] record")
    key, signature, metadata = item
    try:
        codec.key_bytes(key)
        codec.pack_metadata(metadata)
    except NeardupError as err:
        raise InvalidStreamError(f"record #{number}: {err}") from None
    if not isinstance(signature, bytes) or len(signature) != 4 * num_perm:
        size = len(signature) if isinstance(signature, bytes) else type(signature).__name__
        raise InvalidStreamError(
            f"record #{number}: signature is {size} bytes, expected {4 * num_perm} "
            f"({num_perm} uint32 values)"
        )
    return key, np.frombuffer(signature, dtype="<u4").astype(np.uint32), metadata


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for name, item in value.items():
            out.update(_flatten(item, f"{prefix}{name}."))
        return out
    return {prefix.rstrip("."): value}


def _check_config(store: Store, header: _Header) -> None:
    # Both sides through msgpack, so tuples and lists compare equal as they would on disk.
    mine = _flatten(codec.unpack_meta(codec.pack_meta(store.config.to_dict())))
    theirs = _flatten(header.raw_config)
    differs = {
        name: (mine.get(name), theirs.get(name))
        for name in sorted(mine.keys() | theirs.keys())
        if mine.get(name) != theirs.get(name)
    }
    if differs:
        listed = "; ".join(
            f"{name}: store has {a!r}, stream has {b!r}" for name, (a, b) in differs.items()
        )
        raise InvalidStreamError(
            f"the stream's signatures were made with another configuration ({listed}); "
            "import it into a new store made from the export (Store.create_from_export)"
        )


def _import_records(
    store: Store,
    reader: _ExportReader,
    next_size: Callable[[], int | None],
    replace: bool,
    progress: Callable[[int], None] | None = None,
) -> int:
    total, committed = 0, _Committed()
    # Each batch is read (and validated) whole before its transaction begins. An error,
    # the stream's, a document's or the progress callback's, carries how many records
    # earlier batches committed.
    records = batches(reader.records(store.config.num_perm), next_size)
    with committed.stamped():
        for batch in records:
            with _placed(committed.earlier), store.write() as txn:
                committed.begin(txn, len(batch))
                total += txn.add_signatures(batch, replace=replace)
            committed.end()
            if progress is not None:
                progress(total)
    return total


def import_(
    store: Store,
    stream: IO[bytes],
    *,
    batch_size: int | Literal["auto"] = "auto",
    replace: bool = False,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Add every document of an export stream (see :func:`export`) to the store.

    Band keys are recomputed for this store's banding, which may differ from the
    exporter's. Documents are committed ``batch_size`` at a time (``"auto"``:
    :meth:`~.Store.transaction_size`): if the stream turns out bad part-way, the batches
    before stay committed and nothing of the bad batch is; the error's ``committed``
    attribute says how many records they held (importing again with ``replace=True``
    goes over them).

    Args:
        replace: overwrite documents whose key is already stored.

    Returns:
        The number of documents imported.

    Raises:
        InvalidStreamError: not an export, another configuration, or a bad record;
            :class:`StreamReadError` (also an ``OSError``) if reading the stream failed.
        DuplicateKeyError: a key is already stored (or repeats) and ``replace`` is false.
        ReadOnlyError: the store is open read-only.
    """
    store._check_writable()
    check_flags(replace=replace)
    check_progress(progress)
    next_size = store._batch_sizes(batch_size, allow_none=False)
    _check_binary(stream, "rb")
    reader = _ExportReader(stream)
    _check_config(store, reader.header())
    return _import_records(store, reader, next_size, replace, progress)


def create_from_export(
    path: str | os.PathLike[str],
    stream: IO[bytes],
    *,
    batch_size: int | Literal["auto"] = "auto",
    progress: Callable[[int], None] | None = None,
    **options: Any,
) -> Store:
    """Create a store at ``path`` with the configuration and banding of an export, and
    import the export into it.

    Args:
        options: passed to :meth:`Store.open` (``map_size``, ``durable``,
            ``max_readers``); parameters come from the stream.

    Returns:
        The new store, open.

    Raises:
        InvalidParameterError: ``path`` already holds a store.
        InvalidStreamError: the stream is not a valid export. The store created so far
            is closed and deleted, so the path is as it was and a retry can start
            afresh. (A process killed during the import leaves the batches committed
            before it: delete that store before retrying.)
    """
    check_batch_size(batch_size)  # before the store is made
    check_progress(progress)
    path = path_of(path)
    _refuse_a_store_at(path)
    _check_binary(stream, "rb")
    reader = _ExportReader(stream)
    _, config, params = reader.header()
    made = _first_missing(Path(path))  # the directory the store's creation makes first
    store = Store.open(
        path,
        create=True,
        num_perm=config.num_perm,
        scheme=config.scheme,
        seed=config.seed,
        shingles=config.shingles,
        **params,
        **options,
    )
    try:
        _import_records(
            store, reader, store._batch_sizes(batch_size, allow_none=False), False, progress
        )
    except BaseException as error:
        store.close()
        if store.created_here:  # not a store another process made at the path meanwhile
            _delete_created(Path(path), made)
            # Whatever ended it carries the batches' note: none of it is true of a deleted store.
            if getattr(error, "committed", None):
                mark(error, "committed", 0)  # deleted with the store
                mark(
                    error,
                    "__notes__",
                    ["the store this call created was deleted: nothing of it is left"],
                )
        raise
    return store


def _refuse_a_store_at(path: str | os.PathLike[str]) -> None:
    """Refuse a path that holds a store. A creation killed before its first commit left
    none (Store.open with create=True goes on with it), nor does a path with nothing."""
    try:
        found = holds_store(path)
    except StoreBusyError:  # open in this process already: a store is there
        found = True
    if found:
        raise InvalidParameterError("path", str(path), "a directory without a store")


def _first_missing(path: Path) -> Path | None:
    """The outermost of ``path`` and its parents that does not exist (``None``: it does)."""
    missing = None
    for candidate in (path, *path.absolute().parents):
        if candidate.exists():
            return missing
        missing = candidate
    return missing


def _delete_created(path: Path, made: Path | None) -> None:
    """Delete the store a failed :func:`create_from_export` made at ``path``: every
    directory the call made (``made``, the outermost), else only the store's own files."""
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        return
    for name in STORE_FILES:
        (path / name).unlink(missing_ok=True)
