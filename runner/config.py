"""Config schema: dataclasses in Hydra's ConfigStore, so a typo or a wrong type fails at
composition, naming the key, before any work is done. Groups whose objects are built by
``_target_`` (data, model, sampler, loss) are checked against their target's signature in
:func:`check_targets`."""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.utils import get_method
from omegaconf import MISSING, DictConfig, OmegaConf

from runner.errors import UserError

SCHEDULES = ("cosine", "step", "constant")
# The headline metrics every evaluation reports; an objective is one of them on a split.
HEADLINE = (
    "accuracy",
    "balanced_accuracy",
    "macro_f1",
    "many_accuracy",
    "medium_accuracy",
    "few_accuracy",
)
OBJECTIVE_SPLITS = ("val", "test", "final")  # final/: the test set's last evaluation
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class TrainerConfig:
    epochs: int = 10
    batch_size: int = 128
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    nesterov: bool = True
    warmup_epochs: int = 0
    schedule: str = "cosine"
    milestones: list[int] = field(default_factory=list)
    gamma: float = 0.1
    device: str = "auto"
    threads: int = 0
    eval_every: int = 1
    eval_batch_size: int = 1024
    augment: bool = True
    progress: bool = True
    checkpoint_every: int = 1
    classifier_epochs: int = 0
    classifier_lr: float | None = None


@dataclass
class EvalConfig:
    many_shot: int = 100
    few_shot: int = 20


@dataclass
class TrackingConfig:
    uri: str | None = None
    experiment: str = "samplerlab"
    plots: bool = True
    reference: str | None = None
    retries: int = MISSING
    request_timeout: int = MISSING


@dataclass
class RunConfig:
    seed: int = 0
    resume: str | None = None
    objective: str = MISSING
    objective_on_test: bool = MISSING
    data: Any = MISSING
    model: Any = MISSING
    sampler: Any = MISSING
    loss: Any = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


def register() -> None:
    ConfigStore.instance().store(name="run_schema", node=RunConfig)
    # ${pid:} keeps two runs or sweeps started in the same second out of each other's folders.
    OmegaConf.register_new_resolver("pid", os.getpid, use_cache=True, replace=True)


# Arguments the runner supplies itself when it builds each group's object (runner.parts.build
# builds with exactly these, so the check and the build cannot drift apart).
SUPPLIED: dict[str, set[str]] = {
    "data": set(),
    "model": {"in_shape", "num_classes"},
    "sampler": {"labels"},
    "loss": {"class_counts", "sampler_weights", "epochs"},
}


def _fail(key: str, message: str) -> None:
    raise UserError(f"config error at '{key}': {message}")


def accepted_parameters(target: Any) -> set[str]:
    """Keyword parameters ``target`` accepts; a class that forwards ``**kwargs`` to its base
    (every sampler strategy) also accepts the base's, up to the first class that does not."""
    classes = (
        [c for c in target.__mro__ if "__init__" in vars(c)] if inspect.isclass(target) else []
    )
    signatures = [inspect.signature(c.__init__) for c in classes] or [inspect.signature(target)]
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


def _model_class(cfg: DictConfig) -> Any:
    return get_method(cfg.model._target_)


def check_targets(cfg: DictConfig) -> None:
    """Every built group names an importable ``_target_`` and only parameters it accepts."""
    for group, supplied in SUPPLIED.items():
        node = cfg[group]
        if not isinstance(node, DictConfig) or "_target_" not in node:
            _fail(group, f"choose one with {group}=<name> (see conf/{group}/)")
        try:
            target = get_method(node._target_)
        except Exception as err:  # hydra raises ImportError or ValueError variants
            _fail(f"{group}._target_", f"cannot import {node._target_!r} ({err})")
        parameters = accepted_parameters(target)
        known = parameters
        for key in node:
            if key.startswith("_"):
                continue
            if key in supplied:
                _fail(f"{group}.{key}", "is set by the runner; remove it from the config")
            if key not in known:
                _fail(
                    f"{group}.{key}",
                    f"unknown parameter of {node._target_}; known: {sorted(known - supplied)}",
                )
    trainer = cfg.trainer
    if trainer.schedule not in SCHEDULES:
        _fail("trainer.schedule", f"{trainer.schedule!r} is unknown; choose one of {SCHEDULES}")
    if trainer.device not in DEVICES:
        _fail("trainer.device", f"{trainer.device!r} is unknown; choose one of {DEVICES}")
    for key in ("epochs", "batch_size", "eval_every", "eval_batch_size"):
        if trainer[key] < 1:
            _fail(f"trainer.{key}", f"must be >= 1, got {trainer[key]}")
    for key in ("warmup_epochs", "threads", "classifier_epochs"):
        if trainer[key] < 0:
            _fail(f"trainer.{key}", f"must be >= 0, got {trainer[key]}")
    if trainer.warmup_epochs > trainer.epochs:
        _fail("trainer.warmup_epochs", f"must not exceed trainer.epochs={trainer.epochs}")
    if trainer.checkpoint_every < 0:
        _fail(
            "trainer.checkpoint_every",
            f"must be >= 0 (0: only when stopped), got {trainer.checkpoint_every}",
        )
    if not (math.isfinite(trainer.lr) and trainer.lr > 0):
        _fail("trainer.lr", f"must be a finite number > 0 (e.g. 0.1), got {trainer.lr}")
    if trainer.classifier_lr is not None and not (
        math.isfinite(trainer.classifier_lr) and trainer.classifier_lr > 0
    ):
        _fail(
            "trainer.classifier_lr",
            f"must be a finite number > 0, or null for trainer.lr; got {trainer.classifier_lr}",
        )
    if trainer.classifier_epochs and not hasattr(_model_class(cfg), "classifier"):
        _fail(
            "trainer.classifier_epochs",
            f"{cfg.model._target_} has no 'classifier' to retrain; use a runner.models model or 0",
        )
    if not (math.isfinite(trainer.momentum) and 0 <= trainer.momentum < 1):
        _fail("trainer.momentum", f"must lie in [0, 1) (e.g. 0.9), got {trainer.momentum}")
    if not (math.isfinite(trainer.weight_decay) and trainer.weight_decay >= 0):
        _fail(
            "trainer.weight_decay",
            f"must be a finite number >= 0 (e.g. 5e-4), got {trainer.weight_decay}",
        )
    if not (math.isfinite(trainer.gamma) and trainer.gamma > 0):
        _fail(
            "trainer.gamma",
            f"must be a finite number > 0 (the lr decay factor), got {trainer.gamma}",
        )
    if not cfg.tracking.experiment or not str(cfg.tracking.experiment).strip():
        _fail("tracking.experiment", "is empty; name an MLflow experiment (default: samplerlab)")
    for key, least in (("retries", 0), ("request_timeout", 1)):
        if cfg.tracking[key] < least:
            _fail(f"tracking.{key}", f"must be >= {least}, got {cfg.tracking[key]}")
    if cfg.eval.few_shot > cfg.eval.many_shot:
        _fail("eval.few_shot", f"must not exceed eval.many_shot={cfg.eval.many_shot}")


