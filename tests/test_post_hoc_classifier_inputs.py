"""The post-hoc stages (tau_norm, posthoc_la) try every tau with the classifier alone, on the
validation features computed once: what they choose and cross-fit is what predicting with the
whole model at every tau gives, bit for bit."""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from runner.models import FeatureClassifier
from runner.train.decoupled import ClassifierInputs, TauChoice, choose_adjustment, choose_tau
from runner.train.feed import Feed
from runner.train.state import autocast

pytestmark = pytest.mark.unit

CLASSES, ROWS, CHUNK = 4, 50, 7  # 50 rows in chunks of 7: the last one short
# On a GPU the features and the classifier run under bfloat16 autocast, as predict() does.
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def _model(device: torch.device) -> FeatureClassifier:
    """A convolutional backbone with BatchNorm whose running statistics are far from the
    validation batches' own (so a pass in train mode would predict otherwise), and a linear
    classifier with long-tailed class-weight norms and biases (so tau changes predictions).
    Left in train mode, as the last epoch leaves it."""
    torch.manual_seed(0)
    backbone = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    )
    classifier = nn.Linear(8, CLASSES)
    with torch.no_grad():
        classifier.weight.mul_(torch.tensor([4.0, 2.0, 1.0, 0.5])[:, None])
        classifier.bias.copy_(torch.tensor([1.0, 0.5, 0.0, -0.5]))
        for _ in range(5):  # running statistics of shifted, wider inputs
            backbone(3 * torch.randn(16, 3, 6, 6) + 2)
    return FeatureClassifier(backbone, classifier, 8).to(device).train()


def _feed(device: torch.device, stored: str) -> tuple[Feed, np.ndarray]:
    """Validation rows stored as float32 features or as uint8 images (standardised per batch)."""
    generator = torch.Generator().manual_seed(1)
    labels = torch.randint(0, CLASSES, (ROWS,), generator=generator).numpy()
    if stored == "float32":
        return Feed(torch.randn(ROWS, 3, 6, 6, generator=generator), device), labels
    images = torch.randint(0, 256, (ROWS, 3, 6, 6), generator=generator, dtype=torch.uint8)
    return Feed(images, device, ([0.5, 0.4, 0.3], [0.2, 0.25, 0.3])), labels


def _full_forward(model: nn.Module, feed: Feed, device: torch.device) -> Callable[[], np.ndarray]:
    """The computation the stages made before: the whole model's prediction, backbone
    included, at every tau (runner.train.fit's _predict)."""

    def predict() -> np.ndarray:
        with autocast(device):
            return feed.predict(model, CHUNK)

    return predict


def _classifier_alone(model: nn.Module, feed: Feed, device: torch.device):
    chunks = feed.batches(torch.arange(len(feed)), CHUNK)
    return ClassifierInputs(model, chunks, lambda: autocast(device)).predict


def _choose(stage: str, model: FeatureClassifier, predict, labels: np.ndarray) -> TauChoice:
    if stage == "tau_norm":
        return choose_tau(model.classifier, predict, labels)
    prior = torch.tensor([0.6, 0.25, 0.1, 0.05], dtype=torch.float64)
    return choose_adjustment(model.classifier, prior, predict, labels)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stored", ["float32", "uint8"])
@pytest.mark.parametrize("stage", ["tau_norm", "posthoc_la"])
def test_the_classifier_alone_chooses_and_cross_fits_as_the_whole_model(stage, stored, device):
    device = torch.device(device)
    feed, labels = _feed(device, stored)
    before = _model(device)
    statistics = {k: v.clone() for k, v in before.state_dict().items()}
    full, alone = before, copy.deepcopy(before)
    expected = _choose(stage, full, _full_forward(full, feed, device), labels)
    chosen = _choose(stage, alone, _classifier_alone(alone, feed, device), labels)

    assert len(set(expected.scores)) > 1  # tau changes the predictions: the comparison bites
    assert (chosen.tau, chosen.tau_a, chosen.tau_b) == (
        expected.tau,
        expected.tau_a,
        expected.tau_b,
    )
    assert chosen.scores == expected.scores  # the tuning curve, every tau's predictions alike
    assert np.array_equal(chosen.cross_fitted, expected.cross_fitted)
    # Left as the per-tau passes leave it: in train mode, the backbone and its BatchNorm
    # statistics untouched, the classifier at the whole split's tau.
    assert alone.training and alone.features.training
    for name, tensor in alone.features.state_dict().items():
        assert torch.equal(tensor, statistics[f"features.{name}"]), name
    for name, tensor in full.classifier.state_dict().items():
        assert torch.equal(alone.classifier.state_dict()[name], tensor), name


@pytest.mark.parametrize("device", DEVICES)
def test_the_features_are_read_in_eval_mode(device):
    """A backbone left in train mode would normalise by each chunk's own statistics: the
    classifier alone would then predict otherwise than the whole model in eval mode."""
    device = torch.device(device)
    feed, _ = _feed(device, "float32")
    model = _model(device)
    alone = _classifier_alone(model, feed, device)()
    assert np.array_equal(alone, _full_forward(model, feed, device)())
    in_train_mode = copy.deepcopy(model)  # its pass moves its running statistics
    with torch.no_grad(), autocast(device):
        chunks = feed.batches(torch.arange(ROWS), CHUNK)
        batch_statistics = torch.cat([in_train_mode(x).argmax(1) for x in chunks])
    assert not np.array_equal(alone, batch_statistics.cpu().numpy())
