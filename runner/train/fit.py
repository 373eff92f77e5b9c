"""The training loop, in one place: epochs of batches in the sampler's order, evaluation,
checkpoints, and what each epoch records.

Batches are gathered by index from memory (on the device when there is one) or read through a
DataLoader (:mod:`runner.train.feed`); per-sample losses go back to the sampler at the end of each
epoch. Signals are held until a batch ends (:mod:`runner.signals`), so a checkpoint is always
taken from a consistent state. MLflow steps are the epoch numbers the console prints
(1 = after the first epoch; 0 holds the data's class counts)."""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from runner.data import Augment, augment_batch
from runner.data.multilabel import MultiLabelData
from runner.errors import UserError
from runner.signals import raise_if_stopped, stop_on_signals
from runner.train.evaluation import Evaluation, evaluate
from runner.train.feed import Feed
from runner.train.multilabel_run import (
    evaluate_epoch,
    evaluate_rare_positives,
    multilabel_sampling_metrics,
    positive_class,
)
from runner.train.post_hoc import choose_post_hoc
from runner.train.recorder import class_table, per_class_as_table, sampling_keys
from runner.train.run import Parts, RunContext, Scored, divergence_cause, flush
from runner.train.stages import PostHocChoice, PostHocStage, stage_for
from runner.train.state import (
    TrainState,
    autocast,
    batches_per_epoch,
    start_classifier_stage,
    total_epochs,
)
from samplers import Sampler, sampling_stats

log = logging.getLogger("runner")


class Diverged(Exception):
    """The training loss became non-finite at ``epoch`` (0-based), ``batch`` (0-based)."""

    def __init__(self, epoch: int, batch: int, mean_loss_before: float) -> None:
        self.epoch, self.batch, self.mean_loss_before = epoch, batch, mean_loss_before
        super().__init__(f"non-finite training loss at epoch {epoch + 1}, batch {batch + 1}")

    def __reduce__(self) -> tuple[type[Diverged], tuple[int, int, float]]:
        return type(self), (self.epoch, self.batch, self.mean_loss_before)


@dataclass
class EpochResult:
    mean_loss: float
    delivered: torch.Tensor  # the indices the model actually trained on, in order (CPU)
    losses: torch.Tensor = field(repr=False)  # unweighted per-sample cross-entropy (CPU)


_CHECK_EVERY = 20  # batches between finiteness checks on a GPU (each one synchronises)


def train_epoch(
    state: TrainState,
    train_x: torch.Tensor | Feed,
    train_y: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]],
    batch_size: int,
    augment: Augment | None,
    on_batch: Callable[[torch.Tensor], None] | None = None,
) -> EpochResult:
    """Epoch ``state.epoch`` in the sampler's order, from batch ``state.batch`` on (a restored
    mid-epoch state continues where it stopped); hands per-sample losses back to the sampler.
    ``train_x`` is a tensor (gathered in memory) or a :class:`runner.train.feed.Feed` (in memory or
    through a DataLoader); ``train_y`` lies on the device the model trains on.

    ``on_batch`` runs after every batch, when the state is consistent: a checkpoint taken
    there resumes exactly. Raises :class:`Diverged` when the loss turns non-finite (checked
    every batch on the CPU, every ``_CHECK_EVERY`` batches on a GPU, to avoid a sync per batch).
    """
    feed = train_x if isinstance(train_x, Feed) else Feed(train_x, train_x.device)
    sampler, model, device, parallel = state.sampler, state.model, feed.device, state.parallel
    sampler.set_epoch(state.epoch)
    order = sampler.epoch_indices() if parallel is None else parallel.order(sampler)
    # Batch samplers fix their own batches; under torchrun each rank takes its part of a batch.
    per_batch = order.shape[1] if order.dim() == 2 else batch_size // sampler.world_size
    delivered = order.reshape(-1)
    if delivered.numel() % per_batch == 1 and delivered.numel() > 1:
        delivered = delivered[:-1]  # a batch of one breaks BatchNorm; dropped, so not reported
    if state.batch == 0 or state.epoch_losses is None:
        state.batch = 0
        state.epoch_losses = torch.zeros(delivered.numel(), device=device)
        state.epoch_loss_sum = torch.zeros((), device=device)
    assert state.epoch_losses is not None and state.epoch_loss_sum is not None
    losses = state.epoch_losses = state.epoch_losses.to(device)
    loss_sum = state.epoch_loss_sum = state.epoch_loss_sum.to(device)
    check_every = 1 if device.type == "cpu" else _CHECK_EVERY
    model.train(state.train_mode)
    net = model if parallel is None else parallel.module  # the module that averages gradients
    share = (0, 1) if parallel is None else (parallel.rank, parallel.world_size)
    batches = delivered.to(device, non_blocking=True).split(per_batch)
    inputs = feed.batches(delivered, per_batch, state.batch)  # x on the device, converted
    for number, x in zip(range(state.batch, len(batches)), inputs, strict=True):
        idx = batches[number]
        y = train_y.index_select(0, idx)
        if augment is not None:
            x = augment_batch(x, augment, state.generator, share)
        with autocast(device):
            logits = net(x)
        weighted, ce = loss_fn(logits, y, state.epoch)
        loss = weighted.mean()
        state.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        state.optimizer.step()
        state.scheduler.step()
        start = number * per_batch
        losses[start : start + idx.numel()] = ce.detach()
        loss_sum += loss.detach() * idx.numel()
        state.batch = number + 1
        if state.batch % check_every == 0 or state.batch == len(batches):
            _check_finite(state, losses[: start + idx.numel()], per_batch)
        if on_batch is not None:
            on_batch(loss.detach())
    trained = delivered.numel()
    if parallel is not None:  # the whole epoch's feedback, in the global order, on every rank
        trained *= parallel.world_size
        loss_sum = parallel.total(loss_sum)
        drawn = sampler.global_indices().numel()  # without the padding that evens out the ranks
        delivered, losses = parallel.gather(delivered)[:drawn], parallel.gather(losses)[:drawn]
    losses_cpu = losses.cpu()
    sampler.update(delivered, losses_cpu)
    mean_loss = float(loss_sum) / trained
    state.epoch, state.batch, state.epoch_losses, state.epoch_loss_sum = (
        state.epoch + 1,
        0,
        None,
        None,
    )
    return EpochResult(mean_loss, delivered, losses_cpu)


