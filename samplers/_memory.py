"""Memory one epoch's draw leaves to the next: rebuilding a table or remaking weights in pages
already touched instead of fresh ones (the first touch of a fresh page costs about as much as
the arithmetic that fills it)."""

from __future__ import annotations

import torch

from samplers._distributions import Distribution
from samplers._tables import GuideTable

__all__ = ["EpochMemory"]


class EpochMemory:
    """A sampler's spare guide table and spare weights.

    The weights a strategy makes with :meth:`weights_like` come back to be reused only through
    :meth:`keep`, which the sampler calls for a distribution that nothing but itself has seen:
    the drawn epoch's when the next epoch starts (unless it was handed out), or one made only to
    be read inside the sampler.
    """

    def __init__(self) -> None:
        self.table: GuideTable | None = None
        self.weights: torch.Tensor | None = None
        self.made: torch.Tensor | None = None  # what weights_like handed out last

    def weights_like(self, like: torch.Tensor) -> torch.Tensor:
        """An uninitialised tensor shaped like ``like``: the spare weights where they fit."""
        spare, self.weights = self.weights, None
        if spare is None or spare.shape != like.shape or spare.dtype != like.dtype:
            spare = torch.empty_like(like)
        self.made = spare
        return spare

    def keep(self, distribution: Distribution, lent: bool) -> None:
        """Take ``distribution``'s table if it was built for one epoch and, unless ``lent``,
        its weights if :meth:`weights_like` made them; it builds a new table if asked."""
        self.table = distribution.release_table() or self.table
        if not lent and distribution.weights is self.made:
            self.weights = self.made
        self.made = None

    def take_table(self) -> GuideTable | None:
        table, self.table = self.table, None
        return table
