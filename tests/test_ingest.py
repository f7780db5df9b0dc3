"""Input readers, batched ingest and resumable dedup, on real stores under tmp_path."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import read_error_at_call

from neardup_store import Store
from neardup_store import ingest as ingest_module
from neardup_store.demo import make_corpus
from neardup_store.errors import InvalidParameterError
from neardup_store.ingest import (
    BatchProgress,
    DedupBusyError,
    DedupStateError,
    Failure,
    Interrupted,
    Record,
    check_dedup_paths,
    dedup,
    ingest,
    progress_path,
    read_inputs,
)


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(store_path: Path) -> Iterator[Store]:
    with Store.open(store_path, create=True, threshold=0.7) as opened:
        yield opened


@pytest.fixture(scope="module")
def archive_lines() -> list[str]:
    """The demo corpus (12 planted groups) as JSON lines, in key order, with metadata."""
    corpus = make_corpus(120, 12, seed=1)
    return [
        json.dumps({"id": key, "text": text, "n": i})
        for i, (key, text) in enumerate(corpus.documents.items())
    ]


@pytest.fixture
def archive(tmp_path: Path, archive_lines: list[str]) -> Path:
    path = tmp_path / "archive.jsonl"
    path.write_text("\n".join(archive_lines) + "\n", encoding="utf-8")
    return path


def _write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _split(items: list[Record | Failure]) -> tuple[list[Record], list[Failure]]:
    return (
        [i for i in items if isinstance(i, Record)],
        [i for i in items if isinstance(i, Failure)],
    )


# -- readers ---------------------------------------------------------------------------------


def test_plain_file_is_one_record_keyed_by_path(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("héllo world", encoding="utf-8")
    assert list(read_inputs([path])) == [Record(str(path), "héllo world", None, str(path))]


def test_invalid_utf8_file_is_a_failure_not_an_exception(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok \xff\xfe not utf-8")
    good = tmp_path / "good.txt"
    good.write_text("fine", encoding="utf-8")
    records, failures = _split(list(read_inputs([bad, good])))
    assert [r.key for r in records] == [str(good)]
    assert [f.source for f in failures] == [str(bad)]
    assert "not valid utf-8 at byte 3" in failures[0].reason


def test_other_encoding_is_honoured(tmp_path: Path) -> None:
    path = tmp_path / "latin.txt"
    path.write_bytes("café".encode("latin-1"))
    (record,) = read_inputs([path], encoding="latin-1")
    assert isinstance(record, Record) and record.text == "café"


def test_missing_path_is_a_failure(tmp_path: Path) -> None:
    assert list(read_inputs([tmp_path / "nope"])) == [
        Failure(str(tmp_path / "nope"), "no such file or directory")
    ]


def test_directory_is_walked_recursively_sorted_and_filtered(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    for name in ["b.txt", "a.txt", "skip.md", "sub/c.txt", "sub/deeper/d.md", "sub/e.log"]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name, encoding="utf-8")
    keys = [r.key for r in read_inputs([root], include=["*.txt", "sub/deeper/*"])]
    assert keys == [str(root / n) for n in ["a.txt", "b.txt", "sub/c.txt", "sub/deeper/d.md"]]
    assert len(list(read_inputs([root]))) == 6


def test_jsonl_fields_and_metadata(tmp_path: Path) -> None:
    path = _write_jsonl(
        tmp_path / "in.jsonl",
        [{"doc": "a", "body": "text a", "lang": "en"}, {"doc": 7, "body": "text b"}],
    )
    records = list(read_inputs([path], jsonl=True, id_field="doc", text_field="body"))
    assert records == [
        Record("a", "text a", {"lang": "en"}, f"{path}:1"),
        Record("7", "text b", None, f"{path}:2"),
    ]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"id": "x", "text": ', "malformed JSON (Expecting value at column 21)"),
        (b'["id", "text"]', "expected a JSON object, got list"),
        (b'{"text": "no id"}', "missing field 'id'"),
        (b'{"id": "x"}', "missing field 'text'"),
        (b'{"id": "x", "text": 5}', "field 'text' must be a string, not a number"),
        (b'{"id": null, "text": "t"}', "field 'id' must be a string or integer"),
        (b'{"id": "x", "text": "\xff"}', "not valid utf-8"),
    ],
)
def test_bad_jsonl_line_is_a_failure_with_its_line_number(
    tmp_path: Path, line: bytes, reason: str
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"id": "ok", "text": "fine"}\n\n' + line + b"\n")
    records, failures = _split(list(read_inputs([path], jsonl=True)))
    assert [r.key for r in records] == ["ok"]
    assert len(failures) == 1 and failures[0].source == f"{path}:3"
    assert reason in failures[0].reason


@pytest.mark.parametrize("jsonl", [False, True])
def test_stdin(monkeypatch: pytest.MonkeyPatch, jsonl: bool) -> None:
    data = b'{"id": "s1", "text": "from stdin"}\n'
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    (record,) = read_inputs(["-"], jsonl=jsonl)
    assert isinstance(record, Record)
    if jsonl:
        assert (record.key, record.text) == ("s1", "from stdin")
    else:
        assert (record.key, record.text) == ("-", data.decode())


class _FailsAfter(io.RawIOBase):
    """A stream that gives ``data`` and then fails to read, as a failing disk, NFS or FUSE
    does (EIO), however often it is asked again."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._data:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        size = min(len(buffer), len(self._data))
        buffer[:size], self._data = self._data[:size], self._data[size:]
        return size


