"""One run, wired: config -> dataset -> sampler -> batches -> model -> metrics -> tracking.

:func:`run` checks the config and the store, finds what ``resume=`` continues, builds the parts
(:mod:`runner.build`), opens or reopens the MLflow run, trains (:mod:`runner.train.fit`; in a sweep, sharing a prefix: :mod:`runner.sweeps.prefixes`) and records
the results (:mod:`runner.results`), and ends the run with the status it earned: FINISHED,
FAILED, or KILLED when stopped by a signal (checkpointed; ``resume=<run id>`` continues it).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig

from runner.build import build_parts
from runner.checks import check_objective
from runner.distributed import backend, command, from_main, is_main
from runner.errors import EnvironmentFailure, UserError
from runner.explain import explain, is_user_error
from runner.job import active_sweeper, checkpoint_path, choices, discard_if_temporary
from runner.results import RESULT_PREFIXES, record_results, summary_text
from runner.resume import resume_target, saved_checkpoint, without_client
from runner.signals import Interrupted, stop_on_signals
from runner.sweeps.callback import job_parent
from runner.sweeps.prefixes import FORKED_TAG, Entry, fit_sharing, sweep_entry
from runner.tracking import Bystander, Tracker, start_run
from runner.tracking.environment import environment, system_metrics
from runner.tracking.stores import StoreLost, bound_http_retries, prepare_store, resolve_uri
from runner.train.fit import Diverged, fit
from runner.train.recorder import Recorder
from runner.train.run import Progress, RunContext, flush
from runner.train.state import total_epochs

log = logging.getLogger("runner")

FAILURE_TAG = "failure"  # why a run ended FAILED, when the failure is the user's to fix


def failure_reason(error: BaseException) -> str | None:
    """Why a run that raised ``error`` failed, in a few words ("diverged at epoch 2", or the
    first line of the user error), when the configuration is to blame: a divergence or a setting
    its data or model cannot take. None for a crash (a bug) or a failure of where it ran (a lost
    store, a full disk: :class:`runner.errors.EnvironmentFailure`)."""
    cause = error if isinstance(error, Diverged) else error.__cause__
    if isinstance(cause, Diverged):
        return f"diverged at epoch {cause.epoch + 1}"
    if is_user_error(error) and not isinstance(error, EnvironmentFailure):
        return explain(error).splitlines()[0]
    return None


@dataclass
class Prepared:
    """A run ready to train: its config, its parts and record (``run``), whether it resumes,
    where it meets the jobs of its sweep that share a prefix (``entry``), the epochs a resumed
    run forked from another's."""

    cfg: DictConfig
    run: RunContext
    resumed: bool
    entry: Entry | None
    forked: int


def run(cfg: DictConfig) -> dict[str, float]:
    """Train and evaluate one configuration (or continue one with ``resume``); returns the
    results: the final test metrics (``final/``) and the last evaluation's headline metrics
    (``test/``, and ``val/`` with a validation split), from which
    :func:`runner.results.objective` reads."""
    prepared = prepare(cfg)
    if isinstance(prepared, dict):
        return prepared
    return train_recorded(prepared)


def prepare(cfg: DictConfig) -> Prepared | dict[str, float]:
    """Everything :func:`run` does before training: check the config and the store, find what
    ``resume=`` continues (a run that finished: its results, returned as they are), build the
    parts and restore a checkpoint, open or reopen the MLflow run."""
    check_objective(cfg, active_sweeper())
    uri = resolve_uri(cfg.tracking.uri)
    bound_http_retries(cfg.tracking.retries, cfg.tracking.request_timeout)
    from_main(lambda: prepare_store(uri))  # under torchrun rank 0 decides, the others follow
    previous = None
    if cfg.resume:
        cfg, previous = from_main(lambda: resume_target(cfg, uri), without_client)
        if previous is not None and previous.status == "FINISHED":
            print(f"samplerlab: run {previous.run_id} already finished; nothing to resume")
            return {k: v for k, v in previous.metrics.items() if k.startswith(RESULT_PREFIXES)}
        if previous is not None and previous.via_parent and FAILURE_TAG in previous.tags:
            # The same config fails the same way: a resumed sweep (a race) gets the recorded
            # failure back at once instead of training into it again.
            raise UserError(
                f"{previous.tags[FAILURE_TAG]}\n"
                f"recorded by run {previous.run_id} of this sweep; not run again"
            )
    parts = build_parts(cfg)
    progress = Progress()
    # A new run of a sweep may fork from the training it shares with others (runner.sweeps).
    entry = sweep_entry(cfg, parts, job_parent()) if previous is None else None
    forked = int(previous.tags.get(FORKED_TAG, 0)) if previous is not None else 0
    if previous is not None:  # before the run reopens: a checkpoint that fails leaves it as it was
        checkpoint = from_main(lambda: saved_checkpoint(previous))
        if checkpoint is not None:
            parts.state.load_state_dict(checkpoint["train"])
            progress.load_state_dict(checkpoint["progress"])
    with stop_on_signals():
        recorder: Recorder
        if previous is not None:
            recorder = from_main(lambda: Tracker.reopen(uri, previous.run_id), Bystander.of)
            path = checkpoint_path(recorder.run_id, previous.tags.get("checkpoint"))
        else:
            names, overrides = choices(cfg)
            recorder = from_main(
                lambda: start_run(cfg, parts.stored_data, names, overrides, job_parent()),
                Bystander.of,
            )
            path = checkpoint_path(recorder.run_id)
    run = RunContext(parts, recorder, progress, path)
    return Prepared(cfg, run, previous is not None, entry, forked)


