"""A race's job configs, each candidate's composed once.

A race's jobs differ from one another in their candidate's overrides and their seed. Hydra's
launcher composes every job from scratch (``load_sweep_config``: the defaults tree, every YAML
read and merged; a quarter of a second each), so a race of 12 candidates over 3 seeds composed
the same 12 configs three times, and once more to check them. :class:`JobConfigs` composes a
candidate's first job as the launcher does, and gives every other seed of it that config with
the seed's own values in the three places a ``seed=...`` override writes:

- the ``seed`` key itself (what an override sets: ``_apply_overrides_to_config``; everything
  else that depends on the seed reads it through an interpolation, resolved on use);
- ``hydra.overrides.task``, the job's overrides in order;
- ``hydra.job.override_dirname``, the overrides sorted and joined (the seed's item keeps its
  place among them, since every seed's item begins with the same ``seed=``).

Where a config would not show those places as expected (a custom ``override_dirname`` that
shows the seed twice, say), the job is composed as the launcher would compose it.

    >>> from omegaconf import OmegaConf
    >>> config = OmegaConf.create({"seed": 0, "hydra": {"overrides": {"task": ["a=1", "seed=0"]},
    ...     "job": {"override_dirname": "a=1,seed=0",
    ...             "config": {"override_dirname": {"kv_sep": "=", "item_sep": ",",
    ...                                             "exclude_keys": []}}}}})
    >>> other = with_seed(config, 0, 7)
    >>> other.seed, list(other.hydra.overrides.task), other.hydra.job.override_dirname
    (7, ['a=1', 'seed=7'], 'a=1,seed=7')
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from omegaconf import DictConfig

from experiments.race.driver import SEED

Compose = Callable[[list[str]], DictConfig]


class JobConfigs:
    """``configs(overrides)``: the job's config, as ``compose(overrides)`` gives it (Hydra's
    ``load_sweep_config`` against the multirun config), composed once per candidate. Overrides
    are a race job's (:meth:`experiments.race.driver.Plan.job`): ``seed=<int>`` last. Every call
    returns a config of its own (the launcher writes the job's number and output folder in it)."""

    def __init__(self, compose: Compose) -> None:
        self.compose = compose
        self.composed: dict[tuple[str, ...], tuple[int, DictConfig]] = {}

    def __call__(self, overrides: list[str]) -> DictConfig:
        *candidate, last = overrides
        key, _, value = last.partition("=")
        if key != SEED or not value.lstrip("-").isdigit():
            return self.compose(overrides)
        seed = int(value)
        known = self.composed.get(tuple(candidate))
        if known is not None:
            return with_seed(known[1], known[0], seed) or self.compose(overrides)
        config = self.compose(overrides)
        own = with_seed(config, seed, seed)
        if own is None:  # its other seeds are composed too
            return config
        self.composed[tuple(candidate)] = (seed, config)  # kept unchanged: a copy goes out
        return own


def with_seed(config: DictConfig, old: int, new: int) -> DictConfig | None:
    """A copy of ``config``, a job's composed with the override ``seed=<old>`` last, as it would
    have been composed with ``seed=<new>``; None where the config does not show the seed where
    an override writes it (see the module's docstring)."""
    if config.get(SEED) != old:
        return None
    task = list(config.hydra.overrides.task)
    line = f"{SEED}={old}"
    if task.count(line) != 1 or task[-1] != line:
        return None
    job = config.hydra.job
    dirname = str(job.override_dirname)
    naming = job.config.override_dirname
    new_dirname = dirname
    if SEED not in naming.exclude_keys:
        kv, sep = str(naming.kv_sep), str(naming.item_sep)
        if not sep:  # the items run together: the seed's cannot be told apart
            return None
        items = dirname.split(sep)
        shown = f"{SEED}{kv}{old}"
        if items.count(shown) != 1:
            return None
        items[items.index(shown)] = f"{SEED}{kv}{new}"
        new_dirname = sep.join(items)
    other = copy.deepcopy(config)
    other[SEED] = new
    other.hydra.overrides.task[-1] = f"{SEED}={new}"
    other.hydra.job.override_dirname = new_dirname
    return other
