"""A batch sampler whose every batch has an exact class composition."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from samplers._core import ClassWeights, Distribution, check_int, generator_for
from samplers.base import Sampler

__all__ = ["FixedClassSampler"]


class FixedClassSampler(Sampler):
    """Yields batches (lists of indices) of an exact class composition.

    Either ``classes_per_batch`` K and ``samples_per_class`` M (each batch: K distinct classes
    drawn uniformly, M samples of each; the role of pytorch-metric-learning's ``MPerClassSampler``),
    or ``quotas``: samples per batch for every class. An epoch has exactly ``num_batches`` batches
    (default: dataset size // batch size), shared across ranks batch by batch.

    Without ``replacement`` a batch never repeats a sample: each class is consumed in chunks from
    fresh random permutations of its members, so a class's samples are all used before any
    repeats. With ``replacement`` members are drawn independently.
    """

    def __init__(
        self,
        labels: Sequence[int] | torch.Tensor,
        *,
        classes_per_batch: int | None = None,
        samples_per_class: int | None = None,
        quotas: Sequence[int] | None = None,
        batch_size: int | None = None,
        num_batches: int | None = None,
        replacement: bool = False,
        **kwargs: Any,
    ) -> None:
        if "num_samples" in kwargs:
            raise ValueError("num_samples does not apply to fixed_class; set num_batches instead")
        # The base class's replacement flag governs whole-epoch draws; here it is per batch.
        super().__init__(labels, replacement=True, **kwargs)
        self.replacement = replacement
        counts = self.class_counts
        if quotas is not None:
            if classes_per_batch is not None or samples_per_class is not None:
                raise ValueError(
                    "give either quotas or classes_per_batch with samples_per_class, not both"
                )
            quota = torch.as_tensor(list(quotas), dtype=torch.long)
            if quota.numel() != self.num_classes:
                raise ValueError(
                    f"quotas: expected one quota per class ({self.num_classes}), got {quota.numel()}"
                )
            if (quota < 0).any() or int(quota.sum()) == 0:
                raise ValueError("quotas must be non-negative integers with a positive total")
            short = (quota > counts) if not replacement else (quota > 0) & (counts == 0)
            if short.any():
                c = int(torch.nonzero(short)[0])
                raise ValueError(
                    f"quotas: class {c} has {int(counts[c])} samples but a quota of {int(quota[c])} "
                    "per batch; lower its quota or set replacement=True"
                )
            self.quotas: torch.Tensor | None = quota
            per_batch = int(quota.sum())
        else:
            if classes_per_batch is None or samples_per_class is None:
                raise ValueError("give quotas, or both classes_per_batch and samples_per_class")
            self.classes_per_batch = check_int("classes_per_batch", classes_per_batch, 1)
            self.samples_per_class = check_int("samples_per_class", samples_per_class, 1)
            minimum = 1 if replacement else self.samples_per_class
            self.eligible = torch.nonzero(counts >= minimum).flatten()
            if self.eligible.numel() < self.classes_per_batch:
                raise ValueError(
                    f"classes_per_batch={classes_per_batch} but only {self.eligible.numel()} classes "
                    f"have at least {minimum} samples; lower classes_per_batch or samples_per_class, "
                    "or set replacement=True"
                )
            self.quotas = None
            per_batch = self.classes_per_batch * self.samples_per_class
        if batch_size is not None and batch_size != per_batch:
            raise ValueError(
                f"batch_size={batch_size} does not match the composition, which gives {per_batch} "
                "per batch; set batch_size to that or change the composition"
            )
        self.batch_size = per_batch
        if num_batches is None:
            num_batches = max(1, len(self.index) // per_batch)
        self.num_batches = check_int("num_batches", num_batches, 1)
        self.num_samples = self.num_batches * per_batch

    def _global_units(self) -> int:
        return self.num_batches

    def distribution(self, epoch: int) -> Distribution:
        if self.quotas is not None:
            return ClassWeights(self.quotas.double())
        weights = torch.zeros(self.num_classes, dtype=torch.float64)
        weights[self.eligible] = 1.0
        return ClassWeights(weights)

    def _draw(self, distribution: Distribution, seed: int) -> torch.Tensor:
        generator = generator_for(seed)
        slot_class, take = self._slots(generator)
        # Expand slots to items: item k of a slot is the k-th of its class's chunk.
        item_slot = torch.repeat_interleave(torch.arange(slot_class.numel()), take)
        item_class = slot_class[item_slot]
        if self.replacement:
            items = self.index.uniform_members(item_class, generator)
        else:
            shuffled, chunk_start = self._chunk_layout(slot_class, take, generator)
            first_item = torch.cumsum(take, 0) - take
            offset_in_slot = torch.arange(item_slot.numel()) - first_item[item_slot]
            items = self.index.member(item_class, shuffled[chunk_start[item_slot] + offset_in_slot])
        return items.view(self.num_batches, self.batch_size)

    def _slots(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Class of every (batch, class) slot in batch order, and the samples each slot takes."""
        if self.quotas is not None:
            classes = torch.nonzero(self.quotas).flatten()
            slot_class = classes.repeat(self.num_batches)
            return slot_class, self.quotas[slot_class]
        keys = torch.rand(self.num_batches, self.eligible.numel(), generator=generator)
        chosen = torch.topk(keys, self.classes_per_batch, dim=1).indices
        slot_class = self.eligible[chosen.flatten()]
        return slot_class, torch.full_like(slot_class, self.samples_per_class)

    def _chunk_layout(
        self, slot_class: torch.Tensor, take: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh permutations of each class's member positions, laid end to end, and where each
        slot's chunk starts in them; a chunk never spans two permutations."""
        counts = self.class_counts
        num_slots = slot_class.numel()
        # j: how many earlier slots the same class had (rank of the slot within its class).
        order = torch.argsort(slot_class, stable=True)
        slots_per_class = torch.bincount(slot_class, minlength=self.num_classes)
        first_slot = torch.cumsum(slots_per_class, 0) - slots_per_class
        rank_in_class = torch.empty(num_slots, dtype=torch.long)
        rank_in_class[order] = torch.arange(num_slots) - first_slot[slot_class[order]]
        # Per class: chunks per permutation, permutations needed.
        per_slot = torch.zeros(self.num_classes, dtype=torch.long)
        per_slot[slot_class] = take
        chunks_per_perm = torch.where(per_slot > 0, counts // per_slot.clamp(min=1), 1)
        perms = -(-slots_per_class // chunks_per_perm)  # ceil
        perm_class = torch.repeat_interleave(torch.arange(self.num_classes), perms)
        perm_size = counts[perm_class]
        perm_start = torch.cumsum(perm_size, 0) - perm_size
        first_perm = torch.cumsum(perms, 0) - perms
        # One sort of (permutation id + random key in [0, 0.5)) shuffles every permutation at
        # once; 0.5 keeps id + key from rounding up into the next id. Sorting keeps each
        # permutation in its own range, so an element's member position is its sorted source
        # index minus the start of the range it sits in.
        total = int(perm_size.sum())
        keys = torch.rand(total, dtype=torch.float64, generator=generator).mul_(0.5)
        keys += torch.repeat_interleave(
            torch.arange(perm_size.numel(), dtype=torch.float64), perm_size
        )
        shuffled = torch.argsort(keys, stable=True)
        del keys
        shuffled -= torch.repeat_interleave(perm_start, perm_size)
        perm_of_slot = first_perm[slot_class] + rank_in_class // chunks_per_perm[slot_class]
        start = perm_start[perm_of_slot] + (rank_in_class % chunks_per_perm[slot_class]) * take
        return shuffled, start
