"""What each strategy draws, checked against its target with bounds from the distribution."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chi2

import samplers
from samplers import sampling_stats
from samplers.strategies import schedule_progress
from tests.helpers.strategies import LABELS

pytestmark = pytest.mark.unit  # in one process, seconds

COUNTS = torch.bincount(LABELS).double()


def chi_square_ok(
    indices: torch.Tensor, labels: torch.Tensor, target: torch.Tensor, level: float = 1e-4
) -> None:
    """Pearson's test of the drawn class counts against a multinomial with ``target``; fails
    only when the p-value drops below ``level`` (fixed seeds: the outcome is deterministic)."""
    counts = torch.bincount(labels[indices.reshape(-1)], minlength=target.numel()).double()
    expected = target * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "drew a class whose target share is zero"
    statistic = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    bound = chi2.ppf(1 - level, df=int(keep.sum()) - 1)
    assert statistic < bound, f"chi-square {statistic:.1f} >= {bound:.1f}"


@pytest.mark.parametrize(
    ("q", "expected"),
    [(1.0, COUNTS), (0.5, COUNTS.sqrt()), (0.0, torch.ones(5, dtype=torch.float64))],
)
def test_weighted_power_targets(q, expected):
    sampler = samplers.WeightedSampler(LABELS, q=q, num_samples=50_000, seed=0)
    target = expected / expected.sum()
    assert torch.allclose(sampler.target_class_shares(), target)
    chi_square_ok(sampler.epoch_indices(), LABELS, target)


def test_weighted_effective_number_and_explicit_weights():
    beta = 0.99
    effective = (1 - beta) / (1 - beta**COUNTS)
    sampler = samplers.WeightedSampler(LABELS, beta=beta, num_samples=40_000, seed=1)
    assert torch.allclose(sampler.target_class_shares(), effective / effective.sum())
    chi_square_ok(sampler.epoch_indices(), LABELS, effective / effective.sum())
    scaled = samplers.WeightedSampler(
        LABELS, class_weights=[5, 5, 10, 10, 20], num_samples=40_000, seed=2
    )
    target = torch.tensor([0.1, 0.1, 0.2, 0.2, 0.4], dtype=torch.float64)
    assert torch.allclose(scaled.target_class_shares(), target)
    chi_square_ok(scaled.epoch_indices(), LABELS, target)


def test_sample_weights_are_drawn_in_proportion():
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0] * 25)
    labels = torch.arange(100) % 4  # each "class" gathers one weight level
    sampler = samplers.WeightedSampler(labels, sample_weights=weights, num_samples=30_000, seed=3)
    chi_square_ok(
        sampler.epoch_indices(), labels, torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    )


def test_within_class_positions_are_uniform():
    labels = torch.zeros(10, dtype=torch.long)
    drawn = samplers.WeightedSampler(labels, num_samples=20_000, seed=4).epoch_indices()
    chi_square_ok(drawn, torch.arange(10), torch.full((10,), 0.1, dtype=torch.float64))


def test_without_replacement_draws_distinct_samples():
    sampler = samplers.WeightedSampler(LABELS, q=0.0, replacement=False, num_samples=100, seed=5)
    drawn = sampler.epoch_indices()
    assert drawn.unique().numel() == 100
    # The weighted order favours the tail: 100 picks under class-balanced weights hold every
    # tail sample far more often than under instance-balanced ones.
    assert (LABELS[drawn] == 4).sum() == 3
    uniform = samplers.UniformSampler(LABELS, seed=5)
    assert sorted(uniform.epoch_indices().tolist()) == list(range(len(LABELS)))


def test_uniform_with_longer_epoch_and_replacement():
    sampler = samplers.UniformSampler(LABELS, replacement=True, num_samples=3 * len(LABELS), seed=6)
    assert len(sampler) == len(list(sampler)) == 3 * len(LABELS)
    chi_square_ok(sampler.epoch_indices(), LABELS, COUNTS / COUNTS.sum())


def test_fixed_class_k_by_m_batches_have_exact_composition():
    sampler = samplers.FixedClassSampler(
        LABELS, classes_per_batch=3, samples_per_class=3, num_batches=500, seed=7
    )
    batches = sampler.epoch_indices()
    assert batches.shape == (500, 9) and len(list(sampler)) == len(sampler) == 500
    seen_classes = torch.zeros(5)
    for batch in batches:
        classes, per_class = LABELS[batch].unique(return_counts=True)
        assert classes.numel() == 3 and (per_class == 3).all()
        assert batch.unique().numel() == 9, "classes of 3+ samples never repeat inside a batch"
        seen_classes[classes] += 1
    # Classes chosen uniformly among all five (class 4 has exactly 3): each in 3/5 of batches.
    chi_square_ok(
        torch.repeat_interleave(torch.arange(5), seen_classes.long()),
        torch.arange(5),
        torch.full((5,), 0.2, dtype=torch.float64),
    )


def test_fixed_class_small_classes_repeat_only_their_own_members():
    """The issue's case: labels [0,1,2,3]*3 minus one; class 3 (2 samples) below a quota of 3."""
    labels = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2])
    sampler = samplers.FixedClassSampler(
        labels, classes_per_batch=2, samples_per_class=3, num_batches=200, seed=1
    )
    batches = sampler.epoch_indices()
    seen = set()
    for batch in batches:
        for c in labels[batch].unique().tolist():
            members = batch[labels[batch] == c]
            assert members.numel() == 3
            seen.add(c)
            if c == 3:  # two members for three places: both, one of them twice
                assert sorted(set(members.tolist())) == [3, 7]
            else:
                assert members.unique().numel() == 3
    assert seen == {0, 1, 2, 3}, "every class appears, the small one included"
    with pytest.raises(ValueError, match="class 3 has 2 samples but a quota of 3"):
        samplers.FixedClassSampler(
            labels, classes_per_batch=2, samples_per_class=3, repeats="never"
        )
    with pytest.raises(ValueError, match="class 3 has 2 samples but a quota of 3"):
        samplers.FixedClassSampler(labels, quotas=[1, 1, 1, 3], replacement=False)


