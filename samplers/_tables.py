"""Tables that draw items in proportion to float64 weights: alias (fastest draws) and guide
(cheapest build)."""

from __future__ import annotations

from functools import partial

import torch

from samplers._pool import CHUNK, run_tasks

__all__ = ["AliasTable", "GuideTable"]

#: Steps that the draws behind their guide's item take as a subset, before a binary search finds
#: the rest (a bucket can hold many item ends when weights are skewed).
_SUBSET_STEPS = 2


class AliasTable:
    """Walker's alias table over K items: O(1) per draw, exact up to float64 rounding.

    Built without a Python loop over items: with weights scaled to mean 1, light items (< 1) and
    heavy items are swept in index order, so each light bucket's deficit comes from the heavy
    item whose cumulative excess covers it, and each heavy item, once its residual drops below
    1, takes the rest of its bucket from the next heavy item. Both assignments are one
    ``searchsorted`` over the cumulative deficits and excesses.
    """

    def __init__(self, weights: torch.Tensor) -> None:
        k = weights.numel()
        scaled = weights.double() * (k / weights.sum(dtype=torch.float64))
        self.keep = torch.ones(k, dtype=torch.float64)
        self.alias = torch.arange(k)
        light = torch.nonzero(scaled < 1.0).flatten()
        heavy = torch.nonzero(scaled >= 1.0).flatten()
        if light.numel() and heavy.numel():
            light_scaled = torch.index_select(scaled, 0, light)
            deficit = torch.cumsum(1.0 - light_scaled, 0)
            excess = torch.cumsum(torch.index_select(scaled, 0, heavy) - 1.0, 0)
            last = heavy.numel() - 1
            # Light i is filled by the first heavy j whose cumulative excess reaches D_{i-1}.
            donor = torch.searchsorted(excess, deficit - (1.0 - light_scaled)).clamp_(max=last)
            self.keep.index_copy_(0, light, light_scaled)
            self.alias.index_copy_(0, light, torch.index_select(heavy, 0, donor))
            # Heavy j turns light at the first light with D_i > E_j; it keeps 1 + E_j - D_i and
            # takes the rest of its bucket from heavy j + 1. The last heavy keeps a whole bucket.
            turn = torch.searchsorted(deficit[:-1], excess[:-1], right=True)
            residual = 1.0 + excess[:-1] - torch.index_select(deficit, 0, turn)
            self.keep.index_copy_(0, heavy[:-1], residual.clamp_(0.0, 1.0))
            self.alias.index_copy_(0, heavy[:-1], heavy[1:])

    def sample(self, count: int, generator: torch.Generator) -> torch.Tensor:
        bucket = torch.randint(0, self.keep.numel(), (count,), generator=generator)
        u = torch.rand(count, dtype=torch.float64, generator=generator)
        stays = u < torch.index_select(self.keep, 0, bucket)
        return torch.where(stays, bucket, torch.index_select(self.alias, 0, bucket))


