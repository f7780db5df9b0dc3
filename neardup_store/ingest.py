"""Feeding a store from files: input readers, batched ingest, and resumable archive dedup.

These are the library halves of ``neardup-admin add`` and ``neardup-admin dedup``: they
never print, and report through frozen dataclasses and an optional ``on_batch`` callback
(called after each committed batch, so a progress bar only ever shows durable work).

Readers yield :class:`Record` items and, for input that cannot be used (invalid UTF-8, a
malformed JSON line, a missing field), :class:`Failure` items in the same stream, so one
bad file or line is counted and reported instead of stopping a long run.

Each batch is one write transaction. Records are validated and signed *before* their
transaction, so a bad record becomes a failure instead of aborting its batch. A
``KeyboardInterrupt`` aborts only the open batch: :class:`Interrupted` (still a
``KeyboardInterrupt``) carries the report of what was committed before it.

:func:`dedup` is resumable. After each batch it records its position in a sidecar JSON
file next to the keep file (:func:`progress_path`), in two steps around the commit:

1. outputs written, flushed and fsynced (with the batch's failed lines, appended to a file
   beside the sidecar, :func:`failures_path`); sidecar replaced atomically with the batch
   as *pending* (plus the keys of the documents it kept, the *probes*; version 1 and 2
   files hold the first one only);
2. the store commits;
3. sidecar replaced with the batch as *committed*.

On restart a pending batch counts as committed when most of its probe keys are in the
store (kept documents are always new keys, and only their commit stores them). Others who
remove documents of the store, or add some under the same keys, between the crash and the
rerun would have to do so for half the batch to mislead it (a file of version 1 or 2, with
one probe, is misled by that one). The commit counter does not decide it: a repair of a
damaged counter cannot know its old value. A batch that kept nothing changed only the
fsynced outputs, so it counts as committed either way. Outputs (and the failures file) are
then truncated to the recorded sizes and reading continues at the recorded input offset,
so the final outputs equal those of an uninterrupted run. The sidecar records only counts
and sizes, so writing it costs the same for every batch however many lines failed before
(files before version 4 held every failure, rewritten twice a batch; a resume moves them
to the failures file). The sidecar also keeps a digest of the input's last
4 KiB before that offset: an input that was replaced (or cut shorter) is refused, and
lines appended to an input after the job finished are read by the next run. It records
the store's commit counter after each batch, too: a store whose counter is lower (made
anew, or restored from a backup older than the job's last batches) is refused, since a
run against it would keep again what the job kept; what others add or remove meanwhile
only raises it. A run holds a lock on a third file beside them (:func:`lock_path`), so a
second run of the same job started meanwhile is refused before it reads the sidecar.
"""

from __future__ import annotations

import codecs
import contextlib
import fcntl
import fnmatch
import itertools
import json
import os
import re
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt
import xxhash

from . import codec
from .errors import (
    EmptyDocumentError,
    InputTypeError,
    InvalidParameterError,
    NeardupError,
    real_path,
)
from .params import valid_threshold
from .similarity import estimate_jaccard
from .store import AUTO, MIN_TRANSACTION, batches, check_batch_size, note
from .text import check_encoding, decode_text
from .txn import Key, Match, UniqueResult

if TYPE_CHECKING:
    from .minhash import MinHasher
    from .store import Store

STDIN = "-"
"""The input path that means standard input."""
DEDUP_BATCH = MIN_TRANSACTION
"""Input lines per :func:`dedup` transaction. Fixed rather than ``"auto"``: a batch holds
its lines (and their outputs) in memory, and dedup's time goes to its queries more than
to the pages its writes copy (a scratch run of 20k documents into a 1M store: 4.3-4.9k
docs/s with 1000 lines, 7.5-7.8k with 10k, 6.8-7.0k with all 20k in one)."""
PROGRESS_SUFFIX = ".progress.json"
FAILURES_SUFFIX = ".progress.failed.jsonl"
LOCK_SUFFIX = ".progress.lock"
# Positions add input_tail in 2, store_commits in 3 (unchecked in older); in 4 the failures
# move to their own file: ``failed`` becomes their count and ``failed_bytes`` that file's size;
# in 5 the job records the input's encoding (older jobs read UTF-8, :data:`_OLDER_JOB`).
_STATE_VERSION = 5
_READABLE_STATES = (1, 2, 3, 4, 5)
_STATE_FIELDS = frozenset({"version", "job", "committed", "pending", "probe_key", "done"})
_JOB_FIELDS = (
    "input", "keep", "dropped", "store", "id_field", "text_field", "threshold", "encoding"
)  # fmt: skip
_OLDER_JOB = {"encoding": "utf-8"}
"""The job fields a progress file before version 5 lacks, as its job had them."""
_COUNTS = ("line", "input_offset", "keep_bytes", "dropped_bytes", "batches", "kept", "dropped")
_NEWER_FIELDS = {  # the version that added each
    "already_stored": 2,
    "input_tail": 2,
    "store_commits": 3,
    "failed_bytes": 4,
}


# -- records and reports ---------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One document to ingest: ``source`` says where it came from (for failure reports).

    ``file`` and ``line`` locate a JSON-lines record (``source`` is then ``file:line``), so
    a failure can name them apart; they do not take part in equality.
    """

    key: Key
    text: str
    metadata: Any = None
    source: str = ""
    file: str | None = field(default=None, compare=False)
    line: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Failure:
    """An input that could not be used, and why (``source`` is a path, ``path:line`` or key).

    The details a program needs to act on it without parsing ``source`` or ``reason``:
    ``file`` and ``line`` where the input was (``line`` is the file's own line number,
    from 1), ``key`` if one was read, and ``error``, the name of the error type behind it
    (``JSONDecodeError``, ``EmptyDocumentError``, ...). They are ``None`` where unknown and
    do not take part in equality: a failure is the same failure however much is known.
    """

    source: str
    reason: str
    file: str | None = field(default=None, compare=False)
    line: int | None = field(default=None, compare=False)
    key: Any = field(default=None, compare=False)
    error: str | None = field(default=None, compare=False)

    def fields(self) -> list[Any]:
        """The failure as a JSON-ready list, in field order (``Failure(*fields)`` rebuilds it)."""
        return [self.source, self.reason, self.file, self.line, self.key, self.error]


@dataclass(frozen=True)
class Skipped:
    """A valid document that was not added: its key exists, or it near-duplicates others."""

    key: Key
    reason: str
    matches: tuple[Match, ...] = ()

    @property
    def matching_keys(self) -> list[Key]:
        """Keys of the stored documents it duplicates, best first (empty for a key clash)."""
        return [m.key for m in self.matches]


@dataclass(frozen=True)
class BatchProgress:
    """Totals after a committed batch, passed to ``on_batch``.

    For :func:`dedup`, ``records`` counts input lines (blank and failed ones too),
    ``added`` kept and ``skipped`` dropped documents, and ``input_offset`` is the byte
    position reached in the input (for a progress bar against the file size). The totals
    are the job's: a resumed dedup's include the lines of earlier runs, up to
    ``resumed_from`` (0 for a run that read from the start), so that this run's rate is
    ``records - resumed_from`` over its time.
    """

    batches_committed: int
    records: int
    added: int
    skipped: int
    failed: int
    input_offset: int | None = None
    resumed_from: int = 0


@dataclass(frozen=True)
class IngestReport:
    """What :func:`ingest` did; ``batches_committed`` is durable even if it was interrupted."""

    added: int
    replaced: int
    skipped: list[Skipped]
    failed: list[Failure]
    batches_committed: int


@dataclass(frozen=True)
class DedupReport:
    """What :func:`dedup` did over the whole job, including runs it resumed.

    ``resumed_from`` is the input line the run continued after (``None``: a fresh start).
    ``already_stored`` counts the dropped lines whose key the store already held (the case
    :func:`ingest` reports as skipped); ``dropped`` includes them. ``held_back_bytes`` is
    the size of an unfinished last line left unread: no newline and not JSON (yet), as a
    line a writer is still appending; a later run reads it once it is complete.
    """

    kept: int
    dropped: int
    failed: list[Failure]
    resumed_from: int | None
    batches_committed: int
    already_stored: int = 0
    held_back_bytes: int = 0


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`ingest` or :func:`dedup`: earlier batches are committed, nothing
    of the current one is. ``report`` is the report up to the last committed batch."""

    def __init__(self, report: IngestReport | DedupReport) -> None:
        super().__init__(
            f"interrupted: {report.batches_committed} batches committed, nothing half-applied"
        )
        self.report = report
        self.batches_committed = report.batches_committed


class DedupStateError(NeardupError, ValueError):
    """The progress file next to the keep file does not fit this dedup run."""

    def __init__(
        self, path: str, reason: str, *, damaged: bool = False, resume: str | None = None
    ) -> None:
        if resume is None:
            resume = "put back an intact copy of it" if damaged else "rerun with the same arguments"
        super().__init__(
            f"{path}: {reason}; {resume} to resume, or delete the progress file (and use a "
            "fresh store) to start over"
        )
        self.path, self.reason = path, reason


class DedupBusyError(NeardupError, RuntimeError):
    """Another run of the same dedup job (the same keep file) is under way."""

    def __init__(self, keep_path: str) -> None:
        super().__init__(
            f"{keep_path}: another run of this dedup job is writing its outputs; wait for "
            "it to end (running the same command then resumes where it stopped), or give "
            "this run other --keep and --dropped files"
        )
        self.path = keep_path


# -- readers ---------------------------------------------------------------------------------


