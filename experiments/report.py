"""Which sampling strategy should I train with? The report of one sweep (or of an experiment).

Per strategy (a row: data, model, loss, sampler and any other override; seeds are the samples):
the number of seeds, the mean and 95% Student-t interval over seeds of the final test accuracy,
balanced accuracy, macro-F1 and many / medium / few accuracy, the paired difference to the
baseline strategy over the seeds both have, a ranking with a verdict on which differences the
seeds can tell apart, and plots. Runs that failed are left out; repeated runs of one
configuration and seed count once (the newest).

    python -m experiments.report                        # the newest sweep of experiment samplerlab
    python -m experiments.report --parent RUN_ID        # one sweep, by its parent run id
    python -m experiments.report --experiment study-digits --uri sqlite:///other.db --out report/

A sweep's report is logged onto its parent run (report.md, report.html, report_plots/*.png and
summary/<strategy>/... metrics) unless --no-log; a report over a whole experiment (no sweep in it)
is printed only. It reads the store and never creates one: a wrong --uri or --experiment is an
error (exit status 2).
"""

from __future__ import annotations

import argparse
import base64
import html
import math
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments import report_plots
from experiments.published import PUBLISHED
from experiments.stats import Interval, Paired, paired_difference, t_interval
from experiments.store import (
    Run,
    StoreError,
    child_runs,
    experiment_id,
    experiment_runs,
    get_run,
    latest_sweep,
    open_store,
)
from runner.config import RUNTIME_KEYS

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
SPOKEN = {"balanced_accuracy": "balanced accuracy", "few_accuracy": "few-shot accuracy"}
BASELINE = "uniform"
# Runs of a published recipe (conf/method/: sampler, loss and settings together, tag `method`)
# form one block per data and model, compared with plain cross-entropy ("ce").
METHODS = "methods"
METHOD_BASELINE = "ce"
GROUP_BY = ("data", "model", "loss", "sampler", "variant")
# Overrides that do not change what is compared: the group choices (columns already), the seed,
# and what does not change what a run computes (resume=, where results go, threads, workers).
# Anything else (sampler.q=0.5, data.imbalance_factor=50) makes another configuration.
SAME_CONFIGURATION = {"seed", "data", "model", "loss", "sampler", "method", *RUNTIME_KEYS}
SAME_CONFIGURATION_PREFIXES = ("tracking.", "hydra.", "hydra/")
SHOT_GROUPS = ("many", "medium", "few")


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
    label: str = ""
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
            _seed(r): r.metrics[f"final/{metric}"]
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


def _seed(run: Run) -> int:
    seed = run.seed
    # A run without a seed pairs with nothing: a negative number of its own.
    return seed if seed is not None else -(abs(hash(run.run_id)) % 10**9) - 1


