"""Models the runner trains: its own small ones, timm and torchvision backbones and the user's
own ``nn.Module``; every one a :class:`FeatureClassifier` (``features``, then ``classifier``)."""

from runner.models.backbones import timm_backbone, torchvision_backbone
from runner.models.heads import HEADS, CosineClassifier, FeatureClassifier, classifier_head
from runner.models.predictor import Predictor
from runner.models.small import MLP, ResNet32, SmallCNN
from runner.models.small import _BasicBlock as _BasicBlock  # where earlier logged models found it

__all__ = [
    "HEADS",
    "MLP",
    "CosineClassifier",
    "FeatureClassifier",
    "Predictor",
    "ResNet32",
    "SmallCNN",
    "classifier_head",
    "timm_backbone",
    "torchvision_backbone",
]
