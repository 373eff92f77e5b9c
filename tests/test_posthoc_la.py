"""Post-hoc logit adjustment (Menon et al. 2021) as the classifier stage ``posthoc_la``: the
choice against the reference's formula, cross-fitted as tau-normalisation's, and, with labels
independent of the features, a cross-fitted score not above the unadjusted classifier's (the
race's objective on real runs: tests/test_tau_norm_selection.py, for both post-hoc stages)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import balanced_accuracy_score

from runner.train.decoupled import TAU_GRID, balanced_accuracy, choose_adjustment, validation_halves
from tests.test_tau_norm_selection import (
    Z,
    _above_zero,
    _noise_classifier,
    _predictions,
)


def _reference(logits: np.ndarray, base_probs: np.ndarray, tau: float) -> np.ndarray:
    """The reference's post-hoc predictions (google-research logit_adjustment/main.py:
    ``logits - log(base_probs**tau + 1e-12)``), in float64."""
    return (logits - np.log(base_probs**tau + 1e-12)).argmax(1)


@pytest.mark.unit
def test_the_choice_against_the_references_formula():
    """Every tau of the grid scored on the whole split, each half's own choice, the classifier
    left at the whole split's tau, and every validation row predicted with the tau the other
    half chose; computed here from the logits and the prior, independently of the runner."""
    rng = np.random.default_rng(5)
    classifier = _noise_classifier(rng, classes=5, dim=8)
    counts = np.array([400, 150, 60, 20, 5])
    prior = counts / counts.sum()
    labels = rng.integers(0, 5, 80)
    features = torch.from_numpy(rng.standard_normal((80, 8))).float()
    # Rows leaning to their class but with the frequent classes favoured, as a model trained on
    # the long tail leaves them: an adjustment in the grid's middle predicts best.
    weight = classifier.weight.detach()
    features += 0.6 * weight[labels] / weight[labels].norm(dim=1, keepdim=True)
    with torch.no_grad():
        classifier.bias.copy_(torch.from_numpy(np.log(prior)).float())
        logits = classifier(features).double().numpy()
    bias = classifier.bias.detach().clone()

    choice = choose_adjustment(
        classifier, torch.from_numpy(prior), _predictions(classifier, features), labels
    )
    half_a = validation_halves(labels)
    table = np.stack([_reference(logits, prior, tau) for tau in TAU_GRID])
    scores = [balanced_accuracy_score(labels, row) for row in table]
    on_a = [balanced_accuracy_score(labels[half_a], row[half_a]) for row in table]
    on_b = [balanced_accuracy_score(labels[~half_a], row[~half_a]) for row in table]
    tau, tau_a, tau_b = (TAU_GRID[int(np.argmax(s))] for s in (scores, on_a, on_b))
    assert (choice.tau, choice.tau_a, choice.tau_b) == (tau, tau_a, tau_b)
    assert len({tau, tau_a, tau_b}) > 1 and choice.tau > 0  # a real test: the halves differ
    assert choice.scores == pytest.approx(scores)
    crossed = np.where(half_a, table[TAU_GRID.index(tau_b)], table[TAU_GRID.index(tau_a)])
    assert np.array_equal(choice.cross_fitted, crossed)
    # The classifier keeps the whole split's tau, folded into its bias: logits - tau log prior.
    expected = bias.double() - torch.log(torch.from_numpy(prior) ** tau + 1e-12)
    assert torch.allclose(classifier.bias.double(), expected, atol=1e-6)
    with torch.no_grad():
        assert np.array_equal(classifier(features).argmax(1).numpy(), table[TAU_GRID.index(tau)])


@pytest.mark.unit
def test_on_pure_noise_the_cross_fitted_score_is_not_optimistic():
    """Labels independent of the features: every prediction scores 1/K in expectation, so the
    cross-fitted balanced accuracy less the unadjusted classifier's has mean 0 (bounded by
    :data:`Z` standard errors of the 300 paired differences), while the tau scored on the split
    that chose it is optimistic: the test tells the two apart."""
    rng = np.random.default_rng(0)
    prior = torch.from_numpy(np.geomspace(1.0, 0.02, 10))
    prior /= prior.sum()
    crossed, in_sample = [], []
    for _ in range(300):
        classifier = _noise_classifier(rng, classes=10, dim=16)
        with torch.no_grad():  # the frequent classes favoured, as training on the tail leaves it
            classifier.bias.add_(torch.log(prior).float())
        features = torch.from_numpy(rng.standard_normal((200, 16))).float()
        labels = rng.permutation(np.repeat(np.arange(10), 20))  # 20 of every class
        with torch.no_grad():
            plain = balanced_accuracy(labels, _predictions(classifier, features)())
        choice = choose_adjustment(classifier, prior, _predictions(classifier, features), labels)
        crossed.append(balanced_accuracy(labels, choice.cross_fitted) - plain)
        in_sample.append(max(choice.scores) - plain)
    assert _above_zero(np.array(crossed)) <= Z
    assert _above_zero(np.array(in_sample)) > Z
