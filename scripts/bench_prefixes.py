"""The published-recipe race on digits (``+method=ce,drs,drw,crt``), with and without shared
training prefixes, side by side in one session: the epochs trained, against those separate runs
would train, the wall time, and whether every run's value is the same.

    python -m scripts.bench_prefixes [--store DIR] [--max-seeds 5]

Writes ``docs/results/prefixes_bench.json``. Both races run with the basic launcher, one job at
a time, into one store (the seeds come first in each round: see docs/race.md).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

from scripts.bench_race import LOADS, race_record, sweep

ROOT = Path(__file__).resolve().parents[1]
RECIPE = [
    "hydra/sweeper=race",
    "data=digits_lt",
    "model=small_cnn",
    "data.val_per_class=20",
    "trainer.epochs=15",
    "trainer.progress=false",
    "+method=ce,drs,drw,crt",
]


def _values(record: dict[str, object]) -> dict[str, dict[str, float]]:
    values = record["values"]
    assert isinstance(values, dict)
    return {str(c): {str(s): float(v) for s, v in seeds.items()} for c, seeds in values.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, help="folder for the MLflow store")
    parser.add_argument("--max-seeds", type=int, default=5, help="the race's max_seeds")
    args = parser.parse_args(argv)
    folder = args.store or Path(tempfile.mkdtemp(prefix="samplerlab-prefixes-"))
    folder.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    settings = [f"hydra.sweeper.max_seeds={args.max_seeds}"]
    results: dict[str, dict[str, object]] = {}
    for name, share in (("alone", "false"), ("shared", "true")):
        parent, seconds = sweep(
            [*RECIPE, *settings, f"prefixes.share={share}"], uri, f"prefixes-{name}", folder
        )
        record = race_record(uri, parent)
        from mlflow.tracking import MlflowClient

        metrics = MlflowClient(tracking_uri=uri).get_run(parent).data.metrics
        results[name] = {
            "wall_s": round(seconds, 1),
            "runs": int(metrics["advice/runs_used"]),
            "epochs": int(metrics["advice/epochs"]),
            "certificate_points": round(metrics["advice/certificate"], 2),
            "advised": record.get("advised"),
            "values": _values(record),
            "load": LOADS[f"prefixes-{name}"],
        }
        print(f"  {name}: {results[name]['epochs']} epochs, {seconds:.0f} s", flush=True)
    alone, shared = results["alone"], results["shared"]
    epochs = {name: float(str(r["epochs"])) for name, r in results.items()}
    wall = {name: float(str(r["wall_s"])) for name, r in results.items()}
    out = {
        "command": "python -m runner -m " + " ".join([*RECIPE, *settings]),
        **results,
        "same_values": alone["values"] == shared["values"],
        "epochs_ratio": round(epochs["shared"] / epochs["alone"], 3),
        "wall_ratio": round(wall["shared"] / wall["alone"], 3),
    }
    path = ROOT / "docs" / "results" / "prefixes_bench.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k not in results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
