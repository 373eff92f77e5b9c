"""The race against the full grid on digits: the same 9 strategies, the same seeds 0-9, the same
recipe (``+experiment=digits data.val_per_class=20``), selection on validation.

    python -m scripts.bench_race [--store DIR] [--max-runs 36] [--grid PARENT_ID]

1. the grid: every strategy on every seed (90 runs), one look at the end: its leader, and the
   strategies not separable from it (the race's rule at one look, alpha 0.05; also the report's
   uncorrected paired t-intervals);
2. the race (``hydra/sweeper=race``) with a budget of ``--max-runs`` (default 36: 40% of the
   grid);
3. the same race replayed on the grid's values (:func:`experiments.race.race.replay`): with the
   budget it must repeat the real race exactly (a seed's run repeats exactly on a CPU), without
   it, it shows how many runs the race needs on its own.

The race reaches the grid's decision when its winner (its leader at the end, what its advice
names) is the grid's leader or one the grid cannot separate from it; all its survivors among
those leaders is the stricter reading, and both are recorded. Writes
``docs/results/digits_grid.json`` (the grid's runs) and ``docs/results/race_bench.json``, then
renders the tables (:mod:`scripts.tables`). Both sweeps run with the basic launcher, one
job at a time; CPU heavy (the grid took 522 s on 2 lightly loaded cores).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.race.race import Race, replay
from experiments.race.settings import RaceSettings
from scripts import tables
from scripts.artifacts import values_of
from scripts.race_tables import grid_decision

LOADS: dict[str, list[float]] = {}
GRID = ["+experiment=digits", "seed=range(10)", "data.val_per_class=20"]
OBJECTIVE = "val/balanced_accuracy"


def sweep(args: list[str], uri: str, experiment: str, cwd: Path) -> tuple[str, float]:
    """Run ``python -m runner -m ARGS`` into ``uri``; (its parent run id, wall seconds). The
    machine's 1-minute load average before and after goes into :data:`LOADS`: on a shared
    machine a wall time means little without it."""
    command = [sys.executable, "-m", "runner", "-m", *args]
    command += [f"tracking.uri={uri}", f"tracking.experiment={experiment}"]
    print("$", " ".join(command[1:]), flush=True)
    before, started = os.getloadavg()[0], time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    LOADS[experiment] = [before, os.getloadavg()[0]]
    if done.returncode != 0:
        raise SystemExit(f"the sweep failed ({done.returncode}):\n{done.stderr[-3000:]}")
    found = re.search(r"sweep parent run (\w+)", done.stdout)
    assert found, done.stdout[-2000:]
    print(f"  {seconds:.0f} s, parent run {found.group(1)}", flush=True)
    return found.group(1), seconds


def race_record(uri: str, parent: str) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory() as folder:
        path = MlflowClient(tracking_uri=uri).download_artifacts(parent, "race.json", folder)
        return json.loads(Path(path).read_text())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--store", type=Path, help="folder for the MLflow store (default: a new temporary one)"
    )
    parser.add_argument("--max-runs", type=int, default=36, help="the race's budget (default 36)")
    parser.add_argument(
        "--grid", metavar="PARENT_ID", help="reuse a finished grid sweep in the store"
    )
    args = parser.parse_args(argv)
    folder = (args.store or Path(tempfile.mkdtemp(prefix="bench-race-"))).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    print(f"store: {uri}", flush=True)

    grid_seconds = float("nan")
    grid_parent = args.grid
    if grid_parent is None:
        grid_parent, grid_seconds = sweep(GRID, uri, "bench-race-grid", folder)
    grid_runs = tables.export_runs(uri, grid_parent)
    (tables.RESULTS / "digits_grid.json").write_text(json.dumps(grid_runs, indent=1) + "\n")
    values = values_of(grid_runs, OBJECTIVE)
    decision = grid_decision(values)
    seeds = decision["seeds"]

    race_args = [*GRID, "hydra/sweeper=race", f"hydra.sweeper.max_runs={args.max_runs}"]
    race_parent, race_seconds = sweep(race_args, uri, "bench-race-race", folder)
    record = race_record(uri, race_parent)

    # The same race on the grid's values: with the budget it is the real race again.
    table = {(c, s): v for c, by_seed in values.items() for s, v in by_seed.items()}
    order = list(record["candidates"])
    capped = replay(Race(order, seeds, RaceSettings(max_runs=args.max_runs)), table)
    uncapped = replay(Race(order, seeds), table)
    repeats = max(
        abs(float(v) - values[c][int(s)])
        for c, by_seed in record["values"].items()
        for s, v in by_seed.items()
    )
    grid_set = set(decision["not_separable_race_rule"])
    summary = {
        "command_grid": "python -m runner -m " + " ".join(GRID),
        "command_race": "python -m runner -m " + " ".join(race_args),
        "objective": OBJECTIVE,
        "grid": {
            "runs": len(table),
            "candidates": len(values),
            "seconds": grid_seconds,
            "load": LOADS.get("bench-race-grid"),
            **decision,
        },
        "race": {
            "runs": record["runs"],
            "seconds": race_seconds,
            "load": LOADS.get("bench-race-race"),
            "max_runs": args.max_runs,
            "leader_matches": record["survivors"][0] == decision["leader"],
            "survivors": record["survivors"],
            "stop_reason": record["stop_reason"],
            "eliminated_in": record["eliminated_in"],
            "winner_among_grid_leaders": record["survivors"][0] in grid_set,
            "decision_reached": set(record["survivors"]) <= grid_set,
            "within_paired_t_leaders": set(record["survivors"])
            <= set(decision["not_separable_paired_t"]),
            "largest_difference_to_the_grid_values": repeats,
            "record": record,
        },
        "replay_capped_equals_race": capped.survivors == record["survivors"]
        and capped.runs == record["runs"],
        "replay_uncapped": {
            "runs": uncapped.runs,
            "survivors": uncapped.survivors,
            "stop_reason": uncapped.stop_reason,
            "eliminated_in": uncapped.eliminated_in,
        },
    }
    (tables.RESULTS / "race_bench.json").write_text(json.dumps(summary, indent=1) + "\n")
    for path in tables.write():
        print(f"rendered tables in {path.relative_to(tables.ROOT)}")
    share = record["runs"] / len(table)
    print(
        f"grid: {len(table)} runs, {grid_seconds:.0f} s: {decision['leader']} leads; not separable: "
        f"{', '.join(decision['not_separable_race_rule'])}\n"
        f"race: {record['runs']} runs ({100 * share:.0f}% of the grid), {race_seconds:.0f} s: survivors "
        f"{', '.join(record['survivors'])} ({record['stop_reason']}); its winner among the grid's "
        f"leaders: {summary['race']['winner_among_grid_leaders']}; all survivors among them: "
        f"{summary['race']['decision_reached']}; replay equals the race: {summary['replay_capped_equals_race']}\n"
        f"without a budget the race would use {uncapped.runs} runs: survivors {', '.join(uncapped.survivors)}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
