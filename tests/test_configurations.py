"""What a configuration is: every study a Hydra experiment config, and the fingerprint that
makes two runs seeds of one configuration (runtime keys and resume change nothing; runs
recorded before the fingerprint changed are still recognised)."""

from __future__ import annotations

import pytest

from experiments.published import PUBLISHED
from runner.config import CONF

pytestmark = pytest.mark.unit  # in one process, seconds

# Kang et al.'s LWS, tau-normalisation and NCM and Menon et al.'s post-hoc logit adjustment are not
# rows of the published CIFAR-LT table, and the post-hoc stages that choose need a validation
# split the CIFAR studies do not take: they are raced on digits and on frozen features instead.
OUTSIDE_THE_STUDIES = {"lws", "tau_norm", "posthoc_la", "logistic_la", "logistic_balanced", "ncm"}


@pytest.mark.parametrize(
    "study", ["synthetic", "digits", "cifar10_lt", "cifar10_lt_paper", "cifar100_lt_paper"]
)
def test_every_study_is_a_hydra_experiment_config(study):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="config", overrides=[f"+experiment={study}"], return_hydra_config=True
        )
    assert cfg.tracking.experiment == f"study-{study}"
    axes = cfg.hydra.sweeper.params
    if study.startswith("cifar"):  # the published table's rows and ours, as conf/method recipes
        methods = set(axes.method.split(","))
        recipes = {p.stem for p in (CONF / "method").glob("*.yaml")}
        assert methods == recipes - OUTSIDE_THE_STUDIES
        assert cfg.tracking.reference in PUBLISHED
        assert methods >= set(PUBLISHED[cfg.tracking.reference].errors)
    else:
        assert set(axes.sampler.split(",")) >= {"uniform", "weighted", "hybrid"}
    assert axes.seed == "0,1,2"
    assert not any(cfg.hydra.runtime.choices[g] is None for g in ("data", "model", "loss"))


def test_runtime_overrides_do_not_make_another_configuration():
    """``resume=`` (a sweep finished with the parent's id) and every runtime key change nothing a
    run computes: such runs are seeds of the same row, not rows of their own."""
    from experiments.report import group_runs
    from experiments.store import Run

    def run(seed: int, overrides: str) -> Run:
        tags = {"sampler": "hybrid", "data": "synthetic_lt", "model": "mlp", "loss": "ce"}
        tags["overrides"] = f"sampler=hybrid seed={seed} {overrides}".strip()
        return Run(f"r{seed}", "1", f"hybrid-s{seed}", "FINISHED", seed, tags, {"seed": str(seed)})

    runs = [
        run(0, ""),
        run(1, "resume=0123abcd"),
        run(2, "data.num_workers=2 data.in_memory=false trainer.threads=1 objective=val/accuracy"),
        run(3, "sampler.q=0.25"),
    ]
    rows = {s.label: sorted(r.seed for r in s.runs) for s in group_runs(runs)}
    assert rows == {"hybrid": [0, 1, 2], "hybrid [sampler.q=0.25]": [3]}


def test_runs_recorded_before_the_fingerprint_changed_are_still_recognised():
    """The default config's fingerprint as the first computation gave it (before runtime keys
    and settings were added): a sweep resumed on old runs finds its finished jobs."""
    from runner.fingerprint import config_key, config_keys
    from tests.conftest import compose_config

    cfg = compose_config([])
    assert "c9b55afccdd269b2" in config_keys(cfg)
    # ... and as the computation before tracking.plots became a runtime key gave it.
    assert "7eb5c0fdd03204de" in config_keys(cfg)
    assert config_key(compose_config(["tracking.plots=false"])) == config_key(cfg)
    assert config_key(cfg) in config_keys(cfg)
    assert "c9b55afccdd269b2" not in config_keys(compose_config(["data.imbalance_factor=50"]))
    # A setting the first computation's runs could not have: no fingerprint of theirs to match.
    assert "c9b55afccdd269b2" not in config_keys(compose_config(["data.val_fraction=0.1"]))
    assert len(config_keys(compose_config(["data.val_fraction=0.1"]))) == 2
