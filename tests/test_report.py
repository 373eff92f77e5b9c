"""The comparison report reads real runs back from a sqlite store."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from experiments.report import markdown, summarise
from runner.tracking import Tracker, load_runs


def test_report_aggregates_seeds_per_strategy(tracking_uri):
    for sampler, seed, value in [("uniform", 0, 0.5), ("uniform", 1, 0.7), ("hybrid", 0, 0.8)]:
        tracker = Tracker(
            tracking_uri,
            "study",
            f"{sampler}-s{seed}",
            params={"seed": str(seed)},
            tags={"sampler": sampler, "data": "digits_lt", "model": "mlp", "loss": "ce"},
        )
        tracker.log_metrics({"final/balanced_accuracy": value, "final/macro_f1": value / 2}, step=0)
        tracker.finish()
    failed = Tracker(
        tracking_uri,
        "study",
        "broken",
        params={},
        tags={"sampler": "uniform", "data": "digits_lt", "model": "mlp", "loss": "ce"},
    )
    failed.finish(failed=True)  # failed runs are left out
    rows = summarise(load_runs(tracking_uri, "study"))
    assert [r["sampler"] for r in rows] == ["hybrid", "uniform"]  # best first
    uniform = rows[1]
    assert uniform["runs"] == 2
    mean, std = uniform["final/balanced_accuracy"]
    assert mean == pytest.approx(0.6) and std == pytest.approx(math.sqrt(0.02))
    assert math.isnan(rows[0]["final/balanced_accuracy"][1])  # one run: no spread
    table = markdown(rows)
    assert "| digits_lt | mlp | ce | uniform | 2 | 0.6000 ± 0.1414 |" in table
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
