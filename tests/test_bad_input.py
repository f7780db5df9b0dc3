"""Bad input and security (issue 5, known ways 1 and 11), on real stores on disk.

The table lives in ``bad_input_cases.py`` so that ``tools/bad_input_report.py`` runs the
same cases and prints the figures. Every refused case must raise its own typed error,
with a message naming the problem, and leave every byte of every table unchanged.
"""

from __future__ import annotations

import ast
import io
import os
import random
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from bad_input_cases import (
    CASES,
    PARAMS,
    SEEDED,
    STREAMS,
    TEXT,
    Case,
    make_store,
    run_case,
    run_in_write_block,
    texts,
)
from click.testing import CliRunner
from harness import raw_digest

from neardup_store import codec, streamed
from neardup_store.cli import cli
from neardup_store.errors import (
    DuplicateKeyError,
    EmptyDocumentError,
    InputTypeError,
    InvalidParameterError,
    InvalidStreamError,
    KeyNotFoundError,
    TextDecodeError,
    TransactionAbortedError,
)
from neardup_store.minhash import EMPTY_VALUE, MinHashConfig, MinHasher
from neardup_store.store import Store
from neardup_store.text import ShingleConfig

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PACKAGE = PROJECT_ROOT / "neardup_store"


def _ids(cases: list[Case]) -> list[str]:
    return [case.name for case in cases]


# -- the table --------------------------------------------------------------------------------


MAX_MESSAGE = 400  # characters: a refused value is shown shortened, never whole


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_refused_input_raises_its_typed_error_and_changes_nothing(
    tmp_path: Path, case: Case
) -> None:
    outcome = run_case(case, tmp_path)
    assert outcome.typed, f"{outcome.raised}: {outcome.message}"
    assert outcome.names_problem, f"{case.fragment!r} not in {outcome.message!r}"
    assert not outcome.state_changed
    assert len(outcome.message) <= MAX_MESSAGE, outcome.message  # readable, not a dump


def test_the_table_covers_every_operation() -> None:
    operations = {case.operation for case in CASES}
    assert operations == {
        "open",
        "add",
        "add_many",
        "add_signatures",
        "remove",
        "query",
        "import",
        "export",
        "check",
        "compact",
        "rebuild",
        "export_file",
        "backup",
    }
    assert len(CASES) >= 80


# Stores with a planted record are left out: their reference would need the same plant.
IN_WRITE = [
    case for case in CASES if case.call is not None and case.in_write and case.prepare is make_store
]


@pytest.mark.parametrize("case", IN_WRITE, ids=_ids(IN_WRITE))
def test_refused_operation_inside_a_write_block_changes_nothing_and_the_rest_commits(
    tmp_path: Path, case: Case
) -> None:
    """The contract (as in test_store.py): an operation refused inside ``store.write()``
    and caught by the caller leaves no trace, and the block's other operations commit.
    Byte-identical to the same block without the refused operation: not even an internal
    id or a band entry was taken, so validation ran before any put."""
    caught = run_in_write_block(tmp_path / "with", case.call)
    run_in_write_block(tmp_path / "without", None)
    assert isinstance(caught, case.error)
    assert raw_digest(tmp_path / "with") == raw_digest(tmp_path / "without")


# -- inputs that are not errors ---------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    make_store(tmp_path / "store")
    with Store.open(tmp_path / "store") as opened:
        yield opened


@pytest.mark.parametrize("text", ["abc", "  ABC ", "a", "é", "ab\u0301"])
def test_document_shorter_than_k_is_one_shingle_not_an_error(store: Store, text: str) -> None:
    """Fewer than k=5 characters after normalisation: the whole text is the one shingle.
    Equal texts then match with score 1; any other text shares nothing with it."""
    store.add("short", text)
    signature = store.get("short").signature
    assert np.array_equal(signature, store.hasher.signature(text))
    hashes = store.hasher.shingler.hash_document(text)
    assert len(hashes) == 1
    assert [(m.key, m.score) for m in store.query(text)] == [("short", 1.0)]
    assert store.query(text + "z") == []  # not a prefix match: another single shingle


