"""The whole bulk job: JSON lines in, signatures, pairs, clusters and the deduplicated
corpus out; and the bulk load of its signatures into an LMDB store.

Output directory of :func:`run_dedup` (Spark writes each table as a directory of part
files, one per partition):

=================  ====================================================================
``params.json``    the configuration, banding and threshold (what ``spark-load`` uses)
``signatures/``    parquet: ``ordinal, id, signature`` (uint32 LE), ``metadata`` (msgpack)
``pairs/``         JSON lines: ``first, second`` (ids, first is the earlier), ``score``
``clusters/``      JSON lines: ``id, representative`` for every member of a cluster
``kept/``          text: the input lines kept, one per cluster plus every unclustered one
``failed/``        JSON lines: ``ordinal``, ``error``, ``file`` (URI) and ``line_number`` of
                   unusable input lines
``summary.json``   counts and the seconds spent in each stage
=================  ====================================================================
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote, urlparse

import numpy as np

from .. import codec
from ..errors import InvalidParameterError
from ..lsh import KEY_SCHEMES, LSHParams
from ..minhash import MinHashConfig
from ..params import StoreParams
from ..store import Store, batches, check_batch_size
from . import pipeline

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

PARAMS_FILE = "params.json"
SUMMARY_FILE = "summary.json"
DOCUMENTS_KEY = "documents"
"""The count of signatures written, in ``params.json`` and ``summary.json``."""


def params_to_dict(params: StoreParams) -> dict[str, Any]:
    """Everything a store needs to be created with these parameters (JSON-friendly)."""
    return {
        "config": params.config.to_dict(),
        "bands": params.banding.bands,
        "rows": params.banding.rows,
        "threshold": params.threshold,
        "keys": params.banding.keys,
    }


def params_from_dict(data: dict[str, Any]) -> StoreParams:
    """Inverse of :func:`params_to_dict`."""
    return StoreParams(
        MinHashConfig.from_dict(data["config"]),
        LSHParams(int(data["bands"]), int(data["rows"]), str(data.get("keys", KEY_SCHEMES[0]))),
        float(data["threshold"]),
    )


@dataclass(frozen=True)
class DedupReport:
    """What :func:`run_dedup` found and wrote, and where the time went (seconds per stage:
    ``sign``, ``pairs``, ``components``, ``write``)."""

    out: str
    documents: int
    failed: int
    pairs: int
    clusters: int
    clustered: int
    kept: int
    dropped: int
    large_buckets: int
    rounds: int
    partitions: int
    seconds: dict[str, float] = field(default_factory=dict)


def _timed(seconds: dict[str, float], stage: str, action: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    result = action()
    seconds[stage] = round(time.perf_counter() - started, 3)
    return result


def _check_empty(name: str, path: Path) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise InvalidParameterError(name, str(path), "a new or empty directory")


def _make_directory(name: str, path: Path) -> None:
    """Make ``path`` (and its parents), or say why it cannot be made."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InvalidParameterError(
            name, str(path), f"a directory that can be made ({err.strerror})"
        ) from None


