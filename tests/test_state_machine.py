"""Model-based test: a hypothesis state machine drives a real store against ``harness.Model``.

Every rule does one thing to the store (add, remove, a batch, a query, compact, purge,
rebuild, reopen, a read-only reopen, add_if_unique) and the same thing to the in-memory
model (a purge, nothing: removed documents' band entries mean nothing to it), and
compares what came back: return values, raised error types, and query answers (keys,
scores and order) exactly. After every step the document count and key order must agree;
at each full check and at teardown the store is closed and its logical dump must match the
model (:meth:`Model.differences`) and :meth:`Store.check` must be clean.

The CI setting is :data:`CI_SETTINGS`; ``tools/state_machine_long.py`` runs the same
machine with bigger settings. Shrunk failures found by the machine are kept below as
plain regression tests.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from harness import Key, Model
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from neardup_store.demo import make_corpus
from neardup_store.errors import (
    DuplicateKeyError,
    InvalidKeyError,
    KeyNotFoundError,
    NeardupError,
    ReadOnlyError,
)
from neardup_store.lsh import LSHParams, choose_params
from neardup_store.minhash import MinHashConfig, MinHasher
from neardup_store.store import Store

NUM_PERM = 64
SEED = 3
THRESHOLD = 0.7

settings.register_profile(
    "state-machine-ci",
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CI_SETTINGS = settings.get_profile("state-machine-ci")
"""What CI runs: 25 examples of 30 steps (tools/state_machine_long.py derives the long
setting from it)."""

# Near-duplicate families (planted groups of 2-4 texts, similarities 0.73-0.98) plus
# unrelated texts, so queries find matches at every threshold.
TEXTS: list[str] = list(make_corpus(documents=16, planted_groups=6, seed=5).documents.values())
SIGNATURES: npt.NDArray[np.uint32] = MinHasher(
    MinHashConfig(num_perm=NUM_PERM, seed=SEED)
).signatures(TEXTS)

# str and bytes keys that look alike, non-ASCII, and keys over the 400-byte inline limit
# (stored under their SHA-256 in the keys table).
KEYS: list[Key] = [
    "a",
    "b",
    "c",
    "d",
    "e",
    "f",
    b"a",
    b"b",
    b"\x00\xff",
    "ключ",
    "k" * 450,
    b"K" * 600,
]
BAD_KEYS: list[object] = ["", b"", 7, None, "x" * (16 * 1024 + 1)]

# Rebuild targets: (threshold, bands, rows); bands/rows None means choose_params.
REBUILDS = [(0.5, None, None), (0.8, None, None), (0.9, None, None), (None, 16, 4),
            (None, 4, 16), (None, 32, 2), (0.6, 8, 8), (0.7, None, None)]  # fmt: skip

SigSpec = tuple[int, int, int]  # (base signature index, values changed, rng seed)

keys = st.sampled_from(KEYS)
# Half the draws come from a few texts and unchanged signatures, so equal documents under
# several keys (query ties, broken by insertion order) are common.
text_ids = st.integers(0, len(TEXTS) - 1) | st.integers(0, 3)
sig_specs = st.tuples(text_ids, st.integers(0, 24) | st.just(0), st.integers(0, 2**16))
metadata = st.one_of(
    st.none(),
    st.integers(-5, 5),
    st.text(max_size=4),
    st.binary(max_size=3),
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(0, 3), max_size=2),
)
thresholds = st.sampled_from([None, 0.3, 0.5, 0.7, 0.85, 1.0])
limits = st.one_of(st.none(), st.integers(1, 4))


def signature_of(spec: SigSpec) -> npt.NDArray[np.uint32]:
    """A corpus signature with ``changed`` of its values replaced (a graded near-copy)."""
    base, changed, seed = spec
    sig = SIGNATURES[base].copy()
    rng = np.random.default_rng(seed)
    positions = rng.choice(NUM_PERM, size=changed, replace=False)
    sig[positions] = rng.integers(0, 2**32, size=changed, dtype=np.uint64).astype(np.uint32)
    return sig


# -- operations: one description runs on a transaction and predicts on a model -----------------

# An op is a plain tuple (it prints well when hypothesis shows a failing sequence):
#   ("add", key, text id, metadata, replace)      ("add_sig", key, sig spec, metadata, replace)
#   ("remove", key, missing_ok)                   ("remove_many", [keys], missing_ok)
#   ("add_many", [(key, text id, metadata)], replace)
#   ("add_signatures", [(key, sig spec, metadata)], replace)
#   ("add_if_unique", key, text id, threshold)    ("bad_key", bad key, text id)
#   ("query", text id | None, sig spec | None, threshold, limit)
Op = tuple[Any, ...]

add_ops = st.tuples(st.just("add"), keys, text_ids, metadata, st.booleans())
add_sig_ops = st.tuples(st.just("add_sig"), keys, sig_specs, metadata, st.booleans())
remove_ops = st.tuples(st.just("remove"), keys, st.booleans())
batch_ops = st.one_of(
    add_ops,
    add_sig_ops,
    remove_ops,
    st.tuples(st.just("remove_many"), st.lists(keys, max_size=4), st.booleans()),
    st.tuples(
        st.just("add_many"),
        st.lists(st.tuples(keys, text_ids, metadata), max_size=4),
        st.booleans(),
    ),
    st.tuples(
        st.just("add_signatures"),
        st.lists(st.tuples(keys, sig_specs, metadata), max_size=4),
        st.booleans(),
    ),
    st.tuples(st.just("add_if_unique"), keys, text_ids, thresholds),
    st.tuples(st.just("bad_key"), st.sampled_from(BAD_KEYS), text_ids),
    st.tuples(st.just("query"), text_ids, st.none(), thresholds, limits),
    st.tuples(st.just("query"), st.none(), sig_specs, thresholds, limits),
)


def answers(matches: list[Any]) -> list[tuple[Key, float]]:
    return [(m.key, m.score) for m in matches]


def run_op(txn: Any, op: Op) -> Any:
    """Apply ``op`` to a write transaction; return a comparable result."""
    kind = op[0]
    if kind == "add":
        _, key, text, meta, replace = op
        return txn.add(key, TEXTS[text], metadata=meta, replace=replace)
    if kind == "add_sig":
        _, key, spec, meta, replace = op
        return txn.add(key, signature=signature_of(spec), metadata=meta, replace=replace)
    if kind == "remove":
        return txn.remove(op[1], missing_ok=op[2])
    if kind == "remove_many":
        return txn.remove_many(op[1], missing_ok=op[2])
    if kind == "add_many":
        items = [(key, TEXTS[text], meta) for key, text, meta in op[1]]
        return txn.add_many(items, replace=op[2])
    if kind == "add_signatures":
        items = [(key, signature_of(spec), meta) for key, spec, meta in op[1]]
        return txn.add_signatures(items, replace=op[2])
    if kind == "add_if_unique":
        _, key, text, threshold = op
        result = txn.add_if_unique(key, TEXTS[text], threshold=threshold)
        assert result.key == key
        return (result.added, answers(result.matches))
    if kind == "bad_key":
        return txn.add(op[1], TEXTS[op[2]])
    if kind == "query":
        _, text, spec, threshold, limit = op
        if text is not None:
            return answers(txn.query(TEXTS[text], threshold=threshold, limit=limit))
        return answers(txn.query(signature=signature_of(spec), threshold=threshold, limit=limit))
    raise AssertionError(f"unknown op {kind}")


def predict(model: Model, threshold: float, op: Op) -> tuple[type[Exception] | None, Any]:
    """What ``op`` must do: ``(error type, None)``, or ``(None, result)`` with ``model``
    updated. ``threshold`` is the store's current default threshold."""
    kind, docs = op[0], model.documents
    if kind in ("add", "add_sig"):
        _, key, source, meta, replace = op
        if key in docs and not replace:
            return DuplicateKeyError, None
        existed = key in docs
        sig = SIGNATURES[source] if kind == "add" else signature_of(source)
        model.add(key, sig, meta)
        return None, existed
    if kind == "remove":
        _, key, missing_ok = op
        if key not in docs:
            return (None, False) if missing_ok else (KeyNotFoundError, None)
        model.remove(key)
        return None, True
    if kind == "remove_many":
        _, batch, missing_ok = op
        if not missing_ok and any(key not in docs for key in batch):
            return KeyNotFoundError, None
        removed = 0
        for key in batch:
            if key in docs:
                model.remove(key)
                removed += 1
        return None, removed
    if kind in ("add_many", "add_signatures"):
        _, items, replace = op
        batch_keys = [key for key, _, _ in items]
        if not replace and (
            len(set(batch_keys)) < len(batch_keys) or any(k in docs for k in batch_keys)
        ):
            return DuplicateKeyError, None
        for key, source, meta in items:
            sig = SIGNATURES[source] if kind == "add_many" else signature_of(source)
            model.add(key, sig, meta)
        return None, len(items)
    if kind == "add_if_unique":
        _, key, text, asked = op
        if key in docs:
            return DuplicateKeyError, None
        found = model.query(SIGNATURES[text], threshold if asked is None else asked)
        if found:
            return None, (False, found)
        model.add(key, SIGNATURES[text])
        return None, (True, [])
    if kind == "bad_key":
        return InvalidKeyError, None
    if kind == "query":
        _, text, spec, asked, limit = op
        sig = SIGNATURES[text] if text is not None else signature_of(spec)
        return None, model.query(sig, threshold if asked is None else asked, limit)
    raise AssertionError(f"unknown op {kind}")


