"""What a multi-label sampler delivered: label shares among the drawn samples, co-labels
included, set against the intended ones."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from samplers._multilabel_labels import as_label_matrix
from samplers.stats import SamplingStats, sampling_stats

__all__ = ["MultiLabelSamplingStats", "multilabel_sampling_stats"]


@dataclass(frozen=True)
class MultiLabelSamplingStats:
    """Statistics of one epoch's drawn indices into an (N, C) label matrix.

    A drawn sample counts once for each of its positive labels, so a tail class drawn on
    purpose brings its head co-labels into ``counts``.

    Attributes:
        counts: drawn samples that carry each class (int64, length C).
        shares: ``counts / counts.sum()``: each class's share of the drawn labels (float64).
        target: the intended shares (e.g. ``sampler.target_class_shares()``), or ``None``.
        per_draw: ``counts / draws``: the fraction of draws that carry each class.
        labels_per_draw: mean number of positive labels of a drawn sample.
        unique_ratio, max_repeats, never_drawn: over samples, as in
            :class:`~samplers.SamplingStats`.
        kl_to_target: KL(shares || target) in nats (``inf`` if a class with zero target was
            drawn; ``nan`` without a target).
        imbalance_ratio: largest share / smallest, over classes with a positive sample
            (``inf`` if one of them was never drawn).
    """

    counts: torch.Tensor
    shares: torch.Tensor
    target: torch.Tensor | None
    per_draw: torch.Tensor
    labels_per_draw: float
    unique_ratio: float
    max_repeats: int
    never_drawn: float
    kl_to_target: float
    imbalance_ratio: float


def multilabel_sampling_stats(
    indices: torch.Tensor | Sequence[int],
    labels: torch.Tensor | Sequence[Sequence[int]],
    target: torch.Tensor | Sequence[float] | None = None,
) -> MultiLabelSamplingStats:
    """Compute :class:`MultiLabelSamplingStats` from drawn ``indices`` (any shape) into the
    (N, C) 0/1 ``labels``.

    Example:
        >>> from samplers import multilabel_sampling_stats
        >>> stats = multilabel_sampling_stats([0, 1, 1], [[1, 0], [1, 1]], target=[0.5, 0.5])
        >>> stats.counts.tolist(), stats.shares.tolist(), stats.labels_per_draw
        ([3, 2], [0.6, 0.4], 1.6666666666666667)
    """
    matrix = as_label_matrix(labels)
    indices = torch.as_tensor(indices).reshape(-1).long().cpu()
    items = sampling_stats(indices, torch.zeros(matrix.shape[0], dtype=torch.long))
    if target is not None:
        target = torch.as_tensor(target, dtype=torch.float64).reshape(-1)
        if target.numel() != matrix.shape[1]:
            raise ValueError(
                f"target: expected {matrix.shape[1]} shares (one per label column), got "
                f"{target.numel()}; pass sampler.target_class_shares()"
            )
    entries = _label_stats(indices, matrix, target)
    draws = indices.numel()
    return MultiLabelSamplingStats(
        counts=entries.counts,
        shares=entries.shares,
        target=target,
        per_draw=entries.counts.double() / draws,
        labels_per_draw=float(entries.counts.sum()) / draws,
        unique_ratio=items.unique_ratio,
        max_repeats=items.max_repeats,
        never_drawn=items.never_drawn,
        kl_to_target=entries.kl_to_target,
        imbalance_ratio=entries.imbalance_ratio,
    )


def _label_stats(
    indices: torch.Tensor, matrix: torch.Tensor, target: torch.Tensor | None
) -> SamplingStats:
    """:func:`sampling_stats` over the drawn labels: every positive entry of the matrix is one
    item whose class is its column, and a drawn sample draws all of its entries."""
    rows, columns = torch.nonzero(matrix, as_tuple=True)  # entries, row by row
    per_row = torch.bincount(rows, minlength=matrix.shape[0])
    first = torch.cumsum(per_row, 0) - per_row
    taken = per_row[indices]
    if int(taken.sum()) == 0:
        raise ValueError(
            "indices: no drawn sample has a positive label; label statistics need at least one"
        )
    # Entry k of the drawn ones is entry `first[row] + (k - where that row's entries begin)`.
    starts = torch.repeat_interleave(first[indices] - (torch.cumsum(taken, 0) - taken), taken)
    drawn = starts + torch.arange(starts.numel())
    return sampling_stats(drawn, columns, target, num_classes=matrix.shape[1])
