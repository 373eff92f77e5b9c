"""Heads trained at once (runner.train.stacked) against each trained alone by the loop
(runner.train.fit.fit): the same weights, the same records, up to float32 summation order.

The tolerance, derived: the two paths differ only in the order a batched matmul adds each
logit's D products and each gradient's B products, a few float32 ulps (2**-24 = 6e-8 relative)
per value and step. Plain SGD on a convex loss with a learning rate that trains does not
amplify a perturbation of the weights; momentum 0.9 sums at most 1 / (1 - 0.9) = 10 steps' worth.
Over S optimizer steps the weights then differ by at most S * 10 * 6e-8 relative to their
size: with S = 4 epochs * 10 batches (1,236 training rows, batches of 128), 2.4e-5. Losses,
the sampler's feedback and what it then intends to draw follow the weights (the same bound).
An accuracy changes only where two logits lie within that distance of each other, which these
fixed seeds do not produce, so accuracies must be equal.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runner.build import build_parts
from runner.tracking import Bystander
from runner.train.fit import fit
from runner.train.losses import ClassWeightedLoss, LogitAdjustedLoss
from runner.train.optimizer_steps import step_optimizers
from runner.train.run import Progress, RunContext
from runner.train.stacked import (
    _Head,
    _plain_losses,
    fit_stacked,
    stack_groups,
    why_not_stacked,
)
from tests.conftest import compose_config

pytestmark = pytest.mark.slow  # 30 runs built and trained in this process

EPOCHS = 4
BATCHES = 10  # ceil(1236 / 128), checked below
RELATIVE = EPOCHS * BATCHES * 10 * 2**-24  # the bound derived above
# Candidates that exercise what stacking must keep per head: class weights (class_balanced),
# per-sample feedback (hard_mined), a sampler that switches mid-run (drs), a post-hoc stage
# after the last epoch (tau_norm), a schedule over epochs (progressive); two seeds each.
JOBS = [
    (method, seed)
    for method in ("ce", "class_balanced", "hard_mined", "drs", "tau_norm", "progressive")
    for seed in (0, 1)
]


class Rows(Bystander):
    """A recorder that keeps every epoch's metrics, as the store would get them."""

    def __init__(self, name: str) -> None:
        super().__init__(name, name)
        self.rows: dict[int, dict[str, float]] = {}

    def log_metrics(self, metrics, step: int) -> None:
        self.rows[step] = {k: float(v) for k, v in metrics.items()}


def _runs(tmp_path: Path, jobs, extra=()) -> list[RunContext]:
    base = [
        "data.val_per_class=20",  # synthetic Gaussian clusters under a frozen random MLP
        "model.freeze=true",
        "trainer.augment=false",
        "trainer.progress=false",
        f"trainer.epochs={EPOCHS}",
        "trainer.lr=0.05",
        "trainer.checkpoint_every=0",
        f"features.cache_dir={tmp_path / 'features'}",
        *extra,
    ]
    runs = []
    for job in jobs:
        method, seed, *more = job
        parts = build_parts(compose_config([*base, f"+method={method}", f"seed={seed}", *more]))
        path = tmp_path / f"{method}-{seed}.pt"
        runs.append(RunContext(parts, Rows(f"{method}-{seed}"), Progress(), path))
    return runs


def _weights(run: RunContext) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in run.parts.state.model.parameters()])


def test_stacked_heads_train_as_each_alone(tmp_path):
    alone, stacked = _runs(tmp_path, JOBS), _runs(tmp_path, JOBS)
    assert len(alone[0].parts.data.train_y) == 1236
    for run in alone:
        fit(run)
    groups = stack_groups(stacked)
    # The random backbone is initialised from the seed: one group of six heads per seed.
    assert groups == [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 11]]
    for group in groups:
        assert fit_stacked([stacked[i] for i in group]) == [None] * len(group)
    for job, one, many in zip(JOBS, alone, stacked, strict=True):
        w1, w2 = _weights(one), _weights(many)
        assert (w1 - w2).abs().max() <= RELATIVE * w1.abs().max(), job
        rows1, rows2 = one.recorder.rows, many.recorder.rows
        assert sorted(rows1) == sorted(rows2) == list(range(1, EPOCHS + 1)), job
        for epoch, metrics in rows1.items():
            assert set(metrics) == set(rows2[epoch]), (job, epoch)
            for key, value in metrics.items():
                other = rows2[epoch][key]
                if "accuracy" in key or "recall" in key:
                    assert other == value, (job, epoch, key)
                else:
                    assert other == pytest.approx(value, rel=RELATIVE, abs=1e-12), (job, key)
        assert one.progress.best_epoch == many.progress.best_epoch
        assert one.parts.state.epoch == many.parts.state.epoch == EPOCHS


