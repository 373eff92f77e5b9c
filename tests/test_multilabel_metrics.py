"""Score metrics against scikit-learn (exact within float tolerance, ties included), and the
rule that thresholds are chosen on the validation split and applied to the test split."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import (
    average_precision_score,
    f1_score,
    precision_score,
    recall_score,
    roc_auc_score,
)

from runner.train.evaluation import Evaluation, evaluate
from runner.train.multilabel_evaluation import (
    FIXED_THRESHOLD,
    MultiLabelEvaluation,
    choose_f1_thresholds,
    choose_precision_threshold,
    evaluate_binary,
    evaluate_multilabel,
    evaluation_from_state,
)
from runner.train.ranking import (
    average_precision,
    best_f1_thresholds,
    counts_at,
    roc_auc,
    thresholds_at_precision,
)

pytestmark = pytest.mark.unit

# Both sides sum the same float64 terms in other orders: they agree to a few ulps.
TOLERANCE = 1e-12


def tied_cases(count: int = 150, seed: int = 0):  # type: ignore[no-untyped-def]
    """Small score matrices with many ties (scores on coarse grids) and columns with no, some
    and only positives."""
    rng = np.random.RandomState(seed)
    for _ in range(count):
        n = rng.randint(2, 50)
        y = (rng.rand(n, 3) < rng.rand(3)).astype(np.int64)
        s = np.round(rng.rand(n, 3) * rng.choice([2, 5, 1000]), 0) / 7
        yield torch.from_numpy(s), torch.from_numpy(y)


def test_average_precision_and_roc_auc_are_scikit_learns_with_ties() -> None:
    checked = 0
    for s, y in tied_cases():
        ap, auc = average_precision(s, y).numpy(), roc_auc(s, y).numpy()
        for c in range(3):
            positives = int(y[:, c].sum())
            if positives:
                assert abs(ap[c] - average_precision_score(y[:, c], s[:, c])) < TOLERANCE
                checked += 1
            else:
                assert np.isnan(ap[c])
            if 0 < positives < len(y):
                assert abs(auc[c] - roc_auc_score(y[:, c], s[:, c])) < TOLERANCE
            else:
                assert np.isnan(auc[c])
    assert checked > 300


def brute_force(s: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every distinct score of one column as a threshold, with its F1 and precision, counted
    directly (``score >= threshold`` predicts positive)."""
    thresholds = np.unique(s)
    predicted = s[None, :] >= thresholds[:, None]
    tp = (predicted & (y[None, :] == 1)).sum(1)
    f1 = 2 * tp / (predicted.sum(1) + y.sum())
    return thresholds, f1, tp / predicted.sum(1)


def test_the_f1_threshold_is_the_best_of_every_distinct_score() -> None:
    for s, y in tied_cases(100, seed=1):
        chosen = best_f1_thresholds(s, y)
        counts = counts_at(s, y, chosen)
        for c in range(3):
            if not y[:, c].any():
                assert torch.isinf(chosen[c])
                continue
            thresholds, f1, _ = brute_force(s[:, c].numpy(), y[:, c].numpy())
            assert float(chosen[c]) == thresholds[f1 == f1.max()].max()  # the highest best
            assert abs(float(counts.f1[c]) - f1.max()) < TOLERANCE
            assert abs(f1_score(y[:, c], s[:, c] >= chosen[c]) - f1.max()) < TOLERANCE


def test_the_precision_threshold_gives_the_most_recall_at_that_precision() -> None:
    for s, y in tied_cases(100, seed=2):
        chosen = thresholds_at_precision(s, y, 0.6)
        for c in range(3):
            thresholds, f1, precision = brute_force(s[:, c].numpy(), y[:, c].numpy())
            reaching = thresholds[(precision >= 0.6) & (f1 > 0)]
            if not reaching.size:
                assert torch.isinf(chosen[c])
            else:
                assert float(chosen[c]) == reaching.min()


def test_micro_and_macro_f1_at_thresholds_are_scikit_learns() -> None:
    for s, y in tied_cases(40, seed=3):
        thresholds = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)
        result = evaluate_multilabel(s, y, np.array([50, 30, 5]), ["a", "b", "c"], thresholds)
        predicted = (s >= thresholds).numpy()
        micro = f1_score(y.numpy(), predicted, average="micro", zero_division=0)
        macro = f1_score(y.numpy(), predicted, average="macro", zero_division=0)
        assert abs(result.micro_f1 - micro) < TOLERANCE
        assert abs(result.macro_f1 - macro) < TOLERANCE


