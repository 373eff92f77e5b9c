"""Many linear heads on the same cached features trained at once: each batch, every head's
rows are gathered by its own sampler's indices into one ``(H, B, D)`` tensor and its logits come
from one batched matmul, its weights' gradients from another; every head keeps its own loss
(class weights, epoch schedule; the heads whose loss is plain cross-entropy that epoch in one
call), its own optimizer, learning-rate schedule and sampler, stepped exactly as
:func:`runner.train.fit.train_epoch` steps them (those of equal settings in one call,
:func:`runner.train.optimizer_steps.step_optimizers`), and its own record
(:class:`runner.train.fit.Epochs`).

The results equal training each head alone up to float32 summation order: a batched matmul
adds a row's ``D`` products in another order than a single one (tests/test_stacked.py states
and derives the tolerance). What cannot stack trains alone (:func:`why_not_stacked`)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from runner.data import LongTailData
from runner.signals import raise_if_stopped, stop_on_signals
from runner.train.fit import Diverged, EpochResult, Epochs
from runner.train.losses import ClassWeightedLoss
from runner.train.optimizer_steps import step_optimizers
from runner.train.run import Parts, RunContext, flush
from runner.train.state import TrainState, autocast, batches_per_epoch, total_epochs


def why_not_stacked(run: RunContext) -> str | None:
    """None when ``run`` can train as a stacked head; else why not, in a few words. A stacked
    head is a plain linear classifier on cached features (``model.freeze=true``, no
    augmentation, ``model.head=linear``), one stage (no cRT/LWS classifier epochs), in one
    process, from the start of an epoch. Its sampler may draw indices or whole batches."""
    parts, state = run.parts, run.parts.state
    model = state.model
    if parts.frozen is None:
        return "not on cached features (model.freeze=true, trainer.augment=false)"
    if parts.head != "linear" or not isinstance(getattr(model, "classifier", None), nn.Linear):
        return f"model.head={parts.head}, not a linear head"
    if not isinstance(getattr(model, "features", None), nn.Identity):
        return "the model computes features itself"
    if parts.trainer.classifier_epochs:
        return "a classifier stage follows (trainer.classifier_epochs)"
    if state.parallel is not None:
        return "trained by several processes"
    if state.batch:
        return "stopped in the middle of an epoch"
    return None


def stack_key(run: RunContext) -> tuple[object, ...]:
    """Runs with the same key can stack: the same epochs, batches (their number and size) and
    device; their models share the feature and class dimensions (:func:`fit_stacked` checks that they also train on
    the same features and labels)."""
    parts = run.parts
    classifier = parts.state.model.classifier
    assert isinstance(classifier, nn.Linear)
    return (
        parts.device,
        total_epochs(parts.trainer),
        _per_batch(parts),
        len(parts.sampler),
        batches_per_epoch(parts.sampler, parts.trainer.batch_size),
        classifier.in_features,
        classifier.out_features,
        parts.state.epoch,
    )


def stack_groups(runs: Sequence[RunContext]) -> list[list[int]]:
    """The indices of ``runs`` that can stack together, grouped: each one's :func:`stack_key`
    alike, on equal features and labels (a backbone initialised from the run's seed gives each
    seed its own features). Runs that :func:`why_not_stacked` refuses are in none."""
    groups: list[list[int]] = []
    for i, run in enumerate(runs):
        if why_not_stacked(run) is not None:
            continue
        for group in groups:
            first = runs[group[0]]
            if stack_key(first) == stack_key(run) and _same_inputs(first, run):
                group.append(i)
                break
        else:
            groups.append([i])
    return groups


def _per_batch(parts: Parts) -> int:
    """The rows of a batch: a batch sampler's own size, else ``trainer.batch_size``."""
    return parts.sampler.batch_size or parts.trainer.batch_size


def _same_inputs(a: RunContext, b: RunContext) -> bool:
    da, db = a.parts.data, b.parts.data
    return _equal(da.train_x, db.train_x) and _equal(da.train_y, db.train_y)


def _equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    """``torch.equal``, at once for one tensor (runs built together hold the same ones)."""
    return x is y or torch.equal(x, y)


def share_inputs(run: RunContext, kept: list[RunContext]) -> None:
    """Let ``run`` hold the data and frozen backbone of a run in ``kept`` that has equal ones
    (every split's features and labels; the backbone's every tensor), instead of its own copy;
    else add it to ``kept``. Many heads on one backbone then hold one copy of its features."""
    parts = run.parts
    for other in kept:
        if _same_data(parts.data, other.parts.data) and _same_frozen(parts, other.parts):
            parts.data, parts.frozen = other.parts.data, other.parts.frozen
            return
    kept.append(run)


def _same_data(a: LongTailData, b: LongTailData) -> bool:
    def same(x: object, y: object) -> bool:
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            return x.shape == y.shape and x.dtype == y.dtype and _equal(x, y)
        return x is None and y is None

    splits = ("train_x", "train_y", "val_x", "val_y", "test_x", "test_y")
    return a.class_names == b.class_names and all(
        same(getattr(a, k), getattr(b, k)) for k in splits
    )


