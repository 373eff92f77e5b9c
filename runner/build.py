"""A run's parts built from its config (:func:`build_parts`): each group's object instantiated
with what the runner supplies, checked, and put together as the training core's
:class:`runner.train.run.Parts`. The boundary between the Hydra config and the core."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig, OmegaConf

from runner import cache_dirs
from runner.checks import accepted_parameters, check_targets
from runner.config import OPTIONAL_SUPPLIED, SUPPLIED, typed
from runner.data import LongTailData
from runner.distributed import check_batch_size, data_parallel
from runner.errors import UserError
from runner.models import FeatureClassifier
from runner.models.adopt import as_feature_classifier
from runner.reused_builds import reused
from runner.train.features import FrozenInputs, freeze_backbone
from runner.train.feed import place
from runner.train.onnx_engine import check_engine
from runner.train.run import Parts
from runner.train.settings import MODEL_RUNNER_KEYS, EvalConfig, TrackingConfig, TrainerConfig
from runner.train.stages import stage_for
from runner.train.state import build_state
from samplers import Sampler


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "config error at 'trainer.device': cuda requested but no CUDA device is available; use trainer.device=auto"
        )
    return torch.device(name)


def build(group: str, node: DictConfig, **supplied: Any) -> Any:
    """``instantiate`` one group's object with the arguments the runner supplies (those
    :data:`runner.config.SUPPLIED` names, which the config check refuses from the config: all
    of them, but for a model only those its constructor takes); a bad value comes out as a
    :class:`UserError` naming the group."""
    assert set(supplied) <= SUPPLIED[group], f"{group}: supplied {sorted(supplied)}"
    required = SUPPLIED[group] - OPTIONAL_SUPPLIED.get(group, set())
    assert group == "model" or set(supplied) >= required, f"{group}: {sorted(supplied)}"
    try:
        return instantiate(node, **supplied, _convert_="all")
    except InstantiationException as wrapped:
        cause = wrapped.__cause__
        if isinstance(cause, UserError):
            raise cause from None
        if isinstance(cause, (ValueError, TypeError, FileNotFoundError)):
            raise UserError(f"{group} ({node._target_}): {cause}") from cause
        raise


def build_model(node: DictConfig, in_shape: tuple[int, ...], num_classes: int) -> FeatureClassifier:
    """The model group's module as a :class:`FeatureClassifier`: its constructor gets
    ``num_classes``, ``in_shape`` where it takes it, and the config's keys less the runner's own
    (:data:`runner.train.settings.MODEL_RUNNER_KEYS`); ``model.head`` is applied after it where the
    constructor does not take it."""
    target = node._target_
    accepted = accepted_parameters(get_method(target))
    passed = [str(k) for k in node if k not in MODEL_RUNNER_KEYS or k in accepted]
    supplied: dict[str, Any] = {"num_classes": num_classes}
    if "in_shape" in accepted:
        supplied["in_shape"] = in_shape
    model = build("model", OmegaConf.masked_copy(node, passed), **supplied)
    head = None if "head" in accepted else str(node.get("head", "linear"))
    try:
        return as_feature_classifier(model, num_classes, head, target, in_shape)
    except ValueError as error:
        raise UserError(f"model ({target}): {error}") from None


def build_parts(cfg: DictConfig) -> Parts:
    """Validate the config and build every object, so that a bad value fails here; the loop
    gets typed parts (:attr:`Parts.trainer` and the others), not the config."""
    check_targets(cfg)
    trainer = typed(cfg.trainer, TrainerConfig)
    check_batch_size(trainer.batch_size)
    device = _device(trainer.device)
    if trainer.threads:
        torch.set_num_threads(trainer.threads)
    torch.manual_seed(cfg.seed)

    # Runs prepared together (a race round's heads) build what they share once (reused_builds).
    def data_key() -> tuple[str, ...]:
        return _resolved(cfg.data), str(device)

    data: LongTailData = reused(
        "data", data_key, lambda: place(build("data", cfg.data), device), dataclasses.replace
    )  # in memory or a DataLoader
    sampler: Sampler = build("sampler", cfg.sampler, labels=data.train_y)
    stage = stage_for(trainer)

    def model_and_features() -> tuple[FeatureClassifier, LongTailData, FrozenInputs | None]:
        model = build_model(cfg.model, data.in_shape, data.num_classes)
        inputs = dataclasses.replace(data)
        if model.unit_input and inputs.normalize is not None:  # the model standardises itself
            channels = len(inputs.normalize[0])
            inputs.normalize = ([0.0] * channels, [1.0] * channels)
        stage.check_built(model, inputs.val_y)  # the built split and model: refused now
        if not cfg.model.get("freeze", False):
            return model, inputs, None
        return freeze(model, inputs, cfg, device)  # the head alone trains, on cached features

    def model_key() -> tuple[str, ...]:
        return *data_key(), _resolved(cfg.model), _resolved(cfg.features), str(trainer.augment)

    model, data, frozen = reused("model", model_key, model_and_features, _own_model)
    stage.check_built(model, data.val_y)  # also where an earlier run built them
    weights = getattr(sampler, "class_loss_weights", None)  # the hybrid strategy's
    rows = {}  # the number of training samples, for the losses that take it (multi-label)
    if "train_size" in accepted_parameters(get_method(cfg.loss._target_)):
        rows["train_size"] = len(data.train_y)
    loss_fn = build(
        "loss",
        cfg.loss,
        class_counts=data.train_counts,
        sampler_weights=weights() if weights is not None else None,
        epochs=trainer.epochs,
        **rows,
    )
    state = build_state(model.to(device), sampler, trainer, cfg.seed)
    state.parallel = data_parallel(state.model, device)  # under torchrun
    return Parts(
        data,
        sampler,
        loss_fn.to(device),
        state,
        device,
        trainer,
        typed(cfg.eval, EvalConfig),
        typed(cfg.tracking, TrackingConfig),
        str(cfg.model.get("head", "linear")),
        frozen,
    )


def _resolved(node: DictConfig) -> str:
    """A config node's resolved values, as a key (in the node's order: keys of mixed types
    cannot be sorted)."""
    return json.dumps(OmegaConf.to_container(node, resolve=True), default=str)


def _own_model(
    built: tuple[FeatureClassifier, LongTailData, FrozenInputs | None],
) -> tuple[FeatureClassifier, LongTailData, FrozenInputs | None]:
    """A run's own model (it trains it) and data object; the tensors and the frozen backbone
    are read only, and shared."""
    model, data, frozen = built
    return copy.deepcopy(model), dataclasses.replace(data), frozen


def freeze(
    model: FeatureClassifier, data: LongTailData, cfg: DictConfig, device: torch.device
) -> tuple[FeatureClassifier, LongTailData, FrozenInputs | None]:
    """:func:`runner.train.features.freeze_backbone` with ``cfg``'s settings: the model group's
    resolved config, ``trainer.augment``, the cache folder (:func:`feature_cache`) and
    ``features.engine`` (checked first: a wrong one is a :class:`UserError`)."""
    engine = str(cfg.features.get("engine", "torch"))
    check_engine(engine)
    # The model node alone: the whole config holds Hydra's keys, some resolvable only in a job.
    node = OmegaConf.to_container(cfg.model, resolve=True)
    assert isinstance(node, dict)
    model_cfg = {str(k): v for k, v in node.items()}
    augment = bool(cfg.trainer.augment)
    return freeze_backbone(model, data, model_cfg, augment, feature_cache(cfg), device, engine)


def feature_cache(cfg: DictConfig) -> Path:
    """Where frozen backbones' features are cached: ``features.cache_dir``, or (null) the user's
    cache folder (:mod:`runner.cache_dirs`), never the source tree."""
    return Path(cfg.features.cache_dir or cache_dirs.folder("features")).expanduser()
