"""A sweep's report published: the summary metrics logged onto its parent run (for the UI's
table), the report files beside them, and the short text the console prints at a sweep's end."""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from experiments.report.analysis import RANKED_BY
from experiments.report.document import Report, build_report, metrics_table
from experiments.report.render import markdown_table, report_files
from experiments.report.wording import race_tags, verdicts
from experiments.store import Run, StoreError, child_runs, get_run, open_store

# The console's table: the ranked metric and the few-shot one (with every paired difference).
CONSOLE_METRICS = (RANKED_BY, "few_accuracy")


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


class Rebuild(NamedTuple):
    """How to rebuild a sweep's report and browse it, in the words of the store it is in."""

    cli: str  # samplerlab report --parent ID (--uri URI outside the folder's own store)
    ui: str  # samplerlab ui (--uri URI), or a tracking server's address


def rebuild(parent_run_id: str, uri: str) -> Rebuild:
    """The commands for the report of ``parent_run_id`` in the store at ``uri`` (resolved), as
    a user types them in the folder they ran from."""
    from runner.tracking.stores import browse_command, project_store

    store = "" if uri == project_store() else f" --uri {uri}"
    return Rebuild(f"samplerlab report --parent {parent_run_id}{store}", browse_command(uri))


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
    report = build_report(runs, sweep_title(parent), baseline, race=race_tags(parent.tags))
    if not report.strategies:
        failed = f" ({len(report.left_out)} did not finish)" if report.left_out else ""
        return (
            f"samplerlab report: sweep {parent.name} (parent run {parent_run_id}) has no "
            f"finished runs{failed}: nothing to report."
        )
    log_to_run(resolved, parent_run_id, summary_metrics(report), report_files(report))
    return console_text(report, parent, resolved)


def sweep_title(parent: Run) -> str:
    """The title of a sweep's report (the CLI's too, for one sweep)."""
    return f"Sampling strategies compared: sweep {parent.name}"


def console_text(report: Report, parent: Run, uri: str) -> str:
    """What a sweep prints at its end: the ranked metric, the few-shot one and the paired
    differences per strategy, the first verdicts, where the report is and how to rebuild it,
    for the store at ``uri`` (resolved) that holds ``parent``."""
    header, rows = metrics_table(report.strategies, CONSOLE_METRICS)
    said = [v for v in verdicts(report.strategies) if "ranking (mean final" not in v]
    commands = rebuild(parent.run_id, uri)
    lines = [
        f"samplerlab report: sweep {parent.name}, parent run {parent.run_id}: "
        f"{len(report.strategies)} strategies, {report.runs} runs",
        markdown_table(header, rows),
        "(mean ± 95% CI half-width over seeds; Δ: paired difference in points [95% CI])",
        *(
            [
                f"  a race (advised: {report.race.get('advice/advised', '?')}, on validation, "
                "corrected for multiplicity): the test-set comparisons below confirm it, "
                "uncorrected; they are not a second verdict"
            ]
            if report.race
            else []
        ),
        *(f"  {line}" for line in said[:8]),
        *([f"  ... {len(said) - 8} more comparisons in the report"] if len(said) > 8 else []),
        f"Report on the parent run (artifacts report.html, report.md, report_plots/; metrics "
        f"summary/*): {commands.ui}, experiment {parent.experiment_id}, run {parent.name}.",
        f"Rebuild: {commands.cli}",
    ]
    return "\n".join(lines)
