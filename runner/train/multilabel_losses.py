"""Losses for multi-label targets (an (B, C) 0/1 matrix per batch): binary cross-entropy, the
sigmoid focal loss, class-balanced BCE and the distribution-balanced loss (Wu et al. 2020,
"Distribution-Balanced Loss for Multi-Label Classification in Long-Tailed Datasets").

Each is called as the single-label losses are (:mod:`runner.train.losses`): ``loss(logits,
targets, epoch)`` returns the per-sample loss, whose plain mean is the batch's loss, and the
plain per-sample binary cross-entropy of the raw logits. A sample's loss is the mean of its C
per-class terms, so the batch loss is the mean over all B x C terms, as
``F.binary_cross_entropy_with_logits`` and the distribution-balanced reference
(wutong16/DistributionBalancedLoss, ``ResampleLoss``; its framework averages the unreduced
loss) reduce them.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from runner.train.losses import rule_weights

CB_MODES = ("by_class", "average_w")


def _finite(name: str, value: float, low: float, fix: str, strict: bool = False) -> float:
    """``value`` as a float that is finite and ``>= low`` (``> low`` when ``strict``)."""
    number = float(value)
    if not math.isfinite(number) or number < low or (strict and number == low):
        relation = ">" if strict else ">="
        raise ValueError(
            f"loss.{name} must be a finite number {relation} {low}, got {value}; {fix}"
        )
    return number


class MultiLabelBCE(nn.Module):
    """Binary cross-entropy on every class of every sample, or with ``gamma > 0`` the sigmoid
    focal loss (Lin et al. 2017): ``focal_scale * (1 - p_t)^gamma * BCE``, ``p_t`` the
    probability of the right answer (1 or 0) for that class.

    Args:
        class_counts: training samples that carry each class (the runner supplies them).
        sampler_weights: the sampler's class loss weights; multi-label samplers have none, and
            a single-label sampler's cannot apply (refused).
        epochs: the run's epochs (supplied; unused).
        train_size: training samples (supplied for multi-label data); the distribution-balanced
            loss's prior needs it.
        gamma: focal exponent (0: plain BCE).
        focal_scale: a constant factor on the focal terms (the reference's ``balance_param``).

    Subclasses weigh the terms (:meth:`term_weights`) or change the logits the terms are
    computed on (:meth:`regularise`).
    """

    def __init__(
        self,
        class_counts: torch.Tensor,
        sampler_weights: torch.Tensor | None,
        epochs: int,
        train_size: int | None = None,
        gamma: float = 0.0,
        focal_scale: float = 1.0,
    ) -> None:
        super().__init__()
        del epochs  # a multi-label loss does not change over training
        if sampler_weights is not None:
            raise ValueError(
                "the sampler gives class loss weights (a single-label strategy such as hybrid); "
                "multi-label losses take none: use a multi-label sampler"
            )
        counts = torch.as_tensor(class_counts).double()
        if counts.dim() != 1 or not bool((counts > 0).all()):
            raise ValueError(
                f"class_counts: every class needs a training sample, got {counts.tolist()}"
            )
        self.register_buffer("counts", counts.float(), persistent=False)
        self.train_size = train_size
        self.gamma = _finite("gamma", gamma, 0.0, "0 is plain binary cross-entropy")
        self.focal_scale = _finite("focal_scale", focal_scale, 0.0, "1 leaves the loss", True)

    counts: torch.Tensor

    def term_weights(self, targets: torch.Tensor) -> torch.Tensor | None:
        """Weights of the (B, C) terms, or one per sample (B, 1); None: unweighted."""
        return None

    def regularise(
        self, logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The logits the terms are computed on, and the weights after any change to them."""
        return logits, weights

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, epoch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-sample loss whose mean is the batch loss, per-sample plain BCE)."""
        logits, targets = logits.float(), targets.float()
        plain = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
        weights = self.term_weights(targets)
        adjusted, weights = self.regularise(logits, targets, weights)
        terms = (
            plain
            if adjusted is logits
            else F.binary_cross_entropy_with_logits(adjusted, targets, reduction="none")
        )
        weighted = terms if weights is None else terms * weights
        if self.gamma > 0:  # p_t from the unweighted terms, as in the reference
            weighted = self.focal_scale * (1.0 - torch.exp(-terms)) ** self.gamma * weighted
        elif self.focal_scale != 1.0:
            weighted = self.focal_scale * weighted
        return weighted.mean(dim=1), plain.detach().mean(dim=1)


class ClassBalancedBCE(MultiLabelBCE):
    """Binary cross-entropy (or focal, with ``gamma``) weighted by the effective number of
    samples (Cui et al. 2019): class ``c`` weighs ``(1 - beta) / (1 - beta^n_c)``, normalised
    to sum to C as Cui et al. do (``normalize``; false: the raw values, as the
    distribution-balanced reference's ``CB_weight``). ``mode``: ``by_class`` weighs column c's
    terms (positives and negatives) by class c's weight; ``average_w`` (the reference's
    default) weighs all of a sample's terms by the mean weight of its positive labels (a
    sample without one: 1; the reference divides by zero there). ``beta`` 0.9 is the reference's
    default for multi-label data (Cui et al.'s 0.9999 is for CIFAR).
    """

    def __init__(
        self,
        class_counts: torch.Tensor,
        sampler_weights: torch.Tensor | None,
        epochs: int,
        train_size: int | None = None,
        beta: float = 0.9,
        mode: str = "average_w",
        normalize: bool = True,
        gamma: float = 0.0,
        focal_scale: float = 1.0,
    ) -> None:
        super().__init__(class_counts, sampler_weights, epochs, train_size, gamma, focal_scale)
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"loss.beta must lie in [0, 1), got {beta}; the reference uses 0.9")
        if mode not in CB_MODES:
            raise ValueError(f"loss.mode={mode!r} is unknown; choose one of {CB_MODES}")
        weights = rule_weights(self.counts.double(), "effective", beta)
        if not normalize:
            weights = (1.0 - beta) / (1.0 - beta ** self.counts.double())
        self.register_buffer("class_weights", weights.float(), persistent=False)
        self.mode = mode

    class_weights: torch.Tensor

    def term_weights(self, targets: torch.Tensor) -> torch.Tensor | None:
        if self.mode == "by_class":
            return self.class_weights.expand_as(targets)
        labels = targets.sum(dim=1, keepdim=True)
        mean = (targets @ self.class_weights)[:, None] / labels.clamp(min=1)
        return torch.where(labels > 0, mean, torch.ones_like(mean))


class DistributionBalancedLoss(MultiLabelBCE):
    r"""The distribution-balanced loss (Wu et al. 2020), as the reference ``ResampleLoss``
    computes it with ``reweight_func='rebalance'`` and ``logit_reg``.

    - Re-balanced weighting: :math:`r_{ic} = (1/n_c) / \sum_{c' \in y_i} 1/n_{c'}` (the
      probability of drawing sample ``i`` through class ``c`` under class-aware sampling over
      its probability of being drawn at all; every column, negatives too), smoothed to
      ``map_alpha + sigmoid(map_beta * (r - map_gamma))``. A sample without a positive label
      has ``r = inf`` and weight ``map_alpha + 1``, as in the reference.
    - Negative-tolerant regularisation: the logits are shifted by ``-log(N / n_c - 1) *
      init_bias / neg_scale`` (the class prior's logit, scaled; in the loss only, so
      predictions use the raw logits, as in the reference), then a negative term's logit is
      multiplied by ``neg_scale`` and its weight divided by it.
    - Focal terms with ``gamma`` and ``focal_scale`` (the reference's ``balance_param``).

    The defaults are the reference's COCO-MLT configuration (VOC-MLT: ``neg_scale=5``,
    ``map_gamma=0.3``). ``rebalance=false`` or ``negative_tolerant=false`` leave a part out (the
    paper's ablations).
    """

    def __init__(
        self,
        class_counts: torch.Tensor,
        sampler_weights: torch.Tensor | None,
        epochs: int,
        train_size: int | None = None,
        map_alpha: float = 0.1,
        map_beta: float = 10.0,
        map_gamma: float = 0.2,
        neg_scale: float = 2.0,
        init_bias: float = 0.05,
        gamma: float = 2.0,
        focal_scale: float = 2.0,
        rebalance: bool = True,
        negative_tolerant: bool = True,
    ) -> None:
        super().__init__(class_counts, sampler_weights, epochs, train_size, gamma, focal_scale)
        self.map_alpha = _finite("map_alpha", map_alpha, 0.0, "the reference uses 0.1")
        self.map_beta = _finite("map_beta", map_beta, 0.0, "the reference uses 10")
        self.map_gamma = _finite("map_gamma", map_gamma, 0.0, "the reference uses 0.2 (COCO)")
        self.neg_scale = _finite("neg_scale", neg_scale, 0.0, "the reference uses 2 (COCO)", True)
        init_bias = _finite("init_bias", init_bias, 0.0, "the reference uses 0.05")
        self.rebalance, self.negative_tolerant = rebalance, negative_tolerant
        bias = torch.zeros_like(self.counts)
        if negative_tolerant and init_bias:
            bias = self._prior_bias(init_bias)
        self.register_buffer("bias", bias, persistent=False)

    bias: torch.Tensor

    def _prior_bias(self, init_bias: float) -> torch.Tensor:
        """``-log(N / n_c - 1) * init_bias / neg_scale``: needs N, which the runner supplies."""
        if self.train_size is None:
            raise ValueError(
                "loss.init_bias needs the number of training samples, which the runner supplies "
                "for multi-label data; set loss.init_bias=0 to leave the prior out"
            )
        counts = self.counts.double()
        full = torch.nonzero(counts >= self.train_size).flatten().tolist()
        if full:
            raise ValueError(
                f"loss.init_bias: class(es) {full} are carried by every training sample, so "
                f"their prior logit is infinite; set loss.init_bias=0"
            )
        bias = -torch.log(self.train_size / counts - 1.0) * init_bias / self.neg_scale
        return bias.float()

    def term_weights(self, targets: torch.Tensor) -> torch.Tensor | None:
        if not self.rebalance:
            return torch.ones_like(targets) if self.negative_tolerant else None
        inverse = 1.0 / self.counts
        r = inverse[None, :] / (targets @ inverse)[:, None]
        return self.map_alpha + torch.sigmoid(self.map_beta * (r - self.map_gamma))

    def regularise(
        self, logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self.negative_tolerant:
            return logits, weights
        shifted = logits + self.bias
        negative = 1.0 - targets
        scaled = shifted * negative * self.neg_scale + shifted * targets
        assert weights is not None  # ones when not re-balanced
        return scaled, weights / self.neg_scale * negative + weights * targets
