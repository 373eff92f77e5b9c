"""Evidence across tasks: the race's advice against the test-best candidate and a careful
engineer's baselines, task by task.

    python -m scripts.bench_advice [--store DIR] [--cache DIR] [--only NAME ...]

For every task of :data:`TASKS` (data no test of the suite tunes on: the CIFAR-10-LT cuts at
four imbalance factors and a second validation size, with the frozen ImageNet-pretrained
EfficientNet-Lite0 of :mod:`scripts.bench_features` at 224 px; digits at two imbalance factors
on a frozen resnet18 at its random initialisation; a synthetic set on the default MLP frozen at
its initialisation; digits and synthetic with data seeds of their own), in one store. Every task
freezes its backbone, so that the baselines fit the very features the candidates' classifiers
see: the comparison is of ways to train a classifier on given features, not of models.

1. the race (``hydra/sweeper=race``, its defaults) over :data:`scripts.bench_features.CANDIDATES`:
   its advice, runs and wall time (the process included), and the features its jobs computed
   (their ``features: computed`` lines: the CIFAR cuts share one bank, so only the first
   computes any);
2. the full grid, every candidate x :data:`GRID_SEEDS` seeds: the race's first round, which
   trains exactly that (``min_seeds`` = 3 for every candidate), read from its child runs rather
   than trained again; its runs and the span of their MLflow start and end times. The grid's
   test-best candidate is the one whose three runs have the highest mean test balanced
   accuracy (the test split read once per run, after training; nothing selects on it but this
   benchmark's reference);
3. the advice's test balanced accuracy, the mean of its own three grid runs (the same seeds as
   every other candidate's), and the regret: the test-best's mean minus it;
4. :mod:`scripts.baselines` on the same features (read back from the runner's feature bank):
   logistic regression with post-hoc logit adjustment, the class-weighted one, nearest class
   mean, each chosen on the validation split.

A task passes when the advice is within the race's ``delta`` (1 point) of the test-best and at
most ``delta`` below the best baseline. Writes ``docs/results/advice_bench.json`` after each
task (a stopped benchmark keeps what it measured; ``--only`` adds to it) and renders the table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import mean
from typing import Any

from scripts import tables
from scripts.artifacts import ROOT, export_runs
from scripts.baselines import baselines, cached_features
from scripts.bench_features import (
    ARCHIVE,
    BACKBONE,
    CANDIDATES,
    FEATURES_LINE,
    pretrained_weights,
    runner,
    store_uri,
    unpack,
)
from scripts.bench_race import child_runs, race_record

OBJECTIVE = "val/balanced_accuracy"
TEST = "final/balanced_accuracy"
GRID_SEEDS = (0, 1, 2)  # the race's min_seeds: its first round is the grid
RESULT = "advice_bench"
COMMON = ["trainer.progress=false", "tracking.plots=false", "tracking.log_model=false"]


def cifar(imbalance_factor: int, val_per_class: int) -> list[str]:
    """A CIFAR-10-LT cut of the JPEG export on the pretrained frozen backbone at 224 px (the
    root and weights are added by :func:`task_overrides`)."""
    return [
        "data=image_folder_lt",
        f"data.imbalance_factor={imbalance_factor}",
        f"data.val_per_class={val_per_class}",
        "model=timm",
        f"model.name={BACKBONE}",
        "model.freeze=true",
        "model.image_size=224",
        "trainer.augment=false",
        "features.engine=onnxruntime",
    ]


# Digits on a frozen torchvision resnet18 (its random initialisation: no download), as the race
# benchmark's stacked heads; synthetic on the default MLP frozen at its initialisation.
DIGITS = [
    "data=digits_lt",
    "data.val_per_class=20",
    "data.data_seed=3",
    "model=torchvision",
    "model.freeze=true",
    "trainer.augment=false",
]
SYNTHETIC = ["data=synthetic_lt", "data.val_per_class=20", "data.data_seed=11", "model.freeze=true"]
# name -> overrides, the cheap tasks first. Data seeds other than the configs' defaults (0),
# which the tests use.
TASKS: dict[str, list[str]] = {
    "synthetic_lt_if100": SYNTHETIC,
    "digits_lt_if10": [*DIGITS, "data.imbalance_factor=10"],
    "digits_lt_if50": [*DIGITS, "data.imbalance_factor=50"],
    "cifar10_lt_if100": cifar(100, 100),
    "cifar10_lt_if100_val20": cifar(100, 20),
    "cifar10_lt_if10": cifar(10, 100),
    "cifar10_lt_if50": cifar(50, 100),
    "cifar10_lt_if200": cifar(200, 100),
}


def task_overrides(name: str, cache: Path) -> list[str]:
    """The task's overrides with the machine's paths: the JPEG tree, the weights file and the
    features cache (one bank for every CIFAR cut: another cut computes only images it lacks)."""
    overrides = [*TASKS[name], *COMMON, f"features.cache_dir={cache}"]
    if name.startswith("cifar"):
        overrides += [f"data.root={unpack(ARCHIVE)}", f"model.weights={pretrained_weights()}"]
    return overrides


def grid(runs: list[dict[str, Any]], candidates: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Every candidate's runs of seeds :data:`GRID_SEEDS` (finished): mean validation and test
    balanced accuracy, and the seeds found."""
    out = {}
    for name in candidates:
        mine = [
            r
            for r in runs
            if r["tags"].get("method") == name
            and r["status"] == "FINISHED"
            and int(r["params"]["seed"]) in GRID_SEEDS
            and TEST in r["metrics"]
        ]
        out[name] = {
            "seeds": sorted(int(r["params"]["seed"]) for r in mine),
            "val": mean(r["metrics"][OBJECTIVE] for r in mine) if mine else None,
            "test": mean(r["metrics"][TEST] for r in mine) if mine else None,
            "span": [min(r["start_time"] for r in mine), max(r["end_time"] for r in mine)]
            if mine
            else None,
        }
    return out


