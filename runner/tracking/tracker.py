"""A run's MLflow record: the :class:`Tracker` the training loop writes to, and finding a run
to resume.

A run records the flattened resolved config as params, tags that make runs easy to filter, its
metrics in batches (:meth:`Tracker.log_metrics` keeps an epoch's rows and sends what it holds
every :data:`FLUSH_SECONDS`, and whenever the record is read or ended: a ``log_batch`` to sqlite
costs 20-150 ms, so a head run of a few seconds on cached features writes its epochs in one), and
artifacts. In a
Hydra multirun (:mod:`runner.sweeps.callback`) every run is the nested child of the sweep's parent run.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse

import mlflow
import torch
from mlflow.entities import Metric, Param, Run, RunStatus, RunTag
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from runner.config import resolved, typed
from runner.data.multilabel import class_counts
from runner.fingerprint import config_key
from runner.signals import held
from runner.tracking.datasets import dataset_inputs
from runner.tracking.flavor import mlflow_pytorch
from runner.tracking.runs import context_tags, experiment_id, find_run
from runner.tracking.stores import StoreLost, already_exists, browse_command, resolve_uri
from runner.train.recorder import Row, class_table, per_class_as_table
from runner.train.settings import TrackingConfig

if TYPE_CHECKING:
    from runner.data import LongTailData

_BATCH = 100  # MLflow accepts at most 100 params and 1000 metrics per log_batch call
# Tries again after a store's "exists already": a conflict means another job committed one of
# the same datasets first, which the next try finds and links; another conflict needs yet
# another job to commit one of the rest in between, so a few tries settle any sweep.
CONFLICT_RETRIES = 3
# How long after its last send a run sends the metric rows it holds: an epoch slower than that
# is sent as it ends (a watcher sees the run progress), a fast run's epochs go in one batch. Rows
# held are in every checkpoint (:meth:`runner.train.run.RunContext.checkpoint_payload`), so a
# resumed run sends them.
FLUSH_SECONDS = 10.0
T = TypeVar("T")


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


def _chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
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
        self.unsent: list[Row] = []  # metric rows not sent yet (:meth:`flush`)
        self.last_sent = time.monotonic()  # when rows were last sent (or the run opened)
        # A database store (SQLite, PostgreSQL) written from this process: a signal that cut a
        # write short would leave its transaction open, and the store locked for the writes
        # that end the runs. Over HTTP the server's transaction is its own.
        self.direct = urlparse(uri).scheme not in ("http", "https")

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
        experiment = experiment_id(client, uri, experiment)
        tags = context_tags(tags)
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        tracker = cls(client, uri, client.create_run(experiment, run_name=run_name, tags=tags))
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

    def _call(
        self,
        what: str,
        action: Callable[[], T],
        unlogged: list[Row] | None = None,
        conflicts: int = 0,
    ) -> T:
        """``action()``; a store that fails it (MLflow's bounded retries spent) is a
        :class:`StoreLost` carrying the metric rows that did not reach it. Up to ``conflicts``
        times, a store's "exists already" (:func:`runner.tracking.stores.already_exists`: another job
        created the same thing at the same moment, and the store rolled this call back) runs
        ``action`` again, which then finds and reuses what the other job created."""
        attempt = 0
        while True:
            try:
                if not self.direct:
                    return action()
                with held():  # the write ends (MLflow's retries are bounded), then the signal
                    return action()
            except Exception as error:
                if attempt < conflicts and already_exists(error):
                    attempt += 1
                    continue
                raise StoreLost.during(self.uri, what, error, unlogged or []) from error

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Hold the rows; send all held rows when :data:`FLUSH_SECONDS` have passed since the
        last send (an epoch slower than that is sent as it ends; :meth:`flush` sends at once)."""
        now = int(time.time() * 1000)
        self.unsent.extend((k, float(v), now, step) for k, v in metrics.items())
        if time.monotonic() - self.last_sent >= FLUSH_SECONDS:
            self.flush()

    def pending(self) -> list[Row]:
        """The metric rows held, not sent yet (a checkpoint keeps them)."""
        return list(self.unsent)

    def flush(self) -> None:
        """Send the held metric rows; a lost store raises :class:`StoreLost` carrying them."""
        rows, self.unsent = self.unsent, []
        self.last_sent = time.monotonic()
        if rows:
            self.log_rows(rows)

    def log_rows(self, rows: list[Row]) -> None:
        """Metric rows ``(key, value, timestamp, step)``: logging the same row twice is a no-op,
        so rows that a lost store may or may not have taken can be sent again."""
        for start in range(0, len(rows), 1000):
            chunk = [Metric(*row) for row in rows[start : start + 1000]]

            def send(chunk: list[Metric] = chunk) -> None:
                self.client.log_batch(self.run_id, metrics=chunk)

            self._call(f"logging metrics at step {rows[start][3]}", send, rows[start:])

    def last_step(self, key: str) -> int | None:
        """The highest step logged for metric ``key`` (None when it has none)."""
        self.flush()
        history = self._call(
            "reading the metric history", lambda: self.client.get_metric_history(self.run_id, key)
        )
        return max((m.step for m in history), default=None)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        batch = [RunTag(k, v) for k, v in tags.items()]
        self._call("setting tags", lambda: self.client.log_batch(self.run_id, tags=batch))

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
            self._call("uploading artifacts", lambda: self.client.log_artifacts(self.run_id, tmp))

    def log_inputs(self, datasets: list[Any]) -> None:
        """MLflow dataset inputs (:func:`runner.tracking.datasets.dataset_inputs`): the UI's "Datasets"."""
        # Jobs of a sweep log the same datasets: on a new experiment, two may insert one at once.
        self._call(
            "logging datasets",
            lambda: self.client.log_inputs(self.run_id, datasets),
            conflicts=CONFLICT_RETRIES,
        )

    def log_table(self, name: str, table: dict[str, list[Any]]) -> None:
        """A table artifact (MLflow's JSON table format) at ``name``."""
        self._call(
            f"logging the table {name}",
            lambda: self.client.log_table(self.run_id, data=table, artifact_file=name),
        )

    def log_model(
        self,
        model: torch.nn.Module,
        example: Any,
        class_names: list[str],
        register: str | None,
        step: int,
    ) -> None:
        """``model`` as an MLflow model (a LoggedModel named ``model`` of this run, with its
        signature, an input example and the class names), registered as ``register`` if given:
        ``mlflow.pytorch.load_model("runs:/<run id>/model")`` loads it. MLflow links the
        metrics of ``step`` to it (logging them again with the model's id)."""
        from mlflow.models import infer_signature

        self.flush()  # the metrics of ``step`` are in the store before the model links them
        with torch.no_grad():
            outputs = model(torch.as_tensor(example)).numpy()

        def log() -> None:
            # The fluent API names the experiment the model goes to: the run's own.
            mlflow.set_tracking_uri(self.uri)
            mlflow.set_experiment(experiment_id=self.experiment_id)
            mlflow_pytorch().log_model(
                model,
                name="model",
                run_id=self.run_id,
                signature=infer_signature(example, outputs),
                input_example=example,
                metadata={"class_names": class_names},
                # Named, so that MLflow need not infer them by loading the model elsewhere.
                pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
                registered_model_name=register,
                step=step,
            )

        self._call("logging the model", log)

    def finish(self, status: str = "FINISHED") -> None:
        """End the run as FINISHED, FAILED or KILLED. A signal meanwhile waits until the status
        is written (then raises :class:`Interrupted`): a run must not stay RUNNING because
        torchrun stopped this rank after another one failed."""
        RunStatus.from_string(status)  # rejects anything else
        with held():  # the held rows too: a signal while they are sent would leave it RUNNING
            try:
                self.flush()
            finally:  # rows the store refused do not keep the run from its status
                self.client.set_terminated(self.run_id, status=status)

    def where(self) -> str:
        ui = browse_command(self.uri)
        return f"run {self.run_id} in experiment {self.experiment_id} at {self.uri} (browse: {ui})"