def test_an_empty_batch_of_signatures_is_answered_and_numpy_limits_are_taken(
    store: Store,
) -> None:
    """query_many(signatures=[]) was refused as 'a float64 array of shape (0,)' where every
    other batch call answers an empty batch, and purge(limit=np.int64(1)) as 'not a
    positive number' (review 22)."""
    assert store.query_many(signatures=[]) == [] == store.query_many([])
    # an empty batch's options were not checked at all (review 38)
    for options in ({"threshold": 1.5}, {"limit": 0}):
        for batch in ({"signatures": []}, {"documents": []}):
            with pytest.raises(InvalidParameterError, match=next(iter(options))):
                store.query_many(**batch, **options)  # type: ignore[arg-type]
    store.remove_many(["alpha", "gamma"])
    with store.write() as txn:
        assert txn.purge(limit=np.int64(1)) == 1
        assert txn.awaiting_purge() == 1


def test_empty_documents_get_the_empty_signature_when_allowed(tmp_path: Path) -> None:
    shingles = ShingleConfig(allow_empty=True)
    with Store.open(tmp_path / "s", create=True, shingles=shingles, **PARAMS) as store:
        store.add_many([("empty", ""), ("blank", " \t\n\u00a0")])
        assert np.all(store.get("empty").signature == EMPTY_VALUE)
        assert sorted(m.key for m in store.query("   ")) == ["blank", "empty"]
        assert store.query(TEXT) == []


@pytest.mark.parametrize("length", [400, 401, 511, 512, 10_000, codec.MAX_KEY_BYTES])
@pytest.mark.parametrize("kind", [str, bytes])
def test_long_keys_within_the_limit_round_trip(tmp_path: Path, length: int, kind: type) -> None:
    """Keys past LMDB's 511-byte limit are stored by digest (codec.INLINE_KEY_BYTES), so
    512 and 10,000 bytes are valid: they survive a reopen, iteration, query and removal."""
    key: str | bytes = ("k" * (length - 1) + "a") if kind is str else b"k" * (length - 1) + b"a"
    twin = key[:-1] + (b"b" if kind is bytes else "b")  # type: ignore[operator]
    make_store(tmp_path / "s")
    with Store.open(tmp_path / "s") as store:
        store.add(key, TEXT, metadata={"length": length})
        store.add(twin, texts(1, seed=99)[0])
    with Store.open(tmp_path / "s", read_only=True) as store:
        assert store.get(key).key == key and store.get(key).metadata == {"length": length}
        assert list(store)[-2:] == [key, twin]
        assert [m.key for m in store.query(TEXT)] == [key]
    with Store.open(tmp_path / "s") as store:
        assert store.remove(key) and key not in store and twin in store
        assert store.check().ok
        with pytest.raises(KeyNotFoundError):
            store.remove_many([twin, key])  # nothing removed: key is gone
        assert store.remove_many([twin, key, twin], missing_ok=True) == 1
        assert twin not in store and store.check().ok


def test_duplicate_in_a_later_batch_of_one_call_keeps_the_earlier_batches(tmp_path: Path) -> None:
    """``Store.add_many`` commits per batch: a duplicate in batch 2 leaves batch 1
    committed (byte-identical to adding batch 1 alone) and nothing of batch 2."""
    items = [(f"doc-{i}", text) for i, text in enumerate(texts(4, seed=5))]
    make_store(tmp_path / "a")
    with Store.open(tmp_path / "a") as store, pytest.raises(DuplicateKeyError) as raised:
        store.add_many([*items[:2], items[2], ("doc-2", TEXT)], batch_size=2)
    assert raised.value.in_batch and "more than once" in str(raised.value)
    make_store(tmp_path / "b")
    with Store.open(tmp_path / "b") as store:
        store.add_many(items[:2], batch_size=2)
    assert raw_digest(tmp_path / "a") == raw_digest(tmp_path / "b")


def test_import_commits_batches_before_a_bad_record(tmp_path: Path) -> None:
    """A bad record in a later import batch: the earlier batches stay, the bad one leaves
    nothing; the error says which record."""
    make, _ = STREAMS["a bad record after good ones (one batch)"]
    make_store(tmp_path / "s")
    with Store.open(tmp_path / "s") as store:
        with pytest.raises(InvalidStreamError, match="record #3"):
            store.import_(io.BytesIO(make()), batch_size=1)
        assert list(store) == [key for key, _, _ in SEEDED] + ["new-1", "new-2"]


# -- known way 1: a put LMDB itself rejects -------------------------------------------------------