def _check_finite(state: TrainState, losses_so_far: torch.Tensor, per_batch: int) -> None:
    """Raise :class:`Diverged` naming the first batch whose loss is not finite. Under torchrun
    the ranks check the sum over all of them, so that every rank stops at the same batch."""
    loss_sum = state.epoch_loss_sum
    assert loss_sum is not None  # an epoch is under way
    if state.parallel is not None:
        loss_sum = state.parallel.total(loss_sum)
    if bool(torch.isfinite(loss_sum)):
        return
    bad = (~torch.isfinite(losses_so_far)).nonzero()
    # The weighted loss can overflow while the cross-entropy stays finite: then the last batch.
    first = int(bad[0]) if bad.numel() else losses_so_far.numel() - 1
    batch = first // per_batch
    before = losses_so_far[: batch * per_batch]
    raise Diverged(state.epoch, batch, float(before.mean()) if before.numel() else math.nan)


def sampling_metrics(
    sampler: Sampler, delivered: torch.Tensor, class_names: list[str], per_class: bool = True
) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    """What was drawn against what the sampler intended: in summary, and with ``per_class``
    one key per class (the shares are returned either way)."""
    target = sampler.target_class_shares()
    stats = sampling_stats(delivered, sampler.labels, target, sampler.num_classes)
    metrics = sampling_keys(stats, target, class_names, per_class)
    return metrics, stats.shares.numpy(), target.numpy()


