"""The whole bulk job: JSON lines in, signatures, pairs, clusters and the deduplicated
corpus out; and the bulk load of its signatures into an LMDB store.

Output directory of :func:`run_dedup` (Spark writes each table as a directory of part
files, one per partition):

=================  ====================================================================
``params.json``    the configuration, banding and threshold (what ``spark-load`` uses)
``signatures/``    parquet: ``ordinal, id, signature`` (uint32 LE), ``metadata`` (msgpack)
``pairs/``         JSON lines: ``first, second`` (ids, first is the earlier), ``score``
``clusters/``      JSON lines: ``id, representative`` for every member of a cluster
``kept/``          text: the input lines ``neardup-admin dedup`` keeps, in input order:
                   each document unless a near-duplicate of it was kept before it (so
                   every unclustered one, and one or more of each cluster)
``dropped/``       JSON lines: the other documents as ``dedup --dropped`` writes them,
                   in input order: the line's object plus ``duplicate_of`` (the id of
                   the best kept near-duplicate before it, printed as the CLI prints
                   keys) and ``score``
``failed/``        JSON lines: ``ordinal``, ``error``, ``file`` (URI) and ``line_number`` of
                   unusable input lines
``summary.json``   counts and the seconds spent in each stage
=================  ====================================================================
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import numpy as np

from .. import codec
from ..errors import InvalidParameterError, SparkJobError, path_of
from ..lsh import KEY_SCHEMES, LSHParams
from ..minhash import MinHashConfig
from ..params import StoreParams
from ..store import Store, batches, check_batch_size
from . import pipeline
from .runtime import spark_failures

if TYPE_CHECKING:
    import pyarrow as pa
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


def _check_params(params: object) -> None:
    """Refuse ``params`` that are not :class:`StoreParams`, before anything is made."""
    if not isinstance(params, StoreParams):
        raise InvalidParameterError(
            "params",
            type(params).__name__,
            "StoreParams (from neardup_store.params.resolve_params)",
        )


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
    ``sign``, ``pairs``, ``components`` (with what to keep), ``write``). ``kept`` and
    ``dropped`` count documents as ``neardup-admin dedup`` would keep and drop them."""

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
    on_out_checked: Callable[[], None] | None = None,
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
        on_out_checked: called once ``out`` is found new or empty (and made), before
            anything is written to it: from then on, what it holds is this run's (so an
            interrupted run's caller knows whether to advise deleting it).

    Raises:
        InvalidParameterError: ``out`` is not empty, or a parameter is out of range.
        SparkJobError: an input or ``out`` cannot be reached or read (its file system
            refuses, or has no connector here), or an output cannot be written.
    """
    # Checked before anything is made: Spark would fail late, with a traceback.
    path_of(out)
    _check_params(params)
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
    else:
        _check_empty_uri(spark, str(out))
    if on_out_checked is not None:
        on_out_checked()
    uri = str(out) if "://" in str(out) else _file_uri(out_path)
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

    def clustering() -> tuple[pipeline.Components, DataFrame, DataFrame, int, int, int]:
        comps = pipeline.components(pairs)
        members = comps.members.persist()
        clustered = members.count()
        n_clusters = members.filter("ordinal = representative").count()
        dropped = pipeline.dropped_in_order(pairs, members).persist()
        return comps, members, dropped, clustered, n_clusters, dropped.count()

    comps, members, dropped_docs, clustered, n_clusters, dropped = _timed(
        seconds, "components", clustering
    )

    def write() -> None:
        written = _Written(lines, docs, signed, pairs, members, dropped_docs)
        _write_outputs(uri, params, count, written, id_field, text_field)

    _timed(seconds, "write", write)
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
    summary = json.dumps(asdict(report), indent=2) + "\n"
    if "://" not in str(out):
        (out_path / SUMMARY_FILE).write_text(summary)
    else:  # a cluster file system: through Spark, as params.json
        with spark_failures(f"output {uri!r} cannot be written", WRITE_ADVICE):
            _write_text(spark, f"{uri.rstrip('/')}/{SUMMARY_FILE}", summary)
    for frame in (dropped_docs, members, pairs, signed, lines):
        frame.unpersist()
    return report


def _local_path(out: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """A ``file:`` URI as the local path it names, which is then checked and made like
    one (as a URI it was written into whatever was there, and not made when missing)."""
    return pipeline.local_path(out)


OUT_ADVICE = (
    "check the URI and that its file system can be reached from here with this Spark (a "
    "scheme such as s3a: needs its connector, e.g. hadoop-aws, on Spark's class path)"
)


WRITE_ADVICE = (
    "check that it can be written (permissions, room), then run spark-dedup again into a "
    "new or empty directory"
)


def _check_empty_uri(spark: SparkSession, uri: str) -> None:
    """A URI ``out`` checked and made as a local one is (:func:`_check_empty`,
    :func:`_make_directory`), through its Hadoop file system, before any work: Spark
    would refuse it only when writing, after the whole job, with a traceback."""
    context = spark.sparkContext
    with spark_failures(f"output {uri!r} cannot be reached", OUT_ADVICE):
        path = context._jvm.org.apache.hadoop.fs.Path(uri)
        system = path.getFileSystem(context._jsc.hadoopConfiguration())
        if system.exists(path):
            if not system.getFileStatus(path).isDirectory() or len(system.listStatus(path)):
                raise InvalidParameterError("out", uri, "a new or empty directory")
        elif not system.mkdirs(path):
            raise SparkJobError(
                f"output {uri!r} cannot be made", "its file system refused", OUT_ADVICE
            )


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


@dataclass(frozen=True)
class _Written:
    """The frames :func:`_write_outputs` writes from."""

    lines: DataFrame
    docs: DataFrame
    signed: DataFrame
    pairs: DataFrame
    members: DataFrame
    dropped: DataFrame


def _write_outputs(
    uri: str, params: StoreParams, count: int, frames: _Written, id_field: str, text_field: str
) -> None:
    """Write every output but ``summary.json``; a file system refusing a write is a
    :class:`SparkJobError` (a failure of our code on the executors keeps its traceback)."""
    with spark_failures(f"output {uri!r} cannot be written", WRITE_ADVICE):
        _write_tables(uri, params, count, frames, id_field, text_field)


def _write_tables(
    uri: str, params: StoreParams, count: int, frames: _Written, id_field: str, text_field: str
) -> None:
    from pyspark.sql import functions as sf

    lines, docs, signed = frames.lines, frames.docs, frames.signed
    pairs, members = frames.pairs, frames.members
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
    failed = pipeline.failures(signed, lines)
    kept = lines.join(frames.dropped.select("ordinal"), "ordinal", "left_anti").join(
        failed.select("ordinal"), "ordinal", "left_anti"
    )
    # Blank as add and dedup see it: only white space (trim takes off spaces alone).
    kept = kept.filter(sf.col("line").rlike(r"\S"))
    # dedup writes a kept line without the CRs it ended with (the lines are cut at LF)
    kept = kept.select("ordinal", sf.regexp_replace("line", r"\r+\z", "").alias("line"))
    kept.orderBy("ordinal").select("line").write.text(f"{base}/kept")
    _dropped_lines(frames.dropped, lines, ids, id_field, text_field).write.text(f"{base}/dropped")
    failed.write.json(f"{base}/failed")
    # Last: an output with params.json is a whole one, and a run that fails before
    # writes nothing of it over an earlier output's. It also holds the count of
    # signatures, which load_output checks (a copy of the output can lose part files).
    written = {**params_to_dict(params), DOCUMENTS_KEY: count}
    if base.startswith(_FILE_SCHEME):
        Path(base.removeprefix(_FILE_SCHEME), PARAMS_FILE).write_text(
            json.dumps(written, indent=2) + "\n"
        )
    else:  # a cluster file system: write through Spark
        _write_text(docs.sparkSession, f"{base}/{PARAMS_FILE}", json.dumps(written))


def _write_text(spark: SparkSession, uri: str, text: str) -> None:
    """``text`` as one line in one part file of a directory ``uri`` (its file system's
    own way to write a small file: Spark writes a directory there)."""
    spark.createDataFrame([(text,)], "value string").coalesce(1).write.text(uri)


def _dropped_lines(
    dropped: DataFrame, lines: DataFrame, ids: DataFrame, id_field: str, text_field: str
) -> DataFrame:
    """The lines of ``dedup --dropped`` for the dropped documents, in input order: each
    one's JSON object with ``duplicate_of`` and ``score`` added, written as dedup writes
    them (:func:`~neardup_store.ingest.json_text`; the id as
    :func:`~neardup_store.ingest.key_text` prints it)."""
    from pyspark.sql import functions as sf

    kept_ids = ids.select(sf.col("ordinal").alias("duplicate_of"), sf.col("id").alias("kept"))
    rows = dropped.join(lines.select("ordinal", "line"), "ordinal").join(kept_ids, "duplicate_of")

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _dropped_batches(batches, id_field, text_field)

    written = rows.select("ordinal", "line", "kept", "score").mapInArrow(
        run, "ordinal long, value string"
    )
    return written.orderBy("ordinal").select("value")


def _dropped_batches(
    batches: Iterator[pa.RecordBatch], id_field: str, text_field: str
) -> Iterator[pa.RecordBatch]:
    """Executor side of :func:`_dropped_lines`: parse each line as dedup does, add the
    two fields, write it back as JSON text."""
    import pyarrow as pa

    from ..ingest import Failure, dropped_text, parse_line

    for batch in batches:
        values = []
        raw_lines = batch.column(1).cast(pa.binary()).to_pylist()
        kept, scores = batch.column(2).to_pylist(), batch.column(3).to_pylist()
        for raw, key, score in zip(raw_lines, kept, scores, strict=True):
            item = parse_line(raw + b"\n", "dropped", id_field, text_field)
            if isinstance(item, Failure):  # it was signed, so it parsed: a bug
                raise RuntimeError(f"a signed line no longer parses: {item.reason}")
            values.append(dropped_text(item[1], key, score))
        yield pa.RecordBatch.from_arrays(
            [batch.column(0), pa.array(values, pa.string())], names=["ordinal", "value"]
        )


def read_params(out: str | os.PathLike[str]) -> StoreParams:
    """The parameters a :func:`run_dedup` output was computed with."""
    path = Path(_local_path(out), PARAMS_FILE)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InvalidParameterError(
            "out", str(out), f"the output directory of spark-dedup (no {PARAMS_FILE} in it)"
        ) from None
    except OSError as err:
        _bad_params(out, err)
    return _parsed_params(out, text)[0]


def _parsed_params(out: str | os.PathLike[str], text: str) -> tuple[StoreParams, dict[str, Any]]:
    """The parameters in a ``params.json``'s text, and the whole object it holds."""
    try:
        written = json.loads(text)
        return params_from_dict(written), written
    except (ValueError, KeyError, TypeError, AttributeError) as err:  # cut short, or another
        _bad_params(out, err)