def read_inputs(
    paths: Iterable[str | os.PathLike[str]],
    *,
    include: Sequence[str] = ("*",),
    jsonl: bool = False,
    id_field: str = "id",
    text_field: str = "text",
    encoding: str = "utf-8",
) -> Iterator[Record | Failure]:
    """Records from plain-text files, directories, JSON-lines files or ``-`` (stdin).

    A plain file is one document keyed by its path (:func:`path_key`: a path that is not
    UTF-8 keys it by the path's bytes). A directory is walked recursively in
    sorted order, taking files whose name or relative path matches any ``include`` glob.
    With ``jsonl``, every file (and stdin) holds one JSON object per line: the key comes
    from ``id_field`` (a string, or an integer turned into one), the text from
    ``text_field``, and every other field is kept as metadata. Blank lines are ignored.

    Unusable input is yielded as :class:`Failure` so callers can count it and go on.

    Raises:
        InvalidParameterError: ``encoding`` is not a text codec, or with ``jsonl`` one whose
            newline is not the byte 0x0a alone, such as UTF-16 or UTF-7 (raised by this
            call, before anything is read, not by the iteration).
    """
    (check_lines_encoding if jsonl else check_encoding)(encoding)
    if isinstance(include, str):
        include = (include,)
    return _read_inputs(paths, include, jsonl, id_field, text_field, encoding)


def check_lines_encoding(encoding: str) -> None:
    """Refuse what :func:`check_encoding` refuses, and a codec that JSON lines cannot be
    read in: lines are cut at the byte 0x0a.

    Raises:
        InvalidParameterError: ``encoding`` is no text codec, writes a newline otherwise
            (UTF-16), or reads ASCII bytes as something else (UTF-7's ``+AAo-``,
            raw_unicode_escape's ``\\u000a`` are a newline: a kept line written back in
            UTF-8 became two).
    """
    check_encoding(encoding)
    if not (_newline_is_one_byte(encoding) and _ascii_is_ascii(encoding)):
        raise InvalidParameterError(
            "encoding",
            encoding,
            "for JSON lines, which are read line by line, one that writes a newline as the "
            "byte 0x0a alone and reads ASCII as ASCII (utf-8, latin-1, cp1252...); "
            "convert the file to UTF-8 first",
        )


def _newline_is_one_byte(encoding: str) -> bool:
    """Whether ``encoding`` writes a newline inside a text as the byte 0x0a, where JSON
    lines are cut (a byte-order mark it writes first, as utf-8-sig does, aside)."""
    encoder = codecs.getincrementalencoder(encoding)()
    encoder.encode("x")
    return encoder.encode("\n") == b"\n"


_ASCII_PROBE = bytes(range(128)) + b" +AAo- +AA0- \\n \\r \\u000a \\x0a \\012 ~{ ~} ~~"
"""Every ASCII byte, and the escapes by which codecs write a line break without the
byte 0x0a (UTF-7, raw_unicode_escape, unicode_escape) or shift to reading ASCII bytes
as other characters (HZ). A codec that decodes all of it as ASCII reads no line break
in a line's other ASCII bytes (and none of Python's decodes a byte above 0x7f as one)."""


def _ascii_is_ascii(encoding: str) -> bool:
    """Whether ``encoding`` decodes ASCII bytes, escapes included, as the same ASCII
    characters: a JSON line read in it cannot hold a line break other than its bytes
    0x0a and 0x0d, so its text, written back in UTF-8, stays one line."""
    try:
        return codecs.decode(_ASCII_PROBE, encoding) == _ASCII_PROBE.decode("ascii")
    except (UnicodeError, ValueError, TypeError):  # a codec refusing the probe
        return False


def _read_inputs(
    paths: Iterable[str | os.PathLike[str]],
    include: Sequence[str],
    jsonl: bool,
    id_field: str,
    text_field: str,
    encoding: str,
) -> Iterator[Record | Failure]:
    for path in paths:
        name = os.fspath(path)
        if name == STDIN:
            yield from _read_stream(sys.stdin.buffer, name, jsonl, id_field, text_field, encoding)
            continue
        target = Path(name)
        if target.is_dir():
            for entry in walk_inputs(target, include):
                if isinstance(entry, Failure):
                    yield entry
                else:
                    yield from _read_file(entry, jsonl, id_field, text_field, encoding)
        elif target.exists():
            yield from _read_file(target, jsonl, id_field, text_field, encoding)
        elif (err := _stat_error(target)) is not None:  # a symbolic-link loop, say
            yield unreadable(name, err)
        else:
            shown = path_text(name)
            yield Failure(shown, "no such file or directory", shown, error="FileNotFoundError")


def path_key(name: str) -> Key:
    """The key of the document a plain file holds: its path, as it was named.

    A path that is not UTF-8 (a Latin-1 name from an old archive, say) is no ``str`` key:
    Python holds its bytes as lone surrogates, which the store refuses. Its key is then
    the path's bytes, which names that file and no other; the CLI prints it as ``hex:``
    (:func:`key_text`), which ``remove`` takes back.
    """
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return os.fsencode(name)
        except UnicodeEncodeError:  # a surrogate no file system name gives: refused as it is
            return name
    return name


def path_text(name: str) -> str:
    """``name`` as text that UTF-8 (and so JSON) carries: each byte of a path that is not
    UTF-8 as ``\\xNN``, as Python writes such a name to standard error. Where a
    failure or a record names a file, it names it so."""
    key = path_key(name)
    if isinstance(key, bytes):
        return key.decode("utf-8", "backslashreplace")
    return key.encode("utf-8", "backslashreplace").decode("utf-8")  # unchanged if UTF-8


def walk_directory(directory: Path, include: Sequence[str]) -> Iterator[Path]:
    """Files under ``directory`` matching a glob, sorted so runs are repeatable: the
    paths of :func:`walk_inputs`, without what it reports as unusable."""
    return (entry for entry in walk_inputs(directory, include) if isinstance(entry, Path))


def walk_inputs(directory: Path, include: Sequence[str]) -> Iterator[Path | Failure]:
    """The files under ``directory`` matching a glob, and a :class:`Failure` for each
    directory that cannot be listed (the top one included) and each matching entry that
    is no regular file, all sorted by path so that runs are repeatable.

    Without the failures, a directory that could not be listed was left out in silence
    (``add`` said "failed 0" and exited 0), and a named pipe met on the walk was opened
    and waited on for ever. A pipe or device named on its own is still read (by
    :func:`read_inputs`): there the user chose it. A symbolic link is judged by what it
    points to; a broken one stays a path, whose open reports it.
    """
    found: list[tuple[Path, Path | Failure]] = []

    def unlisted(err: OSError) -> None:
        where = Path(err.filename if err.filename is not None else directory)
        found.append((where, unreadable(str(where), err)))

    for root, dirs, files in os.walk(directory, onerror=unlisted):
        dirs.sort()
        for file_name in files:
            file = Path(root, file_name)
            relative = file.relative_to(directory).as_posix()
            if any(fnmatch.fnmatch(file_name, g) or fnmatch.fnmatch(relative, g) for g in include):
                kind = _special_kind(file)
                found.append((file, file if kind is None else _special_file(file, kind)))
    return iter([entry for _, entry in sorted(found, key=lambda item: item[0])])


_SPECIAL_KINDS = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _special_kind(path: Path) -> str | None:
    """What ``path`` is if it is no regular file (``None`` for a regular file, and for a
    path that cannot be looked at: opening it reports why)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _SPECIAL_KINDS if test(mode)), "no regular file")


def _special_file(path: Path, kind: str) -> Failure:
    shown = path_text(str(path))
    reason = (
        f"{kind}, not a regular file: a directory's walk reads regular files only "
        "(name it on its own to read it)"
    )
    return Failure(shown, reason, shown, error="OSError")


def _read_file(
    path: Path, jsonl: bool, id_field: str, text_field: str, encoding: str
) -> Iterator[Record | Failure]:
    try:
        stream = path.open("rb")
    except OSError as err:
        yield unreadable(str(path), err)
        return
    with stream:
        yield from _read_stream(stream, str(path), jsonl, id_field, text_field, encoding)


def _read_stream(
    stream: IO[bytes], name: str, jsonl: bool, id_field: str, text_field: str, encoding: str
) -> Iterator[Record | Failure]:
    shown = path_text(name)
    if jsonl:
        for numbered in input_lines(stream, name):
            if isinstance(numbered, Failure):
                yield numbered
                continue
            number, raw = numbered
            if raw.strip():
                where = f"{shown}:{number}"
                item = parse_line(
                    raw, where, id_field, text_field, encoding, shown, number, PASS_ENCODING
                )
                yield item if isinstance(item, Failure) else item[0]
        return
    try:
        data = stream.read()
    except OSError as err:
        yield unreadable(name, err)
        return
    try:
        yield Record(path_key(name), decode_text(data, encoding), None, shown, file=shown)
    except UnicodeError as err:
        reason = decode_reason(err, encoding, PASS_ENCODING)
        yield Failure(shown, reason, shown, error=type(err).__name__)


def _stat_error(path: Path) -> OSError | None:
    """Why ``path`` cannot be looked at (a symbolic-link loop, a directory that cannot be
    searched), or ``None`` if it can or simply does not exist: ``Path.exists`` says only
    ``False`` for a loop."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        return err
    return None


def input_lines(stream: IO[bytes], name: str) -> Iterator[tuple[int, bytes] | Failure]:
    """The lines of the input ``name`` numbered from 1, and then, if reading it fails
    part-way (a failing disk, NFS, FUSE), :func:`unreadable`'s failure for it: the lines
    read before it stand, as they would before a malformed line."""
    try:
        yield from enumerate(stream, 1)
    except OSError as err:
        yield unreadable(name, err)


