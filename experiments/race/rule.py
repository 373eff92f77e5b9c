"""The race's elimination rule: pure functions, no I/O.

**The layout.** After a round every surviving candidate has the same seeds (a seed gives every
candidate the same data subset and initialisation), so the objective values form a complete
table, candidates x seeds, and any two candidates ``j`` and ``k`` can be compared by their
*paired* differences ``D_jk[s] = y[j, s] - y[k, s]``: what a seed does to both alike cancels.

**Each pair its own variance.** Two candidates can share much of what a seed does to them
(recipes trained on one frozen backbone share their features, or a whole training prefix) or
nothing (a candidate with its own training), so the noise of a difference depends on the pair.
The rule never pools: pair ``(j, k)`` has the mean difference ``Dbar_jk``, the sample standard
deviation ``s_jk`` of its ``n`` per-seed differences and ``SE_jk = s_jk / sqrt(n)`` on ``n - 1``
degrees of freedom, whatever the other candidates do. The price is power at few seeds: a pooled
residual has ``(m - 1)(n - 1)`` degrees of freedom, a pair only ``n - 1`` (2 at 3 seeds).

**One look: multiple comparisons with the best, Bonferroni over the comparisons with it.** With
``m`` survivors at level ``a_r``, let ``t = t_{1 - a_r / (m - 1), n - 1}`` (Student's t quantile:
:func:`pair_critical`). The round's leader ``L`` is the survivor with the highest mean; survivor
``k`` is out when ``Dbar_Lk > t * SE_Lk``. This is Hsu's multiple comparisons with the best
(Hsu 1984; Hsu 1996, *Multiple Comparisons: Theory and Methods*, ch. 4) with a Bonferroni bound
over the ``m - 1`` comparisons with the best, each on its own pair's t, in place of the
equicorrelated Dunnett constant that needs one pooled variance.

*Proof sketch.* Let ``b`` be the truly best survivor and ``E`` the event that for every other
survivor ``j``: ``(Dbar_jb - (mu_j - mu_b)) / SE_jb < t``. Each of these ``m - 1`` ratios is a
Student t on ``n - 1`` degrees of freedom when the seeds are independent replicates and the
pair's per-seed differences are normal (any variance, any correlation between candidates: each
ratio uses only its own pair), so by Bonferroni ``P(not E) <= (m - 1) * a_r / (m - 1) = a_r``.
On ``E``, ``b`` is not eliminated: ``Dbar_Lb < (mu_L - mu_b) + t * SE_Lb <= t * SE_Lb``.

**The repeated looks: alpha spent across the rounds that can happen.** A race looks after every
round, so the chances to drop the best add up. Before the first round the race knows how many
rounds it can have at most, ``R`` (:func:`rounds_possible`), and spends ``alpha`` across them by
Bonferroni: round ``r`` gets ``a_r = alpha * (1/r) / H_R`` (``H_R`` the R-th harmonic number), so
``sum a_r = alpha``. The split leans early because an elimination in round ``r`` saves up to
``R - r`` later runs.

**The certificate: how much a choice could lose** (Hsu's MCB lower bounds, with the pairwise
standard errors). On ``E``, for *every* survivor ``a`` at once,

    max_j mu_j - mu_a  <=  C(a) = max(0, max_{j != a} (Dbar_ja + t * SE_ja)),

since for ``a != b`` the pair ``(a, b)`` in ``E`` gives ``mu_b - mu_a < Dbar_ba + t * SE_ab``.
``C(a)`` is the :func:`certificate`. Because it holds for every ``a`` simultaneously it stays
valid for an ``a`` chosen from the data (the leader, or the first of a preference list within
``delta`` of it), and it rests on the same event ``E`` as the elimination, so the look spends
its ``a_r`` once for both. Over the race the looks' events fail with total probability at most
``sum a_r = alpha``, so the certificate of the look the race stops at is valid at level
``alpha`` however the data chose that look. On ``E`` the best is never eliminated, so the
survivors' certificate covers the eliminated candidates too. With one survivor ``C = 0``.

**What is assumed, and what is not proved.** Assumed: the seeds are independent replicates (one
seed's outcomes tell nothing of another's), and each pair's per-seed differences are normal with
a variance of their own; nothing is assumed about how correlated the candidates are, nor that
their variances are equal. Not covered by the proof: the survivors of a look (hence ``m``) are
chosen by earlier looks at the same seeds. :mod:`experiments.race.simulate` measures both error
rates on simulated races (equal and unequal correlation, unequal variances, heavy tails) and
``tests/test_race_certificate.py`` and ``tests/test_race_rule.py`` check them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from scipy.stats import t as student_t


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


@lru_cache(maxsize=4096)
def pair_critical(level: float, comparisons: int, df: int) -> float:
    """``t``: Student's t quantile ``t_{1 - level / comparisons, df}``, the one-sided critical
    value of each of ``comparisons`` pairwise t-ratios that together fail with probability at
    most ``level`` (Bonferroni)."""
    if not 0 < level < 1 or comparisons < 1 or df < 1:
        raise ValueError(f"pair_critical({level}, {comparisons}, {df})")
    return float(student_t.isf(level / comparisons, df))


@dataclass(frozen=True)
class Look:
    """One look at a batch of ``B`` races with ``K`` candidate slots and ``n`` seeds each.

    Arrays are indexed ``[race]``, ``[race, candidate]`` or ``[race, j, k]`` (the pair ``j``
    minus ``k``); a candidate that is not alive has ``eliminated`` False and meaningless
    numbers."""

    n: int
    level: float
    alive: np.ndarray  # (B, K) the survivors the look compared
    means: np.ndarray  # (B, K) mean objective over the n seeds
    leader: np.ndarray  # (B,) index of the highest mean among the alive (first on ties)
    df: int  # n - 1, each pair's degrees of freedom
    pair_se: np.ndarray  # (B, K, K) standard error of the paired mean difference j - k
    critical: np.ndarray  # (B,) t at the look's level for m - 1 comparisons (inf when m < 2)
    eliminated: np.ndarray  # (B, K) out at this look

    @property
    def rows(self) -> np.ndarray:
        return np.arange(len(self.leader))

    @property
    def difference(self) -> np.ndarray:
        """(B, K) mean minus the leader's mean (<= 0)."""
        return self.means - self.means[self.rows, self.leader][:, None]

    @property
    def pair_margin(self) -> np.ndarray:
        """(B, K, K) half-width of the race interval on the difference ``j - k``: ``t *
        SE_jk`` (inf in a race with fewer than 2 survivors)."""
        with np.errstate(invalid="ignore"):  # inf * 0: no pair to compare
            margin = self.critical[:, None, None] * self.pair_se
        return np.where(np.isfinite(self.critical)[:, None, None], margin, np.inf)

    @property
    def se(self) -> np.ndarray:
        """(B, K) standard error of each candidate's difference to the leader (0 for it)."""
        return self.pair_se[self.rows, self.leader]

    @property
    def margin(self) -> np.ndarray:
        """(B, K) half-width of each candidate's race interval on its difference to the
        leader: ``t * SE_leader,k``. A candidate is out exactly when its interval, difference
        +- margin, lies below 0."""
        return self.pair_margin[self.rows, self.leader]


