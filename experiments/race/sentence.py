"""The race's answer in words: the one sentence printed and put on top of ``advice.md``, and
the pieces of it the tables reuse (differences to the leader with their race interval, the
certificate). See :mod:`experiments.race.advice` for where they go.

Differences are to the round's leader in points (100 x the objective), with the race's interval:
difference +- t * SE at that round's level (:mod:`experiments.race.rule`), which lies below 0
exactly when the candidate was eliminated; ends clipped to [-100, 100] points, a difference that
is the same on every seed shown as such (a tie when it is 0).

Numbers agree with the words beside them: the certificate is printed with as many decimals as
it takes to read on the side of ``delta`` the words say (1.0215 not within delta=1 reads
"1.02", never "1.0").
"""

from __future__ import annotations

import math

from experiments.race.chance import Learning
from experiments.race.race import MAX_RUNS, MAX_SEEDS, Race, Round
from experiments.stats import difference_cell

NO_WINNER = "(none: no candidate learned)"
NO_LEARNING = "no candidate learned: check the data or the backbone"


def interval(race: Race, candidate: str) -> tuple[float, float, float]:
    """(difference, low, high) to the leader at the look that decided about ``candidate``."""
    return look_interval(race.round_of(candidate), candidate)


def look_interval(look: Round, candidate: str) -> tuple[float, float, float]:
    """(difference, low, high) to the leader of ``look``."""
    diff, margin = look.difference[candidate], look.margin[candidate]
    return diff, diff - margin, diff + margin


def diff_text(race: Race, candidate: str) -> str:
    """ "-14.9 points [-18.0, -11.8]" at the look that decided about ``candidate``."""
    return look_text(race.round_of(candidate), candidate)


def look_text(look: Round, candidate: str) -> str:
    """ "-14.9 points [-18.0, -11.8]": the difference to the leader of ``look``."""
    return difference_cell(*look_interval(look, candidate), unit=" points")


def agreeing(value: float, delta: float, within: bool) -> str:
    """``value`` (points) with the fewest decimals, 1 to 4, that read on the side of ``delta``
    the words say (``within``: at most delta): 1.0215 not within delta=1 is "1.02", since "1.0"
    would read within it; the full value when 4 decimals cannot tell."""
    for digits in range(1, 5):
        text = f"{value:.{digits}f}"
        if (float(text) <= delta) == within:
            return text
    return repr(value)


def eliminated_order(race: Race) -> list[str]:
    """Eliminated candidates by round; within a round the failed first, then the furthest
    behind."""
    return sorted(
        race.eliminated_in,
        key=lambda c: (race.eliminated_in[c], race.round_of(c).difference.get(c, -math.inf), c),
    )


def _out_text(race: Race, candidate: str) -> str:
    """Why ``candidate`` is out: "out in round 1: diverged at epoch 2 on seeds 0, 1, 2", or
    "out in round 1 (-14.9 points [-18.0, -11.8])"."""
    failure = race.failure(candidate)
    where = f"out in round {race.eliminated_in[candidate]}"
    return f"{where}: {failure}" if failure else f"{where} ({diff_text(race, candidate)})"


def guarantee(race: Race) -> str:
    """The certificate in words: "no candidate is more than 1.2 points better (95%), within
    delta=2 points" (or "not within delta=2 points: max_seeds reached"); the number is printed
    so that it agrees with the words (:func:`agreeing`)."""
    confidence = f"{100 * (1 - race.alpha):g}%"
    within = race.certificate <= race.settings.tolerance
    shown = agreeing(100 * race.certificate, race.delta, within)
    head = f"no candidate is more than {shown} points better ({confidence})"
    if within:
        return f"{head}, within delta={race.delta:g} points"
    why = {MAX_RUNS: "max_runs", MAX_SEEDS: "max_seeds"}.get(race.stop_reason or "", "the budget")
    return f"{head}: not within delta={race.delta:g} points ({why} reached)"


def no_winner(learned: Learning | None) -> bool:
    """True when the test against chance ran and no candidate learned."""
    return learned is not None and learned.learned is False


def sentence(race: Race, objective: str, learned: Learning | None = None) -> str:
    """The answer in one sentence, e.g. "use weighted: no candidate is more than 1.2 points
    better (95%), within delta=2 points; weighted leads on val/balanced_accuracy after 5 rounds
    (31 runs, 7 seeds); uniform out in round 1 (-14.9 points [-18.0, -11.8]); hybrid not
    separable from weighted (-0.2 points [-1.0, +0.6])". When ``learned`` (the test against
    chance) found no candidate that learned, it names none: "no candidate learned: check the
    data or the backbone (none is shown to beat chance ...); among them weighted leads ..."."""
    survivors, advised = race.survivors, race.advised
    leader = survivors[0]
    rounds = len(race.rounds)
    spent = f"after {rounds} round{'s' * (rounds != 1)} ({race.runs} runs, {race.seeds_used} seeds)"
    if len(survivors) == 1:
        how = f"{leader} best on {objective} {spent}"
    else:
        how = f"{leader} leads on {objective} {spent}"
        if advised != leader and not no_winner(learned):
            behind = race.rounds[-1].difference[advised]
            how += f"; {advised} is {-100 * behind:.1f} points behind it and preferred"
    if learned is not None and no_winner(learned):
        parts = [f"{NO_LEARNING} ({learned.reason()}); among them {how}"]
    else:
        if len(survivors) == 1:
            how = how.removeprefix(f"{leader} ")
        parts = [f"use {advised}: {guarantee(race)}; {how}"]
    for candidate in eliminated_order(race):
        parts.append(f"{candidate} {_out_text(race, candidate)}")
    for candidate in survivors[1:]:
        parts.append(f"{candidate} not separable from {leader} ({diff_text(race, candidate)})")
    return "; ".join(parts)
