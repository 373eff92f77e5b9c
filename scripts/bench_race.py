"""The race against the full grid on digits: the same 9 strategies, the same seeds 0-9, the same
recipe (``+experiment=digits data.val_per_class=20``), selection on validation.

    python -m scripts.bench_race [--store DIR] [--max-runs 36] [--grid PARENT_ID]
    python -m scripts.bench_race --heads [--store DIR]

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

``--heads`` measures instead what a race of heads on cached features costs
(:data:`HEADS`: digits, a frozen resnet18 from its random initialisation, six candidates x
three seeds, one round of 18 head runs), side by side in one invocation: the race with its heads
stacked (the default), the same race one job at a time (``hydra.sweeper.stack_heads=false``,
as before stacking), and a plain PyTorch loop that trains as many linear heads one by one on the
same cached features (SGD as the trainer's defaults, cross-entropy, uniform batches, no
record). The features are computed once, before any of them is timed. Writes
``docs/results/race_heads_bench.json``: each race's wall time (the process included) and the
time from its first round's launch to its verdict, the loop's time, their ratios, and the largest
difference between the two races' validation values.
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
from scripts.race_replays import write_replays
from scripts.race_tables import grid_decision

LOADS: dict[str, list[float]] = {}
RACED: dict[str, str] = {}  # each sweep's console
ROUNDS = re.compile(r"samplerlab race: over after ([\d.]+) s")
HEADS = [
    "data=digits_lt",
    "data.val_per_class=20",
    "model=torchvision",
    "model.freeze=true",
    "trainer.augment=false",
    "trainer.progress=false",
    "+method=ce,class_balanced,fixed_class,progressive,hard_mined,tau_norm",
    "hydra/sweeper=race",
    "hydra.sweeper.max_runs=18",
]
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
    RACED[experiment] = done.stdout
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


def child_runs(uri: str, parent: str) -> list[Any]:
    """Every child run of the sweep ``parent`` (MLflow's ``Run`` objects)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_run(parent).info.experiment_id
    return list(
        client.search_runs(
            [experiment], f"tags.mlflow.parentRunId = '{parent}'", max_results=50_000
        )
    )


def child_seconds(uri: str, parent: str) -> list[float]:
    """How long each of a sweep's child runs took, start to end, as MLflow recorded them."""
    return [
        (r.info.end_time - r.info.start_time) / 1000
        for r in child_runs(uri, parent)
        if r.info.end_time
    ]


def plain_heads(folder: Path, seeds: Sequence[int], per_seed: int) -> float:
    """Seconds a plain PyTorch loop takes to train ``per_seed`` linear heads one by one on each
    seed's cached features (the race's, reused from ``folder``): the trainer's SGD and schedule,
    cross-entropy, uniform batches of 128, 10 epochs, then the validation split predicted."""
    import torch
    from hydra import compose, initialize_config_dir

    from runner.build import build_parts
    from runner.config import CONF, register
    from runner.train.state import lr_lambda

    register()
    overrides = [o for o in HEADS if not o.startswith(("hydra", "+method"))]
    seconds = 0.0
    for seed in seeds:
        with initialize_config_dir(str(CONF), version_base="1.3"):
            choice = [*overrides, "+method=ce", f"seed={seed}", f"features.cache_dir={folder}"]
            cfg = compose("config", choice)
        parts = build_parts(cfg)
        x, y, trainer = parts.data.train_x, parts.data.train_y, parts.trainer
        assert parts.data.val_x is not None
        steps = -(-len(y) // trainer.batch_size)
        started = time.perf_counter()
        for _ in range(per_seed):
            head = torch.nn.Linear(x.shape[1], parts.data.num_classes)
            optimizer = torch.optim.SGD(
                head.parameters(),
                lr=trainer.lr,
                momentum=trainer.momentum,
                weight_decay=trainer.weight_decay,
                nesterov=trainer.nesterov,
            )
            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(trainer, steps))
            for _ in range(trainer.epochs):
                for idx in torch.randperm(len(y)).split(trainer.batch_size):
                    loss = torch.nn.functional.cross_entropy(head(x[idx]), y[idx])
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    schedule.step()
            with torch.no_grad():
                head(parts.data.val_x).argmax(1)
        seconds += time.perf_counter() - started
    return seconds


def heads_bench(folder: Path) -> dict[str, Any]:
    """:data:`HEADS` three ways (see the module's docstring); the figures as a dict."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    cache = folder / "features"
    common = [*HEADS, f"features.cache_dir={cache}"]
    warm = [o for o in common if not o.startswith(("hydra", "+method"))]
    sweep([*warm, "+method=ce", "seed=0,1,2", "trainer.epochs=1"], uri, "heads-features", folder)
    figures: dict[str, Any] = {"command_race": "python -m runner -m " + " ".join(HEADS)}
    values = {}
    for name, extra in (("one_by_one", ["hydra.sweeper.stack_heads=false"]), ("stacked", [])):
        parent, seconds = sweep([*common, *extra], uri, f"heads-{name}", folder)
        record = race_record(uri, parent)
        values[name] = record["values"]
        rounds = ROUNDS.search(RACED[f"heads-{name}"])
        assert rounds, RACED[f"heads-{name}"][-2000:]
        figures[name] = {
            "seconds": seconds,
            "rounds_seconds": float(rounds.group(1)),  # from round 1's launch to the verdict
            "runs": record["runs"],
            "load": LOADS[f"heads-{name}"],
        }
    before = os.getloadavg()[0]
    loop = plain_heads(cache, (0, 1, 2), 6)
    figures["plain_loop"] = {"seconds": loop, "heads": 18, "load": [before, os.getloadavg()[0]]}
    figures["largest_value_difference"] = max(
        abs(float(v) - float(values["one_by_one"][c][s]))
        for c, by_seed in values["stacked"].items()
        for s, v in by_seed.items()
    )
    one, many = figures["one_by_one"], figures["stacked"]
    figures["ratios"] = {
        "race_wall_stacked_over_one_by_one": many["seconds"] / one["seconds"],
        "rounds_stacked_over_one_by_one": many["rounds_seconds"] / one["rounds_seconds"],
        "race_wall_stacked_over_plain_loop": many["seconds"] / loop,
        "race_wall_one_by_one_over_plain_loop": one["seconds"] / loop,
    }
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--store", type=Path, help="folder for the MLflow store (default: a new temporary one)"
    )
    parser.add_argument("--max-runs", type=int, default=36, help="the race's budget (default 36)")
    parser.add_argument(
        "--grid", metavar="PARENT_ID", help="reuse a finished grid sweep in the store"
    )
    parser.add_argument(
        "--heads", action="store_true", help="a race of heads on cached features, three ways"
    )
    args = parser.parse_args(argv)
    folder = (args.store or Path(tempfile.mkdtemp(prefix="bench-race-"))).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if args.heads:
        figures = heads_bench(folder)
        (tables.RESULTS / "race_heads_bench.json").write_text(json.dumps(figures, indent=1) + "\n")
        print(
            json.dumps({k: figures[k] for k in ("one_by_one", "stacked", "plain_loop", "ratios")})
        )
        return 0
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
    print(f"wrote {write_replays()}")  # the seed-order tables replay the new grid
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
