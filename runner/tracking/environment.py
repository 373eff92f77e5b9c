"""How a run ran, as its MLflow record keeps it: the machine, the process group and the
libraries as tags (:func:`environment`), and MLflow's own system metrics while it trains
(:func:`system_metrics`)."""

from __future__ import annotations

import platform
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from runner.train.settings import TrackingConfig


def environment(device: torch.device, world_size: int, backend: str | None) -> dict[str, str]:
    """Tags that say how the run trained: the processes and their backend, the device (and the
    GPU's name), the precision, the library versions, the threads, the host."""
    import torchvision

    cuda = device.type == "cuda"
    return {
        "world_size": str(world_size),
        "backend": backend or "none",
        "device": device.type,
        "gpu": torch.cuda.get_device_name(device) if cuda else "none",
        "precision": "bfloat16 autocast" if cuda else "float32",
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda or "none",
        "threads": str(torch.get_num_threads()),
        "host": socket.gethostname(),
        "python": platform.python_version(),
    }


@contextmanager
def system_metrics(tracking: TrackingConfig, recorder: Any, resumed: bool) -> Iterator[None]:
    """MLflow's own system metrics (CPU, memory, GPU; ``system/*``) while the block runs, with
    ``tracking.system_metrics``, on the process that records; otherwise nothing."""
    run_id, uri = getattr(recorder, "run_id", None), getattr(recorder, "uri", None)
    if not tracking.system_metrics or uri is None:
        yield
        return
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(run_id, resume_logging=resumed, tracking_uri=uri)
    monitor.start()
    try:
        yield
    finally:
        monitor.finish()
