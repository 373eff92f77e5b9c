"""`python -m runner` as a user runs it: in process, a fresh interpreter for the default run and
for launchers whose jobs are other processes; real Hydra multiruns, MLflow reads."""

from __future__ import annotations

import shutil

import mlflow
import pytest

from runner.extras import installed
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


@pytest.mark.skipif(
    installed("hydra_plugins.hydra_ray_launcher"), reason="the ray extra is installed here"
)
def test_a_launcher_not_installed_is_one_line_naming_its_extra(tmp_path):
    done = run_cli(
        "hydra/launcher=ray", "sampler=uniform,weighted", cwd=tmp_path, multirun=True, expect=2
    )
    assert done.stderr == (
        "samplerlab: hydra/launcher=ray: needs hydra_ray_launcher, which is not installed\n"
        "pip install 'samplerlab[ray]'\n"
    )
    assert list(tmp_path.iterdir()) == []  # refused before Hydra made its sweep folder


def test_default_run_with_no_arguments(tmp_path, migrated_store, monkeypatch):
    shutil.copy(migrated_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # keep the project's own store out of tests
    done = run_cli(cwd=tmp_path, fresh=True)  # start-up itself: a new interpreter
    assert "final" in done.stdout and f"mlflow ui --backend-store-uri {uri}" in done.stdout
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


@pytest.mark.parametrize(
    "launcher",
    # submitit's local executor runs each job as its own process, as on a SLURM cluster.
    [["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], ["hydra/launcher=submitit_local"]],
    ids=["joblib", "submitit_local"],
)
def test_sweep_under_other_launchers_joins_the_parent(launcher, tmp_path, tracking_uri):
    run_cli(
        *launcher,
        "sampler=hard_mined,fixed_class",
        *QUICK,
        cwd=tmp_path,
        uri=tracking_uri,
        multirun=True,
        fresh=True,  # the launcher starts the jobs' processes from a real one
    )
    runs = runs_of(tracking_uri)
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 2 and all(c.info.status == "FINISHED" for c in children)
    assert parent.info.status == "FINISHED"


def test_the_slurm_launcher_config_composes(tmp_path):
    shown = run_cli(
        "hydra/launcher=slurm", "hydra.launcher.partition=gpu", "--cfg", "hydra", cwd=tmp_path
    )
    assert "SlurmLauncher" in shown.stdout and "partition: gpu" in shown.stdout


@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_a_failed_job_fails_its_run_and_the_parent(tmp_path, tracking_uri, launcher):
    # lr=1e30 diverges: the loss turns non-finite, the job stops naming trainer.lr.
    done = run_cli(
        f"hydra/launcher={launcher}",
        "trainer.lr=0.1,1e30",
        "trainer.warmup_epochs=0",
        *QUICK,
        cwd=tmp_path,
        uri=tracking_uri,
        multirun=True,
        expect=2,
        fresh=launcher != "basic",  # joblib's jobs: processes of their own
    )
    assert "trainer.lr=1e+30: the training loss became non-finite" in done.stderr, done.stderr
    runs = runs_of(tracking_uri)
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    statuses = sorted(r.info.status for r in runs if "mlflow.parentRunId" in r.data.tags)
    assert statuses == ["FAILED", "FINISHED"]
    assert parent.info.status == "FAILED"
