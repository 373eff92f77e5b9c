"""A race round's heads on cached features, trained at once in the sweep's process.

A job is a head on cached features when its config says so before anything is built
(:func:`is_head_job`: ``model.freeze=true``, ``trainer.augment=false``, ``model.head=linear``,
no classifier epochs, not a resumed job). Each such job goes through Hydra's ``run_job`` as the
basic launcher runs it (its output folder, its callbacks, its MLflow child run with the same
params, tags and datasets) but stops before training (:func:`runner.app.prepare`); then the
round's prepared runs train as stacked heads, one group per backbone and features
(:func:`runner.train.stacked.fit_stacked`: equal to each trained alone, up to float32 summation
order), and each run records its results and ends as it would alone
(:func:`runner.app.train_recorded`). What builds to something else (a dataset with no
augmentation to cache around, a cosine head, a sampler of whole batches) trains alone in this
process; every other job goes to the configured launcher.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from hydra.core.utils import JobReturn, JobStatus, run_job
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext
from omegaconf import DictConfig, open_dict

log = logging.getLogger("runner")


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

    def __init__(self, context: HydraContext, config: DictConfig, launcher: Launcher) -> None:
        self.context, self.config, self.launcher = context, config, launcher

    def __call__(self, batch: list[list[str]], first: int) -> Sequence[JobReturn]:
        configs = [self.context.config_loader.load_sweep_config(self.config, b) for b in batch]
        heads = [i for i, c in enumerate(configs) if is_head_job(c)]
        rest = [i for i in range(len(batch)) if i not in heads]
        returns: dict[int, JobReturn] = {}
        if rest:
            others = self.launcher.launch([batch[i] for i in rest], first + len(heads))
            returns.update(zip(rest, others, strict=True))
        if heads:
            print(f"samplerlab race: {len(heads)} head runs on cached features at once", flush=True)
            done = self._heads([configs[i] for i in heads], first)
            returns.update(zip(heads, done, strict=True))
        return [returns[i] for i in range(len(batch))]

    def _heads(self, configs: list[DictConfig], first: int) -> list[JobReturn]:
        from runner.app import Prepared

        prepared: list[JobReturn] = []
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
        ready = {
            i: ret._return_value
            for i, ret in enumerate(prepared)
            if ret.status == JobStatus.COMPLETED and isinstance(ret._return_value, Prepared)
        }
        outcomes = _train(ready)
        for i, ret in enumerate(prepared):
            if i in outcomes:
                _finish(ret, outcomes[i])
        return prepared


def _train(ready: dict[int, Any]) -> dict[int, Any]:
    """Train the prepared runs (:class:`runner.app.Prepared` by job index): those that stack,
    group by group; the rest alone. Returns each job's outcome: its objective, or the exception
    it ended with. A stop by a signal ends every run (KILLED, checkpointed), then stops the
    race."""
    from runner.app import train_recorded
    from runner.results import objective
    from runner.signals import Interrupted
    from runner.train.stacked import fit_stacked, share_inputs, stack_groups

    indices = list(ready)
    kept: list[Any] = []
    for i in indices:
        share_inputs(ready[i].run, kept)  # one copy of the features per backbone
    runs = [ready[i].run for i in indices]
    trained: dict[int, BaseException | None] = {}
    stop: Interrupted | None = None
    try:
        for group in stack_groups(runs):
            errors = fit_stacked([runs[g] for g in group])
            trained.update((indices[g], e) for g, e in zip(group, errors, strict=True))
    except Interrupted as stopped:
        stop = stopped
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
        except Interrupted:
            continue
        except Exception as error:
            outcomes[i] = error
    if stop is not None:
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
