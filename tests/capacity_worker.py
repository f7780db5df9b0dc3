"""Child processes of the capacity suite, and the parent side of a disk-full trial.

Shared by ``tests/test_capacity.py`` (short setting) and ``tools/disk_full_trials.py``
(long setting). Run as a script it is one child:

* ``reader PATH ACKS STOP READY``: holds read snapshots of a store another process is filling,
  checks each one inside its single transaction, keeps it open until the writer has
  committed again (so the map may grow under it), then begins a new one, which must adopt
  the grown map. Prints a JSON report.
* ``batch PATH SPEC``: opens the store, caps its own file size (``RLIMIT_FSIZE`` soft limit,
  SIGXFSZ ignored so a write past it fails with EFBIG instead of killing the process),
  tries one batch, reports, checks reads, then waits for the parent's go-ahead, lifts the
  limit and retries the same batch. One JSON line per step.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

HERE = Path(__file__).resolve().parent
PROJECT_ROOT = HERE.parent
if str(PROJECT_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(PROJECT_ROOT))

from harness import Model, band_table_entry, raw_digest  # noqa: E402

from neardup_store import codec  # noqa: E402
from neardup_store.errors import NeardupError, StoreFullError  # noqa: E402
from neardup_store.lsh import band_keys  # noqa: E402
from neardup_store.minhash import MinHasher  # noqa: E402
from neardup_store.store import Store  # noqa: E402
from neardup_store.txn import WriteTxn  # noqa: E402

# Small signatures keep ingestion fast; 16 bands of 4 rows as in a real configuration.
PARAMS: dict[str, Any] = {"threshold": 0.7, "num_perm": 64, "bands": 16, "rows": 4}
SMALLEST_MAP = 1 << 16
"""The smallest ``map_size`` that :meth:`Store.open` accepts."""
WAIT_S = 120.0


def child_env() -> dict[str, str]:
    """Environment of a child: this worktree's package and the harness importable."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), str(HERE)])}


