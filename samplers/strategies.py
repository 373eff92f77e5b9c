"""The strategies with fixed or scheduled weights, per class or per sample. Each only says which
distribution to draw from in each epoch (the feedback strategy is in ``hard_mined``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from samplers._checks import check_bool, check_int, check_number
from samplers._distributions import ClassWeights, Distribution, SampleWeights
from samplers.base import Sampler

__all__ = [
    "UniformSampler",
    "WeightedSampler",
    "AnnealedSampler",
    "ProgressiveSampler",
    "DeferredSampler",
    "HybridSampler",
    "power_weights",
    "effective_number_weights",
]

SCHEDULES = ("linear", "cosine", "step")


def power_weights(counts: torch.Tensor, q: float) -> torch.Tensor:
    """Class weights proportional to ``n_j ** q`` (zero for empty classes), normalised."""
    counts = counts.double()
    weights = torch.where(counts > 0, counts.clamp(min=1) ** q, torch.zeros_like(counts))
    return weights / weights.sum()


def effective_number_weights(counts: torch.Tensor, beta: float) -> torch.Tensor:
    """Class weights ``(1 - beta) / (1 - beta ** n_j)`` of Cui et al. (2019), normalised."""
    counts = counts.double()
    effective = 1.0 - torch.pow(torch.tensor(beta, dtype=torch.float64), counts)
    weights = torch.where(counts > 0, (1.0 - beta) / effective.clamp(min=1e-300), 0.0)
    return weights / weights.sum()


def _check_weights(name: str, weights: Any, length: int, what: str) -> torch.Tensor:
    weights = torch.as_tensor(weights, dtype=torch.float64).reshape(-1)
    if weights.numel() != length:
        raise ValueError(
            f"{name}: expected {length} values (one per {what}), got {weights.numel()}"
        )
    if not torch.isfinite(weights).all():
        raise ValueError(f"{name}: contains NaN or infinite values; pass finite weights")
    if (weights < 0).any():
        raise ValueError(f"{name}: contains negative values; weights must be >= 0")
    if not (weights > 0).any():
        raise ValueError(f"{name}: all weights are zero; at least one must be positive")
    normalised: torch.Tensor = weights / weights.sum()
    return normalised


def _check_beta(beta: Any) -> float:
    value = check_number("beta", beta)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"beta must lie in [0, 1) (e.g. 0.999), got {value}")
    return value


class UniformSampler(Sampler):
    """Instance-balanced shuffle: every sample once per epoch (the role of ``shuffle=True``)."""

    def __init__(
        self, labels: Sequence[int] | torch.Tensor, *, replacement: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(labels, replacement=replacement, **kwargs)

    def distribution(self, epoch: int) -> Distribution:
        return ClassWeights(self.class_counts.double())


class WeightedSampler(Sampler):
    """Fixed class or sample probabilities.

    Exactly one of: ``q`` (class probability proportional to ``n_j ** q``: 1 instance-balanced,
    0.5 square-root, 0 class-balanced), ``beta`` (effective number, Cui et al. 2019),
    ``class_weights`` (one per class) or ``sample_weights`` (one per sample). Explicit weights may
    have any positive scale. Default: ``q=0`` (class-balanced), with replacement.
    """

    def __init__(
        self,
        labels: Sequence[int] | torch.Tensor,
        *,
        q: float | None = None,
        beta: float | None = None,
        class_weights: Sequence[float] | torch.Tensor | None = None,
        sample_weights: Sequence[float] | torch.Tensor | None = None,
        replacement: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(labels, replacement=replacement, **kwargs)
        given = [
            name
            for name, value in [
                ("q", q),
                ("beta", beta),
                ("class_weights", class_weights),
                ("sample_weights", sample_weights),
            ]
            if value is not None
        ]
        if len(given) > 1:
            raise ValueError(
                f"give at most one of q, beta, class_weights, sample_weights; got {given}"
            )
        counts = self.class_counts
        if sample_weights is not None:
            self._distribution: Distribution = SampleWeights(
                _check_weights("sample_weights", sample_weights, len(self.index), "sample")
            )
        elif class_weights is not None:
            weights = _check_weights("class_weights", class_weights, self.num_classes, "class")
            if (weights[counts == 0] > 0).any():
                empty = torch.nonzero((weights > 0) & (counts == 0)).flatten().tolist()
                raise ValueError(
                    f"class_weights: classes {empty} have no samples but positive weight"
                )
            self._distribution = ClassWeights(weights)
        elif beta is not None:
            self._distribution = ClassWeights(effective_number_weights(counts, _check_beta(beta)))
        else:
            self._distribution = ClassWeights(
                power_weights(counts, check_number("q", 0.0 if q is None else q))
            )
        if not replacement:
            positive = int((self._sample_weights_view() > 0).sum())
            if self.num_samples > positive:
                raise ValueError(
                    f"num_samples={self.num_samples} exceeds the {positive} samples with positive "
                    "weight; without replacement set replacement=True or lower num_samples"
                )

    def _sample_weights_view(self) -> torch.Tensor:
        if isinstance(self._distribution, SampleWeights):
            return self._distribution.weights
        return self._distribution.weights[self.labels]

    def distribution(self, epoch: int) -> Distribution:
        return self._distribution


def schedule_progress(
    epoch: int, total_epochs: int, schedule: str, steps: int = 1, endpoint: bool = False
) -> float:
    """Fraction ``s(t)`` in [0, 1] of the way from the start to the end distribution.

    The time ``t`` is ``epoch / (total_epochs - 1)`` with ``endpoint`` (1 in the last epoch, as
    ``np.linspace(0, 1, T)``; 0 throughout when ``T = 1``), else ``epoch / total_epochs`` (1 only
    after training); either way capped at 1.
    """
    span = total_epochs - 1 if endpoint else total_epochs
    t = min(epoch / span, 1.0) if span > 0 else 0.0
    if schedule == "linear":
        return t
    if schedule == "cosine":
        return 0.5 * (1.0 - math.cos(math.pi * t))
    return math.floor(steps * t) / steps


class AnnealedSampler(Sampler):
    """Class shares annealed from ``p_start ∝ n^q_start`` to ``p_end ∝ n^q_end`` over training.

    ``mode="mix"``: ``p(t) = (1 - s) p_start + s p_end``; ``mode="power"``:
    ``p(t) ∝ n^(q_start + s (q_end - q_start))``. The progress ``s`` goes from 0 at epoch 0 to 1
    along ``schedule`` (linear, cosine, or step: ``steps`` equal jumps): at epoch
    ``total_epochs`` by default, so that training never reaches ``p_end``; with
    ``endpoint=True`` in the last epoch, ``total_epochs - 1``.

    The default runs from class-balanced (q=0) to instance-balanced (q=1): per-sample
    inverse-frequency weights annealed to 1, a curriculum that starts on balanced data and ends
    on the natural distribution. The published progressively-balanced sampling of Kang et al.
    (2020, "Decoupling representation and classifier for long-tailed recognition") is the
    other direction with the ``mix`` form, instance- to class-balanced: see
    :class:`ProgressiveSampler`.
    """

    def __init__(
        self,
        labels: Sequence[int] | torch.Tensor,
        *,
        total_epochs: int,
        q_start: float = 0.0,
        q_end: float = 1.0,
        schedule: str = "linear",
        mode: str = "mix",
        steps: int = 1,
        endpoint: bool = False,
        replacement: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(labels, replacement=replacement, **kwargs)
        check_int("total_epochs (T)", total_epochs, 1)
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule={schedule!r} is unknown; choose one of {SCHEDULES}")
        if mode not in ("mix", "power"):
            raise ValueError(f"mode={mode!r} is unknown; choose 'mix' or 'power'")
        check_int("steps", steps, 1)
        self.total_epochs = total_epochs
        self.q_start = check_number("q_start", q_start)
        self.q_end = check_number("q_end", q_end)
        self.schedule, self.mode, self.steps = schedule, mode, steps
        self.endpoint = check_bool("endpoint", endpoint)

    def distribution(self, epoch: int) -> Distribution:
        s = schedule_progress(epoch, self.total_epochs, self.schedule, self.steps, self.endpoint)
        counts = self.class_counts
        if self.mode == "power":
            return ClassWeights(
                power_weights(counts, self.q_start + s * (self.q_end - self.q_start))
            )
        start, end = power_weights(counts, self.q_start), power_weights(counts, self.q_end)
        return ClassWeights((1.0 - s) * start + s * end)


class ProgressiveSampler(AnnealedSampler):
    """Progressively-balanced sampling of Kang et al. (2020): instance- to class-balanced.

    ``p(t) = (1 - t/(T-1)) p_IB + t/(T-1) p_CB`` in epoch ``t`` (0-based) of ``T =
    total_epochs``: instance-balanced in the first epoch, class-balanced in the last, as the
    reference's ``ClassPrioritySampler`` (facebookresearch/classifier-balancing: ``lam`` from
    ``np.linspace(0, 1, epochs)``). :class:`AnnealedSampler` with ``q_start=1``, ``q_end=0``,
    ``mode="mix"``, a linear schedule and ``endpoint=True`` by default; ``endpoint=False`` gives
    ``t/T`` (the last epoch ``(T-1)/T`` balanced).
    """

    def __init__(
        self,
        labels: Sequence[int] | torch.Tensor,
        *,
        total_epochs: int,
        q_start: float = 1.0,
        q_end: float = 0.0,
        endpoint: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            labels,
            total_epochs=total_epochs,
            q_start=q_start,
            q_end=q_end,
            endpoint=endpoint,
            **kwargs,
        )


class DeferredSampler(Sampler):
    """Deferred re-sampling (DRS, Cao et al. 2019, "Learning imbalanced datasets with
    label-distribution-aware margin loss"): instance-balanced, then class-balanced.

    Class shares are ``∝ n^q_before`` before epoch ``int(defer_fraction * total_epochs)`` and
    ``∝ n^q_after`` from it on: by default instance-balanced for the first 80% of training and
    class-balanced after (epoch 160 of 200). The switch epoch follows the same rule as the
    deferred re-weighting loss (DRW), so the two switch together. ``switch_epoch`` (0-based)
    names the epoch directly instead; the cRT recipe switches when its classifier stage starts.

    An instance-balanced phase before the switch (``q_before=1``, the default) is a shuffle, as
    in the reference DRS: every sample once an epoch, in exactly :class:`UniformSampler`'s order
    for the same seed, so a run with this sampler trains like one with the uniform sampler until
    the switch. ``replacement`` applies to the phase after it, and to the phase before it when
    that is not instance-balanced or draws more than the dataset (``num_samples``).
    """

    def __init__(
        self,
        labels: Sequence[int] | torch.Tensor,
        *,
        total_epochs: int | None = None,
        defer_fraction: float = 0.8,
        switch_epoch: int | None = None,
        q_before: float = 1.0,
        q_after: float = 0.0,
        replacement: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(labels, replacement=replacement, **kwargs)
        if switch_epoch is None:
            if total_epochs is None:
                raise ValueError("give total_epochs (with defer_fraction) or switch_epoch")
            check_int("total_epochs", total_epochs, 1)
            fraction = check_number("defer_fraction", defer_fraction)
            if not 0.0 <= fraction < 1.0:
                raise ValueError(
                    f"defer_fraction must lie in [0, 1) (e.g. 0.8: the last 20% re-sampled), "
                    f"got {defer_fraction}"
                )
            switch_epoch = int(fraction * total_epochs)
        self.switch_epoch = check_int("switch_epoch", switch_epoch, 0)
        counts = self.class_counts
        q_before = check_number("q_before", q_before)
        # UniformSampler's weights, not power_weights(counts, 1): the same draw needs the same
        # floats (normalised counts divided back per member are not all equal to the last bit).
        self.shuffles_before = q_before == 1.0 and self.num_samples <= len(self.index)
        self._before = ClassWeights(
            counts.double() if self.shuffles_before else power_weights(counts, q_before)
        )
        self._after = ClassWeights(power_weights(counts, check_number("q_after", q_after)))

    def distribution(self, epoch: int) -> Distribution:
        return self._before if epoch < self.switch_epoch else self._after

    def _with_replacement(self, distribution: Distribution) -> bool:
        return self.replacement and not (self.shuffles_before and distribution is self._before)


class HybridSampler(Sampler):
    """Partial re-sampling plus loss re-weighting.

    Draws classes with ``p_j ∝ n_j ** q`` (e.g. square-root, ``q=0.5``) and exposes
    :meth:`class_loss_weights` ``w_j = t_j / p_j`` with target ``t_j ∝ n_j ** target_q``
    (class-balanced by default), so that sampling share times loss weight equals the target.
    Apply the weights to per-sample losses and average plainly (not torch's weighted mean).
    """

    def __init__(
        self,
        labels: Sequence[int] | torch.Tensor,
        *,
        q: float = 0.5,
        target_q: float = 0.0,
        replacement: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(labels, replacement=replacement, **kwargs)
        self.sampling = power_weights(self.class_counts, check_number("q", q))
        self.target = power_weights(self.class_counts, check_number("target_q", target_q))

    def distribution(self, epoch: int) -> Distribution:
        return ClassWeights(self.sampling)

    def class_loss_weights(self) -> torch.Tensor:
        """Per-class loss weights ``target / sampling share`` (float64; 0 for empty classes)."""
        return torch.where(self.sampling > 0, self.target / self.sampling.clamp(min=1e-300), 0.0)
