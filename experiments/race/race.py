"""A race as a state machine: which jobs the next round runs, what each look decided, when it
stops. No Hydra, no MLflow: the sweeper feeds it the objective values its jobs returned, the
benchmark replays it on a grid's values, the tests drive it directly.

Round 1 runs every candidate on the first ``min_seeds`` seeds; each later round adds the next
seed to every survivor. After each round :func:`experiments.race.rule.look` eliminates at that
round's level and names the advised candidate (the leader, or the first of ``prefer`` within
``delta`` of it) with its certificate (:func:`experiments.race.rule.certificate`: the most any
candidate could beat it by). The race stops when one candidate survives, when the certificate is
within ``delta``, after ``max_seeds`` seeds, or when the next round would take the race past
``max_runs`` jobs (a round is never cut short: the layout
must stay complete). Which jobs run depends only on the values recorded, so relaunching a
stopped race with the same values replays the same rounds.

A job may fail instead of returning a value (:meth:`Race.fail`: it diverged, or its candidate's
setting does not fit the data or the model): its candidate is out in that round, with the
reason, before the look, which then compares the others. A failed job counts as a run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from experiments.race.rule import advise, certificate, look, rounds_possible, spending
from experiments.race.settings import RaceSettings

ONE_LEFT, CERTIFIED, MAX_SEEDS, MAX_RUNS = (
    "one candidate left",
    "certificate within delta",
    "max_seeds",
    "max_runs",
)


@dataclass(frozen=True)
class Round:
    """What one look saw and decided. Differences are to the leader (<= 0); ``se[c]`` is the
    standard error of ``c``'s paired difference to the leader (its own pair's, on ``df = n - 1``
    degrees of freedom) and ``margin[c] = critical * se[c]`` the half-width of its race
    interval: ``c`` is out when ``difference[c] + margin[c] < 0``. The leader's are 0."""

    number: int
    seeds: tuple[int, ...]
    level: float
    candidates: tuple[str, ...]  # alive at the look
    means: dict[str, float]
    difference: dict[str, float]
    leader: str
    se: dict[str, float]
    df: int
    critical: float  # t for the look's m - 1 comparisons with the leader
    margin: dict[str, float]
    eliminated: tuple[str, ...]  # by the look
    failed: dict[str, str]  # out before the look: candidate -> why (see failure_text)
    runs: int  # jobs run so far, this round included, failed ones too
    advised: str  # the leader, or the first preferred candidate within delta of it
    certificate: float  # the most any candidate could beat `advised` by, objective units


