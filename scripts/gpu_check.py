"""`make gpu-check`: the CUDA path end to end, for a machine with a GPU.

    python -m scripts.gpu_check [--epochs 3] [--out gpu-check.json]

Trains through the runner on the GPU (``trainer.device=auto``) and checks what docs/scaling.md
promises there: the model and the in-memory training data live on the device, the forward pass
runs in bfloat16 autocast, the loss stays finite and the run records its final metrics (in a
throwaway sqlite store). It prints one line per check and the seconds per epoch for the small CNN
on digits and ResNet-32 on digits, and writes them as JSON with ``--out``. With two GPUs or
more it also trains one run in two processes (``torchrun``, nccl, SyncBatchNorm) and checks that
exactly one MLflow run exists and FINISHED. Without a CUDA device it says so in one line and
exits 2.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from runner.config import CONF, register

CASES = {
    "small_cnn-digits": ["data=digits_lt", "model=small_cnn", "sampler=hard_mined"],
    "resnet32-digits": ["data=digits_lt", "model=resnet32", "sampler=hybrid"],
}


def _check(name: str, ok: bool, detail: str = "") -> bool:
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    return ok


def check_case(name: str, overrides: list[str], epochs: int) -> tuple[bool, dict[str, float]]:
    from runner.build import build_parts
    from runner.results import record_results
    from runner.tracking import Tracker
    from runner.train.feed import Feed
    from runner.train.fit import fit
    from runner.train.run import Progress, RunContext

    with tempfile.TemporaryDirectory() as tmp, initialize_config_dir(str(CONF), version_base="1.3"):
        uri = f"sqlite:///{tmp}/mlflow.db"
        cfg = compose(
            "config",
            [
                *overrides,
                f"trainer.epochs={epochs}",
                "trainer.progress=false",
                "tracking.plots=false",
                f"tracking.uri={uri}",
            ],
        )
        parts = build_parts(cfg)
        outputs: list[torch.dtype] = []
        hook = parts.state.model.register_forward_hook(lambda m, i, o: outputs.append(o.dtype))
        tracker = Tracker.start(uri, "gpu-check", name, params={}, tags={})
        progress, checkpoint = Progress(), Path(tmp) / "checkpoint.pt"
        started = time.perf_counter()
        run = RunContext(parts, tracker, progress, checkpoint)
        fit(run)
        if parts.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / epochs
        hook.remove()
        summary = record_results(run)
        tracker.finish("FINISHED")
        feed = Feed(parts.data.train_x, parts.device)
        ok = _check(
            f"{name}: model on the GPU", all(p.is_cuda for p in parts.state.model.parameters())
        )
        ok &= _check(
            f"{name}: training data in GPU memory", feed.memory is not None and feed.memory.is_cuda
        )
        ok &= _check(
            f"{name}: forward in bfloat16 autocast", torch.bfloat16 in outputs, str(set(outputs))
        )
        ok &= _check(f"{name}: final metrics recorded", "final/balanced_accuracy" in summary)
        print(f"     {name}: {seconds:.3f} s per epoch", flush=True)
        return ok, {
            "seconds_per_epoch": seconds,
            "final_balanced_accuracy": summary["final/balanced_accuracy"],
        }


def check_two_ranks(epochs: int) -> tuple[bool, dict[str, float]]:
    """One run of ResNet-32 on digits in two processes, one per GPU (nccl)."""
    from mlflow.tracking import MlflowClient

    torchrun = Path(sys.executable).with_name("torchrun")
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        started = time.perf_counter()
        done = subprocess.run(
            [str(torchrun), "--standalone", "--nproc_per_node=2", "-m", "runner"]
            + ["data=digits_lt", "model=resnet32", "sampler=hard_mined", "trainer.device=cuda"]
            + [f"trainer.epochs={epochs}", "trainer.progress=false", f"tracking.uri={uri}"],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        seconds = (time.perf_counter() - started) / epochs
        ok = _check("resnet32-digits, 2 ranks (nccl): exit 0", done.returncode == 0)
        if not ok:
            print(done.stderr[-2000:], flush=True)
            return False, {}
        client = MlflowClient(uri)
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        ok &= _check(
            "resnet32-digits, 2 ranks: one MLflow run, FINISHED",
            [r.info.status for r in runs] == ["FINISHED"],
            str([r.info.status for r in runs]),
        )
        print(f"     resnet32-digits, 2 ranks: {seconds:.3f} s per epoch (process start included)")
        return ok, {"seconds_per_epoch": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("samplerlab: gpu-check needs a CUDA device and found none; run it on a GPU machine")
        return 2
    register()
    results: dict[str, object] = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
    }
    passed = True
    for name, overrides in CASES.items():
        ok, figures = check_case(name, overrides, args.epochs)
        passed &= ok
        results[name] = figures
    if torch.cuda.device_count() >= 2:
        ok, figures = check_two_ranks(args.epochs)
        passed &= ok
        results["resnet32-digits-2-ranks"] = figures
    else:
        print("     one GPU: the two-process (nccl) check needs two; skipped", flush=True)
    results["passed"] = passed
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
