"""Runs survive: real CLI processes stopped by real signals, resumed (in process) into the same
MLflow run; sweeps stopped and finished; stores shared from the start; every file source end
to end."""

from __future__ import annotations

import json
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers.cli import run_cli, start_cli, wait_for
from tests.test_errors import _write_images

pytestmark = pytest.mark.slow  # the CLI end to end, training, signals

LONG = [
    "data=digits_lt",
    "model=small_cnn",
    "model.width=8",
    "sampler=hard_mined",
    "trainer.epochs=6",
    "trainer.batch_size=16",
    "trainer.progress=false",
    "tracking.plots=false",
    "tracking.log_model=false",
]


def history(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    keys = client.get_run(run_id).data.metrics
    return {k: [(m.step, m.value) for m in client.get_metric_history(run_id, k)] for k in keys}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, migrated_store):
    """One uninterrupted run of LONG: the history every resumed run must reproduce."""
    tmp = tmp_path_factory.mktemp("reference")
    shutil.copy(migrated_store, tmp / "mlflow.db")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    run_cli(*LONG, cwd=tmp, uri=uri)
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("samplerlab").experiment_id])
    return history(client, run.info.run_id)


def only_run(uri: str):
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("samplerlab").experiment_id])
    return client, run


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_stopped_run_resumes_to_the_same_history(how, tmp_path, tracking_uri, reference):
    log = tmp_path / "run.log"
    process = start_cli(*LONG, cwd=tmp_path, log=log, uri=tracking_uri)
    wait_for(log, "epoch 2/6", process)
    time.sleep(0.1)  # into the third epoch
    process.send_signal(getattr(signal, how))
    returncode = process.wait(timeout=60)
    client, run = only_run(tracking_uri)
    if how == "SIGKILL":
        assert returncode == -signal.SIGKILL and run.info.status == "RUNNING"  # nothing could run
    else:
        assert returncode == 143 and run.info.status == "KILLED"
        told = [line for line in log.read_text().splitlines() if "resume=" in line]
        assert len(told) == 1 and f"resume={run.info.run_id}" in told[0]
        assert Path(run.data.tags["checkpoint"]).is_file()
    resumed = run_cli(
        f"resume={run.info.run_id}", "trainer.progress=false", cwd=tmp_path, uri=tracking_uri
    )
    assert "resuming run" in resumed.stdout + resumed.stderr
    client, again = only_run(tracking_uri)  # the same run continued, no second one
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    # Every metric at every step exactly once, and equal to the uninterrupted run's.
    assert history(client, run.info.run_id) == reference


def test_ctrl_c_stops_a_sweep_and_resume_finishes_it(tmp_path, tracking_uri):
    sweep = [
        "sampler=uniform,hard_mined",
        "data=digits_lt",
        "model=small_cnn",
        "model.width=8",
        "trainer.epochs=4",
        "trainer.batch_size=16",
        "trainer.progress=false",
        "tracking.plots=false",
        "tracking.log_model=false",
    ]
    log = tmp_path / "sweep.log"
    process = start_cli(*sweep, cwd=tmp_path, log=log, uri=tracking_uri, multirun=True)
    wait_for(log, "epoch 1/4", process, after="#1 : sampler=hard_mined")
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 130, log.read_text()[-3000:]
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("samplerlab").experiment_id
    runs = {r.info.run_name: r for r in client.search_runs([experiment])}
    parent = next(r for r in runs.values() if r.data.tags.get("sweep") == "parent")
    assert parent.info.status == "KILLED"
    assert runs["uniform-digits_lt-s0"].info.status == "FINISHED"
    assert runs["hard_mined-digits_lt-s0"].info.status == "KILLED"
    assert f"resume={parent.info.run_id}" in log.read_text()

    again = run_cli(
        *sweep, f"resume={parent.info.run_id}", cwd=tmp_path, uri=tracking_uri, multirun=True
    )
    after = client.search_runs([experiment])
    assert len(after) == 3  # one parent, the same two children: nothing run twice
    assert {r.info.status for r in after} == {"FINISHED"}
    assert "already finished" in again.stdout
    children = {
        r.info.run_id for r in after if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    }
    assert children == {
        runs["uniform-digits_lt-s0"].info.run_id,
        runs["hard_mined-digits_lt-s0"].info.run_id,
    }