def test_fixed_class_cycles_through_a_class_before_reusing_members():
    labels = torch.tensor([0] * 12 + [1] * 7)
    sampler = samplers.FixedClassSampler(labels, quotas=[4, 2], num_batches=14, seed=8)
    batches = sampler.epoch_indices()
    for batch in batches:
        assert (labels[batch] == 0).sum() == 4 and (labels[batch] == 1).sum() == 2
        assert batch.unique().numel() == 6
    # Class 0: three batches per pass of all 12. Class 1 (7 members, 2 per batch): four batches
    # per pass, the fourth completed by a member of the same pass, so 7 distinct every 4 batches.
    for start in range(0, 12, 3):
        assert batches[start : start + 3, :4].unique().numel() == 12
    for start in range(0, 12, 4):
        assert batches[start : start + 4, 4:].unique().numel() == 7


def test_fixed_class_coverage_with_one_per_class():
    """Quotas of 1 per class: a class of n members shows all n in its first n batches (with
    independent draws about 1 - 1/e of them would show)."""
    labels = torch.arange(3000) % 3  # 1000 per class
    batches = samplers.FixedClassSampler(
        labels, quotas=[1, 1, 1], num_batches=1000, seed=3
    ).epoch_indices()
    for c in range(3):
        assert batches[:, c].unique().numel() == 1000
    independent = samplers.FixedClassSampler(
        labels, quotas=[1, 1, 1], num_batches=1000, seed=3, repeats="independent"
    ).epoch_indices()
    # Distinct among 1000 uniform draws from 1000: mean 632.3, sd 8.8; 700 is 7.6 sd away.
    assert independent[:, 0].unique().numel() < 700


def test_fixed_class_independent_draws_are_uniform_within_a_class():
    labels = torch.tensor([0] * 10 + [1] * 10)
    batches = samplers.FixedClassSampler(
        labels, quotas=[3, 1], num_batches=5000, seed=2, repeats="independent"
    ).epoch_indices()
    chi_square_ok(batches[:, :3], torch.arange(20), torch.tensor([0.1] * 10 + [0.0] * 10).double())


def test_fixed_class_validation():
    with pytest.raises(ValueError, match="class 4 has 3 samples but a quota of 5"):
        samplers.FixedClassSampler(LABELS, quotas=[5, 5, 5, 5, 5], repeats="never")
    with pytest.raises(ValueError, match="batch_size=10 does not match"):
        samplers.FixedClassSampler(LABELS, classes_per_batch=2, samples_per_class=4, batch_size=10)
    with pytest.raises(ValueError, match="only 5 classes have samples"):
        samplers.FixedClassSampler(LABELS, classes_per_batch=6, samples_per_class=2)
    with pytest.raises(ValueError, match="num_batches must be a positive integer"):
        samplers.FixedClassSampler(LABELS, classes_per_batch=2, samples_per_class=2, num_batches=0)
    with pytest.raises(ValueError, match="repeats='sometimes' is unknown"):
        samplers.FixedClassSampler(LABELS, quotas=[1] * 5, repeats="sometimes")
    with pytest.raises(ValueError, match="give repeats or replacement, not both"):
        samplers.FixedClassSampler(LABELS, quotas=[1] * 5, repeats="never", replacement=True)
    with pytest.raises(ValueError, match="class 2 has no samples but a quota of 1"):
        samplers.FixedClassSampler([0, 1, 3], quotas=[1, 1, 1, 1])


