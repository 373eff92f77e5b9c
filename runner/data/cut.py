"""The long-tail cut every source shares: a validation split, then the training set cut to
n_i = int(n_max * (1/IF)^(i/(C-1))) (class 0 is the head), the test set left balanced.

Within each class a shuffle with a fixed data seed keeps the first n_i, so every strategy and
seed trains on the same subset. The parameters of the cut (:class:`LongTailCut`) and of the
feeding (:class:`runner.data.types.Feeding`) are every source's: :func:`long_tail_source` adds
them to a source's signature once, with that source's defaults.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from runner.data.types import Augment, Feeding, LongTailData, Normalize

PROFILES = ("exp", "step")
VALIDATION_SEED = 7919  # added to data_seed: the validation split has a stream of its own

F = TypeVar("F", bound=Callable[..., LongTailData])


def long_tail_counts(
    n_max: int, num_classes: int, imbalance_factor: float, profile: str = "exp"
) -> list[int]:
    """Per-class training counts, head first."""
    if imbalance_factor < 1:
        raise ValueError(
            f"data.imbalance_factor must be >= 1 (1 = balanced), got {imbalance_factor}"
        )
    if profile not in PROFILES:
        raise ValueError(f"data.profile={profile!r} is unknown; choose one of {PROFILES}")
    if num_classes == 1:
        return [n_max]
    if profile == "step":
        head = num_classes - num_classes // 2
        return [n_max] * head + [int(n_max / imbalance_factor)] * (num_classes - head)
    return [
        int(n_max * (1.0 / imbalance_factor) ** (i / (num_classes - 1.0)))
        for i in range(num_classes)
    ]


def long_tail_subset(labels: np.ndarray, counts: Sequence[int], data_seed: int) -> np.ndarray:
    """Indices keeping the first ``counts[c]`` of each class after a fixed-seed shuffle."""
    rng = np.random.RandomState(data_seed)
    keep = []
    for c, n in enumerate(counts):
        members = np.flatnonzero(labels == c)
        if n > members.size:
            raise ValueError(
                f"data.n_max: class {c} has {members.size} samples, the long-tail profile asks for {n}; lower data.n_max to at most {members.size}"
            )
        rng.shuffle(members)
        keep.append(members[:n])
    return np.sort(np.concatenate(keep))


@dataclass(frozen=True, kw_only=True)
class LongTailCut:
    """How a source's training pool becomes a validation split and a long-tailed training set.

    ``imbalance_factor`` None keeps the data's own counts (capped at ``n_max`` per class when
    given); a number cuts to the ``profile`` with head class ``n_max`` (default: the smallest
    class's pool). The validation split is taken first, balanced: ``val_per_class`` samples of
    every class, or ``val_fraction`` of every class (at least one, never all); it is never
    part of training or test.
    """

    imbalance_factor: float | None = None
    profile: str = "exp"
    data_seed: int = 0
    n_max: int | None = None
    val_per_class: int = 0
    val_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.val_per_class < 0:
            raise ValueError(f"data.val_per_class must be >= 0, got {self.val_per_class}")
        if not 0 <= self.val_fraction < 1:
            raise ValueError(
                f"data.val_fraction must lie in [0, 1) (e.g. 0.1), got {self.val_fraction}"
            )
        if self.val_per_class and self.val_fraction:
            raise ValueError(
                f"data.val_per_class={self.val_per_class} and data.val_fraction="
                f"{self.val_fraction}: give one of them (set the other to 0)"
            )
        if self.n_max is not None and self.n_max < 1:
            raise ValueError(f"data.n_max must be >= 1, got {self.n_max}")

    def validation(self, labels: np.ndarray, num_classes: int) -> np.ndarray:
        """The validation split's indices into ``labels`` (empty without one), drawn with a
        seed of their own, so the cut that follows stays a pure function of ``data_seed``."""
        if not (self.val_per_class or self.val_fraction):
            return np.empty(0, np.int64)
        rng = np.random.RandomState(self.data_seed + VALIDATION_SEED)
        chosen = []
        for c in range(num_classes):
            members = np.flatnonzero(labels == c)
            take = self.val_per_class or max(1, round(self.val_fraction * members.size))
            if members.size <= take:
                setting = (
                    f"data.val_per_class={self.val_per_class}"
                    if self.val_per_class
                    else f"data.val_fraction={self.val_fraction}"
                )
                raise ValueError(
                    f"{setting} leaves class {c} ({members.size} samples) nothing to train on; "
                    f"hold out fewer per class"
                )
            chosen.append(rng.permutation(members)[:take])
        return np.sort(np.concatenate(chosen))

    def counts(self, pool: np.ndarray, class_names: list[str]) -> tuple[list[int], float]:
        """Training samples per class after the cut, from each class's ``pool``, and the
        imbalance factor they have."""
        if self.imbalance_factor is None:  # the data's own imbalance
            cap = self.n_max
            counts = [int(min(n, cap)) if cap is not None else int(n) for n in pool]
            return counts, max(counts) / max(1, min(counts))
        n_max = int(pool.min()) if self.n_max is None else self.n_max
        factor, profile = self.imbalance_factor, self.profile
        counts = long_tail_counts(n_max, len(class_names), factor, profile)
        if min(counts) == 0:
            empty = class_names[counts.index(0)]
            enough = next(
                n
                for n in range(n_max, 10 * n_max + 10 * int(factor) + 2)
                if min(long_tail_counts(n, len(class_names), factor, profile)) > 0
            )
            raise ValueError(
                f"data.n_max={n_max} with data.imbalance_factor={factor} leaves class "
                f"{empty!r} with no training samples; use data.n_max >= {enough} or lower "
                f"data.imbalance_factor to at most {n_max}"
            )
        return counts, float(factor)

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
    ) -> LongTailData:
        """The validation split, the cut and the checks. ``train`` and ``test`` are (samples,
        labels): numpy arrays, tensors or :class:`runner.data.samples.Samples`, whose indexing
        composes indices and copies nothing."""
        (train_x, train_y), (test_x, test_y) = train, test
        val = self.validation(train_y, len(class_names))
        val_x = val_y = None
        pool_rows = np.arange(train_y.size)  # the training pool's rows of train_x
        if val.size:
            pool_rows = np.setdiff1d(pool_rows, val)
            val_x, val_y = train_x[val], train_y[val]
            train_y = train_y[pool_rows]
        pool = np.bincount(train_y, minlength=len(class_names))
        if (pool == 0).any():
            empty = class_names[int(np.argmin(pool))]
            raise ValueError(
                f"class {empty!r} has no training samples; every class needs some (labels "
                f"must be 0..{len(class_names) - 1}, each present)"
            )
        counts, imbalance_factor = self.counts(pool, class_names)
        tested = np.bincount(test_y, minlength=len(class_names))
        if (tested == 0).any():
            missing = [class_names[c] for c in np.flatnonzero(tested == 0)]
            raise ValueError(
                f"the test split has no samples of class(es) {missing}; every class needs "
                "test samples"
            )
        keep = long_tail_subset(train_y, counts, self.data_seed)
        return LongTailData(
            # One gather of the rows kept, not a copy of the whole pool first.
            train_x=as_tensor(train_x[pool_rows[keep]]),
            train_y=torch.as_tensor(train_y[keep]).long(),
            test_x=as_tensor(test_x),
            test_y=torch.as_tensor(test_y).long(),
            class_names=class_names,
            name=name,
            imbalance_factor=imbalance_factor,
            augment=augment,
            val_x=as_tensor(val_x) if val_x is not None else None,
            val_y=torch.as_tensor(val_y).long() if val_y is not None else None,
            normalize=normalize,
            feeding=feeding or Feeding(),
        )


def as_tensor(x: Any) -> Any:
    """numpy arrays become tensors; tensors and Samples stay as they are."""
    return torch.as_tensor(x) if isinstance(x, np.ndarray) else x


def shared_source(
    *kinds: type, **defaults: Any
) -> Callable[[Callable[..., LongTailData]], Callable[..., LongTailData]]:
    """Give a source the parameters of the dataclasses ``kinds`` (the cut's and the feeding's),
    keyword-only, with this source's ``defaults`` where they differ from those classes'. The
    decorated function takes one instance of each as ``cut`` and ``feeding`` (the first kind is
    the cut); its signature, which the config check and Hydra read, lists every parameter as
    its own."""
    shared = {f.name: (kind, f) for kind in kinds for f in dataclasses.fields(kind)}
    unknown = set(defaults) - set(shared)
    assert not unknown, f"not a shared parameter: {sorted(unknown)}"
    cut_kind, feeding_kind = kinds

    def decorate(source: Callable[..., LongTailData]) -> Callable[..., LongTailData]:
        own = inspect.signature(source)
        parameters = [p for p in own.parameters.values() if p.name not in ("cut", "feeding")]
        added = [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=defaults.get(name, spec.default),
                annotation=spec.type,
            )
            for name, (_, spec) in shared.items()
        ]

        @functools.wraps(source)
        def with_shared(*args: Any, **kwargs: Any) -> LongTailData:
            given = {
                name: kwargs.pop(name, defaults.get(name, spec.default))
                for name, (_, spec) in shared.items()
            }

            def of(kind: type) -> dict[str, Any]:
                return {k: v for k, v in given.items() if shared[k][0] is kind}

            cut, feeding = cut_kind(**of(cut_kind)), feeding_kind(**of(feeding_kind))
            return source(*args, cut=cut, feeding=feeding, **kwargs)

        with_shared.__signature__ = own.replace(parameters=parameters + added)  # type: ignore[attr-defined]
        return with_shared

    return decorate


def long_tail_source(**defaults: Any) -> Callable[[F], Callable[..., LongTailData]]:
    """:func:`shared_source` with the long-tail cut's parameters (:class:`LongTailCut`) and the
    feeding's (:class:`Feeding`)."""
    return shared_source(LongTailCut, Feeding, **defaults)