class Epochs:
    """What ends each epoch of one run, whoever trained it (:func:`fit`, or
    :func:`runner.train.stacked.fit_stacked` for many heads at once): the run's feeds and
    settings, built once, and :meth:`record`, which measures, evaluates, logs and checkpoints."""

    def __init__(self, run: RunContext, checkpoint_every: int | None = None) -> None:
        """``checkpoint_every``: epochs between checkpoints, ``trainer.checkpoint_every`` unless
        given (0: none but the last epoch's, and that only if the trainer's setting takes any)."""
        self.run = run
        self.every = (
            run.parts.trainer.checkpoint_every if checkpoint_every is None else checkpoint_every
        )
        parts = run.parts
        data, trainer = parts.data, parts.trainer
        feed = (parts.device, data.normalize, data.feeding.num_workers)
        self.train_x, self.train_y = Feed(data.train_x, *feed), data.train_y.to(parts.device)
        self.test_x = Feed(data.test_x, *feed)
        self.val_x = Feed(data.val_x, *feed) if data.val_x is not None else None
        self.multi_label = isinstance(data, MultiLabelData)
        self.last = total_epochs(trainer)
        self.tabled = per_class_as_table(parts.tracking, data.num_classes)  # one table an epoch
        self.stage = stage_for(trainer)
        self.stage.check_built(parts.state.model, data.val_y)  # refused before training

    def diverged(self, diverged: Diverged) -> UserError:
        """The user error a non-finite loss in this run's epoch ``diverged.epoch`` ends it with,
        the mean loss before it logged."""
        run, epoch = self.run, diverged.epoch + 1
        if epoch > run.logged_through and not np.isnan(diverged.mean_loss_before):
            run.recorder.log_metrics({"train/loss": diverged.mean_loss_before}, step=epoch)
        setting, fix = divergence_cause(run.parts, run.parts.state.classifier_only)
        error = UserError(
            f"{setting}: the training loss became non-finite at epoch {epoch}, batch "
            f"{diverged.batch + 1}\n{fix}"
        )
        error.__cause__ = diverged
        return error

    def record(self, result: EpochResult) -> None:
        """After epoch ``state.epoch`` trained: what was drawn, the evaluation (a post-hoc stage
        first after the last epoch), the log (past ``logged_through``) and the checkpoint."""
        run, multi_label, tabled = self.run, self.multi_label, self.tabled
        parts, progress, recorder = run.parts, run.progress, run.recorder
        trainer, data, state, names = parts.trainer, parts.data, parts.state, parts.data.class_names
        epoch, last = state.epoch, self.last  # the epoch that ended, as printed and logged
        measure = multilabel_sampling_metrics if multi_label else sampling_metrics
        metrics, drawn, target = measure(parts.sampler, result.delivered, names, not tabled)
        progress.drawn.append(drawn)
        progress.target.append(target)
        columns: dict[str, Any] = {"sampling/share": drawn, "sampling/target": target}
        metrics["train/loss"] = result.mean_loss
        # The classifier's (the last group): a backbone_lr factor gives the features their own.
        metrics["train/lr"] = state.optimizer.param_groups[-1]["lr"]
        stage_one_ends = epoch == trainer.epochs < last
        tuned: PostHocChoice | None = None  # a post-hoc stage's choice: its validation predictions
        if epoch == last and isinstance(self.stage, PostHocStage):
            tuned = choose_post_hoc(parts, self.stage, self.val_x, self.train_x)
            metrics.update(tuned.metrics())
        periodic = trainer.eval_every and epoch % trainer.eval_every == 0  # 0: never
        if periodic or epoch == last or stage_one_ends:
            evaluation, validation = _evaluations(parts, self.test_x, self.val_x, tuned)
            metrics.update(evaluation.metrics(names, per_class=not tabled))
            columns.update(evaluation.class_columns("test"))
            if stage_one_ends:
                metrics.update(evaluation.metrics(names, "stage1", per_class=not tabled))
            progress.latest = evaluation
            score = evaluation.score
            if validation is not None:  # the honest best epoch
                metrics.update(validation.metrics(names, "val", per_class=not tabled))
                columns.update(validation.class_columns("val"))
                progress.latest_val = validation
                score = validation.score
            if data.num_classes == 2 and not multi_label:  # rare positives
                honest = tuned is None or not self.stage.reads_validation
                rare = _rare_positives(parts, self.test_x, self.val_x, honest)
                progress.latest_rare = rare
                metrics.update(rare)
            if score > progress.best_score:
                progress.best, progress.best_epoch, progress.best_score = evaluation, epoch, score
            line = evaluation.one_line()
            log.info("epoch %d/%d  loss %.4f  %s", epoch, last, result.mean_loss, line)
        else:  # not evaluated (trainer.eval_every): its training loss
            log.info("epoch %d/%d  loss %.4f", epoch, last, result.mean_loss)
        if epoch > run.logged_through:
            recorder.log_metrics(metrics, step=epoch)
            if tabled:
                table = class_table(names, columns)
                recorder.log_table(f"per_class/epoch_{epoch:04d}.json", table)
        every = self.every
        before_stage = self.stage.stops_part_way and epoch == last - 1  # see stops_part_way
        ends = bool(trainer.checkpoint_every) and epoch == last
        if (every and epoch % every == 0) or before_stage or ends:
            run.save_checkpoint()


