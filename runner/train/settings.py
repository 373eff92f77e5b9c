"""The typed settings the training core reads (``trainer``, ``eval``, ``tracking``): plain
dataclasses, which :mod:`runner.config` puts in Hydra's ConfigStore as the schema of those
groups, so that the core reads checked attributes and never imports Hydra or OmegaConf."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# OmegaConf's marker of a value the config must supply (``omegaconf.MISSING`` is this string):
# the schema types every key, and the values, defaults included, live in runner/conf/ alone.
MISSING: Any = "???"

# Keys of every model group that the runner reads itself: ``freeze`` (train the features or not)
# and ``head`` (linear | cosine). Neither reaches a model's constructor, except ``head`` where the
# constructor declares it (the runner's own models build their classifier from it).
MODEL_RUNNER_KEYS = ("freeze", "head")

# The headline metrics every evaluation reports; an objective is one of them on a split.
HEADLINE = (
    "accuracy",
    "balanced_accuracy",
    "macro_f1",
    "many_accuracy",
    "medium_accuracy",
    "few_accuracy",
)


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
    target_precision: float = MISSING


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
