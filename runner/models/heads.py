"""The shape every model the runner trains has: ``features`` (input -> (N, D) pooled feature
vectors), then ``classifier`` ((N, D) -> logits), and the classifiers it ends in: a linear layer,
or the normalised (cosine) classifier LDAM is published with."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

HEADS = ("linear", "cosine")


class FeatureClassifier(nn.Module):
    """``model(x) == model.classifier(model.features(x))``; ``features`` gives (N, ``feature_dim``)
    vectors. The contract the runner relies on (cRT retrains ``classifier`` alone, fine-tuning
    gives ``features`` its own learning rate) and that every model it builds honours.

    ``unit_input``: the model standardises images itself (as its pretrained weights expect), so
    the runner scales the data's uint8 images to [0, 1] instead of standardising them with the
    data's channel statistics."""

    unit_input = False

    def __init__(self, features: nn.Module, classifier: nn.Module, feature_dim: int) -> None:
        super().__init__()
        self.features = features
        self.classifier = classifier
        self.feature_dim = feature_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class CosineClassifier(nn.Module):
    """Logits ``cos(x, w_j)`` in [-1, 1]: features and class weights normalised to unit length
    (the ``NormedLinear`` head of Cao et al. 2019, whose LDAM loss scales these logits by 30)."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, num_classes))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # The reference initialisation: uniform, then every class column rescaled to norm 1.
        with torch.no_grad():
            self.weight.uniform_(-1, 1).renorm_(2, 1, 1e-5).mul_(1e5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=1) @ F.normalize(self.weight, dim=0)


def classifier_head(in_features: int, num_classes: int, head: str) -> nn.Module:
    """A fresh classifier of ``in_features``-long vectors: ``head`` is linear or cosine."""
    if head not in HEADS:
        raise ValueError(f"model.head must be one of {', '.join(HEADS)}, got {head!r}")
    if head == "cosine":
        return CosineClassifier(in_features, num_classes)
    return nn.Linear(in_features, num_classes)


class ScaledClassifier(nn.Module):
    """A classifier whose logits are scaled per class: ``classifier(x) * scales``, with
    ``scales`` (one per class, initially 1) the module's only parameter outside ``classifier``.
    Any head: a linear layer's weight and bias, or a cosine head's cosines, scaled alike."""

    def __init__(self, classifier: nn.Module, num_classes: int) -> None:
        super().__init__()
        self.classifier = classifier
        device = next(classifier.parameters()).device
        self.scales = nn.Parameter(torch.ones(num_classes, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(x) * self.scales
