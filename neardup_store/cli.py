"""``neardup-admin``: the command line, a thin layer over the library.

Each command parses its options, makes one library call and renders the result: an
aligned table for people, ``--json`` (JSON lines) for programs. Exit codes: 0 success,
1 findings, 2 usage or input errors (an output that cannot be written too; once a command
has changed the store, its message says what stands, :func:`_summary_of`), 130 after
Ctrl-C, 141 when the reader of stdout has gone (``| head``). Errors the package raises on
purpose become one ``Error:`` line; anything else is a bug and keeps its traceback.
Rendering lives in :mod:`.cli_render`.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import io
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, NamedTuple, NoReturn

import click
from click.core import ParameterSource

from . import cli_render as render
from . import ingest
from ._version import __version__
from .demo import run_demo
from .errors import (
    READ_ONLY_NOT_FOUND_ADVICE,
    CorruptStoreError,
    EmptyDocumentError,
    InvalidParameterError,
    NeardupError,
    NotAStoreError,
    StoreNotFoundError,
    real,
)
from .integrity import CheckReport, Violation
from .lsh import choose_params
from .maintenance import Pair
from .minhash import DEFAULT_NUM_PERM, SCHEMES, MinHashConfig
from .params import StoreParams, resolve_params
from .store import DAMAGE_ADVICE, EMPTY_DATA_FILE, UNFINISHED_CREATION, Store, holds_store
from .text import SHINGLE_KINDS, ShingleConfig, check_encoding, decode_text
from .txn import Match


class InputError(click.ClickException):
    """A library or input error shown as one ``Error:`` line with exit code 2."""

    exit_code = 2


class _Group(click.Group):
    """The command group: every error a command (or the group's own ``--help`` and
    ``--version``, which Click runs while parsing) lets out becomes what the README
    promises (:func:`_cli_errors`)."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        with _cli_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _cli_errors(ctx):
            return super().invoke(ctx)


@contextlib.contextmanager
def _cli_errors(ctx: click.Context | None = None) -> Iterator[None]:
    """Library and input errors as one ``Error:`` line with exit 2, Ctrl-C as
    ``interrupted`` with exit 130 (Click would say "Aborted!" with exit 1, the code for
    findings), a reader of stdout gone as exit 141. ``ctx`` is the group's, which names
    the command that ran, for advice that only that command can follow."""
    try:
        with _named_stdout():
            yield
    except NeardupError as err:  # with its notes (what earlier batches committed)
        command = None if ctx is None else ctx.invoked_subcommand
        raise InputError(_banding_advice(err, _cli_wording(_with_notes(err)), command)) from err
    except KeyboardInterrupt as err:  # add and dedup report their own
        raise _interrupted_exit(err) from err
    except OSError as err:  # a file that cannot be opened (see _File) or written
        if err.filename is None:
            raise  # not about a path the user named: a real failure, with its traceback
        if err.filename == _STDOUT:
            _drop_buffered_stdout()
            if err.errno == errno.EPIPE:
                _reader_gone()
        lead = f"{err.filename}: {err.strerror or err}"  # an output's notes say what is done
        raise InputError(_with_notes(err, lead)) from err


def _interrupted_exit(err: KeyboardInterrupt) -> click.exceptions.Exit:
    """Say ``interrupted`` (and what earlier batches committed): the exit for Ctrl-C, 130."""
    click.echo(_cli_wording(_with_notes(err, "interrupted")), err=True)
    return click.exceptions.Exit(130)


_STDOUT = "stdout"
"""The name an error writing to standard output carries (see :class:`_NamedStream`)."""


@contextlib.contextmanager
def _named_stdout() -> Iterator[None]:
    """Standard output, for the length of a command, as a stream whose errors name it,
    and a closed standard input (``<&-``: Python's ``sys.stdin`` is then ``None``) as one
    whose every read is an error naming it: only a ``-`` argument reads it. A closed
    standard output stays ``None``, which Click's messages skip (``init >&-`` makes its
    store and exits 0); the ``-`` arguments that write their product there ask
    :func:`_stdout_for_dash`."""
    stdout, stdin = sys.stdout, sys.stdin
    if stdout is not None:
        sys.stdout = _NamedStream(stdout, _STDOUT)  # type: ignore[assignment]
    if stdin is None:
        sys.stdin = _ClosedStdin()  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stdin = stdout, stdin


def _stdout_for_dash() -> None:
    """Refuse ``-`` as an output while standard output is closed (``>&-``), before any
    work: the product would go nowhere (``export -`` crashed with a traceback, ``add
    --report -`` after its batches had committed)."""
    if sys.stdout is None:
        raise _closed(_STDOUT, "nowhere to write")


def _stdin_for_dash() -> None:
    """Refuse ``-`` as an input while standard input is closed (``<&-``), before any
    work, as :func:`_stdout_for_dash` does for an output: a read of it part-way would
    be taken for an input that failed, not for a command line to change."""
    if isinstance(sys.stdin, _ClosedStdin):
        raise _closed("stdin", "nothing to read")


def _closed(name: str, what: str) -> OSError:
    """The error for a standard stream the shell closed, naming it, which the group's
    handler reports as one ``Error:`` line, exit 2 (a ``-`` argument crashed with a
    traceback)."""
    error = OSError(errno.EBADF, f"closed, so there is {what}; name a file instead of -")
    error.filename = name
    return error


class _ClosedStdin(io.RawIOBase):
    """Standard input the shell closed (``<&-``): reading it raises :func:`_closed`."""

    encoding, errors = "utf-8", "strict"

    @property
    def buffer(self) -> _ClosedStdin:  # the bytes under a text stream: the same
        return self

    def readable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise _closed("stdin", "nothing to read")

    def readinto(self, buffer: Any) -> int:
        if not len(buffer):
            return 0  # (Click asks for nothing to learn whether a stream gives bytes)
        raise _closed("stdin", "nothing to read")


class _NamedStream:
    """A stream whose write errors carry its name as their file name, as an error on a
    file the user named does: a stream's own errors name nothing, and a full disk under
    ``> out.jsonl`` is an input error for the error wrapper to report, not a bug."""

    def __init__(self, stream: Any, name: str) -> None:
        self._stream, self._name = stream, name

    def write(self, data: Any) -> int:
        with self._naming():
            return self._stream.write(data)

    def flush(self) -> None:
        with self._naming():
            self._stream.flush()

    @property
    def buffer(self) -> _NamedStream:  # export writes its bytes here
        return _NamedStream(self._stream.buffer, self._name)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._stream, attribute)

    @contextlib.contextmanager
    def _naming(self) -> Iterator[None]:
        try:
            yield
        except OSError as err:
            if err.filename is None:
                err.filename = self._name
            raise


def _drop_buffered_stdout() -> None:
    """Point standard output's descriptor at /dev/null after a write to it failed, so that
    what is still buffered goes nowhere at exit. Without a tty or PYTHONUNBUFFERED, stdout
    is block-buffered: the interpreter's last flush at exit failed again and turned the
    documented exit (2, or 141) into 120 with an "Exception ignored" traceback."""
    if sys.stdout is None:  # closed by the shell (``>&-``): nothing is buffered
        return
    with contextlib.suppress(OSError, ValueError):  # no descriptor under a test runner
        stdout = sys.stdout.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stdout)
        finally:
            os.close(devnull)


@contextlib.contextmanager
def _summary_of(done: str | None) -> Iterator[None]:
    """Print, in the block, the summary of a command that has done its work (``done``
    says what: the store changed, a copy written); should standard output fail there (a
    full disk under ``> out``), the ``Error:`` line says that the work stands and only
    the summary was lost, as ``add --report`` says for its report. Exit 2 alone read as
    input refused with nothing changed, and a rerun was then refused (a second ``init``)
    or did nothing (a second ``remove``). ``None``: nothing was changed."""
    try:
        yield
    except OSError as err:
        if done is not None and err.filename == _STDOUT and err.errno != errno.EPIPE:
            err.add_note(f"{done}; only this summary was not written")
        raise


def _reader_gone() -> NoReturn:
    """Stop quietly when stdout's reader has gone (``| head``), with the status of a
    command that SIGPIPE stopped (141): neither success nor the code for findings."""
    raise click.exceptions.Exit(128 + signal.SIGPIPE)


def _with_notes(err: BaseException, lead: str = "") -> str:
    """``err``'s message (or ``lead``) and its notes, one line each."""
    return "\n".join(filter(None, [lead or str(err), *getattr(err, "__notes__", [])]))


# Library messages name Python arguments; on the command line the same advice is a flag.
_CLI_WORDING = {
    "pass create=True": "run `neardup-admin init`",
    READ_ONLY_NOT_FOUND_ADVICE: "run `neardup-admin init` to make one",  # (a reading command)
    "with create=True": "with `neardup-admin init`",
    "pass replace=True": "pass --replace",
    "pass missing_ok=True": "pass --missing-ok",
    "(Store.create_from_export)": "(`neardup-admin import EXPORT NEW_PATH`)",
    DAMAGE_ADVICE: "`neardup-admin check STORE` names the damaged table",
}