class Bystander:
    """What a rank other than 0 records to under torchrun: nothing. It knows the run's id and
    name, as rank 0 created or reopened it, and no MLflow at all (rank 0 alone writes)."""

    def __init__(self, run_id: str, run_name: str) -> None:
        self.run_id, self.run_name = run_id, run_name

    @classmethod
    def of(cls, tracker: Tracker) -> Bystander:
        return cls(tracker.run_id, tracker.run_name)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def log_rows(self, rows: list[Row]) -> None:
        pass

    def pending(self) -> list[Row]:
        return []

    def flush(self) -> None:
        pass

    def log_inputs(self, datasets: list[Any]) -> None:
        pass

    def log_table(self, name: str, table: dict[str, list[Any]]) -> None:
        pass

    def log_model(
        self,
        model: torch.nn.Module,
        example: Any,
        class_names: list[str],
        register: str | None,
        step: int,
    ) -> None:
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
        tracker.flush()
    if files:
        tracker.log_artifacts(files)


def start_run(
    cfg: DictConfig,
    data: LongTailData,
    choices: dict[str, str],
    overrides: list[str],
    parent_run_id: str | None = None,
) -> Tracker:
    """A new run for ``cfg``: its name, tags (the config choices, a published recipe, the
    overrides, the config's fingerprint, MLflow's context tags), every resolved parameter, the
    data's class counts at step 0 (a table with many classes), its datasets (one per split) and
    ``config.yaml``; nested under ``parent_run_id`` (a sweep's parent) when given."""
    names = {group: choices[group] for group in ("sampler", "data", "model", "loss")}
    overridden = {o.split("=")[0].lstrip("+~") for o in overrides}
    # A published recipe (conf/method/: sampler, loss and settings); not when sampler= or loss=
    # on the command line replaced what the recipe chose.
    if choices.get("method") and not overridden & {"sampler", "loss"}:
        names["method"] = choices["method"]
    tags = dict(names)
    if cfg.tracking.reference:
        tags["reference"] = cfg.tracking.reference
    tabled = per_class_as_table(typed(cfg.tracking, TrackingConfig), data.num_classes)
    tags.update(
        imbalance_factor=str(data.imbalance_factor),
        overrides=" ".join(overrides) or "(none)",
        config_key=config_key(cfg),
        per_class="table" if tabled else "metrics",
    )
    # Short parameters with the choice names, to group and filter by in the UI.
    params = {**flatten(resolved(cfg)), **names}
    tracker = Tracker.start(
        cfg.tracking.uri,
        cfg.tracking.experiment,
        run_name=f"{names.get('method', names['sampler'])}-{names['data']}-s{cfg.seed}",
        params=params,
        tags=tags,
        parent_run_id=parent_run_id,
    )
    # The race's chance level reads these: 1/C, or the validation split's majority share.
    splits = {"train_count": data.train_counts}
    if data.val_y is not None:
        splits["val_count"] = class_counts(data.val_y, data.num_classes)
    splits["test_count"] = class_counts(data.test_y, data.num_classes)
    if tabled:
        columns = {f"data/{kind}": values for kind, values in splits.items()}
        tracker.log_table("per_class/data.json", class_table(data.class_names, columns))
        tracker.log_metrics({"data/num_classes": data.num_classes}, step=0)
    else:
        counts = {
            f"data/{kind}/{n}": int(c)
            for kind, values in splits.items()
            for n, c in zip(data.class_names, values, strict=True)
        }
        tracker.log_metrics({**counts, "data/num_classes": data.num_classes}, step=0)
    tracker.flush()  # step 0 is in the store before any checkpoint could carry it
    tracker.log_inputs(dataset_inputs(cfg, data))
    tracker.log_artifacts({"config.yaml": OmegaConf.to_yaml(resolved(cfg))})
    return tracker
