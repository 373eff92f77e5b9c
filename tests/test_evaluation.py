"""Metric functions against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from runner.train.evaluation import evaluate, shot_groups

pytestmark = pytest.mark.unit  # in one process, seconds


def test_metrics_on_a_hand_computed_case():
    # 3 classes, 4 test samples each. Predictions: class 0 all right, class 1 half, class 2 none
    # (two of class 2 predicted as 0, two as 1).
    y_true = np.repeat([0, 1, 2], 4)
    y_pred = np.array([0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1])
    result = evaluate(
        y_true, y_pred, train_counts=np.array([500, 50, 5]), class_names=["a", "b", "c"]
    )
    assert result.accuracy == pytest.approx(6 / 12)
    assert result.balanced_accuracy == pytest.approx((1 + 0.5 + 0) / 3)
    assert result.recall.tolist() == pytest.approx([1.0, 0.5, 0.0])
    # precision: class 0 predicted 8 times (4 right), class 1 predicted 4 times (2 right)
    assert result.precision.tolist() == pytest.approx([0.5, 0.5, 0.0])
    f1 = [2 * 0.5 * 1 / 1.5, 0.5, 0.0]
    assert result.f1.tolist() == pytest.approx(f1)
    assert result.macro_f1 == pytest.approx(sum(f1) / 3)
    assert (result.many_accuracy, result.medium_accuracy, result.few_accuracy) == (1.0, 0.5, 0.0)
    assert result.confusion.tolist() == [[4, 0, 0], [2, 2, 0], [2, 2, 0]]
    metrics = result.metrics(["a", "b", "c"])
    assert metrics["test/recall/b"] == 0.5 and metrics["test/precision/a"] == 0.5
    assert "a" in result.report and "macro avg" in result.report


def test_shot_groups_and_empty_groups_are_not_reported():
    groups = shot_groups(np.array([101, 100, 20, 19]), many_shot=100, few_shot=20)
    assert groups["many"].tolist() == [True, False, False, False]
    assert groups["medium"].tolist() == [False, True, True, False]
    assert groups["few"].tolist() == [False, False, False, True]
    result = evaluate(np.array([0, 1]), np.array([0, 1]), np.array([500, 400]), ["a", "b"])
    assert np.isnan(result.few_accuracy)
    assert "test/few_accuracy" not in result.metrics(["a", "b"])
