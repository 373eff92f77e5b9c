"""The published-recipe race on digits (``+method=ce,drs,drw,crt``) three ways, side by side in
one session: as races ran before lean children and shared prefixes (every child logs its MLflow
model and plots, every run trains from epoch 0: ``before``), with lean children alone
(``alone``), and as a race runs now (lean children, shared prefixes: ``shared``). For each: the
epochs trained, the wall time, and whether every run's value and the advice are the same.

    python -m scripts.bench_prefixes [--store DIR] [--max-seeds 5]

Writes ``docs/results/prefixes_bench.json``. The races run with the basic launcher, one job at
a time, into one store (the seeds come first in each round: see docs/race.md), in the order
before, shared, alone, so that neither end of the comparison always runs first.
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


# How each race differs from a race today (the sweeper's lean children, prefixes shared).
VARIANTS = {
    "before": ["tracking.log_model=true", "tracking.plots=true", "prefixes.share=false"],
    "shared": ["prefixes.share=true"],
    "alone": ["prefixes.share=false"],
}


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
    for name, overrides in VARIANTS.items():
        parent, seconds = sweep([*RECIPE, *settings, *overrides], uri, f"prefixes-{name}", folder)
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
    before, alone, shared = results["before"], results["alone"], results["shared"]
    epochs = {name: float(str(r["epochs"])) for name, r in results.items()}
    wall = {name: float(str(r["wall_s"])) for name, r in results.items()}
    out = {
        "command": "python -m runner -m " + " ".join([*RECIPE, *settings]),
        "variants": {name: " ".join(overrides) for name, overrides in VARIANTS.items()},
        **results,
        "same_values": before["values"] == alone["values"] == shared["values"],
        "same_advice": before["advised"] == alone["advised"] == shared["advised"],
        "epochs_ratio": round(epochs["shared"] / epochs["alone"], 3),
        "wall_ratio": round(wall["shared"] / wall["alone"], 3),
        "wall_ratio_to_before": round(wall["shared"] / wall["before"], 3),
    }
    path = ROOT / "docs" / "results" / "prefixes_bench.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k not in results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
