"""One tiny real sweep (2 samplers x 2 seeds, 2 epochs, synthetic data), run once per test
session and shared by the report and browser tests."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from mlflow.tracking import MlflowClient

from tests.helpers.cli import run_cli

COMMAND = [
    "+experiment=synthetic",
    "sampler=uniform,hybrid",
    "seed=0,1",
    "trainer.epochs=2",
    "data.val_per_class=10",
    "tracking.plots=false",
]


@dataclass(frozen=True)
class Sweep:
    uri: str
    experiment_id: str
    parent_run_id: str
    parent_name: str
    child_names: tuple[str, ...]
    stdout: str


_done: dict[Path, Sweep] = {}


def tiny_sweep(folder: Path, migrated_store: Path) -> Sweep:
    """Run ``python -m runner -m +experiment=synthetic ...`` into a store in ``folder`` (once)."""
    if folder in _done:
        return _done[folder]
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "mlflow.db"
    shutil.copy(migrated_store, db)
    uri = f"sqlite:///{db}"
    done = run_cli(*COMMAND, cwd=folder, uri=uri, multirun=True)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("study-synthetic")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.sweep = 'parent'")
    children = client.search_runs(
        [experiment.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    _done[folder] = Sweep(
        uri,
        experiment.experiment_id,
        parent.info.run_id,
        parent.info.run_name,
        tuple(sorted(r.info.run_name for r in children)),
        done.stdout,
    )
    return _done[folder]