def _bad_params(out: str | os.PathLike[str], err: Exception) -> NoReturn:
    raise InvalidParameterError(
        "out",
        str(out),
        f"the output directory of spark-dedup (its {PARAMS_FILE} does not "
        f"read as one: {type(err).__name__}: {err})",
    ) from None


def load_target(path: str | os.PathLike[str]) -> Path:
    """Where a bulk load puts its store: ``path`` as an absolute path, checked to be a
    new or empty directory before any work; an existing one (``.``, or a symbolic link
    to one) resolved, so that the store is built on its file system, beside it.

    Raises:
        InvalidParameterError: ``path`` is not a path, or not a new or empty directory.
    """
    target = path_of(path)
    _check_empty("path", target)
    return target.resolve() if target.exists() else Path(os.path.abspath(target))


_NO_HARD_LINKS = frozenset(
    {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.EXDEV}
)
"""What ``os.link`` fails with where a file system has no hard links (vfat, exFAT, some
FUSE mounts), or none to this directory (``EXDEV``: ``target`` is a mount point)."""

_CHANGED = frozenset({errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.ENOENT})
"""What a move fails with when ``target`` changed under it: a name taken, a directory
filled, replaced by a file, or removed."""


def _move_into(building: Path, target: Path) -> None:
    """Put the finished store at ``target``: renamed there if nothing is there; else its
    files are moved into the empty directory, which stays (it can be the current one,
    where a rename over it would fail), ``data.mdb`` last, so it is a store only once
    whole. A move never replaces a file: what was put at ``target`` while the load ran
    (another store made and written meanwhile, or any other file) is refused, not
    overwritten, and a failure takes the moved files back out.

    Raises:
        InvalidParameterError: ``target`` is no longer a new or empty directory, or
            cannot be written.
    """
    try:
        held = os.listdir(target)  # looked at again now: the load took its time
    except FileNotFoundError:
        held = None
    except OSError as err:
        raise _refused(target, err) from None
    if held:
        raise _refused(target)
    if held is None:
        try:
            building.rename(target)  # over a directory made meanwhile only if it is empty
        except OSError as err:
            raise _refused(target, err) from None
        return
    moved: list[str] = []
    try:
        for name in sorted(os.listdir(building), key=lambda name: name == "data.mdb"):
            try:
                _place(building / name, target / name)
            except OSError as err:
                raise _refused(target, err) from None
            moved.append(name)
    except BaseException:
        for name in moved:
            with contextlib.suppress(OSError):
                os.unlink(target / name)
        raise
    shutil.rmtree(building)


