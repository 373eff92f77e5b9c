"""tau-normalisation's tau is never scored on the rows that chose it: the validation halves, the
cross-fitted choice against its formula, and, with labels independent of the features, a race
objective that is on average not above plain cross-entropy's."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import DictConfig
from sklearn.metrics import balanced_accuracy_score

from runner.errors import UserError
from runner.tracking import Bystander
from runner.train.decoupled import (
    TAU_GRID,
    balanced_accuracy,
    choose_tau,
    tau_normalised,
    validation_halves,
)
from tests.conftest import compose_config

# One-sided bound on a mean of independent paired differences whose expectation is 0: the mean
# exceeds Z standard errors (the differences' sample standard deviation / sqrt(n)) with
# probability about 0.1% (normal tail; the seeds are fixed, so the outcome is too).
Z = 3.09


def _above_zero(differences: np.ndarray) -> float:
    """How many standard errors the mean of ``differences`` lies above 0."""
    error = differences.std(ddof=1) / np.sqrt(len(differences))
    return float(differences.mean() / error)


@pytest.mark.unit
def test_the_halves_are_stratified_disjoint_and_a_function_of_the_labels():
    labels = np.repeat(np.arange(4), [6, 5, 2, 9])[np.random.default_rng(1).permutation(22)]
    half_a = validation_halves(labels)
    for label, count in zip(range(4), [6, 5, 2, 9], strict=True):
        assert half_a[labels == label].sum() == (count + 1) // 2  # the odd row in half A
    assert np.array_equal(validation_halves(labels.copy()), half_a)  # no other input
    assert not np.array_equal(validation_halves(labels, seed=1), half_a)
    with pytest.raises(UserError, match="set data.val_per_class=2 or more"):
        validation_halves(np.arange(5))  # one row of every class: half B would be empty


@pytest.mark.unit
def test_balanced_accuracy_is_scikit_learns():
    rng = np.random.default_rng(0)
    labels, predictions = rng.integers(0, 5, 300), rng.integers(0, 6, 300)
    labels[labels == 3] = 4  # a class only predicted: scikit-learn drops it (with a warning)
    with pytest.warns(UserWarning, match="y_pred contains classes not in y_true"):
        expected = balanced_accuracy_score(labels, predictions)
    assert balanced_accuracy(labels, predictions) == pytest.approx(expected)


def _noise_classifier(rng: np.random.Generator, classes: int, dim: int) -> torch.nn.Linear:
    """A linear classifier whose class weight norms fall with the class index, as instance-
    balanced training on a long tail leaves them."""
    classifier = torch.nn.Linear(dim, classes)
    with torch.no_grad():
        directions = torch.from_numpy(rng.standard_normal((classes, dim))).float()
        norms = torch.linspace(2.0, 0.5, classes).unsqueeze(1)
        classifier.weight.copy_(directions / directions.norm(dim=1, keepdim=True) * norms)
        classifier.bias.copy_(torch.from_numpy(rng.standard_normal(classes)).float() * 0.1)
    return classifier


def _predictions(classifier: torch.nn.Linear, features: torch.Tensor) -> Callable[[], np.ndarray]:
    """The classifier's predictions of ``features`` as it stands when called."""
    return lambda: classifier(features).argmax(1).numpy()


