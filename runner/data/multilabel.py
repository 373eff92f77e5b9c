"""Multi-label data: every sample carries any number of classes, a row of an (N, C) 0/1 matrix
(:class:`MultiLabelData`), split by iterative stratification (:mod:`runner.data.stratify`), and
the built-in synthetic long tail with co-occurring labels (``data=synthetic_multilabel``).

A multi-label source has no long-tail cut: a cut keeps the first ``n_c`` samples of each class,
which multi-label data cannot do, since keeping a tail sample keeps its head co-labels. Its
long tail is the data's own (the synthetic source generates one). Its parameters are those of
:class:`MultiLabelCut` (``data_seed``, ``val_fraction``) and the feeding's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from runner.data.cut import VALIDATION_SEED, as_tensor, shared_source
from runner.data.stratify import iterative_split
from runner.data.types import Augment, Feeding, LongTailData, Normalize

TEST_SEED = 104729  # added to data_seed: the test split's stream, as the single-label files'


@dataclass
class MultiLabelData(LongTailData):
    """:class:`LongTailData` whose ``train_y``, ``val_y`` and ``test_y`` are (N, C) bool
    matrices; ``train_counts`` are the training samples that carry each class."""

    @property
    def train_counts(self) -> torch.Tensor:
        return self.train_y.sum(0)

    @property
    def train_size(self) -> int:
        """Training samples (rows), which the class counts alone do not tell."""
        return int(self.train_y.shape[0])


def class_counts(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The samples of each class in a split: a label vector's counts, or a label matrix's
    positives per column."""
    if labels.dim() == 2:
        return labels.sum(0)
    return torch.bincount(labels, minlength=num_classes)


def label_matrix(y: Any, key: str, where: str, length: int) -> np.ndarray:
    """``y`` as an (N, C) bool array after checking that it is one: 2-D, ``length`` rows, every
    entry 0 or 1 (bool, integer or float). An error names the key, the first bad entry and
    the fix."""
    array = y.numpy() if torch.is_tensor(y) else np.asarray(y)
    if array.ndim != 2 or not (
        np.issubdtype(array.dtype, np.number) or np.issubdtype(array.dtype, np.bool_)
    ):
        raise ValueError(
            f"{where}: {key} must be an (N, C) 0/1 matrix, one column per class, got dtype "
            f"{array.dtype} and shape {tuple(array.shape)}; for one class id per sample use "
            f"data=tensor_file"
        )
    if array.shape[0] != length:
        raise ValueError(
            f"{where}: {key} has {array.shape[0]} rows for {length} samples; they must match"
        )
    bad = ~np.isin(array, (0, 1))
    if bad.any():
        row, column = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(
            f"{where}: {key}[{row}, {column}] is {array[row, column].item()!r}; entries must be 0 or 1 "
            f"(map ignored or uncertain labels to 0 or 1 first, e.g. np.clip(y, 0, 1))"
        )
    return array.astype(bool)


def split_fraction(
    labels: np.ndarray, fraction: float, seed: int, parameter: str
) -> tuple[np.ndarray, np.ndarray]:
    """(rest, held) by iterative stratification, ``fraction`` checked and named."""
    if not 0 < fraction < 1:
        raise ValueError(f"{parameter} must lie in (0, 1) (e.g. 0.2), got {fraction}")
    return iterative_split(labels, fraction, seed)


@dataclass(frozen=True, kw_only=True)
class MultiLabelCut:
    """How a multi-label training pool becomes a validation split and a training set:
    ``val_fraction`` of the samples (0: none) by iterative stratification with a seed of its
    own (``data_seed`` + :data:`runner.data.cut.VALIDATION_SEED`); the rest trains."""

    data_seed: int = 0
    val_fraction: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.val_fraction < 1:
            raise ValueError(
                f"data.val_fraction must lie in [0, 1) (e.g. 0.1), got {self.val_fraction}"
            )

    def apply(
        self,
        *,
        name: str,
        train: tuple[Any, np.ndarray],
        test: tuple[Any, np.ndarray],
        class_names: list[str],
        augment: Augment | None = None,
        normalize: Normalize | None = None,
        feeding: Feeding | None = None,
    ) -> MultiLabelData:
        """The validation split and the checks: every class needs training and test samples
        (a class without test positives has no average precision). ``train`` and ``test`` are
        (samples, (N, C) bool labels); samples are tensors or
        :class:`runner.data.samples.Samples`, indexed without copying."""
        (train_x, train_y), (test_x, test_y) = train, test
        val_x = val_y = None
        if self.val_fraction:
            rest, val = split_fraction(
                train_y, self.val_fraction, self.data_seed + VALIDATION_SEED, "data.val_fraction"
            )
            val_x, val_y = train_x[val], train_y[val]
            train_x, train_y = train_x[rest], train_y[rest]
        for split, labels in (("training", train_y), ("test", test_y)):
            empty = np.flatnonzero(labels.sum(0) == 0)
            if empty.size:
                missing = [class_names[c] for c in empty[:10]]
                raise ValueError(
                    f"the {split} split has no sample of class(es) {missing}; every class needs "
                    f"training and test samples (drop those label columns, or lower "
                    f"data.val_fraction / data.test_fraction)"
                )
        counts = train_y.sum(0)
        return MultiLabelData(
            train_x=as_tensor(train_x),
            train_y=torch.from_numpy(train_y),
            test_x=as_tensor(test_x),
            test_y=torch.from_numpy(test_y),
            class_names=class_names,
            name=name,
            imbalance_factor=float(counts.max() / counts.min()),
            augment=augment,
            val_x=as_tensor(val_x) if val_x is not None else None,
            val_y=torch.from_numpy(val_y) if val_y is not None else None,
            normalize=normalize,
            feeding=feeding or Feeding(),
        )


