"""A batch sampler whose every batch takes fixed shares from several sources."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch.utils.data import Sampler as TorchSampler

from samplers._batching import BatchSamplerBase
from samplers._checks import check_int, check_number
from samplers._distributions import ClassWeights, Distribution
from samplers._draw import cycled_passes
from samplers._pool import in_background, on_pool_thread
from samplers._seeding import branch_seed, epoch_seed
from samplers.base import Sampler

__all__ = ["MixtureSampler"]

Component = Callable[..., Sampler] | Sequence[int] | torch.Tensor


class MixtureSampler(BatchSamplerBase):
    """Yields batches of which a fixed number of items comes from each component.

    Every batch holds ``counts[c]`` items of component ``c``, component 0's first, then
    component 1's, and so on: e.g. 70% instance-balanced plus 30% class-balanced draws, or the
    current task's data plus a replay memory at a fixed replay ratio (the replay sampler of
    continual learning, mixed inside every batch instead of chained after the data). An epoch
    has exactly ``num_batches`` batches (default: dataset size // batch size), shared across
    ranks batch by batch.

    A component is either

    * a strategy: a callable ``(labels, **kwargs) -> Sampler``, such as a sampler class or a
      ``functools.partial`` of one with its parameters (in Hydra: ``_partial_: true``). The
      mixture builds it with the ``num_samples`` it needs per epoch, a seed derived from its
      own and a single rank; it receives every :meth:`update`. Batch samplers cannot be
      components.
    * an index pool: a sequence or 1-D tensor of dataset indices, read in fresh shuffled passes
      (every pool member once per pass), with no member twice in a batch unless the pool is
      smaller than its count per batch.

    Args:
        components: two or more components (one is allowed, though it mixes nothing).
        shares: one positive share per component; they are normalised and turned into counts
            per batch that add up to ``batch_size`` by largest remainder (ties to the earlier
            component), so ``shares=[0.7, 0.3]`` with ``batch_size=10`` gives 7 and 3 exactly.
        batch_size: items per batch.
        num_batches: batches per epoch (default: dataset size // batch_size, at least 1).
        sampler: for frameworks that rebuild batch samplers (see
            :class:`~samplers._batching.BatchSamplerBase`).
    """

    def __init__(
        self,
        labels: Sequence[int] | torch.Tensor,
        *,
        components: Sequence[Component],
        shares: Sequence[float],
        batch_size: int,
        num_batches: int | None = None,
        sampler: TorchSampler[Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if "num_samples" in kwargs:
            raise ValueError("num_samples does not apply to mixture; set num_batches instead")
        super().__init__(labels, replacement=True, **kwargs)
        self._take_sharding_from(sampler)
        components, shares = list(components), list(shares)
        if not components or len(shares) != len(components):
            raise ValueError(
                f"give one share per component: got {len(components)} components and "
                f"{len(shares)} shares"
            )
        weights = [check_number(f"shares[{i}]", s) for i, s in enumerate(shares)]
        if min(weights) <= 0:
            raise ValueError(f"shares must all be > 0 (drop a component instead), got {shares}")
        self.batch_size = check_int("batch_size", batch_size)
        if self.batch_size < len(components):
            raise ValueError(
                f"batch_size={batch_size} is smaller than the {len(components)} components; "
                "every component needs at least one item per batch"
            )
        self.counts = _largest_remainder(weights, self.batch_size)
        if min(self.counts) == 0:
            raise ValueError(
                f"shares={shares} with batch_size={batch_size} give counts {self.counts}: a "
                "component gets no item per batch; raise its share or the batch size"
            )
        if num_batches is None:
            num_batches = max(1, len(self.index) // self.batch_size)
        self.num_batches = check_int("num_batches", num_batches, 1)
        self.num_samples = self.num_batches * self.batch_size
        # Strategies are built here; pools stay index tensors.
        self.components: list[Sampler | torch.Tensor] = [
            self._build(i, component) for i, component in enumerate(components)
        ]

    def _build(self, i: int, component: Component) -> Sampler | torch.Tensor:
        if isinstance(component, Sampler):
            raise ValueError(
                f"components[{i}] is a {type(component).__name__} instance; pass its class or a "
                "functools.partial of it (Hydra: _partial_: true): the mixture sets its "
                "num_samples, seed and rank"
            )
        if callable(component):
            built = component(
                self.labels,
                num_samples=self.num_batches * self.counts[i],
                # A negative "epoch" gives seeds that no epoch of this mixture uses.
                seed=epoch_seed(self.seed, -1 - i),
                rank=0,
                world_size=1,
                num_classes=self.num_classes,
            )
            if built.batch_size is not None:
                raise ValueError(
                    f"components[{i}] is a batch sampler ({type(built).__name__}); a mixture "
                    "takes index samplers and index pools"
                )
            return built
        pool = torch.as_tensor(component).reshape(-1)
        if pool.numel() == 0 or pool.is_floating_point() or pool.dtype == torch.bool:
            raise ValueError(
                f"components[{i}]: an index pool must be a non-empty sequence of integer dataset "
                "indices (or a sampler class / functools.partial)"
            )
        pool = pool.long()
        if int(pool.min()) < 0 or int(pool.max()) >= len(self.index):
            raise ValueError(
                f"components[{i}]: pool indices must lie in [0, {len(self.index)}), the dataset"
            )
        return pool

    def _global_units(self) -> int:
        return self.num_batches

    def distribution(self, epoch: int) -> Distribution:
        mixed = torch.zeros(self.num_classes, dtype=torch.float64)
        for count, component in zip(self.counts, self.components, strict=True):
            if isinstance(component, Sampler):
                component.set_epoch(epoch)
                shares = component.target_class_shares()
            else:
                shares = torch.bincount(self.labels[component], minlength=self.num_classes)
                shares = shares.double() / component.numel()
            mixed += count / self.batch_size * shares
        return ClassWeights(mixed)

    def _draw(self, distribution: Distribution, seed: int) -> torch.Tensor:
        # The components are drawn at the same time: the first ones on pool threads, the last
        # one from here, its chunks on the other pool threads. One after the other, a part
        # drawn in one piece (a shuffle without replacement, a pool's passes) would leave all
        # pool threads but one idle.
        parts = [partial(self._part, i, seed) for i in range(len(self.components))]
        waits = [in_background(part) for part in parts[:-1]]
        last = parts[-1]()
        return torch.cat([wait() for wait in waits] + [last], dim=1)

    def _part(self, i: int, seed: int) -> torch.Tensor:
        """Component ``i``'s items of every batch of the epoch, shape (num_batches, counts[i])."""
        count, component = self.counts[i], self.components[i]
        if isinstance(component, Sampler):
            component.set_epoch(self.epoch)
            return component.global_indices().view(self.num_batches, count)
        # Hashed: a pool's passes are streams of its seed, which must not be another pool's.
        size, pass_seed = component.numel(), branch_seed(seed, i)
        positions = on_pool_thread(partial(cycled_passes, size, count, self.num_batches, pass_seed))
        return component[positions]

    def observe(self, indices: torch.Tensor, losses: torch.Tensor) -> None:
        for component in self.components:
            if isinstance(component, Sampler):
                component._observe(indices, losses)

    def _state(self, consumed: int | None) -> dict[str, Any]:
        state = super()._state(consumed)
        state["components"] = [
            c._state(None) if isinstance(c, Sampler) else None for c in self.components
        ]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Components first: restoring the mixture's epoch must find their frozen draws.
        for component, saved in zip(self.components, state["components"], strict=True):
            if isinstance(component, Sampler):
                component.load_state_dict(saved)
        super().load_state_dict(state)


def _largest_remainder(weights: list[float], total: int) -> list[int]:
    """Integer counts proportional to ``weights`` that add up to ``total``."""
    exact = [w / sum(weights) * total for w in weights]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts
