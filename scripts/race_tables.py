"""The race's tables: the validation grid and its decision, the benchmark of the race against
the grid, the race's rounds, and the elimination rule's simulated error rates, each rendered from
a stored artifact in ``docs/results/`` (:mod:`scripts.tables` writes them into the docs)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from scripts.artifacts import load, markdown_table, values_of
from scripts.race_replays import ORDERS, stored_replays

if TYPE_CHECKING:
    from experiments.stats import Paired


def _paired(a: dict[int, float], b: dict[int, float]) -> Paired:
    """The paired difference of two candidates of one grid: every seed is in both."""
    from experiments.stats import paired_difference

    paired = paired_difference(a, b)
    assert paired is not None, "a grid's candidates share their seeds"
    return paired


def grid_decision(values: dict[str, dict[int, float]], alpha: float = 0.05) -> dict[str, Any]:
    """The full grid's answer, one look at all its seeds: the leader and the candidates not
    separable from it, by the race's rule at level alpha (one look spends it all) and by the
    report's uncorrected paired 95% t-intervals."""
    from experiments.race.rule import look

    names = sorted(values)
    seeds = sorted(set.intersection(*(set(v) for v in values.values())))
    table = np.array([[[values[n][s] for s in seeds] for n in names]])
    seen = look(table, np.ones((1, len(names)), dtype=bool), alpha)
    leader = names[int(seen.leader[0])]
    mcb = [n for i, n in enumerate(names) if not seen.eliminated[0, i]]
    paired = [
        n
        for n in names
        if n == leader or not _paired(values[leader], values[n]).difference.excludes_zero
    ]
    return {
        "seeds": seeds,
        "leader": leader,
        "means": {n: float(seen.means[0, i]) for i, n in enumerate(names)},
        "difference": {n: float(seen.difference[0, i]) for i, n in enumerate(names)},
        "margin": {n: float(seen.margin[0, i]) for i, n in enumerate(names)},
        "not_separable_race_rule": sorted(mcb, key=lambda n: -seen.means[0, names.index(n)]),
        "not_separable_paired_t": paired,
    }


def _interval(difference: float, margin: float) -> str:
    """A difference to the leader and its race interval, in points: "-1.2 [-3.0, +0.6]"."""
    low, high = difference - margin, difference + margin
    return f"{100 * difference:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"


def naive_replay(values: dict[str, dict[int, float]]) -> dict[str, Any]:
    """The naive race (:func:`experiments.race.simulate.naive_races`: paired t-tests against the
    leader after every round, Holm, nothing for the repeated looks) on a grid's values."""
    from experiments.race.simulate import naive_races

    names = list(values)
    seeds = sorted(set.intersection(*(set(v) for v in values.values())))
    table = np.array([[[values[n][s] for s in seeds] for n in names]])
    out = naive_races(table)
    rounds = {n: int(out.eliminated[0, i]) for i, n in enumerate(names)}
    used = 3 + int(out.rounds[0]) - 1  # the seeds the survivors ran
    means = {n: float(table[0, i, :used].mean()) for i, n in enumerate(names)}
    return {
        "runs": int(out.runs[0]),
        "survivors": sorted((n for n in names if not rounds[n]), key=lambda n: -means[n]),
        "eliminated_in": {n: r for n, r in rounds.items() if r},
    }


def validation_table(folder: Path) -> str:
    """The digits grid on validation: mean and 95% interval per strategy, the difference to the
    leader, and whether 10 seeds separate it (race rule at one look; paired t)."""
    from experiments.stats import t_interval

    values = values_of(load("digits_grid", folder), "val/balanced_accuracy")
    decision = grid_decision(values)
    leader = decision["leader"]
    rows = []
    for name in sorted(values, key=lambda n: -decision["means"][n]):
        i = t_interval(list(values[name].values()))
        diff = decision["difference"][name]
        p = _paired(values[name], values[leader])
        rows.append(
            [
                name,
                str(i.n),
                f"{i.mean:.4f} ± {i.half_width:.4f}",
                "leader" if name == leader else _interval(diff, decision["margin"][name]),
                "—"
                if name == leader
                else f"{100 * p.difference.low:+.1f}, {100 * p.difference.high:+.1f}",
                "leader"
                if name == leader
                else ("no" if name in decision["not_separable_race_rule"] else "yes"),
            ]
        )
    header = [
        "strategy",
        "seeds",
        "val bal. acc",
        "Δ vs leader, points [race rule, one look]",
        "paired 95% t-interval (points)",
        "separated from the leader",
    ]
    return markdown_table(header, rows)


