"""The bucket shuffle behind large permutations: a permutation, a prefix for every count,
uniform, with bounds from the distribution."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chi2

import samplers
from samplers import _pool, _shuffle
from samplers._pool import on_pool_thread
from samplers._seeding import sub_seed
from samplers._shuffle import bucket_shuffle, permutation

pytestmark = pytest.mark.unit  # in one process, seconds


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 3_000),
    st.integers(0, 2**62),
    st.integers(1, 700),
    st.integers(1, 400),
    st.integers(0, 3_000),
)
def test_a_bucket_shuffle_is_a_permutation_and_a_count_cuts_it(size, seed, chunk, bucket, count):
    full = bucket_shuffle(size, seed, chunk=chunk, bucket=bucket)
    assert full.dtype == torch.long
    assert torch.equal(full.sort().values, torch.arange(size))
    count = min(count, size)
    assert torch.equal(bucket_shuffle(size, seed, count, chunk=chunk, bucket=bucket), full[:count])


def test_large_permutations_are_bucket_shuffles_of_their_stream(monkeypatch):
    monkeypatch.setattr(_shuffle, "SEQUENTIAL_MAX", 100)
    expected = bucket_shuffle(1_000, sub_seed(5, 2))
    assert torch.equal(permutation(1_000, 5, 2), expected)
    assert torch.equal(permutation(1_000, 5, 2, 300), expected[:300])
    assert not torch.equal(permutation(1_000, 5, 3), expected)


def _pearson_p_value(counts: torch.Tensor, expected: float, dof: int) -> float:
    statistic = float(((counts.double() - expected) ** 2 / expected).sum())
    return float(chi2.sf(statistic, dof))


def test_every_permutation_is_equally_likely():
    # 5 items in 3 chunks (the last one short) and 8 buckets, most of them empty or single: all
    # 120 orders, 20 expected each, Pearson's test with 119 degrees of freedom. Fixed seeds:
    # the outcome is deterministic; it fails only for a p-value below 1e-4.
    orders = {order: i for i, order in enumerate(itertools.permutations(range(5)))}
    draws = 2_400

    def tally() -> torch.Tensor:  # on a pool thread: the chunks run inline, no hand-offs
        seen = torch.zeros(len(orders), dtype=torch.long)
        for seed in range(draws):
            seen[orders[tuple(bucket_shuffle(5, seed, chunk=2, bucket=1).tolist())]] += 1
        return seen

    seen = on_pool_thread(tally)
    assert _pearson_p_value(seen, draws / math.factorial(5), len(orders) - 1) > 1e-4


def test_every_item_is_equally_likely_at_every_position():
    # 64 items, 8 chunks, 16 buckets: the 64 x 64 table of (item, position) counts over 1,600
    # shuffles (25 expected a cell); its margins are fixed, so Pearson's statistic has 63^2
    # degrees of freedom.
    size, draws = 64, 1_600

    def tally() -> torch.Tensor:
        seen = torch.zeros(size, size, dtype=torch.long)
        positions = torch.arange(size)
        for seed in range(draws):
            seen[bucket_shuffle(size, seed, chunk=8, bucket=4), positions] += 1
        return seen

    seen = on_pool_thread(tally)
    assert _pearson_p_value(seen, draws / size, (size - 1) ** 2) > 1e-4


def test_classes_and_pools_of_one_size_are_read_in_independent_orders():
    # Each class (fixed_class) and each pool (mixture) reads its members in passes drawn from a
    # seed of its own. Were those seeds the sampler's shifted by the class number, class c's
    # pass p would be class c + 1's pass p - 1: two classes of one size in the same order a
    # pass apart. Orders of 1,100 members: any repeat is that, never chance.
    labels = torch.arange(2200) // 1100  # members 0-1099 and 1100-2199
    batches = samplers.FixedClassSampler(
        labels, quotas=[550, 550], num_batches=8, seed=1
    ).epoch_indices()
    first, second = batches[:, :550].reshape(4, 1100), batches[:, 550:].reshape(4, 1100) - 1100
    assert not any(torch.equal(second[p], first[q]) for p in range(4) for q in range(4))
    pools = [torch.arange(1100), torch.arange(1100, 2200)]
    batches = samplers.MixtureSampler(
        labels, components=pools, shares=[0.5, 0.5], batch_size=100, num_batches=66, seed=1
    ).epoch_indices()
    first, second = batches[:, :50].reshape(3, 1100), batches[:, 50:].reshape(3, 1100) - 1100
    assert not any(torch.equal(second[p], first[q]) for p in range(3) for q in range(3))


def test_the_classes_of_every_batch_block_are_uniform_and_independent():
    # fixed_class chooses the classes of 2^16 slots at a time, each block from its own
    # generator: here three whole blocks of 32,768 batches and a part of a fourth.
    from tests.helpers.strategies import LABELS

    k, rows = 2, _pool.CHUNK // 2
    sampler = samplers.FixedClassSampler(
        LABELS, classes_per_batch=k, samples_per_class=1, num_batches=3 * rows + 5, seed=6
    )
    classes = LABELS[sampler.epoch_indices()].sort(dim=1).values
    assert (classes[:, 0] < classes[:, 1]).all()  # two distinct classes in every batch
    pairs = classes[:, 0] * 5 + classes[:, 1]
    counts = torch.bincount(pairs, minlength=25)[pairs.unique()]
    assert counts.numel() == 10  # every pair of the five classes
    # Each pair equally likely: Pearson's test, failing only below p = 10^-4 (fixed seed).
    expected = pairs.numel() / 10
    statistic = float(((counts - expected) ** 2 / expected).sum())
    assert statistic < chi2.ppf(1 - 1e-4, df=9)
    blocks = pairs[: 3 * rows].view(3, rows)
    assert not torch.equal(blocks[0], blocks[1]) and not torch.equal(blocks[1], blocks[2])
