"""Lightning with ``samplers`` imported only inside ``train_dataloader``: this module imports
nothing of ``samplers``, and runs in ranks of their own, where nothing else has imported it."""

from __future__ import annotations

import sys
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from tests.helpers.frameworks.data import dataset, labels, losses, model


class Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = model()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, _ = batch
        return losses(self.net, x, y).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class LazyData(pl.LightningDataModule):
    """Builds a FixedClassSampler in the hook, as the docs say, but imports it there too."""

    imported_before_hook: bool | None = None

    def train_dataloader(self) -> DataLoader[Any]:
        self.imported_before_hook = "samplers" in sys.modules
        from samplers import FixedClassSampler

        sampler = FixedClassSampler(labels(), classes_per_batch=4, samples_per_class=4, seed=2)
        return DataLoader(dataset(), batch_sampler=sampler)


def batch_sampler_imported_in_the_hook() -> dict[str, Any]:
    data = LazyData()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        trainer.fit(Module(), datamodule=data)
    except ValueError as error:
        return {"error": str(error), "imported_before_hook": data.imported_before_hook}
    return {"error": None, "imported_before_hook": data.imported_before_hook}
