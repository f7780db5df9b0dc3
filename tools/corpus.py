"""Real-text corpus for benchmarks, read from this machine at run time.

Benchmarks of shingling and MinHash need real prose and code: synthetic random text has
almost no repeated shingles and flatters every implementation alike. Shipping a corpus
would bloat the repository and raise licensing questions, so the text is read from files
every Python installation and Debian-based system already has:

* the Python standard library sources (``sysconfig.get_paths()["stdlib"]``, ``*.py``);
* ``/usr/share/doc`` (READMEs, changelogs, copyright files; ``.gz`` files are read
  decompressed) and ``/usr/share/common-licenses``, when present.

Files are cut into documents of ``min_bytes`` to ``max_bytes`` of UTF-8 on paragraph
boundaries where possible, else on line boundaries. Given the same machine and seed, the
documents are always the same, so two benchmark runs compare like with like. Nothing here
is committed: the corpus exists only in memory.
"""

from __future__ import annotations

import gzip
import hashlib
import random
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path

DOC_ROOTS: tuple[Path, ...] = (Path("/usr/share/doc"), Path("/usr/share/common-licenses"))
"""System folders of plain-text documentation, read if they exist."""

MAX_FILE_BYTES = 4_000_000
"""Larger files are skipped: they are data dumps, not documents, and slow to read."""

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_WORD_OR_SPACE = re.compile(r"(\s+)")