def _broken_key_index(raw: bytes, is_str: bool) -> bytes:
    """A codec that forgot to digest long keys: a 512-byte key reaches LMDB as 513 bytes."""
    return (b"s" if is_str else b"b") + raw


def _broken_band_key_bytes(values: Any) -> list[Any]:
    """A codec that yields an empty key for the last band of each document's row of band
    keys: LMDB refuses empty keys."""
    rows = ORIGINAL_BAND_KEY_BYTES(values)
    if np.ndim(values) != 2:
        return rows
    return [[*row[:-1], b""] for row in rows]


ORIGINAL_BAND_KEY_BYTES = codec.band_key_bytes
BROKEN = {"key_index": _broken_key_index, "band_key_bytes": _broken_band_key_bytes}


@pytest.mark.parametrize(
    ("patch", "key", "failing_put"),
    [
        ("key_index", "k" * 512, "the keys table (after the record)"),
        ("band_key_bytes", "new", "the last band (after the record, key and other bands)"),
    ],
)
def test_put_rejected_by_lmdb_part_way_never_commits_half_a_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, patch: str, key: str, failing_put: str
) -> None:
    """Fault injection end to end: validation is bypassed on purpose (the codec is made
    to produce a key LMDB rejects), so the document's first puts succeed and a later
    one fails inside LMDB. The error comes typed, the caller catches it and carries on,
    and the block's clean exit still refuses to commit: nothing of it is on disk."""
    path = tmp_path / "s"
    make_store(path)
    before = raw_digest(path)
    with Store.open(path) as store:
        block = store.write()
        txn = block.__enter__()
        txn.add("good", texts(1, seed=30)[0])
        monkeypatch.setattr(codec, patch, BROKEN[patch])
        with pytest.raises(TransactionAbortedError, match="BadValsizeError"):
            txn.add(key, TEXT)  # failing put: see failing_put
        monkeypatch.undo()
        with pytest.raises(TransactionAbortedError):
            txn.add("after", texts(1, seed=31)[0])
        with pytest.raises(TransactionAbortedError, match="part-way"):
            block.__exit__(None, None, None)
        assert store.check().ok
    assert raw_digest(path) == before, failing_put


# -- a huge document: bounded memory ------------------------------------------------------------

MEMORY_PROBE = r"""
import json, sys, tracemalloc
import numpy as np
from neardup_store.store import Store
from neardup_store.text import ShingleConfig

size, path, kind, as_bytes = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "bytes"
rng = np.random.default_rng(1)
codes = rng.integers(97, 124, size, dtype=np.uint8)
codes[codes == 123] = 32  # letters and blanks: about one word in 27 characters
document = codes.tobytes() if as_bytes else codes.tobytes().decode("ascii")
del codes
with Store.open(path, create=True, num_perm=128, shingles=ShingleConfig(kind=kind)) as store:
    store.hasher.signature("warm up")  # loads the compiled loops outside the measurement
    tracemalloc.start()  # numpy reports its buffers to tracemalloc
    store.add("huge", document, encoding="ascii" if as_bytes else None)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    stored = store.get("huge").signature
print(json.dumps({"peak": peak, "size": len(document), "distinct": len(set(stored.tolist()))}))
"""

# 3x the size would already catch the batch path (22x for characters, 42x for words);
# the streamed path measures about 8 MB for characters and 20 MB for words whatever the
# size (a piece's working set), plus 1x for the decoded copy of a bytes document.
HUGE_DOCUMENT_BYTES = 2 * streamed.STREAM_MIN_CHARACTERS  # 8 MiB
MEMORY_BOUND = 3


