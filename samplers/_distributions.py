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
        all); a guide table builds several times faster and in 12 bytes per item, where an
        alias table's build holds several temporaries as large as the weights (4 GB at 10^8)."""
        if self.changes_each_epoch or self.weights.numel() > ALIAS_MAX:
            return GuideTable(self.weights)
        return AliasTable(self.weights)


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
