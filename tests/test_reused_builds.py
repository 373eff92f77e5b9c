"""Builds that runs prepared together make once (runner.reused_builds, within build_parts): a
run whose data and frozen model would be built exactly as an earlier one's gets copies of those,
and is then as if it had built them itself: the same tensors, the same head, the same random
state after; its own model and data object; nothing reused across seeds, outside the block,
or from a build that failed."""

from __future__ import annotations

import logging

import pytest
import torch

from runner.build import build_parts
from runner.errors import UserError
from runner.reused_builds import reused, reusing_builds
from tests.conftest import compose_config

pytestmark = pytest.mark.unit  # in one process, seconds

REUSED = "as an earlier run here built it"


def _config(tmp_path, *overrides):
    return compose_config(
        [
            "data=digits_lt",  # a resnet18 frozen at its seeded initialisation: a seed's own
            "data.val_per_class=20",
            "model=torchvision",
            "model.freeze=true",
            "trainer.augment=false",
            "trainer.progress=false",
            f"features.cache_dir={tmp_path / 'features'}",
            *overrides,
        ]
    )


def _same_parts(a, b) -> None:
    for split in ("train_x", "train_y", "val_x", "val_y", "test_x", "test_y"):
        assert torch.equal(getattr(a.data, split), getattr(b.data, split)), split
    wa, wb = a.state.model.state_dict(), b.state.model.state_dict()
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    sa, sb = a.frozen.backbone.state_dict(), b.frozen.backbone.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_runs_built_together_reuse_and_equal_runs_built_apart(tmp_path, caplog):
    jobs = [("+method=ce", "seed=0"), ("+method=tau_norm", "seed=0"), ("+method=ce", "seed=1")]
    configs = [_config(tmp_path, *job) for job in jobs]
    apart = []
    for config in configs:
        apart.append((build_parts(config), torch.get_rng_state()))
    caplog.set_level(logging.INFO, logger="runner")
    together = []
    with reusing_builds():
        for config in configs:
            together.append((build_parts(config), torch.get_rng_state()))
    reuses = [r.getMessage() for r in caplog.records if REUSED in r.getMessage()]
    assert reuses == [
        f"data: {REUSED} (the same config and random state)",
        f"model: {REUSED} (the same config and random state)",
    ]  # seed 0's second
    for (one, state_one), (other, state_other) in zip(apart, together, strict=True):
        _same_parts(one, other)
        assert torch.equal(state_one, state_other)  # what comes after draws the same
    ce, tau = together[0][0], together[1][0]
    assert ce.data is not tau.data and ce.state.model is not tau.state.model
    assert ce.data.train_x is tau.data.train_x  # the features themselves: one copy
    with torch.no_grad():
        ce.state.model.classifier.weight.add_(1.0)  # a run trains its own head
    assert not torch.equal(ce.state.model.classifier.weight, tau.state.model.classifier.weight)
    # A new block builds anew: nothing is kept from the last one.
    caplog.clear()
    with reusing_builds():
        build_parts(configs[0])
    assert not [r for r in caplog.records if REUSED in r.getMessage()]


def test_one_build_of_each_kind_is_kept():
    """Runs come seed by seed: another seed's build lets the last one go (it is not held
    beside what its runs hold), so going back builds again."""
    built = []

    def build(seed):
        def make():
            built.append(seed)
            return [seed]

        return make

    with reusing_builds():
        for seed in (0, 0, 1, 1, 0):
            torch.manual_seed(seed)
            reused("data", tuple, build(seed), list)
    assert built == [0, 1, 0]


def test_a_build_that_fails_is_not_kept_and_nothing_is_reused_outside():
    calls = []

    def failing():
        calls.append("failed")
        raise UserError("no")

    with reusing_builds():
        for _ in range(2):
            with pytest.raises(UserError):
                reused("thing", tuple, failing, list)
        assert calls == ["failed", "failed"]
        kept = reused("thing", tuple, lambda: [1], list)
        kept.append(2)  # the run's own copy
        assert reused("thing", tuple, lambda: [3], list) == [1]
    built = reused("thing", tuple, lambda: [4], list)
    assert built == [4]