def test_two_sweeps_on_a_new_store_keep_their_parents(tmp_path):
    uri = f"sqlite:///{tmp_path / 'new.db'}"  # not migrated yet: both processes race for it
    quiet = ["trainer.epochs=1", "tracking.plots=false", "tracking.log_model=false"]
    sweep = ["sampler=uniform,weighted", *quiet]

    def one(_: int):  # two processes: one store, two migrations racing
        return run_cli(*sweep, cwd=tmp_path, uri=uri, multirun=True, fresh=True)

    with ThreadPoolExecutor(max_workers=2) as pool:  # both at once
        for done in pool.map(one, range(2)):
            assert "raised" not in done.stderr, done.stderr[-3000:]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("samplerlab").experiment_id])
    parents = [r for r in runs if r.data.tags.get("sweep") == "parent"]
    assert len(parents) == 2 and len(runs) == 6
    for parent in parents:
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert len(children) == 2 and all(c.info.status == "FINISHED" for c in children)
    sweep_dirs = list((tmp_path / "multirun").glob("*/*"))
    assert len(sweep_dirs) == 2  # one folder each, even when started in the same second


@pytest.mark.parametrize("source", ["cifar100_lt", "cifar10_lt", "image_folder_lt"])
def test_every_file_source_trains_to_the_end_with_every_figure(source, tmp_path, tracking_uri):
    """At the real class count (100 for CIFAR-100-LT): every run with more than 12 classes used
    to fail while drawing its last figure."""
    from runner.app import run
    from tests.conftest import compose_config
    from tests.test_data import write_cifar

    if source == "image_folder_lt":
        layout = {"train": {f"k{c}": 8 for c in range(13)}, "test": {f"k{c}": 2 for c in range(13)}}
        _write_images(tmp_path, layout)
        extra, last = [f"data.cache_dir={tmp_path / 'cache'}", "data.imbalance_factor=4"], "k12"
    else:
        write_cifar(tmp_path, source.removesuffix("_lt"), train_per_class=20, test_per_class=2)
        extra = ["data.verify=false", "data.imbalance_factor=10"]
        last = "c99" if source == "cifar100_lt" else "c9"
    cfg = compose_config(
        [
            f"data={source}",
            f"data.root={tmp_path}",
            *extra,
            "model=small_cnn",
            "model.width=8",
            "trainer.epochs=1",
            "trainer.progress=false",
            f"tracking.uri={tracking_uri}",
        ]
    )
    run(cfg)
    client, found = only_run(tracking_uri)
    assert found.info.status == "FINISHED"
    if source == "cifar100_lt":  # above tracking.per_class_max: per-class values as a table
        from runner.train.recorder import read_class_table

        local = client.download_artifacts(found.info.run_id, "per_class/final.json", str(tmp_path))
        table = read_class_table(json.loads(Path(local).read_text()))
        assert last in table["final/recall"] and last in table["sampling/target"]
        assert not any(key.startswith("final/recall/") for key in found.data.metrics)
    else:
        assert f"final/recall/{last}" in found.data.metrics
        assert f"sampling/target/{last}" in found.data.metrics
    artifacts = {a.path for a in client.list_artifacts(found.info.run_id)}
    assert {
        "confusion_matrix.png",
        "per_class_accuracy.png",
        "sampled_class_shares.png",
    } <= artifacts


def test_a_validation_split_chooses_the_best_epoch_honestly(tracking_uri):
    from runner.app import run
    from tests.conftest import compose_config

    cfg = compose_config(
        [
            "data.val_per_class=20",
            "trainer.epochs=3",
            "trainer.progress=false",
            "tracking.plots=false",
            f"tracking.uri={tracking_uri}",
        ]
    )
    summary = run(cfg)
    client, found = only_run(tracking_uri)
    metrics = found.data.metrics
    assert "val/balanced_accuracy" in metrics and 1 <= summary["best/epoch"] <= 3
    val = client.get_metric_history(found.info.run_id, "val/balanced_accuracy")
    best_step = max(val, key=lambda m: (m.value, -m.step)).step  # the first epoch that peaks
    assert summary["best/epoch"] == best_step
    test = {
        m.step: m.value
        for m in client.get_metric_history(found.info.run_id, "test/balanced_accuracy")
    }
    assert summary["best/balanced_accuracy"] == test[best_step]  # test numbers of that epoch
    # Carved before the cut: 20 per class, and the training counts still follow the profile.
    assert metrics["data/train_count/class_0"] == 500
