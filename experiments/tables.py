"""Results tables that cannot drift: every table the docs show is rendered by this command from a
stored study artifact (``docs/results/*.json``, written from the store the study wrote) and
written between markers in the Markdown files that show it::

    <!-- table:digits-test:start -->
    ... rendered, never edited by hand ...
    <!-- table:digits-test:end -->

    python -m experiments.tables                       # re-render every marked table
    python -m experiments.tables --check               # exit 1 when a committed table is stale
    python -m experiments.tables --export digits_grid --parent RUN_ID --uri sqlite:///mlflow.db

``--export`` writes a sweep's finished runs (their headline ``final/`` and ``val/`` metrics,
seeds and tags: what the tables read) to ``docs/results/<name>.json``. The files scanned are
``README.md`` and ``docs/**/*.md``; a marker naming no known table is an error.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from experiments.stats import Paired

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
MARKER = re.compile(
    r"(<!-- table:(?P<name>[a-z0-9_-]+):start -->\n)(?P<body>.*?)(<!-- table:(?P=name):end -->)",
    re.DOTALL,
)
KEPT_TAGS = ("sampler", "data", "model", "loss", "method", "overrides", "config_key", "reference")
HEADLINE = re.compile(r"^(final|val)/[a-z0-9_]+$")


# ------------------------------------------------------------------------------ artifacts


def _paired(a: dict[int, float], b: dict[int, float]) -> Paired:
    """The paired difference of two candidates of one grid: every seed is in both."""
    from experiments.stats import paired_difference

    paired = paired_difference(a, b)
    assert paired is not None, "a grid's candidates share their seeds"
    return paired


def export_runs(uri: str | None, parent_run_id: str) -> dict[str, Any]:
    """A sweep's child runs as a JSON-able study artifact: what the tables read, nothing more."""
    from experiments.store import child_runs, get_run, open_store

    client, resolved = open_store(uri)
    parent = get_run(client, resolved, parent_run_id)
    runs = []
    for run in sorted(child_runs(client, parent), key=lambda r: r.start_time):
        runs.append(
            {
                "run_id": run.run_id,
                "name": run.name,
                "status": run.status,
                "start_time": run.start_time,
                "tags": {k: run.tags[k] for k in KEPT_TAGS if k in run.tags},
                "params": {"seed": run.params.get("seed", "")},
                "metrics": {k: v for k, v in sorted(run.metrics.items()) if HEADLINE.match(k)},
            }
        )
    return {
        "parent": {"run_id": parent.run_id, "name": parent.name, "tags": parent.tags},
        "runs": runs,
    }


def load(name: str, folder: Path = RESULTS) -> dict[str, Any]:
    return json.loads((folder / f"{name}.json").read_text())


def runs_of(artifact: dict[str, Any]) -> list[Any]:
    """The artifact's runs as :class:`experiments.store.Run` (what the report reads)."""
    from experiments.store import Run

    return [
        Run(
            r["run_id"],
            "0",
            r["name"],
            r["status"],
            r["start_time"],
            r["tags"],
            r["params"],
            r["metrics"],
        )
        for r in artifact["runs"]
    ]


def values_of(artifact: dict[str, Any], metric: str) -> dict[str, dict[int, float]]:
    """{sampler (or method): {seed: value}} of the artifact's FINISHED runs."""
    out: dict[str, dict[int, float]] = {}
    for r in artifact["runs"]:
        if r["status"] == "FINISHED" and metric in r["metrics"]:
            name = r["tags"].get("method") or r["tags"]["sampler"]
            out.setdefault(name, {})[int(r["params"]["seed"])] = r["metrics"][metric]
    return out


# ------------------------------------------------------------------------------ renderers


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def report_table(artifact: str) -> Callable[[Path], str]:
    """The report's own table (experiments.report: final test metrics, paired Δ to the
    baseline) of a stored sweep."""

    def render(folder: Path) -> str:
        from experiments.report import build_report

        report = build_report(runs_of(load(artifact, folder)), "stored", plots=False)
        (header, rows) = next(b[1:] for b in report.blocks if b[0] == "table")
        return markdown_table(header, rows)

    return render


