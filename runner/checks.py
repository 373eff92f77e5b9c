"""The config checked at the boundary, before any work: the built groups' targets and their
parameters, every trainer/eval/tracking value against its constraint, and the objective.

A value's constraint is one row of :data:`CONSTRAINTS` checked by :func:`check_scalar`
(scikit-learn's ``check_scalar``, for config keys): the message names the key, the value and
what would do.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf

from runner.config import BASIC_SWEEPER, OBJECTIVE_SPLITS, SUPPLIED
from runner.data.multilabel import is_multilabel_source
from runner.errors import UserError, config_error
from runner.fingerprint import MOVED_MODULES
from runner.models.heads import HEADS
from runner.train.multilabel_evaluation import BINARY_HEADLINE, MULTILABEL_HEADLINE
from runner.train.settings import HEADLINE, MODEL_RUNNER_KEYS
from runner.train.stages import StageSettings, stage_named, stage_names

SCHEDULES = ("cosine", "step", "constant")
DEVICES = ("auto", "cpu", "cuda")
CLASSIFIER_STAGE_MODES = ("train", "eval")  # the model's mode while the classifier stage trains


@dataclass(frozen=True)
class Constraint:
    """``key`` holds a ``kind`` (int or float; finite) within [``low``, ``high``]; ``low`` and
    ``high`` may name another key. ``open_low`` / ``open_high`` exclude the bound itself,
    ``nullable`` allows null, ``example`` tells what a sensible value is."""

    key: str
    kind: type
    low: float | str | None = None
    high: float | str | None = None
    open_low: bool = False
    open_high: bool = False
    nullable: bool = False
    example: str = ""


CONSTRAINTS = (
    Constraint("trainer.epochs", int, low=1),
    Constraint("trainer.batch_size", int, low=1),
    Constraint("trainer.eval_every", int, low=0, example="0: after each stage's last epoch"),
    Constraint("trainer.eval_batch_size", int, low=1),
    Constraint("trainer.warmup_epochs", int, low=0, high="trainer.epochs"),
    Constraint("trainer.threads", int, low=0, example="0: torch's default"),
    Constraint("trainer.classifier_epochs", int, low=0),
    Constraint("trainer.checkpoint_every", int, low=0, example="0: only when stopped"),
    Constraint("trainer.lr", float, low=0, open_low=True, example="e.g. 0.1"),
    Constraint(
        "trainer.classifier_lr",
        float,
        low=0,
        open_low=True,
        nullable=True,
        example="null: trainer.lr",
    ),
    Constraint(
        "trainer.backbone_lr",
        float,
        low=0,
        open_low=True,
        example="a factor on trainer.lr; 1: the same",
    ),
    Constraint("trainer.momentum", float, low=0, high=1, open_high=True, example="e.g. 0.9"),
    Constraint("trainer.weight_decay", float, low=0, example="e.g. 5e-4"),
    Constraint("trainer.gamma", float, low=0, open_low=True, example="the lr decay factor"),
    Constraint("tracking.retries", int, low=0),
    Constraint("tracking.request_timeout", int, low=1, example="seconds per attempt"),
    Constraint("tracking.per_class_max", int, low=1, example="above it, per-class tables"),
    Constraint("eval.many_shot", int, low=0),
    Constraint("eval.few_shot", int, low=0, high="eval.many_shot"),
    Constraint("eval.target_precision", float, low=0, high=1, open_low=True, example="e.g. 0.9"),
)
CHOICES = {
    "trainer.schedule": SCHEDULES,
    "trainer.device": DEVICES,
    "trainer.classifier_stage_mode": CLASSIFIER_STAGE_MODES,
}


def check_scalar(cfg: DictConfig, rule: Constraint) -> None:
    """Raise a :class:`UserError` naming ``rule.key`` unless its value in ``cfg`` obeys ``rule``."""
    value = OmegaConf.select(cfg, rule.key)
    if value is None and rule.nullable:
        return
    bounds = {
        side: OmegaConf.select(cfg, bound) if isinstance(bound, str) else bound
        for side, bound in (("low", rule.low), ("high", rule.high))
    }
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = number and math.isfinite(value) and (rule.kind is float or isinstance(value, int))
    low, high = bounds["low"], bounds["high"]
    if ok and low is not None:
        ok = value > low if rule.open_low else value >= low
    if ok and high is not None:
        ok = value < high if rule.open_high else value <= high
    if ok:
        return
    left = "(" if rule.open_low else "["
    right = ")" if rule.open_high else "]"
    shown = {
        side: f"{bound}={bounds[side]}" if isinstance(bound, str) else bound
        for side, bound in (("low", rule.low), ("high", rule.high))
    }
    span = f"{left}{shown['low'] if low is not None else '-inf'}, {shown['high'] if high is not None else 'inf'}{right}"
    what = "a finite number" if rule.kind is float else "an integer"
    extra = f" ({rule.example})" if rule.example else ""
    raise config_error(rule.key, f"must be {what} in {span}{extra}, got {value!r}")


def accepted_parameters(target: Any) -> set[str]:
    """Keyword parameters ``target`` accepts; a class that forwards ``**kwargs`` to its base
    (every sampler strategy) also accepts the base's, up to the first class that does not."""
    classes = (
        [c for c in target.__mro__ if "__init__" in vars(c)] if inspect.isclass(target) else []
    )
    signatures = [inspect.signature(vars(c)["__init__"]) for c in classes] or [
        inspect.signature(target)
    ]
    names: set[str] = set()
    for signature in signatures:
        kinds = {p.kind for p in signature.parameters.values()}
        names |= {
            n
            for n, p in signature.parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        } - {"self"}
        if inspect.Parameter.VAR_KEYWORD not in kinds:
            break
    return names


