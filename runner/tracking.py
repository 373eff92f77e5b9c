"""MLflow tracking: the only module that imports mlflow.

A run records the flattened resolved config as params, tags that make runs easy to filter, one
``log_batch`` per epoch (per-value ``log_metric`` costs 5-12 ms on sqlite), and artifacts. In a
Hydra multirun, :class:`runner.sweep.SweepCallback` opens one parent run (:func:`open_sweep`) and
every job becomes its child.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param, Run, RunStatus, RunTag
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from runner.config import check_objective
from runner.errors import UserError, exit_with
from runner.signals import Interrupted, held
from runner.sweep import PARENT_RUN_ENV

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


def _store_error(uri: str, problem: str, fix: str) -> UserError:
    return UserError(f"tracking.uri={uri!r}: {problem}\n{fix}")


@contextmanager
def _quick_http() -> Iterator[None]:
    """MLflow retries an unreachable server for minutes; a check should take seconds."""
    saved = {k: os.environ.get(k) for k in _QUICK_HTTP}
    os.environ.update(_QUICK_HTTP)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


_QUICK_HTTP = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
}


def prepare_store(uri: str) -> None:
    """Check, within seconds, that the store at ``uri`` is reachable and writable, and create
    or migrate it once. A new sqlite store is migrated under an exclusive lock on its folder,
    so processes that start together on it do not race MLflow's schema migrations."""
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        folder = path.parent
        if not folder.is_dir():
            raise _store_error(
                uri,
                f"the folder {folder} does not exist",
                "create it, or drop the override to use the project store",
            )
        try:  # os.access says yes to root even where nothing can be written (/proc)
            tempfile.TemporaryFile(dir=folder).close()
            if path.exists():
                open(path, "ab").close()
        except OSError as error:
            raise _store_error(
                uri,
                f"cannot write to {path} ({error.strerror})",
                "choose a writable path, or drop the override to use the project store",
            ) from error
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            _read_store(
                uri, "not a usable MLflow store", "point tracking.uri at an MLflow sqlite file"
            )
        finally:
            os.close(descriptor)  # releases the lock
        return
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=5) as answer:
                answer.read()
        except (OSError, ValueError) as error:
            raise _store_error(
                uri,
                f"no MLflow server answers there ({getattr(error, 'reason', error)})",
                "start one (make server, or mlflow server --host 127.0.0.1 --port PORT), or drop the override to use the local store",
            ) from error
        return
    _read_store(uri, "the store cannot be read", "check the URI")


def _read_store(uri: str, problem: str, fix: str) -> None:
    """One read, which also creates or migrates a database store."""
    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as error:
        why = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        raise _store_error(
            uri, f"{problem} ({why})", f"{fix}, or drop the override to use the project store"
        ) from error