def _cli_wording(message: str) -> str:
    for library, command_line in _CLI_WORDING.items():
        message = message.replace(library, command_line)
    return message


_BANDING_CLAUSE = re.compile(r"\s*\(a threshold of 1 needs bands= and rows= given\)")
"""The library's advice for a threshold that no banding can be chosen for (lsh.py)."""

_INSTEAD = "a threshold of 1 needs the banding given instead: "
_GIVE_THE_BANDING = {
    "init": _INSTEAD + "--bands B --rows R",
    "spark-dedup": _INSTEAD + "--bands B --rows R",
    "rebuild": _INSTEAD + "neardup-admin rebuild STORE --bands B --rows R",
    "dedup": "for a threshold of 1, make the store first with its banding given "
    "(neardup-admin init STORE --bands B --rows R), then run dedup into it",
}
"""How each command that can be given a banding takes one, for a threshold of 1."""


def _banding_advice(err: NeardupError, message: str, command: str | None) -> str:
    """``message`` with the library's advice for a threshold that no banding can be
    chosen for worded as ``command`` can follow it: only for a threshold of 1 (not for
    0, 1.5 or nan), and only where the command has a way to give the banding (``params``
    and ``demo`` have none; ``init`` refuses an existing store, so ``rebuild`` is not
    sent there)."""
    if not isinstance(err, InvalidParameterError) or err.name != "threshold":
        return message
    way = _GIVE_THE_BANDING.get(command or "") if real(err.value) == 1.0 else None
    return _BANDING_CLAUSE.sub(lambda _: f" ({way})" if way else "", message, count=1)


_RESUME_AT_ITEM = re.compile(r"resume from item #\d+")
"""The library's advice after earlier batches committed, which needs an API call."""


@contextlib.contextmanager
def _resume_advice(advice: str) -> Iterator[None]:
    """Word the library's "resume from item #N" note (on any exception leaving the block)
    as ``advice``: no command can start part-way through its input."""
    try:
        yield
    except BaseException as err:
        notes = getattr(err, "__notes__", None)
        if isinstance(notes, list):
            notes[:] = [_RESUME_AT_ITEM.sub(advice, note) for note in notes]
        raise


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="neardup-admin")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars or notes on stderr.")
@click.option("-v", "--verbose", is_flag=True, help="Notes on stderr about what is opened.")
@click.pass_context
def cli(ctx: click.Context, quiet: bool, verbose: bool) -> None:
    """Operate neardup_store near-duplicate indexes.

    \b
    Example:
        neardup-admin init ./corpus.ndx --threshold 0.8
        neardup-admin query ./corpus.ndx --text "some document"
    """
    ctx.obj = {"quiet": quiet, "verbose": verbose and not quiet}


# -- shared plumbing ------------------------------------------------------------------------------

STORE = click.Path()
"""A store argument. Opening it checks it: a missing path is the library's
StoreNotFoundError, one ``Error:`` line (exit 2) that says how to make a store."""


class _File(click.File):
    """:class:`click.File`, but a file that cannot be opened is an input error, one
    ``Error: PATH: reason`` line (the group's handler words the ``OSError``), not a usage
    error with Click's usage block: the path is well formed, the file is what is wrong."""

    def convert(self, value: Any, param: Any, ctx: click.Context | None) -> Any:
        if not isinstance(value, str | os.PathLike):
            return super().convert(value, param, ctx)  # a stream already
        if value == "-" and "r" in self.mode:
            _stdin_for_dash()
        stream = click.open_file(value, self.mode, self.encoding, self.errors, lazy=False)
        if ctx is not None:
            stream = ctx.with_resource(stream)  # closed with the command; '-' is left open
        return stream


_json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON lines instead of a table."
)


class _BatchSize(click.ParamType):
    """A positive integer or ``auto``."""

    name = "INTEGER|auto"

    def convert(self, value: Any, param: Any, ctx: Any) -> int | str:
        if value == "auto":
            return "auto"
        try:
            number = int(value)
        except (TypeError, ValueError):
            number = 0
        if not 1 <= number <= sys.maxsize:
            self.fail(f"{value!r} is neither a positive integer nor 'auto'", param, ctx)
        return number


_batch_size_option = click.option(
    "--batch-size",
    type=_BatchSize(),
    default="auto",
    show_default=True,
    help="Documents per transaction; auto grows it with the store (a tenth of it, from 10k).",
)


def _note(message: str) -> None:
    """A verbose-only note on stderr (never mixed into machine output on stdout)."""
    ctx = click.get_current_context()
    if ctx.obj and ctx.obj.get("verbose"):
        click.echo(message, err=True)


def _show_progress() -> bool:
    """Progress bars only on a terminal (stderr) and not under --quiet."""
    ctx = click.get_current_context()
    quiet = bool(ctx.obj and ctx.obj.get("quiet"))
    return not quiet and sys.stderr is not None and sys.stderr.isatty()  # (None: 2>&-)


@contextlib.contextmanager
def _doc_progress(
    label: str, total: int | None = None, unit: str = "documents"
) -> Iterator[Callable[[int], None]]:
    """A callback ``done -> None`` drawing progress on a terminal: a bar when the total
    is known, else a running count of ``unit``. Silent off a terminal or under --quiet."""
    if not _show_progress():
        yield lambda done: None
        return
    if total:
        with click.progressbar(length=total, label=label, file=sys.stderr) as bar:
            shown = 0

            def advance(done: int) -> None:
                nonlocal shown
                bar.update(max(0, min(done, total) - shown))
                shown = max(shown, min(done, total))

            yield advance
        return
    drawn = False

    def count(done: int) -> None:
        nonlocal drawn
        drawn = True  # first: a Ctrl-C may land in echo, after it has drawn
        click.echo(f"\r{label}: {done} {unit}", nl=False, err=True)

    try:
        yield count
    finally:  # also when the block raises: an Error: or interrupted line starts a line
        if drawn:
            click.echo(err=True)


def open_store(path: str, readonly: bool) -> Store:
    """Open an existing store; read-only where the command does not write, so it can run
    next to writers and on read-only media."""
    _note(f"opening {path} ({'read-only' if readonly else 'read-write'})")
    return Store.open(path, read_only=readonly)


def _read_text(path: str, encoding: str) -> str:
    """One document from a file; decoding errors name the file and the way out."""
    check_encoding(encoding)
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror})") from None
    try:
        return decode_text(data, encoding)
    except UnicodeError as err:
        raise InputError(
            f"{path}: not valid {encoding} ({_where(data, err)}); "
            "pass --encoding with the file's encoding"
        ) from None


def _where(data: bytes, err: UnicodeError) -> str:
    """Where ``data`` stopped decoding, for an error message."""
    if isinstance(err, UnicodeDecodeError):
        return f"byte 0x{data[err.start]:02x} at offset {err.start}"
    return str(err)  # idna and punycode say no more


_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
"""A byte of a command-line argument that the locale's encoding could not decode: Python
keeps it as a lone surrogate, U+DC00 plus the byte (surrogateescape, PEP 383)."""


def _argv_text(text: str, encoding: str | None, option: str) -> str:
    """A document given on the command line (``option``), as text.

    Text the locale's encoding decoded is taken as given. Signing the lone surrogates
    Python keeps for bytes it could not decode would quietly look for a text nobody
    wrote, and find nothing: with ``encoding`` (an explicit ``--encoding``, which also
    names the encoding of the command's files) the argument's own bytes are then decoded
    with it, as a file's are; without, they are an input error that says how to pass
    the text."""
    if encoding is not None:
        check_encoding(encoding)
    escaped = _ESCAPED_BYTE.search(text)
    if escaped is None:
        return text
    locale_encoding = sys.getfilesystemencoding()  # what Python decoded the argument with
    try:
        data = os.fsencode(text)  # the argument's bytes, as the command line gave them
    except UnicodeEncodeError:  # only from code calling the CLI with such a str
        raise InputError(
            f"{option}: holds characters that are not {locale_encoding} text from the "
            "command line, so it has no bytes to decode; pass the text in a file with --file"
        ) from None
    if encoding is None:
        where = (
            f"byte 0x{ord(escaped.group()) - 0xDC00:02x} "
            f"at offset {len(os.fsencode(text[: escaped.start()]))}"
        )
        raise InputError(
            f"{option}: not valid {locale_encoding}, the locale's encoding ({where}); pass "
            "--encoding with the text's encoding, or put it in a file and use --file"
        )
    try:
        return decode_text(data, encoding)
    except UnicodeError as err:
        raise InputError(
            f"{option}: not valid {encoding} ({_where(data, err)}); "
            "pass --encoding with the text's encoding"
        ) from None


