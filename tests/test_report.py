"""The report: intervals and paired differences against hand-computed values, grouping rules,
publishing onto a sweep's parent run, and one real sweep end to end (real sqlite MLflow)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from experiments.report import main, publish
from experiments.stats import paired_difference, t_interval
from runner.tracking import Tracker
from tests.helpers.cli import run_python
from tests.helpers.record import assert_record
from tests.helpers.sweeps import COMMAND, tiny_sweep

pytestmark = pytest.mark.unit  # in one process, seconds

# Student-t quantiles t_{0.975, df} from a printed table.
T_975 = {1: 12.706, 2: 4.303}


def test_t_interval_matches_the_hand_computed_interval():
    i = t_interval([0.5, 0.6, 0.7])  # mean 0.6, s = 0.1
    assert i.mean == pytest.approx(0.6)
    assert i.std == pytest.approx(0.1)
    assert i.half_width == pytest.approx(T_975[2] * 0.1 / math.sqrt(3), abs=1e-4)  # 0.2484
    assert (i.low, i.high) == pytest.approx((0.6 - 0.24841, 0.6 + 0.24841), abs=1e-4)
    two = t_interval([0.5, 0.7])  # s = 0.1414, half = 12.706 * 0.1414 / 1.4142 = 1.2706
    assert two.half_width == pytest.approx(1.2706, abs=1e-3)
    one = t_interval([0.8])
    assert one.mean == 0.8 and math.isnan(one.half_width) and not one.excludes_zero


def test_paired_difference_uses_the_shared_seeds_only():
    a = {0: 0.62, 1: 0.70, 2: 0.84, 7: 0.1}  # seed 7: no partner, left out
    b = {0: 0.50, 1: 0.60, 2: 0.70, 5: 0.9}
    p = paired_difference(a, b)
    assert p.seeds == (0, 1, 2)
    # differences 0.12, 0.10, 0.14: mean 0.12, s 0.02, half 4.303 * 0.02 / sqrt(3) = 0.04969
    assert p.difference.mean == pytest.approx(0.12)
    assert p.difference.half_width == pytest.approx(0.04969, abs=1e-4)
    assert p.difference.excludes_zero
    # Unpaired, the same values could not be told apart: pairing removes the seed effect.
    assert t_interval([0.62, 0.70, 0.84]).half_width > 0.25
    assert paired_difference({0: 1.0}, {1: 1.0}) is None


CLASSES = {"a": (200, 10), "b": (50, 10), "c": (10, 10), "d": (5, 10)}  # train, test images


def _run(uri, parent, sampler, seed, bal_acc, few, status="FINISHED", extra="", tags=()):
    tags = {
        "sampler": sampler,
        "data": "synthetic_lt",
        "model": "mlp",
        "loss": "ce",
        "overrides": f"sampler={sampler} seed={seed} tracking.uri=x{extra}",
        "mlflow.parentRunId": parent,
        **dict(tags),
    }
    params = {"seed": str(seed), "eval.many_shot": "100", "eval.few_shot": "20"}
    params |= {"trainer.epochs": "12", "trainer.batch_size": "128", "trainer.lr": "0.1"}
    tracker = Tracker.start(uri, "study", f"{sampler}-s{seed}", params=params, tags=tags)
    metrics = {f"data/train_count/{c}": n for c, (n, _) in CLASSES.items()}
    metrics |= {f"data/test_count/{c}": t for c, (_, t) in CLASSES.items()}
    tracker.log_metrics(metrics, step=0)
    final = {
        "final/accuracy": bal_acc,
        "final/balanced_accuracy": bal_acc,
        "final/macro_f1": bal_acc - 0.05,
        "final/many_accuracy": 0.95,
        "final/few_accuracy": few,
    }
    final |= {f"final/recall/{c}": bal_acc for c in CLASSES}
    final |= {f"sampling/share/{c}": 0.25 for c in CLASSES}
    final |= {f"sampling/target/{c}": 0.25 for c in CLASSES}
    tracker.log_metrics(final, step=1)
    tracker.finish(status)
    return tracker.run_id


@pytest.fixture
def fake_sweep(tracking_uri):
    parent = Tracker.start(tracking_uri, "study", "sweep-x", params={}, tags={"sweep": "parent"})
    parent.finish()
    p = parent.run_id
    _run(tracking_uri, p, "uniform", 0, 0.99, 0.99)  # older repeat of uniform seed 0
    for seed, (uniform, hybrid, weighted) in enumerate(
        [(0.50, 0.62, 0.60), (0.60, 0.70, 0.72), (0.70, 0.84, 0.80)]
    ):
        _run(tracking_uri, p, "uniform", seed, uniform, [0.10, 0.20, 0.30][seed])
        _run(tracking_uri, p, "hybrid", seed, hybrid, [0.40, 0.55, 0.60][seed])
        _run(tracking_uri, p, "weighted", seed, weighted, 0.5)
    _run(tracking_uri, p, "hybrid", 3, 0.1, 0.1, status="FAILED")  # left out
    _run(tracking_uri, p, "uniform", 0, 0.3, 0.3, extra=" sampler.q=0.5")  # another row
    return tracking_uri, p


def test_publish_logs_the_report_onto_the_parent_run(fake_sweep):
    uri, parent = fake_sweep
    text = publish(uri, parent)
    assert f"parent run {parent}" in text and "report.html" in text
    assert f"samplerlab report --parent {parent} --uri {uri}" in text  # not this folder's store
    client = MlflowClient(tracking_uri=uri)
    metrics = client.get_run(parent).data.metrics
    # uniform: 0.5, 0.6, 0.7 (the newer seed-0 run, not the 0.99 repeat) -> 0.6 ± 0.2484
    assert metrics["summary/uniform/n_seeds"] == 3
    assert metrics["summary/uniform/final_balanced_accuracy_mean"] == pytest.approx(0.6)
    assert metrics["summary/uniform/final_balanced_accuracy_ci95"] == pytest.approx(
        0.2484, abs=1e-4
    )
    # hybrid - uniform per seed: 0.12, 0.10, 0.14 -> +0.12 ± 0.0497; the failed seed 3 is out
    assert metrics["summary/hybrid/n_seeds"] == 3
    assert metrics["summary/hybrid/vs_uniform_balanced_accuracy_mean"] == pytest.approx(0.12)
    assert metrics["summary/hybrid/vs_uniform_balanced_accuracy_ci95"] == pytest.approx(
        0.0497, abs=1e-4
    )
    # few: 0.30, 0.35, 0.30 -> mean 0.3167, s 0.02887, half 4.303 * 0.02887 / sqrt(3) = 0.0717
    assert metrics["summary/hybrid/vs_uniform_few_accuracy_mean"] == pytest.approx(
        0.31667, abs=1e-4
    )
    assert metrics["summary/hybrid/vs_uniform_few_accuracy_ci95"] == pytest.approx(0.0717, abs=1e-4)
    assert metrics["summary/uniform_sampler.q_0.5/n_seeds"] == 1
    artifacts = {a.path for a in client.list_artifacts(parent)}
    assert {"report.md", "report.html", "report_plots"} <= artifacts
    plots = {a.path for a in client.list_artifacts(parent, "report_plots")}
    assert plots == {
        "report_plots/final_metrics.png",
        "report_plots/recall_by_class.png",
        "report_plots/class_shares.png",
    }
    md = Path(client.download_artifacts(parent, "report.md")).read_text()
    # Ranking and verdicts, worded from the intervals.
    assert (
        "best by balanced accuracy: hybrid; not distinguishable from it with 3 seeds: weighted"
        in md
    )
    # hybrid - weighted: 0.02, -0.02, 0.04 -> +1.3, half 4.303 * 0.03055 / sqrt(3) = 0.0759
    assert (
        "hybrid vs weighted on balanced accuracy: +1.3 points, 95% CI [-6.3, +8.9]: "
        "not distinguishable with 3 seeds" in md
    )
    assert (
        "hybrid > uniform on balanced accuracy: +12.0 points, 95% CI [+7.0, +17.0] (3 paired seeds)"
        in md
    )
    assert "hybrid > uniform on few-shot accuracy: +31.7 points, 95% CI [+24.5, +38.8]" in md
    assert "| uniform | 3 | 0.6000 ± 0.2484 | 0.6000 ± 0.2484 |" in md
    assert "| hybrid | 3 |" in md and "| +12.0 [+7.0, +17.0] | +31.7 [+24.5, +38.8] |" in md
    assert "| uniform [sampler.q=0.5] | 1 | 0.3000 |" in md  # a variant is a row, not a seed
    # Classes by training count: a (200) many, b (50) medium, c and d (< 20) few.
    assert (
        "| synthetic_lt | all | 1 class, 10 test images | 1 class, 10 test images | 2 classes, 20 test images |"
        in md
    )
    assert "1 older run(s) repeating a configuration and seed are left out" in md
    assert "1 run(s) left out because they did not finish (1 FAILED)" in md
    html = Path(client.download_artifacts(parent, "report.html")).read_text()
    assert html.count("data:image/png;base64,") == 3 and "<table" in html
    assert publish(uri, parent) == text  # publishing again replaces, it does not add


def test_methods_are_compared_with_ce_and_with_the_published_table(tracking_uri, capsys):
    parent = Tracker.start(tracking_uri, "study", "sweep-m", params={}, tags={"sweep": "parent"})
    parent.finish()
    accuracies = {"ce": (0.70, 0.72, 0.74), "crt": (0.75, 0.74, 0.76), "hybrid": (0.73, 0.75, 0.77)}
    samplers = {"ce": "uniform", "crt": "deferred", "hybrid": "hybrid"}
    for method, values in accuracies.items():
        for seed, accuracy in enumerate(values):
            tags = {"method": method, "reference": "cifar10_lt_if100", "model": "small_cnn"}
            extra = f" method={method} +experiment=cifar10_lt"
            _run(
                tracking_uri,
                parent.run_id,
                samplers[method],
                seed,
                accuracy,
                0.5,
                extra=extra,
                tags=tags,
            )
    publish(tracking_uri, parent.run_id)
    client = MlflowClient(tracking_uri=tracking_uri)
    md = Path(client.download_artifacts(parent.run_id, "report.md")).read_text()
    # One block of methods (not one per sampler), compared with ce, labelled by method.
    # crt - ce per seed: 0.05, 0.02, 0.02 -> +3.0, s 0.01732, half 4.303 * 0.01732 / sqrt(3) = 4.3
    assert "crt > ce on balanced accuracy: +3.0 points, 95% CI [-1.3, +7.3]" not in md
    assert "crt vs ce on balanced accuracy: +3.0 points, 95% CI [-1.3, +7.3]" in md
    assert "| ce | 3 |" in md and "Δ bal. acc vs ce (points)" in md
    # ce: error 30, 28, 26 -> 28.00, s 2, half 4.303 * 2 / sqrt(3) = 4.97; published 29.64.
    assert "| ce | 3 | 29.64 | 28.00 ± 4.97 | -1.64 [-6.61, +3.33] |" in md
    # crt: error 25, 26, 24 -> 25.00 ± 2.48; published 25.01.
    assert "| crt | 3 | 25.01 | 25.00 ± 2.48 | -0.01 [-2.49, +2.47] |" in md
    assert "| hybrid | 3 | — | 25.00 ± 4.97 | — |" in md  # not in the published table
    assert "Against the published table: CIFAR-10-LT, imbalance 100" in md
    assert "These runs: small_cnn, 12 epochs, batch 128, lr 0.1, data synthetic_lt." in md
    assert "not the error levels with the published ones" in md
    # --baseline applies to methods too: crt - hybrid per seed 0.02, -0.01, -0.01 -> 0.0, s 0.01732.
    cli = ["--parent", parent.run_id, "--uri", tracking_uri, "--no-log"]
    assert main([*cli, "--baseline", "hybrid"]) == 0
    out = capsys.readouterr().out
    assert "crt vs hybrid on balanced accuracy: +0.0 points, 95% CI [-4.3, +4.3]" in out
    assert "Δ bal. acc vs hybrid (points)" in out
    assert main([*cli, "--baseline", "hybird"]) == 2
    assert "--baseline 'hybird'" in capsys.readouterr().err


def test_all_runs_reports_every_sweep_of_an_experiment(tracking_uri, capsys, tmp_path):
    for sampler in ("uniform", "hybrid"):  # two sweeps: a study run in two parts
        parent = Tracker.start(tracking_uri, "study", "sweep", params={}, tags={"sweep": "parent"})
        parent.finish()
        for seed in (0, 1):
            _run(tracking_uri, parent.run_id, sampler, seed, 0.5 + 0.1 * seed, 0.2)
    assert main(["--experiment", "study", "--uri", tracking_uri, "--no-log"]) == 0
    newest = capsys.readouterr().out
    assert "| hybrid | 2 |" in newest and "| uniform |" not in newest
    out = tmp_path / "report"
    cli = ["--experiment", "study", "--all-runs", "--uri", tracking_uri, "--out", str(out)]
    assert main(cli) == 0
    both = capsys.readouterr().out
    assert "| hybrid | 2 |" in both and "| uniform | 2 |" in both
    assert "logged onto" not in both  # no single parent to log onto
    assert f"written to {out}/" in both
    assert "| uniform | 2 |" in (out / "report.md").read_text()
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert (out / "report_plots" / "final_metrics.png").read_bytes()[:4] == b"\x89PNG"


def test_empty_or_failed_sweeps_and_wrong_ids_get_a_line_not_a_traceback(tracking_uri):
    parent = Tracker.start(
        tracking_uri, "study", "sweep-empty", params={}, tags={"sweep": "parent"}
    )
    assert "has no finished runs: nothing to report" in publish(tracking_uri, parent.run_id)
    _run(tracking_uri, parent.run_id, "uniform", 0, 0.5, 0.1, status="FAILED")
    assert "has no finished runs (1 did not finish)" in publish(tracking_uri, parent.run_id)
    assert "no run 'nope'" in publish(tracking_uri, "nope")


def test_the_cli_never_creates_a_store(tmp_path, tracking_uri, capsys):
    typo = tmp_path / "typo" / "mlflow.db"
    assert main(["--uri", f"sqlite:///{typo}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("experiments.report: no store at") and "\n" not in err
    assert not typo.exists() and not typo.parent.exists()
    assert main(["--uri", tracking_uri, "--experiment", "nothing"]) == 2
    assert "no experiment 'nothing'" in capsys.readouterr().err
    done = run_python(
        "-m", "experiments.report", "--uri", f"sqlite:///{typo}", cwd=tmp_path, expect=2
    )
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert not typo.parent.exists()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, migrated_store):
    return tiny_sweep(tmp_path_factory.getbasetemp() / "tiny-sweep", migrated_store)


@pytest.mark.slow
def test_a_real_sweep_reports_onto_its_parent_run(sweep, capsys):
    """`python -m runner -m +experiment=synthetic ...` ends by publishing its report: it prints
    the answer and where it is, and the parent run holds it."""
    assert len(sweep.child_names) == 4
    printed = sweep.stdout
    assert (
        f"samplerlab report: sweep {sweep.parent_name}, parent run {sweep.parent_run_id}: "
        "2 strategies, 4 runs" in printed
    )
    assert "| hybrid | 2 |" in printed and "best by balanced accuracy" in printed
    # The sweep ran in the folder of its store: the command needs no --uri there.
    assert f"Rebuild: samplerlab report --parent {sweep.parent_run_id}\n" in printed
    client = MlflowClient(tracking_uri=sweep.uri)
    assert {"report.html", "report.md", "report_plots"} <= {
        a.path for a in client.list_artifacts(sweep.parent_run_id)
    }
    metrics = client.get_run(sweep.parent_run_id).data.metrics
    assert metrics["summary/hybrid/n_seeds"] == metrics["summary/uniform/n_seeds"] == 2
    assert 0 <= metrics["summary/hybrid/final_balanced_accuracy_mean"] <= 1
    # A child's record: how it ran, its three datasets, a model with its own predictions.
    (child,) = client.search_runs(
        [sweep.experiment_id], "tags.sampler = 'uniform' and params.seed = '1'"
    )
    child_overrides = [o for o in COMMAND if not o.startswith(("sampler=", "seed="))]
    assert_record(
        sweep.uri,
        child.info.run_id,
        [*child_overrides, "sampler=uniform", "seed=1"],
        {"training", "validation", "test"},
    )
    assert "summary/hybrid/vs_uniform_few_accuracy_ci95" in metrics
    # The CLI finds the newest sweep of the study's experiment by itself, prints, logs nothing.
    assert main(["--uri", sweep.uri, "--experiment", "study-synthetic", "--no-log"]) == 0
    out = capsys.readouterr().out
    assert "| hybrid | 2 |" in out and "| uniform | 2 |" in out and "baseline" in out


def test_the_rebuild_commands_are_named_for_the_store_they_are_for():
    """Each command by name (a NamedTuple, not a tuple behind a ``-> str``)."""
    from experiments.report.publishing import Rebuild, rebuild
    from runner.tracking.stores import project_store

    here = rebuild("abc", project_store())
    assert isinstance(here, Rebuild)
    assert here == Rebuild("samplerlab report --parent abc", "samplerlab ui")
    other = rebuild("abc", "sqlite:///other.db")
    assert other.cli == "samplerlab report --parent abc --uri sqlite:///other.db"
    assert other.ui == "samplerlab ui --uri sqlite:///other.db"
    server = rebuild("abc", "http://127.0.0.1:5000/")
    assert server.ui == "open http://127.0.0.1:5000"