def unreadable(name: str, err: OSError) -> Failure:
    """The failure for an input ``name`` that cannot be opened, listed or read: the one
    wording of it, for a failure in a report and for an ``Error:`` line alike."""
    shown = path_text(name)
    reason = f"cannot read it: {err.strerror or err}"
    return Failure(shown, reason, shown, error=type(err).__name__)


PASS_ENCODING = "pass the right encoding"
"""What to do about input that does not decode, for a reader that takes its encoding
(``add --encoding``, ``dedup --encoding``, ``encoding=``)."""
CONVERT_TO_UTF8 = "convert the file to UTF-8 (for a Latin-1 file: iconv -f LATIN1 -t UTF-8)"
"""What to do about it for a reader of UTF-8 only (spark-dedup): :func:`parse_line`'s
default."""


def decode_reason(err: UnicodeError, encoding: str, advice: str) -> str:
    """Why input did not decode in ``encoding``, and ``advice`` on what to do."""
    if isinstance(err, UnicodeDecodeError):
        return f"not valid {encoding} at byte {err.start} ({err.reason}); {advice}"
    return f"not valid {encoding} ({err}); {advice}"  # idna, punycode


def parse_line(
    raw: bytes,
    source: str,
    id_field: str,
    text_field: str,
    encoding: str = "utf-8",
    file: str | None = None,
    line: int | None = None,
    decode_advice: str = CONVERT_TO_UTF8,
) -> tuple[Record, dict[str, Any]] | Failure:
    """One JSON line as a record and the parsed object, or a :class:`Failure` saying why.

    ``file`` and ``line`` are passed on to the record or failure. A failure's ``error``
    names what went wrong as Python would: ``UnicodeDecodeError``, ``JSONDecodeError``,
    ``KeyError`` (a missing field) or ``TypeError`` (a value of the wrong JSON type).
    ``decode_advice`` ends the reason of a line that is not valid in ``encoding``: what
    the caller's user can do about it. The default is for a reader of UTF-8 only
    (:data:`CONVERT_TO_UTF8`); a reader that takes an encoding passes
    :data:`PASS_ENCODING`.
    """

    def failure(reason: str, error: str, key: Any = None) -> Failure:
        return Failure(source, reason, file, line, key, error)

    try:
        obj = json_object(raw.decode(encoding))
    except UnicodeError as err:
        return failure(decode_reason(err, encoding, decode_advice), type(err).__name__)
    if isinstance(obj, tuple):
        return failure(*obj)
    missing = [f for f in (id_field, text_field) if f not in obj]
    if missing:
        return failure(
            f"missing field {', '.join(map(repr, missing))}", "KeyError", obj.get(id_field)
        )
    key = obj[id_field]
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)
    if not isinstance(key, str):
        return failure(f"field {id_field!r} must be a string or integer", "TypeError")
    text = obj[text_field]
    if not isinstance(text, str):
        reason = f"field {text_field!r} must be a string, not {_json_type(text)}"
        return failure(reason, "TypeError", key)
    metadata = {k: v for k, v in obj.items() if k not in (id_field, text_field)} or None
    return Record(key, text, metadata, source, file, line), obj


def json_object(line: str) -> dict[str, Any] | tuple[str, str]:
    """A JSON line's object, or why it is none as ``(reason, error type name)``: the
    wording of every command that reads JSON lines. A byte-order mark before the object
    (files some editors write start with one) is not part of it.

    ``NaN``, ``Infinity`` and ``-Infinity``, which Python's ``json`` accepts, are not
    JSON: a line holding one is malformed, as any other line that is not JSON. A number
    with a fraction or an exponent is read as a :class:`JSONFloat`, which
    :func:`json_text` writes back as it was written.
    """
    line = line.removeprefix("\ufeff").rstrip("\r\n")  # so that a column is on this line
    try:
        obj = _LINE_DECODER.decode(line)
    except _NotJSONError as err:
        column = _constant_at(line, err.token) + 1
        return f"malformed JSON ({err.token} is not JSON at column {column})", "JSONDecodeError"
    except json.JSONDecodeError as err:
        return f"malformed JSON ({err.msg} at column {err.colno})", type(err).__name__
    except RecursionError as err:
        return "JSON nested too deeply to read", type(err).__name__
    except ValueError as err:  # an integer of more digits than Python converts
        return f"unreadable JSON ({err})", type(err).__name__
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}", "TypeError"
    return obj


class JSONFloat(float):
    """A JSON number with a fraction or an exponent, as read from an input line: a float
    that keeps the text it was written as.

    :func:`json_text` writes that text back, where ``json.dumps`` writes the float:
    ``0.1000000000000000000001`` would become ``0.1``, and ``1e400`` (valid JSON, past
    the largest double) the bare token ``Infinity``, which is not JSON.
    """

    __slots__ = ("literal",)
    literal: str

    def __new__(cls, literal: str) -> JSONFloat:
        number = super().__new__(cls, literal)
        number.literal = literal
        return number

    def __reduce__(self) -> tuple[type[JSONFloat], tuple[str]]:
        return type(self), (self.literal,)  # pickled (a Spark executor's) with its text


class _NotJSONError(ValueError):
    """A ``NaN``/``Infinity``/``-Infinity`` token, which ``json`` takes and JSON has not."""

    def __init__(self, token: str) -> None:
        super().__init__(token)
        self.token = token


def _refuse_constant(token: str) -> Any:
    raise _NotJSONError(token)


_LINE_DECODER = json.JSONDecoder(parse_float=JSONFloat, parse_constant=_refuse_constant)
_STRING_OR_CONSTANT = re.compile(r'"(?:[^"\\]|\\.)*"|NaN|-?Infinity')


def _constant_at(line: str, token: str) -> int:
    """Where ``token`` first stands outside a string in ``line``: the one the decoder met
    (everything before it parsed, so the strings before it are whole)."""
    for found in _STRING_OR_CONSTANT.finditer(line):
        if found.group() == token:
            return found.start()
    return 0


HEX_PREFIX = "hex:"
"""How a bytes key starts when the CLI prints it (see :func:`key_text`)."""
STR_PREFIX = "str:"
"""How a str key that a line would not show whole starts when the CLI prints it."""
_HEX_DIGITS = re.compile(r"(?:[0-9a-fA-F]{2})*")


def key_text(key: str | bytes) -> str:
    """A key as text that names it and no other, in every output format and on a line of
    its own.

    Bytes keys (from the library, or from ``add`` of a file whose path is not UTF-8) are
    shown as ``hex:`` and their bytes in lowercase hex, so that JSON stays valid and
    nothing is silently re-encoded. A str key that a line or a table cell would not carry
    whole (empty, white space at either end, a control character: line breaks, tabs, C0
    and C1 controls, U+2028, U+2029, or U+FEFF first, a byte-order mark to a file's
    reader) is shown as ``str:`` and its UTF-8 in hex: ``"x\\r"`` prints as ``str:780d``.
    These rules use fixed character sets, not the Unicode database, so a key
    prints the same under every Python. A str key that could be read as either form
    (``hex:``, or ``str:`` and the hex of such a key, after any backslashes) gets one
    backslash more in front, so no two keys print alike: ``b"\\x00\\xff"`` prints as
    ``hex:00ff`` and ``"hex:00ff"`` as ``\\hex:00ff``. Every other str key prints as it
    is, ``"str:61"`` included (``"a"`` prints as ``a``). :func:`key_from_text` reads any of
    them back.
    """
    if not isinstance(key, str):
        return HEX_PREFIX + bytes(key).hex()
    if not _fits_a_line(key):
        return STR_PREFIX + key.encode("utf-8", "surrogatepass").hex()
    return "\\" + key if _looks_escaped(key) else key


def key_from_text(text: str) -> str | bytes:
    """The key that :func:`key_text` prints as ``text``: what ``remove`` takes.

    Raises:
        InvalidParameterError: ``text`` starts with ``hex:`` but no whole bytes follow.
    """
    if text.startswith("\\") and _looks_escaped(text):
        return text[1:]
    escaped = _escaped_str(text)
    if escaped is not None:
        return escaped
    if not text.startswith(HEX_PREFIX):
        return text
    digits = text[len(HEX_PREFIX) :]
    if not _HEX_DIGITS.fullmatch(digits):
        raise InvalidParameterError(
            "key",
            text,
            "hex: and two hex digits a byte for a bytes key (a str key that starts with "
            "hex: is written with a backslash in front, \\hex:...)",
        )
    return bytes.fromhex(digits)


def _looks_escaped(text: str) -> bool:
    body = text.lstrip("\\")
    return body.startswith(HEX_PREFIX) or _escaped_str(body) is not None


def _escaped_str(text: str) -> str | None:
    """The key ``text`` stands for if it is what :func:`key_text` prints for a key that
    does not fit a line (``str:`` and that key's UTF-8 in hex); otherwise None, and
    ``text`` is a key as it is."""
    if not text.startswith(STR_PREFIX):
        return None
    digits = text[len(STR_PREFIX) :]
    if not _HEX_DIGITS.fullmatch(digits):
        return None
    try:
        key = bytes.fromhex(digits).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None
    return None if _fits_a_line(key) else key


_LINE_BREAKERS = re.compile("[\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]")
"""Control characters: line breaks and others that a line or a table cell would not show
as they are (``str.splitlines`` splits at several of them)."""


_BLANKS = " \u00a0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u202f\u205f\u3000"
"""The white space that is not a control character (what ``str.isspace`` adds to the
controls), fixed here so that the rule does not follow the interpreter's Unicode
database."""


