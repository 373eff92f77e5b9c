"""Sweeps under Hydra's launchers: joblib's workers are processes of their own, started from a
fresh ``python -m runner -m``; a job that fails fails its run and the parent, whose children every
job joins; a launcher's config composes, and one not installed is named with its extra. (A sweep
under submitit's local executor, stopped and resumed: tests/test_faults_sweeps.py.)"""

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


def test_the_slurm_launcher_config_composes(tmp_path):
    shown = run_cli(
        "hydra/launcher=slurm", "hydra.launcher.partition=gpu", "--cfg", "hydra", cwd=tmp_path
    )
    assert "SlurmLauncher" in shown.stdout and "partition: gpu" in shown.stdout


@pytest.mark.parametrize(
    "launcher",
    # joblib's workers are processes of their own, started from a real one; a sweep's jobs
    # under submitit's local executor (each its own process, as on a SLURM cluster) join the
    # parent in tests/test_faults_sweeps.py, stopped and resumed.
    [["hydra/launcher=basic"], ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]],
    ids=["basic", "joblib"],
)
def test_a_failed_job_fails_its_run_and_the_parent(tmp_path, tracking_uri, launcher):
    # lr=1e30 diverges: the loss turns non-finite, the job stops naming trainer.lr. hard_mined
    # reads each batch's losses back: its feedback works in a worker process too.
    done = run_cli(
        *launcher,
        "sampler=hard_mined",
        "trainer.lr=0.1,1e30",
        "trainer.warmup_epochs=0",
        *QUICK,
        cwd=tmp_path,
        uri=tracking_uri,
        multirun=True,
        expect=2,
        fresh=launcher != ["hydra/launcher=basic"],
    )
    assert "trainer.lr=1e+30: the training loss became non-finite" in done.stderr, done.stderr
    runs = runs_of(tracking_uri)
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(runs) == 3 and len(children) == 2  # every job joined the sweep's parent
    assert sorted(r.info.status for r in children) == ["FAILED", "FINISHED"]
    assert parent.info.status == "FAILED"
