"""The race's elimination rule: pure functions, no I/O.

**The layout.** After a round every surviving candidate has the same seeds (a seed gives every
candidate the same data subset and initialisation), so the objective values form a complete
two-way table, candidates x seeds. The additive model ``y[k, s] = mu_k + b_s + e[k, s]``
removes what a seed does to every candidate alike (``b_s``); the residual variance pooled over
the whole table, ``s^2 = SSE / ((m - 1)(n - 1))`` for ``m`` survivors and ``n`` seeds, is the
noise of one observation, and a paired difference of two candidates' means has standard error
``SE = s * sqrt(2 / n)``.

**One look: multiple comparisons with the best** (Hsu 1984, "Constrained simultaneous confidence
intervals for multiple comparisons with the best"). The round's leader is the candidate with the
highest mean; candidate ``k`` is eliminated when ``mean_leader - mean_k > d * SE``, where ``d``
is the one-sided Dunnett critical value for ``m - 1`` comparisons (equicorrelated, rho = 1/2)
with ``(m - 1)(n - 1)`` degrees of freedom at the look's level ``a_r``. Under the additive model
with normal, equal-variance noise this keeps the truly best candidate with probability at least
``1 - a_r`` whatever the other means are: it is eliminated only if some candidate's mean error
beats its own by more than ``d * SE``, which is exactly the Dunnett event.

**The repeated looks: alpha spent across the rounds that can happen.** A race looks after every
round, so the chances to drop the best add up (a naive race, paired t-tests at 0.05 after every
round, dropped a candidate at 5 seeds that 10 seeds could not separate). Before the first round
the race knows how many rounds it can have at most, ``R`` (:func:`rounds_possible`), and spends
``alpha`` across them by Bonferroni: round ``r`` gets ``a_r = alpha * (1/r) / H_R`` (``H_R``
the R-th harmonic number), so ``sum a_r = alpha``. The split leans early because an elimination
in round ``r`` saves up to ``R - r`` later runs, and later looks lose little to a small level
(their degrees of freedom are larger, and a normal quantile grows only like
``sqrt(2 log(1/a))``).

**The certificate: how much a choice could lose** (Hsu's MCB lower bounds, 1984, section 2).
Let ``b`` be the truly best of the survivors, and ``E`` the event that no survivor's mean error
beats ``b``'s by more than ``d * SE``: ``(ybar_j - mu_j) - (ybar_b - mu_b) < d * SE`` for every
``j != b``. ``E`` is the very event the look's elimination guarantee rests on, so it holds with
probability at least ``1 - a_r``. On ``E``, for *every* candidate ``a`` at once,

    max_j mu_j - mu_a  <=  C(a) = max(0, max_{j != a} ybar_j - ybar_a + d * SE),

since for ``a != b``: ``ybar_b - ybar_a + d * SE > mu_b - mu_a``. ``C(a)`` is the
:func:`certificate`: the most by which any candidate could beat ``a`` at the look's confidence.
Because it holds for every ``a`` simultaneously, it stays valid for an ``a`` chosen from the
data (the leader, or the first of a preference list within ``delta`` of it). Over the race the
looks' events fail with total probability at most ``sum a_r = alpha`` (the union bound above),
so the certificate of the look the race stops at is valid at level ``alpha`` however the data
chose that look: stopping "as soon as the certificate is within delta" is one more
data-dependent stop the union bound already covers. On ``E`` the best is never eliminated, so
the survivors' certificate covers the eliminated candidates too. Assumptions: the candidates are
paired by seed, the paired differences are normal, and the residual variance is one for all
candidates (pooled); unequal per-candidate variances are outside the proof and measured in
:mod:`experiments.race.simulate`. With one survivor ``C = 0``; ``C(leader) = 0`` exactly when
every other survivor is eliminated, so ``delta = 0`` is today's rule.

**What is and is not proved.** Each look's guarantee is exact for a fixed set of candidates; the
union bound makes the total at most ``alpha``. That the survivors of a look are chosen by the
earlier looks of the same seeds is not covered by the proof, and the noise is assumed normal with
one variance for every candidate (pooling is what buys power at 3 seeds; a best candidate much
noisier than the rest is the case it serves worst). :mod:`experiments.race.simulate` measures the
total error and the power on simulated races; ``tests/test_race_rule.py`` checks them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr, roots_hermite, roots_legendre
from scipy.stats import chi2


def rounds_possible(
    candidates: int, min_seeds: int, max_seeds: int, max_runs: int | None = None
) -> int:
    """The most rounds a race can have: round 1 runs ``candidates * min_seeds`` jobs and each
    later round adds one seed to each of at least 2 survivors (a race with one survivor stops),
    until ``max_seeds`` seeds or ``max_runs`` jobs. Raises ValueError for a race that cannot
    start (fewer than 2 candidates, fewer than 2 seeds, a budget below round 1)."""
    if candidates < 2:
        raise ValueError(f"a race needs at least 2 candidates, got {candidates}")
    if min_seeds < 2:
        raise ValueError(f"min_seeds must be >= 2 (one seed has no variance), got {min_seeds}")
    if max_seeds < min_seeds:
        raise ValueError(f"max_seeds={max_seeds} is below min_seeds={min_seeds}")
    later = max_seeds - min_seeds
    if max_runs is not None:
        first = candidates * min_seeds
        if max_runs < first:
            raise ValueError(
                f"max_runs={max_runs} cannot pay for round 1 ({candidates} candidates x "
                f"{min_seeds} seeds = {first} runs)"
            )
        later = min(later, (max_runs - first) // 2)
    return 1 + later


def spending(alpha: float, rounds: int) -> tuple[float, ...]:
    """The level of each of ``rounds`` looks: ``alpha * (1/r) / H_rounds``, summing to alpha."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if rounds < 1:
        raise ValueError(f"a race has at least one round, got {rounds}")
    weights = 1.0 / np.arange(1, rounds + 1)
    return tuple(float(a) for a in alpha * weights / weights.sum())