def spawn(*args: str) -> subprocess.Popen[str]:
    """Start this module as a child process with ``args``."""
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *args],
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# -- batches -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """One write transaction, rebuilt identically in parent and child from its fields.

    ``adds`` documents by signature and ``texts`` by text, keys ``{prefix}-s{i}`` and
    ``{prefix}-t{i}`` with ``meta_bytes`` of metadata each; ``removes`` are stored keys.
    ``purge`` purges, last in the transaction, every removed document awaiting a purge
    (this batch's removals too): it deletes their band entries.
    """

    prefix: str
    seed: int
    adds: int
    texts: int = 0
    meta_bytes: int = 0
    removes: tuple[str, ...] = ()
    purge: bool = False

    def to_json(self) -> str:
        return json.dumps({**self.__dict__, "removes": list(self.removes)})

    @classmethod
    def from_json(cls, text: str) -> Batch:
        fields = json.loads(text)
        return cls(**{**fields, "removes": tuple(fields["removes"])})

    def signature_items(self, num_perm: int) -> list[tuple[str, npt.NDArray[np.uint32], Any]]:
        rng = np.random.default_rng(self.seed)
        sigs = rng.integers(0, 2**32, size=(self.adds, num_perm), dtype=np.uint32)
        return [(f"{self.prefix}-s{i}", sigs[i], self.metadata(i)) for i in range(self.adds)]

    def text_items(self) -> list[tuple[str, str, Any]]:
        rng = np.random.default_rng(self.seed + 1)
        words = ["".join(chr(97 + c) for c in rng.integers(0, 26, 6)) for _ in range(400)]
        return [
            (
                f"{self.prefix}-t{i}",
                " ".join(words[j] for j in rng.integers(0, len(words), 40)),
                self.metadata(i),
            )
            for i in range(self.texts)
        ]

    def metadata(self, index: int) -> Any:
        return {"i": index, "pad": b"m" * self.meta_bytes} if self.meta_bytes else None

    def write(self, txn: WriteTxn) -> None:
        """Apply the batch inside one write transaction."""
        if self.removes:
            txn.remove_many(list(self.removes))
        if self.adds:
            txn.add_signatures(self.signature_items(txn._store.config.num_perm))
        if self.texts:
            txn.add_many(self.text_items())
        if self.purge:
            txn.purge()

    def apply(self, model: Model, hasher: MinHasher) -> None:
        """What committing the batch does to the reference model."""
        for key in self.removes:
            model.remove(key)
        for key, sig, meta in self.signature_items(hasher.config.num_perm):
            model.add(key, sig, meta)
        items = self.text_items()
        if items:
            sigs = hasher.signatures([text for _, text, _ in items])
            for (key, _, meta), sig in zip(items, sigs, strict=True):
                model.add(key, sig, meta)


# -- reader child --------------------------------------------------------------------------


def keys_digest(txn: Any) -> str:
    """SHA-256 of the keys table as one transaction sees it."""
    digest = hashlib.sha256()
    with txn.txn.cursor(db=txn._store._keys_db) as cursor:
        for index, doc_id in cursor:
            digest.update(bytes(index) + b"\0" + bytes(doc_id))
    return digest.hexdigest()


def check_snapshot(txn: Any, rng: np.random.Generator, sample: int = 40) -> dict[str, Any]:
    """Check that one read transaction is internally consistent; return what it saw.

    Counts agree across tables (every band table holds an entry for each document and
    each removed one awaiting a purge), every record is indexed under its own key, a
    sample of documents has exactly its band entries and is found by a query with its
    signature, and a sample of removed documents still has its band entries but no key
    and is not found.
    """
    store = txn._store
    raw = txn.txn
    docs = int(raw.stat(store._docs_db)["entries"])
    keys = int(raw.stat(store._keys_db)["entries"])
    removed = txn.awaiting_purge()
    bands = [int(raw.stat(db)["entries"]) for db in store._band_dbs]
    assert keys == docs and all(n == docs + removed for n in bands), (docs, removed, keys, bands)
    picks = set(rng.choice(docs, size=min(sample, docs), replace=False).tolist()) if docs else set()
    sampled, seen = [], 0
    with raw.cursor(db=store._docs_db) as cursor:
        for doc_id, record in cursor:
            key_raw, is_str = codec.record_key(record, codec.decode_id(doc_id))
            index = codec.key_index(key_raw, is_str)
            assert raw.get(index, db=store._keys_db) == bytes(doc_id), key_raw
            if seen in picks:
                sampled.append((bytes(doc_id), bytes(record)))
            seen += 1
    assert seen == docs, (seen, docs)
    gone, seen = [], 0
    if removed:
        picks = set(rng.choice(removed, size=min(sample // 4, removed), replace=False).tolist())
        with raw.cursor(db=store._removed_db) as cursor:
            for doc_id, record in cursor:
                assert raw.get(doc_id, db=store._docs_db) is None, codec.decode_id(doc_id)
                if seen in picks:
                    gone.append((bytes(doc_id), bytes(record)))
                seen += 1
    assert seen == removed, (seen, removed)
    for doc_id, record, live in [(*d, True) for d in sampled] + [(*d, False) for d in gone]:
        sig = codec.decode_signature(record, codec.decode_id(doc_id))
        row = codec.encode_band_keys(band_keys(sig[None, :], store.banding, store.config.seed)[0])
        for band, band_key in enumerate(row):
            with raw.cursor(db=store._band_dbs[band]) as cursor:
                assert cursor.set_key_dup(*band_table_entry(band_key, doc_id)), (band, doc_id)
        key_raw, is_str = codec.record_key(record, codec.decode_id(doc_id))
        key = key_raw.decode() if is_str else key_raw
        found = {m.key: m.score for m in txn.query(signature=sig)}
        if live:
            assert found.get(key) == 1.0, (key, found)
        else:  # removed: no key entry names it, and queries skip it
            named = raw.get(codec.key_index(key_raw, is_str), db=store._keys_db)
            assert named != doc_id, key_raw
            assert named is not None or key not in found, (key, found)
    counter = int(codec.unpack_meta(raw.get(b"commit_counter", db=store._meta_db)))
    return {"commit": counter, "docs": docs, "removed": removed, "keys_digest": keys_digest(txn)}


def read_acks(path: Path) -> dict[int, dict[str, Any]]:
    """The writer's acknowledgements so far, by commit counter (a torn last line is skipped)."""
    acks = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                ack = json.loads(line)
            except ValueError:
                continue
            acks[int(ack["commit"])] = ack
    return acks


def reader(path: str, ack_path: Path, stop: Path, ready: Path) -> None:
    rng = np.random.default_rng(os.getpid())
    report: dict[str, Any] = {"snapshots": 0, "held_across_commit": 0, "held_across_growth": 0}
    # Asking for the smallest map makes this reader start with the map the store has now,
    # as a reader does that opened before the writer grew it past the default size.
    with Store.open(path, read_only=True, map_size=SMALLEST_MAP) as store:
        assert store._env is not None
        report["first_map_size"] = int(store._env.info()["map_size"])
        while True:
            finished = stop.exists()
            with store.read() as txn:
                mine = int(store._env.info()["map_size"])
                seen = check_snapshot(txn, rng)
                ready.touch()
                # Hold the snapshot until the writer commits again (or stops), then it must
                # still show exactly the same state.
                deadline = time.monotonic() + WAIT_S
                while not finished and max(read_acks(ack_path), default=-1) <= seen["commit"]:
                    assert time.monotonic() < deadline, "the writer made no progress"
                    if stop.exists():
                        break
                    time.sleep(0.01)
                again = check_snapshot(txn, rng)
                assert again == seen, (again, seen)
                acks = read_acks(ack_path)
                if max(acks, default=-1) > seen["commit"]:
                    report["held_across_commit"] += 1
                    if max(ack["map_size"] for ack in acks.values()) > mine:
                        report["held_across_growth"] += 1
            ack = acks.get(seen["commit"])  # the snapshot is exactly one commit's state
            assert ack is not None, seen
            assert [ack[k] for k in ("docs", "removed", "keys_digest")] == [
                seen[k] for k in ("docs", "removed", "keys_digest")
            ], (ack, seen)
            report["snapshots"] += 1
            if finished:
                break
        report["adoptions"] = store.map_epoch
        info = store._env.info()
        report["final_map_size"] = int(info["map_size"])
        report["final_used"] = (int(info["last_pgno"]) + 1) * int(store._env.stat()["psize"])
        report["final"] = seen
    print(json.dumps(report), flush=True)


def write_ack(store: Store, ack_path: Path) -> dict[str, Any]:
    """Record the state the writer just committed, for the readers to compare with."""
    assert store._env is not None
    with store.read() as txn:
        raw = txn.txn
        counter = int(codec.unpack_meta(raw.get(b"commit_counter", db=store._meta_db)))
        ack = {
            "commit": counter,
            "docs": len(txn),
            "removed": txn.awaiting_purge(),
            "keys_digest": keys_digest(txn),
            "map_size": int(store._env.info()["map_size"]),
        }
    with ack_path.open("a") as out:
        out.write(json.dumps(ack) + "\n")
    return ack


# -- disk-full child -----------------------------------------------------------------------


def _outcome(error: BaseException | None) -> dict[str, Any]:
    if error is None:
        return {"outcome": "committed"}
    kind = "typed" if isinstance(error, StoreFullError) else "untyped"
    return {
        "outcome": kind,
        "error": type(error).__name__,
        "message": str(error),
        "neardup": isinstance(error, NeardupError),
        "trace": "" if kind == "typed" else "".join(traceback.format_exception(error)),
    }


def _try(store: Store, batch: Batch) -> BaseException | None:
    try:
        with store.write() as txn:
            batch.write(txn)
    except Exception as err:  # classified by the parent
        return err
    return None


def batch_child(path: str, spec: dict[str, Any]) -> None:
    """See the module docstring (``batch``); ``spec`` has the batch and the limit."""
    batch = Batch.from_json(spec["batch"])
    out = sys.stdout
    with Store.open(path, map_size=spec.get("map_size")) as store:
        assert store._env is not None
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        size = os.path.getsize(Path(path) / "data.mdb")
        if spec.get("limit_extra") is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (size + int(spec["limit_extra"]), hard))
        epoch = store.map_epoch
        error = _try(store, batch)
        first = _outcome(error)
        first.update(event="first", grew=store.map_epoch != epoch, file_bytes=size)
        if error is not None:  # the store must still serve reads of the last commit
            first["reads"] = _reads_ok(store, spec)
        _say(out, first)
        if sys.stdin.readline().strip() != "go":
            return
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        retry = _outcome(_try(store, batch)) if error is not None else {"outcome": "none"}
        retry["event"] = "retry"
        _say(out, retry)


