"""Which sampling strategy should I train with? The report of one sweep (or of an experiment):
runs grouped and compared (:mod:`.analysis`), worded (:mod:`.wording`), laid out as a document
(:mod:`.document`), rendered as Markdown and HTML (:mod:`.render`), published onto a sweep's
parent run (:mod:`.publishing`), and its command line (:mod:`.cli`, ``python -m
experiments.report``). The Hydra callback that publishes it at a sweep's end is
:mod:`experiments.report_callback` (outside the package: it imports none of this until then)."""

from experiments.report.analysis import (
    BASELINE,
    METHOD_BASELINE,
    METRICS,
    Strategy,
    analyse,
    configuration,
    group_runs,
    variant,
)
from experiments.report.cli import main
from experiments.report.document import Report, build_report
from experiments.report.publishing import console_text, publish, summary_metrics
from experiments.report.render import markdown, report_files, to_html
from experiments.report.wording import verdicts

__all__ = [
    "BASELINE",
    "METHOD_BASELINE",
    "METRICS",
    "Report",
    "Strategy",
    "analyse",
    "build_report",
    "configuration",
    "console_text",
    "group_runs",
    "main",
    "markdown",
    "publish",
    "report_files",
    "summary_metrics",
    "to_html",
    "variant",
    "verdicts",
]
