"""Evaluations of scores: multi-label data (mAP, per-class AP, micro/macro-F1 at thresholds
chosen on the validation split, head/medium/tail mAP) and rare positives in binary data
(average precision, ROC AUC, and the recall and precision at a threshold chosen on the
validation split for a precision the user sets). The metrics are :mod:`runner.train.ranking`'s.

A threshold is chosen on the validation split and applied to the test split, never chosen on
the split it scores; without a validation split the threshold is fixed (0.5 on the
probabilities) and ``thresholds_from`` says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from runner.train.evaluation import Evaluation, shot_groups
from runner.train.ranking import (
    average_precision,
    best_f1_thresholds,
    counts_at,
    roc_auc,
    thresholds_at_precision,
)

FIXED_THRESHOLD = 0.5  # on probabilities, without a validation split to choose on
GROUPS = ("many", "medium", "few")
# The headline metrics of a multi-label evaluation (an objective is one of them on a split), and
# those of the rare positives of binary data.
MULTILABEL_HEADLINE = ("mAP", "many_mAP", "medium_mAP", "few_mAP", "micro_f1", "macro_f1")
BINARY_HEADLINE = ("average_precision", "roc_auc", "threshold", "precision", "recall", "f1")


def _nanmean(values: np.ndarray) -> float:
    kept = values[~np.isnan(values)]
    return float(kept.mean()) if kept.size else float("nan")


def choose_f1_thresholds(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each class's F1-maximising threshold on these (validation) scores; a class without a
    positive here keeps :data:`FIXED_THRESHOLD`."""
    chosen = best_f1_thresholds(scores, targets)
    return torch.where(torch.isinf(chosen), FIXED_THRESHOLD, chosen)


@dataclass
class MultiLabelEvaluation:
    """Scores of one split: ``mAP`` is the mean AP over the classes with a positive in the split
    (``scored`` of them); the group mAPs are over the classes whose training count puts them
    in that group (NaN for an empty group); F1 at ``thresholds``."""

    mAP: float  # noqa: N815 - the name users look for
    many_mAP: float  # noqa: N815
    medium_mAP: float  # noqa: N815
    few_mAP: float  # noqa: N815
    micro_f1: float
    macro_f1: float
    scored: int
    ap: np.ndarray
    f1: np.ndarray
    thresholds: np.ndarray
    support: np.ndarray  # the split's positives of each class
    thresholds_from: str  # "validation" or "fixed"
    class_names: list[str]

    score_name = "mAP"  # the headline metric :attr:`score` is

    @property
    def score(self) -> float:
        """What picks the best epoch (on the validation split when there is one): mAP."""
        return self.mAP

    def headline(self, prefix: str) -> dict[str, float]:
        values = {k: float(getattr(self, k)) for k in MULTILABEL_HEADLINE}
        return {f"{prefix}/{k}": v for k, v in values.items() if not np.isnan(v)}

    @property
    def report(self) -> str:
        """A text table: each class's AP, F1 and the threshold F1 was counted at."""
        width = max(len(n) for n in self.class_names)
        lines = [f"{'class':>{width}}  {'AP':>6}  {'F1':>6}  threshold ({self.thresholds_from})"]
        for name, ap, f1, threshold in zip(
            self.class_names, self.ap, self.f1, self.thresholds, strict=True
        ):
            lines.append(f"{name:>{width}}  {ap:6.4f}  {f1:6.4f}  {threshold:.4f}")
        lines.append(f"{'mAP':>{width}}  {self.mAP:6.4f}  over {self.scored} classes")
        return "\n".join(lines) + "\n"

    def class_columns(self, prefix: str = "test") -> dict[str, np.ndarray]:
        """The per-class values as columns: AP, F1 and the threshold F1 was counted at."""
        return {
            f"{prefix}/ap": self.ap,
            f"{prefix}/f1": self.f1,
            f"{prefix}/threshold": self.thresholds,
        }

    def metrics(
        self, class_names: list[str], prefix: str = "test", per_class: bool = True
    ) -> dict[str, float]:
        """The headline, and with ``per_class`` one key per class and value (``test/ap/<c>``);
        NaN (a class without positives in the split) is left out."""
        out = self.headline(prefix)
        if per_class:
            for kind, values in self.class_columns(prefix).items():
                for name, value in zip(class_names, values, strict=True):
                    out[f"{kind}/{name}"] = float(value)
        return {k: v for k, v in out.items() if np.isfinite(v)}

    def one_line(self) -> str:
        groups = "  ".join(
            f"{g} {getattr(self, g + '_mAP'):.4f}"
            for g in GROUPS
            if not np.isnan(getattr(self, g + "_mAP"))
        )
        return (
            f"mAP {self.mAP:.4f}  {groups}  micro-F1 {self.micro_f1:.4f}  "
            f"macro-F1 {self.macro_f1:.4f} (thresholds: {self.thresholds_from})"
        )

    def state_dict(self) -> dict[str, Any]:
        """Plain values and tensors, ``kind`` saying which evaluation they are."""
        state = {
            k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
            for k, v in asdict(self).items()
        }
        return {"kind": KIND, **state}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> MultiLabelEvaluation:
        values: dict[str, Any] = {
            k: v.numpy() if torch.is_tensor(v) else v for k, v in state.items() if k != "kind"
        }
        return cls(**values)


