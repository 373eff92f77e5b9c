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


def shot_groups(run: Run) -> dict[str, tuple[list[str], int]] | None:
    """many / medium / few -> (classes, test images), by the run's training counts and its
    eval.many_shot / eval.few_shot; None when the run did not log the counts."""
    train = {
        k.removeprefix("data/train_count/"): v
        for k, v in run.metrics.items()
        if k.startswith("data/train_count/")
    }
    if not train:
        return None
    many = float(run.params.get("eval.many_shot", 100))
    few = float(run.params.get("eval.few_shot", 20))
    groups: dict[str, tuple[list[str], int]] = {g: ([], 0) for g in SHOT_GROUPS}
    for name, count in sorted(train.items(), key=lambda kv: -kv[1]):
        group = "many" if count > many else "few" if count < few else "medium"
        members, tests = groups[group]
        members.append(name)
        groups[group] = (members, tests + int(run.metrics.get(f"data/test_count/{name}", 0)))
    return groups
