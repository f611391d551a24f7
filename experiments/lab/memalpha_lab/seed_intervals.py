"""The studies' intervals beyond a single validation: Welch's interval and the equivalence verdict
of the parity checks, and the seed-level estimates of a paired change (a t interval over seeds and
a two-level bootstrap over seeds, then instances) that the pre-registered studies read.

Built on :mod:`memalpha.intervals` (the t quantile and the one-sample interval); pure functions
over lists of floats.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from memalpha.intervals import mean_interval, sample_variance, t_quantile


def welch_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """Welch's interval of ``mean(a) - mean(b)`` for two independent samples of unequal variance.

    ``se = sqrt(s_a^2/n_a + s_b^2/n_b)``, the Welch–Satterthwaite degrees of freedom
    ``df = se^4 / ((s_a^2/n_a)^2/(n_a-1) + (s_b^2/n_b)^2/(n_b-1))`` and the half width
    ``t_quantile(0.5 + level/2, df) * se``. Both samples need two values or more; when both have
    no spread at all the half width is 0 and ``df`` is ``n_a + n_b - 2``.
    """
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's interval needs >= 2 values a side, got {len(a)} and {len(b)}")
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    share_a, share_b = sample_variance(a, mean_a) / len(a), sample_variance(b, mean_b) / len(b)
    se = math.sqrt(share_a + share_b)
    if se == 0.0:
        df, half = float(len(a) + len(b) - 2), 0.0
    else:
        df = (share_a + share_b) ** 2 / (share_a**2 / (len(a) - 1) + share_b**2 / (len(b) - 1))
        half = t_quantile(0.5 + level / 2.0, df) * se
    difference = mean_a - mean_b
    return {
        "difference": difference, "half_width": half, "low": difference - half, "high": difference + half,
        "se": se, "df": df, "mean_a": mean_a, "mean_b": mean_b, "n_a": len(a), "n_b": len(b), "level": level,
    }


def equivalence(low: float, high: float, margin: float) -> dict[str, Any]:
    """The verdict on a difference whose interval is ``[low, high]`` against ``±margin``.

    ``equivalent``: the whole interval lies inside ``(-margin, margin)`` (two one-sided tests at
    the interval's level: a 95 % interval is TOST at 2.5 % each side); ``different``: it is not,
    and it excludes 0; ``inconclusive``: neither (the interval straddles 0 and a margin: too few
    data to say). ``passes`` is ``verdict == "equivalent"``.
    """
    if margin <= 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    if low > high:
        raise ValueError(f"interval low {low} above high {high}")
    if -margin < low and high < margin:
        verdict = "equivalent"
    elif low > 0 or high < 0:
        verdict = "different"
    else:
        verdict = "inconclusive"
    return {"verdict": verdict, "passes": verdict == "equivalent", "margin": margin, "low": low, "high": high}


# --- seed-level estimates of a paired change ------------------------------------------------------
#
# A training run is one draw of a random process (its seed sets the data order, the sampled
# rollouts, the initial noise), so a change measured over the held-out instances of a few runs has
# two sources of variation: the instances, and the runs. An interval over instances alone — even one
# whose instance scores are first averaged over the runs — treats the runs as fixed and answers
# "on these instances, under these runs"; the functions below answer "for a new run of the recipe":
# each seed contributes its own paired mean change, and the interval is over seeds.

BOOTSTRAP_RESAMPLES = 4000
"""The default number of two-level bootstrap resamples of :func:`seed_bootstrap_interval`: on the
committed lever-against-control fact recall (3 seeds x 48 instances) the bounds' standard deviation
over random seeds is about 0.003, a hundredth of the interval's width."""
BOOTSTRAP_SEED = 0
"""The default seed of the bootstrap's ``random.Random``: the same input gives the same interval."""


def paired_differences_by_seed(
    after: Mapping[Hashable, Mapping[Hashable, float]], before: Mapping[Hashable, Mapping[Hashable, float]]
) -> dict[Hashable, list[float]]:
    """``{seed: [after - before, ...]}`` from two ``{seed: {instance: score}}`` tables.

    Per seed, the differences over the instances both tables hold under that seed, in sorted
    instance order. A seed only one table holds is left out (its run of the other arm is
    missing); a seed that shares no instance raises ValueError.
    """
    out: dict[Hashable, list[float]] = {}
    for seed in sorted(after.keys() & before.keys(), key=str):
        shared = sorted(after[seed].keys() & before[seed].keys(), key=str)
        if not shared:
            raise ValueError(f"seed {seed!r}: the two tables share no instance")
        out[seed] = [after[seed][k] - before[seed][k] for k in shared]
    return out


def paired_differences_from_pairs(
    pairs: Mapping[Hashable, Sequence[tuple[float, float]]],
) -> dict[Hashable, list[float]]:
    """``{seed: [after - before, ...]}`` from ``{seed: [(after, before), ...]}``."""
    return {seed: [a - b for a, b in seed_pairs] for seed, seed_pairs in pairs.items()}


def _checked_seeds(differences: Mapping[Hashable, Sequence[float]]) -> None:
    if len(differences) < 2:
        raise ValueError(
            f"a seed-level interval needs paired differences of >= 2 seeds, got {len(differences)}"
            f" ({', '.join(map(repr, differences)) or 'none'}): a spread over seeds needs two runs"
        )
    empty = [seed for seed, values in differences.items() if len(values) == 0]
    if empty:
        raise ValueError(f"seeds without any paired instance: {', '.join(map(repr, empty))}")


def per_seed_means(differences: Mapping[Hashable, Sequence[float]]) -> dict[Hashable, float]:
    """``{seed: mean of its paired differences}``, the per-seed paired mean change."""
    empty = [seed for seed, values in differences.items() if len(values) == 0]
    if empty:
        raise ValueError(f"seeds without any paired instance: {', '.join(map(repr, empty))}")
    return {seed: sum(values) / len(values) for seed, values in differences.items()}


def seed_interval(differences: Mapping[Hashable, Sequence[float]], level: float = 0.95) -> dict[str, float]:
    """The t interval over seeds of the per-seed paired mean changes.

    ``{mean, half_width, low, high, n, df}`` of :func:`mean_interval` over :func:`per_seed_means`
    (``n`` seeds, ``df = n - 1``): each seed counts once whatever its number of instances, so the
    run-to-run variation is the spread. Needs two seeds or more.
    """
    _checked_seeds(differences)
    interval = mean_interval(list(per_seed_means(differences).values()), level)
    return {**interval, "df": interval["n"] - 1}


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile (``0 <= q <= 1``) of values sorted ascending, interpolated linearly between
    the order statistics at ``q * (n - 1)`` (the usual "type 7" definition)."""
    if not ordered:
        raise ValueError("no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (position - below) * (ordered[above] - ordered[below])


def python_uniforms(seed: int, count: int) -> np.ndarray:
    """The first ``count`` values of ``random.Random(seed).random()``, drawn at once by NumPy's MT19937
    set to the same state (both make a double of two 32-bit words the same way)."""
    _, state, _ = random.Random(seed).getstate()
    generator = np.random.RandomState()
    generator.set_state(("MT19937", np.array(state[:-1], dtype=np.uint32), state[-1]))
    return generator.random_sample(count)


def seed_bootstrap_interval(
    differences: Mapping[Hashable, Sequence[float]],
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, float]:
    """The two-level bootstrap percentile interval of the mean over seeds of the per-seed changes.

    Each of ``resamples`` draws picks as many seeds as there are, with replacement; for each seed
    drawn, as many of its instances as it holds, with replacement; and takes the mean over the drawn
    seeds of the mean of each one's drawn differences — the statistic :func:`seed_interval` centres
    on. ``low`` and ``high`` are the ``(1 - level) / 2`` and ``(1 + level) / 2`` percentiles
    (:func:`percentile`) of the draws; ``mean`` is the statistic on the data. ``random.Random(seed)``
    draws every index (as ``int(random() * n)``), so one input gives one interval.

    With few seeds the seed level can only recombine the seeds seen: the interval cannot reach past
    the lowest and highest per-seed change by more than their instance noise, so with 3 seeds it is
    usually much narrower than the t interval over seeds, which is the one to read first. The seeds
    are drawn in the mapping's order, so reorder it and the draws (not their distribution) change.
    """
    _checked_seeds(differences)
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    groups = list(differences.values())
    k = len(groups)
    sizes = np.array([len(values) for values in groups], dtype=np.int64)
    width = int(sizes.max())
    table = np.zeros((k, width))
    for row, values in enumerate(groups):
        table[row, : len(values)] = values
    # random.Random(seed)'s own doubles, drawn at once: a draw uses 1 + the drawn seed's size of them
    uniforms = python_uniforms(seed, resamples * k * (1 + width))
    # where each drawn seed's draws start, which depends on the sizes of the seeds drawn before it
    uniform, sizes_of, picks, starts, at = uniforms.item, sizes.tolist(), [], [], 0
    for _ in range(resamples * k):
        pick = int(uniform(at) * k)
        picks.append(pick)
        starts.append(at + 1)
        at += 1 + sizes_of[pick]
    picks = np.array(picks, dtype=np.int64).reshape(resamples, k)
    starts = np.array(starts, dtype=np.int64).reshape(resamples, k)
    drawn = sizes[picks]  # (resamples, k): how many instances each drawn seed draws
    slots = np.arange(width)
    positions = np.minimum(starts[..., None] + slots, len(uniforms) - 1)  # a short seed's slots past its end
    instances = (uniforms[positions] * drawn[..., None]).astype(np.int64)  # < drawn <= width
    values = np.where(slots < drawn[..., None], table[picks[..., None], instances], 0.0)
    # left-to-right sums (cumsum), as a plain loop adds: the same doubles, so one input, one interval
    seed_means = np.cumsum(values, axis=2)[..., -1] / drawn
    statistics = (np.cumsum(seed_means, axis=1)[:, -1] / k).tolist()
    statistics.sort()
    return {
        "mean": sum(per_seed_means(differences).values()) / k,
        "low": percentile(statistics, (1.0 - level) / 2.0),
        "high": percentile(statistics, (1.0 + level) / 2.0),
        "n": k,
        "resamples": resamples,
        "seed": seed,
        "level": level,
    }


def seed_level_change(
    differences: Mapping[Hashable, Sequence[float]],
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, Any]:
    """Everything the seed level says about one paired comparison, from ``{seed: [differences]}``:
    ``{"per_seed": {seed: mean change}, "t": seed_interval(...),
    "bootstrap": seed_bootstrap_interval(...)}``."""
    return {
        "per_seed": per_seed_means(differences),
        "t": seed_interval(differences, level),
        "bootstrap": seed_bootstrap_interval(differences, level, resamples, seed),
    }
