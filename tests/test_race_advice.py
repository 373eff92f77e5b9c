"""The race's answer in words: no winner when no candidate learned, numbers that agree with the
words beside them, the chance level per objective, and the answer's tags on a real MLflow
store."""

from __future__ import annotations

import re

import numpy as np
import pytest

from experiments.race import advice
from experiments.race.chance import Chance, chance_level, learning
from experiments.race.race import Race, replay
from experiments.race.sentence import NO_LEARNING, agreeing, guarantee
from experiments.race.settings import RaceSettings

pytestmark = pytest.mark.unit  # in one process, seconds

CANDIDATES = ("ce", "weighted", "hybrid")
SEEDS = tuple(range(10))
TEN_CLASSES = Chance(0.1, "1/10 classes")


def _race(means: dict[str, float], sd: float, seed: int, **settings: object) -> Race:
    """A race replayed on normal per-seed values around ``means``."""
    rng = np.random.default_rng(seed)
    table = {(c, s): means[c] + sd * rng.standard_normal() for c in means for s in SEEDS}
    return replay(Race(list(means), SEEDS, RaceSettings(**settings)), table)  # type: ignore[arg-type]


def test_a_race_at_chance_advises_no_winner_and_says_why():
    race = _race({c: 0.10 for c in CANDIDATES}, 0.01, seed=0)
    learned = learning(race, TEN_CLASSES)
    said = advice.sentence(race, "val/balanced_accuracy", learned)
    assert learned.learned is False
    assert said.startswith(NO_LEARNING) and not said.startswith("use ")
    assert "none is shown to beat chance (0.1000, 1/10 classes) by more than delta=1" in said
    page = advice.markdown(race, "val/balanced_accuracy", [], learned)
    assert NO_LEARNING in page and "## Against chance" in page
    assert "winner" not in page.split("## Candidates")[1].split("##")[0]


def test_a_race_that_learned_still_names_its_winner():
    race = _race({"ce": 0.60, "weighted": 0.70, "hybrid": 0.72}, 0.01, seed=1)
    learned = learning(race, TEN_CLASSES)
    said = advice.sentence(race, "val/balanced_accuracy", learned)
    assert learned.learned is True
    assert said.startswith(f"use {race.advised}: ") and NO_LEARNING not in said


def test_without_a_chance_level_the_race_answers_and_says_it_did_not_check():
    race = _race({"ce": 0.60, "weighted": 0.70, "hybrid": 0.72}, 0.01, seed=1)
    learned = learning(race, Chance(None, "no chance level for val/macro_f1"))
    assert learned.learned is None
    assert advice.sentence(race, "val/macro_f1", learned).startswith("use ")
    page = advice.markdown(race, "val/macro_f1", [], learned)
    assert "Not tested against chance: no chance level for val/macro_f1." in page


def test_saying_a_candidate_learned_when_none_did_is_at_most_alpha():
    """At the boundary (every true mean exactly chance + delta) the test says "learned" with
    probability at most alpha = 0.05 (about 1 - (1 - 0.05/3)^3 = 0.049 here). 2000 races: the
    binomial standard deviation of the rate is sqrt(0.05 * 0.95 / 2000) = 0.0049; the tolerance
    is 3 of them."""
    rng = np.random.default_rng(7)
    settings = RaceSettings(alpha=0.05, delta=1.0)
    said = 0
    for _ in range(2000):
        race = Race(list(CANDIDATES), SEEDS[:5], settings)
        for c in CANDIDATES:
            for s in SEEDS[:5]:
                race.record(c, s, 0.11 + 0.02 * rng.standard_normal())
        said += bool(learning(race, TEN_CLASSES).learned)
    assert said / 2000 <= 0.05 + 3 * 0.0049


def test_the_certificate_is_printed_so_that_it_agrees_with_its_words():
    assert agreeing(1.0215, 1.0, within=False) == "1.02"  # "1.0" would read within delta=1
    assert agreeing(1.04, 1.0, within=False) == "1.04"
    assert agreeing(1.26, 1.0, within=False) == "1.3"
    assert agreeing(0.96, 1.0, within=True) == "1.0"  # 1.0 is within delta=1
    assert agreeing(1.00001, 1.0, within=False) == "1.00001"  # 4 decimals cannot tell
    for seed in range(30):  # real races, stopped within delta or not
        race = _race({"ce": 0.70, "weighted": 0.705, "hybrid": 0.71}, 0.02, seed, max_seeds=5)
        text = guarantee(race)
        shown = float(re.search(r"more than ([0-9.e+-]+) points better", text).group(1))  # type: ignore[union-attr]
        within = "not within" not in text
        assert (shown <= race.delta) == within, text


@pytest.mark.parametrize(
    ("objective", "metrics", "params", "level"),
    [
        ("val/balanced_accuracy", {"data/train_count/a": 90, "data/train_count/b": 10}, {}, 0.5),
        ("val/balanced_accuracy", {}, {"data.num_classes": "4"}, 0.25),
        ("val/balanced_accuracy", {"data/num_classes": 200.0}, {}, 0.005),  # counts in a table
        (
            "val/accuracy",
            {f"data/train_count/{c}": 5 for c in "abcd"},
            {"data.val_per_class": "3"},
            0.25,
        ),
        (
            "val/accuracy",
            {"data/train_count/a": 9, "data/val_count/a": 6, "data/val_count/b": 2},
            {},
            0.75,
        ),
        (
            "val/accuracy",
            {f"data/train_count/{c}": 5 for c in "ab"},
            {"data.val_fraction": "0.1"},
            None,
        ),
        ("val/macro_f1", {f"data/train_count/{c}": 5 for c in "ab"}, {}, None),
        ("val/balanced_accuracy", {}, {}, None),
    ],
)
def test_chance_per_objective(objective, metrics, params, level):
    assert chance_level(objective, metrics, params).level == level


def test_the_class_count_reaches_the_answer_on_the_parent_run(tmp_path):
    """The children's logged class counts set chance; the parent's tags name no winner."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("race", artifact_location=str(tmp_path / "artifacts"))
    parent = client.create_run(experiment).info.run_id
    race = _race({c: 0.10 for c in CANDIDATES}, 0.01, seed=2)
    keys = {}
    for c in CANDIDATES:
        for s in race.values[c]:
            child = client.create_run(
                experiment, tags={"mlflow.parentRunId": parent, "config_key": f"{c}-{s}"}
            ).info.run_id
            for k in range(10):
                client.log_metric(child, f"data/train_count/class{k}", 100 // (k + 1))
            client.log_metric(child, "final/balanced_accuracy", 0.1)
            client.set_terminated(child, "FINISHED")
            keys[(c, s)] = f"{c}-{s}"
    text, advised = advice.publish(race, "val/balanced_accuracy", keys, (uri, parent), epochs=0)
    tags = client.get_run(parent).data.tags
    assert advised is None and NO_LEARNING in text and "1/10 classes" in text
    assert tags["advice/learned"] == "false"
    assert tags["advice/advised"] == tags["advice/winner"] == advice.NO_WINNER
