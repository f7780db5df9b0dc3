"""Signatures, verified near-duplicate pairs and clusters of a corpus, computed on Spark.

Every document gets an ``ordinal``: its position in the input. For JSON lines
(:func:`read_jsonl`) that is the order the local tools read: the paths as given, each
directory's files by name, each file's lines in order; for a DataFrame (:func:`sign`),
its partition-major row order unless it brings an ``ordinal`` column. Ordinals are
the node ids of the pair graph, so the "first" of a pair and the representative of a
cluster are the earliest documents, as in a store fed the same input in order.

Stages:

1. **Signatures** (:func:`sign`, :func:`sign_jsonl`): Arrow batches go to the Python
   workers (``mapInArrow``), where the library's own :class:`~neardup_store.MinHasher`
   and :func:`~neardup_store.band_keys` compute signatures (uint32 little-endian bytes,
   as a store records them) and band keys. JSON lines are parsed by the same function
   ``neardup-admin add --jsonl`` uses, so the same lines fail for the same reasons.
2. **Pairs** (:func:`verified_pairs`): one row per (band, band key, document); buckets of
   two or more make candidate pairs. A bucket of at most ``max_bucket`` documents gives
   all its pairs, as the store's band tables do. A larger bucket (shared boilerplate) pairs
   each member with the bucket's earliest document only, so it costs linear, not
   quadratic, work; its members then join a cluster through that document. Candidates
   are verified like the store verifies them: the share of equal signature values must
   reach the threshold.
3. **Clusters** (:func:`components`): connected components by alternating large-star and
   small-star rounds (Kiveris et al., "Connected Components in MapReduce and Beyond",
   2014) until the graph is a forest of stars whose centres are the components' earliest
   documents, the representatives.
4. **Kept and dropped** (:func:`dropped_in_order`): what ``neardup-admin dedup`` keeps,
   fed the same input in order: a document unless a near-duplicate of it was kept
   before it. That is not one document per cluster: on a chain A~B~C whose ends are not
   near-duplicates, A is kept, B dropped as A's duplicate, and C kept (its only
   near-duplicate, B, was not kept). Only pairs inside a cluster can decide, so each
   cluster is one group, walked in input order by one Python call over its pairs.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

import numpy as np
import numpy.typing as npt

from ..errors import InvalidParameterError
from ..lsh import LSHParams, band_keys
from ..minhash import MinHashConfig, MinHasher
from ..params import StoreParams
from .runtime import spark_failures

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

SIGNED_SCHEMA = (
    "ordinal long, id string, signature binary, band_keys array<long>, metadata binary, "
    "error string"
)
"""What the signing stage yields: a document with ``error`` null, or a failed input
(``ordinal`` and ``error`` set, the rest null)."""
PAIR_SCHEMA = "first long, second long, score double"
DROPPED_SCHEMA = "ordinal long, duplicate_of long, score double"
"""What :func:`dropped_in_order` yields: a dropped document, the kept one it duplicates
and their score."""
DEFAULT_MAX_BUCKET = 200
"""Buckets up to this size give all their pairs (at most 19,900 each); larger ones are
paired star-wise through their earliest document."""
MAX_ROUNDS = 64


# -- stage 1: signatures on the executors ------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _hasher(config: MinHashConfig) -> MinHasher:
    """One hasher per worker process and configuration (its keys are derived once)."""
    return MinHasher(config)


def _binary_column(rows: npt.NDArray[np.uint32]) -> pa.Array:
    """Each row of a uint32 matrix as one little-endian binary value, without a copy per row."""
    import pyarrow as pa

    data = np.ascontiguousarray(rows, dtype="<u4")
    width = data.shape[1] * 4
    offsets = np.arange(0, (len(data) + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(
        pa.binary(), len(data), [None, pa.py_buffer(offsets), pa.py_buffer(data.tobytes())]
    )


def _matrix(column: pa.Array, num_perm: int) -> npt.NDArray[np.uint32]:
    """Binary signatures (all ``4 * num_perm`` bytes) back to an ``(n, num_perm)`` matrix.

    A ``large_binary`` column (Spark's ``arrow.useLargeVarTypes``) has 64-bit offsets:
    it is cast to ``binary`` first, whose 32-bit offsets are read below.
    """
    import pyarrow as pa

    if column.type != pa.binary():
        column = column.cast(pa.binary())
    if column.null_count:
        raise InvalidParameterError("signature", "null", "a signature for every document")
    offsets = np.frombuffer(column.buffers()[1], np.int32)[column.offset :][: len(column) + 1]
    width = 4 * num_perm
    if len(column) and not np.array_equal(np.diff(offsets), np.full(len(column), width)):
        raise InvalidParameterError(
            "signature", "values of another length", f"{width} bytes ({num_perm} uint32 values)"
        )
    start = int(offsets[0]) if len(column) else 0
    return np.frombuffer(
        column.buffers()[2], dtype="<u4", count=len(column) * num_perm, offset=start
    ).reshape(len(column), num_perm)


def _sign_batches(
    batches: Iterator[pa.RecordBatch],
    config: MinHashConfig,
    banding: LSHParams,
    jsonl: bool,
    id_field: str,
    text_field: str,
) -> Iterator[pa.RecordBatch]:
    """Executor side of the signing stage: validate, sign and band one Arrow batch at a time."""
    import pyarrow as pa

    from .. import codec
    from ..ingest import Failure, Record, parse_line, sign_records

    hasher = _hasher(config)
    for batch in batches:
        ordinals = batch.column(0).to_pylist()
        records: list[Record] = []
        failed: list[tuple[int, str]] = []
        if jsonl:
            # As bytes: a line that is not UTF-8 fails alone, as in `add --jsonl`, where
            # decoding it as a string column failed the whole job.
            raw_lines = batch.column(1).cast(pa.binary()).to_pylist()
            for ordinal, line in zip(ordinals, raw_lines, strict=True):
                if line is None or not line.strip():
                    continue  # blank lines are no documents, as in `add --jsonl`
                # The reader strips line ends: restore one so errors match `add --jsonl`.
                item = parse_line(line + b"\n", str(ordinal), id_field, text_field)
                if isinstance(item, Failure):
                    failed.append((ordinal, item.reason))
                else:
                    record = item[0]
                    records.append(Record(record.key, record.text, record.metadata, str(ordinal)))
        else:
            keys, texts = batch.column(1).to_pylist(), batch.column(2).to_pylist()
            records = [
                Record(key, text, None, str(ordinal))
                for ordinal, key, text in zip(ordinals, keys, texts, strict=True)
            ]
        signed, failures = sign_records(hasher, records)
        failed.extend((int(f.source), f.reason) for f in failures)
        n = len(signed)
        sigs = (
            np.stack([s.signature for s in signed])
            if n
            else np.empty((0, config.num_perm), np.uint32)
        )
        keys64 = band_keys(sigs, banding, config.seed).view(np.int64) if n else None
        band_offsets = np.arange(0, (n + 1) * banding.bands, banding.bands, dtype=np.int32)
        band_values = pa.array(keys64.reshape(-1), pa.int64()) if n else pa.array([], pa.int64())
        good = pa.RecordBatch.from_arrays(
            [
                pa.array([int(s.record.source) for s in signed], pa.int64()),
                pa.array([s.record.key for s in signed], pa.string()),
                _binary_column(sigs),
                pa.ListArray.from_arrays(pa.array(band_offsets), band_values),
                pa.array([codec.pack_metadata(s.record.metadata) for s in signed], pa.binary()),
                pa.nulls(n, pa.string()),
            ],
            names=["ordinal", "id", "signature", "band_keys", "metadata", "error"],
        )
        yield good
        if failed:
            m = len(failed)
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array([o for o, _ in failed], pa.int64()),
                    pa.nulls(m, pa.string()),
                    pa.nulls(m, pa.binary()),
                    pa.nulls(m, pa.list_(pa.int64())),
                    pa.nulls(m, pa.binary()),
                    pa.array([reason for _, reason in failed], pa.string()),
                ],
                names=["ordinal", "id", "signature", "band_keys", "metadata", "error"],
            )


def with_ordinals(frame: DataFrame) -> DataFrame:
    """Add ``ordinal`` (input position, partition-major) unless the frame has one."""
    from pyspark.sql import functions as sf

    if "ordinal" in frame.columns:
        return frame
    return frame.withColumn("ordinal", sf.monotonically_increasing_id())


def sign(
    frame: DataFrame, params: StoreParams, id_col: str = "id", text_col: str = "text"
) -> DataFrame:
    """Signatures and band keys of a DataFrame of documents (see :data:`SIGNED_SCHEMA`).

    Args:
        frame: one row per document; ``id_col`` (cast to string: store keys are strings)
            and ``text_col``; an ``ordinal`` column is added if missing.
        params: the configuration and banding (as a store created with them would use).
    """
    from pyspark.sql import functions as sf

    frame = with_ordinals(frame).select(
        sf.col("ordinal").cast("long"),
        sf.col(id_col).cast("string").alias("id"),
        sf.col(text_col).cast("string").alias("text"),
    )
    return _run_signing(frame, params, jsonl=False, id_field="id", text_field="text")


def sign_jsonl(
    lines: DataFrame, params: StoreParams, id_field: str = "id", text_field: str = "text"
) -> DataFrame:
    """Like :func:`sign` for raw JSON lines (a frame of ``ordinal``, ``line``), parsed on
    the executors exactly as ``neardup-admin add --jsonl`` parses them: the key from
    ``id_field``, the text from ``text_field``, every other field kept as metadata."""
    return _run_signing(
        lines.select("ordinal", "line"), params, jsonl=True, id_field=id_field,
        text_field=text_field,
    )  # fmt: skip


LINE_BITS = 40
"""An input line's ordinal is its file's rank times 2**40 plus its index in the file."""


def read_jsonl(spark: Any, paths: list[str]) -> DataFrame:
    """The lines of JSON-lines files as ``(ordinal, line, file, line_number)``, ordinals
    in the order the local tools read them: the paths as given, each directory's files
    by name (subdirectories included), each file's lines in order.

    Raises:
        InvalidParameterError: an input is missing, or holds a file Spark would skip or
            cannot read (see :func:`list_inputs`).
    """
    return read_listed(spark, list_inputs(spark, paths))


def read_listed(spark: Any, listed: list[list[str]]) -> DataFrame:
    """:func:`read_jsonl` of the files :func:`list_inputs` found.

    Spark packs the files it reads into partitions by size, so its own row order is not
    the input order once there are several files. Within a partition a file's rows are
    contiguous and in order, and the splits of one file keep their order, so counting
    each file's rows per partition (a small table, collected) gives every row its line
    number, and the files' ranks give the ordinal. That count is a scan of its own: the
    same files split the same way give the same partitions and positions, and the text
    is cached once, by the caller, instead of here as well (where nothing would release it).
    """
    from pyspark.sql import functions as sf

    # Spark checks the paths as it builds the frames: a file gone since the listing is
    # a refusal of the file system, not a traceback.
    with spark_failures("the inputs cannot be read", INPUT_ADVICE):
        frames = [
            _read_lines(spark, files).withColumn("argument", sf.lit(index))
            for index, files in enumerate(listed)
        ]
    lines = functools.reduce(lambda a, b: a.unionByName(b), frames)
    lines = lines.withColumn("part", sf.spark_partition_id()).withColumn(
        "position", sf.monotonically_increasing_id()
    )
    with spark_failures("the inputs cannot be read", INPUT_ADVICE):  # the first read of them
        chunks = (
            lines.groupBy("argument", "file", "part")
            .agg(sf.min("position").alias("first"), sf.count("*").alias("rows"))
            .collect()
        )
        marked = _bom_files(spark, {row["file"] for row in chunks})
    bases = spark.createDataFrame(
        [(*base, base[1] in marked) for base in _chunk_bases(chunks)],
        "argument int, file string, part int, base long, bom boolean",
    )
    ordinal = sf.col("base") + sf.col("position")
    index = ordinal % (1 << LINE_BITS)
    # Hadoop's line reader drops a byte-order mark at the start of a file, which add
    # and dedup read as part of the first line: it goes back there.
    line = sf.when(sf.col("bom") & (index == 0), sf.concat(sf.lit(_BOM), "line"))
    return lines.join(sf.broadcast(bases), ["argument", "file", "part"]).select(
        ordinal.alias("ordinal"),
        line.otherwise(sf.col("line")).alias("line"),
        "file",
        (index + 1).alias("line_number"),
    )


_BOM = "\ufeff"
_BOM_BYTES = _BOM.encode("utf-8")


def _bom_files(spark: Any, files: set[str]) -> set[str]:
    """The files (URIs, as Spark names them) that start with a UTF-8 byte-order mark:
    their first 3 bytes, read here (a local file) or through its Hadoop file system."""
    marked = set()
    for uri in files:
        if uri.startswith("file:"):
            try:
                with open(unquote(urlparse(uri).path), "rb") as stream:
                    start = stream.read(len(_BOM_BYTES))
            except OSError:  # gone since the read: as if it held no mark
                continue
        else:
            jvm = spark.sparkContext._jvm
            path = jvm.org.apache.hadoop.fs.Path(jvm.java.net.URI(uri))
            system = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
            stream = system.open(path)
            try:
                start = bytes(stream.read() & 0xFF for _ in _BOM_BYTES)  # -1 at the end
            finally:
                stream.close()
        if start == _BOM_BYTES:
            marked.add(uri)
    return marked


def local_path(path: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """A ``file:`` URI as the local path it names (anything else as given)."""
    text = str(path)
    if text.startswith("file:"):
        return unquote(urlparse(text).path)
    return path


def list_inputs(spark: Any, paths: list[str]) -> list[list[str]]:
    """The files each input argument names, each named exactly (no glob), in order.

    A directory is listed whole, as ``neardup-admin add`` walks it (every file,
    subdirectories included), which Spark's file index would not: a local one (a path
    or a ``file:`` URI) here, another URI (``hdfs:///corpus/``) through its Hadoop file
    system, where a URI may also be a glob (``hdfs:///corpus/*.jsonl``).

    Raises:
        InvalidParameterError: an input does not exist; or a file's name is one Spark's
            file sources skip without a word, even named one by one (starting with
            ``_`` or ``.``, ending in ``._COPYING_``), one Spark would decompress by
            its name (``.gz``, ...: the local tools read its bytes), or holds a ``:``,
            which Hadoop cannot read in a file name.
    """
    listed = []
    for path in map(str, paths):
        path = str(local_path(path))
        _refuse_kind([path], "name")  # before py4j, which cannot send such a name
        # Local paths are made absolute: a relative "a:b" would read as a URI.
        listed.append(_hadoop_files(spark, path) if "://" in path else _local_files(path))
    _refuse_unreadable([f for files in listed for f in files])
    return listed


_JOB_ADVICE = "move it out of the directory, or run add or dedup, which report it and go on"


def _local_files(path: str) -> list[str]:
    """The files a local input argument names: itself, or a directory's walk.

    Raises:
        InvalidParameterError: nothing is there; it cannot be looked at or read; or it
            is no regular file (a named pipe, or ``/dev/fd/63`` from ``<(...)``). Spark
            opens its inputs by path in its own processes, where a pipe reads as empty
            and ``/dev/fd/N`` is another file, so a stream cannot be read this way.
    """
    from ..ingest import _special_kind, path_text

    named = Path(path).absolute()
    try:
        mode = os.stat(named).st_mode
    except FileNotFoundError:
        raise InvalidParameterError("input", path, "an existing file or directory") from None
    except OSError as err:
        raise InvalidParameterError(
            "input", path_text(path), f"a file or directory that can be read (cannot read it: "
            f"{err.strerror or err})"
        ) from None  # fmt: skip
    if stat.S_ISDIR(mode):
        return [f for f in _walked(named) if not _hadoop_bookkeeping(_name(f))]
    if not stat.S_ISREG(mode):
        raise InvalidParameterError(
            "input",
            path_text(path),
            f"a regular file, which it is not ({_special_kind(named)}): Spark reads each "
            "input by its path in processes of its own, where a stream is empty or another "
            "file; write the stream to a file first and name that, or read it with add or dedup",
        )
    if not os.access(named, os.R_OK):
        raise InvalidParameterError(
            "input", path_text(path), "a file that can be read (cannot read it: permission denied)"
        )
    return [str(named)]


def _walked(directory: Path) -> list[str]:
    """The files of a local directory, as ``neardup-admin add`` walks it.

    Raises:
        InvalidParameterError: a directory in it cannot be listed, or an entry is no
            regular file (a named pipe would hang the job's read, as it hung ``add``),
            or cannot be read (a broken symbolic link, a loop of them, no permission):
            ``add`` and ``dedup`` report such an input and go on, but the job reads
            its whole listing at once, so it refuses before it starts.
    """
    from ..ingest import Failure, unreadable, walk_inputs

    files = []
    for entry in walk_inputs(directory, ("*",)):
        if isinstance(entry, Path):
            try:
                os.stat(entry)  # walk_inputs keeps a broken link, whose open reports it
                if not os.access(entry, os.R_OK):
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
            except OSError as err:
                entry = unreadable(str(entry), err)
        if isinstance(entry, Failure):
            raise InvalidParameterError(
                "input",
                entry.source,
                f"a file the job can read, which it is not ({entry.reason}); {_JOB_ADVICE}",
            )
        files.append(str(entry))
    return files


def _hadoop_files(spark: Any, uri: str) -> list[str]:
    """The files a URI (file, directory or glob) names on its Hadoop file system, the
    directories' listed recursively.

    Raises:
        InvalidParameterError: nothing is at the URI.
        SparkJobError: its file system cannot be reached or refuses the listing (an
            incomplete URI, an unknown host, no connector for its scheme, no permission).
    """
    jvm = spark.sparkContext._jvm
    files = []
    with spark_failures(f"input {uri!r} cannot be read", INPUT_ADVICE):
        path = jvm.org.apache.hadoop.fs.Path(uri)
        system = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        found = system.globStatus(path)
        if not found:
            raise InvalidParameterError("input", uri, "an existing file or directory")
        for status in found:
            if status.isDirectory():
                listing = system.listFiles(status.getPath(), True)
                while listing.hasNext():
                    file = str(listing.next().getPath().toString())
                    if not _hadoop_bookkeeping(_name(file)):
                        files.append(file)
            else:
                files.append(str(status.getPath().toString()))
    return sorted(files)


INPUT_ADVICE = (
    "check the URI (hdfs://HOST:PORT/path names a cluster's file system) and that its file "
    "system can be reached from here with this Spark (a scheme such as s3a: needs its "
    "connector, e.g. hadoop-aws, on Spark's class path)"
)


_SCHEME_AND_AUTHORITY = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:(//[^/]*)?")


def _uri_path(path: str) -> str:
    """The path part of a Hadoop path string (``hdfs://nn/a?b`` -> ``/a?b``): Hadoop does
    not percent-encode its paths, so ``?`` and ``#`` belong to the name."""
    return _SCHEME_AND_AUTHORITY.sub("", path) if ":" in path.split("/", 1)[0] else path


def _name(path: str) -> str:
    return PurePosixPath(_uri_path(path)).name


def _spark_skips(name: str) -> bool:
    """Whether Spark's file index leaves out a file of this name, even one named alone
    (``HadoopFSUtils.shouldFilterOutPathName``, a little wider: all ``_`` names)."""
    return name[:1] in ("_", ".") or name.endswith("._COPYING_")


_HADOOP_CODEC_SUFFIXES = (".gz", ".bz2", ".deflate", ".lz4", ".snappy", ".zst")
"""The name suffixes of Hadoop's compression codecs, by which its text reader decompresses
a file: read so, the input would not be the bytes the local tools read."""


_UNREADABLE: tuple[tuple[str, str, str], ...] = (
    ("name", "whose names are not UTF-8 (Hadoop cannot name them", "rename them"),
    ("skipped", "whose names start with '_' or '.' or end in '._COPYING_' (Spark skips them",
     "rename them"),
    ("compressed", "named as compressed (Spark decompresses a file by its name, where add and "
     "dedup read its bytes", "decompress or rename them"),
    ("colon", "with a ':' in their path (Hadoop cannot read them", "rename them"),
)  # fmt: skip
"""What :func:`_unreadable` names, why such files cannot be read as the local tools do,
and what to do about them."""


def _unreadable(path: str) -> str | None:
    """Why Spark would not read the file at ``path`` as the local tools do, if it would not."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # a name that is not UTF-8 (surrogate escapes)
        return "name"
    name = _name(path)
    if _spark_skips(name):
        return "skipped"
    if name.endswith(_HADOOP_CODEC_SUFFIXES):
        return "compressed"
    return "colon" if ":" in _uri_path(path) else None


def _refuse_unreadable(files: list[str]) -> None:
    for kind, _, _ in _UNREADABLE:
        _refuse_kind(files, kind)


def _refuse_kind(files: list[str], kind: str) -> None:
    """Refuse ``files`` if any is of this :data:`_UNREADABLE` kind."""
    from ..ingest import path_text

    found = [path_text(f) for f in files if _unreadable(f) == kind]
    if found:
        why, fix = next((why, fix) for name, why, fix in _UNREADABLE if name == kind)
        raise InvalidParameterError(
            "inputs",
            found[:3],
            f"no files {why}; {len(found)} found): {fix}, or run add or dedup on them",
        )


def _hadoop_bookkeeping(name: str) -> bool:
    """Files Spark and Hadoop write beside their output (``_SUCCESS``, ``.*.crc``): no
    input, left out of a directory as Spark leaves them out (spark-dedup's own ``kept/``
    is such a directory)."""
    return name == "_SUCCESS" or (name.startswith(".") and name.endswith(".crc"))


_GLOB_CHARACTERS = re.compile(r"([\\{}\[\]*?])")


def literal(path: str) -> str:
    """``path`` with Hadoop's glob characters escaped, so it names just that file (Spark
    expands a path holding any of them as a glob: ``part?.jsonl`` read ``parta.jsonl``)."""
    return _GLOB_CHARACTERS.sub(r"\\\1", path)


def _read_lines(spark: Any, files: list[str]) -> DataFrame:
    """``(line, file)`` rows of ``files``, cut at newlines only (Spark's text source also
    cuts at a bare CR, which JSON allows inside a line and ``add`` does not cut at)."""
    from pyspark.sql import functions as sf

    if not files:  # an empty directory: no lines, as add reads none
        return spark.createDataFrame([], "line string, file string")
    return (
        spark.read.option("lineSep", "\n")
        .text([literal(f) for f in files])
        .withColumnRenamed("value", "line")
        .withColumn("file", sf.input_file_name())
    )


def _file_order(entry: tuple[int, str]) -> tuple[int, tuple[str, ...]]:
    """Argument, then path components: the order ``neardup-admin add`` walks a directory
    in (sorted paths, so ``a/b`` before ``a-c``)."""
    argument, uri = entry
    return argument, PurePosixPath(unquote(urlparse(uri).path)).parts


def _chunk_bases(chunks: list[Any]) -> list[tuple[int, str, int, int]]:
    """For each (argument, file, partition) chunk: what to add to a row's position to
    get its ordinal (file rank * 2**40 + the row's index in its file). A file named by
    two arguments is two inputs, each numbered from its first line, as ``add`` reads it."""
    files = sorted({(row["argument"], row["file"]) for row in chunks}, key=_file_order)
    rank = {entry: i for i, entry in enumerate(files)}
    if len(files) >= 1 << (63 - LINE_BITS):
        raise InvalidParameterError(
            "inputs", f"{len(files)} files", f"fewer than 2**{63 - LINE_BITS}"
        )
    bases, seen = [], dict.fromkeys(rank, 0)
    for row in sorted(chunks, key=lambda r: (rank[r["argument"], r["file"]], r["part"])):
        entry = (row["argument"], row["file"])
        start = (rank[entry] << LINE_BITS) + seen[entry]
        bases.append((row["argument"], row["file"], row["part"], start - row["first"]))
        seen[entry] += row["rows"]
    return bases


def _run_signing(
    frame: DataFrame, params: StoreParams, jsonl: bool, id_field: str, text_field: str
) -> DataFrame:
    config, banding = params.config, params.banding
    banding.check_fits(config.num_perm)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _sign_batches(batches, config, banding, jsonl, id_field, text_field)

    return frame.mapInArrow(run, SIGNED_SCHEMA)


def documents(signed: DataFrame) -> DataFrame:
    """The signed documents of a signing stage's output (failed inputs removed)."""
    return signed.filter(signed.error.isNull()).drop("error")


def failures(signed: DataFrame, lines: DataFrame | None = None) -> DataFrame:
    """The failed inputs of a signing stage's output: ``ordinal`` and ``error``, and
    ``file`` and ``line_number`` when the ``lines`` of :func:`read_jsonl` are given."""
    failed = signed.filter(signed.error.isNotNull()).select("ordinal", "error")
    if lines is None:
        return failed
    return failed.join(lines.select("ordinal", "file", "line_number"), "ordinal", "left")


# -- stage 2: candidate pairs, verified ----------------------------------------------------------


@dataclass(frozen=True)
class Candidates:
    """Candidate pairs ``(first, second)`` of ordinals (``first < second``), and how many
    buckets were too large for all their pairs (paired through their earliest member)."""

    pairs: DataFrame
    large_buckets: DataFrame


def check_max_bucket(max_bucket: object) -> None:
    """Refuse a ``max_bucket`` that is not an integer >= 2."""
    if isinstance(max_bucket, bool) or not isinstance(max_bucket, int) or max_bucket < 2:
        raise InvalidParameterError("max_bucket", max_bucket, "an integer >= 2")


def candidate_pairs(docs: DataFrame, max_bucket: int = DEFAULT_MAX_BUCKET) -> Candidates:
    """Candidate pairs from shared band keys: all pairs in a bucket of at most
    ``max_bucket`` documents, and member-to-earliest pairs in larger buckets.

    A bucket is named by the bits of the band key a store of the current format keeps
    (:meth:`~neardup_store.codec.BandLayout.kept`), not the whole key: keys that differ
    only in the bits it drops share a store's bucket, so they are candidates here too,
    and the pairs are the store's.
    """
    from pyspark.sql import functions as sf

    from .. import codec

    check_max_bucket(max_bucket)
    shift = int(codec.band_layout(codec.FORMAT_VERSION).kept_shift)
    entries = docs.select("ordinal", sf.posexplode("band_keys").alias("band", "key"))
    entries = entries.withColumn("key", sf.shiftrightunsigned("key", shift))
    buckets = (
        entries.groupBy("band", "key")
        .agg(sf.count(sf.lit(1)).alias("size"), sf.min("ordinal").alias("head"))
        .filter(sf.col("size") >= 2)
    )
    members = entries.join(buckets, ["band", "key"])
    small = members.filter(sf.col("size") <= max_bucket).select("band", "key", "ordinal")
    left = small.withColumnRenamed("ordinal", "first")
    right = small.withColumnRenamed("ordinal", "second")
    all_pairs = left.join(right, ["band", "key"]).filter(sf.col("first") < sf.col("second"))
    stars = members.filter(
        (sf.col("size") > max_bucket) & (sf.col("ordinal") != sf.col("head"))
    ).select(sf.col("head").alias("first"), sf.col("ordinal").alias("second"))
    pairs = all_pairs.select("first", "second").unionByName(stars).distinct()
    large = buckets.filter(sf.col("size") > max_bucket).select("band", "key", "size", "head")
    return Candidates(pairs, large)


def _score_batches(batches: Iterator[pa.RecordBatch], num_perm: int) -> Iterator[pa.RecordBatch]:
    """Executor side of verification: the share of equal values, computed as the store does."""
    import pyarrow as pa

    for batch in batches:
        a = _matrix(batch.column(2), num_perm)
        b = _matrix(batch.column(3), num_perm)
        scores = (a == b).mean(axis=1) if len(a) else np.empty(0)
        yield pa.RecordBatch.from_arrays(
            [batch.column(0), batch.column(1), pa.array(scores, pa.float64())],
            names=["first", "second", "score"],
        )


def verify(candidates: DataFrame, docs: DataFrame, num_perm: int, threshold: float) -> DataFrame:
    """Candidate pairs whose estimated Jaccard (share of equal values) is at least
    ``threshold``: ``(first, second, score)``."""
    from pyspark.sql import functions as sf

    sig_a = docs.select(sf.col("ordinal").alias("first"), sf.col("signature").alias("sig_a"))
    sig_b = docs.select(sf.col("ordinal").alias("second"), sf.col("signature").alias("sig_b"))
    joined = candidates.join(sig_a, "first").join(sig_b, "second")
    joined = joined.select("first", "second", "sig_a", "sig_b")

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _score_batches(batches, num_perm)

    return joined.mapInArrow(run, PAIR_SCHEMA).filter(sf.col("score") >= sf.lit(threshold))


def verified_pairs(
    docs: DataFrame,
    params: StoreParams,
    threshold: float | None = None,
    max_bucket: int = DEFAULT_MAX_BUCKET,
) -> DataFrame:
    """Near-duplicate pairs ``(first, second, score)`` of ordinals, each once, ``first``
    the earlier; threshold defaults to the parameters' own."""
    from ..params import valid_threshold

    limit = params.threshold if threshold is None else valid_threshold(threshold)
    found = candidate_pairs(docs, max_bucket)
    return verify(found.pairs, docs, params.config.num_perm, limit)


# -- stage 3: connected components ---------------------------------------------------------------


def _large_star(edges: DataFrame) -> DataFrame:
    """Each node links its larger neighbours to the smallest node of its neighbourhood."""
    from pyspark.sql import functions as sf

    both = edges.select(sf.col("src").alias("u"), sf.col("dst").alias("v")).unionByName(
        edges.select(sf.col("dst").alias("u"), sf.col("src").alias("v"))
    )
    smallest = both.groupBy("u").agg(sf.least(sf.col("u"), sf.min("v")).alias("m"))
    return (
        both.filter(sf.col("v") > sf.col("u"))
        .join(smallest, "u")
        .select(sf.col("v").alias("src"), sf.col("m").alias("dst"))
        .distinct()
    )


def _small_star(edges: DataFrame) -> DataFrame:
    """Each node and its smaller neighbours link to the smallest of them."""
    from pyspark.sql import functions as sf

    smallest = edges.groupBy("src").agg(sf.min("dst").alias("m"))
    joined = edges.join(smallest, "src")
    leaves = joined.filter(sf.col("dst") != sf.col("m")).select(
        sf.col("dst").alias("src"), sf.col("m").alias("dst")
    )
    centres = smallest.select("src", sf.col("m").alias("dst"))
    return leaves.unionByName(centres).distinct()


def _is_star_forest(edges: DataFrame) -> bool:
    """Every node has one edge, to a node that has none: each component is one star."""
    from pyspark.sql import functions as sf

    targets = edges.select(sf.col("dst").alias("src")).distinct()
    if not edges.join(targets, "src").isEmpty():
        return False
    return edges.groupBy("src").count().filter(sf.col("count") > 1).isEmpty()


@dataclass(frozen=True)
class Components:
    """``members``: ``(ordinal, representative)`` for every document in a cluster of two
    or more (the representative, the cluster's earliest document, included); ``rounds``:
    large-star/small-star rounds run."""

    members: DataFrame
    rounds: int


def components(pairs: DataFrame, max_rounds: int = MAX_ROUNDS) -> Components:
    """Connected components of the pair graph (``first``, ``second`` columns).

    Each round is checkpointed locally, so the query plan does not grow with the rounds.

    Raises:
        RuntimeError: no convergence in ``max_rounds`` rounds (a bug: the method
            converges in O(log² n) rounds).
    """
    from pyspark.sql import functions as sf

    edges = (
        pairs.select(
            sf.greatest("first", "second").alias("src"), sf.least("first", "second").alias("dst")
        )
        .filter(sf.col("src") != sf.col("dst"))
        .distinct()
        .localCheckpoint(eager=True)
    )
    rounds = 0
    while not _is_star_forest(edges):
        if rounds == max_rounds:
            raise RuntimeError(f"connected components did not converge in {max_rounds} rounds")
        edges = _small_star(_large_star(edges)).localCheckpoint(eager=True)
        rounds += 1
    members = edges.select(
        sf.col("src").alias("ordinal"), sf.col("dst").alias("representative")
    ).unionByName(
        edges.select(
            sf.col("dst").alias("ordinal"), sf.col("dst").alias("representative")
        ).distinct()
    )
    return Components(members, rounds)


# -- stage 4: what dedup keeps --------------------------------------------------------------------


def dropped_in_order(pairs: DataFrame, members: DataFrame) -> DataFrame:
    """The documents ``neardup-admin dedup`` drops when fed the input in order:
    ``(ordinal, duplicate_of, score)`` (see :data:`DROPPED_SCHEMA`).

    dedup keeps a document unless a document it kept earlier is its near-duplicate, and
    names the best of those kept ones: the highest score, then the earliest. A document
    in no pair is kept, and a pair links two members of one cluster, so each cluster of
    ``members`` (from :func:`components`) is decided alone: its pairs are one group, and
    one Python call walks them (:func:`drop_in_order`). The group's pairs are held in
    that worker's memory, about 150 bytes each (measured with 2M pairs in one cluster;
    the arrays are 24, the rest is the Python walk's lists and set): a boilerplate
    cluster of 100,000 members paired through its earliest one is about 15 MB.
    """
    from pyspark.sql import functions as sf

    clusters = members.select(sf.col("ordinal").alias("first"), "representative")
    grouped = pairs.select("first", "second", "score").join(clusters, "first")
    # A lambda: pyspark reads a function's type hints to choose the call form, and ours
    # name pyarrow types it cannot resolve here; without hints it passes one whole table.
    return grouped.groupBy("representative").applyInArrow(
        lambda table: _drop_group(table), DROPPED_SCHEMA
    )


def _drop_group(table: pa.Table) -> pa.Table:
    """Executor side of :func:`dropped_in_order`: one cluster's pairs in, its dropped
    members out."""
    import pyarrow as pa

    ordinal, duplicate_of, score = drop_in_order(
        table.column("first").to_numpy(),
        table.column("second").to_numpy(),
        table.column("score").to_numpy(),
    )
    return pa.table(
        {
            "ordinal": pa.array(ordinal, pa.int64()),
            "duplicate_of": pa.array(duplicate_of, pa.int64()),
            "score": pa.array(score, pa.float64()),
        }
    )


def drop_in_order(
    first: npt.NDArray[np.int64], second: npt.NDArray[np.int64], score: npt.NDArray[np.float64]
) -> tuple[list[int], list[int], list[float]]:
    """dedup's rule over near-duplicate pairs (``first < second``, ordinals in input
    order): ``(dropped, duplicate_of, score)``, in input order of the dropped.

    Members are decided in input order, each after every earlier one, so one pass over
    the pairs sorted by their later member, then best score, then earliest partner
    decides all: a member is dropped with the first of its pairs whose earlier member
    was kept (a member that is no pair's later one is kept). O(pairs log pairs).
    """
    order = np.lexsort((first, -score, second))
    dropped: set[int] = set()
    found: tuple[list[int], list[int], list[float]] = ([], [], [])
    for earlier, later, value in zip(
        first[order].tolist(), second[order].tolist(), score[order].tolist(), strict=True
    ):
        if later in dropped or earlier in dropped:  # decided already, or its partner was
            continue
        dropped.add(later)
        found[0].append(later)
        found[1].append(earlier)
        found[2].append(value)
    return found
