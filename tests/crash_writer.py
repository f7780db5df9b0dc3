"""The crash suite's writer, and the model of what it has committed.

Run as ``python tests/crash_writer.py STORE SEED START [STOP]``: for s = START, START+1, ...
(up to STOP if given) the writer commits batch ``s`` in one write transaction and only then
prints ``ack s`` (with ``CRASH_WRITER_ACK_EARLY=1`` it acknowledges *before* committing:
a broken writer, to show the crash loop notices lost acknowledged commits).

Batch ``s`` is a pure function of (SEED, s), see :func:`batch`:

* removes (if present) what is left of batch ``s - WINDOW`` and two keys of recent batches;
* adds texts (near-copies of a few base paragraphs, so shingling runs and band buckets are
  shared), in every third batch one under a key long enough for a hashed key index;
* adds precomputed signatures under ``bytes`` keys, some near-copies of each other;
* replaces one recent document (``replace=True``: a delete and an insert);
* replaces the marker document :data:`MARKER` whose metadata is ``{"s": s}``: the store
  itself says which batch it committed last;
* every :data:`PURGE_EVERY`-th batch, purges removed documents (``WriteTxn.purge``, in the
  same transaction): at most :data:`PURGE_LIMIT` of them, every other time all of them.

Removals (and replaces) leave the band entries of the documents they remove until a purge,
so the model counts the documents awaiting one (:attr:`ModelBuilder.awaiting`); the crash
store stays far below the size at which ``Store.write`` purges on its own.

The first writer creates the store with a tiny map (:data:`CREATE_MAP_SIZE`) so that map
growth, and the replay of a transaction that ran out of room, happen while it is killed.

:func:`expected_model` gives the :class:`harness.Model` of the store after batch ``s``,
computed without the store. The tests import this module; it is a script only for the
child process.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from harness import Model  # run as a script, Python puts this file's directory on sys.path

from neardup_store import MinHasher, Store
from neardup_store.params import StoreParams, resolve_params

Key = str | bytes

STORE_OPTIONS: dict[str, Any] = {
    "threshold": 0.6,
    "num_perm": 64,
    "seed": 11,
    "bands": 10,
    "rows": 6,
}
"""Parameters of the crash store (a low threshold: many bands, many shared buckets)."""
CREATE_MAP_SIZE = 1 << 16
MARKER = "__seq__"
WINDOW = 20
"""A batch removes the rest of the batch this many sequence numbers before it."""
ACK_EARLY = "CRASH_WRITER_ACK_EARLY"
PURGE_EVERY = 3
"""Batches ``s`` with ``s % PURGE_EVERY == PURGE_EVERY - 1`` purge (see :func:`batch`)."""
PURGE_LIMIT = 5
"""The most documents a limited purge deletes the band entries of."""
_BASES = 12
_WORDS = 400


@dataclass(frozen=True)
class Batch:
    """One write transaction of the writer (see the module docstring)."""

    s: int
    removes: list[Key]
    texts: list[tuple[Key, str, Any]]
    signatures: list[tuple[Key, npt.NDArray[np.uint32], Any]]
    replace: tuple[Key, npt.NDArray[np.uint32], Any] | None
    marker: npt.NDArray[np.uint32]
    purge: bool = False
    purge_limit: int | None = None  # with purge: None purges every removed document

    def added_keys(self) -> list[Key]:
        return [key for key, _, _ in self.texts] + [key for key, _, _ in self.signatures]


def store_params() -> StoreParams:
    """The crash store's parameters, resolved exactly as ``Store.open`` resolves them."""
    options = STORE_OPTIONS
    return resolve_params(
        options["threshold"], options["num_perm"], None, options["seed"], None,
        options["bands"], options["rows"],
    )  # fmt: skip


def _rng(seed: int, *parts: int) -> np.random.Generator:
    # SeedSequence over integers: the same stream in every process (no str hashing).
    return np.random.default_rng([seed, *parts])