@pytest.mark.unit
def test_the_choice_against_its_formula():
    """The reference's tau-normalised predictions (its tau_norm.py: the features' dot products
    with w_j / ||w_j||^tau, tau in np.linspace(0, 2, 21), no bias), the whole split's tau kept,
    and every validation row predicted with the tau the other half chose."""
    rng = np.random.default_rng(3)
    classifier = _noise_classifier(rng, classes=5, dim=8)
    weight = classifier.weight.detach().clone()
    features = torch.from_numpy(rng.standard_normal((60, 8))).float()
    # Rows along their class's weight by ||w_j||^0.5: equal true-class logits at tau=1.5.
    labels = rng.integers(0, 5, 60)
    along = weight[labels] / weight[labels].norm(dim=1, keepdim=True)
    features += 2.0 * along * weight[labels].norm(dim=1, keepdim=True).sqrt()
    assert np.allclose(TAU_GRID, np.linspace(0, 2, 21))

    def reference(tau: float, rows: torch.Tensor) -> np.ndarray:
        norms = torch.norm(weight, 2, 1)
        scaled = torch.stack([weight[i] / torch.pow(norms[i], tau) for i in range(len(weight))])
        return torch.mm(rows, scaled.t()).max(dim=1)[1].numpy()

    choice = choose_tau(classifier, _predictions(classifier, features), labels)
    half_a = validation_halves(labels)
    table = np.stack([reference(tau, features) for tau in TAU_GRID])
    scores = [balanced_accuracy_score(labels, row) for row in table]
    on_a = [balanced_accuracy_score(labels[half_a], row[half_a]) for row in table]
    on_b = [balanced_accuracy_score(labels[~half_a], row[~half_a]) for row in table]
    tau, tau_a, tau_b = (TAU_GRID[int(np.argmax(s))] for s in (scores, on_a, on_b))
    assert (choice.tau, choice.tau_a, choice.tau_b) == (tau, tau_a, tau_b)
    assert len({tau, tau_a, tau_b}) > 1 and max(choice.tau, choice.tau_a) > 1  # a real test
    assert choice.scores == pytest.approx(scores)
    crossed = np.where(half_a, reference(tau_b, features), reference(tau_a, features))
    assert np.array_equal(choice.cross_fitted, crossed)
    assert torch.allclose(classifier.weight, tau_normalised(weight, tau))
    assert np.array_equal(classifier(features).argmax(1).numpy(), reference(tau, features))
    assert not classifier.bias.any()


@pytest.mark.unit
def test_on_pure_noise_the_cross_fitted_score_is_not_optimistic():
    """Labels independent of the features: every prediction scores 1/K in expectation, so
    the cross-fitted balanced accuracy less the untuned classifier's has mean 0, while the
    tuned tau scored on the split that tuned it (the rule before) is optimistic: the test can
    tell the two apart."""
    rng = np.random.default_rng(0)
    crossed, in_sample = [], []
    for _ in range(300):
        classifier = _noise_classifier(rng, classes=10, dim=16)
        features = torch.from_numpy(rng.standard_normal((200, 16))).float()
        labels = rng.permutation(np.repeat(np.arange(10), 20))  # 20 of every class
        with torch.no_grad():
            untuned = balanced_accuracy(labels, _predictions(classifier, features)())
        choice = choose_tau(classifier, _predictions(classifier, features), labels)
        crossed.append(balanced_accuracy(labels, choice.cross_fitted) - untuned)
        in_sample.append(max(choice.scores) - untuned)
    assert _above_zero(np.array(crossed)) <= Z
    assert _above_zero(np.array(in_sample)) > Z


class _Kept(Bystander):
    """A recorder that keeps what a run logs in memory (no MLflow: sixty runs in seconds)."""

    def __init__(self, name: str) -> None:
        super().__init__("in-memory", name)
        self.metrics: dict[str, float] = {}

    def log_metrics(self, metrics: Any, step: int) -> None:
        self.metrics.update(metrics)


NOISE = [
    "data=synthetic_lt",
    "data.separation=0",  # every class the same distribution: labels independent of features
    "data.dim=16",
    "data.n_max=200",
    "data.imbalance_factor=20",
    "data.val_per_class=20",
    "data.test_per_class=1",
    "model.hidden=[32]",
    "trainer.epochs=3",
    "trainer.eval_every=3",
    "trainer.checkpoint_every=0",
    "trainer.progress=false",
    "trainer.threads=1",
    "tracking.log_model=false",
    "tracking.plots=false",
]


