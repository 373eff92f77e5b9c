"""One run as the training core sees it: what it is built from (:class:`Parts`), what its
epochs produced so far (:class:`Progress`, checkpointed with the training state), and the two
with where they are recorded and checkpointed (:class:`RunContext`), which the loop, the prefix
sharing and the results take as one value."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from runner.data import LongTailData
from runner.train.evaluation import Evaluation
from runner.train.features import FrozenInputs
from runner.train.losses import ClassWeightedLoss, LDAMLoss
from runner.train.multilabel_evaluation import MultiLabelEvaluation, evaluation_from_state
from runner.train.recorder import Recorder, Row
from runner.train.settings import EvalConfig, TrackingConfig, TrainerConfig
from runner.train.state import TrainState, save_checkpoint
from samplers import Sampler

Scored = Evaluation | MultiLabelEvaluation  # what an evaluation of a split gives


@dataclass
class Parts:
    """Everything one run is built from, constructed before any training or tracking."""

    data: LongTailData
    sampler: Sampler
    loss_fn: ClassWeightedLoss  # or a multi-label loss (runner.train.multilabel_losses)
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
    latest: Scored | None = None
    latest_val: Scored | None = None  # the validation split's, at the same evaluation
    unlogged: list[Row] = field(default_factory=list)  # metrics a lost store did not take
    best: Scored | None = None  # on the test set, at the best epoch
    best_epoch: int = 0  # 1-based, as printed
    best_score: float = -1.0  # the score the best epoch was chosen by (balanced accuracy, mAP)
    latest_rare: dict[str, float] = field(default_factory=dict)  # binary data: test/, val/ AP...

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
            "latest_rare": dict(self.latest_rare),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        def evaluation(s: dict[str, Any] | None) -> Scored | None:
            return evaluation_from_state(s) if s else None

        self.drawn = [t.numpy() for t in state["drawn"]]
        self.target = [t.numpy() for t in state["target"]]
        self.latest = evaluation(state["latest"])
        self.latest_val = evaluation(state.get("latest_val"))  # checkpoints before it have none
        self.best = evaluation(state["best"])
        self.best_epoch = state["best_epoch"]
        self.best_score = state["best_score"]
        self.unlogged = [tuple(row) for row in state.get("unlogged", [])]
        self.latest_rare = dict(state.get("latest_rare", {}))  # checkpoints before it: none


@runtime_checkable
class Holding(Protocol):
    """A recorder that holds metric rows before it sends them (:class:`runner.tracking.Tracker`)."""

    def pending(self) -> list[Row]: ...

    def flush(self) -> None: ...


def flush(recorder: Recorder) -> None:
    """Send what ``recorder`` holds, if it holds anything."""
    if isinstance(recorder, Holding):
        recorder.flush()


@dataclass
class RunContext:
    """A run under way: its ``parts``, the ``recorder`` its record goes to, its ``progress``,
    the checkpoint ``path``, and ``logged_through``, the last epoch whose metrics the record
    holds already (a resumed run's, or a forked prefix's), which are not logged again."""

    parts: Parts
    recorder: Recorder
    progress: Progress
    path: Path
    logged_through: int = 0

    def checkpoint_payload(self) -> dict[str, Any]:
        """The training state and the progress, as a checkpoint holds them; the metric rows
        the recorder holds unsent go with the progress' unlogged ones, which a resumed run sends
        before it reads how far its record goes (sending a row twice changes nothing)."""
        progress = self.progress.state_dict()
        if isinstance(self.recorder, Holding):
            progress["unlogged"] += self.recorder.pending()
        return {"train": self.parts.state.state_dict(), "progress": progress}

    def save_checkpoint(self) -> None:
        """Write :meth:`checkpoint_payload` to :attr:`path` (atomically; rank 0 alone)."""
        save_checkpoint(self.path, self.checkpoint_payload())


def divergence_cause(parts: Parts, classifier_only: bool) -> tuple[str, str]:
    """The setting to blame for a non-finite loss and its fix. Every data source checks that its
    samples are finite, so the inputs are not the cause; LDAM's scale on an unbounded linear
    head is a known one, else the learning rate."""
    trainer = parts.trainer
    if classifier_only:  # the classifier stage (cRT, LWS): its own lr, by default trainer.lr
        setting = f"trainer.classifier_lr={trainer.classifier_lr or trainer.lr}"
        return setting, "set a lower trainer.classifier_lr"
    if isinstance(parts.loss_fn, LDAMLoss) and parts.head != "cosine":
        return (
            f"loss=ldam (loss.scale={parts.loss_fn.scale}) on model.head={parts.head}",
            "use model.head=cosine, the head LDAM's scale is meant for (+method=ldam_drw sets "
            "both), or trainer.lr=0.01, or loss.scale=1",
        )
    return f"trainer.lr={trainer.lr}", "lower trainer.lr (or raise trainer.warmup_epochs)"
