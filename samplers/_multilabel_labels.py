"""Multi-label targets: an (N, C) 0/1 matrix, checked with errors that name the fix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from samplers._checks import labels_tensor

__all__ = ["as_label_matrix"]


def _where(mask: torch.Tensor) -> str:
    row, column = (int(v) for v in torch.nonzero(mask)[0])
    return f"row {row}, column {column}"


def as_label_matrix(
    labels: Sequence[Sequence[int]] | torch.Tensor | Any, num_classes: int | None = None
) -> torch.Tensor:
    """Validate multi-label targets and return them as an (N, C) bool CPU tensor.

    ``labels`` is a multi-hot matrix: row ``i`` holds a 1 (or ``True``) in column ``c`` when
    sample ``i`` carries class ``c``. Bool, integer and float tensors, lists of lists and numpy
    arrays (through ``torch.as_tensor``) are accepted; every entry must be 0 or 1. Rows without
    a positive label and classes without a positive sample pass here: each sampler says what it
    does with them. ``num_classes``, when given, must equal the number of columns.
    """
    labels = labels_tensor(
        labels, "an (N, C) 0/1 matrix: a list of equally long rows, a numpy array or a tensor"
    )
    if labels.dim() == 1:
        raise ValueError(
            f"labels: got a 1-D vector of shape {tuple(labels.shape)}; multi-label samplers take "
            "an (N, C) 0/1 matrix, one column per class. For one class id per sample use the "
            "single-label samplers (e.g. WeightedSampler), or one-hot the ids: "
            "torch.nn.functional.one_hot(labels)"
        )
    if labels.dim() != 2:
        raise ValueError(
            f"labels: expected an (N, C) 0/1 matrix, got shape {tuple(labels.shape)}; reshape "
            "to one row per sample and one column per class"
        )
    if labels.shape[0] == 0 or labels.shape[1] == 0:
        raise ValueError(
            f"labels: empty matrix of shape {tuple(labels.shape)}; a sampler needs at least one "
            "sample and one class"
        )
    if labels.is_complex():
        raise ValueError(f"labels: expected 0/1 entries, got dtype {labels.dtype}")
    if labels.dtype != torch.bool:
        _check_binary(labels)
        labels = labels != 0
    if num_classes is not None and num_classes != labels.shape[1]:
        raise ValueError(
            f"num_classes={num_classes} but labels have {labels.shape[1]} columns (one per "
            "class); leave num_classes None, or add the missing classes as all-zero columns"
        )
    return labels


def _check_binary(labels: torch.Tensor) -> None:
    if labels.is_floating_point() and not torch.isfinite(labels).all():
        raise ValueError(
            f"labels: NaN or infinite entry at {_where(~torch.isfinite(labels))}; pass 0/1 entries"
        )
    negative = labels < 0
    if negative.any():
        value = labels[negative][0].item()
        raise ValueError(
            f"labels: entry {value} at {_where(negative)}; entries must be 0 or 1. If negative "
            "entries mark ignored or difficult labels, decide what they mean and map them first, "
            "e.g. labels.clamp(min=0) to count them as absent"
        )
    other = (labels != 0) & (labels != 1)
    if other.any():
        value = labels[other][0].item()
        raise ValueError(
            f"labels: entry {value} at {_where(other)}; entries must be 0 or 1. Pass multi-hot "
            "targets, e.g. (scores > 0.5) for soft ones"
        )