def test_thresholds_chosen_on_validation_are_applied_to_test() -> None:
    generator = torch.Generator().manual_seed(0)
    val_y = torch.rand(400, 4, generator=generator) < 0.3
    test_y = torch.rand(400, 4, generator=generator) < 0.3
    val_scores = (
        val_y.double() * 0.5 + torch.rand(400, 4, generator=generator, dtype=torch.float64)
    ).clamp(0, 1)
    test_scores = (
        test_y.double() * 0.3 + torch.rand(400, 4, generator=generator, dtype=torch.float64)
    ).clamp(0, 1)
    chosen = choose_f1_thresholds(val_scores, val_y)
    result = evaluate_multilabel(
        test_scores, test_y, np.array([200, 150, 50, 10]), list("abcd"), chosen
    )
    assert np.array_equal(result.thresholds, chosen.numpy())
    assert result.thresholds_from == "validation"
    on_test = choose_f1_thresholds(test_scores, test_y)
    assert not torch.equal(on_test, chosen)  # the test set would have chosen others
    expected = f1_score(test_y.numpy(), (test_scores >= chosen).numpy(), average="macro")
    assert abs(result.macro_f1 - expected) < TOLERANCE
    fixed = evaluate_multilabel(test_scores, test_y, np.array([200, 150, 50, 10]), list("abcd"))
    assert fixed.thresholds_from == "fixed" and (fixed.thresholds == FIXED_THRESHOLD).all()


def test_group_maps_and_classes_without_positives() -> None:
    generator = torch.Generator().manual_seed(1)
    y = torch.rand(300, 4, generator=generator) < 0.3
    y[:, 3] = False  # no positive of class d in this split
    scores = torch.rand(300, 4, generator=generator, dtype=torch.float64) + y.double() * 0.4
    result = evaluate_multilabel(scores, y, np.array([500, 60, 10, 5]), list("abcd"))
    ap = [average_precision_score(y[:, c].numpy(), scores[:, c].numpy()) for c in range(3)]
    assert result.scored == 3 and np.isnan(result.ap[3])
    assert result.support.tolist() == y.sum(0).tolist()
    assert abs(result.mAP - np.mean(ap)) < TOLERANCE
    assert result.many_mAP == pytest.approx(ap[0]) and result.medium_mAP == pytest.approx(ap[1])
    assert result.few_mAP == pytest.approx(ap[2])  # class d (few) has no positive: left out
    metrics = result.metrics(list("abcd"), "val")
    assert "val/ap/d" not in metrics and metrics["val/ap/a"] == pytest.approx(ap[0])
    assert metrics["val/mAP"] == result.mAP
    restored = evaluation_from_state(result.state_dict())
    assert isinstance(restored, MultiLabelEvaluation) and restored.score == result.mAP
    assert restored.metrics(list("abcd"), "val") == metrics
    assert f"{ap[0]:6.4f}" in result.report.splitlines()[1]
    single = evaluate(np.array([0, 1, 1]), np.array([0, 1, 0]), np.array([5, 3]), ["x", "y"])
    again = evaluation_from_state(single.state_dict())
    assert isinstance(again, Evaluation) and again.score == single.balanced_accuracy == 0.75


def test_a_rare_positive_class_gets_ap_roc_auc_and_a_validation_threshold() -> None:
    generator = torch.Generator().manual_seed(2)

    def split(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        positives = torch.rand(n, generator=generator) < 0.05  # 95 / 5
        noise = torch.rand(n, generator=generator, dtype=torch.float64)
        return (0.6 * positives.double() + 0.7 * noise).clamp(0, 1), positives

    val_scores, val_y = split(2000)
    test_scores, test_y = split(2000)
    threshold = choose_precision_threshold(val_scores, val_y, 0.8)
    val_predicted = (val_scores >= threshold).numpy()
    assert precision_score(val_y.numpy(), val_predicted) >= 0.8
    result = evaluate_binary(test_scores, test_y, 0.8, threshold)
    predicted = (test_scores >= threshold).numpy()
    assert result.threshold == threshold and result.thresholds_from == "validation"
    assert abs(result.average_precision - average_precision_score(test_y, test_scores)) < TOLERANCE
    assert abs(result.roc_auc - roc_auc_score(test_y, test_scores)) < TOLERANCE
    assert result.recall == pytest.approx(recall_score(test_y, predicted))
    assert result.precision == pytest.approx(precision_score(test_y, predicted))
    assert {"test/average_precision", "test/roc_auc", "test/threshold"} <= set(
        result.headline("test")
    )
    with pytest.raises(ValueError, match=r"eval.target_precision must lie in \(0, 1\]"):
        choose_precision_threshold(val_scores, val_y, 1.5)
