"""What a sampler actually delivered, set against what it intended."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SamplingStats", "sampling_stats"]


@dataclass(frozen=True)
class SamplingStats:
    """Statistics of one epoch's drawn indices.

    Attributes:
        counts: draws per class (int64, length C).
        shares: ``counts / counts.sum()`` (float64).
        unique_ratio: distinct samples drawn / indices drawn.
        max_repeats: most times any one sample was drawn.
        never_drawn: share of the dataset not drawn at all.
        kl_to_target: KL(drawn shares || target shares) in nats (``inf`` if a class with zero
            target was drawn; ``nan`` when no target was given).
        imbalance_ratio: largest class share / smallest, over classes that have samples
            (``inf`` if one of them was never drawn).
    """

    counts: torch.Tensor
    shares: torch.Tensor
    unique_ratio: float
    max_repeats: int
    never_drawn: float
    kl_to_target: float
    imbalance_ratio: float


def sampling_stats(
    indices: torch.Tensor,
    labels: torch.Tensor,
    target: torch.Tensor | None = None,
    num_classes: int | None = None,
) -> SamplingStats:
    """Compute :class:`SamplingStats` from drawn ``indices`` (any shape) into ``labels``."""
    indices = torch.as_tensor(indices).reshape(-1).long().cpu()
    labels = torch.as_tensor(labels)
    if labels.dim() == 2 and labels.shape[1] > 1:
        raise ValueError(
            f"labels: a single-label statistic got a matrix of shape {tuple(labels.shape)}; for "
            "an (N, C) multi-label 0/1 matrix use multilabel_sampling_stats"
        )
    labels = labels.reshape(-1).long().cpu()
    if indices.numel() == 0:
        raise ValueError("indices: empty; statistics need at least one drawn index")
    num_classes = num_classes if num_classes is not None else int(labels.max()) + 1
    per_sample = torch.bincount(indices, minlength=labels.numel())
    counts = torch.bincount(labels[indices], minlength=num_classes)
    shares = counts.double() / indices.numel()
    present = torch.bincount(labels, minlength=num_classes) > 0
    smallest = shares[present].min()
    imbalance = float("inf") if smallest == 0 else float(shares[present].max() / smallest)
    if target is None:
        kl = float("nan")
    else:
        target = torch.as_tensor(target, dtype=torch.float64).reshape(-1)
        drawn = shares > 0
        if (target[drawn] <= 0).any():
            kl = float("inf")
        else:
            kl = float((shares[drawn] * (shares[drawn] / target[drawn]).log()).sum().clamp(min=0))
    return SamplingStats(
        counts=counts,
        shares=shares,
        unique_ratio=float((per_sample > 0).sum()) / indices.numel(),
        max_repeats=int(per_sample.max()),
        never_drawn=float((per_sample == 0).sum()) / labels.numel(),
        kl_to_target=kl,
        imbalance_ratio=imbalance,
    )
