"""What ``hydra/sweeper=race`` does, apart from being a Hydra plugin: turn the sweep's overrides
into candidates and seeds, launch the race round by round through the configured launcher, and
publish the answer on the sweep's parent run.

**Candidates** are the combinations of every swept override (``hydra.sweeper.params`` and the
command line: ``sampler=uniform,weighted sampler.q=0,0.5`` is four candidates). **Seeds** are the
replicates: ``seed=...`` among the sweeps lists them in the order the race uses them (and caps
``max_seeds`` at their number), otherwise they are 0, 1, ... ``max_seeds - 1``. Every other
override goes to every job. Each job returns the run's objective to the sweeper
(``runner.results.objective``; higher is better).

**Stopped and resumed.** The race relaunches the same rounds with ``resume=<parent id>``: a job
whose run already FINISHED under that parent with the same config returns its stored objective
without training, one that was stopped continues from its checkpoint, so the rounds replay to
the same decisions and the race goes on from its last complete round.

**A failing candidate.** A job that fails with a user-level error (it diverged, or a setting
does not fit its data or model: :func:`runner.app.failure_reason`) takes its candidate out of
the race with that reason, and the race goes on with the others; its run ends FAILED with the
reason in its ``failure`` tag, which a resumed race gets back without training again. Any other
exception is a crash (a bug) and stops the race, as in Hydra's basic sweeper.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.types import Override
from hydra.core.utils import JobReturn

from experiments.race.race import Race, Round
from experiments.race.sentence import look_text
from experiments.race.settings import RaceSettings
from runner.errors import UserError
from runner.explain import explain, is_user_error

SEED = "seed"  # the override that names a replicate


@dataclass(frozen=True)
class Plan:
    """Candidates (label -> their overrides), the seeds in order, and the overrides every job
    gets."""

    candidates: dict[str, tuple[str, ...]]
    seeds: tuple[int, ...]
    fixed: tuple[str, ...]

    def job(self, candidate: str, seed: int) -> list[str]:
        return [*self.fixed, *self.candidates[candidate], f"{SEED}={seed}"]


def _label(assignments: Sequence[tuple[str, str]], alone: bool) -> str:
    """``weighted`` for one swept key; ``sampler=weighted sampler.q=0.5`` for several."""
    if alone:
        return assignments[0][1]
    return " ".join(f"{key.lstrip('+~')}={value}" for key, value in assignments)


def plan_from(overrides: Sequence[Override], max_seeds: int) -> Plan:
    """The race's candidates, seeds and fixed overrides from the sweep's parsed overrides (the
    later of two overrides of one key wins, as in Hydra's basic sweeper)."""
    swept: dict[str, list[str]] = {}
    fixed: dict[str, str] = {}
    for override in overrides:
        key = override.get_key_element()
        swept.pop(key, None)
        fixed.pop(key, None)
        if override.is_sweep_override():
            if not override.is_discrete_sweep():
                raise UserError(
                    f"{override.input_line}: the race sweeper needs a list of values to race "
                    "(a,b,c or range(...)), not an interval\nlist the candidates"
                )
            swept[key] = list(override.sweep_string_iterator())
        else:
            fixed[key] = f"{key}={override.get_value_element_as_str()}"
    seeds = tuple(range(max_seeds))
    if SEED in swept:
        try:
            seeds = tuple(int(v) for v in swept.pop(SEED))
        except ValueError as error:
            raise UserError(f"seed: the race's seeds must be integers ({error})") from error
    if SEED in fixed:
        raise UserError(
            f"{fixed[SEED]}: the race chooses the seeds (they are its replicates)\n"
            "drop it, or give the seeds to race on as a list: seed=0,1,2,3,4"
        )
    if not swept:
        raise UserError(
            "the race sweeper has nothing to race: no override lists candidates\n"
            "e.g. python -m runner -m hydra/sweeper=race sampler=uniform,weighted,hybrid"
        )
    keys = list(swept)
    candidates = {}
    for values in itertools.product(*(swept[k] for k in keys)):
        pairs = list(zip(keys, values, strict=True))
        candidates[_label(pairs, len(keys) == 1)] = tuple(f"{k}={v}" for k, v in pairs)
    return Plan(candidates, seeds, tuple(fixed.values()))


def new_race(plan: Plan, settings: RaceSettings) -> Race:
    """The race, or a user error naming the ``hydra.sweeper`` setting that makes it impossible."""
    if len(plan.candidates) < 2:
        raise UserError(
            f"the race needs at least 2 candidates, got {list(plan.candidates)}\n"
            "list several values, e.g. sampler=uniform,weighted"
        )
    if len(plan.seeds) < settings.min_seeds:
        raise UserError(
            f"hydra.sweeper.min_seeds={settings.min_seeds} but only {len(plan.seeds)} seeds "
            f"are listed ({list(plan.seeds)})\nlist more seeds or lower hydra.sweeper.min_seeds"
        )
    try:
        return Race(list(plan.candidates), plan.seeds, settings)
    except ValueError as error:
        raise UserError(f"hydra.sweeper: {error}\nchange that setting") from error


def check_candidates(plan: Plan, check: Callable[[list[str]], None]) -> None:
    """Every candidate's first job through ``check`` (which composes its config and runs the
    runner's checks on it) before any job runs: a bad candidate is refused in one or two lines
    that name it, rather than after the others trained."""
    for candidate, overrides in plan.candidates.items():
        try:
            check(plan.job(candidate, plan.seeds[0]))
        except Exception as error:
            if not is_user_error(error):
                raise
            raise UserError(f"race candidate {' '.join(overrides)}: {explain(error)}") from error


def parent_of(callbacks: Any) -> tuple[str, str] | None:
    """(store URI, parent run id) of the sweep, from the callback that opened the parent run
    (runner.sweeps.callback.SweepCallback keeps them as ``uri`` and ``parent_run_id``)."""
    for callback in getattr(callbacks, "callbacks", None) or []:
        uri, parent = getattr(callback, "uri", None), getattr(callback, "parent_run_id", None)
        if uri and parent:
            return str(uri), str(parent)
    return None


def describe(round_: Round, race: Race) -> str:
    """One console line per round."""
    out = ", ".join(
        [f"{c} ({why})" for c, why in round_.failed.items()]
        + [f"{c} ({look_text(round_, c)})" for c in round_.eliminated]
    )
    return (
        f"samplerlab race: round {round_.number} ({len(round_.seeds)} seeds, level "
        f"{round_.level:.4f}): leader {round_.leader} {round_.means[round_.leader]:.4f}; "
        f"out: {out or 'none'}; {len(race.survivors)} left, {round_.runs} runs"
    )


Launch = Callable[[list[list[str]], int], Sequence[JobReturn]]


def run(
    plan: Plan,
    settings: RaceSettings,
    launch: Launch,
    check: Callable[[list[str]], None] | None = None,
) -> tuple[Race, dict[tuple[str, int], str], list[Sequence[JobReturn]]]:
    """Race to the end: launch each round's jobs in one batch (``launch(batch, first_index)``),
    record the objectives or the failures (:func:`record`), look. Returns the race, each job's
    config key (for its MLflow run) and every batch's returns. A crashed job stops the race; a
    race whose every candidate failed is a user error naming them. ``check``: see
    :func:`check_candidates`, before any job runs."""
    race = new_race(plan, settings)
    if check is not None:
        check_candidates(plan, check)
    keys: dict[tuple[str, int], str] = {}
    returns: list[Sequence[JobReturn]] = []
    index = 0
    started = time.perf_counter()
    while jobs := race.next_jobs():
        batch = [plan.job(candidate, seed) for candidate, seed in jobs]
        results = launch(batch, index)
        index += len(batch)
        returns.append(results)
        for (candidate, seed), result in zip(jobs, results, strict=True):
            record(race, candidate, seed, result)
            keys[(candidate, seed)] = _config_key(result)
        try:
            closed = race.close_round()
        except ValueError as error:  # every candidate failed: nothing to answer with
            raise UserError(
                f"the race has no candidate left: {error}\n"
                "fix what each failure names, or race other candidates"
            ) from error
        # Printed, not logged: after a job Hydra's root logger writes into that job's log file.
        print(describe(closed, race), flush=True)
    print(
        f"samplerlab race: over after {time.perf_counter() - started:.1f} s "
        f"({race.stop_reason}); {race.runs} runs",
        flush=True,
    )
    return race, keys, returns


def record(race: Race, candidate: str, seed: int, result: JobReturn) -> None:
    """The job's objective into ``race``, or its user-level failure (:meth:`Race.fail`); a
    crash re-raises the job's exception."""
    try:
        value = result.return_value  # raises the job's exception if it failed
    except Exception as error:
        from runner.app import failure_reason  # the runner's own line between failure and crash

        reason = failure_reason(error)
        if reason is None:
            raise
        race.fail(candidate, seed, reason)
        return
    try:
        race.record(candidate, seed, float(value))
    except (TypeError, ValueError) as error:
        raise UserError(
            f"the job {' '.join(result.overrides or [])} returned {value!r} to the race, "
            "not a number\nthe objective must be a metric the run logs (objective=val/...)"
        ) from error


def epochs_trained(
    returns: Sequence[Sequence[JobReturn]], runs: Mapping[str, Mapping[str, float]]
) -> int:
    """The epochs of training behind the race's values: each job that returned one counts the
    epochs its run trained itself, its ``cost/epochs_trained`` in ``runs`` (config key ->
    metrics, :func:`experiments.race.advice.finished_runs`): the epochs it forked from another
    job's shared prefix (:mod:`runner.sweeps.prefixes`) are that job's. A run without the metric
    (recorded before it, or no store) counts all its epochs; one a resumed race got back from
    an earlier sweep counts what it trained then. A failed job's epochs are not counted (where
    it stopped is not returned to the sweeper)."""
    from hydra.core.utils import JobStatus

    from runner.train.state import total_epochs

    return sum(
        int(
            runs.get(_config_key(result), {}).get(
                "cost/epochs_trained", total_epochs(result.cfg.trainer)
            )
        )
        for batch in returns
        for result in batch
        if result.status == JobStatus.COMPLETED and result.cfg is not None
    )


def _config_key(result: JobReturn) -> str:
    """The job's run, as the runner fingerprints it (its ``config_key`` tag)."""
    if result.cfg is None:
        return ""
    from runner.fingerprint import config_key

    return config_key(result.cfg)