def test_json_lines_that_fail_to_read_part_way_keep_the_lines_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read error part-way through JSON lines escaped the reader as a bare OSError,
    which the CLI printed as a traceback (review 45): it is the input's failure, after
    the lines read before it."""
    data = b'{"id": "a", "text": "read before the error"}\n{"id": "b", "te'
    stream = io.TextIOWrapper(io.BufferedReader(_FailsAfter(data), buffer_size=16))
    monkeypatch.setattr(sys, "stdin", stream)
    records, failures = _split(list(read_inputs(["-"], jsonl=True)))
    assert [r.key for r in records] == ["a"]
    assert failures == [Failure("-", "cannot read it: Input/output error", "-")]
    assert failures[0].error == "OSError"


def _refusing_to_list(monkeypatch: pytest.MonkeyPatch, denied: Path) -> None:
    """``os.scandir`` of ``denied`` fails as a directory without read permission does,
    whoever runs the test (root reads any directory)."""
    scandir = os.scandir

    def refusing(path: Any = ".") -> Any:
        if Path(os.fsdecode(path)) == denied:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)


@pytest.mark.parametrize("denied", ["docs/sub", "docs"])
def test_a_directory_that_cannot_be_listed_is_a_failure_in_walk_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, denied: str
) -> None:
    """os.walk drops listing errors unless asked: a directory add could not list was
    left out in silence, "failed 0" (review 45)."""
    root = tmp_path / "docs"
    for name in ["a.txt", "sub/b.txt", "z.txt"]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"the text of {name}", encoding="utf-8")
    _refusing_to_list(monkeypatch, tmp_path / denied)
    items = list(read_inputs([root]))
    failure = Failure(str(tmp_path / denied), "cannot read it: Permission denied")
    if denied == "docs":
        assert items == [failure]
    else:
        assert items[0].key == str(root / "a.txt") and items[2].key == str(root / "z.txt")
        assert items[1] == failure and items[1].error == "PermissionError"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_walk_reports_what_is_no_regular_file_without_opening_it(tmp_path: Path) -> None:
    """Opening a named pipe met on a walk waited for a writer for ever (review 45); a
    broken symbolic link is still opened, and so reported by the error it gives."""
    root = tmp_path / "docs"
    root.mkdir()
    (root / "a.txt").write_text("a regular file", encoding="utf-8")
    os.mkfifo(root / "pipe")
    (root / "gone").symlink_to(root / "missing.txt")
    walked = list(ingest_module.walk_inputs(root, ("*",)))
    assert walked[0] == root / "a.txt" and walked[1] == root / "gone"
    assert isinstance(walked[2], Failure) and walked[2].file == str(root / "pipe")
    assert walked[2].reason.startswith("a named pipe, not a regular file")
    assert list(ingest_module.walk_directory(root, ("*",))) == walked[:2]


# -- ingest ----------------------------------------------------------------------------------


def test_ingest_counts_added_replaced_skipped_failed(
    store: Store, near_dup_corpus: dict[str, str]
) -> None:
    first = ingest(store, list(near_dup_corpus.items())[:3], batch_size=2)
    assert (first.added, first.replaced, first.batches_committed) == (3, 0, 2)
    items: list[Any] = [
        ("storm-a", near_dup_corpus["storm-a"]),  # exists: skipped
        ("recipe-b", near_dup_corpus["recipe-b"], {"n": 1}),
        ("recipe-b", near_dup_corpus["recipe-b"]),  # repeated within the batch
        ("", "empty key"),
        ("blank", "   "),
        ("meta", "bad metadata", {"x": object()}),
        Failure("f.txt", "not valid utf-8"),
    ]
    report = ingest(store, items, batch_size=100)
    assert (report.added, report.replaced, report.batches_committed) == (1, 0, 1)
    assert [(s.key, s.reason) for s in report.skipped] == [
        ("storm-a", "key already in the store"),
        ("recipe-b", "key already in the store"),
    ]
    assert [f.source for f in report.failed] == ["f.txt", "", "meta", "blank"]
    assert store.get("recipe-b").metadata == {"n": 1}
    assert len(store) == 4

    again = ingest(store, [("storm-a", "new text for storm a"), ("new", "x y z")], replace=True)
    assert (again.added, again.replaced, again.skipped) == (1, 1, [])
    assert store.query("new text for storm a")[0].key == "storm-a"


def test_ingest_reads_files(store: Store, tmp_path: Path) -> None:
    for name in ["a.txt", "b.txt"]:
        (tmp_path / name).write_text(f"contents of {name} " * 5, encoding="utf-8")
    (tmp_path / "c.txt").write_bytes(b"\xff")
    report = ingest(store, read_inputs([tmp_path], include=["*.txt"]))
    assert report.added == 2 and [f.source for f in report.failed] == [str(tmp_path / "c.txt")]


def test_unique_skips_near_duplicates_in_store_and_in_input(
    store: Store, near_dup_corpus: dict[str, str]
) -> None:
    store.add("storm-a", near_dup_corpus["storm-a"])
    items = [
        ("storm-b", near_dup_corpus["storm-b"]),  # duplicates the stored storm-a
        ("recipe-a", near_dup_corpus["recipe-a"]),
        ("unrelated", near_dup_corpus["unrelated"]),
        ("recipe-b", near_dup_corpus["recipe-b"]),  # duplicates recipe-a, earlier in the input
        ("storm-a", "a different text under a taken key, long enough to shingle"),
    ]
    report = ingest(store, items, unique=True, batch_size=2)
    assert report.added == 2
    assert [(s.key, s.reason, s.matching_keys) for s in report.skipped] == [
        ("storm-b", "near-duplicate", ["storm-a"]),
        ("recipe-b", "near-duplicate", ["recipe-a"]),
        ("storm-a", "key already in the store", []),
    ]
    assert sorted(store) == ["recipe-a", "storm-a", "unrelated"]


def test_auto_batches_follow_the_store_and_sign_a_part_at_a_time(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from neardup_store import store as store_module

    monkeypatch.setattr(store_module, "MIN_TRANSACTION", 4)
    monkeypatch.setattr(ingest_module, "MIN_TRANSACTION", 4)
    signed: list[int] = []
    kept: list[str] = []
    sign = ingest_module._sign

    def counting(store: Store, records: list[Record]) -> Any:
        signed.append(len(records))
        return sign(store, records)

    def plain(txn: Any, batch: list[Any], replace: bool) -> Any:
        kept.extend(doc.record.text for doc in batch)
        return add_plain(txn, batch, replace)

    add_plain = ingest_module._add_plain
    monkeypatch.setattr(ingest_module, "_sign", counting)
    monkeypatch.setattr(ingest_module, "_add_plain", plain)
    items: list[Any] = [(f"k{i}", f"document number {i} with some words") for i in range(60)]
    items[57] = Failure("bad.txt", "unreadable")
    seen: list[BatchProgress] = []
    report = ingest(store, items, on_batch=seen.append)
    # Transactions of 4 while fewer than 50 are stored, then a tenth: 52 -> 5, 57 -> 3 left.
    assert [p.records for p in seen] == [*range(4, 53, 4), 57, 60]
    assert signed == [4] * 13 + [4, 1, 2]  # 3 read in the last part, one a failure
    assert (report.added, [f.source for f in report.failed]) == (59, ["bad.txt"])
    assert set(kept) == {""}  # only signatures are held until the transaction
    assert store.get("k58").signature.tolist() == store.hasher.signature(items[58][1]).tolist()
    with pytest.raises(InvalidParameterError, match="auto"):
        ingest(store, [], batch_size=0)


def test_unique_with_replace_is_refused(store: Store) -> None:
    with pytest.raises(InvalidParameterError, match="replace"):
        ingest(store, [], unique=True, replace=True)


def test_interrupt_after_batch_two_leaves_two_batches(store: Store) -> None:
    items = [(f"k{i}", f"document number {i} with some words") for i in range(50)]
    seen: list[BatchProgress] = []

    def stop_after_two(progress: BatchProgress) -> None:
        seen.append(progress)
        if progress.batches_committed == 2:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted) as caught:
        ingest(store, items, batch_size=10, on_batch=stop_after_two)
    assert caught.value.batches_committed == 2 == caught.value.report.batches_committed
    assert caught.value.report.added == 20
    assert str(caught.value) == "interrupted: 2 batches committed, nothing half-applied"
    assert isinstance(caught.value, KeyboardInterrupt)
    assert sorted(store, key=lambda k: int(str(k)[1:])) == [f"k{i}" for i in range(20)]
    assert [p.records for p in seen] == [10, 20]


def test_interrupt_inside_a_batch_commits_nothing_of_it(store: Store) -> None:
    def items() -> Iterator[tuple[str, str]]:
        for i in range(25):
            if i == 15:
                raise KeyboardInterrupt
            yield (f"k{i}", f"document number {i} with some words")

    with pytest.raises(Interrupted) as caught:
        ingest(store, items(), batch_size=10)
    assert caught.value.batches_committed == 1 and len(store) == 10


# -- dedup -----------------------------------------------------------------------------------


def _dedup(store: Store, archive: Path, out: Path, **options: Any) -> Any:
    return dedup(store, archive, out / "keep.jsonl", out / "dropped.jsonl", **options)


def _assert_as_uninterrupted(report: Any, out: Path, expected: Any, reference: Path) -> None:
    """A resumed run's report and outputs equal those of :func:`_reference_run`."""
    assert (report.kept, report.dropped, report.failed) == (
        expected.kept,
        expected.dropped,
        expected.failed,
    )
    for name in ["keep.jsonl", "dropped.jsonl"]:
        assert (out / name).read_bytes() == (reference / name).read_bytes()


def _reference_run(tmp_path: Path, archive: Path, **options: Any) -> tuple[Any, Path]:
    """An uninterrupted dedup of ``archive`` into a fresh store: its report, and the
    directory of its outputs, which an interrupted and resumed run must equal."""
    reference = tmp_path / "reference"
    reference.mkdir()
    with Store.open(tmp_path / "s1", create=True, threshold=0.7) as fresh:
        return _dedup(fresh, archive, reference, **options), reference


@pytest.mark.parametrize(
    "clash",
    [
        "keep is the input",
        "dropped is keep",
        "hard link",
        "dropped is the progress file",
        "keep in the store",
    ],
)
def test_dedup_refuses_outputs_that_would_destroy_a_file_it_needs(
    store: Store, archive: Path, clash: str
) -> None:
    """A fresh start empties its outputs: naming the input as one emptied the archive and
    reported a clean empty run (a review's finding). Nothing is touched now."""
    out = archive.parent
    keep, dropped = out / "keep.jsonl", out / "dropped.jsonl"
    if clash == "keep is the input":
        keep = archive
    elif clash == "dropped is keep":
        dropped = keep
    elif clash == "hard link":
        os.link(archive, out / "linked.jsonl")
        dropped = out / "linked.jsonl"
    elif clash == "dropped is the progress file":
        dropped = progress_path(keep)
    else:
        keep = Path(store.path) / "data.mdb"
    before = {p: p.read_bytes() for p in [archive, Path(store.path) / "data.mdb"]}
    with pytest.raises(InvalidParameterError, match=r"a file other than|outside the store"):
        dedup(store, archive, keep, dropped)
    assert {p: p.read_bytes() for p in before} == before
    assert not (out / "keep.jsonl").exists() or clash == "keep in the store"


