"""Samples kept where they are (a tensor, possibly memory-mapped, or a dataset that decodes on
demand) and read by index (:class:`Samples`): the splits and the long-tail cut compose indices
and copy nothing; :mod:`runner.train.feed` decides whether they are read into memory or through a
``DataLoader``. Every value read is checked to be finite."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from runner.data.types import Normalize

STATS_SAMPLES = 2048  # images the per-channel mean and std are estimated from


FINITE_CHECK_ROWS = 4096  # samples checked at a time: a memory-mapped file is read in pieces


class SampleError(ValueError):
    """A sample cannot be read or does not match the others; the message names the fix."""


class Samples(Dataset[Any]):
    """Rows ``indices`` of ``base``: a tensor (rows are samples; it may be memory-mapped), or a
    map-style dataset whose items ``read`` turns into tensors. ``samples[i]`` is one sample,
    ``samples[array]`` another :class:`Samples` over those rows, and ``__getitems__`` (which a
    ``DataLoader`` calls) one stacked batch."""

    def __init__(
        self,
        base: Any,
        indices: np.ndarray | None = None,
        read: Callable[[Any, int], torch.Tensor] | None = None,
    ) -> None:
        self.base, self.read = base, read
        self.indices = (
            np.arange(len(base), dtype=np.int64)
            if indices is None
            else np.asarray(indices, dtype=np.int64)
        )

    def __len__(self) -> int:
        return int(self.indices.size)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, np.integer)):
            return self.__getitems__([int(key)])[0]
        return Samples(self.base, self.indices[key], self.read)

    def __getitems__(self, positions: Sequence[int] | np.ndarray) -> torch.Tensor:
        rows = self.indices[np.asarray(positions, dtype=np.int64)]
        if self.read is None:  # a tensor: one gather
            return self.base.index_select(0, torch.from_numpy(rows))
        items = [self.read(self.base, int(r)) for r in rows]
        first = self.sample
        for row, item in zip(rows, items, strict=True):
            if item.shape != first.shape or item.dtype != first.dtype:
                raise SampleError(
                    f"data.dataset: sample {row} is {tuple(item.shape)} {item.dtype}, the first "
                    f"is {tuple(first.shape)} {first.dtype}; give every image one size with "
                    f"data.image_size=<pixels>"
                )
            if item.is_floating_point() and not bool(torch.isfinite(item).all()):
                raise SampleError(
                    f"data.dataset: sample {row} holds {_first_bad(item)} (not finite); every "
                    f"sample must be finite: fix the dataset's sample {row} or its transform"
                )
        return torch.stack(items)

    @cached_property
    def sample(self) -> torch.Tensor:
        """The first sample (of the base), as read: fixes the shape and dtype of every other."""
        if self.read is None:
            return self.base[0]
        return self.read(self.base, int(self.indices[0]) if self.indices.size else 0)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self), *self.sample.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.sample.dtype

    @property
    def decodes(self) -> bool:
        """Whether reading a sample runs code (decoding): then workers pay off."""
        return self.read is not None

    @property
    def nbytes(self) -> int:
        """Memory the samples take once read into one tensor."""
        return len(self) * self.sample.numel() * self.sample.element_size()

    def __getstate__(self) -> dict[str, Any]:  # the cached sample need not travel to workers
        state = dict(self.__dict__)
        state.pop("sample", None)
        return state


def _first_bad(x: torch.Tensor) -> float:
    """The first non-finite value of ``x`` (which has one)."""
    flat = x.reshape(-1)
    return float(flat[~torch.isfinite(flat)][0])


def check_finite(x: torch.Tensor, key: str, where: str, split: str) -> None:
    """Float samples must be finite: a NaN or inf input makes every loss after it non-finite,
    which would otherwise read as a learning rate that is too high. Names the first bad row."""
    if not x.is_floating_point():
        return  # integers (uint8 images) are finite
    for start in range(0, len(x), FINITE_CHECK_ROWS):
        chunk = x[start : start + FINITE_CHECK_ROWS].reshape(-1, max(1, x[0].numel()))
        finite = torch.isfinite(chunk).all(dim=1)
        if not bool(finite.all()):
            row = start + int((~finite).nonzero()[0])
            raise ValueError(
                f"{where}: {key}[{row}] ({split}) holds {_first_bad(x[row])}, not a finite "
                f"number; every sample must be finite: fix or drop row {row} of {key}"
            )


def channel_stats(samples: Samples, data_seed: int) -> Normalize:
    """Per-channel mean and std of uint8 images in [0, 1], from up to ``STATS_SAMPLES`` of them
    chosen with the data seed (all of them when there are fewer)."""
    n = len(samples)
    rows = np.arange(n)
    if n > STATS_SAMPLES:
        rows = np.sort(np.random.RandomState(data_seed).choice(n, STATS_SAMPLES, replace=False))
    x = torch.cat(
        [samples.__getitems__(chunk) for chunk in np.array_split(rows, -(-rows.size // 256))]
    )
    mean, std = uint8_channel_stats(x)
    return mean, [max(s, 1e-3) for s in std]


def uint8_channel_stats(x: torch.Tensor) -> Normalize:
    """Per-channel mean and standard deviation (``n - 1`` in the denominator), in [0, 1], of
    uint8 images ``x`` (N, C, H, W): exact, from each channel's histogram (integer sums, one
    rounding at the end), without the float64 copy of the images a direct mean would make.

    Example:
        >>> uint8_channel_stats(torch.tensor([[[[0, 255]]]], dtype=torch.uint8))
        ([0.5], [0.7071067811865476])
    """
    levels = torch.arange(256, dtype=torch.int64)
    n = x.numel() // x.shape[1]
    means, stds = [], []
    for channel in range(x.shape[1]):
        counts = torch.bincount(x[:, channel].reshape(-1), minlength=256)
        total, squares = int((counts * levels).sum()), int((counts * levels * levels).sum())
        means.append(total / (255 * n))
        spread = (n * squares - total * total) / (n * (n - 1)) if n > 1 else math.nan
        stds.append(math.sqrt(spread) / 255)
    return means, stds


def is_image(sample: torch.Tensor) -> bool:
    return sample.dtype == torch.uint8 and sample.dim() == 3


class ReadImage:
    """An item of a torchvision-style dataset as a tensor: the first element of a tuple, PIL
    images as uint8 (C, H, W), resized (shorter side) and centre-cropped to ``image_size``."""

    def __init__(self, image_size: int | None = None) -> None:
        self.image_size = image_size

    def __call__(self, dataset: Any, index: int) -> torch.Tensor:
        try:
            item = dataset[index]
        except Exception as error:  # the dataset's own code: a missing or corrupt file, ...
            source = ""
            if hasattr(dataset, "samples") and index < len(dataset.samples):
                source = f" ({dataset.samples[index][0]})"
            raise SampleError(
                f"data.dataset: cannot read sample {index}{source}: {type(error).__name__}: "
                f"{error}; remove or replace it"
            ) from None
        x = item[0] if isinstance(item, (tuple, list)) else item
        from PIL import Image
        from torchvision.transforms.v2 import functional as tf

        if self.image_size:
            x = tf.center_crop(tf.resize(x, self.image_size), self.image_size)
        if isinstance(x, Image.Image):
            x = tf.pil_to_tensor(x)
        x = torch.as_tensor(x)
        if x.dtype == torch.uint8 and x.dim() == 2:
            x = x.unsqueeze(0)
        return x


def default_workers(samples: Any) -> int:
    """DataLoader workers when not configured: none for tensors, up to 4 for decoding."""
    if isinstance(samples, Samples) and samples.decodes:
        return min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2)
    return 0