def resolution(paired: np.ndarray, alive: np.ndarray) -> np.ndarray:
    """(B,) the smallest non-zero change of a survivor pair's difference from one seed to
    another, from ``paired`` (B, K, K, n): at most the step of a discrete objective (an accuracy
    counts images), far below the noise of a continuous one; like the differences, untouched by
    what a seed does to every candidate. A pair whose difference is the same on every seed has
    a sample spread of 0, which says nothing about its noise: two recipes one image apart on
    every seed would otherwise be separated with certainty. Each pair's spread is floored at
    this step (0 where no pair's difference changes: nothing shows the step then)."""
    both = alive[:, :, None] & alive[:, None, :]
    ordered = np.sort(paired, axis=3)
    change = np.diff(ordered, axis=3)
    change = np.where(both[..., None] & (change > 1e-12), change, np.inf)
    step = change.reshape(len(change), -1).min(axis=1)
    return np.where(np.isfinite(step), step, 0.0)


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
    means = values.mean(axis=2)
    paired = values[:, :, None, :] - values[:, None, :, :]  # (B, K, K, n)
    spread = np.maximum(paired.std(axis=3, ddof=1), resolution(paired, alive)[:, None, None])
    pair_se = spread / np.sqrt(n)
    m = alive.sum(axis=1)
    leader = np.where(alive, means, -np.inf).argmax(axis=1)
    critical = np.full(races, np.inf)
    for size in np.unique(m[m >= 2]):
        critical[m == size] = pair_critical(level, int(size) - 1, n - 1)
    seen = Look(n, level, alive, means, leader, n - 1, pair_se, critical, np.zeros_like(alive))
    # A difference larger than t * SE (SE at least the objective's resolution over sqrt(n)).
    return replace(seen, eliminated=alive & (-seen.difference > seen.margin) & (m >= 2)[:, None])


def certificate(seen: Look, advised: np.ndarray) -> np.ndarray:
    """(B,) the most by which any survivor of the look could beat ``advised`` (B,) (a survivor
    index per race) at the look's level, in the objective's units: ``max(0, max_{j != a}
    (Dbar_ja + t * SE_ja))`` (see the module's docstring); 0 in a race with one survivor."""
    rows = seen.rows
    others = seen.alive.copy()
    others[rows, advised] = False
    beaten = seen.means - seen.means[rows, advised][:, None] + seen.pair_margin[rows, :, advised]
    bound = np.where(others, beaten, -np.inf).max(axis=1)
    return np.where(others.any(axis=1), np.maximum(bound, 0.0), 0.0)


def advise(seen: Look, prefer: Sequence[int], delta: float) -> np.ndarray:
    """(B,) the advised survivor of each race: the first of ``prefer`` (candidate indices, in
    the user's order) alive and within ``delta`` (objective units) of the leader's mean, else
    the leader."""
    rows = seen.rows
    advised = seen.leader.copy()
    chosen = np.zeros(len(rows), dtype=bool)
    lead = seen.means[rows, seen.leader]
    for k in prefer:
        fits = ~chosen & seen.alive[:, k] & (lead - seen.means[:, k] <= delta)
        advised[fits] = k
        chosen |= fits
    return advised
