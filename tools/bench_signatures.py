"""Text -> MinHash signature throughput and accuracy: neardup_store against its peers.

``neardup_store.minhash`` claims that the default ``oph`` scheme is far faster than
classic k-permutation MinHash at equal accuracy. This script is the evidence, and it is
built so the comparison is fair and repeatable:

* Every method sees the same real documents in the same run on the same pinned core
  (thread pools of numpy's BLAS and of rensa's Rust pool are limited to one thread and the
  process is bound to one CPU), so no library wins by grabbing more cores, and load
  averages are recorded so a noisy machine shows.
* Peers (datasketch 2.x and rensa) get two figures: end-to-end, where they also pay for
  the Python-side normalisation and shingling that a user has to write, and hashing only,
  given precomputed shingle lists, which is the most favourable case for them. rensa is
  also fed the way a user who vectorises the shingling would feed it: numpy window
  hashes into its pre-hashed API (:func:`numpy_shingle_hashes`), at several batch sizes
  (its speed depends on them), its fastest way from text, which the signing target is
  judged against. Ours always starts from raw text:
  its normalisation and shingling are included.
* Throughput is the median of repeated passes over the whole corpus (a warm-up pass over
  one batch comes first), reported as documents and megabytes (10**6 bytes of UTF-8 input)
  per second.
* Accuracy is measured at equal ``num_perm`` on near-duplicate pairs whose exact Jaccard
  similarity spreads over roughly 0.3-1.0, because a sketch that is fast but wrong is
  not a competitor.

Run ``python tools/bench_signatures.py`` from anywhere. Unless ``--no-install`` is given
it creates ``tools/.venv-bench`` (git-ignored), installs this checkout and the peers into
it and re-executes itself there, so the peers never leak into the project's environment.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corpus import near_duplicate, real_documents

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from neardup_store import MinHasher, ShingleBatch

REPO_ROOT = Path(__file__).resolve().parent.parent
VENV_DIR = REPO_ROOT / "tools" / ".venv-bench"
REEXEC_GUARD = "NEARDUP_BENCH_REEXECUTED"
"""Set before re-executing in the venv, so a broken venv can never cause a loop."""

PEER_REQUIREMENTS = ("datasketch>=2,<3", "rensa", "redis", "scipy")
"""Peers, the Redis client for datasketch's Redis storage, and scipy for the exact join."""
SHINGLE_SIZE = 5
NUM_PERM = 128
RENSA_SEED = 42
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "RAYON_NUM_THREADS",
)
"""Thread-pool sizes of numpy's BLAS back ends and of Rust extensions (rensa uses rayon)."""

IDEAL_RMSE_SLACK = 1.5
"""A peer path counts as a full MinHash (eligible for "fastest") only if its RMSE is
within this factor of the ideal k-permutation RMSE: a sketch that is fast because it
looks at fewer tokens is not a like-for-like competitor."""


# -- set-up: one core, own environment ------------------------------------------------------


def pin_to_one_core() -> int | None:
    """Limit every thread pool to one thread and bind the process to one CPU.

    Must run before numpy (or any peer) is imported: BLAS and rayon read their thread
    counts once, at load time. Returns the CPU bound to, or ``None`` where the platform
    has no affinity call.
    """
    for name in THREAD_VARIABLES:
        os.environ[name] = "1"
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def _venv_python() -> Path:
    scripts = "Scripts" if os.name == "nt" else "bin"
    return VENV_DIR / scripts / ("python.exe" if os.name == "nt" else "python")


def _venv_ready(python: Path) -> bool:
    """True if the venv imports this checkout's neardup_store (with its compiled loops, so
    a dependency added since the venv was made is noticed) and both peers."""
    probe = (
        "import datasketch, rensa, redis, scipy, neardup_store, pathlib, sys; "
        "import neardup_store.kernels as k; k.compiled(); "
        "sys.stdout.write(str(pathlib.Path(neardup_store.__file__).resolve().parent.parent))"
    )
    # -I: the current directory must not shadow what the venv itself has installed.
    result = subprocess.run([str(python), "-I", "-c", probe], capture_output=True, text=True)
    return result.returncode == 0 and Path(result.stdout.strip()) == REPO_ROOT


def enter_bench_venv() -> str | None:
    """Re-execute in ``tools/.venv-bench``, creating and filling it first if needed.

    The peers are installed there rather than into the caller's environment so that
    benchmarking never changes what the project's tests run against. Returns a reason
    when the venv cannot be used (the run then goes on with whatever is importable),
    and does not return at all when it re-executes.
    """
    python = _venv_python()
    if Path(sys.prefix).resolve() == VENV_DIR.resolve():
        return None
    if os.environ.get(REEXEC_GUARD):
        return f"re-executed once already but not running in {VENV_DIR}"
    try:
        if not python.exists():
            print(f"creating {VENV_DIR} ...", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, "-m", "venv", str(VENV_DIR)], check=True)
        if not _venv_ready(python):
            print(
                f"installing this checkout and {', '.join(PEER_REQUIREMENTS)} into {VENV_DIR} ...",
                file=sys.stderr,
                flush=True,
            )
            subprocess.run(
                [
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "-e",
                    str(REPO_ROOT),
                    *PEER_REQUIREMENTS,
                ],
                check=True,
            )
    except (OSError, subprocess.CalledProcessError) as err:
        return f"could not prepare {VENV_DIR}: {err}"
    os.environ[REEXEC_GUARD] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    # The running script (this one, or tools/bench.py which imports it) starts again there.
    os.execv(str(python), [str(python), str(Path(sys.argv[0]).resolve()), *sys.argv[1:]])
    return None  # not reached