def _reads_ok(store: Store, spec: dict[str, Any]) -> str:
    """``"ok"``, or what a read after the failed batch got wrong."""
    try:
        with store.read() as txn:
            if len(txn) != spec["docs_before"]:
                return f"{len(txn)} documents, expected {spec['docs_before']}"
            probe = spec.get("probe")
            if probe is not None:
                sig = txn.get(probe).signature
                if not any(m.key == probe and m.score == 1.0 for m in txn.query(signature=sig)):
                    return f"query for {probe!r} did not find it"
    except Exception as err:  # reported, not raised: the parent classifies it
        return f"{type(err).__name__}: {err}"
    return "ok"


def _say(out: IO[str], message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


# -- the parent side of a disk-full trial --------------------------------------------------


@dataclass
class Trial:
    """What one disk-full trial showed; ``kind`` is the classification."""

    kind: str  # committed | typed | untyped | killed | lost | changed | retry_failed | broken
    grew: bool = False
    detail: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)


def disk_full_trial(
    path: Path,
    model: Model,
    hasher: MinHasher,
    batch: Batch,
    limit_extra: int | None,
    between: Any = None,
    map_size: int | None = None,
) -> Trial:
    """Try ``batch`` in a child whose file size is capped ``limit_extra`` bytes above the
    data file, check the store from outside, lift the cap, retry the same batch.

    ``model`` must equal the store on entry and is updated with what was committed;
    ``map_size`` is passed to the child's :meth:`Store.open`. ``between`` (optional) runs
    after the first attempt and before the retry: a test that fills a real disk frees it
    there. The store must not be open in this process.
    """
    before = raw_digest(path)
    probe = next(iter(model.documents), None)
    spec = {
        "batch": batch.to_json(),
        "limit_extra": limit_extra,
        "docs_before": len(model.documents),
        "probe": probe,
        "map_size": map_size,
    }
    child = spawn("batch", str(path), json.dumps(spec))
    trial = Trial("broken")
    try:
        assert child.stdout is not None and child.stdin is not None
        line = child.stdout.readline()
        if not line:
            return _ended(child, trial)
        first = json.loads(line)
        trial.messages.append(first)
        trial.grew = bool(first.get("grew"))
        if first["outcome"] == "committed":
            batch.apply(model, hasher)
            trial.kind = "committed"
        else:
            trial.kind = first["outcome"]
            if first.get("reads") != "ok":
                trial.kind, trial.detail = "changed", f"reads after the failure: {first['reads']}"
        problems = model.differences(path)
        if first["outcome"] != "committed" and raw_digest(path) != before:
            problems.append("the failed batch changed the stored bytes")
        if problems:
            lost = any(p.startswith("missing") for p in problems)
            trial.kind, trial.detail = ("lost" if lost else "changed"), "; ".join(problems[:5])
        if between is not None:
            between()
        child.stdin.write("go\n")
        child.stdin.flush()
        line = child.stdout.readline()
        if not line:
            return _ended(child, trial)
        retry = json.loads(line)
        trial.messages.append(retry)
        if first["outcome"] != "committed":
            if retry["outcome"] == "committed":
                batch.apply(model, hasher)
            elif trial.kind in ("typed", "untyped"):
                trial.kind, trial.detail = "retry_failed", retry.get("message", "")
        problems = model.differences(path)
        if problems and trial.kind in ("committed", "typed", "untyped"):
            lost = any(p.startswith("missing") for p in problems)
            trial.kind, trial.detail = ("lost" if lost else "changed"), "; ".join(problems[:5])
        child.stdin.close()
        if child.wait(timeout=WAIT_S) != 0:
            return _ended(child, trial)
        return trial
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        for stream in (child.stdin, child.stdout, child.stderr):
            if stream is not None and not stream.closed:
                stream.close()


def _ended(child: subprocess.Popen[str], trial: Trial) -> Trial:
    """The child stopped before its report: killed by a signal, or crashed."""
    code = child.wait(timeout=WAIT_S)
    err = child.stderr.read() if child.stderr is not None else ""
    trial.kind = "killed" if code < 0 else "untyped"
    trial.detail = f"exit {code}: {err[-2000:]}"
    return trial


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "reader":
        reader(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5]))
    elif role == "batch":
        batch_child(sys.argv[2], json.loads(sys.argv[3]))
    else:
        raise SystemExit(f"unknown role {role!r}")
