"""The package's errors as values: they pickle whole, so they cross process boundaries."""

from __future__ import annotations

import errno
import inspect
import os
import pickle
import re
import signal
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import pytest

from neardup_store import Store, errors
from neardup_store.errors import (
    InvalidParameterError,
    KeyNotFoundError,
    NeardupError,
    OutputWriteError,
    ParamsMismatchError,
)
from neardup_store.lsh import LSHParams, choose_params
from neardup_store.minhash import MinHashConfig
from neardup_store.similarity import bag_jaccard
from neardup_store.text import ShingleConfig

_SAMPLES = {"str": "a/b", "object": b"v", "int": 7, "int | None": 3, "bool": True}


def _made(cls: type[NeardupError]) -> NeardupError:
    """An instance of ``cls`` with a made-up value for each required argument."""
    args: list[object] = []
    for param in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if param.default is not param.empty:
            continue
        annotation = str(param.annotation)
        if annotation.startswith("tuple"):
            args.append((1, 2))
        elif annotation.startswith("dict"):
            args.append({"num_perm": (128, 64)})
        else:
            args.append(_SAMPLES[annotation])
    return cls(*args)


_ERRORS = [
    cls
    for cls in vars(errors).values()
    if inspect.isclass(cls) and issubclass(cls, NeardupError) and "__init__" in vars(cls)
]


@pytest.mark.parametrize("cls", _ERRORS, ids=lambda cls: cls.__name__)
def test_every_error_pickles_as_itself(cls: type[NeardupError]) -> None:
    """Python's default pickled only the message, which these constructors do not take:
    16 of the 29 classes failed to unpickle, the others came back with the message
    doubled (a review's finding)."""
    error = _made(cls)
    error.add_note("committed before it: 3 batches")
    if isinstance(error, errors.DocumentError):
        error.index = 4  # set by a batched call after the error was made
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is cls
    assert str(error) and str(again) == str(error) and again.__notes__ == error.__notes__
    assert vars(again) == vars(error)


def _open_with_conflicting_params(path: str) -> None:
    Store.open(path, num_perm=64).close()


def test_a_workers_error_reaches_the_parent_typed(tmp_path: Path) -> None:
    """A worker's ParamsMismatchError broke the whole pool (BrokenProcessPool)."""
    Store.open(tmp_path / "s", create=True, num_perm=128).close()
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        future = pool.submit(_open_with_conflicting_params, str(tmp_path / "s"))
        with pytest.raises(ParamsMismatchError, match="num_perm") as raised:
            future.result(timeout=120)
    assert raised.value.conflicts == {"num_perm": (128, 64)}


def test_get_of_a_missing_key_advises_what_get_takes(tmp_path: Path) -> None:
    """The advice was "pass missing_ok=True", which get() does not take."""
    with Store.open(tmp_path / "s", create=True) as store:
        with pytest.raises(KeyNotFoundError) as raised:
            store.get("absent")
        assert "missing_ok" not in str(raised.value) and "in store" in str(raised.value)
        with pytest.raises(KeyNotFoundError, match="missing_ok=True"):
            store.remove("absent")


def test_numpy_numbers_are_accepted_where_numbers_are(tmp_path: Path) -> None:
    """np.int64(128) was refused as "not an integer", np.float32(0.5) as "not a number in
    (0, 1]" (review findings). They are taken, and kept as plain Python numbers."""
    config = MinHashConfig(num_perm=np.int64(64), seed=np.uint64(7))
    shingles = ShingleConfig(size=np.int32(4))
    banding = LSHParams(np.int64(8), np.int64(8))
    assert (config.num_perm, config.seed, shingles.size, banding.bands, banding.rows) == (
        64,
        7,
        4,
        8,
        8,
    )
    assert all(
        type(value) is int
        for value in (config.num_perm, config.seed, shingles.size, banding.bands, banding.rows)
    )
    with Store.open(
        tmp_path / "s", create=True, num_perm=np.int64(64), bands=np.int64(8), rows=np.int64(8)
    ) as store:
        store.add_many([("a", "one document here"), ("b", "another text altogether")])
        matches = store.query("one document here", threshold=np.float32(0.5), limit=np.int64(1))
        assert [m.key for m in matches] == ["a"]
    with pytest.raises(InvalidParameterError):
        MinHashConfig(num_perm=np.float64(64.0))


