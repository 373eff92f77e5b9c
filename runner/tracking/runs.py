"""Where runs live in a store: an experiment by name, a run by id, a sweep's children, and
MLflow's context tags for a run created through the client."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

import mlflow
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from runner.errors import UserError
from runner.tracking.stores import already_exists, quick_http, store_error


def experiment_id(client: MlflowClient, uri: str, name: str) -> str:
    """The id of experiment ``name``, created if missing; a deleted one is an error. When another
    job creates it at the same moment (a fresh store, sweeps started together), the store's
    "exists already" is no error: the experiment is read again and that one used."""
    with quick_http():
        try:
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                location = None
                if uri.startswith("sqlite:///"):
                    # Keep artifacts beside the database rather than relative to whichever cwd
                    # runs first.
                    folder = Path(uri.removeprefix("sqlite:///")).parent
                    location = (folder / "mlartifacts").resolve().as_uri()
                try:
                    return client.create_experiment(name, artifact_location=location)
                except mlflow.exceptions.MlflowException as error:
                    experiment = (
                        client.get_experiment_by_name(name) if already_exists(error) else None
                    )
                    if experiment is None:
                        raise
            if experiment.lifecycle_stage == "deleted":
                raise UserError(
                    f"tracking.experiment={name!r} was deleted in MLflow (id {experiment.experiment_id})\n"
                    f"restore it (mlflow experiments restore --experiment-id {experiment.experiment_id}) or choose another name"
                )
            return experiment.experiment_id
        except mlflow.exceptions.MlflowException as error:
            raise store_error(
                uri,
                f"cannot create or open experiment {name!r} ({str(error).splitlines()[0][:200]})",
                "check that the store is writable, or choose another tracking.experiment",
            ) from error


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


def context_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """``tags`` with MLflow's context tags resolved as ``mlflow.start_run`` resolves them (the
    source, its type and git commit, the user): ``client.create_run`` alone sets none of them."""
    from mlflow.tracking.context.registry import resolve_tags

    resolved_tags = resolve_tags(dict(tags))
    if "mlflow.source.git.commit" not in resolved_tags:  # e.g. run from outside the checkout
        commit = git_commit()
        if commit != "unknown":
            resolved_tags["mlflow.source.git.commit"] = commit
    return resolved_tags


def find_run(client: MlflowClient, uri: str, run_id: str) -> Run:
    """The run ``run_id`` in the store, or a user error naming ``resume``."""
    try:
        return client.get_run(run_id)
    except mlflow.exceptions.MlflowException as error:
        raise UserError(
            f"resume={run_id!r}: no such run in {uri}\n"
            "pass the run id MLflow shows (and the same tracking.uri as the run)"
        ) from error


def child_runs(client: MlflowClient, experiment_id: str, parent_id: str) -> list[Run]:
    """The (non-deleted) nested runs of a sweep's parent, any status, newest first."""
    return client.search_runs(
        [experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent_id}'",
        order_by=["attributes.start_time DESC"],
        max_results=50_000,
    )