@dataclass(frozen=True, eq=False)
class _Query:
    """One query: its id (as printed), its text, and where it came from (for failures:
    ``source`` is ``file:line`` for a JSON line, else the option or file it came from)."""

    qid: Any
    text: str
    source: str
    file: str | None = None
    line: int | None = None

    def failure(self, reason: str, error: str) -> ingest.Failure:
        return ingest.Failure(self.source, reason, self.file, self.line, self.qid, error)


def _stream_name(stream: IO[bytes]) -> str:
    """How failures name a binary input stream (stdin's bytes may have no name)."""
    name = getattr(stream, "name", None)
    return name if isinstance(name, str) else "<stdin>"


def _read_jsonl(
    stream: IO[bytes], id_field: str, text_field: str, encoding: str
) -> tuple[list[_Query], list[ingest.Failure]]:
    """The queries of a JSON-lines stream in ``encoding`` (the id defaults to the line
    number), and a failure, located by ``file:line``, for each line that is not one: as in
    ``add``, a bad line (not in ``encoding``, not JSON, no text) does not stop the others,
    and a read error stops the stream only (:func:`.ingest.input_lines`)."""
    name = ingest.path_text(_stream_name(stream))
    queries: list[_Query] = []
    failed: list[ingest.Failure] = []
    for numbered in ingest.input_lines(stream, _stream_name(stream)):
        if isinstance(numbered, ingest.Failure):  # a read error: the lines before it stand
            failed.append(numbered)
            continue
        number, raw = numbered
        if not raw.strip():
            continue
        where = f"{name}:{number}"
        parsed = _query_line(raw, id_field, text_field, encoding)
        if isinstance(parsed, _BadLine):
            failed.append(
                ingest.Failure(where, parsed.reason, name, number, parsed.qid, parsed.error)
            )
        else:
            qid, text = parsed
            queries.append(_Query(number if qid is None else qid, text, where, name, number))
    return queries, failed


def _query_id(qid: Any) -> Any:
    """A query's id as printed: a str id as a key is (:func:`.ingest.key_text`), so that
    a document that a query of the same corpus finds reads alike in both columns (a
    ``--file`` whose name is not UTF-8 has the bytes key ``add`` gives that file)."""
    return render.key_text(qid) if isinstance(qid, (str, bytes)) else qid


class _BadLine(NamedTuple):
    reason: str
    qid: Any  # the line's id, if it has one
    error: str  # the name of the error type behind it


def _query_line(
    raw: bytes, id_field: str, text_field: str, encoding: str
) -> tuple[Any, str] | _BadLine:
    """A JSON line's ``(id or None, text)``, or why it is no query (worded as ``add``
    words it)."""
    try:
        record = ingest.json_object(raw.decode(encoding))
    except UnicodeError as err:
        reason = ingest.decode_reason(err, encoding, ingest.PASS_ENCODING)
        return _BadLine(reason, None, type(err).__name__)
    if isinstance(record, tuple):
        return _BadLine(record[0], None, record[1])
    qid = record.get(id_field)
    if text_field not in record:
        return _BadLine(f"missing field {text_field!r}", qid, "KeyError")
    if not isinstance(record[text_field], str):
        return _BadLine(f"field {text_field!r} must be a string", qid, "TypeError")
    return qid, record[text_field]


def _source_texts(
    queries: list[_Query], failed: list[ingest.Failure], stream: IO[bytes]
) -> Callable[[Any], str]:
    """``key -> text`` for exact verification; a bad line or a candidate missing from the
    source is an input error (the source must cover the store), not a crash."""
    if failed:
        raise InputError(f"{failed[0].source}: {failed[0].reason}")
    texts = {str(q.qid): q.text for q in queries}
    name = getattr(stream, "name", "-")

    def lookup(key: Any) -> str:
        try:  # a str key is its line's id as add read it; a bytes key (a file's) as printed
            return texts[key if isinstance(key, str) else render.key_text(key)]
        except KeyError:
            raise InputError(
                f"{name}: no text for stored key {key!r} (needed by --exact)"
            ) from None

    return lookup


# -- creating and choosing parameters -------------------------------------------------------------


_PARAMS_OPTIONS = [
    click.option("--threshold", type=float, default=None, help="Jaccard threshold (default 0.8)."),
    click.option(
        "--num-perm", type=int, default=None, help=f"Signature length (default {DEFAULT_NUM_PERM})."
    ),
    click.option("--scheme", type=click.Choice(SCHEMES), default=None, help="MinHash scheme."),
    click.option("--seed", type=int, default=None, help="Hash seed (default 1)."),
    click.option(
        "--shingle-kind", type=click.Choice(SHINGLE_KINDS), default="char", show_default=True
    ),
    click.option(
        "--shingle-size", type=int, default=None, help="Units per shingle (kind default)."
    ),
    click.option("--bag", is_flag=True, help="Count repeated shingles (bag, not set)."),
    click.option("--nfkc/--no-nfkc", default=True, show_default=True, help="NFKC-normalise."),
    click.option("--casefold/--no-casefold", default=True, show_default=True, help="Casefold."),
    click.option(
        "--collapse-whitespace/--no-collapse-whitespace",
        default=True,
        show_default=True,
        help="Turn runs of white space into one blank.",
    ),
    click.option("--strip/--no-strip", default=True, show_default=True, help="Strip the ends."),
    click.option("--bands", type=int, default=None, help="Explicit bands (with --rows)."),
    click.option("--rows", type=int, default=None, help="Explicit rows (with --bands)."),
]


