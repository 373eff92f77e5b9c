"""The report's words: table cells, one honest sentence per comparison, and the verdicts on
what the seeds can tell apart. Differences are spoken in percentage points."""

from __future__ import annotations

import math
from collections.abc import Mapping

from experiments.report.analysis import COMPARED, RANKED_BY, Strategy, mean
from experiments.stats import (
    Interval,
    Paired,
    clipped,
    difference_cell,
    paired_difference,
    points,
)

SPOKEN = {"balanced_accuracy": "balanced accuracy", "few_accuracy": "few-shot accuracy"}
RACE_TAGS = "advice/"  # a race's answer on its parent run (experiments.race.advice)
CONFIRMATION = "The test set: a confirmation, not a second verdict"


def race_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """The race's answer among a parent run's tags (empty when the sweep was no race)."""
    return {k: v for k, v in tags.items() if k.startswith(RACE_TAGS)}


def race_note(race: Mapping[str, str]) -> str:
    """What a race's parent report says before its test-set comparisons: the race compared on
    validation, corrected for its multiplicity; these compare on the test set, uncorrected."""
    objective = race.get("advice/objective", "its validation objective")
    advised = race.get("advice/advised", "?")
    return (
        f"This sweep was a race: its answer, advised: {advised}, is in advice.md on this run. "
        f"The race compared the candidates on {objective} (the validation split), corrected for "
        "its multiplicity (alpha spent over its rounds and over the comparisons with the "
        "leader). The comparisons below are on the test set, each on its own with no correction, "
        "some on fewer seeds (candidates the race took out early): a confirmation, not a second "
        "verdict. A test-set difference the race did not find, or one it found and these do not "
        "show, does not overturn its answer."
    )


def interval_text(i: Interval) -> str:
    low, high = clipped(i.low, i.high, (-1.0, 1.0))
    return f"95% CI [{points(low)}, {points(high)}]"


def diff_cell(p: Paired | None) -> str:
    if p is None:
        return "—"
    d = p.difference
    if math.isnan(d.half_width):
        return f"{points(d.mean)} (1 seed)"
    return difference_cell(d.mean, d.low, d.high)


def group_cell(classes: list[str], tests: int) -> str:
    if not classes:
        return "none"
    return f"{len(classes)} class{'es' if len(classes) != 1 else ''}, {tests} test images"


def _seeds(n: int) -> str:
    return f"{n} seed{'s' if n != 1 else ''}"


def compare(a: str, b: str, what: str, p: Paired | None) -> str:
    """One honest sentence on ``a - b``."""
    if p is None:
        return f"{a} vs {b} on {what}: no seed in common, no paired comparison"
    d, n = p.difference, len(p.seeds)
    if n < 2:
        return f"{a} vs {b} on {what}: {points(d.mean)} points from 1 paired seed: no interval"
    if d.half_width == 0:  # the same difference on every seed: no spread to speak of
        if d.mean == 0:
            return f"{a} and {b} tie on {what}: the same on each of {n} paired seeds"
        sign = ">" if d.mean > 0 else "<"
        return f"{a} {sign} {b} on {what}: {points(d.mean)} points on each of {n} paired seeds"
    if d.excludes_zero:
        sign = ">" if d.mean > 0 else "<"
        return f"{a} {sign} {b} on {what}: {points(d.mean)} points, {interval_text(d)} ({n} paired seeds)"
    return (
        f"{a} vs {b} on {what}: {points(d.mean)} points, {interval_text(d)}: "
        f"not distinguishable with {_seeds(n)}"
    )


def verdicts(strategies: list[Strategy]) -> list[str]:
    """The ranking and what the seeds can tell apart, per (data, model, loss) block."""
    lines = []
    for block in dict.fromkeys(s.block for s in strategies):
        members = [s for s in strategies if s.block == block and s.intervals.get(RANKED_BY)]
        if not members:
            continue
        prefix = f"{'/'.join(block)}: " if len({s.block for s in strategies}) > 1 else ""
        top = members[0]
        tied: dict[str, int] = {}  # label -> paired seeds
        unpaired = []
        for other in members[1:]:
            p = paired_difference(top.values(RANKED_BY), other.values(RANKED_BY))
            if p is None or len(p.seeds) < 2:
                unpaired.append(other.name)
            elif not p.difference.excludes_zero:
                tied[other.name] = len(p.seeds)
        ranking = ", ".join(f"{s.name} {mean(s, RANKED_BY):.4f}" for s in members)
        answer = f"{prefix}best by balanced accuracy: {top.name}"
        if tied:
            if len(set(tied.values())) == 1:
                names = ", ".join(tied)
                answer += f"; not distinguishable from it with {_seeds(next(iter(tied.values())))}: {names}"
            else:
                names = ", ".join(f"{k} ({_seeds(n)})" for k, n in tied.items())
                answer += f"; not distinguishable from it: {names}"
        if unpaired:
            answer += f"; fewer than 2 paired seeds, not compared: {', '.join(unpaired)}"
        lines.append(answer + ".")
        lines.append(f"{prefix}ranking (mean final balanced accuracy): {ranking}.")
        for other in members[1:]:
            p = paired_difference(top.values(RANKED_BY), other.values(RANKED_BY))
            lines.append(prefix + compare(top.name, other.name, "balanced accuracy", p))
        base = top.baseline
        for s in members:
            if base is None or s is base:
                continue
            for metric in COMPARED:
                if base.intervals.get(metric) and s.intervals.get(metric):
                    lines.append(
                        prefix + compare(s.name, base.name, SPOKEN[metric], s.vs_baseline[metric])
                    )
        if base is None:
            lines.append(
                f"{prefix}no {top.baseline_name!r} runs: no paired comparison to a baseline."
            )
    return list(dict.fromkeys(lines))  # the top strategy against the baseline comes up twice