def _vocabulary(seed: int) -> list[str]:
    rng = _rng(seed, 1)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return ["".join(rng.choice(letters, size=int(rng.integers(2, 9)))) for _ in range(_WORDS)]


def _base_text(seed: int, words: list[str], index: int) -> list[str]:
    rng = _rng(seed, 2, index)
    return [words[i] for i in rng.integers(0, len(words), size=int(rng.integers(20, 60)))]


def _base_signature(seed: int, index: int, num_perm: int) -> npt.NDArray[np.uint32]:
    return _rng(seed, 3, index).integers(0, 2**32, size=num_perm, dtype=np.uint32)


_CACHE: dict[int, tuple[list[str], list[list[str]]]] = {}


def _text_pool(seed: int) -> tuple[list[str], list[list[str]]]:
    if seed not in _CACHE:
        words = _vocabulary(seed)
        _CACHE[seed] = (words, [_base_text(seed, words, i) for i in range(_BASES)])
    return _CACHE[seed]


def _edit(rng: np.random.Generator, words: list[str], base: list[str]) -> str:
    text = list(base)
    for _ in range(int(rng.integers(0, 6))):
        text[int(rng.integers(0, len(text)))] = words[int(rng.integers(0, len(words)))]
    return " ".join(text)


def _near(rng: np.random.Generator, signature: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
    out = signature.copy()
    where = rng.choice(len(out), size=int(rng.integers(0, len(out) // 5)), replace=False)
    out[where] = rng.integers(0, 2**32, size=len(where), dtype=np.uint32)
    return out


def _text_keys(s: int, count: int) -> list[Key]:
    keys: list[Key] = [f"t{s}-{i}" for i in range(count)]
    if keys and s % 3 == 0:  # over codec.INLINE_KEY_BYTES: stored under a hashed key index
        keys[0] = f"long-{s}-" + "x" * 450
    return keys


def _shape(seed: int, s: int) -> tuple[int, int]:
    """(texts, signatures) added by batch ``s``."""
    if s < 0:
        return 0, 0
    rng = _rng(seed, 4, s)
    return int(rng.integers(2, 8)), int(rng.integers(1, 6))


def batch(seed: int, s: int) -> Batch:
    """Batch ``s`` of the writer with ``seed``: a pure function of its arguments."""
    num_perm = STORE_OPTIONS["num_perm"]
    words, bases = _text_pool(seed)
    rng = _rng(seed, 5, s)
    n_texts, n_sigs = _shape(seed, s)
    texts = [
        (key, _edit(rng, words, bases[int(rng.integers(0, _BASES))]), {"s": s} if i % 2 else None)
        for i, key in enumerate(_text_keys(s, n_texts))
    ]
    signatures = []
    for i in range(n_sigs):
        base = _base_signature(seed, int(rng.integers(0, _BASES)), num_perm)
        signatures.append((f"g{s}-{i}".encode(), _near(rng, base), None if i % 2 else [s, i]))
    removes: list[Key] = list(_added_keys(seed, s - WINDOW))
    for _ in range(2):
        removes.extend(_recent_key(seed, s, rng))
    replace = None
    target = _recent_key(seed, s, rng)
    if target:
        replace = (target[0], rng.integers(0, 2**32, size=num_perm, dtype=np.uint32), {"r": s})
    marker = _rng(seed, 6, s).integers(0, 2**32, size=num_perm, dtype=np.uint32)
    purge = s % PURGE_EVERY == PURGE_EVERY - 1
    limit = None if s % (2 * PURGE_EVERY) == 2 * PURGE_EVERY - 1 else PURGE_LIMIT
    return Batch(s, removes, texts, signatures, replace, marker, purge, limit)


def _added_keys(seed: int, s: int) -> list[Key]:
    n_texts, n_sigs = _shape(seed, s)
    return _text_keys(s, n_texts) + [f"g{s}-{i}".encode() for i in range(n_sigs)]


def _recent_key(seed: int, s: int, rng: np.random.Generator) -> list[Key]:
    """A key added by one of the batches s-WINDOW+1 .. s-1 (it may be gone already)."""
    earlier = s - int(rng.integers(1, WINDOW))
    keys = _added_keys(seed, earlier)
    return [keys[int(rng.integers(0, len(keys)))]] if keys else []


def write_batch(store: Store, b: Batch) -> None:
    """Commit batch ``b`` in one write transaction."""
    with store.write() as txn:
        txn.remove_many(b.removes, missing_ok=True)
        txn.add_many(b.texts)
        txn.add_signatures(b.signatures)
        if b.replace is not None:
            key, signature, metadata = b.replace
            txn.add(key, signature=signature, metadata=metadata, replace=True)
        txn.add(MARKER, signature=b.marker, metadata={"s": b.s}, replace=True)
        if b.purge:
            txn.purge(b.purge_limit)


def apply_batch(model: Model, hasher: MinHasher, b: Batch) -> int:
    """What :func:`write_batch` does to the store's documents, done to the model; returns
    how many documents it removed or replaced (whose band entries then await a purge)."""
    unlinked = 0
    for key in b.removes:
        unlinked += model.documents.pop(key, None) is not None
    if b.texts:
        sigs = hasher.signatures([text for _, text, _ in b.texts])
        for (key, _, metadata), sig in zip(b.texts, sigs, strict=True):
            model.add(key, sig, metadata)
    for key, sig, metadata in b.signatures:
        model.add(key, sig, metadata)
    if b.replace is not None:
        unlinked += b.replace[0] in model.documents
        model.add(*b.replace)
    unlinked += MARKER in model.documents
    model.add(MARKER, b.marker, {"s": b.s})
    return unlinked


class ModelBuilder:
    """The model after batch ``s``, advanced incrementally (a crash loop needs many), and
    :attr:`awaiting`: how many removed documents then await a purge."""

    def __init__(self, seed: int) -> None:
        params = store_params()
        self.seed = seed
        self.hasher = MinHasher(params.config)
        self.model = Model(params.banding, params.config.seed)
        self.s = -1
        self.awaiting = 0

    def advance(self, upto_s: int) -> Model:
        """The model after batch ``upto_s`` (restarting from empty if that is behind)."""
        if upto_s < self.s:
            self.__init__(self.seed)  # type: ignore[misc]
        while self.s < upto_s:
            self.s += 1
            b = batch(self.seed, self.s)
            self.awaiting += apply_batch(self.model, self.hasher, b)
            if b.purge:  # the lowest ids first: which ones does not show in the model
                limit = self.awaiting if b.purge_limit is None else b.purge_limit
                self.awaiting -= min(limit, self.awaiting)
        return self.model


def expected_model(seed: int, upto_s: int) -> Model:
    """The model of the store after batches 0..``upto_s`` (``-1``: nothing committed)."""
    return ModelBuilder(seed).advance(upto_s)


def committed_s(store: Store) -> int:
    """The last batch the store committed (``-1``: none)."""
    if MARKER not in store:
        return -1
    return int(store.get(MARKER).metadata["s"])


def _ack(s: int) -> None:
    sys.stdout.write(f"ack {s}\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5):
        print(__doc__, file=sys.stderr)
        return 2
    path, seed, start = argv[1], int(argv[2]), int(argv[3])
    stop = int(argv[4]) if len(argv) == 5 else None
    # A broken writer for the negative control: it acknowledges before committing.
    ack_early = os.environ.get(ACK_EARLY) == "1"
    with Store.open(path, create=True, map_size=CREATE_MAP_SIZE, **STORE_OPTIONS) as store:
        found = committed_s(store)
        if found != start - 1:
            print(f"store committed batch {found}, asked to start at {start}", file=sys.stderr)
            return 3
        s = start
        while stop is None or s <= stop:
            if ack_early:
                _ack(s)
            write_batch(store, batch(seed, s))
            if not ack_early:
                _ack(s)  # only after the commit has returned
            s += 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
