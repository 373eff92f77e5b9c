"""What a careful engineer tries first on frozen features, with scikit-learn, beside the race.

:func:`cached_features` reads the features a run of the runner computed (its own feature bank,
through :func:`runner.build.build_parts` on the same overrides: nothing is computed again when
the bank holds them). :func:`baselines` then fits, on those features:

- ``lr_la``: scikit-learn's ``LogisticRegression`` with post-hoc logit adjustment (Menon et al.
  2021, "Long-tail learning via logit adjustment": the logits minus tau * log of the training
  class priors); C over :data:`C_GRID` and tau over :data:`TAU_GRID`, the pair chosen on the
  validation split's balanced accuracy;
- ``lr_balanced``: ``LogisticRegression(class_weight="balanced")``, C chosen on validation;
- ``ncm``: nearest class mean by cosine similarity (no hyper-parameter).

The features are standardised first with a ``StandardScaler`` fitted on the training rows only.
Selection reads the validation split alone; the test split is predicted once per baseline,
after its selection. Ties go to the first of the grid (the most regularised C, the smallest
tau).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

# C spans the regularisation standardised 1280-dimensional features may need; scikit-learn's
# default is 1. Fitted in this order, each fit warm-started from the one before.
C_GRID: tuple[float, ...] = (0.0001, 0.001, 0.01, 0.1, 1.0, 10.0)
TAU_GRID: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(21))  # 0 .. 2 step 0.1
MAX_ITER = 500  # lbfgs iterations per fit: bounds the time; a fit that stops there says so

Split = tuple[NDArray[np.float64], NDArray[np.int64]]


def cached_features(overrides: Sequence[str]) -> dict[str, Split]:
    """The (features, labels) of the train, val and test splits that ``python -m runner
    OVERRIDES`` trains its head on (``model.freeze=true``): the run's config composed and its
    parts built by the runner itself, so the features come from the same bank."""
    from hydra import compose, initialize_config_dir

    from runner.build import build_parts
    from runner.config import CONF, register

    register()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", list(overrides))
    data = build_parts(cfg).data
    if data.val_x is None or data.val_y is None:
        raise SystemExit("the baselines choose on a validation split: set data.val_per_class")
    return {
        split: (
            getattr(data, f"{split}_x").double().numpy(),
            getattr(data, f"{split}_y").long().numpy(),
        )
        for split in ("train", "val", "test")
    }


def balanced_accuracy(labels: NDArray[np.int64], predicted: NDArray[np.int64]) -> float:
    """The mean over the classes present in ``labels`` of their recall."""
    classes = np.unique(labels)
    return float(np.mean([np.mean(predicted[labels == k] == k) for k in classes]))


def standardised(splits: dict[str, Split]) -> dict[str, Split]:
    """Every split scaled by a ``StandardScaler`` fitted on the training rows alone."""
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(splits["train"][0])
    return {name: (scaler.transform(x), y) for name, (x, y) in splits.items()}


Linear = tuple[float, NDArray[np.float64], NDArray[np.float64], bool]  # C, coef, intercept, ok


def _fits(train: Split, class_weight: str | None) -> list[Linear]:
    """(C, coefficients, intercepts, converged) for every C of :data:`C_GRID`, each fit
    warm-started from the one before."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(class_weight=class_weight, max_iter=MAX_ITER, warm_start=True)
    fitted = []
    for c in C_GRID:
        model.set_params(C=c)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # reported as converged=False
            model.fit(*train)
        converged = bool(np.max(model.n_iter_) < MAX_ITER)
        fitted.append((c, model.coef_.copy(), model.intercept_.copy(), converged))
    return fitted


def _logits(x: NDArray[np.float64], fit: Linear) -> NDArray[np.float64]:
    return x @ fit[1].T + fit[2]


def logistic_la(splits: dict[str, Split], num_classes: int) -> dict[str, Any]:
    """``LogisticRegression`` + post-hoc logit adjustment, (C, tau) chosen on validation."""
    started = time.perf_counter()
    (x_val, y_val), (x_test, y_test) = splits["val"], splits["test"]
    train_y = splits["train"][1]
    log_prior = np.log(np.bincount(train_y, minlength=num_classes) / len(train_y))
    best: tuple[float, float, Linear] | None = None
    for fit in _fits(splits["train"], None):
        logits = _logits(x_val, fit)
        for tau in TAU_GRID:
            score = balanced_accuracy(y_val, (logits - tau * log_prior).argmax(1))
            if best is None or score > best[0]:
                best = (score, tau, fit)
    assert best is not None
    score, tau, fit = best
    test = balanced_accuracy(y_test, (_logits(x_test, fit) - tau * log_prior).argmax(1))
    return _row({"C": fit[0], "tau": tau}, score, test, started, fit[3])


def logistic_balanced(splits: dict[str, Split]) -> dict[str, Any]:
    """``LogisticRegression(class_weight="balanced")``, C chosen on validation."""
    started = time.perf_counter()
    (x_val, y_val), (x_test, y_test) = splits["val"], splits["test"]
    best: tuple[float, Linear] | None = None
    for fit in _fits(splits["train"], "balanced"):
        score = balanced_accuracy(y_val, _logits(x_val, fit).argmax(1))
        if best is None or score > best[0]:
            best = (score, fit)
    assert best is not None
    score, fit = best
    test = balanced_accuracy(y_test, _logits(x_test, fit).argmax(1))
    return _row({"C": fit[0]}, score, test, started, fit[3])


def nearest_class_mean(splits: dict[str, Split], num_classes: int) -> dict[str, Any]:
    """Nearest class mean by cosine: the training rows' class means, each row predicted as the
    class whose mean has the largest cosine similarity with it."""
    started = time.perf_counter()
    x, y = splits["train"]
    means = np.stack([x[y == k].mean(0) for k in range(num_classes)])
    means /= np.linalg.norm(means, axis=1, keepdims=True)

    def score(split: str) -> float:
        rows, labels = splits[split]
        return balanced_accuracy(labels, (rows @ means.T).argmax(1))  # row norms change no argmax

    return _row({}, score("val"), score("test"), started, True)


def _row(
    chosen: dict[str, float], val: float, test: float, started: float, converged: bool
) -> dict[str, Any]:
    return {
        "chosen": chosen,
        "val_balanced_accuracy": val,
        "test_balanced_accuracy": test,
        "seconds": time.perf_counter() - started,
        "converged": converged,
    }


def baselines(splits: dict[str, Split]) -> dict[str, Any]:
    """Every baseline on ``splits`` (standardised here first), each with its chosen
    hyper-parameters, validation and test balanced accuracy, and seconds."""
    num_classes = int(splits["train"][1].max()) + 1
    scaled = standardised(splits)
    return {
        "standardised": "StandardScaler fitted on the training rows",
        "c_grid": list(C_GRID),
        "tau_grid": [TAU_GRID[0], TAU_GRID[-1], 0.1],
        "max_iter": MAX_ITER,
        "rows": {
            "lr_la": logistic_la(scaled, num_classes),
            "lr_balanced": logistic_balanced(scaled),
            "ncm": nearest_class_mean(scaled, num_classes),
        },
    }
