"""MLflow tracking: the only module that imports mlflow.

A run records the flattened resolved config as params, tags that make runs easy to filter, one
``log_batch`` per epoch (per-value ``log_metric`` costs 5-12 ms on sqlite), and artifacts. In a
Hydra multirun, :class:`SweepCallback` opens one parent run and every job becomes its child.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import mlflow
from hydra.experimental.callback import Callback
from mlflow.entities import Metric, Param, RunStatus
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

PARENT_RUN_ENV = "SAMPLERLAB_PARENT_RUN_ID"
_BATCH = 100  # MLflow accepts at most 100 params and 1000 metrics per log_batch call


PROJECT_ROOT = Path(__file__).resolve().parents[1]


def resolve_uri(uri: str | None) -> str:
    """The store to use: ``uri`` when given, else MLflow's own ``MLFLOW_TRACKING_URI`` when set,
    else the project's sqlite store ``mlflow.db`` in the project folder (what ``make ui`` serves;
    the launch directory when samplerlab is installed outside its source tree)."""
    if uri:
        return uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    home = PROJECT_ROOT if (PROJECT_ROOT / "pyproject.toml").is_file() else Path.cwd()
    return f"sqlite:///{home / 'mlflow.db'}"


def _experiment_id(client: MlflowClient, uri: str, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        # Keep artifacts beside the database rather than relative to whichever cwd runs first.
        location = (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").resolve().as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except mlflow.exceptions.MlflowException:  # created concurrently by a parallel job
        return client.get_experiment_by_name(name).experiment_id


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mapping -> {"a.b.c": "value"}."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)
    return flat


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).parent,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _chunks(items: list, size: int) -> Iterable[list]:
    return (items[i : i + size] for i in range(0, len(items), size))


class Tracker:
    """One MLflow run: params, tags, per-epoch metric batches, artifacts, final status."""

    def __init__(
        self,
        uri: str | None,
        experiment: str,
        run_name: str,
        params: Mapping[str, str],
        tags: Mapping[str, str],
    ) -> None:
        self.uri = resolve_uri(uri)
        self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment_id = _experiment_id(self.client, self.uri, experiment)
        tags = dict(tags)
        parent = os.environ.get(PARENT_RUN_ENV)
        if parent:
            tags["mlflow.parentRunId"] = parent
        self.run_id = self.client.create_run(
            self.experiment_id, run_name=run_name, tags=tags
        ).info.run_id
        for chunk in _chunks([Param(k, v[:6000]) for k, v in params.items()], _BATCH):
            self.client.log_batch(self.run_id, params=chunk)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        rows = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        for chunk in _chunks(rows, 1000):
            self.client.log_batch(self.run_id, metrics=chunk)

    def log_artifacts(self, files: Mapping[str, Any]) -> None:
        """Write ``{relative path: str | bytes | matplotlib figure}`` and upload them in one go."""
        with tempfile.TemporaryDirectory() as tmp:
            for name, content in files.items():
                path = Path(tmp) / name
                path.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, str):
                    path.write_text(content)
                elif isinstance(content, bytes):
                    path.write_bytes(content)
                else:
                    content.savefig(path, dpi=110, bbox_inches="tight")
            self.client.log_artifacts(self.run_id, tmp)

    def finish(self, status: str = "FINISHED") -> None:
        """End the run as FINISHED, FAILED or KILLED."""
        RunStatus.from_string(status)  # rejects anything else
        self.client.set_terminated(self.run_id, status=status)

    def where(self) -> str:
        project_store = f"sqlite:///{PROJECT_ROOT / 'mlflow.db'}"
        ui = "make ui" if self.uri == project_store else f"mlflow ui --backend-store-uri {self.uri}"
        return f"run {self.run_id} in experiment {self.experiment_id} at {self.uri} (browse: {ui})"


class SweepCallback(Callback):
    """Opens one parent MLflow run per Hydra multirun; each job joins it as a nested child run.

    Works with the basic launcher and with hydra-joblib-launcher: the callback is pickled to the
    workers with the parent's id, and ``on_job_start`` exports it to the job. A failed job marks
    the parent FAILED; otherwise the parent is FINISHED when the sweep ends.
    """

    def __init__(self) -> None:
        self.parent_run_id: str | None = None
        self.uri: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.uri = resolve_uri(config.tracking.uri)
        client = MlflowClient(tracking_uri=self.uri)
        experiment_id = _experiment_id(client, self.uri, config.tracking.experiment)
        overrides = OmegaConf.to_container(config.hydra.overrides.task)
        run = client.create_run(
            experiment_id,
            run_name=f"sweep-{time.strftime('%Y%m%d-%H%M%S')}",
            tags={"sweep": "parent", "overrides": " ".join(overrides), "git_commit": git_commit()},
        )
        self.parent_run_id = run.info.run_id

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if self.parent_run_id:
            os.environ[PARENT_RUN_ENV] = self.parent_run_id

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.utils import JobStatus

        os.environ.pop(PARENT_RUN_ENV, None)
        if self.parent_run_id and job_return.status == JobStatus.FAILED:
            MlflowClient(tracking_uri=self.uri).set_terminated(self.parent_run_id, status="FAILED")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.parent_run_id:
            return
        client = MlflowClient(tracking_uri=self.uri)
        if client.get_run(self.parent_run_id).info.status == "RUNNING":
            client.set_terminated(self.parent_run_id, status="FINISHED")


def load_runs(
    uri: str | None, experiment: str, parent_run_id: str | None = None
) -> list[dict[str, Any]]:
    """Finished child runs of an experiment (or of one sweep) as plain dicts, for reports."""
    client = MlflowClient(tracking_uri=resolve_uri(uri))
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ValueError(
            f"no MLflow experiment named {experiment!r} at {resolve_uri(uri)}; run `make run` first"
        )
    query = "attributes.status = 'FINISHED'"
    if parent_run_id:
        query += f" and tags.mlflow.parentRunId = '{parent_run_id}'"
    runs = client.search_runs([found.experiment_id], filter_string=query, max_results=50_000)
    return [
        {
            "run_id": r.info.run_id,
            "name": r.info.run_name,
            "tags": dict(r.data.tags),
            "params": dict(r.data.params),
            "metrics": dict(r.data.metrics),
        }
        for r in runs
        if "sampler" in r.data.tags  # skip sweep parents
    ]


def latest_sweep(uri: str | None, experiment: str) -> str | None:
    """Run id of the newest sweep parent in ``experiment`` (None when there is none)."""
    client = MlflowClient(tracking_uri=resolve_uri(uri))
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs(
        [found.experiment_id],
        filter_string="tags.sweep = 'parent'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0].info.run_id if runs else None
