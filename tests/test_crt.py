"""cRT (Kang et al. 2020): one run, two stages; stage two retrains the classifier alone."""

from __future__ import annotations

import copy

import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from runner.config import CONF, trainer_config
from runner.models import MLP, ResNet32, SmallCNN
from runner.train.fit import train_epoch
from runner.train.losses import ClassWeightedLoss
from runner.train.state import build_state, start_classifier_stage, total_epochs
from samplers import DeferredSampler
from tests.helpers.cli import run_cli

pytestmark = pytest.mark.unit  # in one process, seconds

X = torch.randn(96, 3, 8, 8, generator=torch.Generator().manual_seed(0))
Y = torch.tensor([0] * 60 + [1] * 24 + [2] * 12)  # long-tailed: 60 / 24 / 12


def _fresh(classifier_epochs: int = 2, mode: str = "train"):
    torch.manual_seed(0)
    cfg = trainer_config(
        epochs=1,
        batch_size=16,
        warmup_epochs=0,
        classifier_epochs=classifier_epochs,
        classifier_stage_mode=mode,
    )
    sampler = DeferredSampler(Y, switch_epoch=1, seed=4)
    state = build_state(SmallCNN((3, 8, 8), 3, width=8), sampler, cfg, seed=0)
    return state, ClassWeightedLoss(torch.bincount(Y), None, epochs=1, weights=None)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_stage_two_trains_only_the_classifier(mode):
    state, loss_fn = _fresh(mode=mode)
    train_epoch(state, X, Y, loss_fn, 16, augment=None)  # stage one: everything trains
    after_one = copy.deepcopy(state.model.state_dict())
    head = next(n for n, m in state.model.named_modules() if m is state.model.classifier) + "."
    start_classifier_stage(state)
    reinitialised = copy.deepcopy(state.model.classifier.state_dict())
    assert not torch.equal(reinitialised["weight"], after_one[head + "weight"])  # a fresh one
    optimised = [p for group in state.optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in optimised} == {id(p) for p in state.model.classifier.parameters()}
    for _ in range(2):
        result = train_epoch(state, X, Y, loss_fn, 16, augment=None)
    assert state.epoch == total_epochs(state.config) == 3
    after_two = state.model.state_dict()
    frozen = [k for k in after_two if not k.startswith(head)]
    weights = {n for n, _ in state.model.named_parameters() if not n.startswith(head)}
    statistics = [k for k in frozen if k not in weights]  # BatchNorm's: means, variances, counts
    assert weights and {k.rsplit(".", 1)[-1] for k in statistics} == {
        "running_mean",
        "running_var",
        "num_batches_tracked",
    }
    # Every backbone weight is bit-for-bit that of stage one ...
    assert all(torch.equal(after_two[k], after_one[k]) for k in weights)
    # ... its BatchNorm statistics re-estimated on stage two's batches in train mode (the
    # reference's), kept in eval mode ...
    moved = [k for k in statistics if not torch.equal(after_two[k], after_one[k])]
    assert moved == (statistics if mode == "train" else [])
    # ... the classifier moved away from its re-initialisation, drawn class-balanced.
    assert not torch.equal(after_two[head + "weight"], reinitialised["weight"])
    drawn = torch.bincount(Y[result.delivered], minlength=3).double() / result.delivered.numel()
    assert torch.allclose(state.sampler.target_class_shares(), torch.full((3,), 1 / 3).double())
    assert drawn.min() > 0.2  # instance-balanced would give the last class 12/96 = 0.125


