"""Lightning's Trainer and Fabric, with their defaults, as their docs use them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.fabric import Fabric
from torch.utils.data import DataLoader

from samplers import (
    AnnealedSampler,
    DeferredSampler,
    FixedClassSampler,
    HardMinedSampler,
    Sampler,
    WeightedSampler,
)
from samplers.integrations import find_sampler, update_across_ranks
from samplers.integrations.lightning import SamplerFeedback
from tests.helpers.frameworks.data import BATCH, EPOCHS, Record, dataset, labels, losses, model


class Module(pl.LightningModule):
    """Trains a linear model and records the indices of every batch it is given."""

    def __init__(self, record: Record) -> None:
        super().__init__()
        self.net = model()
        self.record = record

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x, y, idx = batch
        self.record.batch(self.current_epoch, idx)
        per_sample = losses(self.net, x, y)
        return {"loss": per_sample.mean(), "losses": per_sample}

    def on_train_epoch_end(self) -> None:
        # The sampler of the loader Lightning iterates (a rebuilt batch sampler is a copy).
        self.record.epoch_end(find_sampler(self.trainer.train_dataloader))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Data(pl.LightningDataModule):
    """``sampler`` is built in ``__init__`` (before the process group exists), in ``setup`` or
    in ``train_dataloader`` (where Lightning captures a batch sampler's arguments)."""

    def __init__(self, make: Callable[[], Sampler], where: str) -> None:
        super().__init__()
        self.make, self.where = make, where
        self.sampler: Sampler | None = make() if where == "init" else None

    def setup(self, stage: str) -> None:
        if self.where == "setup":
            self.sampler = self.make()

    def train_dataloader(self) -> DataLoader[Any]:
        if self.where == "hook":
            self.sampler = self.make()
        assert self.sampler is not None
        if self.sampler.batch_size is not None:
            return DataLoader(dataset(), batch_sampler=self.sampler)
        return DataLoader(dataset(), sampler=self.sampler, batch_size=BATCH)


def _fit(data: Data, callbacks: list[pl.Callback] | None = None, **trainer: Any) -> Record:
    record = Record()
    module = Module(record)
    fit = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=EPOCHS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks or [],
        **trainer,
    )
    fit.fit(module, datamodule=data)
    # Whether the loader Lightning iterated drew from a copy of the data module's sampler.
    record.extra["rebuilt"] = find_sampler(fit.train_dataloader) is not data.sampler
    return record


def trainer_index_sampler() -> dict[str, Any]:
    """The issue's case: WeightedSampler(q=0) passed as sampler=, Lightning's defaults."""
    before = dist.is_initialized()
    data = Data(lambda: WeightedSampler(labels(), q=0.0, seed=0), where="init")
    out = _fit(data).as_json()
    out["built_before_process_group"] = not before
    return out


def trainer_schedule_sampler() -> dict[str, Any]:
    data = Data(lambda: AnnealedSampler(labels(), total_epochs=EPOCHS, seed=1), where="setup")
    return _fit(data).as_json()


def trainer_batch_sampler() -> dict[str, Any]:
    """FixedClassSampler as batch_sampler=, built in the hook: Lightning rebuilds it."""
    data = Data(
        lambda: FixedClassSampler(labels(), classes_per_batch=4, samples_per_class=4, seed=2),
        where="hook",
    )
    return _fit(data).as_json()


def trainer_batch_sampler_outside_hook() -> dict[str, Any]:
    """Built in setup(), Lightning can only rebuild it as type(bs)(sampler, ...): refused."""
    data = Data(
        lambda: FixedClassSampler(labels(), classes_per_batch=4, samples_per_class=4, seed=2),
        where="setup",
    )
    try:
        _fit(data)
    except ValueError as error:
        return {"error": str(error)}
    return {"error": None}


def trainer_without_distributed_sampler() -> dict[str, Any]:
    data = Data(
        lambda: FixedClassSampler(labels(), classes_per_batch=4, samples_per_class=4, seed=3),
        where="setup",
    )
    return _fit(data, use_distributed_sampler=False).as_json()


def trainer_feedback() -> dict[str, Any]:
    data = Data(lambda: HardMinedSampler(labels(), seed=4), where="setup")
    return _fit(data, callbacks=[SamplerFeedback()]).as_json()


def _fabric_epochs(fabric: Fabric, loader: Any, sampler: Sampler, feedback: bool) -> Record:
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    net, optimizer = fabric.setup(net, optimizer)
    record = Record()
    for epoch in range(EPOCHS):
        for x, y, idx in loader:  # Fabric sets the sampler's epoch as each pass starts
            record.batch(epoch, idx)
            per_sample = losses(net, x, y)
            optimizer.zero_grad()
            fabric.backward(per_sample.mean())
            optimizer.step()
            if feedback:
                update_across_ranks(sampler, idx, per_sample)
        record.epoch_end(sampler)
    return record


def fabric_index_sampler() -> dict[str, Any]:
    """DeferredSampler (class-balanced from epoch 1), fabric.setup_dataloaders' defaults."""
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    sampler = DeferredSampler(labels(), switch_epoch=1, seed=5)
    loader = fabric.setup_dataloaders(DataLoader(dataset(), sampler=sampler, batch_size=BATCH))
    return _fabric_epochs(fabric, loader, sampler, feedback=False).as_json()


def fabric_feedback() -> dict[str, Any]:
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    sampler = HardMinedSampler(labels(), seed=6)
    loader = fabric.setup_dataloaders(DataLoader(dataset(), sampler=sampler, batch_size=BATCH))
    return _fabric_epochs(fabric, loader, sampler, feedback=True).as_json()


def fabric_batch_sampler() -> dict[str, Any]:
    """A batch sampler under fabric.launch(function): Fabric rebuilds it with its sharding."""
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    out: dict[str, Any] = {}

    def run(fabric: Fabric) -> None:
        sampler = FixedClassSampler(labels(), classes_per_batch=4, samples_per_class=4, seed=7)
        loader = fabric.setup_dataloaders(DataLoader(dataset(), batch_sampler=sampler))
        used = loader.batch_sampler
        out.update(_fabric_epochs(fabric, loader, used, feedback=False).as_json())
        out["rebuilt"] = used is not sampler

    fabric.launch(run)
    return out
