"""Corruption suite: flipped bytes in ``data.mdb`` are detected by ``check`` or harmless.

LMDB keeps no checksums, so every trial here flips real bytes of a real store file and
runs ``neardup-admin check --json`` in a subprocess (see ``tests/corruption.py`` for the
classification). The long setting is ``python tools/corruption_trials.py --trials 2000``.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest
from corruption import (
    TARGETS,
    Reference,
    classify_check,
    flip,
    make_reference,
    run_check,
    run_flips,
    run_trial,
    value_span,
)
from harness import logical_digest

from neardup_store import CorruptStoreError, Store, codec, lmdbfile

TRIALS_PER_TARGET = 4
SEED = 11


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """A store of 200 documents (texts, metadata, str/bytes/long keys, removals)."""
    ref = make_reference(tmp_path_factory.mktemp("reference") / "store", SEED, documents=200)
    assert ref.check_ok
    return ref


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


def _meta_pages(reference: Reference) -> list[lmdbfile.MetaPage]:
    data = (reference.path / "data.mdb").read_bytes()
    pages = lmdbfile.read_meta_pages(data)
    assert all(isinstance(p, lmdbfile.MetaPage) for p in pages)
    return pages  # type: ignore[return-value]


def _assert_caught(trial: object) -> None:
    outcome = getattr(trial, "outcome", None)
    assert outcome in ("detected", "harmless"), trial


# -- the reference and the walk -----------------------------------------------------------


def test_reference_file_walks_clean_with_every_page_accounted_for(reference: Reference) -> None:
    report = lmdbfile.walk(reference.path / "data.mdb", spans=True)
    assert report.problems == []
    assert set(report.owners) == set(range(2, report.last_page + 1))
    assert lmdbfile.FREE in report.owners.values()  # the removals left free pages
    assert report.entries[codec.DOCS_DB] == report.entries[codec.KEYS_DB] > 0
    # The removals await a purge: their records are in ``removed``, their band entries stay.
    removed = report.entries[codec.REMOVED_DB]
    assert removed > 0
    bands = [n for n in report.entries if n.startswith(b"band.")]
    assert bands and all(
        report.entries[n] == report.entries[codec.DOCS_DB] + removed for n in bands
    )
    overflow = [s for s in report.spans if s.tree == "docs" and s.end - s.start > 4096]
    assert overflow  # some records fill LMDB overflow pages


@pytest.mark.parametrize("target", TARGETS)
def test_random_flips_are_detected_or_harmless(
    reference: Reference, workdir: Path, target: str
) -> None:
    rng = random.Random(f"{SEED}-{target}")
    outcomes = [run_trial(reference, workdir, target, rng) for _ in range(TRIALS_PER_TARGET)]
    for trial in outcomes:
        _assert_caught(trial)
    if target in ("docs", "keys", "removed", "bands"):  # every byte of these has meaning
        assert all(t.outcome == "detected" for t in outcomes), outcomes


# -- chosen flips, each a case the trials found or the design must cover ----------------


def test_older_meta_page_made_newest_is_detected(reference: Reference, workdir: Path) -> None:
    """LMDB opens the meta page with the larger transaction id: a flipped high bit in the
    older page's id would silently roll the store back one commit."""
    older = min(_meta_pages(reference), key=lambda m: m.txnid)
    newest = max(m.txnid for m in _meta_pages(reference))
    bit = newest.bit_length()  # keeps the parity, so only consecutiveness can tell
    offset = older.page * 4096 + lmdbfile.PAGE_HEADER + 128 + bit // 8
    trial = run_flips(reference, workdir, "lmdb-meta", [(offset, 1 << bit % 8)])
    assert trial.outcome == "detected" and "structure" in trial.detail, trial


