"""Losses on per-sample terms: cross-entropy or focal (softmax or sigmoid), optionally
class-weighted, and the published long-tail losses that change the logits the cross-entropy
sees (LDAM, balanced softmax, logit adjustment).

Class weights come from a rule (inverse frequency; effective number, Cui et al. 2019) or from
the sampler (the hybrid strategy), and are constant or deferred (DRW: all ones until a given
fraction of training). ``reduction`` says how a batch's weighted terms are averaged:
``weight_sum`` divides their sum by the batch's sum of weights, as ``F.cross_entropy(weight=)``
does in the DRW and LDAM-DRW reference code (kaidic/LDAM-DRW); ``batch_mean`` divides it by the
batch size, as Cui et al.'s class-balanced losses and the hybrid strategy's weights expect.

Every loss is called as ``loss(logits, targets, epoch)`` (``epoch`` 0-based) and returns the
per-sample loss, whose plain mean is the batch's loss under ``reduction``, and the plain
per-sample cross-entropy of the raw logits (no margins, no priors, no weights): the sampler's
``hard_mined`` strategy learns from the latter. Class statistics are buffers, so ``.to(device)``
moves them; they are not part of any checkpoint.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from samplers import effective_number_weights, power_weights

WEIGHT_RULES = (None, "auto", "inverse", "effective", "sampler")
REDUCTIONS = ("weight_sum", "batch_mean")


def rule_weights(class_counts: torch.Tensor, rule: str, beta: float) -> torch.Tensor:
    """Per-class weights (inverse frequency or effective number), summing to the number of
    non-empty classes (the references' ``/ sum(w) * C`` when no class is empty)."""
    shares = (
        power_weights(class_counts, -1.0)
        if rule == "inverse"
        else effective_number_weights(class_counts, beta)
    )
    return shares * int((class_counts > 0).sum())


def _number(name: str, value: Any, fix: str) -> float:
    """``value`` as a finite float, or a ValueError naming ``loss.<name>`` and the fix."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"loss.{name} must be a finite number, got {value!r}; {fix}")
    return float(value)


def _counts(class_counts: torch.Tensor) -> torch.Tensor:
    counts = torch.as_tensor(class_counts).double()
    if not bool((counts > 0).any()):
        raise ValueError("the training set has no samples: every class count is zero")
    return counts


def _focal(terms: torch.Tensor, gamma: float) -> torch.Tensor:
    """``(1 - p)^gamma * terms`` where ``terms = -log p`` (softmax cross-entropy per sample)."""
    return terms if gamma == 0 else (1.0 - torch.exp(-terms)) ** gamma * terms


class ClassWeightedLoss(nn.Module):
    """Per-sample ``w[y] * (1 - p_y)^gamma * CE`` (gamma=0: cross-entropy; gamma>0: the
    softmax focal loss), with ``p_y`` the softmax probability of the true class.

    Args:
        class_counts, sampler_weights, epochs: supplied by the runner; ``sampler_weights`` are the
            sampler's class loss weights (``class_loss_weights()``, the hybrid strategy), or None.
        weights: ``None`` (no class weights), ``"inverse"``, ``"effective"`` (with ``beta``),
            ``"sampler"`` (``sampler_weights``; an error if there are none) or ``"auto"``
            (``sampler_weights`` when there are some, else none).
        beta: effective-number parameter; 0.9999 is Cui et al.'s and BagofTricks' for
            CIFAR-10-LT (BagofTricks uses 0.9 for CIFAR-100-LT).
        gamma: focal exponent.
        defer_fraction: weights stay at one until this fraction of the epochs (DRW), e.g. 0.8.
        reduction: ``"batch_mean"`` (the batch loss is ``sum w_i l_i / B``: Cui et al.'s
            class-balanced softmax loss, the hybrid strategy's weights) or ``"weight_sum"``
            (``sum w_i l_i / sum w_i``, as ``F.cross_entropy(weight=)`` in the DRW reference;
            ``conf/loss/drw.yaml`` sets it). The same without class weights, or before a
            deferred switch.

    Subclasses change the logits the loss is computed on by overriding :meth:`adjust`, or the
    per-sample term itself by overriding :meth:`terms`.
    """

    class_weights: torch.Tensor | None

    def __init__(
        self,
        class_counts: torch.Tensor,
        sampler_weights: torch.Tensor | None,
        epochs: int,
        weights: str | None = "auto",
        beta: float = 0.9999,
        gamma: float = 0.0,
        defer_fraction: float = 0.0,
        reduction: str = "batch_mean",
    ) -> None:
        super().__init__()
        if weights not in WEIGHT_RULES:
            raise ValueError(f"loss.weights={weights!r} is unknown; choose one of {WEIGHT_RULES}")
        if not 0.0 <= beta < 1.0:
            raise ValueError(
                f"loss.beta must lie in [0, 1), got {beta}; 0.9999 is Cui et al.'s for CIFAR-10-LT"
            )
        if gamma < 0:
            raise ValueError(f"loss.gamma must be >= 0, got {gamma}; 0 is plain cross-entropy")
        if not 0.0 <= defer_fraction < 1.0:
            raise ValueError(
                f"loss.defer_fraction must lie in [0, 1), got {defer_fraction}; DRW uses 0.8"
            )
        if reduction not in REDUCTIONS:
            raise ValueError(
                f"loss.reduction={reduction!r} is unknown; choose weight_sum (divide by the "
                "batch's sum of class weights, as F.cross_entropy(weight=)) or batch_mean (by "
                "the batch size)"
            )
        if weights == "sampler" and sampler_weights is None:
            raise ValueError(
                "loss.weights='sampler' but the sampler provides no class loss weights; use "
                "sampler=hybrid or another loss.weights"
            )
        if weights in ("sampler", "auto") and sampler_weights is not None:
            class_weights: torch.Tensor | None = torch.as_tensor(sampler_weights).float()
        elif weights in ("inverse", "effective"):
            class_weights = rule_weights(class_counts, weights, beta).float()
        else:
            class_weights = None
        self.register_buffer("class_weights", class_weights, persistent=False)
        self.gamma = gamma
        self.weights_from_epoch = int(defer_fraction * epochs)
        self.reduction = reduction

    def adjust(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The logits the loss's cross-entropy is computed on (here: unchanged)."""
        return logits

    def plain_at(self, epoch: int) -> bool:
        """Whether at ``epoch`` this loss is the plain per-sample cross-entropy of the logits
        (no adjustment, no focal term, no class weights yet), which heads trained together
        compute for many heads in one call (:mod:`runner.train.stacked`)."""
        cls = type(self)
        own = (cls.forward, cls.terms, cls.adjust)
        if own != (ClassWeightedLoss.forward, ClassWeightedLoss.terms, ClassWeightedLoss.adjust):
            return False
        weighted = self.class_weights is not None and epoch >= self.weights_from_epoch
        return self.gamma == 0 and not weighted

    def terms(self, logits: torch.Tensor, targets: torch.Tensor, ce: torch.Tensor) -> torch.Tensor:
        """Unweighted per-sample loss; ``ce`` is the cross-entropy of the raw ``logits``."""
        adjusted = self.adjust(logits, targets)
        loss = ce if adjusted is logits else F.cross_entropy(adjusted, targets, reduction="none")
        return _focal(loss, self.gamma)

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, epoch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (per-sample loss whose mean is the batch loss, unweighted per-sample CE)."""
        logits = logits.float()
        ce = F.cross_entropy(logits, targets, reduction="none")
        loss = self.terms(logits, targets, ce)
        if self.class_weights is not None and epoch >= self.weights_from_epoch:
            weights = self.class_weights[targets]
            loss = loss * weights
            if self.reduction == "weight_sum":
                # The weights are constants, so scaling by B / sum(w) gives the reference's
                # value and gradient; a batch of zero-weight targets only has zero terms.
                total = weights.sum().clamp(min=torch.finfo(weights.dtype).tiny)
                loss = loss * (weights.numel() / total)
        return loss, ce


class SigmoidFocalLoss(ClassWeightedLoss):
    """The sigmoid (one-vs-all) focal loss of Lin et al. (2017) and Cui et al. (2019), per
    sample ``w[y] * sum_c (1 - p_t,c)^gamma * BCE(z_c, 1[c = y])`` with ``p_t,c`` the sigmoid
    probability of the right answer for class ``c``; ``gamma=0`` (the default): Cui et al.'s
    sigmoid cross-entropy. Arguments as :class:`ClassWeightedLoss`. With effective-number
    weights, ``gamma=1`` and ``reduction="batch_mean"`` (``conf/loss/cb_focal.yaml``) this is
    class-balanced focal as richardaecn/class-balanced-loss and BagofTricks-LT compute it: the
    summed terms divided by the batch size.

    The modulator is computed as ``exp(-gamma * (y z + log(1 + e^-z)))``, Cui et al.'s stable
    form, whose gradient stays finite for ``gamma < 1``. Cui et al. also start the classifier's
    bias at ``-log(C - 1)`` for this loss; the runner's models do not.
    """

    def terms(self, logits: torch.Tensor, targets: torch.Tensor, ce: torch.Tensor) -> torch.Tensor:
        onehot = F.one_hot(targets, logits.shape[1]).to(logits.dtype)
        bce = F.binary_cross_entropy_with_logits(logits, onehot, reduction="none")
        if self.gamma > 0:
            bce = torch.exp(-self.gamma * (onehot * logits + F.softplus(-logits))) * bce
        return bce.sum(dim=1)


class LDAMLoss(ClassWeightedLoss):
    """LDAM (Cao et al. 2019): cross-entropy on ``scale * (z - Δ_y e_y)``, where the true class's
    logit is lowered by the margin ``Δ_j = C / n_j^(1/4)`` and ``C`` makes the largest margin (the
    rarest class's) ``max_margin``. With the defaults, LDAM-DRW: effective-number weights
    (beta 0.9999) from 80% of training on, as in the paper (epoch 160 of 200).

    The paper's ``scale=30`` goes with a cosine head (normalised features and weights, logits in
    [-1, 1]: ``model.head=cosine``, which ``+method=ldam_drw`` sets). On a plain linear layer,
    whose logits are unbounded, 30 multiplies their scale (and gradient) thirtyfold. Measured on the default run (mlp,
    synthetic_lt, 2 epochs): at ``trainer.lr=0.1`` the loss diverges in epoch 2 (the runner stops
    with its non-finite-loss error); ``trainer.lr=0.01`` trains (balanced accuracy 0.81, CE at
    that lr 0.14); ``loss.scale=1`` keeps lr 0.1 stable but its margins, in raw-logit units, are
    then small (0.41, CE 0.47). An empty class is never a target: margin 0.
    After the switch, a batch's weighted terms are divided by its sum of weights
    (``reduction="weight_sum"``), as the reference's ``F.cross_entropy(weight=...)``;
    ``reduction="batch_mean"`` divides by the batch size instead.
    """

    def __init__(
        self,
        class_counts: torch.Tensor,
        sampler_weights: torch.Tensor | None,
        epochs: int,
        max_margin: float = 0.5,
        scale: float = 30.0,
        weights: str | None = "effective",
        beta: float = 0.9999,
        defer_fraction: float = 0.8,
        reduction: str = "weight_sum",
    ) -> None:
        super().__init__(
            class_counts,
            sampler_weights,
            epochs,
            weights=weights,
            beta=beta,
            defer_fraction=defer_fraction,
            reduction=reduction,
        )
        max_margin = _number("max_margin", max_margin, "the paper uses 0.5")
        if max_margin <= 0:
            raise ValueError(f"loss.max_margin must be > 0, got {max_margin}; the paper uses 0.5")
        scale = _number("scale", scale, "the paper uses 30")
        if scale <= 0:
            raise ValueError(
                f"loss.scale must be > 0, got {scale}; the paper uses 30, 1 leaves the logits unscaled"
            )
        counts = _counts(class_counts)
        inverse_root = torch.where(counts > 0, counts.clamp(min=1) ** -0.25, 0.0)
        self.register_buffer(
            "margins", (inverse_root * (max_margin / inverse_root.max())).float(), persistent=False
        )
        self.scale = scale

    margins: torch.Tensor

    def adjust(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        margin = torch.zeros_like(logits).scatter_(1, targets[:, None], self.margins[targets, None])
        return self.scale * (logits - margin)


class LogitAdjustedLoss(ClassWeightedLoss):
    """Logit-adjusted cross-entropy (Menon et al. 2021): cross-entropy on ``z + tau * log π``,
    ``π`` the training class prior ``n_j / N``. With ``tau=1`` this is balanced softmax (Ren et
    al. 2020, cross-entropy on ``z + log n_j``): ``log N`` is the same for every class and
    softmax ignores it. Predict with the raw logits, as the runner does. The prior is the
    training set's class distribution, which is what the model sees only when the sampler draws
    it (``sampler=uniform``); a re-balancing sampler and this loss correct twice.

    An empty class (``n_j = 0``) would get ``log 0 = -inf``; it is counted as one sample instead,
    so the loss stays finite and, as with plain cross-entropy, its logit is pushed down (it is
    never a target) rather than left untrained.
    """

    def __init__(
        self,
        class_counts: torch.Tensor,
        sampler_weights: torch.Tensor | None,
        epochs: int,
        tau: float = 1.0,
    ) -> None:
        super().__init__(class_counts, sampler_weights, epochs, weights=None)
        tau = _number("tau", tau, "1.0 is the paper's (and balanced softmax)")
        if tau < 0:
            raise ValueError(
                f"loss.tau must be >= 0, got {tau}; 1.0 is the paper's (and balanced softmax), 0 is plain cross-entropy"
            )
        counts = _counts(class_counts).clamp(min=1)
        self.register_buffer(
            "offsets", (tau * (counts / counts.sum()).log()).float(), persistent=False
        )
        self.tau = tau

    offsets: torch.Tensor

    def adjust(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return logits + self.offsets
