"""The package's error types.

Every error raised on purpose derives from :class:`NeardupError`, so a service can catch one
class. Each also derives from the matching builtin (``ValueError``, ``TypeError``) so code
written against the builtins keeps working. Facts live in attributes, never only in the
message, so callers never parse text.
"""

from __future__ import annotations

import functools
import numbers
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_SHOWN = 120  # the most characters of a refused value an error message repeats


class NeardupError(Exception):
    """Root of every error this package raises deliberately.

    An error is pickled as the call that made it (and its attributes), so it crosses
    process boundaries whole: Python's default pickles only ``args``, the message, which
    the constructors here do not take (a worker's error broke a process pool instead).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            return

        @functools.wraps(init)
        def recorded(self: NeardupError, *args: Any, **kwargs: Any) -> None:
            if "_made_with" not in self.__dict__:  # the outermost constructor's call
                self._made_with = (args, kwargs)
            init(self, *args, **kwargs)

        cls.__init__ = recorded  # type: ignore[misc]

    def __reduce__(self) -> tuple[object, ...]:
        args, kwargs = self.__dict__.get("_made_with", (self.args, {}))
        return (_remake, (type(self), args, kwargs), self.__dict__)


def _remake(cls: type[NeardupError], args: tuple[object, ...], kwargs: dict[str, object]) -> object:
    return cls(*args, **kwargs)


class InvalidParameterError(NeardupError, ValueError):
    """A configuration value is outside its valid range or of the wrong kind."""

    def __init__(self, name: str, value: object, expected: str) -> None:
        shown = repr(value)
        if len(shown) > _SHOWN:  # a whole array or text would bury the message
            shown = f"{shown[: _SHOWN - 20]}... ({len(shown)} characters)"
        super().__init__(f"{name}={shown} is not valid: expected {expected}")
        self.name, self.value, self.expected = name, value, expected


def integer(value: object) -> int | None:
    """``value`` as an ``int`` if it is an integer (numpy's included, which arrays hand
    out), else ``None``; a bool is not one here."""
    if type(value) is int:  # the usual case, without the slower ABC check (queries ask)
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return None


def real(value: object) -> float | None:
    """``value`` as a ``float`` if it is a real number (numpy's included), else ``None``."""
    if type(value) is float:  # as in integer()
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return None


def choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """``value`` as the plain ``str`` of ``choices`` it equals (numpy's ``str_``, which
    arrays hand out, included), else :class:`InvalidParameterError`.

    The type is checked before the membership: numpy compares an array with each choice
    element by element, so ``in`` let a 0-d array equal to a choice through (and kept it,
    unhashable and unencodable) and raised a raw ``ValueError`` for a longer one.
    """
    if isinstance(value, str) and value in choices:
        return choices[choices.index(value)]
    raise InvalidParameterError(name, value, f"a str, one of {', '.join(choices)}")


def check_flags(**flags: object) -> None:
    """Raise :class:`InvalidParameterError` for the first of ``flags`` that is not a bool.

    A flag decides whether data is replaced, removed or repaired: a truthy ``"no"`` or a
    falsy ``None`` passed by mistake must not decide it silently.
    """
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise InvalidParameterError(name, flag, "True or False")


def after_commit(error: BaseException) -> None:
    """Mark ``error`` as raised once a write block's transaction had committed (a Ctrl-C
    that came during the commit, an automatic purge that failed after it): its changes
    are stored, though the block raised."""
    if not getattr(error, "transaction_committed", False):
        error.transaction_committed = True  # type: ignore[attr-defined]
        error.add_note("the write block had committed: its changes are stored")


PROGRESS_EVERY = 1000
"""Items (documents, pairs) between two calls of a long operation's ``progress``."""


def check_progress(progress: object) -> None:
    """Raise :class:`InvalidParameterError` unless ``progress`` is ``None`` or callable:
    it is first called after a batch has committed, too late to refuse it cleanly."""
    if progress is not None and not callable(progress):
        raise InvalidParameterError(
            "progress", progress, "a function called with the count done so far, or None"
        )


def path_of(value: object) -> Path:
    """``value`` as a :class:`~pathlib.Path` if it is a ``str`` or ``os.PathLike`` that
    the operating system can name a file by; else :class:`InvalidParameterError`
    (``Path`` raised a plain ``TypeError``, and the first file system call a raw
    ``ValueError`` for a NUL or ``UnicodeEncodeError`` for a lone surrogate)."""
    if isinstance(value, str | os.PathLike):
        try:
            path = Path(value)
            encoded = os.fsencode(path)
        except TypeError:  # a PathLike whose __fspath__ returns bytes
            pass
        except UnicodeEncodeError as err:
            character = err.object[err.start : err.end]
            raise InvalidParameterError(
                "path",
                value,
                f"a file system path whose characters the file name encoding "
                f"({sys.getfilesystemencoding()}) can represent, which {character!r} is not",
            ) from None
        else:
            if b"\0" not in encoded:
                return path
            raise InvalidParameterError(
                "path",
                value,
                "a file system path without a NUL character ('\\x00'), which no file name holds",
            )
    raise InvalidParameterError("path", value, "a file system path: a str or os.PathLike")


def real_path(path: str | os.PathLike[str]) -> Path:
    """``path`` with its links resolved, as far as they go: ``Path.resolve`` raises a raw
    ``RuntimeError`` on a loop of links, which the open or write that follows reports."""
    return Path(os.path.realpath(path))


class DocumentError(NeardupError):
    """An error about one document of a call; ``index`` is its position among the call's
    documents (``None`` for a call that takes one). The message is made from the
    attributes when shown, so a batched call can place ``index`` in the whole call."""

    index: int | None

    def __str__(self) -> str:
        return self._describe()

    def _where(self, batched: str, single: str = "the document") -> str:
        return single if self.index is None else batched.format(self.index)

    def _describe(self) -> str:
        raise NotImplementedError


class InputTypeError(DocumentError, TypeError):
    """A document is not text (for example ``bytes`` without an encoding, or ``None``)."""

    def __init__(self, value: object, index: int | None = None) -> None:
        if isinstance(value, memoryview) and _released(value):
            self.hint = "the view was released, so its bytes are gone: pass it before releasing it"
        elif isinstance(value, (bytes, bytearray, memoryview)):
            self.hint = "decode it first or pass encoding='utf-8' (or the right codec)"
        elif hasattr(value, "__array__"):
            self.hint = "for a signature, pass it as signature= (signatures= for a batch)"
        else:
            self.hint = "pass a str"
        self.value_type, self.index = type(value), index
        super().__init__(self._describe())

    def _describe(self) -> str:
        where = self._where(" (document #{})", "")
        return f"expected a str document{where}, got {self.value_type.__name__}; {self.hint}"


def _released(view: memoryview) -> bool:
    """Whether ``view`` was released (memoryview has no attribute that says so)."""
    try:
        view.nbytes  # noqa: B018 (read only for the error a released view raises)
    except ValueError:
        return True
    return False


class InvalidSignatureError(DocumentError, InvalidParameterError):
    """A signature of a call's signatures is refused; ``index`` is the position of the
    first refused one (``None`` for a call that takes one). An
    :class:`InvalidParameterError` of ``signatures``, as before it named the item."""

    def __init__(self, value: object, expected: str, index: int | None = None) -> None:
        self.index = index
        InvalidParameterError.__init__(self, "signatures", value, expected)

    def _describe(self) -> str:
        where = self._where(" (the first is signature #{})", "")
        return f"{InvalidParameterError.__str__(self)}{where}"


class BatchTypeError(NeardupError, TypeError):
    """A batch call got something other than an iterable of its items (often one str,
    which would otherwise be taken as one item per character)."""

    def __init__(
        self,
        value: object,
        items: str = "documents",
        single: str = "signature() / hash_document()",
    ) -> None:
        got = type(value).__name__
        if isinstance(value, (str, bytes, bytearray, memoryview)):
            hint = f"for one, call {single}, or wrap it in a list"
        elif getattr(value, "shape", None) == ():  # a numpy scalar or 0-d array: one value
            got = f"a 0-d {got} (one value)"
            hint = f"pass a list (or any iterable) of {items}, or for one, call {single}"
        else:
            hint = f"pass a list (or any iterable) of {items}"
        super().__init__(f"expected an iterable of {items}, got {got}; {hint}")
        self.value_type = type(value)


class TextDecodeError(DocumentError, ValueError):
    """Bytes given with an explicit encoding are not valid in that encoding."""

    def __init__(self, encoding: str, reason: str, index: int | None = None) -> None:
        self.encoding, self.reason, self.index = encoding, reason, index
        super().__init__(self._describe())

    def _describe(self) -> str:
        where = self._where("document #{}: ", "")
        return (
            f"{where}bytes are not valid {self.encoding}: {self.reason}; "
            "pass the encoding the data was written in"
        )


class EmptyDocumentError(DocumentError, ValueError):
    """A document has no shingles: empty after normalisation, or (word kinds) no words."""

    def __init__(self, index: int | None = None) -> None:
        self.index = index
        super().__init__(self._describe())

    def _describe(self) -> str:
        return (
            f"{self._where('document #{}')} is empty after normalisation and has no shingles; "
            "drop it (a store indexes empty ones only if created with "
            "shingles=ShingleConfig(allow_empty=True))"
        )


# -- store errors ---------------------------------------------------------------------------


class StoreNotFoundError(NeardupError, FileNotFoundError):
    """No store at the path (and ``create`` was not asked for)."""

    def __init__(self, path: str, advice: str = "pass create=True to make one") -> None:
        super().__init__(f"{path}: no store here; {advice}")
        self.path = path


READ_ONLY_NOT_FOUND_ADVICE = "check the path (a read-only open cannot make a store)"
"""What :class:`StoreNotFoundError` advises a read-only open, which ``create`` is not for."""


class NotAStoreError(NeardupError, ValueError):
    """The path holds something that is not a neardup_store store."""

    def __init__(self, path: str, found: str) -> None:
        super().__init__(
            f"{path}: not a neardup_store store ({found}); point at a store directory, "
            "or at an empty or new directory with create=True"
        )
        self.path, self.found = path, found


class StorePermissionError(NeardupError, PermissionError):
    """This user may not open the store: LMDB and our lock need write access to the lock
    files even for a read-only open, which a group's read permission does not give."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(
            f"{path}: permission denied ({detail}); opening a store, even read-only, needs "
            "access to its directory, read access to data.mdb and write access to lock.mdb "
            "and neardup.lock (creating one, write access to the directory): ask its owner "
            "for group access (a store of the group, made with mode 0o770 under umask 002, "
            "or chmod g+w on those files), or open a copy of it"
        )
        self.path, self.detail = path, detail


class FormatVersionError(NeardupError, ValueError):
    """The store was written in a format this release does not read."""

    def __init__(
        self,
        path: str,
        found: object,
        supported: tuple[int, ...],
        what: str = "store format",
        advice: str = (
            "open it with the release that wrote it and export it (`neardup-admin export`), "
            "then import the export here (if no other release wrote it, the store is "
            "corrupt: restore it from a backup)"
        ),
    ) -> None:
        readable = " and ".join(f"v{version}" for version in supported)
        super().__init__(f"{path}: {what} v{found}, this release reads {readable}; {advice}")
        self.path, self.found, self.supported = path, found, supported


_BANDING_PARAMS = ("threshold", "bands", "rows")
"""The parameters a rebuild changes: it bands the stored signatures anew."""
_SIGNING_PARAMS = ("num_perm", "scheme", "seed")
"""The parameters (with ``shingles``) that make the signatures: none can change in a
store, which keeps signatures, not the texts they were made from."""


class ParamsMismatchError(NeardupError, ValueError):
    """Parameters passed to ``open`` conflict with the ones the store was created with.

    The advice depends on which: a rebuild changes the banding (threshold, bands, rows),
    but signatures made with another num_perm, scheme, seed or shingling can only be
    made again from the texts, in a new store (neither a rebuild nor an export, which
    carries the signatures as they are, can change them)."""

    def __init__(self, path: str, conflicts: dict[str, tuple[object, object]]) -> None:
        listed = "; ".join(
            f"{name}: store has {stored!r}, asked for {asked!r}"
            for name, (stored, asked) in sorted(conflicts.items())
        )
        super().__init__(
            f"{path}: parameters conflict with the store's ({listed}); "
            + _mismatch_advice(conflicts)
        )
        self.path, self.conflicts = path, conflicts


def _mismatch_advice(conflicts: Iterable[str]) -> str:
    """What to do about the parameters named in ``conflicts``, worded for them."""
    names = sorted({_parameter(name) for name in conflicts})
    signing = [name for name in names if name not in _BANDING_PARAMS]
    advice = f"open it without {_listed(names)} to use the store's own, or "
    if not signing:
        # A rebuild takes bands and rows together (or neither, for a threshold alone).
        given = [name for name in ("bands", "rows") if name in names]
        other = {"bands": "rows", "rows": "bands"}[given[0]] if len(given) == 1 else None
        also = f", and {other} to go with them" if other else ""
        where = "a rebuild takes bands and rows together: " if other else ""
        return (
            f"{advice}rebuild it with the new {_listed(names)}{also} ({where}Store.rebuild, "
            "neardup-admin rebuild) to change its banding"
        )
    return (
        f"{advice}add the texts again to a new store made with the new ones (a rebuild or an "
        f"export keeps the signatures, made with the store's {_listed(signing)})"
    )


def _parameter(conflict: str) -> str:
    """The ``Store.open`` parameter a conflict's name comes from."""
    if conflict in _BANDING_PARAMS or conflict in _SIGNING_PARAMS:
        return conflict
    return "shingles"


def _listed(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _shown_key(key: object) -> str:
    """A key as an error message shows it: its repr, cut to 60 characters."""
    shown = repr(key)
    return shown if len(shown) <= 60 else shown[:57] + "..."


class InvalidKeyError(DocumentError, ValueError):
    """A document key is of the wrong type, empty or too long. In a batch, ``index`` is
    its item's position among the call's items (placed in the whole call as a
    document's is): a refused key's repr (``None``, ``''``) would not find it there."""

    def __init__(self, key: object, reason: str, index: int | None = None) -> None:
        self.key, self.reason, self.index = key, reason, index
        super().__init__(self._describe())

    def _describe(self) -> str:
        where = self._where("item #{}: ", "")
        return f"{where}invalid document key {_shown_key(self.key)}: {self.reason}"


class InvalidItemError(DocumentError, InvalidParameterError):
    """An item of a batch that is not a ``(key, document[, metadata])`` tuple: an
    :class:`InvalidParameterError` of ``item``, placed by ``index`` as a key is."""

    def __init__(self, value: object, expected: str, index: int | None = None) -> None:
        self.index = index
        InvalidParameterError.__init__(self, "item", value, expected)

    def _describe(self) -> str:
        return f"{self._where('item #{}: ', '')}{self.args[0]}"


class MetadataError(DocumentError, ValueError):
    """User metadata cannot be stored (not msgpack-serialisable, or too large). In a batch,
    ``key`` and ``index`` (its item's position among the call's items, placed in the whole
    call as a document's is), when given, name the item whose metadata it is."""

    def __init__(self, reason: str, *, key: object = None, index: int | None = None) -> None:
        self.reason, self.key, self.index = reason, key, index
        super().__init__(self._describe())

    def _describe(self) -> str:
        where = self._where("item #{} ", "")
        if self.key is not None:
            where += f"(key {_shown_key(self.key)}) "
        return (
            f"{where}metadata rejected: {self.reason}; use small values of dict (with str "
            "or bytes keys)/list/str/bytes/int/float/bool/None"
        )


class DuplicateKeyError(NeardupError, ValueError):
    """The key is already in the store, or repeats within one batch (``in_batch``)."""

    def __init__(self, key: object, in_batch: bool = False, *, advice: str | None = None) -> None:
        """``advice`` replaces the default one, for calls that take no ``replace``."""
        if in_batch:
            advice = advice or "give each item its own key"
            message = f"key {key!r} appears more than once in the batch; {advice}"
        else:
            advice = advice or "pass replace=True to overwrite it"
            message = f"key {key!r} is already in the store; {advice}"
        super().__init__(message)
        self.key, self.in_batch = key, in_batch


class KeyNotFoundError(NeardupError, KeyError):
    """The key is not in the store."""

    def __init__(self, key: object, advice: str = "pass missing_ok=True to ignore") -> None:
        super().__init__(f"key {key!r} is not in the store; {advice}")
        self.key = key

    def __str__(self) -> str:  # KeyError would show the repr of the whole message
        return str(self.args[0])


class ReadOnlyError(NeardupError, PermissionError):
    """A write was attempted on a store opened read-only."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path}: the store is open read-only; reopen it with read_only=False")
        self.path = path


class StoreFullError(NeardupError, OSError):
    """The disk (or file-size limit) is full: the transaction was rolled back."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(
            f"{path}: no space left to grow the store ({detail}); nothing of this "
            "transaction was written. Free disk space (or raise the file-size limit) and retry"
        )
        self.path, self.detail = path, detail


class IdsExhaustedError(NeardupError, OverflowError):
    """The store has handed out every document id its format can hold (ids are never
    reused): the transaction was rolled back."""

    def __init__(self, path: str, limit: int) -> None:
        super().__init__(
            f"{path}: the store has handed out all {limit:,} document ids its format can "
            "hold (ids are never reused); nothing of this transaction was written. Export "
            "the store and import the export into a new one (neardup-admin export, then "
            "import), which numbers the documents from 0 again"
        )
        self.path, self.limit = path, limit


class StoreIOError(NeardupError, OSError):
    """The device reported an I/O error while a transaction was written: rolled back."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(
            f"{path}: the disk reported an error while writing the store ({detail}); "
            "nothing of this transaction was written. Check the device and the system log, "
            "then retry"
        )
        self.path, self.detail = path, detail


class OutputWriteError(NeardupError, OSError):
    """A file this package writes for the caller (an export) could not be written whole;
    nothing of it was left at its path."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(
            f"{path}: cannot write it ({detail}); nothing was left there: check the path "
            "and the free space, then retry"
        )
        self.path, self.detail = path, detail


