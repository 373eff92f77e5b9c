"""The linear classifier fitted again, convexly, on the representation the run learnt: what a
careful engineer tries first on frozen features. On pretrained features, scikit-learn's
``LogisticRegression`` with post-hoc logit adjustment (Menon et al. 2021), C and tau chosen on
validation, beats heads trained by a few epochs of SGD; these stages make it a candidate.

:func:`fit_logistic` is multinomial logistic regression by full-batch L-BFGS, scikit-learn's
``LogisticRegression`` objective (``penalty="l2"``, the bias unpenalised), divided by C·n:
(1/n) Σ s_i CE(W x_i + b, y_i) + ||W||² / (2 C n), ``s`` the sample weights
(``class_weight="balanced"``: s_i = n / (K n_{y_i})). Its fits of the C grid are warm-started
from the one before, the most regularised first.

The refits fit standardised features, as a careful engineer puts a ``StandardScaler`` (fitted on
the training rows) before ``LogisticRegression``: every feature less its training mean, divided
by its training standard deviation (one where it is zero, as scikit-learn does). The fit is then
folded back into the classifier (w/sd, b - (w/sd)·mean), which predicts from the raw features
what the pipeline predicts; C means what it means for the pipeline, whatever the features' scale.

``logistic_la`` (:func:`choose_refit`): for every C of :data:`C_GRID` the classifier is refitted
on the training rows' representation (the model in eval mode, no augmentation), then
logit-adjusted by the training class frequencies with every tau of
:data:`runner.train.decoupled.TAU_GRID` (tau=0: the plain fit); the pair (C, tau) is chosen on
the validation split by balanced accuracy and cross-fitted as tau-normalisation's tau
(:func:`runner.train.decoupled.cross_fit_table`): each half of the split is predicted with the
pair the other half chose. ``logistic_balanced``: the class-weighted fit, C alone chosen.

``ncm`` (:func:`set_class_means`): nearest class mean by cosine similarity on the same
standardised features, the cheap reference (Kang et al. 2020's NCM): a linear classifier whose
class weights are the class means' directions; nothing is chosen on validation.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from runner.signals import stop_if_signalled
from runner.train.decoupled import TAU_GRID, adjusted_bias, cross_fit_table
from runner.train.feature_bank import tensor_bytes

# scikit-learn's default C is 1; on standardised pretrained features (1280 of them, 10 classes)
# validation chose 0.001, the strongest of a grid that stopped there, so the grid reaches 1e-4.
C_GRID: tuple[float, ...] = (0.0001, 0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
MAX_ITERATIONS = 1000  # L-BFGS steps per fit (scikit-learn's max_iter is 100; it warns short)
# The largest gradient entry of the divided objective at convergence: scikit-learn's default
# ``tol`` for lbfgs (its ``gtol``, on the same objective). On pretrained CIFAR-10-LT features
# (12,406 x 1280) 1e-7 fitted the grid in 100 s instead of 8 s and chose the same C and tau.
GRADIENT_TOLERANCE = 1e-4
# Refits by the contents they are a function of (:func:`_refit_key`), the last few used: on frozen
# features every seed of a race hands a refit the same rows, labels and validation inputs, and
# fitting the C grid takes seconds (10 s on CIFAR-10-LT's pretrained features) for the same
# result.
KEPT_REFITS = 8
_refits: OrderedDict[bytes, tuple[RefitChoice, torch.Tensor, torch.Tensor]] = OrderedDict()


def standardiser(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and standard deviation of every column of ``features`` (float64; the population
    deviation, one where it is zero): scikit-learn's ``StandardScaler`` fitted on them.

    Example:
        >>> standardiser(torch.tensor([[0.0, 5.0], [2.0, 5.0]]))
        (tensor([1., 5.], dtype=torch.float64), tensor([1., 1.], dtype=torch.float64))
    """
    x = features.double()
    mean = x.mean(0)
    scale = x.std(0, correction=0)
    return mean, torch.where(scale > 0, scale, torch.ones_like(scale))


