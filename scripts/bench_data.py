"""Speed of the runner's DataLoader path against a plain ``DataLoader(shuffle=True)`` on the same
data, in images per second, and the in-memory path's memory per image.

Both sides deliver model-ready batches: read (and decoded), collated, and standardised per
channel in float32 in the main process with the same function (no model). Our path draws with
the class-balanced ``weighted`` sampler and reads through ``runner.train.feed.Feed`` (the sampler's
epoch as the DataLoader's batch sampler, whole-batch reads); the baseline is
``DataLoader(dataset, batch_size, shuffle=True, num_workers)``. Data: 32x32 RGB images, 10
classes, as PNG files in an ImageFolder tree decoded on the fly by the workers (``data=torchvision``
over the memory budget; the baseline uses torchvision's ``PILToTensor``), and as a uint8 tensor
(``data=tensor_file`` over the budget; the baseline a ``TensorDataset``). Each figure is the best
of ``--repeats`` epochs, worker start-up included.

    python -m scripts.bench_data [--images 4000] [--tensor-images 50000] [--workers 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from runner.data import Samples, to_model_input, torchvision_lt
from runner.train.feed import Feed, place
from samplers import WeightedSampler


def write_folder(root: Path, images: int, classes: int = 10, size: int = 32) -> None:
    from PIL import Image

    rng = np.random.RandomState(0)
    for i in range(images):
        folder = root / f"c{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.randint(0, 256, (size, size, 3), dtype=np.uint8)).save(
            folder / f"{i:06d}.png"
        )


def best_rate(epoch: Callable[[], Iterable[torch.Tensor]], repeats: int) -> float:
    """Images per second of the fastest of ``repeats`` full epochs."""
    best = float("inf")
    count = 0
    for _ in range(repeats):
        started = time.perf_counter()
        count = sum(len(batch) for batch in epoch())
        best = min(best, time.perf_counter() - started)
    return count / best


def ours(
    samples: Samples | torch.Tensor, labels: torch.Tensor, normalize: Any, workers: int, batch: int
) -> Any:
    """One epoch of the runner's feeding: the sampler's order, cut into batches, through ``Feed``
    (a DataLoader for :class:`Samples`, whole-batch gathers for a tensor)."""
    sampler = WeightedSampler(labels, q=0.0, seed=0)  # class-balanced, with replacement
    feed = Feed(samples, torch.device("cpu"), normalize, num_workers=workers)
    epochs = iter(range(10**6))

    def epoch() -> Iterable[torch.Tensor]:
        sampler.set_epoch(next(epochs))
        return feed.batches(sampler.epoch_indices().reshape(-1), batch)

    return epoch


def converted(batches: Iterable, normalize) -> Iterable[torch.Tensor]:
    """The baseline's batches made model-ready with the runner's own conversion."""
    return (to_model_input(b[0], normalize) for b in batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4000, help="PNG files to write and decode")
    parser.add_argument("--tensor-images", type=int, default=50_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import PILToTensor

    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "images"
        write_folder(root, args.images)
        data = torchvision_lt(
            {"_target_": "torchvision.datasets.ImageFolder", "root": str(root)},
            test_fraction=0.01,
            in_memory=False,
        )
        data = place(data, torch.device("cpu"))
        n = len(data.train_x)
        plain_set = ImageFolder(str(root), transform=PILToTensor())
        plain = DataLoader(
            torch.utils.data.Subset(plain_set, data.train_x.indices.tolist()),
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.workers,
        )
        mine = ours(data.train_x, data.train_y, data.normalize, args.workers, args.batch_size)
        rows.append(
            (
                f"PNG folder, decoded on the fly ({n} images, {args.workers} workers)",
                best_rate(mine, args.repeats),
                best_rate(lambda: converted(plain, data.normalize), args.repeats),
            )
        )
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(
        0, 256, (args.tensor_images, 3, 32, 32), dtype=torch.uint8, generator=generator
    )
    y = torch.arange(args.tensor_images) % 10
    normalize = ([0.5] * 3, [0.25] * 3)
    for workers in (args.workers, 0):
        plain_tensor = DataLoader(
            TensorDataset(x), batch_size=args.batch_size, shuffle=True, num_workers=workers
        )
        rows.append(
            (
                f"uint8 tensor ({len(x)} images, {workers} workers)",
                best_rate(ours(Samples(x), y, normalize, workers, args.batch_size), args.repeats),
                best_rate(lambda: converted(plain_tensor, normalize), args.repeats),  # noqa: B023
            )
        )
    memory_rate = best_rate(ours(x, y, normalize, 0, args.batch_size), args.repeats)

    print(f"images/s, batch size {args.batch_size} (higher is better; ratio = ours / plain)\n")
    print("| data | runner DataLoader path | plain DataLoader(shuffle=True) | ratio |")
    print("|---|---|---|---|")
    for name, mine_rate, plain_rate in rows:
        print(f"| {name} | {mine_rate:,.0f} | {plain_rate:,.0f} | {mine_rate / plain_rate:.2f}x |")
    print(f"\nin-memory path (whole-batch gathers on the CPU): {memory_rate:,.0f} images/s")
    per_image = x[0].numel() * x.element_size()
    print(
        f"in-memory path, memory per image: {per_image} bytes ({x.dtype}, {tuple(x.shape[1:])}); "
        f"as float32, as before: {x[0].numel() * 4} bytes ({x[0].numel() * 4 / per_image:.0f}x)"
    )


if __name__ == "__main__":
    main()