def test_json_lines_in_utf8_sig_are_read(tmp_path: Path) -> None:
    """The check that a newline is the byte 0x0a encoded it alone, byte-order mark
    included, and refused utf-8-sig, the usual way to read files that start with one."""
    path = tmp_path / "bom.jsonl"
    path.write_bytes(
        '{"id": "a", "text": "café au lait"}\n{"id": "b", "text": "x"}\n'.encode("utf-8-sig")
    )
    records = list(read_inputs([path], jsonl=True, encoding="utf-8-sig"))
    assert [(r.key, r.text) for r in records] == [("a", "café au lait"), ("b", "x")]


def test_dedup_reads_a_last_line_too_deep_to_parse_as_one_failure(
    store: Store, archive: Path, archive_lines: list[str]
) -> None:
    """Without a final newline, the check for an unfinished line met RecursionError and
    the run died on it, every time (a review of the nesting fix)."""
    archive.write_text("\n".join(archive_lines[:5]) + "\n" + "[" * 100_000 + "]" * 100_000)
    report = _dedup(store, archive, archive.parent)
    assert [(f.line, f.error) for f in report.failed] == [(6, "RecursionError")]
    assert report.held_back_bytes == 0


def test_dedup_keeps_first_of_each_planted_group(store: Store, archive: Path) -> None:
    corpus = make_corpus(120, 12, seed=1)
    out = archive.parent
    report = _dedup(store, archive, out, batch_size=25)
    kept = (out / "keep.jsonl").read_text(encoding="utf-8").splitlines()
    dropped = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]
    assert (report.kept, report.dropped, report.failed, report.resumed_from) == (
        len(kept),
        len(dropped),
        [],
        None,
    )
    assert report.kept + report.dropped == 120 and report.batches_committed == 5
    group_of = {key: i for i, group in enumerate(corpus.planted) for key in group}
    for row in dropped:
        assert group_of[row["id"]] == group_of[row["duplicate_of"]]
        assert row["duplicate_of"] < row["id"]  # the input is in key order: first one wins
        assert 0.7 <= row["score"] <= 1.0 and "n" in row
    copies = sum(len(group) - 1 for group in corpus.planted)
    assert copies - 2 <= len(dropped) <= copies
    kept_ids = [json.loads(line)["id"] for line in kept]
    assert all(group[0] in kept_ids for group in corpus.planted)
    assert len(store) == report.kept
    # A finished job is not redone.
    assert _dedup(store, archive, out, batch_size=25).kept == report.kept


def test_dedup_names_a_stored_bytes_key_as_the_cli_prints_it(store: Store, tmp_path: Path) -> None:
    """A line matching a document stored through the API under a bytes key crashed the
    run in json.dumps (a review's note); it is named as every output names a bytes key."""
    text = "a document stored through the Python API under a bytes key " * 4
    store.add(b"\x00\xff", text)
    archive = tmp_path / "in.jsonl"
    archive.write_text(json.dumps({"id": "copy", "text": text}) + "\n", encoding="utf-8")
    report = _dedup(store, archive, tmp_path)
    (row,) = [json.loads(line) for line in (tmp_path / "dropped.jsonl").read_text().splitlines()]
    assert report.dropped == 1 and row["duplicate_of"] == "hex:00ff" and row["id"] == "copy"
    # A line whose str key is stored names it as the output does: 'hex:00ff' as a str key
    # is '\\hex:00ff' (written as it was, it read back as the bytes key above).
    store.add("hex:00ff", "another document, stored under a str key that reads as hex " * 4)
    line = {
        "id": "hex:00ff",
        "text": "another document, stored under a str key that reads as hex " * 4,
    }
    again = tmp_path / "again"
    again.mkdir()
    archive.write_text(json.dumps(line) + "\n", encoding="utf-8")
    _dedup(store, archive, again)
    (row,) = [json.loads(line) for line in (again / "dropped.jsonl").read_text().splitlines()]
    assert row["duplicate_of"] == "\\hex:00ff"


def test_dedup_resumes_to_the_same_outputs(
    tmp_path: Path, archive: Path, archive_lines: list[str]
) -> None:
    # Failures and blank lines must survive the resume too.
    archive.write_text(
        "\n".join([*archive_lines[:30], "", "{not json", *archive_lines[30:]]) + "\n"
    )
    expected, reference = _reference_run(tmp_path, archive, batch_size=16)

    resumed = tmp_path / "resumed"
    resumed.mkdir()

    def stop_at_four(progress: BatchProgress) -> None:
        if progress.batches_committed == 4:
            raise KeyboardInterrupt

    with Store.open(tmp_path / "s2", create=True, threshold=0.7) as store:
        with pytest.raises(Interrupted) as caught:
            _dedup(store, archive, resumed, batch_size=16, on_batch=stop_at_four)
        assert caught.value.batches_committed == 4
        # Leftovers of an uncommitted batch are cut off on resume.
        with (resumed / "keep.jsonl").open("ab") as keep:
            keep.write(b'{"half": "written"}\n')
        report = _dedup(store, archive, resumed, batch_size=16)
    assert report.resumed_from is not None and report.resumed_from > 0
    assert (report.kept, report.dropped, report.failed) == (
        expected.kept,
        expected.dropped,
        expected.failed,
    )
    assert len(expected.failed) == 1 and "malformed JSON" in expected.failed[0].reason
    for name in ["keep.jsonl", "dropped.jsonl"]:
        assert (resumed / name).read_bytes() == (reference / name).read_bytes()


