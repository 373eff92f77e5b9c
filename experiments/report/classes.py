"""The classes of a report's runs: their order by training count, and the many / medium /
few-shot groups a run's thresholds put them in."""

from __future__ import annotations

import re
from collections.abc import Sequence

from experiments.store import Run

SHOT_GROUPS = ("many", "medium", "few")


def class_order(runs: Sequence[Run]) -> tuple[list[str], dict[str, float]]:
    """Class names (from final/recall/<class>) by training count, most first; the counts, when
    the runs logged them (data/train_count/<class>), else natural name order."""
    names: dict[str, None] = {}
    counts: dict[str, float] = {}
    for run in runs:
        for key, value in run.metrics.items():
            if key.startswith("final/recall/"):
                names.setdefault(key.removeprefix("final/recall/"))
            elif key.startswith("data/train_count/"):
                counts.setdefault(key.removeprefix("data/train_count/"), value)

    def natural(name: str) -> tuple:
        return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))

    ordered = sorted(names, key=lambda n: (-counts.get(n, 0), natural(n)))
    return ordered, counts


def train_counts(run: Run) -> dict[str, float]:
    """Training images per class, as the run logged them (data/train_count/<class>)."""
    return {
        k.removeprefix("data/train_count/"): v
        for k, v in run.metrics.items()
        if k.startswith("data/train_count/")
    }


def shot_thresholds(run: Run) -> tuple[str, str] | None:
    """The run's eval.many_shot and eval.few_shot as it recorded them (a run records its whole
    config as params); None when it did not. No default is assumed here: the config's is the
    only one, and a guess could put classes in groups the run never evaluated."""
    many, few = run.params.get("eval.many_shot"), run.params.get("eval.few_shot")
    return (many, few) if many is not None and few is not None else None


def shot_groups(run: Run) -> dict[str, tuple[list[str], int]] | None:
    """many / medium / few -> (classes, test images), by the run's training counts and its
    eval.many_shot / eval.few_shot; None when the run did not log the counts or did not record
    the thresholds."""
    train = train_counts(run)
    thresholds = shot_thresholds(run)
    if not train or thresholds is None:
        return None
    many, few = (float(t) for t in thresholds)
    groups: dict[str, tuple[list[str], int]] = {g: ([], 0) for g in SHOT_GROUPS}
    for name, count in sorted(train.items(), key=lambda kv: -kv[1]):
        group = "many" if count > many else "few" if count < few else "medium"
        members, tests = groups[group]
        members.append(name)
        groups[group] = (members, tests + int(run.metrics.get(f"data/test_count/{name}", 0)))
    return groups
