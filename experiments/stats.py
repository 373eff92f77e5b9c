"""Confidence intervals over seeds: Student-t intervals of a mean and of a paired difference.

Seeds are the samples. With n seeds the 95% interval of the mean is
``mean ± t_{0.975, n-1} · s / sqrt(n)`` (``s`` the sample standard deviation); the paired
difference of two strategies uses the per-seed differences (same seeds, so the shared data split
and initialisation cancel out). One seed gives no interval (NaN half-width).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy.stats import t as student_t

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` samples with its two-sided Student-t confidence interval."""

    mean: float
    half_width: float  # NaN when n < 2
    n: int
    std: float  # sample standard deviation (NaN when n < 2)

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    @property
    def excludes_zero(self) -> bool:
        """The interval lies wholly above or below 0 (False without an interval)."""
        return not math.isnan(self.half_width) and (self.low > 0 or self.high < 0)


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean of ``values`` and the half-width of its Student-t interval (n - 1 degrees of freedom)."""
    n = len(values)
    if n == 0:
        raise ValueError("t_interval needs at least one value")
    mean = statistics.fmean(values)
    if n < 2:
        return Interval(mean, math.nan, n, math.nan)
    std = statistics.stdev(values)
    quantile = float(student_t.ppf(0.5 + confidence / 2, n - 1))
    return Interval(mean, quantile * std / math.sqrt(n), n, std)


@dataclass(frozen=True)
class Paired:
    """``a - b`` over the seeds both have."""

    difference: Interval
    seeds: tuple[int, ...]


def paired_difference(
    a: Mapping[int, float], b: Mapping[int, float], confidence: float = CONFIDENCE
) -> Paired | None:
    """Per-seed differences ``a[s] - b[s]`` over the seeds both have, and their t-interval;
    None when they share no seed."""
    seeds = tuple(sorted(set(a) & set(b)))
    if not seeds:
        return None
    return Paired(t_interval([a[s] - b[s] for s in seeds], confidence), seeds)