def test_dedup_input_that_fails_part_way_names_itself_and_resumes(
    tmp_path: Path, archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read error on the input part-way was a bare OSError, which the CLI printed as a
    traceback (review 45): it names the input and says what is committed, and the same
    job then resumes to the outputs of an uninterrupted run."""
    expected, reference = _reference_run(tmp_path, archive, batch_size=16)
    out = tmp_path / "out"
    out.mkdir()
    with Store.open(tmp_path / "s2", create=True, threshold=0.7) as store:
        failing = read_error_at_call(ingest_module._read_lines, 3)
        monkeypatch.setattr(ingest_module, "_read_lines", failing)
        with pytest.raises(OSError, match="Input/output error") as caught:
            _dedup(store, archive, out, batch_size=16)
        assert caught.value.filename == str(archive.resolve())
        assert caught.value.__notes__ == [
            "nothing of the batch being read was committed, any batches before it were: "
            "once the input can be read, run the same command again to resume after them"
        ]
        assert len(store) == sum(1 for _ in (out / "keep.jsonl").open()) > 0
        monkeypatch.undo()
        report = _dedup(store, archive, out, batch_size=16)
    assert report.resumed_from == 32
    _assert_as_uninterrupted(report, out, expected, reference)


def test_dedup_refuses_an_input_whose_start_cannot_be_read_before_creating_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, archive: Path
) -> None:
    """An input that opened but failed its first read (here as a failing disk would)
    was refused only after the CLI had made the store and the outputs (review 45)."""
    opened = Path.open

    def failing(path: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        stream = opened(path, mode, *args, **kwargs)
        if path == archive.resolve() and "r" in mode:
            stream.close()
            return io.BufferedReader(_FailsAfter(b""))
        return stream

    monkeypatch.setattr(Path, "open", failing)
    with pytest.raises(InvalidParameterError, match="a file that can be read") as caught:
        check_dedup_paths(archive, tmp_path / "k.jsonl", tmp_path / "d.jsonl", tmp_path / "s")
    assert "(it gives: Input/output error)" in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["archive.jsonl"]


@pytest.mark.parametrize("committed", [False, True])
def test_dedup_interrupted_around_the_commit_resumes_exactly(
    tmp_path: Path, archive: Path, monkeypatch: pytest.MonkeyPatch, committed: bool
) -> None:
    """Ctrl-C after the sidecar marks batch 2 pending: before the store commits it
    (``committed=False``) or after (``True``). The probe key decides; outputs match."""
    _, reference = _reference_run(tmp_path, archive, batch_size=40)

    real_save = ingest_module._save_state
    calls: list[bool] = []

    def interrupting_save(*args: Any, **kwargs: Any) -> None:
        pending = args[3] is not None
        calls.append(pending)
        if committed and not pending and len(calls) == 4:  # batch 2's "committed" save
            raise KeyboardInterrupt
        real_save(*args, **kwargs)
        if not committed and pending and len(calls) == 3:  # batch 2 pending, inside its txn
            raise KeyboardInterrupt

    out = tmp_path / "out"
    out.mkdir()
    with Store.open(tmp_path / "s2", create=True, threshold=0.7) as store:
        monkeypatch.setattr(ingest_module, "_save_state", interrupting_save)
        with pytest.raises(Interrupted):
            _dedup(store, archive, out, batch_size=40)
        monkeypatch.setattr(ingest_module, "_save_state", real_save)
        assert len(store) == (
            _expected_kept_after(reference, archive, 80)
            if committed
            else _expected_kept_after(reference, archive, 40)
        )
        state = json.loads(progress_path(out / "keep.jsonl").read_text())
        assert state["pending"] is not None and state["probe_key"] is not None
        _dedup(store, archive, out, batch_size=40)
    for name in ["keep.jsonl", "dropped.jsonl"]:
        assert (out / name).read_bytes() == (reference / name).read_bytes()


def _expected_kept_after(reference: Path, archive: Path, lines: int) -> int:
    """How many of the first ``lines`` archive records the reference run kept."""
    first = {json.loads(x)["id"] for x in archive.read_text().splitlines()[:lines]}
    return sum(json.loads(x)["id"] in first for x in (reference / "keep.jsonl").open())


@pytest.mark.parametrize("batch_size", [0, -3, True, "auto", 2.5])
def test_dedup_refuses_a_bad_batch_size_before_writing(
    store: Store, archive: Path, batch_size: object
) -> None:
    """dedup's batches are the units it resumes from, so unlike add_many it takes no
    "auto": the error names what it does take, and no output or progress file appears."""
    out = archive.parent / "out"
    out.mkdir()
    with pytest.raises(InvalidParameterError, match=r"expected a positive integer$"):
        _dedup(store, archive, out, batch_size=batch_size)
    assert list(out.iterdir()) == [] and len(store) == 0


def test_dedup_rerun_reads_lines_appended_to_a_finished_input(
    tmp_path: Path, archive: Path, archive_lines: list[str]
) -> None:
    """An archive grows: the next run of the same job reads only the new lines, and the
    outputs equal those of one run over the whole input (blank lines that ended the old
    input count, so a failure among the new lines names its own line)."""
    old, new = [*archive_lines[:40], "", ""], ["{not json", *archive_lines[40:]]
    whole = tmp_path / "whole.jsonl"
    whole.write_text("\n".join(old + new) + "\n")
    expected, reference = _reference_run(tmp_path, whole, batch_size=16)
    assert [f.line for f in expected.failed] == [43]

    archive.write_text("\n".join(old) + "\n")
    out = tmp_path / "grown"
    out.mkdir()
    with Store.open(tmp_path / "s2", create=True, threshold=0.7) as store:
        first = _dedup(store, archive, out, batch_size=16)
        assert first.kept + first.dropped == 40
        with archive.open("a") as appended:
            appended.write("\n".join(new) + "\n")
        report = _dedup(store, archive, out, batch_size=16)
    assert (report.kept, report.dropped) == (expected.kept, expected.dropped)
    assert [f.line for f in report.failed] == [43]
    assert report.resumed_from == 42
    for name in ["keep.jsonl", "dropped.jsonl"]:
        assert (out / name).read_bytes() == (reference / name).read_bytes()


def _stop_after_one(progress: BatchProgress) -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("finished", [True, False])
@pytest.mark.parametrize("change", ["replaced", "truncated"])
def test_dedup_refuses_to_resume_on_another_input(
    store: Store, archive: Path, archive_lines: list[str], change: str, finished: bool
) -> None:
    out = archive.parent
    if finished:
        _dedup(store, archive, out, batch_size=60)
    else:  # interrupted after its first batch: the check runs on every resume
        with pytest.raises(Interrupted):
            _dedup(store, archive, out, batch_size=60, on_batch=_stop_after_one)
    before = {name: (out / name).read_bytes() for name in ["keep.jsonl", "dropped.jsonl"]}
    if change == "replaced":  # the same size, other bytes
        archive.write_text("\n".join(reversed(archive_lines)) + "\n")
    else:
        archive.write_text("\n".join(archive_lines[:10]) + "\n")
    documents = len(store)
    with pytest.raises(DedupStateError, match=change if change == "replaced" else "shorter"):
        _dedup(store, archive, out, batch_size=60)
    assert len(store) == documents
    assert before == {name: (out / name).read_bytes() for name in before}


def test_dedup_leaves_a_last_line_cut_short_for_the_next_run(
    tmp_path: Path, archive: Path, archive_lines: list[str]
) -> None:
    """A writer may still be appending the input's last line: a line without a newline
    that is no JSON yet is left unread, and read whole once it is complete. Blank lines
    count as lines, so a failure after them names its own line."""
    final = [*archive_lines[:40], "", "", "{not json", *archive_lines[40:]]
    text = "\n".join(final) + "\n"
    whole = tmp_path / "whole.jsonl"
    whole.write_text(text)
    expected, reference = _reference_run(tmp_path, whole, batch_size=16)
    assert [f.line for f in expected.failed] == [43]

    cut = text.index(archive_lines[41]) + 20  # inside line 45, the second record after
    archive.write_text(text[:cut])
    out = tmp_path / "grown"
    out.mkdir()
    with Store.open(tmp_path / "s2", create=True, threshold=0.7) as store:
        first = _dedup(store, archive, out, batch_size=16)
        assert first.kept + first.dropped + len(first.failed) == 42  # 41 records, 1 bad
        unfinished = text[text.rindex("\n", 0, cut) + 1 : cut].encode()
        assert first.held_back_bytes == len(unfinished) > 0  # reported, not silently left
        archive.write_text(text)  # the writer finishes its line and goes on
        report = _dedup(store, archive, out, batch_size=16)
    assert expected.held_back_bytes == report.held_back_bytes == 0
    assert (report.kept, report.dropped) == (expected.kept, expected.dropped)
    assert [(f.line, f.reason) for f in report.failed] == [
        (f.line, f.reason) for f in expected.failed
    ]
    for name in ["keep.jsonl", "dropped.jsonl"]:
        assert (out / name).read_bytes() == (reference / name).read_bytes()


def test_dedup_refuses_progress_of_another_job(store: Store, archive: Path) -> None:
    out = archive.parent
    _dedup(store, archive, out, batch_size=60)
    with pytest.raises(DedupStateError, match="differs in text_field"):
        _dedup(store, archive, out, text_field="body")


def _in_committed(**fields: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda state: {"committed": {**state["committed"], **fields}}


def _in_version_3(**fields: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Damage to a finished job's file in the layout of version 3, whose positions list
    their failures themselves."""

    def damage(state: dict[str, Any]) -> dict[str, Any]:
        committed = {k: v for k, v in state["committed"].items() if k != "failed_bytes"}
        return {"version": 3, "job": _job_before_5(state), "committed": {**committed, **fields}}

    return damage


def _job_before_5(state: dict[str, Any]) -> dict[str, Any]:
    """A progress file's job as files before version 5 record it: without its encoding."""
    return {k: v for k, v in state["job"].items() if k != "encoding"}


def _as_version_3(state: dict[str, Any], keep: Path) -> dict[str, Any]:
    """A version 5 progress file's state as version 3 wrote it: the job without its
    encoding, and each position lists its failures, which version 4 keeps in the
    failures file."""
    data = ingest_module.failures_path(keep).read_bytes()

    def old(position: dict[str, Any] | None) -> dict[str, Any] | None:
        if position is None:
            return None
        failed = [json.loads(line) for line in data[: position["failed_bytes"]].splitlines()]
        assert len(failed) == position["failed"]
        kept = {k: v for k, v in position.items() if k != "failed_bytes"}
        return {**kept, "failed": failed}

    return {
        **state,
        "version": 3,
        "job": _job_before_5(state),
        "committed": old(state["committed"]),
        "pending": old(state["pending"]),
    }


# Damage to a finished job's progress file (the version stays valid): each entry gives the
# fields it replaces.
_DAMAGES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "job is not an object": lambda state: {"job": None},
    "job lacks a field": lambda state: {
        "job": {k: v for k, v in state["job"].items() if k != "store"}
    },
    "job.threshold is a bool": lambda state: {"job": {**state["job"], "threshold": True}},
    "version is a bool": lambda state: {"version": True},
    "an unknown field": lambda state: {"extra": 1},
    "done is not a bool": lambda state: {"done": "yes"},
    "probe_key is a number": lambda state: {"probe_key": 7},
    "committed is not an object": lambda state: {"committed": "garbled"},
    "committed lacks its offsets": lambda state: {"done": False, "committed": {"line": 3}},
    "committed has an unknown field": _in_committed(extra=1),
    "keep_bytes is a string": _in_committed(keep_bytes="1721"),
    "keep_bytes is a bool": _in_committed(keep_bytes=True),
    "keep_bytes is negative": _in_committed(keep_bytes=-1),
    "input_offset is a float": _in_committed(input_offset=10.0),
    "input_tail is not a digest": _in_committed(input_tail=5),
    "failed is not a count": _in_committed(failed={}),
    "failed_bytes is negative": _in_committed(failed_bytes=-1),
    "failed_bytes is missing": lambda state: {
        "committed": {k: v for k, v in state["committed"].items() if k != "failed_bytes"}
    },
    "failed is not a list (version 3)": _in_version_3(failed=3),
    "a failure is too short": _in_version_3(failed=[["x"]]),
    "a failure's line is text": _in_version_3(failed=[["a", "b", None, "3"]]),
    "pending lacks fields": lambda state: {"pending": {"kept": 1}, "probe_key": None},
}


