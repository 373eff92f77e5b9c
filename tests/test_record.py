"""A run's MLflow record as MLflow users expect it, read back from a real store: where and how
it ran, which data it saw (one dataset per split, digests that follow the data), the model it
made (loadable, with the run's own predictions), and many classes as tables."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

import runner.tracking.datasets as datasets
from runner.build import build
from runner.tracking.datasets import dataset_inputs, digest_of
from tests.conftest import compose_config
from tests.helpers.cli import run_cli
from tests.helpers.record import assert_record

pytestmark = pytest.mark.slow  # the CLI end to end, training, signals

DIGITS = [
    "data=digits_lt",
    "model=small_cnn",
    "model.width=8",
    "data.val_per_class=5",
    "trainer.epochs=2",
    "trainer.progress=false",
    "tracking.plots=false",
]


def _only_run(uri: str):
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("samplerlab").experiment_id])
    return client, run


def test_a_run_records_how_it_ran_its_datasets_and_a_model_with_its_predictions(
    tmp_path, tracking_uri
):
    run_cli(*DIGITS, "tracking.register=digits-cnn", cwd=tmp_path, uri=tracking_uri)
    client, run = _only_run(tracking_uri)
    assert_record(tracking_uri, run.info.run_id, DIGITS, {"training", "validation", "test"})
    tags = run.data.tags
    assert tags["backend"] == "none" and tags["device"] == "cpu" and tags["precision"] == "float32"
    (version,) = client.search_model_versions("name='digits-cnn'")
    assert version.run_id == run.info.run_id  # registered as asked
    assert {d.dataset.name for d in run.inputs.dataset_inputs} == {
        f"digits_lt-{split}" for split in ("train", "val", "test")
    }


def test_the_datasets_digests_follow_the_data_the_split_and_the_cut():
    def digests(*overrides: str) -> dict[str, str]:
        cfg = compose_config(["data=digits_lt", "data.val_per_class=5", *overrides])
        inputs = dataset_inputs(cfg, build("data", cfg.data))
        return {d.dataset.name.rsplit("-", 1)[1]: d.dataset.digest for d in inputs}

    base = digests()
    assert digests() == base  # the same data: the same digests
    cut = digests("data.imbalance_factor=5")
    assert cut["train"] != base["train"] and cut["test"] == base["test"]
    split = digests("data.val_per_class=6")
    assert split["val"] != base["val"] and split["train"] != base["train"]
    assert digests("data.data_seed=1")["test"] != base["test"]  # another held-out test split
    assert digests("data.num_workers=2") == base  # how it is fed is not what it is


def test_a_split_hashed_a_moment_ago_is_not_read_again_and_nothing_else_is_taken_for_it(
    monkeypatch,
):
    reads = []
    real = datasets.tensor_bytes
    monkeypatch.setattr(datasets, "tensor_bytes", lambda t: reads.append(1) or real(t))
    monkeypatch.setattr(datasets, "_known", {})
    x, y = torch.arange(12.0).reshape(6, 2), torch.tensor([0, 1, 1, 0, 1, 0])
    first = digest_of(x, y)
    assert reads == [1]
    assert digest_of(x, y) == first and reads == [1]  # the same tensors: not read again
    assert digest_of(x.clone(), y) == first and len(reads) == 2  # equal, but another object
    assert digest_of(x, y.flip(0)) != first and len(reads) == 3  # other labels
    hashed = weakref.ref(x)
    del x
    gc.collect()
    assert hashed() is None  # what was hashed is let go: the memo does not hold it
    # An object new at a freed address is not taken for the one hashed there: a remembered
    # digest under this object's address, for an object gone, is not served.
    ones = torch.ones(6, 2)
    gone = torch.zeros(1)
    datasets._known[(id(ones), id(y))] = (weakref.ref(gone), weakref.ref(y), first)
    del gone
    assert digest_of(ones, y) != first
    alive = [torch.randn(2, 2) for _ in range(datasets.RECENT + 3)]
    assert len({digest_of(t, y) for t in alive}) == len(alive)
    assert len(datasets._known) == datasets.RECENT  # the latest alone


def test_a_data_folder_is_mlflows_local_source_without_its_duplicate_warning(tmp_path):
    """MLflow registers its local file source twice, so resolving a local path warns that it
    "can be interpreted in multiple ways" (checked: once MLflow stops, ``LOCAL_TWICE`` goes);
    the runner's source of a data folder is the one MLflow picks, and nothing is printed."""
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source

    from runner.tracking.datasets import _source

    folder = str(tmp_path.resolve())
    with warnings.catch_warnings(record=True) as direct:
        warnings.simplefilter("always")
        expected = resolve_dataset_source(folder)
    assert any("multiple ways" in str(w.message) for w in direct), "MLflow warns no more"
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        source = _source({"root": folder})
    assert not ours, [str(w.message) for w in ours]
    assert type(source).__name__ == type(expected).__name__ == "LocalArtifactDatasetSource"
    assert source.to_dict() == expected.to_dict()


