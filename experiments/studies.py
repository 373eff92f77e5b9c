"""Named studies: a sweep of every sampler over seeds on one data set, then its report.

    python -m experiments.studies digits            # ~1 min on a 2-core CPU
    python -m experiments.studies cifar10_lt_jpeg --root /path/to/cifar10-jpeg   # GPU advised

Each study runs `python -m runner -m ...` (one parent MLflow run, a child per job) in the MLflow
experiment ``study-<name>`` and prints the comparison table of that sweep.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from experiments.report import markdown, summarise
from runner.tracking import latest_sweep, load_runs

ALL_SAMPLERS = "sampler=uniform,weighted,fixed_class,annealed,hard_mined,hybrid"
STUDIES: dict[str, list[str]] = {
    "synthetic": [
        "data=synthetic_lt",
        "model=mlp",
        "trainer.epochs=10",
        ALL_SAMPLERS,
        "seed=0,1,2",
    ],
    "digits": [
        "data=digits_lt",
        "model=small_cnn",
        "trainer.epochs=15",
        ALL_SAMPLERS,
        "seed=0,1,2",
    ],
    # CIFAR-10-LT (IF=100) from the JPEG image tree: ~20 s per epoch per run with small_cnn on
    # two CPU cores, so 6 runs x 30 epochs take about an hour there.
    "cifar10_lt_jpeg": [
        "data=image_folder_lt",
        "model=small_cnn",
        "trainer.epochs=30",
        "trainer.warmup_epochs=2",
        "trainer.weight_decay=2e-4",
        ALL_SAMPLERS,
        "seed=0",
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("study", choices=sorted(STUDIES))
    parser.add_argument("--root", help="data.root for image-folder studies")
    parser.add_argument(
        "--uri", default=None, help="tracking URI (default: the project store, as for runs)"
    )
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. trainer.epochs=5")
    args = parser.parse_intermixed_args()
    # Later overrides of the same key replace the study's (e.g. seed=0 for a quick look).
    chosen = {o.split("=")[0]: o for o in STUDIES[args.study]}
    experiment = f"study-{args.study}"
    extra = [f"tracking.experiment={experiment}", "trainer.progress=false", *args.overrides]
    if args.root:
        extra.append(f"data.root={args.root}")
    if args.uri:
        extra.append(f"tracking.uri={args.uri}")
    chosen.update({o.split("=")[0]: o for o in extra})
    if chosen["data"] == "data=image_folder_lt" and "data.root" not in chosen:
        parser.error(f"study {args.study!r} needs --root (a folder with train/ and test/)")
    overrides = list(chosen.values())
    subprocess.run([sys.executable, "-m", "runner", "-m", *overrides], check=True)
    print(markdown(summarise(load_runs(args.uri, experiment, latest_sweep(args.uri, experiment)))))


if __name__ == "__main__":
    main()
