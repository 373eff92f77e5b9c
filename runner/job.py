"""The Hydra job this process runs, as the app reads it: the chosen config names and
overrides, the sweeper that launched it, and where it checkpoints. Outside a Hydra app (a
composed config, a test) each has a plain answer."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig


def active_sweeper() -> str | None:
    """The ``_target_`` of the sweeper that launched this job (None outside a multirun)."""
    if not HydraConfig.initialized():
        return None
    hydra = HydraConfig.get()
    return str(hydra.sweeper._target_) if hydra.mode == RunMode.MULTIRUN else None


def choices(cfg: DictConfig) -> tuple[dict[str, str], list[str]]:
    """Hydra's chosen config names and overrides; outside a Hydra app, the targets' names."""
    if HydraConfig.initialized():
        hydra = HydraConfig.get()
        return {k: str(v) for k, v in hydra.runtime.choices.items()}, list(hydra.overrides.task)
    return {
        g: str(cfg[g]._target_).rsplit(".", 1)[-1] for g in ("data", "model", "sampler", "loss")
    }, []


def temporary_checkpoints() -> Path:
    """Where runs outside a Hydra app checkpoint: a folder per run in the temporary folder."""
    return Path(tempfile.gettempdir()) / "samplerlab-checkpoints"


def discard_if_temporary(path: Path) -> None:
    """Remove ``path``'s run folder if it is one of :func:`temporary_checkpoints`: a finished
    run's checkpoint is its MLflow artifact (which ``resume=`` reads when the file is gone), and
    nobody else would ever clean the temporary folder of one file per run. A checkpoint beside
    Hydra's output stays with that output."""
    if path.parent.parent == temporary_checkpoints():
        shutil.rmtree(path.parent, ignore_errors=True)


def checkpoint_path(run_id: str, before: str | None = None) -> Path:
    """Where the run checkpoints: for a resumed run, the file it checkpointed to before (its
    ``checkpoint`` tag) while that folder is there, so that a run keeps one checkpoint; else
    beside the run's Hydra output (outputs/... or multirun/.../<job>); outside Hydra, in the
    temporary folder."""
    if before and Path(before).parent.is_dir():
        return Path(before)
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir) / "checkpoint.pt"
    return temporary_checkpoints() / run_id / "checkpoint.pt"
