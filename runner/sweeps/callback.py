"""A sweep's lifecycle: one parent MLflow run per Hydra multirun, every job its nested child.

:class:`SweepCallback` (``hydra.callbacks.mlflow_sweep``) opens the parent when the multirun
starts, hands its id to every job (:func:`job_parent`, read by the app), and ends it when the
multirun ends; :func:`end_open_sweeps` ends it KILLED or FAILED when the sweep stops with an
exception, and a stopped sweep leaves no child RUNNING (:func:`stop_jobs`). MLflow is imported
only when a sweep starts: Hydra instantiates callbacks for single runs too, and a single run's
config error should answer without waiting for MLflow's import (~2 s).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from runner.errors import UserError
from runner.explain import exit_with
from runner.signals import Interrupted, on_stop

BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
STOP_WAIT_SECONDS = 60  # how long a stopped sweep waits for its jobs to checkpoint and end

_job_parent: list[str] = []  # in a job's process: its sweep's parent run id
_open: dict[str, str] = {}  # in the sweep's process: parent run id -> store, not yet ended


def job_parent() -> str | None:
    """The parent run of the job running in this process (None outside a sweep)."""
    return _job_parent[-1] if _job_parent else None


def open_sweep() -> tuple[str, str] | None:
    """(store, parent run id) of the sweep this process runs and has not ended yet."""
    for parent, uri in _open.items():
        return uri, parent
    return None


class SweepCallback(Callback):
    """Opens one parent MLflow run per Hydra multirun; each job joins it as a nested child run.

    Works with every launcher (basic, joblib, submitit, Ray): the callback travels to the
    workers with the parent's id, and ``on_job_start`` hands it to the job. With
    ``resume=<parent run id>`` the sweep continues that parent instead of opening a new one. The
    parent ends FINISHED when every job did; a failed or stopped sweep ends it FAILED or KILLED
    (:func:`end_open_sweeps`), never RUNNING.
    """

    def __init__(self) -> None:
        self.parent_run_id: str | None = None
        self.uri: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.uri, self.parent_run_id = start(config)
        if str(config.hydra.launcher._target_) != BASIC_LAUNCHER:  # jobs in other processes
            uri, parent = self.uri, self.parent_run_id
            on_stop(lambda signum: stop_jobs(uri, parent, signum))

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if self.parent_run_id:
            _job_parent.append(self.parent_run_id)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if _job_parent:
            _job_parent.pop()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.parent_run_id and self.uri:
            finish(self.uri, self.parent_run_id)
            from runner.sweeps.prefixes import cache_root, remove_sweep_cache  # imports torch

            remove_sweep_cache(cache_root(config), self.parent_run_id)


def start(config: DictConfig) -> tuple[str, str]:
    """The store and parent run of a starting multirun: a new parent, or with ``resume=`` the
    one named. A store that cannot take the sweep stops it here, before any job (Hydra would
    turn a callback's exception into a warning)."""
    from runner.checks import check_objective
    from runner.distributed import launched

    try:
        if launched():  # every rank would open its own parent and run every job alone
            raise UserError(
                "-m under torchrun: torchrun trains one run at a time\n"
                "drop -m and launch one torchrun per configuration"
            )
        check_objective(config, str(config.hydra.sweeper._target_))
        _check_sweeper(config)
        from mlflow.tracking import MlflowClient  # after the checks: they answer at once

        from runner.tracking.stores import prepare_store, resolve_uri

        uri = resolve_uri(config.tracking.uri)
        prepare_store(uri)
        parent_run_id = _parent_run(MlflowClient(tracking_uri=uri), uri, config)
    except UserError as error:
        exit_with(error)
    _open[parent_run_id] = uri
    print(f"samplerlab: sweep parent run {parent_run_id} ({uri})", flush=True)
    return uri, parent_run_id


def _check_sweeper(config: DictConfig) -> None:
    """A sweeper's own settings checked before the parent run exists: Hydra builds the sweeper
    only after this callback, and its error would leave a FAILED parent behind. A sweeper class
    with a static ``check(config)`` (the race's) raises the user error it would stop with."""
    from hydra.utils import get_class

    check = getattr(get_class(str(config.hydra.sweeper._target_)), "check", None)
    if check is not None:
        check(config)


def _parent_run(client: Any, uri: str, config: DictConfig) -> str:
    from runner.tracking.runs import context_tags, experiment_id, find_run

    if config.get("resume"):
        parent = find_run(client, uri, config.resume)
        if parent.data.tags.get("sweep") != "parent":
            raise UserError(
                f"resume={config.resume!r} is not a sweep's parent run\n"
                "with -m, pass the parent run id the sweep printed; without -m, any run id"
            )
        client.update_run(parent.info.run_id, status="RUNNING")
        return str(parent.info.run_id)
    overrides = OmegaConf.to_container(config.hydra.overrides.task)
    assert isinstance(overrides, list)
    run = client.create_run(
        experiment_id(client, uri, config.tracking.experiment),
        run_name=f"sweep-{time.strftime('%Y%m%d-%H%M%S')}",
        tags=context_tags({"sweep": "parent", "overrides": " ".join(overrides)}),
    )
    return str(run.info.run_id)


def finish(uri: str, parent_run_id: str) -> None:
    """A multirun ended: its parent run FINISHED, unless a job's failure already ended it."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    if client.get_run(parent_run_id).info.status == "RUNNING":
        client.set_terminated(parent_run_id, status="FINISHED")
    _open.pop(parent_run_id, None)


def _children() -> list[int]:
    """Process ids of this process's direct children (launcher workers, resource trackers)."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (name)": state, ppid, ...
        if int(fields[1]) == me:
            found.append(int(entry.name))
    return found


def _running_children(uri: str, parent_run_id: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    from runner.tracking.runs import child_runs

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_run(parent_run_id).info.experiment_id
    return [r for r in child_runs(client, experiment, parent_run_id) if r.info.status == "RUNNING"]


def stop_jobs(uri: str, parent_run_id: str, signum: int) -> None:
    """The sweep got ``signum`` while its jobs run in other processes (joblib's workers,
    submitit's jobs), which a signal to this process alone does not reach: pass it on to them,
    and wait (at most :data:`STOP_WAIT_SECONDS`) until their runs have checkpointed and ended.
    Child processes that ignore the signal (multiprocessing's resource trackers) are unharmed."""
    for pid in _children():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    deadline = time.monotonic() + STOP_WAIT_SECONDS
    try:
        while _running_children(uri, parent_run_id) and time.monotonic() < deadline:
            time.sleep(0.5)
    except Exception as error:  # the store itself: end_open_sweeps reports what it can
        print(f"samplerlab: could not wait for the sweep's jobs: {error}", file=sys.stderr)


def end_open_sweeps(error: BaseException) -> None:
    """End the parent runs this process opened and did not finish: KILLED when stopped by a
    signal or Ctrl-C, FAILED otherwise. A child run still RUNNING then has no process left to
    end it (its worker was stopped with the sweep): it is marked KILLED, and ``resume=<parent
    id>`` continues it from its last checkpoint. Called when a sweep ends with an exception."""
    if not _open:  # a single run, or a sweep that ended well: nothing to end (and no import)
        return
    from mlflow.tracking import MlflowClient

    stopped = isinstance(error, (Interrupted, KeyboardInterrupt))
    for run_id, uri in list(_open.items()):
        try:
            client = MlflowClient(tracking_uri=uri)
            if stopped:
                for child in _running_children(uri, run_id):
                    client.set_terminated(child.info.run_id, status="KILLED")
            client.set_terminated(run_id, status="KILLED" if stopped else "FAILED")
        except Exception as failure:  # the store itself may be what failed
            print(f"samplerlab: could not end sweep run {run_id}: {failure}", file=sys.stderr)
        _open.pop(run_id, None)
        if stopped:
            print(
                f"samplerlab: sweep stopped; continue it with the same command plus resume={run_id}",
                file=sys.stderr,
            )