def test_heads_whose_samplers_draw_whole_batches_stack_by_their_batches(tmp_path):
    """fixed_class (8 classes x 16 per batch) and mixture draw whole batches of 128: 9 an
    epoch, not the index samplers' 10, so they stack apart from ce, each seed's pair at once."""
    jobs = [(m, seed) for m in ("fixed_class", "mixture", "ce") for seed in (0, 1)]
    alone, stacked = _runs(tmp_path, jobs), _runs(tmp_path, jobs)
    assert [why_not_stacked(run) for run in stacked] == [None] * len(jobs)
    assert stack_groups(stacked) == [[0, 2], [1, 3], [4], [5]]
    for run in alone:
        fit(run)
    for group in stack_groups(stacked):
        assert fit_stacked([stacked[i] for i in group]) == [None] * len(group)
    for job, one, many in zip(jobs, alone, stacked, strict=True):
        w1, w2 = _weights(one), _weights(many)
        assert (w1 - w2).abs().max() <= RELATIVE * w1.abs().max(), job
        last = one.recorder.rows[EPOCHS]
        assert (
            many.recorder.rows[EPOCHS]["test/balanced_accuracy"] == last["test/balanced_accuracy"]
        )
        drawn = {k: v for k, v in last.items() if k.startswith("sampling/")}
        assert drawn == {k: many.recorder.rows[EPOCHS][k] for k in drawn}, job  # the same draws


def test_a_diverging_head_fails_alone_and_the_others_train_on(tmp_path):
    jobs = [("ce", 0), ("ce", 0, "trainer.lr=1e38"), ("class_balanced", 0)]
    alone, stacked = _runs(tmp_path, jobs), _runs(tmp_path, jobs)
    errors = fit_stacked(stacked)
    assert errors[0] is None and errors[2] is None
    assert "trainer.lr=1e+38" in str(errors[1]) and "non-finite" in str(errors[1])
    for i in (0, 2):
        fit(alone[i])
        assert (_weights(alone[i]) - _weights(stacked[i])).abs().max() <= RELATIVE * _weights(
            alone[i]
        ).abs().max()


class InPlaceLoss(ClassWeightedLoss):
    """Cross-entropy whose code changes its logits in place first (by nothing), as a user's
    loss may."""

    def forward(self, logits, targets, epoch):
        logits.mul_(1.0)
        return super().forward(logits, targets, epoch)


def test_a_loss_that_changes_its_logits_in_place_stacks(tmp_path):
    jobs = [("ce", 0, f"loss._target_={__name__}.InPlaceLoss"), ("class_balanced", 0)]
    alone, stacked = _runs(tmp_path, jobs), _runs(tmp_path, jobs)
    assert fit_stacked(stacked) == [None, None]
    for one, many in zip(alone, stacked, strict=True):
        fit(one)
        w1, w2 = _weights(one), _weights(many)
        assert (w1 - w2).abs().max() <= RELATIVE * w1.abs().max()


def test_what_cannot_stack_says_why(tmp_path):
    crt, augmented = _runs(
        tmp_path, [("crt", 0, "trainer.classifier_epochs=1"), ("ce", 0, "model.freeze=false")]
    )
    assert "classifier stage" in str(why_not_stacked(crt))
    assert "cached features" in str(why_not_stacked(augmented))
    assert stack_groups([crt, augmented]) == []


def _sgd_heads(
    settings: list[dict], seed: int = 0
) -> list[tuple[torch.nn.Linear, torch.optim.SGD]]:
    torch.manual_seed(seed)
    heads = []
    for kwargs in settings:
        head = torch.nn.Linear(16, 5)
        heads.append((head, torch.optim.SGD(head.parameters(), **kwargs)))
    return heads


@pytest.mark.parametrize(
    "settings",
    [
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4},
        {"lr": 0.05, "momentum": 0.9, "nesterov": True, "dampening": 0.0},
        {"lr": 0.1},  # no momentum: no buffers
        {"lr": 0.1, "momentum": 0.5, "dampening": 0.1, "maximize": True},
    ],
)
def test_optimizers_stepped_together_step_as_each_alone_bit_for_bit(settings):
    """Five heads, two of them with another learning rate, and an SGD that must step by its
    own step() (two parameter groups), over six steps with fresh gradients: every weight and
    momentum buffer equal to each optimizer's own step(), to the last bit."""
    mixed = [settings, settings, {**settings, "lr": 0.3}, settings, {**settings, "lr": 0.3}]
    alone, together = _sgd_heads(mixed), _sgd_heads(mixed)
    for heads in (alone, together):
        head = torch.nn.Linear(16, 5)
        head.load_state_dict(heads[0][0].state_dict())
        groups = [{"params": [head.weight]}, {"params": [head.bias], "lr": 0.01}]
        heads.append((head, torch.optim.SGD(groups, **settings)))
    generator = torch.Generator().manual_seed(1)
    for _ in range(6):
        x = torch.randn(8, 16, generator=generator)
        for heads in (alone, together):
            for head, optimizer in heads:
                optimizer.zero_grad()
                head(x).square().mean().backward()
        for _, optimizer in alone:
            optimizer.step()
        step_optimizers([optimizer for _, optimizer in together])
    for (a, opt_a), (b, opt_b) in zip(alone, together, strict=True):
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(p, q)
            assert set(opt_a.state[p]) == set(opt_b.state[q])
            for key, value in opt_a.state[p].items():
                assert torch.equal(value, opt_b.state[q][key])