def _place(source: Path, destination: Path) -> None:
    """Give ``source`` the name ``destination``, which must be free (``EEXIST`` if it is
    not): a hard link, or where the file system has none, the name taken first as an
    empty file of this process's (``O_EXCL``), then ``source`` moved (or, across file
    systems, copied) onto it."""
    try:
        os.link(source, destination)
        return
    except OSError as err:
        if err.errno not in _NO_HARD_LINKS:
            raise
    os.close(os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        try:
            os.replace(source, destination)
        except OSError as err:
            if err.errno != errno.EXDEV:
                raise
            shutil.copyfile(source, destination)
            shutil.copymode(source, destination)
            with open(destination, "rb+") as copied:  # the store was synced before the move
                os.fsync(copied.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(destination)
        raise


def _refused(target: Path, err: OSError | None = None) -> InvalidParameterError:
    """Why the loaded store cannot be moved into ``target``: it changed while the load
    ran (no ``err``, or one of :data:`_CHANGED`), or it cannot be written, said of
    ``target`` (the error's own file name is the load's temporary copy, deleted right
    after)."""
    if err is None or err.errno in _CHANGED:
        return InvalidParameterError(
            "path",
            str(target),
            "a new or empty directory until the load ends (something was put there while "
            "it ran, which is left as it is; load again into another path)",
        )
    return InvalidParameterError(
        "path",
        str(target),
        f"a directory the loaded store can be moved into ({err.strerror or err}; the "
        "load was not kept: load again once it can be written, or into another path)",
    )


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
    target = load_target(path)
    _check_params(params)
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
        _move_into(building, target)
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
    path_of(out)
    load_target(path)  # before any work
    out = _local_path(out)
    unreadable = f"spark-dedup output {str(out)!r} cannot be read"
    if "://" in str(out):  # a cluster file system: params.json was written through Spark
        with spark_failures(unreadable, OUT_ADVICE):
            text = "".join(
                row["value"] for row in spark.read.text(f"{out}/{PARAMS_FILE}").collect()
            )
        params, written = _parsed_params(out, text)
        uri, counts = str(out).rstrip("/"), [written.get(DOCUMENTS_KEY)]
    else:
        params, uri = read_params(out), pipeline.literal(_file_uri(Path(out)))
        if not (Path(out) / "signatures" / "_SUCCESS").exists():
            raise InvalidParameterError(
                "out", str(out), "a finished spark-dedup output (its signatures/ is missing"
                " or incomplete: the run stopped before writing it; run it again)"
            )  # fmt: skip
        counts = _written_counts(Path(out))
    with spark_failures(unreadable, OUT_ADVICE):
        docs = spark.read.parquet(f"{uri}/signatures")
        found = docs.count()
    _check_count(str(out), found, counts)
    return bulk_load(docs, path, params, batch_size=batch_size, progress=progress)


_FILE_SCHEME = "file://"


def _file_uri(path: Path) -> str:
    """The ``file:`` URI Hadoop reads as ``path``: not percent-encoded, as
    ``Path.as_uri`` would (Hadoop takes ``%20`` and ``%C3%A9`` literally and wrote a
    sibling directory named so, review 36)."""
    return _FILE_SCHEME + str(path.resolve())


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
