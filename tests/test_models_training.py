"""Models and a short real training run per model that beats chance."""

from __future__ import annotations

import pytest
import torch

from runner.models import MLP, ResNet32, SmallCNN
from runner.tracking import Tracker  # noqa: F401  (the runner's modules import cleanly)
from tests.conftest import compose_config

pytestmark = pytest.mark.slow  # real training runs


def parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_model_sizes():
    assert 0.45e6 < parameters(ResNet32((3, 32, 32), 10)) < 0.48e6  # He et al.: 0.46M
    assert 0.2e6 < parameters(SmallCNN((3, 32, 32), 10)) < 0.4e6
    assert MLP((1, 8, 8), 10)(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    with pytest.raises(ValueError, match="use model=mlp"):
        SmallCNN((32,), 10)


@pytest.mark.parametrize(
    ("model", "data", "floor"),
    [("mlp", "synthetic_lt", 0.5), ("small_cnn", "digits_lt", 0.5), ("resnet32", "digits_lt", 0.5)],
)
def test_short_training_beats_chance(model, data, floor, tracking_uri):
    """Balanced test accuracy well above chance (0.1 on ten classes) after a few epochs."""
    from runner.app import run

    cfg = compose_config(
        [
            f"model={model}",
            f"data={data}",
            "sampler=weighted",
            "trainer.epochs=8",
            "trainer.batch_size=32",
            "trainer.progress=false",
            "tracking.log_model=false",
            "tracking.plots=false",
            f"tracking.uri={tracking_uri}",
        ]
    )
    summary = run(cfg)
    assert summary["final/balanced_accuracy"] > floor


def test_train_epoch_gathers_batches_in_sampler_order_and_feeds_losses_back():

    from runner.config import trainer_config
    from runner.train.fit import train_epoch
    from runner.train.losses import ClassWeightedLoss
    from runner.train.state import build_state
    from samplers import HardMinedSampler

    torch.manual_seed(0)
    x, y = torch.randn(129, 3, 8, 8), torch.arange(129) % 3
    sampler = HardMinedSampler(y, seed=1, replacement=False)  # 129 = 128 + a batch of one
    cfg = trainer_config(epochs=2, batch_size=128, warmup_epochs=0)
    state = build_state(SmallCNN((3, 8, 8), 3, width=8), sampler, cfg, seed=0)
    loss_fn = ClassWeightedLoss(torch.bincount(y), None, epochs=2, weights=None)
    result = train_epoch(state, x, y, loss_fn, 128, augment=None)
    assert torch.equal(result.delivered, sampler.epoch_indices()[:128])  # the lone last one dropped
    assert state.epoch == 1 and int(sampler.seen.sum()) == 128
    # The training pass's per-sample losses are what the sampler received (first sight: the EMA).
    assert torch.allclose(sampler.loss_ema[result.delivered], result.losses.double())
    assert abs(result.mean_loss - float(result.losses.mean())) < 1e-5  # no class weights: same mean


def test_train_state_round_trip_resumes_exactly():
    """Everything the loop needs lives in TrainState: a restored state trains on identically."""
    import copy

    from runner.config import trainer_config
    from runner.data import Augment
    from runner.train.fit import train_epoch
    from runner.train.losses import ClassWeightedLoss
    from runner.train.state import build_state
    from samplers import HardMinedSampler

    x, y = (
        torch.randn(200, 3, 8, 8, generator=torch.Generator().manual_seed(0)),
        torch.arange(200) % 4,
    )
    cfg = trainer_config(epochs=3, batch_size=32, warmup_epochs=1)

    def fresh():
        torch.manual_seed(0)
        sampler = HardMinedSampler(y, seed=3)
        state = build_state(SmallCNN((3, 8, 8), 4, width=8), sampler, cfg, seed=0)
        return state, ClassWeightedLoss(torch.bincount(y), None, epochs=3)

    augment = Augment(crop_padding=1, flip=True)
    state, loss_fn = fresh()
    train_epoch(state, x, y, loss_fn, 32, augment)
    checkpoint = copy.deepcopy(state.state_dict())
    expected = train_epoch(state, x, y, loss_fn, 32, augment)

    restored, restored_loss = fresh()
    restored.load_state_dict(checkpoint)
    assert restored.epoch == 1
    again = train_epoch(restored, x, y, restored_loss, 32, augment)
    assert torch.equal(again.delivered, expected.delivered)  # same draw, from the same feedback
    assert torch.equal(again.losses, expected.losses) and again.mean_loss == expected.mean_loss