def test_a_loss_is_plain_cross_entropy_only_while_it_computes_nothing_else():
    counts = torch.tensor([50, 20, 5])
    plain = ClassWeightedLoss(counts, None, epochs=10, weights=None)
    drw = ClassWeightedLoss(counts, None, epochs=10, weights="inverse", defer_fraction=0.8)
    assert plain.plain_at(0) and plain.plain_at(9)
    assert drw.plain_at(7) and not drw.plain_at(8)  # the class weights from epoch 8
    assert not ClassWeightedLoss(counts, None, epochs=10, weights="inverse").plain_at(0)
    assert not ClassWeightedLoss(counts, None, epochs=10, weights=None, gamma=1.0).plain_at(0)
    assert not LogitAdjustedLoss(counts, None, epochs=10).plain_at(0)  # it adjusts
    assert not InPlaceLoss(counts, None, epochs=10, weights=None).plain_at(0)  # its own forward


def test_plain_heads_losses_and_gradients_are_each_heads_own_bit_for_bit():
    """Five heads, three of them plain cross-entropy: one call for the three gives each row's
    loss and each logit's gradient exactly as each head's own loss gives them."""
    counts = torch.tensor([50, 20, 5, 5])
    losses = [
        ClassWeightedLoss(counts, None, epochs=4, weights=None),
        ClassWeightedLoss(counts, None, epochs=4, weights="inverse"),
        ClassWeightedLoss(counts, None, epochs=4, weights=None),
        LogitAdjustedLoss(counts, None, epochs=4),
        ClassWeightedLoss(counts, None, epochs=4, weights=None),
    ]
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 16, 4, generator=generator) * 3
    targets = torch.randint(0, 4, (5, 16), generator=generator)
    heads = [
        _Head(None, loss, torch.arange(32), torch.zeros(32), torch.zeros(()), loss.plain_at(0))  # type: ignore[arg-type]
        for loss in losses
    ]
    together = logits.clone().requires_grad_(True)
    _plain_losses(heads, together, targets, start=16).backward()
    assert together.grad is not None
    for h, (head, loss_fn) in enumerate(zip(heads, losses, strict=True)):
        alone = logits[h].clone().requires_grad_(True)
        weighted, ce = loss_fn(alone, targets[h], 0)
        weighted.mean().backward()
        if loss_fn.plain_at(0):
            assert torch.equal(together.grad[h], alone.grad)
            assert torch.equal(head.losses[16:], ce.detach())
            assert head.loss_sum == pytest.approx(float(weighted.detach().mean()) * 16, rel=1e-6)
        else:  # left to its own loss: untouched here
            assert not together.grad[h].any() and not head.losses.any() and head.loss_sum == 0


def test_optimizers_built_from_names_or_sharing_a_parameter_step_as_each_alone():
    """An SGD built from named parameters (its group lists their names) steps with the others;
    two optimizers that share a parameter step one after the other, the second seeing the
    first's update, as their own steps would."""
    for share in (False, True):
        runs = []
        for _ in range(2):
            torch.manual_seed(0)
            a, b = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)
            shared = [a.weight] if share else []
            optimizers = [
                torch.optim.SGD(a.named_parameters(), lr=0.1, momentum=0.9, weight_decay=0.5),
                torch.optim.SGD(
                    [b.weight, b.bias, *shared], lr=0.1, momentum=0.9, weight_decay=0.5
                ),
            ]
            runs.append((a, b, optimizers))
        for step in range(3):
            x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step))
            for a, b, optimizers in runs:
                for optimizer in optimizers:
                    optimizer.zero_grad()
                (a(x).square().sum() + b(x).square().sum()).backward()
            for optimizer in runs[0][2]:
                optimizer.step()
            step_optimizers(runs[1][2])
        for p, q in zip(
            [*runs[0][0].parameters(), *runs[0][1].parameters()],
            [*runs[1][0].parameters(), *runs[1][1].parameters()],
            strict=True,
        ):
            assert torch.equal(p, q), share