def run_memory_probe(
    path: Path, size: int, kind: str = "char", as_bytes: bool = False
) -> dict[str, Any]:
    """Add one document of ``size`` characters in a fresh process; its tracemalloc peak."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    args = [str(size), str(path), kind, "bytes" if as_bytes else "str"]
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, *args],
        env=env, capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    import json

    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize(("kind", "as_bytes"), [("char", False), ("word", False), ("char", True)])
def test_huge_document_is_signed_in_bounded_memory(
    tmp_path: Path, kind: str, as_bytes: bool
) -> None:
    result = run_memory_probe(tmp_path / "s", HUGE_DOCUMENT_BYTES, kind, as_bytes)
    assert result["size"] == HUGE_DOCUMENT_BYTES
    assert result["peak"] < MEMORY_BOUND * HUGE_DOCUMENT_BYTES, result
    assert result["distinct"] > 100  # a real signature of 128 values, not an empty one


TRICKY = ["a", "b", "c", " ", "  ", "\t", "\n", "\u00a0", "\u3000", "\u2028", "e\u0301",
          "\u0301", "\u00e9", "ß", "\ufb01", "ΑΣ", "Σ ", "\u1100\u1161", "\u11a8", "한",
          "\U0001d538", "\u0b47", "\u0b3e", "x\u0327\u0301", "\u2460", "A", "\ud800"]  # fmt: skip
FLAG_SETS = [(True, True, True, True), (True, False, True, False), (False, True, False, True),
             (False, False, False, False), (True, True, False, False)]  # fmt: skip


@pytest.mark.parametrize("flags", FLAG_SETS, ids=[str(f) for f in FLAG_SETS])
@pytest.mark.parametrize("scheme", ["oph", "kperm"])
@pytest.mark.parametrize(("kind", "size"), [("char", 5), ("char", 1), ("word", 3), ("word", 1)])
def test_streamed_signature_is_byte_identical_to_the_batch_path(
    flags: tuple[bool, ...], scheme: str, kind: str, size: int
) -> None:
    """Tiny pieces put a cut everywhere: inside words, white-space runs, combining
    sequences, Hangul syllables and surrogate pairs; every signature must still equal the
    batch path's, byte for byte (also for texts shorter than k and blank ones)."""
    nfkc, casefold, collapse, strip = flags
    shingles = ShingleConfig(
        kind=kind,  # type: ignore[arg-type]
        size=size,
        nfkc=nfkc,
        casefold=casefold,
        collapse_whitespace=collapse,
        strip=strip,
        allow_empty=True,
    )
    config = MinHashConfig(num_perm=32, scheme=scheme, shingles=shingles)  # type: ignore[arg-type]
    hasher = MinHasher(config)
    rng = random.Random(hash_free_seed(flags, scheme, kind, size))
    documents = ["", "  ", "ab", *("".join(rng.choices(TRICKY, k=n)) for n in (3, 40, 400))]
    for document in documents:
        expected = hasher.signatures_from_hashes(hasher.shingler.hash_batch([document]))[0]
        for piece in (1, 3, 64):
            got = streamed.signature(hasher, document, piece_characters=piece)
            assert np.array_equal(got, expected), (document, piece)


def hash_free_seed(*parts: object) -> int:
    """A seed from the parameters that does not depend on PYTHONHASHSEED."""
    return sum(ord(c) * (i + 1) for i, c in enumerate(repr(parts)))


def _streamed_in_pieces_of_100(monkeypatch: pytest.MonkeyPatch, longer_than: int) -> list[int]:
    """Documents longer than ``longer_than`` streamed in pieces of 100 characters; the
    returned list gets the batch index of each document streamed."""
    calls: list[int] = []
    original = streamed.signature

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[3])
        return original(*args, **{**kwargs, "piece_characters": 100})

    monkeypatch.setattr(streamed, "STREAM_MIN_CHARACTERS", longer_than)
    monkeypatch.setattr(streamed, "signature", counting)
    return calls


def test_signatures_routes_long_documents_through_the_streamed_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a batch, documents over the threshold are signed alone in pieces; the batch's
    signatures equal the batch path's, and errors still name the right document."""
    hasher = MinHasher(MinHashConfig(num_perm=64))
    documents: list[object] = [
        *texts(2, seed=40, length=300),
        texts(1, seed=41, length=5000)[0],  # streamed
        texts(1, seed=42, length=50)[0],
        texts(1, seed=43, length=3000)[0].encode(),  # streamed, after decoding
    ]
    expected = hasher.signatures_from_hashes(
        hasher.shingler.hash_batch(documents, encoding="ascii")
    )
    calls = _streamed_in_pieces_of_100(monkeypatch, longer_than=1000)
    assert np.array_equal(hasher.signatures(documents, encoding="ascii"), expected)
    assert calls == [2, 4]
    with pytest.raises(TextDecodeError) as raised:
        hasher.signatures([*documents[:4], b"\xff" * 2000], encoding="ascii")
    assert raised.value.index == 4
    with pytest.raises(EmptyDocumentError) as empty:
        hasher.signatures([documents[2], " " * 2000])
    assert empty.value.index == 1