class StoreBusyError(NeardupError, RuntimeError):
    """An exclusive operation (such as compact) found other processes using the store."""

    def __init__(
        self,
        path: str,
        operation: str,
        reason: str = "while other processes have the store open; close them and retry",
    ) -> None:
        super().__init__(f"{path}: cannot {operation} {reason}")
        self.path, self.operation = path, operation


class TooManyReadersError(NeardupError, RuntimeError):
    """Every LMDB reader slot of the store is taken."""

    def __init__(self, path: str, max_readers: int | None) -> None:
        limit = "" if max_readers is None else f" (max_readers={max_readers})"
        super().__init__(
            f"{path}: all reader slots{limit} are taken. Slots of "
            "killed processes are freed as soon as a process that has the store open "
            "begins a transaction, or once every process has closed it; otherwise end "
            "some read transactions, or reopen every process with a larger max_readers "
            "(the first process to open the store sets the limit)"
        )
        self.path, self.max_readers = path, max_readers


class ForkedStoreError(NeardupError, RuntimeError):
    """A store object was used in a process forked after it was opened."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path}: this store object belongs to the process that opened it, not to this "
            "forked child; open the store in each worker after it starts (use "
            "multiprocessing's 'spawn' or 'forkserver' start method, or fork before the "
            "parent opens the store: py-lmdb refuses to reopen an environment that a "
            "forked child inherited open)"
        )
        self.path = path


class StoreClosedError(NeardupError, RuntimeError):
    """The store, or the transaction, was used after it was closed."""

    def __init__(self, what: str) -> None:
        super().__init__(f"the {what} is closed; open a new one")
        self.what = what


class CorruptStoreError(NeardupError, ValueError):
    """The store's own structure (LMDB pages, tables, ``meta``) is damaged.

    Mostly raised by :meth:`Store.open`, so the advice is what works without opening the
    store: every command, export and ``check --repair`` included, opens it first and
    fails alike. Where a repair works on a store that opens, ``detail`` says so.
    """

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(
            f"{path}: the store is corrupt ({detail}); restore it from a backup, or add "
            "its documents again to a new store"
        )
        self.path, self.detail = path, detail


REMOVE_AND_REPAIR = (
    "run `neardup-admin check`, which names its key: remove that document, repair, and "
    "add it again, or restore from a backup"
)
"""What to do about a damaged record of a stored document: only its key can remove it."""
_REPAIR_ALONE = "run `neardup-admin check --repair` (Store.check(repair=True)), which {does}"
BAD_ID_ADVICE = _REPAIR_ALONE.format(
    does="rebuilds the keys table, and moves a record kept under a key that is no id to an "
    "id of its own"
)
"""What to do about a document id that is not one (a ``docs`` key, a ``keys`` value)."""
MISSING_RECORD_ADVICE = _REPAIR_ALONE.format(
    does="drops the key and band entries of a document whose record is gone (add it again after)"
)
"""What to do about a key whose record is missing: removing it needs the record."""
PURGE_ADVICE = _REPAIR_ALONE.format(
    does="drops the records of removed documents with their band entries (no key names "
    "them any more)"
)
"""What to do about a damaged record of a removed document, met by a purge."""


class CorruptRecordError(NeardupError, ValueError):
    """A stored record failed its checksum or could not be decoded."""

    def __init__(self, doc_id: int | None, reason: str, advice: str = REMOVE_AND_REPAIR) -> None:
        where = "a record" if doc_id is None else f"document record #{doc_id}"
        super().__init__(f"{where} is corrupt ({reason}); {advice}")
        self.doc_id, self.reason = doc_id, reason


class TransactionConflictError(NeardupError, RuntimeError):
    """A write transaction could not be replayed after the map had to grow, because
    another process committed in between and the replay gave different results."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"the transaction had to be redone after growing the store and another "
            f"writer changed the outcome ({detail}); nothing was written, retry it"
        )
        self.detail = detail


