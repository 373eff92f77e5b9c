"""torchdata's StatefulDataLoader with workers: a checkpoint mid-epoch, with feedback, resumes
exactly as if never stopped."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from samplers import HardMinedSampler
from samplers.integrations import update_across_ranks
from tests.helpers.frameworks.data import BATCH, EPOCHS, Record, dataset, labels, losses, model

STOP_EPOCH, STOP_AFTER = 1, 5  # the checkpoint: after 5 batches of epoch 1


def _parts() -> tuple[HardMinedSampler, StatefulDataLoader[Any], torch.nn.Module]:
    sampler = HardMinedSampler(labels(), seed=11)
    loader = StatefulDataLoader(dataset(), sampler=sampler, batch_size=BATCH, num_workers=2)
    return sampler, loader, model()


def _train(
    sampler: HardMinedSampler,
    loader: StatefulDataLoader[Any],
    net: torch.nn.Module,
    record: Record,
    epochs: range,
    stop: Path | None = None,
) -> None:
    """The plain loop: losses fed back (from every rank) after each batch; with ``stop``, save
    the loader's state there after ``STOP_AFTER`` batches of ``STOP_EPOCH`` and return."""
    for epoch in epochs:
        sampler.set_epoch(epoch)
        for step, (x, y, idx) in enumerate(loader, start=1):
            record.batch(epoch, idx)
            with torch.no_grad():  # the model's losses only: the data path is under test
                update_across_ranks(sampler, idx, losses(net, x, y))
            if stop is not None and (epoch, step) == (STOP_EPOCH, STOP_AFTER):
                torch.save({"loader": loader.state_dict(), "net": net.state_dict()}, stop)
                return
        record.epoch_end(sampler)


def resume_with_feedback() -> dict[str, Any]:
    whole = Record()
    _train(*_parts(), whole, range(EPOCHS))
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = Path(folder) / "checkpoint.pt"
        first = Record()
        _train(*_parts(), first, range(EPOCHS), stop=checkpoint)
        sampler, loader, net = _parts()  # as a new process would build them
        saved = torch.load(checkpoint, weights_only=True)
        loader.load_state_dict(saved["loader"])
        net.load_state_dict(saved["net"])
        resumed = Record()
        resumed.epochs = [[] for _ in range(STOP_EPOCH)]
        resumed.batches = [[] for _ in range(STOP_EPOCH)]
        _train(sampler, loader, net, resumed, range(STOP_EPOCH, EPOCHS))
    return {
        "whole": whole.as_json(),
        "first": first.as_json(),
        "resumed": resumed.as_json(),
    }
