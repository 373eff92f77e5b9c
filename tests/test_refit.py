"""The classifier refitted by logistic regression (``logistic_la``, ``logistic_balanced``): the fit
against scikit-learn's ``LogisticRegression``, the (C, tau) choice cross-fitted as the other
post-hoc stages', not optimistic on labels independent of the features, a signal during the
fits, and real runs; and nearest class mean (``ncm``) against the reference's computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from runner.build import build_parts
from runner.train.decoupled import TAU_GRID, balanced_accuracy, validation_halves
from runner.train.refit import (
    C_GRID,
    GRADIENT_TOLERANCE,
    balanced_weights,
    choose_refit,
    fit_logistic,
)
from tests.conftest import compose_config
from tests.helpers.record import logged_checkpoint
from tests.test_tau_norm_selection import Z, _above_zero, _predictions


def _blobs(rng: np.random.Generator, counts: list[int], dim: int, spread: float):
    labels = np.repeat(np.arange(len(counts)), counts)
    means = rng.standard_normal((len(counts), dim)) * spread
    features = means[labels] + rng.standard_normal((len(labels), dim))
    return torch.from_numpy(features).float(), torch.from_numpy(labels)


@pytest.mark.unit
@pytest.mark.parametrize("c", [0.01, 1.0, 100.0])
@pytest.mark.parametrize("balanced", [False, True])
def test_the_fit_is_scikit_learns_logistic_regression(c, balanced):
    """The same objective (l2, bias unpenalised, class_weight="balanced" as sample weights),
    both solved far past their default tolerances: the predicted probabilities agree to 1e-4
    (the objective is strictly convex in W and the softmax is invariant to the bias's common
    shift, so the probabilities are unique)."""
    rng = np.random.default_rng(3)
    features, labels = _blobs(rng, [120, 50, 20, 8], dim=6, spread=1.2)
    weights = balanced_weights(labels, 4) if balanced else None
    weight, bias = fit_logistic(features, labels, 4, c, weights, tolerance=1e-10)
    ours = torch.softmax(features.double() @ weight.T + bias, 1).numpy()
    reference = LogisticRegression(
        C=c, tol=1e-12, max_iter=100_000, class_weight="balanced" if balanced else None
    ).fit(features.double().numpy(), labels.numpy())
    assert np.abs(ours - reference.predict_proba(features.double().numpy())).max() < 1e-4


@pytest.mark.unit
@pytest.mark.parametrize("c", [0.01, 100.0])
def test_the_fit_stops_where_scikit_learns_does(c):
    """At their default tolerances (the same gradient bound on the same objective) both predict
    the same classes, and their probabilities differ by far less than a class's margin."""
    assert LogisticRegression().get_params()["tol"] == GRADIENT_TOLERANCE
    rng = np.random.default_rng(5)
    features, labels = _blobs(rng, [200, 80, 30, 10], dim=16, spread=0.8)
    weight, bias = fit_logistic(features, labels, 4, c)
    ours = torch.softmax(features.double() @ weight.T + bias, 1).numpy()
    x = features.double().numpy()
    reference = LogisticRegression(C=c, max_iter=1000).fit(x, labels.numpy())
    assert np.array_equal(ours.argmax(1), reference.predict(x))
    assert np.abs(ours - reference.predict_proba(x)).max() < 1e-2


@pytest.mark.unit
@pytest.mark.parametrize("balanced", [False, True])
def test_the_refit_classifier_is_a_standard_scaler_then_logistic_regression(balanced):
    """Features on scales from 1e-3 to 1e3 (and one constant column): the refitted classifier,
    acting on the raw features, predicts what scikit-learn's StandardScaler + LogisticRegression
    pipeline predicts (scikit-learn's fit tight, ours at its default tolerance: probabilities
    within 1e-2, as in the test above), and the same as on the features unscaled; C means the
    same whatever the features' scale."""
    rng = np.random.default_rng(11)
    features, labels = _blobs(rng, [150, 60, 20, 8], dim=6, spread=1.0)
    val_x, val_y = _blobs(np.random.default_rng(12), [20, 20, 20, 20], dim=6, spread=1.0)
    features[:, -1] = val_x[:, -1] = 7.0  # no spread: scaled by one, as scikit-learn does
    scales = torch.tensor([1e-3, 1e-1, 1.0, 10.0, 1e3, 1.0])
    prior = torch.bincount(labels).double() / len(labels)

    def refit(x: torch.Tensor, v: torch.Tensor) -> np.ndarray:
        classifier = torch.nn.Linear(6, 4)
        choose_refit(
            classifier, (x, labels), prior, _predictions(classifier, v), val_y.numpy(),
            balanced=balanced, c_grid=(0.05,), tau_grid=(0.0,),
        )  # fmt: skip
        with torch.no_grad():
            return torch.softmax(classifier(v).double(), 1).numpy()

    x, v = features * scales, val_x * scales
    pipeline = make_pipeline(
        StandardScaler(),
        LogisticRegression(
            C=0.05, tol=1e-12, max_iter=100_000, class_weight="balanced" if balanced else None
        ),
    ).fit(x.double().numpy(), labels.numpy())
    ours = refit(x, v)
    assert np.abs(ours - pipeline.predict_proba(v.double().numpy())).max() < 1e-2
    assert np.abs(ours - refit(features, val_x)).max() < 1e-2


