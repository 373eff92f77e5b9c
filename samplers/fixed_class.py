"""A batch sampler whose every batch has an exact class composition."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch.utils.data import Sampler as TorchSampler

from samplers._batching import BatchSamplerBase
from samplers._checks import check_bool, check_int
from samplers._distributions import ClassWeights, Distribution
from samplers._draw import cycled_passes
from samplers._labels import group_by
from samplers._pool import CHUNK, run_tasks
from samplers._seeding import branch_seed, generator_for

__all__ = ["FixedClassSampler", "REPEATS"]

#: How members may repeat inside a batch; see :class:`FixedClassSampler`.
REPEATS = ("never", "small_classes", "independent")


class FixedClassSampler(BatchSamplerBase):
    """Yields batches (lists of indices) of an exact class composition.

    Either ``classes_per_batch`` K and ``samples_per_class`` M (each batch: K distinct classes
    drawn uniformly among the classes that have samples, M samples of each; the role of
    pytorch-metric-learning's ``MPerClassSampler``), or ``quotas``: samples per batch for every
    class. An epoch has exactly ``num_batches`` batches (default: dataset size // batch size),
    shared across ranks batch by batch.

    ``repeats`` says how a class's members may repeat inside a batch:

    * ``"small_classes"`` (default): only a class smaller than its quota repeats, and only its
      own members, each ``quota // size`` or one more times per batch.
    * ``"never"``: no member twice in a batch; a class smaller than its quota is a ValueError.
    * ``"independent"``: every member is drawn independently and uniformly from its class.

    Except with ``"independent"``, each class's members are consumed across the epoch's batches
    in a fresh shuffled order, reshuffled when exhausted: a class's next batches take the next
    members of that order, so every member is used before any is used again.

    ``replacement`` is the earlier spelling, kept for existing configs: ``True`` means
    ``repeats="independent"``, ``False`` means ``repeats="never"``. ``sampler`` is for
    frameworks that rebuild batch samplers (see :class:`~samplers._batching.BatchSamplerBase`).
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
        repeats: str | None = None,
        replacement: bool | None = None,
        sampler: TorchSampler[Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if "num_samples" in kwargs:
            raise ValueError("num_samples does not apply to fixed_class; set num_batches instead")
        # Whole-epoch draws with replacement in the base; repeats govern what happens per batch.
        super().__init__(labels, replacement=True, **kwargs)
        self._take_sharding_from(sampler)
        self.repeats = _resolve_repeats(repeats, replacement)
        counts = self.class_counts
        if quotas is not None:
            if classes_per_batch is not None or samples_per_class is not None:
                raise ValueError(
                    "give either quotas or classes_per_batch with samples_per_class, not both: "
                    "with quotas, set classes_per_batch and samples_per_class to None (in the "
                    "runner: sampler.classes_per_batch=null sampler.samples_per_class=null)"
                )
            quota = torch.as_tensor(list(quotas), dtype=torch.long)
            if quota.numel() != self.num_classes:
                raise ValueError(
                    f"quotas: expected one quota per class ({self.num_classes}), got {quota.numel()}"
                )
            if (quota < 0).any() or int(quota.sum()) == 0:
                raise ValueError("quotas must be non-negative integers with a positive total")
            empty = (quota > 0) & (counts == 0)
            if empty.any():
                c = int(torch.nonzero(empty)[0])
                raise ValueError(
                    f"quotas: class {c} has no samples but a quota of {int(quota[c])}; set its "
                    "quota to 0"
                )
            self._check_never(quota)
            self.quotas: torch.Tensor | None = quota
            per_batch = int(quota.sum())
        else:
            if classes_per_batch is None or samples_per_class is None:
                raise ValueError("give quotas, or both classes_per_batch and samples_per_class")
            self.classes_per_batch = check_int("classes_per_batch", classes_per_batch, 1)
            self.samples_per_class = check_int("samples_per_class", samples_per_class, 1)
            self.eligible = torch.nonzero(counts > 0).flatten()
            if self.eligible.numel() < self.classes_per_batch:
                raise ValueError(
                    f"classes_per_batch={classes_per_batch} but only {self.eligible.numel()} "
                    "classes have samples; lower classes_per_batch"
                )
            self._check_never(torch.where(counts > 0, self.samples_per_class, 0))
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

    def _check_never(self, quota: torch.Tensor) -> None:
        short = quota > self.class_counts
        if self.repeats == "never" and short.any():
            c = int(torch.nonzero(short)[0])
            raise ValueError(
                f"class {c} has {int(self.class_counts[c])} samples but a quota of "
                f"{int(quota[c])} per batch, which repeats='never' cannot fill; lower the quota "
                "(samples_per_class or quotas), or set repeats='small_classes' to repeat only "
                "inside such classes"
            )

    def _global_units(self) -> int:
        return self.num_batches

    def distribution(self, epoch: int) -> Distribution:
        if self.quotas is not None:
            return ClassWeights(self.quotas.double())
        weights = torch.zeros(self.num_classes, dtype=torch.float64)
        weights[self.eligible] = 1.0
        return ClassWeights(weights)

    def _draw(self, distribution: Distribution, seed: int) -> torch.Tensor:
        out = torch.empty(self.num_batches, self.batch_size, dtype=torch.long)
        if self.quotas is not None:
            # Every batch: each class's block of columns, in class order.
            ends = torch.cumsum(self.quotas, 0).tolist()
            tasks = [
                (self.num_batches * q, partial(self._fill_quota, out, c, ends[c] - q, q, seed))
                for c, q in enumerate(self.quotas.tolist())
                if q > 0
            ]
        else:
            slots = out.view(-1, self.samples_per_class)  # one row per (batch, class) slot
            grouped, per_class = group_by(self._chosen_classes(seed), self.num_classes)
            ends = torch.cumsum(per_class, 0).tolist()
            tasks = [
                (
                    n * self.samples_per_class,
                    partial(self._fill_slots, slots, c, grouped[ends[c] - n : ends[c]], seed),
                )
                for c, n in enumerate(per_class.tolist())
                if n > 0
            ]
        run_tasks(_batched(tasks))
        return out

    def _chosen_classes(self, seed: int) -> torch.Tensor:
        """Class of every slot, batch by batch: K distinct classes per batch, each K-subset
        equally likely. The batches are chosen in blocks of about ``CHUNK`` slots, each from
        its own generator, on the drawing pool."""
        k = self.classes_per_batch
        chosen = torch.empty(self.num_batches, k, dtype=torch.long)
        rows = max(1, CHUNK // k)

        def choose(block: int) -> None:
            part = chosen[block * rows : (block + 1) * rows]
            self._choose_into(part, generator_for(seed, block))

        run_tasks([partial(choose, block) for block in range(-(-self.num_batches // rows))])
        return self.eligible[chosen.view(-1)]

    def _choose_into(self, chosen: torch.Tensor, generator: torch.Generator) -> None:
        """Positions among the eligible classes for each row of ``chosen`` (batches, K), K
        distinct per row: Floyd's algorithm, run for all rows at once."""
        k, eligible = self.classes_per_batch, self.eligible.numel()
        for step, j in enumerate(range(eligible - k, eligible)):
            # t uniform in [0, j]; if taken, take j (not yet takeable before this step).
            u = torch.rand(chosen.shape[0], dtype=torch.float64, generator=generator)
            t = u.mul_(j + 1).long()
            taken = (chosen[:, :step] == t[:, None]).any(1)
            chosen[:, step] = torch.where(taken, j, t)

    def _members(self, c: int, slots: int, take: int, seed: int) -> torch.Tensor:
        """Dataset indices for ``slots`` slots of class ``c``, ``take`` each: (slots, take)."""
        size = int(self.class_counts[c])
        start = int(self.index.offsets[c])
        members = self.index.order[start : start + size]
        # Hashed: a class's passes are streams of its seed, which must not be another class's.
        class_seed = branch_seed(seed, c)
        if self.repeats == "independent":
            u = torch.rand(slots, take, dtype=torch.float64, generator=generator_for(class_seed))
            return members[u.mul_(size).long()]  # floor(u * size) < size, see LabelIndex
        return members[cycled_passes(size, take, slots, class_seed)]

    def _fill_quota(self, out: torch.Tensor, c: int, column: int, take: int, seed: int) -> None:
        out[:, column : column + take] = self._members(c, self.num_batches, take, seed)

    def _fill_slots(self, slots: torch.Tensor, c: int, rows: torch.Tensor, seed: int) -> None:
        slots.index_copy_(0, rows, self._members(c, rows.numel(), self.samples_per_class, seed))


def _batched(tasks: Sequence[tuple[int, Callable[[], None]]]) -> list[Callable[[], None]]:
    """Consecutive (items, task) pairs joined into tasks of at least CHUNK items each: small
    classes cost a thread hand-off each otherwise."""
    joined: list[list[Callable[[], None]]] = [[]]
    size = 0
    for items, task in tasks:
        if size >= CHUNK:
            joined.append([])
            size = 0
        joined[-1].append(task)
        size += items
    return [partial(_run_all, group) for group in joined]


def _run_all(tasks: list[Callable[[], None]]) -> None:
    for task in tasks:
        task()


def _resolve_repeats(repeats: str | None, replacement: bool | None) -> str:
    if replacement is not None:
        check_bool("replacement", replacement)
        if repeats is not None:
            raise ValueError(
                f"give repeats or replacement, not both (got repeats={repeats!r}, "
                f"replacement={replacement!r}); replacement is the earlier spelling of repeats"
            )
        return "independent" if replacement else "never"
    if repeats is None:
        return "small_classes"
    if repeats not in REPEATS:
        raise ValueError(f"repeats={repeats!r} is unknown; choose one of {REPEATS}")
    return repeats
