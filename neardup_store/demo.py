"""A deterministic sample corpus with planted near-duplicates, and the demo run over it.

The text is generated here (pseudo-words from syllables, seeded), never copied from
anywhere. Each planted group is an original plus copies altered by word substitutions,
insertions and deletions at a few per cent, sometimes an edit of an edit, so the copies'
Jaccard similarity to the original spans roughly 0.75–0.97.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import InvalidParameterError
from .lsh import LSHParams
from .minhash import MinHashConfig
from .similarity import estimate_jaccard
from .store import Store

_SYLLABLES = (
    "ka ri to mes lan dor vi sen ul pra the gos min ar bel fi nor es tu qua lo red "
    "si om cal ven tir as ple dun mo har ex zi pol ga"
).split()


@dataclass(frozen=True)
class DemoCorpus:
    """Documents by key, and the planted groups (each sorted) that a run should find."""

    documents: dict[str, str]
    planted: list[list[str]]


def make_corpus(documents: int = 400, planted_groups: int = 40, seed: int = 7) -> DemoCorpus:
    """Build exactly ``documents`` texts, of which up to ``planted_groups`` groups are
    near-duplicates (fewer when the documents run out first: the last group's copies
    stop at ``documents``, and an original left without a copy is no group)."""
    rng = random.Random(seed)
    vocabulary = sorted(
        {"".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4))) for _ in range(3000)}
    )
    texts: list[str] = []
    planted_indices: list[list[int]] = []
    while len(texts) < documents:
        original = _sentence_words(rng, vocabulary, rng.randint(60, 220))
        group = [len(texts)]
        texts.append(_render(original))
        if len(planted_indices) < planted_groups:
            # Drawn as before, then capped: a corpus whose groups fit in ``documents``
            # is the one earlier releases made for the same seed.
            copies = min(rng.randint(1, 3), documents - len(texts))
            if not copies:
                break
            previous = original
            for _ in range(copies):
                source = previous if rng.random() < 0.3 else original  # edits of edits
                previous = _edit(rng, vocabulary, source, rate=rng.uniform(0.005, 0.025))
                group.append(len(texts))
                texts.append(_render(previous))
            planted_indices.append(group)
    order = list(range(len(texts)))
    rng.shuffle(order)
    keys = {old: f"doc-{new:04d}" for new, old in enumerate(order)}
    corpus = {keys[i]: texts[i] for i in sorted(range(len(texts)), key=lambda i: keys[i])}
    planted = sorted(sorted(keys[i] for i in group) for group in planted_indices)
    return DemoCorpus(corpus, planted)


def _sentence_words(rng: random.Random, vocabulary: list[str], count: int) -> list[str]:
    words = [rng.choice(vocabulary) for _ in range(count)]
    for i in range(0, count, rng.randint(8, 16)):
        words[i] = words[i].capitalize()
    return words


def _render(words: list[str]) -> str:
    out, line = [], []
    for i, word in enumerate(words, 1):
        line.append(word)
        if i % 12 == 0:
            out.append(" ".join(line) + ".")
            line = []
    if line:
        out.append(" ".join(line) + ".")
    return "\n".join(out)


def _edit(rng: random.Random, vocabulary: list[str], words: list[str], rate: float) -> list[str]:
    edited: list[str] = []
    for word in words:
        roll = rng.random()
        if roll < rate:  # substitute
            edited.append(rng.choice(vocabulary))
        elif roll < 1.5 * rate:  # delete
            continue
        elif roll < 2 * rate:  # insert before
            edited.extend([rng.choice(vocabulary), word])
        else:
            edited.append(word)
    return edited


@dataclass(frozen=True)
class DemoGroup:
    """A found group: its keys and each member's estimated similarity to the first."""

    keys: list[str]
    similarities: list[float]


@dataclass(frozen=True)
class DemoResult:
    """What :func:`run_demo` found, with how it compares to what was planted."""

    config: MinHashConfig
    params: LSHParams
    threshold: float
    document_count: int
    groups: list[DemoGroup]
    planted: list[list[str]]
    store_path: str | None
    store_bytes: int

    @property
    def exact_matches(self) -> int:
        """Planted groups found exactly (same members, nothing more, nothing less)."""
        return len(self.planted) - len(self.missed)

    @property
    def missed(self) -> list[list[str]]:
        """The planted groups that no found group equals."""
        found = {tuple(g.keys) for g in self.groups}
        return [p for p in self.planted if tuple(p) not in found]

    def was_planted(self, group: DemoGroup) -> bool:
        """Whether ``group`` is exactly one of the planted groups."""
        return group.keys in self.planted


def run_demo(
    documents: int = 400,
    planted_groups: int = 40,
    seed: int = 7,
    threshold: float = 0.7,
    config: MinHashConfig = MinHashConfig(),
    path: str | os.PathLike[str] | None = None,
) -> DemoResult:
    """Generate the corpus, index it in a real store, and read back its clusters.

    The store lives in a temporary directory, or at ``path`` (which must not hold a store
    yet) when the caller wants to keep it.
    """
    corpus = make_corpus(documents, planted_groups, seed)
    with contextlib.ExitStack() as stack:
        where = (
            Path(path)
            if path is not None
            else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="neardup-demo-")))
            / "store"
        )
        if (where / "data.mdb").exists():
            raise InvalidParameterError("path", str(where), "a new or empty directory")
        store = stack.enter_context(
            Store.open(
                where,
                create=True,
                threshold=threshold,
                num_perm=config.num_perm,
                scheme=config.scheme,
                seed=config.seed,
                shingles=config.shingles,
            )
        )
        store.add_many(corpus.documents.items())
        groups = []
        with store.read() as txn:
            for members in store.clusters():
                head = txn.get(members[0]).signature
                sims = [float(estimate_jaccard(head, txn.get(m).signature)) for m in members]
                groups.append(DemoGroup([str(m) for m in members], sims))
        size = (where / "data.mdb").stat().st_size
        params = store.banding
    return DemoResult(
        config,
        params,
        threshold,
        len(corpus.documents),
        groups,
        corpus.planted,
        None if path is None else str(where),
        size,
    )