def _same_frozen(a: Parts, b: Parts) -> bool:
    if a.frozen is None or b.frozen is None or a.frozen is b.frozen:
        return a.frozen is b.frozen
    sa, sb = a.frozen.backbone.state_dict(), b.frozen.backbone.state_dict()
    return sa.keys() == sb.keys() and all(
        sa[k].shape == sb[k].shape and torch.equal(sa[k], sb[k]) for k in sa
    )


@dataclass
class _Head:
    """One head's epoch under way: its run's parts, its order, its losses so far."""

    state: TrainState
    loss_fn: nn.Module
    order: torch.Tensor  # (N,) the sampler's indices, as trained
    losses: torch.Tensor  # (N,) unweighted per-sample losses
    loss_sum: torch.Tensor
    plain: bool  # its loss is plain cross-entropy this epoch (ClassWeightedLoss.plain_at)
    diverged: Diverged | None = None

    @property
    def linear(self) -> nn.Linear:
        classifier = self.state.model.classifier
        assert isinstance(classifier, nn.Linear)
        return classifier


def _start(run: RunContext, batch_size: int) -> _Head:
    """Epoch ``state.epoch`` of ``run``: its sampler's order (the batch of one dropped as
    :func:`runner.train.fit.train_epoch` drops it)."""
    state = run.parts.state
    state.sampler.set_epoch(state.epoch)
    order = state.sampler.epoch_indices().reshape(-1)
    if order.numel() % batch_size == 1 and order.numel() > 1:
        order = order[:-1]
    state.model.train(state.train_mode)
    device = run.parts.device
    zeros = torch.zeros(order.numel(), device=device)
    loss_fn = run.parts.loss_fn
    plain = isinstance(loss_fn, ClassWeightedLoss) and loss_fn.plain_at(state.epoch)
    return _Head(state, loss_fn, order.to(device), zeros, torch.zeros((), device=device), plain)


def train_epoch_stacked(
    runs: Sequence[RunContext], x: torch.Tensor, y: torch.Tensor, batch_size: int
) -> list[EpochResult | Diverged]:
    """One epoch of every run in ``runs`` (one :func:`stack_key`), on features ``x`` (N, D)
    and labels ``y`` on their device, in batches of ``batch_size`` rows: for each, what :func:`runner.train.fit.train_epoch` returns,
    or the :class:`Diverged` it would raise (a diverged head stops; the others go on, their
    gradients are their own)."""
    heads = [_start(run, batch_size) for run in runs]
    sizes = {head.order.numel() for head in heads}
    if len(sizes) != 1:
        raise ValueError(f"stacked heads drew epochs of different lengths: {sorted(sizes)}")
    device = runs[0].parts.device
    epoch = heads[0].state.epoch
    for number, start in enumerate(range(0, sizes.pop(), batch_size)):
        active = [head for head in heads if head.diverged is None]
        if not active:
            break
        idx = torch.stack([head.order[start : start + batch_size] for head in active])
        rows = x.index_select(0, idx.reshape(-1)).view(*idx.shape, x.shape[1])
        with torch.no_grad(), autocast(device):
            weight = torch.stack([head.linear.weight for head in active])
            bias = torch.stack([head.linear.bias for head in active])
            logits = torch.baddbmm(bias.unsqueeze(1), rows, weight.transpose(1, 2))
        # Autograd goes back to the logits alone; the heads' gradients are one product below.
        logits.requires_grad_(True)
        targets = y.index_select(0, idx.reshape(-1)).view_as(idx)
        total = _plain_losses(active, logits, targets, start)
        # Unbound, not indexed: each head's gradient lands in its own slice of one tensor
        # (indexing would give each a zero-filled gradient of the whole stack to add up).
        for head, head_logits, head_targets in zip(
            active, logits.unbind(0), targets.unbind(0), strict=True
        ):
            if head.plain:
                continue
            # A copy: a loss may change its logits in place, as alone.
            weighted, ce = head.loss_fn(head_logits.clone(), head_targets, epoch)
            loss = weighted.mean()
            total = total + loss
            head.losses[start : start + idx.shape[1]] = ce.detach()
            head.loss_sum += loss.detach() * idx.shape[1]
        total.backward()
        # Each head's gradients are set, not added to: no zero_grad needed.
        _set_gradients(active, logits, rows, device)
        # Each epoch's first batch steps each optimizer alone: a scheduler's first step after
        # it was built expects its optimizer's own step() before it, or warns.
        step_optimizers([head.state.optimizer for head in active], alone=number == 0)
        for head in active:
            head.state.scheduler.step()
        # One check for every head while all are finite; each head's where one is not.
        if bool(torch.isfinite(torch.stack([head.loss_sum for head in active])).all()):
            continue
        for head in active:
            if not bool(torch.isfinite(head.loss_sum)):
                done = head.losses[: start + idx.shape[1]]
                before = done[: number * batch_size]
                mean = float(before.mean()) if before.numel() else float("nan")
                head.diverged = Diverged(epoch, number, mean)
    return [_finish(head) for head in heads]


