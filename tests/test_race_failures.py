"""A race with failing candidates, in one process: the driver fed Hydra's own ``JobReturn``s
with recorded outcomes (objectives, a divergence, a crash), and every candidate's config
composed by Hydra's config loader and checked before any job runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus

from experiments.race import advice, driver
from experiments.race.settings import RaceSettings
from runner.app import failure_reason
from runner.config import CONF
from runner.errors import UserError
from runner.tracking import StoreLost
from runner.train.fit import Diverged

pytestmark = pytest.mark.unit  # in one process, seconds

ROOT = Path(__file__).resolve().parents[1]


def diverged(epoch: int) -> UserError:
    """What the runner raises when a job's loss turns non-finite (``runner.train.fit``)."""
    try:
        raise UserError("loss=ldam: the training loss became non-finite\nuse a cosine head") from (
            Diverged(epoch - 1, 1, 2.5)
        )
    except UserError as error:
        return error


def returned(outcome: float | BaseException, overrides: list[str]) -> JobReturn:
    result = JobReturn(overrides=overrides, cfg=None)
    result.status = JobStatus.FAILED if isinstance(outcome, BaseException) else JobStatus.COMPLETED
    result.return_value = outcome
    return result


def launcher(outcomes: dict[tuple[str, int], float | BaseException]):
    """A launch that answers each job with its recorded outcome, keyed by (loss, seed); the
    batches it got are kept in ``launch.batches``."""

    def launch(batch: list[list[str]], first: int) -> list[JobReturn]:
        launch.batches.append(batch)
        out = []
        for job in batch:
            chosen = dict(o.split("=", 1) for o in job)
            out.append(returned(outcomes[(chosen["loss"], int(chosen["seed"]))], job))
        return out

    launch.batches = []
    return launch


def plan(*losses: str) -> driver.Plan:
    parser = OverridesParser.create()
    return driver.plan_from(parser.parse_overrides([f"loss={','.join(losses)}"]), 10)


def good(loss: str, base: float) -> dict[tuple[str, int], float]:
    return {(loss, s): base + 0.01 * ((s * 7) % 3) for s in range(10)}


def test_a_diverging_candidate_is_out_with_its_reason_and_the_race_answers(capsys):
    outcomes = {**good("ce", 0.60), **good("focal", 0.58)}
    outcomes.update({("ldam", s): diverged(epoch=2) for s in range(10)})
    launch = launcher(outcomes)
    race, _, _ = driver.run(plan("ce", "ldam", "focal"), RaceSettings(max_seeds=5), launch)
    assert race.eliminated_in["ldam"] == 1 and race.failure("ldam") == (
        "diverged at epoch 2 on seeds 0, 1, 2"
    )
    assert all("loss=ldam" not in " ".join(job) for batch in launch.batches[1:] for job in batch)
    assert race.runs == sum(len(b) for b in launch.batches)  # the failed jobs count as runs
    first = race.rounds[0]
    assert first.candidates == ("ce", "focal") and first.failed == {
        "ldam": "diverged at epoch 2 on seeds 0, 1, 2"
    }
    printed = capsys.readouterr().out
    assert "out: ldam (diverged at epoch 2 on seeds 0, 1, 2)" in printed
    text = advice.sentence(race, "val/balanced_accuracy")
    assert text.startswith("use ce") or text.startswith("use ce (or focal")
    assert "ldam out in round 1: diverged at epoch 2 on seeds 0, 1, 2" in text
    record = race.to_dict()
    assert record["failed"] == {
        "ldam": {"0": "diverged at epoch 2", "1": "diverged at epoch 2", "2": "diverged at epoch 2"}
    }
    page = advice.markdown(race, "val/balanced_accuracy", [])
    assert "ldam (failed: diverged at epoch 2 on seeds 0, 1, 2)" in page
    assert "| ldam | 3 | — | — | out in round 1: diverged at epoch 2 on seeds 0, 1, 2 |" in page
    assert advice.chart(race, "val/balanced_accuracy").startswith(b"\x89PNG")


def test_a_survivor_failing_a_later_seed_is_out_in_that_round():
    # focal varies over the seeds unlike ce: identical candidates would tie exactly (SE 0) and
    # certify at once, before the seed focal fails on.
    focal = {("focal", s): 0.60 + 0.01 * ((s * 3) % 4) for s in range(10)}
    outcomes = {**good("ce", 0.60), **focal, **good("ldam", 0.20)}
    outcomes[("focal", 3)] = UserError("data.val_per_class=30: too few images of class 3\nlower it")
    race, _, _ = driver.run(
        plan("ce", "ldam", "focal"), RaceSettings(max_seeds=5, delta=0.0), launcher(outcomes)
    )
    assert race.eliminated_in == {"ldam": 1, "focal": 2}
    assert race.failure("focal") == "data.val_per_class=30: too few images of class 3 on seed 3"
    assert race.survivors == ["ce"] and race.rounds[1].candidates == ("ce",)
    assert "focal out in round 2: data.val_per_class=30" in advice.sentence(race, "val/x")
    advice.chart(race, "val/x")  # its earlier look is drawn, the failure marked


