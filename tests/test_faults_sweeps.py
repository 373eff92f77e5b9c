"""A sweep stopped while its jobs run in other processes (joblib's workers, submitit's jobs):
no run is left RUNNING, and resume finishes every job from where it stopped."""

from __future__ import annotations

import signal
import time

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers.cli import run_cli, start_cli
from tests.test_faults import QUICK

pytestmark = pytest.mark.slow  # the CLI end to end, training, signals

SWEEP = [
    "sampler=uniform,hard_mined",
    "data=digits_lt",
    "model=small_cnn",
    "model.width=8",
    "trainer.epochs=5",
    "trainer.batch_size=16",
    *QUICK,
]
LAUNCHERS = {
    "joblib": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
    "submitit_local": ["hydra/launcher=submitit_local"],
}


@pytest.mark.parametrize(
    ("launcher", "how"), [("joblib", signal.SIGTERM), ("submitit_local", signal.SIGINT)]
)
def test_a_stopped_sweep_leaves_no_run_running_and_resume_finishes_it(
    launcher, how, tmp_path, tracking_uri
):
    command = [*SWEEP, *LAUNCHERS[launcher]]
    log = tmp_path / "sweep.log"
    process = start_cli(*command, cwd=tmp_path, log=log, uri=tracking_uri, multirun=True)
    client = MlflowClient(tracking_uri)
    deadline = time.monotonic() + 240
    while True:  # both jobs in flight, each past its first epoch
        experiment = client.get_experiment_by_name("samplerlab")
        runs = client.search_runs([experiment.experiment_id]) if experiment else []
        children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
        if len(children) == 2 and all("train/loss" in r.data.metrics for r in children):
            break
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    process.send_signal(how)
    assert process.wait(timeout=120) == 128 + how, log.read_text()[-3000:]
    runs = client.search_runs([experiment.experiment_id])
    assert {r.info.status for r in runs} <= {"KILLED", "FINISHED"}, log.read_text()[-3000:]
    parent = next(r for r in runs if r.data.tags.get("sweep") == "parent")
    assert parent.info.status == "KILLED" and f"resume={parent.info.run_id}" in log.read_text()

    # submitit's jobs resume in processes of their own again, from a real one (a sweep under it
    # that ends); joblib's in this process, one after the other (Hydra's basic launcher): what
    # resume does is the jobs' own, the stop above was the launcher's part.
    resume = f"resume={parent.info.run_id}"
    again = command if launcher == "submitit_local" else SWEEP
    fresh = launcher == "submitit_local"
    run_cli(*again, resume, cwd=tmp_path, uri=tracking_uri, multirun=True, fresh=fresh)
    after = client.search_runs([experiment.experiment_id])
    assert len(after) == 3 and {r.info.status for r in after} == {"FINISHED"}
    for child in after:
        if child.info.run_id != parent.info.run_id:
            assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
            steps = [m.step for m in client.get_metric_history(child.info.run_id, "train/loss")]
            assert steps == [1, 2, 3, 4, 5]  # continued, not restarted, no epoch twice
