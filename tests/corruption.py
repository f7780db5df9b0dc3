"""Corruption trials: flip bytes of a store's ``data.mdb`` and see what ``check`` says.

Shared by ``tests/test_corruption.py`` (a short setting) and ``tools/corruption_trials.py``
(the long one). A trial copies a reference store, flips one or more bytes (or single
bits) of its ``data.mdb`` at random offsets or inside a chosen region, runs
``neardup-admin check --json`` in a subprocess with a timeout and classifies the outcome:

* ``detected``: exit 1 with violations listed (a store too damaged to open is one), or
  exit 2 with one typed ``Error:`` line naming the damage;
* ``harmless``: exit 0, and in a fresh subprocess the logical dump and the answers to
  the probes (every key's lookup, ``len``, fixed queries) equal the reference's. Only a
  flip that changes no meaning can be harmless: bytes LMDB does not read (free pages,
  the slack between a page's node pointers and its nodes, unused parts of a meta page),
  fields no reader uses (the older meta page until the next commit overwrites it, the
  meta page's map address and map size, which the store sets itself), and meta entries
  without meaning for the data (``commit_counter``, ``package_version``, ``lmdb``,
  ``map_size`` and ``next_doc_id`` while they stay valid);
* ``undetected``: exit 0 but the dump or the probes differ, or the probes fail;
* ``crash``: a traceback, death by a signal, a timeout, or any other exit code.

Run as a script (``python tests/corruption.py probe PATH``) it prints the digests of a
store's logical dump and probe answers, which the trials compare in a subprocess so that
a crash while reading cannot take the trial runner down.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

PROJECT_ROOT = Path(__file__).resolve().parent.parent
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

from neardup_store import Store, lmdbfile  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import logical_digest  # noqa: E402

CHECK_TIMEOUT_S = 120.0
REGIONS = (
    "docs", "keys", "removed", "bands", "meta", "lmdb-meta", "lmdb-structure", "free-space",
)  # fmt: skip
"""Where a flipped byte can land, by what it means (see :func:`region_of`)."""
TARGETS = ("random", "docs", "keys", "removed", "bands", "meta", "lmdb-meta", "branch",
           "page-header", "tables")  # fmt: skip
"""Trial kinds: ``random`` offsets anywhere in the file, or inside one kind of span."""

_WORDS = [
    "".join(random.Random(i).choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3 + i % 6))
    for i in range(600)
]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def _variant(rng: random.Random, text: str) -> str:
    words = text.split()
    words[rng.randrange(len(words))] = rng.choice(_WORDS)
    return " ".join(words)


def _key(index: int, rng: random.Random) -> str | bytes:
    """Short str keys mostly; some bytes keys; some long keys (hashed index) of both."""
    if index % 29 == 0:
        return f"long-str-{index:05d}-" + "x" * (420 + rng.randrange(60))
    if index % 31 == 0:
        return b"long-bytes-%05d-" % index + bytes(rng.randrange(256) for _ in range(450))
    if index % 5 == 0:
        return b"\x00bin-" + index.to_bytes(4, "big")
    return f"doc-{index:05d}"


@dataclass
class Reference:
    """A reference store and everything a corrupted copy of it is compared with."""

    path: Path
    logical: str
    probe: str
    check_ok: bool
    seed: int
    documents: int
    file_size: int
    spans: list[lmdbfile.Span]
    starts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.spans.sort(key=lambda s: s.start)
        self.starts = [s.start for s in self.spans]


def _items(seed: int, documents: int) -> list[tuple[Any, str, Any]]:
    rng = random.Random(seed)
    items: list[tuple[Any, str, Any]] = []
    base: list[str] = []
    for index in range(documents):
        if base and rng.random() < 0.4:
            text = _variant(rng, rng.choice(base))
        else:
            text = _text(rng, 30 + rng.randrange(50))
            base.append(text)
        metadata = None
        if index % 37 == 1:  # records larger than a page go to LMDB's overflow pages
            metadata = {"blob": rng.randbytes(5000 + rng.randrange(4000))}
        elif index % 3 == 0:
            metadata = {"n": index, "tag": rng.choice(["a", "b"]), "raw": bytes([index % 256])}
        items.append((_key(index, rng), text, metadata))
    return items


def build_store(path: Path, seed: int, documents: int = 300) -> None:
    """A store with texts, metadata (some large), str/bytes/long keys, removals (so free
    pages, and records in ``removed`` whose band entries await a purge), and adds after
    the removals (so reused pages)."""
    rng = random.Random(seed + 1)
    items = _items(seed, documents)
    with Store.open(path, create=True) as store:
        first = documents * 3 // 4
        store.add_many(items[:first], batch_size=60)
        removed = [key for key, _, _ in rng.sample(items[:first], first // 5)]
        store.remove_many(removed[: len(removed) // 2])
        store.remove_many(removed[len(removed) // 2 :])
        store.add_many(items[first:], batch_size=40)


def probe_texts(seed: int, documents: int) -> list[str]:
    """Fixed queries: some stored texts, variants of them, and unrelated texts."""
    rng = random.Random(seed + 2)
    stored = [text for _, text, _ in _items(seed, documents)[::10]]
    return stored + [_variant(rng, t) for t in stored[::2]] + [_text(rng, 40) for _ in range(5)]


def probe_answers(path: Path, texts: list[str]) -> dict[str, Any]:
    """Everything a reader can ask a store, for comparison between copies."""
    with Store.open(path, read_only=True) as store, store.read() as txn:
        keys = list(txn.keys())
        documents = []
        for key in keys:
            doc = txn.get(key)
            documents.append([key, doc.signature.tobytes(), doc.metadata, key in txn])
            # Queries by each stored signature reach every band table through lookups.
        by_signature = [
            [[m.key, m.score] for m in txn.query(signature=txn.get(key).signature)]
            for key in keys[::7]
        ]
        by_text = [[[m.key, m.score] for m in txn.query(t)] for t in texts]
        return {"len": len(txn), "documents": documents, "sig": by_signature, "text": by_text}


def _probe_digest(path: Path, seed: int, documents: int) -> str:
    answers = probe_answers(path, probe_texts(seed, documents))
    return hashlib.sha256(msgpack.packb(answers, use_bin_type=True)).hexdigest()


def make_reference(path: Path, seed: int, documents: int = 300) -> Reference:
    """Build the reference store and record its dump, probe answers and layout."""
    build_store(path, seed, documents)
    with Store.open(path, read_only=True) as store:
        check_ok = store.check().ok
    data = path / "data.mdb"
    layout = lmdbfile.walk(data, spans=True)
    assert not layout.problems, layout.problems
    return Reference(
        path,
        logical_digest(path),
        _probe_digest(path, seed, documents),
        check_ok,
        seed,
        documents,
        data.stat().st_size,
        layout.spans,
    )


# -- regions ------------------------------------------------------------------------------


def value_span(reference: Reference, tree: str, key: bytes) -> lmdbfile.Span:
    """Where the value of ``key`` in table ``tree`` lies in the reference file."""
    return next(s for s in reference.spans if s.tree == tree and s.part == "value" and s.key == key)


def region_of(reference: Reference, offset: int) -> str:
    """What a byte of the reference file means: one of :data:`REGIONS`."""
    index = bisect.bisect_right(reference.starts, offset) - 1
    span = reference.spans[index] if index >= 0 else None
    if span is None or not span.start <= offset < span.end:
        return "free-space"  # beyond the last page in use, or past a meta page's fields
    return _span_region(span, offset)


def _span_region(span: lmdbfile.Span, offset: int) -> str:
    if span.part == "meta":
        return "lmdb-meta"
    if span.part in ("slack", "free", "unused"):
        return "free-space"
    if span.part in ("page-header", "node-header") or span.tree.startswith("("):
        return "lmdb-structure"
    if span.part.startswith("branch"):
        return "lmdb-structure"
    if span.tree == "meta":
        return "meta"
    if span.tree in ("docs", "keys", "removed"):
        return span.tree
    return "bands"


def _target_spans(reference: Reference, target: str) -> list[lmdbfile.Span]:
    spans = reference.spans
    if target == "lmdb-meta":
        return [s for s in spans if s.part == "meta"]
    if target == "branch":
        return [s for s in spans if s.part.startswith("branch")]
    if target == "page-header":
        return [s for s in spans if s.part in ("page-header", "node-header")]
    if target == "tables":
        return [s for s in spans if s.tree == lmdbfile.MAIN and s.part in ("key", "value")]
    if target == "meta":
        return [s for s in spans if s.tree == "meta" and s.part == "value"]
    tree = {"docs": ("docs",), "keys": ("keys",), "removed": ("removed",)}.get(target)
    return [
        s
        for s in spans
        if s.part in ("key", "value") and (s.tree in tree if tree else s.tree.startswith("band."))
    ]


def choose_offsets(reference: Reference, target: str, rng: random.Random) -> list[int]:
    """Offsets to flip for one trial of kind ``target``."""
    if target == "random":
        return [rng.randrange(reference.file_size) for _ in range(rng.choice((1, 1, 2, 3, 8)))]
    candidates = _target_spans(reference, target)
    span = rng.choice(candidates)
    end = span.end
    return [rng.randrange(span.start, end)]


# -- one trial ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    """One flip and its outcome."""

    target: str
    flips: list[tuple[int, int]]  # (offset, xor mask)
    regions: list[str]
    outcome: str  # detected, harmless, undetected, crash
    detail: str
    repair: str = ""  # after ``check --repair`` (when asked): see :func:`repair_outcome`


def _subprocess_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}


def run_check(path: Path, repair: bool = False) -> subprocess.CompletedProcess[str] | None:
    """``neardup-admin check --json`` in a subprocess; ``None`` when it timed out."""
    command = [sys.executable, "-m", "neardup_store", "check", "--json", str(path)]
    if repair:
        command.append("--repair")
    try:
        return subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            env=_subprocess_env(),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None


def classify_check(result: subprocess.CompletedProcess[str] | None) -> tuple[str, str]:
    """``(outcome, detail)`` of a check run; outcome ``clean`` needs the probes next."""
    if result is None:
        return "crash", "timeout"
    if result.returncode < 0:
        return "crash", f"signal {-result.returncode}"
    if "Traceback" in result.stderr:
        last = result.stderr.strip().splitlines()[-1]
        return "crash", f"traceback: {last}"
    if result.returncode == 0:
        summary = _summary(result.stdout)
        if summary is None or not summary.get("ok"):
            return "crash", f"exit 0 without a clean summary: {result.stdout[-200:]!r}"
        return "clean", ""
    if result.returncode == 1:
        summary = _summary(result.stdout)
        if summary is None or not summary.get("violations"):
            return "crash", f"exit 1 without violations: {result.stderr[-200:]!r}"
        kinds = Counter(
            json.loads(line)["kind"] for line in result.stdout.splitlines() if '"kind"' in line
        )
        return "detected", "check: " + ", ".join(sorted(kinds))
    if result.returncode == 2:
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        if len(errors) == 1 and "corrupt" in errors[0].lower():
            return "detected", "open: " + errors[0][:160]
        return "crash", f"exit 2 without a typed corruption error: {result.stderr[-300:]!r}"
    return "crash", f"exit code {result.returncode}: {result.stderr[-300:]!r}"


def _summary(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "summary" in record:
            return record["summary"]  # type: ignore[no-any-return]
    return None


def compare_probes(path: Path, reference: Reference) -> tuple[str, str]:
    """``harmless`` when the copy means what the reference means, else ``undetected``."""
    command = [sys.executable, str(Path(__file__).resolve()), "probe", str(path),
               str(reference.seed), str(reference.documents)]  # fmt: skip
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S,
            env=_subprocess_env(), check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "undetected", "probes timed out on a store check called clean"
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["?"])[-1]
        return "undetected", f"probes failed on a store check called clean: {last}"
    digests = json.loads(result.stdout)
    if digests["logical"] != reference.logical:
        return "undetected", "logical dump differs"
    if digests["probe"] != reference.probe:
        return "undetected", "probe answers differ"
    return "harmless", ""


def flip(path: Path, flips: list[tuple[int, int]]) -> None:
    """XOR the bytes at the given offsets of ``data.mdb`` with the given masks."""
    with open(path / "data.mdb", "r+b") as file:
        for offset, mask in flips:
            file.seek(offset)
            old = file.read(1)
            file.seek(offset)
            file.write(bytes([old[0] ^ mask]))


def run_trial(
    reference: Reference, workdir: Path, target: str, rng: random.Random, repair: bool = False
) -> Trial:
    """Random flips of kind ``target`` (see :data:`TARGETS`), then :func:`run_flips`."""
    return run_flips(reference, workdir, target, plan_flips(reference, target, rng), repair)


def plan_flips(reference: Reference, target: str, rng: random.Random) -> list[tuple[int, int]]:
    """``(offset, xor mask)`` pairs for one trial: single bits or whole random bytes."""
    offsets = choose_offsets(reference, target, rng)
    bits = rng.random() < 0.5
    return [(o, 1 << rng.randrange(8) if bits else rng.randrange(1, 256)) for o in offsets]


def run_flips(
    reference: Reference,
    workdir: Path,
    target: str,
    flips: list[tuple[int, int]],
    repair: bool = False,
) -> Trial:
    """One trial with chosen flips: copy the reference, flip, check, classify."""
    copy = workdir / "trial"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(reference.path, copy)
    flip(copy, flips)
    outcome, detail = classify_check(run_check(copy))
    if outcome == "clean":
        outcome, detail = compare_probes(copy, reference)
    regions = [region_of(reference, o) for o, _ in flips]
    repaired = repair_outcome(copy, reference) if repair and outcome == "detected" else ""
    return Trial(target, flips, regions, outcome, detail, repaired)


def repair_outcome(path: Path, reference: Reference) -> str:
    """What ``check --repair`` made of a damaged copy; only ``wrong`` and ``crash`` are bad.

    ``restored``: a check is clean after it and the copy means what the reference means;
    ``unchanged``: it refused (damaged pages, or a store it cannot open) and wrote nothing;
    ``reported``: it ran and still reports what it could not re-derive (a damaged record);
    ``wrong``: it called the store clean, but the store means something else now.
    """
    before = (path / "data.mdb").read_bytes()
    outcome, _ = classify_check(run_check(path, repair=True))
    if outcome == "crash":
        return "crash"
    after, _ = classify_check(run_check(path))
    if after == "crash":
        return "crash"
    if after == "clean":
        return "restored" if compare_probes(path, reference)[0] == "harmless" else "wrong"
    return "unchanged" if (path / "data.mdb").read_bytes() == before else "reported"


def summarize(trials: list[Trial]) -> dict[str, Any]:
    """Counts by outcome, overall, by region (the first flip's) and by trial kind."""
    outcomes = ("detected", "harmless", "undetected", "crash")
    by_region: dict[str, Counter[str]] = {r: Counter() for r in REGIONS}
    by_target: dict[str, Counter[str]] = {t: Counter() for t in TARGETS}
    for trial in trials:
        by_region[_main_region(trial.regions)][trial.outcome] += 1
        by_target[trial.target][trial.outcome] += 1
    total = Counter(t.outcome for t in trials)
    repairs = Counter(t.repair for t in trials if t.repair)
    return {
        "repairs": dict(repairs),
        "trials": len(trials),
        **{name: total[name] for name in outcomes},
        "by_region": {r: {o: c[o] for o in outcomes} for r, c in by_region.items() if c},
        "by_target": {t: {o: c[o] for o in outcomes} for t, c in by_target.items() if c},
    }


def _main_region(regions: list[str]) -> str:
    """A multi-flip trial counts under its most meaningful region hit."""
    for region in REGIONS:
        if region in regions:
            return region
    return "free-space"


if __name__ == "__main__":
    if sys.argv[1:2] == ["probe"]:
        store_path, probe_seed, count = Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
        print(
            json.dumps(
                {
                    "logical": logical_digest(store_path),
                    "probe": _probe_digest(store_path, probe_seed, count),
                }
            )
        )