def _fits_a_line(key: str) -> bool:
    """Whether a line, or a table cell, carries ``key`` whole: it is not empty, has no
    white space at either end, no control character, and does not start with U+FEFF
    (which a key file's first line loses, read as a byte-order mark)."""
    return (
        key.strip(_BLANKS) == key != ""
        and not key.startswith(_BYTE_ORDER_MARK)
        and _LINE_BREAKERS.search(key) is None
    )


_BYTE_ORDER_MARK = "\ufeff"


def dropped_text(obj: dict[str, Any], key: str | bytes, score: float) -> str:
    """A line of ``dedup --dropped`` (and of spark-dedup's ``dropped/``, which must equal
    it): the input object plus the key it duplicates, printed as keys are, and the score."""
    return json_text({**obj, "duplicate_of": key_text(key), "score": round(float(score), 6)})


def json_text(value: Any) -> str:
    """JSON text of ``value``: every JSON line the package writes goes through here, so
    that none can be invalid JSON.

    Non-ASCII characters are kept readable, unless the text holds a lone surrogate (a
    valid JSON escape such as ``"\\ud800"``), which UTF-8 cannot carry: that text is
    ASCII-escaped instead. A :class:`JSONFloat` is written as it was read; any other
    float that is not finite raises ``ValueError`` (``allow_nan=False``), where
    ``json.dumps`` would write ``NaN`` or ``Infinity``, which strict parsers refuse.
    Object keys must be ``str``.
    """
    text = _json(value, _READABLE)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _json(value, _ASCII)
    return text


_READABLE = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
_ASCII = json.JSONEncoder(allow_nan=False)


class _Raw(str):
    """Text :func:`_json` copies to its output as it is (punctuation, an encoded key)."""


def _json(value: Any, encoder: json.JSONEncoder) -> str:
    """``encoder``'s text for ``value``, with its separators, but each :class:`JSONFloat`
    as written. A loop with its own stack, not recursion: a line nested as deep as
    Python's parser reads must not run out of stack when it is written back."""
    parts: list[str] = []
    todo: list[Any] = [value]
    while todo:
        item = todo.pop()
        if type(item) is _Raw:
            parts.append(item)
        elif isinstance(item, JSONFloat):
            parts.append(item.literal)
        elif isinstance(item, dict):
            todo.append(_Raw("}"))
            members = list(item.items())
            for position in range(len(members) - 1, -1, -1):
                name, member = members[position]
                if not isinstance(name, str):
                    raise TypeError(f"JSON object keys must be str, not {type(name).__name__}")
                todo.append(member)
                todo.append(_Raw((", " if position else "") + encoder.encode(name) + ": "))
            todo.append(_Raw("{"))
        elif isinstance(item, (list, tuple)):
            todo.append(_Raw("]"))
            for position in range(len(item) - 1, -1, -1):
                todo.append(item[position])
                if position:
                    todo.append(_Raw(", "))
            todo.append(_Raw("["))
        else:
            parts.append(encoder.encode(item))
    return "".join(parts)


def _json_type(value: object) -> str:
    return {dict: "an object", list: "an array", type(None): "null", bool: "a boolean"}.get(
        type(value), "a number"
    )


# -- validation and signing (before any transaction) -----------------------------------------


@dataclass(frozen=True)
class _Signed:
    record: Record
    signature: npt.NDArray[np.uint32]


def _as_record(item: object) -> Record | Failure:
    if isinstance(item, (Record, Failure)):
        return item
    if isinstance(item, (tuple, list)) and len(item) in (2, 3):
        key, text = item[0], item[1]
        return Record(key, text, item[2] if len(item) == 3 else None, str(key))
    reason = "expected a Record or a (key, text[, metadata]) tuple"
    return Failure(repr(item)[:60], reason, error="TypeError")


def _sign(store: Store, records: Sequence[Record]) -> tuple[list[_Signed], list[Failure]]:
    return sign_records(store.hasher, records)


def sign_records(
    hasher: MinHasher, records: Sequence[Record]
) -> tuple[list[_Signed], list[Failure]]:
    """Validate keys, metadata and texts one by one, then sign the valid ones as a batch.

    Shared by the store's ingest and the Spark executors, so both accept and reject the
    same records for the same reasons.
    """
    valid: list[Record] = []
    failed: list[Failure] = []
    for record in records:
        try:
            codec.key_bytes(record.key)
            codec.pack_metadata(record.metadata)
        except NeardupError as err:
            failed.append(_failed(record, str(err), type(err).__name__))
            continue
        if not isinstance(record.text, str):
            reason = f"text must be a str, not {type(record.text).__name__}"
            failed.append(_failed(record, reason, InputTypeError.__name__))
            continue
        valid.append(record)
    try:
        signatures = list(hasher.signatures([r.text for r in valid]))
    except EmptyDocumentError:
        # Rare: sign one by one so only the empty documents fail.
        signed, signatures = [], []
        for record in valid:
            try:
                signatures.append(hasher.signatures([record.text])[0])
                signed.append(record)
            except EmptyDocumentError:
                failed.append(_failed(record, "empty document", EmptyDocumentError.__name__))
        valid = signed
    return [_Signed(r, s) for r, s in zip(valid, signatures, strict=True)], failed


def _failed(record: Record, reason: str, error: str) -> Failure:
    """A record's failure, located where the record came from."""
    source = record.source or str(record.key)
    return Failure(source, reason, record.file, record.line, record.key, error)


# -- ingest ----------------------------------------------------------------------------------


def ingest(
    store: Store,
    records: Iterable[Record | Failure | tuple[Any, ...]],
    *,
    batch_size: int | Literal["auto"] = AUTO,
    replace: bool = False,
    unique: bool = False,
    threshold: float | None = None,
    on_batch: Callable[[BatchProgress], None] | None = None,
) -> IngestReport:
    """Add records to ``store`` in batches, one write transaction per batch.

    Args:
        records: :class:`Record` / :class:`Failure` items (as from :func:`read_inputs`) or
            ``(key, text[, metadata])`` tuples.
        batch_size: records per transaction, or ``"auto"``: the store's
            :meth:`~.Store.transaction_size` when the batch begins. Texts are signed
            :data:`~.store.MIN_TRANSACTION` at a time and only signatures are kept.
        replace: overwrite documents whose key exists (otherwise they are skipped).
        unique: add only documents with no near-duplicate in the store or earlier in the
            input; skipped ones are reported with their matches.
        threshold: similarity for ``unique`` (default: the store's threshold).
        on_batch: called with :class:`BatchProgress` after each commit.

    Raises:
        Interrupted: on ``KeyboardInterrupt``; its ``report`` covers the committed batches.
        InvalidParameterError: bad ``batch_size``, or ``unique`` with ``replace``.

    Any other error (a full disk) after a batch has committed carries a note saying how
    much the committed batches hold.
    """
    next_size = store._batch_sizes(batch_size, allow_none=False)
    if unique and replace:
        raise InvalidParameterError("replace", replace, "False when unique=True")
    if threshold is not None and not unique:
        raise InvalidParameterError("threshold", threshold, "None unless unique=True")
    if threshold is not None:
        threshold = store._check_threshold(threshold)
    added = replaced = batches = seen = 0
    skipped: list[Skipped] = []
    failed: list[Failure] = []

    def report() -> IngestReport:
        return IngestReport(added, replaced, skipped, failed, batches)

    def count(batch: _Batch) -> None:
        nonlocal added, replaced, batches, seen
        added, replaced, batches = added + batch.added, replaced + batch.replaced, batches + 1
        skipped.extend(batch.skipped)
        failed.extend(batch.failed)
        seen += batch.records

    pending: _Batch | None = None
    try:
        for read, signed, failures in _signed_batches(store, records, next_size):
            with store.write() as txn:
                if unique:
                    n_added, batch_skipped, probe = _add_unique(txn, signed, threshold)
                    n_replaced = 0
                else:
                    n_added, n_replaced, batch_skipped, probe = _add_plain(txn, signed, replace)
                pending = _Batch(
                    n_added, n_replaced, batch_skipped, failures, read, probe, batches + 1
                )
            count(pending)  # committed: only now does the batch count
            pending = None
            if on_batch is not None:
                on_batch(BatchProgress(batches, seen, added, len(skipped), len(failed)))
    except KeyboardInterrupt as err:
        # Ctrl-C may land during the commit, which marks it transaction_committed once the
        # commit has returned, or between the commit and the count, where a key the batch
        # added tells (a batch that only replaced keys has none). A batch counted already
        # is not counted again.
        if (
            pending is not None
            and pending.number > batches
            and (
                getattr(err, "transaction_committed", False)
                or (pending.probe is not None and pending.probe in store)
            )
        ):
            count(pending)
        raise Interrupted(report()) from err
    except Exception as err:  # a full disk, an unreadable file: say what is stored
        if batches:
            note(
                err,
                f"the batches before it are committed: {batches} of them, the first {seen}"
                f" records ({added} added, {replaced} replaced); once the cause is fixed, "
                "the same command adds the rest",
            )
        raise
    return report()


@dataclass(frozen=True)
class _Batch:
    """A batch's outcome, counted once its transaction has committed."""

    added: int
    replaced: int
    skipped: list[Skipped]
    failed: list[Failure]
    records: int
    probe: Key | None  # a key the batch added anew, to test whether it committed
    number: int  # the batch's place in the call, from 1 (counted once ``batches`` reaches it)


def _add_plain(
    txn: Any, signed: list[_Signed], replace: bool
) -> tuple[int, int, list[Skipped], Key | None]:
    """Add a batch; returns (new keys added, keys replaced, skipped for existing keys, the
    first new key)."""
    seen: set[Key] = set()
    existing: set[Key] = set()
    items, skipped, replaced = [], [], 0
    for doc in signed:
        key = doc.record.key
        exists = key in seen or key in txn
        if exists:
            existing.add(key)
        seen.add(key)
        if exists and not replace:
            skipped.append(Skipped(key, "key already in the store"))
            continue
        replaced += exists
        items.append((key, doc.signature, doc.record.metadata))
    if items:
        txn.add_signatures(items, replace=replace)
    probe = next((key for key, _, _ in items if key not in existing), None)
    return len(items) - replaced, replaced, skipped, probe


