"""A race round's heads on cached features, trained at once in the sweep's process.

A job is a head on cached features when its config says so before anything is built
(:func:`is_head_job`: ``model.freeze=true``, ``trainer.augment=false``, ``model.head=linear``,
no classifier epochs, not a resumed job). Each such job goes through Hydra's ``run_job`` as the
basic launcher runs it (its output folder, its callbacks, its MLflow child run with the same
params, tags and datasets) but stops before training (:func:`runner.app.prepare`; each seed's
data and frozen model built once for the round: :mod:`runner.reused_builds`); then the round's
prepared runs train as stacked heads, one group per backbone and features
(:func:`runner.train.stacked.fit_stacked`: equal to each trained alone, up to float32 summation
order), and each run records its results and ends as it would alone
(:func:`runner.app.train_recorded`). What builds to something else (a dataset with no
augmentation to cache around, a cosine head) trains alone in this process; every other job
goes to the configured launcher. Only with a launcher that runs jobs on this machine
(:data:`LOCAL_LAUNCHERS`; :func:`stacks_here`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from hydra.core.utils import JobReturn, JobStatus, configure_log, run_job
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext
from omegaconf import DictConfig, open_dict

from experiments.race.driver import SEED
from runner.reused_builds import reusing_builds
from runner.sweeps.callback import BASIC_LAUNCHER

log = logging.getLogger("runner")


# Launchers that run the jobs on this machine: there the sweep's process may train them itself.
# A remote launcher (Ray, Slurm) keeps every job, heads included, where it sends them.
LOCAL_LAUNCHERS = (
    BASIC_LAUNCHER,
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
)


def stacks_here(config: DictConfig) -> bool:
    """Whether a race with this multirun config trains its heads at once in this process:
    ``hydra.sweeper.stack_heads`` and a launcher that runs jobs on this machine."""
    hydra = config.hydra
    return bool(hydra.sweeper.stack_heads) and str(hydra.launcher._target_) in LOCAL_LAUNCHERS


def is_head_job(config: DictConfig) -> bool:
    """Whether a job's composed config trains a linear head on cached features, from the
    start: what may stack with others."""
    model, trainer = config.model, config.trainer
    return (
        bool(model.get("freeze", False))
        and not bool(trainer.augment)
        and str(model.get("head", "linear")) == "linear"
        and not int(trainer.classifier_epochs)
        and not config.get("resume")
    )


def _prepare_task(cfg: DictConfig) -> Any:
    """The job's task in ``run_job``: everything the runner does before training."""
    from runner.app import prepare
    from runner.checks import check_targets

    check_targets(cfg)
    return _logged(lambda: prepare(cfg))


def _logged(action: Callable[[], Any]) -> Any:
    """``action()``; a user error is logged as the runner's app logs one in a sweep."""
    from runner.errors import UserError
    from runner.explain import explain

    try:
        return action()
    except UserError as error:
        log.error("samplerlab: %s", explain(error))
        raise


class StackedLaunch:
    """``launch(batch, first_index)`` for the race driver: head jobs stacked here, the others
    through ``launcher``; the returns in the batch's order."""

    def __init__(
        self,
        context: HydraContext,
        config: DictConfig,
        launcher: Launcher,
        configs: Callable[[list[str]], DictConfig],
    ) -> None:
        """``configs(overrides)``: a job's config as the launcher composes it
        (:class:`experiments.race.job_configs.JobConfigs`)."""
        self.context, self.config, self.launcher = context, config, launcher
        self.configs = configs
        self.kinds: dict[tuple[str, ...], bool] = {}  # by candidate: are its jobs heads?

    def _is_head(self, overrides: list[str]) -> bool:
        """Whether the job trains a head on cached features: decided once per candidate (its
        overrides but the seed), from its first job's composed config."""
        candidate = tuple(o for o in overrides if not o.startswith(f"{SEED}="))
        if candidate not in self.kinds:
            self.kinds[candidate] = is_head_job(self.configs(overrides))
        return self.kinds[candidate]

    def __call__(self, batch: list[list[str]], first: int) -> Sequence[JobReturn]:
        heads = [i for i, overrides in enumerate(batch) if self._is_head(overrides)]
        rest = [i for i in range(len(batch)) if i not in heads]
        returns: dict[int, JobReturn] = {}
        here = str(self.config.hydra.launcher._target_) == BASIC_LAUNCHER
        if rest and not here:  # joblib's workers build their own: all at once, in parallel
            others = self.launcher.launch([batch[i] for i in rest], first + len(heads))
            returns.update(zip(rest, others, strict=True))
        if heads:
            print(f"samplerlab race: {len(heads)} head runs on cached features at once", flush=True)
        prepared: list[JobReturn] = []
        kept: list[Any] = []  # one copy of the features and backbone per backbone, as built
        try:
            # Seed by seed (the batch's runs of one seed): the jobs the basic launcher runs in
            # this process, then the heads to prepare. Each seed's data, backbone and features
            # are read once for all of them; only the latest seed's build is kept.
            with reusing_builds():
                for segment in _by_seed(batch):
                    mine = [i for i in segment if i in rest] if here else []
                    if mine:
                        number = first + len(heads) + rest.index(mine[0])
                        others = self.launcher.launch([batch[i] for i in mine], number)
                        returns.update(zip(mine, others, strict=True))
                    own = [i for i in segment if i in heads]
                    if own:
                        configs = [self.configs(batch[i]) for i in own]
                        self._prepare(configs, first + heads.index(own[0]), prepared, kept)
        except BaseException as stop:  # a signal (run_job returns exceptions): end those opened
            _train(_ready(prepared), stop)
            raise
        if heads:
            returns.update(zip(heads, self._train_heads(prepared), strict=True))
        return [returns[i] for i in range(len(batch))]

    def _train_heads(self, prepared: list[JobReturn]) -> list[JobReturn]:
        """The prepared heads trained (stacked where they can), each job's return completed."""
        # As the basic launcher does after each job: the epochs' log lines of every head go
        # to the sweep's log, not into the last prepared job's file.
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        outcomes = _train(_ready(prepared))
        for i, ret in enumerate(prepared):
            if i in outcomes:
                _finish(ret, outcomes[i])
        return prepared

    def _prepare(
        self, configs: list[DictConfig], first: int, prepared: list[JobReturn], kept: list[Any]
    ) -> None:
        """Each job through ``run_job`` up to training, its return appended to ``prepared``;
        the runs' features and backbones shared through ``kept``."""
        from runner.train.stacked import share_inputs

        for number, config in enumerate(configs, start=first):
            with open_dict(config):
                config.hydra.job.id = number
                config.hydra.job.num = number
            prepared.append(
                run_job(
                    hydra_context=self.context,
                    task_function=_prepare_task,
                    config=config,
                    job_dir_key="hydra.sweep.dir",
                    job_subdir_key="hydra.sweep.subdir",
                )
            )
            for ready in _ready(prepared[-1:]).values():
                share_inputs(ready.run, kept)


