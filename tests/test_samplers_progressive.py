"""Progressively-balanced sampling against the reference's schedule: Kang et al.'s
ClassPrioritySampler (facebookresearch/classifier-balancing, data/ClassPrioritySampler.py) with
the progressive settings (``lam=None, cycle=0, manual_only=True, balance_scale=1``), written out
here from its code."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import samplers
from tests.helpers.strategies import LABELS
from tests.test_samplers_strategies import chi_square_ok

pytestmark = pytest.mark.unit  # in one process, seconds

COUNTS = torch.bincount(LABELS).double()


def kang_shares(counts: torch.Tensor, epochs: int, epoch: int) -> torch.Tensor:
    """The reference's class shares in ``epoch``: ``lams = np.linspace(0, 1, epochs)``,
    ``lam = lams[clip(epoch, 0, epochs - 1)]``, manual weights ``lam * balanced + (1 - lam) *
    counts`` with the balanced weights (all equal) scaled to the same sum as the counts."""
    cnts = counts.numpy()
    lam = np.linspace(0, 1, epochs)[np.clip(epoch, 0, epochs - 1)]
    balanced = np.ones(len(cnts))
    balanced *= cnts.sum() / balanced.sum()
    manual = lam * balanced + (1 - lam) * cnts
    return torch.from_numpy(manual / manual.sum())


@pytest.mark.parametrize("epochs", [1, 2, 10, 200])
def test_progressive_follows_kangs_schedule_and_ends_class_balanced(epochs):
    sampler = samplers.ProgressiveSampler(LABELS, total_epochs=epochs)
    for epoch in {0, 1, epochs // 2, max(epochs - 2, 0), epochs - 1, epochs, epochs + 3}:
        sampler.set_epoch(epoch)
        assert torch.allclose(sampler.target_class_shares(), kang_shares(COUNTS, epochs, epoch))
    sampler.set_epoch(epochs - 1)
    last = sampler.target_class_shares()
    if epochs > 1:  # one epoch: the reference's linspace(0, 1, 1) is [0], instance-balanced
        assert torch.allclose(last, torch.full((5,), 0.2, dtype=torch.float64), atol=1e-15)


def test_progressive_last_epoch_draws_class_balanced():
    sampler = samplers.ProgressiveSampler(LABELS, total_epochs=10, num_samples=20_000, seed=3)
    sampler.set_epoch(9)
    chi_square_ok(sampler.epoch_indices(), LABELS, torch.full((5,), 0.2, dtype=torch.float64))


def test_progressive_without_endpoint_keeps_the_t_over_T_schedule():
    """endpoint=False: p(t) = (1 - t/T) p_IB + (t/T) p_CB, the last epoch (T-1)/T balanced."""
    instance, balanced = COUNTS / COUNTS.sum(), torch.full((5,), 0.2, dtype=torch.float64)
    sampler = samplers.ProgressiveSampler(LABELS, total_epochs=10, endpoint=False)
    for epoch in (0, 5, 9, 10):
        sampler.set_epoch(epoch)
        s = epoch / 10
        assert torch.allclose(sampler.target_class_shares(), (1 - s) * instance + s * balanced)


def test_annealed_can_end_on_its_end_distribution_in_the_last_epoch():
    sampler = samplers.AnnealedSampler(LABELS, total_epochs=4, schedule="step", endpoint=True)
    sampler.set_epoch(2)  # t = 2/3: the one step not yet taken
    assert torch.allclose(sampler.target_class_shares(), torch.full((5,), 0.2, dtype=torch.float64))
    sampler.set_epoch(3)
    assert torch.allclose(sampler.target_class_shares(), COUNTS / COUNTS.sum())


def test_endpoint_must_be_a_bool():
    with pytest.raises(ValueError, match="endpoint must be True or False, got 'no'"):
        samplers.ProgressiveSampler(LABELS, total_epochs=10, endpoint="no")


def test_the_progressive_recipe_builds_kangs_schedule():
    from runner.build import build
    from tests.conftest import compose_config

    cfg = compose_config(["+method=progressive", "trainer.epochs=7"])
    sampler = build("sampler", cfg.sampler, labels=LABELS)
    assert isinstance(sampler, samplers.ProgressiveSampler) and sampler.endpoint
    sampler.set_epoch(6)
    assert torch.allclose(sampler.target_class_shares(), kang_shares(COUNTS, 7, 6))
