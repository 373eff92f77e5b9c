"""The one vectorized drawing core that every strategy shares.

A strategy describes an epoch as a :class:`ClassWeights` or a :class:`SampleWeights`; :func:`draw`
turns that into an index tensor. Nothing here loops over samples in Python, every probability or
cumulative table is float64 (float32 tables starve items at 10^7 samples), and nothing calls
``torch.multinomial`` (capped at 2^24 categories).
"""

from __future__ import annotations

import torch

from samplers._distributions import ClassWeights, Distribution, SampleWeights
from samplers._labels import LabelIndex
from samplers._pool import in_chunks, on_pool_thread
from samplers._seeding import generator_for
from samplers._shuffle import permutation

__all__ = ["cycled_passes", "draw"]


#: Below this size a class's passes are shuffled together, by sorting random keys row by row;
#: above it one ``randperm`` per pass is cheaper than the sort.
_ROW_SORT_MAX = 1024


def cycled_passes(size: int, take: int, slots: int, seed: int) -> torch.Tensor:
    """Positions in ``[0, size)`` for ``slots`` slots of ``take`` each, shape (slots, take).

    The positions are read in fresh shuffled passes, one pass every ``ceil(size / take)``
    slots. When ``take`` does not divide ``size``, a pass's last slot is completed with the
    first positions of the same pass, so every position appears in every pass and, when
    ``take <= size``, no slot holds a position twice. With ``take > size`` each slot holds
    every position ``take // size`` or one more times.
    """
    per_pass = -(-size // take) * take  # positions a pass hands out, its own start repeated
    needed = slots * take
    passes = -(-needed // per_pass)
    reps = -(-per_pass // size)
    if passes > 1 and size <= _ROW_SORT_MAX:
        keys = torch.rand(passes, size, dtype=torch.float64, generator=generator_for(seed))
        perms = torch.argsort(keys, dim=1, stable=True)
        return perms.repeat(1, reps)[:, :per_pass].reshape(-1)[:needed].view(slots, take)
    if passes == 1 and reps == 1:  # part of one pass: no copy
        return permutation(size, seed, count=needed).view(slots, take)
    stream = torch.empty(needed, dtype=torch.long)
    for p, start in enumerate(range(0, needed, per_pass)):
        part = stream[start : start + per_pass]
        perm = permutation(size, seed, p)
        if reps > 1:
            perm = perm.repeat(reps)
        part.copy_(perm[: part.numel()])
    return stream.view(slots, take)


def draw(
    distribution: Distribution,
    index: LabelIndex,
    num_samples: int,
    replacement: bool,
    seed: int,
) -> torch.Tensor:
    """Draw ``num_samples`` dataset indices (int64) from ``distribution``, determined by ``seed``.

    With replacement: an :class:`AliasTable` (or, for weights new every epoch, a
    :class:`GuideTable`) over classes (then a uniform member of the class) or over samples;
    O(num_samples) after the table, built once for fixed weights. Without replacement: a
    weighted random order (Efraimidis-Spirakis exponential keys), or, when all samples weigh the
    same, a uniformly random permutation (:func:`~samplers._shuffle.permutation`).
    """
    if replacement:
        table = distribution.table
        if isinstance(distribution, SampleWeights):
            return in_chunks(num_samples, seed, table.sample)
        return in_chunks(
            num_samples, seed, lambda n, g: index.uniform_members(table.sample(n, g), g)
        )
    if _weighs_evenly(distribution, index):
        # From this thread: a large permutation runs in chunks on the pool.
        return permutation(len(index), seed, count=num_samples)
    return on_pool_thread(lambda: _weighted_order(distribution, index, num_samples, seed))


def _weighs_evenly(distribution: Distribution, index: LabelIndex) -> bool:
    """Whether every sample has the same probability (exact comparisons: no thread count
    changes the answer)."""
    if isinstance(distribution, ClassWeights):
        per_member = distribution.weights / index.counts.clamp(min=1)
        present = per_member[index.counts > 0]
        return bool((present == present[0]).all())  # without spreading over N samples
    return bool((distribution.weights == distribution.weights[0]).all())


def _weighted_order(
    distribution: Distribution, index: LabelIndex, num_samples: int, seed: int
) -> torch.Tensor:
    weights = distribution.weights
    if isinstance(distribution, ClassWeights):  # each class's weight spread over its members
        weights = (weights / index.counts.clamp(min=1))[index.labels]
    keys = torch.empty(weights.numel(), dtype=torch.float64).exponential_(
        generator=generator_for(seed)
    )
    keys /= weights  # zero weight -> infinite key -> never among the first num_samples
    if num_samples * 4 < weights.numel():
        return torch.topk(keys, num_samples, largest=False, sorted=True).indices
    return torch.argsort(keys)[:num_samples]
