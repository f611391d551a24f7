"""memalpha.intervals and memalpha_lab.seed_intervals against hand-computed numbers: closed forms
of the t distribution, intervals worked out by hand, and the seed-level interval and bootstrap over seeds."""

from __future__ import annotations

import math
import random

import pytest

from memalpha.intervals import incomplete_beta, mean_interval, paired_interval, t_cdf, t_quantile
from memalpha_lab.seed_intervals import (
    equivalence,
    paired_differences_by_seed,
    paired_differences_from_pairs,
    per_seed_means,
    percentile,
    python_uniforms,
    seed_bootstrap_interval,
    seed_interval,
    seed_level_change,
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
    assert ci["half_width"] == pytest.approx(3.18245 * 1.08012, abs=1e-4) and ci[
        "half_width"
    ] == pytest.approx(half)
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


# --- seed level -----------------------------------------------------------------------------------

T975_2 = 4.302652729911275  # t_{0.975, 2}


def test_per_seed_means_and_the_t_interval_over_three_seeds_by_hand():
    # seed means 0.1, 0.2, 0.6: mean 0.3, deviations -0.2, -0.1, 0.3, sum of squares 0.14, variance 0.07
    differences = {"0": [0.0, 0.2], "1": [0.1, 0.2, 0.3], "2": [0.6]}
    assert per_seed_means(differences) == pytest.approx({"0": 0.1, "1": 0.2, "2": 0.6})
    ci = seed_interval(differences)
    half = T975_2 * math.sqrt(0.07 / 3)
    assert ci["n"] == 3 and ci["df"] == 2 and ci["mean"] == pytest.approx(0.3)
    assert ci["half_width"] == pytest.approx(half) and half == pytest.approx(0.657241, abs=1e-6)
    assert (ci["low"], ci["high"]) == pytest.approx((0.3 - half, 0.3 + half))
    assert t_quantile(0.975, 2) == pytest.approx(T975_2, rel=1e-9)


def test_differences_are_paired_within_each_seed_from_tables_or_pairs():
    after = {"0": {"a": 1.0, "b": 0.5, "c": 0.0}, "1": {"a": 0.5, "b": 1.0}, "2": {"a": 0.0}}
    before = {"0": {"a": 0.5, "b": 0.5, "c": 0.5}, "1": {"a": 0.0, "b": 0.0, "c": 1.0}}
    # seed 2 has no "before" run: left out; seed 1 pairs a and b only
    assert paired_differences_by_seed(after, before) == {"0": [0.5, 0.0, -0.5], "1": [0.5, 1.0]}
    pairs = {0: [(1.0, 0.5), (0.5, 0.5)], 1: [(0.25, 0.0)]}
    assert paired_differences_from_pairs(pairs) == {0: [0.5, 0.0], 1: [0.25]}
    with pytest.raises(ValueError, match="share no instance"):
        paired_differences_by_seed({"0": {"a": 1.0}}, {"0": {"b": 1.0}})


def test_fewer_than_two_seeds_or_an_empty_seed_is_refused_by_name():
    with pytest.raises(ValueError, match=">= 2 seeds, got 1"):
        seed_interval({"0": [0.1, 0.2]})
    with pytest.raises(ValueError, match=">= 2 seeds, got 0"):
        seed_bootstrap_interval({})
    with pytest.raises(ValueError, match="seeds without any paired instance: '1'"):
        seed_level_change({"0": [0.1], "1": []})
    with pytest.raises(ValueError, match="resamples"):
        seed_bootstrap_interval({"0": [0.1], "1": [0.2]}, resamples=0)


def test_percentile_interpolates_between_order_statistics():
    ordered = [0.0, 1.0, 2.0, 10.0]
    assert percentile(ordered, 0.0) == 0.0 and percentile(ordered, 1.0) == 10.0
    assert percentile(ordered, 0.5) == pytest.approx(1.5)  # position 1.5
    assert percentile(ordered, 0.9) == pytest.approx(2.0 + 0.7 * 8.0)  # position 2.7
    assert percentile([3.0], 0.025) == 3.0
    with pytest.raises(ValueError):
        percentile([], 0.5)


def test_bootstrap_is_deterministic_for_a_seed_and_stays_within_what_resampling_can_reach():
    differences = {"0": [0.1, 0.3, 0.2, 0.0], "1": [0.5, 0.4], "2": [-0.2, 0.0, -0.1]}
    first = seed_bootstrap_interval(differences, resamples=500, seed=7)
    assert first == seed_bootstrap_interval(differences, resamples=500, seed=7)
    assert first != seed_bootstrap_interval(differences, resamples=500, seed=8)
    assert first["mean"] == pytest.approx((0.15 + 0.45 - 0.1) / 3)
    assert first["resamples"] == 500 and first["seed"] == 7 and first["n"] == 3
    # every draw is a mean of drawn differences: never below the smallest nor above the largest
    assert -0.2 <= first["low"] < first["mean"] < first["high"] <= 0.5
    # no spread anywhere: every draw is the one value
    flat = seed_bootstrap_interval({"a": [0.25, 0.25], "b": [0.25]}, resamples=50)
    assert flat["low"] == pytest.approx(0.25) and flat["high"] == pytest.approx(0.25)


def looped_bootstrap_statistics(differences: dict, resamples: int, seed: int) -> list[float]:
    """Every draw's statistic by the plain loop the bootstrap's docstring describes, sorted."""
    draw, groups, statistics = random.Random(seed).random, list(differences.values()), []
    for _ in range(resamples):
        total = 0.0
        for _ in range(len(groups)):
            values = groups[int(draw() * len(groups))]
            total += sum([values[int(draw() * len(values))] for _ in values]) / len(values)
        statistics.append(total / len(groups))
    return sorted(statistics)


def test_pythons_random_doubles_are_drawn_at_once():
    generator = random.Random(11)
    assert python_uniforms(11, 1000).tolist() == [generator.random() for _ in range(1000)]


@pytest.mark.parametrize("sizes", [(24, 24, 24), (30, 1, 17, 9)])
def test_the_bootstrap_draws_exactly_what_a_loop_over_random_draws(sizes):
    # seeds of equal and of unequal sizes: the vectorised draws are the loop's, double for double
    values = iter(math.sin(i) / 3 for i in range(1, 200))
    differences = {f"s{j}": [next(values) for _ in range(size)] for j, size in enumerate(sizes)}
    for level, seed in ((0.95, 0), (0.6, 4)):
        result = seed_bootstrap_interval(differences, level=level, resamples=300, seed=seed)
        looped = looped_bootstrap_statistics(differences, 300, seed)
        assert result["low"] == percentile(looped, (1 - level) / 2)
        assert result["high"] == percentile(looped, (1 + level) / 2)


def test_bootstrap_with_one_instance_a_seed_resamples_the_seed_means_only():
    # two seeds of one value each: a draw's mean is 0 (both draws seed a), 1 or 0.5,
    # with chances 1/4, 1/4, 1/2
    result = seed_bootstrap_interval({"a": [0.0], "b": [1.0]}, level=0.4, resamples=4000, seed=3)
    assert (result["low"], result["high"]) == (0.5, 0.5)  # the 30th and 70th percentiles fall on 0.5
    wide = seed_bootstrap_interval({"a": [0.0], "b": [1.0]}, level=0.9, resamples=4000, seed=3)
    assert (wide["low"], wide["high"]) == (0.0, 1.0)


def test_an_instance_interval_can_exclude_zero_while_the_seed_interval_holds_it():
    # within each seed the instances agree, but one seed of three goes the other way
    differences = {"0": [0.2, 0.3, 0.4], "1": [0.4, 0.3, 0.2], "2": [-0.1, -0.2, -0.3]}
    averaged = [sum(d[i] for d in differences.values()) / 3 for i in range(3)]  # 1/6, 2/15, 1/10
    instance_level = mean_interval(averaged)  # the pooled interval: instances averaged over seeds
    assert instance_level["mean"] == pytest.approx(2 / 15)
    assert instance_level["half_width"] == pytest.approx(T975_2 * (1 / 30) / math.sqrt(3))
    assert instance_level["low"] > 0  # [+0.050, +0.216]
    level = seed_level_change(differences)
    assert level["per_seed"] == pytest.approx({"0": 0.3, "1": 0.3, "2": -0.2})
    # seed means 0.3, 0.3, -0.2: mean 2/15, variance ((1/6)^2 * 2 + (1/3)^2) / 2 = 1/12
    assert level["t"]["mean"] == pytest.approx(2 / 15)
    assert level["t"]["half_width"] == pytest.approx(T975_2 * math.sqrt(1 / 12 / 3))
    assert level["t"]["low"] < 0 < level["t"]["high"]  # [-0.584, +0.851]
    assert level["bootstrap"]["low"] < 0 < level["bootstrap"]["high"]