@dataclass
class Race:
    """One race over ``candidates`` (labels) on ``seeds`` (in the order they are used), run as
    ``settings`` say."""

    candidates: Sequence[str]
    seeds: Sequence[int]
    settings: RaceSettings = field(default_factory=RaceSettings)
    values: dict[str, dict[int, float]] = field(default_factory=dict)
    failed: dict[str, dict[int, str]] = field(default_factory=dict)  # candidate -> seed -> why
    rounds: list[Round] = field(default_factory=list)
    eliminated_in: dict[str, int] = field(default_factory=dict)
    stop_reason: str | None = None

    def __post_init__(self) -> None:
        self.candidates = tuple(self.candidates)
        self.seeds = tuple(self.seeds)
        if len(set(self.candidates)) != len(self.candidates):
            raise ValueError(f"candidates must be distinct: {list(self.candidates)}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct: {list(self.seeds)}")
        self.min_seeds = self.settings.min_seeds
        self.max_seeds = min(self.settings.max_seeds, len(self.seeds))
        self.max_runs = self.settings.max_runs
        self.alpha = self.settings.alpha
        self.levels = spending(
            self.alpha,
            rounds_possible(len(self.candidates), self.min_seeds, self.max_seeds, self.max_runs),
        )
        self.delta = self.settings.delta
        if not (math.isfinite(self.delta) and self.delta >= 0):
            raise ValueError(f"delta={self.delta} must be a number of points >= 0")
        self.prefer = tuple(self.settings.prefer or ())
        unknown = [p for p in self.prefer if p not in self.candidates]
        if unknown:
            raise ValueError(
                f"prefer lists {unknown}, which are not candidates {list(self.candidates)}"
            )
        for name in self.candidates:
            self.values.setdefault(name, {})

    @property
    def survivors(self) -> list[str]:
        """Candidates not eliminated, best mean first (after the last look)."""
        alive = [c for c in self.candidates if c not in self.eliminated_in]
        if self.rounds:
            means = self.rounds[-1].means
            alive.sort(key=lambda c: -means[c])
        return alive

    @property
    def advised(self) -> str:
        """The candidate the race advises (after the last look)."""
        return self.rounds[-1].advised if self.rounds else self.candidates[0]

    @property
    def certificate(self) -> float:
        """The most, in objective units, by which any candidate could beat :attr:`advised` at
        confidence ``1 - alpha`` (inf before the first look)."""
        return self.rounds[-1].certificate if self.rounds else math.inf

    @property
    def runs(self) -> int:
        return sum(len(v) for v in self.values.values()) + sum(len(v) for v in self.failed.values())

    @property
    def seeds_used(self) -> int:
        return len(self.rounds[-1].seeds) if self.rounds else 0

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def next_jobs(self) -> list[tuple[str, int]]:
        """The (candidate, seed) jobs of the next round, every one of which must be recorded
        before :meth:`close_round`; empty when the race is over (:attr:`stop_reason` says why)."""
        if self.done:
            return []
        if not self.rounds:  # seed by seed: runs that share training with another on a seed
            # (runner.sweeps.prefixes) find it, or say what they want of it, before the next seed's run
            return [(c, s) for s in self.seeds[: self.min_seeds] for c in self.candidates]
        alive, n = self.survivors, self.seeds_used
        if len(alive) == 1:
            self.stop_reason = ONE_LEFT
        elif self.certificate <= self.settings.tolerance:
            self.stop_reason = CERTIFIED
        elif n >= self.max_seeds:
            self.stop_reason = MAX_SEEDS
        elif self.max_runs is not None and self.runs + len(alive) > self.max_runs:
            self.stop_reason = MAX_RUNS
        if self.done:
            return []
        return [(c, self.seeds[n]) for c in alive]

    def record(self, candidate: str, seed: int, value: float) -> None:
        if not math.isfinite(value):
            raise ValueError(f"{candidate} on seed {seed} returned {value}, not a number")
        self.values[candidate][seed] = float(value)

    def fail(self, candidate: str, seed: int, reason: str) -> None:
        """The job (``candidate``, ``seed``) failed for ``reason`` (e.g. "diverged at epoch 2"):
        the candidate goes out when the round closes."""
        self.failed.setdefault(candidate, {})[seed] = reason

    def failure(self, candidate: str) -> str | None:
        """Why ``candidate`` went out failing (see :func:`failure_text`); None if it did not."""
        by_seed = self.failed.get(candidate)
        return failure_text(by_seed) if by_seed else None

    def close_round(self) -> Round:
        """Take out the candidates with a failed job, look at the others' round: eliminate,
        and return what was decided. Raises ValueError when every candidate failed."""
        number = len(self.rounds) + 1
        n = self.min_seeds + number - 1
        seeds = tuple(self.seeds[:n])
        failed = {}
        for c in self.candidates:
            text = self.failure(c)
            if text is not None and c not in self.eliminated_in:
                failed[c] = text
                self.eliminated_in[c] = number
        alive = [c for c in self.candidates if c not in self.eliminated_in]
        if not alive:
            said = "; ".join(f"{c}: {text}" for c, text in failed.items())
            raise ValueError(f"every candidate failed in round {number} ({said})")
        missing = [(c, s) for c in alive for s in seeds if s not in self.values[c]]
        if missing:
            raise ValueError(f"round {number} is incomplete: no value for {missing[:5]}")
        table = np.array([[[self.values[c][s] for s in seeds] for c in alive]])
        seen = look(table, np.ones((1, len(alive)), dtype=bool), self.levels[number - 1])
        means = {c: float(seen.means[0, i]) for i, c in enumerate(alive)}
        leader = alive[int(seen.leader[0])]
        out = tuple(c for i, c in enumerate(alive) if seen.eliminated[0, i])
        after = replace(seen, alive=~seen.eliminated)  # the survivors of the look
        prefer = [alive.index(c) for c in self.prefer if c in alive]
        advised = advise(after, prefer, self.settings.tolerance)
        bound = float(certificate(after, advised)[0])
        for c in out:
            self.eliminated_in[c] = number
        result = Round(
            number=number,
            seeds=seeds,
            level=self.levels[number - 1],
            candidates=tuple(alive),
            means=means,
            difference={c: means[c] - means[leader] for c in alive},
            leader=leader,
            se={c: float(seen.se[0, i]) for i, c in enumerate(alive)},
            df=seen.df,
            critical=float(seen.critical[0]),
            margin={c: float(seen.margin[0, i]) for i, c in enumerate(alive)},
            eliminated=out,
            failed=failed,
            runs=self.runs,
            advised=alive[int(advised[0])],
            certificate=bound,
        )
        self.rounds.append(result)
        return result

    def round_of(self, candidate: str) -> Round:
        """The look that decided about ``candidate``: the one that eliminated it, else the last."""
        number = self.eliminated_in.get(candidate, len(self.rounds))
        return self.rounds[number - 1]

    def to_dict(self) -> dict[str, object]:
        """Everything the race saw and decided, for ``race.json`` on the parent run."""
        return {
            "candidates": list(self.candidates),
            "seeds": list(self.seeds),
            "min_seeds": self.min_seeds,
            "max_seeds": self.max_seeds,
            "max_runs": self.max_runs,
            "alpha": self.alpha,
            "delta": self.delta,
            "prefer": list(self.prefer),
            "levels": list(self.levels),
            "values": {c: {str(s): v for s, v in vs.items()} for c, vs in self.values.items()},
            "failed": {c: {str(s): w for s, w in ws.items()} for c, ws in self.failed.items()},
            "rounds": [asdict(r) for r in self.rounds],
            "eliminated_in": dict(self.eliminated_in),
            "survivors": self.survivors,
            "advised": self.advised,
            "certificate": self.certificate,
            "stop_reason": self.stop_reason,
            "runs": self.runs,
        }