def run_dedup(
    spark: SparkSession,
    inputs: list[str],
    out: str | os.PathLike[str],
    params: StoreParams,
    *,
    id_field: str = "id",
    text_field: str = "text",
    max_bucket: int = pipeline.DEFAULT_MAX_BUCKET,
    partitions: int | None = None,
) -> DedupReport:
    """Deduplicate JSON-lines files on Spark and write the outputs listed above.

    Each stage is materialised before the next starts, so the stage times say where
    the time goes; the signatures are persisted (memory, spilling to disk) because
    banding, verification and the outputs all read them.

    Args:
        inputs: JSON-lines files (or directories of them), one document per line.
        out: a new or empty directory (local path, or a URI the cluster can write).
        partitions: repartition the input lines into this many partitions first
            (default: as read, about one per 128 MB of input).

    Raises:
        InvalidParameterError: ``out`` is not empty, or a parameter is out of range.
    """
    # Checked before anything is made: Spark would fail late, with a traceback.
    if isinstance(inputs, (str, os.PathLike)) or not inputs:
        raise InvalidParameterError("inputs", inputs, "a list of one or more files or directories")
    if partitions is not None and (
        isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1
    ):
        raise InvalidParameterError("partitions", partitions, "a positive integer or None")
    pipeline.check_max_bucket(max_bucket)
    listed = pipeline.list_inputs(spark, list(inputs))
    out = _local_path(out)
    out_path = Path(out)
    if "://" not in str(out):
        _check_empty("out", out_path)
        _make_directory("out", out_path)
    uri = str(out) if "://" in str(out) else out_path.resolve().as_uri()
    seconds: dict[str, float] = {}
    lines = pipeline.read_listed(spark, listed)
    if partitions:
        lines = lines.repartition(partitions)
    lines = lines.persist()
    signed = pipeline.sign_jsonl(lines, params, id_field, text_field).persist()
    docs = pipeline.documents(signed)

    def signing() -> tuple[int, int]:
        count = docs.count()
        _check_unique_ids(docs)
        return count, pipeline.failures(signed).count()

    count, n_failed = _timed(seconds, "sign", signing)
    found = pipeline.candidate_pairs(docs, max_bucket)
    pairs = pipeline.verify(found.pairs, docs, params.config.num_perm, params.threshold).persist()
    n_pairs, n_large = _timed(
        seconds, "pairs", lambda: (pairs.count(), found.large_buckets.count())
    )

    def clustering() -> tuple[pipeline.Components, DataFrame, int, int]:
        comps = pipeline.components(pairs)
        members = comps.members.persist()
        clustered = members.count()
        return comps, members, clustered, members.filter("ordinal = representative").count()

    comps, members, clustered, n_clusters = _timed(seconds, "components", clustering)

    def write() -> None:
        _write_outputs(uri, params, count, lines, docs, signed, pairs, members)

    _timed(seconds, "write", write)
    dropped = clustered - n_clusters
    report = DedupReport(
        out=str(out),
        documents=count,
        failed=n_failed,
        pairs=n_pairs,
        clusters=n_clusters,
        clustered=clustered,
        kept=count - dropped,
        dropped=dropped,
        large_buckets=n_large,
        rounds=comps.rounds,
        partitions=lines.rdd.getNumPartitions(),
        seconds=seconds,
    )
    if "://" not in str(out):
        (out_path / SUMMARY_FILE).write_text(json.dumps(asdict(report), indent=2) + "\n")
    for frame in (members, pairs, signed, lines):
        frame.unpersist()
    return report


