"""LWS and tau-normalisation (Kang et al. 2020), and post-hoc logit adjustment (Menon et al. 2021):
the decoupled classifiers beside cRT."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from sklearn.metrics import accuracy_score, balanced_accuracy_score

from runner.config import trainer_config
from runner.data import LongTailData
from runner.errors import UserError
from runner.models import SmallCNN
from runner.train.decoupled import ScaledClassifier, linear_classifier, validation_halves
from runner.train.feed import Feed
from runner.train.fit import train_epoch
from runner.train.losses import ClassWeightedLoss
from runner.train.stages import stage_named
from runner.train.state import build_state, start_classifier_stage
from samplers import DeferredSampler
from tests.conftest import compose_config
from tests.helpers.record import logged_checkpoint

X = torch.randn(96, 3, 8, 8, generator=torch.Generator().manual_seed(0))
Y = torch.tensor([0] * 60 + [1] * 24 + [2] * 12)  # long-tailed: 60 / 24 / 12
DIGITS = [
    "data=digits_lt",
    "data.val_per_class=20",
    "trainer.epochs=3",
    "trainer.progress=false",
    "trainer.threads=1",
    "tracking.plots=false",
    "tracking.log_model=false",
]


def _lws_state(head: str):
    torch.manual_seed(0)
    cfg = trainer_config(
        epochs=1, batch_size=16, warmup_epochs=0, classifier_epochs=2, classifier_stage="scale"
    )
    sampler = DeferredSampler(Y, switch_epoch=1, seed=4)
    state = build_state(SmallCNN((3, 8, 8), 3, width=8, head=head), sampler, cfg, seed=0)
    return state, ClassWeightedLoss(torch.bincount(Y), None, epochs=1, weights=None)


@pytest.mark.unit
@pytest.mark.parametrize("head", ["linear", "cosine"])
def test_lws_trains_the_class_scales_alone(head):
    state, loss_fn = _lws_state(head)
    train_epoch(state, X, Y, loss_fn, 16, augment=None)  # stage one: everything trains
    model, trained = state.model, state.model.classifier
    before = {id(t): t.detach().clone() for t in [*model.parameters(), *model.buffers()]}
    statistics = [id(t) for t in model.buffers()]
    start_classifier_stage(state)
    scaled = model.classifier
    assert isinstance(scaled, ScaledClassifier) and scaled.classifier is trained  # kept, wrapped
    optimised = [p for group in state.optimizer.param_groups for p in group["params"]]
    assert [id(p) for p in optimised] == [id(scaled.scales)]
    for _ in range(2):
        result = train_epoch(state, X, Y, loss_fn, 16, augment=None)
    # Every weight, the classifier's own included, is stage one's; the BatchNorm statistics
    # are re-estimated on the stage's batches (the model in train mode, as in the reference) ...
    after = [*model.parameters(), *model.buffers()]
    kept = [t for t in after if id(t) in before]
    assert len(kept) == len(before) == len(after) - 1 and statistics
    assert all(torch.equal(t, before[id(t)]) != (id(t) in statistics) for t in kept)
    # ... the scales moved from 1, the logits are the kept classifier's scaled per class ...
    assert not torch.allclose(scaled.scales, torch.ones(3))
    with torch.no_grad():
        features = torch.randn(5, trained.weight.shape[1 if head == "linear" else 0])
        assert torch.allclose(scaled(features), trained(features) * scaled.scales)
    # ... drawn class-balanced, as in cRT's stage two.
    drawn = torch.bincount(Y[result.delivered], minlength=3).double() / result.delivered.numel()
    assert drawn.min() > 0.2  # instance-balanced would give the last class 12/96 = 0.125


@pytest.mark.unit
def test_an_lws_checkpoint_resumes_into_the_scaled_classifier():
    state, loss_fn = _lws_state("linear")
    train_epoch(state, X, Y, loss_fn, 16, augment=None)
    start_classifier_stage(state)
    train_epoch(state, X, Y, loss_fn, 16, augment=None)
    checkpoint = copy.deepcopy(state.state_dict())
    expected = train_epoch(state, X, Y, loss_fn, 16, augment=None)

    restored, restored_loss = _lws_state("linear")  # a new process: the plain classifier
    restored.load_state_dict(checkpoint)
    assert isinstance(restored.model.classifier, ScaledClassifier)
    again = train_epoch(restored, X, Y, restored_loss, 16, augment=None)
    assert torch.equal(again.losses, expected.losses)
    assert torch.equal(restored.model.classifier.scales, state.model.classifier.scales)


@pytest.mark.unit
@pytest.mark.parametrize(
    "overrides,key,named",
    [
        (
            ["+method=tau_norm", "data=digits_lt"],
            "trainer.classifier_stage",
            "data.val_per_class=0, data.val_fraction=0.0",
        ),
        (
            ["+method=tau_norm", *DIGITS, "model.head=cosine"],
            "trainer.classifier_stage",
            "model.head=linear",
        ),
        (
            ["+method=tau_norm", *DIGITS, "trainer.classifier_epochs=2"],
            "trainer.classifier_stage",
            "trainer.classifier_epochs=0",
        ),
        (
            ["+method=tau_norm", *DIGITS, "data.val_per_class=1"],
            "data.val_per_class",
            "set data.val_per_class=2 or more",
        ),
        (
            ["+method=posthoc_la", "data=digits_lt"],
            "trainer.classifier_stage",
            "posthoc_la chooses tau on a validation split",
        ),
        (
            ["+method=posthoc_la", *DIGITS, "model.head=cosine"],
            "trainer.classifier_stage",
            "shifts a linear head's bias, and model.head=cosine has none",
        ),
        (
            ["+method=posthoc_la", *DIGITS, "trainer.classifier_epochs=2"],
            "trainer.classifier_stage",
            "posthoc_la takes no classifier epochs",
        ),
        (
            ["+method=posthoc_la", *DIGITS, "data.val_per_class=1"],
            "data.val_per_class",
            "set data.val_per_class=2 or more",
        ),
        (
            ["+method=lws", *DIGITS, "trainer.classifier_epochs=0"],
            "trainer.classifier_stage",
            "trainer.classifier_epochs=N",
        ),
        (["trainer.classifier_stage=rescale"], "trainer.classifier_stage", "'rescale' is unknown"),
        (
            ["+method=crt", "trainer.classifier_stage_mode=frozen"],
            "trainer.classifier_stage_mode",
            "choose one of ('train', 'eval')",
        ),
    ],
)
def test_a_decoupled_stage_that_cannot_run_is_refused_before_training(
    overrides, key, named, tracking_uri
):
    from runner.app import run

    with pytest.raises(UserError) as refused:
        run(compose_config([*overrides, f"tracking.uri={tracking_uri}"]))
    message = str(refused.value)
    assert message.startswith(f"config error at '{key}'") and named in message
    assert len(message.splitlines()) == 1
    client = MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    assert client.search_runs(experiments) == []  # no run was started, nothing trained


@pytest.mark.unit
@pytest.mark.parametrize("stage", ["tau_norm", "posthoc_la"])
def test_a_validation_fraction_that_does_not_halve_is_refused_before_any_run(stage, tracking_uri):
    """data.val_fraction=0.01 leaves one row of every digit: the config cannot tell, the built
    split's labels can, before the MLflow run is created."""
    from runner.app import run

    overrides = ["data=digits_lt", "data.val_fraction=0.01", f"tracking.uri={tracking_uri}"]
    with pytest.raises(UserError) as refused:
        run(compose_config([f"+method={stage}", *overrides]))
    assert str(refused.value).startswith("data.val_per_class / data.val_fraction: ")
    assert "no class twice\nset data.val_per_class=2 or more" in str(refused.value)
    client = MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    assert client.search_runs(experiments) == []  # no run was started, nothing trained