@pytest.mark.parametrize("case", list(_DAMAGES))
def test_dedup_refuses_a_damaged_progress_file_and_touches_nothing(
    store: Store, archive: Path, case: str
) -> None:
    """Every field of the progress file is checked before it is acted on: a position with
    its offsets missing was taken as zeros and cut the finished keep file to 0 bytes, and
    fields of the wrong shape gave raw TypeError and AttributeError (a review's finding)."""
    out = archive.parent
    _dedup(store, archive, out, batch_size=40)
    sidecar = progress_path(out / "keep.jsonl")
    state = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**state, **_DAMAGES[case](state)}))
    before = {name: (out / name).read_bytes() for name in ["keep.jsonl", "dropped.jsonl"]}
    documents = len(store)
    with pytest.raises(DedupStateError, match="progress file") as caught:
        _dedup(store, archive, out, batch_size=40)
    assert caught.value.path == str(sidecar)
    assert len(store) == documents
    assert before == {name: (out / name).read_bytes() for name in before}


def test_dedup_refuses_a_progress_file_nested_too_deep_to_parse(
    store: Store, archive: Path
) -> None:
    """JSON nested past Python's recursion limit raised a raw RecursionError (a review of
    the check's fix)."""
    out = archive.parent
    _dedup(store, archive, out, batch_size=40)
    sidecar = progress_path(out / "keep.jsonl")
    sidecar.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DedupStateError, match=r"unreadable progress file .RecursionError"):
        _dedup(store, archive, out, batch_size=40)


def test_dedup_resumes_from_a_version_1_progress_file(
    tmp_path: Path, archive: Path, archive_lines: list[str]
) -> None:
    """Version 1 files, from before already_stored and input_tail, with failures of two
    fields, still resume: the checks refuse damage, not an older layout."""
    archive.write_text("\n".join([*archive_lines[:30], "{not json", *archive_lines[30:]]) + "\n")
    expected, reference = _reference_run(tmp_path, archive, batch_size=16)
    out = tmp_path / "out"
    out.mkdir()
    with Store.open(tmp_path / "s2", create=True, threshold=0.7) as store:
        with pytest.raises(Interrupted):
            _dedup(store, archive, out, batch_size=16, on_batch=_stop_at(3))
        sidecar = progress_path(out / "keep.jsonl")
        state = _as_version_3(json.loads(sidecar.read_text()), out / "keep.jsonl")
        ingest_module.failures_path(out / "keep.jsonl").unlink()  # version 1 had none
        old = {
            k: v for k, v in state["committed"].items() if k not in ("already_stored", "input_tail")
        }
        old["failed"] = [fields[:2] for fields in old["failed"]]
        assert old["failed"]  # the bad line is in the first three batches
        sidecar.write_text(json.dumps({**state, "version": 1, "committed": old}))
        report = _dedup(store, archive, out, batch_size=16)
    _assert_as_uninterrupted(report, out, expected, reference)


def _stop_at(batches: int) -> Any:
    def stop(progress: BatchProgress) -> None:
        if progress.batches_committed == batches:
            raise KeyboardInterrupt

    return stop


def test_check_dedup_paths_refuses_a_job_whose_store_is_gone_and_device_outputs(
    tmp_path: Path, archive: Path
) -> None:
    """A progress file with committed batches was resumed against whatever store the
    caller made anew, and a device as an output was accepted (review 20)."""
    out = tmp_path / "out"
    out.mkdir()
    store_dir = tmp_path / "gone"
    with Store.open(store_dir, create=True, threshold=0.7) as store:
        _dedup(store, archive, out, batch_size=16)
    for name in os.listdir(store_dir):
        (store_dir / name).unlink()
    keep, dropped = out / "keep.jsonl", out / "dropped.jsonl"
    with pytest.raises(DedupStateError, match=r"committed batch.* which is not there"):
        ingest_module.check_dedup_paths(archive, keep, dropped, store_dir)
    with pytest.raises(DedupStateError, match="differs in threshold"):
        ingest_module.check_dedup_paths(archive, keep, dropped, store_dir, threshold=0.9)
    with pytest.raises(InvalidParameterError, match="expected a regular file"):
        ingest_module.check_dedup_paths(archive, os.devnull, dropped, tmp_path / "other")


_PAUSED_RUN = """
import sys, time
from pathlib import Path
from neardup_store import Store
from neardup_store.ingest import dedup
archive, out, store_dir = map(Path, sys.argv[1:4])

def pause(progress):
    if progress.batches_committed == 2:
        (out / "paused").touch()
        while not (out / "go").exists():
            time.sleep(0.01)

with Store.open(store_dir, threshold=0.7) as store:
    dedup(store, archive, out / "keep.jsonl", out / "dropped.jsonl", batch_size=16,
          on_batch=pause)
"""


def test_a_second_run_of_a_running_dedup_job_is_refused_and_changes_nothing(
    tmp_path: Path, archive: Path
) -> None:
    """Two runs of one job at once (a cron overlap) cut back each other's outputs and
    kept or dropped lines twice, and both exited 0 (review 59)."""
    expected, reference = _reference_run(tmp_path, archive, batch_size=16)
    out, store_dir = tmp_path / "out", tmp_path / "shared"
    out.mkdir()
    Store.open(store_dir, create=True, threshold=0.7).close()
    first = subprocess.Popen(
        [sys.executable, "-c", _PAUSED_RUN, str(archive), str(out), str(store_dir)]
    )
    try:
        deadline = time.monotonic() + 60
        while not (out / "paused").exists():
            assert first.poll() is None and time.monotonic() < deadline, "the run never paused"
            time.sleep(0.01)
        files = ["keep.jsonl", "dropped.jsonl", "keep.jsonl.progress.json"]
        before = {name: (out / name).read_bytes() for name in files}
        with Store.open(store_dir) as store:
            with pytest.raises(DedupBusyError, match="another run of this dedup job"):
                _dedup(store, archive, out, batch_size=16)
            assert {name: (out / name).read_bytes() for name in files} == before
            (out / "go").touch()
            assert first.wait(timeout=60) == 0
            report = _dedup(store, archive, out, batch_size=16)  # finished: nothing to do
    finally:
        (out / "go").touch()
        first.wait(timeout=60)
    _assert_as_uninterrupted(report, out, expected, reference)


def test_a_resumed_dedup_tells_on_batch_where_it_resumed(
    tmp_path: Path, store: Store, archive: Path
) -> None:
    """On a resume, on_batch's records count the earlier runs' lines as well, and nothing
    said how many, so a rate shown from them was the job's, not the run's (review 20)."""
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(Interrupted):
        _dedup(store, archive, out, batch_size=16, on_batch=_stop_after_one)
    seen: list[BatchProgress] = []
    report = _dedup(store, archive, out, batch_size=16, on_batch=seen.append)
    assert report.resumed_from == 16 and seen
    assert {p.resumed_from for p in seen} == {16}