def _params_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Every option that fixes a store's parameters: one list for init and spark-dedup, so
    a store made one way can be made the other."""
    for option in reversed(_PARAMS_OPTIONS):
        command = option(command)
    return command


def _params_from(options: dict[str, Any]) -> StoreParams:
    """The parameters :func:`_params_options` asked for (defaults where not given)."""
    shingles = ShingleConfig(
        kind=options["shingle_kind"],
        size=options["shingle_size"],
        bag=options["bag"],
        nfkc=options["nfkc"],
        casefold=options["casefold"],
        collapse_whitespace=options["collapse_whitespace"],
        strip=options["strip"],
    )
    names = ("threshold", "num_perm", "scheme", "seed")
    return resolve_params(*(options[n] for n in names), shingles, options["bands"], options["rows"])


@cli.command()
@click.argument("path", type=click.Path(file_okay=False))
@_params_options
@click.option(
    "--mode",
    default="700",
    show_default=True,
    help="Octal permissions of the store directory (files: the same without x), less the "
    "umask, as mkdir applies them. A group can use the store with 770 under umask 002: "
    "opening it, even read-only, writes its lock files.",
)
@_json_option
def init(path: str, mode: str, as_json: bool, **params_options: Any) -> None:
    """Create a new, empty store and print the banding chosen for it.

    Refuses a path that already holds a store: parameters are fixed at creation
    (use `rebuild` to change the banding).

    \b
    Example:
        neardup-admin init ./corpus.ndx --threshold 0.8 --num-perm 256
        neardup-admin init ./words.ndx --shingle-kind word --shingle-size 3 --bands 32 --rows 4
        (umask 002; neardup-admin init ./shared.ndx --mode 770)
    """
    try:
        permissions = int(mode, 8)
    except ValueError:
        raise InputError(f"--mode {mode!r} is not an octal number such as 700 or 750") from None
    if holds_store(path):  # a killed init's leftovers are none: creating it goes on
        raise InputError(f"{path}: a store already exists here; init only creates new stores")
    asked = _params_from(params_options)
    with Store.open(path, create=True, mode=permissions, **asked.open_options()) as store:
        params = store.params
    summary = render.banding_summary(params.banding, params.threshold)
    with _summary_of(f"the store was created at {path}"):
        if as_json:
            render.json_line({"path": path, **summary, "params": params.flat()})
        else:
            click.echo(f"Created {path}: " + render.banding_line(summary))


@cli.command()
@click.option("--threshold", type=float, required=True, help="Jaccard threshold in (0, 1).")
@click.option(
    "--num-perm", type=int, default=DEFAULT_NUM_PERM, show_default=True, help="Signature length."
)
@click.option(
    "--fp-weight", type=float, default=0.05, show_default=True, help="False-positive cost."
)
@click.option(
    "--fn-weight", type=float, default=0.95, show_default=True, help="False-negative cost."
)
@click.option("--use-all", is_flag=True, help="Only bandings with bands*rows == num_perm.")
@click.option(
    "--png",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Also save the S-curve plot here (needs matplotlib).",
)
@_json_option
def params(
    threshold: float,
    num_perm: int,
    fp_weight: float,
    fn_weight: float,
    use_all: bool,
    png: str | None,
    as_json: bool,
) -> None:
    """Choose bands and rows for a threshold, and show the S-curve (no store needed).

    The S-curve is the probability that a pair of a given Jaccard similarity becomes a
    candidate; a steep rise at the threshold means few misses and few false candidates.

    \b
    Example:
        neardup-admin params --threshold 0.8
        neardup-admin params --threshold 0.5 --num-perm 128 --fn-weight 0.5 --fp-weight 0.5
    """
    if png is not None and importlib.util.find_spec("matplotlib") is None:
        raise InputError(
            "--png needs matplotlib, which is not installed: "
            "pip install 'neardup_store[plot]' (or matplotlib)"
        )
    banding = choose_params(threshold, num_perm, fp_weight, fn_weight, use_all)
    summary = render.banding_summary(banding, threshold)
    grid = [round(i * 0.05, 2) for i in range(21)]
    curve = [(s, float(banding.probability(s))) for s in grid]
    if as_json:
        for s, p in curve:
            render.json_line({"similarity": s, "probability": p})
        render.json_line({"summary": {**summary, "num_perm": num_perm}})
    else:
        click.echo(f"num_perm={num_perm}: " + render.banding_line(summary))
        click.echo()
        render.table(("similarity", "P(candidate)"), curve)
        click.echo()
        for line in render.ascii_plot(banding, threshold):
            click.echo(line)
    if png is not None:
        render.save_png(banding, threshold, png)


# -- feeding the store ----------------------------------------------------------------------------


class _BatchTicker:
    """Progress on a terminal for batch-wise work: a bar against the input size when it
    is known, else a running count with docs/s. Silent off a terminal or under --quiet."""

    def __init__(self, label: str, total_bytes: int | None = None) -> None:
        self.enabled = _show_progress()
        self.label, self.total = label, total_bytes
        self.started = time.monotonic()
        self.shown = 0

    def __call__(self, progress: ingest.BatchProgress) -> None:
        if not self.enabled:
            return
        # This run's lines over this run's time: a resumed job's totals include earlier runs.
        this_run = progress.records - progress.resumed_from
        rate = this_run / max(time.monotonic() - self.started, 1e-9)
        where = ""
        if self.total and progress.input_offset is not None:
            where = f" {100 * progress.input_offset / self.total:5.1f}%"
        since = f" since line {progress.resumed_from}" if progress.resumed_from else ""
        click.echo(
            f"\r{self.label}{where}: {progress.records} docs, {rate:,.0f} docs/s{since}, "
            f"{progress.batches_committed} batches committed",
            nl=False,
            err=True,
        )
        self.shown += 1

    def close(self) -> None:
        if self.enabled and self.shown:
            click.echo(err=True)


def _interrupted(err: ingest.Interrupted, ticker: _BatchTicker) -> None:
    ticker.close()
    click.echo(str(err), err=True)
    sys.exit(130)


@cli.command()
@click.argument("path", type=STORE)
@click.argument("inputs", nargs=-1, required=True)
@click.option("--jsonl", is_flag=True, help="Inputs are JSON lines (one document per line).")
@click.option("--id-field", default="id", show_default=True, help="JSON-lines key field.")
@click.option("--text-field", default="text", show_default=True, help="JSON-lines text field.")
@click.option(
    "--include", multiple=True, default=("*",), show_default=True, help="Glob for directories."
)
@click.option("--encoding", default="utf-8", show_default=True, help="Encoding of the inputs.")
@_batch_size_option
@click.option("--replace", is_flag=True, help="Overwrite documents whose key is stored.")
@click.option(
    "--unique", is_flag=True, help="Add only documents with no near-duplicate stored or earlier."
)
@click.option("--threshold", type=float, default=None, help="With --unique (store default).")
@click.option(
    "--report",
    # A path, opened by the command once it is known not to be a file the command reads.
    type=click.Path(dir_okay=False, allow_dash=True),
    default=None,
    help="Write skipped (with matching keys) and failed inputs here as JSON lines.",
)
@_json_option
def add(
    path: str,
    inputs: tuple[str, ...],
    jsonl: bool,
    id_field: str,
    text_field: str,
    include: tuple[str, ...],
    encoding: str,
    batch_size: int | Literal["auto"],
    replace: bool,
    unique: bool,
    threshold: float | None,
    report: str | None,
    as_json: bool,
) -> None:
    """Add documents: files, directories, JSON lines, or - for stdin.

    Each batch is one transaction: Ctrl-C keeps every batch committed before it and
    nothing of the current one. Exits 1 if some inputs could not be used (among them a
    directory that cannot be listed, and a pipe or device met in a directory, which is
    not opened: name it on its own to read it).

    \b
    Example:
        neardup-admin add ./corpus.ndx ./articles --include '*.txt'
        neardup-admin add ./corpus.ndx dump.jsonl --jsonl --unique --report skipped.jsonl
    """
    if unique and replace:
        raise click.UsageError("--unique and --replace cannot be combined")
    if threshold is not None and not unique:
        raise click.UsageError("--threshold applies only with --unique")
    if ingest.STDIN in inputs:
        _stdin_for_dash()
    report_out = None if report is None else _open_report(report, inputs, path)
    records = ingest.read_inputs(
        inputs,
        include=include,
        jsonl=jsonl,
        id_field=id_field,
        text_field=text_field,
        encoding=encoding,
    )
    ticker = _BatchTicker("adding")
    with open_store(path, readonly=False) as store:
        try:
            result = ingest.ingest(
                store,
                records,
                batch_size=batch_size,
                replace=replace,
                unique=unique,
                threshold=threshold,
                on_batch=ticker,
            )
        except ingest.Interrupted as err:
            _interrupted(err, ticker)
    ticker.close()
    if report_out is not None:
        _write_report(report_out, result)
    summary = {
        "added": result.added,
        "replaced": result.replaced,
        "skipped": len(result.skipped),
        "failed": len(result.failed),
        "batches": result.batches_committed,
    }
    with _summary_of(f"the documents were added ({_added(result)})"):
        _report_failures(summary, result.failed, as_json, "see --report or --json")


def _open_report(report: str, inputs: tuple[str, ...], store: str) -> IO[str]:
    """``add --report``, opened (and so emptied) before anything is added, so that a path
    that cannot be written is refused before, not after, every batch has committed; but
    only once it is known to be neither an input nor a file of the store, which emptying
    it would destroy (as ``dedup`` refuses for its outputs)."""
    if report == ingest.STDIN:
        _stdout_for_dash()
    else:
        named = [("input", Path(p)) for p in inputs if p != ingest.STDIN]
        ingest.refuse_clashing_paths(named, [("report", Path(report))], store)
    stream = click.open_file(report, "w", encoding="utf-8", lazy=False)
    if report != ingest.STDIN:

        def close() -> None:  # a write error is reported by _write_report; closing repeats it
            with contextlib.suppress(OSError):
                stream.close()

        click.get_current_context().call_on_close(close)
    return stream


def _write_report(report: IO[str], result: ingest.IngestReport) -> None:
    """``add --report``: skipped and failed inputs as JSON lines, flushed here, where a
    write error can still be reported: at Click's close it would be dropped, with exit 0."""
    try:
        for skipped in result.skipped:
            record = {"key": render.key_text(skipped.key), "skipped": skipped.reason}
            record["matches"] = [render.key_text(k) for k in skipped.matching_keys]
            report.write(ingest.json_text(record) + "\n")
        for failure in result.failed:
            line = {"source": failure.source, "failed": failure.reason}
            report.write(ingest.json_text(line) + "\n")
        report.flush()
    except OSError as err:
        name = getattr(report, "name", "the report")
        raise InputError(
            f"{name}: cannot write the report ({err.strerror or err}); the documents were "
            f"added ({_added(result)}), but the report was not written"
        ) from err


def _added(result: ingest.IngestReport) -> str:
    """What ``add`` did, for a message saying that it stands though an output failed."""
    return (
        f"{result.added} added, {result.replaced} replaced, {len(result.skipped)} skipped, "
        f"{len(result.failed)} failed"
    )


def _report_failures(
    summary: dict[str, Any], failed: list[ingest.Failure], as_json: bool, more: str
) -> None:
    """The summary and the failures (JSON: a line each, then the summary; a table: the
    summary, then the first failures), and exit 1 when an input could not be used."""
    if as_json:
        render.failures(failed, as_json, more)
        render.summary(summary, as_json)
    else:
        render.summary(summary, as_json)
        render.failures(failed, as_json, more)
    if failed:
        sys.exit(1)