class _RollBackError(Exception):
    """Raised inside a write block to make the whole batch roll back."""


def copy_model(model: Model) -> Model:
    return Model(model.banding, model.seed, dict(model.documents))


# -- the machine ------------------------------------------------------------------------------


class StoreMachine(RuleBasedStateMachine):
    """A real store in a fresh directory, and the model it must equal."""

    # Totals over every machine run in this process (tools/state_machine_long.py reports them).
    examples = 0
    steps = 0

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="neardup-sm-"))
        self.path = self.directory / "store"
        # durable=False: process-crash safe, no fsync per commit (durability is not tested here)
        self.store: Store | None = Store.open(
            self.path, create=True, num_perm=NUM_PERM, seed=SEED, threshold=THRESHOLD,
            durable=False,
        )  # fmt: skip
        self.read_only = False
        self.threshold = THRESHOLD
        self.model = Model(choose_params(THRESHOLD, NUM_PERM), SEED)
        assert self.store.banding == self.model.banding
        self.steps_taken = -1  # the invariant also runs once before the first rule
        type(self).examples += 1

    # -- helpers ------------------------------------------------------------------------------

    @property
    def s(self) -> Store:
        assert self.store is not None
        return self.store

    def expect(self, op: Op, call: Callable[[], Any]) -> None:
        """Run ``call`` (``op`` in its own transaction) and compare with the prediction."""
        if self.read_only and op[0] != "query":
            with pytest.raises(ReadOnlyError):
                call()
            return
        shadow = copy_model(self.model)
        error, result = predict(shadow, self.threshold, op)
        if error is not None:
            with pytest.raises(error):
                call()
            return
        assert call() == result
        self.model = shadow

    def open(self, read_only: bool) -> None:
        self.s.close()
        self.store = Store.open(self.path, read_only=read_only, durable=False)
        self.read_only = read_only
        assert self.store.banding == self.model.banding
        assert self.store.threshold == self.threshold

    # -- single operations (each its own transaction) -----------------------------------------

    @rule(key=keys, text=text_ids, meta=metadata, replace=st.booleans())
    def add_text(self, key: Key, text: int, meta: Any, replace: bool) -> None:
        op = ("add", key, text, meta, replace)
        self.expect(op, lambda: self.s.add(key, TEXTS[text], metadata=meta, replace=replace))

    @rule(key=keys, spec=sig_specs, meta=metadata, replace=st.booleans())
    def add_signature(self, key: Key, spec: SigSpec, meta: Any, replace: bool) -> None:
        op = ("add_sig", key, spec, meta, replace)
        sig = signature_of(spec)
        self.expect(op, lambda: self.s.add(key, signature=sig, metadata=meta, replace=replace))

    @rule(key=keys, missing_ok=st.booleans())
    def remove(self, key: Key, missing_ok: bool) -> None:
        self.expect(("remove", key, missing_ok), lambda: self.s.remove(key, missing_ok=missing_ok))

    @rule(key=keys, text=text_ids, threshold=thresholds)
    def add_if_unique(self, key: Key, text: int, threshold: float | None) -> None:
        def call() -> tuple[bool, list[tuple[Key, float]]]:
            result = self.s.add_if_unique(key, TEXTS[text], threshold=threshold)
            return (result.added, answers(result.matches))

        self.expect(("add_if_unique", key, text, threshold), call)

    @rule(
        text=st.none() | text_ids,
        spec=sig_specs,
        threshold=thresholds,
        limit=limits,
    )
    def query(
        self, text: int | None, spec: SigSpec, threshold: float | None, limit: int | None
    ) -> None:
        if text is not None:
            op: Op = ("query", text, None, threshold, limit)
            got = self.s.query(TEXTS[text], threshold=threshold, limit=limit)
        else:
            op = ("query", None, spec, threshold, limit)
            got = self.s.query(signature=signature_of(spec), threshold=threshold, limit=limit)
        assert answers(got) == predict(self.model, self.threshold, op)[1]

    @rule(
        texts=st.lists(text_ids, min_size=1, max_size=4),
        specs=st.lists(sig_specs, min_size=1, max_size=4),
        by_text=st.booleans(),
        threshold=thresholds,
        limit=limits,
    )
    def query_many(
        self,
        texts: list[int],
        specs: list[SigSpec],
        by_text: bool,
        threshold: float | None,
        limit: int | None,
    ) -> None:
        asked = self.threshold if threshold is None else threshold
        if by_text:
            got = self.s.query_many([TEXTS[t] for t in texts], threshold=threshold, limit=limit)
            sigs = [SIGNATURES[t] for t in texts]
        else:
            sigs = [signature_of(spec) for spec in specs]
            got = self.s.query_many(signatures=np.stack(sigs), threshold=threshold, limit=limit)
        assert [answers(g) for g in got] == [self.model.query(s, asked, limit) for s in sigs]

    # -- batches ------------------------------------------------------------------------------

    @rule(
        ops=st.lists(batch_ops, min_size=1, max_size=6),
        on_error=st.sampled_from(["catch", "propagate"]),
        roll_back=st.booleans(),
    )
    def batch(self, ops: list[Op], on_error: str, roll_back: bool) -> None:
        """Several operations in one ``store.write()``.

        A predicted error is either caught inside the block (the rejected operation must
        change nothing and the rest commits) or propagated (the whole batch rolls back).
        ``roll_back`` raises at the end of the block: nothing of the batch may remain.
        """
        if self.read_only:
            with pytest.raises(ReadOnlyError), self.s.write():
                pass
            return
        shadow = copy_model(self.model)
        try:
            with self.s.write() as txn:
                for op in ops:
                    error, result = predict(shadow, self.threshold, op)
                    if error is None:
                        assert run_op(txn, op) == result, op
                        continue
                    with pytest.raises(error):
                        run_op(txn, op)
                    if on_error == "propagate":
                        raise _RollBackError
                if roll_back:
                    raise _RollBackError
        except _RollBackError:
            return
        self.model = shadow

    # -- maintenance and reopening ------------------------------------------------------------

    @rule(dry_run_first=st.booleans())
    def compact(self, dry_run_first: bool) -> None:
        if self.read_only:
            with pytest.raises(ReadOnlyError):
                self.s.compact()
            return
        estimate = self.s.compact(dry_run=True) if dry_run_first else None
        report = self.s.compact()
        assert report.bytes_after == (self.path / "data.mdb").stat().st_size
        if estimate is not None:
            # An upper bound: band entries awaiting a purge (which compaction purges first)
            # still take pages, and pages that removals left partly empty count whole.
            assert estimate.bytes_after >= report.bytes_after
            assert estimate.bytes_before == report.bytes_before
        with self.s.read() as reader:
            assert reader.awaiting_purge() == 0
        assert self.s.compact(dry_run=True).bytes_after == report.bytes_after
        assert not [p for p in self.path.iterdir() if p.name.startswith(".compact-")]

    @rule(limit=st.none() | st.integers(1, 3))
    def purge(self, limit: int | None) -> None:
        """Purge the band entries of removed documents: all (``Store.purge``) or up to
        ``limit`` in one transaction (``WriteTxn.purge``). Answers must not change (the
        invariant and the full checks compare everything else)."""
        if self.read_only:
            with pytest.raises(ReadOnlyError):
                self.s.purge()
            return
        with self.s.read() as reader:
            awaiting = reader.awaiting_purge()
        if limit is None:
            assert self.s.purge() == awaiting
        else:
            with self.s.write() as txn:
                assert txn.purge(limit) == min(limit, awaiting)
        with self.s.read() as reader:
            left = reader.awaiting_purge()
        assert left == (0 if limit is None else awaiting - min(limit, awaiting))

    @rule(target_banding=st.sampled_from(REBUILDS))
    def rebuild(self, target_banding: tuple[float | None, int | None, int | None]) -> None:
        threshold, bands, rows = target_banding
        if self.read_only:
            with pytest.raises(ReadOnlyError):
                self.s.rebuild(threshold, bands, rows)
            return
        report = self.s.rebuild(threshold, bands, rows)
        new_threshold = self.threshold if threshold is None else threshold
        expected = (
            choose_params(new_threshold, NUM_PERM)
            if bands is None or rows is None
            else LSHParams(bands, rows)
        )
        assert report.documents == len(self.model.documents)
        assert report.new_params.banding == expected == self.s.banding
        assert self.s.threshold == new_threshold
        with self.s.read() as reader:
            assert reader.awaiting_purge() == 0  # the new band tables hold none of them
        self.model.banding, self.threshold = expected, new_threshold

    @rule()
    def reopen(self) -> None:
        self.open(read_only=False)

    @rule()
    def reopen_read_only(self) -> None:
        self.open(read_only=True)

    @precondition(lambda self: self.read_only)
    @rule(key=keys, text=text_ids)
    def write_is_refused_while_read_only(self, key: Key, text: int) -> None:
        """Every way to write raises ReadOnlyError (the invariant shows nothing changed)."""
        writes: list[Callable[[], Any]] = [
            lambda: self.s.add(key, TEXTS[text]),
            lambda: self.s.add_many([(key, TEXTS[text])]),
            lambda: self.s.remove(key, missing_ok=True),
            lambda: self.s.remove_many([key], missing_ok=True),
            lambda: self.s.add_if_unique(key, TEXTS[text]),
            lambda: self.s.check(repair=True),
            lambda: self.s.purge(),
        ]
        for write in writes:
            with pytest.raises(ReadOnlyError) as caught:
                write()
            assert str(self.path) in str(caught.value)

    @rule()
    def full_check(self) -> None:
        self.check_against_model()

    def check_against_model(self) -> None:
        """Close (the dumps need the store closed here), compare, reopen, run check()."""
        read_only = self.read_only
        self.s.close()
        assert self.model.differences(self.path) == []
        self.store = Store.open(self.path, read_only=read_only, durable=False)
        report = self.s.check()
        assert report.ok, report.violations
        assert report.documents_checked == len(self.model.documents)

    # -- after every step ---------------------------------------------------------------------

    @invariant()
    def same_documents_in_order(self) -> None:
        self.steps_taken += 1
        assert len(self.s) == len(self.model.documents)
        assert list(self.s) == list(self.model.documents)

    def teardown(self) -> None:
        type(self).steps += max(self.steps_taken, 0)
        try:
            if self.store is not None and self.store._env is not None:
                self.check_against_model()
        finally:
            if self.store is not None:
                self.store.close()
            shutil.rmtree(self.directory, ignore_errors=True)