def checkout_state() -> str:
    """The benchmarked checkout's commit, marked ``+dirty`` if the work tree differs from it:
    figures are only comparable between runs of the same code."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", "neardup_store"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def proactive_pageout() -> list[str]:
    """The kernel's DAMON schemes that page out idle memory, if any are running.

    Such a scheme drops cached file pages that no one touched for a while, however much
    memory is free, so a store's first reads after a pause wait for the disk.
    """
    found = []
    for context in Path("/sys/kernel/mm/damon/admin/kdamonds").glob("*/contexts/*"):
        try:
            if (context.parent.parent / "state").read_text().strip() != "on":
                continue
            aggregation_us = int((context / "monitoring_attrs/intervals/aggr_us").read_text())
            for scheme in sorted(context.glob("schemes/*")):
                if (scheme / "action").read_text().strip() != "pageout":
                    continue
                age = int((scheme / "access_pattern/age/min").read_text())
                found.append(f"DAMON pageout of memory idle for {age * aggregation_us / 1e6:.0f} s")
        except (OSError, ValueError):
            continue
    return found


def machine_info(cpu: int | None) -> dict[str, Any]:
    """What the figures depend on: CPU, interpreter and library versions."""
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def version(package: str) -> str | None:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "platform": platform.platform(),
        "cpu_model": model,
        "cpu_count": os.cpu_count(),
        "pinned_cpu": cpu,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "numpy": version("numpy"),
        "neardup_store": version("neardup_store"),
        "neardup_store_checkout": checkout_state(),
        "datasketch": version("datasketch"),
        "rensa": version("rensa"),
        "thread_variables": {name: os.environ.get(name) for name in THREAD_VARIABLES},
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "proactive_pageout": proactive_pageout(),
    }


# -- methods under test ---------------------------------------------------------------------


def batches(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """Consecutive slices of ``items`` of at most ``size`` elements."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass(frozen=True)
class Method:
    """One way of turning the corpus into signatures, timed as a whole pass.

    ``run`` gets ``inputs`` (raw texts, precomputed shingle lists, ...) and processes all
    of it; ``warm_count`` items of it are processed once, untimed, before the first pass
    so that one-off costs (imports, caches, table growth) are not measured.
    """

    key: str
    system: str
    label: str
    figure: str
    inputs: Sequence[Any]
    run: Callable[[Sequence[Any]], object]
    warm_count: int
    keep_output: bool = False


@dataclass
class Timing:
    """Repeated wall-clock (and CPU) times of one method over the whole corpus."""

    key: str
    system: str
    label: str
    figure: str
    seconds: list[float]
    cpu_seconds: list[float]
    docs: int
    megabytes: float
    output: Any = field(default=None, repr=False)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def docs_per_s(self) -> float:
        return self.docs / self.median

    @property
    def mb_per_s(self) -> float:
        return self.megabytes / self.median

    @property
    def spread(self) -> float:
        """(slowest - fastest) / median: how much to trust the median."""
        return (max(self.seconds) - min(self.seconds)) / self.median

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "system": self.system,
            "label": self.label,
            "figure": self.figure,
            "seconds": self.seconds,
            "cpu_seconds": self.cpu_seconds,
            "median_seconds": self.median,
            "docs_per_s": self.docs_per_s,
            "mb_per_s": self.mb_per_s,
            "spread": self.spread,
        }


def measure(method: Method, repeats: int, docs: int, megabytes: float) -> Timing:
    """Warm up once, then time ``repeats`` full passes; the last output is kept on request."""
    method.run(method.inputs[: method.warm_count])
    seconds: list[float] = []
    cpu_seconds: list[float] = []
    output: object = None
    for _ in range(repeats):
        output = None
        gc.collect()
        cpu_start, start = time.process_time(), time.perf_counter()
        output = method.run(method.inputs)
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(time.process_time() - cpu_start)
    return Timing(
        method.key,
        method.system,
        method.label,
        method.figure,
        seconds,
        cpu_seconds,
        docs,
        megabytes,
        output if method.keep_output else None,
    )


def python_shingler() -> Callable[[str], list[str]]:
    """The peers' shingling, as a user of theirs would write it: our normalisation, then the
    distinct ``SHINGLE_SIZE``-character substrings. A text shorter than that is one
    shingle, as in neardup_store, so both sides hash the same sets."""
    from neardup_store.text import normalize

    size = SHINGLE_SIZE

    def shingles(text: str) -> list[str]:
        norm = normalize(text)
        if len(norm) < size:
            return [norm] if norm else []
        return list({norm[i : i + size] for i in range(len(norm) - size + 1)})

    return shingles


def ours_methods(
    docs: Sequence[str], hash_batches: Sequence[ShingleBatch], batch_size: int
) -> list[Method]:
    """neardup_store: batch API (intended use), one document per call, and both schemes."""
    from neardup_store import MinHashConfig, MinHasher

    oph = MinHasher(MinHashConfig(num_perm=NUM_PERM, scheme="oph"))
    kperm = MinHasher(MinHashConfig(num_perm=NUM_PERM, scheme="kperm"))

    def batched(hasher: MinHasher) -> Callable[[Sequence[Any]], object]:
        def run(texts: Sequence[Any]) -> list[npt.NDArray[np.uint32]]:
            return [hasher.signatures(chunk) for chunk in batches(texts, batch_size)]

        return run

    def one_per_call(texts: Sequence[Any]) -> list[npt.NDArray[np.uint32]]:
        return [oph.signature(text) for text in texts]

    def from_hashes(prepared: Sequence[Any]) -> list[npt.NDArray[np.uint32]]:
        return [oph.signatures_from_hashes(batch) for batch in prepared]

    raw, hashed = "raw text", "hashing only"
    return [
        Method(key="ours-oph", system="ours", label=f"oph signatures(), {batch_size} docs/call",
               figure=raw, inputs=docs, run=batched(oph), warm_count=batch_size,
               keep_output=True),
        Method(key="ours-oph-single", system="ours", label="oph signature(), 1 doc/call",
               figure=raw, inputs=docs, run=one_per_call, warm_count=batch_size,
               keep_output=True),
        Method(key="ours-kperm", system="ours", label=f"kperm signatures(), {batch_size} docs/call",
               figure=raw, inputs=docs, run=batched(kperm), warm_count=batch_size),
        Method(key="ours-oph-from-hashes", system="ours",
               label="oph signatures_from_hashes(), given our shingle hashes",
               figure=hashed, inputs=hash_batches, run=from_hashes, warm_count=1),
    ]  # fmt: skip


