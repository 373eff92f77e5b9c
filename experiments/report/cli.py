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
import sys
from collections.abc import Sequence
from pathlib import Path

from experiments.report.analysis import BASELINE, METHOD_BASELINE
from experiments.report.document import build_report
from experiments.report.publishing import rebuild, summary_metrics, sweep_title
from experiments.report.render import markdown, report_files
from experiments.report.wording import race_tags
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
            title = sweep_title(parent)
        else:
            runs = experiment_runs(client, experiment_id(client, uri, args.experiment))
            title = f"Sampling strategies compared: experiment {args.experiment}"
    except StoreError as err:
        print(f"experiments.report: {err}", file=sys.stderr)
        return 2
    race = race_tags(parent.tags) if parent is not None else {}
    report = build_report(runs, title, args.baseline, race=race)
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
        print(
            f"logged onto parent run {parent.run_id} ({parent.name}): report.html, report.md, "
            f"report_plots/*.png, summary/* metrics; browse: {rebuild(parent.run_id, uri).ui}"
        )
    return 0 if report.strategies else 1