def _add_unique(
    txn: Any, signed: list[_Signed], threshold: float | None
) -> tuple[int, list[Skipped], Key | None]:
    """Add each document unless a stored or earlier one near-duplicates it (in order)."""
    added, skipped, probe = 0, [], None
    for doc, result in zip(signed, _unique_in_order(txn, signed, threshold, True), strict=True):
        key = doc.record.key
        if result is None:
            skipped.append(Skipped(key, "key already in the store"))
        elif result.added:
            added += 1
            probe = key if probe is None else probe
        else:
            skipped.append(Skipped(key, "near-duplicate", tuple(result.matches)))
    return added, skipped, probe


def _unique_in_order(
    txn: Any, signed: Sequence[_Signed], threshold: float | None, metadata: bool
) -> list[UniqueResult | None]:
    """``add_if_unique`` of each document in order with its precomputed signature (and
    its metadata if ``metadata``), or ``None`` where the key is already stored.

    The same answers as one call per document, but each stretch of documents with no
    key repeated goes to ``add_signatures_if_unique`` as one batch: a repeated key is
    decided only after its earlier occurrence is.
    """
    results: list[UniqueResult | None] = [None] * len(signed)
    stretch: list[int] = []
    keys: set[Key] = set()

    def decide() -> None:
        items = [
            (
                signed[i].record.key,
                signed[i].signature,
                signed[i].record.metadata if metadata else None,
            )
            for i in stretch
        ]
        for i, result in zip(
            stretch, txn.add_signatures_if_unique(items, threshold=threshold), strict=True
        ):
            results[i] = result
        stretch.clear()
        keys.clear()

    for position, doc in enumerate(signed):
        key = doc.record.key
        if key in keys:
            decide()
        if key not in txn:
            stretch.append(position)
            keys.add(key)
    if stretch:
        decide()
    return results


def _signed_batches(
    store: Store, records: Iterable[Any], next_size: Callable[[], int | None]
) -> Iterator[tuple[int, list[_Signed], list[Failure]]]:
    """``(records read, signed, failed)`` per batch of ``next_size()`` records, signed a
    part at a time before the batch's transaction; the signed records keep their
    signatures but not their texts."""
    items = iter(records)
    while True:
        size = next_size()
        read, signed, failed = 0, [], []
        for part in batches(itertools.islice(items, size), lambda: MIN_TRANSACTION):
            read += len(part)
            loaded = [_as_record(item) for item in part]
            good, bad = _sign(store, [r for r in loaded if isinstance(r, Record)])
            signed += [_Signed(_without_text(doc.record), doc.signature) for doc in good]
            failed += [r for r in loaded if isinstance(r, Failure)] + bad
        if not read:
            return
        yield read, signed, failed


def _without_text(record: Record) -> Record:
    return Record(record.key, "", record.metadata, record.source, record.file, record.line)


# -- dedup -----------------------------------------------------------------------------------


def progress_path(keep_path: str | os.PathLike[str]) -> Path:
    """The sidecar file where :func:`dedup` records its progress for ``keep_path``."""
    keep = Path(keep_path)
    return keep.with_name(keep.name + PROGRESS_SUFFIX)


def lock_path(keep_path: str | os.PathLike[str]) -> Path:
    """The file beside the sidecar that a running :func:`dedup` job holds locked."""
    keep = Path(keep_path)
    return keep.with_name(keep.name + LOCK_SUFFIX)


def failures_path(keep_path: str | os.PathLike[str]) -> Path:
    """The file beside the sidecar where :func:`dedup` appends the failed lines of each
    batch (one :meth:`Failure.fields` list a line), for the report of a resumed run."""
    keep = Path(keep_path)
    return keep.with_name(keep.name + FAILURES_SUFFIX)


@dataclass
class _Position:
    """How far a dedup job got: input position, output sizes and totals."""

    line: int = 0
    input_offset: int = 0
    keep_bytes: int = 0
    dropped_bytes: int = 0
    batches: int = 0
    kept: int = 0
    dropped: int = 0
    failed: int = 0  # failed lines; their reports are in the failures file
    already_stored: int = 0
    input_tail: str | None = None  # :func:`_tail_digest` at input_offset (newer files)
    # The store's commit counter once the batch committed, at least (newer files): a
    # store of the job counts on from it, whatever else others commit or remove.
    store_commits: int | None = None
    failed_bytes: int = 0  # the failures file's size (version 4 files)
    # The failures themselves, as files before version 4 held them (never saved: a
    # resume writes them to the failures file).
    old_failures: list[list[Any]] | None = None

    def copy(self) -> _Position:
        return _Position(**vars(self))

    def saved(self) -> dict[str, Any]:
        """The fields a progress file records."""
        return {name: value for name, value in vars(self).items() if name != "old_failures"}


def dedup(
    store: Store,
    input_jsonl_path: str | os.PathLike[str],
    keep_path: str | os.PathLike[str],
    dropped_path: str | os.PathLike[str],
    *,
    id_field: str = "id",
    text_field: str = "text",
    threshold: float | None = None,
    encoding: str = "utf-8",
    batch_size: int = DEDUP_BATCH,
    on_batch: Callable[[BatchProgress], None] | None = None,
) -> DedupReport:
    """Stream a JSON-lines archive through the index, keeping the first of each group.

    Each record (in input order) that has no near-duplicate in the store or earlier in
    the input is added to the store and its original line written to ``keep_path``;
    every other one is written to ``dropped_path`` as its object plus ``"duplicate_of"``
    (the best match's key) and ``"score"``. A record whose key the store already holds
    (stored earlier, by another writer, or by an earlier line of the input) is dropped the
    same way, with ``"duplicate_of"`` its own key and ``"score"`` the similarity to the
    stored document, and counted in ``already_stored`` too: the store holds that key, so
    the record is not new. Unusable lines are reported as failures.

    ``encoding`` is the input's (one in which a line break is the byte 0x0a alone and
    ASCII stays ASCII: :func:`check_dedup_paths`). Both outputs are UTF-8: read in another
    encoding, a kept line is written as its text in UTF-8 (a character UTF-8 cannot carry,
    a lone surrogate, as its JSON escape), so that the two outputs, and the inputs of
    later jobs made from them, share one.

    Rerunning with the same arguments after an interruption resumes (see the module
    docstring); a finished job returns its report without doing anything, unless lines
    were appended to the input since, which it goes on to read.

    Raises:
        InvalidParameterError: as :func:`check_dedup_paths`, and a bad ``batch_size``.
        Interrupted: on ``KeyboardInterrupt`` (rerun to resume).
        DedupStateError: the progress file belongs to a different job (other arguments,
            ``encoding`` included), the input is not the one it read (replaced or
            truncated), an output is shorter than it records, or the store's commit
            counter is below what the job's last batch saw (not the store it wrote to, or
            an older state of it).
        DedupBusyError: another run of the same job (the same keep file) is under way.
        OSError: reading the input or writing an output failed part-way: the error
            names the file and says that the batches before it are committed.
    """
    check_batch_size(batch_size, allow_auto=False)
    fields = _job_fields(id_field, text_field, threshold, encoding)
    paths, job, _ = _checked_job(input_jsonl_path, keep_path, dropped_path, store.path, fields)
    with _job_lock(keep_path):
        # Read again under the lock: a run that ended meanwhile moved the job on.
        state = _load_state(real_path(progress_path(keep_path)), job)
        return _run_job(store, paths, job, state, keep_path, batch_size, on_batch)