@pytest.mark.unit
def test_the_choice_of_c_and_tau_is_cross_fitted():
    """Every (C, tau) scored on the whole split and on each half, the classifier left at the
    whole split's pair, every validation row predicted with the pair the other half chose:
    recomputed here from fits of our own."""
    rng = np.random.default_rng(7)
    features, labels = _blobs(rng, [300, 90, 30, 10], dim=8, spread=0.7)
    val_x, val_y = _blobs(np.random.default_rng(8), [30, 30, 30, 30], dim=8, spread=0.7)
    val_y = val_y.numpy()
    prior = torch.bincount(labels).double() / len(labels)
    classifier = torch.nn.Linear(8, 4)
    grid = (0.01, 1.0)
    choice = choose_refit(
        classifier, (features, labels), prior, _predictions(classifier, val_x), val_y, c_grid=grid
    )

    scaler = StandardScaler().fit(features.double().numpy())
    mean, scale = torch.from_numpy(scaler.mean_), torch.from_numpy(scaler.scale_)
    scaled, scaled_val = ((x.double() - mean) / scale for x in (features, val_x))

    fits = {grid[0]: fit_logistic(scaled, labels, 4, grid[0])}  # each warm-starts the next
    fits[grid[1]] = fit_logistic(scaled, labels, 4, grid[1], start=fits[grid[0]])

    def predictions(c: float, tau: float) -> np.ndarray:
        weight, bias = fits[c]
        logits = scaled_val @ weight.T + bias - torch.log(prior**tau + 1e-12)
        return logits.argmax(1).numpy()

    table = {(c, tau): predictions(c, tau) for c in grid for tau in TAU_GRID}
    half_a = validation_halves(val_y)
    scored = {k: balanced_accuracy(val_y, p) for k, p in table.items()}
    on_a = {k: balanced_accuracy(val_y[half_a], p[half_a]) for k, p in table.items()}
    on_b = {k: balanced_accuracy(val_y[~half_a], p[~half_a]) for k, p in table.items()}
    # The first of equal maxima in the table's order (C ascending, then tau), as the stage's.
    best = [max(s, key=s.__getitem__) for s in (scored, on_a, on_b)]
    assert [(choice.c, choice.tau), (choice.c_a, choice.tau_a), (choice.c_b, choice.tau_b)] == best
    assert choice.scores == pytest.approx(
        {c: max(s for (k, _), s in scored.items() if k == c) for c in grid}
    )
    crossed = np.where(half_a, table[best[2]], table[best[1]])
    assert np.array_equal(choice.cross_fitted, crossed)
    with torch.no_grad():
        kept = classifier(val_x).argmax(1).numpy()
    assert np.array_equal(kept, table[best[0]])
    assert {"decoupled/C", "decoupled/tau", "decoupled/C_half_a"} <= set(choice.metrics())


@pytest.mark.unit
def test_on_pure_noise_the_cross_fitted_score_is_not_optimistic():
    """Labels independent of the features: every prediction scores 1/K in expectation, so the
    cross-fitted balanced accuracy less chance has mean 0 (bounded by :data:`Z` standard errors
    of the 60 differences), while the pair scored on the split that chose it is optimistic."""
    rng = np.random.default_rng(0)
    crossed, in_sample = [], []
    for _ in range(60):
        features = torch.from_numpy(rng.standard_normal((120, 6))).float()
        labels = torch.from_numpy(rng.permutation(np.repeat(np.arange(4), [60, 30, 20, 10])))
        val_x = torch.from_numpy(rng.standard_normal((80, 6))).float()
        val_y = rng.permutation(np.repeat(np.arange(4), 20))
        prior = torch.bincount(labels).double() / len(labels)
        classifier = torch.nn.Linear(6, 4)
        choice = choose_refit(
            classifier,
            (features, labels),
            prior,
            _predictions(classifier, val_x),
            val_y,
            c_grid=(0.01, 1.0),
        )
        crossed.append(balanced_accuracy(val_y, choice.cross_fitted) - 0.25)
        in_sample.append(max(choice.scores.values()) - 0.25)
    assert _above_zero(np.array(crossed)) <= Z
    assert _above_zero(np.array(in_sample)) > Z