CJK_TRICKY = [*"\u4e00\u4e8c\u6587\u5b57\u8a9e\u3042\u304b\u30ab\u3002\u3001\uff0c",
              "\u3000", "\u304b\u3099", "\u3099", "\uff76\uff9e", "\uff9e", "\u1100\u1161",
              "\u11a8", "\uac00\u11a8", "\u4e00\u0301", "\u0301\u0327", "\uff21\uff42",
              "\u00e9", "\u0cc6\u0cd5", "\u2460", "\u00a0", "\U00020000",
              "\u3000\u3000"]  # fmt: skip


@pytest.mark.parametrize("scheme", ["oph", "kperm"])
@pytest.mark.parametrize(("kind", "size"), [("char", 5), ("char", 1), ("word", 2)])
def test_a_long_text_without_ascii_is_cut_into_pieces_and_signed_identically(
    scheme: str, kind: str, size: int
) -> None:
    """Chinese or Japanese prose has no ASCII, and pieces were cut only before ASCII under
    NFKC: a long such document was one piece, signed in the batch path's memory (review
    52). It is now cut before characters NFKC never joins to what precedes them, and each
    signature still equals the batch path's, kana voiced marks, Hangul jamo and combining
    marks placed at every cut included."""
    shingles = ShingleConfig(kind=kind, size=size)  # type: ignore[arg-type]
    config = MinHashConfig(num_perm=32, scheme=scheme, shingles=shingles)  # type: ignore[arg-type]
    hasher = MinHasher(config)
    rng = random.Random(hash_free_seed(scheme, kind, size, "cjk"))
    for length in (30, 400, 3000):
        document = "".join(rng.choices(CJK_TRICKY, k=length))
        assert not re.search(r"[\x00-\x7f]", document)
        expected = hasher.signatures_from_hashes(hasher.shingler.hash_batch([document]))[0]
        for piece in (1, 7, 100):
            pieces = list(streamed._raw_pieces(document, piece, nfkc=True))
            assert "".join(pieces) == document
            assert len(pieces) > len(document) // (4 * piece), (length, piece)
            got = streamed.signature(hasher, document, piece_characters=piece)
            assert np.array_equal(got, expected), (document, piece)


def test_memoryview_documents_are_streamed_like_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """streams() took only str and bytes: a long memoryview document was signed whole, in
    the batch path's memory (review 52). It counts by the bytes as_text decodes."""
    text = texts(1, seed=44, length=3000)[0]
    view = memoryview(text.encode("utf-16-le")).cast("H")  # 3,000 items, 6,000 bytes
    hasher = MinHasher(MinHashConfig(num_perm=64))
    expected = hasher.signatures([text, "a short one", text])
    calls = _streamed_in_pieces_of_100(monkeypatch, longer_than=4000)
    assert streamed.streams(hasher.config.shingles, view)
    assert streamed.streams(hasher.config.shingles, memoryview(text.encode("utf-16-le")))
    assert not streamed.streams(hasher.config.shingles, memoryview(text.encode("ascii")))
    short = memoryview("a short one".encode("utf-16-le"))
    documents = [view, short, memoryview(bytearray(text.encode("utf-16-le")))]
    assert np.array_equal(hasher.signatures(documents, encoding="utf-16-le"), expected)
    assert calls == [0, 2]


def test_a_released_memoryview_document_is_a_typed_error_naming_it() -> None:
    """bytes() of a released memoryview raised a raw ValueError out of signature() and
    signatures(), though streamed.length() said as_text reports it (review 54)."""
    hasher = MinHasher(MinHashConfig(num_perm=16))
    view = memoryview(b"some document text")
    view.release()
    hint = "got memoryview; the view was released, so its bytes are gone"
    with pytest.raises(InputTypeError, match=f"^expected a str document, {hint}") as one:
        hasher.signature(view, "utf-8")
    assert one.value.index is None
    with pytest.raises(InputTypeError, match=rf"\(document #1\), {hint}") as batch:
        hasher.signatures([b"other text here", view], "utf-8")
    assert batch.value.index == 1
    with pytest.raises(InputTypeError, match=hint):  # without an encoding, the same reason
        hasher.signature(view)
    assert streamed.length(view) is None


# -- security: no code execution, bounded decoding ---------------------------------------------


def _package_sources() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(PACKAGE.glob("*.py"))}


