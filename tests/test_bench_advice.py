"""scripts.bench_advice: the grid read from the race's runs, the verdict, and its table."""

from __future__ import annotations

import json

import pytest

from scripts.advice_tables import advice_bench_table
from scripts.bench_advice import GRID_SEEDS, TASKS, grid, verdict

pytestmark = pytest.mark.unit


def run(method: str, seed: int, val: float, test: float, status: str = "FINISHED") -> dict:
    return {
        "tags": {"method": method},
        "status": status,
        "params": {"seed": str(seed)},
        "metrics": {"val/balanced_accuracy": val, "final/balanced_accuracy": test},
        "start_time": 1000 * seed,
        "end_time": 1000 * seed + 500,
    }


def test_the_grid_is_every_candidates_finished_runs_of_the_grid_seeds():
    """A later round's seed and a failed run are not the grid's; the means are over the rest."""
    runs = [run("ce", s, 0.5 + s / 100, 0.4 + s / 100) for s in GRID_SEEDS]
    runs += [run("ce", 3, 0.9, 0.9), run("lws", 0, 0.7, 0.7), run("lws", 1, 0.1, 0.1, "FAILED")]
    table = grid(runs, ["ce", "lws", "crt"])
    assert table["ce"]["seeds"] == list(GRID_SEEDS)
    assert table["ce"]["test"] == pytest.approx(0.41)
    assert table["ce"]["span"] == [0, 2500]
    assert table["lws"]["seeds"] == [0] and table["lws"]["val"] == 0.7
    assert table["crt"] == {"seeds": [], "val": None, "test": None, "span": None}


def task(advised: float, best: float, baseline: float, delta: float = 0.01) -> dict:
    return {
        "race": {"advised": "a", "runs": 45, "seconds": 10.0},
        "grid": {
            "candidates": {"a": {"test": advised}, "b": {"test": best}},
            "test_best": "b",
            "runs": 45,
            "seconds": 5.0,
        },
        "baselines": {
            "rows": {
                "lr_la": {"test_balanced_accuracy": baseline},
                "lr_balanced": {"test_balanced_accuracy": baseline - 0.02},
                "ncm": {"test_balanced_accuracy": 0.1},
            }
        },
        "features_computed": {"rows": 0, "seconds": 0.0},
        "delta": delta,
    }


@pytest.mark.parametrize(
    ("advised", "best", "baseline", "delta", "near", "above"),
    [
        (0.80, 0.805, 0.79, 0.01, True, True),
        (0.80, 0.811, 0.79, 0.01, False, True),  # the regret exceeds delta
        (0.80, 0.80, 0.811, 0.01, True, False),  # more than delta below the best baseline
        (0.75, 0.875, 0.875, 0.125, True, True),  # delta exactly (binary fractions): within
    ],
)
def test_the_verdict_compares_within_delta(advised, best, baseline, delta, near, above):
    found = verdict(task(advised, best, baseline, delta))
    assert found["within_delta_of_best"] is near
    assert found["not_below_baseline"] is above
    assert found["regret"] == pytest.approx(best - advised)
    assert found["best_baseline"] == "lr_la"


def test_the_table_counts_the_tasks_that_pass(tmp_path):
    tasks = {"one": task(0.80, 0.805, 0.79), "two": task(0.70, 0.75, 0.70)}
    tasks["two"]["features_computed"] = {"rows": 23156, "seconds": 125.9}
    for name in tasks:
        tasks[name]["verdict"] = verdict(tasks[name])
    (tmp_path / "advice_bench.json").write_text(json.dumps({"tasks": tasks}))
    table = advice_bench_table(tmp_path)
    assert "In 1 of 2 tasks the advice is within delta (1.0 points)" in table
    assert "in 2 of 2 it is at most delta below" in table
    assert "two's race computed 23,156 rows' features in 126 s" in table
    assert table.count("**no**") == 1


def test_the_tasks_are_the_issues_eight():
    """CIFAR-10-LT at four imbalance factors and a second validation size (no test reads it),
    digits at two, synthetic: eight; digits and synthetic on a data seed of their own, not the
    configs' default (0) that the tests use."""
    assert len(TASKS) == 8
    assert sum(name.startswith("cifar10_lt_if") for name in TASKS) == 5
    for name, overrides in TASKS.items():
        seeds = [o.split("=")[1] for o in overrides if o.startswith("data.data_seed=")]
        assert name.startswith("cifar") or (len(seeds) == 1 and seeds[0] != "0"), name
