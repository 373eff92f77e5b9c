"""What one run is built from (:class:`Parts`), what its epochs produced so far
(:class:`Progress`), and the Hydra facts the other modules share: the chosen config names, the
sweeper, where the run checkpoints. Below the loop, the results and the resume logic, so that
each of them can import it."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig, OmegaConf

from runner.checks import accepted_parameters, check_targets
from runner.config import (
    MODEL_RUNNER_KEYS,
    POST_HOC_STAGES,
    SUPPLIED,
    EvalConfig,
    TrackingConfig,
    TrainerConfig,
    typed,
)
from runner.data import LongTailData
from runner.distributed import check_batch_size, data_parallel
from runner.errors import UserError
from runner.models import FeatureClassifier
from runner.models.adopt import as_feature_classifier
from runner.tracking.stores import Row
from runner.train.decoupled import check_post_hoc
from runner.train.evaluation import Evaluation
from runner.train.features import FrozenInputs, freeze
from runner.train.feed import place
from runner.train.losses import ClassWeightedLoss
from runner.train.state import TrainState, build_state
from samplers import Sampler


@dataclass
class Parts:
    """Everything one run is built from, constructed before any training or tracking."""

    data: LongTailData
    sampler: Sampler
    loss_fn: ClassWeightedLoss
    state: TrainState
    device: torch.device
    # The typed parts of the config the loop, the evaluation and the recording read.
    trainer: TrainerConfig
    evaluation: EvalConfig
    tracking: TrackingConfig
    head: str  # model.head, as the model was built (linear | cosine)
    frozen: FrozenInputs | None = None  # model.freeze on cached features: the backbone, the images

    @property
    def stored_data(self) -> LongTailData:
        """The data as its source stores it: on cached features, the samples they came from
        (what the run's MLflow datasets and logged model describe), else :attr:`data`."""
        return self.frozen.stored if self.frozen is not None else self.data


@dataclass
class Progress:
    """What the epochs so far produced beyond the training state; checkpointed with it."""

    drawn: list[np.ndarray] = field(default_factory=list)  # class shares per epoch, as drawn
    target: list[np.ndarray] = field(default_factory=list)  # ... as intended
    latest: Evaluation | None = None
    latest_val: Evaluation | None = None  # the validation split's, at the same evaluation
    unlogged: list[Row] = field(default_factory=list)  # metrics a lost store did not take
    best: Evaluation | None = None  # on the test set, at the best epoch
    best_epoch: int = 0  # 1-based, as printed
    best_score: float = -1.0  # balanced accuracy the best epoch was chosen by

    def state_dict(self) -> dict[str, Any]:
        return {
            "drawn": [torch.from_numpy(a) for a in self.drawn],
            "target": [torch.from_numpy(a) for a in self.target],
            "latest": self.latest.state_dict() if self.latest else None,
            "latest_val": self.latest_val.state_dict() if self.latest_val else None,
            "best": self.best.state_dict() if self.best else None,
            "best_epoch": self.best_epoch,
            "best_score": self.best_score,
            "unlogged": list(self.unlogged),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        def evaluation(s: dict[str, Any] | None) -> Evaluation | None:
            return Evaluation.from_state(s) if s else None

        self.drawn = [t.numpy() for t in state["drawn"]]
        self.target = [t.numpy() for t in state["target"]]
        self.latest = evaluation(state["latest"])
        self.latest_val = evaluation(state.get("latest_val"))  # checkpoints before it have none
        self.best = evaluation(state["best"])
        self.best_epoch = state["best_epoch"]
        self.best_score = state["best_score"]
        self.unlogged = [tuple(row) for row in state.get("unlogged", [])]


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "config error at 'trainer.device': cuda requested but no CUDA device is available; use trainer.device=auto"
        )
    return torch.device(name)


def build(group: str, node: DictConfig, **supplied: Any) -> Any:
    """``instantiate`` one group's object with the arguments the runner supplies (those
    :data:`runner.config.SUPPLIED` names, which the config check refuses from the config: all
    of them, but for a model only those its constructor takes); a bad value comes out as a
    :class:`UserError` naming the group."""
    assert set(supplied) <= SUPPLIED[group], f"{group}: supplied {sorted(supplied)}"
    assert group == "model" or set(supplied) == SUPPLIED[group], f"{group}: {sorted(supplied)}"
    try:
        return instantiate(node, **supplied, _convert_="all")
    except InstantiationException as wrapped:
        cause = wrapped.__cause__
        if isinstance(cause, UserError):
            raise cause from None
        if isinstance(cause, (ValueError, TypeError, FileNotFoundError)):
            raise UserError(f"{group} ({node._target_}): {cause}") from cause
        raise


def build_model(node: DictConfig, in_shape: tuple[int, ...], num_classes: int) -> FeatureClassifier:
    """The model group's module as a :class:`FeatureClassifier`: its constructor gets
    ``num_classes``, ``in_shape`` where it takes it, and the config's keys less the runner's own
    (:data:`runner.config.MODEL_RUNNER_KEYS`); ``model.head`` is applied after it where the
    constructor does not take it."""
    target = node._target_
    accepted = accepted_parameters(get_method(target))
    passed = [str(k) for k in node if k not in MODEL_RUNNER_KEYS or k in accepted]
    supplied: dict[str, Any] = {"num_classes": num_classes}
    if "in_shape" in accepted:
        supplied["in_shape"] = in_shape
    model = build("model", OmegaConf.masked_copy(node, passed), **supplied)
    head = None if "head" in accepted else str(node.get("head", "linear"))
    try:
        return as_feature_classifier(model, num_classes, head, target, in_shape)
    except ValueError as error:
        raise UserError(f"model ({target}): {error}") from None


def build_parts(cfg: DictConfig) -> Parts:
    """Validate the config and build every object, so that a bad value fails here; the loop
    gets typed parts (:attr:`Parts.trainer` and the others), not the config."""
    check_targets(cfg)
    trainer = typed(cfg.trainer, TrainerConfig)
    check_batch_size(trainer.batch_size)
    device = _device(trainer.device)
    if trainer.threads:
        torch.set_num_threads(trainer.threads)
    torch.manual_seed(cfg.seed)
    data: LongTailData = place(build("data", cfg.data), device)  # in memory or a DataLoader
    sampler: Sampler = build("sampler", cfg.sampler, labels=data.train_y)
    model: FeatureClassifier = build_model(cfg.model, data.in_shape, data.num_classes)
    if model.unit_input and data.normalize is not None:  # the model standardises itself
        channels = len(data.normalize[0])
        data.normalize = ([0.0] * channels, [1.0] * channels)
    if trainer.classifier_stage in POST_HOC_STAGES:  # the built split and model: refused now
        check_post_hoc(model, trainer.classifier_stage, data.val_y)
    frozen = None
    if cfg.model.get("freeze", False):  # the head alone trains, on cached features if it can
        model, data, frozen = freeze(model, data, cfg, device)
    weights = getattr(sampler, "class_loss_weights", None)  # the hybrid strategy's
    loss_fn = build(
        "loss",
        cfg.loss,
        class_counts=data.train_counts,
        sampler_weights=weights() if weights is not None else None,
        epochs=trainer.epochs,
    )
    state = build_state(model.to(device), sampler, trainer, cfg.seed)
    state.parallel = data_parallel(state.model, device)  # under torchrun
    return Parts(
        data,
        sampler,
        loss_fn.to(device),
        state,
        device,
        trainer,
        typed(cfg.eval, EvalConfig),
        typed(cfg.tracking, TrackingConfig),
        str(cfg.model.get("head", "linear")),
        frozen,
    )


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


def checkpoint_path(run_id: str, before: str | None = None) -> Path:
    """Where the run checkpoints: for a resumed run, the file it checkpointed to before (its
    ``checkpoint`` tag) while that folder is there, so that a run keeps one checkpoint; else
    beside the run's Hydra output (outputs/... or multirun/.../<job>); outside Hydra, in the
    temporary folder."""
    if before and Path(before).parent.is_dir():
        return Path(before)
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir) / "checkpoint.pt"
    return Path(tempfile.gettempdir()) / "samplerlab-checkpoints" / run_id / "checkpoint.pt"
