"""Sweeps under Hydra's launchers: joblib's workers and submitit's jobs are processes of their
own, started from a fresh ``python -m runner -m``; a job that fails fails its run and the parent
under each; a launcher's config composes, and one not installed is named with its extra."""

from __future__ import annotations

import pytest

from runner.extras import installed
from tests.helpers.cli import run_cli
from tests.test_cli import QUICK, runs_of

pytestmark = pytest.mark.slow  # the CLI end to end, training


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