def test_numpy_numbers_are_taken_by_choose_params_stats_and_batch_sizes(tmp_path: Path) -> None:
    """The first fix left choose_params, stats(largest=) and batch_size= refusing them."""
    assert choose_params(np.float32(0.8), np.int64(128)) == choose_params(0.8, 128)
    assert choose_params(0.8, 128, np.float64(1), np.float32(1)) == choose_params(0.8, 128, 1, 1)
    with Store.open(tmp_path / "s", create=True) as store:
        assert store.add_many([("a", "one text"), ("b", "one text")], batch_size=np.int64(1)) == 2
        assert len(store.stats(largest=np.int32(1)).largest_buckets) == 1


_KILLED_EXPORT = """
import os, signal, sys
from neardup_store import Store
with Store.open(sys.argv[1], read_only=True) as store:
    store.export_file(sys.argv[2], progress=lambda done: os.kill(os.getpid(), signal.SIGKILL))
"""


def test_an_export_to_a_long_name_is_written_and_the_next_deletes_a_killed_ones_partial(
    tmp_path: Path,
) -> None:
    """A name of 241-255 bytes, which the file system accepts, failed: the temporary name
    beside it was 15 bytes longer, too long (a review's finding). Partials named as earlier
    releases named them are still deleted."""
    with Store.open(tmp_path / "s", create=True, num_perm=16) as store:
        store.add_many([("a", "some text here"), ("b", "another text there")])
    exports = tmp_path / "exports"
    exports.mkdir()
    long = exports / ("e" * 245)
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_EXPORT, str(tmp_path / "s"), str(long)], timeout=120
    )
    assert killed.returncode == -signal.SIGKILL
    (left,) = exports.iterdir()
    assert len(os.fsencode(left.name)) <= 64 and not long.exists()
    middling = exports / ("m" * 60)  # a partial of 71 bytes or more, as earlier releases made
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    older = exports / f".{middling.name}.partial-{gone.stdout.strip()}"
    older.write_bytes(b"")
    with Store.open(tmp_path / "s", read_only=True) as store:
        assert store.export_file(long) == 2 and store.export_file(middling) == 2
    assert sorted(p.name for p in exports.iterdir()) == sorted([long.name, middling.name])
    with long.open("rb") as stream, Store.create_from_export(tmp_path / "copy", stream) as copy:
        assert sorted(copy) == ["a", "b"]


