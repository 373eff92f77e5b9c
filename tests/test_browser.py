"""The MLflow UI in a real browser (Debian's chromium through playwright): after a tiny sweep,
the parent run's row shows the summary metrics, expanding it lists the children, and the
report.html artifact renders its table and plots. Screenshots go to $SAMPLERLAB_SCREENSHOTS
(default: the test's temporary folder)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from scripts.browser import (
    browser_page,
    chromium_available,
    mlflow_ui,
    parent_row,
    report_artifact,
    run_overview,
)
from tests.helpers.sweeps import tiny_sweep

pytestmark = [
    pytest.mark.browser,  # a real chromium
    pytest.mark.skipif(
        not chromium_available() and not os.environ.get("CI"),
        reason="no chromium here (make install-browser); in CI this test always runs",
    ),
]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, migrated_store):
    return tiny_sweep(tmp_path_factory.getbasetemp() / "tiny-sweep", migrated_store)


def test_the_mlflow_ui_shows_the_answer_on_the_parent_run(sweep, tmp_path):
    shown = [f"summary/{s}/final_balanced_accuracy_mean" for s in ("hybrid", "uniform")]
    logged = MlflowClient(tracking_uri=sweep.uri).get_run(sweep.parent_run_id).data.metrics
    shots = Path(os.environ.get("SAMPLERLAB_SCREENSHOTS") or tmp_path)
    with mlflow_ui(sweep.uri, tmp_path / "mlflow-ui.log") as base, browser_page() as page:
        row = parent_row(
            page,
            base,
            sweep.experiment_id,
            sweep.parent_name,
            shown,
            sweep.child_names,
            shots / "mlflow_parent_row.png",
        )
        for metric in shown:
            assert str(logged[metric]) in row, (metric, logged[metric], row)
        text, images = report_artifact(
            page,
            base,
            sweep.experiment_id,
            sweep.parent_run_id,
            shots / "mlflow_report.png",
            "Plots",
        )
        (child,) = MlflowClient(tracking_uri=sweep.uri).search_runs(
            [sweep.experiment_id], "tags.sampler = 'hybrid' and params.seed = '0'"
        )
        overview = run_overview(
            page,
            base,
            sweep.experiment_id,
            child.info.run_id,
            ["synthetic_lt-train", "Training"],
            shots / "mlflow_child_run.png",
        )
    # The run page lists its datasets (the training one, "+2" more: validation and test) and
    # links its final metrics to the logged model.
    datasets = overview.split("Datasets", 1)[1].split("Tags", 1)[0]
    assert "synthetic_lt-train" in datasets and "Training" in datasets and "+2" in datasets
    assert "Models" in overview and "\nmodel\n" in overview, overview
    assert "Final test metrics per strategy" in text and "best by balanced accuracy" in text
    assert "baseline" in text and "hybrid" in text
    assert images == 3  # the three plots, embedded, all decoded
    for name in ("mlflow_parent_row.png", "mlflow_report.png"):
        assert (shots / name).stat().st_size > 10_000
