"""The comparison report reads real runs back from a sqlite store."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from experiments.report import markdown, summarise
from runner.tracking import Tracker, load_runs


def test_report_aggregates_seeds_per_strategy(tracking_uri):
    runs = [
        ("uniform", 0, 0.5, ""),
        ("uniform", 1, 0.7, ""),
        ("hybrid", 0, 0.8, ""),
        ("uniform", 0, 0.1, " trainer.lr=0.01"),
        ("uniform", 1, 0.3, " sampler.q=0.5 hydra/launcher=joblib"),
    ]
    for sampler, seed, value, extra in runs:
        overrides = f"sampler={sampler} seed={seed} tracking.uri=x{extra}"
        tags = {
            "sampler": sampler,
            "data": "digits_lt",
            "model": "mlp",
            "loss": "ce",
            "overrides": overrides,
        }
        tracker = Tracker.start(
            tracking_uri, "study", f"{sampler}-s{seed}", params={"seed": str(seed)}, tags=tags
        )
        tracker.log_metrics({"final/balanced_accuracy": value, "final/macro_f1": value / 2}, step=0)
        tracker.finish()
    failed = Tracker.start(
        tracking_uri,
        "study",
        "broken",
        params={},
        tags={"sampler": "uniform", "data": "digits_lt", "model": "mlp", "loss": "ce"},
    )
    failed.finish("FAILED")  # failed runs are left out
    rows = summarise(load_runs(tracking_uri, "study"))
    # Best first; another lr is another configuration, not another seed.
    assert [(r["sampler"], r["variant"]) for r in rows] == [
        ("hybrid", "-"),
        ("uniform", "-"),
        ("uniform", "sampler.q=0.5"),  # another sampler setting is another row
        ("uniform", "trainer.lr=0.01"),
    ]
    uniform = rows[1]
    assert uniform["runs"] == 2
    mean, std = uniform["final/balanced_accuracy"]
    assert mean == pytest.approx(0.6) and std == pytest.approx(math.sqrt(0.02))
    assert math.isnan(rows[0]["final/balanced_accuracy"][1])  # one run: no spread
    table = markdown(rows)
    assert "| digits_lt | mlp | ce | uniform | - | 2 | 0.6000 ± 0.1414 |" in table
    with pytest.raises(ValueError, match="no MLflow experiment named 'nothing'"):
        load_runs(tracking_uri, "nothing")


def test_samplers_import_torch_alone():
    code = (
        "import sys, samplers; bad = [m for m in ('runner', 'hydra', 'omegaconf', 'mlflow', 'sklearn') "
        "if m in sys.modules]; print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_a_named_study_sweeps_every_sampler_and_reports(tracking_uri, tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.studies",
            "synthetic",
            "--uri",
            tracking_uri,
            "seed=0",
            "trainer.epochs=1",
            "tracking.plots=false",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("| synthetic_lt")]
    samplers = sorted(line.split("|")[4].strip() for line in table)
    assert samplers == ["annealed", "fixed_class", "hard_mined", "hybrid", "uniform", "weighted"]
    assert all("| 1 |" in line for line in table)  # one seed each
