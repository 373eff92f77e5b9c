"""Losses against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from runner.losses import ClassWeightedLoss, rule_weights
from samplers import HybridSampler, UniformSampler

COUNTS = torch.tensor([100, 10, 1, 0])


def test_rule_weights():
    inverse = torch.tensor([0.01, 0.1, 1.0, 0.0], dtype=torch.float64)
    assert torch.allclose(rule_weights(COUNTS, "inverse", 0.0), inverse / inverse.sum() * 3)
    beta = 0.9
    effective = torch.tensor(
        [(1 - beta) / (1 - beta**n) for n in (100, 10, 1)] + [0.0], dtype=torch.float64
    )
    assert torch.allclose(rule_weights(COUNTS, "effective", beta), effective / effective.sum() * 3)


def test_focal_deferred_weights_and_sampler_weights():
    logits = torch.tensor([[2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    targets = torch.tensor([0, 2])
    ce = F.cross_entropy(logits, targets, reduction="none")
    labels = [0] * 100 + [1] * 10 + [2]
    loss = ClassWeightedLoss(
        COUNTS, UniformSampler(labels), epochs=10, weights="inverse", gamma=2.0, defer_fraction=0.5
    )
    focal = (1 - torch.exp(-ce)) ** 2 * ce
    early, raw = loss(logits, targets, epoch=4)  # before epoch 5: no class weights (DRW)
    assert torch.allclose(early, focal) and torch.allclose(raw, ce)
    late, _ = loss(logits, targets, epoch=5)
    assert torch.allclose(late, focal * rule_weights(COUNTS, "inverse", 0.0).float()[targets])
    hybrid = HybridSampler(labels, q=0.5)
    auto = ClassWeightedLoss(torch.bincount(torch.tensor(labels)), hybrid, epochs=10)
    assert torch.allclose(auto.class_weights, hybrid.class_loss_weights().float())
    plain = ClassWeightedLoss(COUNTS, UniformSampler(labels), epochs=10)  # auto, no sampler weights
    assert plain.class_weights is None
    assert math.isclose(float(plain(logits, targets, 0)[0].sum()), float(ce.sum()), rel_tol=1e-6)
    with pytest.raises(ValueError, match="loss.defer_fraction must lie in"):
        ClassWeightedLoss(COUNTS, None, epochs=10, defer_fraction=1.0)