def test_an_export_whose_cleanup_fails_too_raises_the_typed_error_of_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failing unlink of the temporary file replaced the OutputWriteError with its own
    raw OSError, about a file the caller never named (a review's finding)."""

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def refused(path: Path, missing_ok: bool = False) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    with Store.open(tmp_path / "s", create=True, num_perm=16) as store:
        store.add("a", "some text here")
        monkeypatch.setattr(os, "fsync", full)
        monkeypatch.setattr(Path, "unlink", refused)
        with pytest.raises(OutputWriteError) as raised:
            store.export_file(tmp_path / "out.export")
    assert raised.value.detail == os.strerror(errno.ENOSPC)
    assert not (tmp_path / "out.export").exists()


_CHOICES = {
    "kind": (lambda value: ShingleConfig(kind=value, size=3), "word"),
    "scheme": (lambda value: MinHashConfig(scheme=value), "kperm"),
    "keys": (lambda value: LSHParams(4, 4, keys=value), "fold"),
    "union": (lambda value: bag_jaccard(["a", "a"], ["a"], union=value), "max"),
}


@pytest.mark.parametrize("name", sorted(_CHOICES))
def test_a_choice_among_strings_takes_a_str_and_no_numpy_array(name: str) -> None:
    """``np.array("word") in ("char", "word", ...)`` is numpy's element-wise comparison:
    a 0-d array (or a one-element one) equal to a choice passed and was kept, unhashable
    and unencodable (Store.open then failed raw in msgpack, leaving files), and a longer
    one raised numpy's raw "truth value is ambiguous" (review 44). numpy's ``str_``,
    which arrays hand out, is taken as the plain ``str``."""
    make, good = _CHOICES[name]
    for bad in (np.array(good), np.array([good]), np.array([good, good]), None):
        with pytest.raises(InvalidParameterError, match=f"^{name}=.*a str, one of"):
            make(bad)
    made, plain = make(np.str_(good)), make(good)
    assert made == plain
    if name != "union":
        assert type(getattr(made, name)) is str and hash(made) == hash(plain)


class _FsPath:
    """An ``os.PathLike`` whose path is given."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __fspath__(self) -> str:
        return self.path


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("a\x00b", "without a NUL character"),
        (_FsPath("dir/\x00"), "without a NUL character"),
        ("\ud800x", r"the file name encoding \(utf-8\) can represent, which '\\ud800' is not"),
    ],
)
def test_path_of_refuses_a_path_the_file_system_cannot_name(path: object, fragment: str) -> None:
    """A NUL or a lone surrogate reached the first file system call of Store.open, backup
    and export_file, which raised a raw ValueError or UnicodeEncodeError (review 44). An
    undecodable byte that Python holds as a surrogate escape (U+DC80-U+DCFF) is a name."""
    if "utf-8" in fragment and sys.getfilesystemencoding() != "utf-8":
        pytest.skip("the message names this system's file name encoding")
    with pytest.raises(InvalidParameterError, match=f"^path=.*{fragment}"):
        errors.path_of(path)
    assert errors.path_of("a\udcffb") == Path(os.fsdecode(b"a\xffb"))


def _raises_section(function: object) -> str:
    doc = inspect.getdoc(function) or ""
    return doc.split("Raises:", 1)[1] if "Raises:" in doc else ""


def test_raises_sections_name_what_bad_input_raises(tmp_path: Path) -> None:
    """Store.open, WriteTxn.add and ReadTxn.query raised errors for bad input that their
    "Raises:" sections did not name (review 53). Each error raised here must be named
    there, itself or as a base class of the package's."""
    from neardup_store.txn import ReadTxn, WriteTxn

    store = Store.open(tmp_path / "s", create=True, num_perm=64)
    store.add("a", "the quick brown fox jumps over the lazy dog")
    cases = [
        (Store.open, lambda: Store.open(tmp_path / "n", create=True, threshold=2)),
        (Store.open, lambda: Store.open(tmp_path / "s")),  # a second open in this process
        (WriteTxn.add, lambda: store.add("b", b"\xff", encoding="utf-8")),
        (WriteTxn.add, lambda: store.add("b", signature=["x"] * 64)),
        (WriteTxn.add, lambda: store.add("b", "text", signature=[1] * 64)),
        (ReadTxn.query, lambda: store.query("   ")),
        (ReadTxn.query, lambda: store.query(b"bytes")),
        (ReadTxn.query, lambda: store.query(b"\xff", encoding="utf-8")),
        (ReadTxn.query, lambda: store.query(signature=[-1] * 64)),
    ]
    unnamed = []
    try:
        for function, call in cases:
            with pytest.raises(NeardupError) as raised:
                call()
            section = _raises_section(function)
            named = [
                cls.__name__
                for cls in type(raised.value).__mro__
                if issubclass(cls, NeardupError) and cls is not NeardupError
                if re.search(rf"\b{cls.__name__}\b", section)
            ]
            if not named:
                unnamed.append((function.__qualname__, type(raised.value).__name__))
    finally:
        store.close()
    assert unnamed == []