@pytest.mark.unit
@pytest.mark.parametrize("stage", ["tau_norm", "posthoc_la"])
def test_a_post_hoc_stage_refuses_a_model_without_a_linear_classifier(stage):
    """What the config cannot tell (a model of the user's), the loop refuses before training."""
    with pytest.raises(UserError, match="is CosineClassifier\nuse model.head=linear"):
        linear_classifier(SmallCNN((3, 8, 8), 3, width=8, head="cosine"), stage)
    with pytest.raises(UserError, match=f"classifier_stage={stage} .* is NoneType"):
        linear_classifier(torch.nn.Sequential(torch.nn.Linear(4, 3)), stage)
    without_bias = torch.nn.Sequential()
    without_bias.classifier = torch.nn.Linear(4, 3, bias=False)
    needs_bias = stage_named(stage).needs_bias
    assert needs_bias == (stage == "posthoc_la")  # its adjustment is folded into the bias
    if needs_bias:
        with pytest.raises(UserError, match="is torch.nn.Linear without a bias"):
            linear_classifier(without_bias, stage, needs_bias)
    else:
        assert linear_classifier(without_bias, stage, needs_bias) is without_bias.classifier


def _run(overrides: list[str], uri: str):
    """One real run in this process; its MLflow run and the trainer state it checkpointed."""
    from runner.app import run

    run(compose_config([*overrides, *DIGITS, f"tracking.uri={uri}"]))
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("samplerlab").experiment_id
    found = client.search_runs([experiment], order_by=["attributes.start_time DESC"])[0]
    assert found.info.status == "FINISHED"
    assert not Path(found.data.tags["checkpoint"]).exists()  # the artifact is the checkpoint
    return found, logged_checkpoint(uri, found.info.run_id)