def race_bench_table(folder: Path) -> str:
    """The grid, the race, the race without its budget and the naive race: runs, the winner
    each names (its leader at the end: the advice) and whether the grid cannot separate it from
    its own leader, who is left, and whether all of them are among the strategies the grid
    cannot separate from its leader (by the race's rule at one look / by paired t)."""
    bench = load("race_bench", folder)
    grid, race, replay = bench["grid"], bench["race"], bench["replay_uncapped"]
    by_rule, by_t = set(grid["not_separable_race_rule"]), set(grid["not_separable_paired_t"])
    grid_values = values_of(load("digits_grid", folder), bench["objective"])
    naive = naive_replay({c: grid_values[c] for c in race["record"]["candidates"]})

    def wall(part: dict[str, Any]) -> str:
        load = part.get("load")
        return f"{part['seconds']:.0f} s" + (f" (load {load[0]:.1f}→{load[1]:.1f})" if load else "")

    def row(name: str, runs: int, seconds: str, survivors: list[str], why: str) -> list[str]:
        winner = survivors[0]
        same = "the grid's leader" if winner == grid["leader"] else "not separable from it"
        return [
            name,
            str(runs),
            f"{100 * runs / grid['runs']:.0f}%",
            seconds,
            f"{winner} ({same if winner in by_rule else 'separated from it'})",
            f"{', '.join(survivors)} ({why})",
            f"{_yes(set(survivors) <= by_rule)} / {_yes(set(survivors) <= by_t)}",
        ]

    header = [
        "",
        "runs",
        "share of the grid",
        "wall time",
        "winner (its advice)",
        "left at the end",
        "all left among the grid's leaders? (race rule / paired t)",
    ]
    rows = [
        [
            f"full grid ({grid['candidates']} strategies × {len(grid['seeds'])} seeds)",
            str(grid["runs"]),
            "100%",
            wall(grid),
            f"{grid['leader']} (its leader)",
            f"not separable from it: {', '.join(sorted(by_rule - {grid['leader']}))} (race rule, "
            f"one look) / {', '.join(sorted(by_t - {grid['leader']})) or 'none'} (paired t)",
            "—",
        ],
        row(
            f"race, max_runs={race['max_runs']}",
            race["runs"],
            wall(race),
            race["survivors"],
            race["stop_reason"],
        ),
        row(
            "the same race without max_runs (replayed on the grid's values)",
            replay["runs"],
            "—",
            replay["survivors"],
            replay["stop_reason"],
        ),
        row(
            "the naive race, no budget (paired t vs the leader, Holm, every round; replayed)",
            naive["runs"],
            "—",
            naive["survivors"],
            ", ".join(
                f"{n} out in round {r}" for n, r in naive["eliminated_in"].items() if n in by_rule
            )
            or "none of the grid's leaders dropped",
        ),
    ]
    return markdown_table(header, rows)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def race_orders_table(folder: Path) -> str:
    """The benchmark's race replayed in :data:`ORDERS` seed orders (:mod:`scripts.race_replays`) with
    no tolerance: how often its winner is the grid's leader or not separable from it, how often
    all it leaves is, and the runs it used; with the budget and without."""
    from collections import Counter

    bench = load("race_bench", folder)
    rows = []
    for budget in (bench["race"]["max_runs"], None):
        replay = "rule alone, budget" if budget else "rule alone, no budget"
        grid, races = stored_replays(folder, replay)
        by_rule = set(grid["not_separable_race_rule"])
        winners = Counter(r.survivors[0] for r in races)
        runs = np.array([r.runs for r in races])
        rows.append(
            [
                f"max_runs={budget}" if budget else "no max_runs",
                str(ORDERS),
                f"{100 * np.mean([r.survivors[0] == grid['leader'] for r in races]):.1f}%",
                f"{100 * np.mean([r.survivors[0] in by_rule for r in races]):.1f}%",
                f"{100 * np.mean([set(r.survivors) <= by_rule for r in races]):.1f}%",
                f"{runs.mean():.1f} ({100 * runs.mean() / grid['runs']:.0f}%), at most {runs.max()}",
                ", ".join(f"{name} {count}" for name, count in winners.most_common()),
            ]
        )
    header = [
        "the race",
        "seed orders",
        "winner: the grid's leader",
        "winner not separable from it",
        "all left among the grid's leaders",
        "runs: mean (share of the grid), most",
        "winners",
    ]
    return markdown_table(header, rows)


