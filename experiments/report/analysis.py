"""What a report compares: runs grouped into strategies (one configuration, one run per seed),
each strategy's interval per metric, its paired differences to the baseline of its block, and
the ranking. Nothing here words or renders anything."""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from experiments.stats import Interval, Paired, paired_difference, t_interval
from experiments.store import Run
from runner.fingerprint import RUNTIME_KEYS

METRICS = {
    "accuracy": "accuracy",
    "balanced_accuracy": "bal. acc",
    "macro_f1": "macro-F1",
    "many_accuracy": "many",
    "medium_accuracy": "medium",
    "few_accuracy": "few",
}
RANKED_BY = "balanced_accuracy"
COMPARED = ("balanced_accuracy", "few_accuracy")  # paired differences to the baseline
BASELINE = "uniform"
# Runs of a published recipe (runner/conf/method/: sampler, loss and settings together, tag `method`)
# form one block per data and model, compared with plain cross-entropy ("ce").
METHODS = "methods"
METHOD_BASELINE = "ce"
GROUP_BY = ("data", "model", "loss", "sampler", "variant")
# Overrides that do not change what is compared: the group choices (columns already), the seed,
# and what does not change what a run computes (resume=, where results go, threads, workers).
# Anything else (sampler.q=0.5, data.imbalance_factor=50) makes another configuration.
SAME_CONFIGURATION = {"seed", "data", "model", "loss", "sampler", "method", *RUNTIME_KEYS}
SAME_CONFIGURATION_PREFIXES = ("tracking.", "hydra.", "hydra/")


def variant(run: Run) -> str:
    """The run's other command-line overrides: runs that differ there are different
    configurations, not more seeds of one."""
    kept = []
    for override in run.tags.get("overrides", "").split():
        key = override.split("=")[0].lstrip("+~")
        if (
            override != "(none)"
            and key not in SAME_CONFIGURATION
            and not key.startswith(SAME_CONFIGURATION_PREFIXES)
        ):
            kept.append(override)
    return " ".join(sorted(kept)) or "-"


def configuration(run: Run) -> tuple[str, ...]:
    """(data, model, loss, sampler, variant); for a method run (data, model, "methods", method,
    variant): the method names its sampler and loss."""
    if "method" in run.tags:
        data, model = (run.tags.get(k, "?") for k in ("data", "model"))
        return (data, model, METHODS, run.tags["method"], variant(run))
    return tuple(run.tags.get(k, "?") for k in GROUP_BY[:-1]) + (variant(run),)


@dataclass
class Strategy:
    """One row: the runs of one configuration, one per seed."""

    key: tuple[str, ...]  # data, model, loss (or "methods"), sampler (or method), variant
    runs: list[Run]  # one per seed, by seed
    repeats: list[Run] = field(default_factory=list)  # older runs of a configuration and seed
    label: str = ""  # the row's name in tables: its block too when there are several
    name: str = ""  # ... without its block, for sentences that name the block already
    intervals: dict[str, Interval | None] = field(default_factory=dict)
    vs_baseline: dict[str, Paired | None] = field(default_factory=dict)
    baseline: Strategy | None = None
    baseline_name: str = BASELINE  # the sampler (or method) this row is compared with

    @property
    def block(self) -> tuple[str, ...]:
        return self.key[:3]

    @property
    def sampler(self) -> str:
        """The sampler's name, or the method's for a method run."""
        return self.key[3]

    def values(self, metric: str) -> dict[int, float]:
        """Final value of ``metric`` per seed (seeds without it left out)."""
        return {
            seed_key(r): r.metrics[f"final/{metric}"]
            for r in self.runs
            if f"final/{metric}" in r.metrics and not math.isnan(r.metrics[f"final/{metric}"])
        }

    def mean_of(self, prefix: str, classes: Sequence[str]) -> list[float] | None:
        """Mean over seeds of ``prefix/<class>`` per class (None if no run logged them)."""
        per_class = []
        for name in classes:
            values = [
                r.metrics[f"{prefix}/{name}"] for r in self.runs if f"{prefix}/{name}" in r.metrics
            ]
            if not values:
                return None
            per_class.append(sum(values) / len(values))
        return per_class


def seed_key(run: Run) -> int:
    """The run's seed: what pairs it with the runs of other strategies. A run without a seed
    pairs with nothing: a negative number of its own, from a digest of its run id, the same in
    every process (``hash()`` of a str is salted per process: rows and pairs would change from
    one report of the same runs to the next)."""
    if run.seed is not None:
        return run.seed
    digest = hashlib.sha256(run.run_id.encode()).digest()
    return -int.from_bytes(digest[:8], "big") - 1


def group_runs(runs: Iterable[Run]) -> list[Strategy]:
    """Finished runs -> one Strategy per configuration, the newest run per seed."""
    by_configuration: dict[tuple[str, ...], dict[int, list[Run]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for run in runs:
        by_configuration[configuration(run)][seed_key(run)].append(run)
    strategies = []
    for key, seeds in by_configuration.items():
        kept, repeats = [], []
        for seed in sorted(seeds):
            newest_first = sorted(seeds[seed], key=lambda r: r.start_time, reverse=True)
            kept.append(newest_first[0])
            repeats.extend(newest_first[1:])
        strategies.append(Strategy(key, kept, repeats))
    _label(strategies)
    return strategies


def _label(strategies: list[Strategy]) -> None:
    """Short row names: the sampler, plus whatever else differs between the rows."""
    blocks = {s.block for s in strategies}
    common = set.intersection(*(set(s.key[4].split()) for s in strategies)) if strategies else set()
    for s in strategies:
        extra = [o for o in s.key[4].split() if o not in common and o != "-"]
        s.name = s.sampler + (f" [{' '.join(extra)}]" if extra else "")
        s.label = f"{'/'.join(s.block)}: {s.name}" if len(blocks) > 1 else s.name


def analyse(strategies: list[Strategy], baseline: str | None = None) -> list[Strategy]:
    """Intervals per metric, paired differences to the baseline; best first within each (data,
    model, loss) block. The baseline of a block is ``baseline`` where the block has it, else
    ``uniform`` among samplers and plain cross-entropy (``ce``) among methods."""
    for s in strategies:
        for metric in METRICS:
            values = list(s.values(metric).values())
            s.intervals[metric] = t_interval(values) if values else None
    for block in {s.block for s in strategies}:
        members = [s for s in strategies if s.block == block]
        name = METHOD_BASELINE if block[2] == METHODS else BASELINE
        if baseline is not None and any(s.sampler == baseline for s in members):
            name = baseline
        candidates = [s for s in members if s.sampler == name]
        base = min(candidates, key=lambda s: len(s.label)) if candidates else None
        for s in members:
            s.baseline, s.baseline_name = base, name
            if base is None or s is base:
                continue
            for metric in COMPARED:
                s.vs_baseline[metric] = paired_difference(s.values(metric), base.values(metric))
    strategies.sort(key=lambda s: (s.block, -mean(s, RANKED_BY), s.label))
    return strategies


def mean(s: Strategy, metric: str) -> float:
    """The strategy's mean of ``metric`` over seeds; -inf without one (ranked last)."""
    interval = s.intervals.get(metric)
    return interval.mean if interval else -math.inf