def test_package_never_loads_code_from_data() -> None:
    """No pickle (or its relatives) anywhere in the package: opening or importing an
    untrusted file cannot run code. The scan covers the source text, so an import under
    another name or inside a function is caught too."""
    forbidden = re.compile(
        r"\b(pickle|cPickle|dill|cloudpickle|marshal|shelve|joblib|jsonpickle)\b"
        r"|\byaml\.(unsafe_)?load\b|\beval\(|\bexec\(|allow_pickle\s*=\s*True|np\.load\("
    )
    found = {
        f"{name}:{number}": line.strip()
        for name, source in _package_sources().items()
        for number, line in enumerate(source.splitlines(), 1)
        if forbidden.search(line)
    }
    assert found == {}


def test_every_msgpack_decoder_has_no_hooks_and_bounded_lengths() -> None:
    """Every msgpack decoding call in the package is in codec.py and installs no hook
    (so nothing in the data chooses code to run); the stream reader also passes every
    length limit (the one-shot ``unpackb`` bounds them by the input's length itself)."""
    calls: list[tuple[str, str, set[str]]] = []
    for name, source in _package_sources().items():
        for node in ast.walk(ast.parse(source)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"unpackb", "Unpacker", "unpack", "loads", "load"}
                and ast.unparse(node.func.value) == "msgpack"
            ):
                calls.append((name, node.func.attr, {k.arg or "" for k in node.keywords}))
    assert calls and {name for name, _, _ in calls} == {"codec.py"}
    limits = {"max_buffer_size", "max_bin_len", "max_str_len", "max_array_len", "max_map_len"}
    for _, function, keywords in calls:
        assert {"raw", "strict_map_key"} <= keywords
        assert not keywords & {"ext_hook", "object_hook", "object_pairs_hook", "list_hook"}
        if function == "Unpacker":
            assert limits <= keywords


@pytest.mark.parametrize(
    "name", [name for name in STREAMS if "declaring" in name or "nested" in name]
)
def test_crafted_stream_cannot_make_the_reader_allocate_what_it_declares(
    tmp_path: Path, name: str
) -> None:
    import tracemalloc

    make, _ = STREAMS[name]
    data = make()
    make_store(tmp_path / "s")
    with Store.open(tmp_path / "s") as store:
        tracemalloc.start()
        with pytest.raises(InvalidStreamError):
            store.import_(io.BytesIO(data))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < len(data) + 4 * codec.STREAM_MAX_OBJECT_BYTES


def test_extension_types_import_as_inert_data(tmp_path: Path) -> None:
    """Stores may already hold ``ExtType`` metadata (tests/test_format.py pins that it
    reads back as data), so an export carrying one imports it as data: no hook runs."""
    from bad_input_cases import GOOD_SIG_BYTES, crafted_stream

    payload = msgpack.ExtType(5, b"\x80\x04 would be a pickle")
    record = codec.export_item("new-1", GOOD_SIG_BYTES, payload)
    make_store(tmp_path / "s")
    with Store.open(tmp_path / "s") as store:
        assert store.import_(io.BytesIO(crafted_stream(record)())) == 1
        assert store.get("new-1").metadata == payload


# -- owner-only permissions -----------------------------------------------------------------------


def _modes(path: Path) -> dict[str, int]:
    entries = [path, *sorted(path.iterdir())]
    return {p.name if p != path else ".": stat.S_IMODE(p.stat().st_mode) for p in entries}


@pytest.fixture
def umask() -> Iterator[Any]:
    """Set the process umask for one test and put the old one back."""
    old = os.umask(0o022)
    try:
        yield os.umask
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o000])
def test_store_is_created_owner_only(tmp_path: Path, umask: Any, mask: int) -> None:
    umask(mask)
    make_store(tmp_path / "s")
    modes = _modes(tmp_path / "s")
    assert modes.pop(".") == 0o700
    assert set(modes) == {"data.mdb", "lock.mdb", "neardup.lock", "neardup.create.lock"}
    assert set(modes.values()) == {0o600}


def test_mode_widens_permissions_on_request_and_umask_still_applies(
    tmp_path: Path, umask: Any
) -> None:
    Store.open(tmp_path / "group", create=True, mode=0o750).close()
    assert set(_modes(tmp_path / "group").values()) == {0o750, 0o640}
    umask(0o027)
    Store.open(tmp_path / "masked", create=True, mode=0o777).close()
    assert set(_modes(tmp_path / "masked").values()) == {0o750, 0o640}
    for bad in (0o644, 0o1777, -1, "700", True):
        with pytest.raises(InvalidParameterError, match="mode"):
            Store.open(tmp_path / "bad", create=True, mode=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "bad").exists()


