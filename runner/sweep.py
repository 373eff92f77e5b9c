"""The Hydra callback behind ``-m``: one parent MLflow run per multirun, every job its child.

The callback only holds the parent's id; :mod:`runner.tracking` does the MLflow work, imported
when a sweep starts. Hydra instantiates callbacks for single runs too, and a single run's config
error should answer without waiting for MLflow's import (~2 s).
"""

from __future__ import annotations

import os
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

PARENT_RUN_ENV = "SAMPLERLAB_PARENT_RUN_ID"  # a job's parent run, for runner.tracking


class SweepCallback(Callback):
    """Opens one parent MLflow run per Hydra multirun; each job joins it as a nested child run.

    Works with the basic launcher and with hydra-joblib-launcher: the callback is pickled to the
    workers with the parent's id, and ``on_job_start`` exports it to the job. With
    ``resume=<parent run id>`` the sweep continues that parent instead of opening a new one. The
    parent ends FINISHED when every job did, with the sweep's report logged onto it; a failed or
    stopped sweep ends it FAILED or KILLED (:func:`runner.tracking.end_open_sweeps`), never
    RUNNING.
    """

    def __init__(self) -> None:
        self.parent_run_id: str | None = None
        self.uri: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from runner.tracking import open_sweep

        self.uri, self.parent_run_id = open_sweep(config)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if self.parent_run_id:
            os.environ[PARENT_RUN_ENV] = self.parent_run_id

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        os.environ.pop(PARENT_RUN_ENV, None)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.parent_run_id and self.uri:
            from runner.tracking import close_sweep

            close_sweep(self.uri, self.parent_run_id)
