"""``hydra/sweeper=race``: race the candidates of a sweep over seeds, round by round, through
the configured ``hydra/launcher``, and publish the answer on the sweep's parent run.

    python -m runner -m hydra/sweeper=race sampler=uniform,weighted,hybrid data.val_per_class=30
    python -m runner -m hydra/sweeper=race +experiment=digits data.val_per_class=20 \\
        hydra.sweeper.max_runs=36 hydra.sweeper.min_seeds=3

Settings (``hydra.sweeper.*``): ``params`` (the candidates, as for the basic sweeper) and the
race's own, :class:`experiments.race.settings.RaceSettings` (``min_seeds``, ``max_seeds``,
``max_runs``, ``alpha``, ``delta``, ``prefer``, ``stack_heads``; their defaults are there
alone). A round's linear heads on cached features train at once, in this process
(:mod:`experiments.race.stacked_jobs`).

**Lean children.** Every job gets ``tracking.log_model=false tracking.plots=false
trainer.eval_every=0`` unless the command line sets them (:data:`LEAN`): a child keeps its
metrics and checkpoint, is evaluated after its last epoch (the objective the race reads), and
the advised candidate's model alone is logged, on the parent
(:mod:`experiments.race.advised_model`). The rule is in :mod:`experiments.race.rule`, the rounds
in :mod:`experiments.race.driver`.

Imported by Hydra's plugin discovery on every start: it imports Hydra and
:mod:`experiments.race.settings` (dataclasses alone), nothing heavy. No ``from __future__ import
annotations`` here: Hydra executes plugin modules outside ``sys.modules``, where a dataclass
cannot resolve string annotations.
"""

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from experiments.race.settings import RaceSettings

# What a race's children skip unless told otherwise: the answer needs one model, no plots, and
# of each run only its last evaluation (the objective; a classifier stage's end is evaluated too).
LEAN = {"tracking.log_model": "false", "tracking.plots": "false", "trainer.eval_every": "0"}


@dataclass
class RaceSweeperConf(RaceSettings):
    _target_: str = "hydra_plugins.samplerlab_race.race_sweeper.RaceSweeper"
    params: dict[str, str] | None = None


ConfigStore.instance().store(
    group="hydra/sweeper", name="race", node=RaceSweeperConf, provider="samplerlab"
)


# The multirun configs whose candidates :meth:`RaceSweeper.check` composed and checked already
# (before the sweep's parent run), with those compositions: the sweep takes them over.
_CHECKED: list[tuple[DictConfig, Any]] = []


def _plan(parser: Any, params: list[str], task: list[str], max_seeds: int) -> Any:
    """The race's plan (:class:`experiments.race.driver.Plan`) from the sweeper's ``params`` and
    the command line's ``task`` overrides; every job lean (:data:`LEAN`) unless they say."""
    from experiments.race import driver

    overrides = parser.parse_overrides(params) + parser.parse_overrides(task)
    given = {o.get_key_element().lstrip("+~") for o in overrides}
    lean = [f"{k}={v}" for k, v in LEAN.items() if k not in given]
    return driver.plan_from(parser.parse_overrides(lean) + overrides, max_seeds)


def _job_configs(loader: Any, config: DictConfig) -> Any:
    """The jobs' configs of the multirun ``config`` as the launcher composes them, each
    candidate's composed once (:class:`experiments.race.job_configs.JobConfigs`)."""
    from experiments.race.job_configs import JobConfigs

    return JobConfigs(lambda overrides: loader.load_sweep_config(config, overrides))


def _check_job(job: DictConfig, config: DictConfig) -> None:
    """Run the runner's checks (values, targets, the objective) on a job's composed config."""
    from runner.checks import check_objective, check_targets

    check_targets(job)
    check_objective(job, str(config.hydra.sweeper._target_))


class RaceSweeper(Sweeper):
    """Candidates are the combinations of the swept overrides; replicates are seeds."""

    def __init__(self, params: dict[str, str] | None = None, **settings: Any) -> None:
        """``params``: the candidates; ``settings``: the fields of :class:`RaceSettings`."""
        super().__init__()
        self.params = dict(params or {})
        self.settings = RaceSettings(**settings)
        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None
        self.launcher: Launcher | None = None
        self.configs: Any = None  # experiments.race.job_configs.JobConfigs, once composing

    @staticmethod
    def check(config: DictConfig) -> None:
        """Raise the user error a race of this composed multirun config would stop with (no
        candidates, too few seeds, a budget below round 1, a candidate whose composed config
        the runner refuses), without launching anything: for a caller that wants it before the
        sweep's parent run exists (the runner's sweep callback)."""
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from experiments.race import driver

        sweeper = config.hydra.sweeper
        params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
        task = [str(o) for o in config.hydra.overrides.task]
        settings = RaceSettings.from_node(sweeper)
        plan = _plan(OverridesParser.create(), params, task, settings.max_seeds)
        driver.new_race(plan, settings)
        hydra = GlobalHydra.instance()
        if hydra.is_initialized():  # inside the app: every candidate's composed config too
            configs = _job_configs(hydra.config_loader(), config)
            driver.check_candidates(plan, lambda job: _check_job(configs(job), config))
            _CHECKED.append((config, configs))

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def job_config(self, overrides: list[str]) -> DictConfig:
        """The job's config as the launcher composes it, each candidate's composed once: by
        :meth:`check` already, for this multirun config, or here."""
        assert self.hydra_context is not None and self.config is not None
        if self.configs is None:
            checked = [configs for config, configs in _CHECKED if config is self.config]
            _CHECKED[:] = [(c, j) for c, j in _CHECKED if c is not self.config]
            loader = self.hydra_context.config_loader
            self.configs = checked[0] if checked else _job_configs(loader, self.config)
        config: DictConfig = self.configs(overrides)
        return config

    def check_job(self, overrides: list[str]) -> None:
        """Compose the job's config as the launcher will and run the runner's checks on it
        (values, targets, the objective): the user error its job would stop with, at once."""
        assert self.config is not None
        _check_job(self.job_config(overrides), self.config)

    def sweep(self, arguments: list[str]) -> Any:
        from pathlib import Path

        from hydra.core.override_parser.overrides_parser import OverridesParser

        from experiments.race import advice, driver

        assert self.config is not None and self.launcher is not None
        assert self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        params = [f"{k}={v}" for k, v in self.params.items()]
        settings = self.settings
        plan = _plan(parser, params, arguments, settings.max_seeds)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        launcher = self.launcher

        def launch(batch: list[list[str]], first: int) -> Any:
            return launcher.launch(batch, initial_job_idx=first)

        from experiments.race.stacked_jobs import StackedLaunch, stacks_here

        checked = any(config is self.config for config, _ in _CHECKED)
        if stacks_here(self.config):
            launch = StackedLaunch(self.hydra_context, self.config, launcher, self.job_config)
        race, keys, returns = driver.run(
            plan, settings, launch, None if checked else self.check_job
        )
        objective = str(OmegaConf.select(self.config, "objective", default="objective"))
        where = driver.parent_of(self.hydra_context.callbacks)
        epochs = driver.epochs_trained(returns, advice.finished_runs(*where) if where else {})
        text, advised = advice.publish(race, objective, keys, where, epochs)
        print(text, flush=True)
        if where is not None and advised is not None:  # None: no candidate learned
            from experiments.race.advised_model import log_advised_model

            def compose(candidate: str, seed: int) -> DictConfig:
                return self.job_config(plan.job(candidate, seed))

            print(log_advised_model(race, keys, compose, where), flush=True)
        return returns