def test_compact_and_backup_keep_the_store_private(tmp_path: Path, umask: Any) -> None:
    """LMDB writes its copies 0o666 less the umask; compaction swaps such a copy in."""
    make_store(tmp_path / "s")
    with Store.open(tmp_path / "s") as store:
        store.remove("alpha")
        store.compact()
        store.backup(tmp_path / "copy")
    assert _modes(tmp_path / "s")["data.mdb"] == 0o600
    assert _modes(tmp_path / "copy") == {".": 0o700, "data.mdb": 0o600}


def test_compact_and_backup_keep_the_store_s_group(tmp_path: Path) -> None:
    """LMDB writes its copies in the creator's primary group: a group member's compaction
    handed the store to that member's group, locking the rest of the group out (review
    34). The copy takes the store's group, where this user may give it."""
    if os.geteuid() != 0:
        pytest.skip("giving a file a group other than one's own needs root here")
    team = 4242  # no one's primary group
    make_store(tmp_path / "s")
    os.chown(tmp_path / "s" / "data.mdb", -1, team)
    with Store.open(tmp_path / "s") as store:
        store.remove("alpha")
        store.compact()
        store.backup(tmp_path / "copy")
    for copy in (tmp_path / "s" / "data.mdb", tmp_path / "copy" / "data.mdb"):
        assert (copy.stat().st_gid, stat.S_IMODE(copy.stat().st_mode)) == (team, 0o600)


def test_cli_init_mode(tmp_path: Path, umask: Any) -> None:
    runner = CliRunner()
    done = runner.invoke(cli, ["init", str(tmp_path / "s"), "--mode", "750"])
    assert done.exit_code == 0, done.output
    assert set(_modes(tmp_path / "s").values()) == {0o750, 0o640}
    done = runner.invoke(cli, ["init", str(tmp_path / "t")])
    assert set(_modes(tmp_path / "t").values()) == {0o700, 0o600}
    done = runner.invoke(cli, ["init", str(tmp_path / "u"), "--mode", "rwx"])
    assert done.exit_code == 2 and "not an octal number" in done.output


# -- known way 11: nothing stored depends on Python's hash() ------------------------------------

BUILD = r"""
import sys
from neardup_store.store import Store
from neardup_store.text import ShingleConfig

path, seed = sys.argv[1], sys.argv[2]
assert __import__("os").environ["PYTHONHASHSEED"] == seed
words = ["river", "stone", "lamp", "quiet", "orange", "harbour", "wind", "paper"]
texts = [
    " ".join(words[(i * 7 + j * 3) % 8] + str(j % (i + 2)) for j in range(60))
    for i in range(40)
]
for kind in ("char", "word"):
    with Store.open(f"{path}-{kind}", create=True, shingles=ShingleConfig(kind=kind)) as store:
        first = [(f"doc-{i}", t, {"i": i, "tags": ["x", str(i)]}) for i, t in enumerate(texts[:20])]
        store.add_many(first)
        store.add_many([(f"doc-{i}".encode(), t) for i, t in enumerate(texts[20:])], batch_size=7)
        store.add_signatures([("by-signature", store.get("doc-3").signature, {"copied": True})])
        store.remove("doc-5")
        store.add_if_unique("maybe", texts[4] + " and a little more")
        store.rebuild(threshold=0.6)
"""


def test_store_bytes_do_not_depend_on_the_python_hash_seed(tmp_path: Path) -> None:
    digests = {}
    for seed in ("0", "12345"):
        target = tmp_path / f"seed-{seed}"
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "PYTHONHASHSEED": seed}
        subprocess.run(
            [sys.executable, "-c", BUILD, str(target), seed], env=env, check=True, timeout=300
        )
        digests[seed] = [raw_digest(f"{target}-{kind}") for kind in ("char", "word")]
    assert digests["0"] == digests["12345"]  # commit counters included: same operations


def test_package_never_calls_the_builtin_hash() -> None:
    calls = [
        f"{name}:{node.lineno}"
        for name, source in _package_sources().items()
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hash"
    ]
    assert calls == []
    assert not any(re.search(r"(?<![\w.])hash\(", source) for source in _package_sources().values())
