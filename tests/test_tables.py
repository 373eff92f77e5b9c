"""Tables that cannot drift: the committed tables are what ``python -m scripts.tables``
renders from the stored study artifacts, and the command writes between markers only."""

from __future__ import annotations

import json
import shutil

import pytest
from mlflow.tracking import MlflowClient

from experiments.report import build_report
from experiments.store import child_runs, get_run, open_store
from scripts import race_replays, tables

pytestmark = pytest.mark.unit  # in one process, seconds


def test_the_committed_tables_match_their_artifacts():
    assert tables.stale() == [], "run python -m scripts.tables and commit the result"
    shown = {
        m.group("name") for p in tables.documents() for m in tables.MARKER.finditer(p.read_text())
    }
    assert {"race-rule", "race-bench", "race-rounds", "digits-test", "digits-val"} <= shown


# Orders replayed again of each stored setting: 7 x 25 races, a few seconds; any change of the
# rule that alters a race shows in its first orders in practice (every order replays the same
# rounds with other seeds first).
RECHECKED_ORDERS = 25


def test_the_stored_seed_order_replays_are_todays_rule():
    """The tables read the race's replays from ``race_orders.json``: they are what today's rule
    gives on today's artifacts (the first orders replayed again, compared exactly)."""
    for name, settings in race_replays.expected_settings().items():
        _, stored = race_replays.stored_replays(race_replays.RESULTS, name)
        assert len(stored) == race_replays.ORDERS
        again = race_replays.replay_setting(race_replays.RESULTS, settings, RECHECKED_ORDERS)
        assert again == stored[:RECHECKED_ORDERS], f"{name}: run python -m scripts.tables --replay"


def test_replays_of_other_inputs_or_settings_are_refused(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(tables.RESULTS, results)
    race_replays.stored_replays(results, "defaults, budget")  # as committed: read
    committed = (results / "race_orders.json").read_text()
    stored = json.loads(committed)
    stored["replays"]["defaults, budget"]["settings"]["alpha"] = 0.1
    (results / "race_orders.json").write_text(json.dumps(stored))
    with pytest.raises(race_replays.StaleReplays, match="other settings"):
        race_replays.stored_replays(results, "defaults, budget")
    (results / "race_orders.json").write_text(committed)
    grid = results / "digits_grid.json"
    grid.write_text(grid.read_text().replace("0.", "0.0", 1))
    with pytest.raises(race_replays.StaleReplays, match="other grid or benchmark files"):
        race_replays.stored_replays(results, "defaults, budget")


def test_the_features_table_shows_a_races_seconds_a_run_and_how_it_stopped(tmp_path):
    """Stacked heads each last as long as their round, so the table shows the race's wall time
    over its runs, and under it a line per setting: the rounds, why it stopped, who was left."""
    results = tmp_path / "results"
    shutil.copytree(tables.RESULTS, results)
    bench = json.loads((results / "features_bench.json").read_text())
    race = bench["settings"]["pretrained"]["race"]
    race.update(seconds=120.0, runs=48, survivors=["a", "b"], stop_reason="budget spent")
    race["record"]["rounds"] = race["record"]["rounds"][:1]
    (results / "features_bench.json").write_text(json.dumps(bench))
    text = tables.features_bench_table(results)
    assert "(2.5 s a run in the race) | 48 runs, 2.0 min |" in text
    assert "pretrained: the race stopped after 1 round(s) (budget spent), a, b left in it." in text


def test_tables_are_written_between_their_markers_only(tmp_path):
    (tmp_path / "docs").mkdir()
    results = tmp_path / "results"
    shutil.copytree(tables.RESULTS, results)
    doc = tmp_path / "docs" / "a.md"
    doc.write_text(
        "before\n<!-- table:race-rule:start -->\nstale\n<!-- table:race-rule:end -->\nafter\n"
    )
    assert tables.stale(tmp_path, results) == [doc]
    assert tables.write(tmp_path, results) == [doc]
    text = doc.read_text()
    assert text.startswith("before\n<!-- table:race-rule:start -->\n| scenario")
    assert text.endswith("<!-- table:race-rule:end -->\nafter\n") and "stale" not in text
    assert tables.write(tmp_path, results) == []  # rendering again changes nothing
    doc.write_text("<!-- table:nosuch:start -->\n<!-- table:nosuch:end -->\n")
    with pytest.raises(KeyError, match="no table 'nosuch'"):
        tables.write(tmp_path, results)


def test_an_exported_sweep_renders_the_reports_own_table(tracking_uri, tmp_path):
    """A sweep written to a real store, exported to an artifact: the table rendered from the
    artifact is the report's table of the store's runs."""
    client = MlflowClient(tracking_uri)
    experiment = client.create_experiment("study")
    parent = client.create_run(experiment, tags={"sweep": "parent"}).info.run_id
    for sampler, level in (("uniform", 0.80), ("weighted", 0.90)):
        for seed in range(3):
            run = client.create_run(
                experiment,
                run_name=f"{sampler}-s{seed}",
                tags={
                    "mlflow.parentRunId": parent,
                    "sampler": sampler,
                    "data": "d",
                    "model": "m",
                    "loss": "ce",
                    "overrides": f"sampler={sampler} seed={seed}",
                },
            ).info.run_id
            client.log_param(run, "seed", str(seed))
            for metric in (
                "accuracy",
                "balanced_accuracy",
                "macro_f1",
                "many_accuracy",
                "medium_accuracy",
                "few_accuracy",
            ):
                client.log_metric(run, f"final/{metric}", level + 0.01 * seed)
                client.log_metric(run, f"val/{metric}", level + 0.02 * seed)
            client.log_metric(run, "final/recall/class_0", 0.5)  # per-class: not exported
            client.set_terminated(run, "FINISHED")
    artifact = tables.export_runs(tracking_uri, parent)
    assert len(artifact["runs"]) == 6
    assert all("final/recall/class_0" not in r["metrics"] for r in artifact["runs"])
    (tmp_path / "digits_grid.json").write_text(json.dumps(artifact))
    rendered = tables.TABLES["digits-test"](tmp_path)
    store, uri = open_store(tracking_uri)
    report = build_report(child_runs(store, get_run(store, uri, parent)), "t", plots=False)
    header, rows = next(b[1:] for b in report.blocks if b[0] == "table")
    assert rendered == tables.markdown_table(header, rows)
    assert "weighted" in rendered and "+10.0" in rendered  # the paired Δ to uniform, in points