def datasketch_methods(
    docs: Sequence[str], byte_lists: Sequence[list[bytes]], batch_size: int
) -> list[Method]:
    """datasketch 2.x ``MinHash.bulk`` (default affine32 scheme, SHA-1 token hash)."""
    from datasketch import MinHash

    shingles = python_shingler()

    def end_to_end(texts: Sequence[Any]) -> list[Any]:
        out: list[Any] = []
        for chunk in batches(texts, batch_size):
            lists = [[s.encode("utf-8") for s in shingles(text)] for text in chunk]
            out.extend(MinHash.bulk(lists, num_perm=NUM_PERM))
        return out

    def hashing_only(lists: Sequence[Any]) -> list[Any]:
        out: list[Any] = []
        for chunk in batches(lists, batch_size):
            out.extend(MinHash.bulk(chunk, num_perm=NUM_PERM))
        return out

    label = f"MinHash.bulk, {batch_size} docs/call"
    return [
        Method(key="datasketch-bulk", system="datasketch", label=label, figure="end-to-end",
               inputs=docs, run=end_to_end, warm_count=batch_size),
        Method(key="datasketch-bulk", system="datasketch", label=label, figure="hashing only",
               inputs=byte_lists, run=hashing_only, warm_count=batch_size),
    ]  # fmt: skip


@dataclass(frozen=True)
class RensaPath:
    """One Python-facing way into rensa: what tokens it takes and how a chunk is digested."""

    key: str
    label: str
    tokens: str  # "str", "bytes" or "hashes" (rensa's own u64 token hashes, flattened)
    digest: Callable[[Sequence[Any]], list[list[int]]]


def rensa_paths() -> list[RensaPath]:
    """Every rensa 0.5 entry point that turns token sets into 128-value digests.

    Matrix results are converted with ``to_rows()`` inside the timed call: the rho path
    defers most of its work to that call, and the per-document path's ``digest()`` returns
    lists as well, so all paths are timed to the same point (digest values in hand).
    """
    from rensa import CMinHash, RMinHash

    def per_document(chunk: Sequence[Any]) -> list[list[int]]:
        out = []
        for tokens in chunk:
            sketch = RMinHash(num_perm=NUM_PERM, seed=RENSA_SEED)
            sketch.update(tokens)
            out.append(sketch.digest())
        return out

    def flat(chunk: Sequence[Any]) -> list[list[int]]:
        hashes, offsets = chunk[0]
        matrix = RMinHash.digest_matrix_from_flat_token_hashes(
            hashes, offsets, NUM_PERM, RENSA_SEED
        )
        return matrix.to_rows()

    return [
        RensaPath("rensa-update", "RMinHash.update + digest, 1 doc/call", "str", per_document),
        RensaPath(
            "rensa-digests",
            "RMinHash.digests_from_token_sets",
            "str",
            lambda chunk: RMinHash.digests_from_token_sets(chunk, NUM_PERM, RENSA_SEED),
        ),
        RensaPath(
            "rensa-matrix",
            "RMinHash.digest_matrix_from_token_sets",
            "str",
            lambda chunk: RMinHash.digest_matrix_from_token_sets(
                chunk, NUM_PERM, RENSA_SEED
            ).to_rows(),
        ),
        RensaPath(
            "rensa-matrix-bytes",
            "RMinHash.digest_matrix_from_token_byte_sets",
            "bytes",
            lambda chunk: RMinHash.digest_matrix_from_token_byte_sets(
                chunk, NUM_PERM, RENSA_SEED
            ).to_rows(),
        ),
        RensaPath(
            "rensa-flat-hashes",
            "RMinHash.digest_matrix_from_flat_token_hashes (pre-hashed u64)",
            "hashes",
            flat,
        ),
        RensaPath(
            "rensa-cminhash",
            "CMinHash.digests_from_token_sets",
            "str",
            lambda chunk: CMinHash.digests_from_token_sets(chunk, NUM_PERM, RENSA_SEED),
        ),
        RensaPath(
            "rensa-rho",
            "RMinHash.digest_matrix_from_token_sets_rho",
            "str",
            lambda chunk: RMinHash.digest_matrix_from_token_sets_rho(
                chunk, NUM_PERM, RENSA_SEED
            ).to_rows(),
        ),
    ]


