"""neardup_store: a persistent near-duplicate document index (shingles, MinHash, LSH bands).

Data flows one way: text → shingles (:mod:`.text`) → signature (:mod:`.minhash`) → band
keys (:mod:`.lsh`).
"""

from ._version import __version__
from .clusters import connected_components, duplicate_groups, verified_pairs
from .errors import (
    BatchTypeError,
    EmptyDocumentError,
    InputTypeError,
    InvalidParameterError,
    NeardupError,
    TextDecodeError,
)
from .lsh import LSHParams, band_keys, candidate_pairs, choose_params, s_curve
from .minhash import MinHashConfig, MinHasher
from .similarity import (
    bag_jaccard,
    estimate_jaccard,
    hashed_jaccard,
    jaccard,
    sum_union_from_max_union,
)
from .text import (
    ENGLISH_STOP_WORDS,
    HASH_VERSION,
    ShingleBatch,
    ShingleConfig,
    Shingler,
    normalize,
    shingle_strings,
)

__all__ = [
    "ENGLISH_STOP_WORDS",
    "HASH_VERSION",
    "BatchTypeError",
    "EmptyDocumentError",
    "InputTypeError",
    "InvalidParameterError",
    "LSHParams",
    "MinHashConfig",
    "MinHasher",
    "NeardupError",
    "ShingleBatch",
    "ShingleConfig",
    "Shingler",
    "TextDecodeError",
    "__version__",
    "bag_jaccard",
    "band_keys",
    "candidate_pairs",
    "choose_params",
    "connected_components",
    "duplicate_groups",
    "estimate_jaccard",
    "hashed_jaccard",
    "jaccard",
    "normalize",
    "s_curve",
    "shingle_strings",
    "sum_union_from_max_union",
    "verified_pairs",
]
