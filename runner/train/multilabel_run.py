"""What an epoch of a multi-label run records beside the training itself (which is the loop's,
:func:`runner.train.fit.train_epoch`, unchanged: its loss takes the batch's label rows): the
label shares the sampler drew, co-labels included, against the intended ones, and the
evaluation of sigmoid scores, the validation split first so that its F1 thresholds are the
ones the test split is counted at.

The validation split's own F1 is counted at the fixed threshold (nothing is chosen on the rows
it scores); its mAP, which needs no threshold, picks the best epoch and is a race's objective.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from runner.train.feed import Feed
from runner.train.multilabel_evaluation import (
    BinaryEvaluation,
    MultiLabelEvaluation,
    choose_f1_thresholds,
    choose_precision_threshold,
    evaluate_binary,
    evaluate_multilabel,
)
from runner.train.recorder import sampling_keys
from samplers import Sampler, multilabel_sampling_stats


@torch.no_grad()
def probabilities(
    model: torch.nn.Module, feed: Feed, batch_size: int, multi_label: bool = True
) -> torch.Tensor:
    """Every sample's class probabilities (N, C), float64 on the CPU: sigmoids of the logits
    for multi-label data, their softmax otherwise; in eval mode, read in chunks of
    ``batch_size`` as a prediction is."""
    activate = torch.sigmoid if multi_label else (lambda z: torch.softmax(z, dim=1))
    was_training = model.training
    model.eval()
    try:
        chunks = feed.batches(torch.arange(len(feed)), batch_size)
        out = [activate(model(x).float()).double().cpu() for x in chunks]
    finally:
        model.train(was_training)
    return torch.cat(out)


def multilabel_sampling_metrics(
    sampler: Sampler, delivered: torch.Tensor, class_names: list[str], per_class: bool = True
) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    """What the epoch drew against what the sampler intended, a drawn sample counting once for
    each of its labels (:func:`samplers.multilabel_sampling_stats`): the same keys as a
    single-label run's, and ``sampling/labels_per_draw``."""
    target = sampler.target_class_shares()
    stats = multilabel_sampling_stats(delivered, sampler.labels, target)
    metrics = sampling_keys(stats, target, class_names, per_class)
    metrics["sampling/labels_per_draw"] = stats.labels_per_draw
    return metrics, stats.shares.numpy(), target.numpy()


@dataclass
class MultiLabelEpoch:
    """One evaluation: the test split's (F1 at the validation split's thresholds, when there is
    one) and the validation split's; ``score`` picks the best epoch (validation mAP, else the
    test mAP, as a single-label run falls back to the test set)."""

    test: MultiLabelEvaluation
    val: MultiLabelEvaluation | None

    @property
    def score(self) -> float:
        return (self.val or self.test).mAP


def evaluate_epoch(
    model: torch.nn.Module,
    test: tuple[Feed, torch.Tensor],
    val: tuple[Feed, torch.Tensor] | None,
    train_counts: np.ndarray,
    class_names: list[str],
    batch_size: int,
    shots: tuple[int, int] = (100, 20),
) -> MultiLabelEpoch:
    """Score the validation split (if any), choose each class's F1 threshold on it, and score
    the test split at those thresholds. ``test`` and ``val`` are (inputs, (N, C) labels)."""
    many, few = shots
    validation, thresholds = None, None
    if val is not None:
        val_scores = probabilities(model, val[0], batch_size)
        thresholds = choose_f1_thresholds(val_scores, val[1])
        validation = evaluate_multilabel(
            val_scores, val[1], train_counts, class_names, None, many, few
        )
    test_scores = probabilities(model, test[0], batch_size)
    tested = evaluate_multilabel(
        test_scores, test[1], train_counts, class_names, thresholds, many, few
    )
    return MultiLabelEpoch(tested, validation)


@dataclass
class RarePositives:
    """One evaluation of the positive class of single-label data (binary, or one class against
    the rest): the test split's, counted at the threshold chosen on the validation split, and
    the validation split's own (at the fixed threshold)."""

    test: BinaryEvaluation
    val: BinaryEvaluation | None


def positive_class(train_counts: torch.Tensor) -> int:
    """The rare positives' class: the one with the fewest training samples (the first such)."""
    return int(torch.argmin(train_counts))


def evaluate_rare_positives(
    model: torch.nn.Module,
    test: tuple[Feed, torch.Tensor],
    val: tuple[Feed, torch.Tensor] | None,
    positive: int,
    target_precision: float,
    batch_size: int,
) -> RarePositives:
    """Score class ``positive`` against the rest: average precision, ROC AUC, and precision,
    recall and F1 at the lowest threshold whose precision on the validation split reaches
    ``target_precision`` (fixed at 0.5 without a validation split). ``test`` and ``val`` are
    (inputs, 1-D class labels)."""
    threshold, validation = None, None
    if val is not None:
        scores = probabilities(model, val[0], batch_size, multi_label=False)[:, positive]
        truth = val[1] == positive
        threshold = choose_precision_threshold(scores, truth, target_precision)
        validation = evaluate_binary(scores, truth, target_precision)
    scores = probabilities(model, test[0], batch_size, multi_label=False)[:, positive]
    tested = evaluate_binary(scores, test[1] == positive, target_precision, threshold)
    return RarePositives(tested, validation)