def multilabel_source(
    **defaults: Any,
) -> Callable[[Callable[..., LongTailData]], Callable[..., LongTailData]]:
    """A multi-label source's shared parameters: :class:`MultiLabelCut`'s and the feeding's;
    :func:`is_multilabel_source` knows it by them."""
    return shared_source(MultiLabelCut, Feeding, **defaults)


def is_multilabel_source(source: Any) -> bool:
    """Whether the data source ``source`` (a ``data._target_``'s function) gives multi-label
    data: it takes :class:`MultiLabelCut`'s parameters and no long-tail cut's."""
    try:
        parameters = inspect.signature(source).parameters
    except (TypeError, ValueError):
        return False
    return "val_fraction" in parameters and "n_max" not in parameters


def label_rates(
    num_classes: int, head_rate: float, imbalance_factor: float, profile: str
) -> np.ndarray:
    """Each class's rate of positives, head first: ``head_rate * (1/IF)^(c/(C-1))`` (``exp``) or
    ``head_rate`` for the first half and ``head_rate / IF`` for the rest (``step``)."""
    if not imbalance_factor >= 1:
        raise ValueError(
            f"data.imbalance_factor must be >= 1 (1 = balanced), got {imbalance_factor}"
        )
    c = np.arange(num_classes)
    if profile == "exp":
        return np.asarray(head_rate * (1.0 / imbalance_factor) ** (c / max(1, num_classes - 1)))
    if profile == "step":
        head = num_classes - num_classes // 2
        return np.where(c < head, head_rate, head_rate / imbalance_factor)
    raise ValueError(f"data.profile={profile!r} is unknown; choose one of ('exp', 'step')")


@multilabel_source()
def synthetic_multilabel(
    num_classes: int = 10,
    dim: int = 32,
    train_size: int = 4000,
    test_size: int = 2000,
    head_rate: float = 0.4,
    imbalance_factor: float = 100.0,
    profile: str = "exp",
    co_occurrence: float = 0.7,
    separation: float = 3.0,
    noise: float = 1.0,
    *,
    cut: MultiLabelCut,
    feeding: Feeding,
) -> MultiLabelData:
    """A long tail of labels with co-occurrence, generated from ``data_seed``.

    Sample ``i`` carries class ``c`` with probability ``rate_c`` (:func:`label_rates`), each
    independently, and a sample left without a label gets one class drawn in proportion to the
    rates; then a sample with a label of the tail half also carries the head class 0 with
    probability ``co_occurrence`` (drawing a tail sample brings the head along). Its features are the
    sum of its classes' means (drawn at ``separation`` scale) plus isotropic ``noise``. The test
    set is ``test_size`` more samples from the same distribution."""
    where = "data"
    if num_classes < 2 or dim < 1 or train_size < 2 or test_size < 1:
        raise ValueError(
            f"{where}: num_classes >= 2, dim >= 1, train_size >= 2 and test_size >= 1 are "
            f"required, got {num_classes}, {dim}, {train_size}, {test_size}"
        )
    for key, value, low, high in (
        ("head_rate", head_rate, 0.0, 1.0),
        ("co_occurrence", co_occurrence, 0.0, 1.0),
        ("separation", separation, 0.0, np.inf),
        ("noise", noise, 0.0, np.inf),
    ):
        if not (np.isfinite(value) and low <= value <= high) or (key == "head_rate" and value == 0):
            raise ValueError(f"data.{key} must lie in [{low}, {high}] (head_rate > 0), got {value}")
    rates = label_rates(num_classes, head_rate, imbalance_factor, profile)
    rng = np.random.RandomState(cut.data_seed)
    means = rng.randn(num_classes, dim) * separation / np.sqrt(dim) * np.sqrt(2)

    def sample(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.rand(n, num_classes) < rates
        empty = np.flatnonzero(~y.any(1))
        y[empty, rng.choice(num_classes, empty.size, p=rates / rates.sum())] = True
        tail = y[:, num_classes - num_classes // 2 :].any(1)
        y[:, 0] |= tail & (rng.rand(n) < co_occurrence)
        x = y.astype(np.float64) @ means + noise * rng.randn(n, dim)
        return x.astype(np.float32), y

    train, test = sample(train_size), sample(test_size)
    return cut.apply(
        name="synthetic_multilabel",
        train=train,
        test=test,
        class_names=[f"class_{c}" for c in range(num_classes)],
        feeding=feeding,
    )
