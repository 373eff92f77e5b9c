"""The training loop: data stays in memory (on the device when there is one) and whole batches
are gathered by index in the sampler's order; per-sample losses go back to the sampler."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from runner.config import TrainerConfig
from runner.data import Augment, augment_batch
from samplers import Sampler


@dataclass
class TrainState:
    """Everything a checkpoint or another process needs to continue training."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: Sampler
    generator: torch.Generator  # batch augmentation
    epoch: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "generator": self.generator.get_state(),
            "epoch": self.epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        self.generator.set_state(state["generator"])
        self.epoch = state["epoch"]


@dataclass
class EpochResult:
    mean_loss: float
    delivered: torch.Tensor  # the indices the model actually trained on, in order (CPU)
    losses: torch.Tensor = field(repr=False)  # unweighted per-sample cross-entropy (CPU)


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


def build_state(
    model: torch.nn.Module, sampler: Sampler, cfg: TrainerConfig, seed: int
) -> TrainState:
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=cfg.lr,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        nesterov=cfg.nesterov and cfg.momentum > 0,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(cfg, batches_per_epoch(sampler, cfg.batch_size))
    )
    return TrainState(model, optimizer, scheduler, sampler, torch.Generator().manual_seed(seed))


def batches_per_epoch(sampler: Sampler, batch_size: int) -> int:
    """Batch samplers (2-D epoch tensors) fix their own batches; others are cut into batch_size."""
    return len(sampler) if sampler.batch_size else math.ceil(len(sampler) / batch_size)


def autocast(device: torch.device) -> AbstractContextManager:
    """Mixed precision (bfloat16) on CUDA; full precision on the CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def train_epoch(
    state: TrainState,
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    loss_fn: Callable,
    batch_size: int,
    augment: Augment | None,
    on_batch: Callable[[torch.Tensor], None] | None = None,
) -> EpochResult:
    """One epoch in the sampler's order for ``state.epoch``; hands per-sample losses back to it."""
    sampler, model, device = state.sampler, state.model, train_x.device
    sampler.set_epoch(state.epoch)
    order = sampler.epoch_indices()
    per_batch = order.shape[1] if order.dim() == 2 else batch_size  # batch samplers fix their own
    delivered = order.reshape(-1)
    if delivered.numel() % per_batch == 1 and delivered.numel() > 1:
        delivered = delivered[:-1]  # a batch of one breaks BatchNorm; dropped, so not reported
    delivered_device = delivered.to(device, non_blocking=True)
    losses = torch.empty(delivered.numel(), device=device)
    loss_sum = torch.zeros((), device=device)
    model.train()
    start = 0
    for idx in delivered_device.split(per_batch):
        x = train_x.index_select(0, idx)
        y = train_y.index_select(0, idx)
        if augment is not None:
            x = augment_batch(x, augment, state.generator)
        with autocast(device):
            logits = model(x)
        weighted, ce = loss_fn(logits, y, state.epoch)
        loss = weighted.mean()
        state.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        state.optimizer.step()
        state.scheduler.step()
        losses[start : start + idx.numel()] = ce.detach()
        start += idx.numel()
        loss_sum += loss.detach() * idx.numel()
        if on_batch is not None:
            on_batch(loss.detach())
    losses_cpu = losses.cpu()
    sampler.update(delivered, losses_cpu)
    state.epoch += 1
    return EpochResult(float(loss_sum) / delivered.numel(), delivered, losses_cpu)
