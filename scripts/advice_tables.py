"""The tables of ``scripts.bench_advice`` (``docs/results/advice_bench.json``): the race's
advice beside the test-best candidate and the baselines, task by task, and the tally."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scripts.artifacts import load, markdown_table

BASELINES = ("lr_la", "lr_balanced", "ncm")


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def _row(name: str, task: dict[str, Any]) -> list[str]:
    verdict, race, grid = task["verdict"], task["race"], task["grid"]
    rows = task["baselines"]["rows"]
    return [
        name,
        f"{race['advised']} {_pct(verdict['advised_test'])}",
        f"{grid['test_best']} {_pct(verdict['best_test'])}",
        f"{100 * verdict['regret']:+.1f}",
        f"{race['runs']} runs, {race['seconds']:.0f} s",
        f"{grid['runs']} runs, {grid['seconds']:.0f} s",
        *(_pct(rows[b]["test_balanced_accuracy"]) for b in BASELINES),
        "yes" if verdict["within_delta_of_best"] else "**no**",
        "yes" if verdict["not_below_baseline"] else "**no**",
    ]


def advice_bench_table(folder: Path) -> str:
    """One row a task: the advice and the grid's test-best (test balanced accuracy, %), the
    regret in points, the race's and the grid's cost, the baselines' test balanced accuracy,
    and whether the advice passes; then the tally."""
    bench = load("advice_bench", folder)
    tasks = bench["tasks"]
    header = [
        "task",
        "advice (test %)",
        "test-best of the grid (%)",
        "regret (points)",
        "race",
        "grid (its first round)",
        "LR + logit adj. (%)",
        "LR balanced (%)",
        "nearest class mean (%)",
        "within delta of the best",
        "at least the best baseline - delta",
    ]
    table = markdown_table(header, [_row(name, task) for name, task in tasks.items()])
    verdicts = [task["verdict"] for task in tasks.values()]
    near = sum(v["within_delta_of_best"] for v in verdicts)
    above = sum(v["not_below_baseline"] for v in verdicts)
    deltas = {task["delta"] for task in tasks.values()}
    delta = ", ".join(_pct(d) for d in sorted(deltas))
    computed = {
        n: t["features_computed"] for n, t in tasks.items() if t["features_computed"]["rows"]
    }
    features = "; ".join(
        f"{name}'s race computed {f['rows']:,} rows' features in {f['seconds']:.0f} s"
        for name, f in computed.items()
    )
    return table + (
        f"\nIn {near} of {len(tasks)} tasks the advice is within delta ({delta} points) of the "
        f"grid's test-best candidate; in {above} of {len(tasks)} it is at most delta below the "
        f"best baseline. {features or 'No race computed features'}; every other task's race "
        "found all of its features in the bank.\n"
    )
