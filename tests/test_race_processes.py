"""The race sweeper as real processes: a race stopped by a real SIGTERM and resumed, a race whose
rounds joblib launches in worker processes, and the plugin found by a fresh interpreter started
outside the repository."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.cli import environment, runner_args
from tests.test_race import QUICK, race, sweep_runs

pytestmark = pytest.mark.slow  # the CLI end to end, training, signals

RUN = [sys.executable, *runner_args(("hydra/sweeper=race",), multirun=True)]


def _stopped_race(args: list[str], cwd: Path, job: int, epoch: str) -> Path:
    """A race started in ``cwd`` and stopped by SIGTERM once job ``#job`` logs ``epoch`` (e.g.
    ``"epoch 1/3"``); it must end as a signal ends it (143). Returns its log."""
    log = cwd / "race.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [*RUN, *args],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environment({"PYTHONUNBUFFERED": "1"}),
        )
    deadline = time.monotonic() + 240
    while epoch not in log.read_text().partition(f"#{job} : ")[2]:
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 143, log.read_text()[-3000:]
    return log


def test_a_race_stopped_by_sigterm_resumes_to_its_end(tmp_path, tracking_uri):
    args = [
        "sampler=uniform,weighted,hybrid",
        "hydra.sweeper.min_seeds=2",
        "hydra.sweeper.max_seeds=3",
        "hydra.sweeper.delta=0",  # no tolerance: weighted and hybrid race on into round 2
        "trainer.epochs=3",
        *QUICK,
        f"tracking.uri={tracking_uri}",
    ]
    # Round 1 is jobs #0-#5; stop the first job of round 2 in its first epoch.
    log = _stopped_race(args, tmp_path, 6, "epoch 1/3")
    client, parent, before = sweep_runs(tracking_uri)
    assert parent.info.status == "KILLED"
    stopped = {c.info.run_id for c in before if c.info.status != "FINISHED"}
    assert f"resume={parent.info.run_id}" in log.read_text()

    again = race([*args, f"resume={parent.info.run_id}"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    _, parent, children = sweep_runs(tracking_uri)
    assert parent.info.status == "FINISHED"
    assert {c.info.status for c in children} == {"FINISHED"}  # none left RUNNING or KILLED
    assert len(children) == parent.data.metrics["advice/runs_used"]  # nothing run twice
    assert stopped <= {c.info.run_id for c in children}  # the stopped job was continued
    assert "already finished" in again.stdout  # round 1 replayed from the store
    assert parent.data.tags["advice/winner"] and "uniform" not in parent.data.tags["advice/winner"]


def test_a_race_stopped_between_a_seeds_heads_and_the_next_seeds_jobs_leaves_none_running(
    tmp_path, tracking_uri
):
    """Heads on cached features (ce) and cRT (launched), seed by seed: seed 0's cRT, seed 0's
    head prepared (its run open), then seed 1's cRT, stopped by SIGTERM as it trains. No run is
    left RUNNING: the prepared head ends KILLED with the stopped job and the parent."""
    args = [
        "+method=ce,crt",
        "model.freeze=true",
        "trainer.augment=false",
        "trainer.epochs=2",
        "hydra.sweeper.min_seeds=2",
        "hydra.sweeper.max_seeds=2",
        f"features.cache_dir={tmp_path / 'features'}",
        *QUICK,
        f"tracking.uri={tracking_uri}",
    ]
    # The heads are jobs #0-#1, cRT #2 (seed 0) and #3 (seed 1): stop #3 in its first epoch.
    _stopped_race(args, tmp_path, 3, "epoch 1/12")
    _, parent, children = sweep_runs(tracking_uri)
    assert parent.info.status == "KILLED"
    statuses = {
        c.info.run_name.split("-")[0] + c.data.params["seed"]: c.info.status for c in children
    }
    assert statuses == {"crt0": "FINISHED", "ce0": "KILLED", "crt1": "KILLED"}, statuses


def test_a_race_launches_its_rounds_through_joblib(tmp_path, tracking_uri):
    """Through the configured launcher (two joblib workers): every round's jobs are children of
    the one parent, and the race decided on the values its children recorded."""
    done = race(
        [
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            "sampler=uniform,weighted",
            "hydra.sweeper.min_seeds=2",
            "hydra.sweeper.max_seeds=3",
            "trainer.epochs=2",
            *QUICK,
            f"tracking.uri={tracking_uri}",
        ],
        tmp_path,
        fresh=True,  # joblib's workers: processes of their own
    )
    assert done.returncode == 0, done.stderr[-3000:]
    client, parent, children = sweep_runs(tracking_uri)
    assert parent.info.status == "FINISHED" and {c.info.status for c in children} == {"FINISHED"}
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    folder = tmp_path / "artifacts"
    client.download_artifacts(parent.info.run_id, "race.json", str(folder))
    record = json.loads((folder / "race.json").read_text())
    assert record["runs"] == len(children) == parent.data.metrics["advice/runs_used"]
    recorded = {
        (c.data.tags["sampler"], int(c.data.params["seed"])): c.data.metrics[
            "val/balanced_accuracy"
        ]
        for c in children
    }
    raced = {(n, int(s)): v for n, by_seed in record["values"].items() for s, v in by_seed.items()}
    assert raced == recorded
    assert parent.data.tags["advice/winner"].split(",")[0] == "weighted"  # uniform: far behind


def test_the_plugin_is_found_from_outside_the_repository(tmp_path):
    shown = subprocess.run(
        [sys.executable, "-m", "runner", "hydra/sweeper=race", "--cfg", "hydra"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=environment({"PYTHONUNBUFFERED": "1"}),
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "_target_: hydra_plugins.samplerlab_race.race_sweeper.RaceSweeper" in shown.stdout
    assert "min_seeds: 3" in shown.stdout and "alpha: 0.05" in shown.stdout
