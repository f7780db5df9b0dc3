"""LSH banding (MMDS section 3.4): S-curve, parameter choice, band keys, candidates."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import set_pair_batch

from neardup_store import lsh
from neardup_store.errors import InvalidParameterError
from neardup_store.lsh import LSHParams, band_keys, candidate_pairs, choose_params, s_curve
from neardup_store.minhash import MAX_NUM_PERM, MinHashConfig, MinHasher

# MMDS Figure 3.8: values of the S-curve for b = 20 and r = 5 (rounded as printed there).
MMDS_B20_R5 = {0.2: 0.006, 0.3: 0.047, 0.4: 0.186, 0.5: 0.470, 0.6: 0.802, 0.7: 0.975, 0.8: 0.9996}


@pytest.mark.parametrize(("s", "expected"), sorted(MMDS_B20_R5.items()))
def test_s_curve_for_20_bands_of_5_rows(s: float, expected: float) -> None:
    digits = len(str(expected)) - 2
    assert round(float(s_curve(s, bands=20, rows=5)), digits) == expected


def test_mmds_worked_figures_at_08_and_04() -> None:
    # MMDS Example 3.11: at s = 0.8 a band agrees with probability 0.328 and about one
    # pair in 3000 is missed; at s = 0.4 roughly 19% of pairs still become candidates.
    assert pytest.approx(0.32768) == 0.8**5
    assert 1 - float(s_curve(0.8, 20, 5)) == pytest.approx(1 / 2800, rel=0.05)
    assert float(s_curve(0.4, 20, 5)) == pytest.approx(0.186, abs=5e-4)


def test_table_for_5_bands_of_7_rows() -> None:
    expected = {0.1: 0.0000, 0.2: 0.0001, 0.3: 0.0011, 0.4: 0.0082, 0.5: 0.0385,
                0.6: 0.1323, 0.7: 0.3493, 0.8: 0.6917, 0.9: 0.9614}  # fmt: skip
    params = LSHParams(bands=5, rows=7)
    for s, value in expected.items():
        assert round(float(params.probability(s)), 4) == value
    assert params.approx_threshold == pytest.approx(0.7946, abs=1e-4)  # (1/5)**(1/7)


def test_s_curve_refuses_what_is_no_probability_or_banding() -> None:
    for similarity, bands, rows, name in [
        (1.5, 25, 10, "similarity"), ([0.5, -0.1], 25, 10, "similarity"),
        (float("nan"), 25, 10, "similarity"), (0.8, 0, 10, "bands"), (0.8, 25, 0, "rows"),
    ]:  # fmt: skip
        with pytest.raises(InvalidParameterError, match=f"^{name}="):
            s_curve(similarity, bands, rows)


def test_s_curve_is_vectorised_and_monotone() -> None:
    s = np.linspace(0, 1, 101)
    p = s_curve(s, 9, 13)
    assert p.shape == (101,) and p[0] == 0.0 and p[-1] == 1.0
    assert (np.diff(p) >= 0).all()


def _brute_force_error(t: float, b: int, r: int, fp: float = 0.05, fn: float = 0.95) -> float:
    """Independent check: trapezoid rule on a very fine grid (default weights: the defaults)."""
    lo, hi = np.linspace(0, t, 20001), np.linspace(t, 1, 20001)
    return fp * np.trapezoid(s_curve(lo, b, r), lo) + fn * np.trapezoid(1 - s_curve(hi, b, r), hi)


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7, 0.8, 0.9])
@pytest.mark.parametrize("num_perm", [64, 128, 200])
@pytest.mark.parametrize("weights", [(0.05, 0.95), (0.5, 0.5)])
def test_choose_params_minimises_the_weighted_error(
    threshold: float, num_perm: int, weights: tuple[float, float]
) -> None:
    params = choose_params(threshold, num_perm, *weights)
    assert params.width <= num_perm
    chosen = _brute_force_error(threshold, params.bands, params.rows, *weights)
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            assert chosen <= _brute_force_error(threshold, b, r, *weights) + 1e-9


def test_default_weights_count_a_miss_nineteen_times_a_false_candidate() -> None:
    assert choose_params(0.8) == choose_params(0.8, 256, 0.05, 0.95) == LSHParams(25, 10)
    assert choose_params(0.8, 128) == LSHParams(16, 8)
    assert choose_params(0.8, 128, 0.5, 0.5) == LSHParams(9, 13)  # datasketch's choice


def test_exact_areas_match_numeric_integration() -> None:
    params = LSHParams(9, 13)
    lo, hi = np.linspace(0, 0.8, 40001), np.linspace(0.8, 1, 40001)
    assert params.false_positive_area(0.8) == pytest.approx(
        np.trapezoid(params.probability(lo), lo), rel=1e-6
    )
    assert params.false_negative_area(0.8) == pytest.approx(
        np.trapezoid(1 - params.probability(hi), hi), rel=1e-6
    )
    assert params.false_positive_rate(0.8) == pytest.approx(params.false_positive_area(0.8) / 0.8)


def test_use_all_uses_every_signature_value() -> None:
    for t in (0.5, 0.8, 0.9):
        params = choose_params(t, 128, use_all=True)
        assert params.width == 128


def test_weights_move_the_curve() -> None:
    fewer_misses = choose_params(0.8, 128, false_positive_weight=0.1, false_negative_weight=0.9)
    fewer_false = choose_params(0.8, 128, false_positive_weight=0.9, false_negative_weight=0.1)
    balanced = choose_params(0.8, 128, false_positive_weight=0.5, false_negative_weight=0.5)
    assert fewer_misses.approx_threshold < balanced.approx_threshold < fewer_false.approx_threshold


@pytest.mark.parametrize("threshold", [0, 1, 1.5, -0.2, "0.8", True, float("nan")])
def test_threshold_outside_open_unit_interval_is_rejected(threshold: object) -> None:
    with pytest.raises(InvalidParameterError, match=r"threshold.*strictly between 0 and 1"):
        choose_params(threshold)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_perm": 0},
        {"num_perm": 2.5},
        {"false_positive_weight": -1},
        {"false_positive_weight": 0, "false_negative_weight": 0},
    ],
)
def test_invalid_choose_params_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidParameterError):
        choose_params(0.8, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("bands", "rows"), [(0, 5), (5, 0), (-1, 2), (2.0, 3)])
def test_invalid_banding(bands: object, rows: object) -> None:
    with pytest.raises(InvalidParameterError):
        LSHParams(bands, rows)  # type: ignore[arg-type]


def test_bands_times_rows_over_num_perm_is_rejected() -> None:
    sigs = MinHasher(MinHashConfig(num_perm=64)).signatures(["some text here"])
    with pytest.raises(InvalidParameterError, match="at most num_perm=64"):
        band_keys(sigs, LSHParams(bands=10, rows=7))
    with pytest.raises(InvalidParameterError, match="uint32"):
        band_keys(sigs.astype(np.int64), LSHParams(bands=4, rows=4))


def test_band_keys_digest_band_index_and_values() -> None:
    rng = np.random.default_rng(0)
    sigs = rng.integers(0, 2**32, size=(3, 20), dtype=np.uint32)
    sigs[1] = sigs[0]
    sigs[1, 7] ^= 1  # differs from row 0 in band 1 only (rows 5..9)
    sigs[2] = np.tile(sigs[0, :5], 4)  # the same five values in every band
    params = LSHParams(bands=4, rows=5)
    keys = band_keys(sigs, params)
    assert keys.shape == (3, 4) and keys.dtype == np.uint64
    assert (keys[0] == keys[1]).tolist() == [True, False, True, True]
    assert len(np.unique(keys[2])) == 4  # the band index is part of the digest
    assert np.array_equal(band_keys(sigs[0], params)[0], keys[0])
    assert not np.intersect1d(band_keys(sigs, params, seed=2), keys).size
    # The values past bands * rows are not part of any band.
    longer = np.concatenate([sigs, rng.integers(0, 2**32, (3, 4), dtype=np.uint32)], axis=1)
    assert np.array_equal(band_keys(longer, params), keys)


def test_candidate_pairs_from_shared_keys() -> None:
    keys = np.array([[1, 10], [2, 10], [1, 30], [4, 40], [5, 10]], dtype=np.uint64)
    pairs = candidate_pairs(keys)
    assert pairs.tolist() == [[0, 1], [0, 2], [0, 4], [1, 4]]
    assert candidate_pairs(np.arange(6, dtype=np.uint64).reshape(3, 2)).shape == (0, 2)


@pytest.mark.parametrize("key_bits", [1, 8, 39, 40, 41, 63, 64])
def test_candidate_pairs_compare_exactly_the_first_key_bits(key_bits: int) -> None:
    """Keys that differ in every bit after the first ``key_bits`` are a pair; keys that
    differ in the last of those bits only are not. The fixture meant to pin the store's
    40 bits shared 42, so keeping a bit too many or too few went unseen (review 49)."""
    dropped = (1 << (64 - key_bits)) - 1  # every bit after the first key_bits
    last_kept = 1 << (64 - key_bits)
    base = 0x9E3779B97F4A7C15 & ~dropped & ~last_kept
    keys = [base, base | dropped, base | last_kept, base | last_kept | dropped]
    pairs = candidate_pairs(np.array(keys, dtype=np.uint64)[:, None], key_bits=key_bits)
    assert pairs.tolist() == [[0, 1], [2, 3]]


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["oph", "kperm"])
def test_candidate_rate_follows_the_s_curve(scheme: str) -> None:
    """Pairs of known similarity become candidates at the rate the S-curve predicts."""
    params = LSHParams(bands=20, rows=5)
    hasher = MinHasher(MinHashConfig(num_perm=100, scheme=scheme))  # type: ignore[arg-type]
    pairs = 600
    for index, s in enumerate((0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)):
        batch = set_pair_batch(np.full(pairs, s), 500, seed=100 + index)
        keys = band_keys(hasher.signatures_from_hashes(batch), params)
        rate = (keys[0::2] == keys[1::2]).any(axis=1).mean()
        expected = float(params.probability(s))
        tolerance = 4 * np.sqrt(expected * (1 - expected) / pairs) + 0.01
        assert abs(rate - expected) < tolerance, (s, rate, expected)


@pytest.mark.parametrize("weight", [math.inf, math.nan])
def test_a_weight_that_is_not_finite_is_refused(weight: float) -> None:
    """inf passed the check and gave a NaN-driven 1 x 168 banding (a review's finding)."""
    with pytest.raises(InvalidParameterError, match="finite non-negative"):
        choose_params(0.8, 256, false_positive_weight=weight)


def test_only_the_ratio_of_the_weights_matters() -> None:
    """Two huge weights overflowed their sum; scaled, they choose what 1 and 1 choose."""
    assert choose_params(0.8, 256, 1e308, 1e308) == choose_params(0.8, 256, 1.0, 1.0)
    assert choose_params(0.7, 128, 5e306, 9.5e307) == choose_params(0.7, 128, 0.05, 0.95)


def test_areas_in_chunks_equal_areas_in_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """At num_perm 8192 one matrix of every pair by every node took about 5 GB; the
    pairs now go in chunks of bounded size, each with the nodes it needs."""
    pairs = [(b, r) for b in range(1, 257) for r in range(1, 256 // b + 1)]
    bands = np.array([b for b, _ in pairs], dtype=np.int64)
    rows = np.array([r for _, r in pairs], dtype=np.int64)
    whole = lsh._areas_with(bands, rows, 0.8, 129)
    monkeypatch.setattr(lsh, "_AREA_CHUNK", 1000)
    chunked = lsh._areas(bands, rows, 0.8)
    np.testing.assert_allclose(chunked[0], whole[0], rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(chunked[1], whole[1], rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize(
    "call",
    [
        lambda: s_curve("x", 2, 2),
        lambda: s_curve("0.5", 2, 2),
        lambda: s_curve(None, 2, 2),
        lambda: LSHParams(2, 2).check_fits("x"),  # type: ignore[arg-type]
        lambda: choose_params(0.8, 64, use_all="no"),  # type: ignore[arg-type]
    ]
    + [
        lambda seed=seed: band_keys(np.zeros((2, 8), np.uint32), LSHParams(4, 2), seed=seed)
        for seed in ("x", 1.5, None, -1, 2**70)
    ],
)
def test_lsh_helpers_refuse_wrong_inputs_with_a_typed_error(call: object) -> None:
    """Raw ValueError/TypeError, or seeds MinHashConfig refuses, for wrong inputs (review 22)."""
    with pytest.raises(InvalidParameterError):
        call()  # type: ignore[operator]


def test_band_keys_and_candidate_pairs_take_numpy_integers() -> None:
    """candidate_pairs(key_bits=np.int64(40)) said an integer was expected (review 22)."""
    sigs = np.random.default_rng(1).integers(0, 3, (20, 8)).astype(np.uint32)
    keys = band_keys(sigs, LSHParams(4, 2), seed=np.uint64(7))
    assert np.array_equal(keys, band_keys(sigs, LSHParams(4, 2), seed=7))
    pairs = candidate_pairs(keys, key_bits=np.int64(40))
    assert np.array_equal(pairs, candidate_pairs(keys, key_bits=40))


def test_choose_params_refuses_num_perm_above_the_maximum() -> None:
    """num_perm=10**9 ran for hours instead of being refused as MinHashConfig does (review 22)."""
    for num_perm in (MAX_NUM_PERM + 1, 10**9):
        with pytest.raises(InvalidParameterError, match=f"num_perm.*{MAX_NUM_PERM}"):
            choose_params(0.8, num_perm, use_all=True)


@pytest.mark.parametrize("num_perm", [16, 37, 64, 100, 128, 200, 256])
def test_choose_params_ruling_bandings_out_keeps_the_exhaustive_answer(num_perm: int) -> None:
    """The bounds that skip most exact areas (made for num_perm 8192's minutes) change no
    answer: the same banding as integrating every banding (review 22)."""
    pairs = [(b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)]
    bands = np.array([b for b, _ in pairs], dtype=np.int64)
    rows = np.array([r for _, r in pairs], dtype=np.int64)
    for threshold in (0.05, 0.5, 0.8, 0.95):
        fp, fn = lsh._areas(bands, rows, threshold)
        for fp_weight, fn_weight in ((0.05, 0.95), (0.5, 0.5), (1.0, 0.0), (0.0, 1.0)):
            best = int(np.argmin(fp_weight * fp + fn_weight * fn))
            chosen = choose_params(threshold, num_perm, fp_weight, fn_weight)
            assert (chosen.bands, chosen.rows) == (bands[best], rows[best])


@pytest.mark.parametrize("banding", [(1000, 100), (100, 82), (MAX_NUM_PERM + 1, 1)])
@pytest.mark.parametrize(
    "method",
    ["false_positive_area", "false_negative_area", "false_positive_rate", "false_negative_rate"],
)
def test_areas_and_rates_refuse_a_banding_wider_than_the_longest_signature(
    monkeypatch: pytest.MonkeyPatch, banding: tuple[int, int], method: str
) -> None:
    """The quadrature for bands*rows values builds a dense matrix of about (width / 2)**2
    floats: 1000 x 100 asked numpy for 32 GiB (a raw MemoryError) and 100 x 100 ran for
    minutes (review 44). Refused before any node is made; 8192 wide is still answered."""

    def no_nodes(points: int) -> None:
        raise AssertionError(f"{points} quadrature nodes made for a refused banding")

    monkeypatch.setattr(lsh, "_nodes", no_nodes)
    with pytest.raises(InvalidParameterError, match=f"bands\\*rows=.*at most {MAX_NUM_PERM}"):
        getattr(LSHParams(*banding), method)(0.8)
    monkeypatch.setattr(lsh, "_areas", lambda *args: (np.array([0.25]), np.array([0.125])))
    widest = LSHParams(MAX_NUM_PERM // 2, 2)
    assert (widest.false_positive_area(0.5), widest.false_negative_rate(0.5)) == (0.25, 0.25)


@pytest.mark.parametrize(
    "keys",
    [
        np.array([["a", "b"], ["a", "c"]]),
        np.array([[None, 1], [None, 2]], dtype=object),
        np.array([[np.nan], [np.nan]]),
        np.array([[True], [True]]),
    ],
    ids=["str", "object", "nan", "bool"],
)
def test_candidate_pairs_refuses_keys_that_are_no_integers(keys: np.ndarray) -> None:
    """str keys raised a raw ValueError, object ones a raw TypeError, and NaN keys were
    answered as the pair [0, 1] (review 44). No keys at all are still no pairs."""
    for key_bits in (64, 40):
        with pytest.raises(InvalidParameterError, match="integer band keys"):
            candidate_pairs(keys, key_bits)
    assert candidate_pairs(np.empty((0, 3))).shape == (0, 2)


@pytest.mark.parametrize("threshold", [1, 1.0, 0, 1.5, float("nan")])
def test_only_a_threshold_of_1_is_told_to_give_the_banding(threshold: float) -> None:
    """The advice to give bands and rows was added to every refused threshold, though
    only 1 can be served that way (0, 1.5 and nan cannot be served at all; review 45)."""
    with pytest.raises(InvalidParameterError) as refused:
        choose_params(threshold)
    assert ("bands= and rows= given" in str(refused.value)) == (threshold == 1)


def test_check_fits_advice_drops_more_num_perm_when_the_signatures_are_made() -> None:
    """A rebuild keeps the stored signatures, so "or more num_perm" could not be followed
    there (review 53); choosing a banding for signatures still to be made keeps it."""
    with pytest.raises(InvalidParameterError) as fixed:
        LSHParams(20, 4).check_fits(64, num_perm_fixed=True)
    assert str(fixed.value) == (
        "bands*rows='20*4=80' is not valid: expected at most the store's num_perm=64 (fixed "
        "when its signatures were made); use fewer bands or rows"
    )
    with pytest.raises(InvalidParameterError, match=r"fewer bands or rows, or more num_perm$"):
        LSHParams(20, 4).check_fits(64)
