"""Argument checks whose errors name the parameter, the value and the fix."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["as_labels", "check_bool", "check_int", "check_number"]


def check_int(name: str, value: Any, minimum: int | None = None) -> int:
    """``value`` as an int (>= ``minimum`` when given), or a ValueError that names ``name``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or (minimum is not None and value < minimum)
    ):
        what = {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}.get(
            minimum, f"an integer >= {minimum}"
        )
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a real bool, or a ValueError that names ``name``.

    Strings and numbers are refused rather than read as truthy: ``"False"`` from a config file or
    ``0`` would otherwise silently mean the opposite of what was meant.
    """
    if not isinstance(value, bool):
        raise ValueError(
            f"{name} must be True or False, got {value!r} ({type(value).__name__}); pass a bool "
            "(in YAML: true / false, unquoted)"
        )
    return value


def check_number(name: str, value: Any) -> float:
    """``value`` as a finite float, or a ValueError that names ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def labels_tensor(labels: Any, expected: str) -> torch.Tensor:
    """``labels`` as a detached CPU tensor, or a ValueError that says what was ``expected``."""
    if isinstance(labels, torch.Tensor):
        tensor = labels
    else:
        try:
            tensor = torch.as_tensor(labels)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(
                f"labels: could not convert to a tensor ({err}); pass {expected}"
            ) from None
    return tensor.detach().cpu()


def as_labels(labels: Sequence[int] | torch.Tensor, num_classes: int | None = None) -> torch.Tensor:
    """Validate class labels and return them as a 1-D int64 CPU tensor."""
    labels = labels_tensor(labels, "a sequence of non-negative integers or a 1-D integer tensor")
    if labels.dim() == 2 and labels.shape[1] == 1:
        raise ValueError(
            f"labels: expected a 1-D sequence, got a column of shape {tuple(labels.shape)}; pass "
            "labels.reshape(-1)"
        )
    if labels.dim() == 2:
        raise ValueError(
            f"labels: expected a 1-D sequence, got shape {tuple(labels.shape)}; for an (N, C) "
            "multi-label 0/1 matrix use MultiLabelClassAwareSampler, MultiLabelWeightedSampler "
            "or MultiLabelInstanceSampler (docs/your-labels.md)"
        )
    if labels.dim() != 1:
        raise ValueError(f"labels: expected a 1-D sequence, got shape {tuple(labels.shape)}")
    if labels.numel() == 0:
        raise ValueError("labels: empty; a sampler needs at least one labelled sample")
    if labels.dtype == torch.bool or labels.is_complex():
        raise ValueError(f"labels: expected integer class ids, got dtype {labels.dtype}")
    if labels.is_floating_point() and (
        not torch.isfinite(labels).all() or (labels != labels.round()).any()
    ):
        raise ValueError(
            "labels: non-integer values found; pass integer class ids 0..C-1 "
            "(e.g. labels.long() after checking they are whole numbers)"
        )
    labels = labels.long()
    smallest = int(labels.min())
    if smallest < 0:
        raise ValueError(f"labels: negative class id {smallest}; class ids must be 0..C-1")
    largest = int(labels.max())
    if num_classes is not None and largest >= num_classes:
        raise ValueError(
            f"num_classes={num_classes} but labels contain class {largest}; "
            f"raise num_classes to at least {largest + 1} or leave it None"
        )
    return labels
