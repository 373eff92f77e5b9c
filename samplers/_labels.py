"""Labels grouped by class: who the members of each class are, found without a Python loop."""

from __future__ import annotations

from functools import partial

import torch

from samplers._pool import CHUNK, chunks, run_tasks

__all__ = ["LabelIndex", "group_by"]


class LabelIndex:
    """Labels sorted by class: the members of class ``c`` are
    ``order[offsets[c] : offsets[c] + counts[c]]``, in dataset order."""

    def __init__(self, labels: torch.Tensor, num_classes: int | None = None) -> None:
        self.labels = labels
        self.num_classes = num_classes if num_classes is not None else int(labels.max()) + 1
        self.counts = torch.bincount(labels, minlength=self.num_classes)
        self.offsets = torch.cumsum(self.counts, 0) - self.counts
        self.order = group_by(labels, self.num_classes)[0]
        self._counts_f64 = self.counts.double()

    def __len__(self) -> int:
        return self.labels.numel()

    def member(self, classes: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Dataset index of the ``positions``-th member of each class in ``classes``."""
        return torch.index_select(
            self.order, 0, torch.index_select(self.offsets, 0, classes) + positions
        )

    def uniform_members(self, classes: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """One uniformly chosen member of each class in ``classes`` (with replacement)."""
        u = torch.rand(classes.numel(), dtype=torch.float64, generator=generator)
        # floor(u * n) < n for every float64 u < 1 and integer n < 2^53: the product's exact
        # value n - n*2^-53 (at most) lies closer to n - ulp than to n, so it never rounds up.
        positions = u.mul_(torch.index_select(self._counts_f64, 0, classes)).long()
        positions += torch.index_select(self.offsets, 0, classes)
        return torch.index_select(self.order, 0, positions)


def group_by(keys: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices that sort integer ``keys`` in ``[0, num_groups)`` stably, and each group's size.

    A counting sort: each cache-sized chunk is sorted on its own in the narrowest integer dtype
    (torch sorts those far faster than int64 or a whole array) and placed by the counts of the
    chunks before it.
    """
    dtype = (
        torch.uint8 if num_groups <= 256 else torch.int16 if num_groups <= 2**15 else torch.int32
    )
    keys = keys.to(dtype)
    count = keys.numel()
    parts = chunks(count)
    per_chunk = torch.zeros(len(parts), num_groups, dtype=torch.long)

    def tally(chunk: int) -> None:
        part = keys[chunk * CHUNK : (chunk + 1) * CHUNK]
        per_chunk[chunk] = torch.bincount(part.int(), minlength=num_groups)

    run_tasks([partial(tally, chunk) for chunk in parts])
    totals = per_chunk.sum(0)
    # Where chunk j's members of group g start in the result, minus where they start in the
    # chunk's own sorted order: the shift from one to the other.
    shift = (torch.cumsum(totals, 0) - totals) + (torch.cumsum(per_chunk, 0) - per_chunk)
    shift -= torch.cumsum(per_chunk, 1) - per_chunk
    out = torch.empty(count, dtype=torch.long)

    def place(chunk: int) -> None:
        start = chunk * CHUNK
        part = keys[start : start + CHUNK]
        local = torch.argsort(part, stable=True)
        target = torch.index_select(shift[chunk], 0, torch.index_select(part, 0, local).long())
        target += torch.arange(part.numel())
        out.index_copy_(0, target, local.add_(start))

    run_tasks([partial(place, chunk) for chunk in parts])
    return out, totals
