"""Confidence intervals over seeds: Student-t intervals of a mean and of a paired difference.

Seeds are the samples. With n seeds the 95% interval of the mean is
``mean ± t_{0.975, n-1} · s / sqrt(n)`` (``s`` the sample standard deviation); the paired
difference of two strategies uses the per-seed differences (same seeds, so the shared data split
and initialisation cancel out). One seed gives no interval (NaN half-width).

Shown to a user (:func:`interval_cell`, :func:`clipped`), an interval never leaves the range its
quantity can take ([0, 1] for an accuracy): a Student-t interval is symmetric and can cross a
bound, so a clipped one is written as its ends, not as a ± that would reach past the bound. An
interval of zero width (every seed gave the same value) is written as that, not as "± 0.0000".
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


def clipped(
    low: float, high: float, bounds: tuple[float, float] = (0.0, 1.0)
) -> tuple[float, float]:
    """``[low, high]`` cut to ``bounds`` (what the quantity can be)."""
    return max(low, bounds[0]), min(high, bounds[1])


def interval_cell(i: Interval | None, bounds: tuple[float, float] = (0.0, 1.0)) -> str:
    """A table cell: "0.8150 ± 0.0329"; "0.8150 [0.5821, 1.0000]" when the interval crosses
    ``bounds`` (clipped); "0.1000 (every seed)" when every seed gave that value (to 4
    decimals); "0.8150" from one seed; "—" for none."""
    if i is None:
        return "—"
    if math.isnan(i.half_width):
        return f"{i.mean:.4f}"
    if f"{i.half_width:.4f}" == f"{0.0:.4f}":  # no spread at the precision shown
        return f"{i.mean:.4f} (every seed)"
    low, high = clipped(i.low, i.high, bounds)
    if (low, high) != (i.low, i.high):
        return f"{i.mean:.4f} [{low:.4f}, {high:.4f}]"
    return f"{i.mean:.4f} ± {i.half_width:.4f}"


def points(value: float) -> str:
    """A difference of the objective in points (100 x), signed: "+0.6"."""
    return f"{100 * value:+.1f}"


def difference_cell(mean: float, low: float, high: float, unit: str = "") -> str:
    """A difference with its interval, in points (``unit`` after the mean, e.g. " points"):
    "+0.6 [+0.1, +1.1]", the ends clipped to [-1, 1] (two accuracies differ by at most that);
    "tie: +0.0 on every seed" or "+2.0 on every seed" when the interval has no width at the
    precision shown (the same difference on every seed, to 0.1 points)."""
    if points(low) == points(high):  # no spread to 0.1 points
        said = f"{points(mean)}{unit} on every seed"
        return f"tie: {said}" if points(abs(mean)) == points(0.0) else said
    low, high = clipped(low, high, (-1.0, 1.0))
    return f"{points(mean)}{unit} [{points(low)}, {points(high)}]"


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
