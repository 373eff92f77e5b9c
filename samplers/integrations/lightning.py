"""Lightning: a callback that feeds every rank's per-sample losses back to the sampler.

Imports ``lightning``; ``pip install 'samplerlab[lightning]'``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from samplers.base import Sampler
from samplers.integrations import find_sampler, update_across_ranks

__all__ = ["SamplerFeedback"]


def _last_element(batch: Any) -> torch.Tensor:
    if isinstance(batch, Mapping) and "index" in batch:
        return torch.as_tensor(batch["index"])
    if isinstance(batch, (list, tuple)) and batch:
        return torch.as_tensor(batch[-1])
    raise ValueError(
        "SamplerFeedback: cannot find the batch's dataset indices; put them last in each batch "
        "(e.g. TensorDataset(x, y, torch.arange(len(y)))), under the key 'index', or pass "
        "indices=lambda batch: ..."
    )


class SamplerFeedback(Callback):
    """After every training batch, gathers the batch's dataset indices and per-sample losses
    from all ranks and calls the train loader's sampler's ``update`` with them.

    ``training_step`` returns a dict with ``"loss"`` (what Lightning optimises) and ``losses``
    (key ``losses_key``): the per-sample losses, ``reduction="none"``::

        losses = F.cross_entropy(self(x), y, reduction="none")
        return {"loss": losses.mean(), "losses": losses}

    The indices are the batch's last element, or its ``"index"`` entry for dict batches, or
    what ``indices(batch)`` returns. The sampler is found in ``trainer.train_dataloader`` (the
    loader Lightning actually iterates: a batch sampler it rebuilt is a copy of yours), unless
    ``sampler`` is given. Strategies that ignore feedback cost nothing.
    """

    def __init__(
        self,
        losses_key: str = "losses",
        indices: Callable[[Any], torch.Tensor] | None = None,
        sampler: Sampler | None = None,
    ) -> None:
        self.losses_key = losses_key
        self.indices = indices or _last_element
        self.sampler = sampler

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if not isinstance(outputs, Mapping) or self.losses_key not in outputs:
            raise ValueError(
                f"SamplerFeedback: training_step must return a dict with {self.losses_key!r}, "
                "the per-sample losses (reduction='none'), beside 'loss'"
            )
        sampler = self.sampler or find_sampler(trainer.train_dataloader)
        update_across_ranks(sampler, self.indices(batch), outputs[self.losses_key])
