"""The published loss recipes (conf/loss/*.yaml, built as the runner builds them) against their
reference implementations' formulas, written out here from the references' code:
kaidic/LDAM-DRW (DRW, LDAM-DRW: ``F.cross_entropy(weight=)``), richardaecn/class-balanced-loss
and BagofTricks-LT (class-balanced softmax and sigmoid focal losses)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch.nn import functional as F

from runner.build import build
from runner.config import CONF
from runner.data.cut import long_tail_counts
from runner.errors import UserError
from runner.train.losses import ClassWeightedLoss, SigmoidFocalLoss

pytestmark = pytest.mark.unit  # in one process, seconds

EPOCHS = 200  # the references' CIFAR schedule: DRW from epoch 160 (0-based)
CIFAR10_LT = torch.tensor(long_tail_counts(5000, 10, 100))  # imbalance 100: 12,406 images
CIFAR100_LT = torch.tensor(long_tail_counts(500, 100, 100))  # 10,847 images


def recipe(name: str, counts: torch.Tensor = CIFAR10_LT, **overrides: object) -> ClassWeightedLoss:
    """conf/loss/<name>.yaml as the runner builds it, with ``overrides``."""
    node = OmegaConf.load(CONF / "loss" / f"{name}.yaml")
    node.merge_with(overrides)
    loss: ClassWeightedLoss = build(
        "loss", node, class_counts=counts, sampler_weights=None, epochs=EPOCHS
    )
    return loss


def reference_weights(counts: torch.Tensor, beta: float) -> torch.Tensor:
    """kaidic/LDAM-DRW cifar_train.py and Cui et al.'s cifar_main.py: effective-number weights
    normalised to sum to the number of classes."""
    n = counts.numpy().astype(np.float64)
    weights = (1.0 - beta) / (1.0 - np.power(beta, n))
    return torch.tensor(weights / weights.sum() * len(n), dtype=torch.float32)


def batch(
    counts: torch.Tensor, size: int = 128, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and targets drawn as an instance-balanced batch of the counts."""
    generator = torch.Generator().manual_seed(seed)
    targets = torch.multinomial(counts.double(), size, replacement=True, generator=generator)
    logits = 3 * torch.randn(size, len(counts), generator=generator)
    return logits, targets