def source_files() -> list[Path]:
    """Every candidate file, sorted, so the seeded shuffle is reproducible."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found = {path for path in stdlib.rglob("*.py") if "site-packages" not in path.parts}
    for root in DOC_ROOTS:
        if root.is_dir():
            found.update(path for path in root.rglob("*") if path.is_file())
    return sorted(found)


def read_text(path: Path) -> str | None:
    """The file's text if it is UTF-8 text of a sensible size, else ``None``.

    ``.gz`` files are decompressed (Debian compresses most changelogs); anything with a
    NUL byte or invalid UTF-8 is taken to be binary and skipped.
    """
    try:
        if path.is_symlink() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
            if len(raw) > MAX_FILE_BYTES:
                return None
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if b"\0" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _pieces(text: str, max_bytes: int) -> Iterator[str]:
    """Paragraphs of ``text`` (with their trailing break), those over ``max_bytes`` as lines.

    A single line longer than ``max_bytes`` (minified data, a wrapped-never licence) is
    dropped: it cannot fit in any document.
    """
    start = 0
    for match in _PARAGRAPH_BREAK.finditer(text):
        yield from _fit(text[start : match.end()], max_bytes)
        start = match.end()
    yield from _fit(text[start:], max_bytes)


def _fit(paragraph: str, max_bytes: int) -> Iterator[str]:
    if len(paragraph.encode("utf-8")) <= max_bytes:
        yield paragraph
        return
    for line in paragraph.splitlines(keepends=True):
        if len(line.encode("utf-8")) <= max_bytes:
            yield line


def split_documents(text: str, rng: random.Random, min_bytes: int, max_bytes: int) -> Iterator[str]:
    """Cut one file's text into documents of ``min_bytes``..``max_bytes`` UTF-8 bytes.

    Each document gets a target size drawn uniformly from that range and collects whole
    paragraphs (or lines) until it reaches it. A remainder shorter than ``min_bytes`` is
    dropped rather than padded, so every document is real, contiguous text.
    """
    parts: list[str] = []
    size = 0
    target = rng.randint(min_bytes, max_bytes)
    for piece in _pieces(text, max_bytes):
        piece_size = len(piece.encode("utf-8"))
        if size + piece_size > max_bytes:
            if size >= min_bytes:
                yield "".join(parts)
                target = rng.randint(min_bytes, max_bytes)
            parts, size = [], 0
        parts.append(piece)
        size += piece_size
        if size >= target:
            yield "".join(parts)
            parts, size = [], 0
            target = rng.randint(min_bytes, max_bytes)
    if size >= min_bytes:
        yield "".join(parts)


def real_documents(
    count: int, seed: int, min_bytes: int = 1000, max_bytes: int = 20000
) -> list[str]:
    """``count`` documents of real text, deterministic given ``seed`` and the machine.

    Files are visited in a seeded random order (so code and prose mix), byte-identical
    files are read once (Debian ships many copies of the same licence), and the resulting
    documents are shuffled again so that neighbours in a batch rarely share a source file.

    Raises:
        RuntimeError: the machine has too little text for ``count`` documents.
    """
    if not 0 < min_bytes <= max_bytes:
        raise ValueError(f"need 0 < min_bytes <= max_bytes, got {min_bytes}, {max_bytes}")
    rng = random.Random(seed)
    files = source_files()
    rng.shuffle(files)
    seen: set[bytes] = set()
    documents: list[str] = []
    for path in files:
        text = read_text(path)
        if text is None:
            continue
        digest = hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()
        if digest in seen:
            continue
        seen.add(digest)
        documents.extend(split_documents(text, rng, min_bytes, max_bytes))
        if len(documents) >= count:
            break
    if len(documents) < count:
        raise RuntimeError(
            f"found only {len(documents)} documents of {min_bytes}-{max_bytes} bytes "
            f"on this machine; asked for {count}"
        )
    rng.shuffle(documents)
    return documents[:count]


def near_duplicate(text: str, rate: float, rng: random.Random) -> str:
    """A copy of ``text`` in which about ``rate`` of the words were edited.

    Each word is, with probability ``rate``, substituted by another word of the same
    document, deleted, or followed by an inserted word (one of the three, equally likely).
    Drawing replacements from the document's own vocabulary keeps the copy looking like
    a human edit rather than noise. White space between words is kept as it was, so line
    structure survives.
    """
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    tokens = _WORD_OR_SPACE.split(text)
    vocabulary = [token for token in tokens if token and not token.isspace()]
    if not vocabulary:
        return text
    out: list[str] = []
    for token in tokens:
        if not token or token.isspace() or rng.random() >= rate:
            out.append(token)
            continue
        edit = rng.randrange(3)
        if edit == 0:
            out.append(rng.choice(vocabulary))
        elif edit == 2:
            out.extend((token, " ", rng.choice(vocabulary)))
        # edit == 1 deletes the word; its surrounding white space stays.
    return "".join(out)


BOILERPLATE: tuple[str, ...] = (
    "\n\nThis message and any attachments are confidential and intended solely for the "
    "addressee. If you received it in error, please notify the sender and delete it.\n",
    "\n\nGenerated automatically; do not edit by hand. Report problems to the maintainers.\n",
    "\n\nCopyright the authors. All rights reserved. Redistribution is subject to the terms "
    "of the licence shipped with this file.\n",
)
"""Short footers of the kind that mail and web templates append to otherwise equal text."""


def _paragraphs(text: str) -> list[str]:
    parts = [p for p in _PARAGRAPH_BREAK.split(text) if p.strip()]
    return parts or [text]


def edited_copy(text: str, rng: random.Random) -> tuple[str, str]:
    """A realistic near-duplicate of ``text`` and a label naming the edit.

    One of: word edits (substitutions, insertions and deletions) at a rate of 1-20%, two
    paragraphs swapped, the end truncated (by up to a fifth), a boilerplate footer added,
    or an edit of an edit (two of these in turn).
    """
    kind = rng.choice(("words", "words", "swap", "truncate", "boilerplate", "twice"))
    if kind == "words":
        rate = rng.uniform(0.01, 0.20)
        return near_duplicate(text, rate, rng), f"words {100 * rate:.0f}%"
    if kind == "swap":
        paragraphs = _paragraphs(text)
        if len(paragraphs) >= 2:
            i, j = rng.sample(range(len(paragraphs)), 2)
            paragraphs[i], paragraphs[j] = paragraphs[j], paragraphs[i]
        return "\n\n".join(paragraphs), "paragraph swap"
    if kind == "truncate":
        cut = rng.uniform(0.02, 0.20)
        return text[: max(1, int(len(text) * (1 - cut)))], f"truncated {100 * cut:.0f}%"
    if kind == "boilerplate":
        return text + rng.choice(BOILERPLATE), "boilerplate"
    first, label = edited_copy(text, rng)
    second, label2 = edited_copy(first, rng)
    return second, f"{label} then {label2}"


def with_near_duplicates(
    documents: list[str], copies: int, seed: int
) -> tuple[list[str], list[tuple[int, int, str]]]:
    """``documents`` followed by ``copies`` edited copies of randomly chosen ones.

    Returns the combined list and, for every copy, ``(copy index, source index, edit)``.
    A copy may itself be copied again (an edit of an edit of a neighbour), as happens with
    forwarded mail and re-posted pages.
    """
    rng = random.Random(seed)
    combined = list(documents)
    seeded: list[tuple[int, int, str]] = []
    for _ in range(copies):
        source = rng.randrange(len(combined))
        text, label = edited_copy(combined[source], rng)
        seeded.append((len(combined), source, label))
        combined.append(text)
    return combined, seeded


def stream_documents(
    count: int, seed: int, min_bytes: int = 1000, max_bytes: int = 4000, pool_docs: int = 20000
) -> Iterator[str]:
    """``count`` distinct documents, generated one at a time (the large, streamed variant).

    The machine holds far less text than a million documents, so each document is a
    seeded mixture of real paragraphs drawn from ``pool_docs`` real documents, cut to a
    size in ``min_bytes``..``max_bytes``. Two such documents rarely share more than one
    paragraph, so they behave like distinct documents with some common boilerplate;
    nothing is kept in memory but the paragraph pool.
    """
    rng = random.Random(seed)
    pool = [p for doc in real_documents(pool_docs, seed) for p in _paragraphs(doc)]
    pool = [p for p in pool if 40 <= len(p) <= max_bytes]
    for _ in range(count):
        target = rng.randint(min_bytes, max_bytes)
        parts: list[str] = []
        size = 0
        while size < target:
            piece = rng.choice(pool)
            parts.append(piece)
            size += len(piece) + 2
        yield "\n\n".join(parts)[:target]