def test_an_output_inside_an_input_directory_is_refused(tmp_path: Path) -> None:
    """``add --report docs/a1.txt`` with ``docs`` an input emptied that document before it
    was read (review 25 #1)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a1.txt").write_text("a document to keep")
    for report in [docs / "a1.txt", docs / "sub" / "new.jsonl"]:
        with pytest.raises(InvalidParameterError, match="outside the input directory"):
            ingest_module.refuse_clashing_paths(
                [("input", docs)], [("report", report)], tmp_path / "s.ndx"
            )
    assert (docs / "a1.txt").read_text() == "a document to keep"


def test_an_output_hard_linked_to_a_store_or_input_file_is_refused(
    tmp_path: Path, store: Store, archive: Path
) -> None:
    """A hard link of data.mdb outside the store's directory, as ``--report`` or
    ``--keep``, emptied the store (review 25 #5); so did a link of a document in an input
    directory."""
    store.add("a", "a stored document of several words")
    data = tmp_path / "snapshot-data.mdb"
    os.link(Path(store.path) / "data.mdb", data)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a1.txt").write_text("a document to keep")
    document = tmp_path / "linked.txt"
    os.link(docs / "a1.txt", document)
    for output in [data, document]:
        with pytest.raises(InvalidParameterError, match=r"a file other than .* \(a link to it\)"):
            ingest_module.refuse_clashing_paths([("input", docs)], [("report", output)], store.path)
    with pytest.raises(InvalidParameterError, match=r"data\.mdb \(a link to it\)"):
        ingest_module.check_dedup_paths(archive, data, tmp_path / "dropped.jsonl", store.path)
    assert len(store) == 1 and (docs / "a1.txt").read_text() == "a document to keep"


def test_symbolic_link_loops_are_reported_not_raised(
    tmp_path: Path, store: Store, archive: Path
) -> None:
    """Path.resolve() raised RuntimeError on a loop: add and dedup ended in a traceback
    (review 25 #3). A loop is now an unreadable input, or a usage error for dedup."""
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    loop = tmp_path / "loop1"
    ingest_module.refuse_clashing_paths([("input", loop)], [("report", loop / "r")], store.path)
    ingest_module.refuse_clashing_paths([("input", archive)], [("report", loop)], store.path)
    (failure,) = list(read_inputs([loop]))
    assert isinstance(failure, Failure)
    assert failure.reason == "cannot read it: Too many levels of symbolic links"
    dropped = tmp_path / "dropped.jsonl"
    for name, paths in [("input", (loop, tmp_path / "k.jsonl")), ("keep", (archive, loop))]:
        with pytest.raises(InvalidParameterError, match=f"^{name}=.*Too many levels"):
            ingest_module.check_dedup_paths(*paths, dropped, store.path)
    with pytest.raises(InvalidParameterError, match="Too many levels"):
        dedup(store, archive, loop, dropped)


def _finished_job_then(tmp_path: Path, archive: Path, replace_store: Callable[[Path], None]) -> Any:
    """A dedup job run to its end (after an interruption at batch 2, whose store is kept
    as ``backup``), its store then replaced by ``replace_store``, two lines appended to
    the input, and the job run again: the error it raises."""
    out, store_dir = tmp_path / "out", tmp_path / "job.ndx"
    out.mkdir()
    with Store.open(store_dir, create=True, threshold=0.7) as store, pytest.raises(Interrupted):
        _dedup(store, archive, out, batch_size=16, on_batch=_stop_at(2))
    shutil.copytree(store_dir, tmp_path / "backup")
    with Store.open(store_dir) as store:
        _dedup(store, archive, out, batch_size=16)
    replace_store(store_dir)
    lines = archive.read_text().splitlines()
    with archive.open("a") as more:  # copies of the last two lines, under new keys
        for line in lines[-2:]:
            more.write(json.dumps({**json.loads(line), "id": "copy-" + json.loads(line)["id"]}))
            more.write("\n")
    before = {p: p.read_bytes() for p in out.iterdir()}
    with Store.open(store_dir) as store:
        documents = len(store)
        with pytest.raises(DedupStateError) as caught:
            _dedup(store, archive, out, batch_size=16)
        assert len(store) == documents
    assert before == {p: p.read_bytes() for p in out.iterdir()}
    return caught.value


def _made_anew(store_dir: Path) -> None:
    shutil.rmtree(store_dir)
    Store.open(store_dir, create=True, threshold=0.7).close()


def _restored_from_backup(store_dir: Path) -> None:
    _restored_from(store_dir.parent / "backup", store_dir)


def _restored_from(copy: Path, store_dir: Path) -> None:
    shutil.rmtree(store_dir)
    shutil.copytree(copy, store_dir)


@pytest.mark.parametrize("replace_store", [_made_anew, _restored_from_backup])
def test_dedup_refuses_to_resume_against_a_store_without_the_jobs_work(
    tmp_path: Path, archive: Path, replace_store: Callable[[Path], None]
) -> None:
    """A store made anew by init, or restored from an older backup, was resumed against:
    the job kept again documents it had kept (review 25 #2)."""
    err = _finished_job_then(tmp_path, archive, replace_store)
    message = str(err)
    assert "has committed" in message and "fewer than the" in message
    assert "restore the store the job wrote to, in its latest state" in message


def test_dedup_resumes_after_others_removed_documents_it_kept(
    tmp_path: Path, archive: Path
) -> None:
    """The store is a shared index: a check of the job's last kept key and kept count
    refused a rerun once someone removed a document the job had kept (review 26). The
    store's commit counter, which only grows, tells the job's store from another."""
    out, store_dir = tmp_path / "out", tmp_path / "job.ndx"
    out.mkdir()
    with Store.open(store_dir, create=True, threshold=0.7) as store:
        first = _dedup(store, archive, out, batch_size=16)
        kept = [json.loads(line)["id"] for line in (out / "keep.jsonl").read_text().splitlines()]
        assert store.remove_many(kept) == len(kept) == first.kept  # all of them, by others
        with archive.open("a") as more:
            more.write(json.dumps({"id": "late", "text": "a line appended after the job ran"}))
            more.write("\n")
        again = _dedup(store, archive, out, batch_size=16)
    assert again.resumed_from is not None and again.kept == first.kept + 1


def test_dedup_resumes_a_version_2_progress_file_unchecked(tmp_path: Path, archive: Path) -> None:
    """A version 2 progress file records no commit counter: it still resumes (its kept
    count was checked instead, which refused resumes after others' removals)."""
    out, store_dir = tmp_path / "out", tmp_path / "job.ndx"
    out.mkdir()
    with Store.open(store_dir, create=True, threshold=0.7) as store:
        first = _dedup(store, archive, out, batch_size=16)
        sidecar = progress_path(out / "keep.jsonl")
        state = _as_version_3(json.loads(sidecar.read_text()), out / "keep.jsonl")
        assert state["committed"]["store_commits"] > 0
        for name in ("committed", "pending"):
            if state[name] is not None:
                state[name].pop("store_commits")
        sidecar.write_text(json.dumps({**state, "version": 2}))
        again = _dedup(store, archive, out, batch_size=16)
    assert again.resumed_from is not None and again.kept == first.kept


def test_dedup_refuses_a_progress_file_whose_store_commits_is_no_count(
    store: Store, archive: Path
) -> None:
    """The new store_commits field is checked like the others (review 25 #2)."""
    out = archive.parent
    _dedup(store, archive, out, batch_size=40)
    sidecar = progress_path(out / "keep.jsonl")
    state = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**state, **_in_committed(store_commits="7")(state)}))
    with pytest.raises(DedupStateError, match=r'committed\.store_commits is "7", not a whole'):
        _dedup(store, archive, out, batch_size=40)


@pytest.mark.parametrize("output", ["keep.jsonl", "dropped.jsonl"])
def test_dedup_advises_putting_back_an_output_cut_short(
    store: Store, archive: Path, output: str
) -> None:
    """A deleted keep file was refused with "rerun with the same arguments to resume",
    which failed the same way every time (review 25 #7)."""
    out = archive.parent
    _dedup(store, archive, out, batch_size=40)
    (out / output).write_bytes(b"")
    with pytest.raises(DedupStateError) as caught:
        _dedup(store, archive, out, batch_size=40)
    assert f"put back the complete {output} to resume" in str(caught.value)
    assert "rerun" not in str(caught.value)


# -- review 41: JSON numbers, file names that are not UTF-8, the progress file's cost -------


def _strict_json(line: str | bytes) -> Any:
    """``line`` as JSON, refusing the NaN/Infinity tokens that Python's json takes (as
    JavaScript's JSON.parse, serde_json and Go refuse them)."""

    def refuse(token: str) -> Any:
        raise ValueError(f"not JSON: {token}")

    return json.loads(line, parse_constant=refuse)