@cli.command()
@click.argument("input_path", metavar="INPUT.jsonl", type=click.Path())  # checked below
@click.option(
    "--store",
    "store_path",
    required=True,
    type=click.Path(file_okay=False),
    help="The index to dedup against (created if missing).",
)
@click.option("--keep", required=True, type=click.Path(dir_okay=False), help="Kept lines.")
@click.option("--dropped", required=True, type=click.Path(dir_okay=False), help="Dropped lines.")
@click.option("--id-field", default="id", show_default=True, help="JSON-lines key field.")
@click.option("--text-field", default="text", show_default=True, help="JSON-lines text field.")
@click.option("--threshold", type=float, default=None, help="Similarity threshold (store's).")
@click.option(
    "--encoding",
    default="utf-8",
    show_default=True,
    help="Encoding of the input (--keep and --dropped are written in UTF-8).",
)
@click.option("--batch-size", type=click.IntRange(1), default=ingest.DEDUP_BATCH, show_default=True)
@click.option("--fail-on-duplicates", is_flag=True, help="Exit 1 if anything was dropped.")
@_json_option
def dedup(
    input_path: str,
    store_path: str,
    keep: str,
    dropped: str,
    id_field: str,
    text_field: str,
    threshold: float | None,
    encoding: str,
    batch_size: int,
    fail_on_duplicates: bool,
    as_json: bool,
) -> None:
    """Stream an archive through the index: keep the first of each near-duplicate group.

    Dropped records get "duplicate_of" and "score". A record whose key the store already
    holds is not new either: it is dropped with "duplicate_of" its own key and counted as
    already_stored. Exits 1 if some lines could not be used (listed with --json). An
    input that is not UTF-8 needs --encoding; kept lines are written in UTF-8 then. After
    an interruption, run the same command again: it resumes where the last committed
    batch ended.

    \b
    Example:
        neardup-admin dedup archive.jsonl --store ./corpus.ndx \\
            --keep kept.jsonl --dropped dropped.jsonl
    """
    # Everything checked before a store is created: a refused job must leave nothing.
    ingest.check_dedup_paths(
        input_path,
        keep,
        dropped,
        store_path,
        id_field=id_field,
        text_field=text_field,
        threshold=threshold,
        encoding=encoding,
    )
    exists = (Path(store_path) / "data.mdb").exists()
    _note(f"{'opening' if exists else 'creating'} {store_path}")
    store = (
        Store.open(store_path)
        if exists
        else Store.open(store_path, create=True, threshold=0.8 if threshold is None else threshold)
    )
    ticker = _BatchTicker("dedup", Path(input_path).stat().st_size)
    with store:
        try:
            result = ingest.dedup(
                store,
                input_path,
                keep,
                dropped,
                id_field=id_field,
                text_field=text_field,
                threshold=threshold,
                encoding=encoding,
                batch_size=batch_size,
                on_batch=ticker,
            )
        except ingest.Interrupted as err:
            _interrupted(err, ticker)
    ticker.close()
    summary = {
        "kept": result.kept,
        "dropped": result.dropped,
        "already_stored": result.already_stored,
        "failed": len(result.failed),
        "resumed_from_line": result.resumed_from,
        "held_back_bytes": result.held_back_bytes,
    }
    if result.held_back_bytes:
        click.echo(
            f"{input_path}: its last line ({result.held_back_bytes} bytes) has no newline and "
            "is not JSON: left unread (a writer may still be appending it); run the same "
            "command again once it is complete",
            err=True,
        )
    done = (
        f"the job's batches were committed and their lines written ({result.kept} kept, "
        f"{result.dropped} dropped, {len(result.failed)} failed)"
    )
    with _summary_of(done):
        _report_failures(summary, result.failed, as_json, "see --json")
    if fail_on_duplicates and result.dropped:
        sys.exit(1)


# -- reading the store ----------------------------------------------------------------------------


@cli.command()
@click.argument("path", type=STORE)
@click.option(
    "--text",
    default=None,
    help="The query document itself (bytes the locale cannot decode: see --encoding).",
)
@click.option(
    "--file",
    "file_",
    type=click.Path(),  # read by _read_text, whose errors name it
    default=None,
    help="A file holding one query document.",
)
@click.option(
    "--jsonl",
    type=_File("rb"),
    default=None,
    help="JSON lines of queries ('-' for stdin).",
)
@click.option("--id-field", default="id", show_default=True, help="JSON-lines id field.")
@click.option("--text-field", default="text", show_default=True, help="JSON-lines text field.")
@click.option(
    "--encoding",
    default="utf-8",
    show_default=True,
    help="Encoding of --file, --jsonl and --exact; given, also of --text's bytes that "
    "the locale cannot decode.",
)
@click.option("--threshold", type=float, default=None, help="Minimum score (store default).")
@click.option("--limit", type=click.IntRange(1), default=None, help="Matches per query.")
@click.option(
    "--exact",
    "exact_source",
    type=_File("rb"),
    default=None,
    help="JSON lines of the stored documents' texts (same id/text fields): re-verify "
    "every candidate by exact Jaccard.",
)
@click.option("--fail-on-duplicates", is_flag=True, help="Exit 1 when any match is found.")
@_json_option
def query(
    path: str,
    text: str | None,
    file_: str | None,
    jsonl: IO[bytes] | None,
    id_field: str,
    text_field: str,
    encoding: str,
    threshold: float | None,
    limit: int | None,
    exact_source: IO[bytes] | None,
    fail_on_duplicates: bool,
    as_json: bool,
) -> None:
    """Find stored near-duplicates of a text, a file or JSON lines of queries.

    Scores are estimated Jaccard similarities (the share of equal signature values). A
    JSON line that is no query (or has an empty text) is reported by its line number and
    the others are still answered; the exit code is then 1.

    \b
    Example:
        neardup-admin query ./corpus.ndx --text "the quick brown fox"
        neardup-admin query ./corpus.ndx --file draft.txt --threshold 0.6
        neardup-admin query ./corpus.ndx --jsonl queries.jsonl --json --fail-on-duplicates
        neardup-admin query ./corpus.ndx --text "the quick brown fox" --exact corpus.jsonl
    """
    options = (("--text", text), ("--file", file_), ("--jsonl", jsonl))
    if sum(value is not None for _, value in options) != 1:
        raise click.UsageError("give exactly one of --text, --file or --jsonl")
    failed: list[ingest.Failure] = []
    if jsonl is not None or exact_source is not None:  # JSON lines, read in --encoding
        ingest.check_lines_encoding(encoding)
    if text is not None:
        given = click.get_current_context().get_parameter_source("encoding")
        explicit = None if given is ParameterSource.DEFAULT else encoding
        queries = [_Query("text", _argv_text(text, explicit, "--text"), "--text")]
    elif file_ is not None:
        # Its id is the key add gives the file (bytes for a name that is not UTF-8).
        queries = [
            _Query(ingest.path_key(file_), _read_text(file_, encoding), ingest.path_text(file_))
        ]
    else:
        assert jsonl is not None
        queries, failed = _read_jsonl(jsonl, id_field, text_field, encoding)
    exact = None
    if exact_source is not None:
        read = _read_jsonl(exact_source, id_field, text_field, encoding)
        exact = _source_texts(*read, exact_source)
    results: list[list[Match]] = []
    answered: list[_Query] = []
    with (
        open_store(path, readonly=True) as store,
        _doc_progress("Querying", len(queries)) as progress,
    ):
        for lo in range(0, len(queries), QUERY_CHUNK):  # in chunks, for the progress bar
            chunk = _answer(
                store, queries[lo : lo + QUERY_CHUNK], threshold=threshold, limit=limit, exact=exact
            )
            answered += chunk[0]
            results += chunk[1]
            failed += chunk[2]
            progress(lo + QUERY_CHUNK)
    queries = answered
    rows = [
        (_query_id(q.qid), render.key_text(m.key), m.score, m.exact)
        for q, matches in zip(queries, results, strict=True)
        for m in matches
    ]
    headers = ("query", "key", "score", "exact") if exact else ("query", "key", "score")
    if as_json:
        for qid, key, score, jaccard in rows:
            record = {"query": qid, "key": key, "score": score}
            render.json_line(record if exact is None else {**record, "exact": jaccard})
    elif rows:
        render.table(headers, [row[: len(headers)] for row in rows])
    else:
        click.echo("No matches.")
    render.failures(sorted(failed, key=lambda f: f.line or 0), as_json, "see --json")
    if failed or (fail_on_duplicates and rows):
        sys.exit(1)


QUERY_CHUNK = 1000
"""Queries of ``query --jsonl`` answered by one ``query_many`` call, between progress steps."""


def _answer(
    store: Store, queries: list[_Query], **options: Any
) -> tuple[list[_Query], list[list[Match]], list[ingest.Failure]]:
    """The queries answered, their matches, and a failure for each empty one (no
    shingles): in JSON lines an empty text fails its own line and the others are still
    answered, as in ``add``; as the one query of --text or --file it is an input error."""
    texts = [q.text for q in queries]
    try:
        return queries, store.query_many(texts, **options) if texts else [], []
    except EmptyDocumentError as err:
        # Rare: sign one by one to find the empty ones, then answer the rest.
        rest, empty = [], []
        for q in queries:
            (empty if _is_empty(store, q.text) else rest).append(q)
        if not empty:
            raise  # not a query's own text
        if len(queries) == 1 and queries[0].line is None:
            raise InputError(
                f"{queries[0].source}: the document is empty after normalisation and has "
                "no shingles, so there is nothing to compare; give a text with words in it"
            ) from err
    failures = [q.failure("empty document", EmptyDocumentError.__name__) for q in empty]
    matches = store.query_many([q.text for q in rest], **options) if rest else []
    return rest, matches, failures


def _is_empty(store: Store, text: str) -> bool:
    """Whether a query text has no shingles (asked only after a batch found one empty)."""
    try:
        store.hasher.signature(text)
    except EmptyDocumentError:
        return True
    return False


