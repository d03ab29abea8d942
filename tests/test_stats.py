"""helpers.lab.stats: paired comparisons, censored time-to-threshold and k-of-n intervals.

Known answers come from two independent places: small cases worked by hand (formulas,
enumerations written out here) and scipy's own functions called directly.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from helpers.lab.stats import (
    Censored,
    PairedComparison,
    k_of_n_interval,
    km_median,
    paired,
    proportion_interval,
    time_to_threshold,
)


@pytest.fixture(scope="module", autouse=True)
def _scipy_stats():
    """scipy.stats (the known answers) is imported when this module's first test runs, not at
    collection: both workers collect every file, and the import costs each about 0.6 s (issue 32)."""
    global st
    import scipy.stats as st

# --------------------------------------------------------------------------- counts


def test_clopper_pearson_closed_forms_for_0_and_n():
    # k = 0: [0, 1 - (alpha/2)^(1/n)]; k = n: [(alpha/2)^(1/n), 1]  (beta quantiles in closed form)
    lo, hi = proportion_interval(0, 8)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 8), rel=1e-9)
    lo, hi = proportion_interval(8, 8)
    assert lo == pytest.approx(0.025 ** (1 / 8), rel=1e-9) and hi == 1.0


def test_clopper_pearson_equals_beta_quantiles():
    lo, hi = proportion_interval(6, 8)
    assert lo == pytest.approx(st.beta.ppf(0.025, 6, 3), rel=1e-9)
    assert hi == pytest.approx(st.beta.ppf(0.975, 7, 2), rel=1e-9)
    assert (round(lo, 4), round(hi, 4)) == (0.3491, 0.9681)


def test_wilson_interval_by_formula():
    k, n, z = 6, 8, st.norm.ppf(0.975)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert proportion_interval(6, 8, method="wilson") == pytest.approx((centre - half, centre + half), rel=1e-9)


def test_k_of_n_interval_text():
    assert k_of_n_interval(6, 8) == "6 of 8 seeds (75%; 95% CI 35% to 97%, Clopper-Pearson)"
    assert k_of_n_interval(0, 5, what="") == "0 of 5 (0%; 95% CI 0% to 52%, Clopper-Pearson)"
    assert k_of_n_interval(4, 8, 0.9, method="wilson").startswith("4 of 8 seeds (50%; 90% CI ")


@pytest.mark.parametrize("args, kwargs, exc, msg", [
    ((6.0, 8), {}, TypeError, r"k must be an int, got float 6\.0"),
    ((6, True), {}, TypeError, r"n must be an int, got bool True"),
    ((0, 0), {}, ValueError, r"n must be >= 1, got 0"),
    ((9, 8), {}, ValueError, r"k must satisfy 0 <= k <= n \(n = 8\), got 9"),
    ((-1, 8), {}, ValueError, r"k must satisfy 0 <= k <= n \(n = 8\), got -1"),
    ((6, 8, 1.5), {}, ValueError, r"confidence must be a number strictly between 0 and 1, got 1\.5"),
    ((6, 8), {"method": "wald"}, ValueError, r"method must be 'exact', 'wilson' or 'wilsoncc', got 'wald'"),
])
def test_interval_arguments_are_checked(args, kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        k_of_n_interval(*args, **kwargs)


# --------------------------------------------------------------------------- paired


A8 = [0.9, 0.8, 1.0, 0.95, 0.7, 0.99, 0.6, 0.85]
B8 = [0.6, 0.5, 0.7, 0.95, 0.8, 0.6, 0.5, 0.3]


def test_paired_t_interval_by_hand():
    # d = 1, 2, 3, 6: mean 3, s^2 = (4 + 1 + 0 + 9) / 3, se = s / 2, t_{0.975, 3} = 3.18245 (tables)
    c = paired([11, 12, 13, 16], [10, 10, 10, 10])
    se = math.sqrt(14 / 3) / 2
    assert c.mean_diff == 3.0 and c.sd_diff == pytest.approx(math.sqrt(14 / 3))
    assert c.t_ci == pytest.approx((3 - 3.18245 * se, 3 + 3.18245 * se), abs=1e-4)
    assert c.t_ci == pytest.approx((-0.43743, 6.43743), abs=1e-4)


def test_paired_matches_scipy_ttest_rel():
    c = paired(A8, B8)
    ref = st.ttest_rel(A8, B8)
    ci = ref.confidence_interval()
    assert c.t_ci == pytest.approx((ci.low, ci.high), rel=1e-12)
    assert c.t_p == pytest.approx(ref.pvalue, rel=1e-12)
    np.testing.assert_allclose(c.diffs, np.subtract(A8, B8))


def test_sign_test_6_of_8_by_hand():
    # P = 2 * (C(8,6) + C(8,7) + C(8,8)) / 2^8 = 74 / 256
    c = paired([1, 1, 1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0, 1, 1])
    assert (c.n_better, c.n_worse, c.n_tied) == (6, 2, 0)
    assert c.sign_p == 74 / 256 == 0.2890625


def test_wilcoxon_exact_by_hand():
    # |d| ranks 1..8, the single negative has rank 6: W- = 6. Subsets of {1..8} with sum <= 6:
    # {}, 1, 2, 3, 12, 4, 13, 5, 14, 23, 6, 15, 24, 123 -> 14; p = 2 * 14 / 256.
    c = paired([1, 2, 3, 4, 5, -6, 7, 8], [0] * 8)
    assert c.wilcoxon_method == "exact"
    assert c.wilcoxon_p == 28 / 256
    assert c.wilcoxon_p == pytest.approx(st.wilcoxon([1, 2, 3, 4, 5, -6, 7, 8]).pvalue, rel=1e-12)
    assert paired(np.arange(1, 9) + 0.5, [0] * 8).wilcoxon_p == 2 / 256


def _wilcoxon_by_enumeration(d):
    d = np.asarray([x for x in d if x != 0], dtype=float)
    ranks = st.rankdata(np.abs(d))
    t_obs = ranks[d > 0].sum()
    centre = ranks.sum() / 2
    stats = [sum(r for r, s in zip(ranks, signs) if s) for signs in itertools.product([0, 1], repeat=len(d))]
    return np.mean([abs(t - centre) >= abs(t_obs - centre) - 1e-12 for t in stats])


def test_wilcoxon_with_ties_and_zeros_is_exact_by_enumeration():
    d = [1, 1, 2, -2, 3, 0, 0.5, 2]          # ties among |d| and one zero (dropped, Wilcoxon's rule)
    c = paired(d, [0] * len(d))
    assert c.wilcoxon_method == "exact (enumerated, ties)"
    assert c.n_tied == 1
    assert c.wilcoxon_p == pytest.approx(_wilcoxon_by_enumeration(d), rel=1e-12)


def test_all_tied_seeds():
    c = paired([0.5, 0.7, 0.9], [0.5, 0.7, 0.9])
    assert (c.n_better, c.n_worse, c.n_tied) == (0, 0, 3)
    assert c.wilcoxon_p == 1.0 and c.sign_p == 1.0 and c.wilcoxon_method == "none (all tied)"
    assert c.t_ci == (0.0, 0.0) and math.isnan(c.t_p)
    assert "every seed differs by exactly +0.00 (no interval)" in c.line()


def test_small_n_says_the_wilcoxon_test_cannot_reach_005():
    c = paired([2, 3, 4, 5, 6.5], [1, 1, 1, 1, 1])
    assert c.wilcoxon_p == 2 / 32  # the smallest p with 5 non-tied seeds
    assert c.line().endswith("(with 5 non-tied seeds no p can go below 0.062)")
    assert "no p can go below" not in paired(np.arange(6) + 1.5, [0] * 6).line()


def test_bootstrap_interval_is_scipys_bca_with_the_fixed_seed():
    c = paired(A8, B8, boot_seed=3)
    ref = st.bootstrap((np.subtract(A8, B8),), np.mean, n_resamples=9999, method="BCa",
                       rng=np.random.default_rng(3)).confidence_interval
    assert c.boot_ci == pytest.approx((ref.low, ref.high), rel=1e-12)
    assert paired(A8, B8, boot_seed=3).boot_ci == c.boot_ci                 # reproducible
    assert c.boot_ci[0] < c.mean_diff < c.boot_ci[1]


def test_paired_line_and_table():
    c = paired(A8, B8, range(8), a_name="dropout", b_name="none")
    assert c.line() == ("dropout - none: better in 6 of 8 seeds (worse in 1, tied in 1), mean +0.23 "
                        "[95% t CI +0.05, +0.41], Wilcoxon p = 0.047, sign test p = 0.12")
    assert str(c) == c.line()
    rows = c.table().splitlines()
    assert rows[0].split() == ["seed", "dropout", "none", "dropout", "-", "none"]
    assert rows[8].split() == ["7", "0.85", "0.30", "+0.55"]
    # mean 4.5625, s = 2.49911, t_{0.975, 7} = 2.36462 (tables): 4.5625 -/+ 2.36462 * 2.49911 / sqrt(8);
    # Wilcoxon and sign test: all 8 positive, no ties -> 2 / 2^8
    c = paired([1.0, 2.0, 3.0, 4.0, 5.0, 6.5, 7.0, 8.0], [0.0] * 8, a_name="x", b_name="y")
    assert c.line() == ("x - y: better in 8 of 8 seeds, mean +4.56 [95% t CI +2.47, +6.65], "
                        "Wilcoxon p = 0.0078, sign test p = 0.0078")


def test_lower_is_better():
    c = paired([100, 120, 90, 300, 200, 150], [150, 130, 80, 400, 260, 190], better="lower",
               a_name="4 heads", b_name="1 head", fmt=".0f")
    assert (c.n_better, c.n_worse) == (5, 1)
    assert c.line().startswith("4 heads - 1 head: better in 5 of 6 seeds, mean -42 [95% t CI ")
    assert c.line().endswith("; lower is better")


@pytest.mark.parametrize("args, kwargs, exc, msg", [
    (([1, 2], [1]), {}, ValueError, r"a_values and b_values must have the same length .* got 2 and 1"),
    (([1], [1]), {}, ValueError, r"at least 2 seeds .* got 1"),
    (("ab", [1, 2]), {}, TypeError, r"a_values must be a sequence of numbers, got str"),
    (([1, "x"], [1, 2]), {}, TypeError, r"a_values\[1\] must be a number, got str 'x'"),
    (([1, 2], [1, math.inf]), {}, ValueError, r"b_values must be finite for every seed; seeds \[1\] hold \[inf\]"),
    (([1, None], [1, 2]), {}, ValueError, r"a_values must be finite for every seed; seeds \[1\] hold \[nan\]"),
    (([1, 2], [1, 2], [0]), {}, ValueError, r"seeds must have one seed per value \(2\), got 1"),
    (([1, 2], [1, 2], [4, 4]), {}, ValueError, r"seeds must be distinct, got \[4, 4\]"),
    (([1, 2], [1, 2], [0, 1.5]), {}, TypeError, r"seeds must hold ints, got float 1\.5"),
    (([1, 2], [1, 2]), {"better": "up"}, ValueError, r"better must be 'higher' or 'lower', got 'up'"),
    (([1, 2], [1, 2]), {"confidence": 95}, ValueError, r"confidence must be a number strictly between 0 and 1, got 95"),
    (([1, 2], [1, 2]), {"n_boot": 10}, ValueError, r"n_boot must be an int >= 100, got 10"),
    (([1, 2], [1, 2]), {"boot_seed": -1}, ValueError, r"boot_seed must be a non-negative int, got -1"),
    (([1, 2], [1, 2]), {"fmt": "%d"}, ValueError, r"fmt must be a valid float format spec such as '.2f', got '%d'"),
    (([1, 2], [1, 2]), {"a_name": 3}, TypeError, r"a_name must be a string, got int"),
])
def test_paired_arguments_are_checked(args, kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        paired(*args, **kwargs)


# --------------------------------------------------------------------------- censored


def test_km_median_by_hand():
    # 3, 5, 7+, 9: S(3) = 3/4, S(5) = 3/4 * 2/3 = 1/2 -> median 5 (smallest t with S(t) <= 1/2)
    assert km_median(np.array([3, 5, 7, 9]), np.array([True, True, False, True])) == 5.0
    # 2, 4+, 6, 8+, 10: S(2) = 4/5, S(6) = 4/5 * 2/3 = 8/15 > 1/2, S(10) = 0 -> median 10,
    # while the median of the reached times alone (2, 6, 10) would say 6
    assert km_median(np.array([2, 4, 6, 8, 10]), np.array([True, False, True, False, True])) == 10.0
    # no censoring: the lower middle value for even n, the middle one for odd n
    assert km_median(np.array([4, 1, 3, 2]), np.ones(4, bool)) == 2.0
    assert km_median(np.array([5, 1, 3]), np.ones(3, bool)) == 3.0
    assert km_median(np.array([1, 2]), np.zeros(2, bool)) is None


def test_kaplan_meier_curve_is_scipys():
    c = time_to_threshold([3, 5, 7, 9], 10, reached=[True, True, False, True])
    sf = c.km()
    np.testing.assert_allclose(sf.quantiles, [3, 5, 7, 9])
    np.testing.assert_allclose(sf.probabilities, [0.75, 0.5, 0.5, 0.0])


def test_time_to_threshold_censors_none_inf_and_nan_at_the_budget():
    c = time_to_threshold([290, None, 125, math.inf, 450, 300, 200, float("nan")], 500, threshold=0.99,
                          seeds=range(8))
    assert isinstance(c, Censored)
    assert (c.k, c.n) == (5, 8) and c.censored_seeds == (1, 3, 7)
    np.testing.assert_array_equal(c.times, [290, 500, 125, 500, 450, 300, 200, 500])
    # S drops by 1/8 at 125, 200, 290, 300: S(300) = 1/2 -> median 300
    assert c.median == 300.0
    assert c.reached_ci == pytest.approx(proportion_interval(5, 8))
    assert c.line() == ("5 of 8 seeds reached 0.99 by step 500 (95% CI 24% to 91%); "
                        "Kaplan-Meier median 300 steps (censored: seeds 1, 3, 7)")


def test_fewer_than_half_reached_gives_median_above_the_budget():
    c = time_to_threshold([100, None, None, None], 500, threshold=0.99)
    assert c.median is None and c.median_text == "> 500 steps"
    assert c.line() == ("1 of 4 seeds reached 0.99 by step 500 (95% CI 1% to 81%); Kaplan-Meier median "
                        "> 500 steps (censored: seeds 1, 2, 3); fewer than half reached it")
    c = time_to_threshold([math.inf] * 3, 400)
    assert (c.k, c.median, c.km()) == (0, None, None)
    assert c.line().startswith("0 of 3 seeds reached it by step 400 (95% CI 0% to 71%); Kaplan-Meier median > 400")


def test_reached_flags_allow_early_stops():
    c = time_to_threshold([3, 5, 7, 9], 10, reached=[True, True, False, True], seeds=[10, 11, 12, 13])
    assert c.median == 5.0
    assert c.line().endswith("Kaplan-Meier median 5 steps (censored: seed 12; stopped early: seed 12 at 7)")


def test_all_reached_and_events_tied_with_censoring_at_the_budget():
    c = time_to_threshold([100, 200, 300, 400], 400)
    assert c.median == 200.0 and "censored" not in c.line()
    # reached at exactly the budget counts as reached; events precede censorings at a tie
    c = time_to_threshold([400, 500, None, None], 500)
    assert c.median == 500.0


@pytest.mark.parametrize("args, kwargs, exc, msg", [
    (([1, 2], 0), {}, ValueError, r"budget must be a finite number > 0 .* got 0"),
    (([1, 2], math.inf), {}, ValueError, r"budget must be a finite number > 0 .* got inf"),
    (([1, 2], "500"), {}, ValueError, r"budget must be a finite number > 0 .* got '500'"),
    (([], 10), {}, ValueError, r"values must hold at least one run, got none"),
    ((5, 10), {}, TypeError, r"values must be a sequence of numbers, got int"),
    (([1, -2], 10), {}, ValueError, r"values must be >= 0 \(steps\), got \[-2\.0\]"),
    (([1, 20], 10), {"seeds": [4, 5]}, ValueError, r"values must be <= budget \(10\) .* got \[\(5, 20\.0\)\]"),
    (([1, 2], 10), {"reached": [True]}, ValueError, r"reached must have one flag per value \(2\), got 1"),
    (([1, 2], 10), {"reached": [1, 0]}, TypeError, r"reached\[0\] must be a bool, got int 1"),
    (([1, None], 10), {"reached": [True, False]}, ValueError, r"values must be finite steps when reached is given"),
    (([1, 12], 10), {"reached": [True, False]}, ValueError, r"values must be <= budget \(10\), got \[12\.0\]"),
    (([1, 2], 10), {"threshold": "0.99"}, TypeError, r"threshold must be a number or None, got str"),
    (([1, 2], 10), {"unit": 3}, TypeError, r"unit must be a string, got int"),
    (([1, 2], 10), {"fmt": 3}, TypeError, r"fmt must be a format spec string such as '.2f', got int"),
])
def test_time_to_threshold_arguments_are_checked(args, kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        time_to_threshold(*args, **kwargs)


def test_paired_comparison_is_a_frozen_record():
    c = paired([1, 2], [0, 0])
    assert isinstance(c, PairedComparison)
    with pytest.raises(Exception):
        c.n = 3
