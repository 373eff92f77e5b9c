"""The race's tables: the validation grid and its decision, the benchmark of the race against
the grid, the race's rounds, and the elimination rule's simulated error rates, each rendered from
a stored artifact in ``docs/results/`` (:mod:`experiments.tables` writes them into the docs)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.artifacts import load, markdown_table, values_of

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
    import numpy as np

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
        "margin": float(seen.margin[0]),
        "not_separable_race_rule": sorted(mcb, key=lambda n: -seen.means[0, names.index(n)]),
        "not_separable_paired_t": paired,
    }


def naive_replay(values: dict[str, dict[int, float]]) -> dict[str, Any]:
    """The naive race (:func:`experiments.race.simulate.naive_races`: paired t-tests against the
    leader after every round, Holm, nothing for the repeated looks) on a grid's values."""
    import numpy as np

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
                "leader"
                if name == leader
                else f"{100 * diff:+.1f} [{100 * (diff - decision['margin']):+.1f}, {100 * (diff + decision['margin']):+.1f}]",
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
    """The grid, the race, the race without its budget and the naive race: runs, the leader,
    who is left, and whether that is the grid's decision (the survivors among the strategies
    the grid cannot separate from its leader, by the race's rule at one look / by paired t)."""
    bench = load("race_bench", folder)
    grid, race, replay = bench["grid"], bench["race"], bench["replay_uncapped"]
    by_rule, by_t = set(grid["not_separable_race_rule"]), set(grid["not_separable_paired_t"])
    grid_values = values_of(load("digits_grid", folder), bench["objective"])
    naive = naive_replay({c: grid_values[c] for c in race["record"]["candidates"]})

    def wall(part: dict[str, Any]) -> str:
        load = part.get("load")
        return f"{part['seconds']:.0f} s" + (f" (load {load[0]:.1f}→{load[1]:.1f})" if load else "")

    def row(name: str, runs: int, seconds: str, survivors: list[str], why: str) -> list[str]:
        reached = "yes" if set(survivors) <= by_rule else "no"
        reached_t = "yes" if set(survivors) <= by_t else "no"
        return [
            name,
            str(runs),
            f"{100 * runs / grid['runs']:.0f}%",
            seconds,
            survivors[0],
            f"{', '.join(survivors)} ({why})",
            f"{reached} / {reached_t}",
        ]

    header = [
        "",
        "runs",
        "share of the grid",
        "wall time",
        "leader",
        "left at the end",
        "the grid's decision? (race rule / paired t)",
    ]
    rows = [
        [
            f"full grid ({grid['candidates']} strategies × {len(grid['seeds'])} seeds)",
            str(grid["runs"]),
            "100%",
            wall(grid),
            grid["leader"],
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


def race_rounds_table(folder: Path) -> str:
    race = load("race_bench", folder)["race"]["record"]
    rows = []
    for r in race["rounds"]:
        out = ", ".join(
            f"{c} ({100 * r['difference'][c]:+.1f} [{100 * (r['difference'][c] - r['margin']):+.1f}, {100 * (r['difference'][c] + r['margin']):+.1f}])"
            for c in r["eliminated"]
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
    data = load("race_rule", folder)
    rows = []
    for r in data["rows"]:
        power = "—"
        if "worse_out_by_round_2" in r:
            power = f"{r['worse_out_by_round_2'] / r['races']:.3f} (≥ {r['worse_out_by_round_2_lower95']:.3f})"
        rows.append(
            [
                r["scenario"],
                str(r["races"]),
                f"{r['best_eliminated'] / r['races']:.4f} (≤ {r['best_eliminated_upper95']:.4f})",
                power,
                f"{r['mean_runs']:.1f}",
            ]
        )
    header = [
        "scenario (candidate 0 best)",
        "races",
        "best eliminated (95% upper bound)",
        "the worse one out by round 2 (95% lower bound)",
        "mean runs",
    ]
    return markdown_table(header, rows)
