"""What the batch samplers share: torch's ``BatchSampler`` protocol, as frameworks use it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch.utils.data import BatchSampler as TorchBatchSampler
from torch.utils.data import Sampler as TorchSampler

from samplers.base import Sampler

__all__ = ["BatchSamplerBase"]


class BatchSamplerBase(Sampler, TorchBatchSampler):
    """A strategy whose units are whole batches (lists of ``batch_size`` indices).

    It is a ``torch.utils.data.BatchSampler``, with the two things frameworks rely on:

    * ``sampler`` (the attribute) is the batch sampler itself: Lightning, Fabric and Accelerate
      set the epoch through ``batch_sampler.sampler.set_epoch(epoch)``.
    * ``sampler=`` (the argument of every batch strategy) takes the ``DistributedSampler`` that
      Lightning and Fabric pass in when they rebuild a batch sampler from the arguments it was
      built with (a batch sampler built inside a ``*_dataloader`` hook, or under
      ``fabric.launch(function)``): its ``num_replicas`` and ``rank`` become this sampler's
      world size and rank, and its own order is not used.
    """

    batch_size: int

    def _take_sharding_from(self, sampler: TorchSampler[Any] | None) -> None:
        if sampler is not None:
            self._adopt(sampler)

    @property
    def sampler(self) -> BatchSamplerBase:
        """The sampler whose ``set_epoch`` a framework calls: this one."""
        return self

    @sampler.setter
    def sampler(self, value: TorchSampler[int] | Iterable[int]) -> None:
        raise AttributeError(
            f"{type(self).__name__}.sampler is the batch sampler itself and cannot be replaced; "
            "pass a framework's DistributedSampler as sampler= when building it"
        )