def value_and_grad(fn, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = logits.clone().requires_grad_(True)
    value = fn(leaf)
    value.backward()
    assert leaf.grad is not None
    return value.detach(), leaf.grad


def close(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    # float32 sums over 128 terms: relative error far below 1e-5
    return torch.allclose(a[0], b[0], rtol=1e-5) and torch.allclose(a[1], b[1], atol=1e-8)


def test_drw_is_the_references_weighted_cross_entropy_after_the_switch():
    loss = recipe("drw")
    logits, targets = batch(CIFAR10_LT)
    weights = reference_weights(CIFAR10_LT, 0.9999)
    ours = value_and_grad(lambda z: loss(z, targets, 159)[0].mean(), logits)
    assert close(ours, value_and_grad(lambda z: F.cross_entropy(z, targets), logits))
    ours = value_and_grad(lambda z: loss(z, targets, 160)[0].mean(), logits)
    expected = value_and_grad(lambda z: F.cross_entropy(z, targets, weight=weights), logits)
    assert close(ours, expected)


def test_weighted_ce_is_the_weighted_cross_entropy_from_the_first_epoch():
    # inverse-frequency weights with no deferral: F.cross_entropy(weight=1/n) at every epoch (the
    # weights' scale cancels in the division by their sum)
    loss = recipe("weighted_ce")
    logits, targets = batch(CIFAR10_LT)
    weights = 1.0 / CIFAR10_LT.double()
    expected = value_and_grad(lambda z: F.cross_entropy(z, targets, weight=weights.float()), logits)
    for epoch in (0, EPOCHS - 1):
        assert close(
            value_and_grad(lambda z, e=epoch: loss(z, targets, e)[0].mean(), logits), expected
        )


def test_ldam_drw_is_the_references_ldam_loss():
    """kaidic/LDAM-DRW losses.py: margins 1/n^(1/4) scaled to max_m=0.5, s=30, weight=DRW."""
    loss = recipe("ldam")
    logits, targets = batch(CIFAR10_LT, seed=1)
    logits = torch.tanh(logits)  # a cosine head's range
    margins = 1.0 / np.sqrt(np.sqrt(CIFAR10_LT.numpy().astype(np.float64)))
    margins = torch.tensor(margins * (0.5 / margins.max()), dtype=torch.float32)
    onehot = F.one_hot(targets, 10).bool()

    def reference(z: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        shifted = torch.where(onehot, z - margins[targets, None], z)
        return F.cross_entropy(30 * shifted, targets, weight=weight)

    weights = reference_weights(CIFAR10_LT, 0.9999)
    for epoch, weight in [(0, None), (159, None), (160, weights), (199, weights)]:
        ours = value_and_grad(lambda z, e=epoch: loss(z, targets, e)[0].mean(), logits)
        assert close(ours, value_and_grad(lambda z, w=weight: reference(z, w), logits))


def test_class_balanced_cross_entropy_is_cuis_and_bagoftricks_by_reduction():
    """Cui et al.: tf.losses.softmax_cross_entropy(weights=w_y), whose default reduction
    divides by the number of non-zero weights (the batch size); BagofTricks-LT's ClassBalanceCE:
    F.cross_entropy(weight=)."""
    logits, targets = batch(CIFAR10_LT, seed=2)
    weights = reference_weights(CIFAR10_LT, 0.9999)

    def cui(z: torch.Tensor) -> torch.Tensor:
        return (weights[targets] * F.cross_entropy(z, targets, reduction="none")).sum() / 128

    ours = value_and_grad(lambda z: recipe("cb_ce")(z, targets, 0)[0].mean(), logits)
    assert close(ours, value_and_grad(cui, logits))
    tricks = recipe("cb_ce", reduction="weight_sum")
    ours = value_and_grad(lambda z: tricks(z, targets, 0)[0].mean(), logits)
    expected = value_and_grad(lambda z: F.cross_entropy(z, targets, weight=weights), logits)
    assert close(ours, expected)
    default = ClassWeightedLoss(CIFAR10_LT, None, EPOCHS, weights="effective").class_weights
    assert default is not None and torch.allclose(default, weights)  # beta 0.9999 by default


def sigmoid_focal(z: torch.Tensor, y: torch.Tensor, w: torch.Tensor, gamma: float) -> torch.Tensor:
    """Lin et al. (2017), eq. 5, per class: -(1 - p_t)^gamma log p_t, p_t = sigmoid(z) for the
    true class and 1 - sigmoid(z) for the others; weighted by w_y, summed and divided by the
    number of positives (the batch size), as Cui et al.'s focal_loss and BagofTricks-LT."""
    p = torch.sigmoid(z.double())
    positive = F.one_hot(y, z.shape[1]).bool()
    p_t = torch.where(positive, p, 1 - p)
    per_class = -((1 - p_t) ** gamma) * torch.log(p_t)
    return (w.double()[y, None] * per_class).sum() / len(y)


@pytest.mark.parametrize(("counts", "beta"), [(CIFAR10_LT, 0.9999), (CIFAR100_LT, 0.9)])
def test_class_balanced_focal_is_the_references_sigmoid_focal_loss(counts, beta):
    """conf/loss/cb_focal.yaml (gamma 1) with CIFAR-10-LT's beta, and with BagofTricks-LT's 0.9
    for CIFAR-100-LT."""
    loss = recipe("cb_focal", counts, beta=beta)
    logits, targets = batch(counts, seed=3)
    weights = reference_weights(counts, beta)
    ours = value_and_grad(lambda z: loss(z, targets, 0)[0].mean(), logits)
    expected = value_and_grad(lambda z: sigmoid_focal(z, targets, weights, 1.0), logits)
    assert torch.allclose(ours[0].double(), expected[0], rtol=1e-5)
    assert torch.allclose(ours[1], expected[1], atol=1e-7)


def test_sigmoid_focal_stays_finite_below_gamma_one_and_is_sigmoid_ce_at_zero():
    counts = torch.tensor([50, 5])
    logits = torch.tensor([[30.0, -30.0], [0.5, -1.0]])  # sample 0 all but certain: p_t ~ 1
    targets = torch.tensor([0, 1])
    half = SigmoidFocalLoss(counts, None, EPOCHS, weights=None, gamma=0.5)
    ours = value_and_grad(lambda z: half(z, targets, 0)[0].mean(), logits)
    assert torch.isfinite(ours[1]).all()
    expected = value_and_grad(lambda z: sigmoid_focal(z, targets, torch.ones(2), 0.5), logits)
    assert torch.allclose(ours[0].double(), expected[0], rtol=1e-5)
    plain = SigmoidFocalLoss(counts, None, EPOCHS, weights=None, gamma=0.0)
    bce = F.binary_cross_entropy_with_logits(logits, F.one_hot(targets, 2).float(), reduction="sum")
    assert math.isclose(float(plain(logits, targets, 0)[0].mean()), float(bce) / 2, rel_tol=1e-6)


@pytest.mark.parametrize(("counts", "ratio"), [(CIFAR10_LT, 5.85), (CIFAR100_LT, 4.93)])
def test_weight_sum_steps_are_larger_by_the_inverse_mean_weight(counts, ratio):
    """After the DRW switch the two reductions differ by sum(w_y) / B, whose expectation under
    instance-balanced sampling is sum_j n_j w_j / N: the documented 5.9x and 4.9x."""
    weights = reference_weights(counts, 0.9999).double()
    mean_weight = float((counts.double() * weights).sum() / counts.sum())
    assert math.isclose(1 / mean_weight, ratio, abs_tol=0.005)
    logits, targets = batch(counts, size=4096, seed=4)
    drw, plain = recipe("drw", counts), recipe("drw", counts, reduction="batch_mean")
    measured = float(drw(logits, targets, 160)[0].mean() / plain(logits, targets, 160)[0].mean())
    # B/sum(w_y) over B=4096 draws: relative standard deviation sd(w_y)/(E[w_y] sqrt(B)), 0.033
    # (CIFAR-10-LT) and 0.031 (CIFAR-100-LT) for these weights; 15% is over four of them
    assert measured == pytest.approx(1 / mean_weight, rel=0.15)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"reduction": "sum"}, "loss.reduction='sum' is unknown; choose weight_sum"),
        ({"beta": 1.0}, "loss.beta must lie in \\[0, 1\\), got 1.0; 0.9999"),
        ({"gamma": -1.0}, "loss.gamma must be >= 0, got -1.0; 0 is plain"),
    ],
)
def test_bad_recipe_values_name_the_key_the_value_and_the_fix(override, message):
    with pytest.raises(UserError, match=message):
        recipe("cb_focal", **override)
