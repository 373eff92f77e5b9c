"""Losses on per-sample terms: cross-entropy or focal, optionally class-weighted.

Class weights come from a rule (inverse frequency; effective number, Cui et al. 2019) or from
the sampler (the hybrid strategy), and are constant or deferred (DRW: all ones until a given
fraction of training). The batch loss is the plain mean of weighted per-sample terms, so a
class's expected contribution is its sampling share times its weight.
"""

from __future__ import annotations

import torch
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


class ClassWeightedLoss:
    """Per-sample ``w[y] * (1 - p_y)^gamma * CE`` (gamma=0: cross-entropy; gamma>0: focal).

    Args:
        class_counts, sampler, epochs: supplied by the runner.
        weights: ``None`` (no class weights), ``"inverse"``, ``"effective"`` (with ``beta``),
            ``"sampler"`` (the sampler's ``class_loss_weights()``; an error if it has none) or
            ``"auto"`` (the sampler's when it provides them, else none).
        gamma: focal exponent.
        defer_fraction: weights stay at one until this fraction of the epochs (DRW), e.g. 0.8.
    """

    def __init__(
        self,
        class_counts: torch.Tensor,
        sampler: object,
        epochs: int,
        weights: str | None = "auto",
        beta: float = 0.999,
        gamma: float = 0.0,
        defer_fraction: float = 0.0,
    ) -> None:
        if weights not in WEIGHT_RULES:
            raise ValueError(f"loss.weights={weights!r} is unknown; choose one of {WEIGHT_RULES}")
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"loss.beta must lie in [0, 1), got {beta}")
        if gamma < 0:
            raise ValueError(f"loss.gamma must be >= 0, got {gamma}")
        if not 0.0 <= defer_fraction < 1.0:
            raise ValueError(f"loss.defer_fraction must lie in [0, 1), got {defer_fraction}")
        from_sampler = getattr(sampler, "class_loss_weights", None)
        if weights == "sampler" and from_sampler is None:
            raise ValueError(
                f"loss.weights='sampler' but {type(sampler).__name__} provides no class loss weights; use sampler=hybrid or another loss.weights"
            )
        if weights in ("sampler", "auto") and from_sampler is not None:
            self.class_weights: torch.Tensor | None = from_sampler().float()
        elif weights in ("inverse", "effective"):
            self.class_weights = rule_weights(class_counts, weights, beta).float()
        else:
            self.class_weights = None
        self.gamma = gamma
        self.weights_from_epoch = int(defer_fraction * epochs)

    def to(self, device: torch.device) -> ClassWeightedLoss:
        if self.class_weights is not None:
            self.class_weights = self.class_weights.to(device)
        return self

    def __call__(
        self, logits: torch.Tensor, targets: torch.Tensor, epoch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (weighted per-sample loss, unweighted per-sample cross-entropy)."""
        ce = F.cross_entropy(logits.float(), targets, reduction="none")
        loss = ce
        if self.gamma > 0:
            loss = (1.0 - torch.exp(-ce)) ** self.gamma * ce
        if self.class_weights is not None and epoch >= self.weights_from_epoch:
            loss = loss * self.class_weights[targets]
        return loss, ce
