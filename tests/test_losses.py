"""Losses against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from runner.train.losses import ClassWeightedLoss, LDAMLoss, LogitAdjustedLoss, rule_weights
from samplers import HybridSampler

pytestmark = pytest.mark.unit  # in one process, seconds

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
        COUNTS, None, epochs=10, weights="inverse", gamma=2.0, defer_fraction=0.5
    )
    focal = (1 - torch.exp(-ce)) ** 2 * ce
    early, raw = loss(logits, targets, epoch=4)  # before epoch 5: no class weights (DRW)
    assert torch.allclose(early, focal) and torch.allclose(raw, ce)
    late, _ = loss(logits, targets, epoch=5)
    assert torch.allclose(late, focal * rule_weights(COUNTS, "inverse", 0.0).float()[targets])
    hybrid = HybridSampler(labels, q=0.5)
    weights = hybrid.class_loss_weights()
    auto = ClassWeightedLoss(torch.bincount(torch.tensor(labels)), weights, epochs=10)
    assert torch.allclose(auto.class_weights, hybrid.class_loss_weights().float())
    plain = ClassWeightedLoss(COUNTS, None, epochs=10)  # auto, no sampler weights
    assert plain.class_weights is None
    assert math.isclose(float(plain(logits, targets, 0)[0].sum()), float(ce.sum()), rel_tol=1e-6)
    with pytest.raises(ValueError, match="loss.defer_fraction must lie in"):
        ClassWeightedLoss(COUNTS, None, epochs=10, defer_fraction=1.0)


def test_ldam_margins_scale_and_deferred_weights():
    # n^(-1/4): 16 -> 0.5, 1 -> 1; the largest (class 1's) becomes max_margin=0.5, so margins
    # are 0.25 and 0.5; the empty class is never a target (margin 0).
    loss = LDAMLoss(torch.tensor([16, 1, 0]), None, epochs=10, scale=2.0, beta=0.9)
    assert torch.allclose(loss.margins, torch.tensor([0.25, 0.5, 0.0]))
    logits = torch.tensor([[1.0, 0.0, 0.0], [0.5, 1.0, -1.0]])
    targets = torch.tensor([0, 1])
    # sample 0: 2 * [1 - 0.25, 0, 0] = [1.5, 0, 0]; sample 1: 2 * [0.5, 1 - 0.5, -1] = [1, 1, -2]
    ldam = torch.tensor(
        [-1.5 + math.log(math.exp(1.5) + 2), -1 + math.log(2 * math.exp(1) + math.exp(-2))]
    )
    ce = torch.tensor(
        [
            -1 + math.log(math.exp(1) + 2),
            -1 + math.log(math.exp(0.5) + math.exp(1) + math.exp(-1)),
        ]
    )
    early, raw = loss(logits, targets, epoch=7)  # 0.8 * 10: plain LDAM through epoch 7 (0-based)
    assert torch.allclose(early, ldam) and torch.allclose(raw, ce)
    # DRW: effective-number weights summing to 2, as many as the batch's samples, so dividing by
    # the batch's sum of weights changes nothing here (tests/test_losses_references.py checks it)
    late, raw = loss(logits, targets, epoch=8)
    a, b = 0.1 / (1 - 0.9**16), 0.1 / (1 - 0.9)
    assert torch.allclose(late, ldam * torch.tensor([2 * a / (a + b), 2 * b / (a + b)]))
    assert torch.allclose(raw, ce)  # the sampler's feedback: raw logits, no margin, no weight
    plain, _ = LDAMLoss(torch.tensor([16, 1, 0]), None, 10, scale=2.0, weights=None)(
        logits, targets, 9
    )
    assert torch.allclose(plain, ldam)


def test_ldam_margins_follow_the_inverse_fourth_root():
    counts = torch.tensor([10000, 625, 81, 16])  # n^(1/4) = 10, 5, 3, 2
    margins = LDAMLoss(counts, None, epochs=200, max_margin=0.5).margins
    assert torch.allclose(margins, torch.tensor([0.1, 0.2, 1 / 3, 0.5]))
    assert float(margins.max()) == 0.5
    assert torch.allclose(margins * counts.double().pow(0.25).float(), torch.tensor(1.0))
    assert LDAMLoss(counts, None, epochs=200).weights_from_epoch == 160  # the paper's epoch


def test_balanced_softmax_adds_log_counts_and_survives_an_empty_class():
    loss = LogitAdjustedLoss(torch.tensor([3, 1, 0]), None, epochs=10)  # tau=1: balanced softmax
    logits = torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 0.0]], requires_grad=True)
    targets = torch.tensor([0, 1])
    # + log n = [log 3, 0, 0] (the empty class counts as one: log 1 = 0)
    # sample 0: [log 3, 0, 0], target 0; sample 1: [1 + log 3, 2, 0], target 1
    expected = torch.tensor([math.log(5 / 3), -2 + math.log(3 * math.exp(1) + math.exp(2) + 1)])
    weighted, ce = loss(logits, targets, epoch=0)
    assert torch.allclose(weighted, expected)
    assert torch.allclose(
        ce, torch.tensor([math.log(3), -2 + math.log(math.exp(1) + math.exp(2) + 1)])
    )
    weighted.mean().backward()
    assert torch.isfinite(loss.offsets).all() and torch.isfinite(logits.grad).all()


def test_logit_adjustment_with_tau():
    loss = LogitAdjustedLoss(torch.tensor([3, 1]), None, epochs=10, tau=0.5)
    logits = torch.tensor([[0.0, 0.0], [1.0, 2.0]])
    targets = torch.tensor([1, 0])
    # prior [0.75, 0.25]; + 0.5 * log prior, i.e. exp of the offsets is sqrt(prior)
    expected = torch.tensor(
        [
            -0.5 * math.log(0.25) + math.log(math.sqrt(0.75) + 0.5),
            -(1 + 0.5 * math.log(0.75))
            + math.log(math.exp(1) * math.sqrt(0.75) + math.exp(2) * 0.5),
        ]
    )
    weighted, ce = loss(logits, targets, epoch=3)
    assert torch.allclose(weighted, expected)
    assert torch.allclose(ce, torch.tensor([math.log(2), -1 + math.log(math.exp(1) + math.exp(2))]))
    zero, _ = LogitAdjustedLoss(torch.tensor([3, 1]), None, epochs=10, tau=0.0)(logits, targets, 0)
    assert torch.allclose(zero, ce)


def test_new_losses_move_as_modules_and_hold_no_state():
    loss = LDAMLoss(torch.tensor([5, 2]), None, epochs=10).to(torch.device("cpu"))
    assert isinstance(loss, LDAMLoss) and loss.state_dict() == {}
    assert {name for name, _ in loss.named_buffers()} == {"class_weights", "margins"}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: LDAMLoss(COUNTS, None, 10, max_margin=0.0), "loss.max_margin must be > 0"),
        (lambda: LDAMLoss(COUNTS, None, 10, max_margin=float("nan")), "loss.max_margin must be a"),
        (lambda: LDAMLoss(COUNTS, None, 10, scale=-30.0), "loss.scale must be > 0, got -30.0; the"),
        (lambda: LDAMLoss(COUNTS, None, 10, scale="big"), "loss.scale must be a finite number"),
        (lambda: LDAMLoss(COUNTS, None, 10, defer_fraction=1.0), "loss.defer_fraction must lie"),
        (
            lambda: LogitAdjustedLoss(COUNTS, None, 10, tau=-1.0),
            "loss.tau must be >= 0, got -1.0; 1.0",
        ),
        (
            lambda: LogitAdjustedLoss(COUNTS, None, 10, tau=float("inf")),
            "loss.tau must be a finite",
        ),
        (lambda: LogitAdjustedLoss(torch.zeros(3), None, 10), "every class count is zero"),
    ],
)
def test_bad_loss_parameters_name_the_key_and_the_fix(make, message):
    with pytest.raises(ValueError, match=message):
        make()