def _experiment_id(client: MlflowClient, uri: str, name: str) -> str:
    """The id of experiment ``name``, created if missing; a deleted one is an error."""
    with _quick_http():
        try:
            experiment = client.get_experiment_by_name(name)
            if experiment is not None and experiment.lifecycle_stage == "deleted":
                raise UserError(
                    f"tracking.experiment={name!r} was deleted in MLflow (id {experiment.experiment_id})\n"
                    f"restore it (mlflow experiments restore --experiment-id {experiment.experiment_id}) or choose another name"
                )
            if experiment is not None:
                return experiment.experiment_id
            location = None
            if uri.startswith("sqlite:///"):
                # Keep artifacts beside the database rather than relative to whichever cwd runs first.
                location = (
                    (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").resolve().as_uri()
                )
            try:
                return client.create_experiment(name, artifact_location=location)
            except mlflow.exceptions.MlflowException:  # created concurrently by a parallel job
                found = client.get_experiment_by_name(name)
                if found is None:
                    raise
                return found.experiment_id
        except mlflow.exceptions.MlflowException as error:
            raise _store_error(
                uri,
                f"cannot create or open experiment {name!r} ({str(error).splitlines()[0][:200]})",
                "check that the store is writable, or choose another tracking.experiment",
            ) from error


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
    """One MLflow run: params, tags, per-epoch metric batches, artifacts, final status.

    ``Tracker.start`` creates the run (nested under the sweep's parent inside a multirun);
    ``Tracker.reopen`` continues an existing one, which is RUNNING again until it ends.
    """

    def __init__(self, client: MlflowClient, uri: str, run: Run) -> None:
        self.client, self.uri = client, uri
        self.run_id, self.run_name = run.info.run_id, run.info.run_name
        self.experiment_id = run.info.experiment_id

    @classmethod
    def start(
        cls,
        uri: str | None,
        experiment: str,
        run_name: str,
        params: Mapping[str, str],
        tags: Mapping[str, str],
        parent_run_id: str | None = None,
    ) -> Tracker:
        uri = resolve_uri(uri)
        client = MlflowClient(tracking_uri=uri)
        experiment_id = _experiment_id(client, uri, experiment)
        tags = dict(tags)
        parent_run_id = parent_run_id or os.environ.get(PARENT_RUN_ENV)
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        tracker = cls(client, uri, client.create_run(experiment_id, run_name=run_name, tags=tags))
        try:
            for chunk in _chunks([Param(k, v[:6000]) for k, v in params.items()], _BATCH):
                client.log_batch(tracker.run_id, params=chunk)
        except BaseException:
            tracker.finish("FAILED")
            raise
        return tracker

    @classmethod
    def reopen(cls, uri: str | None, run_id: str) -> Tracker:
        uri = resolve_uri(uri)
        client = MlflowClient(tracking_uri=uri)
        run = find_run(client, uri, run_id)
        client.update_run(run_id, status="RUNNING")
        return cls(client, uri, run)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        rows = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        for chunk in _chunks(rows, 1000):
            self.client.log_batch(self.run_id, metrics=chunk)

    def last_step(self, key: str) -> int | None:
        """The highest step logged for metric ``key`` (None when it has none)."""
        history = self.client.get_metric_history(self.run_id, key)
        return max((m.step for m in history), default=None)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def log_artifacts(self, files: Mapping[str, Any]) -> None:
        """Write ``{relative path: str | bytes | Path | matplotlib figure}`` and upload them in one go."""
        with tempfile.TemporaryDirectory() as tmp:
            for name, content in files.items():
                path = Path(tmp) / name
                path.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, str):
                    path.write_text(content)
                elif isinstance(content, bytes):
                    path.write_bytes(content)
                elif isinstance(content, Path):
                    shutil.copyfile(content, path)
                else:
                    content.savefig(path, dpi=110, bbox_inches="tight")
            self.client.log_artifacts(self.run_id, tmp)

    def finish(self, status: str = "FINISHED") -> None:
        """End the run as FINISHED, FAILED or KILLED. A signal meanwhile waits until the status
        is written (then raises :class:`Interrupted`): a run must not stay RUNNING because
        torchrun stopped this rank after another one failed."""
        RunStatus.from_string(status)  # rejects anything else
        with held():
            self.client.set_terminated(self.run_id, status=status)

    def where(self) -> str:
        project_store = f"sqlite:///{PROJECT_ROOT / 'mlflow.db'}"
        if self.uri.startswith(("http://", "https://")):
            ui = f"{self.uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}"
        elif self.uri == project_store:
            ui = "make ui"
        else:
            ui = f"mlflow ui --backend-store-uri {self.uri}"
        return f"run {self.run_id} in experiment {self.experiment_id} at {self.uri} (browse: {ui})"


