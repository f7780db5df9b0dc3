"""A store's parameters: what its signatures and bands mean, and how they are chosen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import InvalidParameterError, real
from .lsh import LSHParams, choose_params
from .minhash import MinHashConfig
from .text import ShingleConfig


@dataclass(frozen=True)
class StoreParams:
    """Everything that decides what a store's signatures and bands mean."""

    config: MinHashConfig
    banding: LSHParams
    threshold: float

    def flat(self) -> dict[str, Any]:
        """One flat dict of every parameter (for comparisons and display)."""
        return {
            "num_perm": self.config.num_perm,
            "scheme": self.config.scheme,
            "seed": self.config.seed,
            **shingle_fields(self.config.shingles),
            "bands": self.banding.bands,
            "rows": self.banding.rows,
            "threshold": self.threshold,
        }

    def open_options(self) -> dict[str, Any]:
        """These parameters as :meth:`Store.open` keywords: ``Store.open(path, create=True,
        **params.open_options())`` makes a store that means what these say."""
        config = self.config
        return {
            "threshold": self.threshold,
            "num_perm": config.num_perm,
            "scheme": config.scheme,
            "seed": config.seed,
            "shingles": config.shingles,
            "bands": self.banding.bands,
            "rows": self.banding.rows,
        }


def shingle_fields(shingles: ShingleConfig) -> dict[str, Any]:
    return {
        f"shingle_{name}" if name in ("kind", "size") else name: value
        for name, value in shingles.to_dict().items()
    }


def resolve_params(
    threshold: float | None,
    num_perm: int | None,
    scheme: str | None,
    seed: int | None,
    shingles: ShingleConfig | None,
    bands: int | None,
    rows: int | None,
) -> StoreParams:
    defaults = MinHashConfig()
    config = MinHashConfig(
        num_perm=defaults.num_perm if num_perm is None else num_perm,
        scheme=defaults.scheme if scheme is None else scheme,  # type: ignore[arg-type]
        seed=defaults.seed if seed is None else seed,
        shingles=defaults.shingles if shingles is None else shingles,
    )
    threshold = valid_threshold(0.8 if threshold is None else threshold)
    if (bands is None) != (rows is None):
        raise InvalidParameterError("bands/rows", (bands, rows), "both bands and rows, or neither")
    if bands is None or rows is None:
        banding = choose_params(threshold, config.num_perm)
    else:
        banding = LSHParams(bands, rows)
        banding.check_fits(config.num_perm)
    return StoreParams(config, banding, threshold)


def valid_threshold(threshold: object) -> float:
    value = real(threshold)
    if value is None or not 0.0 < value <= 1.0:
        raise InvalidParameterError("threshold", threshold, "a number in (0, 1]")
    return value
