"""Finding what ``resume=`` continues: a run by its id, or a sweep's job by its parent and its
config's fingerprint; the config it runs with; its last checkpoint."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from runner.config import RunConfig
from runner.errors import UserError
from runner.fingerprint import (
    ADDED_DEFAULTS,
    NEUTRAL_DEFAULTS,
    RUNTIME_KEYS,
    config_keys,
    moved_targets,
)
from runner.job import choices
from runner.tracking.runs import child_runs, find_run
from runner.train.state import load_checkpoint


def resume_target(cfg: DictConfig, uri: str) -> tuple[DictConfig, PreviousRun | None]:
    """The config to run and the run to continue (None: start a new one, e.g. a sweep's job
    that did not run before)."""
    previous = previous_run(uri, cfg.resume, config_keys(cfg))
    if previous is None or previous.via_parent:
        return cfg, previous  # a sweep's job: its config is the sweep's
    _, overrides = choices(cfg)
    extra = [o for o in overrides if o.split("=")[0].lstrip("+~") not in RUNTIME_KEYS]
    if extra:
        raise UserError(
            f"resume={cfg.resume!r} continues the run with its own config, but got {' '.join(extra)}\n"
            "drop those overrides, or start a new run without resume"
        )
    saved = cast(
        DictConfig,
        OmegaConf.merge(
            OmegaConf.structured(RunConfig),
            OmegaConf.create(moved_targets(_plain(OmegaConf.create(previous.config)))),
        ),
    )
    for key in RUNTIME_KEYS:
        OmegaConf.update(saved, key, OmegaConf.select(cfg, key), merge=False)
    # A schema key added since the run was recorded: the behaviour it had then.
    for key, before in {**ADDED_DEFAULTS, **NEUTRAL_DEFAULTS}.items():
        group, _, name = key.rpartition(".")
        node = OmegaConf.select(saved, group)
        # Absent from an untyped group (model, data), missing from a typed one (trainer).
        if isinstance(node, DictConfig) and (name not in node or OmegaConf.is_missing(node, name)):
            node[name] = before
    return saved, previous


def _plain(node: Any) -> dict[str, Any]:
    plain = OmegaConf.to_container(node, resolve=False)
    assert isinstance(plain, dict)
    return {str(k): v for k, v in plain.items()}


def without_client(
    target: tuple[DictConfig, PreviousRun | None],
) -> tuple[DictConfig, PreviousRun | None]:
    """What ranks other than 0 receive of :func:`resume_target`: they never read MLflow."""
    cfg, previous = target
    return cfg, dataclasses.replace(previous, client=None) if previous is not None else None


def saved_checkpoint(previous: PreviousRun) -> dict[str, Any] | None:
    with previous.checkpoint_file() as saved:
        return load_checkpoint(saved) if saved is not None else None


@dataclass
class PreviousRun:
    """A run to continue (or, FINISHED, to skip), as found by :func:`previous_run`."""

    client: MlflowClient | None  # None on the ranks that never read MLflow
    run_id: str
    status: str
    via_parent: bool  # found as a sweep parent's child with the same config
    tags: dict[str, str]
    metrics: dict[str, float]

    @property
    def config(self) -> str:
        """The resolved config the run was started with (its ``config.yaml``)."""
        with tempfile.TemporaryDirectory() as tmp:
            assert self.client is not None, "read on the rank that reads MLflow"
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
            assert self.client is not None, "read on the rank that reads MLflow"
            try:
                path = self.client.download_artifacts(
                    self.run_id, "checkpoint/checkpoint.pt", folder
                )
            except Exception:
                path = None
            yield Path(path) if path is not None else None


def previous_run(uri: str, resume: str, config_keys: set[str]) -> PreviousRun | None:
    """The run ``resume`` names; for a sweep's parent, its child whose ``config_key`` is one of
    ``config_keys`` (a finished one first, else the newest; None when the sweep never ran that
    job)."""
    client = MlflowClient(tracking_uri=uri)
    run = find_run(client, uri, resume)
    via_parent = run.data.tags.get("sweep") == "parent"
    if via_parent:
        same = [
            c
            for c in child_runs(client, run.info.experiment_id, run.info.run_id)
            if c.data.tags.get("config_key") in config_keys
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
