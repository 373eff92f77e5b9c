"""Multi-label losses against their references: PyTorch's BCE, torchvision's sigmoid focal loss,
Cui et al.'s effective number, and the distribution-balanced loss as wutong16/
DistributionBalancedLoss's ``ResampleLoss`` computes it (transcribed below, step by step)."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from torchvision.ops import sigmoid_focal_loss

from runner.train.multilabel_losses import (
    ClassBalancedBCE,
    DistributionBalancedLoss,
    MultiLabelBCE,
)
from samplers import rebalance_weights

pytestmark = pytest.mark.unit

COUNTS = torch.tensor([400.0, 120.0, 40.0, 9.0, 3.0])
TRAIN_SIZE = 500


def batch(seed: int = 0, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(size, 5, generator=generator)
    targets = (torch.rand(size, 5, generator=generator) < 0.3).float()
    targets[0] = 0.0  # a row without a positive label
    targets[1] = 1.0  # and one with every label
    return logits, targets


def reference_resample_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    class_freq: torch.Tensor,
    train_num: int,
    *,
    map_param: tuple[float, float, float],
    neg_scale: float,
    init_bias: float,
    gamma: float,
    balance_param: float,
) -> torch.Tensor:
    """``ResampleLoss.forward`` with ``reweight_func='rebalance'``, ``logit_reg`` holding
    ``init_bias`` and ``neg_scale``, ``focal=True`` and the framework's mean of the (B, C)
    result, written as the reference writes it."""
    alpha, beta, mu = map_param
    freq_inv = torch.ones(class_freq.shape) / class_freq
    repeat_rate = torch.sum(labels.float() * freq_inv, dim=1, keepdim=True)
    pos_weight = freq_inv.clone().detach().unsqueeze(0) / repeat_rate
    weight = torch.sigmoid(beta * (pos_weight - mu)) + alpha
    bias = -torch.log(train_num / class_freq - 1) * init_bias / neg_scale
    cls_score = logits.clone()
    cls_score += bias
    cls_score = cls_score * (1 - labels) * neg_scale + cls_score * labels
    weight = weight / neg_scale * (1 - labels) + weight * labels
    logpt = -F.binary_cross_entropy_with_logits(cls_score.clone(), labels, reduction="none")
    pt = torch.exp(logpt)
    loss = F.binary_cross_entropy_with_logits(cls_score, labels, weight, reduction="none")
    loss = ((1 - pt) ** gamma) * loss
    return (balance_param * loss).mean()


@pytest.mark.parametrize(
    ("map_param", "neg_scale"),
    [((0.1, 10.0, 0.2), 2.0), ((0.1, 10.0, 0.3), 5.0)],  # the COCO-MLT and VOC-MLT configs
)
def test_distribution_balanced_loss_is_the_reference(
    map_param: tuple[float, float, float], neg_scale: float
) -> None:
    logits, targets = batch()
    loss = DistributionBalancedLoss(
        COUNTS,
        None,
        epochs=1,
        train_size=TRAIN_SIZE,
        map_alpha=map_param[0],
        map_beta=map_param[1],
        map_gamma=map_param[2],
        neg_scale=neg_scale,
    )
    per_sample, plain = loss(logits, targets, 0)
    expected = reference_resample_loss(
        logits,
        targets,
        COUNTS,
        TRAIN_SIZE,
        map_param=map_param,
        neg_scale=neg_scale,
        init_bias=0.05,
        gamma=2.0,
        balance_param=2.0,
    )
    torch.testing.assert_close(per_sample.mean(), expected, rtol=1e-6, atol=0)
    assert per_sample.shape == plain.shape == (64,)
    assert torch.isfinite(per_sample).all()  # the row without labels too: weight alpha + 1
    torch.testing.assert_close(
        plain, F.binary_cross_entropy_with_logits(logits, targets, reduction="none").mean(1)
    )


def test_the_rebalancing_is_the_samplers_class_aware_ratio() -> None:
    _, targets = batch()
    loss = DistributionBalancedLoss(COUNTS, None, 1, TRAIN_SIZE, map_alpha=0.0, map_beta=1.0)
    rows = targets[targets.sum(1) > 0]  # the samplers refuse a row without labels (never drawn)
    r = rebalance_weights(rows, COUNTS)
    mapped = torch.sigmoid(1.0 * (r - 0.2)).float()
    torch.testing.assert_close(loss.term_weights(rows), mapped, rtol=1e-6, atol=1e-7)


def test_the_ablations_leave_their_part_out() -> None:
    logits, targets = batch(1)
    plain_focal = MultiLabelBCE(COUNTS, None, 1, gamma=2.0, focal_scale=2.0)
    neither = DistributionBalancedLoss(
        COUNTS, None, 1, TRAIN_SIZE, rebalance=False, negative_tolerant=False
    )
    torch.testing.assert_close(neither(logits, targets, 0)[0], plain_focal(logits, targets, 0)[0])
    only_rebalance = DistributionBalancedLoss(COUNTS, None, 1, TRAIN_SIZE, negative_tolerant=False)
    assert not torch.allclose(only_rebalance(logits, targets, 0)[0], neither(logits, targets, 0)[0])


def test_bce_and_focal_are_pytorch_and_torchvision() -> None:
    logits, targets = batch(2)
    bce, _ = MultiLabelBCE(COUNTS, None, 1)(logits, targets, 0)
    torch.testing.assert_close(bce.mean(), F.binary_cross_entropy_with_logits(logits, targets))
    focal, _ = MultiLabelBCE(COUNTS, None, 1, gamma=2.0)(logits, targets, 0)
    expected = sigmoid_focal_loss(logits, targets, alpha=-1, gamma=2.0, reduction="mean")
    torch.testing.assert_close(focal.mean(), expected)


@pytest.mark.parametrize("normalize", [True, False])
def test_class_balanced_bce_weighs_by_the_effective_number(normalize: bool) -> None:
    logits, targets = batch(3)
    beta = 0.9
    raw = (1 - beta) / (1 - beta ** COUNTS.double())
    weights = (raw / raw.sum() * len(COUNTS) if normalize else raw).float()
    terms = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    by_class, _ = ClassBalancedBCE(COUNTS, None, 1, mode="by_class", normalize=normalize)(
        logits, targets, 0
    )
    torch.testing.assert_close(by_class, (terms * weights).mean(1))
    average, _ = ClassBalancedBCE(COUNTS, None, 1, normalize=normalize)(logits, targets, 0)
    mean_w = (targets @ weights) / targets.sum(1).clamp(min=1)
    mean_w[targets.sum(1) == 0] = 1.0  # no positive label: weight 1
    torch.testing.assert_close(average, terms.mean(1) * mean_w)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: DistributionBalancedLoss(COUNTS, None, 1), "loss.init_bias needs the number"),
        (
            lambda: DistributionBalancedLoss(COUNTS, None, 1, train_size=400),
            r"class\(es\) \[0\] are carried by every training sample",
        ),
        (lambda: MultiLabelBCE(COUNTS, torch.ones(5), 1), "multi-label losses take none"),
        (lambda: MultiLabelBCE(torch.tensor([3.0, 0.0]), None, 1), "every class needs"),
        (lambda: ClassBalancedBCE(COUNTS, None, 1, mode="mean"), "loss.mode='mean' is unknown"),
        (lambda: MultiLabelBCE(COUNTS, None, 1, gamma=-1), "loss.gamma must be a finite"),
        (
            lambda: DistributionBalancedLoss(COUNTS, None, 1, TRAIN_SIZE, neg_scale=0),
            "loss.neg_scale must be a finite number > 0",
        ),
    ],
)
def test_bad_settings_are_named_with_their_fix(build, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        build()


def test_every_loss_trains_a_linear_layer() -> None:
    torch.manual_seed(0)
    logits, targets = batch(4, 256)
    x = torch.randn(256, 8)
    for loss in (
        MultiLabelBCE(COUNTS, None, 1),
        ClassBalancedBCE(COUNTS, None, 1),
        DistributionBalancedLoss(COUNTS, None, 1, TRAIN_SIZE),
    ):
        model = torch.nn.Linear(8, 5)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        first = None
        for _ in range(30):
            value = loss(model(x), targets, 0)[0].mean()
            first = float(value.detach()) if first is None else first
            optimizer.zero_grad()
            value.backward()
            optimizer.step()
        assert float(value.detach()) < first
