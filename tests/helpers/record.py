"""Checking a run's MLflow record as a user reads it back: MLflow's context tags, how it ran,
its datasets, a logged model that reproduces the run's own test metrics, and the checkpoint a
finished run logged."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
from mlflow.tracking import MlflowClient
from sklearn.metrics import balanced_accuracy_score, recall_score

from runner.build import build
from runner.tracking.flavor import mlflow_pytorch
from tests.conftest import compose_config

ENVIRONMENT = ("world_size", "backend", "device", "precision", "torch", "threads", "host")


def assert_record(
    uri: str, run_id: str, overrides: list[str], contexts: set[str], world_size: int = 1
) -> None:
    """The run ``run_id`` (trained with ``overrides``) has MLflow's context tags, the
    environment tags (``world_size`` processes), one dataset per split in ``contexts``, and a
    model that, loaded as a user would, gives the run's final test metrics exactly."""
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    tags = run.data.tags
    assert tags["mlflow.source.type"] == "LOCAL" and tags["mlflow.user"], tags
    assert tags["mlflow.source.name"].endswith("__main__.py"), tags["mlflow.source.name"]
    assert len(tags["mlflow.source.git.commit"]) == 40
    assert all(key in tags for key in ENVIRONMENT), tags
    assert tags["world_size"] == str(world_size) and tags["torch"] == torch.__version__
    inputs = run.inputs.dataset_inputs
    seen = {t.value for d in inputs for t in d.tags if t.key == "mlflow.data.context"}
    assert seen == contexts, seen
    assert len({d.dataset.digest for d in inputs}) == len(inputs)  # every split its own data

    mlflow.set_tracking_uri(uri)
    model = mlflow_pytorch().load_model(f"runs:/{run_id}/model")
    info = mlflow.models.get_model_info(f"runs:/{run_id}/model")
    cfg = compose_config(overrides)
    data = build("data", cfg.data)
    assert info.signature is not None and info.metadata["class_names"] == data.class_names
    test_x = data.test_x
    if not torch.is_tensor(test_x):
        test_x = test_x.__getitems__(list(range(len(test_x))))
    with torch.no_grad():
        predicted = torch.cat(
            [model(chunk).argmax(1) for chunk in test_x.split(cfg.trainer.eval_batch_size)]
        ).numpy()
    truth = data.test_y.numpy()
    metrics = run.data.metrics
    assert balanced_accuracy_score(truth, predicted) == metrics["final/balanced_accuracy"]
    labels = np.arange(data.num_classes)
    recall = recall_score(truth, predicted, average=None, labels=labels, zero_division=0)
    for name, value in zip(data.class_names, recall, strict=True):
        if f"final/recall/{name}" in metrics:
            assert value == metrics[f"final/recall/{name}"], name


def logged_checkpoint(uri: str, run_id: str) -> dict[str, Any]:
    """The checkpoint the finished run ``run_id`` logged (a run outside a Hydra app removes its
    temporary copy when it finishes), loaded as ``resume=`` loads it."""
    with tempfile.TemporaryDirectory() as folder:
        path = mlflow.artifacts.download_artifacts(
            run_id=run_id,
            artifact_path="checkpoint/checkpoint.pt",
            dst_path=folder,
            tracking_uri=uri,
        )
        return dict(torch.load(Path(path), weights_only=True))
