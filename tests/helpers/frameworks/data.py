"""The data every scenario trains on, and the recording of what each rank was given."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import TensorDataset

#: Long-tailed class sizes: 400 samples of 10 classes.
COUNTS = [120, 80, 56, 40, 30, 24, 18, 14, 10, 8]
BATCH = 16
EPOCHS = 3
WORLD = 2
FEATURES = 8


def labels() -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(COUNTS)), torch.tensor(COUNTS))


def dataset() -> TensorDataset:
    """(features, label, dataset index) per sample: the index is what the rank records."""
    y = labels()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(len(y), FEATURES, generator=generator) + 0.5 * y[:, None]
    return TensorDataset(x, y, torch.arange(len(y)))


def model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same start on every rank
    return torch.nn.Linear(FEATURES, len(COUNTS))


def losses(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample losses (reduction="none"): what feedback strategies learn from."""
    return torch.nn.functional.cross_entropy(net(x), y, reduction="none")


class Record:
    """What one rank was given, epoch by epoch, and what the sampler held after each epoch."""

    def __init__(self) -> None:
        self.epochs: list[list[int]] = []
        self.batches: list[list[list[int]]] = []
        self.after: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}

    def batch(self, epoch: int, indices: torch.Tensor) -> None:
        while len(self.epochs) <= epoch:
            self.epochs.append([])
            self.batches.append([])
        self.epochs[epoch].extend(indices.tolist())
        self.batches[epoch].append(indices.tolist())

    def epoch_end(self, sampler: Any) -> None:
        state: dict[str, Any] = {"epoch": sampler.epoch}
        for name in getattr(sampler, "feedback_state", ()):
            state[name] = getattr(sampler, name).double().tolist()
        self.after.append(state)

    def as_json(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "batches": self.batches, "after": self.after, **self.extra}