def _by_seed(batch: list[list[str]]) -> list[list[int]]:
    """The batch's indices cut where the seed changes: the runs of jobs of one seed, in order."""
    segments: list[list[int]] = []
    last: object = object()
    for i, overrides in enumerate(batch):
        seed = next((o for o in overrides if o.startswith(f"{SEED}=")), None)
        if not segments or seed != last:
            segments.append([])
        segments[-1].append(i)
        last = seed
    return segments


def _ready(prepared: list[JobReturn]) -> dict[int, Any]:
    """The jobs whose run is prepared (:class:`runner.app.Prepared`), by index."""
    from runner.app import Prepared

    return {
        i: ret.return_value
        for i, ret in enumerate(prepared)
        if ret.status == JobStatus.COMPLETED and isinstance(ret.return_value, Prepared)
    }


def _train(ready: dict[int, Any], stop: BaseException | None = None) -> dict[int, Any]:
    """Train the prepared runs (:class:`runner.app.Prepared` by job index): those that stack,
    group by group; the rest alone. Returns each job's outcome: its objective, or the exception
    it ended with (the race reads a failure or a crash from it). Given ``stop``, or stopped by a
    signal, every run ends with it (KILLED by a signal, checkpointed where the signal found a
    safe point), and a signal is raised again to stop the race."""
    from runner.app import train_recorded
    from runner.results import objective
    from runner.train.stacked import fit_stacked, stack_groups

    indices = list(ready)
    runs = [ready[i].run for i in indices]
    trained: dict[int, BaseException | None] = {}
    try:
        for group in stack_groups(runs) if stop is None else []:
            errors = fit_stacked([runs[g] for g in group])
            trained.update((indices[g], e) for g, e in zip(group, errors, strict=True))
    except BaseException as error:  # a signal, or a crash: every run ends with it
        stop = error
    outcomes: dict[int, Any] = {}
    for i in indices:
        if stop is not None:
            train = _raising(stop)
        elif i in trained:
            train = _raising(trained[i])
        else:
            train = None  # it does not stack: trained alone by the runner's loop
        try:
            results = _logged(partial(train_recorded, ready[i], train))
            outcomes[i] = objective(ready[i].cfg, results)
        except Exception as error:
            outcomes[i] = error
        except BaseException as signal:  # stopped: the runs after it end KILLED too
            stop = stop or signal
    if stop is not None and not isinstance(stop, Exception):
        raise stop
    return outcomes


def _raising(error: BaseException | None) -> Callable[[Any], int]:
    """The ``train`` of a run trained already: nothing to do, or its error raised."""

    def train(run: Any) -> int:
        if error is not None:
            raise error
        return 0

    return train


def _finish(ret: JobReturn, outcome: Any) -> None:
    """The job's return as the basic launcher would have made it: the objective, or the error
    (which the race reads as a candidate's failure or a crash)."""
    ret.return_value = outcome
    ret.status = JobStatus.FAILED if isinstance(outcome, BaseException) else JobStatus.COMPLETED