def _format_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--format jsonl|csv|table``, with ``--json`` for ``--format jsonl`` as every other
    command spells JSON lines."""
    command = click.option(
        "--json", "fmt", flag_value="jsonl", help="JSON lines (the same as --format jsonl)."
    )(command)
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(["jsonl", "csv", "table"]),
        default="jsonl",
        show_default=True,
        help="Output format.",
    )(command)


@cli.command()
@click.argument("path", type=STORE)
@click.option("--threshold", type=float, default=None, help="Minimum score (store default).")
@_format_option
@click.option("--fail-on-duplicates", is_flag=True, help="Exit 1 when any pair is found.")
def pairs(path: str, threshold: float | None, fmt: str, fail_on_duplicates: bool) -> None:
    """List every near-duplicate pair in the store (first inserted first).

    \b
    Example:
        neardup-admin pairs ./corpus.ndx --threshold 0.9 > pairs.jsonl
        neardup-admin pairs ./corpus.ndx --format csv --fail-on-duplicates
    """
    headers = ("first", "second", "score")
    with (
        open_store(path, readonly=True) as store,
        # Closed before the store, also when a write fails or Ctrl-C lands mid-walk: the
        # store refuses to close under the iterator's open snapshot.
        contextlib.closing(store.pairs(threshold)) as walk,
    ):
        found = _with_progress(walk, "pairs")
        if fmt == "csv":
            count = _count(found, lambda it: render.csv_rows(headers, it))
        elif fmt == "table":
            count = _count(found, lambda it: render.table(headers, list(it)))
        else:
            count = _count(found, _pairs_jsonl)
    if fail_on_duplicates and count:
        sys.exit(1)


def _with_progress(found: Iterator[Pair], label: str) -> Iterator[tuple[str, str, float]]:
    """Stream pairs as rows of printed keys (:func:`.cli_render.key_text`) and score, behind
    a progress counter on a terminal (silent when piped).

    When stdout is a terminal too, rows are held until the walk ends so that they do not
    interleave with the bar.
    """
    rows = ((render.key_text(p.first), render.key_text(p.second), p.score) for p in found)
    if not _show_progress():
        yield from rows
        return
    held = []
    with click.progressbar(rows, label=f"Finding {label}", file=sys.stderr) as bar:
        for row in bar:
            if sys.stdout is not None and sys.stdout.isatty():
                held.append(row)
            else:
                yield row
    yield from held


def _count(rows: Iterator[tuple[Any, ...]], sink: Any) -> int:
    """Feed ``rows`` to ``sink`` and return how many went through."""
    seen = 0

    def counting() -> Iterator[tuple[Any, ...]]:
        nonlocal seen
        for row in rows:
            seen += 1
            yield row

    sink(counting())
    return seen


def _pairs_jsonl(rows: Iterator[tuple[str, str, float]]) -> None:
    for first, second, score in rows:
        render.json_line({"first": first, "second": second, "score": score})


@cli.command()
@click.argument("path", type=STORE)
@click.option("--threshold", type=float, default=None, help="Minimum score (store default).")
@_format_option
def clusters(path: str, threshold: float | None, fmt: str) -> None:
    """List clusters: groups of documents linked by near-duplicate pairs.

    \b
    Example:
        neardup-admin clusters ./corpus.ndx > clusters.jsonl
        neardup-admin clusters ./corpus.ndx --format csv --threshold 0.9
    """
    with (
        open_store(path, readonly=True) as store,
        _doc_progress("Finding clusters", unit="pairs") as progress,
    ):
        groups = store.clusters(threshold, progress)
    if fmt == "jsonl":
        for number, keys in enumerate(groups, 1):
            render.json_line({"cluster": number, "keys": [render.key_text(k) for k in keys]})
        return
    rows = [(number, render.key_text(key)) for number, keys in enumerate(groups, 1) for key in keys]
    if fmt == "csv":
        render.csv_rows(("cluster", "key"), rows)
    else:
        render.table(("cluster", "key"), rows)


@cli.command()
@click.argument("path", type=STORE)
@_json_option
def info(path: str, as_json: bool) -> None:
    """Show a store's parameters, document count and file size (quick).

    \b
    Example:
        neardup-admin info ./corpus.ndx
    """
    with open_store(path, readonly=True) as store:
        flat, documents = store.params.flat(), len(store)
    file_bytes = (Path(path) / "data.mdb").stat().st_size  # LMDB's data file
    render.render_info(flat, documents, file_bytes, as_json)


@cli.command()
@click.argument("path", type=STORE)
@click.option("--largest", type=click.IntRange(0), default=5, show_default=True)
@_json_option
def stats(path: str, largest: int, as_json: bool) -> None:
    """Show full statistics: sizes, free pages, readers, bucket sizes, largest buckets.

    Walks every band, so it takes about as long as reading the whole index. Large
    buckets are usually shared boilerplate and make queries slow.

    \b
    Example:
        neardup-admin stats ./corpus.ndx --largest 10
    """
    with open_store(path, readonly=True) as store:
        report = store.stats(largest)
    render.render_stats(report, as_json)


# -- changing the store ---------------------------------------------------------------------------


@cli.command()
@click.argument("path", type=STORE)
@click.argument("keys", nargs=-1)
@click.option(
    "--from-file",
    type=_File("rb"),
    default=None,
    help="Read keys from this file, one a line ('-' for stdin).",
)
@click.option("--missing-ok", is_flag=True, help="Ignore keys that are not stored.")
@click.option(
    "--batch-size",
    type=_BatchSize(),
    default=None,
    help="Keys per transaction, or auto (as add's); default: all in one, all or nothing.",
)
@_json_option
def remove(
    path: str,
    keys: tuple[str, ...],
    from_file: IO[bytes] | None,
    missing_ok: bool,
    batch_size: int | Literal["auto"] | None,
    as_json: bool,
) -> None:
    """Remove documents by key, in one transaction (all or nothing) unless --batch-size
    commits every that many; a missing key fails before anything is removed.

    Keys are written as pairs, query and clusters print them: hex:<hex digits> is a bytes
    key, str:<hex digits> the UTF-8 of a key that a line would not carry whole (a line
    break, a tab, a blank at an end), and a key that could be read as either has a
    backslash in front (\\hex:...).

    \b
    Example:
        neardup-admin remove ./corpus.ndx doc-17 doc-18
        neardup-admin remove ./corpus.ndx hex:00ff '\\hex:00ff'
        neardup-admin remove ./corpus.ndx --from-file stale-keys.txt --missing-ok
        neardup-admin remove ./corpus.ndx --from-file takedowns.txt --batch-size auto
    """
    if not keys and from_file is None:
        raise click.UsageError("give keys as arguments or with --from-file")
    wanted = [ingest.key_from_text(key) for key in keys]
    if from_file is not None:  # an empty file is no mistake: nothing is stale today
        wanted += _key_lines(from_file)
    advice = "to finish, run the same remove again with --missing-ok"
    with open_store(path, readonly=False) as store, _resume_advice(advice):
        removed = store.remove_many(wanted, missing_ok=missing_ok, batch_size=batch_size)
    with _summary_of(f"the store was changed: {removed} of {len(wanted)} documents removed"):
        if as_json:
            render.json_line({"removed": removed, "asked": len(wanted)})
        else:
            click.echo(f"Removed {removed} of {len(wanted)} documents.")


def _key_lines(stream: IO[bytes]) -> list[str | bytes]:
    """The keys of a file, one a line (blank lines skipped), each checked to be UTF-8 and
    read as :func:`.ingest.key_from_text` reads a key."""
    name = _stream_name(stream)
    keys: list[str | bytes] = []
    for numbered in ingest.input_lines(stream, name):
        if isinstance(numbered, ingest.Failure):  # nothing is removed from a partial list
            raise InputError(f"{numbered.source}: {numbered.reason}")
        number, raw = numbered
        try:
            line = (decode_text if number == 1 else bytes.decode)(raw, "utf-8").rstrip("\r\n")
        except UnicodeDecodeError as err:
            raise InputError(
                f"{name}:{number}: not valid UTF-8 at byte {err.start} ({err.reason}); keys "
                "are read as UTF-8 text"
            ) from None
        if line.strip():
            keys.append(_key_at(line, f"{name}:{number}"))
    return keys


def _key_at(text: str, where: str) -> str | bytes:
    """The key a line of a key file names; a malformed one is refused with its place."""
    try:
        return ingest.key_from_text(text)
    except InvalidParameterError as err:
        raise InputError(f"{where}: {err}") from None


@cli.command()
@click.argument("path", type=STORE)
@click.option(
    "--batch-size",
    type=_BatchSize(),
    default="auto",
    help="Documents per transaction, or auto (the default, as add's).",
)
@_json_option
def purge(path: str, batch_size: int | Literal["auto"], as_json: bool) -> None:
    """Delete the band entries that removed documents leave behind.

    A removal takes a document out of every query at once; its band entries wait for a
    purge, which deletes many at a time. One runs on its own once they pass both 10,000
    and a tenth of the documents, and compact runs one first.

    \b
    Example:
        neardup-admin purge ./corpus.ndx
    """
    with open_store(path, readonly=False) as store:
        with store.read() as reader:
            waiting = reader.awaiting_purge()
        with _doc_progress("Purging", waiting) as progress:
            purged = store.purge(batch_size, progress)
    with _summary_of(f"the band entries of {purged} removed documents were purged"):
        if as_json:
            render.json_line({"purged": purged})
        else:
            click.echo(f"Purged the band entries of {purged} removed documents.")


@cli.command()
@click.argument("path", type=STORE)
@click.option("--repair", is_flag=True, help="Re-derive the keys and band tables from the records.")
@_json_option
def check(path: str, repair: bool, as_json: bool) -> None:
    """Check the store's invariants; exit 1 when violations are (still) present, a store
    too damaged to open included.

    \b
    Example:
        neardup-admin check ./corpus.ndx
        neardup-admin check ./corpus.ndx --repair
    """
    try:
        with open_store(path, readonly=not repair) as store, _doc_progress("Checking") as progress:
            report = store.check(repair, progress)  # a count: a repair checks again after it
    except CorruptStoreError as err:  # a finding like any other: the store is there, damaged
        report = CheckReport(0, [Violation("structure", str(err))])
    with _summary_of("the store was repaired" if report.repaired else None):
        render.render_check(report, as_json)
    if not report.ok:
        sys.exit(1)


@cli.command()
@click.argument("path", type=STORE)
@click.option("--dry-run", is_flag=True, help="Report reclaimable space; change nothing.")
@_json_option
def compact(path: str, dry_run: bool, as_json: bool) -> None:
    """Rewrite the store without free pages.

    \b
    Example:
        neardup-admin compact ./corpus.ndx --dry-run
    """
    with open_store(path, readonly=dry_run) as store:
        if dry_run:
            report = store.compact(dry_run=True)
        else:
            with _doc_progress("Compacting", len(store)) as progress:
                report = store.compact(progress=progress)
    done = None if dry_run else f"the store was compacted ({report.bytes_after} bytes now)"
    with _summary_of(done):
        render.render_compact(report, as_json)


@cli.command()
@click.argument("path", type=STORE)
@click.option("--threshold", type=float, default=None, help="New threshold (bands chosen).")
@click.option("--bands", type=int, default=None, help="Explicit bands (with --rows).")
@click.option("--rows", type=int, default=None, help="Explicit rows (with --bands).")
@_json_option
def rebuild(
    path: str, threshold: float | None, bands: int | None, rows: int | None, as_json: bool
) -> None:
    """Re-band every document for a new threshold or banding (signatures are kept).

    With no option, the banding stays and the store is rewritten in the current format.

    \b
    Example:
        neardup-admin rebuild ./corpus.ndx --threshold 0.9
        neardup-admin rebuild ./corpus.ndx --bands 16 --rows 8
        neardup-admin rebuild ./old-format.ndx
    """
    with (
        open_store(path, readonly=False) as store,
        _doc_progress("Re-banding", len(store)) as progress,
    ):
        report = store.rebuild(threshold, bands, rows, progress)
    with _summary_of(f"the store was rebuilt ({report.documents} documents re-banded)"):
        render.render_rebuild(report, as_json)


@cli.command()
@click.argument("path", type=STORE)
@click.argument("out", type=click.Path(dir_okay=False, allow_dash=True))
@_json_option
def export(path: str, out: str, as_json: bool) -> None:
    """Write the store's documents as a portable export stream ('-' for stdout).

    A file appears whole or not at all. The stream ends with a marker that import checks,
    so an export cut short (on stdout too) is refused: into a new store, nothing is left;
    into an existing one, the batches before the cut stay committed (see import --help).

    \b
    Example:
        neardup-admin export ./corpus.ndx corpus.export
        neardup-admin export ./corpus.ndx - | gzip > corpus.export.gz
    """
    with (
        open_store(path, readonly=True) as store,
        _doc_progress("Exporting", len(store)) as progress,
    ):
        if out == "-":
            stdout = _stdout_bytes()
            count = store.export(stdout, progress)
            stdout.flush()
        else:
            count = store.export_file(out, progress)
    message = {"exported": count}
    with _summary_of(None if out == "-" else f"the export was written to {out}"):
        if as_json:  # stdout may be the export itself: the summary goes to stderr then
            click.echo(json.dumps(message), err=out == "-")
        elif not _quiet():
            click.echo(f"Exported {count} documents.", err=True)


def _stdout_bytes() -> IO[bytes]:
    """Standard output's byte stream, for ``-`` (:func:`_stdout_for_dash`)."""
    _stdout_for_dash()
    return sys.stdout.buffer


