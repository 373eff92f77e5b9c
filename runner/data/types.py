"""What a data source hands the runner: the samples of each split, their labels and class names,
and how they are augmented, standardised and fed (:class:`LongTailData`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Augment:
    """Batch augmentation for images: random crop after zero padding, horizontal flip."""

    crop_padding: int = 0
    flip: bool = False


@dataclass
class Feeding:
    """How the samples reach the model (see :mod:`runner.train.feed`): ``in_memory`` None chooses
    by the memory budget (``memory_budget_gb`` None: a quarter of the available memory);
    ``num_workers`` None: 0 for tensors, up to 4 for datasets that decode."""

    in_memory: bool | None = None
    memory_budget_gb: float | None = None
    num_workers: int | None = None

    def __post_init__(self) -> None:
        if self.memory_budget_gb is not None and not self.memory_budget_gb > 0:
            raise ValueError(
                f"data.memory_budget_gb must be > 0 (or null: a quarter of the available "
                f"memory), got {self.memory_budget_gb}"
            )
        if self.num_workers is not None and self.num_workers < 0:
            raise ValueError(
                f"data.num_workers must be >= 0 (or null: automatic), got {self.num_workers}"
            )


Normalize = tuple[Sequence[float], Sequence[float]]


@dataclass
class LongTailData:
    """``*_x`` are tensors (in memory) or :class:`runner.data.samples.Samples` (read on demand);
    with ``normalize`` (per-channel mean, std) they hold uint8 images in [0, 255]."""

    train_x: Any
    train_y: torch.Tensor
    test_x: Any
    test_y: torch.Tensor
    class_names: list[str]
    name: str
    imbalance_factor: float
    augment: Augment | None = None
    val_x: Any = None  # balanced, carved from the training pool before the cut
    val_y: torch.Tensor | None = None
    normalize: Normalize | None = None
    feeding: Feeding = field(default_factory=Feeding)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def train_counts(self) -> torch.Tensor:
        return torch.bincount(self.train_y, minlength=self.num_classes)

    @property
    def in_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])