def failure_text(by_seed: Mapping[int, str]) -> str:
    """The seeds a candidate failed on, grouped by reason in the order they ran: "diverged at
    epoch 2 on seeds 0, 1, 2" (" and " between different reasons)."""
    seeds_of: dict[str, list[int]] = {}
    for seed, reason in by_seed.items():
        seeds_of.setdefault(reason, []).append(seed)
    return " and ".join(
        f"{reason} on seed{'s' * (len(seeds) > 1)} {', '.join(str(s) for s in seeds)}"
        for reason, seeds in seeds_of.items()
    )


def replay(race: Race, table: Mapping[tuple[str, int], float]) -> Race:
    """Run ``race`` to its end on known values ``{(candidate, seed): value}`` (e.g. a full
    grid's results): what a real race with these outcomes would have done."""
    while jobs := race.next_jobs():
        for candidate, seed in jobs:
            race.record(candidate, seed, table[(candidate, seed)])
        race.close_round()
    return race


def seed_orders(
    race: Callable[[list[int]], Race],
    table: Mapping[tuple[str, int], float],
    seeds: Sequence[int],
    orders: int,
    seed: int = 0,
) -> list[Race]:
    """``race(seed_order)`` replayed on known values ``table`` with ``seeds`` in ``orders``
    random orders (numpy's PCG64 from ``seed``): how a race with these outcomes ends had its
    seeds come in another order. The orders draw on one grid's seeds, so they are not
    independent races: they show how much one benchmark's answer owes to its seed order."""
    rng = np.random.default_rng(seed)
    return [replay(race([int(s) for s in rng.permutation(seeds)]), table) for _ in range(orders)]
