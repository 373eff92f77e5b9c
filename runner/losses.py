"""Losses on per-sample terms: cross-entropy or focal, optionally class-weighted, and the
published long-tail losses that change the logits the cross-entropy sees (LDAM, balanced
softmax, logit adjustment).

Class weights come from a rule (inverse frequency; effective number, Cui et al. 2019) or from
the sampler (the hybrid strategy), and are constant or deferred (DRW: all ones until a given
fraction of training). The batch loss is the plain mean of weighted per-sample terms, so a
class's expected contribution is its sampling share times its weight.

Every loss is called as ``loss(logits, targets, epoch)`` (``epoch`` 0-based) and returns the
weighted per-sample loss and the plain per-sample cross-entropy of the raw logits (no margins,
no priors, no weights): the sampler's ``hard_mined`` strategy learns from the latter. Class
statistics are buffers, so ``.to(device)`` moves them; they are not part of any checkpoint.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from samplers import effective_number_weights, power_weights

WEIGHT_RULES = (None, "auto", "inverse", "effective", "sampler")


def rule_weights(class_counts: torch.Tensor, rule: str, beta: float) -> torch.Tensor:
    """Per-class weights (inverse frequency or effective number), summing to the number of
    non-empty classes, so that a balanced batch has mean weight one."""
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


class ClassWeightedLoss(nn.Module):
    """Per-sample ``w[y] * (1 - p_y)^gamma * CE`` (gamma=0: cross-entropy; gamma>0: focal).

    Args:
        class_counts, sampler_weights, epochs: supplied by the runner; ``sampler_weights`` are the
            sampler's class loss weights (``class_loss_weights()``, the hybrid strategy), or None.
        weights: ``None`` (no class weights), ``"inverse"``, ``"effective"`` (with ``beta``),
            ``"sampler"`` (``sampler_weights``; an error if there are none) or ``"auto"``
            (``sampler_weights`` when there are some, else none).
        gamma: focal exponent.
        defer_fraction: weights stay at one until this fraction of the epochs (DRW), e.g. 0.8.

    Subclasses change the logits the loss is computed on by overriding :meth:`adjust`.
    """

    class_weights: torch.Tensor | None

    def __init__(
        self,
        class_counts: torch.Tensor,
        sampler_weights: torch.Tensor | None,
        epochs: int,
        weights: str | None = "auto",
        beta: float = 0.999,
        gamma: float = 0.0,
        defer_fraction: float = 0.0,
    ) -> None:
        super().__init__()
        if weights not in WEIGHT_RULES:
            raise ValueError(f"loss.weights={weights!r} is unknown; choose one of {WEIGHT_RULES}")
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"loss.beta must lie in [0, 1), got {beta}")
        if gamma < 0:
            raise ValueError(f"loss.gamma must be >= 0, got {gamma}")
        if not 0.0 <= defer_fraction < 1.0:
            raise ValueError(f"loss.defer_fraction must lie in [0, 1), got {defer_fraction}")
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

    def adjust(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The logits the loss's cross-entropy is computed on (here: unchanged)."""
        return logits

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, epoch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (weighted per-sample loss, unweighted per-sample cross-entropy)."""
        logits = logits.float()
        ce = F.cross_entropy(logits, targets, reduction="none")
        adjusted = self.adjust(logits, targets)
        loss = ce if adjusted is logits else F.cross_entropy(adjusted, targets, reduction="none")
        if self.gamma > 0:
            loss = (1.0 - torch.exp(-loss)) ** self.gamma * loss
        if self.class_weights is not None and epoch >= self.weights_from_epoch:
            loss = loss * self.class_weights[targets]
        return loss, ce


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
    As everywhere in this runner, weighted terms are averaged plainly (the reference
    implementation's ``F.cross_entropy(weight=...)`` divides by the batch's weight sum instead).
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
    ) -> None:
        super().__init__(
            class_counts,
            sampler_weights,
            epochs,
            weights=weights,
            beta=beta,
            defer_fraction=defer_fraction,
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