def test_a_last_page_beyond_the_map_is_detected(reference: Reference, workdir: Path) -> None:
    """The last page in use may lie past the end of the file (pages a transaction freed
    before its commit are never written; ``tests/test_crash.py`` purges in the writer's
    transactions, which leaves such stores), but never past the map."""
    newest = max(_meta_pages(reference), key=lambda m: m.txnid)
    assert (newest.last_page + 1) * newest.page_size <= newest.map_size
    offset = newest.page * 4096 + lmdbfile.PAGE_HEADER + 120 + 4  # bit 32 of the last page
    data = bytearray((reference.path / "data.mdb").read_bytes())
    data[offset] ^= 0x01
    problems = lmdbfile.check_meta_pages(lmdbfile.read_meta_pages(bytes(data)))
    assert problems == [
        f"meta page {newest.page}: last page {newest.last_page + 2**32} lies beyond the map"
    ]
    trial = run_flips(reference, workdir, "lmdb-meta", [(offset, 0x01)])
    assert trial.outcome == "detected" and "structure" in trial.detail, trial


def test_damaged_free_list_is_detected(reference: Reference, workdir: Path) -> None:
    """A free list naming a page in use would let the next commit overwrite live data."""
    span = next(s for s in reference.spans if s.tree == lmdbfile.FREE_LIST and s.part == "value")
    trial = run_flips(reference, workdir, "free-list", [(span.start + 8, 0x01)])
    assert trial.outcome == "detected" and "structure" in trial.detail, trial


def test_wrong_entry_count_of_a_table_is_detected(reference: Reference, workdir: Path) -> None:
    """``len(store)`` reads LMDB's entry count: a flip there changes no record."""
    span = value_span(reference, lmdbfile.MAIN, codec.DOCS_DB)
    trial = run_flips(reference, workdir, "tables", [(span.start + 32, 0x01)])
    assert trial.outcome == "detected" and "structure" in trial.detail, trial


def _threshold_offset(reference: Reference) -> int:
    span = value_span(reference, "meta", b"banding")
    data = (reference.path / "data.mdb").read_bytes()
    at = data.index(b"threshold\xcb", span.start, span.end)
    return at + len(b"threshold\xcb") + 1  # the float's low exponent bits


def test_flipped_threshold_is_detected_by_the_meta_checksum(
    reference: Reference, workdir: Path
) -> None:
    """0.8 becomes 0.2: a valid threshold, which only the checksum can tell."""
    trial = run_flips(reference, workdir, "meta", [(_threshold_offset(reference), 0x20)])
    assert trial.outcome == "detected" and "structure" in trial.detail, trial
    with pytest.raises(CorruptStoreError) as raised:
        Store.open(workdir / "trial", read_only=True)
    assert "checksum" in str(raised.value)


def test_flipped_commit_counter_is_harmless(reference: Reference, workdir: Path) -> None:
    """The counter only counts commits: no reader's answer depends on it."""
    span = value_span(reference, "meta", b"commit_counter")
    trial = run_flips(reference, workdir, "meta", [(span.start, 0x01)])
    assert trial.outcome == "harmless", trial


