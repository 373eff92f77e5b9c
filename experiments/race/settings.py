"""The race's settings, ``hydra.sweeper.*`` of ``hydra/sweeper=race``, defined once: the
sweeper's Hydra config extends :class:`RaceSettings`, and the driver, the race and the
simulations take an instance of it.

The race sweeper's plugin module imports this module at Hydra's plugin discovery, on every
start: it imports nothing but :mod:`dataclasses`. No ``from __future__ import annotations``:
OmegaConf reads these annotations as types when it builds the sweeper's config node.
"""

from dataclasses import dataclass, fields
from typing import Any


@dataclass
class RaceSettings:
    """How a race is run (see :mod:`experiments.race.race`).

    ``min_seeds``: the seeds of round 1 (at least 2). ``max_seeds``: the most seeds a candidate
    gets (capped by the seeds listed). ``max_runs``: a budget of jobs, failed ones included
    (None: no budget). ``alpha``: the chance, over the whole race, of eliminating the truly best
    candidate, and that the certificate is wrong. ``delta``: a tolerance in objective points (100
    x the objective): the race stops as soon as no candidate can beat the advised one by more
    than ``delta`` at confidence ``1 - alpha`` (its certificate; 0: only when one candidate is
    left). ``prefer``: candidate labels in order of preference: the advised candidate is the
    first of them within ``delta`` of the leader's mean (none: the leader).

    The default ``delta`` of 1 point is below one run's validation noise on the digits benchmark
    (1.4 points), a difference few would switch strategies for. Each pair of candidates has its
    own variance, so it certifies early where candidates share training (recipes on one
    backbone) and rarely between independently trained ones: within 10 seeds in 9% of seed
    orders on the digits grid, where delta = 2 always does (docs/results/race.md).

    ``stack_heads``: a round's linear heads on cached features train at once in the sweep's
    process, as stacked heads (:mod:`experiments.race.stacked_jobs`; false: every job through
    the configured launcher, one run at a time)."""

    min_seeds: int = 3
    max_seeds: int = 10
    max_runs: int | None = None
    alpha: float = 0.05
    delta: float = 1.0
    prefer: list[str] | None = None
    stack_heads: bool = True

    def __post_init__(self) -> None:
        if self.prefer is not None:  # a Hydra list arrives as a ListConfig
            self.prefer = [str(label) for label in self.prefer]

    @property
    def tolerance(self) -> float:
        """``delta`` in the objective's own units."""
        return self.delta / 100

    @classmethod
    def from_node(cls, node: Any) -> "RaceSettings":
        """The settings from a mapping that holds them among other keys (``hydra.sweeper``)."""
        return cls(**{f.name: node[f.name] for f in fields(cls)})