class GuideTable:
    """Inverse-CDF lookup over K items with a guide table (Chen & Asau 1974): built in O(K),
    about one lookup per draw, exact up to float64 rounding, in 16 bytes per item (24 from 2^31
    items on, where the guide holds int64).

    The cumulative weights are scaled to ``[0, B)`` with ``B = max(2K, 4096)`` buckets;
    ``guide[j]`` is the item that covers point ``j``. A draw ``u`` starts at
    ``guide[floor(u)]``; a bucket holds half an item end on average, so about three draws in
    four are settled by that one read and one comparison, the rest step forward past the item
    ends at or below ``u`` as a subset (at most ``_SUBSET_STEPS`` steps), and the rare rest is
    a binary search. The build is a few passes in ``CHUNK``-sized pieces on the drawing pool,
    several times cheaper than an alias table's, so weights that change every epoch
    (hard_mined) use it. The cumulative sums are rounded chunk by chunk (each chunk's sum
    started from the earlier chunks' total), so the table does not depend on the thread count.
    """

    ends: torch.Tensor  #: item i covers [ends[i - 1], ends[i]) (float64, scaled to the buckets)
    guide: torch.Tensor  #: guide[j]: the item covering point j (int32 below 2^31 items)

    def __init__(self, weights: torch.Tensor, reuse: GuideTable | None = None) -> None:
        """``reuse``: a table that nothing draws from any more, whose tensors this one overwrites
        where their sizes match. Fresh memory costs a page fault on its first touch of each
        page: for a table rebuilt every epoch, about as long as the build's own arithmetic."""
        k = weights.numel()
        # Twice as many buckets as items: a quarter of the draws step (one bucket per item: one
        # in two, and a step for every draw costs a second full pass of random reads).
        buckets = max(2 * k, 1 << 12)
        starts = range(0, k, CHUNK)
        self.ends = _recycled(reuse.ends if reuse else None, k, torch.float64)

        def chunk_sums(c: int) -> None:
            part = slice(starts[c], starts[c] + CHUNK)
            torch.cumsum(weights[part], 0, dtype=torch.float64, out=self.ends[part])

        run_tasks([partial(chunk_sums, c) for c in range(len(starts))])
        chunk_ends = torch.tensor([min(start + CHUNK, k) - 1 for start in starts])
        before = torch.cumsum(self.ends[chunk_ends], 0)
        offsets = torch.cat([torch.zeros(1, dtype=torch.float64), before[:-1]])
        scale = buckets / float(before[-1])
        # guide[j] = number of items that end at or before j = the item covering j; zero-weight
        # items end where their predecessor does and are stepped over. Item i ends at point
        # ceil(ends[i]); a chunk fills the guide from its first item's end point up to the next
        # chunk's, where no other chunk's items end, counting only its own items. Those points
        # come first, by the very operations that scale each chunk below.
        firsts = self.ends[list(starts)].add_(offsets).mul_(scale)
        bounds = torch.ceil(firsts).long().clamp_(max=buckets + 1).tolist() + [buckets + 1]
        dtype = torch.int32 if k < 2**31 else torch.long
        self.guide = _recycled(reuse.guide if reuse else None, buckets + 1, dtype)
        self.guide[: bounds[0]] = 0

        def scale_and_count(c: int) -> None:
            # Each chunk's sums continue from the last end of the chunk before, as added here:
            # the ends rise across chunk borders too (adding a weight >= 0 never rounds below).
            part = self.ends[starts[c] : starts[c] + CHUNK].add_(float(offsets[c])).mul_(scale)
            low, high = bounds[c], bounds[c + 1]
            if high > low:
                ends_at = torch.ceil(part).long().clamp_(max=buckets + 1).sub_(low)
                counts = torch.bincount(ends_at, minlength=high - low + 1)[: high - low]
                self.guide[low:high] = counts.cumsum_(0).add_(starts[c])

        run_tasks([partial(scale_and_count, c) for c in range(len(starts))])
        self.total = float(self.ends[-1])

    def lookup(self, u: torch.Tensor) -> torch.Tensor:
        """The item covering each point ``u`` of ``[0, total)`` (float64).

        No clamp is needed: for ``u < total`` the guide never points past the item that covers
        ``u``, and the last item's end (the total) is above every ``u``, so no draw steps past it.
        """
        item = torch.index_select(self.guide, 0, u.long()).long()
        # Stepping only the draws still behind their item touches a quarter of the table where
        # a step for every draw touches all of it (the lookup is bound by those random reads).
        behind = torch.nonzero(torch.index_select(self.ends, 0, item) <= u).flatten()
        for _ in range(_SUBSET_STEPS):
            if not behind.numel():
                break
            ahead = torch.index_select(item, 0, behind).add_(1)
            further = torch.index_select(self.ends, 0, ahead) <= torch.index_select(u, 0, behind)
            item.index_copy_(0, behind, ahead)
            behind = behind[further]
        if behind.numel():
            found = torch.searchsorted(self.ends, torch.index_select(u, 0, behind), right=True)
            item.index_copy_(0, behind, found)
        return item

    def sample(self, count: int, generator: torch.Generator) -> torch.Tensor:
        # torch's float64 uniforms are multiples of 2^-53 below 1, and (1 - 2^-53) * total
        # rounds below the total for every total: each point lies in [0, total).
        u = torch.rand(count, dtype=torch.float64, generator=generator).mul_(self.total)
        return self.lookup(u)


def _recycled(tensor: torch.Tensor | None, size: int, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` if it holds ``size`` items of ``dtype``, else a new uninitialised tensor."""
    if tensor is not None and tensor.numel() == size and tensor.dtype == dtype:
        return tensor
    return torch.empty(size, dtype=dtype)