def group_runs(runs: Iterable[Run]) -> list[Strategy]:
    """Finished runs -> one Strategy per configuration, the newest run per seed."""
    by_configuration: dict[tuple[str, ...], dict[int, list[Run]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for run in runs:
        by_configuration[configuration(run)][_seed(run)].append(run)
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
        label = s.sampler + (f" [{' '.join(extra)}]" if extra else "")
        if len(blocks) > 1:
            label = f"{'/'.join(s.block)}: {label}"
        s.label = label


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
        if any(s.sampler == baseline for s in members):
            name = baseline
        candidates = [s for s in members if s.sampler == name]
        base = min(candidates, key=lambda s: len(s.label)) if candidates else None
        for s in members:
            s.baseline, s.baseline_name = base, name
            if base is None or s is base:
                continue
            for metric in COMPARED:
                s.vs_baseline[metric] = paired_difference(s.values(metric), base.values(metric))
    strategies.sort(key=lambda s: (s.block, -_mean(s, RANKED_BY), s.label))
    return strategies


def _mean(s: Strategy, metric: str) -> float:
    interval = s.intervals.get(metric)
    return interval.mean if interval else -math.inf


# ---------------------------------------------------------------------------------- wording


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
                unpaired.append(other.label)
            elif not p.difference.excludes_zero:
                tied[other.label] = len(p.seeds)
        ranking = ", ".join(f"{s.label} {_mean(s, RANKED_BY):.4f}" for s in members)
        answer = f"{prefix}best by balanced accuracy: {top.label}"
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
            lines.append(prefix + compare(top.label, other.label, "balanced accuracy", p))
        base = top.baseline
        for s in members:
            if base is None or s is base:
                continue
            for metric in COMPARED:
                if base.intervals.get(metric) and s.intervals.get(metric):
                    lines.append(
                        prefix + compare(s.label, base.label, SPOKEN[metric], s.vs_baseline[metric])
                    )
        if base is None:
            lines.append(
                f"{prefix}no {top.baseline_name!r} runs: no paired comparison to a baseline."
            )
    return list(dict.fromkeys(lines))  # the top strategy against the baseline comes up twice


# ---------------------------------------------------------------------------- class groups


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


def group_cell(classes: list[str], tests: int) -> str:
    if not classes:
        return "none"
    return f"{len(classes)} class{'es' if len(classes) != 1 else ''}, {tests} test images"


# -------------------------------------------------------------------------------- document


@dataclass
class Report:
    title: str
    strategies: list[Strategy]
    left_out: list[Run]  # failed, killed or unfinished
    blocks: list[tuple[str, Any]] = field(default_factory=list)  # rendered content
    images: dict[str, bytes] = field(default_factory=dict)  # report_plots/<name>.png -> PNG

    @property
    def runs(self) -> int:
        return sum(len(s.runs) for s in self.strategies)


def _table(strategies: list[Strategy]) -> tuple[list[str], list[list[str]]]:
    base = next((s.baseline.label for s in strategies if s.baseline), BASELINE)
    header = ["strategy", "seeds", *METRICS.values()]
    header += [f"Δ {METRICS[m]} vs {base} (points)" for m in COMPARED]
    rows = []
    for s in strategies:
        row = [s.label, str(len(s.runs)), *(cell(s.intervals.get(m)) for m in METRICS)]
        row += [
            "baseline" if s is s.baseline else diff_cell(s.vs_baseline.get(m)) for m in COMPARED
        ]
        rows.append(row)
    return header, rows


def build_report(
    runs: Sequence[Run], title: str, baseline: str | None = None, plots: bool = True
) -> Report:
    finished = [r for r in runs if r.status == "FINISHED" and "sampler" in r.tags]
    left_out = [r for r in runs if r not in finished]
    strategies = analyse(group_runs(finished), baseline)
    report = Report(title, strategies, left_out)
    add = report.blocks.append
    add(("h1", title))
    if not strategies:
        add(("p", "No finished runs: nothing to compare."))
        _notes(report)
        return report
    add(("h2", "Answer"))
    add(("ul", verdicts(strategies)))
    add(("h2", "Final test metrics per strategy"))
    header, rows = _table(strategies)
    add(("table", header, rows))
    add(
        (
            "p",
            "Mean ± half-width of the 95% Student-t confidence interval over seeds (t with n−1 "
            "degrees of freedom; no interval from one seed). Δ: the paired difference to the "
            "baseline over the seeds both have (same seed: same data subset and initialisation), "
            "in percentage points, with its 95% interval; an interval that excludes 0 is a "
            "difference the seeds can tell apart. Intervals are per comparison, with no "
            "correction for making several. Values are from the final epoch (no test-selected "
            "best epoch). The test sets are balanced.",
        )
    )
    _published(report)
    _class_groups(report)
    if plots:
        _plots(report)
    _runs_table(report)
    _notes(report)
    return report


def _published(report: Report) -> None:
    """Each method beside its published top-1 error, for runs that name a table
    (``tracking.reference``, tag ``reference``): our mean error with its interval, and the
    difference to the published number (a constant: the interval is ours, shifted)."""
    for reference_name in dict.fromkeys(
        s.runs[0].tags.get("reference", "") for s in report.strategies if s.key[2] == METHODS
    ):
        reference = PUBLISHED.get(reference_name)
        if reference is None:
            continue
        members = [
            s
            for s in report.strategies
            if s.key[2] == METHODS and s.runs[0].tags.get("reference") == reference_name
        ]
        rows = []
        for s in sorted(members, key=lambda s: reference.errors.get(s.sampler, math.inf)):
            accuracy = s.intervals.get("accuracy")
            if accuracy is None:
                continue
            error = 100 * (1 - accuracy.mean)
            spread = (
                "" if math.isnan(accuracy.half_width) else f" ± {100 * accuracy.half_width:.2f}"
            )
            published = reference.errors.get(s.sampler)
            if published is None:
                rows.append([s.label, str(len(s.runs)), "—", f"{error:.2f}{spread}", "—"])
                continue
            difference = f"{error - published:+.2f}"
            if spread:
                half = 100 * accuracy.half_width
                difference += f" [{error - half - published:+.2f}, {error + half - published:+.2f}]"
            rows.append(
                [s.label, str(len(s.runs)), f"{published:.2f}", f"{error:.2f}{spread}", difference]
            )
        if not rows:
            continue
        run = members[0].runs[0]
        epochs = int(run.params.get("trainer.epochs", "0") or 0)
        extra = max(
            int(r.params.get("trainer.classifier_epochs", "0") or 0)
            for m in members
            for r in m.runs
        )
        ours = (
            f"{run.tags.get('model', '?')}, {epochs} epochs, batch "
            f"{run.params.get('trainer.batch_size', '?')}, lr {run.params.get('trainer.lr', '?')}, "
            f"data {run.tags.get('data', '?')}"
        )
        report.blocks.append(("h2", f"Against the published table: {reference.title}"))
        report.blocks.append(
            (
                "table",
                ["method", "seeds", "published error %", "our error %", "ours − published"],
                rows,
            )
        )
        caveats = [
            f"Top-1 error on the balanced test set, 100 × (1 − final accuracy), mean ± half-width "
            f"of the 95% Student-t interval over seeds; the difference's interval is ours shifted "
            f"(the published numbers come without a spread). Published recipe: {reference.recipe}. "
            f"These runs: {ours}" + (f" (cRT: +{extra} classifier epochs)" if extra else "") + "."
        ]
        if run.tags.get("data") == "image_folder_lt":
            caveats.append(
                "Data from an image folder: if it is the JPEG export of CIFAR-10, its pixels are "
                "JPEG-decoded (quality 75), not the original bytes: close to, not the same as, "
                "the published setting."
            )
        if run.tags.get("model") != "resnet32" or epochs < 200:
            caveats.append(
                "Not the published recipe: compare the methods' order and gaps with each other, "
                "not the error levels with the published ones."
            )
        report.blocks.append(("ul", caveats))


def _class_groups(report: Report) -> None:
    described: dict[tuple, list[str]] = defaultdict(list)
    missing = []
    for s in report.strategies:
        groups = shot_groups(s.runs[0])
        if groups is None:
            missing.append(s.label)
            continue
        run = s.runs[0]
        thresholds = (
            run.params.get("eval.many_shot", "100"),
            run.params.get("eval.few_shot", "20"),
        )
        cells = tuple(group_cell(*groups[g]) for g in SHOT_GROUPS)
        described[(s.key[0], thresholds, cells)].append(s.label)
    report.blocks.append(("h2", "Many / medium / few-shot classes"))
    if described:
        header = ["data", "strategies", "many", "medium", "few"]
        rows = []
        for (data, _thresholds, cells), labels in described.items():
            names = "all" if len(labels) == len(report.strategies) else ", ".join(labels)
            rows.append([data, names, *cells])
        report.blocks.append(("table", header, rows))
        many, few = next(iter(described))[1]
        report.blocks.append(
            (
                "p",
                f"Many-shot: more than {many} training images (eval.many_shot), few-shot: fewer "
                f"than {few} (eval.few_shot), medium: the rest; a group's accuracy is the mean "
                "recall of its classes on the test set.",
            )
        )
    if missing:
        report.blocks.append(
            (
                "p",
                "Class counts were not logged (data/train_count/<class>) by the runs of: "
                + ", ".join(missing),
            )
        )


def _plots(report: Report) -> None:
    all_runs = [r for s in report.strategies for r in s.runs]
    classes, counts = class_order(all_runs)
    images = report.images
    groups = shot_groups(report.strategies[0].runs[0])
    by_class = None
    if groups:
        by_class = {c: g for g in SHOT_GROUPS for c in groups[g][0]}
    if classes:
        recall = {s.label: s.mean_of("final/recall", classes) for s in report.strategies}
        recall = {k: v for k, v in recall.items() if v is not None}
        if recall:
            labels = [by_class.get(c, "?") for c in classes] if by_class else None
            images["report_plots/recall_by_class.png"] = report_plots.png(
                report_plots.recall_by_strategy(recall, classes, labels)
            )
        drawn = {s.label: s.mean_of("sampling/share", classes) for s in report.strategies}
        drawn = {k: v for k, v in drawn.items() if v is not None}
        if drawn:
            intended = {s.label: s.mean_of("sampling/target", classes) for s in report.strategies}
            images["report_plots/class_shares.png"] = report_plots.png(
                report_plots.shares_by_strategy(drawn, intended, classes)
            )
    images["report_plots/final_metrics.png"] = report_plots.png(
        report_plots.metrics_with_intervals(
            {s.label: s.intervals for s in report.strategies}, METRICS
        )
    )
    report.blocks.append(("h2", "Plots"))
    captions = {
        "report_plots/final_metrics.png": "Final metrics with 95% intervals over seeds.",
        "report_plots/recall_by_class.png": "Per-class test recall (mean over seeds), classes "
        "ordered by training count"
        + ("" if counts else " (not logged by these runs: by name)")
        + ".",
        "report_plots/class_shares.png": "What each sampler drew in the last epoch (bars) "
        "against what it intended (black), mean over seeds"
        + (
            ""
            if any(s.mean_of("sampling/target", classes) for s in report.strategies)
            else " (intended shares not logged by these runs)"
        )
        + ".",
    }
    for name, caption in captions.items():
        if name in images:
            report.blocks.append(("img", name, caption))


def _runs_table(report: Report) -> None:
    rows = [[s.label, str(r.seed), r.name, r.run_id] for s in report.strategies for r in s.runs]
    report.blocks.append(("h2", "Runs"))
    report.blocks.append(("table", ["strategy", "seed", "run", "run id"], rows))


def _notes(report: Report) -> None:
    notes = []
    repeats = [r for s in report.strategies for r in s.repeats]
    if repeats:
        notes.append(
            f"{len(repeats)} older run(s) repeating a configuration and seed are left out (the "
            "newest counts, once): " + ", ".join(f"{r.name} ({r.run_id[:8]})" for r in repeats)
        )
    if report.left_out:
        statuses = Counter(r.status for r in report.left_out)
        notes.append(
            f"{len(report.left_out)} run(s) left out because they did not finish ("
            + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
            + "): "
            + ", ".join(f"{r.name} ({r.run_id[:8]})" for r in report.left_out)
        )
    one_seed = [s.label for s in report.strategies if len(s.runs) == 1]
    if one_seed:
        notes.append("One seed only (no interval): " + ", ".join(one_seed))
    if notes:
        report.blocks.append(("h2", "Notes"))
        report.blocks.append(("ul", notes))


def markdown(report: Report, skip: Iterable[str] = ()) -> str:
    """The report as Markdown; sections (h2 titles) in ``skip`` left out."""
    out = []
    skipping = False
    for kind, *content in report.blocks:
        if kind == "h2":
            skipping = content[0] in skip
        if skipping:
            continue
        if kind == "h1":
            out.append(f"# {content[0]}\n")
        elif kind == "h2":
            out.append(f"## {content[0]}\n")
        elif kind == "p":
            out.append(f"{content[0]}\n")
        elif kind == "ul":
            out.append("\n".join(f"- {item}" for item in content[0]) + "\n")
        elif kind == "table":
            out.append(markdown_table(*content) + "\n")
        elif kind == "img":
            out.append(f"![{content[1]}]({content[0]})\n")
    return "\n".join(out)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:0.8em 0;font-size:0.9em}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3} td{font-variant-numeric:tabular-nums;white-space:nowrap}
