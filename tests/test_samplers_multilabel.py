"""Multi-label samplers: exact distributions against their formulas, a statistical test of what
class-aware sampling draws, the core's protocol (len, seeds, resume, shards), label checks."""

from __future__ import annotations

import doctest
import random
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest
import torch

import samplers.multilabel
import samplers.multilabel_stats
from samplers import (
    MultiLabelClassAwareSampler,
    MultiLabelInstanceSampler,
    MultiLabelWeightedSampler,
    UniformSampler,
    WeightedSampler,
    multilabel_sampling_stats,
    rebalance_weights,
)

pytestmark = pytest.mark.unit  # in one process, seconds

# Familywise false-alarm rate of every statistical test here (with its fixed seed it either
# passes or fails forever; the rate says how unlucky a seed would have to be).
ALPHA = 1e-6


def long_tailed_multilabel(n: int = 2000, classes: int = 10, seed: int = 0) -> torch.Tensor:
    """A synthetic long-tailed (n, classes) bool label matrix with co-occurrence.

    Class ``c`` is carried independently with a rate falling geometrically from 0.4 (class 0)
    to 0.02 (the last class); a sample with a label from the tail half also carries head
    class 0 with probability 0.7, so drawing a tail class brings the head along. Some rows
    carry no label at all.
    """
    generator = torch.Generator().manual_seed(seed)
    rates = 0.4 * (0.02 / 0.4) ** (torch.arange(classes, dtype=torch.float64) / (classes - 1))
    labels = torch.rand(n, classes, dtype=torch.float64, generator=generator) < rates
    has_tail = labels[:, classes // 2 :].any(1)
    labels[:, 0] |= has_tail & (torch.rand(n, dtype=torch.float64, generator=generator) < 0.7)
    return labels


Y = long_tailed_multilabel()


def rows_of(labels: torch.Tensor) -> list[list[int]]:
    return [[c for c, v in enumerate(row) if v] for row in labels.tolist()]


def exact_class_aware(labels: torch.Tensor, choice: list[Fraction]) -> list[Fraction]:
    """p_i = sum over the labels c of sample i of pi_c / n_c, in exact arithmetic."""
    counts = [int(v) for v in labels.sum(0)]
    return [sum((choice[c] / counts[c] for c in row), Fraction(0)) for row in rows_of(labels)]


def assert_probabilities(got: torch.Tensor, exact: list[Fraction]) -> None:
    total = sum(exact, Fraction(0))
    want = torch.tensor([float(p / total) for p in exact], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-12, atol=0)


def bonferroni_z(tests: int) -> float:
    """Two-sided normal quantile that keeps ``tests`` tests together at ALPHA."""
    return NormalDist().inv_cdf(1 - ALPHA / (2 * tests))


# ------------------------------------------------------------------ exact distributions


def test_class_aware_probabilities_are_the_formula():
    sampler = MultiLabelClassAwareSampler(Y, seed=0)
    present = [int(v) > 0 for v in Y.sum(0)]
    choice = [Fraction(1, sum(present)) if p else Fraction(0) for p in present]
    assert_probabilities(sampler.item_probabilities(), exact_class_aware(Y, choice))
    assert torch.equal(sampler.class_choice_shares(), torch.full((10,), 0.1, dtype=torch.float64))
    never = ~Y.any(1)
    assert never.any() and (sampler.item_probabilities()[never] == 0).all()


def reference_class_aware_counts(labels: torch.Tensor, draws: int, take: int = 3) -> list[int]:
    """How often the reference procedure (``ClassAwareSampler`` of
    wutong16/DistributionBalancedLoss) draws each sample in ``draws`` draws: the classes come
    in shuffled cycles, and each pick reads the next ``take`` members of its class's own
    shuffled cycle. Written from the description, with its own seeded generator."""
    rng = random.Random(0)
    members = [
        [i for i, row in enumerate(rows_of(labels)) if c in row] for c in range(labels.shape[1])
    ]

    def cycle(items: list[int]):
        while True:
            items = items[:]
            rng.shuffle(items)
            yield from items

    classes = cycle(list(range(labels.shape[1])))
    readers = [cycle(m) for m in members]
    counts = [0] * labels.shape[0]
    drawn = 0
    while drawn < draws:
        group = [next(readers[next(classes)]) for _ in range(take)]
        for i in group[: draws - drawn]:
            counts[i] += 1
        drawn += take
    return counts


def test_class_aware_probabilities_are_the_reference_procedures_long_run_shares():
    """After M draws of the reference procedure (M a multiple of take, every class with
    samples), class c has been picked M / (take C) times give or take one (every class once a
    cycle), and each member of c has been read take picks_c / n_c times give or take one (every
    member once a cycle): so sample i's count lies within sum over its labels of
    (take / n_c + take / (C n_c) + 1) of M p_i; the bound allows 2 take / n_c + 1."""
    labels = long_tailed_multilabel(400, 6, seed=2)
    assert (labels.sum(0) > 0).all()
    draws = 60_000
    counts = torch.tensor(reference_class_aware_counts(labels, draws), dtype=torch.float64)
    p = MultiLabelClassAwareSampler(labels).item_probabilities()
    bound = (labels.double() * (2 * 3 / labels.sum(0).double() + 1)).sum(1)
    assert ((counts - draws * p).abs() <= bound).all()
    mean_of_labels = MultiLabelWeightedSampler(labels, q=0.0).item_probabilities()
    assert not ((counts - draws * mean_of_labels).abs() <= bound).all()  # the test can fail


def test_class_aware_with_a_given_class_distribution_and_an_empty_class():
    labels = torch.cat([Y, torch.zeros(len(Y), 1, dtype=torch.bool)], 1)  # class 10: no sample
    given = [Fraction(c + 1) for c in range(10)] + [Fraction(0)]
    sampler = MultiLabelClassAwareSampler(labels, class_probabilities=[float(g) for g in given])
    choice = [g / sum(given) for g in given]
    assert_probabilities(sampler.item_probabilities(), exact_class_aware(labels, choice))
    uniform = MultiLabelClassAwareSampler(labels)  # the empty class gets no share of the choice
    assert uniform.class_choice_shares()[10] == 0 and uniform.target_class_shares()[10] == 0
    with pytest.raises(ValueError, match=r"class_probabilities: classes \[10\] have no positive"):
        MultiLabelClassAwareSampler(labels, class_probabilities=[1.0] * 11)


@pytest.mark.parametrize("aggregate", ["mean", "max", "sum"])
@pytest.mark.parametrize("q", [0.0, 0.5, 1.0])
def test_weighted_probabilities_are_the_formula(aggregate, q):
    sampler = MultiLabelWeightedSampler(Y, q=q, aggregate=aggregate)
    counts = [int(v) for v in Y.sum(0)]
    exact = []
    for row in rows_of(Y):
        # n_c ** (q - 1) exactly where q - 1 is a whole number; the square roots of q=0.5 are
        # float64 either way, so the comparison is at float64 precision.
        weights = [Fraction(counts[c] ** (q - 1)) for c in row]
        if not weights:
            exact.append(Fraction(0))
        elif aggregate == "mean":
            exact.append(sum(weights, Fraction(0)) / len(weights))
        elif aggregate == "max":
            exact.append(max(weights))
        else:
            exact.append(sum(weights, Fraction(0)))
    assert_probabilities(sampler.item_probabilities(), exact)


def test_weighted_sum_at_q0_is_class_aware_and_one_hot_is_the_single_label_sampler():
    summed = MultiLabelWeightedSampler(Y, q=0.0, aggregate="sum").item_probabilities()
    aware = MultiLabelClassAwareSampler(Y).item_probabilities()
    assert torch.allclose(summed, aware, rtol=1e-12, atol=0)
    single = torch.tensor([0] * 50 + [1] * 20 + [2] * 5)
    one_hot = torch.nn.functional.one_hot(single)
    for q in (0.0, 0.5, 1.0):
        reference = WeightedSampler(single, q=q).current_distribution().weights
        per_item = (reference / torch.bincount(single).double())[single]
        for aggregate in ("mean", "max", "sum"):
            multi = MultiLabelWeightedSampler(one_hot, q=q, aggregate=aggregate)
            assert torch.allclose(multi.item_probabilities(), per_item, rtol=1e-12, atol=0)
            assert torch.allclose(multi.target_class_shares(), reference, rtol=1e-12, atol=0)


def test_instance_sampler_is_the_uniform_shuffle():
    sampler = MultiLabelInstanceSampler(Y, seed=3)
    assert torch.equal(
        sampler.epoch_indices(), UniformSampler([0] * len(Y), seed=3).epoch_indices()
    )
    assert sorted(sampler) == list(range(len(Y)))  # rows without a label too
    shares = Y.double().sum(0) / Y.sum()
    assert torch.allclose(sampler.target_class_shares(), shares, rtol=1e-12, atol=0)


def test_rebalance_weights_are_the_reference_formula():
    """wutong16/DistributionBalancedLoss, ResampleLoss.rebalance_weight before its smoothing:
    ``freq_inv / sum(gt_labels * freq_inv, dim=1)``, every column."""
    labelled = Y[Y.any(1)]
    counts = labelled.sum(0)
    freq_inv = 1.0 / counts.double()
    reference = freq_inv[None, :] / (labelled.double() * freq_inv).sum(1, keepdim=True)
    assert torch.allclose(rebalance_weights(labelled, counts), reference, rtol=1e-12, atol=0)
    sampler = MultiLabelClassAwareSampler(Y)
    rows = torch.nonzero(Y.any(1)).flatten()
    assert torch.allclose(sampler.rebalance_weights(rows), reference, rtol=1e-12, atol=0)
    # r = P^C / P^I: for a positive label, the share of the sample's draws that come through it
    assert torch.allclose(
        (reference * labelled).sum(1), torch.ones(len(labelled), dtype=torch.float64)
    )
    with pytest.raises(ValueError, match="row 0 has no positive label"):
        rebalance_weights([[0, 0, 0]], class_counts=[3, 2, 1])


# ------------------------------------------------------------------ what is drawn


def test_class_aware_draws_each_label_share_within_its_tolerance():
    """Every draw is independent, so the number of draws that carry class c is exactly
    Binomial(M, q_c), q_c = sum_i p_i y_ic: the test allows z standard deviations, z the
    two-sided normal quantile at ALPHA with a Bonferroni correction over the C classes (M q_c
    is at least ~10^4 here, where the normal approximation of the binomial is close). The same
    counts fall outside the instance-balanced intention's tolerance: the test can fail."""
    draws = 200_000
    sampler = MultiLabelClassAwareSampler(Y, num_samples=draws, seed=11)
    stats = multilabel_sampling_stats(sampler.epoch_indices(), Y, sampler.target_class_shares())
    z = bonferroni_z(Y.shape[1])

    def within(q: torch.Tensor) -> torch.Tensor:
        return (stats.counts - draws * q).abs() <= z * (draws * q * (1 - q)).sqrt()

    exact = exact_class_aware(Y, [Fraction(1, 10)] * 10)  # the formula, not the sampler's
    q = torch.tensor([float(p) for p in exact], dtype=torch.float64) @ Y.double()
    assert (draws * q).min() > 1e4 and within(q).all(), (stats.counts, draws * q)
    assert torch.allclose(stats.shares, stats.target, atol=0.01)
    assert stats.never_drawn == pytest.approx(float((~Y.any(1)).double().mean()))
    instance = MultiLabelInstanceSampler(Y).item_probabilities() @ Y.double()
    assert not within(instance)[-1]  # the tail is drawn far more often than instance-balanced


def test_class_aware_draws_every_sample_at_its_probability():
    """Pearson's chi-square over the samples that can be drawn (the smallest expected count is
    over 20), df = K - 1; its quantile at 1 - ALPHA from the Wilson-Hilferty approximation."""
    draws = 200_000
    sampler = MultiLabelClassAwareSampler(Y, num_samples=draws, seed=12)
    p = torch.tensor([float(p) for p in exact_class_aware(Y, [Fraction(1, 10)] * 10)])
    drawable = p > 0
    observed = torch.bincount(sampler.epoch_indices(), minlength=len(Y)).double()
    expected = draws * p[drawable]
    assert expected.min() > 20 and observed[~drawable].sum() == 0
    chi2 = float(((observed[drawable] - expected) ** 2 / expected).sum())
    df = int(drawable.sum()) - 1
    quantile = (
        df * (1 - 2 / (9 * df) + NormalDist().inv_cdf(1 - ALPHA) * (2 / (9 * df)) ** 0.5) ** 3
    )
    assert chi2 < quantile, (chi2, quantile)


def test_statistics_count_co_labels():
    stats = multilabel_sampling_stats([0, 1, 1, 2], [[1, 0, 0], [1, 1, 0], [0, 0, 0], [0, 0, 1]])
    assert stats.counts.tolist() == [3, 2, 0]
    assert stats.shares.tolist() == [0.6, 0.4, 0.0]
    assert stats.per_draw.tolist() == [0.75, 0.5, 0.0]
    assert stats.labels_per_draw == 1.25 and stats.max_repeats == 2 and stats.never_drawn == 0.25
    assert stats.imbalance_ratio == float("inf") and stats.target is None
    with pytest.raises(ValueError, match="no drawn sample has a positive label"):
        multilabel_sampling_stats([2], [[1, 0], [0, 1], [0, 0]])
    with pytest.raises(ValueError, match="target: expected 2 shares"):
        multilabel_sampling_stats([0], [[1, 0]], target=[1.0])


# ------------------------------------------------------------------ the core's protocol

BUILDERS = {
    "instance": lambda **kw: MultiLabelInstanceSampler(Y, **kw),
    "class_aware": lambda **kw: MultiLabelClassAwareSampler(Y, **kw),
    "weighted": lambda **kw: MultiLabelWeightedSampler(Y, q=0.5, aggregate="max", **kw),
}


@pytest.mark.parametrize("name", BUILDERS)
def test_len_seed_and_epochs(name):
    sampler = BUILDERS[name](seed=7, num_samples=1234)
    assert len(sampler) == len(list(sampler)) == 1234
    again = BUILDERS[name](seed=7, num_samples=1234)
    assert list(again) == list(sampler)
    first = sampler.epoch_indices().clone()
    sampler.set_epoch(1)
    assert not torch.equal(sampler.epoch_indices(), first)
    assert not torch.equal(BUILDERS[name](seed=8, num_samples=1234).epoch_indices(), first)


@pytest.mark.parametrize("name", BUILDERS)
def test_resume_mid_epoch_yields_the_rest(name):
    sampler = BUILDERS[name](seed=2)
    sampler.set_epoch(3)
    whole = sampler.epoch_indices().tolist()
    iterator = iter(sampler)
    taken = [next(iterator) for _ in range(500)]
    state = sampler.state_dict()
    restored = BUILDERS[name](seed=2)
    restored.load_state_dict(state)
    assert taken + list(restored) == whole and len(restored) == len(whole)


@pytest.mark.parametrize("name", BUILDERS)
def test_ranks_share_one_global_draw(name):
    world = 3
    alone = BUILDERS[name](seed=4, num_samples=1000).global_indices()
    shards = [
        BUILDERS[name](seed=4, num_samples=1000, rank=r, world_size=world) for r in range(world)
    ]
    for shard in shards:
        shard.set_epoch(2)
    parts = [list(shard) for shard in shards]
    assert {len(p) for p in parts} == {len(shards[0])} == {334}
    assert [(s.rank, s.num_replicas) for s in shards] == [(r, world) for r in range(world)]
    interleaved = [parts[r][k] for k in range(334) for r in range(world)]
    global_draw = shards[0].global_indices().tolist()
    assert interleaved == (global_draw + global_draw[:2])  # padded by repeating the start
    assert not torch.equal(alone, shards[0].global_indices())  # epoch 2 is not epoch 0
    epoch0 = BUILDERS[name](seed=4, num_samples=1000, rank=1, world_size=world)
    assert torch.equal(epoch0.global_indices(), alone)  # the draw does not depend on the world


def test_weights_and_draws_do_not_depend_on_the_thread_count():
    labels = long_tailed_multilabel(100_000, 10, seed=1)  # above torch's parallel grain size
    builds = [
        lambda: MultiLabelClassAwareSampler(labels, seed=1),
        lambda: MultiLabelWeightedSampler(labels, aggregate="mean", q=0.5, seed=1),
        lambda: MultiLabelWeightedSampler(labels, aggregate="max", seed=1),
    ]
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 3):
            torch.set_num_threads(threads)
            runs.append([build() for build in builds])
    finally:
        torch.set_num_threads(before)
    for one, three in zip(*runs, strict=True):
        assert torch.equal(one.item_probabilities(), three.item_probabilities())
        assert torch.equal(one.epoch_indices(), three.epoch_indices())


