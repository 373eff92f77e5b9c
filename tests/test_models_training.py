"""Models and a short real training run per model that beats chance."""

from __future__ import annotations

import pytest
import torch

from runner.models import MLP, ResNet32, SmallCNN
from runner.tracking import Tracker  # noqa: F401  (the runner's modules import cleanly)
from tests.conftest import compose_config


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
            "tracking.plots=false",
            f"tracking.uri={tracking_uri}",
            "trainer.threads=2",
        ]
    )
    summary = run(cfg)
    assert summary["final/balanced_accuracy"] > floor
