"""The race sweeper's pure parts: candidates and seeds from Hydra's parsed overrides, the
settings it refuses, and the answer it writes (on a race replayed from known values)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from experiments.race import advice
from experiments.race.driver import new_race, plan_from
from experiments.race.race import MAX_RUNS, ONE_LEFT, Race, replay, seed_orders
from experiments.race.settings import RaceSettings as Settings
from runner.config import CONF
from runner.errors import UserError

pytestmark = pytest.mark.unit  # in one process, seconds


def parsed(*overrides: str):
    return OverridesParser.create().parse_overrides(list(overrides))


def test_candidates_are_the_combinations_of_the_swept_overrides():
    plan = plan_from(
        parsed("sampler=uniform,weighted", "sampler.q=0,0.5", "trainer.epochs=2", "+method=ce"), 4
    )
    assert list(plan.candidates) == [
        "sampler=uniform sampler.q=0",
        "sampler=uniform sampler.q=0.5",
        "sampler=weighted sampler.q=0",
        "sampler=weighted sampler.q=0.5",
    ]
    assert plan.seeds == (0, 1, 2, 3)
    assert plan.job("sampler=weighted sampler.q=0.5", 3) == [
        "trainer.epochs=2",
        "+method=ce",
        "sampler=weighted",
        "sampler.q=0.5",
        "seed=3",
    ]
    one_key = plan_from(parsed("sampler=uniform,hybrid"), 10)
    assert list(one_key.candidates) == ["uniform", "hybrid"]


def test_a_seed_sweep_lists_the_seeds_and_the_later_override_wins():
    """As with +experiment=digits (params seed: 0,1,2) and seed=range(10) on the command line."""
    plan = plan_from(
        parsed("sampler=a,b", "seed=0,1,2", "seed=range(10)", "seed=range(5,0,-1)"), 10
    )
    assert plan.seeds == (5, 4, 3, 2, 1)
    assert "seed" not in " ".join(plan.fixed)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["sampler=uniform,weighted", "seed=3"], "the race chooses the seeds"),
        (["sampler.q=interval(0,1)"], "not an interval"),
        (["trainer.epochs=2"], "nothing to race"),
    ],
)
def test_overrides_the_race_cannot_use_are_one_line_errors(overrides, message):
    with pytest.raises(UserError, match=message):
        plan_from(parsed(*overrides), 10)


@pytest.mark.parametrize(
    ("overrides", "settings", "message"),
    [
        (["sampler=uniform,uniform"], Settings(), "at least 2 candidates"),
        (["sampler=a,b", "seed=0,1"], Settings(min_seeds=3), "min_seeds=3 but only 2 seeds"),
        (["sampler=a,b,c"], Settings(max_runs=8), "max_runs=8 cannot pay for round 1"),
        (["sampler=a,b"], Settings(min_seeds=1), "min_seeds must be >= 2"),
        (["sampler=a,b"], Settings(alpha=1.5), "alpha must lie in"),
    ],
)
def test_settings_the_race_cannot_use_name_hydra_sweeper(overrides, settings, message):
    with pytest.raises(UserError, match=message):
        new_race(plan_from(parsed(*overrides), 10), settings)


def finished_race(max_runs: int | None = None) -> Race:
    """weighted and hybrid close, uniform far behind, on made-up but fixed values."""
    table = {}
    for seed in range(10):
        wobble = 0.004 * ((seed * 7) % 5 - 2)
        table[("uniform", seed)] = 0.80 + wobble - 0.002 * (seed % 3)
        table[("weighted", seed)] = 0.95 + wobble + 0.001 * (seed % 2)
        table[("hybrid", seed)] = 0.949 + wobble - 0.001 * (seed % 2)
    return replay(
        Race(
            ["uniform", "weighted", "hybrid"],
            list(range(10)),
            Settings(max_runs=max_runs, delta=0.0),  # the rule alone: hybrid stays in
        ),
        table,
    )


def test_the_answer_names_the_winner_or_the_survivors_and_every_elimination():
    race = finished_race(max_runs=13)
    assert race.stop_reason == MAX_RUNS and race.eliminated_in == {"uniform": 1}
    text = advice.sentence(race, "val/balanced_accuracy")
    assert text.startswith(
        "use weighted: no candidate is more than 0.2 points better (95%): not within delta=0 "
        "points (max_runs reached); weighted leads on val/balanced_accuracy"
    )
    assert "uniform out in round 1 (-15.2 points [" in text
    assert "hybrid not separable from weighted (" in text
    diff, low, high = advice.interval(race, "uniform")
    assert high < 0 < advice.interval(race, "hybrid")[2]  # out exactly when the interval is below 0
    confirmed = advice.confirm(race, "val/balanced_accuracy", {}, {})
    page = advice.to_html(race, "val/balanced_accuracy", confirmed, advice.chart(race, "val"))
    assert page.count("data:image/png;base64,") == 1 and "How the race decides" in page
    assert "| weighted |" in advice.markdown(race, "val/balanced_accuracy", confirmed)


def test_a_race_with_one_survivor_says_use_it():
    values = {("a", s): 0.9 + 0.001 * s for s in range(10)}
    values.update({("b", s): 0.5 + 0.002 * (s % 2) for s in range(10)})
    race = replay(Race(["a", "b"], list(range(10))), values)
    assert race.stop_reason == ONE_LEFT and race.survivors == ["a"]
    assert advice.sentence(race, "val/macro_f1").startswith(
        "use a: no candidate is more than 0.0 points better (95%), within delta=1 points; "
        "best on val/macro_f1 after 1 round (6 runs, 3 seeds); b out in round 1"
    )


def test_seed_orders_replay_the_race_with_its_seeds_shuffled_reproducibly():
    """The orders are reproducible permutations of the seeds, each the race a grid with these
    values replays; b's one good seed (seed 0) never outweighs a's seven, in any order."""
    values = {("a", s): 0.90 + 0.01 * (s % 3) for s in range(8)}
    values.update({("b", s): 0.93 if s == 0 else 0.80 for s in range(8)})
    values.update({("c", s): 0.50 + 0.001 * s for s in range(8)})

    def race(order: list[int]) -> Race:
        return Race(["a", "b", "c"], order, Settings(max_seeds=8))

    races = seed_orders(race, values, list(range(8)), orders=50, seed=3)
    assert [r.seeds for r in races] == [
        r.seeds for r in seed_orders(race, values, list(range(8)), 50, seed=3)
    ]
    assert all(sorted(r.seeds) == list(range(8)) for r in races)
    assert len({r.seeds for r in races}) > 40  # 8! orders: nearly all distinct
    assert all(r.eliminated_in.get("c") == 1 for r in races)  # far behind whatever the order
    assert {r.survivors[0] for r in races} == {"a"}  # one good seed never outweighs seven
    for r in races:  # each is the race a grid with these values would replay
        assert replay(race(list(r.seeds)), values).survivors == r.survivors


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ([], "advise digits"),
        (["DATA=/d/features.npz", "BUDGET=30"], "advise /d/features.npz --budget 30"),
        (
            ["DATA=/d/folder", "MODEL=timm:resnet18", "WEIGHTS=w.pt", "VAL=5", "SIZE=64"],
            "advise /d/folder --model timm:resnet18 --weights w.pt --val 5 --size 64",
        ),
    ],
)
@pytest.mark.slow
def test_make_advise_calls_samplerlab_advise(variables, expected):
    """``make advise ...``: the samplerlab command it runs (printed by make -n, not run); the
    race that command builds is tested in tests/test_command.py."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    root = Path(__file__).resolve().parents[1]
    printed = (
        subprocess.run(
            [
                "make",
                "--no-print-directory",  # also when a make (make test) runs this one
                "-n",
                "advise",
                *variables,
                "STAMP=/dev/null",
                "SAMPLERLAB=samplerlab",
            ],
            cwd=root,
            env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")},
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    assert printed == f"samplerlab {expected}"


def test_the_sweeper_checks_a_composed_config_without_launching(tmp_path):
    """RaceSweeper.check: what a caller can run before the sweep's parent run is created."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from hydra_plugins.samplerlab_race.race_sweeper import RaceSweeper

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()

        def composed(*overrides: str):
            line = ["hydra/sweeper=race", "sampler=uniform,weighted", *overrides]
            return loader.load_configuration("config", line, run_mode=RunMode.MULTIRUN)

        good, bad = composed("data.val_per_class=30"), composed("hydra.sweeper.max_runs=5")
    RaceSweeper.check(good)
    with pytest.raises(UserError, match="hydra.sweeper: max_runs=5 cannot pay for round 1"):
        RaceSweeper.check(bad)


def test_the_chart_draws_a_candidate_whose_seeds_all_scored_the_same():
    """A refit that ignores the seed scores the same on every seed: its interval has no width
    and its ends may miss the round's mean (summed in another order) by one rounding; the chart
    draws it and leaves no figure open."""
    import matplotlib.pyplot as plt

    same = 306 / 600  # a value whose means over six seeds differ by one rounding
    values = {("a", s): same for s in range(10)}
    values.update({("b", s): same - 0.004 + 0.008 * (s % 2) for s in range(10)})
    race = replay(Race(["a", "b"], list(range(10))), values)
    assert any(len(r.seeds) == 6 for r in race.rounds)
    assert advice.chart(race, "val/balanced_accuracy").startswith(b"\x89PNG")
    assert not plt.get_fignums()
