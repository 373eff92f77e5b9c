"""Metrics of scores rather than predicted classes, column by column of an (N, C) score matrix
against (N, C) 0/1 targets, in torch and at once for every column: average precision and ROC
AUC (scikit-learn's ``average_precision_score`` and ``roc_auc_score``, ties included), and the
thresholds chosen on one split to be applied to another: the one that maximises a class's F1,
and the one that gives the most recall at a precision the user sets.

Every curve is read at the distinct scores (a tie is one point, as scikit-learn's
``_binary_clf_curve`` reads it); predicting positive means ``score >= threshold``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Curve:
    """Each column's counts at its distinct scores, highest first, as (N, C) tensors: ``kept``
    marks the last row of each run of equal scores (a threshold), where ``tp`` and ``fp`` are
    the positives and negatives scoring at least ``score``; ``positives`` (C,)."""

    score: torch.Tensor
    tp: torch.Tensor
    fp: torch.Tensor
    kept: torch.Tensor
    positives: torch.Tensor


def curve(scores: torch.Tensor, targets: torch.Tensor) -> Curve:
    """The counts behind the precision-recall and ROC curves of every column."""
    scores = scores.double()
    ordered, order = torch.sort(scores, dim=0, descending=True, stable=True)
    hits = torch.gather(targets.double(), 0, order)
    tp = torch.cumsum(hits, dim=0)
    rank = torch.arange(1, len(scores) + 1, dtype=torch.float64, device=scores.device)
    fp = rank[:, None] - tp
    kept = torch.ones_like(ordered, dtype=torch.bool)
    kept[:-1] = ordered[:-1] != ordered[1:]
    return Curve(ordered, tp, fp, kept, tp[-1])


def average_precision(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per column ``sum_k (R_k - R_{k-1}) P_k`` over the distinct thresholds (scikit-learn's
    ``average_precision_score``, no interpolation); NaN for a column without positives."""
    c = curve(scores, targets)
    tp_at = torch.where(c.kept, c.tp, 0.0)
    before = torch.cummax(tp_at, dim=0).values  # tp at the last threshold so far
    previous = torch.cat([torch.zeros_like(before[:1]), before[:-1]])
    gained = torch.where(c.kept, c.tp - previous, 0.0)
    precision = c.tp / (c.tp + c.fp)
    ap = (gained * precision).sum(0) / c.positives
    return torch.where(c.positives > 0, ap, torch.nan)


def roc_auc(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per column the area under the ROC curve (trapezoids between the distinct thresholds,
    scikit-learn's ``roc_auc_score``): the chance that a positive outscores a negative, a tie
    counting one half. NaN for a column without both positives and negatives."""
    c = curve(scores, targets)
    negatives = len(scores) - c.positives
    tp = torch.where(c.kept, c.tp, 0.0)
    fp = torch.where(c.kept, c.fp, 0.0)
    tp_before = torch.cat([torch.zeros_like(tp[:1]), torch.cummax(tp, 0).values[:-1]])
    fp_before = torch.cat([torch.zeros_like(fp[:1]), torch.cummax(fp, 0).values[:-1]])
    area = torch.where(c.kept, (fp - fp_before) * (tp + tp_before) / 2, 0.0).sum(0)
    auc = area / (c.positives * negatives)
    return torch.where((c.positives > 0) & (negatives > 0), auc, torch.nan)


def best_f1_thresholds(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per column the threshold whose F1 is highest (the highest such threshold on a tie);
    ``inf`` (never positive) for a column without positives."""
    c = curve(scores, targets)
    f1 = torch.where(c.kept, 2 * c.tp / (c.tp + c.fp + c.positives), -1.0)
    best = torch.argmax(f1, dim=0)  # the first maximum: the highest threshold
    chosen = torch.gather(c.score, 0, best[None]).squeeze(0)
    return torch.where(c.positives > 0, chosen, torch.inf)


def thresholds_at_precision(
    scores: torch.Tensor, targets: torch.Tensor, precision: float
) -> torch.Tensor:
    """Per column the lowest threshold whose precision is at least ``precision`` (the most
    recall at that precision); ``inf`` where no threshold reaches it."""
    c = curve(scores, targets)
    reached = c.kept & (c.tp / (c.tp + c.fp) >= precision) & (c.tp > 0)
    rows = torch.arange(len(scores), device=scores.device)[:, None].expand_as(reached)
    last = torch.where(reached, rows, -1).max(0).values  # the lowest score that reaches it
    chosen = torch.gather(c.score, 0, last.clamp(min=0)[None]).squeeze(0)
    return torch.where(last >= 0, chosen, torch.inf)


@dataclass(frozen=True)
class Counts:
    """Per column true positives, predicted positives and positives at given thresholds."""

    tp: torch.Tensor
    predicted: torch.Tensor
    positives: torch.Tensor

    @property
    def precision(self) -> torch.Tensor:
        """0 where nothing is predicted (scikit-learn's ``zero_division=0``)."""
        return torch.where(self.predicted > 0, self.tp / self.predicted.clamp(min=1), 0.0)

    @property
    def recall(self) -> torch.Tensor:
        return torch.where(self.positives > 0, self.tp / self.positives.clamp(min=1), torch.nan)

    @property
    def f1(self) -> torch.Tensor:
        """``2 tp / (predicted + positives)``, 0 where both are 0 (scikit-learn's)."""
        total = self.predicted + self.positives
        return torch.where(total > 0, 2 * self.tp / total.clamp(min=1), 0.0)

    @property
    def micro_f1(self) -> float:
        total = float(self.predicted.sum() + self.positives.sum())
        return 2 * float(self.tp.sum()) / total if total else 0.0


def counts_at(scores: torch.Tensor, targets: torch.Tensor, thresholds: torch.Tensor) -> Counts:
    """The counts of predicting ``score >= threshold`` column by column."""
    predicted = scores.double() >= thresholds.double()[None, :]
    truth = targets.bool()
    return Counts(
        tp=(predicted & truth).sum(0).double(),
        predicted=predicted.sum(0).double(),
        positives=truth.sum(0).double(),
    )
