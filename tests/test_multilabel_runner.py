"""The runner on multi-label data and on rare positives, in process with a real sqlite store:
every multi-label strategy trains and records mAP, per-class AP and the drawn label shares; a
binary 95/5 run records average precision, ROC AUC and the threshold chosen on validation; an
optimising sweeper refuses an objective the data do not report."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from runner.app import run
from runner.checks import check_objective
from runner.errors import UserError
from runner.results import objective
from runner.train.multilabel_evaluation import MultiLabelEvaluation
from runner.train.run import Progress
from tests.conftest import compose_config

pytestmark = pytest.mark.unit

QUICK = ["trainer.epochs=2", "trainer.progress=false", "tracking.log_model=false"]
# Binary data, 95:5 in training, a balanced validation split: the rare-positive metrics.
BINARY = [
    "data.num_classes=2",
    "data.imbalance_factor=19",
    "data.n_max=950",
    "data.val_per_class=40",
]
MULTILABEL = ["data=synthetic_multilabel", "data.val_fraction=0.2", "data.train_size=1500"]
NAMES = [f"class_{c}" for c in range(10)]
RACE = "hydra_plugins.samplerlab_race.race_sweeper.RaceSweeper"


def only_run(uri: str) -> tuple[dict[str, float], list[str]]:
    client = MlflowClient(uri)
    (found,) = client.search_runs([client.get_experiment_by_name("samplerlab").experiment_id])
    assert found.info.status == "FINISHED"
    files = [a.path for a in client.list_artifacts(found.info.run_id)]
    return found.data.metrics, files


@pytest.mark.parametrize(
    ("sampler", "loss"),
    [
        ("multilabel/instance", "multilabel/bce"),
        ("multilabel/class_aware", "multilabel/db"),
        ("multilabel/weighted", "multilabel/cb_bce"),
    ],
)
def test_a_multilabel_strategy_trains_and_records_map_ap_and_drawn_shares(
    tracking_uri: str, sampler: str, loss: str
) -> None:
    cfg = compose_config(
        [*QUICK, *MULTILABEL, f"sampler={sampler}", f"loss={loss}", f"tracking.uri={tracking_uri}"]
    )
    results = run(cfg)
    metrics, files = only_run(tracking_uri)
    for key in ("val/mAP", "test/mAP", "final/mAP", "best/mAP", "sampling/labels_per_draw"):
        assert math.isfinite(metrics[key]), key
    assert results["val/mAP"] == metrics["val/mAP"]
    assert {f"test/ap/{c}" for c in NAMES} <= set(metrics)
    shares = [metrics[f"sampling/share/{c}"] for c in NAMES]
    targets = [metrics[f"sampling/target/{c}"] for c in NAMES]
    assert math.isclose(sum(shares), 1.0) and math.isclose(sum(targets), 1.0)
    assert "classification_report.txt" in files and "confusion_matrix.png" not in files
    # The checkpoint a resumed run starts from restores the multi-label evaluations.
    client = MlflowClient(tracking_uri)
    (found,) = client.search_runs([client.get_experiment_by_name("samplerlab").experiment_id])
    saved = client.download_artifacts(found.info.run_id, "checkpoint/checkpoint.pt")
    progress = Progress()
    progress.load_state_dict(torch.load(saved, weights_only=True)["progress"])
    assert isinstance(progress.latest, MultiLabelEvaluation)
    assert progress.latest.mAP == metrics["final/mAP"]
    assert isinstance(progress.best, MultiLabelEvaluation) and progress.latest_val is not None
    assert progress.best.mAP == metrics["best/mAP"]
    assert progress.best_score >= progress.latest_val.mAP  # the best validation mAP so far


def test_a_binary_95_5_run_records_ap_roc_auc_and_the_validation_threshold(
    tracking_uri: str,
) -> None:
    cfg = compose_config(
        [*QUICK, *BINARY, "eval.target_precision=0.8", f"tracking.uri={tracking_uri}"]
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="figure .* skipped")  # else only a warning
        results = run(cfg)
    metrics, files = only_run(tracking_uri)
    assert "precision_recall.png" in files
    assert metrics["data/train_count/class_1"] == 50
    for key in ("test/average_precision", "test/roc_auc", "test/threshold", "test/recall"):
        assert math.isfinite(metrics[key]), key
    assert metrics["test/target_precision"] == 0.8 and "val/average_precision" in metrics
    # What a race on average precision reads: the run's results, the final values logged too.
    assert results["val/average_precision"] == metrics["val/average_precision"]
    assert metrics["final/average_precision"] == metrics["test/average_precision"]
    raced = OmegaConf.merge(cfg, {"objective": "val/average_precision"})
    assert objective(raced, results) == metrics["val/average_precision"]


@pytest.mark.slow  # two real binary runs, in this process
@pytest.mark.parametrize(("method", "val_scores"), [("posthoc_la", False), ("ncm", True)])
def test_validation_rare_positive_scores_are_logged_after_a_stage_that_tunes_nothing_there(
    method, val_scores, tracking_uri
):
    """``posthoc_la`` chose its tau on the split, so only its cross-fitted balanced accuracy
    scores it there at the last epoch; ``ncm`` chose nothing, so its validation scores are
    honest and logged then. (Epoch 1, before either stage, scores the trained head.)"""
    from runner.app import run

    overrides = [*QUICK, *BINARY, f"+method={method}", "tracking.plots=false"]
    results = run(compose_config([*overrides, f"tracking.uri={tracking_uri}"]))
    client = MlflowClient(tracking_uri)
    (found,) = client.search_runs([client.get_experiment_by_name("samplerlab").experiment_id])
    steps = {
        key: [m.step for m in client.get_metric_history(found.info.run_id, key)]
        for key in ("test/average_precision", "val/balanced_accuracy", "val/average_precision")
    }
    assert steps["test/average_precision"] == steps["val/balanced_accuracy"] == [1, 2]
    assert steps["val/average_precision"] == ([1, 2] if val_scores else [1])
    assert ("val/average_precision" in results) == val_scores


def test_a_race_refuses_an_objective_the_data_do_not_report() -> None:
    multilabel = compose_config([*MULTILABEL, "objective=val/balanced_accuracy"])
    with pytest.raises(UserError, match="use objective=val/mAP"):
        check_objective(multilabel, RACE)
    check_objective(compose_config([*MULTILABEL, "objective=val/mAP"]), RACE)
    single = compose_config(["data.val_per_class=20", "objective=val/mAP"])
    with pytest.raises(UserError, match="use objective=val/balanced_accuracy"):
        check_objective(single, RACE)
    # A post-hoc stage tunes its classifier on the split: no val/ rare-positive score is honest.
    binary = ["data.num_classes=2", "data.val_per_class=20", "objective=val/average_precision"]
    check_objective(compose_config(binary), RACE)
    with pytest.raises(UserError, match="classifier_stage=posthoc_la tunes the classifier"):
        check_objective(compose_config(["+method=posthoc_la", *binary]), RACE)
    check_objective(compose_config(["+method=ncm", *binary]), RACE)  # it tunes nothing there