def grid_decision(values: dict[str, dict[int, float]], alpha: float = 0.05) -> dict[str, Any]:
    """The full grid's answer, one look at all its seeds: the leader and the candidates not
    separable from it, by the race's rule at level alpha (one look spends it all) and by the
    report's uncorrected paired 95% t-intervals."""
    import numpy as np

    from experiments.race.rule import look

    names = sorted(values)
    seeds = sorted(set.intersection(*(set(v) for v in values.values())))
    table = np.array([[[values[n][s] for s in seeds] for n in names]])
    seen = look(table, np.ones((1, len(names)), dtype=bool), alpha)
    leader = names[int(seen.leader[0])]
    mcb = [n for i, n in enumerate(names) if not seen.eliminated[0, i]]
    paired = [
        n
        for n in names
        if n == leader or not _paired(values[leader], values[n]).difference.excludes_zero
    ]
    return {
        "seeds": seeds,
        "leader": leader,
        "means": {n: float(seen.means[0, i]) for i, n in enumerate(names)},
        "difference": {n: float(seen.difference[0, i]) for i, n in enumerate(names)},
        "margin": float(seen.margin[0]),
        "not_separable_race_rule": sorted(mcb, key=lambda n: -seen.means[0, names.index(n)]),
        "not_separable_paired_t": paired,
    }


def naive_replay(values: dict[str, dict[int, float]]) -> dict[str, Any]:
    """The naive race (:func:`experiments.race.simulate.naive_races`: paired t-tests against the
    leader after every round, Holm, nothing for the repeated looks) on a grid's values."""
    import numpy as np

    from experiments.race.simulate import naive_races

    names = list(values)
    seeds = sorted(set.intersection(*(set(v) for v in values.values())))
    table = np.array([[[values[n][s] for s in seeds] for n in names]])
    out = naive_races(table)
    rounds = {n: int(out.eliminated[0, i]) for i, n in enumerate(names)}
    used = 3 + int(out.rounds[0]) - 1  # the seeds the survivors ran
    means = {n: float(table[0, i, :used].mean()) for i, n in enumerate(names)}
    return {
        "runs": int(out.runs[0]),
        "survivors": sorted((n for n in names if not rounds[n]), key=lambda n: -means[n]),
        "eliminated_in": {n: r for n, r in rounds.items() if r},
    }


def validation_table(folder: Path) -> str:
    """The digits grid on validation: mean and 95% interval per strategy, the difference to the
    leader, and whether 10 seeds separate it (race rule at one look; paired t)."""
    from experiments.stats import t_interval

    values = values_of(load("digits_grid", folder), "val/balanced_accuracy")
    decision = grid_decision(values)
    leader = decision["leader"]
    rows = []
    for name in sorted(values, key=lambda n: -decision["means"][n]):
        i = t_interval(list(values[name].values()))
        diff = decision["difference"][name]
        p = _paired(values[name], values[leader])
        rows.append(
            [
                name,
                str(i.n),
                f"{i.mean:.4f} ± {i.half_width:.4f}",
                "leader"
                if name == leader
                else f"{100 * diff:+.1f} [{100 * (diff - decision['margin']):+.1f}, {100 * (diff + decision['margin']):+.1f}]",
                "—"
                if name == leader
                else f"{100 * p.difference.low:+.1f}, {100 * p.difference.high:+.1f}",
                "leader"
                if name == leader
                else ("no" if name in decision["not_separable_race_rule"] else "yes"),
            ]
        )
    header = [
        "strategy",
        "seeds",
        "val bal. acc",
        "Δ vs leader, points [race rule, one look]",
        "paired 95% t-interval (points)",
        "separated from the leader",
    ]
    return markdown_table(header, rows)


