"""Classifier stages, one class each, chosen by name (``trainer.classifier_stage``): what a
decoupled recipe does to the classifier after the representation trained for
``trainer.epochs`` (Kang et al. 2020, "Decoupling representation and classifier"; Menon et al.
2021 for post-hoc logit adjustment). The maths lives in :mod:`runner.train.decoupled`.

A stage says what it refuses before anything is built (:meth:`ClassifierStage.check`) and once
the model and the split are built (:meth:`ClassifierStage.check_built`); a stage that trains
(``takes_epochs``) says which parameters train in its ``trainer.classifier_epochs``
(:meth:`ClassifierStage.trainable`; :func:`runner.train.state.start_classifier_stage` freezes
the rest and starts its optimizer, also when a checkpoint taken in the stage is resumed); a
post-hoc stage (``post_hoc``) changes the classifier after the last epoch, most of them
choosing on the validation split (``reads_validation``; :meth:`PostHocStage.choose`). Every
stage shares plain cross-entropy's epochs but its last (:meth:`ClassifierStage.shared_epochs`),
which logs ``stage1/*`` or is changed.

A new stage is one subclass with :func:`register` and one YAML under ``conf/method/`` setting
``trainer.classifier_stage``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeVar

import numpy as np
import torch
from torch import nn

from runner.errors import UserError, config_error
from runner.train.decoupled import (
    TAU_GRID,
    choose_adjustment,
    choose_tau,
    linear_classifier,
    scale_classifier,
    validation_halves,
)
from runner.train.refit import choose_refit, set_class_means
from runner.train.settings import TrainerConfig

KEY = "trainer.classifier_stage"


@dataclass(frozen=True)
class StageSettings:
    """What a stage's config check reads: the classifier epochs, ``model.head``, and the
    validation split asked for (``data.val_per_class``, ``data.val_fraction``; None: unset)."""

    classifier_epochs: int
    head: str
    val_per_class: int | None
    val_fraction: float | None

    @property
    def has_validation(self) -> bool:
        return bool(self.val_per_class or self.val_fraction)


class ClassifierStage:
    """The base of every stage; on its own, a run without one (:class:`NoStage`)."""

    name: ClassVar[str]
    takes_epochs: ClassVar[bool] = False  # trains for trainer.classifier_epochs after the others
    post_hoc: ClassVar[bool] = False  # changes the classifier after the last epoch, no epochs
    # Chooses on the validation split, which then scores the run only where cross-fitted.
    reads_validation: ClassVar[bool] = False
    # Takes long enough that a signal stops it part-way, with no checkpoint there: the run
    # checkpoints after the epoch before the last, so that resuming loses one epoch at most.
    stops_part_way: ClassVar[bool] = False

    def check(self, settings: StageSettings) -> None:
        """Refuse, before anything is built, a config the stage cannot run with."""
        if settings.classifier_epochs and not self.takes_epochs:
            raise config_error(
                KEY,
                f"{self.name} takes no classifier epochs, got trainer.classifier_epochs="
                f"{settings.classifier_epochs}; set trainer.classifier_epochs=0, or use scale "
                "(LWS) or retrain (cRT)",
            )

    def check_built(self, model: nn.Module, val_labels: torch.Tensor | None) -> None:
        """Refuse, before any run is recorded, what the built model or split cannot do."""

    def trainable(self, model: nn.Module, num_classes: int) -> list[nn.Parameter]:
        """The parameters the stage trains, prepared (the caller has frozen every weight)."""
        raise NotImplementedError(f"{self.name} trains no classifier epochs")

    def shared_epochs(self, trainer: TrainerConfig) -> int:
        """The epochs a run with this stage trains exactly like plain cross-entropy: all of
        stage one but its last, which logs ``stage1/*`` or is changed after it trains."""
        return trainer.epochs - 1


_STAGES: dict[str, type[ClassifierStage]] = {}
S = TypeVar("S", bound=type[ClassifierStage])


def register(stage: S) -> S:
    """Class decorator: ``trainer.classifier_stage=<stage.name>`` chooses ``stage``."""
    _STAGES[stage.name] = stage
    return stage


def stage_names() -> tuple[str, ...]:
    """The names ``trainer.classifier_stage`` takes, in registration order."""
    return tuple(_STAGES)


def stage_named(name: str) -> ClassifierStage:
    """The registered stage ``name``; an unknown one is a :class:`UserError` listing them.

    Example:
        >>> stage = stage_named("tau_norm")
        >>> stage.post_hoc, stage.takes_epochs
        (True, False)
        >>> stage_named("lws")
        Traceback (most recent call last):
        ...
        runner.errors.UserError: config error at 'trainer.classifier_stage': 'lws' is unknown; choose one of ('none', 'retrain', 'scale', 'tau_norm', 'posthoc_la', 'logistic_la', 'logistic_balanced', 'ncm')
    """
    if name not in _STAGES:
        raise config_error(KEY, f"{name!r} is unknown; choose one of {stage_names()}")
    return _STAGES[name]()


def stage_for(trainer: TrainerConfig) -> ClassifierStage:
    """The stage a run with ``trainer`` goes through: the one it names, or :class:`NoStage`
    when that one trains and ``trainer.classifier_epochs`` is 0 (the default ``retrain``)."""
    stage = stage_named(trainer.classifier_stage)
    if stage.takes_epochs and not trainer.classifier_epochs:
        return NoStage()
    return stage


@register
class NoStage(ClassifierStage):
    """No classifier stage: the classifier stage one trained is the run's."""

    name = "none"

    def shared_epochs(self, trainer: TrainerConfig) -> int:
        return trainer.epochs + trainer.classifier_epochs


@register
class Retrain(ClassifierStage):
    """cRT: the classifier (``model.classifier``) is re-initialised by its layers' own
    ``reset_parameters`` (torch's default for a linear layer) and trains alone."""

    name = "retrain"
    takes_epochs = True

    def trainable(self, model: nn.Module, num_classes: int) -> list[nn.Parameter]:
        classifier = model.classifier
        assert isinstance(classifier, nn.Module), "a classifier stage needs model.classifier"
        for layer in classifier.modules():
            reset = getattr(layer, "reset_parameters", None)
            if callable(reset):
                reset()
        classifier.requires_grad_(True)
        return list(classifier.parameters())


@register
class Scale(ClassifierStage):
    """LWS: the classifier keeps its weights, frozen, and is wrapped so that its logits are
    scaled per class by learnable factors, initially 1, the only parameters that train
    (:func:`runner.train.decoupled.scale_classifier`)."""

    name = "scale"
    takes_epochs = True

    def check(self, settings: StageSettings) -> None:
        if not settings.classifier_epochs:
            raise config_error(
                KEY,
                "scale (LWS) learns its class scales in trainer.classifier_epochs, which is 0; "
                "set trainer.classifier_epochs=N (+method=lws sets 10)",
            )

    def trainable(self, model: nn.Module, num_classes: int) -> list[nn.Parameter]:
        return [scale_classifier(model, num_classes)]


@dataclass(frozen=True)
class PostHocInputs:
    """What a post-hoc stage chooses with: ``predict`` gives the validation rows' predicted
    classes by the classifier as it stands (None without a split, which only a stage that
    does not ``reads_validation`` runs with), ``labels`` their labels, ``counts`` the training
    class counts; ``training()`` the classifier's inputs for every training row (the model in
    eval mode, no augmentation) and their labels, computed when a stage asks;
    ``validation_digest()`` a digest of what ``predict`` reads besides the classifier's
    parameters (:meth:`runner.train.decoupled.ClassifierInputs.digest`)."""

    predict: Callable[[], np.ndarray] | None
    labels: np.ndarray
    counts: torch.Tensor
    training: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    validation_digest: Callable[[], bytes]

    def validation(self) -> Callable[[], np.ndarray]:
        """``predict``, for a stage that chooses on the split (checked before training)."""
        assert self.predict is not None, "a stage that reads validation ran without a split"
        return self.predict


class PostHocChoice(Protocol):
    """What a post-hoc stage chose: the validation predictions cross-fitted (every row predicted
    with what the half it is not in chose), its metrics and a line for the log."""

    @property
    def cross_fitted(self) -> np.ndarray: ...

    def metrics(self) -> dict[str, float]: ...

    def describe(self) -> str: ...


class PostHocStage(ClassifierStage):
    """A stage that takes no epochs: after the last one, what it ``chooses`` on the validation
    split changes a linear classifier (``needs_bias``: one with a bias), the validation metrics
    cross-fitted; one that chooses nothing there (not ``reads_validation``) needs no split, and
    its validation metrics are its own predictions'."""

    post_hoc = True
    needs_bias: ClassVar[bool] = False
    chooses: ClassVar[str] = "tau"
    reads_validation = True  # False: chooses nothing, needs no split
    why_linear: ClassVar[str]  # why model.head must be linear, "{}" the head

    def check(self, settings: StageSettings) -> None:
        super().check(settings)
        if settings.head != "linear":
            reason = self.why_linear.format(settings.head)
            raise config_error(KEY, f"{self.name} {reason}; use model.head=linear")
        if not self.reads_validation:
            return
        if settings.val_per_class == 1:
            raise config_error(
                "data.val_per_class",
                f"{self.name} chooses {self.chooses} on one half of the validation split and scores it on "
                "the other, and 1 row of every class leaves the second half empty; set "
                "data.val_per_class=2 or more",
            )
        if not settings.has_validation:
            raise config_error(
                KEY,
                f"{self.name} chooses {self.chooses} on a validation split, and data.val_per_class="
                f"{settings.val_per_class}, data.val_fraction={settings.val_fraction} give "
                "none; set data.val_per_class=N or data.val_fraction=F (never the test set)",
            )

    def check_built(self, model: nn.Module, val_labels: torch.Tensor | None) -> None:
        """A classifier it cannot change, and a split that does not halve (a
        ``data.val_fraction`` that leaves every class one row shows only in the built labels)."""
        linear_classifier(model, self.name, self.needs_bias)
        if not self.reads_validation:
            return
        if val_labels is None:
            raise UserError(
                f"{KEY}={self.name} chooses {self.chooses} on a validation split, and the data "
                "built none\n"
                "set data.val_per_class=N or data.val_fraction=F (never the test set)"
            )
        validation_halves(val_labels.numpy())

    def choose(self, model: nn.Module, inputs: PostHocInputs) -> PostHocChoice:
        """Change ``model``'s classifier in place with what the validation rows choose."""
        raise NotImplementedError


@register
class TauNorm(PostHocStage):
    """tau-normalisation: every class weight becomes w_j / ||w_j||^tau, the bias dropped."""

    name = "tau_norm"
    why_linear = (
        "rescales a linear head's class weights, and model.head={} has unit-norm ones already"
    )

    def choose(self, model: nn.Module, inputs: PostHocInputs) -> PostHocChoice:
        return choose_tau(linear_classifier(model, self.name), inputs.validation(), inputs.labels)


@register
class PostHocAdjustment(PostHocStage):
    """Post-hoc logit adjustment: the bias less log(pi^tau + 1e-12), pi the training class
    frequencies."""

    name = "posthoc_la"
    needs_bias = True
    why_linear = "shifts a linear head's bias, and model.head={} has none"

    def choose(self, model: nn.Module, inputs: PostHocInputs) -> PostHocChoice:
        classifier = linear_classifier(model, self.name, needs_bias=True)
        prior = inputs.counts.double() / inputs.counts.double().sum()
        return choose_adjustment(classifier, prior, inputs.validation(), inputs.labels)


class LogisticRefit(PostHocStage):
    """The linear classifier refitted by L-BFGS logistic regression on the training rows'
    representation, C (and tau) chosen on validation (:mod:`runner.train.refit`)."""

    needs_bias = True
    stops_part_way = True  # L-BFGS fits: minutes on big features
    balanced: ClassVar[bool] = False
    why_linear = "refits a linear head's weights and bias, and model.head={} is not one"

    def choose(self, model: nn.Module, inputs: PostHocInputs) -> PostHocChoice:
        classifier = linear_classifier(model, self.name, needs_bias=True)
        prior = inputs.counts.double() / inputs.counts.double().sum()
        taus = (0.0,) if self.balanced else TAU_GRID
        return choose_refit(
            classifier,
            inputs.training(),
            prior,
            inputs.validation(),
            inputs.labels,
            balanced=self.balanced,
            tau_grid=taus,
            validation_digest=inputs.validation_digest(),
        )


@register
class LogisticAdjusted(LogisticRefit):
    """Logistic regression, then post-hoc logit adjustment: C and tau chosen together."""

    name = "logistic_la"
    chooses = "C and tau"


@register
class LogisticBalanced(LogisticRefit):
    """Class-weighted logistic regression (``class_weight="balanced"``): C chosen."""

    name = "logistic_balanced"
    chooses = "C"
    balanced = True


@register
class NearestClassMean(PostHocStage):
    """Nearest class mean by cosine similarity on the training rows' standardised
    representation, the cheap reference (:func:`runner.train.refit.set_class_means`): nothing
    chosen, so no split needed; with one, its validation metrics are the classifier's own."""

    name = "ncm"
    needs_bias = True
    reads_validation = False
    why_linear = "replaces a linear head's weights and bias, and model.head={} is not one"

    def choose(self, model: nn.Module, inputs: PostHocInputs) -> PostHocChoice:
        classifier = linear_classifier(model, self.name, needs_bias=True)
        return set_class_means(classifier, inputs.training(), inputs.predict)
