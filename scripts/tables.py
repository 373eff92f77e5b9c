"""Results tables that cannot drift: every table the docs show is rendered by this command from a
stored study artifact (``docs/results/*.json``, written from the store the study wrote) and
written between markers in the Markdown files that show it::

    <!-- table:digits-test:start -->
    ... rendered, never edited by hand ...
    <!-- table:digits-test:end -->

    python -m scripts.tables                       # re-render every marked table
    python -m scripts.tables --check               # exit 1 when a committed table is stale
    python -m scripts.tables --replay              # replay the race's seed orders first
    python -m scripts.tables --export digits_grid --parent RUN_ID --uri sqlite:///mlflow.db

``--export`` writes a sweep's finished runs (their headline ``final/`` and ``val/`` metrics,
seeds and tags: what the tables read) to ``docs/results/<name>.json``. The files scanned are
``README.md`` and ``docs/**/*.md``; a marker naming no known table is an error.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from scripts.advice_tables import advice_bench_table
from scripts.artifacts import RESULTS, ROOT, export_runs, load, markdown_table, runs_of
from scripts.race_replays import StaleReplays, write_replays
from scripts.race_tables import (
    race_bench_table,
    race_certificate_table,
    race_headline_table,
    race_orders_table,
    race_rounds_table,
    race_rule_table,
    validation_table,
)

MARKER = re.compile(
    r"(<!-- table:(?P<name>[a-z0-9_-]+):start -->\n)(?P<body>.*?)(<!-- table:(?P=name):end -->)",
    re.DOTALL,
)


def report_table(artifact: str) -> Callable[[Path], str]:
    """The report's own table (experiments.report: final test metrics, paired Δ to the
    baseline) of a stored sweep."""

    def render(folder: Path) -> str:
        from experiments.report import build_report

        report = build_report(runs_of(load(artifact, folder)), "stored", plots=False)
        (header, rows) = next(b[1:] for b in report.blocks if b[0] == "table")
        return markdown_table(header, rows)

    return render


def small_cnn_best(folder: Path) -> tuple[str, str, str]:
    """The best row by balanced accuracy of the report's table in ``cifar10_lt_short.md`` (the
    small CNN from scratch on CIFAR-10-LT): strategy, seeds, balanced accuracy as printed."""
    page = (folder / "cifar10_lt_short.md").read_text()
    table = page.split("## The report's table", 1)[1].split("\n\n##", 1)[0]
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in table.splitlines()
        if line.startswith("|") and not line.startswith(("| strategy", "|---"))
    ]
    best = max(rows, key=lambda r: float(r[3].split()[0]))
    return best[0], best[1], best[3]


def features_bench_table(folder: Path) -> str:
    """``scripts.bench_features``: each frozen backbone's feature time, head run and race, beside
    the stored small-CNN-from-scratch figures of the same data."""
    bench = load("features_bench", folder)
    rows = []
    for name, setting in bench["settings"].items():
        features, race = setting["features"], setting["race"]
        test = race["test_balanced_accuracy"]
        rows.append(
            [
                f"{bench['backbone']}, {name}, frozen, {setting['size']} px",
                f"{features['samples']:,} x {features['dim']} in {features['seconds']:.0f} s",
                f"{setting['head_run_seconds']:.1f} s ({race['seconds'] / race['runs']:.1f} s a run in the race)",
                f"{race['runs']} runs, {race['seconds'] / 60:.1f} min",
                race["advised"],
                f"{race['validation']:.3f}",
                f"{test:.3f} ({race['test_seeds']} seeds)" if test is not None else "—",
            ]
        )
    name, seeds, balanced = small_cnn_best(folder)
    rows.append(
        [
            "small CNN from scratch ([its table](cifar10_lt_short.md), not run again)",
            "—",
            "about 10 min a run",
            "—",
            name,
            "—",
            f"{balanced} ({seeds} seeds)",
        ]
    )
    header = [
        "model",
        "features",
        "one head run (the process)",
        "race",
        "advised",
        "val bal. acc",
        "test bal. acc (advised)",
    ]
    stops = [
        f"{name}: the race stopped after {len(s['race']['record']['rounds'])} round(s) "
        f"({s['race']['stop_reason']}), {', '.join(s['race']['survivors'])} left in it."
        for name, s in bench["settings"].items()
    ]
    return markdown_table(header, rows) + "\n" + " ".join(stops) + "\n"


BASELINES = {  # scripts.baselines' rows, as the table names them
    "lr_la": "scikit-learn LogisticRegression + post-hoc logit adjustment",
    "lr_balanced": "LogisticRegression(class_weight='balanced')",
    "ncm": "nearest class mean (cosine)",
}


def features_baselines_table(folder: Path) -> str:
    """``scripts.bench_features``: the race's advice beside scikit-learn's baselines on the same
    cached features (each setting that has them), and whether the advice reaches the logit-
    adjusted logistic regression's test balanced accuracy."""
    bench = load("features_bench", folder)
    rows, verdicts = [], []
    for name, setting in bench["settings"].items():
        if "baselines" not in setting:
            continue
        race, found = setting["race"], setting["baselines"]["rows"]
        test = race["test_balanced_accuracy"]
        rows.append(
            [
                f"{name}, {setting['size']} px: the race ({race['runs']} runs), advised "
                f"{race['advised']}",
                "—",
                f"{race['validation']:.3f}",
                f"{test:.3f} ({race['test_seeds']} seeds)",
                f"{race['seconds']:.0f} s",
            ]
        )
        for key, row in found.items():
            chosen = ", ".join(f"{k} {v:g}" for k, v in row["chosen"].items()) or "—"
            rows.append(
                [
                    f"{name}, {setting['size']} px: {BASELINES[key]}",
                    chosen + ("" if row["converged"] else " (max_iter reached)"),
                    f"{row['val_balanced_accuracy']:.3f}",
                    f"{row['test_balanced_accuracy']:.3f}",
                    f"{row['seconds']:.1f} s",
                ]
            )
        gap = 100 * (test - found["lr_la"]["test_balanced_accuracy"])
        verdict = "reaches" if gap >= 0 else "does NOT reach"
        verdicts.append(
            f"{name}, {setting['size']} px: the advice ({race['advised']}) {verdict} the logit-"
            f"adjusted logistic regression's test balanced accuracy ({gap:+.2f} points)."
        )
    if not rows:
        return "No setting of the stored bench has its baselines: run the bench again.\n"
    header = ["setting: method", "chosen on validation", "val bal. acc", "test bal. acc", "time"]
    return markdown_table(header, rows) + "\n" + "\n".join(verdicts) + "\n"