def rensa_flat_hashes(
    str_lists: Sequence[list[str]],
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """rensa's own u64 hashes of token sets, as one flat buffer plus row offsets."""
    import numpy as np
    from rensa import RMinHash

    per_doc = RMinHash.hash_token_sets(str_lists)
    offsets = np.zeros(len(per_doc) + 1, dtype=np.uint64)
    np.cumsum([len(row) for row in per_doc], out=offsets[1:])
    rows = [np.asarray(row, dtype=np.uint64) for row in per_doc]
    hashes = np.concatenate(rows) if rows else np.zeros(0, dtype=np.uint64)
    return hashes, offsets


def rensa_methods(
    docs: Sequence[str],
    str_lists: Sequence[list[str]],
    byte_lists: Sequence[list[bytes]],
    flat_batches: Sequence[tuple[Any, Any]],
    batch_size: int,
) -> list[Method]:
    """Each rensa path end-to-end (Python shingling included) and given its tokens."""
    shingles = python_shingler()
    methods: list[Method] = []
    for path in rensa_paths():

        def end_to_end(texts: Sequence[Any], path: RensaPath = path) -> list[list[int]]:
            out: list[list[int]] = []
            for chunk in batches(texts, batch_size):
                lists = [shingles(text) for text in chunk]
                if path.tokens == "bytes":
                    lists = [[s.encode("utf-8") for s in tokens] for tokens in lists]
                if path.tokens == "hashes":
                    out.extend(path.digest([rensa_flat_hashes(lists)]))
                else:
                    out.extend(path.digest(lists))
            return out

        def hashing_only(prepared: Sequence[Any], path: RensaPath = path) -> list[list[int]]:
            out: list[list[int]] = []
            step = 1 if path.tokens == "hashes" else batch_size
            for chunk in batches(prepared, step):
                out.extend(path.digest(chunk))
            return out

        prepared: Sequence[Any] = {"str": str_lists, "bytes": byte_lists}.get(
            path.tokens, flat_batches
        )
        warm = 1 if path.tokens == "hashes" else batch_size
        methods += [
            Method(key=path.key, system="rensa", label=path.label, figure="end-to-end",
                   inputs=docs, run=end_to_end, warm_count=batch_size),
            Method(key=path.key, system="rensa", label=path.label, figure="hashing only",
                   inputs=prepared, run=hashing_only, warm_count=warm),
        ]  # fmt: skip
    return methods


_POLY = 0x9E3779B97F4A7C15
NUMPY_RENSA_KEY = "rensa-numpy-flat"
_MIX = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def numpy_shingle_hashes(
    texts: Sequence[str],
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """The peers' shingling vectorised with numpy, as a rensa user who wants its pre-hashed
    API would write it: our normalisation (the one both sides share), then every
    ``SHINGLE_SIZE``-character window of a document as a 64-bit hash (a polynomial of its
    code points, finished with the splitmix64 mixer), all documents of the chunk in whole
    array passes. A text shorter than the window is one shingle, as in
    :func:`python_shingler`; repeats are kept (a minimum does not change for them).
    Returns one flat hash buffer and the row offsets rensa's flat API takes."""
    import numpy as np

    from neardup_store.text import normalize

    size = SHINGLE_SIZE
    norm = [normalize(text) for text in texts]
    lengths = np.fromiter(map(len, norm), dtype=np.int64, count=len(norm))
    starts = np.zeros(len(norm) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    codes = np.frombuffer("".join(norm).encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    counts = np.where(lengths >= size, lengths - size + 1, np.minimum(lengths, 1))
    offsets = np.zeros(len(norm) + 1, dtype=np.uint64)
    np.cumsum(counts, out=offsets[1:])

    def polynomial(spans: list[npt.NDArray[np.uint64]]) -> npt.NDArray[np.uint64]:
        value = spans[0].copy()
        for column in spans[1:]:
            value *= np.uint64(_POLY)
            value += column
        value ^= value >> np.uint64(30)
        value *= np.uint64(_MIX[0])
        value ^= value >> np.uint64(27)
        value *= np.uint64(_MIX[1])
        value ^= value >> np.uint64(31)
        return value

    windows = max(len(codes) - size + 1, 0)
    with np.errstate(over="ignore"):
        hashed = polynomial([codes[j : j + windows] for j in range(size)])
        first = np.repeat(starts[:-1] - offsets[:-1].astype(np.int64), counts)
        picks = np.arange(int(offsets[-1]), dtype=np.int64) + first  # each window's start
        out = (
            hashed[np.minimum(picks, max(windows - 1, 0))]
            if windows
            else np.zeros(int(offsets[-1]), dtype=np.uint64)
        )
        for doc in np.flatnonzero((lengths > 0) & (lengths < size)).tolist():
            whole = codes[starts[doc] : starts[doc + 1]]
            out[offsets[doc]] = polynomial([whole[j : j + 1] for j in range(len(whole))])[0]
    return np.ascontiguousarray(out), offsets


def numpy_rensa_methods(docs: Sequence[str], batch_sizes: Sequence[int]) -> list[Method]:
    """rensa's fastest way from text for a user who vectorises the shingling: numpy window
    hashes (:func:`numpy_shingle_hashes`) fed to its pre-hashed flat API, once per batch
    size. The batch size matters to this path alone (about 60 MB/s at 20-100 documents a
    call, 35 at 1000, whose arrays no longer stay in the CPU cache), so the target is
    judged against its best size. Its digests are not RMinHash.update's (other token
    hashes), but its sets are the same shingles (:func:`check_numpy_shingles`), so only
    speed is compared; the keys are ``NUMPY_RENSA_KEY@size``."""
    from rensa import RMinHash

    def end_to_end_in(batch_size: int) -> Callable[[Sequence[Any]], list[list[int]]]:
        def end_to_end(texts: Sequence[Any]) -> list[list[int]]:
            out: list[list[int]] = []
            for chunk in batches(texts, batch_size):
                hashes, offsets = numpy_shingle_hashes(chunk)
                matrix = RMinHash.digest_matrix_from_flat_token_hashes(
                    hashes, offsets, NUM_PERM, RENSA_SEED
                )
                out.extend(matrix.to_rows())
            return out

        return end_to_end

    label = "numpy window hashes -> RMinHash.digest_matrix_from_flat_token_hashes"
    return [
        Method(key=f"{NUMPY_RENSA_KEY}@{size}", system="rensa",
               label=f"{label}, {size} docs/call", figure="end-to-end", inputs=docs,
               run=end_to_end_in(size), warm_count=size)
        for size in batch_sizes
    ]  # fmt: skip


def check_numpy_shingles(docs: Sequence[str], str_lists: Sequence[list[str]]) -> int:
    """Documents (of the first 200) whose numpy window hashes hold another number of
    distinct values than the Python shingling has distinct shingles: 0 means the numpy
    path hashes the same sets (no shingle lost, no collision)."""
    import numpy as np

    sample = list(docs[:200])
    hashes, offsets = numpy_shingle_hashes(sample)
    return sum(
        len(np.unique(hashes[int(offsets[i]) : int(offsets[i + 1])])) != len(str_lists[i])
        for i in range(len(sample))
    )


def hybrid_methods(
    docs: Sequence[str], hash_batches: Sequence[ShingleBatch], batch_size: int
) -> list[Method]:
    """Our vectorised shingling feeding rensa's pre-hashed kernel: shows which of our two
    stages (shingle hashing or signature) would gain from a compiled kernel."""
    from rensa import RMinHash

    from neardup_store import Shingler

    shingler = Shingler()

    def digest(batch: ShingleBatch) -> list[list[int]]:
        return RMinHash.digest_matrix_from_flat_token_hashes(
            batch.hashes, batch.offsets, NUM_PERM, RENSA_SEED
        ).to_rows()

    def end_to_end(texts: Sequence[Any]) -> list[list[int]]:
        out: list[list[int]] = []
        for chunk in batches(texts, batch_size):
            out.extend(digest(shingler.hash_batch(chunk)))
        return out

    def hashing_only(prepared: Sequence[Any]) -> list[list[int]]:
        out: list[list[int]] = []
        for batch in prepared:
            out.extend(digest(batch))
        return out

    key = "hybrid-ours-rensa"
    return [
        Method(key=key, system="hybrid", label="our Shingler.hash_batch -> rensa flat-hash kernel",
               figure="raw text", inputs=docs, run=end_to_end, warm_count=batch_size),
        Method(key=key, system="hybrid", label="rensa flat-hash kernel, given our shingle hashes",
               figure="hashing only", inputs=hash_batches, run=hashing_only, warm_count=1),
    ]  # fmt: skip


# -- accuracy -------------------------------------------------------------------------------


@dataclass
class Accuracy:
    """Error of estimated against exact Jaccard over the same pairs."""

    key: str
    label: str
    rmse: float
    bias: float
    mae: float
    max_abs: float
    empty_slots: float | None = None


def error_stats(
    key: str, label: str, estimates: Sequence[float], exact: Sequence[float]
) -> Accuracy:
    errors = [e - x for e, x in zip(estimates, exact, strict=True)]
    return Accuracy(
        key,
        label,
        rmse=math.sqrt(statistics.fmean(err * err for err in errors)),
        bias=statistics.fmean(errors),
        mae=statistics.fmean(abs(err) for err in errors),
        max_abs=max(abs(err) for err in errors),
    )


def agreement(first: Sequence[int], second: Sequence[int]) -> float:
    """Fraction of positions where two digests agree: the MinHash Jaccard estimate."""
    return sum(a == b for a, b in zip(first, second, strict=True)) / len(first)


def empty_fraction(digests: Sequence[Sequence[int]], empty: int) -> float:
    """Share of slots still holding the "no token" value. Every document here has over a
    thousand shingles, so a full 128-slot MinHash has none; a sparse sketch has many."""
    total = sum(len(row) for row in digests)
    return sum(value == empty for row in digests for value in row) / total


@dataclass
class PairSet:
    originals: list[str]
    copies: list[str]
    rates: list[float]
    exact: list[float]


def make_pairs(docs: Sequence[str], count: int, max_rate: float, seed: int) -> PairSet:
    """Near-duplicate pairs: each document and a copy with 1% to ``max_rate`` of its words
    edited, the rate drawn uniformly, so exact Jaccard covers the range LSH cares about."""
    from neardup_store import Shingler, hashed_jaccard

    rng = random.Random(seed)
    shingler = Shingler()
    originals = list(docs[:count])
    rates = [rng.uniform(0.01, max_rate) for _ in originals]
    copies = [near_duplicate(text, rate, rng) for text, rate in zip(originals, rates, strict=True)]
    exact = [
        hashed_jaccard(shingler.hash_document(a), shingler.hash_document(b))
        for a, b in zip(originals, copies, strict=True)
    ]
    return PairSet(originals, copies, rates, exact)


def ideal_rmse(exact: Sequence[float]) -> float:
    """RMSE of an ideal k-permutation MinHash: agreements are Binomial(k, J) / k."""
    return math.sqrt(statistics.fmean(j * (1 - j) / NUM_PERM for j in exact))


def measure_accuracy(pairs: PairSet, peers: dict[str, str | None]) -> list[Accuracy]:
    """RMSE and bias of every method's Jaccard estimate on the same pairs."""
    from neardup_store import MinHashConfig, MinHasher, estimate_jaccard

    results = []
    for scheme in ("oph", "kperm"):
        hasher = MinHasher(MinHashConfig(num_perm=NUM_PERM, scheme=scheme))
        first, second = hasher.signatures(pairs.originals), hasher.signatures(pairs.copies)
        estimates = [float(estimate_jaccard(a, b)) for a, b in zip(first, second, strict=True)]
        stats = error_stats(f"ours-{scheme}", f"ours {scheme}", estimates, pairs.exact)
        stats.empty_slots = empty_fraction(first.tolist(), 0xFFFFFFFF)
        results.append(stats)

    shingles = python_shingler()
    str_a = [shingles(text) for text in pairs.originals]
    str_b = [shingles(text) for text in pairs.copies]

    if peers.get("datasketch"):
        from datasketch import MinHash

        sketches_a = MinHash.bulk([[s.encode() for s in t] for t in str_a], num_perm=NUM_PERM)
        sketches_b = MinHash.bulk([[s.encode() for s in t] for t in str_b], num_perm=NUM_PERM)
        estimates = [a.jaccard(b) for a, b in zip(sketches_a, sketches_b, strict=True)]
        results.append(error_stats("datasketch-bulk", "datasketch", estimates, pairs.exact))

    if peers.get("rensa"):
        from rensa import RMinHash

        def sketch(tokens: list[str]) -> RMinHash:
            m = RMinHash(num_perm=NUM_PERM, seed=RENSA_SEED)
            m.update(tokens)
            return m

        estimates = [sketch(a).jaccard(sketch(b)) for a, b in zip(str_a, str_b, strict=True)]
        results.append(
            error_stats("rensa-update", "rensa RMinHash.jaccard", estimates, pairs.exact)
        )
        for path in rensa_paths():
            if path.key == "rensa-update":
                continue
            digests_a, digests_b = rensa_digests(path, str_a), rensa_digests(path, str_b)
            estimates = [agreement(a, b) for a, b in zip(digests_a, digests_b, strict=True)]
            stats = error_stats(path.key, f"rensa {path.label}", estimates, pairs.exact)
            stats.empty_slots = empty_fraction(digests_a, 0xFFFFFFFF)
            results.append(stats)
        (numpy_path,) = numpy_rensa_methods([], [1000])
        digests_a, digests_b = numpy_path.run(pairs.originals), numpy_path.run(pairs.copies)
        estimates = [agreement(a, b) for a, b in zip(digests_a, digests_b, strict=True)]
        label = f"rensa {numpy_path.label.rpartition(',')[0]}"
        stats = error_stats(NUMPY_RENSA_KEY, label, estimates, pairs.exact)
        stats.empty_slots = empty_fraction(digests_a, 0xFFFFFFFF)
        results.append(stats)
    return results


def rensa_digests(path: RensaPath, str_lists: Sequence[list[str]]) -> list[list[int]]:
    """One rensa path's digests for token lists, converting tokens as that path needs."""
    if path.tokens == "bytes":
        return path.digest([[s.encode("utf-8") for s in tokens] for tokens in str_lists])
    if path.tokens == "hashes":
        return path.digest([rensa_flat_hashes(str_lists)])
    return path.digest(str_lists)


# -- consistency checks ---------------------------------------------------------------------


def check_ours(
    timings: dict[tuple[str, str], Timing],
    hash_batches: Sequence[ShingleBatch],
    str_lists: Sequence[list[str]],
) -> dict[str, Any]:
    """Cross-checks that the API gives the same answer however it is called.

    * batched signatures equal one-document-per-call signatures (a batch must not leak
      into its neighbours' results);
    * the number of distinct shingle hashes equals the number of distinct shingle strings
      of the Python reference shingling (no hash collisions, no missing shingles).
    """
    import numpy as np

    checks: dict[str, Any] = {}
    batched = timings.get(("ours-oph", "raw text"))
    single = timings.get(("ours-oph-single", "raw text"))
    if batched and single and batched.output is not None and single.output is not None:
        a = np.concatenate(batched.output)
        b = np.stack(single.output)
        checks["batch_vs_single_rows_differing"] = int((a != b).any(axis=1).sum())
    counts_differ = 0
    doc = 0
    for batch in hash_batches:
        for index in range(len(batch)):
            if len(np.unique(batch.document(index))) != len(str_lists[doc]):
                counts_differ += 1
            doc += 1
    checks["distinct_shingle_count_mismatches"] = counts_differ
    return checks


def check_rensa_paths(str_lists: Sequence[list[str]]) -> dict[str, bool]:
    """Whether each rensa path's digests equal RMinHash.update's on the same tokens (if so,
    their accuracy is the same sketch's and only their speed differs)."""
    paths = rensa_paths()
    sample = list(str_lists[:50])
    reference = rensa_digests(paths[0], sample)
    return {path.key: rensa_digests(path, sample) == reference for path in paths[1:]}


# -- report ---------------------------------------------------------------------------------


def ratio(ours: Timing | None, peer: Timing | None) -> float | None:
    if ours is None or peer is None:
        return None
    return ours.mb_per_s / peer.mb_per_s


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _load(machine: dict[str, Any], when: str) -> str:
    value = machine.get(f"load_average_at_{when}")
    return "n/a" if value is None else f"{value[0]:.2f}"


def print_report(report: dict[str, Any], timings: list[Timing], accuracy: list[Accuracy]) -> None:
    machine, corpus, settings = report["machine"], report["corpus"], report["settings"]
    print()
    print(
        f"MinHash signature benchmark: char {SHINGLE_SIZE}-shingles, num_perm {NUM_PERM}, "
        f"one core (cpu {machine['pinned_cpu']})"
    )
    print(
        f"machine: {machine['platform']}; {machine['cpu_model']}; "
        f"{machine['cpu_count']} CPUs visible; load average (1 min) "
        f"{_load(machine, 'start')} at start, {_load(machine, 'end')} at end"
    )
    print(
        f"python {machine['python']}, numpy {machine['numpy']}, neardup_store "
        f"{machine['neardup_store']} (checkout {machine['neardup_store_checkout']}), "
        f"datasketch {machine['datasketch']}, rensa {machine['rensa']}"
    )
    for name, reason in report["peers_unavailable"].items():
        print(f"  {name} unavailable: {reason}")
    print(
        f"corpus: {corpus['docs']} documents, {corpus['megabytes']:.2f} MB of UTF-8 "
        f"({corpus['min_bytes']}-{corpus['max_bytes']} bytes, median {corpus['median_bytes']}), "
        f"seed {settings['seed']}; stdlib *.py + /usr/share/doc + common-licenses"
    )
    print(
        f"timing: median of {settings['repeats']} passes over the whole corpus after one "
        f"warm-up batch; {settings['batch_size']} docs per batch call; MB = 10^6 bytes of input"
    )

    print()
    print("THROUGHPUT")
    header = f"{'system':<11}{'method':<66}{'figure':<14}{'docs/s':>9}{'MB/s':>9}{'spread':>8}"
    print(header)
    print("-" * len(header))
    for t in timings:
        print(
            f"{t.system:<11}{t.label:<66}{t.figure:<14}{t.docs_per_s:>9.1f}"
            f"{t.mb_per_s:>9.2f}{100 * t.spread:>7.0f}%"
        )
    print(
        "figure: raw text = from the raw document (normalisation included); end-to-end = "
        "peer incl. Python normalise+shingle; hashing only = given precomputed tokens"
    )

    print()
    print("RATIOS: ours oph (signatures(), batch, raw text) MB/s / peer MB/s  (>1: ours faster)")
    header = f"{'peer':<78}{'end-to-end':>12}{'hashing only':>14}"
    print(header)
    print("-" * len(header))
    for row in report["ratios"]:
        print(
            f"{row['peer']:<78}{fmt_ratio(row['end_to_end']):>12}"
            f"{fmt_ratio(row['hashing_only']):>14}"
        )

    print()
    pairs = report["accuracy_pairs"]
    print(
        f"ACCURACY at num_perm {NUM_PERM}: {pairs['count']} near-duplicate pairs, "
        f"words edited {100 * pairs['min_rate']:.0f}-{100 * pairs['max_rate']:.0f}%, exact "
        f"Jaccard {pairs['exact_min']:.2f}-{pairs['exact_max']:.2f} "
        f"(median {pairs['exact_median']:.2f})"
    )
    header = f"{'method':<72}{'RMSE':>8}{'bias':>9}{'MAE':>8}{'max|err|':>10}{'empty':>8}"
    print(header)
    print("-" * len(header))
    print(
        f"{'ideal k-permutation MinHash (binomial), for reference':<72}"
        f"{pairs['ideal_rmse']:>8.4f}{0.0:>+9.4f}"
    )
    for a in accuracy:
        empty = "" if a.empty_slots is None else f"{100 * a.empty_slots:.0f}%"
        print(
            f"{a.label:<72}{a.rmse:>8.4f}{a.bias:>+9.4f}{a.mae:>8.4f}{a.max_abs:>10.4f}{empty:>8}"
        )
    print("empty = share of signature slots left at the 'no token' value (0 for a full MinHash)")

    print()
    print("CHECKS")
    for name, value in report["checks"].items():
        print(f"  {name}: {value}")
    if report.get("rensa_fastest"):
        fastest = report["rensa_fastest"]
        print(
            f"  rensa fastest full-MinHash path: end-to-end {fastest['end_to_end']}, "
            f"hashing only {fastest['hashing_only']}"
        )
    print(f"  total run time: {report['run_seconds']:.0f} s")


# -- main -----------------------------------------------------------------------------------


def positive_ints(text: str) -> list[int]:
    """``"20,50,100"`` as ``[20, 50, 100]``, for ``--peer-batch-sizes``."""
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers joined by commas") from None
    if min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every size must be at least 1")
    return sizes


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark text -> MinHash signatures: neardup_store vs datasketch, rensa."
    )
    parser.add_argument("--quick", action="store_true", help="600 docs, 3 repeats")
    parser.add_argument("--repeats", type=int, help="timed passes per method (5; quick: 3)")
    parser.add_argument("--docs", type=int, help="corpus size in documents (3000; quick: 600)")
    parser.add_argument("--batch-size", type=int, default=1000, help="docs per batch call")
    parser.add_argument("--pairs", type=int, default=300, help="near-duplicate pairs")
    parser.add_argument(
        "--peer-batch-sizes",
        type=positive_ints,
        default=[20, 50, 100, 300, 1000],
        metavar="N,N,...",
        help="docs per call of the numpy-fed rensa path, each timed (the best is its figure)",
    )
    parser.add_argument(
        "--max-edit-rate",
        type=float,
        default=0.7,
        help="largest share of words edited in a pair's copy (default 0.7: with edits drawn "
        "from the document's own words, 30%% edits still leave Jaccard near 0.6)",
    )
    parser.add_argument("--seed", type=int, default=0, help="corpus and edit seed")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write all figures here")
    parser.add_argument(
        "--no-install",
        action="store_true",
        help="do not create tools/.venv-bench; peers missing here are reported unavailable",
    )
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    if args.docs is None:
        args.docs = 600 if args.quick else 3000
    args.pairs = min(args.pairs, args.docs)
    if args.repeats < 1 or args.docs < 1 or args.batch_size < 1 or args.pairs < 1:
        parser.error("--repeats, --docs, --batch-size and --pairs must be positive")
    return args


def available_peers() -> tuple[dict[str, str | None], dict[str, str]]:
    """Versions of the importable peers, and why the others are not."""
    found: dict[str, str | None] = {}
    missing: dict[str, str] = {}
    for name in ("datasketch", "rensa"):
        try:
            __import__(name)
            found[name] = importlib.metadata.version(name)
        except Exception as err:
            missing[name] = f"{type(err).__name__}: {err}"
    return found, missing


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cpu = pin_to_one_core()
    venv_problem = None if args.no_install else enter_bench_venv()
    # Benchmark this checkout even when run with --no-install from a bare interpreter.
    sys.path.insert(0, str(REPO_ROOT))
    started = time.perf_counter()

    from neardup_store import Shingler

    peers, missing = available_peers()
    machine = machine_info(cpu)
    if venv_problem:
        missing = {name: f"{reason}; {venv_problem}" for name, reason in missing.items()}

    def progress(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f} s] {message}", file=sys.stderr, flush=True)

    progress(f"reading {args.docs} documents")
    docs = real_documents(args.docs, args.seed)
    sizes = sorted(len(doc.encode("utf-8")) for doc in docs)
    megabytes = sum(sizes) / 1e6

    progress("precomputing shingle lists and hashes for the hashing-only figures")
    shingles = python_shingler()
    str_lists = [shingles(doc) for doc in docs]
    byte_lists = [[s.encode("utf-8") for s in tokens] for tokens in str_lists]
    shingler = Shingler()
    hash_batches = [shingler.hash_batch(chunk) for chunk in batches(docs, args.batch_size)]

    methods = ours_methods(docs, hash_batches, args.batch_size)
    if "datasketch" in peers:
        methods += datasketch_methods(docs, byte_lists, args.batch_size)
    if "rensa" in peers:
        flat_batches = [rensa_flat_hashes(chunk) for chunk in batches(str_lists, args.batch_size)]
        methods += rensa_methods(docs, str_lists, byte_lists, flat_batches, args.batch_size)
        methods += numpy_rensa_methods(docs, args.peer_batch_sizes)
        methods += hybrid_methods(docs, hash_batches, args.batch_size)

    timings: dict[tuple[str, str], Timing] = {}
    for method in methods:
        progress(f"timing {method.system} {method.label} [{method.figure}]")
        timings[method.key, method.figure] = measure(method, args.repeats, len(docs), megabytes)

    progress(f"accuracy on {args.pairs} near-duplicate pairs")
    pairs = make_pairs(docs, args.pairs, args.max_edit_rate, args.seed + 1)
    accuracy = measure_accuracy(pairs, peers)
    ideal = ideal_rmse(pairs.exact)

    checks: dict[str, Any] = check_ours(timings, hash_batches, str_lists)
    if "rensa" in peers:
        same = check_rensa_paths(str_lists)
        checks["rensa_paths_with_digests_identical_to_RMinHash.update"] = sorted(
            key for key, equal in same.items() if equal
        )
        checks["rensa_paths_with_different_digests"] = sorted(
            key for key, equal in same.items() if not equal
        )
        checks["numpy_shingle_set_mismatches"] = check_numpy_shingles(docs, str_lists)

    ours = timings.get(("ours-oph", "raw text"))
    accuracy_by_key = {a.key: a for a in accuracy}
    ratio_rows = []
    seen_keys: list[tuple[str, str]] = []
    for (key, _figure), timing in timings.items():
        if timing.system in ("datasketch", "rensa") and (key, timing.label) not in seen_keys:
            seen_keys.append((key, timing.label))
    for key, label in seen_keys:
        system = key.split("-", 1)[0]
        ratio_rows.append(
            {
                "peer": f"{system} {label}",
                "key": key,
                "end_to_end": ratio(ours, timings.get((key, "end-to-end"))),
                "hashing_only": ratio(ours, timings.get((key, "hashing only"))),
            }
        )

    # "Fastest" is judged per figure among paths that are a full MinHash (accurate) and,
    # for the hashing-only figure, that take shingle lists like the other peers; the
    # pre-hashed-ints path is shown as well but starts from u64 hashes, not shingles.
    token_kind = {path.key: path.tokens for path in rensa_paths()} if "rensa" in peers else {}
    rensa_fastest: dict[str, str] = {}
    for figure, name in (("end-to-end", "end_to_end"), ("hashing only", "hashing_only")):
        eligible = [
            t
            for (key, fig), t in timings.items()
            if t.system == "rensa"
            and fig == figure
            and key.partition("@")[0] in accuracy_by_key  # one accuracy for all batch sizes
            and accuracy_by_key[key.partition("@")[0]].rmse <= IDEAL_RMSE_SLACK * ideal
            and (figure == "end-to-end" or token_kind.get(key) in ("str", "bytes"))
        ]
        if not eligible:
            continue
        best = max(eligible, key=lambda t: t.mb_per_s)
        rensa_fastest[name] = f"{best.label} ({best.mb_per_s:.2f} MB/s)"
        ratio_rows.append(
            {
                "peer": f"= rensa fastest full MinHash, {figure}",
                "key": best.key,
                "end_to_end": ratio(ours, best) if figure == "end-to-end" else None,
                "hashing_only": ratio(ours, best) if figure == "hashing only" else None,
            }
        )

    report: dict[str, Any] = {
        "machine": machine,
        "peers_unavailable": missing,
        "settings": {
            "shingles": f"char {SHINGLE_SIZE}",
            "num_perm": NUM_PERM,
            "repeats": args.repeats,
            "docs": args.docs,
            "batch_size": args.batch_size,
            "peer_batch_sizes": args.peer_batch_sizes,
            "seed": args.seed,
            "quick": args.quick,
            "rensa_seed": RENSA_SEED,
        },
        "corpus": {
            "docs": len(docs),
            "megabytes": megabytes,
            "min_bytes": sizes[0],
            "max_bytes": sizes[-1],
            "median_bytes": sizes[len(sizes) // 2],
            "distinct_shingles": sum(len(tokens) for tokens in str_lists),
        },
        "throughput": [t.to_json() for t in timings.values()],
        "ratios": ratio_rows,
        "rensa_fastest": rensa_fastest,
        "accuracy_pairs": {
            "count": len(pairs.exact),
            "min_rate": 0.01,
            "max_rate": args.max_edit_rate,
            "exact_min": min(pairs.exact),
            "exact_max": max(pairs.exact),
            "exact_median": statistics.median(pairs.exact),
            "ideal_rmse": ideal,
        },
        "accuracy": [asdict(a) for a in accuracy],
        "checks": checks,
    }
    report["run_seconds"] = time.perf_counter() - started
    report["machine"]["load_average_at_end"] = (
        os.getloadavg() if hasattr(os, "getloadavg") else None
    )
    print_report(report, list(timings.values()), accuracy)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
