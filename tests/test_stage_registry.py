"""A classifier stage is one class (:mod:`runner.train.stages`) and one YAML: a stage defined
here, with a method YAML in a copy of the config tree, trains through the app in this process
with nothing else added; and no module outside the registry compares stage names."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from mlflow.tracking import MlflowClient
from torch import nn

import runner
from runner.config import CONF
from runner.train import stages
from runner.train.stages import ClassifierStage, register, stage_names
from tests.helpers.record import logged_checkpoint

RUNNER = Path(runner.__file__).parent


class BiasOnly(ClassifierStage):
    """A stage for this test: the classifier keeps its weights and its bias alone trains."""

    name = "bias_only"
    takes_epochs = True

    def trainable(self, model: nn.Module, num_classes: int) -> list[nn.Parameter]:
        bias = model.classifier.bias
        bias.requires_grad_(True)
        return [bias]


METHOD = """# @package _global_
trainer:
  classifier_epochs: 2
  classifier_stage: bias_only
"""


@pytest.mark.slow
def test_a_new_stage_is_one_class_and_one_yaml(tmp_path, monkeypatch, tracking_uri):
    monkeypatch.setattr(stages, "_STAGES", dict(stages._STAGES))  # registered for this test
    register(BiasOnly)
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "method" / "bias_only.yaml").write_text(METHOD)
    overrides = [
        "+method=bias_only",
        "data=digits_lt",
        "trainer.epochs=2",
        "trainer.progress=false",
        "trainer.threads=1",
        "tracking.plots=false",
        f"tracking.uri={tracking_uri}",
    ]
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    from runner.app import run

    results = run(cfg)
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("samplerlab").experiment_id
    (found,) = client.search_runs([experiment])
    assert found.info.status == "FINISHED"
    assert found.data.params["trainer.classifier_stage"] == "bias_only"
    assert "stage1/balanced_accuracy" in found.data.metrics  # stage one ended before it
    assert results["cost/epochs_trained"] == 4
    # The stage's optimizer trained one tensor, of one value per class: the bias.
    state = logged_checkpoint(tracking_uri, found.info.run_id)["train"]
    assert state["classifier_only"]
    (group,) = state["optimizer"]["param_groups"]
    assert len(group["params"]) == 1
    (slot,) = state["optimizer"]["state"].values()
    assert slot["momentum_buffer"].shape == state["model"]["classifier.bias"].shape == (10,)


@pytest.mark.unit
def test_no_module_outside_the_registry_compares_stage_names():
    names = set(stage_names())
    assert {"none", "retrain", "scale", "tau_norm", "posthoc_la"} <= names
    found = []
    for path in sorted(RUNNER.rglob("*.py")):
        if path == RUNNER / "train" / "stages.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                constants = [
                    c.value
                    for c in ast.walk(node)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                ]
                found += [
                    f"{path.relative_to(RUNNER)}:{node.lineno}" for c in constants if c in names
                ]
    assert found == []


@pytest.mark.unit
def test_the_stage_a_run_goes_through_and_the_epochs_it_shares_with_cross_entropy():
    from runner.config import trainer_config
    from runner.train.stages import NoStage, stage_for

    plain = trainer_config(epochs=5, classifier_stage="retrain", classifier_epochs=0)
    assert isinstance(stage_for(plain), NoStage) and stage_for(plain).shared_epochs(plain) == 5
    crt = trainer_config(epochs=5, classifier_stage="retrain", classifier_epochs=3)
    assert stage_for(crt).name == "retrain" and stage_for(crt).shared_epochs(crt) == 4
    tau = trainer_config(epochs=5, classifier_stage="tau_norm", classifier_epochs=0)
    assert stage_for(tau).post_hoc and stage_for(tau).shared_epochs(tau) == 4


@pytest.mark.unit
def test_none_takes_no_classifier_epochs_and_an_unknown_stage_lists_the_registered():
    from runner.checks import check_targets
    from runner.errors import UserError
    from tests.conftest import compose_config

    with pytest.raises(UserError, match="none takes no classifier epochs"):
        check_targets(
            compose_config(["trainer.classifier_stage=none", "trainer.classifier_epochs=2"])
        )
    with pytest.raises(UserError, match=r"'lws' is unknown; choose one of \('none', 'retrain'"):
        check_targets(compose_config(["trainer.classifier_stage=lws"]))
    check_targets(compose_config(["trainer.classifier_stage=none"]))  # no stage: accepted