@pytest.mark.parametrize("name", [b"next_doc_id", b"map_size", b"package_version", b"lmdb"])
def test_flipped_bookkeeping_meta_is_detected_or_harmless(
    reference: Reference, workdir: Path, name: bytes
) -> None:
    span = value_span(reference, "meta", name)
    for offset in range(span.start, span.end, max(1, (span.end - span.start) // 3)):
        _assert_caught(run_flips(reference, workdir, "meta", [(offset, 0x10)]))


def test_open_of_a_store_with_a_damaged_table_record_is_a_typed_error(
    reference: Reference, workdir: Path
) -> None:
    copy = workdir / "copy"
    shutil.copytree(reference.path, copy)
    data = (reference.path / "data.mdb").read_bytes()
    name = next(
        s
        for s in reference.spans
        if s.tree == lmdbfile.MAIN and s.part == "key" and data[s.start : s.end] == b"keys"
    )
    flip(copy, [(name.start, 0x02)])  # "keys" becomes "ieys": LMDB finds no such table
    with pytest.raises(CorruptStoreError) as raised:
        Store.open(copy, read_only=True)
    assert raised.value.path == str(copy)
    # check reports it as a finding (exit 1), not as a mistyped path (review 59)
    result = run_check(copy)
    assert result is not None and result.returncode == 1, result.stderr
    violation, summary = map(json.loads, result.stdout.splitlines())
    assert violation["kind"] == "structure" and "the store is corrupt" in violation["detail"]
    assert summary["summary"]["ok"] is False and summary["summary"]["violations"] == 1


def test_in_process_check_reports_damaged_pages_without_raising(
    reference: Reference, workdir: Path
) -> None:
    copy = workdir / "copy"
    shutil.copytree(reference.path, copy)
    branch = next(s for s in reference.spans if s.tree == "docs" and s.part == "branch-key")
    flip(copy, [(branch.start, 0xFF)])
    with Store.open(copy, read_only=True) as store:
        report = store.check()
    assert not report.ok and report.kinds() == {"structure"}
    assert all("docs" in v.detail for v in report.violations)


def test_repair_refuses_to_write_through_damaged_pages(reference: Reference, workdir: Path) -> None:
    copy = workdir / "copy"
    shutil.copytree(reference.path, copy)
    header = next(s for s in reference.spans if s.tree == "keys" and s.part == "page-header")
    flip(copy, [(header.start + 12, 0x01)])  # the page's free-space bounds
    before = (copy / "data.mdb").read_bytes()
    result = run_check(copy, repair=True)
    assert classify_check(result)[0] == "detected"
    assert (copy / "data.mdb").read_bytes() == before


def test_repair_restores_a_damaged_band_entry(reference: Reference, workdir: Path) -> None:
    """A band value flipped in place keeps the page sound: repair re-derives the band."""
    copy = workdir / "copy"
    shutil.copytree(reference.path, copy)
    value = next(
        s for s in reference.spans if s.tree.startswith("band.") and s.part == "value"
    )  # a bucket with one document: its id is the node's value
    flip(copy, [(value.start + 7, 0x01)])
    assert classify_check(run_check(copy))[0] == "detected"
    result = run_check(copy, repair=True)
    assert result is not None and result.returncode == 0, result.stdout
    assert logical_digest(copy) == reference.logical


def test_repair_drops_a_damaged_removed_record_with_its_band_entries(
    reference: Reference, workdir: Path
) -> None:
    """A record awaiting a purge cannot vouch for its band entries once damaged (a flip
    in place, under its checksum): repair re-derives the bands from the stored documents
    and empties ``removed``, which changes nothing a reader sees."""
    copy = workdir / "copy"
    shutil.copytree(reference.path, copy)
    value = next(s for s in reference.spans if s.tree == "removed" and s.part == "value")
    flip(copy, [(value.start + 20, 0x01)])
    result = run_check(copy)
    assert classify_check(result) == ("detected", "check: removed-record"), result
    result = run_check(copy, repair=True)
    assert result is not None and result.returncode == 0, result.stdout
    assert logical_digest(copy) == reference.logical
    with Store.open(copy, read_only=True) as store, store.read() as txn:
        assert txn.awaiting_purge() == 0
        assert all(txn.txn.stat(db)["entries"] == len(txn) for db in store._band_dbs)


def test_store_without_meta_checksum_still_opens(reference: Reference, workdir: Path) -> None:
    """Stores written before ``meta_checksum`` existed are read unverified."""
    copy = workdir / "copy"
    shutil.copytree(reference.path, copy)
    env = lmdb.open(str(copy), max_dbs=4)
    try:
        with env.begin(write=True) as txn:
            assert txn.delete(b"meta_checksum", db=env.open_db(codec.META_DB, txn=txn))
    finally:
        env.close()
    with Store.open(copy, read_only=True) as store:
        assert store.check().ok


def test_check_subprocess_reports_clean_on_the_reference(reference: Reference) -> None:
    result = run_check(reference.path)
    assert isinstance(result, subprocess.CompletedProcess)
    assert classify_check(result) == ("clean", "")


def test_lmdb_refusing_a_damaged_meta_page_is_a_typed_error(
    reference: Reference, workdir: Path
) -> None:
    """py-lmdb raises a plain ``lmdb.Error`` for an unknown data version (trial finding)."""
    copy = workdir / "copy"
    shutil.copytree(reference.path, copy)
    flip(copy, [(lmdbfile.PAGE_HEADER + 4, 0x10)])  # meta page 0: data version 1 -> 17
    with pytest.raises(CorruptStoreError) as raised:
        Store.open(copy, read_only=True)
    assert "data version 17" in str(raised.value)


def test_damaged_main_table_record_in_the_meta_page_is_a_typed_error(
    reference: Reference, workdir: Path
) -> None:
    """Trial finding: LMDB answers MDB_INVALID, which is no reason to call it foreign."""
    newest = max(_meta_pages(reference), key=lambda m: m.txnid)
    copy = workdir / "copy"
    shutil.copytree(reference.path, copy)
    flip(copy, [(newest.page * 4096 + lmdbfile.PAGE_HEADER + 75, 0xD0)])  # main's md_pad
    with pytest.raises(CorruptStoreError) as raised:
        Store.open(copy, read_only=True)
    assert "main table" in str(raised.value)


@pytest.mark.parametrize("create", [False, True])
def test_main_table_root_out_of_the_file_is_a_typed_error(
    reference: Reference, workdir: Path, create: bool
) -> None:
    """Regression (a trial after the merge): the probe for a creation that never committed
    read the main table through LMDB unguarded, so a root page number pointing past the
    file came out as a raw ``lmdb.PageNotFoundError`` instead of a corrupt store."""
    newest = max(_meta_pages(reference), key=lambda m: m.txnid)
    copy = workdir / "copy"
    shutil.copytree(reference.path, copy)
    # MDB_meta: magic 4, version 4, address 8, map size 8, then two 48-byte table records
    # (free list, main); the main record's root page number is its last 8 bytes.
    root = newest.page * 4096 + lmdbfile.PAGE_HEADER + 24 + 2 * 48 - 8
    flip(copy, [(root + 4, 0x20)])
    with pytest.raises(CorruptStoreError):
        Store.open(copy, create=create)


# -- the mapped file under an exception -----------------------------------------------------


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_an_error_during_the_walk_propagates_as_itself(
    reference: Reference, monkeypatch: pytest.MonkeyPatch, error: type[BaseException]
) -> None:
    """The walk unmapped the file while the propagating error's frames still held views of
    it, so ``BufferError: cannot close exported pointers exist`` replaced a Ctrl-C (exit 1
    from ``check``, not 130) or any other error (a review's finding)."""
    real_page = lmdbfile._Walker.page

    def page(walker: lmdbfile._Walker, pgno: int, tree: str) -> tuple[int, memoryview]:
        held = real_page(walker, pgno, tree)  # a view of the map, alive in this frame
        raise error(f"raised while holding page {held[0]}")

    monkeypatch.setattr(lmdbfile._Walker, "page", page)
    with pytest.raises(error, match="raised while holding page"):
        lmdbfile.walk(reference.path / "data.mdb")
    monkeypatch.undo()
    assert lmdbfile.walk(reference.path / "data.mdb").problems == []


_DAMAGED_PAGE_CASES = [
    *(("docs", 0, command) for command in ("pairs", "clusters", "export", "compact", "backup")),
    # band pages whose damage aborted a compaction or a backup inside LMDB (an assertion,
    # SIGBUS) before they walked the pages first
    *(("band", page, command) for page in (2, 4, 13) for command in ("compact", "backup")),
]


@pytest.mark.parametrize(("table", "page", "command"), _DAMAGED_PAGE_CASES)
def test_commands_that_meet_a_damaged_page_give_one_typed_error_line(
    reference: Reference, workdir: Path, table: str, page: int, command: str
) -> None:
    """The node pointers of a leaf page overwritten: the store opens, and the commands
    reading that page ended in a raw LMDB traceback with exit 1, the code for findings,
    or killed the process (review 59). ``check`` reports it; they say the store is
    corrupt, and a compaction stops before it writes anything."""
    path = workdir / "store"
    shutil.copytree(reference.path, path)
    pages = sorted(
        {
            span.start - span.start % 4096
            for span in reference.spans
            if span.part == "page-header"
            and (span.tree == "docs" if table == "docs" else span.tree.startswith("band."))
        }
    )
    flip(path, [(offset, 0x5A) for offset in range(pages[page] + 16, pages[page] + 32)])
    damaged = (path / "data.mdb").read_bytes()
    target = [str(workdir / "out")] if command in ("export", "backup") else []
    done = subprocess.run(
        [sys.executable, "-m", "neardup_store", command, str(path), *target],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"Error: {path}: the store is corrupt (")
    assert "`neardup-admin check STORE` names the damaged table" in line
    assert (path / "data.mdb").read_bytes() == damaged