@pytest.mark.slow  # two real runs of three digits epochs, in this process
@pytest.mark.parametrize("method", ["logistic_la", "logistic_balanced"])
def test_a_refit_run_records_its_choice_and_keeps_the_refitted_classifier(method, tracking_uri):
    from runner.app import run

    overrides = [
        f"+method={method}",
        "data=digits_lt",
        "data.val_per_class=20",
        "trainer.epochs=3",
        "trainer.progress=false",
        "trainer.threads=1",
        "tracking.plots=false",
        f"tracking.uri={tracking_uri}",
    ]
    results = run(compose_config(overrides))
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("samplerlab").experiment_id
    (found,) = client.search_runs([experiment])
    assert found.info.status == "FINISHED"
    metrics = found.data.metrics
    assert metrics["decoupled/C"] in C_GRID
    if method == "logistic_balanced":  # the class weights balance; no adjustment is tried
        assert metrics["decoupled/tau"] == 0.0
    curve = {f"decoupled/val_balanced_accuracy/C_{c:g}" for c in C_GRID}
    assert curve <= set(metrics)
    assert results["val/balanced_accuracy"] == metrics["val/balanced_accuracy"]


def _counting_fits(monkeypatch) -> list[float]:
    """Every C that :func:`fit_logistic` fits from now on (the memory of refits starts empty:
    tests/conftest.py)."""
    from runner.train import refit

    fitted: list[float] = []

    def counting(*args, **kwargs):
        fitted.append(args[3])
        return fit_logistic(*args, **kwargs)

    monkeypatch.setattr(refit, "fit_logistic", counting)
    return fitted


@pytest.mark.unit
def test_a_refit_of_the_same_contents_is_what_fitting_again_gives_without_fitting(monkeypatch):
    from runner.train import refit

    fitted = _counting_fits(monkeypatch)
    rng = np.random.default_rng(3)
    x, y = _blobs(rng, [60, 20, 8], 5, 1.5)
    val_x, val_y = _blobs(rng, [10, 10, 10], 5, 1.5)
    prior = torch.bincount(y).double() / len(y)

    def refit_into(classifier, rows, digest=b"validation"):
        predict = lambda: classifier(val_x).argmax(1).numpy()  # noqa: E731
        with torch.no_grad():
            return choose_refit(
                classifier, rows, prior, predict, val_y.numpy(), False, validation_digest=digest
            )

    torch.manual_seed(0)
    first = torch.nn.Linear(5, 3)
    chosen = refit_into(first, (x, y))
    assert len(fitted) == len(C_GRID)
    torch.manual_seed(1)  # another start: a refit does not depend on it
    second = torch.nn.Linear(5, 3)
    again = refit_into(second, (x.clone(), y.clone()))
    assert len(fitted) == len(C_GRID)  # taken from the first
    assert torch.equal(second.weight, first.weight) and torch.equal(second.bias, first.bias)
    assert (again.c, again.tau, again.scores) == (chosen.c, chosen.tau, chosen.scores)
    assert np.array_equal(again.cross_fitted, chosen.cross_fitted)
    refit._refits.clear()
    fresh = torch.nn.Linear(5, 3)
    anew = refit_into(fresh, (x, y))
    assert len(fitted) == 2 * len(C_GRID)  # fitted again: the same as the remembered one
    assert torch.equal(fresh.weight, first.weight) and torch.equal(fresh.bias, first.bias)
    assert np.array_equal(anew.cross_fitted, chosen.cross_fitted)
    changed = x.clone()
    changed[0, 0] += 1e-3
    refit_into(torch.nn.Linear(5, 3), (changed, y))
    refit_into(torch.nn.Linear(5, 3), (x, y), digest=b"other validation inputs")
    assert len(fitted) == 4 * len(C_GRID)


@pytest.mark.slow
def test_a_second_run_on_the_same_features_takes_the_first_runs_refit(monkeypatch, tracking_uri):
    """Two runs of one config in one process (as a sweep's jobs): the second's refit is the
    first's, without fitting; another cut of the data fits again."""
    from runner.app import run

    fitted = _counting_fits(monkeypatch)
    overrides = [
        "+method=logistic_la",
        "data=digits_lt",
        "data.val_per_class=20",
        "model.freeze=true",
        "trainer.augment=false",
        "trainer.epochs=2",
        "trainer.progress=false",
        "trainer.threads=1",
        "tracking.plots=false",
        "tracking.log_model=false",
        f"tracking.uri={tracking_uri}",
    ]
    first = run(compose_config(overrides))
    assert len(fitted) == len(C_GRID)
    second = run(compose_config(overrides))
    assert len(fitted) == len(C_GRID) and second == first
    run(compose_config([*overrides, "data.data_seed=1"]))
    assert len(fitted) == 2 * len(C_GRID)


