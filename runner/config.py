"""The config schema: dataclasses in Hydra's ConfigStore, so a typo or a wrong type fails at
composition, naming the key, before any work is done (values are checked in
:mod:`runner.checks`); the keys that do not change what a run computes and the fingerprint of the rest are
:mod:`runner.fingerprint`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from runner.train.settings import (
    EvalConfig,
    TrackingConfig,
    TrainerConfig,
)

OBJECTIVE_SPLITS = ("val", "test", "final")  # final/: the test set's last evaluation
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
CONF = Path(__file__).resolve().parent / "conf"  # package data: every config YAML
T = TypeVar("T")

# The schema gives every key its type; the values, defaults included, live in conf/ alone
# (conf/trainer/default.yaml, conf/config.yaml, conf/tracking/local.yaml): one source each.


@dataclass
class FeaturesConfig:
    cache_dir: str | None = MISSING
    engine: str = MISSING


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


# Arguments the runner supplies itself when it builds each group's object (runner.build.build
# builds with exactly these, so the check and the build cannot drift apart).
SUPPLIED: dict[str, set[str]] = {
    "data": set(),
    "model": {"in_shape", "num_classes"},
    "sampler": {"labels"},
    "loss": {"class_counts", "sampler_weights", "epochs", "train_size"},
}
# Supplied only to the objects whose constructor takes them (the others' sets are all-or-none).
OPTIONAL_SUPPLIED = {"model": {"in_shape"}, "loss": {"train_size"}}


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """The config with every interpolation resolved, as plain containers."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
