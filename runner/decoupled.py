"""Decoupled classifiers beside cRT (Kang et al. 2020, "Decoupling representation and classifier
for long-tailed recognition", ICLR): learnable weight scaling (LWS) and tau-normalisation, both
on the representation and classifier that instance-balanced training learnt.

LWS (``trainer.classifier_stage=scale``): the trained classifier is kept and frozen, and its
logits are multiplied per class by a learnable scale f_j, initially 1 (:class:`ScaledClassifier`,
the reference implementation's ``logits * scales``): w_j <- f_j w_j, bias included. The scales
are all that the classifier stage trains (:func:`runner.state.start_classifier_stage`).

tau-normalisation (``trainer.classifier_stage=tau_norm``): after training, with no further
epochs, every class weight of the linear classifier becomes w_j / ||w_j||^tau
(:func:`tau_normalised`), with tau chosen on the validation split's balanced accuracy over
:data:`TAU_GRID` (:func:`choose_tau`). The bias is dropped, as in the reference implementation,
whose tau-normalised logits are the features' dot products with the rescaled weights alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from runner.errors import UserError

# The paper's range: tau=0 keeps the weights, tau=1 gives every class weight unit norm; above 1
# the ordering of the norms inverts (||w_j / ||w_j||^tau|| = ||w_j||^(1 - tau)), favouring the
# rare classes by more than balancing does. Steps of 0.1 as in the reference's sweep; a finer
# grid would choose among differences the validation split cannot resolve.
TAU_GRID: tuple[float, ...] = tuple(step / 10 for step in range(11))


class ScaledClassifier(nn.Module):
    """A classifier whose logits are scaled per class: ``classifier(x) * scales``, with
    ``scales`` (one per class, initially 1) the module's only parameter outside ``classifier``.
    Any head: a linear layer's weight and bias, or a cosine head's cosines, scaled alike."""

    def __init__(self, classifier: nn.Module, num_classes: int) -> None:
        super().__init__()
        self.classifier = classifier
        device = next(classifier.parameters()).device
        self.scales = nn.Parameter(torch.ones(num_classes, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(x) * self.scales


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
    ``tau``: w_j / ||w_j||^tau."""
    norms = weight.norm(dim=1, keepdim=True).clamp_min(torch.finfo(weight.dtype).tiny)
    return weight / norms.pow(tau)


def tau_norm_classifier(model: nn.Module) -> nn.Linear:
    """The linear classifier tau-normalisation rescales; any other head is refused (a cosine
    head's class weights all have norm 1 already: there is nothing to rescale)."""
    classifier = getattr(model, "classifier", None)
    if not isinstance(classifier, nn.Linear):
        raise UserError(
            f"trainer.classifier_stage=tau_norm rescales the weights of a linear model.classifier;"
            f" this model's is {type(classifier).__name__}\nuse model.head=linear, or a model "
            "whose classifier is a torch.nn.Linear"
        )
    return classifier


@dataclass(frozen=True)
class TauChoice:
    """The chosen ``tau`` and the validation split's balanced accuracy at every tau tried."""

    tau: float
    grid: tuple[float, ...]
    scores: tuple[float, ...]

    def metrics(self) -> dict[str, float]:
        """``decoupled/tau`` and the validation curve, one key per tau tried."""
        curve = {
            f"decoupled/val_balanced_accuracy/tau_{tau:.2f}": score
            for tau, score in zip(self.grid, self.scores, strict=True)
        }
        return {"decoupled/tau": self.tau, **curve}


@torch.no_grad()
def choose_tau(
    classifier: nn.Linear, validation_score: Callable[[], float], grid: tuple[float, ...] = TAU_GRID
) -> TauChoice:
    """Tau-normalise ``classifier`` in place with the tau of ``grid`` whose validation score is
    highest (the smallest such tau on a tie: the least change). ``validation_score`` measures
    the model as the classifier stands when it is called; the test set never takes part. The
    bias, if any, is zeroed first and stays zero."""
    trained = classifier.weight.detach().clone()
    if classifier.bias is not None:
        classifier.bias.zero_()
    scores = []
    for tau in grid:
        classifier.weight.copy_(tau_normalised(trained, tau))
        scores.append(validation_score())
    best = int(np.argmax(scores))  # the first of equal maxima
    classifier.weight.copy_(tau_normalised(trained, grid[best]))
    return TauChoice(grid[best], grid, tuple(scores))
