"""Simulated races with known means: how often the rule drops the truly best candidate, and how
fast it drops a clearly worse one. Pure and seeded (numpy's PCG64 from ``seed``).

**The model.** Candidate ``k`` on seed ``s`` scores

    mu_k + b_s + sigma_k * (sqrt(rho_k) * c_s + sqrt(1 - rho_k) * e[k, s]):

``b_s`` (standard deviation ``seed_sd``) is what a seed does to every candidate alike (the data
subset, the initialisation), which pairing removes; ``c_s`` is a per-seed component that only
some candidates share, a share ``rho_k`` of candidate ``k``'s own variation (``shared``: 0 by
default; recipes on one frozen backbone share most of theirs, a candidate with its own training
shares none), so two candidates are correlated by ``sqrt(rho_j rho_k)`` beyond ``b_s``; ``e`` is
independent noise. ``c`` and ``e`` are standard normal, or Student t on ``tails`` degrees of
freedom scaled to variance 1 (heavy tails). **sigma** (``noise_sd``, per candidate with
``noise_sds``) is the per-observation noise SD of one candidate's outcome; with ``rho = 0`` the
paired difference of two candidates on one seed has SD ``sigma_d = sqrt(2) * sigma``. Means are
given in units of ``sigma``.

The scenarios measured with it, and the command that writes their table, are in
:mod:`experiments.race.scenarios`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.stats import t as t_dist

from experiments.race.rule import advise, certificate, look, rounds_possible, spending
from experiments.race.settings import RaceSettings


@dataclass(frozen=True)
class Outcomes:
    """``eliminated[race, k]``: the round candidate ``k`` was eliminated in (0: survived);
    ``runs[race]`` and ``rounds[race]``: the runs and rounds the race used; ``advised[race]``
    the candidate it advised and ``certificate[race]`` its certificate at the last look
    (objective units); ``certified[race]``: it stopped because the certificate was within
    delta (or one candidate was left)."""

    eliminated: np.ndarray
    runs: np.ndarray
    rounds: np.ndarray
    advised: np.ndarray
    certificate: np.ndarray
    certified: np.ndarray

    def loss(self, means: Sequence[float]) -> np.ndarray:
        """Per race: how far the advised candidate's true mean lies below the best's."""
        true = np.asarray(means, dtype=float)
        return true.max() - true[self.advised]

    def out_by(self, candidate: int, round_: int) -> np.ndarray:
        """Per race: was ``candidate`` eliminated in round ``round_`` or earlier?"""
        column = self.eliminated[:, candidate]
        return (column > 0) & (column <= round_)


def simulated_values(
    means: Sequence[float],
    races: int,
    seed: int,
    *,
    max_seeds: int = RaceSettings.max_seeds,
    noise_sd: float = 1.0,
    noise_sds: Sequence[float] | None = None,
    seed_sd: float = 1.0,
    shared: Sequence[float] | None = None,
    tails: float | None = None,
) -> np.ndarray:
    """(races, candidates, max_seeds) outcomes of the model above (by default as many seeds
    as a race with the default settings can use). Raises ValueError for a share outside [0, 1]
    or ``tails`` <= 2 (no variance)."""
    k = len(means)
    rng = np.random.default_rng(seed)
    sds = np.full(k, noise_sd) if noise_sds is None else np.asarray(noise_sds, dtype=float)
    rho = np.zeros(k) if shared is None else np.asarray(shared, dtype=float)
    if not ((rho >= 0) & (rho <= 1)).all():
        raise ValueError(f"shared={list(rho)}: each share lies in [0, 1]")
    if tails is not None and tails <= 2:
        raise ValueError(f"tails={tails}: Student t has a variance above 2 degrees of freedom")

    def draw(shape: tuple[int, ...]) -> np.ndarray:
        if tails is None:
            return rng.standard_normal(shape)
        return rng.standard_t(tails, shape) / math.sqrt(tails / (tails - 2))

    blocks = seed_sd * rng.standard_normal((races, 1, max_seeds))
    own = draw((races, k, max_seeds))
    common = draw((races, 1, max_seeds)) if rho.any() else 0.0
    noise = np.sqrt(rho)[None, :, None] * common + np.sqrt(1 - rho)[None, :, None] * own
    return np.asarray(means, dtype=float)[None, :, None] + blocks + sds[None, :, None] * noise


def run_races(values: np.ndarray, settings: RaceSettings | None = None) -> Outcomes:
    """Race every ``values[race]`` (candidates x seeds) as :class:`experiments.race.race.Race`
    does with ``settings`` (the defaults when None): the rule
    (:func:`experiments.race.rule.look` after every round, :func:`spending` over
    :func:`rounds_possible`), the advice and its certificate (``prefer`` holds candidate
    indices here, as strings or ints), and the stopping: one survivor, a certificate within
    ``delta``, ``max_seeds`` seeds (at most the seeds in ``values``), or a next round that would
    pass ``max_runs``; vectorised over races."""
    settings = settings or RaceSettings()
    races, k, available = values.shape
    min_seeds, max_runs = settings.min_seeds, settings.max_runs
    max_seeds = min(settings.max_seeds, available)
    levels = spending(settings.alpha, rounds_possible(k, min_seeds, max_seeds, max_runs))
    alive = np.ones((races, k), dtype=bool)
    eliminated = np.zeros((races, k), dtype=int)
    runs = np.full(races, k * min_seeds)
    rounds = np.ones(races, dtype=int)
    running = np.ones(races, dtype=bool)
    prefer = [int(k) for k in settings.prefer or ()]
    advised = np.zeros(races, dtype=int)
    bound = np.full(races, np.inf)
    certified = np.zeros(races, dtype=bool)
    for round_, n in enumerate(range(min_seeds, max_seeds + 1), start=1):
        if round_ > 1:
            survivors = alive.sum(axis=1)
            if max_runs is not None:
                running &= runs + survivors <= max_runs
            runs = np.where(running, runs + survivors, runs)
            rounds = np.where(running, round_, rounds)
        if not running.any():
            break
        seen = look(values[:, :, :n], alive & running[:, None], levels[round_ - 1])
        out = seen.eliminated & running[:, None]
        eliminated[out] = round_
        alive &= ~out
        after = replace(seen, alive=alive & running[:, None])  # the look's, less its eliminated
        chosen = advise(after, prefer, settings.tolerance)
        advised = np.where(running, chosen, advised)
        bound = np.where(running, certificate(after, chosen), bound)
        certified = np.where(running, bound <= settings.tolerance, certified)
        running &= (alive.sum(axis=1) > 1) & ~certified
    return Outcomes(eliminated, runs, rounds, advised, bound, certified)


def naive_races(values: np.ndarray, settings: RaceSettings | None = None) -> Outcomes:
    """The race the rule replaces, for contrast: after every round, one-sided paired t-tests of
    each survivor against the leader (n - 1 degrees of freedom), Holm across them at ``alpha``,
    and nothing for the repeated looks (``settings``' ``max_runs`` is not applied)."""
    settings = settings or RaceSettings()
    races, k, available = values.shape
    min_seeds, alpha = settings.min_seeds, settings.alpha
    max_seeds = min(settings.max_seeds, available)
    alive = np.ones((races, k), dtype=bool)
    eliminated = np.zeros((races, k), dtype=int)
    runs = np.full(races, k * min_seeds)
    rounds = np.ones(races, dtype=int)
    running = np.ones(races, dtype=bool)
    rows = np.arange(races)
    for round_, n in enumerate(range(min_seeds, max_seeds + 1), start=1):
        if round_ > 1:
            runs = np.where(running, runs + alive.sum(axis=1), runs)
            rounds = np.where(running, round_, rounds)
        y = values[:, :, :n]
        means = np.where(alive, y.mean(axis=2), -np.inf)
        leader = means.argmax(axis=1)
        diff = y[rows, leader][:, None, :] - y  # (races, k, n)
        sd = diff.std(axis=2, ddof=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            statistic = diff.mean(axis=2) / (sd / math.sqrt(n))
        p = np.where(
            alive & (np.arange(k)[None, :] != leader[:, None]), t_dist.sf(statistic, n - 1), np.inf
        )
        p = np.nan_to_num(p, nan=1.0)
        tests = (np.isfinite(p)).sum(axis=1)
        order = np.argsort(p, axis=1)
        ranked = np.take_along_axis(p, order, axis=1)
        thresholds = alpha / np.maximum(tests[:, None] - np.arange(k)[None, :], 1)
        passing = np.cumprod(ranked <= thresholds, axis=1).astype(
            bool
        )  # Holm stops at the first failure
        out = np.zeros_like(alive)
        np.put_along_axis(out, order, passing, axis=1)
        out &= alive & running[:, None]
        eliminated[out] = round_
        alive &= ~out
        running &= alive.sum(axis=1) > 1
        if not running.any():
            break
    # It has no certificate: it advises its last leader, certified only when alone.
    alone = alive.sum(axis=1) == 1
    return Outcomes(eliminated, runs, rounds, leader, np.where(alone, 0.0, np.inf), alone)


def simulate_races(
    means: Sequence[float],
    races: int,
    seed: int,
    settings: RaceSettings | None = None,
    *,
    noise_sd: float = 1.0,
    noise_sds: Sequence[float] | None = None,
    seed_sd: float = 1.0,
    shared: Sequence[float] | None = None,
    tails: float | None = None,
) -> Outcomes:
    """``races`` independent races of ``len(means)`` candidates on simulated outcomes, run as
    ``settings`` say (the defaults when None); the keywords are :func:`simulated_values`'."""
    settings = settings or RaceSettings()
    values = simulated_values(
        means,
        races,
        seed,
        max_seeds=settings.max_seeds,
        noise_sd=noise_sd,
        noise_sds=noise_sds,
        seed_sd=seed_sd,
        shared=shared,
        tails=tails,
    )
    return run_races(values, settings)