# The one-sided Dunnett probability, P(max_j (Z_j - Z_0) > d * sqrt(2) * U) with Z iid normal
# and U^2 ~ chi2(df)/df, is E over U and Z_0 of 1 - Phi(Z_0 + sqrt(2) d U)^p: Gauss-Hermite
# over Z_0 and Gauss-Legendre panels over the chi2 quantile of U (the panels near 0 carry the
# heavy tail of small df). The complement is computed as -expm1(p * log Phi), without
# cancellation, so levels down to 1e-5 keep ~6 digits (checked against Student t for p = 1).
_Z, _ZW = roots_hermite(64)
_Z, _ZW = math.sqrt(2) * _Z, _ZW / math.sqrt(math.pi)


def _panels(nodes: int, edges: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    x, w = roots_legendre(nodes)
    q = [lo + (x + 1) / 2 * (hi - lo) for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
    qw = [w / 2 * (hi - lo) for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
    return np.concatenate(q), np.concatenate(qw)


_Q, _QW = _panels(48, (0.0, 1e-5, 1e-3, 0.05, 1.0))


@lru_cache(maxsize=64)
def _scale(df: int) -> np.ndarray:
    return np.sqrt(chi2.ppf(_Q, df) / df)


def mcb_exceedance(d: float, comparators: int, df: int) -> float:
    """P(the best is out-scored by more than ``d`` standard errors by one of ``comparators``
    equally good candidates), with a pooled variance on ``df`` degrees of freedom."""
    u = _scale(df)
    shifted = _Z[None, :] + math.sqrt(2) * d * u[:, None]
    inner = (_ZW[None, :] * -np.expm1(comparators * log_ndtr(shifted))).sum(axis=1)
    return float((_QW * inner).sum())


@lru_cache(maxsize=4096)
def mcb_critical(level: float, comparators: int, df: int) -> float:
    """The one-sided Dunnett critical value ``d``: ``mcb_exceedance(d, comparators, df) ==
    level`` (for one comparator, Student's t quantile ``t_{1-level, df}``)."""
    if not 0 < level < 1 or comparators < 1 or df < 1:
        raise ValueError(f"mcb_critical({level}, {comparators}, {df})")
    high = 1.0
    while mcb_exceedance(high, comparators, df) > level:
        high *= 2
    return float(
        brentq(
            lambda d: math.log(max(mcb_exceedance(d, comparators, df), 1e-300)) - math.log(level),
            0.0,
            high,
            xtol=1e-10,
        )
    )


@dataclass(frozen=True)
class Look:
    """One look at a batch of ``B`` races with ``K`` candidate slots and ``n`` seeds each.

    Arrays are indexed ``[race]`` or ``[race, candidate]``; a candidate that is not alive has
    ``eliminated`` False and meaningless numbers."""

    n: int
    level: float
    alive: np.ndarray  # (B, K) the survivors the look compared
    means: np.ndarray  # (B, K) mean objective over the n seeds
    leader: np.ndarray  # (B,) index of the highest mean among the alive (first on ties)
    df: np.ndarray  # (B,) (m - 1)(n - 1)
    se: np.ndarray  # (B,) standard error of a paired difference of two means
    critical: np.ndarray  # (B,) d at the look's level for m - 1 comparators (inf when m < 2)
    eliminated: np.ndarray  # (B, K) out at this look

    @property
    def difference(self) -> np.ndarray:
        """(B, K) mean minus the leader's mean (<= 0)."""
        return self.means - self.means[np.arange(len(self.leader)), self.leader][:, None]

    @property
    def margin(self) -> np.ndarray:
        """(B,) half-width of the race interval on a difference to the leader: ``d * SE``. A
        candidate is out exactly when its interval, difference +- margin, lies below 0."""
        margin = np.full(len(self.se), np.inf)
        finite = np.isfinite(self.critical)
        margin[finite] = self.critical[finite] * self.se[finite]
        return margin


def look(values: np.ndarray, alive: np.ndarray, level: float) -> Look:
    """Apply the rule once: ``values`` (B, K, n) objective values (higher is better; rows that
    are not alive are ignored and may hold anything finite), ``alive`` (B, K) the survivors,
    ``level`` the look's share of alpha (:func:`spending`). Races with fewer than 2 survivors
    eliminate nothing."""
    values = np.asarray(values, dtype=float)
    alive = np.asarray(alive, dtype=bool)
    races, _, n = values.shape
    if n < 2:
        raise ValueError(f"a look needs at least 2 seeds, got {n}")
    y = np.where(alive[:, :, None], values, 0.0)
    m = alive.sum(axis=1)
    size = np.maximum(m, 1)
    means = y.mean(axis=2)
    seed_means = y.sum(axis=1) / size[:, None]
    grand = (means * alive).sum(axis=1) / size
    residual = (y - means[:, :, None] - seed_means[:, None, :] + grand[:, None, None]) * alive[
        :, :, None
    ]
    df = (m - 1) * (n - 1)
    sse = (residual**2).sum(axis=(1, 2))
    se = np.sqrt(sse / np.maximum(df, 1)) * math.sqrt(2.0 / n)
    leader = np.where(alive, means, -np.inf).argmax(axis=1)
    critical = np.full(races, np.inf)
    for size_ in np.unique(m[m >= 2]):
        critical[m == size_] = mcb_critical(level, int(size_) - 1, int(size_ - 1) * (n - 1))
    lead = means[np.arange(races), leader]
    # A difference larger than d * SE; with SE = 0 (the additive model fits exactly) any
    # strictly lower mean is out.
    margin = np.full(races, np.inf)
    finite = np.isfinite(critical)
    margin[finite] = critical[finite] * se[finite]
    eliminated = alive & (lead[:, None] - means > margin[:, None])
    eliminated &= (m >= 2)[:, None]
    return Look(n, level, alive, means, leader, df, se, critical, eliminated)


def certificate(seen: Look, advised: np.ndarray) -> np.ndarray:
    """(B,) the most by which any survivor of the look could beat ``advised`` (B,) (a survivor
    index per race) at the look's level, in the objective's units: ``max(0, max_{j != a} ybar_j
    - ybar_a + d * SE)`` (see the module's docstring); 0 in a race with one survivor."""
    rows = np.arange(len(seen.leader))
    others = seen.alive.copy()
    others[rows, advised] = False
    best_other = np.where(others, seen.means, -np.inf).max(axis=1)
    bound = best_other - seen.means[rows, advised] + np.where(others.any(axis=1), seen.margin, 0)
    return np.where(others.any(axis=1), np.maximum(bound, 0.0), 0.0)


def advise(seen: Look, prefer: Sequence[int], delta: float) -> np.ndarray:
    """(B,) the advised survivor of each race: the first of ``prefer`` (candidate indices, in
    the user's order) alive and within ``delta`` (objective units) of the leader's mean, else
    the leader."""
    rows = np.arange(len(seen.leader))
    advised = seen.leader.copy()
    chosen = np.zeros(len(rows), dtype=bool)
    lead = seen.means[rows, seen.leader]
    for k in prefer:
        fits = ~chosen & seen.alive[:, k] & (lead - seen.means[:, k] <= delta)
        advised[fits] = k
        chosen |= fits
    return advised
