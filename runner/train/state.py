"""The training state a run carries from batch to batch and from process to process: model,
optimizer, schedule, sampler and generators (:class:`TrainState`), how it is built, how the
classifier stage changes it, and how it is checkpointed and restored.

A run has one stage, or two with ``trainer.classifier_epochs`` (cRT and LWS, Kang et al. 2020):
after ``trainer.epochs`` the classifier is re-initialised and trained alone (cRT), or kept and
rescaled per class by learnt factors (LWS), every other weight frozen."""

from __future__ import annotations

import io
import math
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runner.distributed import DataParallel, is_main
from runner.errors import EnvironmentFailure, UserError
from runner.files import write_atomically
from runner.train.settings import TrainerConfig
from runner.train.stages import stage_for
from samplers import Sampler


@dataclass
class TrainState:
    """Everything a checkpoint or another process needs to continue training, also from the
    middle of an epoch: ``batch`` batches of epoch ``epoch`` are done, and their per-sample
    losses and loss sum wait in ``epoch_losses`` / ``epoch_loss_sum`` for the epoch's end.

    Under torchrun ``parallel`` is this rank's :class:`runner.distributed.DataParallel` and the
    waiting losses are this rank's; :meth:`state_dict` (a collective then: every rank calls it)
    saves them in the global order, and :meth:`load_state_dict` takes this rank's part back, so
    a checkpoint is the same whichever rank writes it."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: Sampler
    generator: torch.Generator  # batch augmentation
    config: TrainerConfig
    classifier_only: bool = False  # the classifier stage: see start_classifier_stage
    epoch: int = 0
    batch: int = 0
    epoch_losses: torch.Tensor | None = None
    epoch_loss_sum: torch.Tensor | None = None
    parallel: DataParallel | None = None

    @property
    def train_mode(self) -> bool:
        """Whether the model trains in train mode: always in stage one; in the classifier stage
        as ``trainer.classifier_stage_mode`` says (see :func:`start_classifier_stage`)."""
        return not self.classifier_only or self.config.classifier_stage_mode == "train"

    @property
    def world_size(self) -> int:
        """How many processes train together (1 without torchrun)."""
        return self.parallel.world_size if self.parallel is not None else 1

    def state_dict(self) -> dict[str, Any]:
        losses, loss_sum = self.epoch_losses, self.epoch_loss_sum
        partial = self.batch > 0 and losses is not None and loss_sum is not None
        if partial and self.parallel is not None:
            assert losses is not None and loss_sum is not None
            losses, loss_sum = self.parallel.gather(losses), self.parallel.total(loss_sum)
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "classifier_only": self.classifier_only,
            "world_size": self.world_size,
            "epoch": self.epoch,
            "batch": self.batch,
            "epoch_losses": losses.cpu() if partial and losses is not None else None,
            "epoch_loss_sum": loss_sum.cpu() if partial and loss_sum is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved, now = state.get("world_size", 1), self.world_size
        if state["batch"] and saved != now:  # a rank's share of the epoch's batches would shift
            raise UserError(
                f"resume: the run stopped in the middle of an epoch in {saved} process(es), this "
                f"is {now}; resume it with {saved} (torchrun --nproc_per_node={saved} when > 1)"
            )
        if state.get("classifier_only", False) and not self.classifier_only:
            start_classifier_stage(self)  # its optimizer, to load the saved one into
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.epoch, self.batch = state["epoch"], state["batch"]
        self.epoch_losses, self.epoch_loss_sum = state["epoch_losses"], state["epoch_loss_sum"]
        parallel = self.parallel
        if parallel is not None and self.epoch_losses is not None:
            self.epoch_losses = self.epoch_losses[parallel.rank :: parallel.world_size]
            if not parallel.main:  # rank 0 carries the sum so far; the epoch's end adds them up
                self.epoch_loss_sum = torch.zeros_like(self.epoch_loss_sum)


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write atomically (temporary file, fsync, rename): a kill never leaves half a checkpoint,
    and a failed write (a full disk, a file-size limit, no permission) removes its temporary
    file, keeps the previous checkpoint and raises a :class:`UserError` naming the folder and
    the space needed. Under torchrun rank 0 alone writes (every rank holds the same state).

    The payload is serialised in memory first (a checkpoint is megabytes): torch's own file
    writer reports a failed write as an opaque internal error, a plain write as the OSError it
    is."""
    if not is_main():
        return
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    try:
        write_atomically(path, buffer.getbuffer())
    except OSError as error:
        raise _unwritable(path, buffer.getbuffer().nbytes, error) from None


def _unwritable(path: Path, needed: int, error: OSError) -> EnvironmentFailure:
    try:
        free = f"{shutil.disk_usage(path.parent).free / 2**20:.1f} MiB free there"
    except OSError:
        free = "free space unknown"
    kept = "the previous checkpoint is kept" if path.is_file() else "there is no earlier checkpoint"
    return EnvironmentFailure(
        f"checkpoint: cannot write {path.name} to {path.parent} ({error.strerror or error}; it "
        f"needs {needed / 2**20:.1f} MiB, {free}); {kept}\n"
        "free space there (or raise the file-size limit), then resume=<run id> continues the run "
        "from its last checkpoint"
    )


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Tensors and plain containers only (``weights_only=True``): no code runs on load. A file
    that cannot be read as one (truncated, not a checkpoint) is a :class:`UserError` naming it."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many kinds for a bad file
        first = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
        raise UserError(
            f"resume: cannot read the checkpoint {path} ({type(error).__name__}: {first})\n"
            "the run is left as it was; restore the file (its MLflow artifact "
            "checkpoint/checkpoint.pt, if the run logged one), or start a new run without resume"
        ) from None
    if not isinstance(checkpoint, dict) or not {"train", "progress"} <= set(checkpoint):
        raise UserError(
            f"resume: {path} is not a samplerlab checkpoint (no training state in it)\n"
            "the run is left as it was; restore the file, or start a new run without resume"
        )
    return checkpoint