def test_dedup_writes_numbers_back_as_written_and_refuses_nan(tmp_path: Path, store: Store) -> None:
    """A number past a double (1e400, valid JSON) came back as the bare token Infinity in
    a dropped line, 0.1000000000000000000001 as 0.1, and NaN was taken as input (review
    41 #1). A failure's key (the line's id) keeps its text through an interrupted and
    resumed run, since the failures are kept between runs."""
    text = "the quick brown fox jumps over the lazy dog " * 3
    numbers = '"size": 1e400, "r": 0.1000000000000000000001, "n": [-0.0, 1E+2]'
    bad = '{"id": "c", "text": "other words entirely", "bad": NaN}'
    archive = tmp_path / "in.jsonl"
    archive.write_text(
        f'{{"id": "a", "text": "{text}", {numbers}}}\n'
        f'{{"id": "b", "text": "{text}", {numbers}}}\n'
        '{"id": 1e400, "body": "no text field"}\n'
        f"{bad}\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(Interrupted):
        _dedup(store, archive, out, batch_size=1, on_batch=_stop_at(3))
    report = _dedup(store, archive, out, batch_size=1)
    assert (out / "dropped.jsonl").read_text() == (
        f'{{"id": "b", "text": "{text}", {numbers}, "duplicate_of": "a", "score": 1.0}}\n'
    )
    _strict_json((out / "dropped.jsonl").read_bytes())
    assert [(f.line, f.error) for f in report.failed] == [(3, "KeyError"), (4, "JSONDecodeError")]
    assert ingest_module.json_text({"key": report.failed[0].key}) == '{"key": 1e400}'
    column = bad.index("NaN") + 1
    assert report.failed[1].reason == f"malformed JSON (NaN is not JSON at column {column})"


def test_json_text_writes_no_nan_or_infinity() -> None:
    """Every JSON line goes through json_text, which wrote a float that is not finite as
    NaN or Infinity (review 41 #1): now that is an error, never invalid output."""
    for number in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match="not JSON compliant"):
            ingest_module.json_text({"failed": {"key": [number]}})
    record = {"a": [1, {"b": None, "c": True}], "d": "é", "e": 0.25, "f": {}, "g": []}
    assert ingest_module.json_text(record) == json.dumps(record, ensure_ascii=False)


def _make_file(path: bytes, data: bytes) -> None:
    try:
        with open(path, "wb") as out:
            out.write(data)
    except OSError:
        pytest.skip("this file system takes only UTF-8 names")


def test_a_file_name_that_is_not_utf8_keys_its_document_by_the_path_bytes(
    tmp_path: Path, store: Store
) -> None:
    """A Latin-1 name got a str key with surrogate escapes, which the store refused, and
    its failure's source held them, which strict JSON parsers refuse (review 41 #5): the
    key is now the path's bytes, and where a failure names the file, each byte that is
    not UTF-8 is written \\xNN."""
    root = tmp_path / "docs"
    root.mkdir()
    resume, empty = os.fsencode(root) + b"/r\xe9sum\xe9.txt", os.fsencode(root) + b"/emp\xe9.txt"
    _make_file(resume, b"curriculum vitae of a person with a long list of jobs")
    _make_file(empty, b"")
    plain = str(root / "plain.txt")
    Path(plain).write_text("a second document with other words entirely in it")
    items = list(read_inputs([root, root / "emp\udce9.txt"]))  # walked, and named
    shown, shown_empty = str(root) + "/r\\xe9sum\\xe9.txt", str(root) + "/emp\\xe9.txt"
    assert [(r.key, r.source, r.file) for r in items if isinstance(r, Record)] == [
        (empty, shown_empty, shown_empty),
        (plain, plain, plain),
        (resume, shown, shown),
        (empty, shown_empty, shown_empty),
    ]
    report = ingest(store, items)
    assert (report.added, [f.source for f in report.failed]) == (2, [shown_empty] * 2)
    assert resume in store and plain in store
    names = ingest_module.json_text([[f.source, f.file] for f in report.failed])
    assert "\\ud" not in names and names.encode("utf-8")  # no lone surrogate, escaped or not


def test_dedup_progress_file_costs_the_same_every_batch_however_many_lines_failed(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every failure so far was in the progress file, rewritten twice a batch: 20k failed
    lines in batches of 200 wrote 250 MB to it (review 41 #4). Now it records counts and
    sizes, and the failed lines are appended once to the failures file."""
    archive = tmp_path / "in.jsonl"
    row = {"body": "the text is under another field name"}
    archive.write_text("".join(json.dumps({"id": f"k{i}", **row}) + "\n" for i in range(400)))
    real_save = ingest_module._save_state
    sizes: dict[bool, list[int]] = {True: [], False: []}  # by whether a batch is pending

    def measured(sidecar: Path, *args: Any, **kwargs: Any) -> None:
        real_save(sidecar, *args, **kwargs)
        sizes[args[2] is not None].append(sidecar.stat().st_size)

    monkeypatch.setattr(ingest_module, "_save_state", measured)
    report = _dedup(store, archive, tmp_path, batch_size=10)
    assert len(report.failed) == 400 and report.batches_committed == 40
    assert len(sizes[True]) == 40 and len(sizes[False]) == 41  # and the final "done"
    for written in sizes.values():  # only the counts' digits grow
        assert max(written) - min(written) < 64, written
    lines = ingest_module.failures_path(tmp_path / "keep.jsonl").read_bytes().splitlines()
    assert [Failure(*json.loads(line)) for line in lines] == report.failed


def test_dedup_counts_a_batch_interrupted_after_its_commit_and_resumes_a_version_3_file(
    tmp_path: Path, archive: Path, archive_lines: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C after batch 3 committed, before the progress file said so, was reported as
    2 batches committed (review 41 #2). That progress file, put in the layout of the
    release before (version 3, which listed every failure, the pending batch's too),
    resumes to the outputs and failures of an uninterrupted run."""
    missing_text = '{"id": "x"}'
    lines = [*archive_lines[:20], "{not json", *archive_lines[20:40], missing_text]
    archive.write_text("\n".join([*lines, *archive_lines[40:]]) + "\n")
    expected, reference = _reference_run(tmp_path, archive, batch_size=16)
    assert [f.line for f in expected.failed] == [21, 42]  # in batches 2 and 3
    real_save = ingest_module._save_state

    def interrupting_save(
        sidecar: Path, job: Any, committed: Any, pending: Any, *rest: Any
    ) -> None:
        if pending is None and committed.batches == 3:  # its commit has returned
            raise KeyboardInterrupt
        real_save(sidecar, job, committed, pending, *rest)

    out = tmp_path / "out"
    out.mkdir()
    with Store.open(tmp_path / "s2", create=True, threshold=0.7) as store:
        monkeypatch.setattr(ingest_module, "_save_state", interrupting_save)
        with pytest.raises(Interrupted) as caught:
            _dedup(store, archive, out, batch_size=16)
        monkeypatch.setattr(ingest_module, "_save_state", real_save)
        assert caught.value.batches_committed == 3
        assert [f.line for f in caught.value.report.failed] == [21, 42]
        sidecar = progress_path(out / "keep.jsonl")
        state = json.loads(sidecar.read_text())
        assert state["pending"]["batches"] == 3 and state["committed"]["batches"] == 2
        sidecar.write_text(json.dumps(_as_version_3(state, out / "keep.jsonl")))
        ingest_module.failures_path(out / "keep.jsonl").unlink()  # version 3 had none
        report = _dedup(store, archive, out, batch_size=16)
    _assert_as_uninterrupted(report, out, expected, reference)
    assert json.loads(sidecar.read_text())["version"] == 5


_FAILURES_DAMAGES: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    # what is done to the failures file, and what the error says
    "garbled": ("is damaged", lambda data: data.replace(b"[", b"{", 1)),
    "a line blanked": ("is damaged", lambda data: data[: data.index(b"\n") + 1].ljust(len(data))),
    "cut short": ("put back the complete", lambda data: data[:-1]),
    "deleted": ("put back the complete", lambda data: b""),
}


@pytest.mark.parametrize("damage", list(_FAILURES_DAMAGES))
def test_dedup_refuses_a_damaged_failures_file(store: Store, archive: Path, damage: str) -> None:
    """The failures file is checked as the progress file is: a resumed report must not
    lose or invent failures, and the advice names the file to put back."""
    archive.write_text(archive.read_text() + "{not json\n" + '{"id": "x"}\n')
    out = archive.parent
    _dedup(store, archive, out, batch_size=40)
    failures = ingest_module.failures_path(out / "keep.jsonl")
    expected, change = _FAILURES_DAMAGES[damage]
    data = failures.read_bytes()
    assert data.count(b"\n") == 2
    if damage == "deleted":
        failures.unlink()
    else:
        failures.write_bytes(change(data))
    with pytest.raises(DedupStateError, match=expected) as caught:
        _dedup(store, archive, out, batch_size=40)
    assert failures.name in str(caught.value)


def test_dedup_refuses_a_failures_file_that_holds_other_than_it_records(
    store: Store, archive: Path
) -> None:
    archive.write_text(archive.read_text() + "{not json\n" + '{"id": "x"}\n')
    out = archive.parent
    _dedup(store, archive, out, batch_size=40)
    sidecar = progress_path(out / "keep.jsonl")
    state = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**state, **_in_committed(failed=3)(state)}))
    with pytest.raises(DedupStateError, match="holds 2 failures, not the 3 the progress file"):
        _dedup(store, archive, out, batch_size=40)


