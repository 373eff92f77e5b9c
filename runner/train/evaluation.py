"""Evaluation on the balanced test set: every metric from the confusion matrix (one
``torch.bincount``), as scikit-learn computes it with ``zero_division=0``; scikit-learn's
input validation cost most of an epoch's evaluation. The classification report is scikit-learn's,
written when it is read."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from runner.train.settings import HEADLINE

PER_CLASS = ("recall", "precision", "f1")


@dataclass
class Evaluation:
    accuracy: float
    balanced_accuracy: float
    macro_f1: float
    many_accuracy: float
    medium_accuracy: float
    few_accuracy: float
    precision: np.ndarray
    recall: np.ndarray
    f1: np.ndarray
    support: np.ndarray
    confusion: np.ndarray
    class_names: list[str]
    # The report a checkpoint saved before the report was written on demand (those did not keep
    # the class names it needs): shown as it was saved.
    saved_report: str = field(default="", repr=False)

    @property
    def report(self) -> str:
        """scikit-learn's ``classification_report`` (4 digits, ``zero_division=0``) of the
        predictions this evaluation counted: every (true, predicted) pair as often as the
        confusion matrix holds it, which is all the report reads."""
        if self.saved_report:
            return self.saved_report
        from sklearn.metrics import classification_report  # here: a second to import

        cells = self.confusion.ravel()
        pairs = np.repeat(np.arange(cells.size), cells)
        classes = len(self.class_names)
        return str(
            classification_report(
                pairs // classes,
                pairs % classes,
                labels=np.arange(classes),
                target_names=self.class_names,
                zero_division=0,
                digits=4,
            )
        )

    score_name = "balanced_accuracy"  # the headline metric :attr:`score` is

    @property
    def score(self) -> float:
        """What picks the best epoch (on the validation split when there is one): balanced
        accuracy."""
        return self.balanced_accuracy

    def headline(self, prefix: str) -> dict[str, float]:
        """The headline metrics as ``prefix/<name>`` (a shot group with no classes left out)."""
        out = {f"{prefix}/{k}": float(getattr(self, k)) for k in HEADLINE}
        return {k: v for k, v in out.items() if not np.isnan(v)}

    def one_line(self) -> str:
        """The headline metrics as the console prints them."""
        parts = [
            f"acc {self.accuracy:.4f}",
            f"bal-acc {self.balanced_accuracy:.4f}",
            f"macro-F1 {self.macro_f1:.4f}",
        ]
        parts += [
            f"{g} {getattr(self, g + '_accuracy'):.4f}"
            for g in ("many", "medium", "few")
            if not np.isnan(getattr(self, g + "_accuracy"))
        ]
        return "  ".join(parts)

    def metrics(
        self, class_names: list[str], prefix: str = "test", per_class: bool = True
    ) -> dict[str, float]:
        """Flat metric dict: the headline, and with ``per_class`` one key per class and value
        (``test/recall/<class>``); a shot group with no classes (NaN) is left out."""
        out = self.headline(prefix)
        if per_class:
            for kind, values in self.class_columns(prefix).items():
                for name, value in zip(class_names, values, strict=True):
                    out[f"{kind}/{name}"] = float(value)
        return {k: v for k, v in out.items() if not np.isnan(v)}

    def class_columns(self, prefix: str = "test") -> dict[str, np.ndarray]:
        """The per-class values as columns (``test/recall``: one value per class)."""
        return {f"{prefix}/{kind}": getattr(self, kind) for kind in PER_CLASS}

    def state_dict(self) -> dict[str, Any]:
        """Plain values and tensors, loadable with ``torch.load(weights_only=True)``."""
        return {
            k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
            for k, v in asdict(self).items()
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Evaluation:
        values = {k: v.numpy() if torch.is_tensor(v) else v for k, v in state.items()}
        if "report" in values:  # saved before the report was written on demand
            values["saved_report"] = values.pop("report")
            values.setdefault("class_names", [])
        return cls(**values)  # type: ignore[arg-type]  # the fields of a state_dict() of this class


def shot_groups(train_counts: np.ndarray, many_shot: int, few_shot: int) -> dict[str, np.ndarray]:
    """Class masks by training count: many (> many_shot), few (< few_shot), medium (the rest)."""
    many = train_counts > many_shot
    few = train_counts < few_shot
    return {"many": many, "medium": ~many & ~few, "few": few}


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> np.ndarray:
    """Counts of (true class i, predicted class j) at [i, j], both in 0..num_classes - 1 (anything
    else is a ValueError): scikit-learn's ``confusion_matrix`` with ``labels=range(num_classes)``,
    from one ``torch.bincount``."""
    true = torch.from_numpy(np.asarray(y_true, dtype=np.int64))
    pred = torch.from_numpy(np.asarray(y_pred, dtype=np.int64))
    if true.shape != pred.shape:
        raise ValueError(f"{true.numel()} labels against {pred.numel()} predictions")
    for name, values in (("labels", true), ("predictions", pred)):
        if values.numel() and not 0 <= int(values.min()) <= int(values.max()) < num_classes:
            raise ValueError(f"{name} outside 0..{num_classes - 1}")
    flat = torch.bincount(true * num_classes + pred, minlength=num_classes * num_classes)
    return flat.reshape(num_classes, num_classes).numpy()


def _divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator in float64, 0 where the denominator is 0: scikit-learn's
    ``zero_division=0``."""
    return np.divide(
        numerator,
        denominator,
        out=np.zeros(len(numerator)),
        where=denominator != 0,
        dtype=np.float64,
    )


