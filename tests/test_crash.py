"""Crash suite: a SIGKILLed writer leaves the store at its last committed state.

A real writer process (``tests/crash_writer.py``) commits deterministic batches of adds,
replaces and removes and acknowledges each one after its commit returns. It is killed with
SIGKILL at random moments and, through the test-only hook :mod:`neardup_store._faults`, at
chosen points inside a write transaction (after a document's record, after its band
entries, after a removal, after a purge of removed documents' band entries, just before
and just after the commit, right after the map grew while a batch is redone, and while the
store is being created). After every kill the loop
of ``tests/crash_loop_core.py`` reopens the store and compares it with a reference model;
kills accumulate on one store. The long setting is ``python tools/crash_loop.py``.

SIGKILL ends the process but not the machine: the kernel keeps the page cache, so these
tests prove the transaction boundaries, not that commits reach the disk (``durable=True``,
the default, is what makes LMDB fsync each commit; a power cut is not simulated).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest
from crash_loop_core import FAULT_POINTS, OPENING_FAULTS, PROJECT_ROOT, CrashLoop
from crash_writer import (
    ACK_EARLY,
    CREATE_MAP_SIZE,
    PURGE_EVERY,
    STORE_OPTIONS,
    ModelBuilder,
    batch,
    expected_model,
    write_batch,
)
from harness import band_table_entry, orphan_band_entries

from neardup_store import NotAStoreError, Store, _faults, codec
from neardup_store.txn import WriteTxn

# Every fault point once (the opening ones hit a fresh store), between 12 kills from outside.
CI_SCHEDULE: list[str | None] = [
    *OPENING_FAULTS,
    None,
    "after-put:7",
    None,
    None,
    "after-bands:12",
    None,
    "after-remove:5",
    None,
    "after-purge:2",
    None,
    "before-commit:2",
    None,
    None,
    "after-commit:2",
    None,
    None,
    None,
]


def test_kills_at_random_moments_and_at_every_fault_point_lose_nothing(tmp_path: Path) -> None:
    loop = CrashLoop(tmp_path / "store", seed=7, rng_seed=2024)
    summary = loop.run_schedule(CI_SCHEDULE)

    assert summary.problems == []
    assert summary.kills == len(CI_SCHEDULE)
    assert summary.fault_kills_by_point == {
        point: sum(f is not None and f.startswith(point + ":") for f in CI_SCHEDULE)
        for point in FAULT_POINTS
    }
    assert summary.lost_acknowledged_commits == 0
    assert summary.invariant_violations == 0
    assert summary.acknowledged_commits > 0 and summary.last_committed >= 0
    # The last round left the store at the model's state with the marker of that batch.
    assert expected_model(7, summary.last_committed).differences(tmp_path / "store") == []


def test_the_growth_fault_points_of_a_fresh_store_fall_inside_a_redone_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # OPENING_FAULTS relies on this: the first two map growths of the crash store are the
    # ones that redo a batch after MapFullError (LMDB's failed transaction is dead).
    growths: list[str] = []
    redo = WriteTxn._redo_after_growth

    def counted(self: WriteTxn) -> None:
        growths.append("redo")
        redo(self)

    monkeypatch.setattr(WriteTxn, "_redo_after_growth", counted)
    options = {"create": True, "map_size": CREATE_MAP_SIZE, **STORE_OPTIONS}
    with Store.open(tmp_path / "store", **options) as store:
        epochs = []
        for s in range(2):
            write_batch(store, batch(7, s))
            epochs.append(store.map_epoch)
    assert growths == ["redo", "redo"] and epochs == [1, 2]
    assert expected_model(7, 1).differences(tmp_path / "store") == []


def test_the_loop_notices_an_acknowledged_commit_that_is_not_stored(tmp_path: Path) -> None:
    # Negative control: a writer that acknowledges before committing, killed just before
    # its commit, has acknowledged a batch the store does not hold.
    loop = CrashLoop(tmp_path / "store", seed=7, rng_seed=1)
    loop.run_schedule(["after-commit:1"])  # one committed batch to start from
    result = loop.run_round("before-commit:3", extra_env={ACK_EARLY: "1"})

    assert result.killed and result.lost == 1
    assert loop.summary.lost_acknowledged_commits == 1
    assert any(p.startswith("lost acknowledged") for p in result.problems)


def test_the_verification_notices_an_orphan_band_entry(tmp_path: Path) -> None:
    # Negative control for "no orphan band entries": add one behind the store's back.
    loop = CrashLoop(tmp_path / "store", seed=7, rng_seed=1)
    loop.run_schedule(["after-commit:3"])
    env = lmdb.open(str(tmp_path / "store"), max_dbs=64)
    with env.begin(write=True) as txn:
        band = env.open_db(codec.band_table_name(0, 0), txn=txn, dupsort=True, dupfixed=True)
        entry = band_table_entry(b"\x00" * 8, codec.encode_id(10**9))
        txn.put(*entry, db=band, dupdata=True)
    env.close()

    assert len(orphan_band_entries(tmp_path / "store")) == 1
    problems: list[str] = []
    loop._verify(loop.committed, problems)
    assert any("orphan band entries" in p for p in problems)
    assert any(p.startswith("check:") for p in problems)
    assert any("differs from the model" in p for p in problems)


def test_expected_model_is_a_pure_function_of_seed_and_batch() -> None:
    builder = ModelBuilder(3)
    builder.advance(10)
    incremental = builder.advance(35)
    fresh = expected_model(3, 35)
    assert incremental.documents.keys() == fresh.documents.keys()
    assert all(
        (incremental.documents[k][0] == fresh.documents[k][0]).all()
        and incremental.documents[k][1] == fresh.documents[k][1]
        for k in fresh.documents
    )
    assert incremental.band_entries() == fresh.band_entries()
    assert expected_model(4, 35).documents.keys() != fresh.documents.keys()
    # So is the count of removed documents awaiting a purge, when advancing restarts too.
    again = ModelBuilder(3)
    again.advance(20)
    again.advance(34)
    builder.advance(34)  # behind its batch 35: from empty again
    assert builder.s == again.s == 34 and builder.awaiting == again.awaiting > 0


def test_the_writer_purges_and_the_model_counts_what_awaits_a_purge(tmp_path: Path) -> None:
    # Removed documents keep their band entries until a purge; the writer purges in every
    # PURGE_EVERY-th batch, some of them (a limited purge) or all, and the model follows.
    builder = ModelBuilder(7)
    options = {"create": True, "map_size": CREATE_MAP_SIZE, **STORE_OPTIONS}
    counts = []
    with Store.open(tmp_path / "store", **options) as store:
        for s in range(12 * PURGE_EVERY):  # the first 20 batches remove few documents
            write_batch(store, batch(7, s))
            builder.advance(s)
            with store.read() as reader:
                counts.append(reader.awaiting_purge())
            assert counts[-1] == builder.awaiting, s
            report = store.check()  # what the crash loop checks after a kill
            assert report.ok, (s, report.violations)
    assert builder.model.differences(tmp_path / "store") == []
    purging = [s for s in range(len(counts)) if batch(7, s).purge]
    assert purging == list(range(PURGE_EVERY - 1, len(counts), PURGE_EVERY))
    full = [s for s in purging if batch(7, s).purge_limit is None]
    assert full and all(counts[s] == 0 for s in full)
    assert any(counts[s] > 0 for s in purging if s not in full)  # a limited purge left some


def test_the_verification_notices_a_purge_the_model_did_not_make(tmp_path: Path) -> None:
    # Negative control for the count of removed documents awaiting a purge: a purge changes
    # no document and no band entry a reader sees, so only that count can tell.
    loop = CrashLoop(tmp_path / "store", seed=7, rng_seed=1)
    loop.run_schedule(["after-commit:2"])  # batches 0..1: no purge yet, some awaiting one
    assert loop.summary.problems == [] and loop.models.awaiting > 0
    with Store.open(tmp_path / "store") as store:
        assert store.purge() == loop.models.awaiting

    problems: list[str] = []
    loop._verify(loop.committed, problems)
    assert len(problems) == 1 and "await a purge" in problems[0], problems


def _create_in_child(path: Path, fault: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "NEARDUP_FAULT": fault}
    code = "import sys, neardup_store as nd; nd.Store.open(sys.argv[1], create=True)"
    return subprocess.run([sys.executable, "-c", code, str(path)], env=env, check=False).returncode


def test_init_goes_on_where_a_killed_init_left_an_unfinished_store(tmp_path: Path) -> None:
    """`neardup-admin init` after a killed creation creates the store (it used to refuse,
    telling the user to run init), and still refuses a store that exists."""
    from click.testing import CliRunner

    from neardup_store.cli import cli

    path = tmp_path / "store"
    assert _create_in_child(path, "before-create:1") == -signal.SIGKILL
    runner = CliRunner()
    created = runner.invoke(cli, ["init", str(path), "--num-perm", "64"])
    assert created.exit_code == 0, created.output
    with Store.open(path) as store:
        assert store.config.num_perm == 64 and store.check().ok
    again = runner.invoke(cli, ["init", str(path)])
    assert again.exit_code == 2 and "a store already exists here" in again.output


def test_import_goes_on_where_a_killed_creation_left_an_unfinished_store(
    tmp_path: Path,
) -> None:
    """`neardup-admin import` into a path where a creation was killed refused (telling the
    user to run init, whose store then had the wrong configuration for the export);
    create_from_export refused any data.mdb (a review's finding)."""
    import io

    from click.testing import CliRunner

    from neardup_store.cli import cli

    with Store.open(tmp_path / "source", create=True, num_perm=32) as source:
        source.add_many([("a", "the first of two documents"), ("b", "and the second one")])
        stream = io.BytesIO()
        source.export(stream)
    path = tmp_path / "copy"
    assert _create_in_child(path, "before-create:1") == -signal.SIGKILL
    runner = CliRunner()
    imported = runner.invoke(cli, ["import", "-", str(path)], input=stream.getvalue())
    assert imported.exit_code == 0, imported.output
    with Store.open(path) as store:
        assert store.config.num_perm == 32 and len(store) == 2 and store.check().ok
    library = tmp_path / "library"
    assert _create_in_child(library, "before-create:1") == -signal.SIGKILL
    with Store.create_from_export(library, io.BytesIO(stream.getvalue())) as store:
        assert len(store) == 2


def test_a_creation_killed_before_its_commit_can_be_created_again(tmp_path: Path) -> None:
    # Regression: the meta table used to be made in a transaction of its own, and any
    # environment without our meta entries was refused, so a creation killed before its
    # commit left a directory no later open could use, not even with create=True.
    path = tmp_path / "store"
    assert _create_in_child(path, "before-create:1") == -signal.SIGKILL
    assert (path / "data.mdb").exists()

    with pytest.raises(NotAStoreError, match=r"creation has not committed.*create=True"):
        Store.open(path)
    with Store.open(path, create=True, **STORE_OPTIONS) as store:
        store.add("a", "a document written after the crash")
        assert store.check().ok and len(store) == 1
    with Store.open(path) as store:
        assert "a" in store


def test_an_empty_meta_table_left_by_an_older_creation_is_created_over(tmp_path: Path) -> None:
    path = tmp_path / "store"
    env = lmdb.open(str(path), max_dbs=4)
    env.open_db(codec.META_DB)  # what a creation killed before its commit used to leave
    env.close()
    with Store.open(path, create=True) as store:
        assert store.check().ok


def test_another_applications_environment_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "other"
    env = lmdb.open(str(path), max_dbs=4)
    with env.begin(write=True) as txn:
        txn.put(b"their-key", b"their value")
    env.close()
    with pytest.raises(NotAStoreError, match="meta"):
        Store.open(path, create=True)
    env = lmdb.open(str(path), max_dbs=4, readonly=True)
    with env.begin() as txn:
        assert txn.get(b"their-key") == b"their value"
    env.close()


def test_commits_are_synced_by_default_and_the_writer_keeps_the_default(tmp_path: Path) -> None:
    # SIGKILL cannot prove durability (the page cache survives it); this pins the setting
    # that does: LMDB syncs data and meta pages at each commit unless durable=False.
    assert "durable" not in STORE_OPTIONS
    with Store.open(tmp_path / "store", create=True) as store:
        flags = store._require_env().flags()
        assert store.durable and flags["sync"] and flags["metasync"] and not flags["writemap"]


@pytest.mark.parametrize("value", ["after-put", "nowhere:1", "after-put:0", "after-put:x"])
def test_a_malformed_fault_setting_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="NEARDUP_FAULT"):
        _faults._parse(value)


def test_the_fault_hook_is_unarmed_without_its_variable() -> None:
    assert _faults._parse(None) is None and _faults._parse("") is None
    if "NEARDUP_FAULT" not in os.environ:
        assert _faults._armed is None
