"""A config's fingerprint (:func:`config_key`): what a run computes, less the keys that do not
change it (:data:`RUNTIME_KEYS`). A resumed sweep recognises its finished jobs by it (tag
``config_key``), so every change to what is fingerprinted keeps a history here: the keys added
since the first computation, the defaults runs had before a key existed, the computations that
changed under the same config, and the modules whose targets moved (:func:`config_keys` gives
every fingerprint a run of a config may have been recorded with)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runner.config import resolved

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
    "features.engine",  # onnxruntime gives torch's features within 1e-4; the bank shares them
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
    "features.engine",
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
    "eval.target_precision": 0.9,  # binary data's validation threshold: new metrics, same training
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
    return _renamed(plain, {old: new for new, old in MOVED_MODULES.items()})


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