Train = Callable[[RunContext], int]  # trains a run; returns the epochs it forked from another's


def train_recorded(prepared: Prepared, train: Train | None = None) -> dict[str, float]:
    """Train the prepared run (``train``, by default :func:`runner.train.fit.fit`, sharing a
    prefix through its entry; a caller that trained it already passes one that returns or
    raises what that training did), record the results, and end the run with the status it
    earned: FINISHED, FAILED (a failure tag with the reason when the config is to blame), or
    KILLED when stopped by a signal (checkpointed)."""
    with stop_on_signals():
        return _train_recorded(prepared, train)


def _train_recorded(prepared: Prepared, train: Train | None) -> dict[str, float]:
    cfg, run, forked = prepared.cfg, prepared.run, prepared.forked
    started = time.perf_counter()
    parts, recorder, progress = run.parts, run.recorder, run.progress
    try:
        if prepared.resumed:
            recorder.log_rows(progress.unlogged)  # what a lost store did not take, at last
            progress.unlogged = []
            run.logged_through = recorder.last_step("train/loss") or 0
            log.info(
                "resuming run %s at epoch %d%s",
                recorder.run_id,
                parts.state.epoch + 1,
                f", batch {parts.state.batch + 1}" if parts.state.batch else "",
            )
        how = environment(parts.device, parts.state.world_size, backend())
        recorder.set_tags({"checkpoint": str(run.path), **how})  # a resumed run: how it ran last
        with system_metrics(parts.tracking, recorder, prepared.resumed):
            if train is not None:
                forked = train(run) or forked
            elif prepared.entry is None:  # one run, or a sweep's job that shares no epoch
                fit(run)
            else:
                forked = fit_sharing(prepared.entry, run) or forked
            results = record_results(run, forked)
            flush(recorder)  # here a lost store is caught below: the rows go into the checkpoint
    except Interrupted as stop:
        if stop.safe:
            run.save_checkpoint()
        recorder.finish("KILLED")
        # The epoch under way; after the last one trained, that one (its evaluation or refit).
        stopped_in = min(parts.state.epoch + 1, total_epochs(parts.trainer))
        if is_main():  # under torchrun, one line for the whole run
            print(
                f"samplerlab: stopped by {stop.signal_name} at epoch {stopped_in}; "
                f"run {recorder.run_id} is KILLED; continue it with: {_again(cfg, recorder)}",
                file=sys.stderr,
                flush=True,
            )
        raise
    except StoreLost as lost:  # the run cannot be ended there: it stays RUNNING until resumed
        progress.unlogged.extend(lost.unlogged)
        run.save_checkpoint()
        then = (
            f"run {recorder.run_id} checkpointed to {run.path}; once the store answers again, "
            f"continue it with: {_again(cfg, recorder)}"
        )
        raise StoreLost(f"{lost}\n{then}", lost.unlogged) from None
    except BaseException as error:
        reason = failure_reason(error)
        if reason is not None:
            recorder.set_tags({FAILURE_TAG: reason})
        recorder.finish("FAILED")
        raise
    recorder.finish("FINISHED")
    if is_main():
        discard_if_temporary(run.path)
    print(summary_text(run, time.perf_counter() - started), flush=True)
    return results


def _again(cfg: DictConfig, recorder: Recorder) -> str:
    """The command that continues this run."""
    again = f"{command()} resume={recorder.run_id}"
    return again + (f" tracking.uri={cfg.tracking.uri}" if cfg.tracking.uri else "")