def race_bench_table(folder: Path) -> str:
    """The grid, the race, the race without its budget and the naive race: runs, the leader,
    who is left, and whether that is the grid's decision (the survivors among the strategies
    the grid cannot separate from its leader, by the race's rule at one look / by paired t)."""
    bench = load("race_bench", folder)
    grid, race, replay = bench["grid"], bench["race"], bench["replay_uncapped"]
    by_rule, by_t = set(grid["not_separable_race_rule"]), set(grid["not_separable_paired_t"])
    grid_values = values_of(load("digits_grid", folder), bench["objective"])
    naive = naive_replay({c: grid_values[c] for c in race["record"]["candidates"]})

    def wall(part: dict[str, Any]) -> str:
        load = part.get("load")
        return f"{part['seconds']:.0f} s" + (f" (load {load[0]:.1f}→{load[1]:.1f})" if load else "")

    def row(name: str, runs: int, seconds: str, survivors: list[str], why: str) -> list[str]:
        reached = "yes" if set(survivors) <= by_rule else "no"
        reached_t = "yes" if set(survivors) <= by_t else "no"
        return [
            name,
            str(runs),
            f"{100 * runs / grid['runs']:.0f}%",
            seconds,
            survivors[0],
            f"{', '.join(survivors)} ({why})",
            f"{reached} / {reached_t}",
        ]

    header = [
        "",
        "runs",
        "share of the grid",
        "wall time",
        "leader",
        "left at the end",
        "the grid's decision? (race rule / paired t)",
    ]
    rows = [
        [
            f"full grid ({grid['candidates']} strategies × {len(grid['seeds'])} seeds)",
            str(grid["runs"]),
            "100%",
            wall(grid),
            grid["leader"],
            f"not separable from it: {', '.join(sorted(by_rule - {grid['leader']}))} (race rule, "
            f"one look) / {', '.join(sorted(by_t - {grid['leader']})) or 'none'} (paired t)",
            "—",
        ],
        row(
            f"race, max_runs={race['max_runs']}",
            race["runs"],
            wall(race),
            race["survivors"],
            race["stop_reason"],
        ),
        row(
            "the same race without max_runs (replayed on the grid's values)",
            replay["runs"],
            "—",
            replay["survivors"],
            replay["stop_reason"],
        ),
        row(
            "the naive race, no budget (paired t vs the leader, Holm, every round; replayed)",
            naive["runs"],
            "—",
            naive["survivors"],
            ", ".join(
                f"{n} out in round {r}" for n, r in naive["eliminated_in"].items() if n in by_rule
            )
            or "none of the grid's leaders dropped",
        ),
    ]
    return markdown_table(header, rows)


def race_rounds_table(folder: Path) -> str:
    race = load("race_bench", folder)["race"]["record"]
    rows = []
    for r in race["rounds"]:
        out = ", ".join(
            f"{c} ({100 * r['difference'][c]:+.1f} [{100 * (r['difference'][c] - r['margin']):+.1f}, {100 * (r['difference'][c] + r['margin']):+.1f}])"
            for c in r["eliminated"]
        )
        rows.append(
            [
                str(r["number"]),
                str(len(r["seeds"])),
                f"{r['level']:.4f}",
                f"{r['critical']:.2f}",
                r["leader"],
                out or "—",
                str(r["runs"]),
            ]
        )
    header = [
        "round",
        "seeds",
        "level",
        "d",
        "leader",
        "eliminated (Δ vs leader, points [race interval])",
        "runs",
    ]
    return markdown_table(header, rows)


def race_rule_table(folder: Path) -> str:
    data = load("race_rule", folder)
    rows = []
    for r in data["rows"]:
        power = "—"
        if "worse_out_by_round_2" in r:
            power = f"{r['worse_out_by_round_2'] / r['races']:.3f} (≥ {r['worse_out_by_round_2_lower95']:.3f})"
        rows.append(
            [
                r["scenario"],
                str(r["races"]),
                f"{r['best_eliminated'] / r['races']:.4f} (≤ {r['best_eliminated_upper95']:.4f})",
                power,
                f"{r['mean_runs']:.1f}",
            ]
        )
    header = [
        "scenario (candidate 0 best)",
        "races",
        "best eliminated (95% upper bound)",
        "the worse one out by round 2 (95% lower bound)",
        "mean runs",
    ]
    return markdown_table(header, rows)


TABLES: dict[str, Callable[[Path], str]] = {
    "digits-test": report_table("digits_grid"),
    "digits-val": validation_table,
    "race-bench": race_bench_table,
    "race-rounds": race_rounds_table,
    "race-rule": race_rule_table,
}


# ------------------------------------------------------------------------------ writing


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
    args = parser.parse_args(argv)
    if args.export:
        if not args.parent:
            parser.error("--export needs --parent")
        path = RESULTS / f"{args.export}.json"
        path.write_text(json.dumps(export_runs(args.uri, args.parent), indent=1) + "\n")
        print(f"wrote {path}")
    if args.check:
        old = stale()
        for path in old:
            print(f"stale tables in {path.relative_to(ROOT)}: run python -m experiments.tables")
        return 1 if old else 0
    for path in write():
        print(f"rendered tables in {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
