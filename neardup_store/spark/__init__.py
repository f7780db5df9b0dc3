"""Bulk deduplication on Apache Spark (optional extra ``spark``).

The same signatures, pairs and clusters as a local store, for corpora beyond one
machine: executors run the library's own MinHasher over Arrow batches, banding and
connected components run as Spark joins and aggregations, and the result can be
bulk-loaded into an LMDB store that answers queries as a locally built one would.

Example:
    >>> from neardup_store.params import resolve_params
    >>> from neardup_store import spark as nds
    >>> session = nds.spark_session("local[*]")  # doctest: +SKIP
    >>> params = resolve_params(0.8, 128, None, None, None, None, None)
    >>> report = nds.run_dedup(session, ["corpus.jsonl"], "out/", params)  # doctest: +SKIP
    >>> nds.load_output(session, "out/", "corpus.ndx")  # doctest: +SKIP

Importing this module needs no pyspark; the functions that run Spark check for it and
for Java and raise :class:`~neardup_store.errors.SparkUnavailableError` saying what is
missing.
"""

from ..errors import SparkUnavailableError
from .job import (
    DedupReport,
    LoadReport,
    bulk_load,
    load_output,
    params_from_dict,
    params_to_dict,
    read_params,
    run_dedup,
)
from .pipeline import (
    DEFAULT_MAX_BUCKET,
    Candidates,
    Components,
    candidate_pairs,
    components,
    documents,
    failures,
    read_jsonl,
    sign,
    sign_jsonl,
    verified_pairs,
    verify,
)
from .runtime import (
    MIN_JAVA,
    JavaRuntime,
    find_java,
    require_pyspark,
    ship_package,
    spark_java_home,
    spark_session,
)

__all__ = [
    "DEFAULT_MAX_BUCKET",
    "MIN_JAVA",
    "Candidates",
    "Components",
    "DedupReport",
    "JavaRuntime",
    "LoadReport",
    "SparkUnavailableError",
    "bulk_load",
    "candidate_pairs",
    "components",
    "documents",
    "failures",
    "find_java",
    "load_output",
    "params_from_dict",
    "params_to_dict",
    "read_jsonl",
    "read_params",
    "require_pyspark",
    "run_dedup",
    "ship_package",
    "sign",
    "sign_jsonl",
    "spark_java_home",
    "spark_session",
    "verified_pairs",
    "verify",
]