def _plain_losses(
    heads: Sequence[_Head], logits: torch.Tensor, targets: torch.Tensor, start: int
) -> torch.Tensor:
    """The batch loss of the heads whose loss is plain cross-entropy this epoch
    (:attr:`_Head.plain`), summed, from one cross-entropy
    over all their rows; each head's per-sample losses and loss sum noted as its own loss
    would note them. Each row's value and gradient is the one its head's own call gives (rows
    are independent; each head's mean adds ``1 / B`` of each row's gradient as alone); a
    head's mean over its rows may differ from its own call in the last bits of the loss it
    records. Zero (a tensor) when there are none."""
    plain = [h for h, head in enumerate(heads) if head.plain]
    if not plain:
        return logits.new_zeros(())
    if len(plain) < len(heads):
        chosen = _index(tuple(plain), logits.device)
        logits, targets = logits.index_select(0, chosen), targets.index_select(0, chosen)
    rows = targets.shape[1]
    ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view_as(
        targets
    )
    means = ce.mean(1)
    noted_ce, noted_means = ce.detach(), means.detach() * rows
    for j, h in enumerate(plain):
        heads[h].losses[start : start + rows] = noted_ce[j]
        heads[h].loss_sum += noted_means[j]
    return means.sum()


@functools.lru_cache(maxsize=64)
def _index(rows: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``rows`` as an index tensor on ``device``, made once: the same heads are plain batch
    after batch, and on a GPU each new index is a copy the host waits for."""
    return torch.tensor(rows, device=device)


def _set_gradients(
    heads: Sequence[_Head], logits: torch.Tensor, rows: torch.Tensor, device: torch.device
) -> None:
    """Each head's weight and bias gradient from its logits' (``logits.grad``, (H, B, C)) and
    its rows (H, B, D), as ``nn.Linear``'s backward computes them for one head: the weight's
    ``grad^T @ rows`` (a (C, B) by (B, D) product, the layout the loop alone uses; the batched
    matmul's own backward multiplied (D, B) by (B, C), which took twice the forward's time),
    the bias's the sum over the batch; in the parameters' dtype."""
    grad = logits.grad
    assert grad is not None
    with torch.no_grad(), autocast(device):
        weights = torch.bmm(grad.transpose(1, 2), rows)
    biases = grad.sum(1)
    for head, weight, bias in zip(heads, weights, biases, strict=True):
        head.linear.weight.grad = weight.to(head.linear.weight.dtype)
        head.linear.bias.grad = bias.to(head.linear.bias.dtype)


def _finish(head: _Head) -> EpochResult | Diverged:
    """The sampler's feedback and the state's next epoch, as the single-run loop ends one."""
    if head.diverged is not None:
        return head.diverged
    state, losses = head.state, head.losses.cpu()
    delivered = head.order.cpu()
    state.sampler.update(delivered, losses)
    state.epoch, state.batch, state.epoch_losses, state.epoch_loss_sum = (
        state.epoch + 1,
        0,
        None,
        None,
    )
    return EpochResult(float(head.loss_sum) / delivered.numel(), delivered, losses)


def fit_stacked(runs: Sequence[RunContext]) -> list[BaseException | None]:
    """:func:`runner.train.fit.fit` for every run of ``runs`` (one :func:`stack_key`, every one
    :func:`why_not_stacked`-free), their heads trained at once; each run's epochs recorded as
    ``fit`` records them, but checkpointed after the last epoch alone. Returns, per run, None or the error that ended it (a divergence's
    user error); signals are held until an epoch of every head ends."""
    if not runs:
        return []
    if stack_groups(runs) != [list(range(len(runs)))]:
        raise ValueError("fit_stacked: runs that do not stack together (see stack_groups)")
    # Heads on cached features train in seconds: checkpointed once, after the last epoch (a
    # stop by a signal at an epoch's end checkpoints every run where it stopped,
    # runner.app.train_recorded; one during a refit stops them unsaved, and a refit's run
    # checkpointed after the epoch before it, Epochs.record).
    epochs = [Epochs(run, checkpoint_every=0) for run in runs]
    x, y = epochs[0].train_x.memory, epochs[0].train_y
    assert x is not None and x.is_floating_point(), "cached features are a tensor in memory"
    errors: list[BaseException | None] = [None] * len(runs)
    batch_size = _per_batch(runs[0].parts)
    with stop_on_signals(deferred=True):
        while live := [i for i, run in enumerate(runs) if errors[i] is None and not _done(run)]:
            results = train_epoch_stacked([runs[i] for i in live], x, y, batch_size)
            for i, result in zip(live, results, strict=True):
                try:
                    if isinstance(result, Diverged):
                        raise epochs[i].diverged(result) from result
                    epochs[i].record(result)
                except Exception as error:  # this run ends with it; the others go on
                    errors[i] = error
            raise_if_stopped()
    for i, run in enumerate(runs):
        if errors[i] is None:
            flush(run.recorder)
    return errors


def _done(run: RunContext) -> bool:
    return run.parts.state.epoch >= total_epochs(run.parts.trainer)