TestStoreStateMachine = StoreMachine.TestCase
TestStoreStateMachine.settings = CI_SETTINGS


def test_every_error_the_machine_expects_is_typed() -> None:
    """The machine only ever expects NeardupError subclasses (never raw LMDB errors)."""
    for error in (DuplicateKeyError, InvalidKeyError, KeyNotFoundError, ReadOnlyError):
        assert issubclass(error, NeardupError)


# -- regressions found by the machine -----------------------------------------------------------


def test_a_second_rebuild_to_more_bands_reopens_an_environment_a_first_one_left_small(
    tmp_path: Path,
) -> None:
    """Found by the machine: rebuild(0.5) went from 8 to 14 bands without reopening (the
    environment, opened for 8, had room), then rebuild(bands=32) compared with the limit of
    a 14-band store instead of the environment's own and died of a raw ``DbsFullError``."""
    with Store.open(
        tmp_path / "s", create=True, num_perm=NUM_PERM, seed=SEED, threshold=0.7, bands=8, rows=8
    ) as store:
        store.add_signatures([(f"k{i}", sig) for i, sig in enumerate(SIGNATURES)])
        store.rebuild(threshold=0.5, bands=14, rows=4)
        assert store.banding == LSHParams(14, 4)
        store.rebuild(bands=32, rows=2)
        assert store.banding == LSHParams(32, 2) and store.check().ok
        assert store.query(signature=SIGNATURES[3])[0].key == "k3"
    model = Model(LSHParams(32, 2), SEED)
    for i, sig in enumerate(SIGNATURES):
        model.add(f"k{i}", sig)
    assert model.differences(tmp_path / "s") == []