def fit(
    run: RunContext, until: int | None = None, on_epoch: Callable[[], None] | None = None
) -> None:
    """Every epoch of ``run``: train in the sampler's order, then :meth:`Epochs.record`
    (measure what was drawn, evaluate, log once: steps up to ``run.logged_through`` were logged
    before and are not logged again; the recorder may hold the rows,
    :func:`runner.train.run.flush` sends them as ``fit`` ends; checkpoint to ``run.path``), call
    ``on_epoch``; stop after epoch ``until`` (default: the last; called again, it continues).
    Signals are held until a batch ends, then stop the loop. With ``trainer.classifier_epochs``
    (cRT, LWS) the classifier stage follows ``trainer.epochs``; the evaluation that ends stage
    one is also logged as ``stage1/*``. With ``trainer.classifier_stage=tau_norm`` or
    ``posthoc_la`` the classifier is tau-normalised or logit-adjusted after the last epoch
    trains, before it is evaluated, and that evaluation's validation metrics are cross-fitted
    (:mod:`runner.train.post_hoc`)."""
    parts, progress, epochs = run.parts, run.progress, Epochs(run)
    trainer, state, last = parts.trainer, parts.state, epochs.last
    augment = parts.data.augment if trainer.augment else None
    show = trainer.progress and sys.stderr.isatty()
    steps = batches_per_epoch(parts.sampler, trainer.batch_size)
    with stop_on_signals(deferred=True):
        while state.epoch < (last if until is None else min(until, last)):
            if state.epoch >= trainer.epochs and not state.classifier_only:
                start_classifier_stage(state)
            epoch = state.epoch + 1  # as printed and logged
            latest = f"{progress.latest.score:.3f}" if progress.latest else "-"
            bar = tqdm(
                total=steps,
                initial=state.batch,
                desc=f"epoch {epoch}/{last}",
                disable=not show,
                leave=False,
            )

            def on_batch(loss: torch.Tensor, bar: tqdm = bar, latest: str = latest) -> None:
                bar.update()
                if bar.n % 10 == 0:  # reading the loss synchronises the device: not every batch
                    bar.set_postfix(loss=f"{float(loss):.3f}", score=latest)
                raise_if_stopped()

            try:
                result = train_epoch(
                    state,
                    epochs.train_x,
                    epochs.train_y,
                    parts.loss_fn,
                    trainer.batch_size,
                    augment,
                    on_batch,
                )
            except Diverged as diverged:
                raise epochs.diverged(diverged) from diverged
            finally:
                bar.close()
            epochs.record(result)
            if on_epoch is not None:
                on_epoch()
            raise_if_stopped()
    flush(run.recorder)  # a lost store is found before the results add rows that a resume repeats


def _evaluations(
    parts: Parts, test_x: Feed, val_x: Feed | None, tuned: PostHocChoice | None
) -> tuple[Scored, Scored | None]:
    """The test split's evaluation and the validation split's (None without one). Multi-label
    data: sigmoid scores, the validation split's F1 thresholds applied to the test split
    (:func:`runner.train.multilabel_run.evaluate_epoch`); else predicted classes, the validation
    ones cross-fitted after a post-hoc stage (``tuned``)."""
    data, shots = parts.data, parts.evaluation
    if isinstance(data, MultiLabelData):
        val = (val_x, data.val_y) if val_x is not None and data.val_y is not None else None
        with autocast(parts.device):
            scored = evaluate_epoch(
                parts.state.model,
                (test_x, data.test_y),
                val,
                data.train_counts.numpy(),
                data.class_names,
                parts.trainer.eval_batch_size,
                (shots.many_shot, shots.few_shot),
            )
        return scored.test, scored.val
    evaluation = _evaluate(parts, test_x, data.test_y.numpy())
    if val_x is None or data.val_y is None:
        return evaluation, None
    labels = data.val_y.numpy()
    if tuned is None:
        return evaluation, _evaluate(parts, val_x, labels)
    return evaluation, _scored(parts, labels, tuned.cross_fitted)


def _rare_positives(
    parts: Parts, test_x: Feed, val_x: Feed | None, val_metrics: bool
) -> dict[str, float]:
    """Binary data: the rarer class against the other (average precision, ROC AUC, and
    precision and recall at the threshold chosen on the validation split for
    ``eval.target_precision``), as ``test/`` and, when ``val_metrics``, ``val/`` metrics: not
    after a post-hoc stage whose classifier the validation split tuned (its scores would be
    optimistic; only the cross-fitted predictions score it)."""
    data = parts.data
    val = (val_x, data.val_y) if val_x is not None and data.val_y is not None else None
    with autocast(parts.device):
        rare = evaluate_rare_positives(
            parts.state.model,
            (test_x, data.test_y),
            val,
            positive_class(data.train_counts),
            parts.evaluation.target_precision,
            parts.trainer.eval_batch_size,
        )
    metrics = rare.test.headline("test")
    if rare.val is not None and val_metrics:
        metrics.update(rare.val.headline("val"))
    return metrics


def _evaluate(parts: Parts, x: Feed, y: np.ndarray) -> Evaluation:
    return _scored(parts, y, _predict(parts, x))


def _predict(parts: Parts, x: Feed) -> np.ndarray:
    with autocast(parts.device):
        return x.predict(parts.state.model, parts.trainer.eval_batch_size)


def _scored(parts: Parts, y: np.ndarray, predictions: np.ndarray) -> Evaluation:
    counts, shots = parts.data.train_counts.numpy(), parts.evaluation
    return evaluate(y, predictions, counts, parts.data.class_names, shots.many_shot, shots.few_shot)
