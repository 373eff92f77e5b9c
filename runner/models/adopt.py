"""Any ``nn.Module`` as a :class:`FeatureClassifier`: one that already exposes ``features``,
``classifier`` and ``feature_dim`` as it is (``feature_dim`` says it means the contract:
torchvision's MobileNet has a ``features`` trunk before its pooling); any other split at its final linear layer (the last
``nn.Linear`` it registers with ``num_classes`` outputs), which becomes ``classifier`` while the
module, with an identity in that layer's place, becomes ``features``."""

from __future__ import annotations

import torch
from torch import nn

from runner.models.heads import FeatureClassifier, classifier_head


def final_linear(module: nn.Module, out_features: int | None = None) -> str | None:
    """The dotted name of the last ``nn.Linear`` ``module`` registers (with ``out_features``
    outputs, when given), or None."""
    names = [
        name
        for name, layer in module.named_modules()
        if isinstance(layer, nn.Linear)
        and (out_features is None or layer.out_features == out_features)
    ]
    return names[-1] if names else None


def replace_layer(module: nn.Module, name: str, layer: nn.Module) -> nn.Module:
    """Put ``layer`` at dotted ``name`` inside ``module``; returns the layer it replaced."""
    parent_name, _, child = name.rpartition(".")
    parent = module.get_submodule(parent_name) if parent_name else module
    old = parent.get_submodule(child)
    setattr(parent, child, layer)
    return old


def as_feature_classifier(
    model: nn.Module, num_classes: int, head: str | None, target: str
) -> FeatureClassifier:
    """``model`` split into features and classifier; with ``head`` (linear or cosine; None when
    ``model`` built its own from ``model.head``), a cosine head replaces the classifier it has.
    A module that neither exposes the split nor ends in such a layer is a user error naming
    ``target``."""
    if isinstance(model, FeatureClassifier):
        adopted = model
    elif isinstance(getattr(model, "feature_dim", None), int) and all(
        isinstance(getattr(model, a, None), nn.Module) for a in ("features", "classifier")
    ):
        adopted = FeatureClassifier(model.features, model.classifier, model.feature_dim)  # type: ignore[arg-type]
    else:
        name = final_linear(model, num_classes)
        if name is None:
            raise ValueError(
                f"{target} has no final nn.Linear with num_classes={num_classes} outputs to use "
                "as its classifier; end it in one, or give it `features`, `classifier` and "
                "`feature_dim` attributes (docs/your-model.md)"
            )
        classifier = replace_layer(model, name, nn.Identity())
        assert isinstance(classifier, nn.Linear)
        adopted = FeatureClassifier(model, classifier, classifier.in_features)
    if head is not None and head != "linear":
        adopted.classifier = classifier_head(adopted.feature_dim, num_classes, head)
    return adopted


@torch.no_grad()
def output_width(module: nn.Module, in_shape: tuple[int, ...]) -> int:
    """The length of the vector ``module`` makes of one ``in_shape`` input (a dummy forward in
    eval mode, so that BatchNorm statistics are not touched)."""
    was_training = module.training
    module.eval()
    try:
        out = module(torch.zeros(1, *in_shape))
    finally:
        module.train(was_training)
    if out.dim() != 2:
        raise ValueError(f"features give shape {tuple(out.shape)} per batch, not (N, D)")
    return int(out.shape[1])
