"""memalpha.intervals against hand-computed numbers: closed forms of the t distribution and
intervals worked out by hand."""

from __future__ import annotations

import math

import pytest

from memalpha.intervals import (
    equivalence,
    incomplete_beta,
    mean_interval,
    paired_interval,
    t_cdf,
    t_quantile,
    welch_interval,
)


def test_incomplete_beta_matches_its_binomial_sum():
    # I_x(2, 3) = P(Binomial(4, x) >= 2) = 6x^2(1-x)^2 + 4x^3(1-x) + x^4
    for x in (0.05, 0.3, 0.5, 0.8, 0.99):
        expected = 6 * x**2 * (1 - x) ** 2 + 4 * x**3 * (1 - x) + x**4
        assert incomplete_beta(x, 2, 3) == pytest.approx(expected, abs=1e-12)
    assert incomplete_beta(0.0, 2, 3) == 0.0 and incomplete_beta(1.0, 2, 3) == 1.0
    with pytest.raises(ValueError):
        incomplete_beta(0.5, 0, 1)


def test_t_cdf_and_quantile_match_the_closed_forms_for_one_and_two_degrees_of_freedom():
    for p in (0.6, 0.9, 0.95, 0.975, 0.995):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)  # Cauchy
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9)
    assert t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-12)  # 1/2 + atan(1)/pi
    assert t_cdf(-1.0, 2) == pytest.approx(0.5 - 0.5 / math.sqrt(3), abs=1e-12)  # 1/2 + t/(2 sqrt(2 + t^2))
    assert t_quantile(0.025, 2) == pytest.approx(-t_quantile(0.975, 2)) and t_quantile(0.5, 7) == 0.0


def test_t_quantile_matches_the_printed_table_and_tends_to_the_normal():
    table = {3: 3.182, 4: 2.776, 6: 2.447, 10: 2.228, 30: 2.042, 120: 1.980}
    for df, value in table.items():
        assert t_quantile(0.975, df) == pytest.approx(value, abs=6e-4)
    assert t_quantile(0.975, math.inf) == pytest.approx(1.959964, abs=1e-6)
    assert t_quantile(0.975, 1e12) == pytest.approx(1.959964, abs=1e-6)
    assert t_quantile(0.975, 6.5) < t_quantile(0.975, 6) and t_quantile(0.975, 6.5) > t_quantile(0.975, 7)
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError):
        t_cdf(0.0, 0)


def test_mean_interval_by_hand():
    # 1, 2, 3, 6: mean 3, sample variance 14/3, t(0.975, 3) = 3.18245
    ci = mean_interval([1.0, 2.0, 3.0, 6.0])
    half = t_quantile(0.975, 3) * math.sqrt(14 / 3 / 4)
    assert ci["mean"] == 3.0 and ci["n"] == 4
    assert ci["half_width"] == pytest.approx(3.18245 * 1.08012, abs=1e-4) and ci["half_width"] == pytest.approx(half)
    assert (ci["low"], ci["high"]) == pytest.approx((3 - half, 3 + half))
    assert mean_interval([0.25])["half_width"] == 0.0
    with pytest.raises(ValueError):
        mean_interval([])


def test_paired_interval_is_the_interval_of_the_differences():
    # differences 1, 0, 1, 2: mean 1, variance 2/3, half width t(3) * sqrt(2/3 / 4) = 3.18245 * 0.40825
    ci = paired_interval([2.0, 2.0, 4.0, 6.0], [1.0, 2.0, 3.0, 4.0])
    assert ci["mean"] == 1.0 and ci["half_width"] == pytest.approx(1.29923, abs=1e-4)
    with pytest.raises(ValueError):
        paired_interval([1.0], [1.0, 2.0])


def test_welch_interval_by_hand():
    # a = 1..4: mean 2.5, s^2 5/3, s^2/n 5/12; b = 2, 4, 6: mean 4, s^2 4, s^2/n 4/3
    # se^2 = 5/12 + 4/3 = 7/4; df = (7/4)^2 / ((5/12)^2/3 + (4/3)^2/2) = 3.0625 / 0.946759 = 3.23472
    w = welch_interval([1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0])
    assert w["difference"] == -1.5 and w["se"] == pytest.approx(math.sqrt(1.75))
    assert w["df"] == pytest.approx(3.23472, abs=1e-5)
    assert w["half_width"] == pytest.approx(t_quantile(0.975, w["df"]) * math.sqrt(1.75))
    assert 2.776 < t_quantile(0.975, w["df"]) < 3.182  # between t(4) and t(3)
    assert (w["low"], w["high"]) == pytest.approx((-1.5 - w["half_width"], -1.5 + w["half_width"]))
    same = welch_interval([1.0, 1.0], [1.0, 1.0, 1.0])
    assert same["half_width"] == 0.0 and same["df"] == 3.0
    with pytest.raises(ValueError):
        welch_interval([1.0], [1.0, 2.0])


def test_equal_variances_and_sizes_give_the_pooled_degrees_of_freedom():
    # equal n and equal s^2: Welch's df is 2(n - 1), its se the pooled one
    w = welch_interval([0.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0])
    assert w["df"] == pytest.approx(6.0) and w["se"] == pytest.approx(math.sqrt(2 * (5 / 3) / 4))
    assert w["half_width"] == pytest.approx(2.446912 * math.sqrt(5 / 6), abs=1e-5)


def test_equivalence_verdicts():
    assert equivalence(-0.05, 0.08, 0.1)["verdict"] == "equivalent"
    assert equivalence(-0.05, 0.08, 0.1)["passes"] is True
    assert equivalence(-0.15, 0.08, 0.1)["verdict"] == "inconclusive"  # straddles 0 and -margin
    assert equivalence(0.02, 0.3, 0.1)["verdict"] == "different"
    assert equivalence(-0.3, -0.11, 0.1)["verdict"] == "different"
    assert equivalence(-0.1, 0.05, 0.1)["passes"] is False  # the margin itself is outside
    with pytest.raises(ValueError):
        equivalence(0.0, 0.1, 0.0)
