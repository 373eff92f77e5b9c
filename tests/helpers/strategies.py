"""Every strategy with small default parameters, and a small long tail to draw from."""

from __future__ import annotations

from collections.abc import Callable

import torch

import samplers

STRATEGIES: dict[str, Callable[..., samplers.Sampler]] = {
    "uniform": lambda labels, **kw: samplers.UniformSampler(labels, **kw),
    "weighted": lambda labels, **kw: samplers.WeightedSampler(labels, q=0.0, **kw),
    "weighted_sample": lambda labels, **kw: samplers.WeightedSampler(
        labels, sample_weights=[1.0 + (i % 3) for i in range(len(labels))], **kw
    ),
    "weighted_no_replacement": lambda labels, **kw: samplers.WeightedSampler(
        labels, q=0.5, replacement=False, **kw
    ),
    "fixed_class": lambda labels, **kw: samplers.FixedClassSampler(
        labels, classes_per_batch=2, samples_per_class=3, **kw
    ),
    "fixed_class_independent": lambda labels, **kw: samplers.FixedClassSampler(
        labels, quotas=[1] * (int(max(labels)) + 1), repeats="independent", **kw
    ),
    "annealed": lambda labels, **kw: samplers.AnnealedSampler(labels, total_epochs=4, **kw),
    "progressive": lambda labels, **kw: samplers.ProgressiveSampler(labels, total_epochs=4, **kw),
    "deferred": lambda labels, **kw: samplers.DeferredSampler(labels, total_epochs=4, **kw),
    "mixture": lambda labels, **kw: samplers.MixtureSampler(
        labels,
        components=[samplers.UniformSampler, samplers.HardMinedSampler, [0, 1]],
        shares=[0.5, 0.25, 0.25],
        batch_size=4,
        **kw,
    ),
    "hard_mined": lambda labels, **kw: samplers.HardMinedSampler(labels, **kw),
    "hybrid": lambda labels, **kw: samplers.HybridSampler(labels, **kw),
}

# Five classes from 500 down to 3 members: a long tail small enough to test exactly.
LABELS = torch.tensor([0] * 500 + [1] * 200 + [2] * 60 + [3] * 15 + [4] * 3)

BATCH_SAMPLERS = {"fixed_class", "fixed_class_independent", "mixture"}
WITHOUT_REPLACEMENT = {"uniform", "weighted_no_replacement"}


def feed_losses(sampler: samplers.Sampler) -> None:
    """Some deterministic feedback, so that feedback strategies move off their start."""

    idx = sampler.epoch_indices().reshape(-1)
    sampler.update(idx, (idx % 7).double())