# ------------------------------------------------------------------ label checks


@pytest.mark.parametrize(
    "convert",
    [
        lambda y: y,
        lambda y: y.long(),
        lambda y: y.float(),
        lambda y: y.long().tolist(),
        lambda y: y.numpy().astype(np.uint8),
    ],
    ids=["bool", "int", "float", "lists", "numpy"],
)
def test_label_matrix_forms_agree(convert):
    sampler = MultiLabelClassAwareSampler(convert(Y[:50]), seed=1)
    assert torch.equal(sampler.labels, Y[:50]) and sampler.num_classes == 10
    assert torch.equal(sampler.class_counts, Y[:50].sum(0))


@pytest.mark.parametrize(
    "labels, kwargs, message",
    [
        ([0, 1, 2], {}, r"1-D vector of shape \(3,\).*use the single-label samplers"),
        (torch.zeros(2, 2, 2), {}, r"expected an \(N, C\) 0/1 matrix, got shape \(2, 2, 2\)"),
        (torch.zeros(0, 3), {}, "empty matrix"),
        ([[1, 0], [0, 2]], {}, "entry 2 at row 1, column 1; entries must be 0 or 1"),
        ([[1, -1]], {}, "entry -1 at row 0, column 1.*labels.clamp"),
        ([[1.0, float("nan")]], {}, "NaN or infinite entry at row 0, column 1"),
        ([[1, 0], [0]], {}, "could not convert to a tensor"),
        ([[1, 0]], {"num_classes": 3}, "num_classes=3 but labels have 2 columns"),
        ([[0, 0], [0, 0]], {}, "no row has a positive label"),
    ],
)
def test_label_errors_name_the_fix(labels, kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiLabelClassAwareSampler(labels, **kwargs)


def test_parameter_errors_name_the_fix():
    with pytest.raises(ValueError, match="replacement=False: class-aware sampling draws with"):
        MultiLabelClassAwareSampler(Y, replacement=False)
    with pytest.raises(ValueError, match="aggregate='median' is unknown"):
        MultiLabelWeightedSampler(Y, aggregate="median")
    labelled = int(Y.any(1).sum())
    with pytest.raises(ValueError, match=f"exceeds the {labelled} samples with positive weight"):
        MultiLabelWeightedSampler(Y, replacement=False, num_samples=labelled + 1)
    order = MultiLabelWeightedSampler(Y, replacement=False, num_samples=labelled).epoch_indices()
    assert sorted(order.tolist()) == torch.nonzero(Y.any(1)).flatten().tolist()


@pytest.mark.parametrize("module", [samplers.multilabel, samplers.multilabel_stats])
def test_docstring_examples_run(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
