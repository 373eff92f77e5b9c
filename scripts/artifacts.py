"""Stored study artifacts: a sweep's finished runs written to ``docs/results/<name>.json``
(their headline metrics, seeds and tags) and read back, for tables that cannot drift from the
runs they come from (:mod:`scripts.tables`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


RESULTS = ROOT / "docs" / "results"


KEPT_TAGS = ("sampler", "data", "model", "loss", "method", "overrides", "config_key", "reference")


HEADLINE = re.compile(r"^(final|val)/[a-z0-9_]+$")


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


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
