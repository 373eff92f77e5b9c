"""The evaluation's metrics, computed from one confusion matrix, are scikit-learn's to the bit
(the values logged before they were computed so), also for classes never predicted, never
present, or neither; its report is scikit-learn's, also after a checkpoint."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from sklearn.metrics import (
    accuracy_score,
    balanced_accuracy_score,
    classification_report,
    confusion_matrix,
    f1_score,
    precision_recall_fscore_support,
)

from runner.train.evaluation import Evaluation, evaluate

pytestmark = pytest.mark.unit  # in one process, seconds

NAMES = [f"class {i}" for i in range(7)]


def _cases() -> list[tuple[np.ndarray, np.ndarray]]:
    """Random labels and predictions of 7 classes in which class 5 is never predicted, class 4
    never present (only predicted), class 6 neither; and a perfect case, and one of a single row."""
    rng = np.random.default_rng(0)
    cases = []
    for n in (1, 13, 500):
        labels = rng.choice([0, 1, 2, 3, 5], n)
        predictions = rng.choice([0, 1, 2, 3, 4], n)
        cases.append((labels, predictions))
    cases.append((np.arange(7).repeat(3), np.arange(7).repeat(3)))
    return cases


@pytest.mark.parametrize("case", range(4))
def test_every_metric_is_scikit_learns(case):
    labels, predictions = _cases()[case]
    every = np.arange(len(NAMES))
    counts = np.array([500, 300, 120, 60, 30, 10, 5])  # many, medium and few-shot classes
    result = evaluate(labels, predictions, counts, NAMES)
    precision, recall, f1, support = precision_recall_fscore_support(
        labels, predictions, labels=every, zero_division=0
    )
    # Bitwise: the same values as logged before, not merely close ones.
    assert np.array_equal(result.precision, precision)
    assert np.array_equal(result.recall, recall)
    assert np.array_equal(result.f1, f1)
    assert np.array_equal(result.support, support)
    assert np.array_equal(result.confusion, confusion_matrix(labels, predictions, labels=every))
    assert result.accuracy == accuracy_score(labels, predictions)
    with warnings.catch_warnings():  # scikit-learn warns that class 4 is only predicted
        warnings.simplefilter("ignore")
        balanced = balanced_accuracy_score(labels, predictions)
    assert result.balanced_accuracy == balanced
    macro = f1_score(labels, predictions, labels=every, average="macro", zero_division=0)
    assert result.macro_f1 == macro
    expected = classification_report(
        labels, predictions, labels=every, target_names=NAMES, zero_division=0, digits=4
    )
    assert result.report == expected


def test_a_checkpointed_evaluation_reports_alike():
    labels, predictions = _cases()[2]
    result = evaluate(labels, predictions, np.full(7, 50), NAMES)
    buffer = io.BytesIO()
    torch.save(result.state_dict(), buffer)
    buffer.seek(0)
    restored = Evaluation.from_state(torch.load(buffer, weights_only=True))
    assert restored.report == result.report and restored.metrics(NAMES) == result.metrics(NAMES)
    # A checkpoint saved before the report was written on demand kept the text, not the names.
    old = {k: v for k, v in result.state_dict().items() if k not in ("class_names", "saved_report")}
    old["report"] = "the text saved then"
    assert Evaluation.from_state(old).report == "the text saved then"


def test_labels_or_predictions_outside_the_classes_are_refused():
    with pytest.raises(ValueError, match="predictions outside 0..6"):
        evaluate(np.array([0, 1]), np.array([0, 7]), np.full(7, 50), NAMES)
    with pytest.raises(ValueError, match="labels outside 0..6"):
        evaluate(np.array([-1, 1]), np.array([0, 1]), np.full(7, 50), NAMES)
