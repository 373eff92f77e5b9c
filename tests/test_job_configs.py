"""A race's job configs, each candidate's composed once (:mod:`experiments.race.job_configs`):
every seed's config equals the one Hydra's launcher composes for it, for the configs races run
(every experiment, a published recipe, a decoupled method), and for a job folder named by the
overrides."""

from __future__ import annotations

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import OmegaConf

from experiments.race.job_configs import JobConfigs, with_seed
from hydra_plugins.samplerlab_race.race_sweeper import LEAN
from runner.config import CONF

pytestmark = pytest.mark.unit  # in one process, seconds

LEAN_OVERRIDES = [f"{k}={v}" for k, v in LEAN.items()]
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def _everything(config):
    return OmegaConf.to_container(config, resolve=False)


@pytest.mark.parametrize(
    ("multirun", "candidate"),
    [
        *((["hydra/sweeper=race"], [f"+experiment={e}"]) for e in EXPERIMENTS),
        (["hydra/sweeper=race", "data.val_per_class=20"], ["+method=tau_norm"]),
        (
            [
                "hydra/sweeper=race",
                "hydra.sweep.subdir=${hydra.job.override_dirname}",
                "hydra.job.config.override_dirname.kv_sep=_",
                "hydra.job.config.override_dirname.item_sep=/",
            ],
            ["sampler=weighted", "trainer.lr=0.05"],
        ),
        (
            [
                "hydra/sweeper=race",
                "hydra.job.config.override_dirname.exclude_keys=[seed]",
            ],
            ["loss=focal"],
        ),
    ],
)
def test_every_seeds_config_is_the_one_the_launcher_composes(multirun, candidate):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("config", multirun, run_mode=RunMode.MULTIRUN)
        composed: list[list[str]] = []

        def compose(overrides):
            composed.append(overrides)
            return loader.load_sweep_config(master, overrides)

        configs = JobConfigs(compose)
        for seed in (3, 0, 12):
            job = [*LEAN_OVERRIDES, *candidate, f"seed={seed}"]
            got = configs(job)
            assert got.seed == seed
            assert _everything(got) == _everything(loader.load_sweep_config(master, job))
    assert composed == [[*LEAN_OVERRIDES, *candidate, "seed=3"]]  # once for three jobs


def test_each_config_is_a_job_of_its_own():
    """The launcher writes a job's number and folder into its config: a write into one job's
    config reaches no other."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("config", ["hydra/sweeper=race"], RunMode.MULTIRUN)
        configs = JobConfigs(lambda overrides: loader.load_sweep_config(master, overrides))
        first = configs(["sampler=weighted", "seed=0"])
        first.hydra.job.num = 41
        first.trainer.lr = 9.0
        again = configs(["sampler=weighted", "seed=0"])
        assert again.trainer.lr != 9.0 and OmegaConf.is_missing(again.hydra.job, "num")
        assert configs(["sampler=weighted", "seed=1"]).trainer.lr == again.trainer.lr


def test_a_config_that_does_not_show_its_seed_as_an_override_writes_it_is_composed_again():
    calls: list[list[str]] = []
    shown_twice = OmegaConf.create(
        {
            "seed": 0,
            "hydra": {
                "overrides": {"task": ["seed=0"]},
                "job": {
                    "override_dirname": "seed=0,seed=0",
                    "config": {
                        "override_dirname": {"kv_sep": "=", "item_sep": ",", "exclude_keys": []}
                    },
                },
            },
        }
    )

    def compose(overrides):
        calls.append(overrides)
        return shown_twice

    assert with_seed(shown_twice, 0, 1) is None
    configs = JobConfigs(compose)
    configs(["seed=0"])
    configs(["seed=1"])
    configs(["seed=1", "trainer.lr=0.1"])  # the seed not last: not a race's job
    assert calls == [["seed=0"], ["seed=1"], ["seed=1", "trainer.lr=0.1"]]
    moved = OmegaConf.merge(shown_twice, {"seed": 5})
    assert with_seed(moved, 0, 1) is None  # the seed key does not hold the override's value
    run_together = OmegaConf.merge(
        shown_twice,
        {
            "hydra": {
                "job": {
                    "override_dirname": "seed=0",
                    "config": {"override_dirname": {"item_sep": ""}},
                }
            }
        },
    )
    assert with_seed(run_together, 0, 1) is None  # no separator: the items cannot be told apart