@pytest.mark.unit
@pytest.mark.parametrize("change", ["labels", "prior", "val_labels", "balanced", "tau_grid"])
def test_a_refit_with_anything_of_its_key_changed_fits_again(change, monkeypatch):
    fitted = _counting_fits(monkeypatch)
    rng = np.random.default_rng(4)
    x, y = _blobs(rng, [40, 20, 10], 4, 1.5)
    val_x, val_y = _blobs(rng, [10, 10, 10], 4, 1.5)
    prior = torch.bincount(y).double() / len(y)
    args = {
        "rows": (x, y),
        "prior": prior,
        "val": val_y.numpy(),
        "balanced": False,
        "taus": (0.0, 1.0),
    }

    def refit_into(rows, prior, val, balanced, taus):
        classifier = torch.nn.Linear(4, 3)
        predict = lambda: classifier(val_x).argmax(1).numpy()  # noqa: E731
        with torch.no_grad():
            choose_refit(
                classifier,
                rows,
                prior,
                predict,
                val,
                balanced,
                c_grid=(0.1, 1.0),
                tau_grid=taus,
                validation_digest=b"validation",
            )

    refit_into(**args)
    refit_into(**args)
    assert len(fitted) == 2  # the second taken from the first
    changed = {
        "labels": {"rows": (x, y.roll(1))},
        "prior": {"prior": prior.flip(0)},
        "val_labels": {"val": np.roll(val_y.numpy(), 1)},
        "balanced": {"balanced": True},
        "tau_grid": {"taus": (0.0, 0.5)},
    }[change]
    refit_into(**{**args, **changed})
    assert len(fitted) == 4


def _digits_run(method: str, uri: str) -> list[str]:
    """A short digits run of ``method`` into ``uri``, without figures or a logged model."""
    return [
        f"+method={method}",
        "data=digits_lt",
        "trainer.epochs=3",
        "trainer.progress=false",
        "trainer.threads=1",
        "tracking.plots=false",
        "tracking.log_model=false",
        f"tracking.uri={uri}",
    ]


@pytest.mark.unit
def test_a_signal_during_the_refit_stops_it_at_the_next_fit_step_not_after_the_grid():
    """A refit runs after the last epoch, where the loop holds signals until its next safe
    point; a grid of fits on big features takes minutes, so a signal held meanwhile stops it
    at the next L-BFGS step (not safe: no checkpoint of a half-changed classifier). A real
    SIGTERM to this process, sent once the first C is fitted: only that C's taus are tried."""
    import os
    import signal

    from runner.signals import Interrupted, stop_on_signals

    rng = np.random.default_rng(4)
    x, y = _blobs(rng, [60, 20, 8], 5, 1.5)
    val_x, val_y = _blobs(rng, [10, 10, 10], 5, 1.5)
    prior = torch.bincount(y).double() / len(y)
    classifier = torch.nn.Linear(5, 3)
    tried = []

    def predict() -> np.ndarray:
        if not tried:
            os.kill(os.getpid(), signal.SIGTERM)
        tried.append(1)
        return classifier(val_x).argmax(1).numpy()

    with pytest.raises(Interrupted) as stopped, stop_on_signals(deferred=True), torch.no_grad():
        choose_refit(classifier, (x, y), prior, predict, val_y.numpy())
    assert stopped.value.signum == signal.SIGTERM and not stopped.value.safe
    assert len(tried) == len(TAU_GRID)  # the first C's; the second C's fit stopped at once


