"""Student t confidence intervals: the t quantile, and the one-sample and paired intervals
``memalpha compare`` gives a change between two validation reports (:mod:`memalpha.train.instance_scores`).

Pure functions over lists of floats, with no dependency beyond :mod:`math`. The t distribution's
CDF is written through the regularized incomplete beta function,
``P(T <= t) = 1 - I_x(df/2, 1/2) / 2`` for ``t >= 0`` with ``x = df / (df + t^2)``; the
incomplete beta is evaluated with its continued fraction (modified Lentz iteration), and the
quantile is found by bisection on the CDF, which is monotone, so it works for non-integer
degrees of freedom too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

_TINY = 1e-300
_EPS = 1e-15
_MAX_TERMS = 500


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction ``1 / (1 + d1 / (1 + d2 / (1 + ...)))`` of ``I_x(a, b)``, with
    ``d(2m+1) = -(a+m)(a+b+m)x / ((a+2m)(a+2m+1))`` and ``d(2m) = m(b-m)x / ((a+2m-1)(a+2m))``;
    converges fast for ``x < (a+1)/(a+b+2)``."""
    c = 1.0
    d = 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    fraction = d
    for m in range(1, _MAX_TERMS + 1):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            fraction *= c * d
        if abs(c * d - 1.0) < _EPS:
            return fraction
    raise ArithmeticError(f"incomplete beta: no convergence for a={a}, b={b}, x={x}")


def incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` for ``0 <= x <= 1``, ``a, b > 0``."""
    if a <= 0 or b <= 0:
        raise ValueError(f"a and b must be > 0, got {a}, {b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = a * math.log(x) + b * math.log1p(-x) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df > 0`` degrees of freedom (not necessarily whole)."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if df > 1e7:  # the normal distribution to about 1e-7, where the continued fraction loses digits
        return 0.5 * math.erfc(-t / math.sqrt(2.0))
    tail = 0.5 * incomplete_beta(df / (df + t * t), df / 2.0, 0.5)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df > 0`` degrees of freedom: bisection on
    :func:`t_cdf` to a relative precision of about 1e-12."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
        if high > 1e12:
            raise ArithmeticError(f"t quantile out of range for p={p}, df={df}")
    while high - low > 1e-12 * high:
        middle = 0.5 * (low + high)
        if t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


def sample_variance(values: Sequence[float], mean: float) -> float:
    """The unbiased sample variance of ``values`` around their ``mean`` (``n - 1`` in the denominator)."""
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def mean_interval(values: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """``{mean, half_width, low, high, n}``: the mean and its two-sided ``level`` t interval
    (``n - 1`` degrees of freedom; half width 0 for one value: there is no spread to estimate)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = sum(values) / n
    half = 0.0
    if n > 1:
        half = t_quantile(0.5 + level / 2.0, n - 1) * math.sqrt(sample_variance(values, mean) / n)
    return {"mean": mean, "half_width": half, "low": mean - half, "high": mean + half, "n": n}


def paired_interval(after: Sequence[float], before: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """:func:`mean_interval` of ``after[i] - before[i]`` (the same units measured twice)."""
    if len(after) != len(before):
        raise ValueError(f"paired values differ in number: {len(after)} and {len(before)}")
    return mean_interval([a - b for a, b in zip(after, before, strict=True)], level)