MODEL_HINT = (
    "\nanother module: model=custom model._target_=<its class> with its other arguments as "
    "+model.<name>=<value>, or model=timm / model=torchvision model.name=<name>"
)


def check_model_keys(model: DictConfig) -> None:
    """The runner's own keys of the model group (:data:`MODEL_RUNNER_KEYS`) hold what they may,
    and a model group without a class (``model=custom``) is told how to name one."""
    if not isinstance(model, DictConfig):
        return  # check_targets names the missing group
    if OmegaConf.is_missing(model, "_target_"):
        raise config_error(
            "model._target_",
            "model=custom needs your module's class: model._target_=mypkg.nets.Net "
            "(importable, e.g. on PYTHONPATH; its other arguments as +model.<name>=<value>)",
        )
    if model.get("head", "linear") not in HEADS:
        raise config_error("model.head", f"{model.head!r} is unknown; choose one of {HEADS}")
    if not isinstance(model.get("freeze", False), bool):
        raise config_error("model.freeze", f"must be true or false, got {model.freeze!r}")


def takes_keyword(target: Any, name: str) -> bool:
    """Whether calling ``target`` with the keyword argument ``name`` binds (``**kwargs`` too)."""
    try:
        inspect.signature(target).bind_partial(**{name: None})
    except TypeError:
        return False
    return True


def check_targets(cfg: DictConfig) -> None:
    """Every built group names an importable ``_target_`` and only parameters it accepts, and
    every trainer, eval and tracking value obeys its constraint."""
    # Values first: they need no import, so a mistyped number answers at once.
    # The stages registered by then (runner.train.stages), a stage added by a user's code too.
    for key, options in {**CHOICES, "trainer.classifier_stage": stage_names()}.items():
        if OmegaConf.select(cfg, key) not in options:
            raise config_error(
                key, f"{OmegaConf.select(cfg, key)!r} is unknown; choose one of {options}"
            )
    for rule in CONSTRAINTS:
        check_scalar(cfg, rule)
    check_model_keys(cfg.model)
    for group, supplied in SUPPLIED.items():
        node = cfg[group]
        if not isinstance(node, DictConfig) or "_target_" not in node:
            raise config_error(
                group, f"choose one with {group}=<name> (samplerlab run --help lists them)"
            )
        moved = [
            new + str(node._target_).removeprefix(old)
            for new, old in MOVED_MODULES.items()
            if str(node._target_).startswith(old)
        ]
        if moved:  # a config saved before the module moved
            raise config_error(
                f"{group}._target_", f"{node._target_!r} has moved; use {moved[0]!r}"
            )
        try:
            target = get_method(node._target_)
        except Exception as err:  # hydra raises ImportError or ValueError variants
            raise config_error(
                f"{group}._target_", f"cannot import {node._target_!r} ({err})"
            ) from None
        known = accepted_parameters(target)
        for name in node:
            key = str(name)
            if key.startswith("_") or (group == "model" and key in MODEL_RUNNER_KEYS):
                continue
            if key in supplied:
                raise config_error(
                    f"{group}.{key}", "is set by the runner; remove it from the config"
                )
            if key not in known:
                raise config_error(
                    f"{group}.{key}",
                    f"unknown parameter of {node._target_}; known: {sorted(known - supplied)}"
                    + (MODEL_HINT if group == "model" else ""),
                )
        if group == "model" and not takes_keyword(target, "num_classes"):
            raise config_error(
                "model._target_",
                f"{node._target_} takes no num_classes argument, which the runner passes; "
                "add one to its constructor (docs/your-model.md)",
            )
    check_classifier_stage(cfg)
    if not str(cfg.tracking.experiment or "").strip():
        raise config_error(
            "tracking.experiment", "is empty; name an MLflow experiment (default: samplerlab)"
        )