def evaluate(
    y_true: np.ndarray,
    y_pred: np.ndarray,
    train_counts: np.ndarray,
    class_names: list[str],
    many_shot: int = 100,
    few_shot: int = 20,
) -> Evaluation:
    """The metrics of predictions ``y_pred`` of labels ``y_true`` (classes 0..len(class_names) -
    1), equal to scikit-learn's: ``precision_recall_fscore_support`` and macro ``f1_score`` over
    every class with ``zero_division=0`` (F1 as 2 tp / (support + predicted)), ``accuracy_score``,
    and ``balanced_accuracy_score``, the mean recall over the classes present in ``y_true``. The
    shot groups' accuracies are their tested classes' mean recall (NaN for a group without)."""
    confusion = confusion_matrix(y_true, y_pred, len(class_names))
    hits = np.diag(confusion)
    support, predicted = confusion.sum(axis=1), confusion.sum(axis=0)
    precision, recall = _divide(hits, predicted), _divide(hits, support)
    f1 = _divide(2.0 * hits, (support + predicted).astype(np.float64))
    groups = shot_groups(np.asarray(train_counts), many_shot, few_shot)
    tested = support > 0
    group_acc = {
        g: float(recall[mask & tested].mean()) if (mask & tested).any() else float("nan")
        for g, mask in groups.items()
    }
    return Evaluation(
        accuracy=float(hits.sum() / confusion.sum()),
        balanced_accuracy=float(np.mean(recall[tested])),
        macro_f1=float(np.mean(f1)),
        many_accuracy=group_acc["many"],
        medium_accuracy=group_acc["medium"],
        few_accuracy=group_acc["few"],
        precision=precision,
        recall=recall,
        f1=f1,
        support=support,
        confusion=confusion,
        class_names=list(class_names),
    )


@torch.no_grad()
def predict(model: torch.nn.Module, x: torch.Tensor, batch_size: int) -> np.ndarray:
    """Predicted classes for ``x`` (already on the model's device), in eval mode."""
    was_training = model.training
    model.eval()
    preds = [model(chunk).argmax(1) for chunk in x.split(batch_size)]
    model.train(was_training)
    return torch.cat(preds).cpu().numpy()