@pytest.mark.slow  # three real runs of three digits epochs, in this process
def test_a_run_stopped_during_its_refit_resumes_and_refits_to_the_uninterrupted_result(
    monkeypatch, tracking_uri, capsys
):
    """A real SIGTERM while the second C is fitted: the run ends KILLED at once, its checkpoint
    the one taken after the epoch before the last (even with trainer.checkpoint_every=0);
    resumed, it trains the last epoch again, refits, and records what the run never stopped
    records."""
    import os
    import signal

    from runner.app import run
    from runner.signals import Interrupted
    from runner.train import refit

    overrides = [
        *_digits_run("logistic_la", tracking_uri),
        "data.val_per_class=20",
        "trainer.checkpoint_every=0",
    ]
    whole = run(compose_config(overrides))
    refit._refits.clear()  # the same contents: the next run would take this refit, not fit
    fits = []

    def stopped_at_the_second(*args, **kwargs):
        fits.append(args[3])
        if len(fits) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return fit_logistic(*args, **kwargs)

    monkeypatch.setattr(refit, "fit_logistic", stopped_at_the_second)
    with pytest.raises(Interrupted) as stopped:
        run(compose_config(overrides))
    assert not stopped.value.safe and len(fits) == 2
    assert "stopped by SIGTERM at epoch 3;" in capsys.readouterr().err  # the last, not a 4th
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("samplerlab").experiment_id
    (killed,) = client.search_runs([experiment], "attributes.status = 'KILLED'")
    assert "final/balanced_accuracy" not in killed.data.metrics
    saved = torch.load(killed.data.tags["checkpoint"], weights_only=True)["train"]
    assert saved["epoch"] == 2  # one epoch back, not the start
    resumed = run(compose_config([*overrides, f"resume={killed.info.run_id}"]))
    assert len(fits) == 2 + len(C_GRID)  # the whole grid again
    finished = client.get_run(killed.info.run_id)
    assert finished.info.status == "FINISHED" and "final/balanced_accuracy" in finished.data.metrics
    assert resumed == whole


@pytest.mark.unit
def test_ncm_predicts_as_standardised_class_means_nearest_by_cosine():
    """The classifier ``ncm`` sets, on raw features, predicts every row as the reference does:
    a StandardScaler fitted on the training rows, then the class whose mean (of the scaled
    training rows) has the largest cosine similarity with the scaled row (scripts/baselines.py's
    baseline). A class with no training rows (which the data refuses) gets zero weights, not
    NaN: it would score 0 against the others' cosines."""
    from runner.train.refit import set_class_means

    rng = np.random.default_rng(9)
    features, labels = _blobs(rng, [200, 60, 20, 6], dim=12, spread=0.6)
    features = features * torch.linspace(0.1, 30, 12) + 5  # scales and offsets a scaler undoes
    rows, _ = _blobs(np.random.default_rng(10), [40, 40, 40, 40], dim=12, spread=0.6)
    rows = rows * torch.linspace(0.1, 30, 12) + 5
    scaler = StandardScaler().fit(features.double().numpy())
    scaled = scaler.transform(features.double().numpy())
    means = np.stack([scaled[labels.numpy() == k].mean(0) for k in range(4)])
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    expected = (scaler.transform(rows.double().numpy()) @ means.T).argmax(1)

    classifier = torch.nn.Linear(12, 4)
    choice = set_class_means(classifier, (features, labels), lambda: np.zeros(3, np.int64))
    with torch.no_grad():
        assert np.array_equal(classifier(rows).argmax(1).numpy(), expected)
    empty = torch.nn.Linear(12, 5)  # a fifth class the training rows never show
    set_class_means(empty, (features, labels), None)
    assert torch.isfinite(empty.weight).all() and not empty.weight[4].any()
    assert choice.metrics() == {} and np.array_equal(choice.cross_fitted, np.zeros(3))


@pytest.mark.slow  # two real runs of three digits epochs, in this process
def test_an_ncm_run_needs_no_split_and_with_one_scores_its_own_predictions(tracking_uri):
    """Nothing is chosen on validation: without a split the run trains; with one, its
    validation metrics are the classifier's plain predictions, scored like its test ones."""
    from runner.app import run

    common = _digits_run("ncm", tracking_uri)
    alone = run(compose_config([*common, "data.val_per_class=0"]))
    assert "val/balanced_accuracy" not in alone and alone["test/balanced_accuracy"] > 0.5
    split = run(compose_config([*common, "data.val_per_class=20"]))
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("samplerlab").experiment_id
    runs = client.search_runs([experiment])
    assert {r.info.status for r in runs} == {"FINISHED"} and len(runs) == 2
    assert not any(k.startswith("decoupled/") for r in runs for k in r.data.metrics)
    (with_split,) = [r for r in runs if r.data.params["data.val_per_class"] == "20"]
    parts = build_parts(compose_config([*common, "data.val_per_class=20"]))
    saved = logged_checkpoint(tracking_uri, with_split.info.run_id)["train"]["model"]
    parts.state.model.load_state_dict(saved)
    parts.state.model.eval()
    with torch.no_grad():
        predicted = parts.state.model(parts.data.val_x).argmax(1).numpy()
    own = balanced_accuracy(parts.data.val_y.numpy(), predicted)
    assert split["val/balanced_accuracy"] == pytest.approx(own, abs=1e-12) and own > 0.5
