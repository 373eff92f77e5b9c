"""Evaluation on the balanced test set with scikit-learn's metrics."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from runner.config import HEADLINE

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
    report: str

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
        return cls(**values)  # type: ignore[arg-type]  # the fields of a state_dict() of this class


def shot_groups(train_counts: np.ndarray, many_shot: int, few_shot: int) -> dict[str, np.ndarray]:
    """Class masks by training count: many (> many_shot), few (< few_shot), medium (the rest)."""
    many = train_counts > many_shot
    few = train_counts < few_shot
    return {"many": many, "medium": ~many & ~few, "few": few}


def evaluate(
    y_true: np.ndarray,
    y_pred: np.ndarray,
    train_counts: np.ndarray,
    class_names: list[str],
    many_shot: int = 100,
    few_shot: int = 20,
) -> Evaluation:
    from sklearn.metrics import (  # here: scikit-learn takes a second to import
        accuracy_score,
        balanced_accuracy_score,
        classification_report,
        confusion_matrix,
        f1_score,
        precision_recall_fscore_support,
    )

    labels = np.arange(len(class_names))
    precision, recall, f1, support = precision_recall_fscore_support(
        y_true, y_pred, labels=labels, zero_division=0
    )
    groups = shot_groups(np.asarray(train_counts), many_shot, few_shot)
    tested = support > 0
    group_acc = {
        g: float(recall[mask & tested].mean()) if (mask & tested).any() else float("nan")
        for g, mask in groups.items()
    }
    return Evaluation(
        accuracy=float(accuracy_score(y_true, y_pred)),
        balanced_accuracy=float(balanced_accuracy_score(y_true, y_pred)),
        macro_f1=float(f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)),
        many_accuracy=group_acc["many"],
        medium_accuracy=group_acc["medium"],
        few_accuracy=group_acc["few"],
        precision=precision,
        recall=recall,
        f1=f1,
        support=support,
        confusion=confusion_matrix(y_true, y_pred, labels=labels),
        report=classification_report(
            y_true, y_pred, labels=labels, target_names=class_names, zero_division=0, digits=4
        ),
    )


@torch.no_grad()
def predict(model: torch.nn.Module, x: torch.Tensor, batch_size: int) -> np.ndarray:
    """Predicted classes for ``x`` (already on the model's device), in eval mode."""
    was_training = model.training
    model.eval()
    preds = [model(chunk).argmax(1) for chunk in x.split(batch_size)]
    model.train(was_training)
    return torch.cat(preds).cpu().numpy()