figure{margin:1em 0} img{max-width:100%} figcaption{color:#555;font-size:0.9em}
"""


def to_html(report: Report) -> str:
    """The report as one self-contained HTML page (plots embedded as data URIs)."""
    e = html.escape
    body = []
    for kind, *content in report.blocks:
        if kind in ("h1", "h2", "p"):
            body.append(f"<{kind}>{e(content[0])}</{kind}>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in content[0]) + "</ul>")
        elif kind == "table":
            header, rows = content
            head = "".join(f"<th>{e(h)}</th>" for h in header)
            cells = "".join(
                "<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows
            )
            body.append(f'<table class="results"><tr>{head}</tr>{cells}</table>')
        elif kind == "img":
            name, caption = content
            data = base64.b64encode(report.images[name]).decode()
            body.append(
                f'<figure><img alt="{e(caption)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{e(caption)}</figcaption></figure>"
            )
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8">'
        f"<title>{e(report.title)}</title><style>{STYLE}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )


# ----------------------------------------------------------------------- summary metrics


def _metric_name(label: str) -> str:
    """A row's label as one metric-name part: "uniform [sampler.q=0.5]" -> uniform_sampler.q_0.5."""
    return re.sub(r"[^A-Za-z0-9_\-.]+", "_", label).strip("_")


def summary_metrics(report: Report) -> dict[str, float]:
    """summary/<strategy>/final_<metric>_mean and _ci95 (half-width), n_seeds, and the paired
    differences to the baseline, vs_<baseline>_<metric>_mean / _ci95 (rounded to 6 decimals,
    for the UI's table)."""
    out: dict[str, float] = {}
    for s in report.strategies:
        prefix = f"summary/{_metric_name(s.label)}"
        out[f"{prefix}/n_seeds"] = len(s.runs)
        for metric, i in s.intervals.items():
            if i is None:
                continue
            out[f"{prefix}/final_{metric}_mean"] = i.mean
            if not math.isnan(i.half_width):
                out[f"{prefix}/final_{metric}_ci95"] = i.half_width
        for metric, p in s.vs_baseline.items():
            if p is None or s.baseline is None:
                continue
            base = _metric_name(s.baseline.sampler)
            out[f"{prefix}/vs_{base}_{metric}_mean"] = p.difference.mean
            if not math.isnan(p.difference.half_width):
                out[f"{prefix}/vs_{base}_{metric}_ci95"] = p.difference.half_width
    return {k: round(v, 6) for k, v in out.items()}


def report_files(report: Report) -> dict[str, Any]:
    return {"report.md": markdown(report), "report.html": to_html(report), **report.images}


# --------------------------------------------------------------------------------- publish


def _again(parent_run_id: str, uri: str) -> str:
    from runner.stores import project_store

    project = uri == project_store()
    cli = f"python -m experiments.report --parent {parent_run_id}" + (
        "" if project else f" --uri {uri}"
    )
    make = f"make report PARENT={parent_run_id}" if project else None
    ui = "make ui" if project else f"mlflow ui --backend-store-uri {uri}"
    return cli, make, ui


def publish(uri: str | None, parent_run_id: str, baseline: str | None = None) -> str:
    """Build the report of a sweep's child runs and log it onto its parent run (report.md,
    report.html, report_plots/*.png, summary/... metrics). Returns a short text for the
    console: the answer, where the report is, and how to rebuild it. Never raises for an empty
    or all-failed sweep, or a store / run that is not there (the text says so)."""
    from runner.tracking import log_to_run

    try:
        client, resolved = open_store(uri)
        parent = get_run(client, resolved, parent_run_id)
        runs = child_runs(client, parent)
    except StoreError as err:
        return f"samplerlab report: {err}"
    report = build_report(runs, _title(parent), baseline)
    cli, make, ui = _again(parent_run_id, resolved)
    if not report.strategies:
        failed = f" ({len(report.left_out)} did not finish)" if report.left_out else ""
        return (
            f"samplerlab report: sweep {parent.name} (parent run {parent_run_id}) has no "
            f"finished runs{failed}: nothing to report."
        )
    log_to_run(resolved, parent_run_id, summary_metrics(report), report_files(report))
    return console_text(report, parent, resolved, cli, make, ui)


def _title(parent: Run) -> str:
    return f"Sampling strategies compared: sweep {parent.name}"


def console_text(report: Report, parent: Run, uri: str, cli: str, make: str | None, ui: str) -> str:
    header, rows = _table(report.strategies)
    said = [v for v in verdicts(report.strategies) if "ranking (mean final" not in v]
    keep = [0, 1, 3, 7, 8, 9]  # strategy, seeds, bal. acc, few, the two Δ
    lines = [
        f"samplerlab report: sweep {parent.name}, parent run {parent.run_id}: "
        f"{len(report.strategies)} strategies, {report.runs} runs",
        markdown_table([header[i] for i in keep], [[r[i] for i in keep] for r in rows]),
        "(mean ± 95% CI half-width over seeds; Δ: paired difference in points [95% CI])",
        *(f"  {line}" for line in said[:8]),
        *([f"  ... {len(said) - 8} more comparisons in the report"] if len(said) > 8 else []),
        f"Report on the parent run (artifacts report.html, report.md, report_plots/; metrics "
        f"summary/*): {ui}, experiment {parent.experiment_id}, run {parent.name}.",
        f"Rebuild: {make + '  or  ' if make else ''}{cli}",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--parent", default=None, help="a sweep's parent run id")
    parser.add_argument(
        "--experiment",
        default="samplerlab",
        help="without --parent: its newest sweep, or all its runs when it has no sweep",
    )
    parser.add_argument(
        "--all-runs",
        action="store_true",
        help="every run of --experiment, across its sweeps (e.g. a study run in parts)",
    )
    parser.add_argument(
        "--uri", default=None, help="tracking URI (default: the project store, as for runs)"
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help=f"the sampler or method compared against (default: {BASELINE!r} among samplers, "
        f"{METHOD_BASELINE!r} among methods)",
    )
    parser.add_argument("--out", default=None, help="also write the report files to this folder")
    parser.add_argument(
        "--no-log", action="store_true", help="print only: log nothing onto the parent run"
    )
    args = parser.parse_args(argv)
    try:
        client, uri = open_store(args.uri)
        if args.parent:
            parent: Run | None = get_run(client, uri, args.parent)
        elif args.all_runs:
            parent = None
        else:
            parent = latest_sweep(client, experiment_id(client, uri, args.experiment))
        if parent is not None:
            runs = child_runs(client, parent)
            title = _title(parent)
        else:
            runs = experiment_runs(client, experiment_id(client, uri, args.experiment))
            title = f"Sampling strategies compared: experiment {args.experiment}"
    except StoreError as err:
        print(f"experiments.report: {err}", file=sys.stderr)
        return 2
    report = build_report(runs, title, args.baseline)
    known = sorted({s.sampler for s in report.strategies})
    if args.baseline and known and args.baseline not in known:
        print(
            f"experiments.report: --baseline {args.baseline!r}: no finished runs of it here\n"
            f"pass one of {known}, or leave --baseline out (uniform / ce)",
            file=sys.stderr,
        )
        return 2
    print(markdown(report, skip=("Plots", "Runs")))
    if args.out:
        out = Path(args.out)
        for name, content in report_files(report).items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                (out / name).write_bytes(content)
            else:
                (out / name).write_text(content)
        print(f"written to {out}/ (report.html, report.md, report_plots/)")
    if parent is not None and report.strategies and not args.no_log:
        from runner.tracking import log_to_run

        log_to_run(uri, parent.run_id, summary_metrics(report), report_files(report))
        cli, make, ui = _again(parent.run_id, uri)
        print(
            f"logged onto parent run {parent.run_id} ({parent.name}): report.html, report.md, "
            f"report_plots/*.png, summary/* metrics; browse: {ui}"
        )
    return 0 if report.strategies else 1


if __name__ == "__main__":
    sys.exit(main())
