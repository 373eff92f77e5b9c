"""The report as a document: a title, the strategies it compares, and a list of blocks
(headings, paragraphs, lists, tables, images) that the renderers turn into Markdown or HTML.
:func:`build_report` is the one place that decides what the report says, in which order."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from experiments.published import PUBLISHED
from experiments.report.analysis import (
    BASELINE,
    COMPARED,
    METHODS,
    METRICS,
    Strategy,
    analyse,
    group_runs,
)
from experiments.report.classes import (
    SHOT_GROUPS,
    class_order,
    shot_groups,
    shot_thresholds,
    train_counts,
)
from experiments.report.plots import (
    metrics_with_intervals,
    png,
    recall_by_strategy,
    shares_by_strategy,
)
from experiments.report.wording import (
    CONFIRMATION,
    diff_cell,
    group_cell,
    race_note,
    verdicts,
)
from experiments.stats import interval_cell
from experiments.store import Run

# One piece of content, its kind first: ("h1" | "h2" | "p", text), ("ul", [items]),
# ("table", header, rows) or ("img", "report_plots/<name>.png", caption).
Block = tuple[Any, ...]


@dataclass
class Report:
    """What the report says, before rendering: the strategies compared (analysed, best first
    per block), the runs left out, the content in order, and the plots the content names."""

    title: str
    strategies: list[Strategy]
    left_out: list[Run]  # failed, killed or unfinished
    blocks: list[Block] = field(default_factory=list)
    images: dict[str, bytes] = field(default_factory=dict)  # report_plots/<name>.png -> PNG
    race: dict[str, str] = field(default_factory=dict)  # a race's answer (its advice/* tags)

    @property
    def runs(self) -> int:
        return sum(len(s.runs) for s in self.strategies)


def metrics_table(
    strategies: list[Strategy], metrics: Sequence[str] | None = None
) -> tuple[list[str], list[list[str]]]:
    """Header and rows: per strategy its seeds, the interval of each of ``metrics`` (names in
    :data:`METRICS`; all of them, in that order, by default) and its paired differences to the
    baseline on the :data:`COMPARED` metrics."""
    shown = list(METRICS) if metrics is None else list(metrics)
    base = next((s.baseline.label for s in strategies if s.baseline), BASELINE)
    header = ["strategy", "seeds", *(METRICS[m] for m in shown)]
    header += [f"Δ {METRICS[m]} vs {base} (points)" for m in COMPARED]
    rows = []
    for s in strategies:
        row = [s.label, str(len(s.runs)), *(interval_cell(s.intervals.get(m)) for m in shown)]
        row += [
            "baseline" if s is s.baseline else diff_cell(s.vs_baseline.get(m)) for m in COMPARED
        ]
        rows.append(row)
    return header, rows


def build_report(
    runs: Sequence[Run],
    title: str,
    baseline: str | None = None,
    plots: bool = True,
    race: dict[str, str] | None = None,
) -> Report:
    """The report of ``runs``, any status: the finished training runs are compared, the others
    left out and named in the notes. ``baseline`` as for :func:`analyse`; ``plots=False`` leaves
    the figures out (a table without matplotlib's time). ``race``: the ``advice/*`` tags of a
    race's parent run (:func:`experiments.report.wording.race_tags`): the answer is the race's,
    and the report's test-set comparisons are titled and worded as its confirmation."""
    finished = [r for r in runs if r.status == "FINISHED" and "sampler" in r.tags]
    left_out = [r for r in runs if r not in finished]
    strategies = analyse(group_runs(finished), baseline)
    report = Report(title, strategies, left_out, race=dict(race or {}))
    add = report.blocks.append
    add(("h1", title))
    if not strategies:
        add(("p", "No finished runs: nothing to compare."))
        _notes(report)
        return report
    if report.race:
        add(("h2", "The race's answer"))
        add(("p", race_note(report.race)))
        add(("h2", CONFIRMATION))
    else:
        add(("h2", "Answer"))
    add(("ul", verdicts(strategies)))
    add(("h2", "Final test metrics per strategy"))
    header, rows = metrics_table(strategies)
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
    no_counts: list[str] = []
    no_thresholds: list[str] = []
    for s in report.strategies:
        run = s.runs[0]
        groups = shot_groups(run)
        if groups is None:
            (no_thresholds if train_counts(run) else no_counts).append(s.label)
            continue
        cells = tuple(group_cell(*groups[g]) for g in SHOT_GROUPS)
        described[(s.key[0], shot_thresholds(run), cells)].append(s.label)
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
    if no_counts:
        report.blocks.append(
            (
                "p",
                "Class counts were not logged (data/train_count/<class>) by the runs of: "
                + ", ".join(no_counts),
            )
        )
    if no_thresholds:
        report.blocks.append(
            (
                "p",
                "The shot thresholds were not recorded (params eval.many_shot, eval.few_shot) "
                "by the runs of: " + ", ".join(no_thresholds) + ": no many / medium / few "
                "classes for them.",
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
        recall = {
            s.label: means
            for s in report.strategies
            if (means := s.mean_of("final/recall", classes)) is not None
        }
        if recall:
            labels = [by_class.get(c, "?") for c in classes] if by_class else None
            images["report_plots/recall_by_class.png"] = png(
                recall_by_strategy(recall, classes, labels)
            )
        drawn = {
            s.label: means
            for s in report.strategies
            if (means := s.mean_of("sampling/share", classes)) is not None
        }
        if drawn:
            intended = {s.label: s.mean_of("sampling/target", classes) for s in report.strategies}
            images["report_plots/class_shares.png"] = png(
                shares_by_strategy(drawn, intended, classes)
            )
    images["report_plots/final_metrics.png"] = png(
        metrics_with_intervals({s.label: s.intervals for s in report.strategies}, METRICS)
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