def has_validation_split(cfg: DictConfig) -> bool:
    data = cfg.data
    return bool(data.get("val_per_class") or data.get("val_fraction"))


def check_objective(cfg: DictConfig, sweeper: str | None = None) -> None:
    """``objective`` names a headline metric on a split; under an optimising sweeper (``sweeper``,
    the target of ``hydra.sweeper``, anything but Hydra's basic one) it must not select on the
    test set unless ``objective_on_test`` says so, and a validation objective needs a split."""
    split, _, metric = str(cfg.objective).partition("/")
    if split not in OBJECTIVE_SPLITS or metric not in HEADLINE:
        _fail(
            "objective",
            f"{cfg.objective!r} is not a metric of a run; use <split>/<metric> with split in "
            f"{OBJECTIVE_SPLITS} and metric in {HEADLINE} (default val/balanced_accuracy)",
        )
    if sweeper is None or sweeper == BASIC_SWEEPER:
        return
    name = sweeper.rsplit(".", 1)[-1]
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


# Keys that do not change what a run computes: they may differ between a run and its resumption,
# and between runs that are the same configuration (seeds aside).
RUNTIME_KEYS = (
    "resume",
    "objective",
    "objective_on_test",
    "tracking.uri",
    "tracking.retries",
    "tracking.request_timeout",
    "trainer.progress",
    "trainer.threads",
    "trainer.device",
    "data.num_workers",
    "data.in_memory",
    "data.memory_budget_gb",
)
# The first fingerprint left out fewer keys, and configs had none of the keys added since (whose
# default a run then had in effect): a run recorded with it is recognised by that computation.
FIRST_RUNTIME_KEYS = (
    "resume",
    "tracking.uri",
    "trainer.progress",
    "trainer.threads",
    "trainer.device",
)
ADDED_RUNTIME_KEYS = (
    "objective",
    "objective_on_test",
    "tracking.retries",
    "tracking.request_timeout",
)
ADDED_DEFAULTS = {"data.val_fraction": 0}  # keys added since, with the value runs had before


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """The config with every interpolation resolved, as plain containers."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def _drop(plain: dict[str, Any], key: str) -> Any:
    *path, last = key.split(".")
    node = plain
    for part in path:
        node = node.get(part, {})
    return node.pop(last, None)


def _fingerprint(plain: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_key(cfg: DictConfig) -> str:
    """A fingerprint of what the run computes (the config less :data:`RUNTIME_KEYS`): a resumed
    sweep recognises its finished jobs by it (tag ``config_key``)."""
    plain = resolved(cfg)
    for key in RUNTIME_KEYS:
        _drop(plain, key)
    return _fingerprint(plain)


def config_keys(cfg: DictConfig) -> set[str]:
    """The fingerprints a run of ``cfg`` may have been recorded with: today's, and the first
    computation's when ``cfg`` keeps the defaults of every key added since."""
    keys = {config_key(cfg)}
    plain = resolved(cfg)
    for key in FIRST_RUNTIME_KEYS:
        _drop(plain, key)
    for key in ADDED_RUNTIME_KEYS:
        _drop(plain, key)
    for key, default in ADDED_DEFAULTS.items():
        if _drop(plain, key) not in (None, default):
            return keys  # a setting runs recorded before could not have had
    keys.add(_fingerprint(plain))
    return keys