class InvalidStreamError(NeardupError, ValueError):
    """An import stream is not a neardup_store export, or does not fit this store."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"cannot import: {reason}")
        self.reason = reason


class StreamReadError(InvalidStreamError, OSError):
    """An import stream could not be read (its source reported an I/O error). Also an
    ``OSError``, as the source's own error was before it was typed."""

    def __init__(self, consumed: int, detail: str) -> None:
        super().__init__(
            f"the stream could not be read after {consumed} bytes ({detail}); check its "
            "source, then import again"
        )
        self.consumed, self.detail = consumed, detail


class TransactionAbortedError(NeardupError, RuntimeError):
    """An operation failed part-way through its writes; the transaction cannot commit."""

    def __init__(self, cause: str) -> None:
        super().__init__(
            f"an operation failed part-way ({cause}); the whole transaction was rolled "
            "back so no half-applied document is committed. Fix the cause and retry"
        )
        self.cause = cause


class SparkUnavailableError(NeardupError, RuntimeError):
    """The Spark integration cannot run here: pyspark (or what it needs) or a suitable Java
    runtime is missing. ``missing`` names the part; the message says how to get it."""

    def __init__(self, missing: str, detail: str, hint: str) -> None:
        super().__init__(f"Spark is unavailable: {detail}; {hint}")
        self.missing, self.detail, self.hint = missing, detail, hint


class SparkJobError(NeardupError, RuntimeError):
    """Spark or Hadoop refused part of a job that is no bug of ours: the session did not
    start, an input could not be listed or read, or an output could not be checked or
    written. ``what`` names that part, ``detail`` is the first line of Spark's or the
    Java exception's message, ``advice`` what to do."""

    def __init__(self, what: str, detail: str, advice: str) -> None:
        super().__init__(f"{what}: {detail}; {advice}")
        self.what, self.detail, self.advice = what, detail, advice