def _quiet() -> bool:
    ctx = click.get_current_context()
    return bool(ctx.obj and ctx.obj.get("quiet"))


def _import_target_advice(err: NotAStoreError) -> str:
    """``err``'s message with advice for ``import``, which makes a store in a new or empty
    directory itself: one that ``init`` made has default parameters, which an export
    made with others does not fit."""
    return _cli_wording(
        _with_notes(err).replace(
            "with create=True", "(import makes the store there, with the export's parameters)"
        )
    )


@cli.command(name="import")
@click.argument("source", type=_File("rb"))
@click.argument("path", type=click.Path(file_okay=False))
@click.option("--replace", is_flag=True, help="Overwrite documents whose key is stored.")
@_json_option
def import_(source: IO[bytes], path: str, replace: bool, as_json: bool) -> None:
    """Import an export stream ('-' for stdin) into PATH, creating the store if needed.

    A new store takes the export's parameters; an existing one must have the same
    signature configuration (its banding may differ: band keys are recomputed).

    Documents are committed in batches. If the stream is bad part-way (an export cut
    short, say), or on Ctrl-C, a new store is deleted; an existing one keeps the batches
    before it, and the error says how many: once the export is whole, run the same import
    again with --replace to finish.

    \b
    Example:
        neardup-admin import corpus.export ./copy.ndx
        gunzip -c corpus.export.gz | neardup-admin import - ./copy.ndx
    """
    try:
        store = Store.open(path)
    except (StoreNotFoundError, NotAStoreError) as err:
        if isinstance(err, NotAStoreError) and err.found not in (
            UNFINISHED_CREATION,
            EMPTY_DATA_FILE,
        ):
            raise InputError(_import_target_advice(err)) from err
        # (Else an import killed while creating its store: creating it goes on.)
        try:
            with (
                _doc_progress("Importing") as progress,
                Store.create_from_export(path, source, progress=progress) as created,
            ):
                count, created_new = len(created), True
        except NotAStoreError as refused:  # PATH holds other files: no store is made there
            raise InputError(_import_target_advice(refused)) from refused
    else:
        advice = "to finish, run the same import again with --replace, from a whole export"
        with store, _doc_progress("Importing") as progress, _resume_advice(advice):
            count = store.import_(source, replace=replace, progress=progress)
            created_new = False
    where = "new store" if created_new else "store"
    with _summary_of(f"the store was changed: {count} documents imported into {where} {path}"):
        if as_json:
            render.json_line({"imported": count, "created": created_new, "path": path})
        else:
            click.echo(f"Imported {count} documents into {where} {path}.")


@cli.command()
@click.argument("path", type=STORE)
@click.argument("dest", type=click.Path(file_okay=False))
@_json_option
def backup(path: str, dest: str, as_json: bool) -> None:
    """Write a consistent, compacted copy of the store to DEST while it stays in use.

    \b
    Example:
        neardup-admin backup ./corpus.ndx /backups/corpus-2024-06-01.ndx
    """
    with open_store(path, readonly=True) as store, _doc_progress("Copying", len(store)) as progress:
        report = store.backup(dest, progress)
    with _summary_of(f"the backup was written to {dest}"):
        render.render_backup(report, as_json)


# -- Spark ----------------------------------------------------------------------------------------


def _conf_pairs(conf: tuple[str, ...]) -> dict[str, str]:
    """``--conf KEY=VALUE`` options as a dict; a malformed one is a usage error."""
    settings = {}
    for item in conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.UsageError(f"--conf {item!r}: expected KEY=VALUE")
        settings[key] = value
    return settings


@contextlib.contextmanager
def _spark(master: str, conf: tuple[str, ...]) -> Iterator[Any]:
    """A Spark session for the command's block; Spark's own progress bar only on a
    terminal.

    py4j reports a connection that a Ctrl-C broke through ``logging.exception`` on the
    root logger, which, having no handler, made one that printed tracebacks around the
    one ``interrupted`` line: for the block, the root logger gets a handler that drops
    them (the command words its failures itself), and loses it after, so that a program
    running the command in its own process keeps its logging as it was. A Ctrl-C in the
    block stops the session with the JVM's logging off
    (:func:`~neardup_store.spark.runtime.stopped_on_interrupt`)."""
    from .spark import runtime

    settings = {"spark.ui.showConsoleProgress": str(_show_progress()).lower()}
    settings.update(_conf_pairs(conf))
    root, quiet = logging.getLogger(), logging.NullHandler()
    if not root.handlers:
        root.addHandler(quiet)
    try:
        _note(f"starting Spark on {master}")
        session = runtime.spark_session(master, "neardup-admin", settings)
        with runtime.stopped_on_interrupt(session):
            yield session
    finally:
        root.removeHandler(quiet)


