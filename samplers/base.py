"""The sampler protocol that every strategy inherits."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import torch
from torch.utils.data import DistributedSampler
from torch.utils.data import Sampler as TorchSampler

from samplers._checks import as_labels, check_bool, check_int
from samplers._distributions import ClassWeights, Distribution, SampleWeights
from samplers._draw import draw
from samplers._feedback import keep_in_place, restore_in_place
from samplers._frameworks import check_not_sharded_twice
from samplers._labels import LabelIndex
from samplers._memory import EpochMemory
from samplers._placement import Placement
from samplers._pool import on_pool_thread
from samplers._seeding import epoch_seed

__all__ = ["Sampler"]


class Sampler(Placement, DistributedSampler[Any]):
    r"""Base class: draws each epoch's order from the distribution a strategy declares.

    A strategy overrides :meth:`distribution` (``epoch -> ClassWeights | SampleWeights``) and,
    if it learns from training, :meth:`observe` plus the names of its state tensors in
    ``feedback_state``. Everything else is inherited and guaranteed:

    * The order is a pure function of ``(seed, epoch, feedback received)``: not of the global RNG,
      the number of DataLoader workers or the process.
    * Distributed: every rank computes the same global draw of ``num_samples`` indices and takes
      the positions ``rank, rank + world_size, ...``. Like ``DistributedSampler``, the draw is
      padded by repeating its start (``drop_last=False``) or its tail is dropped, so every rank
      gets the same length. The global draw does not depend on ``world_size``.
    * ``state_dict`` / ``load_state_dict`` hold the epoch, the position inside it and the feedback
      state (the sampler's own tensors, as ``nn.Module.state_dict`` holds the parameters); a
      sampler restored mid-epoch yields exactly the remaining items. Under a ``DataLoader`` with
      workers, pass ``state_dict(consumed=...)`` (see there).
    * ``len(sampler)`` is exactly the number of items a whole epoch yields on this rank, also
      right after a mid-epoch restore (torch's convention), when the restored iterator yields
      ``len(sampler) - position`` items and :meth:`epoch_indices` is still the whole epoch.

    Inside training frameworks (see ``docs/trainers.md``):

    * A sampler is a ``torch.utils.data.DistributedSampler``, so frameworks that replace or wrap
      any other sampler for distributed training (Lightning's Trainer and Fabric) leave it as
      it is, and it shards itself. Its ``num_samples`` is still the global count per epoch,
      not ``DistributedSampler``'s count per rank.
    * Told that its loader shards by itself (``loader_shards = True``, which
      ``samplers.integrations.accelerate.prepare`` and ``SamplerTrainerMixin`` set for
      Accelerate's prepared loaders), ``len`` and iteration give the global draw on every
      process (as with ``world_size=1``) and the loader hands each process its batches of it.
      Not told, in a process where Accelerate runs several processes, a sampler without a given
      rank and world size refuses to shard itself (it would be sharded twice).
    * Rank and world size that were not given are read from torch.distributed the first time
      the sampler is used with a process group up, so it may be built before the group exists.

    Args:
        labels: class id of every sample (a sequence or a 1-D integer tensor), ``0..C-1``.
        num_samples: indices per epoch over all ranks (default: the dataset size). Larger than
            the dataset only with ``replacement=True``.
        replacement: draw with replacement.
        seed: seed of the order.
        rank, world_size: this process's place (default: from ``torch.distributed`` when it is
            initialised, else 0 and 1).
        drop_last: drop the tail of the global draw instead of padding it to a multiple of
            ``world_size``.
        num_classes: number of classes, if some have no samples (default: ``max(labels) + 1``).
    """

    feedback_state: ClassVar[tuple[str, ...]] = ()
    #: Batch samplers set this: they yield lists of ``batch_size`` indices, and
    #: :meth:`epoch_indices` is 2-D (batches x batch_size). ``None`` for index samplers.
    batch_size: int | None = None
    #: Whether the loader reading this sampler hands each process its own share of what it
    #: reads (Accelerate's prepared loaders): then every process reads the whole global draw.
    loader_shards: bool = False

    def __init__(
        self,
        labels: Sequence[int] | torch.Tensor,
        *,
        num_samples: int | None = None,
        replacement: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        num_classes: int | None = None,
    ) -> None:
        if isinstance(labels, TorchSampler):
            raise ValueError(
                f"{type(self).__name__} got a {type(labels).__name__} where its labels go: a "
                "framework rebuilt it as type(batch_sampler)(sampler, batch_size=..., "
                "drop_last=...), which loses its settings. Lightning re-creates a batch sampler "
                "from its own arguments only if it was built inside train_dataloader (or another "
                "*_dataloader hook; Fabric: inside fabric.launch(function)) from a class that was "
                "already imported when Lightning called the hook: import samplers at the top of "
                "the module, not inside the hook, and build the sampler in the hook; or turn the "
                "framework's sampler replacement off: Trainer(use_distributed_sampler=False), "
                "fabric.setup_dataloaders(..., use_distributed_sampler=False)"
            )
        self.index = LabelIndex(as_labels(labels, num_classes), num_classes)
        dataset_size = len(self.index)
        if num_samples is None:
            num_samples = dataset_size
        check_int("num_samples", num_samples, 1)
        check_bool("replacement", replacement)
        check_bool("drop_last", drop_last)
        if not replacement and num_samples > dataset_size:
            raise ValueError(
                f"num_samples={num_samples} exceeds the dataset size {dataset_size} without "
                "replacement; set replacement=True or lower num_samples"
            )
        check_int("seed", seed)
        self.num_samples = num_samples
        self.replacement = replacement
        self.seed = seed
        self._place(rank, world_size)
        self.drop_last = drop_last
        self.epoch = 0
        self._resume_at = 0
        self._started = 0  # where the current pass over the epoch began (a restored position)
        self._live: tuple[int, Iterator[Any]] | None = None
        self._drawn: tuple[int, Distribution, torch.Tensor] | None = None
        self._memory = EpochMemory()  # what the drawn epoch leaves to the next
        self._drawn_lent = False  # whether current_distribution() handed the drawn one out

    # ------------------------------------------------------------------ strategy hooks
    def distribution(self, epoch: int) -> Distribution:
        """What to draw from in ``epoch``: ``ClassWeights`` or ``SampleWeights`` (float64)."""
        raise NotImplementedError

    def observe(self, indices: torch.Tensor, losses: torch.Tensor) -> None:
        """Feedback hook: ``indices`` (int64) and their validated per-sample ``losses`` (float64).

        Called by :meth:`update`. The default ignores feedback.
        """

    def _draw(self, distribution: Distribution, seed: int) -> torch.Tensor:
        """The global draw of one epoch (its first dimension is what ranks share)."""
        replacement = self._with_replacement(distribution)
        return draw(distribution, self.index, self.num_samples, replacement, seed)

    def _with_replacement(self, distribution: Distribution) -> bool:
        """Whether an epoch drawing from ``distribution`` draws with replacement."""
        return self.replacement

    def _prepared(self, distribution: Distribution) -> Distribution:
        """``distribution`` with the table its draws need already built (on a pool thread), in
        the memory of the last epoch's table where that fits."""
        table = self._memory.take_table()
        if self._with_replacement(distribution):
            distribution.build_table(reuse=table)
        return distribution

    def _forget_draw(self) -> None:
        """Drop the drawn epoch, leaving its memory to the next (see ``EpochMemory``)."""
        if self._drawn is not None:
            self._memory.keep(self._drawn[1], lent=self._drawn_lent)
        self._drawn, self._drawn_lent = None, False

    # ------------------------------------------------------------------ public protocol
    @property
    def labels(self) -> torch.Tensor:
        return self.index.labels

    @property
    def num_classes(self) -> int:
        return self.index.num_classes

    @property
    def class_counts(self) -> torch.Tensor:
        return self.index.counts

    def _global_units(self) -> int:
        return self.num_samples

    def __len__(self) -> int:
        return self._length(self._reader_share()[1])

    def _reader_share(self) -> tuple[int, int]:
        """(rank, world size) of the share this sampler yields: the whole draw when its loader
        shards by itself (:attr:`loader_shards`), else this rank's positions."""
        if self.loader_shards:
            return 0, 1
        placed = self._given_rank is not None and self._given_world_size is not None
        check_not_sharded_twice(type(self).__name__, placed)
        return self.rank, self.world_size

    def _length(self, world_size: int) -> int:
        units = self._global_units()
        if self.drop_last:
            return units // world_size
        return math.ceil(units / world_size)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next iteration yields (call before each epoch)."""
        check_int("epoch", epoch, 0)
        if epoch != self.epoch:
            self._forget_draw()
        self.epoch = epoch
        self._resume_at = 0
        self._started = 0
        self._live = None

    def update(
        self, indices: torch.Tensor | Sequence[int], losses: torch.Tensor | Sequence[float]
    ) -> None:
        """Feed back per-sample training losses (a no-op for strategies that ignore them).

        In distributed training pass the losses gathered from all ranks, so that every rank holds
        the same feedback state and keeps drawing the same global order.
        """
        indices = torch.as_tensor(indices).detach().reshape(-1).cpu().long()
        losses = torch.as_tensor(losses).detach().reshape(-1).cpu().double()
        if indices.numel() != losses.numel():
            raise ValueError(
                f"update: got {indices.numel()} indices but {losses.numel()} losses; pass one "
                "loss per index (reduction='none')"
            )
        if not torch.isfinite(losses).all():
            raise ValueError(
                "update: losses contain NaN or infinite values; check the training loss"
            )
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= len(self.index)):
            raise ValueError(f"update: indices must lie in [0, {len(self.index)})")
        on_pool_thread(lambda: self._observe(indices, losses))  # sums independent of threads

    def _observe(self, indices: torch.Tensor, losses: torch.Tensor) -> None:
        """:meth:`observe`, keeping each feedback tensor the same object: a strategy that
        assigns a new tensor has it copied into the old one, which a state dict taken earlier
        holds (see :meth:`state_dict`)."""
        held = [getattr(self, name) for name in self.feedback_state]
        self.observe(indices, losses)
        for name, tensor in zip(self.feedback_state, held, strict=True):
            keep_in_place(self, name, tensor)

    def current_distribution(self) -> Distribution:
        """The distribution of the current epoch (frozen when the epoch is first drawn). Its
        weights stay the caller's: they are never reused for a later epoch."""
        if self._drawn is not None:
            self._drawn_lent = True
        return self._current_distribution()

    def _current_distribution(self) -> Distribution:
        if self._drawn is not None:
            return self._drawn[1]
        return self.distribution(self.epoch)

    def target_class_shares(self) -> torch.Tensor:
        """The class shares this epoch's draw aims at (float64, sums to 1)."""
        drawn = self._drawn is not None
        distribution = self._current_distribution()  # read here, not handed out
        if isinstance(distribution, ClassWeights):
            weights = distribution.weights
        else:
            weights = torch.zeros(self.num_classes, dtype=torch.float64)
            weights.index_add_(0, self.labels, distribution.weights)
        if not drawn:  # made only to be read here: its memory is the draw's to reuse
            self._memory.keep(distribution, lent=False)
        return weights / weights.sum()

    def global_indices(self) -> torch.Tensor:
        """The global draw of the current epoch, over all ranks, before padding."""
        if self._drawn is None or self._drawn[0] != self.epoch:
            distribution = on_pool_thread(lambda: self._prepared(self.distribution(self.epoch)))
            units = self._draw(distribution, epoch_seed(self.seed, self.epoch))
            self._drawn = (self.epoch, distribution, units)
        return self._drawn[2]

    def epoch_indices(self) -> torch.Tensor:
        """This rank's indices for the current epoch as one int64 tensor (all of the epoch)."""
        return self._share(self.rank, self.world_size)

    def _share(self, rank: int, world_size: int) -> torch.Tensor:
        units = self.global_indices()
        total = self._length(world_size) * world_size
        if total > units.shape[0]:
            repeats = math.ceil(total / units.shape[0])
            units = torch.cat([units] * repeats)
        return units[rank:total:world_size]

    def __iter__(self) -> Iterator[Any]:
        units = self._share(*self._reader_share())
        if self._live is not None and self._position == self._started:
            # The last iterator was never advanced: this is a second iter() for the same pass
            # (a DataLoader with workers calls it twice as it starts), so keep its start.
            start = self._started
        else:
            start, self._resume_at = self._resume_at, 0
        self._started = start
        # A plain list iterator (C speed); the position is read off its remaining length.
        iterator = iter(units[start:].tolist())
        self._live = (len(units), iterator)
        return iterator

    @property
    def _position(self) -> int:
        """Items of the current epoch already yielded on this rank."""
        if self._live is None:
            return self._resume_at
        end, iterator = self._live
        return end - operator.length_hint(iterator)

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Epoch, position inside it and feedback state.

        Args:
            consumed: units of the current epoch the training loop has taken on this rank
                (indices, or batches for a batch sampler), counted from the start of the epoch,
                including any taken before a restore. Pass it when something reads ahead of the
                loop: a ``DataLoader`` with ``num_workers > 0`` asks the sampler for
                ``prefetch_factor * num_workers`` batches early, so what the sampler has yielded
                is more than what was trained on. With ``batch_size=B`` and ``k`` batches taken
                in this epoch: ``consumed=min(k * B, len(sampler))`` for an index sampler,
                ``consumed=k`` for a batch sampler. Default: what the sampler's iterator has
                yielded (right for a plain loop over the sampler or ``num_workers=0``, and under
                torchdata's ``StatefulDataLoader``, which asks when it hands a batch out).

        Epoch and position are values; the feedback tensors are the sampler's own, which
        :meth:`update` changes in place, as ``nn.Module.state_dict`` holds the module's own
        parameters: serialise the state (``torch.save``) when you take it, or
        ``copy.deepcopy`` it to keep it in memory. torchdata's ``StatefulDataLoader`` relies on
        this: it takes the state when it hands a batch to a worker, before the loop has trained
        on that batch and fed its losses back, and serialises it only when the loop asks for
        ``loader.state_dict()``, which then holds the feedback of that moment.
        """
        return self._state(consumed)

    def _state(self, consumed: int | None) -> dict[str, Any]:
        """:meth:`state_dict`, which strategies with parts of their own extend."""
        position = self._position
        if consumed is not None:
            check_int("consumed", consumed, 0)
            if not self._started <= consumed <= position:
                raise ValueError(
                    f"state_dict: consumed={consumed} is outside [{self._started}, {position}]: "
                    f"this pass over epoch {self.epoch} started at position {self._started} and "
                    f"the sampler has handed out {position} units so far; count the units the "
                    "loop has taken from the start of the epoch (indices, or batches for a batch "
                    "sampler), including those taken before a restore"
                )
            position = consumed
        state: dict[str, Any] = {
            "seed": self.seed,
            "epoch": self.epoch,
            "position": position,
            "feedback": {name: getattr(self, name) for name in self.feedback_state},
        }
        if self.feedback_state and self._drawn is not None:
            # The epoch's draw depends on feedback as it was when the epoch began.
            weights = self._drawn[1]
            state["epoch_distribution"] = (
                type(weights).__name__,
                weights.weights.clone(),
                weights.changes_each_epoch,  # which table drew it
            )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the next iteration yields the rest of the saved epoch."""
        if state["seed"] != self.seed:
            raise ValueError(
                f"load_state_dict: state was saved with seed={state['seed']}, this sampler has "
                f"seed={self.seed}; construct the sampler with the same seed"
            )
        self.set_epoch(state["epoch"])
        for name in self.feedback_state:
            restore_in_place(self, name, state["feedback"][name])
        self._forget_draw()
        if "epoch_distribution" in state:
            kind, weights, *table = state["epoch_distribution"]  # (states before the flag: 2)
            kinds: dict[str, type[ClassWeights] | type[SampleWeights]] = {
                "ClassWeights": ClassWeights,
                "SampleWeights": SampleWeights,
            }
            saved = kinds[kind](weights, changes_each_epoch=bool(table and table[0]))
            frozen = on_pool_thread(lambda: self._prepared(saved))
            units = self._draw(frozen, epoch_seed(self.seed, self.epoch))
            self._drawn, self._drawn_lent = (self.epoch, frozen, units), True  # the state's
        self._resume_at = self._started = state["position"]
        self._live = None