def test_many_classes_are_tables_not_a_metric_key_each(tmp_path, tracking_uri):
    """100 classes: the aggregates and shot groups as metrics, the per-class values in one
    table per evaluation; the report reads them from the table."""
    from experiments.report import build_report, markdown
    from experiments.store import experiment_runs, open_store

    run_cli(
        "data.num_classes=100",
        "data.val_per_class=3",
        "trainer.epochs=2",
        "trainer.progress=false",
        "tracking.plots=false",
        "tracking.log_model=false",
        cwd=tmp_path,
        uri=tracking_uri,
    )
    client, run = _only_run(tracking_uri)
    assert run.data.tags["per_class"] == "table"
    assert len(run.data.metrics) < 150, sorted(run.data.metrics)
    assert {"final/balanced_accuracy", "final/few_accuracy", "val/balanced_accuracy"} <= set(
        run.data.metrics
    )
    tables = {a.path for a in client.list_artifacts(run.info.run_id, "per_class")}
    assert tables == {f"per_class/{n}.json" for n in ("data", "epoch_0001", "epoch_0002", "final")}
    local = client.download_artifacts(run.info.run_id, "per_class/final.json", str(tmp_path))
    final = json.loads(Path(local).read_text())
    assert len(final["data"]) == 100 and "final/recall" in final["columns"]
    store, uri = open_store(tracking_uri)
    (read,) = experiment_runs(store, run.info.experiment_id)
    assert len([k for k in read.metrics if k.startswith("final/recall/")]) == 100
    text = markdown(build_report([read], "one run", plots=False))
    # The shot groups come from the table's training counts: 100 classes in three groups.
    groups = next(line for line in text.splitlines() if line.startswith("| synthetic_lt |"))
    counts = [int(cell.split()[0]) for cell in groups.split("|")[3:6]]
    assert sum(counts) == 100, groups


def test_system_metrics_are_recorded_while_the_run_trains_when_asked(tmp_path, tracking_uri):
    """``tracking.system_metrics=true``: MLflow's own monitor writes ``system/*`` into the run,
    sampled every 0.2 s here (MLflow's setting; its default is 10 s, and a run shorter than one
    interval records none), and stops with it."""
    env = {
        "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "0.2",
        "MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING": "1",
    }
    run_cli(
        *DIGITS,
        "trainer.epochs=8",  # about 2 s
        "tracking.log_model=false",
        "tracking.system_metrics=true",
        cwd=tmp_path,
        uri=tracking_uri,
        env=env,
    )
    client, run = _only_run(tracking_uri)
    assert run.info.status == "FINISHED"
    system = {key for key in run.data.metrics if key.startswith("system/")}
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= system
    history = client.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")
    assert history and all(0 <= m.value <= 100 for m in history)  # psutil: the whole machine
