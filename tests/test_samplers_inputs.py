"""Bad inputs name the parameter, the value and what is allowed; the draw's tables reproduce
any weights exactly and its shuffles are torch's (property-based)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import samplers
from samplers._pool import CHUNK
from samplers._seeding import generator_for
from samplers._shuffle import permutation
from samplers._tables import AliasTable, GuideTable
from tests.helpers.strategies import LABELS

pytestmark = pytest.mark.unit  # in one process, seconds


BAD_INPUT = [
    (lambda: samplers.UniformSampler([]), "labels: empty"),
    (lambda: samplers.UniformSampler([0, -1]), "negative class id"),
    (lambda: samplers.UniformSampler([0.5, 1.0]), "non-integer"),
    (
        lambda: samplers.UniformSampler([0, 1], num_samples=3),
        "num_samples=3 exceeds the dataset size",
    ),
    (
        lambda: samplers.WeightedSampler([0, 1], class_weights=[1, float("nan")]),
        "class_weights: contains NaN",
    ),
    (
        lambda: samplers.WeightedSampler([0, 1], class_weights=[1, float("inf")]),
        "class_weights: contains NaN or infinite",
    ),
    (
        lambda: samplers.WeightedSampler([0, 1], class_weights=[1, -1]),
        "class_weights: contains negative",
    ),
    (
        lambda: samplers.WeightedSampler([0, 1], sample_weights=[0, 0]),
        "sample_weights: all weights are zero",
    ),
    (lambda: samplers.WeightedSampler([0, 1], sample_weights=[1, 1, 1]), "expected 2 values"),
    (lambda: samplers.WeightedSampler([0, 1], q=1, beta=0.9), "at most one of"),
    (
        lambda: samplers.WeightedSampler([0, 1, 1], sample_weights=[1, 0, 1], replacement=False),
        "exceeds the 2 samples with positive weight",
    ),
    (
        lambda: samplers.AnnealedSampler([0, 1], total_epochs=0),
        r"total_epochs \(T\) must be a positive",
    ),
    (
        lambda: samplers.AnnealedSampler([0, 1], total_epochs=5, schedule="exp"),
        "schedule='exp' is unknown",
    ),
    (lambda: samplers.HardMinedSampler([0, 1], floor=0), "floor must lie in"),
    (lambda: samplers.HardMinedSampler([0, 1], momentum=1.0), "momentum must lie in"),
    (lambda: samplers.UniformSampler([0, 1], rank=2, world_size=2), "rank must be an integer in"),
    (lambda: samplers.UniformSampler([0, 1], seed=1.5), "seed must be an integer"),
    (
        lambda: samplers.DeferredSampler([0, 1], total_epochs=5, defer_fraction=1.0),
        r"defer_fraction must lie in \[0, 1\)",
    ),
    (lambda: samplers.UniformSampler([0, 1]).state_dict(consumed=-1), "consumed must be a non"),
    (lambda: samplers.WeightedSampler([[0], [1]]), r"labels.reshape\(-1\)"),
    (lambda: samplers.WeightedSampler([[0, 1], [1, 0]]), "use MultiLabelClassAwareSampler"),
    (
        lambda: samplers.sampling_stats(torch.tensor([0, 1]), torch.tensor([[0, 1], [1, 0]])),
        "use multilabel_sampling_stats",
    ),
]


@pytest.mark.parametrize(("build", "message"), BAD_INPUT)
def test_bad_input_names_the_parameter(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def implied_probabilities(table: AliasTable) -> torch.Tensor:
    """What the alias table draws: bucket k keeps itself with keep[k], else gives alias[k]."""
    k = table.keep.numel()
    p = table.keep.clone()
    p.index_add_(0, table.alias, 1.0 - table.keep)
    return p / k


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.just(0.0), st.floats(1e-9, 1e9)), min_size=1, max_size=300).filter(
        lambda w: sum(w) > 0
    )
)
def test_alias_table_reproduces_any_weights_exactly(weights):
    w = torch.tensor(weights, dtype=torch.float64)
    table = AliasTable(w)
    assert ((table.keep >= 0) & (table.keep <= 1)).all()
    assert torch.allclose(implied_probabilities(table), w / w.sum(), rtol=1e-9, atol=1e-12)
    assert (implied_probabilities(table)[w == 0] == 0).all()  # zero weight: never drawn


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.just(0.0), st.floats(1e-9, 1e9)), min_size=1, max_size=300).filter(
        lambda w: sum(w) > 0
    ),
    st.integers(0, 2**31),
)
def test_guide_table_reproduces_any_weights_exactly(weights, seed):
    w = torch.tensor(weights, dtype=torch.float64)
    table = GuideTable(w)
    # What the table draws: item i covers [ends[i-1], ends[i]) of [0, total).
    widths = torch.diff(table.ends, prepend=torch.zeros(1, dtype=torch.float64)) / table.total
    assert torch.allclose(widths, w / w.sum(), rtol=1e-9, atol=1e-12)
    assert (widths[w == 0] == 0).all()  # zero weight: an empty interval, never drawn
    # The guided lookup finds the covering item exactly as a binary search does.
    u = torch.rand(2000, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    u = torch.cat([u * table.total, table.ends[:-1]])  # item ends: the boundary cases
    u = u[u < table.total]  # trailing zero weights end at the total, outside [0, total)
    expected = torch.searchsorted(table.ends, u, right=True)
    assert torch.equal(table.lookup(u), expected)


def test_guide_table_steps_through_crowded_buckets_exactly():
    # Many tiny weights end in a few buckets: draws there take the subset steps and the binary
    # search, beside buckets where the guide's item alone settles the draw.
    generator = torch.Generator().manual_seed(0)
    w = torch.cat(
        [
            torch.full((50_000,), 1e-12, dtype=torch.float64),
            torch.rand(150_000, dtype=torch.float64, generator=generator),
            torch.tensor([0.0, 1e-12, 1e-12, 0.0, 5.0], dtype=torch.float64),
        ]
    )
    table = GuideTable(w)
    u = torch.rand(200_000, dtype=torch.float64, generator=generator) * table.total
    u = torch.cat([u, table.ends[:-1], torch.zeros(1, dtype=torch.float64)])
    assert torch.equal(table.lookup(u), torch.searchsorted(table.ends, u, right=True))


def test_a_guide_table_built_in_chunks_is_the_whole_table():
    # A chunk and the next chunk's start that weigh nothing, a zero weight at a chunk's end and
    # one item with nearly all the weight, whose chunk fills most of the guide.
    generator = torch.Generator().manual_seed(1)
    w = torch.rand(5 * CHUNK + 123, dtype=torch.float64, generator=generator)
    w[CHUNK : 2 * CHUNK + 7] = 0.0
    w[3 * CHUNK - 1] = 0.0
    w[4 * CHUNK + 5] = 1e6
    table = GuideTable(w)
    assert (torch.diff(table.ends) >= 0).all()
    widths = torch.diff(table.ends, prepend=torch.zeros(1, dtype=torch.float64)) / table.total
    assert torch.allclose(widths, w / w.sum(), rtol=1e-9, atol=1e-12)
    # guide[j]: how many items end at or before point j, item i ending at ceil(ends[i]).
    buckets = table.guide.numel() - 1
    ends_at = torch.ceil(table.ends).long().clamp(max=buckets + 1)
    expected = torch.searchsorted(ends_at, torch.arange(buckets + 1), right=True)
    assert torch.equal(table.guide.long(), expected)
    u = torch.rand(100_000, dtype=torch.float64, generator=generator) * table.total
    u = torch.cat([u, table.ends[:-1]])
    assert torch.equal(table.lookup(u), torch.searchsorted(table.ends, u, right=True))


def test_each_epochs_table_is_built_in_the_memory_of_the_last():
    # hard_mined's weights are new every epoch: each epoch's guide table overwrites the one the
    # epoch before gave up, and holds exactly what a table in fresh memory holds.
    labels = torch.arange(3 * CHUNK + 5) % 7
    sampler = samplers.HardMinedSampler(labels, seed=2)
    generator = torch.Generator().manual_seed(0)
    addresses = set()
    earlier = None
    for epoch in range(4):
        sampler.set_epoch(epoch)
        drawn = sampler.epoch_indices()
        distribution = sampler.current_distribution()
        table = distribution.table
        addresses.add((table.ends.data_ptr(), table.guide.data_ptr()))
        fresh = GuideTable(distribution.weights)
        assert torch.equal(table.ends, fresh.ends) and torch.equal(table.guide, fresh.guide)
        if earlier is not None:  # it gave its table up: asked again, it builds one of its own
            rebuilt = earlier.table
            assert rebuilt.ends.data_ptr() != table.ends.data_ptr()
            assert torch.equal(rebuilt.guide, GuideTable(earlier.weights).guide)
        earlier = distribution
        sampler.update(drawn, torch.rand(drawn.numel(), dtype=torch.float64, generator=generator))
    assert len(addresses) == 1


def test_each_epochs_weights_reuse_memory_that_nothing_else_holds():
    # hard_mined's weights are new every epoch: the memory of the last epoch's is reused unless
    # the distribution was handed out (current_distribution) or came from a caller's state.
    labels = torch.arange(3 * CHUNK + 5) % 7
    everything = torch.arange(labels.numel())
    reusing, lending = (samplers.HardMinedSampler(labels, seed=2) for _ in range(2))
    generator = torch.Generator().manual_seed(0)
    addresses, lent = set(), []
    for epoch in range(1, 5):
        losses = torch.rand(labels.numel(), dtype=torch.float64, generator=generator)
        for sampler in (reusing, lending):
            sampler.update(everything, losses)
            sampler.set_epoch(epoch)
        reusing.target_class_shares()  # read inside the sampler before the draw (a mixture's)
        assert torch.equal(reusing.epoch_indices(), lending.epoch_indices())
        reusing.target_class_shares()  # and after it, as a training loop does
        addresses.add(reusing._drawn[1].weights.data_ptr())
        distribution = lending.current_distribution()
        lent.append((distribution, distribution.weights.clone()))
    assert len(addresses) == 1
    assert all(torch.equal(distribution.weights, kept) for distribution, kept in lent)
    state = reusing.state_dict()
    saved = state["epoch_distribution"][1].clone()
    restored = samplers.HardMinedSampler(labels, seed=2)
    restored.load_state_dict(state)
    restored.update(
        everything, torch.rand(labels.numel(), dtype=torch.float64, generator=generator)
    )
    restored.set_epoch(5)
    restored.epoch_indices()
    assert torch.equal(state["epoch_distribution"][1], saved)


def test_a_strategy_that_keeps_its_distributions_keeps_their_weights():
    # A subclass may keep what hard_mined's distribution returns (here to measure the drift
    # between epochs): those weights are never made in memory that a later epoch reuses.
    class Drift(samplers.HardMinedSampler):
        kept: list[tuple[Any, torch.Tensor]] = []

        def distribution(self, epoch: int) -> Any:
            distribution = super().distribution(epoch)
            self.kept.append((distribution, distribution.weights.clone()))
            return distribution

    labels = torch.arange(1000) % 7
    sampler = Drift(labels, seed=1)
    generator = torch.Generator().manual_seed(0)
    for epoch in range(1, 5):
        losses = torch.rand(1000, dtype=torch.float64, generator=generator)
        sampler.update(torch.arange(1000), losses)
        sampler.set_epoch(epoch)
        sampler.epoch_indices()
    assert all(torch.equal(distribution.weights, kept) for distribution, kept in Drift.kept)
    assert not torch.equal(Drift.kept[-1][1], Drift.kept[-2][1])  # the epochs did differ


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 70_000), st.integers(0, 2**62), st.integers(0, 3), st.integers(0, 70_000))
def test_small_shuffles_are_torch_randperm(size, seed, stream, count):
    # The order contract up to SEQUENTIAL_MAX items: the very permutation randperm gives (it is
    # built in int32, whose swaps take their positions from the generator as int64's do).
    shuffled = permutation(size, seed, stream, count)
    assert shuffled.dtype == torch.long
    expected = torch.randperm(size, generator=generator_for(seed, stream))[:count]
    assert torch.equal(shuffled, expected)


def test_mixture_validation():
    with pytest.raises(ValueError, match="one share per component"):
        samplers.MixtureSampler(LABELS, components=[[0]], shares=[0.5, 0.5], batch_size=4)
    with pytest.raises(ValueError, match="a component gets no item per batch"):
        samplers.MixtureSampler(LABELS, components=[[0], [1]], shares=[0.95, 0.05], batch_size=4)
    with pytest.raises(ValueError, match="pass its class or a functools.partial"):
        samplers.MixtureSampler(
            LABELS, components=[samplers.UniformSampler(LABELS)], shares=[1], batch_size=4
        )
    with pytest.raises(ValueError, match=r"pool indices must lie in \[0, 778\)"):
        samplers.MixtureSampler(LABELS, components=[[0, 778]], shares=[1], batch_size=4)
    with pytest.raises(ValueError, match="a mixture takes index samplers"):
        samplers.MixtureSampler(
            LABELS,
            components=[lambda y, **kw: samplers.FixedClassSampler(y, quotas=[1] * 5)],
            shares=[1],
            batch_size=4,
        )


BAD_BOOLEANS = [
    (lambda v: samplers.UniformSampler(LABELS, replacement=v), "replacement"),
    (lambda v: samplers.WeightedSampler(LABELS, replacement=v), "replacement"),
    (lambda v: samplers.UniformSampler(LABELS, drop_last=v), "drop_last"),
    (lambda v: samplers.HardMinedSampler(LABELS, class_balanced=v), "class_balanced"),
    (lambda v: samplers.FixedClassSampler(LABELS, quotas=[1] * 5, replacement=v), "replacement"),
    (lambda v: samplers.DeferredSampler(LABELS, total_epochs=5, replacement=v), "replacement"),
]


@pytest.mark.parametrize(("build", "name"), BAD_BOOLEANS)
@pytest.mark.parametrize("value", ["False", 0, 1, "true"])
def test_bad_booleans_raise_naming_the_parameter(build, name, value):
    with pytest.raises(ValueError, match=f"{name} must be True or False, got {value!r}"):
        build(value)
