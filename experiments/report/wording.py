"""The report's words: table cells, one honest sentence per comparison, and the verdicts on
what the seeds can tell apart. Differences are spoken in percentage points."""

from __future__ import annotations

import math

from experiments.report.analysis import COMPARED, RANKED_BY, Strategy, mean
from experiments.stats import Interval, Paired, paired_difference

SPOKEN = {"balanced_accuracy": "balanced accuracy", "few_accuracy": "few-shot accuracy"}


def points(value: float) -> str:
    return f"{100 * value:+.1f}"


def interval_text(i: Interval) -> str:
    return f"95% CI [{points(i.low)}, {points(i.high)}]"


def cell(i: Interval | None) -> str:
    if i is None:
        return "—"
    return f"{i.mean:.4f}" if math.isnan(i.half_width) else f"{i.mean:.4f} ± {i.half_width:.4f}"


def diff_cell(p: Paired | None) -> str:
    if p is None:
        return "—"
    d = p.difference
    if math.isnan(d.half_width):
        return f"{points(d.mean)} (1 seed)"
    return f"{points(d.mean)} [{points(d.low)}, {points(d.high)}]"


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