def _holds_files(path: Path) -> bool:
    """Whether ``path`` is a directory with anything in it."""
    try:
        return path.is_dir() and any(path.iterdir())
    except OSError:
        return False


def _partial_output_note(out: str, local_out: Path | None, fresh: bool) -> str | None:
    """What a Ctrl-C of spark-dedup leaves to do about ``--out``: delete it, if this run
    is what put files there. ``fresh``: the job found ``--out`` new or empty (a Ctrl-C
    while the inputs were listed, before the job checked ``--out``, must not send anyone
    to delete an earlier run's output). A remote URI is not looked at (its file system is
    Spark's, which the interrupt stops): once checked, it may hold part of the output."""
    if not fresh or (local_out is not None and not _holds_files(local_out)):
        return None
    holds = "may hold" if local_out is None else "holds"
    return (
        f"{out} {holds} part of the output: delete it before running again (a run needs a "
        "new or empty directory)"
    )


_master_option = click.option(
    "--master",
    default="local[*]",
    show_default=True,
    help="Spark master: local, local[N], local[*], spark://host:7077, yarn, k8s://...",
)
_conf_option = click.option(
    "--conf",
    multiple=True,
    metavar="KEY=VALUE",
    help="A Spark setting, e.g. spark.executor.memory=8g (repeatable).",
)


@cli.command(name="spark-dedup")
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@click.option("--out", required=True, help="A new or empty output directory (or URI).")
@_master_option
@_conf_option
@_params_options
@click.option("--id-field", default="id", show_default=True, help="JSON-lines key field.")
@click.option("--text-field", default="text", show_default=True, help="JSON-lines text field.")
@click.option(
    "--partitions", type=click.IntRange(1), default=None, help="Repartition the input first."
)
@click.option(
    "--max-bucket",
    type=click.IntRange(2),
    default=200,
    show_default=True,
    help="Larger buckets are paired through their earliest member only.",
)
@_json_option
def spark_dedup(
    inputs: tuple[str, ...],
    out: str,
    master: str,
    conf: tuple[str, ...],
    id_field: str,
    text_field: str,
    partitions: int | None,
    max_bucket: int,
    as_json: bool,
    **params_options: Any,
) -> None:
    """Deduplicate JSON-lines files on Spark: signatures, pairs, clusters, kept lines.

    Writes to --out: signatures (parquet), pairs, clusters and failed inputs (JSON
    lines), kept (the input lines `dedup` keeps: each line unless a near-duplicate of
    it was kept before it, so a cluster can keep more than one), dropped (the others
    as `dedup --dropped` writes them, with "duplicate_of" and "score"), params.json and
    summary.json. Exits 1 if some lines could not be used (see failed/); 2, before
    the job, if an input or --out cannot be reached (a URI --out must be new or
    empty, as a directory must). Needs the spark extra: pip install
    'neardup_store[spark]'.

    \b
    Example:
        neardup-admin spark-dedup archive.jsonl --out ./dedup-out --threshold 0.8
        neardup-admin spark-dedup hdfs:///corpus/*.jsonl --out hdfs:///dedup-out \\
            --master yarn --partitions 4000 --conf spark.executor.memory=8g
    """
    from .spark import job, pipeline

    store_params = _params_from(params_options)
    local = str(pipeline.local_path(out))  # a file: URI is the directory it names
    local_out = None if "://" in local else Path(local)
    checked = threading.Event()  # set when the job finds --out new or empty: then it is ours
    with _spark(master, conf) as session:
        try:
            report = job.run_dedup(
                session,
                list(inputs),
                out,
                store_params,
                id_field=id_field,
                text_field=text_field,
                max_bucket=max_bucket,
                partitions=partitions,
                on_out_checked=checked.set,
            )
        except KeyboardInterrupt as err:
            note = _partial_output_note(out, local_out, checked.is_set())
            if note:
                err.add_note(note)
            raise
    summary = {
        "documents": report.documents,
        "failed": report.failed,
        "pairs": report.pairs,
        "clusters": report.clusters,
        "kept": report.kept,
        "dropped": report.dropped,
        "large_buckets": report.large_buckets,
        "rounds": report.rounds,
        "out": report.out,
    }
    if as_json:
        render.json_line({"summary": {**summary, "seconds": report.seconds}})
    else:
        click.echo(", ".join(f"{name} {value}" for name, value in summary.items()))
        render.table(("stage", "seconds"), list(report.seconds.items()))
    if report.failed:
        sys.exit(1)


@cli.command(name="spark-load")
@click.argument("out")  # a directory or a URI (file:, hdfs:, ...): load_output checks it
@click.argument("path", type=click.Path(file_okay=False))
@_master_option
@_conf_option
@_batch_size_option
@_json_option
def spark_load(
    out: str,
    path: str,
    master: str,
    conf: tuple[str, ...],
    batch_size: int | Literal["auto"],
    as_json: bool,
) -> None:
    """Bulk-load a spark-dedup output's signatures (OUT: a directory, or the URI given
    to spark-dedup --out) into a new store at PATH.

    Partitions stream to this process one at a time and are written in batches (LMDB
    has one writer); the store is built beside PATH and moved there once it is
    complete and passes `check`, so a failed load leaves nothing at PATH.

    \b
    Example:
        neardup-admin spark-load ./dedup-out ./corpus.ndx
    """
    from .spark import job

    total = None
    with contextlib.suppress(OSError, ValueError, KeyError):
        total = int(json.loads((Path(out) / job.SUMMARY_FILE).read_text())["documents"])
    job.load_target(path)  # refused before Spark starts, not after the load
    with _spark(master, conf) as session, _doc_progress("loading", total) as progress:
        report = job.load_output(session, out, path, batch_size=batch_size, progress=progress)
    summary = {
        "path": report.path,
        "documents": report.documents,
        "batches": report.batches,
        "seconds": report.seconds,
        "check": "ok" if report.check_ok else "failed",
    }
    with _summary_of(f"the store was loaded at {report.path}"):
        if as_json:
            render.json_line({"summary": summary})
        else:
            click.echo(", ".join(f"{name} {value}" for name, value in summary.items()))


# -- demo -----------------------------------------------------------------------------------------


@cli.command()
@click.option(
    "--docs", default=400, show_default=True, type=click.IntRange(2), help="Documents to generate."
)
@click.option(
    "--groups",
    default=40,
    show_default=True,
    type=click.IntRange(0),
    help="Near-duplicate groups to plant.",
)
@click.option(
    "--seed", default=7, show_default=True, type=click.IntRange(0), help="Corpus generator seed."
)
@click.option(
    "--threshold", default=0.7, show_default=True, type=float, help="Jaccard threshold in (0, 1)."
)
@click.option(
    "--num-perm", default=DEFAULT_NUM_PERM, show_default=True, type=int, help="Signature length."
)
@click.option(
    "--scheme", default="oph", show_default=True, type=click.Choice(SCHEMES), help="MinHash scheme."
)
@click.option(
    "--path",
    type=click.Path(file_okay=False),
    default=None,
    help="Keep the demo store here (a new directory) instead of a temporary one.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
def demo(
    docs: int,
    groups: int,
    seed: int,
    threshold: float,
    num_perm: int,
    scheme: str,
    path: str | None,
    as_json: bool,
) -> None:
    """Find near-duplicates in a generated sample corpus (no data needed).

    The corpus is made by neardup_store itself, deterministically from --seed, with
    planted near-duplicate groups; the command indexes it in a real store (temporary
    unless --path is given), reads back the store's near-duplicate clusters and prints
    them next to what was planted.

    \b
    Example:
        neardup-admin demo
        neardup-admin demo --docs 2000 --threshold 0.8 --json
        neardup-admin demo --path ./demo.ndx
    """
    config = MinHashConfig(num_perm=num_perm, scheme=scheme)  # type: ignore[arg-type]
    result = run_demo(docs, groups, seed, threshold, config, path)
    with _summary_of(None if path is None else f"the demo store was kept at {path}"):
        if as_json:
            render.demo_json(result)
        else:
            render.demo_table(result)


def main() -> None:
    """Console-script entry point.

    A Ctrl-C from the moment this module is loaded ends in ``interrupted`` and exit 130
    (:class:`_Group`). One while the package itself is still importing, before this module
    runs, cannot be caught here: that needs an entry point outside the package.

    With standard error closed (``2>&-``), messages for it go nowhere: Click would print
    its errors on standard output instead, in the middle of JSON lines. The exit code
    still tells.
    """
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115  # for the process's lifetime
    cli(prog_name="neardup-admin")