@contextlib.contextmanager
def _job_lock(keep_path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the job's lock file for a run: a second run of the same job at the same time
    (a cron overlap) would cut back the outputs the first is appending to, and keep or
    drop lines twice. It is refused instead (:class:`DedupBusyError`). The lock is the
    kernel's (``flock``), so it ends with its process, however that ends; the empty file
    stays, as a store's lock files do."""
    fd = os.open(lock_path(keep_path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DedupBusyError(str(keep_path)) from None
        yield
    finally:
        os.close(fd)


def _run_job(
    store: Store,
    paths: list[Path],
    job: dict[str, Any],
    state: _State | None,
    keep_path: str | os.PathLike[str],
    batch_size: int,
    on_batch: Callable[[BatchProgress], None] | None,
) -> DedupReport:
    """:func:`dedup` once its job is checked and locked: from ``state`` (``None``: a new
    job) to the end of the input."""
    threshold = job["threshold"]
    sidecar = progress_path(keep_path)
    failures_file = failures_path(keep_path)
    failures: list[Failure] = []  # the job's, this batch's included once it is written
    if state is None:
        at, resumed_from, done = _Position(), None, False
        for path in (*paths[1:], failures_file):
            path.open("wb").close()
    else:
        at, done = _resolve(store, state), state.done
        _check_store(store, at, sidecar)  # before anything is written
        resumed_from = at.line
        with _reading(paths[0]):
            grown = _check_input(paths[0], at, sidecar)  # on every resume, finished or not
        done = done and not grown  # lines appended to a finished job's input: read on
        _truncate(paths[1], at.keep_bytes, sidecar)
        _truncate(paths[2], at.dropped_bytes, sidecar)
        failures = _resumed_failures(failures_file, at, sidecar)
    held_back = 0

    def report() -> DedupReport:
        return DedupReport(
            at.kept,
            at.dropped,
            failures[: at.failed],
            resumed_from,
            at.batches,
            at.already_stored,
            held_back,
        )

    if done:
        return report()
    try:
        with (
            paths[0].open("rb") as source,
            paths[1].open("ab") as keep,
            paths[2].open("ab") as dropped,
            failures_file.open("ab") as failed,
        ):
            outputs = _Outputs(keep, dropped, failed, failures)
            source.seek(at.input_offset)
            while True:
                with _reading(paths[0]):
                    lines, (line, offset) = _read_lines(
                        source, batch_size, at.line, job["encoding"]
                    )
                    if not lines:
                        break
                    end = (line, offset, _tail_digest(source, offset))
                at = _dedup_batch(store, lines, end, at, outputs, job, sidecar, threshold)
                _save_state(sidecar, job, at, None, None)
                if on_batch is not None:
                    progress = BatchProgress(
                        at.batches,
                        at.line,
                        at.kept,
                        at.dropped,
                        at.failed,
                        at.input_offset,
                        resumed_from or 0,
                    )
                    on_batch(progress)
            source.seek(at.input_offset)  # what is left: blank lines, then perhaps one cut short
            with _reading(paths[0]):
                held_back = len(source.read().lstrip())
        _save_state(sidecar, job, at, None, None, done=True)
    except KeyboardInterrupt as err:
        at = _interrupted_at(store, sidecar, at, err)
        raise Interrupted(report()) from err
    return report()


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[None]:
    """A read of the input that fails part-way (a failing disk, NFS, FUSE) as an error
    that names the input, as an output's write error does (:func:`_write_synced`), and
    says what is committed: a bare ``OSError`` names no file, and the CLI took it for a
    bug (a traceback). Its start was read before anything was created
    (:func:`_checked_job`), so a job whose input cannot be read at all leaves nothing."""
    try:
        yield
    except OSError as err:
        if err.filename is None:
            err.filename = str(path)
        err.add_note(
            "nothing of the batch being read was committed, any batches before it were: "
            "once the input can be read, run the same command again to resume after them"
        )
        raise


def _interrupted_at(
    store: Store, sidecar: Path, at: _Position, interrupt: KeyboardInterrupt
) -> _Position:
    """Where a job stands after a Ctrl-C, as the next run will resume it: past the batch
    in progress if that one committed. The Ctrl-C may have come during its commit (the
    write marks it ``transaction_committed``), or after it, before ``at`` took it up; the
    progress file records that batch as pending (or, once saved, as committed), and
    :func:`_resolve` judges a pending one as a resume does."""
    try:
        read = _read_state(sidecar)
    except DedupStateError:
        return at
    if read is None:
        return at
    state = read[1]
    if state.committed.batches > at.batches:  # saved as committed, not yet taken up
        return state.committed
    pending = state.pending
    if pending is None or pending.batches <= at.batches:
        return at  # the batch in progress never got as far as its commit
    if getattr(interrupt, "transaction_committed", False):
        return pending
    try:
        return pending if _resolve(store, state) is pending else at
    except NeardupError:  # the store cannot say now: the next run will
        return at


def _resumed_failures(path: Path, at: _Position, sidecar: Path) -> list[Failure]:
    """The failures of a job's earlier runs, up to ``at``, with the failures file cut
    back to that point; a position read from a file before version 4 holds them itself,
    and they are written to the failures file."""
    if at.old_failures is not None:
        failures = [Failure(*fields) for fields in at.old_failures]
        with path.open("wb") as out:
            lines = [json_text(failure.fields()).encode() + b"\n" for failure in failures]
            at.failed_bytes = _write_synced(out, lines)
        at.old_failures = None
        return failures
    failures = []
    if at.failed_bytes or path.exists():  # (deleted while empty: it is made again)
        _truncate(path, at.failed_bytes, sidecar)
        with path.open("rb") as stream:
            for number, raw in enumerate(stream, 1):
                try:
                    fields = _PROGRESS_DECODER.decode(raw.decode("utf-8"))
                    _check_failure(fields, f"line {number}")
                except (ValueError, RecursionError) as err:  # not JSON, not UTF-8, no failure
                    raise DedupStateError(
                        str(sidecar),
                        f"{path} is damaged ({type(err).__name__}: {err})",
                        resume=f"put back an intact {path.name}",
                    ) from None
                failures.append(Failure(*fields))
    if len(failures) != at.failed:
        raise DedupStateError(
            str(sidecar),
            f"{path} holds {len(failures)} failures, not the {at.failed} the progress file records",
            resume=f"put back an intact {path.name}",
        )
    return failures


def check_dedup_paths(
    input_jsonl_path: str | os.PathLike[str],
    keep_path: str | os.PathLike[str],
    dropped_path: str | os.PathLike[str],
    store_path: str | os.PathLike[str],
    *,
    id_field: str = "id",
    text_field: str = "text",
    threshold: float | None = None,
    encoding: str = "utf-8",
) -> list[Path]:
    """The resolved paths of a :func:`dedup` job (input, keep, dropped), checked with the
    rest of the job before anything is opened or created, so that a refused job changes
    nothing: a caller that creates the store only when it is missing calls this first.

    Raises:
        InvalidParameterError: the threshold is invalid, ``encoding`` is no text codec
            or one JSON lines cannot be read in (UTF-16, UTF-7:
            :func:`check_lines_encoding`), the input is not a regular file (a resume
            seeks in it) or its start cannot be read (no permission, an I/O
            error), an output's directory does not exist, an output is no
            regular file (a resume cuts it back), or an output would destroy a file the
            job needs (:func:`refuse_clashing_paths`).
        DedupStateError: the progress file beside the keep file is damaged, records
            another job, or records committed batches while no store is at
            ``store_path``: a run would create a new, empty one and keep again what the
            lost store held.
    """
    fields = _job_fields(id_field, text_field, threshold, encoding)
    paths, _, state = _checked_job(input_jsonl_path, keep_path, dropped_path, store_path, fields)
    if (
        state is not None
        and state.committed.batches
        and not (Path(store_path) / "data.mdb").exists()
    ):
        batches = state.committed.batches
        raise DedupStateError(
            str(progress_path(keep_path)),
            f"it records {batches} committed batch{'es' if batches > 1 else ''} of a job on "
            f"the store {store_path}, which is not there (a new, empty store would keep again "
            "what that one held)",
            resume="restore that store and rerun with the same arguments",
        )
    return paths


def _job_fields(
    id_field: str, text_field: str, threshold: float | None, encoding: str
) -> dict[str, Any]:
    """The arguments of a :func:`dedup` job that its progress file records, besides its
    paths (checked by :func:`_checked_job`)."""
    return {"id_field": id_field, "text_field": text_field, "threshold": threshold,
            "encoding": encoding}  # fmt: skip


def _checked_job(
    input_jsonl_path: str | os.PathLike[str],
    keep_path: str | os.PathLike[str],
    dropped_path: str | os.PathLike[str],
    store_path: str | os.PathLike[str],
    fields: dict[str, Any],
) -> tuple[list[Path], dict[str, Any], _State | None]:
    """A dedup job's resolved paths, its description (as its progress file records it)
    and the progress file's state, if there is one, refused if it records another job."""
    if fields["threshold"] is not None:
        fields = {**fields, "threshold": valid_threshold(fields["threshold"])}
    check_lines_encoding(fields["encoding"])
    # Recorded by the codec's own name: "latin-1" and "ISO-8859-1" are one job's.
    fields = {**fields, "encoding": codecs.lookup(fields["encoding"]).name}
    paths = [real_path(p) for p in (input_jsonl_path, keep_path, dropped_path)]
    for name, path in zip(("input", "keep", "dropped"), paths, strict=True):
        if (err := _stat_error(path)) is not None:
            shown = input_jsonl_path if name == "input" else path
            reason = err.strerror or err
            raise InvalidParameterError(
                name, str(shown), f"a path that can be opened (it gives: {reason})"
            )
    if not paths[0].is_file():
        raise InvalidParameterError(
            "input",
            str(input_jsonl_path),
            "a regular file (a resumed job seeks in it; save a stream to a file first)"
            if paths[0].exists()
            else "an existing file",
        )
    if (err := _read_error(paths[0])) is not None:  # refused before a store is created
        raise InvalidParameterError(
            "input", str(input_jsonl_path), f"a file that can be read (it gives: {err})"
        )
    outputs = list(zip(("keep", "dropped"), paths[1:], strict=True))
    for (name, path), given in zip(outputs, (keep_path, dropped_path), strict=True):
        if not path.parent.is_dir():
            raise InvalidParameterError(name, str(path), "a file in an existing directory")
        # The path as given too: /dev/stdout on a pipe resolves to no path at all.
        if any(p.exists() and not p.is_file() for p in (path, Path(given))):
            raise InvalidParameterError(
                name,
                str(given),
                "a regular file (a resumed job cuts it back to the size it records)",
            )
        if _is_standard_stream(path):
            raise InvalidParameterError(
                name,
                str(given),
                "a file other than this process's standard output or error (a resumed job "
                "cuts it back, and a command prints its summary there)",
            )
    sidecar = real_path(progress_path(keep_path))
    failures = real_path(failures_path(keep_path))
    refuse_clashing_paths(
        [("input", paths[0])],
        [
            *outputs,
            ("progress file", sidecar),
            ("failures file", failures),
            ("lock file", real_path(lock_path(keep_path))),
        ],
        Path(store_path),
    )
    job = {
        "input": str(paths[0]),
        "keep": str(paths[1]),
        "dropped": str(paths[2]),
        "store": str(real_path(store_path)),
        **fields,
    }
    return paths, job, _load_state(sidecar, job)


def _is_standard_stream(path: Path) -> bool:
    """Whether ``path`` is the file this process's standard output or error writes to
    (:func:`_file_id`, which a path names and a descriptor writes to alike)."""
    identity = _file_id(path)
    return identity is not None and identity in {_file_id(Path(f"/dev/fd/{fd}")) for fd in (1, 2)}


def _read_error(path: Path) -> str | None:
    """Why the start of ``path`` cannot be read (no permission, an I/O error), or
    ``None``: a file that opens may still fail its first read (a failing disk, NFS,
    FUSE)."""
    try:
        with path.open("rb") as source:
            source.read(1)
    except OSError as err:
        return err.strerror or str(err)
    return None


def refuse_clashing_paths(
    inputs: Sequence[tuple[str, Path]],
    outputs: Sequence[tuple[str, Path]],
    store_dir: str | os.PathLike[str],
) -> None:
    """Refuse an output that is one of the named inputs, lies in one that is a directory,
    is another output, or is a file in the store's directory, symbolic and hard links
    included: opening it for writing empties it, which would destroy that file (a document
    to read, the store's data file) before anything could be checked. Each pair is
    ``(name for the message, path)``. A path that cannot be looked at (a symbolic-link
    loop) is left for its open to report.

    Raises:
        InvalidParameterError: naming the output and what it must differ from.
    """
    named = [(name, real_path(path)) for name, path in [*inputs, *outputs]]
    ids = [_file_id(path) for _, path in named]
    for i, (first, first_path) in enumerate(named):
        for j in range(max(i + 1, len(inputs)), len(named)):
            second, second_path = named[j]
            if first_path == second_path or (ids[i] is not None and ids[i] == ids[j]):
                raise InvalidParameterError(
                    second.replace(" ", "_"), str(second_path), f"a file other than the {first}"
                )
    store = real_path(store_dir)
    directories = [(name, path) for name, path in named[: len(inputs)] if path.is_dir()]
    protected: dict[tuple[int, int], Path] | None = None
    for (name, path), identity in zip(named[len(inputs) :], ids[len(inputs) :], strict=True):
        name = name.replace(" ", "_")
        if path.is_relative_to(store):
            raise InvalidParameterError(name, str(path), "a path outside the store's directory")
        for directory_name, directory in directories:
            if path.is_relative_to(directory):
                raise InvalidParameterError(
                    name, str(path), f"a path outside the {directory_name} directory {directory}"
                )
        if identity is None:
            continue
        if protected is None:  # only for an output that exists: the walk costs a stat a file
            protected = _file_ids([store, *(directory for _, directory in directories)])
        if identity in protected:
            raise InvalidParameterError(
                name, str(path), f"a file other than {protected[identity]} (a link to it)"
            )


def _file_id(path: Path) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the file ``path`` names (links followed), which its hard
    links share; ``None`` if there is none to look at (missing, a loop...)."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _file_ids(directories: Sequence[Path]) -> dict[tuple[int, int], Path]:
    """:func:`_file_id` of every file under ``directories`` (those that exist), mapped to
    the file's path."""
    found: dict[tuple[int, int], Path] = {}
    for directory in directories:
        # A subdirectory that cannot be listed is passed over: its files cannot be read
        # through it either (add reports it, :func:`walk_inputs`), so no input is there.
        for root, _, files in os.walk(directory):
            for name in files:
                file = Path(root, name)
                identity = _file_id(file)
                if identity is not None:
                    found.setdefault(identity, file)
    return found


def _read_lines(
    source: IO[bytes], count: int, line: int, encoding: str
) -> tuple[list[tuple[int, bytes]], tuple[int, int]]:
    """Up to ``count`` non-blank lines as (line number, bytes), and the number of the last
    line consumed and the offset after it (blank lines count as lines, so that later
    failures name the right line).

    A last line without a newline is consumed only if it parses as JSON: a file may end
    without one, but a line cut short may also be one a writer is still appending, whose
    rest the next run must read with it. So that line is left for the next run.
    """
    lines: list[tuple[int, bytes]] = []
    offset = source.tell()
    while len(lines) < count:
        raw = source.readline()
        if not raw:
            break
        if not raw.endswith(b"\n") and raw.strip() and not _parses(raw, encoding):
            source.seek(offset)
            break
        line, offset = line + 1, source.tell()
        if raw.strip():
            lines.append((line, raw))
    return lines, (line, offset)


def _parses(raw: bytes, encoding: str) -> bool:
    try:
        json.loads(raw.decode(encoding).removeprefix("\ufeff"))
    except RecursionError:  # complete, too deep to read: a failed line, not an unfinished one
        return True
    except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
        return False
    return True


def _tail_digest(source: IO[bytes], offset: int) -> str:
    """xxh64 of the (up to) 4 KiB of ``source`` before ``offset``: enough to tell an input
    that was replaced from one that was only appended to, without reading it all again.
    Leaves the stream at ``offset``."""
    start = max(0, offset - 4096)
    source.seek(start)
    digest = xxhash.xxh64_hexdigest(source.read(offset - start))
    source.seek(offset)
    return digest


def _check_input(path: Path, at: _Position, sidecar: Path) -> bool:
    """Refuse to resume on an input that is not the one the job read (shorter than the
    position, or other bytes before it); returns whether lines were appended since."""
    with path.open("rb") as source:
        size = source.seek(0, os.SEEK_END)
        if size < at.input_offset:
            raise DedupStateError(
                str(sidecar),
                f"{path} is shorter than the position it records ({size} < "
                f"{at.input_offset} bytes): the input was replaced or truncated (put the "
                "original back to resume)",
            )
        if at.input_tail is not None and _tail_digest(source, at.input_offset) != at.input_tail:
            raise DedupStateError(
                str(sidecar),
                f"{path} holds other bytes before the position it records: the input was "
                "replaced (put the original back to resume)",
            )
    return size > at.input_offset


@dataclass(frozen=True)
class _Outputs:
    """Where :func:`dedup` writes: the keep, dropped and failures files, and the job's
    failures in memory (for its report)."""

    keep: IO[bytes]
    dropped: IO[bytes]
    failed: IO[bytes]
    failures: list[Failure]


def _dedup_batch(
    store: Store,
    lines: list[tuple[int, bytes]],
    end: tuple[int, int, str],
    at: _Position,
    outputs: _Outputs,
    job: dict[str, Any],
    sidecar: Path,
    threshold: float | None,
) -> _Position:
    """Decide, write and commit one batch; returns the position after it (``end``: the
    last line consumed, the offset after it and :func:`_tail_digest` there)."""
    new = at.copy()
    new.line, new.input_offset, new.input_tail = end
    new.batches += 1
    parsed: dict[int, tuple[bytes, dict[str, Any]]] = {}
    records: list[Record] = []
    failed: list[Failure] = []
    name = path_text(Path(job["input"]).name)
    encoding = job["encoding"]
    for number, raw in lines:
        fields = job["id_field"], job["text_field"], encoding, name, number, PASS_ENCODING
        item = parse_line(raw, f"{name}:{number}", *fields)
        if isinstance(item, Failure):
            failed.append(item)
            continue
        record, obj = item
        parsed[id(record)] = (raw, obj)
        records.append(record)
    signed, bad = _sign(store, records)
    failed += bad
    new.failed += len(failed)
    keep_out: list[bytes] = []
    dropped_out: list[bytes] = []
    probes: list[Key] = []
    with store.write() as txn:
        decided = _unique_in_order(txn, signed, threshold, False)
        for doc, result in zip(signed, decided, strict=True):
            key = doc.record.key
            raw, obj = parsed[id(doc.record)]
            if result is None:  # the key is stored: not new, so dropped (add skips it)
                score = estimate_jaccard(doc.signature, txn.get(key).signature)
                dropped_out.append(dropped_text(obj, key, score).encode() + b"\n")
                new.dropped += 1
                new.already_stored += 1
            elif result.added:
                probes.append(key)
                keep_out.append(_as_utf8(raw.rstrip(b"\r\n"), encoding) + b"\n")
                new.kept += 1
            else:
                best = result.matches[0]
                dropped_out.append(dropped_text(obj, best.key, best.score).encode() + b"\n")
                new.dropped += 1
        commits = store._read_count(txn._live, "commit_counter")
        new.store_commits = commits + 1 if keep_out else commits  # (it commits what it adds)
        new.keep_bytes += _write_synced(outputs.keep, keep_out)
        new.dropped_bytes += _write_synced(outputs.dropped, dropped_out)
        failed_out = [json_text(failure.fields()).encode() + b"\n" for failure in failed]
        new.failed_bytes += _write_synced(outputs.failed, failed_out)
        outputs.failures.extend(failed)  # counted in the report once new.failed is
        _save_state(sidecar, job, at, new, probes or None)
    return new


def _as_utf8(raw: bytes, encoding: str) -> bytes:
    """A line read in ``encoding`` (one it decodes: it parsed) as UTF-8. A lone surrogate
    (UTF-7 can give one), which UTF-8 cannot carry, can only be inside a JSON string (the
    line parsed), and becomes the JSON escape of that character there, ``\\ud800``."""
    if encoding == "utf-8":
        return raw  # as it was read, byte for byte
    return raw.decode(encoding).encode("utf-8", "backslashreplace")


def _write_synced(out: IO[bytes], chunks: list[bytes]) -> int:
    """Write a batch's lines and fsync them, before the batch commits.

    Straight to the file descriptor: a buffered write that fails keeps its bytes, and the
    close would fail on them again with an error that names no file. The error raised here
    names the file, and says what is committed, since it aborts the batch.
    """
    data = b"".join(chunks)
    try:
        out.flush()
        _write_all(out.fileno(), data)
        os.fsync(out.fileno())
    except OSError as err:
        if err.filename is None:
            err.filename = getattr(out, "name", None)
        err.add_note(
            "nothing of this batch was committed, any batches before it were: once the file "
            "can be written, run the same command again to resume after them"
        )
        raise
    return len(data)


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is written (it may write less)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _save_state(
    sidecar: Path,
    job: dict[str, Any],
    committed: _Position,
    pending: _Position | None,
    probe: list[Key] | None,
    done: bool = False,
) -> None:
    """Replace the sidecar atomically (write, fsync, rename, fsync the directory)."""
    state = {
        "version": _STATE_VERSION,
        "job": job,
        "committed": committed.saved(),
        "pending": None if pending is None else pending.saved(),
        "probe_key": probe,
        "done": done,
    }
    temporary = sidecar.with_name(sidecar.name + ".tmp")
    with temporary.open("w", encoding="utf-8") as out:
        out.write(json_text(state))
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, sidecar)
    directory = os.open(sidecar.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _load_state(sidecar: Path, job: dict[str, Any]) -> _State | None:
    """The progress file of ``job`` (:func:`_read_state`), refused if it records another
    (``job`` may name some of the fields only)."""
    read = _read_state(sidecar)
    if read is None:
        return None
    recorded, saved = read
    differs = sorted(name for name, value in job.items() if recorded[name] != value)
    if differs:
        raise DedupStateError(
            str(sidecar), f"it records a different job (differs in {', '.join(differs)})"
        )
    return saved


def _read_state(sidecar: Path) -> tuple[dict[str, Any], _State] | None:
    """The job and the state a progress file records (``None`` if there is none), every
    field checked before anything acts on it: a damaged position would cut the finished
    outputs back to what it says."""
    if not sidecar.exists():
        return None
    try:
        state = _PROGRESS_DECODER.decode(sidecar.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:  # not JSON: rerunning cannot help
        damaged = not isinstance(err, OSError)
        reason = f"unreadable progress file ({type(err).__name__}: {err})"
        raise DedupStateError(str(sidecar), reason, damaged=damaged) from None
    version = state.get("version") if isinstance(state, dict) else None
    if type(version) is not int or version not in _READABLE_STATES:
        raise DedupStateError(str(sidecar), "not a progress file of this version")
    try:
        saved = _checked_state(state, version)
    except _StateFieldError as err:
        reason = f"unreadable progress file ({err})"
        raise DedupStateError(str(sidecar), reason, damaged=True) from None
    job = state["job"] if version >= 5 else {**state["job"], **_OLDER_JOB}
    return job, saved


# Numbers as they were written (a failure's key is the input's id). Before version 4 the
# file was written with json.dump, which turned a key past a double into Infinity: read
# as unknown (null), since the number it was is lost.
_PROGRESS_DECODER = json.JSONDecoder(parse_float=JSONFloat, parse_constant=lambda token: None)


@dataclass(frozen=True)
class _State:
    """A checked progress file: the committed position, a pending batch and its probe keys
    (version 1 and 2 files hold one, as a string), and whether the job finished."""

    committed: _Position
    pending: _Position | None
    probe_key: list[str] | None
    done: bool


class _StateFieldError(ValueError):
    """What is wrong with a progress file's fields (becomes a :class:`DedupStateError`)."""


def _checked_state(state: dict[str, Any], version: int) -> _State:
    _fields(state, _STATE_FIELDS, _STATE_FIELDS, "the file")
    _check_job(state["job"], version)
    probe, done = state["probe_key"], state["done"]
    probes_ok = isinstance(probe, list) and all(isinstance(key, str) for key in probe)
    if probe is not None and not isinstance(probe, str) and not probes_ok:
        raise _StateFieldError(
            f"probe_key is {_shown(probe)}, not a string, a list of strings or null"
        )
    if not isinstance(done, bool):
        raise _StateFieldError(f"done is {_shown(done)}, not true or false")
    committed = _checked_position(state["committed"], "committed", version)
    pending = state["pending"]
    if pending is not None:
        pending = _checked_position(pending, "pending", version)
    probes = [probe] if isinstance(probe, str) else probe
    return _State(committed, pending, probes, done)


def _fields(
    value: object, required: frozenset[str], known: frozenset[str], where: str
) -> dict[str, Any]:
    """``value`` as an object with every ``required`` field and no field not ``known``."""
    if not isinstance(value, dict):
        raise _StateFieldError(f"{where} is {_shown(value)}, not an object")
    missing, unknown = sorted(required - value.keys()), sorted(value.keys() - known)
    if missing:
        raise _StateFieldError(f"{where} lacks {', '.join(missing)}")
    if unknown:
        raise _StateFieldError(f"{where} has unknown fields {', '.join(map(repr, unknown))}")
    return value


def _check_job(value: object, version: int) -> None:
    names = frozenset(_JOB_FIELDS) - (_OLDER_JOB.keys() if version < 5 else set())
    job = _fields(value, names, names, "job")
    for name in _JOB_FIELDS:
        if name in names and name != "threshold" and not isinstance(job[name], str):
            raise _StateFieldError(f"job.{name} is {_shown(job[name])}, not a string")
    threshold = job["threshold"]
    if threshold is not None and (
        type(threshold) is bool or not isinstance(threshold, int | float)
    ):
        raise _StateFieldError(f"job.threshold is {_shown(threshold)}, not a number or null")


def _checked_position(value: object, where: str, version: int) -> _Position:
    """A saved position as a :class:`_Position`; older files lack the newer fields, and
    before version 4 ``failed`` lists the failures themselves."""
    known = frozenset(_COUNTS) | {"failed"} | _NEWER_FIELDS.keys()
    required = known - {name for name, since in _NEWER_FIELDS.items() if since > version}
    position = _fields(value, required, known, where)
    counts = (*_COUNTS, "already_stored", "failed_bytes", *(("failed",) if version >= 4 else ()))
    for name in counts:
        if name in position and not _is_count(position[name]):
            raise _StateFieldError(
                f"{where}.{name} is {_shown(position[name])}, not a whole number of 0 or more"
            )
    tail = position.get("input_tail")
    if tail is not None and not _is_digest(tail):
        raise _StateFieldError(f"{where}.input_tail is {_shown(tail)}, not 16 hex digits or null")
    commits = position.get("store_commits")
    if commits is not None and not _is_count(commits):
        raise _StateFieldError(
            f"{where}.store_commits is {_shown(commits)}, not a whole number of 0 or more, or null"
        )
    if version >= 4:
        return _Position(**position)
    failed = position["failed"]
    if not isinstance(failed, list):
        raise _StateFieldError(f"{where}.failed is {_shown(failed)}, not a list")
    for number, fields in enumerate(failed):
        _check_failure(fields, f"{where}.failed[{number}]")
    return _Position(**{**position, "failed": len(failed), "old_failures": failed})


def _check_failure(fields: object, where: str) -> None:
    """A failure as :meth:`Failure.fields` writes it (version 1 files: source and reason
    first, the later fields perhaps missing)."""
    if not isinstance(fields, list) or not 2 <= len(fields) <= 6:
        raise _StateFieldError(f"{where} is {_shown(fields)}, not a list of 2 to 6 fields")
    source, reason, file, line, _key, error = [*fields, None, None, None, None][:6]
    texts_ok = isinstance(source, str) and isinstance(reason, str)
    optional_ok = all(v is None or isinstance(v, str) for v in (file, error))
    if not (texts_ok and optional_ok and (line is None or _is_count(line))):
        raise _StateFieldError(f"{where} is {_shown(fields)}, not a failure's fields")


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0  # a bool is no count


def _is_digest(value: object) -> bool:
    """An xxh64 hex digest, as :func:`_tail_digest` gives."""
    return isinstance(value, str) and len(value) == 16 and set(value) <= set("0123456789abcdef")


def _shown(value: object) -> str:
    shown = json.dumps(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _resolve(store: Store, state: _State) -> _Position:
    """The position to resume from: a pending batch counts if the store committed it."""
    if state.pending is None:
        return state.committed
    probes = state.probe_key
    if not probes:
        return state.pending
    with store.read() as reader:
        present = sum(key in reader for key in probes)
    return state.pending if 2 * present > len(probes) else state.committed


def _check_store(store: Store, at: _Position, sidecar: Path) -> None:
    """Refuse to resume against a store that is not the one the job wrote to, in its
    latest state (one made anew, or restored from a backup older than the job's last
    batches): the run would keep again what the job kept before. The store's commit
    counter only grows, whatever others add or remove, so one below what the job's last
    batch saw gives it away. Files from before version 3 record none, and are not checked.
    """
    if at.store_commits is None:
        return
    with store.read() as reader:
        commits = store._read_count(reader.txn, "commit_counter")
    if commits >= at.store_commits:
        return
    raise DedupStateError(
        str(sidecar),
        f"the store {store.path} has committed {commits} write transactions, fewer than the "
        f"{at.store_commits} it had when the job's last batch committed: it is not the store "
        "the job wrote to, or an older state of it (made anew, or restored from an older "
        "backup), and resuming would keep again what the job kept",
        resume="restore the store the job wrote to, in its latest state, and rerun",
    )


def _truncate(path: Path, size: int, sidecar: Path) -> None:
    """Cut an output back to its recorded size (it may hold an uncommitted batch)."""
    try:
        actual = path.stat().st_size
    except FileNotFoundError:
        actual = -1
    if actual < size:
        raise DedupStateError(
            str(sidecar),
            f"{path} is shorter than recorded ({max(actual, 0)} < {size} bytes): it was "
            "deleted or cut short",
            resume=f"put back the complete {path.name}",
        )
    os.truncate(path, size)
