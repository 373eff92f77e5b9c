"""The race's chart on its parent run (``race_chart.png``, also inside ``advice.html``)."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from experiments.race.race import Race
from experiments.stats import Interval, clipped, t_interval

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def chart(race: Race, objective: str) -> bytes:
    """PNG: each candidate's mean per round with its 95% Student-t interval over the round's
    seeds, clipped to [0, 1], and its difference to the leader with the race interval (its own
    pair's, :mod:`experiments.race.rule`); eliminations marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    try:
        _draw(race, objective, left, right)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=110)
    finally:
        plt.close(figure)
    return buffer.getvalue()


def _draw(race: Race, objective: str, left: Axes, right: Axes) -> None:
    for k, c in enumerate(race.candidates):
        seen = [r for r in race.rounds if c in r.candidates]
        if not seen:  # failed in round 1: never looked at
            continue
        x = [r.number + (k - len(race.candidates) / 2) * 0.03 for r in seen]
        means = [r.means[c] for r in seen]
        ends = [clipped(i.low, i.high) for i in (_interval(race, c, r.seeds) for r in seen)]
        # A zero-width interval (every seed the same value, as a refit that ignores the seed
        # gives) is centred on a mean summed in another order: its ends may miss the round's
        # mean by one rounding, which must not make an error bar negative.
        below = [max(0.0, m - low) for m, (low, _) in zip(means, ends, strict=True)]
        above = [max(0.0, high - m) for m, (_, high) in zip(means, ends, strict=True)]
        diffs = [100 * r.difference[c] for r in seen]
        margins = [100 * r.margin[c] for r in seen]
        line = left.errorbar(x, means, yerr=[below, above], marker="o", capsize=3, label=c)
        right.errorbar(x, diffs, yerr=margins, marker="o", capsize=3, color=line[0].get_color())
        if c in race.eliminated_in:
            last = seen[-1]
            left.plot(x[-1], last.means[c], "x", color="black", markersize=12, mew=2)
            right.plot(x[-1], diffs[-1], "x", color="black", markersize=12, mew=2)
    right.axhline(0, color="grey", linestyle="--", linewidth=1)
    left.set(xlabel="round", ylabel=objective, title="mean per candidate (95% interval)")
    right.set(
        xlabel="round",
        ylabel="difference to the leader (points)",
        title="vs the leader, race interval (x: eliminated)",
    )
    left.set_ylim(*clipped(*left.get_ylim()))  # an objective in [0, 1] drawn inside it
    for axis in (left, right):
        axis.set_xticks([r.number for r in race.rounds])
        axis.grid(alpha=0.3)
    left.legend(fontsize=8, loc="best")


def _interval(race: Race, candidate: str, seeds: tuple[int, ...]) -> Interval:
    """The candidate's mean over ``seeds`` with its 95% Student-t interval."""
    return t_interval([race.values[candidate][s] for s in seeds])