def _local_path(out: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """A ``file:`` URI as the local path it names, which is then checked and made like
    one (as a URI it was written into whatever was there, and not made when missing)."""
    return pipeline.local_path(out)


def _check_unique_ids(docs: DataFrame) -> None:
    from pyspark.sql import functions as sf

    repeated = docs.groupBy("id").count().filter(sf.col("count") > 1).limit(3).collect()
    if repeated:
        raise InvalidParameterError(
            "ids",
            [row["id"] for row in repeated],
            "unique document ids (a store holds one document per key); drop the repeated"
            " lines first: unlike add and dedup, spark-dedup does not skip them",
        )


def _write_outputs(
    uri: str,
    params: StoreParams,
    count: int,
    lines: DataFrame,
    docs: DataFrame,
    signed: DataFrame,
    pairs: DataFrame,
    members: DataFrame,
) -> None:
    from pyspark.sql import functions as sf

    base = uri.rstrip("/")
    docs.select("ordinal", "id", "signature", "metadata").write.parquet(f"{base}/signatures")
    ids = docs.select("ordinal", "id")
    first = ids.select(sf.col("ordinal").alias("first"), sf.col("id").alias("first_id"))
    second = ids.select(sf.col("ordinal").alias("second"), sf.col("id").alias("second_id"))
    pairs.join(first, "first").join(second, "second").select(
        sf.col("first_id").alias("first"), sf.col("second_id").alias("second"), "score"
    ).write.json(f"{base}/pairs")
    rep = ids.select(sf.col("ordinal").alias("representative"), sf.col("id").alias("rep_id"))
    members.join(ids, "ordinal").join(rep, "representative").select(
        "id", sf.col("rep_id").alias("representative")
    ).write.json(f"{base}/clusters")
    dropped = members.filter(sf.col("ordinal") != sf.col("representative")).select("ordinal")
    failed = pipeline.failures(signed, lines)
    kept = lines.join(dropped, "ordinal", "left_anti").join(
        failed.select("ordinal"), "ordinal", "left_anti"
    )
    # Blank as add and dedup see it: only white space (trim takes off spaces alone).
    kept = kept.filter(sf.col("line").rlike(r"\S"))
    kept.orderBy("ordinal").select("line").write.text(f"{base}/kept")
    failed.write.json(f"{base}/failed")
    # Last: an output with params.json is a whole one, and a run that fails before
    # writes nothing of it over an earlier output's. It also holds the count of
    # signatures, which load_output checks (a copy of the output can lose part files).
    written = {**params_to_dict(params), DOCUMENTS_KEY: count}
    if base.startswith("file:"):
        Path(unquote(urlparse(base).path), PARAMS_FILE).write_text(
            json.dumps(written, indent=2) + "\n"
        )
    else:  # a cluster file system: write through Spark
        spark = docs.sparkSession
        spark.createDataFrame([(json.dumps(written),)], "value string").coalesce(1).write.text(
            f"{base}/{PARAMS_FILE}"
        )


def read_params(out: str | os.PathLike[str]) -> StoreParams:
    """The parameters a :func:`run_dedup` output was computed with."""
    path = Path(_local_path(out), PARAMS_FILE)
    try:
        return params_from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise InvalidParameterError(
            "out", str(out), f"the output directory of spark-dedup (no {PARAMS_FILE} in it)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as err:  # cut short, or another file
        raise InvalidParameterError(
            "out",
            str(out),
            f"the output directory of spark-dedup (its {PARAMS_FILE} does not "
            f"read as one: {type(err).__name__}: {err})",
        ) from None


# -- bulk load ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadReport:
    """What :func:`bulk_load` wrote: documents, write transactions, seconds, and the
    integrity check of the finished store."""

    path: str
    documents: int
    batches: int
    seconds: float
    check_ok: bool


def _rows(frame: DataFrame) -> Iterator[Any]:
    """Rows in ordinal order, one partition at a time on the driver (never all at once)."""
    return frame.orderBy("ordinal").toLocalIterator(prefetchPartitions=True)


def bulk_load(
    docs: DataFrame,
    path: str | os.PathLike[str],
    params: StoreParams,
    *,
    batch_size: int | Literal["auto"] = "auto",
    progress: Callable[[int], None] | None = None,
) -> LoadReport:
    """Write signed documents (``ordinal, id, signature[, metadata]``) into a new store.

    LMDB has one writer, so the driver writes: partitions stream to it in ordinal order
    (at most two partitions in memory), each ``batch_size`` documents (``"auto"``:
    :meth:`Store.transaction_size`) are one transaction of :meth:`Store.add_signatures`.
    Inserting in ordinal order makes the store equal to one built by adding the input in
    order, down to query tie-breaks.
    The store is built next to ``path`` and moved there only once complete and checked,
    so a failed load leaves nothing at ``path``.

    Raises:
        InvalidParameterError: ``path`` is not a new or empty directory; ``docs`` lacks
            a column; or a row's signature is null or not ``4 * num_perm`` bytes, or its
            metadata is not msgpack (named by the row's id).
        DuplicateKeyError: two documents share an id.
        RuntimeError: the finished store fails :meth:`Store.check` (a bug).
    """
    target = Path(path)
    _check_empty("path", target)
    check_batch_size(batch_size)
    _check_columns(docs)
    _make_directory("path", target.parent)
    started = time.perf_counter()
    building = target.parent / f".{target.name}.loading-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    has_metadata = "metadata" in docs.columns
    done = loaded = 0
    try:
        with Store.open(
            building,
            create=True,
            durable=False,  # one sync at the end; a crash leaves only the temporary copy
            **params.open_options(),
        ) as store:
            items = _load_items(docs, has_metadata, params.config.num_perm)
            for batch in batches(items, store._batch_sizes(batch_size)):
                done += store.add_signatures(batch, batch_size=None)
                loaded += 1
                if progress is not None:
                    progress(done)
            store.sync()
            report = store.check()
        if not report.ok:
            raise RuntimeError(f"the loaded store fails its check: {report}")
        if target.exists():
            target.rmdir()  # empty (checked above); rename needs it gone
        building.rename(target)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return LoadReport(str(target), done, loaded, round(time.perf_counter() - started, 3), True)


LOAD_COLUMNS = ("ordinal", "id", "signature")


def _check_columns(docs: DataFrame) -> None:
    missing = [name for name in LOAD_COLUMNS if name not in docs.columns]
    if missing:
        raise InvalidParameterError(
            "docs",
            f"columns {docs.columns}",
            f"signed documents with columns {', '.join(LOAD_COLUMNS)} (and optionally"
            f" metadata), as spark-dedup's signatures/ holds; missing: {', '.join(missing)}",
        )


def _load_items(
    docs: DataFrame, has_metadata: bool, num_perm: int
) -> Iterator[tuple[str, Any, Any]]:
    """``(id, signature, metadata)`` of signed documents, in ordinal order."""
    columns = [*LOAD_COLUMNS] + (["metadata"] if has_metadata else [])
    width = 4 * num_perm
    for row in _rows(docs.select(*columns)):
        key, signature = row["id"], row["signature"]
        if signature is None or len(signature) != width:
            shown = None if signature is None else f"{len(signature)} bytes"
            raise InvalidParameterError(
                f"signature of {key!r}", shown, f"{width} bytes ({num_perm} uint32 values)"
            )
        raw = row["metadata"] if has_metadata else None
        yield key, np.frombuffer(signature, dtype="<u4"), _metadata(key, raw)


def _metadata(key: str, raw: Any) -> Any:
    """A row's msgpack metadata, decoded; the engine's errors named by the row's id."""
    if raw is None:
        return None
    try:
        return codec.unpack_meta(bytes(raw))
    except Exception as err:  # msgpack raises several kinds, some with no message
        raise InvalidParameterError(
            f"metadata of {key!r}",
            f"{len(raw)} bytes",
            f"msgpack bytes, as spark-dedup writes them ({type(err).__name__}: {err})",
        ) from None


def load_output(
    spark: SparkSession,
    out: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    batch_size: int | Literal["auto"] = "auto",
    progress: Callable[[int], None] | None = None,
) -> LoadReport:
    """Bulk-load the signatures of a :func:`run_dedup` output into a new store at ``path``.

    Raises:
        InvalidParameterError: ``out`` is not a whole spark-dedup output: no
            ``params.json``, no ``signatures/_SUCCESS``, or fewer or more signatures
            than the run wrote (part files lost in a copy), by the counts in
            ``params.json`` and ``summary.json``.
    """
    out = _local_path(out)
    if "://" in str(out):  # a cluster file system: params.json was written through Spark
        text = "".join(row["value"] for row in spark.read.text(f"{out}/{PARAMS_FILE}").collect())
        written, uri = json.loads(text), str(out).rstrip("/")
        params, counts = params_from_dict(written), [written.get(DOCUMENTS_KEY)]
    else:
        params, uri = read_params(out), Path(out).resolve().as_uri()
        if not (Path(out) / "signatures" / "_SUCCESS").exists():
            raise InvalidParameterError(
                "out", str(out), "a finished spark-dedup output (its signatures/ is missing"
                " or incomplete: the run stopped before writing it; run it again)"
            )  # fmt: skip
        counts = _written_counts(Path(out))
    docs = spark.read.parquet(f"{uri}/signatures")
    _check_count(str(out), docs.count(), counts)
    return bulk_load(docs, path, params, batch_size=batch_size, progress=progress)


def _written_counts(out: Path) -> list[Any]:
    """The signature counts a local output's ``params.json`` and ``summary.json`` record
    (None for a file that has none: an older output, or no summary)."""
    counts = []
    for name in (PARAMS_FILE, SUMMARY_FILE):
        try:
            counts.append(json.loads((out / name).read_text()).get(DOCUMENTS_KEY))
        except FileNotFoundError:
            counts.append(None)
        except (OSError, ValueError, AttributeError) as err:
            raise InvalidParameterError(
                "out", str(out), f"a whole spark-dedup output (its {name} does not read:"
                f" {type(err).__name__}: {err}; copy it again or run spark-dedup again)"
            ) from None  # fmt: skip
    return counts


def _check_count(out: str, found: int, counts: list[Any]) -> None:
    """Refuse an output whose signatures/ holds another count than the run wrote."""
    for expected in counts:
        if expected is not None and expected != found:
            raise InvalidParameterError(
                "out",
                out,
                f"a whole spark-dedup output: its signatures/ holds {found} documents, the"
                f" run wrote {expected} (part files missing or extra, as from a copy cut"
                " short: copy it again, or run spark-dedup again)",
            )