def test_the_train_mode_statistics_are_those_of_the_stage_batches():
    """Against the reference's formula: a frozen BatchNorm in train mode (the reference's
    ``model.train()`` with the feature model's weights frozen) moves its running mean by
    ``momentum`` towards each batch's mean, the batches being the classifier stage's."""
    state, loss_fn = _fresh(classifier_epochs=1)
    train_epoch(state, X, Y, loss_fn, 16, augment=None)
    start_classifier_stage(state)
    first_bn = next(m for m in state.model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    inputs: list[torch.Tensor] = []
    first_bn.register_forward_pre_hook(lambda _, args: inputs.append(args[0].detach().clone()))
    expected = first_bn.running_mean.clone()
    result = train_epoch(state, X, Y, loss_fn, 16, augment=None)
    for batch in inputs:
        expected = (1 - first_bn.momentum) * expected + first_bn.momentum * batch.mean((0, 2, 3))
    assert len(inputs) == len(result.delivered) // 16
    assert torch.allclose(first_bn.running_mean, expected, atol=1e-6)


def test_a_stage_two_checkpoint_resumes_exactly():
    state, loss_fn = _fresh(classifier_epochs=3)
    train_epoch(state, X, Y, loss_fn, 16, augment=None)
    start_classifier_stage(state)
    train_epoch(state, X, Y, loss_fn, 16, augment=None)
    checkpoint = copy.deepcopy(state.state_dict())
    expected = train_epoch(state, X, Y, loss_fn, 16, augment=None)

    restored, restored_loss = _fresh(classifier_epochs=3)  # a new process: stage one's optimizer
    restored.load_state_dict(checkpoint)
    assert restored.classifier_only and restored.epoch == 2
    again = train_epoch(restored, X, Y, restored_loss, 16, augment=None)
    assert torch.equal(again.losses, expected.losses)
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            restored.model.state_dict().values(), state.model.state_dict().values(), strict=True
        )
    )


@pytest.mark.parametrize("model", [MLP, SmallCNN, ResNet32])
@pytest.mark.parametrize("head", ["linear", "cosine"])
def test_every_model_ends_in_its_classifier(model, head):
    net = model((3, 8, 8), 3, head=head)
    seen = {}
    net.classifier.register_forward_hook(lambda _, inputs, out: seen.update(z=out))
    with torch.no_grad():
        logits = net(torch.randn(4, 3, 8, 8))
    assert logits.shape == (4, 3) and seen["z"] is logits  # the last layer
    if head == "cosine":  # cosines: |z| <= 1, and 1 for a feature along a class's weight
        assert float(logits.abs().max()) <= 1 + 1e-6
        weight = net.classifier.weight
        assert torch.allclose(weight.norm(dim=0), torch.ones(3))
        with torch.no_grad():
            along = net.classifier(weight[:, :1].T * 5.0)
        assert float(along[0, 0]) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.slow
def test_the_crt_method_records_both_stages_in_one_run(tmp_path, tracking_uri):
    done = run_cli(
        "+method=crt",
        "data=digits_lt",
        "model=small_cnn",
        "model.width=8",
        "trainer.epochs=2",
        "trainer.classifier_epochs=2",
        "trainer.progress=false",
        "tracking.plots=false",
        cwd=tmp_path,
        uri=tracking_uri,
    )
    client = MlflowClient(tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("samplerlab").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["method"] == "crt"
    steps = lambda key: [m.step for m in client.get_metric_history(run.info.run_id, key)]  # noqa: E731
    assert steps("train/loss") == [1, 2, 3, 4]  # both stages, one run
    assert steps("stage1/balanced_accuracy") == [2]  # the end of stage one
    assert steps("final/balanced_accuracy") == [4]
    shares = {
        m.step: m.value for m in client.get_metric_history(run.info.run_id, "sampling/target/0")
    }
    counts = {k: v for k, v in run.data.metrics.items() if k.startswith("data/train_count/")}
    head = counts["data/train_count/0"] / sum(counts.values())
    assert shares[1] == pytest.approx(head) and shares[2] == pytest.approx(head)  # instance
    assert shares[3] == pytest.approx(1 / len(counts))  # class-balanced in stage two
    assert "4 epochs" in done.stdout


@pytest.mark.parametrize(
    "overrides,method",
    [(["method=crt"], "crt"), (["method=crt", "sampler=hard_mined"], None), (["loss=focal"], None)],
)
def test_a_run_is_tagged_with_its_method_only_when_the_recipe_chose_it(
    overrides, method, tracking_uri
):
    """A study's run that replaces the recipe's sampler or loss is not that method's run."""
    from hydra import compose, initialize_config_dir

    from runner.build import build
    from runner.tracking import start_run

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", ["+experiment=cifar10_lt", *overrides], return_hydra_config=True)
    choices = {k: str(v) for k, v in cfg.hydra.runtime.choices.items()}
    del cfg.hydra
    data = build("data", OmegaConf.create({"_target_": "runner.data.synthetic_lt", "n_max": 100}))
    cfg.tracking.uri = tracking_uri
    tracker = start_run(cfg, data, choices, ["+experiment=cifar10_lt", *overrides])
    tracker.finish("FINISHED")
    tags = MlflowClient(tracking_uri).get_run(tracker.run_id).data.tags
    assert tags.get("method") == method
    assert tracker.run_name.startswith(method or choices["sampler"])
