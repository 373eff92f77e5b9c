"""The config schema: dataclasses in Hydra's ConfigStore, so a typo or a wrong type fails at
composition, naming the key, before any work is done (values are checked in
:mod:`runner.checks`); the keys that do not change what a run computes, and the fingerprint of
the rest (:func:`config_key`)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

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
CONF = Path(__file__).resolve().parent / "conf"  # package data: every config YAML
# Classifier stages that take no epochs: after the last one, a tau chosen on the validation split
# (tau-normalisation, post-hoc logit adjustment; runner.train.decoupled). They train all CE's epochs.
POST_HOC_STAGES = ("tau_norm", "posthoc_la")
T = TypeVar("T")

# The schema gives every key its type; the values, defaults included, live in conf/ alone
# (conf/trainer/default.yaml, conf/config.yaml, conf/tracking/local.yaml): one source each.


@dataclass
class TrainerConfig:
    epochs: int = MISSING
    batch_size: int = MISSING
    lr: float = MISSING
    momentum: float = MISSING
    weight_decay: float = MISSING
    nesterov: bool = MISSING
    warmup_epochs: int = MISSING
    schedule: str = MISSING
    milestones: list[int] = MISSING
    gamma: float = MISSING
    device: str = MISSING
    threads: int = MISSING
    eval_every: int = MISSING
    eval_batch_size: int = MISSING
    augment: bool = MISSING
    progress: bool = MISSING
    checkpoint_every: int = MISSING
    classifier_epochs: int = MISSING
    classifier_lr: float | None = MISSING
    backbone_lr: float = MISSING
    classifier_stage: str = MISSING
    classifier_stage_mode: str = MISSING


@dataclass
class EvalConfig:
    many_shot: int = MISSING
    few_shot: int = MISSING


@dataclass
class TrackingConfig:
    uri: str | None = MISSING
    experiment: str = MISSING
    plots: bool = MISSING
    reference: str | None = MISSING
    retries: int = MISSING
    request_timeout: int = MISSING
    log_model: bool = MISSING
    register: str | None = MISSING
    per_class_max: int = MISSING
    system_metrics: bool = MISSING


@dataclass
class FeaturesConfig:
    cache_dir: str | None = MISSING


@dataclass
class PrefixesConfig:
    share: bool = MISSING
    cache_dir: str | None = MISSING


@dataclass
class RunConfig:
    seed: int = MISSING
    resume: str | None = MISSING
    objective: str = MISSING
    objective_on_test: bool = MISSING
    data: Any = MISSING
    model: Any = MISSING
    sampler: Any = MISSING
    loss: Any = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    prefixes: PrefixesConfig = field(default_factory=PrefixesConfig)


def typed(node: Any, schema: type[T]) -> T:
    """A composed config node as the dataclass its schema types it by (``trainer``, ``eval``,
    ``tracking``): built once where a run starts, so that the loop, the evaluation and the
    recording read checked attributes, never the config itself."""
    value = OmegaConf.to_object(node) if isinstance(node, DictConfig) else node
    if not isinstance(value, schema):
        raise TypeError(f"expected a {schema.__name__} node, got {type(value).__name__}")
    return value


def trainer_config(**overrides: Any) -> TrainerConfig:
    """``conf/trainer/default.yaml`` with ``overrides``, typed by :class:`TrainerConfig`: the
    trainer recipe for code that builds a training state without composing a whole run."""
    recipe = OmegaConf.merge(
        OmegaConf.structured(TrainerConfig), OmegaConf.load(CONF / "trainer" / "default.yaml")
    )
    # A structured config reads as the dataclass it types (OmegaConf's documented cast).
    return cast(TrainerConfig, OmegaConf.merge(recipe, overrides))


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
# Keys of every model group that the runner reads itself: ``freeze`` (train the features or not)
# and ``head`` (linear | cosine). Neither reaches a model's constructor, except ``head`` where the
# constructor declares it (the runner's own models build their classifier from it).
MODEL_RUNNER_KEYS = ("freeze", "head")


# Keys that do not change what a run computes: they may differ between a run and its resumption,
# and between runs that are the same configuration (seeds aside).
RUNTIME_KEYS = (
    "resume",
    "objective",
    "objective_on_test",
    "tracking.uri",
    "tracking.retries",
    "tracking.request_timeout",
    "tracking.log_model",
    "tracking.plots",
    "tracking.register",
    "tracking.per_class_max",
    "tracking.system_metrics",
    "trainer.progress",
    "trainer.threads",
    "trainer.device",
    "data.num_workers",
    "data.in_memory",
    "data.memory_budget_gb",
    "features.cache_dir",
    "prefixes.share",  # a run forked from a shared prefix is bit-identical to one trained alone
    "prefixes.cache_dir",
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
    "tracking.log_model",
    "tracking.register",
    "tracking.per_class_max",
    "tracking.system_metrics",
    "features.cache_dir",
    "prefixes.share",
    "prefixes.cache_dir",
)
# Runtime keys since today's fingerprint was first computed, which it kept: a run recorded then
# is recognised by the computation that keeps them.
LATER_RUNTIME_KEYS = ("tracking.plots",)
ADDED_DEFAULTS = {"data.val_fraction": 0}  # keys added since, with the value runs had before
# Keys added to every config since today's fingerprint was first computed, with the behaviour runs
# had before them: left out of it at that value, so that those runs are still recognised.
NEUTRAL_DEFAULTS = {
    "trainer.backbone_lr": 1.0,
    "trainer.classifier_stage": "retrain",
    "trainer.classifier_stage_mode": "eval",
    "model.freeze": False,
}
# Keys that change nothing while another is 0 or false (the classifier stage's mode without
# classifier epochs): left out of the fingerprint then, whatever their value.
INERT_WITHOUT = {"trainer.classifier_stage_mode": "trainer.classifier_epochs"}
# Settings whose computation changed under the same config, and what it became: the fingerprint
# of a config with one carries the change, so that a resumed sweep does not take a run recorded
# before it for this config's (tau_norm: tau from 0..2, validation metrics cross-fitted).
REVISED = {
    ("trainer.classifier_stage", "tau_norm"): "tau cross-fitted on validation halves",
    # ClassWeightedLoss's beta default went from 0.999 to Cui et al.'s 0.9999: a config that
    # leaves loss.beta out computes otherwise under the same keys (one that states it is marked
    # too, which only costs a rerun).
    ("loss.weights", "effective"): "effective-number beta default 0.9999",
}


# Modules that moved since runs were first fingerprinted, new prefix -> old: a ``_target_`` in a
# moved module is fingerprinted by its old path, so that runs recorded before the move are still
# recognised, and a recorded config is read back with the new one (:func:`moved_targets`).
MOVED_MODULES = {"runner.train.losses.": "runner.losses."}


def _renamed(node: Any, renames: dict[str, str]) -> Any:
    """``node`` with every ``_target_`` starting with a key of ``renames`` given its value."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "_target_" and isinstance(value, str):
                for new, old in renames.items():
                    if value.startswith(new):
                        node[key] = old + value[len(new) :]
            else:
                _renamed(value, renames)
    return node