def balanced_weights(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """scikit-learn's ``class_weight="balanced"`` as sample weights: n / (K n_{y_i})."""
    counts = torch.bincount(labels, minlength=num_classes).double()
    return (len(labels) / (num_classes * counts))[labels]


def fit_logistic(
    features: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    c: float,
    sample_weight: torch.Tensor | None = None,
    start: tuple[torch.Tensor, torch.Tensor] | None = None,
    tolerance: float = GRADIENT_TOLERANCE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights (K x D) and bias (K) of the multinomial logistic regression of ``labels`` on
    ``features`` with inverse regularisation ``c`` (see the module's docstring), in float64 on
    the features' device; ``start`` warm-starts L-BFGS, which stops when no gradient entry
    exceeds ``tolerance`` (or after :data:`MAX_ITERATIONS` steps). A SIGINT or SIGTERM held
    meanwhile stops it at once (:func:`runner.signals.stop_if_signalled`).

    Example:
        >>> x = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
        >>> weight, bias = fit_logistic(x, torch.tensor([0, 0, 1, 1]), 2, c=1.0)
        >>> (x.double() @ weight.T + bias).argmax(1).tolist()
        [0, 0, 1, 1]
    """
    x = features.double()
    n = len(x)
    weights = torch.ones(n, dtype=torch.float64, device=x.device)
    if sample_weight is not None:
        weights = sample_weight.to(x.device, torch.float64)
    if start is None:
        start = (x.new_zeros(num_classes, x.shape[1]), x.new_zeros(num_classes))
    weight, bias = (p.detach().clone().to(x.device, torch.float64) for p in start)
    weight.requires_grad_(True)
    bias.requires_grad_(True)
    optimizer = torch.optim.LBFGS(
        [weight, bias],
        max_iter=MAX_ITERATIONS,
        tolerance_grad=tolerance,
        tolerance_change=1e-12,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def objective() -> torch.Tensor:
        stop_if_signalled()  # a fit takes up to seconds, a grid of them minutes on big features
        optimizer.zero_grad()
        losses = F.cross_entropy(x @ weight.T + bias, labels.to(x.device), reduction="none")
        loss = (weights * losses).sum() / n + weight.square().sum() / (2 * c * n)
        loss.backward()
        return loss

    optimizer.step(objective)
    return weight.detach(), bias.detach()


@dataclass(frozen=True)
class RefitChoice:
    """What :func:`choose_refit` chose: C and tau on the whole validation split (the classifier
    keeps them), on half A and on half B; ``scores``: the whole split's best balanced accuracy
    over tau at every C (the tuning curve: in-sample, never an estimate); ``cross_fitted``: the
    validation predictions, each row's made with the pair chosen on the half it is not in."""

    c: float
    tau: float
    c_a: float
    tau_a: float
    c_b: float
    tau_b: float
    scores: dict[float, float]
    cross_fitted: np.ndarray = field(repr=False)

    def describe(self) -> str:
        """The choice in words, for the run's log."""
        return (
            f"C {self.c:g}, tau {self.tau:.1f} chosen on the whole validation split (what the "
            f"test set and the checkpoint use); the validation metrics use C {self.c_a:g}, tau "
            f"{self.tau_a:.1f} (chosen on half A) for half B's rows and C {self.c_b:g}, tau "
            f"{self.tau_b:.1f} (chosen on half B) for half A's"
        )

    def metrics(self) -> dict[str, float]:
        """``decoupled/C``, ``decoupled/tau``, the halves' choices and the tuning curve."""
        curve = {f"decoupled/val_balanced_accuracy/C_{c:g}": s for c, s in self.scores.items()}
        chosen = {"decoupled/C": self.c, "decoupled/tau": self.tau}
        halves = {
            "decoupled/C_half_a": self.c_a,
            "decoupled/C_half_b": self.c_b,
            "decoupled/tau_half_a": self.tau_a,
            "decoupled/tau_half_b": self.tau_b,
        }
        return {**chosen, **halves, **curve}


@torch.no_grad()
def choose_refit(
    classifier: nn.Linear,
    training: tuple[torch.Tensor, torch.Tensor],
    prior: torch.Tensor,
    predict: Callable[[], np.ndarray],
    labels: np.ndarray,
    balanced: bool = False,
    c_grid: tuple[float, ...] = C_GRID,
    tau_grid: tuple[float, ...] = TAU_GRID,
    validation_digest: bytes | None = None,
) -> RefitChoice:
    """Refit ``classifier`` in place on ``training`` (the classifier's inputs for every training
    row, and their labels), standardised by their :func:`standardiser`, for every C of ``c_grid``
    (class-weighted when ``balanced``), fold the standardisation into it, adjust
    its bias by ``prior`` (the training class frequencies) with every tau of ``tau_grid``, and
    keep the pair the validation rows (``labels``; ``predict`` predicts them with the classifier
    as it stands) choose; cross-fitted. The test set never takes part.

    Given ``validation_digest`` (a digest of what ``predict`` reads besides the classifier's
    parameters), a refit of the same contents done earlier in this process is taken instead
    of fitting again: on the CPU the fits are deterministic for a thread count, so it is what
    fitting again gives (tested); on a GPU, up to the order of its float64 sums."""
    key = None
    if validation_digest is not None:
        key = _refit_key(
            validation_digest, classifier, training, prior, labels, balanced, c_grid, tau_grid
        )
        if key in _refits:
            _refits.move_to_end(key)  # the least recently used goes first
            choice, weight, bias = _refits[key]
            assert classifier.bias is not None
            classifier.weight.copy_(weight)
            classifier.bias.copy_(bias)
            return _copy(choice)
    raw, train_labels = training
    mean, scale = standardiser(raw)
    features = (raw.double() - mean) / scale
    num_classes = classifier.out_features
    weights = balanced_weights(train_labels, num_classes) if balanced else None
    fits: list[tuple[torch.Tensor, torch.Tensor]] = []
    settings: list[tuple[int, float]] = []
    predictions = []
    for i, c in enumerate(sorted(c_grid)):  # the most regularised first: each warm-starts the next
        with torch.enable_grad():
            start = fits[-1] if fits else None
            fits.append(fit_logistic(features, train_labels, num_classes, c, weights, start))
        for tau in tau_grid:
            _set(classifier, fits[i], (mean, scale), prior, tau)
            predictions.append(predict())
            settings.append((i, tau))
    fitted = cross_fit_table(np.stack(predictions), labels)
    grid = sorted(c_grid)
    (i, tau), (i_a, tau_a), (i_b, tau_b) = (settings[k] for k in (fitted.whole, fitted.a, fitted.b))
    _set(classifier, fits[i], (mean, scale), prior, tau)
    scores = {
        c: max(s for (j, _), s in zip(settings, fitted.scores, strict=True) if j == k)
        for k, c in enumerate(grid)
    }
    choice = RefitChoice(
        grid[i], tau, grid[i_a], tau_a, grid[i_b], tau_b, scores, fitted.cross_fitted
    )
    if key is not None:
        assert classifier.bias is not None
        _refits[key] = (_copy(choice), classifier.weight.clone(), classifier.bias.clone())
        while len(_refits) > KEPT_REFITS:
            _refits.popitem(last=False)
    return choice


def class_mean_directions(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> torch.Tensor:
    """Every class's mean of ``features`` (K x D, float64) scaled to norm one: as a classifier's
    weights (no bias) its argmax is the class mean nearest by cosine similarity, a row's own norm
    changing no argmax. A class without rows, or with a zero mean, gets zero weights.

    Example:
        >>> x = torch.tensor([[2.0, 0.0], [4.0, 0.0], [0.0, 1.0]])
        >>> class_mean_directions(x, torch.tensor([0, 0, 1]), 2)
        tensor([[1., 0.],
                [0., 1.]], dtype=torch.float64)
    """
    x = features.double()
    sums = torch.zeros(num_classes, x.shape[1], dtype=torch.float64, device=x.device)
    sums.index_add_(0, labels.to(x.device), x)
    norms = sums.norm(dim=1, keepdim=True)  # the mean's direction is the sum's
    return torch.where(norms > 0, sums / norms.clamp_min(1e-300), torch.zeros_like(sums))


@dataclass(frozen=True)
class MeansChoice:
    """What :func:`set_class_means` did: nothing chosen, so the validation predictions are the
    classifier's own (``cross_fitted`` in name only: no row scored what it tuned)."""

    cross_fitted: np.ndarray = field(repr=False)

    def describe(self) -> str:
        return (
            "the classifier is the training rows' standardised class means (nearest by cosine "
            "similarity); nothing chosen on the validation split"
        )

    def metrics(self) -> dict[str, float]:
        return {}


@torch.no_grad()
def set_class_means(
    classifier: nn.Linear,
    training: tuple[torch.Tensor, torch.Tensor],
    predict: Callable[[], np.ndarray] | None,
) -> MeansChoice:
    """Set ``classifier`` to the nearest class mean by cosine similarity on ``training`` (the
    classifier's inputs for every training row, and their labels) standardised by their
    :func:`standardiser`, folded back to act on raw inputs; ``predict`` (None: no validation
    split) then predicts the validation rows with it."""
    raw, labels = training
    mean, scale = standardiser(raw)
    weight = class_mean_directions((raw.double() - mean) / scale, labels, classifier.out_features)
    no_bias = torch.zeros(len(weight), dtype=torch.float64, device=weight.device)
    _fold(classifier, (weight, no_bias), (mean, scale))
    return MeansChoice(predict() if predict is not None else np.empty(0, dtype=np.int64))


def _refit_key(
    validation_digest: bytes,
    classifier: nn.Linear,
    training: tuple[torch.Tensor, torch.Tensor],
    prior: torch.Tensor,
    labels: np.ndarray,
    balanced: bool,
    c_grid: tuple[float, ...],
    tau_grid: tuple[float, ...],
) -> bytes:
    """What a refit is a function of: the validation inputs' digest, every tensor's dtype, shape
    and bytes, the settings, the classifier's parameters' dtype and device (not their values: a
    refit starts from zero) and torch's thread count (which may change the order of a sum)."""
    digest = hashlib.sha256(validation_digest)
    for tensor in (*training, prior, torch.as_tensor(labels)):
        digest.update(f"|{tensor.dtype}{tuple(tensor.shape)}|".encode())
        digest.update(tensor_bytes(tensor))
    weight = classifier.weight
    settings = (balanced, sorted(c_grid), list(tau_grid), MAX_ITERATIONS, GRADIENT_TOLERANCE)
    where = (tuple(weight.shape), weight.dtype, weight.device.type, torch.get_num_threads())
    digest.update(repr((settings, *where)).encode())
    return digest.digest()


def _copy(choice: RefitChoice) -> RefitChoice:
    return dataclasses.replace(
        choice, scores=dict(choice.scores), cross_fitted=choice.cross_fitted.copy()
    )


def _set(
    classifier: nn.Linear,
    fit: tuple[torch.Tensor, torch.Tensor],
    standardised: tuple[torch.Tensor, torch.Tensor],
    prior: torch.Tensor,
    tau: float,
) -> None:
    """Set ``classifier`` to ``fit`` (made on features standardised by ``standardised``: their
    mean and deviation) as it acts on raw features, its bias adjusted by ``prior`` with ``tau``."""
    bias = _fold(classifier, fit, standardised)
    classifier.bias.copy_(adjusted_bias(bias, prior.to(bias.device), tau))


def _fold(
    classifier: nn.Linear,
    fit: tuple[torch.Tensor, torch.Tensor],
    standardised: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """Set ``classifier`` to ``fit`` (made on standardised features) as it acts on raw
    features: its weights w/sd and its bias b - (w/sd)·mean, which is also returned (float64)."""
    (weight, bias), (mean, scale) = fit, standardised
    weight = weight / scale.to(weight.device)
    bias = bias - weight @ mean.to(weight.device)
    assert classifier.bias is not None, "linear_classifier refuses a classifier without a bias"
    classifier.weight.copy_(weight.to(classifier.weight.device))
    classifier.bias.copy_(bias.to(classifier.bias.device))
    return bias