class Bystander(Tracker):
    """What a rank other than 0 holds in place of its :class:`Tracker` under torchrun: the run's
    id and name, as rank 0 created or reopened it, and no MLflow at all (rank 0 alone writes)."""

    def __init__(self, run_id: str, run_name: str) -> None:
        self.run_id, self.run_name = run_id, run_name

    @classmethod
    def of(cls, tracker: Tracker) -> Bystander:
        return cls(tracker.run_id, tracker.run_name)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def last_step(self, key: str) -> int | None:
        return None

    def set_tags(self, tags: Mapping[str, str]) -> None:
        pass

    def log_artifacts(self, files: Mapping[str, Any]) -> None:
        pass

    def finish(self, status: str = "FINISHED") -> None:
        pass

    def where(self) -> str:
        return f"run {self.run_id}, recorded by rank 0"


def find_run(client: MlflowClient, uri: str, run_id: str) -> Run:
    """The run ``run_id`` in the store, or a user error naming ``resume``."""
    try:
        return client.get_run(run_id)
    except mlflow.exceptions.MlflowException as error:
        raise UserError(
            f"resume={run_id!r}: no such run in {uri}\n"
            "pass the run id MLflow shows (and the same tracking.uri as the run)"
        ) from error


@dataclass
class PreviousRun:
    """A run to continue (or, FINISHED, to skip), as found by :func:`previous_run`."""

    client: MlflowClient
    run_id: str
    status: str
    via_parent: bool  # found as a sweep parent's child with the same config
    tags: dict[str, str]
    metrics: dict[str, float]

    @property
    def config(self) -> str:
        """The resolved config the run was started with (its ``config.yaml``)."""
        with tempfile.TemporaryDirectory() as tmp:
            try:
                path = self.client.download_artifacts(self.run_id, "config.yaml", tmp)
            except Exception as error:
                raise UserError(
                    f"resume={self.run_id!r}: the run has no config.yaml artifact\n"
                    "only runs started by this version of samplerlab can be resumed"
                ) from error
            return Path(path).read_text()

    @contextmanager
    def checkpoint_file(self) -> Iterator[Path | None]:
        """Its last checkpoint while the block runs: the local file its tag names, else its
        artifact (downloaded to a temporary folder removed afterwards), else None."""
        local = Path(self.tags.get("checkpoint", ""))
        if self.tags.get("checkpoint") and local.is_file():
            yield local
            return
        with tempfile.TemporaryDirectory(prefix="samplerlab-resume-") as folder:
            try:
                path = self.client.download_artifacts(
                    self.run_id, "checkpoint/checkpoint.pt", folder
                )
            except Exception:
                path = None
            yield Path(path) if path is not None else None


def previous_run(uri: str, resume: str, config_key: str) -> PreviousRun | None:
    """The run ``resume`` names; for a sweep's parent, its child with ``config_key`` (a finished
    one first, else the newest; None when the sweep never ran that job)."""
    client = MlflowClient(tracking_uri=uri)
    run = find_run(client, uri, resume)
    via_parent = run.data.tags.get("sweep") == "parent"
    if via_parent:
        same = [
            c
            for c in child_runs(client, run.info.experiment_id, run.info.run_id)
            if c.data.tags.get("config_key") == config_key
        ]
        if not same:
            return None
        run = next((c for c in same if c.info.status == "FINISHED"), same[0])
    return PreviousRun(
        client,
        run.info.run_id,
        run.info.status,
        via_parent,
        dict(run.data.tags),
        dict(run.data.metrics),
    )


def child_runs(client: MlflowClient, experiment_id: str, parent_id: str) -> list[Run]:
    """The (non-deleted) nested runs of a sweep's parent, any status, newest first."""
    return client.search_runs(
        [experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent_id}'",
        order_by=["attributes.start_time DESC"],
        max_results=50_000,
    )


_open_sweeps: dict[str, str] = {}  # parent run id -> store, for the sweeps this process opened


