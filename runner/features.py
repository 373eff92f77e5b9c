"""Where MLflow models logged before the training core moved (runner/train/) find the class a
frozen backbone was pickled as, ``runner.features.FrozenBackbone``."""

from runner.models.backbones import FrozenBackbone as FrozenBackbone