def lr_lambda(cfg: TrainerConfig, steps_per_epoch: int) -> Callable[[int], float]:
    """Multiplier of the base learning rate at optimizer step ``step``: linear warmup, then
    cosine to zero, step decay at ``milestones`` (epochs), or constant."""
    warmup = cfg.warmup_epochs * steps_per_epoch
    total = cfg.epochs * steps_per_epoch

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
        if cfg.schedule == "step":
            return cfg.gamma ** sum(step >= m * steps_per_epoch for m in cfg.milestones)
        return 1.0

    return factor


def total_epochs(cfg: TrainerConfig) -> int:
    """The run's epochs: ``epochs``, then cRT's ``classifier_epochs``."""
    return cfg.epochs + cfg.classifier_epochs


def _sgd(parameters: Any, cfg: TrainerConfig, lr: float) -> torch.optim.SGD:
    return torch.optim.SGD(
        parameters,
        lr=lr,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        nesterov=cfg.nesterov and cfg.momentum > 0,
    )


def parameter_groups(model: torch.nn.Module, cfg: TrainerConfig) -> Any:
    """What the optimizer trains: the model's parameters at ``lr``; with ``backbone_lr`` other
    than 1, the features' at ``backbone_lr * lr`` and the classifier's at ``lr`` (fine-tuning a
    pretrained backbone more gently than its fresh head)."""
    factor = cfg.backbone_lr
    if factor == 1.0:
        return model.parameters()
    features, classifier = getattr(model, "features", None), getattr(model, "classifier", None)
    assert isinstance(features, torch.nn.Module) and isinstance(classifier, torch.nn.Module)
    return [
        {"params": list(features.parameters()), "lr": cfg.lr * factor},
        {"params": list(classifier.parameters())},
    ]


def build_state(
    model: torch.nn.Module, sampler: Sampler, cfg: TrainerConfig, seed: int
) -> TrainState:
    optimizer = _sgd(parameter_groups(model, cfg), cfg, cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(cfg, batches_per_epoch(sampler, cfg.batch_size))
    )
    generator = torch.Generator().manual_seed(seed)
    return TrainState(model, optimizer, scheduler, sampler, generator, cfg)


def start_classifier_stage(state: TrainState) -> None:
    """The classifier stage of a decoupled recipe (Kang et al. 2020, "Decoupling representation
    and classifier"): every weight is frozen; then the stage ``trainer.classifier_stage`` names
    (:mod:`runner.train.stages`: cRT's ``retrain``, LWS's ``scale``) prepares what trains.

    A fresh SGD (same momentum and weight decay) starts at ``classifier_lr`` (default ``lr``)
    and follows a cosine to zero over ``classifier_epochs``. The sampler decides what the stage
    draws (cRT and LWS: class-balanced, ``sampler=deferred`` with
    ``switch_epoch=${trainer.epochs}``).

    The model trains in the mode ``trainer.classifier_stage_mode`` names (:attr:`TrainState.
    train_mode`): ``train``, the reference implementation's (its classifier stage calls
    ``model.train()`` on the frozen feature model), normalises with batch statistics and
    re-estimates the frozen backbone's BatchNorm running statistics on the stage's batches
    (class-balanced), and runs any dropout; ``eval`` keeps stage one's statistics and no
    dropout. A backbone frozen by ``model.freeze`` stays in eval mode either way
    (:class:`runner.models.backbones.FrozenBackbone`), its features cached or not."""
    cfg, model = state.config, state.model
    model.requires_grad_(False)
    trained = stage_for(cfg).trainable(model, state.sampler.num_classes)
    if state.parallel is not None:  # DDP reduces the gradients of what trained when it was built
        state.parallel = DataParallel(model, state.parallel.device)
    state.optimizer = _sgd(trained, cfg, cfg.classifier_lr or cfg.lr)
    steps = max(1, cfg.classifier_epochs * batches_per_epoch(state.sampler, cfg.batch_size))
    state.scheduler = torch.optim.lr_scheduler.LambdaLR(
        state.optimizer, lambda step: 0.5 * (1.0 + math.cos(math.pi * step / steps))
    )
    state.classifier_only = True


def batches_per_epoch(sampler: Sampler, batch_size: int) -> int:
    """Batch samplers (2-D epoch tensors) fix their own batches; others are cut into batch_size.
    Under torchrun every rank takes its part of each of those batches (``batch_size`` is the
    global batch; the sampler's length is this rank's)."""
    if sampler.batch_size:
        return sampler.global_indices().shape[0]  # drawn now, kept for the epoch
    return math.ceil(len(sampler) / (batch_size // sampler.world_size))


def autocast(device: torch.device) -> AbstractContextManager[Any]:
    """Mixed precision (bfloat16) on CUDA; full precision on the CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
