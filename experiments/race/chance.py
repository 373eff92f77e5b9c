"""Did any candidate learn? A race ranks its candidates against each other, never against a model
that ignores its input; on features that carry nothing (a random-weight backbone, labels cut
loose from the images) every candidate sits at chance and the race would still name one. Before
it names a winner the answer asks whether any candidate is shown to beat chance by more than
``delta``, and says "no candidate learned: check the data or the backbone" when none is.

**Chance, per objective** (:func:`chance_level`), what a classifier that ignores its input
scores on the validation split:

* ``val/balanced_accuracy`` (the mean per-class recall): ``1 / C`` for ``C`` classes, whatever
  the split's class counts (a constant prediction recalls one class fully, the others not at
  all; a random one recalls each class with the same probability, summing to 1). ``C`` is the
  number of ``data/train_count/<class>`` metrics the children log, else their
  ``data/num_classes`` metric (logged also when the counts go to a table, above
  ``tracking.per_class_max`` classes), else their ``data.num_classes`` parameter; with none of
  them ``C`` is unknown: not checked.
* ``val/accuracy``: the majority class's share of the validation split (what always predicting
  it scores): from the children's ``data/val_count/<class>`` metrics when they log them, else
  ``1 / C`` when ``data.val_per_class`` makes the split balanced. A split drawn by
  ``data.val_fraction`` without logged counts has no known majority share: not checked.
* any other objective: no chance level defined here: not checked (the answer says so).

**The test** (:func:`learning`). Each candidate with values on ``n >= 2`` seeds gets a one-sided
lower confidence bound on its mean, ``mean - t_{1 - alpha / K, n - 1} * s / sqrt(n)`` (Student's
t over its per-seed values, ``s`` their sample standard deviation), ``K`` the number of such
candidates (Bonferroni: the leader is picked from the data, so every candidate is tested). A
candidate *learned* when its bound exceeds ``chance + delta``. If no candidate's true mean is
above ``chance + delta``, the chance that the test says some candidate learned is at most
``alpha`` (each bound fails with probability at most ``alpha / K``), assuming the seeds are
independent replicates and a candidate's per-seed values are normal. The converse is not
guaranteed: "no candidate learned" means none is *shown* to beat chance by more than ``delta``
(a candidate a little above chance, or one the seeds cannot pin down, also reads so); the words
say "shown". The race's ``alpha`` and ``delta`` are the test's: "better than chance by more
than delta" is the same practical difference the race certifies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from experiments.race.race import Race
from experiments.stats import t_interval

BALANCED, ACCURACY = "balanced_accuracy", "accuracy"
TRAIN_COUNT, VAL_COUNT = "data/train_count/", "data/val_count/"


@dataclass(frozen=True)
class Chance:
    """What ignoring the input scores on the objective (None: unknown), and how it was found."""

    level: float | None
    source: str  # "1/10 classes", or why there is no level


def _counts(metrics: Mapping[str, float], prefix: str) -> list[float]:
    return [v for k, v in metrics.items() if k.startswith(prefix)]


def _int(value: str | None) -> int:
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def chance_level(objective: str, metrics: Mapping[str, float], params: Mapping[str, str]) -> Chance:
    """Chance for ``objective`` (``val/<metric>``) from one child run's ``metrics`` and
    ``params`` (see the module's docstring)."""
    metric = objective.partition("/")[2]
    if metric not in (BALANCED, ACCURACY):
        return Chance(None, f"no chance level for {objective}")
    val = _counts(metrics, VAL_COUNT)
    if metric == ACCURACY and val and sum(val) > 0:
        return Chance(max(val) / sum(val), "the validation split's majority class share")
    classes = (
        len(_counts(metrics, TRAIN_COUNT))
        or int(metrics.get("data/num_classes", 0))
        or _int(params.get("data.num_classes"))
    )
    if classes < 2:
        return Chance(
            None, f"the runs logged no class counts ({TRAIN_COUNT}<class>) nor data.num_classes"
        )
    if metric == BALANCED:
        return Chance(1 / classes, f"1/{classes} classes")
    if str(params.get("data.val_per_class", "None")) not in ("None", "null", "0", ""):
        return Chance(1 / classes, f"1/{classes} classes (data.val_per_class: a balanced split)")
    return Chance(None, "the validation split's class counts are unknown (data.val_fraction)")


@dataclass(frozen=True)
class Learning:
    """The test against chance: each tested candidate's lower bound (objective units), at
    ``confidence`` one-sided and simultaneous over them; ``learned`` None when not checked."""

    chance: Chance
    confidence: float
    delta: float  # points
    means: dict[str, float]  # over each tested candidate's seeds
    bounds: dict[str, float]
    learned: bool | None

    def reason(self) -> str:
        """Why no candidate learned, e.g. "none is shown to beat chance (0.1000, 1/10 classes)
        by more than delta=1 points (95%, one-sided, 3 candidates): the best, weighted, has
        0.1230 (lower bound 0.0950)"."""
        level = self.chance.level
        best = max(self.means, key=lambda c: self.means[c])
        return (
            f"none is shown to beat chance ({level:.4f}, {self.chance.source}) by more than "
            f"delta={self.delta:g} points ({100 * self.confidence:g}%, one-sided, "
            f"{len(self.bounds)} candidates): the best, {best}, has {self.means[best]:.4f} (lower "
            f"bound {self.bounds[best]:.4f})"
        )


def learning(race: Race, chance: Chance) -> Learning:
    """The race's candidates against ``chance`` at the race's alpha and delta."""
    tested = {c: list(v.values()) for c, v in race.values.items() if len(v) >= 2}
    if chance.level is None or not tested:
        return Learning(chance, 1 - race.alpha, race.delta, {}, {}, None)
    # A one-sided bound at alpha / K is the low end of the two-sided interval at 1 - 2 alpha / K.
    confidence = 1 - 2 * race.alpha / len(tested)
    seen = {c: t_interval(values, confidence) for c, values in tested.items()}
    bounds = {c: i.low for c, i in seen.items()}
    learned = any(b > chance.level + race.settings.tolerance for b in bounds.values())
    means = {c: i.mean for c, i in seen.items()}
    return Learning(chance, 1 - race.alpha, race.delta, means, bounds, learned)
