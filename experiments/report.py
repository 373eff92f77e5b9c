"""Compare sampling strategies across the runs of an MLflow experiment (or one sweep).

Groups finished runs by data, model, loss and sampler; reports mean and standard deviation over
seeds of the final test metrics, with the number of runs, as a Markdown table.

    python -m experiments.report [--experiment samplerlab] [--parent RUN_ID] [--uri URI] [--out report.md]
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from runner.tracking import load_runs

COLUMNS = {
    "final/balanced_accuracy": "bal. acc",
    "final/macro_f1": "macro-F1",
    "final/many_accuracy": "many",
    "final/medium_accuracy": "medium",
    "final/few_accuracy": "few",
    "best/balanced_accuracy": "best bal. acc*",
}
GROUP_BY = ("data", "model", "loss", "sampler", "variant")
# Overrides that do not change what is compared: the group choices (columns already), the seed,
# where results go, and display settings. Anything else (sampler.q=0.5, data.imbalance_factor=50)
# makes another configuration.
SAME_CONFIGURATION = {"seed", "data", "model", "loss", "sampler", "trainer.progress"}
SAME_CONFIGURATION_PREFIXES = ("tracking.", "hydra.", "hydra/")


def variant(run: dict[str, Any]) -> str:
    """The run's other command-line overrides: runs that differ there are different
    configurations, not more seeds of one."""
    kept = []
    for override in run["tags"].get("overrides", "").split():
        key = override.split("=")[0].lstrip("+~")
        if (
            override != "(none)"
            and key not in SAME_CONFIGURATION
            and not key.startswith(SAME_CONFIGURATION_PREFIXES)
        ):
            kept.append(override)
    return " ".join(sorted(kept)) or "-"


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN for a single run)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else float("nan")


def summarise(runs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (data, model, loss, sampler): run count and mean/std of each column."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        key = tuple(run["tags"].get(k, "?") for k in GROUP_BY[:-1]) + (variant(run),)
        groups[key].append(run)
    rows = []
    for key, members in groups.items():
        row: dict[str, Any] = dict(zip(GROUP_BY, key, strict=True))
        row["runs"] = len(members)
        for metric in COLUMNS:
            values = [m["metrics"][metric] for m in members if metric in m["metrics"]]
            row[metric] = mean_std(values) if values else None
        rows.append(row)
    rows.sort(key=lambda r: (r["data"], r["model"], r["loss"], _best_first(r)))
    return rows


def _best_first(row: dict[str, Any]) -> float:
    """Sort key: highest mean final balanced accuracy first, rows without it last."""
    value = row["final/balanced_accuracy"]
    return -value[0] if value else math.inf


def markdown(rows: list[dict[str, Any]]) -> str:
    def cell(value: tuple[float, float] | None) -> str:
        if value is None:
            return "—"
        mean, std = value
        return f"{mean:.4f}" if math.isnan(std) else f"{mean:.4f} ± {std:.4f}"

    header = [*GROUP_BY, "runs", *COLUMNS.values()]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append(
            "| "
            + " | ".join(
                [*(row[k] for k in GROUP_BY), str(row["runs"]), *(cell(row[m]) for m in COLUMNS)]
            )
            + " |"
        )
    note = (
        "\nMean ± sample standard deviation over runs (seeds). Test sets are balanced. "
        "*Best epoch is selected on the test set itself, so it is optimistic; compare final values.\n"
    )
    return "\n".join(lines) + "\n" + note


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--experiment", default="samplerlab")
    parser.add_argument(
        "--parent", default=None, help="only the child runs of this sweep's parent run"
    )
    parser.add_argument(
        "--uri", default=None, help="tracking URI (default: the project store, as for runs)"
    )
    parser.add_argument("--out", default=None, help="also write the table to this Markdown file")
    args = parser.parse_args()
    runs = load_runs(args.uri, args.experiment, args.parent)
    if not runs:
        raise SystemExit(f"no finished runs in experiment {args.experiment!r}")
    table = markdown(summarise(runs))
    print(table)
    if args.out:
        Path(args.out).write_text(table)


if __name__ == "__main__":
    main()
