"""The MLflow side of a run, in one package:

* :mod:`~runner.tracking.tracker`: the :class:`Tracker` a run writes to (and the
  :class:`Bystander` of the other ranks), starting a run with its params, tags and datasets;
* :mod:`~runner.tracking.environment`: how a run ran (tags) and MLflow's system metrics;
* :mod:`~runner.tracking.datasets`: the data a run saw, as MLflow datasets with digests;
* :mod:`~runner.tracking.flavor`: MLflow's PyTorch flavor, which logs and loads the model;
* :mod:`~runner.tracking.runs`: where runs live (an experiment by name, a run by id, a sweep's
  children, context tags);
* :mod:`~runner.tracking.stores`: the store a run writes to (resolving and checking its URI,
  bounded waits, what a lost store raises);
* :mod:`~runner.tracking.server`: the shared ``mlflow server`` on PostgreSQL (``python -m
  runner.tracking.server``).

What callers import from ``runner.tracking`` itself is re-exported here, loaded on first use:
``runner.tracking.stores`` stays importable without MLflow (a run's config error imports none).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.tracking.stores import StoreLost as StoreLost
    from runner.tracking.tracker import Bystander as Bystander
    from runner.tracking.tracker import Tracker as Tracker
    from runner.tracking.tracker import log_to_run as log_to_run
    from runner.tracking.tracker import start_run as start_run

_EXPORTS = {
    "Bystander": "runner.tracking.tracker",
    "Tracker": "runner.tracking.tracker",
    "log_to_run": "runner.tracking.tracker",
    "start_run": "runner.tracking.tracker",
    "StoreLost": "runner.tracking.stores",
}
__all__ = ["Bystander", "StoreLost", "Tracker", "log_to_run", "start_run"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'runner.tracking' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
