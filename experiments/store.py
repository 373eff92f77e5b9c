"""Reading runs back from an MLflow store, for reports. Reads only: never creates a store or an
experiment (a mistyped path is an error, not a new empty database)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from runner.errors import UserError
from runner.tracking import stores
from runner.tracking.runs import child_runs as nested_runs


class StoreError(Exception):
    """No store at the URI, no such experiment or run: a one-line message for the user."""


@dataclass
class Run:
    run_id: str
    experiment_id: str
    name: str
    status: str
    start_time: int
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def seed(self) -> int | None:
        value = self.params.get("seed")
        if value is None:
            for override in self.tags.get("overrides", "").split():
                if override.startswith("seed="):
                    value = override.removeprefix("seed=")
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None


def _local_path(uri: str) -> Path | None:
    """The file or folder a local store lives in (None for a server)."""
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///"))
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if parsed.scheme == "" or len(parsed.scheme) == 1:  # a plain path (or a Windows drive)
        return Path(uri)
    return None


def open_store(uri: str | None) -> tuple[MlflowClient, str]:
    """A client for an existing MLflow store; StoreError when there is none at ``uri`` (nothing,
    an empty file, another application's database, a server or database that does not answer).
    Nothing is created or migrated: the checks read sqlite files read-only (`sqlite_tables`)."""
    resolved = stores.resolve_uri(uri)
    path = _local_path(resolved)
    if path is not None and not path.exists():
        raise StoreError(f"no store at {resolved} (nothing at {path}); check --uri / tracking.uri")
    try:
        if resolved.startswith("sqlite:///"):
            stores.check_sqlite_store(resolved, "--uri", create=False)
        elif resolved.split(":", 1)[0].split("+", 1)[0] in stores.DATABASES:
            stores.check_database(resolved)
        client = MlflowClient(tracking_uri=resolved)
        with stores.quick_http():
            client.search_experiments(max_results=1)
    except UserError as error:
        raise StoreError(str(error).replace("\n", "; ")) from None
    except Exception as error:  # MLflow's own: a server that does not answer, an old schema
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        raise StoreError(
            f"cannot read the store at {resolved} ({type(error).__name__}: {first}); check --uri"
        ) from None
    return client, resolved


def _run(r: Any, client: MlflowClient | None = None) -> Run:
    """A run as the report reads it; one that recorded its per-class values as a table (many
    classes) gets them as the metric keys a run with few classes has (``final/recall/<class>``),
    from its ``per_class/final.json``."""
    metrics = dict(r.data.metrics)
    if client is not None and r.data.tags.get("per_class") == "table":
        metrics.update(_class_table_metrics(client, r.info.run_id))
    return Run(
        run_id=r.info.run_id,
        experiment_id=r.info.experiment_id,
        name=r.info.run_name or r.info.run_id,
        status=r.info.status,
        start_time=r.info.start_time or 0,
        tags=dict(r.data.tags),
        params=dict(r.data.params),
        metrics=metrics,
    )


def _class_table_metrics(client: MlflowClient, run_id: str) -> dict[str, float]:
    import json
    import tempfile

    from runner.train.recorder import read_class_table

    with tempfile.TemporaryDirectory() as folder:
        try:
            path = client.download_artifacts(run_id, "per_class/final.json", folder)
        except MlflowException:  # the run did not get to its end
            return {}
        table = read_class_table(json.loads(Path(path).read_text()))
    return {f"{column}/{name}": v for column, values in table.items() for name, v in values.items()}


def experiment_id(client: MlflowClient, uri: str, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is None:
        known = sorted(e.name for e in client.search_experiments())
        raise StoreError(f"no experiment {name!r} at {uri} (experiments there: {known})")
    return found.experiment_id


def get_run(client: MlflowClient, uri: str, run_id: str) -> Run:
    try:
        return _run(client.get_run(run_id), client)
    except MlflowException:
        raise StoreError(f"no run {run_id!r} at {uri}") from None


def child_runs(client: MlflowClient, parent: Run) -> list[Run]:
    """Every (non-deleted) child run of a sweep's parent run, any status, newest first."""
    return [_run(r, client) for r in nested_runs(client, parent.experiment_id, parent.run_id)]


def experiment_runs(client: MlflowClient, experiment_id_: str) -> list[Run]:
    """Every (non-deleted) training run of an experiment, any status (sweep parents left out)."""
    runs = client.search_runs([experiment_id_], max_results=50_000)
    return [_run(r, client) for r in runs if r.data.tags.get("sweep") != "parent"]


def latest_sweep(client: MlflowClient, experiment_id_: str) -> Run | None:
    """The newest sweep parent run of an experiment (None when there is none)."""
    runs = client.search_runs(
        [experiment_id_],
        filter_string="tags.sweep = 'parent'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return _run(runs[0]) if runs else None