# -- dedup's encoding (review 53) --------------------------------------------------------------

_LATIN1_ROWS = [
    {"id": "a", "text": "café au lait, crème brûlée and a pâtisserie on the corner"},
    {"id": "b", "text": "café au lait, crème brûlée and a pâtisserie on the corner!"},
    {"id": "c", "text": "naïve façade of the old théâtre, seen from the river bank"},
]


def _rows_file(path: Path, encoding: str) -> Path:
    """:data:`_LATIN1_ROWS` as JSON lines in ``encoding``, the last without a newline."""
    lines = [json.dumps(row, ensure_ascii=False) for row in _LATIN1_ROWS]
    path.write_bytes("\n".join(lines).encode(encoding))
    return path


def test_dedup_reads_its_input_in_the_encoding_it_is_given(tmp_path: Path) -> None:
    """dedup read UTF-8 only (it had no encoding), and advised "pass the right encoding"
    for a Latin-1 line. Read with encoding="latin-1", a Latin-1 input gives what its UTF-8
    copy gives: the same outputs, in UTF-8 (its last line, without a newline, included)."""
    results = {}
    for encoding in ("utf-8", "latin-1"):
        source = _rows_file(tmp_path / f"{encoding}.jsonl", encoding)
        out = tmp_path / f"out-{encoding}"
        out.mkdir()
        with Store.open(tmp_path / f"s-{encoding}", create=True, threshold=0.7) as store:
            report = _dedup(store, source, out, encoding=encoding)
            with store.read() as reader:
                stored = sorted(reader.keys())
        assert (report.kept, report.dropped, report.failed) == (2, 1, [])
        assert report.held_back_bytes == 0 and stored == ["a", "c"]
        results[encoding] = [(out / n).read_bytes() for n in ("keep.jsonl", "dropped.jsonl")]
    assert results["latin-1"] == results["utf-8"]
    kept = results["latin-1"][0].decode("utf-8").splitlines()
    assert [json.loads(line) for line in kept] == [_LATIN1_ROWS[0], _LATIN1_ROWS[2]]


def test_dedup_advice_for_an_undecodable_line_is_its_encoding_option(tmp_path: Path) -> None:
    """The advice was "pass the right encoding", which dedup could not take; following it
    now works."""
    source = _rows_file(tmp_path / "latin.jsonl", "latin-1")
    for attempt, options in enumerate([{}, {"encoding": "latin-1"}]):
        out = tmp_path / f"out{attempt}"
        out.mkdir()
        with Store.open(tmp_path / f"s{attempt}", create=True, threshold=0.7) as store:
            report = _dedup(store, source, out, **options)
        if not options:
            assert len(report.failed) == 2  # the third line is held back: not UTF-8 JSON
            assert report.failed[0].reason == (
                "not valid utf-8 at byte 24 (invalid continuation byte); pass the right encoding"
            )
    assert (report.kept, report.dropped, report.failed) == (2, 1, [])


def test_dedup_resumes_only_with_the_encoding_its_job_read(
    store: Store, archive: Path, tmp_path: Path
) -> None:
    """The encoding is part of the job: another one is refused, another spelling of the
    same one is not, and a job of a progress file before version 5 read UTF-8."""
    out = archive.parent
    latin = _rows_file(tmp_path / "latin.jsonl", "latin-1")
    first = dedup(store, latin, out / "k1.jsonl", out / "d1.jsonl", encoding="latin-1")
    again = dedup(store, latin, out / "k1.jsonl", out / "d1.jsonl", encoding="ISO-8859-1")
    assert (again.kept, again.dropped) == (first.kept, first.dropped) == (2, 1)
    with pytest.raises(DedupStateError, match=r"differs in encoding\)"):
        dedup(store, latin, out / "k1.jsonl", out / "d1.jsonl")
    done = _dedup(store, archive, out)
    sidecar = progress_path(out / "keep.jsonl")
    state = json.loads(sidecar.read_text())
    assert state["version"] == 5 and state["job"]["encoding"] == "utf-8"
    sidecar.write_text(json.dumps({**state, "version": 4, "job": _job_before_5(state)}))
    with pytest.raises(DedupStateError, match=r"differs in encoding\)"):
        _dedup(store, archive, out, encoding="cp1252")
    assert _dedup(store, archive, out).kept == done.kept


def test_check_dedup_paths_refuses_an_encoding_lines_cannot_be_read_in(
    tmp_path: Path, archive: Path
) -> None:
    """UTF-16 cuts no lines at the byte 0x0a, and a name that is no codec: both refused
    before anything is made."""
    keep, dropped = tmp_path / "keep.jsonl", tmp_path / "dropped.jsonl"
    for encoding, expected in [("utf-16", "byte 0x0a"), ("no-such-codec", "a codec name")]:
        with pytest.raises(InvalidParameterError, match=expected):
            check_dedup_paths(archive, keep, dropped, tmp_path / "s", encoding=encoding)
    assert not keep.exists() and not dropped.exists() and not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("encoding", "newline"),
    [("utf-7", b"+AAo-"), ("utf-7", b"+AA0-"), ("raw_unicode_escape", b"\\u000a")],
)
def test_an_encoding_that_reads_a_newline_from_other_bytes_is_refused(
    store: Store, tmp_path: Path, encoding: str, newline: bytes
) -> None:
    """In UTF-7 and raw_unicode_escape a newline needs no byte 0x0a: JSON read it as white
    space between tokens, and the kept line, written back in UTF-8, became two lines that
    were not JSON (review 54). Such a codec is refused before anything is read or made;
    one that reads ASCII as ASCII and cuts lines at 0x0a alone is taken."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"id": "a",' + newline + b'"text": "first document about apples"}\n')
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InvalidParameterError, match="newline as the byte 0x0a alone") as raised:
        _dedup(store, source, out, encoding=encoding)
    assert "reads ASCII as ASCII" in str(raised.value)
    assert not list(out.iterdir()) and len(store) == 0
    with pytest.raises(InvalidParameterError, match="newline as the byte 0x0a alone"):
        read_inputs([source], jsonl=True, encoding=encoding)
    for usable in ("utf-8", "utf-8-sig", "latin-1", "cp1252", "shift_jis", "gb18030"):
        check_dedup_paths(source, out / "k.jsonl", out / "d.jsonl", tmp_path / "s", encoding=usable)


def test_parse_line_advice_for_an_undecodable_line_is_worded_by_its_caller() -> None:
    """By default (spark-dedup, which reads UTF-8 only) the advice is to convert the file,
    not to "pass the right encoding", which it has no way to take."""
    line = '{"id": "x", "text": "café"}\n'.encode("latin-1")
    default = ingest_module.parse_line(line, "in.jsonl:1", "id", "text")
    assert isinstance(default, Failure)
    assert default.reason == (
        "not valid utf-8 at byte 24 (invalid continuation byte); convert the file to UTF-8 "
        "(for a Latin-1 file: iconv -f LATIN1 -t UTF-8)"
    )
    worded = ingest_module.parse_line(
        line, "in.jsonl:1", "id", "text", decode_advice=ingest_module.PASS_ENCODING
    )
    assert isinstance(worded, Failure) and worded.reason.endswith("; pass the right encoding")
