"""Decoupled classifiers beside cRT (Kang et al. 2020, "Decoupling representation and classifier
for long-tailed recognition", ICLR): learnable weight scaling (LWS) and tau-normalisation, both
on the representation and classifier that instance-balanced training learnt.

LWS (``trainer.classifier_stage=scale``): the trained classifier is kept and frozen, and its
logits are multiplied per class by a learnable scale f_j, initially 1 (:class:`ScaledClassifier`,
the reference implementation's ``logits * scales``): w_j <- f_j w_j, bias included. The scales
are all that the classifier stage trains (:func:`runner.train.state.start_classifier_stage`).

tau-normalisation (``trainer.classifier_stage=tau_norm``): after training, with no further
epochs, every class weight of the linear classifier becomes w_j / ||w_j||^tau
(:func:`tau_normalised`). The bias is dropped, as in the reference implementation, whose
tau-normalised logits are the features' dot products with the rescaled weights alone.

tau is chosen on the validation split over :data:`TAU_GRID` (the reference's sweep) by balanced
accuracy, and never scored on the rows that chose it (:func:`choose_tau`): the split is cut into
two stratified halves (:func:`validation_halves`); the tau half A chooses makes half B's
validation predictions and the tau half B chooses makes half A's, so that the validation metrics
(what a race compares) read every row once, predicted with a tau its own row did not tune. The
classifier keeps the tau the whole split chooses: the test set, which never chooses, scores it.

Post-hoc logit adjustment (``trainer.classifier_stage=posthoc_la``; Menon et al. 2021, "Long-tail
learning via logit adjustment", ICLR): after training, with no further epochs, every logit
becomes f_j(x) - log(pi_j^tau + 1e-12), pi the training class frequencies, as the reference
implementation (google-research/google-research, logit_adjustment/main.py) computes it; for small
pi_j^tau the 1e-12 is nothing and this is f_j(x) - tau log pi_j, the paper's formula. A linear
classifier's logit j is w_j x + b_j, so the adjustment is folded into its bias
(:func:`adjusted_bias`): the checkpoint and the logged model predict adjusted, as they are. tau is
chosen over the same grid and cross-fitted alike (:func:`choose_adjustment`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from runner.errors import UserError
from runner.models.heads import ScaledClassifier
from runner.train.feature_bank import tensor_bytes

# The reference's sweep (its tau_norm.py: np.linspace(0, 2, 21)): tau=0 keeps the weights, tau=1
# gives every class weight unit norm; above 1 the ordering of the norms inverts
# (||w_j / ||w_j||^tau|| = ||w_j||^(1 - tau)), favouring the rare classes by more than balancing.
TAU_GRID: tuple[float, ...] = tuple(step / 10 for step in range(21))
# Post-hoc logit adjustment sweeps the same grid: tau=0 is the trained classifier unchanged, tau=1
# the reference's default (main.py's --tau) and the paper's Bayes-optimal shift for the balanced
# error when the model's probabilities are calibrated; above 1 it favours the rare classes more.
# The halves are a function of the validation labels alone (this seed): every run on the same
# split, whatever its own seed, cuts it alike, so the candidates of a race are scored alike.
# Changing it changes every post-hoc stage's validation metrics (and the halves' taus) under the
# same config: it then needs an entry per post-hoc stage in runner.fingerprint.REVISED, so that a
# resumed sweep does not take runs recorded with the old halves for the new ones.
HALVES_SEED = 0


def replace_classifier(model: nn.Module, replacement: nn.Module) -> None:
    """Put ``replacement`` where ``model.classifier`` is, so that the model's forward pass and
    ``model.classifier`` both reach it."""
    current = model.classifier
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is current:
                setattr(parent, name, replacement)
                assert model.classifier is replacement, "model.classifier must be a submodule"
                return
    raise AssertionError("model.classifier is not a submodule of the model")


def scale_classifier(model: nn.Module, num_classes: int) -> nn.Parameter:
    """LWS: wrap ``model.classifier`` in a :class:`ScaledClassifier` (its weights as they are)
    and return the scales, the parameter to train. Everything else is left as it is found
    (the caller freezes it)."""
    classifier = model.classifier
    assert isinstance(classifier, nn.Module), "LWS needs model.classifier, a module"
    scaled = ScaledClassifier(classifier, num_classes)
    replace_classifier(model, scaled)
    return scaled.scales


def tau_normalised(weight: torch.Tensor, tau: float) -> torch.Tensor:
    """Every class weight (a row of a linear layer's ``weight``) divided by its norm to the power
    ``tau``: w_j / ||w_j||^tau.

    Example:
        >>> weight = torch.tensor([[3.0, 4.0], [0.6, 0.8]])  # norms 5 and 1
        >>> tau_normalised(weight, 1.0)
        tensor([[0.6000, 0.8000],
                [0.6000, 0.8000]])
        >>> tau_normalised(weight, 0.0).equal(weight)
        True
    """
    norms = weight.norm(dim=1, keepdim=True).clamp_min(torch.finfo(weight.dtype).tiny)
    return weight / norms.pow(tau)


def adjusted_bias(bias: torch.Tensor, prior: torch.Tensor, tau: float) -> torch.Tensor:
    """``bias`` less the reference's adjustment log(prior^tau + 1e-12), computed in float64 (the
    1e-12 is below float32's resolution near 1) and returned in ``bias``'s dtype."""
    adjustment = torch.log(prior.double() ** tau + 1e-12)
    return (bias.double() - adjustment.to(bias.device)).to(bias.dtype)


def linear_classifier(model: nn.Module, stage: str, needs_bias: bool = False) -> nn.Linear:
    """The linear classifier a post-hoc stage changes: tau-normalisation rescales its weights
    (a cosine head's all have norm 1 already: there is nothing to rescale), logit adjustment
    shifts its bias, which it then ``needs_bias``. Any other head is refused, naming ``stage``."""
    classifier = getattr(model, "classifier", None)
    if not isinstance(classifier, nn.Linear):
        kind = type(classifier).__name__
    elif needs_bias and classifier.bias is None:
        kind = "torch.nn.Linear without a bias"
    else:
        return classifier
    raise UserError(
        f"trainer.classifier_stage={stage} changes a linear model.classifier with a bias; this "
        f"model's is {kind}\nuse model.head=linear, or a model whose classifier is a "
        "torch.nn.Linear with bias=True"
    )


def balanced_accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
    """The mean recall over the classes present in ``labels``: scikit-learn's
    ``balanced_accuracy_score`` (which also drops classes only predicted), without its warning."""
    present, index = np.unique(labels, return_inverse=True)
    hits = np.bincount(index, weights=predictions == labels, minlength=len(present))
    return float(np.mean(hits / np.bincount(index, minlength=len(present))))


def validation_halves(labels: np.ndarray, seed: int = HALVES_SEED) -> np.ndarray:
    """Half A of the validation rows as a mask (the rest is half B): within every class a seeded
    random half of its rows, one more in A for an odd count. Stratified, so every class with two
    or more rows is in both halves. A split with no class of two rows leaves half B empty and is
    refused, naming the setting: tau cannot be chosen on one half and scored on the other."""
    rng = np.random.default_rng(seed)
    half_a = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        half_a[rng.permutation(np.flatnonzero(labels == label))[::2]] = True
    if half_a.all():
        raise UserError(
            "data.val_per_class / data.val_fraction: the classifier stage chooses tau on one half "
            f"of the validation split and scores it on the other, and its {len(labels)} rows hold no "
            "class twice\nset data.val_per_class=2 or more (or a larger data.val_fraction)"
        )
    return half_a


@dataclass(frozen=True)
class TauChoice:
    """What :func:`choose_tau` chose and measured. ``tau`` (the whole validation split's choice)
    is the one the classifier keeps; ``tau_a`` and ``tau_b`` are the halves' choices;
    ``scores`` is the whole split's balanced accuracy at every tau of ``grid`` (the tuning curve:
    in-sample, never an estimate); ``cross_fitted`` holds the validation predictions, every row's
    made with the tau chosen on the half it is not in."""

    tau: float
    tau_a: float
    tau_b: float
    grid: tuple[float, ...]
    scores: tuple[float, ...]
    cross_fitted: np.ndarray = field(repr=False)

    def describe(self) -> str:
        """The choice in words, for the run's log."""
        return (
            f"tau {self.tau:.1f} chosen on the whole validation split (the tau the test set and "
            f"the checkpoint use); the validation metrics use tau {self.tau_a:.1f} (chosen on "
            f"half A) for half B's rows and {self.tau_b:.1f} (chosen on half B) for half A's"
        )

    def metrics(self) -> dict[str, float]:
        """``decoupled/tau``, the halves' taus and the tuning curve, one key per tau tried."""
        curve = {
            f"decoupled/val_balanced_accuracy/tau_{tau:.2f}": score
            for tau, score in zip(self.grid, self.scores, strict=True)
        }
        halves = {"decoupled/tau_half_a": self.tau_a, "decoupled/tau_half_b": self.tau_b}
        return {"decoupled/tau": self.tau, **halves, **curve}


def _best(predictions: np.ndarray, labels: np.ndarray) -> tuple[int, list[float]]:
    """The row of ``predictions`` (one per tau) with the highest balanced accuracy (the first of
    equal maxima: the smallest tau, the least change) and every row's score."""
    scores = [balanced_accuracy(labels, row) for row in predictions]
    return int(np.argmax(scores)), scores


class ClassifierInputs:
    """What ``model.features`` hands ``model.classifier`` for every validation row, computed once
    in eval mode (``model`` is a :class:`runner.models.FeatureClassifier`: its forward is
    ``classifier(features(x))``), so that a post-hoc stage tries every tau with the classifier
    alone. ``chunks`` are the inputs in the chunks a full prediction would take, and ``precision``
    the context it runs in (autocast on a GPU): :meth:`predict` then gives what the whole model's
    prediction gives, the same operations on the same tensors, for the classifier as it stands."""

    @torch.no_grad()
    def __init__(
        self,
        model: nn.Module,
        chunks: Iterable[torch.Tensor],
        precision: Callable[[], AbstractContextManager[object]],
    ) -> None:
        features, classifier = model.features, model.classifier
        assert isinstance(features, nn.Module) and isinstance(classifier, nn.Module)
        self.classifier, self.precision = classifier, precision
        was_training = model.training
        model.eval()
        try:
            with precision():
                self.chunks = [features(x) for x in chunks]
        finally:
            model.train(was_training)

    def digest(self) -> bytes:
        """A digest of what :meth:`predict` reads besides the classifier's parameters: the
        inputs (their chunks' dtypes, shapes, device types and bytes) and the classifier's type.
        The precision :meth:`predict` runs in follows the device type (autocast on a GPU)."""
        classifier = type(self.classifier)
        digest = hashlib.sha256(f"{classifier.__module__}.{classifier.__qualname__}".encode())
        for chunk in self.chunks:
            digest.update(f"|{chunk.dtype}{tuple(chunk.shape)}{chunk.device.type}|".encode())
            digest.update(tensor_bytes(chunk))
        return digest.digest()

    @torch.no_grad()
    def predict(self) -> np.ndarray:
        """The predicted classes of the validation rows by the classifier as it stands, in eval
        mode."""
        was_training = self.classifier.training
        self.classifier.eval()
        try:
            with self.precision():
                preds = [self.classifier(f).argmax(1) for f in self.chunks]
        finally:
            self.classifier.train(was_training)
        return torch.cat(preds).cpu().numpy() if preds else np.empty(0, np.int64)


def cross_fit(
    apply: Callable[[float], object],
    predict: Callable[[], np.ndarray],
    labels: np.ndarray,
    grid: tuple[float, ...] = TAU_GRID,
) -> TauChoice:
    """Choose the tau of ``grid`` whose balanced accuracy on the whole validation split is
    highest, and cross-fit the validation predictions (see the module's docstring). ``apply``
    sets the classifier to a tau; ``predict`` gives the model's predictions of the validation
    rows, whose labels are ``labels``, as the classifier stands when it is called; the test set
    never takes part. The classifier is left at the whole split's tau."""
    predictions = []
    for tau in grid:
        apply(tau)
        predictions.append(predict())
    fitted = cross_fit_table(np.stack(predictions), labels)
    apply(grid[fitted.whole])
    tau, tau_a, tau_b = (grid[i] for i in (fitted.whole, fitted.a, fitted.b))
    return TauChoice(tau, tau_a, tau_b, grid, fitted.scores, fitted.cross_fitted)


@dataclass(frozen=True)
class CrossFit:
    """Which setting (a row of the table) the whole validation split chooses (``whole``), which
    half A and half B choose (``a``, ``b``), every setting's balanced accuracy on the whole split
    (``scores``, in-sample), and the cross-fitted predictions: half A's rows as half B's choice
    predicts them, half B's as half A's."""

    whole: int
    a: int
    b: int
    scores: tuple[float, ...]
    cross_fitted: np.ndarray = field(repr=False)


def cross_fit_table(table: np.ndarray, labels: np.ndarray) -> CrossFit:
    """Choose among the settings of ``table`` (settings x validation rows: each setting's
    predictions) by balanced accuracy, on the whole split and on each half
    (:func:`validation_halves`; the first of equal maxima), and cross-fit."""
    half_a = validation_halves(labels)
    whole, scores = _best(table, labels)
    a, _ = _best(table[:, half_a], labels[half_a])
    b, _ = _best(table[:, ~half_a], labels[~half_a])
    return CrossFit(whole, a, b, tuple(scores), np.where(half_a, table[b], table[a]))


@torch.no_grad()
def choose_tau(
    classifier: nn.Linear,
    predict: Callable[[], np.ndarray],
    labels: np.ndarray,
    grid: tuple[float, ...] = TAU_GRID,
) -> TauChoice:
    """Tau-normalise ``classifier`` in place with the tau :func:`cross_fit` chooses. The bias, if
    any, is zeroed first and stays zero."""
    trained = classifier.weight.detach().clone()
    if classifier.bias is not None:
        classifier.bias.zero_()
    return cross_fit(
        lambda tau: classifier.weight.copy_(tau_normalised(trained, tau)), predict, labels, grid
    )


@torch.no_grad()
def choose_adjustment(
    classifier: nn.Linear,
    prior: torch.Tensor,
    predict: Callable[[], np.ndarray],
    labels: np.ndarray,
    grid: tuple[float, ...] = TAU_GRID,
) -> TauChoice:
    """Logit-adjust ``classifier`` in place (its bias less log(prior^tau + 1e-12), ``prior`` the
    training class frequencies) with the tau :func:`cross_fit` chooses."""
    bias = classifier.bias
    assert bias is not None, "linear_classifier refuses a classifier without a bias"
    trained = bias.detach().clone()
    return cross_fit(
        lambda tau: bias.copy_(adjusted_bias(trained, prior, tau)), predict, labels, grid
    )
