"""scripts.baselines: scikit-learn's baselines beside the race select on validation alone."""

from __future__ import annotations

import numpy as np
import pytest

from scripts.baselines import Split, balanced_accuracy, baselines

pytestmark = pytest.mark.unit

COUNTS = (400, 120, 40, 12)  # a long-tailed training split, imbalance factor 33


def gaussians(seed: int = 0) -> dict[str, Split]:
    """Four overlapping Gaussian classes in 6 dimensions: a long-tailed training split, a
    balanced validation (50 a class) and test split (200 a class)."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 1.0, (len(COUNTS), 6))

    def draw(counts: tuple[int, ...]) -> Split:
        y = np.repeat(np.arange(len(counts)), counts)
        return means[y] + rng.normal(0.0, 1.0, (len(y), 6)), y

    return {"train": draw(COUNTS), "val": draw((50,) * 4), "test": draw((200,) * 4)}


def test_balanced_accuracy_is_scikit_learns():
    from sklearn.metrics import balanced_accuracy_score

    rng = np.random.default_rng(1)
    labels, predicted = rng.integers(0, 5, 300), rng.integers(0, 5, 300)
    assert balanced_accuracy(labels, predicted) == pytest.approx(
        balanced_accuracy_score(labels, predicted)
    )


def test_the_test_split_chooses_nothing():
    """Shuffled test labels change the test figures and nothing chosen on validation."""
    splits = gaussians()
    x, y = splits["test"]
    shuffled = {**splits, "test": (x, np.random.default_rng(2).permutation(y))}
    first, second = baselines(splits)["rows"], baselines(shuffled)["rows"]
    for name in first:
        assert first[name]["chosen"] == second[name]["chosen"], name
        assert first[name]["val_balanced_accuracy"] == second[name]["val_balanced_accuracy"]
    assert first["lr_la"]["test_balanced_accuracy"] != second["lr_la"]["test_balanced_accuracy"]


def test_logit_adjustment_raises_the_rare_classes():
    """On a long tail scored by balanced accuracy, subtracting tau * log(prior) helps the rare
    classes, so validation picks tau > 0 over the plain fit (tau = 0, first in the grid, wins
    ties): with the sign of the adjustment reversed, tau = 0 would win. Fixed seed; the rarest
    class has 12 of the 572 training rows."""
    assert baselines(gaussians())["rows"]["lr_la"]["chosen"]["tau"] > 0
