"""MinHash signatures (MMDS section 3.3), two schemes, vectorised over batches.

A signature is ``num_perm`` uint32 values; two documents' signatures agree at a position
with probability equal to the Jaccard similarity of their shingle sets.

``kperm``: classic k-permutation MinHash (Broder 1997). Permutation ``i`` is the
multiply-add-shift hash ``((a_i * x + b_i) mod 2**64) >> 32`` of the 64-bit shingle hash
``x``, with ``a_i`` odd; this is a universal family (Dietzfelbinger 1996) whose arithmetic
is exactly numpy's wrapping uint64 arithmetic, so no overflow can occur or be mishandled.
The minimum is taken before the shift (the shift is monotone). Cost O(n · num_perm).

``oph``: one-permutation hashing (Li, Owen and Zhang 2012) with optimal densification
(Shrivastava 2017). One hash per shingle: its top 32 bits choose one of ``num_perm`` bins,
its low 32 bits are the value, and each bin keeps its minimum. An empty bin ``j`` borrows
the value of the first non-empty bin among ``g(j, 1), g(j, 2), ...`` for a seeded hash
``g``; the probe sequence depends only on ``j``, so two documents probe the same bins and
the estimate stays unbiased. Cost O(n + num_perm). It is the default: at equal accuracy it
is far faster (see ``tools/bench_signatures.py``).

A document with no shingles (only with ``allow_empty``) gets the empty signature: every
value ``2**32 - 1``. That value is not reserved: under ``oph`` a document whose every
shingle hash ends in 32 one bits gets the same signature. For a one-shingle document
(text shorter than the shingle size) that is a 2**-32 chance, and such a text can be made
on purpose. Under ``kperm`` each of the ``num_perm`` values must reach it by chance
(about ``2**(-32 * num_perm)`` for one shingle).

Specification (hashes ``x`` are the 64-bit shingle hashes of :mod:`.text`, used as they
are, with no further seeded hash; arithmetic wraps modulo 2**64; keys come from
:func:`.hashing.derive_keys` with ``MinHashConfig.seed``):

``kperm``
    ``a[i] = derive_keys(seed, "kperm-a", num_perm)[i] | 1``, ``b[i] =
    derive_keys(seed, "kperm-b", num_perm)[i]``; value ``i`` is the minimum over the
    document's ``x`` of ``a[i] * x + b[i]``, shifted right by 32 (the minimum of no
    values counts as ``2**64 - 1``, so a document with no shingles gets ``2**32 - 1``).
``oph``
    1. Bins: shingle ``x`` falls into bin ``((x >> 32) * num_perm) >> 32``
       (:func:`.hashing.high_bits_below`) with the value ``x & 0xFFFFFFFF``; a bin keeps
       its smallest value.
    2. Densification, for a document with at least one shingle: with ``p =
       derive_keys(seed, "oph-densify", num_perm)``, an empty bin ``j`` takes the value of
       bin ``((fmix64(p[j] + t) >> 32) * num_perm) >> 32`` for the first ``t = 1, 2, ...``
       at which that bin was filled in step 1 (bins filled here are never a source). A
       probe may land on ``j`` itself, which is empty and so skipped.
    3. A document with no shingles: every value ``2**32 - 1``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from . import kernels, streamed
from .errors import InvalidParameterError, choice, integer
from .hashing import U64, derive_keys, fmix64, high_bits_below
from .text import (
    ShingleBatch,
    ShingleConfig,
    Shingler,
    check_batch,
    check_encoding,
    exact_fields,
    single_document,
    valid_seed,
)

Scheme = Literal["oph", "kperm"]
SCHEMES: tuple[str, ...] = ("oph", "kperm")
EMPTY_VALUE = np.uint32(0xFFFFFFFF)
MAX_NUM_PERM = 8192
DEFAULT_NUM_PERM = 256
"""256 rather than the usual 128: one-permutation hashing makes the extra values nearly
free to compute, and they halve the variance of the estimate that verifies a candidate,
which is what lets the defaults reach recall and precision of 0.95 at t = 0.8 (see the
README's "Choosing threshold and num_perm")."""

_CHUNK_CHARACTERS = 1 << 18  # characters per internal batch: big enough to amortise the
# per-batch Python, small enough that its arrays stay in cache and in the reused buffers of
# kernels.scratch (1 << 20 measured 12 % slower, 1 << 16 no faster)
_KPERM_BLOCK_ROWS = 512  # shingles per block: keeps the block's work matrix in cache
_EMPTY_BIN = U64(1 << 32)  # above every 32-bit value, marks a bin no shingle fell into


@dataclass(frozen=True)
class MinHashConfig:
    """Everything that determines a signature. Two signatures are comparable only if
    they were made with equal configurations.

    Args:
        num_perm: values per signature.
        scheme: ``"oph"`` (default) or ``"kperm"``.
        seed: 64-bit seed for every hash involved.
        shingles: the :class:`~neardup_store.text.ShingleConfig`.
    """

    num_perm: int = DEFAULT_NUM_PERM
    scheme: Scheme = "oph"
    seed: int = 1
    shingles: ShingleConfig = ShingleConfig()

    def __post_init__(self) -> None:
        n = integer(self.num_perm)
        if n is None or not 1 <= n <= MAX_NUM_PERM:
            raise InvalidParameterError(
                "num_perm", self.num_perm, f"an integer in [1, {MAX_NUM_PERM}]"
            )
        object.__setattr__(self, "num_perm", n)  # numpy's integers are made plain ints
        object.__setattr__(self, "scheme", choice("scheme", self.scheme, SCHEMES))
        object.__setattr__(self, "seed", valid_seed(self.seed))
        if not isinstance(self.shingles, ShingleConfig):
            raise InvalidParameterError("shingles", self.shingles, "a ShingleConfig")

    def to_dict(self) -> dict[str, Any]:
        """Plain, msgpack/JSON-friendly dict (what a store records)."""
        return {
            "num_perm": self.num_perm,
            "scheme": self.scheme,
            "seed": self.seed,
            "shingles": self.shingles.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MinHashConfig:
        """Inverse of :meth:`to_dict`. A parameter this release does not know (a later
        release's, from an export or a job's output) is refused: dropped, the store
        would sign its text queries otherwise than its imported signatures. A missing one
        is refused too, with the field named (it was a raw ``KeyError``)."""
        data = exact_fields(data, _CONFIG_FIELDS, "config")
        return cls(
            num_perm=data["num_perm"],
            scheme=data["scheme"],
            seed=data["seed"],
            shingles=ShingleConfig.from_dict(data["shingles"]),
        )


_CONFIG_FIELDS = ("num_perm", "scheme", "seed", "shingles")
"""The keys of :meth:`MinHashConfig.to_dict`."""


def _chunks(documents: list[object]) -> Iterator[tuple[int, int]]:
    """``[lo, hi)`` ranges of documents holding about ``_CHUNK_CHARACTERS`` characters."""
    lo, size = 0, 0
    for i, doc in enumerate(documents):
        measured = streamed.length(doc)
        length = 1 if measured is None else measured  # the rest are refused, by as_text
        long = length > streamed.STREAM_MIN_CHARACTERS  # signed alone, in pieces
        if long and lo < i:
            yield lo, i
            lo, size = i, 0
        size += length
        if size >= _CHUNK_CHARACTERS or long:
            yield lo, i + 1
            lo, size = i + 1, 0
    if lo < len(documents):
        yield lo, len(documents)


def _checked_batch(batch: object) -> ShingleBatch:
    """``batch`` with ``uint64`` hashes and ``int64`` offsets in native byte order and
    contiguous (the types the compiled loops were built for), once it is known to be a
    :class:`ShingleBatch` whose offsets cut its hashes into documents.

    Raises:
        InvalidParameterError: it is not one.
    """
    owns = "document i owns hashes[offsets[i]:offsets[i + 1]]"
    if not isinstance(batch, ShingleBatch):
        raise InvalidParameterError(
            "batch", batch, "a ShingleBatch of numpy arrays (Shingler.hash_batch makes one)"
        )
    hashes, offsets = batch.hashes, batch.offsets
    if not (isinstance(hashes, np.ndarray) and hashes.ndim == 1 and hashes.dtype.kind in "iu"):
        raise InvalidParameterError(
            "batch.hashes",
            hashes,
            "a 1-D numpy array of integers: the 64-bit shingle hashes, uint64 (or int64, "
            "read modulo 2**64)",
        )
    if not (
        isinstance(offsets, np.ndarray)
        and offsets.ndim == 1
        and offsets.dtype.kind in "iu"
        and len(offsets) > 0
    ):
        raise InvalidParameterError(
            "batch.offsets",
            offsets,
            f"a 1-D numpy array of integers with one value or more: {owns}",
        )
    if offsets[0] != 0 or offsets[-1] != len(hashes):
        raise InvalidParameterError(
            "batch.offsets",
            offsets,
            f"offsets from 0 to len(hashes) = {len(hashes)} ({owns}); these run from "
            f"{offsets[0]} to {offsets[-1]}",
        )
    decrease = np.flatnonzero(offsets[1:] < offsets[:-1])  # no np.diff: uint64 would wrap
    if len(decrease):
        i = int(decrease[0])
        raise InvalidParameterError(
            "batch.offsets",
            offsets,
            f"offsets that never decrease ({owns}); offsets[{i + 1}] = {offsets[i + 1]} "
            f"is below offsets[{i}] = {offsets[i]}",
        )
    # Every offset now lies in [0, len(hashes)], so int64 holds it.
    return ShingleBatch(
        hashes.astype(np.uint64, order="C", copy=False),
        offsets.astype(np.int64, order="C", copy=False),
    )


class MinHasher:
    """Computes signatures for one :class:`MinHashConfig`.

    Example:
        >>> hasher = MinHasher(MinHashConfig(num_perm=64))
        >>> sigs = hasher.signatures(["the quick brown fox", "the quick brown dog"])
        >>> sigs.shape, sigs.dtype.name
        ((2, 64), 'uint32')
    """

    def __init__(self, config: MinHashConfig = MinHashConfig()) -> None:
        if not isinstance(config, MinHashConfig):
            raise InvalidParameterError("config", config, "a MinHashConfig")
        self.config = config
        self.shingler = Shingler(config.shingles, config.seed)
        k = config.num_perm
        if config.scheme == "kperm":
            a, b = derive_keys(config.seed, "kperm-a", k), derive_keys(config.seed, "kperm-b", k)
            self._mult = a | U64(1)
            self._add = b
        else:
            self._probe_keys = derive_keys(config.seed, "oph-densify", k)

    @property
    def num_perm(self) -> int:
        return self.config.num_perm

    def signature(self, document: object, encoding: str | None = None) -> npt.NDArray[np.uint32]:
        """Signature of one document, shape ``(num_perm,)``."""
        with single_document():
            return self.signatures([document], encoding)[0]

    def signatures(
        self, documents: Iterable[object], encoding: str | None = None
    ) -> npt.NDArray[np.uint32]:
        """Signatures of many documents at once, shape ``(len(documents), num_perm)``.

        Raises:
            BatchTypeError: ``documents`` is a single str/bytes or not iterable.
            InputTypeError: a document is not ``str`` (or bytes without ``encoding``).
            TextDecodeError: bytes are invalid in ``encoding``.
            EmptyDocumentError: a document has no shingles and empties are not allowed.
        """
        check_batch(documents)
        if encoding is not None:  # refused up front, even when every document is a str
            check_encoding(encoding)
        docs = list(documents)
        parts = [
            streamed.signature(self, docs[lo], encoding, lo)[None, :]
            if hi - lo == 1 and streamed.streams(self.config.shingles, docs[lo])
            else self._signatures_of_texts(docs[lo:hi], encoding, lo)
            for lo, hi in _chunks(docs)
        ]
        if not parts:
            return np.empty((0, self.num_perm), dtype=np.uint32)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _signatures_of_texts(
        self, documents: list[object], encoding: str | None, start_index: int
    ) -> npt.NDArray[np.uint32]:
        """Signatures of a chunk of documents. OPH over a set of character shingles bins
        each window's hash as it is made (the common case, and the fastest: no shingle
        hash is stored); the rest sign :meth:`.Shingler.hash_batch`'s hashes."""
        shingles = self.config.shingles
        if self.config.scheme == "oph" and shingles.kind == "char" and not shingles.bag:
            bins, has_shingles = self.shingler._window_bins(
                documents, encoding, start_index, self.num_perm, _EMPTY_BIN
            )
            return self._oph_finish(bins, has_shingles)
        return self._signatures_from_hashes(
            self.shingler._hash_batch(documents, encoding, start_index)
        )

    def signatures_from_hashes(self, batch: ShingleBatch) -> npt.NDArray[np.uint32]:
        """Signatures from precomputed 64-bit shingle hashes (one row per document).

        ``batch.hashes`` is a 1-D numpy array of any integer type. Its values are read
        modulo 2**64, so an ``int64`` hash counts as the ``uint64`` with the same bits
        (what ``.view(np.uint64)`` gives), under both schemes. ``batch.offsets`` is a 1-D
        numpy integer array that starts at 0, never decreases and ends at
        ``len(batch.hashes)``. The batch is checked first: the compiled loops index the
        hashes by the offsets without bounds checks, and an offset past the end read
        memory outside the array.

        Raises:
            InvalidParameterError: ``batch`` is no :class:`ShingleBatch`, or its arrays
                are not as described; the message says which rule was broken.
        """
        return self._signatures_from_hashes(_checked_batch(batch))

    def _signatures_from_hashes(self, batch: ShingleBatch) -> npt.NDArray[np.uint32]:
        """:meth:`signatures_from_hashes` without the checks, for the batches that
        :class:`Shingler` builds (valid by construction)."""
        if self.config.scheme == "kperm":
            return self._kperm(batch)
        return self._oph(batch)

    # -- k-permutation -----------------------------------------------------------------

    def _kperm(self, batch: ShingleBatch) -> npt.NDArray[np.uint32]:
        k, n_docs = self.num_perm, len(batch)
        best = np.full((n_docs, k), np.iinfo(np.uint64).max, dtype=np.uint64)
        hashes, offsets = batch.hashes, batch.offsets
        owners = np.repeat(np.arange(n_docs), np.diff(offsets))
        work = np.empty((_KPERM_BLOCK_ROWS, k), dtype=np.uint64)
        for lo in range(0, len(hashes), _KPERM_BLOCK_ROWS):
            block = hashes[lo : lo + _KPERM_BLOCK_ROWS]
            rows = work[: len(block)]
            np.multiply(block[:, None], self._mult[None, :], out=rows)
            rows += self._add
            block_owners = owners[lo : lo + len(block)]
            # Owners are sorted, so each document is one contiguous run of rows.
            run_starts = np.flatnonzero(np.r_[True, block_owners[1:] != block_owners[:-1]])
            docs = block_owners[run_starts]
            best[docs] = np.minimum(best[docs], np.minimum.reduceat(rows, run_starts, axis=0))
        return (best >> U64(32)).astype(np.uint32)

    # -- one-permutation with optimal densification ----------------------------------------

    def _oph(self, batch: ShingleBatch) -> npt.NDArray[np.uint32]:
        return self._oph_finish(self._oph_bins(batch), np.diff(batch.offsets) > 0)

    def _oph_bins(self, batch: ShingleBatch) -> npt.NDArray[np.uint64]:
        """Each bin's minimum (``_EMPTY_BIN`` if none), ``n_docs * num_perm`` values:
        minima that :mod:`.streamed` folds over the pieces of a long document."""
        return kernels.compiled().oph_bins(batch.hashes, batch.offsets, self.num_perm, _EMPTY_BIN)

    def _oph_finish(
        self, bins: npt.NDArray[np.uint64], has_shingles: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.uint32]:
        """Densified signatures, ``(n_docs, num_perm)``, from :meth:`_oph_bins`."""
        signature = bins.copy()
        self._densify(signature, bins, has_shingles=has_shingles)
        signature[signature == _EMPTY_BIN] = EMPTY_VALUE
        return signature.astype(np.uint32).reshape(len(has_shingles), self.num_perm)

    def _densify(
        self,
        signature: npt.NDArray[np.uint64],
        bins: npt.NDArray[np.uint64],
        has_shingles: npt.NDArray[np.bool_],
    ) -> None:
        """Fill each empty bin from the first non-empty bin on its probe sequence."""
        k = self.num_perm
        todo = np.flatnonzero(bins == _EMPTY_BIN)
        todo = todo[has_shingles[todo // k]]
        doc_base = todo - todo % k
        probe_key = self._probe_keys[todo % k]
        attempt = U64(0)
        while len(todo):
            attempt += U64(1)
            source = doc_base + high_bits_below(fmix64(probe_key + attempt), k)
            values = bins[source]
            found = values != _EMPTY_BIN
            signature[todo[found]] = values[found]
            keep = ~found
            todo, doc_base, probe_key = todo[keep], doc_base[keep], probe_key[keep]
