"""Pinned signature bytes: the same inputs and configuration must give the same bytes in
every process, on every machine and in every release of the same ``HASH_VERSION``.

If one of these tests fails, a change altered stored values: either undo it, or bump
``HASH_VERSION`` (and the store format), note it in CHANGELOG.md and pin the new bytes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

from neardup_store import HASH_VERSION, LSHParams, MinHashConfig, MinHasher, Shingler, band_keys
from neardup_store.text import ShingleConfig

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Ünïcödé  TEXT\twith\u00a0spaces and the ﬁ ligature",
    "ab",
    "a rose is a rose is a rose",
]

CONFIGS = {
    "oph-char5": MinHashConfig(num_perm=128),
    "kperm-char5": MinHashConfig(num_perm=128, scheme="kperm"),
    "oph-char5-defaults": MinHashConfig(),
    "oph-word2-bag": MinHashConfig(
        num_perm=64, shingles=ShingleConfig(kind="word", size=2, bag=True)
    ),
    "kperm-stopword-seed42": MinHashConfig(
        num_perm=32, scheme="kperm", seed=42, shingles=ShingleConfig(kind="stopword")
    ),
}

GOLDEN = {
    "oph-char5": (
        "8a78831a93da985ec95692f62653a7f0c7287bf971c7a04b95a850aa5fcbc883",
        [80376165, 2528935198, 3747089265, 2634554238],
    ),
    "oph-char5-defaults": (
        "65ba1b9a3987d00cb5b07dea00384af0462f2f23d89c750ccf5e59b225c963dd",
        [80376165, 2528935198, 2763222084, 3747089265],
    ),
    "kperm-char5": (
        "c554a3b97a8dc2c3062cdbfbbdb5c558111a44db060138ea7460c7d7dd8526e0",
        [152019431, 69067745, 203123200, 1419706],
    ),
    "oph-word2-bag": (
        "8eb1237a7f750a4a8fc3651306210ca454ec1d3ac20d254cd1005cf3ddd8fe5c",
        [2768248738, 847503421, 4187209225, 4137245188],
    ),
    "kperm-stopword-seed42": (
        "7f045206e1c7b4b817d381877ca5fc74ae50b35b050d89ec69c64b123bdd6cdf",
        [314387892, 1998403421, 1793225317, 2410570014],
    ),
}


def _digest(config: MinHashConfig) -> tuple[str, list[int]]:
    sigs = MinHasher(config).signatures(TEXTS)
    return hashlib.sha256(sigs.astype("<u4").tobytes()).hexdigest(), sigs[0, :4].tolist()


def test_hash_version_is_the_one_pinned_here() -> None:
    assert HASH_VERSION == 1


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_signature_bytes_are_pinned(name: str) -> None:
    assert _digest(CONFIGS[name]) == GOLDEN[name]


def test_shingle_hashes_are_pinned() -> None:
    assert Shingler().hash_document("abcdefg").tolist() == [
        11884209184440047947,
        792903490398270787,
        5171066292878684932,
    ]


@pytest.mark.parametrize(
    ("scheme", "digest", "first"),
    [
        (
            "fold",  # stores of format 1
            "3fe04a2ff7ec4d38b7215b56ee801520dea611d563ab7ede9b2eb36c89a642c8",
            [15213700286706899156, 8855641454244499343],
        ),
        (
            "multilinear",  # stores of format 2
            "5279c931a878aa1a4197469dc3481971debca37eb846317d711cfcdb711122c0",
            [10231735975641395329, 6322865515209535905],
        ),
    ],
)
def test_band_keys_are_pinned(scheme: str, digest: str, first: list[int]) -> None:
    keys = band_keys(MinHasher(CONFIGS["oph-char5"]).signatures(TEXTS), LSHParams(9, 13, scheme))
    assert hashlib.sha256(keys.astype("<u8").tobytes()).hexdigest() == digest
    assert keys[0, :2].tolist() == first


@pytest.mark.parametrize("hash_seed", ["0", "12345"])
def test_other_processes_compute_the_same_bytes(hash_seed: str) -> None:
    """A fresh interpreter with a different str hash seed signs to identical bytes."""
    code = (
        "import hashlib, sys; sys.path.insert(0, sys.argv[1]);"
        "from test_golden import CONFIGS, _digest;"
        "print(*[_digest(CONFIGS[n])[0] for n in sorted(CONFIGS)])"
    )
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run(
        [sys.executable, "-c", code, os.path.dirname(__file__)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == [GOLDEN[n][0] for n in sorted(CONFIGS)]


def test_signatures_do_not_depend_on_batch_composition() -> None:
    alone = MinHasher().signature(TEXTS[1])
    mixed = MinHasher().signatures(["padding text " * 50, TEXTS[1], "x"])
    assert np.array_equal(alone, mixed[1])