def run_task(name: str, store: Path, cache: Path) -> dict[str, Any]:
    """One task: the race, its grid, the baselines; the figures :func:`verdict` reads."""
    uri = store_uri(store)
    overrides = task_overrides(name, cache)
    args = [*overrides, "hydra/sweeper=race", f"+method={CANDIDATES}"]
    out, seconds = runner(args, store, f"advice-{name}", multirun=True)
    found = re.search(r"sweep parent run (\w+)", out)
    if not found:
        raise SystemExit(f"{name}: no parent run in the race's output:\n{out[-2000:]}")
    record = race_record(uri, found.group(1))
    runs = export_runs(uri, found.group(1))["runs"]
    ends = end_times(uri, found.group(1))  # export_runs keeps the start; the span needs the end
    for run in runs:
        run["end_time"] = ends[run["run_id"]]
    candidates = CANDIDATES.split(",")
    table = grid(runs, candidates)
    complete = {n: g for n, g in table.items() if g["seeds"] == list(GRID_SEEDS)}
    advised = record["advised"] or record["survivors"][0]
    if advised not in complete:  # the regret compares means over the same three seeds
        raise SystemExit(f"{name}: the advised {advised} lacks a finished run of seed {GRID_SEEDS}")
    best = max(complete, key=lambda n: complete[n]["test"])
    spans = [g["span"] for g in complete.values()]
    started = time.perf_counter()
    base = baselines(cached_features(overrides))
    computed = FEATURES_LINE.findall(out)  # the rows the race's jobs had to compute
    return {
        "overrides": TASKS[name],
        "features_computed": {
            "rows": sum(int(rows) for rows, _, _ in computed),
            "seconds": sum(float(seconds) for _, _, seconds in computed),
        },
        "race": {
            "advised": advised,
            "runs": record["runs"],
            "seconds": seconds,
            "stop_reason": record["stop_reason"],
            "certificate": record["certificate"],
        },
        "grid": {
            "candidates": table,
            "runs": sum(len(g["seeds"]) for g in table.values()),
            "seconds": (max(s[1] for s in spans) - min(s[0] for s in spans)) / 1000,
            "test_best": best,
        },
        "baselines": base,
        "baselines_seconds": time.perf_counter() - started,
        "delta": record["delta"] / 100,
    }


def end_times(uri: str, parent: str) -> dict[str, int]:
    """When each child run of ``parent`` ended (ms), by run id."""
    return {r.info.run_id: int(r.info.end_time or 0) for r in child_runs(uri, parent)}


def verdict(task: dict[str, Any]) -> dict[str, Any]:
    """The advice against the test-best and the best baseline, within ``delta``."""
    candidates = task["grid"]["candidates"]
    advised = candidates[task["race"]["advised"]]["test"]
    best = candidates[task["grid"]["test_best"]]["test"]
    rows = task["baselines"]["rows"]
    baseline = max(rows, key=lambda n: rows[n]["test_balanced_accuracy"])
    base = rows[baseline]["test_balanced_accuracy"]
    delta = task["delta"]
    return {
        "advised_test": advised,
        "best_test": best,
        "regret": best - advised,
        "best_baseline": baseline,
        "best_baseline_test": base,
        "within_delta_of_best": advised >= best - delta,
        "not_below_baseline": advised >= base - delta,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--store", type=Path, help="folder for the MLflow store and Hydra's outputs"
    )
    parser.add_argument("--cache", type=Path, help="the features cache (default: in --store)")
    parser.add_argument("--only", nargs="+", choices=list(TASKS), help="these tasks alone")
    args = parser.parse_args(argv)
    folder = (args.store or Path(tempfile.mkdtemp(prefix="bench-advice-"))).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    cache = (args.cache or folder / "cache").resolve()
    path = tables.RESULTS / f"{RESULT}.json"
    summary: dict[str, Any] = json.loads(path.read_text()) if args.only and path.is_file() else {}
    summary.update(
        {
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{os.cpu_count()} CPU cores",
            "command": "python -m scripts.bench_advice " + " ".join(argv or sys.argv[1:]),
            "candidates": CANDIDATES.split(","),
            "grid_seeds": list(GRID_SEEDS),
        }
    )
    summary.setdefault("tasks", {})
    for name in args.only or list(TASKS):
        task = run_task(name, folder, cache)
        task["verdict"] = verdict(task)
        task["command"], task["date"] = summary["command"], summary["date"]  # --only mixes runs
        task["candidates"] = summary["candidates"]
        summary["tasks"][name] = task
        summary["tasks"] = {n: summary["tasks"][n] for n in TASKS if n in summary["tasks"]}
        path.write_text(json.dumps(summary, indent=1) + "\n")
        print(f"{name}: {json.dumps(task['verdict'])}", flush=True)
        for written in tables.write():
            print(f"rendered tables in {written.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