def prefixes_bench_table(folder: Path) -> str:
    """``scripts.bench_prefixes``: the published-recipe race as before lean children and shared
    prefixes, with lean children alone, and with both (as now)."""
    bench = load("prefixes_bench", folder)
    rows = [
        [
            name,
            str(bench[name]["runs"]),
            str(bench[name]["epochs"]),
            f"{bench[name]['wall_s']:.0f} s",
            f"{bench[name]['load'][0]:.1f} / {bench[name]['load'][1]:.1f}",
            str(bench[name]["advised"]),
            f"{bench[name]['certificate_points']:.2f}",
        ]
        for name in ("before", "alone", "shared")
    ]
    header = ["race", "runs", "epochs trained", "wall", "load before / after", "advised"]
    table = markdown_table([*header, "certificate (points)"], rows)
    same = "the same" if bench["same_values"] else "NOT the same"
    advice = "the same" if bench["same_advice"] else "NOT the same"
    return (
        f"{table}\nShared: {bench['epochs_ratio']:.0%} of the epochs and {bench['wall_ratio']:.0%} "
        f"of the wall time of alone, {bench['wall_ratio_to_before']:.0%} of the wall time of "
        f"before; every run's validation value {same} in all three, the advice {advice}.\n"
    )


TABLES: dict[str, Callable[[Path], str]] = {
    "advice-bench": advice_bench_table,
    "features-bench": features_bench_table,
    "features-baselines": features_baselines_table,
    "prefixes-bench": prefixes_bench_table,
    "digits-test": report_table("digits_grid"),
    "digits-val": validation_table,
    "race-bench": race_bench_table,
    "race-certificate": race_certificate_table,
    "race-headline": race_headline_table,
    "race-orders": race_orders_table,
    "race-rounds": race_rounds_table,
    "race-rule": race_rule_table,
}


def documents(root: Path = ROOT) -> list[Path]:
    return [p for p in [root / "README.md", *sorted((root / "docs").rglob("*.md"))] if p.is_file()]


def rendered(text: str, folder: Path, cache: dict[str, str]) -> str:
    """``text`` with every marked table re-rendered."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in TABLES:
            raise KeyError(f"no table {name!r}; known: {sorted(TABLES)}")
        if name not in cache:
            cache[name] = TABLES[name](folder)
        return f"{match.group(1)}{cache[name]}{match.group(4)}"

    return MARKER.sub(replace, text)


def stale(root: Path = ROOT, folder: Path = RESULTS) -> list[Path]:
    """The documents whose committed tables differ from what their artifacts render."""
    cache: dict[str, str] = {}
    return [p for p in documents(root) if rendered(p.read_text(), folder, cache) != p.read_text()]


def write(root: Path = ROOT, folder: Path = RESULTS) -> list[Path]:
    """Re-render every marked table in place; returns the documents that changed."""
    cache: dict[str, str] = {}
    changed = []
    for path in documents(root):
        text = path.read_text()
        new = rendered(text, folder, cache)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a table is stale")
    parser.add_argument("--export", metavar="NAME", help="write docs/results/NAME.json first")
    parser.add_argument("--parent", help="the sweep's parent run id (with --export)")
    parser.add_argument("--uri", help="the store (default: the project's mlflow.db)")
    parser.add_argument(
        "--replay",
        action="store_true",
        help="replay the race's seed orders into docs/results/race_orders.json first (a minute)",
    )
    args = parser.parse_args(argv)
    if args.export:
        if not args.parent:
            parser.error("--export needs --parent")
        path = RESULTS / f"{args.export}.json"
        path.write_text(json.dumps(export_runs(args.uri, args.parent), indent=1) + "\n")
        print(f"wrote {path}")
    if args.replay:
        print(f"wrote {write_replays()}")
    try:
        if args.check:
            old = stale()
            for path in old:
                print(f"stale tables in {path.relative_to(ROOT)}: run python -m scripts.tables")
            return 1 if old else 0
        for path in write():
            print(f"rendered tables in {path.relative_to(ROOT)}")
    except StaleReplays as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
