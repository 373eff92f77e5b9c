"""The feedback strategy: per-sample probabilities that follow each sample's training loss."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from samplers._checks import check_bool, check_number
from samplers._distributions import Distribution, SampleWeights
from samplers._pool import CHUNK, over_chunks
from samplers.base import Sampler

__all__ = ["HardMinedSampler"]


class HardMinedSampler(Sampler):
    """Per-sample probabilities that follow each sample's recent training loss.

    Each sample's loss is smoothed by an exponential moving average (``momentum``); the score is
    sharpened as ``ema ** power`` or, when ``temperature`` is given, ``exp(ema / temperature)``.
    Samples not seen yet get the mean weight. The result is mixed with a uniform ``floor`` so
    that no sample starves: ``p = (1 - floor) * score / sum + floor * base``. Before any feedback
    (the first epoch) ``p`` is the base: uniform over samples or, with ``class_balanced``,
    uniform over classes and then over their members (scores are then normalised per class).
    """

    feedback_state = ("loss_ema", "seen")

    def __init__(
        self,
        labels: Sequence[int] | torch.Tensor,
        *,
        momentum: float = 0.9,
        power: float = 1.0,
        temperature: float | None = None,
        floor: float = 0.1,
        class_balanced: bool = False,
        replacement: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(labels, replacement=replacement, **kwargs)
        self.momentum = check_number("momentum", momentum)
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
        self.power = check_number("power", power)
        if self.power < 0:
            raise ValueError(f"power must be >= 0, got {power}")
        if temperature is not None and check_number("temperature", temperature) <= 0:
            raise ValueError(
                f"temperature must be > 0 (or None for the power form), got {temperature}"
            )
        self.temperature = temperature
        self.floor = check_number("floor", floor)
        if not 0.0 < self.floor <= 1.0:
            raise ValueError(f"floor must lie in (0, 1] so that no sample starves, got {floor}")
        self.class_balanced = check_bool("class_balanced", class_balanced)
        self.loss_ema = torch.zeros(len(self.index), dtype=torch.float64)
        self.seen = torch.zeros(len(self.index), dtype=torch.bool)

    def _per_class_normalised(self, weights: torch.Tensor) -> torch.Tensor:
        """Weights rescaled so each non-empty class sums to 1 / (number of non-empty classes);
        a class whose weights are all zero is spread evenly over its members."""
        totals = torch.zeros(self.num_classes, dtype=torch.float64).index_add_(
            0, self.labels, weights
        )
        if (totals[self.class_counts > 0] == 0).any():
            weights = torch.where(totals[self.labels] == 0, 1.0, weights)
            totals = torch.zeros(self.num_classes, dtype=torch.float64).index_add_(
                0, self.labels, weights
            )
        present = int((self.class_counts > 0).sum())
        return weights / totals[self.labels] / present

    def _base(self) -> torch.Tensor:
        ones = torch.ones(len(self.index), dtype=torch.float64)
        return self._per_class_normalised(ones) if self.class_balanced else ones / ones.numel()

    def _shift(self, ema: torch.Tensor) -> float:
        """What the exponential form subtracts first: the largest EMA, so nothing overflows."""
        return float(ema.max()) if self.temperature is not None else 0.0

    def _sharpen(self, ema: torch.Tensor, shift: float, out: torch.Tensor) -> torch.Tensor:
        """The scores of ``ema`` into ``out``: ``exp((ema - shift) / temperature)`` or
        ``max(ema, 0) ** power``."""
        if self.temperature is not None:
            return torch.sub(ema, shift, out=out).div_(self.temperature).exp_()
        torch.clamp(ema, min=0.0, out=out)
        return out if self.power == 1.0 else out.pow_(self.power)

    def distribution(self, epoch: int) -> Distribution:
        if not self.seen.any():
            return SampleWeights.for_one_epoch(self._base())
        # The memory of an earlier epoch's weights, unless a subclass overrides this method
        # (it may keep what it returns; the sampler would not know).
        own = type(self).distribution is HardMinedSampler.distribution
        weights = (
            self._memory.weights_like(self.loss_ema) if own else torch.empty_like(self.loss_ema)
        )
        if self.seen.all():  # after the first epoch, usually: no masking needed
            ema, shift = self.loss_ema, self._shift(self.loss_ema)
            # Chunk by chunk on the pool, each chunk summed while in cache; the total adds the
            # chunks' sums in order, the same for every thread count.
            sums = over_chunks(
                ema.numel(),
                lambda part: float(self._sharpen(ema[part], shift, weights[part]).sum()),
            )
            total = sum(sums)
        else:
            seen = self.loss_ema[self.seen]
            sharpened = self._sharpen(seen, self._shift(seen), torch.empty_like(seen))
            weights.fill_(float(sharpened.mean()))  # unseen: the mean
            weights[self.seen] = sharpened
            total = float(weights.sum())
        if self.class_balanced:
            base = self._base()
            return SampleWeights.for_one_epoch(
                (1.0 - self.floor) * self._per_class_normalised(weights) + self.floor * base
            )
        if total <= 0:
            return SampleWeights.for_one_epoch(self._base())
        # p = (1 - floor) * w / sum(w) + floor / N, in place on the fresh weights tensor
        scale, floor = (1.0 - self.floor) / total, self.floor / weights.numel()
        over_chunks(weights.numel(), lambda part: weights[part].mul_(scale).add_(floor))
        return SampleWeights.for_one_epoch(weights)

    def observe(self, indices: torch.Tensor, losses: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        if indices.numel() * 4 >= len(self.index):
            self._observe_dense(indices, losses)
            return
        unique, inverse = torch.unique(indices, return_inverse=True)
        mean_loss = torch.zeros(unique.numel(), dtype=torch.float64)
        mean_loss.index_add_(0, inverse, losses)
        mean_loss /= torch.bincount(inverse, minlength=unique.numel())
        previous = self.loss_ema[unique]
        smoothed = previous.mul_(self.momentum).add_(mean_loss, alpha=1.0 - self.momentum)
        self.loss_ema[unique] = torch.where(self.seen[unique], smoothed, mean_loss)
        self.seen[unique] = True

    def _observe_dense(self, indices: torch.Tensor, losses: torch.Tensor) -> None:
        """Feedback on a large share of the data (a whole epoch at once): sums over dense tables
        instead of sorting the indices, applied slice by slice so that no other temporary is as
        large as the data (10^8 samples: 800 MB each)."""
        totals = torch.zeros(len(self.index), dtype=torch.float64).index_add_(0, indices, losses)
        times = torch.zeros(len(self.index), dtype=torch.int32)
        times.index_add_(0, indices, torch.ones(1, dtype=torch.int32).expand(indices.numel()))
        for start in range(0, len(self.index), CHUNK):
            part = slice(start, start + CHUNK)
            fed = times[part] > 0
            mean_loss = totals[part].div_(times[part])  # NaN where not fed: masked out below
            ema, seen = self.loss_ema[part], self.seen[part]
            smoothed = torch.where(
                seen, ema * self.momentum + (1.0 - self.momentum) * mean_loss, mean_loss
            )
            ema.copy_(torch.where(fed, smoothed, ema))
            seen |= fed
