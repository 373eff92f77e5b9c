"""A multi-label training loop without tracking: the runner's epoch
(:func:`runner.train.fit.train_epoch`) and its multi-label records
(:mod:`runner.train.multilabel_run`), epoch after epoch, for benchmarks and for users' own code
(``python -m runner`` runs the same epochs through :func:`runner.train.fit.fit`, with MLflow)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from runner.data.multilabel import MultiLabelData
from runner.train.feed import Feed
from runner.train.fit import train_epoch
from runner.train.multilabel_run import (
    MultiLabelEpoch,
    evaluate_epoch,
    multilabel_sampling_metrics,
)
from runner.train.settings import TrainerConfig
from runner.train.state import build_state
from samplers import Sampler


@dataclass
class EpochRecord:
    """What one epoch of :func:`train_multilabel` produced."""

    mean_loss: float
    sampling: dict[str, float]
    shares: np.ndarray
    scores: MultiLabelEpoch


def train_multilabel(
    data: MultiLabelData,
    model: torch.nn.Module,
    sampler: Sampler,
    loss: torch.nn.Module,
    trainer: TrainerConfig,
    seed: int,
    shots: tuple[int, int] = (100, 20),
) -> list[EpochRecord]:
    """Train ``model`` on ``data`` for ``trainer.epochs`` with the runner's epoch
    (:func:`runner.train.fit.train_epoch`: the sampler's order, its optimiser and schedule) on
    the CPU, recording each epoch's drawn shares and evaluation; no tracking."""
    device = torch.device("cpu")
    state = build_state(model, sampler, trainer, seed)
    train_x = Feed(data.train_x, device, data.normalize)
    test = (Feed(data.test_x, device, data.normalize), data.test_y)
    val = None
    if data.val_x is not None and data.val_y is not None:
        val = (Feed(data.val_x, device, data.normalize), data.val_y)
    counts = data.train_counts.numpy()
    records = []
    for _ in range(trainer.epochs):
        result = train_epoch(state, train_x, data.train_y, loss, trainer.batch_size, None)
        sampling, shares, _ = multilabel_sampling_metrics(
            sampler, result.delivered, data.class_names
        )
        scored = evaluate_epoch(
            model, test, val, counts, data.class_names, trainer.eval_batch_size, shots
        )
        records.append(EpochRecord(result.mean_loss, sampling, shares, scored))
    return records