def _features(model: torch.nn.Module, data: LongTailData, x: torch.Tensor) -> torch.Tensor:
    """What ``model`` hands its classifier for the stored samples ``x``."""
    seen: dict[str, torch.Tensor] = {}
    hook = model.classifier.register_forward_hook(lambda _, inputs, out: seen.update(x=inputs[0]))
    (inputs,) = Feed(x, torch.device("cpu"), data.normalize).batches(torch.arange(len(x)), len(x))
    with torch.no_grad():
        model.eval()(inputs)
    hook.remove()
    return seen["x"]


def _reference(method: str, classifier: torch.nn.Linear, prior: torch.Tensor):
    """The reference's predictions of a trained linear classifier's inputs at a tau: Kang et
    al.'s tau-normalised weights without the bias (their tau_norm.py), or Menon et al.'s logits
    less log(prior^tau + 1e-12) (google-research logit_adjustment/main.py)."""
    weight, bias = classifier.weight.detach().clone(), classifier.bias.detach().clone()

    def predictions(features: torch.Tensor, tau: float) -> np.ndarray:
        if method == "tau_norm":
            logits = features @ (weight / weight.norm(dim=1, keepdim=True) ** tau).T
        else:
            logits = features @ weight.T + bias - torch.log(prior**tau + 1e-12).float()
        return logits.argmax(1).numpy()

    return predictions


@pytest.mark.slow  # two runs of three digits epochs, in this process
@pytest.mark.parametrize("method", ["tau_norm", "posthoc_la"])
def test_a_post_hoc_stage_chooses_tau_on_validation_and_reports_the_changed_classifier(
    method, tracking_uri
):
    from runner.build import build_parts

    # The same training without the post-hoc stage: the trained classifier, to change here.
    _, plain = _run(["+method=ce"], tracking_uri)
    tuned_run, tuned_checkpoint = _run([f"+method={method}"], tracking_uri)
    parts = build_parts(compose_config(["+method=ce", *DIGITS]))
    model, data = parts.state.model, parts.data
    model.load_state_dict(plain["train"]["model"])
    counts = data.train_counts.double()
    predictions = _reference(method, model.classifier, counts / counts.sum())
    val, test = _features(model, data, data.val_x), _features(model, data, data.test_x)

    grid = np.linspace(0, 2, 21).round(1).tolist()  # the reference's sweep
    labels = data.val_y.numpy()
    table = np.stack([predictions(val, tau) for tau in grid])
    curve = [balanced_accuracy_score(labels, row) for row in table]
    assert len(set(curve)) > 1  # the grid's choice is not a tie everywhere
    tau = grid[int(np.argmax(curve))]
    assert tau > 0  # the classifier changes: its checkpoint below is told from the plain one
    metrics = tuned_run.data.metrics
    assert metrics["decoupled/tau"] == pytest.approx(tau)
    logged = [metrics[f"decoupled/val_balanced_accuracy/tau_{t:.2f}"] for t in grid]
    assert logged == pytest.approx(curve)
    chosen = predictions(test, tau)
    assert metrics["final/balanced_accuracy"] == pytest.approx(
        balanced_accuracy_score(data.test_y.numpy(), chosen)
    )
    assert metrics["final/accuracy"] == pytest.approx(accuracy_score(data.test_y.numpy(), chosen))
    # What a race judges: every validation row predicted with the tau the other half chose.
    half_a = validation_halves(labels)
    on_a = [balanced_accuracy_score(labels[half_a], row[half_a]) for row in table]
    on_b = [balanced_accuracy_score(labels[~half_a], row[~half_a]) for row in table]
    tau_a, tau_b = grid[int(np.argmax(on_a))], grid[int(np.argmax(on_b))]
    assert (metrics["decoupled/tau_half_a"], metrics["decoupled/tau_half_b"]) == (tau_a, tau_b)
    crossed = np.where(half_a, predictions(val, tau_b), predictions(val, tau_a))
    assert metrics["val/balanced_accuracy"] == pytest.approx(
        balanced_accuracy_score(labels, crossed)
    )
    # Not above the in-sample best, given 20 rows of every class (10 in each half): the whole
    # split's balanced accuracy is then the mean of the halves' (BA(t) = (BA_A(t) + BA_B(t)) / 2)
    # and the cross-fitted one (BA_A(tau_b) + BA_B(tau_a)) / 2 <= BA(tau_a), as BA_A(tau_b) <=
    # BA_A(tau_a). Equal when both halves choose the whole split's tau, so never strictly below;
    # 1e-12 for the rounding of equal sums of other recalls. Odd counts would break the mean.
    assert metrics["val/balanced_accuracy"] <= max(curve) + 1e-12

    # The last checkpoint holds the changed classifier, which predicts as the reference at the
    # whole split's tau; resumed from it, the run has nothing left to train and does not
    # choose again.
    model.load_state_dict(tuned_checkpoint["train"]["model"])
    with torch.no_grad():
        assert np.array_equal(model.classifier(test).argmax(1).numpy(), chosen)
    _resume_after_training(
        method, tuned_run.info.run_id, tuned_checkpoint, Path(tuned_run.data.tags["checkpoint"])
    )