@pytest.mark.parametrize("schedule", ["linear", "cosine", "step"])
def test_annealed_moves_from_balanced_to_instance_shares(schedule):
    sampler = samplers.AnnealedSampler(
        LABELS, total_epochs=10, schedule=schedule, steps=2, num_samples=30_000
    )
    balanced, instance = torch.full((5,), 0.2, dtype=torch.float64), COUNTS / COUNTS.sum()
    for epoch in (0, 3, 5, 10, 12):
        sampler.set_epoch(epoch)
        s = schedule_progress(epoch, 10, schedule, 2)
        target = (1 - s) * balanced + s * instance
        assert torch.allclose(sampler.target_class_shares(), target)
        chi_square_ok(sampler.epoch_indices(), LABELS, target)
    assert (
        schedule_progress(0, 10, schedule, 2) == 0 and schedule_progress(10, 10, schedule, 2) == 1
    )
    assert schedule_progress(4, 10, "step", 2) == 0 and schedule_progress(5, 10, "step", 2) == 0.5


def test_annealed_power_form_and_reverse_direction():
    sampler = samplers.AnnealedSampler(LABELS, total_epochs=4, q_start=1.0, q_end=0.0, mode="power")
    sampler.set_epoch(2)
    expected = COUNTS**0.5
    assert torch.allclose(sampler.target_class_shares(), expected / expected.sum())


