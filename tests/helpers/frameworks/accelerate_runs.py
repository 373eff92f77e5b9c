"""Accelerate's prepared loaders, with their defaults, prepared as docs/trainers.md shows
(``samplers.integrations.accelerate.prepare``), and plain ``accelerator.prepare`` refused."""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from torch.utils.data import DataLoader

from samplers import FixedClassSampler, HardMinedSampler, ProgressiveSampler, Sampler
from samplers.integrations import update_across_ranks
from samplers.integrations.accelerate import prepare
from tests.helpers.frameworks.data import BATCH, EPOCHS, Record, dataset, labels, losses, model


def _epochs(accelerator: Accelerator, loader: Any, sampler: Sampler, feedback: bool) -> Record:
    net, optimizer = accelerator.prepare(model(), torch.optim.SGD(model().parameters(), lr=0.1))
    record = Record()
    record.extra["len"] = len(loader)
    for epoch in range(EPOCHS):
        for x, y, idx in loader:  # the prepared loader sets the sampler's epoch itself
            record.batch(epoch, idx)
            per_sample = losses(net, x, y)
            optimizer.zero_grad()
            accelerator.backward(per_sample.mean())
            optimizer.step()
            if feedback:
                update_across_ranks(sampler, idx, per_sample)
        record.epoch_end(sampler)
    return record


def _loader(sampler: Sampler) -> DataLoader[Any]:
    if sampler.batch_size is not None:
        return DataLoader(dataset(), batch_sampler=sampler)
    return DataLoader(dataset(), sampler=sampler, batch_size=BATCH)


def _run(sampler: Sampler, feedback: bool = False, dispatch: bool = False) -> dict[str, Any]:
    accelerator = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=dispatch)
    )
    loader = prepare(accelerator, _loader(sampler))
    return _epochs(accelerator, loader, sampler, feedback).as_json()


def index_sampler() -> dict[str, Any]:
    """ProgressiveSampler built before Accelerator() (and before the process group)."""
    return _run(ProgressiveSampler(labels(), total_epochs=EPOCHS, seed=8))


def batch_sampler() -> dict[str, Any]:
    return _run(FixedClassSampler(labels(), classes_per_batch=4, samples_per_class=4, seed=9))


def feedback() -> dict[str, Any]:
    return _run(HardMinedSampler(labels(), seed=10), feedback=True)


def dispatched() -> dict[str, Any]:
    """dispatch_batches=True: process 0 reads the loader and deals the batches out."""
    return _run(ProgressiveSampler(labels(), total_epochs=EPOCHS, seed=14), dispatch=True)


def plain_prepare() -> dict[str, Any]:
    """accelerator.prepare itself: the sampler was not told, and refuses to be sharded twice."""
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(_loader(ProgressiveSampler(labels(), total_epochs=EPOCHS)))
    try:
        next(iter(loader))
    except ValueError as error:
        return {"error": str(error)}
    return {"error": None}
