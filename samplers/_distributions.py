"""What a strategy draws from in an epoch: weights per class or per sample, with their table."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from samplers._tables import AliasTable, GuideTable

__all__ = ["ALIAS_MAX", "ClassWeights", "Distribution", "SampleWeights"]


#: Above this many items the table is a :class:`GuideTable`, for memory (see ``_Weights``).
ALIAS_MAX = 1 << 24


@dataclass(frozen=True)
class _Weights:
    weights: torch.Tensor
    #: Set by strategies whose weights are new every epoch (hard_mined): their table is built
    #: every epoch, so the cheaper build wins over the cheaper draw.
    changes_each_epoch: bool = False

    @cached_property
    def table(self) -> AliasTable | GuideTable:
        """Built on first use and kept: a strategy that returns the same object every epoch
        (fixed weights) builds its table once. An alias table draws fastest (no search at
        all); a guide table builds several times faster and in 16 bytes per item, where an
        alias table's build holds several temporaries as large as the weights (4 GB at 10^8).

        A table built for one epoch (``changes_each_epoch``) is lent: once the sampler moves on
        to the next epoch it builds that epoch's table in this one's memory, and this
        distribution builds a new table if asked again. Hold the distribution, not its table."""
        return self._new_table()

    def _new_table(self, reuse: GuideTable | None = None) -> AliasTable | GuideTable:
        if self.changes_each_epoch or self.weights.numel() > ALIAS_MAX:
            return GuideTable(self.weights, reuse)
        return AliasTable(self.weights)

    def build_table(self, reuse: GuideTable | None = None) -> None:
        """Build :attr:`table` now, unless built already, in the memory of ``reuse`` where it
        fits: a table given up by :meth:`release_table`."""
        if "table" not in self.__dict__:  # where cached_property keeps it
            self.__dict__["table"] = self._new_table(reuse)

    def release_table(self) -> GuideTable | None:
        """Give up a table built for one epoch, once nothing draws from it, so that the next
        epoch's table can be built in its memory; asked again, this builds a new one."""
        table = self.__dict__.get("table")
        if not self.changes_each_epoch or not isinstance(table, GuideTable):
            return None
        del self.__dict__["table"]
        return table


class ClassWeights(_Weights):
    """Draw class ``c`` with probability ``weights[c] / weights.sum()``, then a uniform member of it.

    ``weights`` is a float64 tensor of length ``num_classes``; empty classes must weigh zero.
    """


class SampleWeights(_Weights):
    """Draw sample ``i`` with probability ``weights[i] / weights.sum()`` (float64, length N)."""

    @classmethod
    def for_one_epoch(cls, weights: torch.Tensor) -> SampleWeights:
        """Weights that a strategy computes anew every epoch (its table is built each time)."""
        return cls(weights, changes_each_epoch=True)


Distribution = ClassWeights | SampleWeights