KIND = "multilabel"


def evaluation_from_state(state: dict[str, Any]) -> Evaluation | MultiLabelEvaluation:
    """The evaluation a checkpoint saved, whichever kind it is."""
    if state.get("kind") == KIND:
        return MultiLabelEvaluation.from_state(state)
    return Evaluation.from_state(state)


def evaluate_multilabel(
    scores: torch.Tensor,
    targets: torch.Tensor,
    train_counts: np.ndarray,
    class_names: list[str],
    thresholds: torch.Tensor | None = None,
    many_shot: int = 100,
    few_shot: int = 20,
) -> MultiLabelEvaluation:
    """Evaluate (N, C) ``scores`` (probabilities) against (N, C) 0/1 ``targets``. ``thresholds``
    are chosen elsewhere (:func:`choose_f1_thresholds` on the validation split); None: fixed."""
    ap = average_precision(scores, targets).cpu().numpy()
    fixed = thresholds is None
    if thresholds is None:
        thresholds = torch.full((scores.shape[1],), FIXED_THRESHOLD, dtype=torch.float64)
    counts = counts_at(scores, targets, thresholds.to(scores.device))
    groups = shot_groups(np.asarray(train_counts), many_shot, few_shot)
    return MultiLabelEvaluation(
        mAP=_nanmean(ap),
        many_mAP=_nanmean(ap[groups["many"]]),
        medium_mAP=_nanmean(ap[groups["medium"]]),
        few_mAP=_nanmean(ap[groups["few"]]),
        micro_f1=counts.micro_f1,
        macro_f1=float(counts.f1.mean()),
        scored=int((~np.isnan(ap)).sum()),
        ap=ap,
        f1=counts.f1.cpu().numpy(),
        thresholds=thresholds.double().cpu().numpy(),
        support=counts.positives.cpu().numpy().astype(np.int64),
        thresholds_from="fixed" if fixed else "validation",
        class_names=list(class_names),
    )


@dataclass
class BinaryEvaluation:
    """One split's scores for the positive class: ``average_precision`` and ``roc_auc`` need no
    threshold; ``precision``, ``recall`` and ``f1`` are counted at ``threshold``, chosen on
    the validation split as the lowest one whose precision there is at least
    ``target_precision`` (``inf``: none reaches it, nothing is predicted positive)."""

    average_precision: float
    roc_auc: float
    threshold: float
    precision: float
    recall: float
    f1: float
    target_precision: float
    thresholds_from: str

    def headline(self, prefix: str) -> dict[str, float]:
        values = {k: v for k, v in asdict(self).items() if isinstance(v, float)}
        return {f"{prefix}/{k}": v for k, v in values.items() if np.isfinite(v)}

    def one_line(self) -> str:
        return (
            f"AP {self.average_precision:.4f}  ROC-AUC {self.roc_auc:.4f}  at threshold "
            f"{self.threshold:.4f} ({self.thresholds_from}): precision {self.precision:.4f} "
            f"recall {self.recall:.4f}"
        )


def choose_precision_threshold(
    scores: torch.Tensor, positives: torch.Tensor, target_precision: float
) -> float:
    """The lowest threshold of these (validation) ``scores`` (N,) whose precision reaches
    ``target_precision``: the most recall at it; ``inf`` when no threshold reaches it."""
    if not 0 < target_precision <= 1:
        raise ValueError(
            f"eval.target_precision must lie in (0, 1] (e.g. 0.9), got {target_precision}"
        )
    return float(thresholds_at_precision(scores[:, None], positives[:, None], target_precision)[0])


def evaluate_binary(
    scores: torch.Tensor,
    positives: torch.Tensor,
    target_precision: float,
    threshold: float | None = None,
) -> BinaryEvaluation:
    """Evaluate the positive class's ``scores`` (N,) (probabilities) against ``positives``
    (N,) 0/1, at ``threshold`` (chosen on the validation split by
    :func:`choose_precision_threshold`); None: :data:`FIXED_THRESHOLD`."""
    column, truth = scores[:, None], positives[:, None]
    at = FIXED_THRESHOLD if threshold is None else threshold
    counts = counts_at(column, truth, torch.tensor([at], dtype=torch.float64))
    return BinaryEvaluation(
        average_precision=float(average_precision(column, truth)[0]),
        roc_auc=float(roc_auc(column, truth)[0]),
        threshold=at,
        precision=float(counts.precision[0]),
        recall=float(counts.recall[0]),
        f1=float(counts.f1[0]),
        target_precision=float(target_precision),
        thresholds_from="fixed" if threshold is None else "validation",
    )
