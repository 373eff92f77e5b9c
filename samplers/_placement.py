"""A sampler's place among the ranks: given, or read from torch.distributed once it is up."""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["Placement"]


def _initialised() -> bool:
    return dist.is_available() and dist.is_initialized()


def _check_world_size(world_size: object) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    return world_size


def _check_rank(rank: object, world_size: int) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in [0, world_size={world_size}), got {rank!r}")
    return rank


class Placement:
    """``rank`` and ``world_size``, each either given or read from torch.distributed.

    What was not given comes from the process group the first time the sampler is used while
    one exists, and is kept from then on (also after the group is destroyed). A sampler built
    before the group exists (at the top of a script, in a LightningDataModule's ``__init__``,
    before ``Accelerator()``) is rank 0 of 1 until then, and shards once the group is up.
    ``num_replicas`` is ``world_size`` under the name ``DistributedSampler`` gives it.
    """

    _given_rank: int | None
    _given_world_size: int | None
    #: (rank, world size) of the process group, as first seen.
    _from_group: tuple[int, int] | None = None

    def _place(self, rank: int | None, world_size: int | None) -> None:
        """Keep what was given, after checking it against what torch.distributed says now."""
        if world_size is not None:
            _check_world_size(world_size)
        _check_rank(self._live_rank(rank), self._live_world_size(world_size))
        self._given_rank, self._given_world_size = rank, world_size

    def _adopt(self, sampler: object) -> None:
        """Take rank and world size from a ``DistributedSampler`` a framework hands in."""
        replicas, rank = getattr(sampler, "num_replicas", None), getattr(sampler, "rank", None)
        if not isinstance(replicas, int) or not isinstance(rank, int):
            raise ValueError(
                f"sampler={type(sampler).__name__}: sampler= takes the DistributedSampler that a "
                "framework passes in when it rebuilds a batch sampler (its num_replicas and rank "
                "are adopted); to choose this process's share yourself pass rank= and world_size="
            )
        for name, given, offered in (
            ("world_size", self._given_world_size, replicas),
            ("rank", self._given_rank, rank),
        ):
            if given is not None and given != offered:
                raise ValueError(
                    f"{name}={given} was given, but the framework's DistributedSampler has "
                    f"{offered}; leave {name} unset to follow the framework"
                )
        self._place(rank, replicas)

    def _group(self) -> tuple[int, int]:
        if self._from_group is None:
            if not _initialised():
                return 0, 1
            self._from_group = (dist.get_rank(), dist.get_world_size())
        return self._from_group

    def _live_world_size(self, given: int | None) -> int:
        return given if given is not None else self._group()[1]

    def _live_rank(self, given: int | None) -> int:
        return given if given is not None else self._group()[0]

    @property
    def world_size(self) -> int:
        """Number of ranks sharing each epoch's draw."""
        return self._live_world_size(self._given_world_size)

    @world_size.setter
    def world_size(self, value: int) -> None:
        self._place(self._given_rank, value)

    @property
    def rank(self) -> int:
        """This process's rank: it takes the positions ``rank, rank + world_size, ...``."""
        world_size = self.world_size
        return _check_rank(self._live_rank(self._given_rank), world_size)

    @rank.setter
    def rank(self, value: int) -> None:
        self._place(value, self._given_world_size)

    @property
    def num_replicas(self) -> int:
        """``world_size``, under ``DistributedSampler``'s name."""
        return self.world_size

    @num_replicas.setter
    def num_replicas(self, value: int) -> None:
        self.world_size = value
