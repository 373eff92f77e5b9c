"""Where MLflow models logged before the training core moved (runner/train/) find the class
an LWS classifier was pickled as, ``runner.decoupled.ScaledClassifier``."""

from runner.models.heads import ScaledClassifier as ScaledClassifier
