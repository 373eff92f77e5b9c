"""The private MLflow and Hydra names the runner relies on, as it calls them: pyproject.toml bounds
mlflow (<4) and hydra-core (<1.4), and these fail on the first release inside the bounds that
moves or changes one, before a run meets it."""

from __future__ import annotations

import inspect

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import get_class

from runner.config import BASIC_SWEEPER, CONF
from runner.sweeps.callback import BASIC_LAUNCHER

pytestmark = pytest.mark.unit


def test_hydra_names_its_basic_sweeper_and_launcher_as_the_runner_compares_them():
    """runner.checks and runner.sweeps compare ``hydra.sweeper._target_`` (and the launcher's)
    with these paths: a default multirun must carry exactly them."""
    assert get_class(BASIC_SWEEPER).__name__ == "BasicSweeper"
    assert get_class(BASIC_LAUNCHER).__name__ == "BasicLauncher"
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", return_hydra_config=True)
    assert cfg.hydra.sweeper._target_ == BASIC_SWEEPER
    assert cfg.hydra.launcher._target_ == BASIC_LAUNCHER


def test_mlflows_private_names_take_what_the_runner_passes():
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import Dataset
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    from mlflow.tracking.context.registry import resolve_tags

    # runner.tracking.environment.system_metrics
    monitor = inspect.signature(SystemMetricsMonitor)
    assert {"run_id", "resume_logging", "tracking_uri"} <= set(monitor.parameters)
    assert callable(SystemMetricsMonitor.start) and callable(SystemMetricsMonitor.finish)
    # runner.tracking.runs.context_tags: the tags mlflow.start_run would add
    tags = resolve_tags({"mine": "1"})
    assert tags["mine"] == "1" and "mlflow.source.type" in tags
    # runner.tracking.datasets.dataset_inputs: a metadata-only dataset as an MLflow entity
    from mlflow.data.code_dataset_source import CodeDatasetSource

    dataset = MetaDataset(CodeDatasetSource(tags={}), name="n", digest="0123")  # type: ignore[abstract]
    entity = dataset._to_mlflow_entity()
    assert isinstance(entity, Dataset) and (entity.name, entity.digest) == ("n", "0123")