def _resume_after_training(method: str, run_id: str, checkpoint: dict, path: Path) -> None:
    from runner.build import build_parts
    from runner.tracking import Bystander
    from runner.train.fit import fit
    from runner.train.run import Progress, RunContext

    cfg = compose_config([f"+method={method}", *DIGITS])
    parts = build_parts(cfg)
    parts.state.load_state_dict(checkpoint["train"])
    progress = Progress()
    progress.load_state_dict(checkpoint["progress"])
    fit(RunContext(parts, Bystander(run_id, method), progress, path, logged_through=3))
    saved = checkpoint["train"]["model"]
    assert all(torch.equal(v, saved[k]) for k, v in parts.state.model.state_dict().items())


@pytest.mark.slow  # a run of three digits epochs and two classifier epochs, in this process
def test_lws_runs_on_digits_with_a_validation_split(tracking_uri):
    found, checkpoint = _run(["+method=lws", "trainer.classifier_epochs=2"], tracking_uri)
    client = MlflowClient(tracking_uri)
    steps = lambda key: [m.step for m in client.get_metric_history(found.info.run_id, key)]  # noqa: E731
    assert found.data.params["trainer.classifier_stage"] == "scale"
    assert steps("train/loss") == [1, 2, 3, 4, 5] and steps("val/balanced_accuracy")[-1] == 5
    scales = [v for k, v in checkpoint["train"]["model"].items() if k.endswith("scales")]
    assert len(scales) == 1 and not torch.allclose(scales[0], torch.ones(10))


@pytest.mark.unit
def test_a_run_recorded_before_the_classifier_stage_existed_resumes_as_retrain(
    tracking_uri, tmp_path
):
    """Its saved config has no ``trainer.classifier_stage``: it ran the only stage there was."""
    from omegaconf import OmegaConf

    from runner.checks import check_targets
    from runner.resume import resume_target

    recorded = OmegaConf.to_container(compose_config(["+method=crt"]), resolve=True)
    assert isinstance(recorded, dict)
    del recorded["trainer"]["classifier_stage"]
    client = MlflowClient(tracking_uri)
    artifacts = (tmp_path / "mlartifacts").as_uri()  # not MLflow's ./mlruns in the checkout
    old = client.create_run(client.create_experiment("samplerlab", artifacts))
    client.log_text(old.info.run_id, OmegaConf.to_yaml(recorded), "config.yaml")
    client.set_terminated(old.info.run_id, "KILLED")
    saved, previous = resume_target(compose_config([f"resume={old.info.run_id}"]), tracking_uri)
    assert previous is not None and previous.run_id == old.info.run_id
    assert saved.trainer.classifier_stage == "retrain" and saved.trainer.classifier_epochs == 10
    check_targets(saved)
