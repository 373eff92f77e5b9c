"""A trained model as a run logs it (the MLflow model)."""

from __future__ import annotations

import torch
from torch import nn

from runner.data import Normalize, to_model_input


class Predictor(nn.Module):
    """A trained model as a run logs it: samples as the data stores them in (uint8 images, or
    float features), logits out; the run's own conversion (per-channel standardisation of
    images) comes first, and any resizing a backbone needs is inside the model, so predictions
    on the stored test set are the run's."""

    def __init__(self, model: nn.Module, normalize: Normalize | None) -> None:
        super().__init__()
        self.model = model
        self.normalize = (
            tuple(torch.tensor(v, dtype=torch.float32) for v in normalize)
            if normalize is not None
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(to_model_input(x, self.normalize))
