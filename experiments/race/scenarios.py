"""The scenarios the race's guarantee is checked on: both error rates of the rule, eliminating the
truly best candidate and understating how much the advised one loses (its certificate below its
true loss), on simulated races (:mod:`experiments.race.simulate`) on the digits benchmark's
scale: one run's validation noise ``SIGMA`` = 1.39 points, a seed effect of the same size.

Each scenario runs twice, on the layout least favourable to each rate: every candidate tied (any
of them can lead, so the best is the most exposed) for the elimination rate, and the best with
the others just over ``delta`` below it and one clearly worse (advising one of the near ones is
the error) for the understated loss. Candidate 0 is the best. ``tests/test_race_certificate.py``
checks every scenario; ``python -m experiments.race.scenarios --out
docs/results/race_rule.json`` writes the fuller table.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.race.settings import RaceSettings
from experiments.race.simulate import Outcomes, simulate_races

SIGMA = 0.0139  # one run's validation noise on digits, in objective units


@dataclass(frozen=True)
class Scenario:
    """``candidates`` candidates; ``shared[k]``: the share of candidate ``k``'s per-seed
    variation it shares with the others that share (None: none); ``noise[k]``: its noise SD in
    units of :data:`SIGMA` (None: 1 each); ``tails``: Student t degrees of freedom of the noise
    (None: normal); ``settings``: :class:`RaceSettings` keywords (``prefer`` as indices)."""

    name: str
    candidates: int
    shared: tuple[float, ...] | None = None
    noise: tuple[float, ...] | None = None
    tails: float | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def race(self) -> RaceSettings:
        return RaceSettings(**self.settings)

    def means(self, layout: str) -> tuple[float, ...]:
        """``"tied"``: every candidate equal; ``"near"``: the best, the others 0.1 points more
        than ``delta`` below it, the last 3 points below (objective units)."""
        if layout == "tied":
            return (0.0,) * self.candidates
        near = -(self.race.delta + 0.1) / 100
        return (0.0, *[near] * (self.candidates - 2), -0.03)

    def simulate(self, layout: str, races: int, seed: int) -> Outcomes:
        noise_sds = None if self.noise is None else [SIGMA * s for s in self.noise]
        return simulate_races(
            self.means(layout),
            races,
            seed,
            self.race,
            noise_sd=SIGMA,
            noise_sds=noise_sds,
            seed_sd=SIGMA,
            shared=self.shared,
            tails=self.tails,
        )


def scenarios(k: int) -> tuple[Scenario, ...]:
    """The scenarios with ``k`` candidates: how much of their per-seed variation they share (0%,
    50%, 100% alike, and the best sharing none of what the others share), unequal variances,
    heavy tails, a preference order, a budget, a wider delta and 2 seeds in round 1."""
    apart = (0.0,) + (1.0,) * (k - 1)  # the best shares nothing with the others
    half = (0.0,) + (0.5,) * (k - 1)
    worst_first = {"prefer": list(range(k - 1, 0, -1))}
    return (
        Scenario(f"{k}: independent", k),
        Scenario(f"{k}: all share 50%", k, (0.5,) * k),
        Scenario(f"{k}: all share 100%", k, (1.0,) * k),
        Scenario(f"{k}: the best shares none, the others 50%", k, half),
        Scenario(f"{k}: the best shares none, the others 100%", k, apart),
        Scenario(f"{k}: the best 2x noisier", k, noise=(2.0,) + (1.0,) * (k - 1)),
        Scenario(f"{k}: the others 2x noisier, sharing 100%", k, apart, (1.0,) + (2.0,) * (k - 1)),
        Scenario(f"{k}: heavy tails (t, 3 df), the best shares none", k, half, tails=3.0),
        Scenario(
            f"{k}: preferring the worst first, the best shares none",
            k,
            apart,
            None,
            None,
            worst_first,
        ),
        Scenario(
            f"{k}: budget {8 * k} runs, the best shares none",
            k,
            apart,
            settings={"max_runs": 8 * k},
        ),
        Scenario(f"{k}: delta 2 points, the best shares none", k, apart, settings={"delta": 2.0}),
        Scenario(f"{k}: min_seeds 2, the best shares none", k, apart, settings={"min_seeds": 2}),
    )


SCENARIOS: tuple[Scenario, ...] = scenarios(5) + scenarios(9)


@dataclass(frozen=True)
class Rates:
    """Counts over ``races`` races per layout: the best eliminated (tied, and near), the
    certificate below the true loss (near), races certified within delta (near), mean runs."""

    races: int
    best_out_tied: int
    best_out_near: int
    understated: int
    certified: int
    runs_near: float

    def error(self, count: int) -> tuple[float, float]:
        """A count's rate and its Monte-Carlo standard error ``sqrt(p (1 - p) / races)``."""
        p = count / self.races
        return p, math.sqrt(p * (1 - p) / self.races)


def rates(scenario: Scenario, races: int, seed: int) -> Rates:
    """Both layouts of ``scenario``, ``races`` races each, seeded ``seed`` and ``seed + 1``."""
    tied = scenario.simulate("tied", races, seed)
    near = scenario.simulate("near", races, seed + 1)
    loss = near.loss(scenario.means("near"))
    return Rates(
        races,
        int((tied.eliminated[:, 0] > 0).sum()),
        int((near.eliminated[:, 0] > 0).sum()),
        int((loss > near.certificate).sum()),
        int(near.certified.sum()),
        float(near.runs.mean()),
    )


def scenario_table(races: int = 4000, seed: int = 2024) -> list[dict[str, object]]:
    """Every scenario of :data:`SCENARIOS`: each error rate with its Monte-Carlo standard error
    and whether it is within ``alpha + 2`` standard errors, the share certified and the runs."""
    rows: list[dict[str, object]] = []
    for i, scenario in enumerate(SCENARIOS):
        counted = rates(scenario, races, seed + 2 * i)
        alpha = scenario.race.alpha
        row: dict[str, object] = {"scenario": scenario.name, "races": races, "alpha": alpha}
        for key, count in (
            ("best_eliminated", counted.best_out_tied),
            ("best_eliminated_near", counted.best_out_near),
            ("understated", counted.understated),
        ):
            p, se = counted.error(count)
            row |= {key: p, f"{key}_se": se, f"{key}_within": bool(p <= alpha + 2 * se)}
        row["certified"] = counted.certified / races
        row["mean_runs"] = counted.runs_near
        rows.append(row)
    return rows


def all_within(rows: list[dict[str, object]]) -> bool:
    """Every error rate of every row within alpha plus two Monte-Carlo standard errors."""
    return all(bool(r[key]) for r in rows for key in r if str(key).endswith("_within"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON artifact to write")
    parser.add_argument("--races", type=int, default=4000)
    args = parser.parse_args(argv)
    rows = scenario_table(args.races)
    used = RaceSettings()
    header = {"alpha": used.alpha, "min_seeds": used.min_seeds, "max_seeds": used.max_seeds}
    header |= {"sigma_points": 100 * SIGMA, "delta_points": used.delta}
    args.out.write_text(json.dumps({**header, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out} ({len(rows)} scenarios, all within alpha + 2 SE: {all_within(rows)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
