"""MLflow's PyTorch flavor (``mlflow.pytorch``), which logs and loads a run's model."""

from __future__ import annotations

import sys
from typing import Any


def mlflow_pytorch() -> Any:
    """``mlflow.pytorch``, imported without PyTorch Lightning: MLflow imports Lightning there for
    its autologging alone, which logging or loading a model never uses, and that import takes
    5-12 s (a short run's whole training time) wherever Lightning is installed."""
    if "mlflow.pytorch" in sys.modules or "pytorch_lightning" in sys.modules:
        import mlflow.pytorch

        return mlflow.pytorch
    sys.modules["pytorch_lightning"] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        import mlflow.pytorch
    finally:
        del sys.modules["pytorch_lightning"]
    return mlflow.pytorch