def test_a_crash_stops_the_race():
    outcomes = {
        **good("ce", 0.6),
        ("ldam", 0): RuntimeError("a bug"),
        **{("ldam", s): 0.5 for s in (1, 2)},
    }
    with pytest.raises(RuntimeError, match="a bug"):
        driver.run(plan("ce", "ldam"), RaceSettings(), launcher(outcomes))


def test_a_race_whose_every_candidate_failed_is_a_user_error_naming_them():
    outcomes = {("ce", s): diverged(1) for s in range(3)} | {
        ("ldam", s): diverged(2) for s in range(3)
    }
    with pytest.raises(
        UserError,
        match="no candidate left: every candidate failed in round 1 "
        r"\(ce: diverged at epoch 1 on seeds 0, 1, 2; ldam: diverged at epoch 2",
    ):
        driver.run(plan("ce", "ldam"), RaceSettings(), launcher(outcomes))


def test_failures_the_configuration_is_to_blame_for_and_crashes():
    assert failure_reason(diverged(epoch=3)) == "diverged at epoch 3"
    assert failure_reason(Diverged(0, 4, 1.0)) == "diverged at epoch 1"
    assert failure_reason(UserError("model.head=linear: no\nuse cosine")) == "model.head=linear: no"
    assert (
        failure_reason(StoreLost("the store stopped answering", [])) is None
    )  # not the candidate's
    assert failure_reason(RuntimeError("a bug")) is None


def test_a_full_disk_is_not_the_configurations_failure(tmp_path):
    """A checkpoint that cannot be written fails the run, but a resumed sweep must run that job
    again once there is space: no failure is recorded for it."""
    from runner.train.state import save_checkpoint

    (tmp_path / "checkpoint.pt").mkdir()  # the file cannot be written where a folder stands
    with pytest.raises(UserError) as unwritable:
        save_checkpoint(tmp_path / "checkpoint.pt", {"train": {}, "progress": {}})
    assert "checkpoint: cannot write" in str(unwritable.value)
    assert failure_reason(unwritable.value) is None


def test_every_candidate_is_checked_before_any_job_runs():
    """trainer.lr=0.1,-1: refused in one line naming the candidate and the key, nothing
    launched; nine valid candidates pass."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import HydraContext, RunMode

    from hydra_plugins.samplerlab_race.race_sweeper import RaceSweeper

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration(
            "config", ["hydra/sweeper=race", "data.val_per_class=30"], run_mode=RunMode.MULTIRUN
        )
        sweeper = RaceSweeper()
        # Hydra's own loader, as its multirun hands it to the sweeper (callbacks: not read here).
        sweeper.hydra_context = HydraContext(config_loader=loader, callbacks=None)
        sweeper.config = master
        parser = OverridesParser.create()
        bad = driver.plan_from(
            parser.parse_overrides(["trainer.lr=0.1,-1", "data.val_per_class=30"]), 10
        )
        launch = launcher({})
        with pytest.raises(UserError) as refused:
            driver.run(bad, RaceSettings(), launch, sweeper.check_job)
        assert launch.batches == []
        assert str(refused.value) == (
            "race candidate trainer.lr=-1: config error at 'trainer.lr': must be a finite number "
            "in (0, inf] (e.g. 0.1), got -1.0"
        )
        samplers = sorted(p.stem for p in (CONF / "sampler").glob("*.yaml"))[:9]
        nine = driver.plan_from(
            parser.parse_overrides([f"sampler={','.join(samplers)}", "data.val_per_class=30"]), 10
        )
        driver.check_candidates(nine, sweeper.check_job)
    assert len(nine.candidates) == 9


def test_the_candidates_are_refused_before_the_sweeps_parent_run_exists():
    """The sweep callback's check (``RaceSweeper.check``, before it opens the parent run) composes
    every candidate too, so a refused race leaves no parent behind; the sweep then does not
    compose them again."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from hydra_plugins.samplerlab_race import race_sweeper

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        bad, good = (
            loader.load_configuration(
                "config",
                ["hydra/sweeper=race", lr, "data.val_per_class=30"],
                run_mode=RunMode.MULTIRUN,
            )
            for lr in ("trainer.lr=0.1,-1", "trainer.lr=0.1,0.05")
        )
        with pytest.raises(UserError, match=r"^race candidate trainer.lr=-1: config error at"):
            race_sweeper.RaceSweeper.check(bad)
        assert not any(c is bad for c, _ in race_sweeper._CHECKED)
        race_sweeper.RaceSweeper.check(good)
        assert any(c is good for c, _ in race_sweeper._CHECKED)
        race_sweeper._CHECKED.clear()