def moved_targets(plain: dict[str, Any]) -> dict[str, Any]:
    """A recorded config (plain containers) with the targets of moved modules at their new
    paths (:data:`MOVED_MODULES`), in place."""
    return _renamed(plain, {old: new for new, old in MOVED_MODULES.items()})  # type: ignore[no-any-return]


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """The config with every interpolation resolved, as plain containers."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def _drop(plain: dict[str, Any], key: str) -> Any:
    *path, last = key.split(".")
    parents, node = [], plain
    for part in path:
        parents.append(node)
        node = node.get(part, {})
    value = node.pop(last, None)
    if path and not node and path[-1] in parents[-1]:  # a node of runtime keys alone, gone
        del parents[-1][path[-1]]
    return value


def _fingerprint(plain: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _settle_for_fingerprint(plain: dict[str, Any], cfg: DictConfig) -> None:
    """Leave out the keys at the behaviour runs had before them, and those that change nothing
    in ``cfg``; mark the settings whose computation changed (:data:`REVISED`); name the targets
    of moved modules by their old paths (:data:`MOVED_MODULES`)."""
    _renamed(plain, MOVED_MODULES)
    for key, default in NEUTRAL_DEFAULTS.items():
        if OmegaConf.select(cfg, key) == default:
            _drop(plain, key)
    for key, switch in INERT_WITHOUT.items():
        if not OmegaConf.select(cfg, switch, default=None):
            _drop(plain, key)
    for (key, value), change in REVISED.items():
        if OmegaConf.select(cfg, key, default=None) == value:
            plain.setdefault("revised", {})[key] = change


def config_key(cfg: DictConfig, keep: tuple[str, ...] = ()) -> str:
    """A fingerprint of what the run computes (the config less :data:`RUNTIME_KEYS`, but for
    those in ``keep``): a resumed sweep recognises its finished jobs by it (tag ``config_key``)."""
    plain = resolved(cfg)
    for key in RUNTIME_KEYS:
        if key not in keep:
            _drop(plain, key)
    _settle_for_fingerprint(plain, cfg)
    return _fingerprint(plain)


def config_keys(cfg: DictConfig) -> set[str]:
    """The fingerprints a run of ``cfg`` may have been recorded with: today's, the one that kept
    :data:`LATER_RUNTIME_KEYS`, and the first computation's when ``cfg`` keeps the defaults of
    every key added since."""
    keys = {config_key(cfg), config_key(cfg, keep=LATER_RUNTIME_KEYS)}
    plain = resolved(cfg)
    for key in FIRST_RUNTIME_KEYS:
        _drop(plain, key)
    for key in ADDED_RUNTIME_KEYS:
        _drop(plain, key)
    _settle_for_fingerprint(plain, cfg)
    for key, default in ADDED_DEFAULTS.items():
        if _drop(plain, key) not in (None, default):
            return keys  # a setting runs recorded before could not have had
    keys.add(_fingerprint(plain))
    return keys
