"""The race sweeper end to end: ``python -m runner -m hydra/sweeper=race`` in process on
synthetic data (IF 100, 2-3 epochs), a real MLflow store (as real processes, stopped by a signal
or launching through joblib: tests/test_race_processes.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import mlflow
import pytest
import torch
from mlflow.models import Model
from mlflow.tracking import MlflowClient

from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow  # the CLI end to end, training, signals

# One torch thread (idle OpenMP threads spin: about half the CPU of a 2-epoch job here) and no
# checkpoint but the one a signal takes: the jobs cost what the race needs, little more.
QUICK = [
    "data.val_per_class=30",
    "tracking.plots=false",
    "trainer.progress=false",
    "trainer.threads=1",
    "trainer.checkpoint_every=0",
    "tracking.log_model=false",
]


def race(
    args: list[str], cwd: Path, timeout: float = 300, fresh: bool = False
) -> subprocess.CompletedProcess[str]:
    """``python -m runner -m hydra/sweeper=race *args``; the test reads its exit status."""
    return run_cli(
        "hydra/sweeper=race",
        *args,
        cwd=cwd,
        multirun=True,
        timeout=timeout,
        expect=None,
        fresh=fresh,
    )


def sweep_runs(uri: str) -> tuple[MlflowClient, object, list]:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("samplerlab").experiment_id
    runs = client.search_runs([experiment])
    (parent,) = [r for r in runs if r.data.tags.get("sweep") == "parent"]
    children = [r for r in runs if r is not parent]
    return client, parent, children


def test_a_race_eliminates_uniform_within_its_budget(tmp_path, tracking_uri):
    done = race(
        [
            "sampler=uniform,weighted,hybrid,hard_mined",
            "hydra.sweeper.max_runs=24",
            "trainer.epochs=2",
            *QUICK,
            f"tracking.uri={tracking_uri}",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    client, parent, children = sweep_runs(tracking_uri)
    tags, metrics = parent.data.tags, parent.data.metrics
    assert parent.info.status == "FINISHED"
    assert "uniform" in tags["advice/eliminated"].split(",")
    assert "uniform" not in tags["advice/winner"].split(",")
    assert set(tags["advice/winner"].split(",")) <= {"weighted", "hybrid", "hard_mined"}
    assert 12 <= metrics["advice/runs_used"] <= 24 and metrics["advice/rounds"] >= 1
    # Every job is one FINISHED child of this parent: nothing else ran, nothing ran twice.
    assert len(children) == metrics["advice/runs_used"]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert {c.info.status for c in children} == {"FINISHED"}
    files = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"advice.md", "advice.html", "race.json", "report.md", "report.html"} <= files
    folder = tmp_path / "artifacts"
    client.download_artifacts(parent.info.run_id, "", str(folder))
    record = json.loads((folder / "race.json").read_text())
    assert record["runs"] == len(children) and record["eliminated_in"]["uniform"] >= 1
    # uniform is far behind on validation: out as soon as the race first looks.
    assert record["eliminated_in"]["uniform"] == 1
    advice = (folder / "advice.md").read_text()
    assert "The test set, once" in advice and "final/balanced_accuracy" in advice
    assert "data:image/png;base64," in (folder / "advice.html").read_text()
    # The sentence is printed too, and the report of the sweep still works on the parent.
    sentence = re.search(r"samplerlab race: (use .*)\.\n", done.stdout)
    assert sentence and "uniform out in round 1" in sentence.group(1)
    assert f"{tags['advice/winner'].split(',')[0]}" in sentence.group(1)
    assert "samplerlab report: sweep" in done.stdout


def test_a_race_on_chance_level_features_advises_no_winner_and_says_why(tmp_path, tracking_uri):
    """Class means that coincide (data.separation=0): every candidate sits at 1/10 balanced
    accuracy, and the race names none (nor logs a model) and says why; the report after it
    calls its test-set comparisons a confirmation."""
    done = race(
        [
            "sampler=uniform,weighted",
            "data.separation=0",
            "hydra.sweeper.max_seeds=3",
            "trainer.epochs=2",
            *QUICK,
            f"tracking.uri={tracking_uri}",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    client, parent, _ = sweep_runs(tracking_uri)
    tags = parent.data.tags
    said = re.search(r"samplerlab race: (.*)\.\n", done.stdout)
    assert said and said.group(1).startswith("no candidate learned: check the data or the backbone")
    assert "beat chance (0.1000, 1/10 classes)" in said.group(1)
    assert tags["advice/learned"] == "false"
    assert tags["advice/advised"] == tags["advice/winner"] == "(none: no candidate learned)"
    assert "advice/model_from" not in tags
    folder = tmp_path / "artifacts"
    client.download_artifacts(parent.info.run_id, "", str(folder))
    assert "no candidate learned" in (folder / "advice.md").read_text()
    assert "a confirmation, not a second verdict" in (folder / "report.md").read_text()


def test_a_test_set_objective_or_no_validation_split_is_refused(tmp_path, tracking_uri):
    """Before any parent run is created: one line, exit 2, nothing in the store."""
    commands = {
        "test set": ["sampler=uniform,weighted", "objective=final/balanced_accuracy", *QUICK],
        "no split": ["sampler=uniform,weighted", "tracking.plots=false"],
    }
    done = {
        name: race([*args, f"tracking.uri={tracking_uri}"], tmp_path, timeout=120)
        for name, args in commands.items()
    }
    said = {name: ran.stderr for name, ran in done.items()}
    assert {ran.returncode for ran in done.values()} == {2}, said
    assert "RaceSweeper sweeper would select on the test set" in said["test set"]
    assert "needs a validation split" in said["no split"]
    assert all(len(text.strip().splitlines()) <= 2 for text in said.values()), said
    client = MlflowClient(tracking_uri)
    experiments = client.search_experiments()
    assert not client.search_runs([e.experiment_id for e in experiments])


def test_a_diverging_candidate_is_out_and_the_resumed_race_replays_it(tmp_path, tracking_uri):
    """loss=ce,ldam on a linear head: ldam diverges (LDAM's scale 30 is meant for a cosine
    head), the race answers ce and says why; resumed, it decides the same without training."""
    args = ["loss=ce,ldam", "trainer.epochs=2", *QUICK, f"tracking.uri={tracking_uri}"]
    done = race(args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    sentence = re.search(r"samplerlab race: (use .*)\.\n", done.stdout)
    assert sentence and sentence.group(1).startswith("use ce: no candidate is more than")
    said = re.search(r"ldam out in round 1: (diverged at epoch \d on seeds? [\d, ]+)", done.stdout)
    assert said, done.stdout[-3000:]
    assert f"out: ldam ({said.group(1)})" in done.stdout  # the round's console line
    client, parent, children = sweep_runs(tracking_uri)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["advice/winner"] == "ce"
    assert parent.data.tags["advice/eliminated"] == "ldam"
    failed = [c for c in children if c.info.status == "FAILED"]
    assert failed and {c.data.tags["loss"] for c in failed} == {"ldam"}
    assert {c.data.tags["failure"].split(" on ")[0] for c in failed} <= {
        "diverged at epoch 1",
        "diverged at epoch 2",
    }
    assert {c.info.status for c in children} <= {"FINISHED", "FAILED"}  # none left RUNNING
    folder = tmp_path / "artifacts"
    client.download_artifacts(parent.info.run_id, "", str(folder))
    assert said.group(1) in (folder / "advice.md").read_text()
    record = json.loads((folder / "race.json").read_text())
    assert record["eliminated_in"] == {"ldam": 1} and set(record["failed"]) == {"ldam"}

    again = race([*args, f"resume={parent.info.run_id}"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert sentence.group(1) in again.stdout  # the same decision, word for word
    assert "not run again" in again.stderr or "not run again" in again.stdout
    _, parent, after = sweep_runs(tracking_uri)
    assert {c.info.run_id for c in after} == {c.info.run_id for c in children}  # nothing new
    assert parent.info.status == "FINISHED" and parent.data.tags["advice/winner"] == "ce"


def test_race_children_log_no_model_and_the_advised_one_is_on_the_parent(tmp_path, tracking_uri):
    """Lean children: no MLflow model and no plots on any child (the sweeper's defaults), its
    checkpoint kept, evaluated after its last epoch alone (every epoch's training record kept);
    the advised candidate's model rebuilt from its best seed's checkpoint,
    logged on the parent, loadable and registered; the certificate and the epochs on the parent."""
    dropped = ("tracking.log_model", "tracking.plots", "trainer.checkpoint_every")
    lean = [a for a in QUICK if not a.startswith(dropped)]
    done = race(
        [
            "sampler=uniform,weighted",
            "hydra.sweeper.min_seeds=2",
            "hydra.sweeper.max_seeds=2",
            "trainer.epochs=2",
            "tracking.register=race_advised",
            *lean,
            f"tracking.uri={tracking_uri}",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    client, parent, children = sweep_runs(tracking_uri)
    experiment = parent.info.experiment_id
    models = client.search_logged_models([experiment])
    assert [m.source_run_id for m in models] == [parent.info.run_id]
    for child in children:
        files = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert "checkpoint" in files and not any(f.endswith(".png") for f in files)
        steps = {
            key: [m.step for m in client.get_metric_history(child.info.run_id, key)]
            for key in (
                "train/loss",
                "sampling/kl_to_target",
                "val/balanced_accuracy",
                "test/f1/class_0",
            )
        }
        assert steps == {
            "train/loss": [1, 2],
            "sampling/kl_to_target": [1, 2],
            "val/balanced_accuracy": [2],
            "test/f1/class_0": [2],
        }
        assert child.data.params["trainer.eval_every"] == "0"
    advised = parent.data.tags["advice/advised"]
    source = client.get_run(parent.data.tags["advice/model_from"])
    assert source.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert source.info.run_name.startswith(f"{advised}-")  # <sampler>-<data>-s<seed>
    mlflow.set_tracking_uri(tracking_uri)
    local = mlflow.artifacts.download_artifacts(f"runs:/{parent.info.run_id}/model")
    example = Model.load(local).load_input_example(local)
    model = mlflow.pytorch.load_model(local)
    assert model(torch.as_tensor(example)).shape[0] == len(example)
    assert client.get_registered_model("race_advised").name == "race_advised"
    metrics = parent.data.metrics
    assert metrics["advice/runs_used"] == 4 and metrics["advice/epochs"] == 8  # 2 epochs each
    assert 0 <= metrics["advice/certificate"] < 100
    assert "no candidate is more than" in done.stdout


# Linear heads on a frozen backbone's cached features, two epochs, a race of two seeds each.
HEADS = [
    "model.freeze=true",
    "trainer.augment=false",
    "trainer.epochs=2",
    "hydra.sweeper.min_seeds=2",
    "hydra.sweeper.max_seeds=2",
]


def test_heads_on_cached_features_race_at_once_as_one_by_one(tmp_path, tracking_uri):
    """The same race on a frozen backbone's cached features, its heads stacked (the default) and
    each job through the launcher (``hydra.sweeper.stack_heads=false``): the same decisions, and
    children with the same params, tags and metric keys, every value within the stacked heads'
    tolerance (tests/test_stacked.py: 2.4e-5 relative for 4 epochs of 10 batches; 2 epochs
    here), accuracies equal. The stacked race says so on its console. fixed_class draws whole
    batches: its heads stack apart (9 batches an epoch, not 10). cRT trains alone, launched
    seed by seed before that seed's heads are prepared: they reuse the data and features it
    built."""
    common = [
        "+method=ce,class_balanced,hard_mined,fixed_class,crt",
        *HEADS,
        f"features.cache_dir={tmp_path / 'features'}",
        *QUICK,
        f"tracking.uri={tracking_uri}",
    ]
    stacked = race([*common, "tracking.experiment=stacked"], tmp_path)
    alone = race(
        [*common, "tracking.experiment=alone", "hydra.sweeper.stack_heads=false"], tmp_path
    )
    assert stacked.returncode == alone.returncode == 0, stacked.stderr[-3000:] + alone.stderr
    assert "8 head runs on cached features at once" in stacked.stdout
    assert "head runs on cached features at once" not in alone.stdout
    reused = "data: as an earlier run here built it"
    assert stacked.stdout.count(reused) == 8, stacked.stdout[-3000:]  # every head's
    client = MlflowClient(tracking_uri)

    def children(name: str) -> dict[str, object]:
        experiment = client.get_experiment_by_name(name).experiment_id
        runs = [r for r in client.search_runs([experiment]) if r.data.tags.get("sweep") != "parent"]
        assert all(r.info.status == "FINISHED" for r in runs)
        return {r.info.run_name: r for r in runs}

    one, many = children("alone"), children("stacked")
    assert sorted(one) == sorted(many) and len(one) == 10
    relative = 2 * 10 * 10 * 2**-24
    for name, run in one.items():
        other = many[name]
        ignored = {"tracking.experiment"}
        params = {k: v for k, v in run.data.params.items() if k not in ignored}
        assert params == {k: v for k, v in other.data.params.items() if k not in ignored}
        # One by one, cRT forks CE's epoch from the snapshot CE's run left (the same values);
        # stacked, it is launched before the heads and trains that epoch itself.
        forked = {"prefix.forked_epochs"}
        assert set(run.data.tags) - forked == set(other.data.tags) - forked, name
        assert set(run.data.metrics) == set(other.data.metrics), name
        for key, value in run.data.metrics.items():
            if key == "cost/epochs_trained":  # the epochs it did not fork
                continue
            if "accuracy" in key or "recall" in key:
                assert other.data.metrics[key] == value, (name, key)
            else:
                assert other.data.metrics[key] == pytest.approx(value, rel=relative, abs=1e-9)
        steps = [m.step for m in client.get_metric_history(other.info.run_id, "train/loss")]
        epochs = 2 + 10 if name.startswith("crt") else 2  # cRT's classifier epochs: 10
        assert steps == list(range(1, epochs + 1)), name
    verdict = re.compile(r"samplerlab race: use .*")
    assert verdict.findall(stacked.stdout) == verdict.findall(alone.stdout)


def test_a_stacked_head_that_diverges_is_out_and_the_others_race_on(tmp_path, tracking_uri):
    """Heads stacked: the head whose loss turns non-finite ends FAILED with its reason (its
    gradients were its own), the others train to the end; the race reads the failure as it
    reads one from a job run alone."""
    done = race(
        [
            "trainer.lr=0.05,1e38",
            *HEADS,
            f"features.cache_dir={tmp_path / 'features'}",
            *QUICK,
            f"tracking.uri={tracking_uri}",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "4 head runs on cached features at once" in done.stdout
    assert "diverged at epoch 1" in done.stdout
    _, parent, children = sweep_runs(tracking_uri)
    status = {(r.data.params["trainer.lr"], r.data.params["seed"]): r for r in children}
    for seed in ("0", "1"):
        failed = status[("1e+38", seed)]
        assert failed.info.status == "FAILED"
        assert failed.data.tags["failure"].startswith("diverged at epoch 1")
        assert status[("0.05", seed)].info.status == "FINISHED"
    assert parent.data.tags["advice/advised"] == "0.05"
