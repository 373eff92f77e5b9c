"""The report's text from runs in memory: the console table and its columns, the store it
names, runs without a seed, shot groups, verdicts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit  # in one process, seconds

CLASSES = {"a": (200, 10), "b": (50, 10), "c": (10, 10), "d": (5, 10)}  # train, test images


def _in_memory(sampler: str, seed: int | None, value: float, run_id: str = "", **params: str):
    """A finished run as the store gives it back, without a store: ``value`` is its final
    balanced accuracy (and accuracy), half of it its few-shot accuracy."""
    from experiments.store import Run

    tags = {"sampler": sampler, "data": "synthetic_lt", "model": "mlp", "loss": "ce"}
    tags["overrides"] = f"sampler={sampler}" + (f" seed={seed}" if seed is not None else "")
    metrics = {f"final/{m}": value for m in ("accuracy", "balanced_accuracy", "macro_f1")}
    metrics |= {"final/few_accuracy": value / 2}
    metrics |= {f"data/train_count/{c}": n for c, (n, _) in CLASSES.items()}
    metrics |= {f"data/test_count/{c}": t for c, (_, t) in CLASSES.items()}
    seeded = {"seed": str(seed)} if seed is not None else {}
    run_id = run_id or f"{sampler}-{seed}"
    return Run(run_id, "1", run_id, "FINISHED", 0, tags, seeded | params, metrics)


def _two_samplers(**params: str) -> list:
    values = {"uniform": (0.50, 0.60, 0.70), "hybrid": (0.62, 0.70, 0.84)}
    return [
        _in_memory(sampler, seed, value, **params)
        for sampler, per_seed in values.items()
        for seed, value in enumerate(per_seed)
    ]


def test_the_console_text_names_the_store_it_is_given():
    from experiments.report import build_report, console_text
    from experiments.store import Run
    from runner.tracking.stores import project_store

    report = build_report(_two_samplers(), "t", plots=False)
    parent = Run("p" * 32, "7", "sweep-x", "FINISHED", 0, {}, {})
    elsewhere = console_text(report, parent, "sqlite:///other.db").splitlines()
    assert elsewhere[-1] == (
        f"Rebuild: samplerlab report --parent {parent.run_id} --uri sqlite:///other.db"
    )
    assert elsewhere[-2].endswith(
        ": samplerlab ui --uri sqlite:///other.db, experiment 7, run sweep-x."
    )
    here = console_text(report, parent, project_store()).splitlines()
    assert here[-1] == f"Rebuild: samplerlab report --parent {parent.run_id}"
    assert here[-2].endswith(": samplerlab ui, experiment 7, run sweep-x.")


@pytest.fixture
def metrics_reordered():
    """METRICS in another order, with one more metric in front (restored afterwards)."""
    from experiments.report.analysis import METRICS

    saved = dict(METRICS)
    METRICS.clear()
    METRICS.update({"top5_accuracy": "top-5", **dict(reversed(saved.items()))})
    yield
    METRICS.clear()
    METRICS.update(saved)


def test_the_console_table_picks_its_columns_by_name(metrics_reordered):
    from experiments.report import build_report, console_text
    from experiments.store import Run

    report = build_report(_two_samplers(), "t", plots=False)
    text = console_text(report, Run("p", "7", "sweep-x", "FINISHED", 0, {}, {}), "sqlite:///x.db")
    header = (
        "| strategy | seeds | bal. acc | few | Δ bal. acc vs uniform (points) "
        "| Δ few vs uniform (points) |"
    )
    assert header in text.splitlines()
    # hybrid: balanced 0.62, 0.70, 0.84; few half of it; uniform 0.50, 0.60, 0.70 (and half).
    row = "| hybrid | 3 | 0.7200 ± 0.2766 | 0.3600 ± 0.1383 | +12.0 [+7.0, +17.0] | +6.0 [+3.5, +8.5] |"
    assert row in text.splitlines()


def unseeded_report() -> str:
    """The report of runs without a seed (five of one sampler, three of another)."""
    from experiments.report import build_report, markdown

    runs = [_in_memory("uniform", None, 0.1 * i, run_id=f"u{i}") for i in range(1, 6)]
    runs += [_in_memory("hybrid", None, 0.1 * i, run_id=f"h{i}") for i in range(1, 4)]
    return markdown(build_report(runs, "t", plots=False))


def test_runs_without_a_seed_are_reported_alike_in_every_process():
    """A run without a seed is a row's sample of its own that pairs with nothing, and the order
    of such runs is the same whatever the process's str-hash salt (PYTHONHASHSEED): this
    process's and another's with a salt of its own (importing the report there: about 10 s)."""
    from tests.conftest import ROOT

    salt = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tests.test_report_text import unseeded_report as r; print(r())",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": salt},
        timeout=120,
    )
    assert other.returncode == 0, other.stderr[-3000:]
    reports = [unseeded_report(), other.stdout.removesuffix("\n")]
    assert reports[0] == reports[1]
    assert "| uniform | 5 |" in reports[0] and "| hybrid | 3 |" in reports[0]
    assert "hybrid vs uniform on balanced accuracy: no seed in common" in reports[0]


def test_shot_groups_follow_the_thresholds_each_run_recorded_and_none_are_guessed():
    from experiments.report import build_report, markdown

    thresholds = {"eval.many_shot": "40", "eval.few_shot": "8"}
    md = markdown(build_report(_two_samplers(**thresholds), "t", plots=False))
    # a (200) and b (50) have more than 40 training images, c (10) is medium, d (5) fewer than 8
    assert (
        "| synthetic_lt | all | 2 classes, 20 test images | 1 class, 10 test images "
        "| 1 class, 10 test images |" in md
    )
    assert "Many-shot: more than 40 training images (eval.many_shot), few-shot: fewer than 8" in md
    unrecorded = markdown(build_report(_two_samplers(), "t", plots=False))
    assert (
        "The shot thresholds were not recorded (params eval.many_shot, eval.few_shot) by the runs "
        "of: hybrid, uniform: no many / medium / few classes for them." in unrecorded
    )
    assert "Many-shot: more than" not in unrecorded and "| synthetic_lt |" not in unrecorded


def test_a_verdict_names_its_block_once():
    """With two (data, model, loss) blocks the rows' labels carry their block; the verdict
    sentences, which start with the block, name the strategies without it."""
    from experiments.report import analyse, group_runs
    from experiments.report.wording import verdicts
    from experiments.store import Run

    def run(data: str, sampler: str, seed: int, value: float) -> Run:
        tags = {"sampler": sampler, "data": data, "model": "mlp", "loss": "ce"}
        tags["overrides"] = f"sampler={sampler} seed={seed}"
        return Run(
            f"{data}{sampler}{seed}",
            "1",
            "r",
            "FINISHED",
            seed,
            tags,
            {"seed": str(seed)},
            {"final/balanced_accuracy": value, "final/few_accuracy": value},
        )

    runs = [
        run(data, sampler, seed, 0.5 + 0.1 * (sampler == "hybrid") + 0.01 * seed)
        for data in ("digits_lt", "synthetic_lt")
        for sampler in ("uniform", "hybrid")
        for seed in range(3)
    ]
    lines = verdicts(analyse(group_runs(runs)))
    assert lines and all(line.count("/mlp/ce:") == 1 for line in lines), lines
    assert "digits_lt/mlp/ce: best by balanced accuracy: hybrid" in lines[0]


def test_intervals_are_clipped_to_what_an_accuracy_can_be_and_ties_read_as_ties():
    from experiments.stats import Interval, difference_cell, interval_cell

    assert interval_cell(Interval(0.8150, 0.2329, 3, 0.09)) == "0.8150 [0.5821, 1.0000]"
    assert interval_cell(Interval(0.0300, 0.0500, 3, 0.02)) == "0.0300 [0.0000, 0.0800]"
    assert interval_cell(Interval(0.5000, 0.0329, 3, 0.01)) == "0.5000 ± 0.0329"
    assert interval_cell(Interval(0.1000, 0.0, 3, 0.0)) == "0.1000 (every seed)"
    assert difference_cell(0.0, 0.0, 0.0) == "tie: +0.0 on every seed"
    assert difference_cell(-0.4, -0.4, -0.4, " points") == "-40.0 points on every seed"
    assert difference_cell(0.9, 0.5, 1.3) == "+90.0 [+50.0, +100.0]"


def test_a_tie_on_every_seed_is_said_to_be_one():
    from experiments.report import build_report, markdown

    same = [
        _in_memory(s, seed, v) for s in ("uniform", "hybrid") for seed, v in enumerate((0.5, 0.6))
    ]
    md = markdown(build_report(same, "t", plots=False))
    assert "hybrid and uniform tie on balanced accuracy" in md or "uniform and hybrid tie" in md
    assert "± 0.0000" not in md and "tie: +0.0 on every seed" in md


def test_the_metrics_plot_stays_inside_0_and_1():
    from experiments.report.plots import metrics_with_intervals, recall_by_strategy
    from experiments.stats import Interval

    figure = metrics_with_intervals(
        {"a": {"m": Interval(0.8150, 0.2329, 3, 0.09)}, "b": {"m": Interval(0.98, 0.05, 3, 0.02)}},
        {"m": "metric"},
    )
    low, high = figure.axes[0].get_xlim()
    assert low >= 0 and high <= 1
    bars = [c.get_segments() for c in figure.axes[0].collections]  # the error bars' lines
    assert max(x for segments in bars for segment in segments for x, _ in segment) == 1
    recall = recall_by_strategy({"a": [1.0, 0.5, 0.0]}, ["x", "y", "z"], None)
    assert recall.axes[0].get_ylim() == (0, 1)


def test_a_race_parents_report_calls_its_test_set_table_a_confirmation():
    from experiments.report import build_report, console_text, markdown
    from experiments.report.wording import CONFIRMATION, race_tags
    from experiments.store import Run

    tags = {"advice/advised": "hybrid", "advice/objective": "val/balanced_accuracy", "x": "y"}
    race = race_tags(tags)
    assert race == {"advice/advised": "hybrid", "advice/objective": "val/balanced_accuracy"}
    report = build_report(_two_samplers(), "t", plots=False, race=race)
    md = markdown(report)
    assert "## The race's answer" in md and f"## {CONFIRMATION}" in md and "## Answer" not in md
    assert "advised: hybrid" in md and "val/balanced_accuracy (the validation split)" in md
    assert "not a second verdict" in md
    parent = Run("p", "1", "sweep", "FINISHED", 0, tags, {})
    assert "they are not a second verdict" in console_text(report, parent, "sqlite:///x.db")
    plain = markdown(build_report(_two_samplers(), "t", plots=False))
    assert "## Answer" in plain and CONFIRMATION not in plain