def check_classifier_stage(cfg: DictConfig) -> None:
    """What the chosen classifier stage refuses of the config (:mod:`runner.train.stages`)."""
    data = cfg.data
    settings = StageSettings(
        classifier_epochs=int(cfg.trainer.classifier_epochs),
        head=str(cfg.model.get("head", "linear")),
        val_per_class=data.get("val_per_class"),
        val_fraction=data.get("val_fraction"),
    )
    stage_named(cfg.trainer.classifier_stage).check(settings)


def has_validation_split(cfg: DictConfig) -> bool:
    data = cfg.data
    return bool(data.get("val_per_class") or data.get("val_fraction"))


def check_objective(cfg: DictConfig, sweeper: str | None = None) -> None:
    """``objective`` names a headline metric on a split; under an optimising sweeper (``sweeper``,
    the target of ``hydra.sweeper``, anything but Hydra's basic one) it must not select on the
    test set unless ``objective_on_test`` says so, and a validation objective needs a split."""
    split, _, metric = str(cfg.objective).partition("/")
    known = HEADLINE + MULTILABEL_HEADLINE + BINARY_HEADLINE
    if split not in OBJECTIVE_SPLITS or metric not in known:
        raise config_error(
            "objective",
            f"{cfg.objective!r} is not a metric of a run; use <split>/<metric> with split in "
            f"{OBJECTIVE_SPLITS} and metric in {known} (default val/balanced_accuracy)",
        )
    if sweeper is None or sweeper == BASIC_SWEEPER:
        return
    name = sweeper.rsplit(".", 1)[-1]
    multi_label = is_multilabel_source(get_method(cfg.data._target_))
    if multi_label != (metric in MULTILABEL_HEADLINE):
        kind = "multi-label" if multi_label else "single-label"
        fix = "val/mAP" if multi_label else "val/balanced_accuracy"
        raise UserError(
            f"objective={cfg.objective}: {kind} data (data="
            f"{cfg.data._target_.rsplit('.', 1)[-1]}) do not report it, so the {name} sweeper "
            f"would compare nothing\nuse objective={fix} (or another metric of {kind} data)"
        )
    if split != "val" and not cfg.objective_on_test:
        raise UserError(
            f"objective={cfg.objective}: the {name} sweeper would select on the test set\n"
            "use objective=val/<metric> with a validation split (data.val_per_class=N or "
            "data.val_fraction=F), or set objective_on_test=true knowingly"
        )
    if split == "val" and not has_validation_split(cfg):
        raise UserError(
            f"objective={cfg.objective}: the {name} sweeper needs a validation split, and "
            f"data={cfg.data._target_.rsplit('.', 1)[-1]} has none\n"
            "set data.val_per_class=N (N images of every class) or data.val_fraction=F (a share "
            "of every class)"
        )
    stage = stage_named(str(cfg.trainer.classifier_stage))
    if split == "val" and metric in BINARY_HEADLINE and stage.reads_validation:
        raise UserError(
            f"objective={cfg.objective}: trainer.classifier_stage={stage.name} tunes the "
            "classifier on the validation split, so only its cross-fitted balanced accuracy "
            f"scores it there, and the {name} sweeper would compare nothing\n"
            "use objective=val/balanced_accuracy (or a stage that chooses nothing on validation)"
        )