def race_certificate_table(folder: Path) -> str:
    """The race with a tolerance, replayed in :data:`ORDERS` seed orders (:mod:`scripts.race_replays`;
    no budget but max_seeds): how often it certifies, how often the advised candidate is within
    delta of the grid's leader by its all-seed validation means, its certificate and its runs."""
    from experiments.race.race import CERTIFIED, ONE_LEFT

    rows = []
    for delta, min_seeds in ((0.0, 3), (1.0, 3), (2.0, 3), (2.0, 2)):
        grid, races = stored_replays(folder, f"delta={delta:g} min_seeds={min_seeds}")
        means = grid["means"]
        runs = np.array([r.runs for r in races])
        loss = np.array([100 * (means[grid["leader"]] - means[r.advised]) for r in races])
        rows.append(
            [
                f"{delta:g}",
                str(min_seeds),
                str(ORDERS),
                f"{100 * np.mean([r.stop_reason in (CERTIFIED, ONE_LEFT) for r in races]):.1f}%",
                f"{100 * np.mean(loss <= delta + 1e-9):.1f}%",
                f"{np.median([100 * r.certificate for r in races]):.2f}",
                f"{runs.mean():.1f} ({100 * runs.mean() / grid['runs']:.0f}%)",
            ]
        )
    header = [
        "delta (points)",
        "min_seeds",
        "seed orders",
        "certified within delta",
        "advised within delta of the grid's leader",
        "certificate: median (points)",
        "runs: mean (share of the grid)",
    ]
    return markdown_table(header, rows)


def race_headline_table(folder: Path) -> str:
    """The README's figures: the grid's runs and answer beside the race's by today's rule
    (:class:`RaceSettings`' defaults, the benchmark's budget), replayed on the grid's values in
    :data:`ORDERS` seed orders: its mean runs, its winners' shares of the orders, and the most
    frequent set it could not separate from its winner (with its share)."""
    from collections import Counter

    from experiments.race.settings import RaceSettings

    budget = load("race_bench", folder)["race"]["max_runs"]
    grid, races = stored_replays(folder, "defaults, budget")
    runs = np.mean([r.runs for r in races])
    winners = Counter(r.advised for r in races)
    left = Counter(frozenset(r.survivors) - {r.advised} for r in races)
    ((typical, count),) = left.most_common(1)
    typical_names = sorted(typical, key=lambda name: -grid["means"][name])
    others = len(load("race_bench", folder)["race"]["record"]["candidates"]) - 1
    median = np.median([len(r.survivors) - 1 for r in races])
    rows = [
        [
            f"full grid ({grid['candidates']} strategies × {len(grid['seeds'])} seeds)",
            str(grid["runs"]),
            "100%",
            grid["leader"],
            ", ".join(n for n in grid["not_separable_race_rule"] if n != grid["leader"]),
        ],
        [
            f"race by today's rule (max_runs={budget}, delta={RaceSettings.delta:g}), replayed on "
            f"the grid's values in {ORDERS} seed orders",
            f"{runs:.1f} (mean)",
            f"{100 * runs / grid['runs']:.0f}%",
            ", ".join(f"{n} in {100 * c / ORDERS:.0f}%" for n, c in winners.most_common()),
            f"{median:g} of the other {others} (median); most often ({100 * count / ORDERS:.0f}% "
            f"of orders): {', '.join(typical_names) or 'none'}",
        ],
    ]
    header = [
        "digits, selected on validation",
        "runs",
        "share",
        "winner",
        "not separable from it with these runs",
    ]
    return markdown_table(header, rows)


def race_rounds_table(folder: Path) -> str:
    race = load("race_bench", folder)["race"]["record"]
    rows = []
    for r in race["rounds"]:
        # A record made before the rule's pairwise margins holds one pooled margin per round.
        margin = (
            r["margin"]
            if isinstance(r["margin"], dict)
            else dict.fromkeys(r["eliminated"], r["margin"])
        )
        out = ", ".join(
            f"{c} ({_interval(r['difference'][c], margin[c])})" for c in r["eliminated"]
        )
        rows.append(
            [
                str(r["number"]),
                str(len(r["seeds"])),
                f"{r['level']:.4f}",
                f"{r['critical']:.2f}",
                r["leader"],
                out or "—",
                str(r["runs"]),
            ]
        )
    header = [
        "round",
        "seeds",
        "level",
        "d",
        "leader",
        "eliminated (Δ vs leader, points [race interval])",
        "runs",
    ]
    return markdown_table(header, rows)


def race_rule_table(folder: Path) -> str:
    """:mod:`experiments.race.scenarios`' table: each error rate with its Monte-Carlo standard
    error, marked when above alpha plus two of them."""
    data = load("race_rule", folder)

    def rate(row: dict[str, Any], key: str) -> str:
        flag = "" if row[f"{key}_within"] else " **above alpha + 2 SE**"
        return f"{100 * row[key]:.2f}% ± {100 * row[f'{key}_se']:.2f}{flag}"

    rows = [
        [
            r["scenario"],
            str(r["races"]),
            rate(r, "best_eliminated"),
            rate(r, "best_eliminated_near"),
            rate(r, "understated"),
            f"{100 * r['certified']:.1f}%",
            f"{r['mean_runs']:.1f}",
        ]
        for r in data["rows"]
    ]
    header = [
        "scenario (candidate 0 best)",
        "races per layout",
        "best eliminated, all tied (± MC SE)",
        "best eliminated, others near",
        "certificate below the true loss, others near",
        "certified within delta, others near",
        "mean runs, others near",
    ]
    return markdown_table(header, rows)