def test_hard_mined_moves_probability_toward_high_loss_samples():
    labels = torch.zeros(100, dtype=torch.long)
    sampler = samplers.HardMinedSampler(labels, num_samples=20_000, floor=0.2, seed=9)
    first = sampler.epoch_indices()
    chi_square_ok(first, torch.arange(100) // 10, torch.full((10,), 0.1, dtype=torch.float64))
    hard = torch.arange(10)  # samples 0-9 get loss 5, the rest 0.5
    sampler.update(torch.arange(100), torch.where(torch.arange(100) < 10, 5.0, 0.5))
    sampler.set_epoch(1)
    scores = torch.where(torch.arange(100) < 10, 5.0, 0.5).double()
    expected = 0.8 * scores / scores.sum() + 0.2 / 100
    assert torch.allclose(sampler.current_distribution().weights, expected)
    drawn = sampler.epoch_indices()
    share_hard = float(torch.isin(drawn, hard).double().mean())
    p = float(expected[:10].sum())
    assert abs(share_hard - p) < 4 * math.sqrt(p * (1 - p) / drawn.numel())
    assert p > 0.4  # ten of a hundred samples now get more than 40% of the draws


def test_hard_mined_ema_unseen_mean_and_class_balance():
    labels = torch.tensor([0, 0, 0, 1])
    sampler = samplers.HardMinedSampler(labels, momentum=0.5, floor=0.5, class_balanced=True)
    assert torch.allclose(
        sampler.target_class_shares(), torch.tensor([0.5, 0.5], dtype=torch.float64)
    )
    sampler.update([0, 0, 1], [2.0, 4.0, 1.0])  # duplicates average: sample 0 sees 3.0
    sampler.update([0], [1.0])
    assert torch.allclose(sampler.loss_ema[:2], torch.tensor([2.0, 1.0], dtype=torch.float64))
    sampler.set_epoch(1)
    weights = sampler.current_distribution().weights
    # Unseen samples 2 and 3 score the mean 1.5; classes keep half the mass each.
    assert torch.allclose(weights[labels == 1].sum(), torch.tensor(0.5, dtype=torch.float64))
    assert torch.allclose(
        weights[:3], 0.5 * torch.tensor([2.0, 1.0, 1.5], dtype=torch.float64) / 4.5 * 0.5 + 0.5 / 6
    )


def test_hybrid_share_times_weight_is_the_target():
    sampler = samplers.HybridSampler(LABELS, q=0.5, num_samples=60_000, seed=10)
    shares = sampler.target_class_shares()
    assert torch.allclose(
        shares * sampler.class_loss_weights(), torch.full((5,), 0.2, dtype=torch.float64)
    )
    stats = sampling_stats(sampler.epoch_indices(), LABELS, shares)
    chi_square_ok(sampler.epoch_indices(), LABELS, COUNTS.sqrt() / COUNTS.sqrt().sum())
    # What was actually drawn, times the weights, is the target up to sampling noise: a drawn
    # share has standard deviation sqrt(p (1 - p) / n); allow four of them, scaled by the weight.
    weights = sampler.class_loss_weights()
    spread = 4 * weights * (shares * (1 - shares) / 60_000).sqrt()
    assert ((stats.shares * weights - 0.2).abs() <= spread).all()


def test_sampling_stats_on_a_hand_computed_case():
    labels = torch.tensor([0, 0, 1, 1, 2])
    stats = sampling_stats(
        torch.tensor([0, 0, 0, 2, 4, 4]), labels, torch.tensor([0.5, 0.25, 0.25])
    )
    assert stats.counts.tolist() == [3, 1, 2]
    assert torch.allclose(stats.shares, torch.tensor([0.5, 1 / 6, 1 / 3], dtype=torch.float64))
    assert stats.unique_ratio == 3 / 6 and stats.max_repeats == 3 and stats.never_drawn == 2 / 5
    kl = 0.5 * math.log(1) + (1 / 6) * math.log((1 / 6) / 0.25) + (1 / 3) * math.log((1 / 3) / 0.25)
    assert stats.kl_to_target == pytest.approx(kl)
    assert stats.imbalance_ratio == pytest.approx(3.0)
    assert sampling_stats(torch.tensor([0, 1]), labels).imbalance_ratio == math.inf


def test_more_than_two_to_the_24_samples():
    n = 2**24 + 1000  # torch.multinomial and WeightedRandomSampler refuse this many categories
    labels = torch.zeros(n, dtype=torch.long)
    labels[-1000:] = 1
    sampler = samplers.WeightedSampler(labels, q=0.0, num_samples=200_000, seed=11)
    drawn = sampler.epoch_indices()
    assert int(drawn.max()) >= 2**24  # the tail beyond 2^24 is reachable
    chi_square_ok(drawn, labels, torch.tensor([0.5, 0.5], dtype=torch.float64))


def test_hard_mined_temperature_and_a_class_with_zero_losses():
    labels = torch.tensor([0, 0, 1, 1, 1])
    sampler = samplers.HardMinedSampler(labels, temperature=0.5, floor=0.5)
    sampler.update([0, 1, 2], [1.0, 2.0, 1.0])
    sampler.set_epoch(1)
    weights = sampler.current_distribution().weights
    sharpened = torch.exp(torch.tensor([1.0, 2.0, 1.0], dtype=torch.float64) / 0.5)
    mean = sharpened.mean()
    expected = torch.cat([sharpened, mean.repeat(2)])  # samples 3 and 4 unseen: the mean weight
    assert torch.allclose(weights, 0.5 * expected / expected.sum() + 0.5 / 5)
    balanced = samplers.HardMinedSampler(labels, class_balanced=True, floor=0.2)
    balanced.update([0, 1, 2, 3, 4], [1.0, 3.0, 0.0, 0.0, 0.0])  # class 1: all zero losses
    balanced.set_epoch(1)
    weights = balanced.current_distribution().weights
    assert torch.allclose(weights[2:], torch.full((3,), 0.5 / 3, dtype=torch.float64))
    assert torch.allclose(
        weights[:2], 0.8 * torch.tensor([0.125, 0.375], dtype=torch.float64) + 0.2 * 0.25
    )


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_annealed_follows_its_formula(schedule):
    """p(t) = (1 - s) p_CB + s p_IB, s reaching 1 at t = T (after training) by default.
    Kang et al.'s progressive schedule: tests/test_samplers_progressive.py."""
    instance, balanced = COUNTS / COUNTS.sum(), torch.full((5,), 0.2, dtype=torch.float64)
    annealed = samplers.AnnealedSampler(LABELS, total_epochs=10, schedule=schedule)
    for epoch, s in [(0, 0.0), (5, 0.5), (10, 1.0)]:  # t = 0, T/2, T: s = 0, 1/2, 1 either way
        annealed.set_epoch(epoch)
        assert torch.allclose(annealed.target_class_shares(), (1 - s) * balanced + s * instance)


def test_deferred_switches_exactly_at_its_epoch():
    instance, balanced = COUNTS / COUNTS.sum(), torch.full((5,), 0.2, dtype=torch.float64)
    sampler = samplers.DeferredSampler(LABELS, total_epochs=200, num_samples=20_000, seed=12)
    assert sampler.switch_epoch == 160  # 80% of 200, as loss=drw
    for epoch, target in [(0, instance), (159, instance), (160, balanced), (199, balanced)]:
        sampler.set_epoch(epoch)
        assert torch.allclose(sampler.target_class_shares(), target)
        chi_square_ok(sampler.epoch_indices(), LABELS, target)
    assert samplers.DeferredSampler(LABELS, total_epochs=10, defer_fraction=0.5).switch_epoch == 5
    # An explicit switch epoch (cRT's classifier stage) wins over the fraction.
    explicit = samplers.DeferredSampler(LABELS, total_epochs=10, switch_epoch=7)
    for epoch, target in [(6, instance), (7, balanced)]:
        explicit.set_epoch(epoch)
        assert torch.allclose(explicit.target_class_shares(), target)
    with pytest.raises(ValueError, match="total_epochs .* or switch_epoch"):
        samplers.DeferredSampler(LABELS)


def test_deferred_shuffles_in_the_uniform_order_before_its_switch():
    """As the reference DRS: every sample once an epoch before the switch, in exactly the order
    the uniform sampler draws with the same seed (so the runs share that training), then
    class-balanced with replacement."""
    uniform = samplers.UniformSampler(LABELS, seed=3)
    deferred = samplers.DeferredSampler(LABELS, total_epochs=5, seed=3)
    for epoch in range(4):
        uniform.set_epoch(epoch)
        deferred.set_epoch(epoch)
        assert torch.equal(deferred.epoch_indices(), uniform.epoch_indices())
        assert torch.equal(deferred.target_class_shares(), uniform.target_class_shares())
    deferred.set_epoch(4)
    assert deferred.epoch_indices().unique().numel() < len(LABELS)  # with replacement now
    # Not instance-balanced, or more than the dataset an epoch: drawn with replacement.
    for sqrt in (
        samplers.DeferredSampler(LABELS, total_epochs=5, q_before=0.5, seed=3),
        samplers.DeferredSampler(LABELS, total_epochs=5, num_samples=2 * len(LABELS), seed=3),
    ):
        assert not sqrt.shuffles_before
        assert sqrt.epoch_indices().unique().numel() < len(LABELS)


def test_mixture_shares_per_batch_are_exact():
    current, memory = torch.arange(0, 700), torch.arange(700, 778)  # a replay memory of 78
    sampler = samplers.MixtureSampler(
        LABELS, components=[current, memory], shares=[0.75, 0.25], batch_size=12, seed=13
    )
    assert sampler.counts == [9, 3] and len(sampler) == len(LABELS) // 12
    batches = sampler.epoch_indices()
    assert batches.shape == (len(sampler), 12)
    assert (batches[:, :9] < 700).all() and (batches[:, 9:] >= 700).all()
    for batch in batches:
        assert batch.unique().numel() == 12  # pools larger than their count: no repeats
    # The memory is read in passes of 26 batches (78 / 3): all of it in each pass.
    assert batches[:26, 9:].unique().numel() == 78
    memory_shares = torch.bincount(LABELS[memory], minlength=5).double() / 78
    current_shares = torch.bincount(LABELS[current], minlength=5).double() / 700
    assert torch.allclose(
        sampler.target_class_shares(), 0.75 * current_shares + 0.25 * memory_shares
    )


def test_mixture_of_strategies_takes_each_share_from_its_component():
    import functools

    sampler = samplers.MixtureSampler(
        LABELS,
        components=[samplers.UniformSampler, functools.partial(samplers.WeightedSampler, q=0.0)],
        shares=[0.7, 0.3],
        batch_size=10,
        num_batches=111,  # 7 x 111 = 777 of the 778 samples: one shuffle without replacement
        seed=14,
    )
    assert sampler.counts == [7, 3]
    instance, balanced = COUNTS / COUNTS.sum(), torch.full((5,), 0.2, dtype=torch.float64)
    assert torch.allclose(sampler.target_class_shares(), 0.7 * instance + 0.3 * balanced)
    batches = sampler.epoch_indices()
    chi_square_ok(batches[:, 7:], LABELS, balanced)  # the class-balanced columns
    # The instance-balanced columns are one shuffle without replacement: no sample twice.
    assert batches[:, :7].unique().numel() == 777