def end_open_sweeps(error: BaseException) -> None:
    """End the parent runs this process opened and did not finish: KILLED when stopped by a
    signal or Ctrl-C, FAILED otherwise. Called when a sweep ends with an exception."""
    stopped = isinstance(error, (Interrupted, KeyboardInterrupt))
    for run_id, uri in list(_open_sweeps.items()):
        try:
            MlflowClient(tracking_uri=uri).set_terminated(
                run_id, status="KILLED" if stopped else "FAILED"
            )
        except Exception as failure:  # the store itself may be what failed
            print(f"samplerlab: could not end sweep run {run_id}: {failure}", file=sys.stderr)
        _open_sweeps.pop(run_id, None)
        if stopped:
            print(
                f"samplerlab: sweep stopped; continue it with the same command plus resume={run_id}",
                file=sys.stderr,
            )


def open_sweep(config: DictConfig) -> tuple[str, str]:
    """The store and parent run of a starting multirun (:class:`runner.sweep.SweepCallback`): a
    new parent, or with ``resume=`` the one named. A store that cannot take the sweep stops it
    here, before any job (Hydra would turn the callback's exception into a warning)."""
    from runner.distributed import launched

    try:
        if launched():  # every rank would open its own parent and run every job alone
            raise UserError(
                "-m under torchrun: torchrun trains one run at a time\n"
                "drop -m and launch one torchrun per configuration"
            )
        check_objective(config, str(config.hydra.sweeper._target_))
        uri = resolve_uri(config.tracking.uri)
        prepare_store(uri)
        parent_run_id = _parent_run(MlflowClient(tracking_uri=uri), uri, config)
    except UserError as error:
        exit_with(error)
    _open_sweeps[parent_run_id] = uri
    print(f"samplerlab: sweep parent run {parent_run_id} ({uri})", flush=True)
    return uri, parent_run_id


def _parent_run(client: MlflowClient, uri: str, config: DictConfig) -> str:
    if config.get("resume"):
        parent = find_run(client, uri, config.resume)
        if parent.data.tags.get("sweep") != "parent":
            raise UserError(
                f"resume={config.resume!r} is not a sweep's parent run\n"
                "with -m, pass the parent run id the sweep printed; without -m, any run id"
            )
        client.update_run(parent.info.run_id, status="RUNNING")
        return parent.info.run_id
    experiment_id = _experiment_id(client, uri, config.tracking.experiment)
    overrides = OmegaConf.to_container(config.hydra.overrides.task)
    run = client.create_run(
        experiment_id,
        run_name=f"sweep-{time.strftime('%Y%m%d-%H%M%S')}",
        tags={"sweep": "parent", "overrides": " ".join(overrides), "git_commit": git_commit()},
    )
    return run.info.run_id


def close_sweep(uri: str, parent_run_id: str) -> None:
    """A multirun ended: its parent run FINISHED (unless a job's failure already ended it), and
    the sweep's report logged onto it. A report that cannot be built never fails the sweep."""
    client = MlflowClient(tracking_uri=uri)
    if client.get_run(parent_run_id).info.status == "RUNNING":
        client.set_terminated(parent_run_id, status="FINISHED")
    _open_sweeps.pop(parent_run_id, None)
    from experiments.report import publish

    try:
        print(publish(uri, parent_run_id), flush=True)
    except Exception as error:
        print(
            f"samplerlab: the sweep's report failed ({type(error).__name__}: {error}); "
            f"rebuild it with: python -m experiments.report --parent {parent_run_id}",
            file=sys.stderr,
            flush=True,
        )


def log_to_run(
    uri: str | None, run_id: str, metrics: Mapping[str, float], files: Mapping[str, Any]
) -> None:
    """Add metrics (at step 0) and files (as for :meth:`Tracker.log_artifacts`) to an existing
    run, e.g. a sweep's report on its parent run; its status stays, nothing is created."""
    uri = resolve_uri(uri)
    client = MlflowClient(tracking_uri=uri)
    tracker = Tracker(client, uri, client.get_run(run_id))
    if metrics:
        tracker.log_metrics(metrics, step=0)
    if files:
        tracker.log_artifacts(files)
