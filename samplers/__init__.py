"""samplers: class-imbalance samplers for torch DataLoaders.

Depends on torch alone. Every sampler takes labels first, is seeded (``seed``, ``set_epoch``),
has an exact ``len``, shards across ranks, resumes mid-epoch (``state_dict``, with ``consumed=``
under a prefetching DataLoader) and takes training feedback through ``update(indices, losses)``.
"""

from samplers._distributions import ClassWeights, SampleWeights
from samplers.base import Sampler
from samplers.fixed_class import FixedClassSampler
from samplers.hard_mined import HardMinedSampler
from samplers.mixture import MixtureSampler
from samplers.multilabel import (
    MultiLabelClassAwareSampler,
    MultiLabelInstanceSampler,
    MultiLabelSampler,
    MultiLabelWeightedSampler,
    rebalance_weights,
)
from samplers.multilabel_stats import MultiLabelSamplingStats, multilabel_sampling_stats
from samplers.stats import SamplingStats, sampling_stats
from samplers.strategies import (
    AnnealedSampler,
    DeferredSampler,
    HybridSampler,
    ProgressiveSampler,
    UniformSampler,
    WeightedSampler,
    effective_number_weights,
    power_weights,
)

__all__ = [
    "Sampler",
    "ClassWeights",
    "SampleWeights",
    "UniformSampler",
    "WeightedSampler",
    "FixedClassSampler",
    "AnnealedSampler",
    "ProgressiveSampler",
    "DeferredSampler",
    "HardMinedSampler",
    "HybridSampler",
    "MixtureSampler",
    "SamplingStats",
    "sampling_stats",
    "power_weights",
    "effective_number_weights",
    "MultiLabelSampler",
    "MultiLabelInstanceSampler",
    "MultiLabelClassAwareSampler",
    "MultiLabelWeightedSampler",
    "rebalance_weights",
    "MultiLabelSamplingStats",
    "multilabel_sampling_stats",
]
