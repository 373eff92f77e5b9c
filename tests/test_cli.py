"""`python -m runner` as a user runs it: in process (the default run: a fresh interpreter), real
Hydra multiruns, MLflow reads; under other launchers: tests/test_cli_launchers.py."""

from __future__ import annotations

import shutil

import mlflow
import pytest

from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow  # the CLI end to end, training

QUICK = ["trainer.epochs=2", "tracking.plots=false", "tracking.log_model=false"]


def runs_of(uri: str):
    mlflow.set_tracking_uri(uri)
    return mlflow.search_runs(experiment_names=["samplerlab"], output_format="list")


def test_default_store_is_in_the_folder_a_run_starts_in(monkeypatch, tmp_path):
    from runner.tracking.stores import resolve_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert resolve_uri(None) == f"sqlite:///{tmp_path / 'mlflow.db'}"  # samplerlab ui's too
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////elsewhere.db")
    assert resolve_uri(None) == "sqlite:////elsewhere.db"
    assert resolve_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def test_default_run_with_no_arguments(tmp_path, migrated_store, monkeypatch):
    shutil.copy(migrated_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # keep the project's own store out of tests
    done = run_cli(cwd=tmp_path, fresh=True)  # start-up itself: a new interpreter
    assert "final" in done.stdout and "(browse: samplerlab ui)" in done.stdout  # the folder's store
    (run,) = runs_of(uri)
    assert run.info.run_name == "uniform-synthetic_lt-s0" and run.data.tags["sampler"] == "uniform"
    assert run.data.tags["overrides"] == "(none)"
    assert (tmp_path / "mlartifacts").is_dir()


def test_sweep_gives_one_parent_with_nested_children(tmp_path, tracking_uri):
    run_cli(
        "sampler=uniform,weighted",
        "seed=0,1",
        *QUICK,
        cwd=tmp_path,
        uri=tracking_uri,
        multirun=True,
    )
    runs = runs_of(tracking_uri)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 4
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["sweep"] == "parent"
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert sorted(c.info.run_name for c in children) == [
        "uniform-synthetic_lt-s0",
        "uniform-synthetic_lt-s1",
        "weighted-synthetic_lt-s0",
        "weighted-synthetic_lt-s1",
    ]
    for child in children:
        assert child.info.status == "FINISHED"
        assert (
            "test/recall/class_9" in child.data.metrics
            and "sampling/kl_to_target" in child.data.metrics
        )
        assert child.data.tags["overrides"].startswith("sampler=")