def _objective(cfg: DictConfig, seed: int, tmp: Path) -> tuple[float, dict[str, float]]:
    """The race's objective of one real run of ``cfg`` with ``seed`` (the data's and the
    run's; ``runner.results.objective`` on what the run returns) and the metrics it logged."""
    from runner.build import build_parts
    from runner.results import objective, record_results
    from runner.train.fit import fit
    from runner.train.run import Progress, RunContext

    cfg = copy.deepcopy(cfg)
    cfg.seed = cfg.data.data_seed = seed
    parts, recorder = build_parts(cfg), _Kept(f"{cfg.trainer.classifier_stage}-s{seed}")
    run = RunContext(parts, recorder, Progress(), tmp / "checkpoint.pt")
    fit(run)
    results = record_results(dataclasses.replace(run, path=tmp / "none"))  # no checkpoint logged
    return objective(cfg, results), recorder.metrics


@pytest.mark.slow  # ninety runs of three epochs, in this process (about 40 s of CPU)
def test_on_pure_noise_a_post_hoc_stage_does_not_beat_cross_entropy_in_the_race(tmp_path):
    """Thirty seeds, each a cross-entropy run and, for each post-hoc stage (tau-normalisation,
    logit adjustment), a run that trains alike (uniform sampler, cross-entropy) and differs in
    the stage alone: the paired differences of the race's objective (val/balanced_accuracy)
    have mean 0 when no tau is scored on the rows that chose it."""
    methods = ("tau_norm", "posthoc_la")
    # Composed once each; a seed changes two values (composition costs more than a run).
    configs = {m: compose_config([f"+method={m}", *NOISE]) for m in methods}
    plain = compose_config(["+method=ce", *NOISE])
    crossed: dict[str, list[float]] = {m: [] for m in methods}
    in_sample: dict[str, list[float]] = {m: [] for m in methods}
    for seed in range(30):
        ce, _ = _objective(plain, seed, tmp_path)
        for method in methods:
            tuned, logged = _objective(configs[method], seed, tmp_path)
            curve = [
                v for k, v in logged.items() if k.startswith("decoupled/val_balanced_accuracy/")
            ]
            assert len(curve) == len(TAU_GRID) and logged["val/balanced_accuracy"] == tuned
            if method == "posthoc_la":  # its tau=0 is the cross-entropy run's classifier unchanged
                assert curve[0] == pytest.approx(ce)
            crossed[method].append(tuned - ce)
            in_sample[method].append(max(curve) - ce)  # the objective the rule before gave
    for method in methods:
        assert _above_zero(np.array(crossed[method])) <= Z, method
        assert _above_zero(np.array(in_sample[method])) > Z, method  # catches the optimistic rule


@pytest.mark.unit
def test_the_fingerprints_tell_the_changed_recipes_from_runs_recorded_before():
    """A resumed sweep takes a finished run for its job by the config's fingerprint. Runs
    recorded before the classifier stage's mode existed trained in eval mode, and tau_norm's
    scored its tau on the split that chose it: the fingerprints below are those the code of
    then computed (commit dd4fcff) for +method=crt and for +method=tau_norm
    data.val_per_class=20."""
    from runner.fingerprint import config_key, config_keys

    def keys(*overrides: str) -> set[str]:
        return config_keys(compose_config(list(overrides)))

    crt_then, tau_norm_then = "2503bb285527f62f", "407ce316d5429c8a"
    assert crt_then in keys("+method=crt", "trainer.classifier_stage_mode=eval")
    assert crt_then not in keys("+method=crt")  # train mode, the default now, computes anew
    assert tau_norm_then not in keys("+method=tau_norm", "data.val_per_class=20")
    # Without classifier epochs the mode changes nothing: left out, whatever its value.
    assert config_key(compose_config(["trainer.classifier_stage_mode=eval"])) == config_key(
        compose_config([])
    )
