"""The runner in-process: every config choice, bad values, tracking in a real sqlite store."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from mlflow.tracking import MlflowClient
from omegaconf.errors import OmegaConfBaseException

from runner.app import run
from runner.build import build_model
from runner.checks import check_targets
from runner.config import CONF
from tests.conftest import compose_config

pytestmark = pytest.mark.unit  # in one process, seconds

GROUPS = ("data", "model", "sampler", "loss", "trainer", "tracking")
CHOICES = [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))]
QUICK = ["trainer.epochs=3", "trainer.progress=false", "tracking.log_model=false"]


@pytest.mark.parametrize(("group", "choice"), CHOICES, ids=[f"{g}={c}" for g, c in CHOICES])
def test_every_choice_composes_and_builds(group, choice):
    named = (
        ["model._target_=runner.models.SmallCNN"] if choice == "custom" else []
    )  # the user's class
    cfg = compose_config([f"{group}={choice}", *named])
    check_targets(cfg)
    labels = torch.tensor(
        [0] * 300 + [1] * 100 + [2] * 40 + [3] * 20 + [4] * 16 + [5] * 16 + [6] * 16 + [7] * 16
    )
    sampler = instantiate(cfg.sampler, labels=labels)
    assert len(list(sampler)) == len(sampler)
    model = build_model(cfg.model, (3, 8, 8), 8)
    assert model(torch.zeros(2, 3, 8, 8)).shape == (2, 8)
    weights = getattr(sampler, "class_loss_weights", lambda: None)()
    instantiate(
        cfg.loss,
        class_counts=torch.bincount(labels),
        sampler_weights=weights,
        epochs=cfg.trainer.epochs,
    )


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("trainer.epoch=3", "epoch"),
        ("trainer.epochs=three", "trainer.epochs"),
        ("sampler=annealing", "sampler"),
        ("tracking.plot=false", "plot"),
    ],
)
def test_composition_rejects_typos_and_wrong_types(override, key):
    with pytest.raises((ConfigCompositionException, OmegaConfBaseException)) as error:
        compose_config([override])
    assert key in str(error.value) + str(error.value.__cause__)


def test_a_run_records_metrics_statistics_and_artifacts(tracking_uri, tmp_path):
    cfg = compose_config([*QUICK, f"tracking.uri={tracking_uri}", "sampler=annealed", "seed=3"])
    summary = run(cfg)
    client = MlflowClient(tracking_uri)
    (found,) = client.search_runs([client.get_experiment_by_name("samplerlab").experiment_id])
    assert found.info.status == "FINISHED"
    assert (
        found.data.params["sampler.q_start"] == "0.0" and found.data.params["trainer.epochs"] == "3"
    )
    tags = found.data.tags
    assert tags["sampler"] == "AnnealedSampler" and tags["imbalance_factor"] == "100.0"
    assert len(tags.get("mlflow.source.git.commit", "x" * 40)) == 40  # MLflow's own context tag
    metrics = found.data.metrics
    names = [f"class_{c}" for c in range(10)]
    for key in (
        "train/loss",
        "test/accuracy",
        "test/balanced_accuracy",
        "test/macro_f1",
        "test/many_accuracy",
        "test/medium_accuracy",
        "test/few_accuracy",
        "sampling/unique_ratio",
        "sampling/max_repeats",
        "sampling/never_drawn",
        "sampling/kl_to_target",
        "sampling/imbalance_ratio",
        "final/balanced_accuracy",
    ):
        assert key in metrics, key
    assert not [k for k in metrics if k.startswith("best/")]  # test-selected: not a metric
    for name in names:
        for kind in (
            "test/recall",
            "test/precision",
            "test/f1",
            "sampling/share",
            "sampling/target",
        ):
            assert f"{kind}/{name}" in metrics
    assert metrics["data/train_count/class_0"] == 500 and metrics["data/test_count/class_9"] == 100
    assert metrics["final/balanced_accuracy"] == summary["final/balanced_accuracy"]
    assert found.data.params["sampler"] == "AnnealedSampler"  # outside Hydra: the class name
    history = client.get_metric_history(found.info.run_id, "sampling/share/class_9")
    assert [m.step for m in history] == [1, 2, 3]  # the epochs as printed
    # Annealed from class-balanced toward instance-balanced: the tail's share falls.
    assert history[0].value > history[-1].value
    target = client.get_metric_history(found.info.run_id, "sampling/target/class_9")
    assert target[0].value > target[-1].value
    artifacts = {a.path for a in client.list_artifacts(found.info.run_id)}
    assert {
        "config.yaml",
        "classification_report.txt",
        "best_classification_report.txt",
        "checkpoint",
        "confusion_matrix.png",
        "per_class_accuracy.png",
        "sampled_class_shares.png",
    } <= artifacts
    local = Path(
        client.download_artifacts(found.info.run_id, "confusion_matrix.png", str(tmp_path))
    )
    assert local.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(("every", "evaluated"), [(0, [2, 4]), (1, [1, 2, 3, 4]), (3, [2, 3, 4])])
def test_eval_every_evaluates_its_epochs_and_each_stages_last(tracking_uri, every, evaluated):
    """cRT, 2 + 2 epochs: ``trainer.eval_every`` epochs apart (0: none between), and always
    stage one's last epoch and the run's last; the final metrics and the objective the same."""
    cfg = compose_config(
        [
            *QUICK,
            "trainer.epochs=2",
            "trainer.classifier_epochs=2",
            "data.val_per_class=10",
            "tracking.plots=false",
            f"trainer.eval_every={every}",
            f"tracking.uri={tracking_uri}",
        ]
    )
    results = run(cfg)
    client = MlflowClient(tracking_uri)
    (found,) = client.search_runs(
        [client.get_experiment_by_name("samplerlab").experiment_id],
        f"params.`trainer.eval_every` = '{every}'",
    )

    def steps(key: str) -> list[int]:
        return [m.step for m in client.get_metric_history(found.info.run_id, key)]

    assert steps("train/loss") == [1, 2, 3, 4]
    assert steps("val/balanced_accuracy") == steps("test/recall/class_0") == evaluated
    assert steps("stage1/balanced_accuracy") == [2]
    assert results["val/balanced_accuracy"] == found.data.metrics["val/balanced_accuracy"]


def test_same_config_and_seed_give_the_same_metrics(tracking_uri):
    overrides = [
        *QUICK,
        f"tracking.uri={tracking_uri}",
        "sampler=hard_mined",
        "tracking.plots=false",
    ]
    first, second = run(compose_config(overrides)), run(compose_config(overrides))
    assert first == second
    assert run(compose_config([*overrides, "seed=1"])) != first


def test_a_run_with_a_validation_split_records_its_class_counts(tracking_uri):
    """The race's chance level for val/accuracy reads the validation split's class counts."""
    cfg = compose_config([*QUICK, f"tracking.uri={tracking_uri}", "data.val_per_class=5"])
    run(cfg)
    client = MlflowClient(tracking_uri)
    (found,) = client.search_runs([client.get_experiment_by_name("samplerlab").experiment_id])
    metrics = found.data.metrics
    assert [metrics[f"data/val_count/class_{c}"] for c in range(10)] == [5] * 10
    assert metrics["data/num_classes"] == 10
