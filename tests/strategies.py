"""Every strategy with small default parameters, for tests that cover them all."""

from __future__ import annotations

from collections.abc import Callable

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
        labels, classes_per_batch=2, samples_per_class=2, replacement=True, **kw
    ),
    "annealed": lambda labels, **kw: samplers.AnnealedSampler(labels, total_epochs=4, **kw),
    "hard_mined": lambda labels, **kw: samplers.HardMinedSampler(labels, **kw),
    "hybrid": lambda labels, **kw: samplers.HybridSampler(labels, **kw),
}

BATCH_SAMPLERS = {"fixed_class"}
WITHOUT_REPLACEMENT = {"uniform", "weighted_no_replacement"}


def feed_losses(sampler: samplers.Sampler) -> None:
    """Some deterministic feedback, so that feedback strategies move off their start."""

    idx = sampler.epoch_indices().reshape(-1)
    sampler.update(idx, (idx % 7).double())
